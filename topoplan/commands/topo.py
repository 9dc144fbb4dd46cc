"""``topoplan topo show|lint CLUSTER.yaml``: look at a cluster file;
``topoplan topo import nccl NODE.xml``: make one from an NCCL topology file;
``topoplan topo generate rail|fat-tree --boxes N``: write a big fabric's cluster file."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import warnings
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

from ..cluster import Cluster, load_cluster
from ..errors import TopoplanError, TopoplanWarning
from ..ir.schedule import atomic_write
from ..units import format_bandwidth, format_time, parse_bandwidth, plural
from .common import Column, console, fit_table, left_out_note, positive_int, table


def register(subparsers: argparse._SubParsersAction) -> None:
    topo = subparsers.add_parser(
        "topo", help="cluster YAML files: topo show, topo lint, topo import (from an NCCL "
                     "topology), topo generate (rail or fat-tree)",
        description="Look at a cluster YAML file (show, lint), or make one: from an NCCL "
                    "topology file (import), or for a rail-optimised or fat-tree fabric "
                    "(generate).")
    sub = topo.add_subparsers(dest="topo_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="ranks, boxes, links, per-box and bisection bandwidth")
    show.add_argument("cluster", help="cluster YAML file")
    show.add_argument("--links", type=int, default=24, metavar="N",
                      help="list at most N switch links (default 24; --json lists all)")
    show.add_argument("--json", action="store_true",
                      help="print one JSON object (bandwidths in bytes/s) instead of tables")
    show.set_defaults(func=cmd_show)
    lint = sub.add_parser(
        "lint", help="validate a cluster file; exit 0 when it loads",
        description="Load each cluster file: print 'FILE: ok: ...' for a file that loads "
                    "cleanly, or 'FILE: N warning(s): ...' (each warning on stderr) for one "
                    "that loads but has something that may not mean what was meant, such "
                    "as a bandwidth without a unit. A file that does not load is an error "
                    "(exit 1).")
    lint.add_argument("cluster", nargs="+", help="cluster YAML file(s)")
    lint.add_argument("--strict", action="store_true",
                      help="exit 1 when any file has a warning, too")
    lint.add_argument("--json", action="store_true",
                      help="print one JSON object: every file with ok, its warnings, or its "
                           "error")
    lint.set_defaults(func=cmd_lint)
    imp = sub.add_parser(
        "import", help="make a cluster YAML file from another tool's topology file",
        description="Make a cluster YAML v1 file from an NCCL topology file (the XML that "
                    "NCCL_TOPO_DUMP_FILE writes or NCCL_TOPO_FILE reads) of one host. "
                    "Every assumption is printed to stderr and written at the top of the "
                    "file; see docs/CLUSTER.md, 'Importing an NCCL topology file'.")
    imp.add_argument("format", type=_topology_format, metavar="{nccl}",
                     help="the input's format: nccl (topology XML)")
    imp.add_argument("file", help="the topology file of one host")
    imp.add_argument("-o", "--output", metavar="CLUSTER.yaml",
                     help="write the cluster file here (default: print it)")
    imp.add_argument("--nodes", type=positive_int, default=1, metavar="N",
                     help="N copies of the host (default 1)")
    imp.add_argument("--network", choices=["rail", "single", "none"], default=None,
                     help="rail: NIC k of every node on switch rail{k}, rails joined by a "
                          "non-blocking spine (default); single: every NIC on one switch; "
                          "none: no NICs (one node)")
    imp.add_argument("--overlay", metavar="NET.yaml",
                     help="the network from a YAML file: switches, links (cluster syntax) and "
                          "nic_switches (the switch of each NIC)")
    imp.add_argument("--nvlink-per-gpu", type=_nvlink_arg, metavar="BW|none",
                     help="NVLink bandwidth per GPU to an NVSwitch fabric, each way (e.g. "
                          "240GB/s), or none for PCIe only; for files without <gpu> elements, "
                          "or to override them")
    imp.add_argument("--nic-speed", type=_bandwidth_arg, metavar="BW",
                     help="the speed of every NIC (e.g. 200Gbit/s); for files without <net> "
                          "elements, or to override them")
    imp.add_argument("--name", help="the cluster's name (default: from the file name)")
    imp.set_defaults(func=cmd_import)
    gen = sub.add_parser(
        "generate", help="write the cluster YAML of a rail-optimised or fat-tree fabric",
        description="Write a cluster YAML v1 file for a big fabric: rail (NIC k of every box "
                    "on rail k, each rail a set of leaves joined by spines) or fat-tree (a "
                    "box's NICs on one leaf, leaves joined by oversubscribed spines). "
                    "Defaults follow the DGX SuperPOD design: 8 GPUs per box, a 200 Gbit/s "
                    "NIC per GPU, NVSwitch at 300 GB/s.")
    gen.add_argument("fabric", choices=["rail", "fat-tree"],
                     help="rail: NIC k of every box on rail k; fat-tree: a box's NICs on one "
                          "leaf")
    gen.add_argument("--boxes", type=positive_int, required=True, metavar="N",
                     help="boxes in the cluster")
    gen.add_argument("--gpus", type=positive_int, default=8, metavar="G", help="per box (8)")
    gen.add_argument("--boxes-per-leaf", type=positive_int, metavar="K",
                     help="boxes on one leaf (rail: 32 per rail leaf; fat-tree: 8)")
    gen.add_argument("--spines", type=positive_int, metavar="S", help="(rail: 4; fat-tree: 8)")
    gen.add_argument("--nic", type=_bandwidth_arg, default=25e9, metavar="BW",
                     help="speed of every NIC (200Gbit/s)")
    gen.add_argument("--nvlink", type=_bandwidth_arg, default=300e9, metavar="BW",
                     help="in-box bandwidth per GPU each way (300GB/s)")
    gen.add_argument("--oversubscription", type=_ratio_arg, metavar="R",
                     help="leaf down/up bandwidth (rail: 1; fat-tree: 2)")
    gen.add_argument("--name", help="the cluster's name")
    gen.add_argument("-o", "--output", metavar="CLUSTER.yaml",
                     help="write the cluster file here (default: print it)")
    gen.set_defaults(func=cmd_generate)


def cmd_show(args: argparse.Namespace) -> int:
    cluster, found = _load_warned(args.cluster)
    facts = cluster_facts(cluster)
    if args.json:
        print(json.dumps({"file": args.cluster, **facts,
                          "warnings": [str(w) for w in found]}))
        return 0
    out = console()
    out.print(f"[bold]{cluster.name}[/bold]  ({args.cluster})")
    out.print(f"{plural(cluster.nranks, 'rank')} in {plural(len(cluster.boxes), 'box')}, "
              f"{plural(len(cluster.switches), 'switch')}, "
              f"{plural(len(cluster.links), 'switch link')}")
    out.print(f"graph: {plural(facts['graph']['nodes'], 'node')}, "
              f"{plural(facts['graph']['directed_edges'], 'directed edge')}")

    rows = [[group["boxes"], str(group["count"]),
             f"{group['first_rank']}..{group['last_rank']}", str(group["gpus"]),
             _bw(group["in_box_per_gpu_Bps"]),
             " + ".join(f"{n['count']} x {format_bandwidth(n['bandwidth_Bps'])}"
                        for n in group["nics"]) or "-",
             _bw(group["injection_Bps"])]
            for group in facts["boxes"]]
    boxes, left_out = fit_table(BOX_COLUMNS, rows, out.width, title="Boxes")
    out.print(boxes)
    note = left_out_note(left_out, out.width)
    if note:
        out.print(note)

    if cluster.links:
        links = table("a", "b", "bandwidth", "latency", title="Switch links")
        for link in cluster.links[:args.links]:
            links.add_row(link.a, link.b, format_bandwidth(link.bandwidth), format_time(link.latency))
        if len(cluster.links) > args.links:
            links.add_row(f"... {len(cluster.links) - args.links} more", "", "", "")
        out.print(links)

    bw = facts["bandwidth"]
    summary: list[list[str]] = []
    if bw["injection_min_Bps"] is not None and len(cluster.boxes) > 1:
        summary.append(["per-box injection (min .. max)", f"{_bw(bw['injection_min_Bps'])} .. "
                                                          f"{_bw(bw['injection_max_Bps'])}"])
    if bw["in_box_per_gpu_min_Bps"] is not None:
        summary.append(["in-box per GPU (min)", _bw(bw["in_box_per_gpu_min_Bps"])])
    if cluster.nranks < 2:
        # One GPU: no cut separates GPUs and an allreduce moves nothing.
        summary.append(["bisection (rank-order halves)", "- (one GPU)"])
        summary.append(["lower bound partition", "none: one GPU, nothing to move"])
    else:
        summary.append(["bisection (rank-order halves)", _bw(bw["bisection_Bps"])])
        if bw["bound_partition"] is not None:
            summary.append(["lower bound partition (any schedule)", bw["bound_partition"]["text"]])
            cut = bw["bottleneck"]
            summary.append(["RS+AG bottleneck cut", f"{cut['text']}: {cut['crossing']}"])
    out.print(fit_table(SUMMARY_COLUMNS, summary, out.width, title="Bandwidth")[0])
    return 0


def cluster_facts(cluster: Cluster) -> dict[str, Any]:
    """What ``topo show`` prints, as data (``--json``): bandwidths in bytes/s, each way."""
    groups = []
    for _, group in groupby(cluster.boxes, key=lambda b: (b.template, b.signature())):
        members = list(group)
        first, last = members[0], members[-1]
        speeds = Counter(nic.bandwidth for nic in first.nics)
        groups.append({
            "boxes": first.name if len(members) == 1 else f"{first.name} .. {last.name}",
            "count": len(members), "first_rank": first.first_rank,
            "last_rank": last.ranks[-1], "gpus": first.gpus,
            "in_box_per_gpu_Bps": first.in_box_bandwidth() or None,
            "nics": [{"count": speeds[bw], "bandwidth_Bps": bw} for bw in sorted(speeds)],
            "injection_Bps": cluster.injection_bandwidth(first) if first.nics else None})
    inj = [cluster.injection_bandwidth(b) for b in cluster.boxes if b.nics]
    per_gpu = [b.in_box_bandwidth() for b in cluster.boxes if b.gpus > 1]
    bandwidth: dict[str, Any] = {
        "injection_min_Bps": min(inj) if inj else None,
        "injection_max_Bps": max(inj) if inj else None,
        "in_box_per_gpu_min_Bps": min(per_gpu) if per_gpu else None,
        "bisection_Bps": cluster.bisection_bandwidth() if cluster.nranks > 1 else None,
        "bound_partition": None, "bottleneck": None}
    if cluster.nranks > 1:
        try:
            from ..analysis.bound import best_partition, bottleneck
        except ImportError:  # a partial installation: the bounds are left out
            pass
        else:
            part, cut = best_partition(cluster), bottleneck(cluster)
            bandwidth["bound_partition"] = {"name": part.name, "groups": len(part.groups),
                                            "bandwidth_Bps": part.bandwidth, "text": str(part)}
            bandwidth["bottleneck"] = {"gpus": cut.gpus, "bandwidth_Bps": cut.bandwidth,
                                       "behind": cut.behind, "where": cut.where,
                                       "text": str(cut), "crossing": cut.crossing()}
    graph = cluster.graph
    return {"cluster": cluster.name, "nranks": cluster.nranks, "switches": len(cluster.switches),
            "graph": {"nodes": graph.number_of_nodes(), "directed_edges": graph.number_of_edges()},
            "boxes": groups,
            "links": [{"a": link.a, "b": link.b, "bandwidth_Bps": link.bandwidth,
                       "latency_s": link.latency} for link in cluster.links],
            "bandwidth": bandwidth}


def _bw(bytes_per_s: float | None) -> str:
    return format_bandwidth(bytes_per_s) if bytes_per_s else "-"


#: Bandwidths are each way; NICs of several speeds stack one speed a line when narrow.
BOX_COLUMNS = (Column("box", "left"), Column("count", drop=1), Column("ranks"),
               Column("GPUs"), Column("in-box\nper GPU"), Column("NICs", stack=" + "),
               Column("injection\nper box"))
SUMMARY_COLUMNS = (Column("measure", "left", wrap=True), Column("value", "left", wrap=True))


def cmd_lint(args: argparse.Namespace) -> int:
    out = console()
    files: list[dict[str, Any]] = []
    for path in args.cluster:
        if not args.json:
            cluster, found = _load_warned(path)
        else:  # every file is reported, a bad one too, in one object at the end
            try:
                cluster, found = _load_warned(path)
            except TopoplanError as exc:
                files.append({"file": path, "ok": False, "error": str(exc), "warnings": []})
                continue
        files.append({"file": path, "ok": True, "warnings": [str(w) for w in found],
                      "cluster": cluster.name, "nranks": cluster.nranks,
                      "boxes": len(cluster.boxes), "switches": len(cluster.switches)})
        if not args.json:
            verdict = "ok" if not found else plural(len(found), "warning")
            out.print(f"{path}: {verdict}: {cluster.name}, {plural(cluster.nranks, 'rank')} in "
                      f"{plural(len(cluster.boxes), 'box')}, "
                      f"{plural(len(cluster.switches), 'switch')}",
                      soft_wrap=True)
    if args.json:
        print(json.dumps({"files": files}))
    if not all(f["ok"] for f in files):
        return 1
    return 1 if args.strict and any(f["warnings"] for f in files) else 0


def _load_warned(path: str) -> tuple[Cluster, list[TopoplanWarning]]:
    """The cluster in ``path`` and the warnings its reading issued (each also shown)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TopoplanWarning)
        cluster = load_cluster(path)
    found = []
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        if isinstance(w.message, TopoplanWarning):
            found.append(w.message)
    return cluster, found


def _topology_format(text: str) -> str:
    """argparse type of ``topo import FORMAT``: nccl; an algorithm format says where it goes."""
    if text == "msccl":
        raise argparse.ArgumentTypeError(
            "'msccl' is an algorithm, not a topology: did you mean `topoplan import ALGO.xml "
            "--format msccl`?")
    if text != "nccl":
        raise argparse.ArgumentTypeError(f"unknown format {text!r}; topo import reads nccl "
                                         "(an NCCL topology XML)")
    return text


def _bandwidth_arg(text: str) -> float:
    try:
        value = parse_bandwidth(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; e.g. 200Gbit/s or 25GB/s") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _nvlink_arg(text: str) -> float:
    if text.strip().lower() in {"none", "0"}:
        return 0.0
    return _bandwidth_arg(text)


def _ratio_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def cmd_generate(args: argparse.Namespace) -> int:
    from ..cluster import loads_cluster
    from ..cluster.generate import bandwidth_text, fat_tree, rail_optimized

    make = rail_optimized if args.fabric == "rail" else fat_tree
    options = {key: getattr(args, key) for key in ("boxes_per_leaf", "spines",
                                                    "oversubscription", "name")
               if getattr(args, key) is not None}
    text = make(args.boxes, args.gpus, nic=bandwidth_text(args.nic),
                nvlink=bandwidth_text(args.nvlink), **options)
    cluster = loads_cluster(text, file=args.output or "<generated>")  # what we write loads
    return _emit(text, args.output, f"{plural(cluster.nranks, 'rank')} in "
                                    f"{plural(len(cluster.boxes), 'box')}, "
                                    f"{plural(len(cluster.switches), 'switch')}")


def _emit(text: str, output: str | None, summary: str) -> int:
    """Print ``text``, or write it to ``output`` atomically and say what it holds."""
    if output is None:
        sys.stdout.write(text)
        return 0
    atomic_write(Path(output), text)
    print(f"{output}: {summary}", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..errors import TopoplanError
    from ..interop.nccl_topo import import_nccl_topology, render_cluster_yaml

    if args.overlay and args.network:
        raise TopoplanError("--overlay gives the network; leave out --network")
    imported = import_nccl_topology(
        args.file, nodes=args.nodes, network=args.network or "rail", overlay=args.overlay,
        nvlink_per_gpu=args.nvlink_per_gpu, nic_speed=args.nic_speed, name=args.name)
    words = ["topoplan", "topo", "import", args.format, args.file]
    for option in ("nodes", "network", "overlay", "name"):
        value = getattr(args, option)
        if value is not None and not (option == "nodes" and value == 1):
            words += [f"--{option}", str(value)]
    if args.nvlink_per_gpu is not None:
        words += ["--nvlink-per-gpu", format_bandwidth(args.nvlink_per_gpu).replace(" ", "")
                  if args.nvlink_per_gpu else "none"]
    if args.nic_speed is not None:
        words += ["--nic-speed", format_bandwidth(args.nic_speed).replace(" ", "")]
    text = render_cluster_yaml(imported, command=" ".join(shlex.quote(w) for w in words))
    for note in imported.assumptions:
        print(f"topoplan: note: {note}", file=sys.stderr)
    return _emit(text, args.output,
                 f"{plural(imported.nranks, 'rank')} in "
                 f"{plural(imported.document['boxes'][0]['count'], 'node')}; "
                 f"{plural(len(imported.assumptions), 'assumption')} noted at the top")
