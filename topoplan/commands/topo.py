"""``topoplan topo show|lint CLUSTER.yaml``: look at a cluster file;
``topoplan topo import nccl NODE.xml``: make one from an NCCL topology file;
``topoplan topo generate rail|fat-tree --boxes N``: write a big fabric's cluster file."""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections import Counter
from itertools import groupby
from pathlib import Path

from ..cluster import Cluster, Nic, load_cluster
from ..errors import TopoplanWarning
from ..schedule import atomic_write
from ..units import format_bandwidth, format_time, parse_bandwidth
from .common import Column, console, fit_table, left_out_note, positive_int, table


def register(subparsers: argparse._SubParsersAction) -> None:
    topo = subparsers.add_parser("topo", help="show, lint or import a cluster YAML file")
    sub = topo.add_subparsers(dest="topo_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="ranks, boxes, links, per-box and bisection bandwidth")
    show.add_argument("cluster", help="cluster YAML file")
    show.add_argument("--links", type=int, default=24, metavar="N",
                      help="list at most N switch links (default 24)")
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
    lint.set_defaults(func=cmd_lint)
    imp = sub.add_parser(
        "import", help="make a cluster YAML file from another tool's topology file",
        description="Make a cluster YAML v1 file from an NCCL topology file (the XML that "
                    "NCCL_TOPO_DUMP_FILE writes or NCCL_TOPO_FILE reads) of one host. "
                    "Every assumption is printed to stderr and written at the top of the "
                    "file; see docs/CLUSTER.md, 'Importing an NCCL topology file'.")
    imp.add_argument("format", choices=["nccl"], help="the input's format: nccl (topology XML)")
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
    gen.add_argument("fabric", choices=["rail", "fat-tree"])
    gen.add_argument("--boxes", type=positive_int, required=True, metavar="N")
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
    cluster = load_cluster(args.cluster)
    out = console()
    graph = cluster.graph
    out.print(f"[bold]{cluster.name}[/bold]  ({args.cluster})")
    out.print(f"{cluster.nranks} ranks in {len(cluster.boxes)} boxes, {len(cluster.switches)} "
              f"switches, {len(cluster.links)} switch links")
    out.print(f"graph: {graph.number_of_nodes()} nodes, {graph.number_of_edges()} directed edges")

    rows = []
    for template, group in groupby(cluster.boxes, key=lambda b: (b.template, b.signature())):
        members = list(group)
        first, last = members[0], members[-1]
        label = first.name if len(members) == 1 else f"{first.name} .. {last.name}"
        inbox = first.in_box_bandwidth()
        rows.append([label, str(len(members)), f"{first.first_rank}..{last.ranks[-1]}",
                     str(first.gpus), format_bandwidth(inbox) if inbox else "-",
                     nic_summary(first.nics),
                     format_bandwidth(cluster.injection_bandwidth(first)) if first.nics else "-"])
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

    summary: list[list[str]] = []
    if len(cluster.boxes) > 1:
        inj = [cluster.injection_bandwidth(b) for b in cluster.boxes]
        summary.append(["per-box injection (min .. max)",
                        f"{format_bandwidth(min(inj))} .. {format_bandwidth(max(inj))}"])
    per_gpu = [b.in_box_bandwidth() for b in cluster.boxes if b.gpus > 1]
    if per_gpu:
        summary.append(["in-box per GPU (min)", format_bandwidth(min(per_gpu))])
    if cluster.nranks < 2:
        # One GPU: no cut separates GPUs and an allreduce moves nothing.
        summary.append(["bisection (rank-order halves)", "- (one GPU)"])
        summary.append(["lower bound partition", "none: one GPU, nothing to move"])
    else:
        summary.append(["bisection (rank-order halves)",
                        format_bandwidth(cluster.bisection_bandwidth())])
        try:
            from ..bound import best_partition, bottleneck
            summary.append(["lower bound partition (any schedule)", str(best_partition(cluster))])
            cut = bottleneck(cluster)
            summary.append(["RS+AG bottleneck cut",
                            f"{cut.gpus} GPUs behind {format_bandwidth(cut.bandwidth)} "
                            f"({format_bandwidth(cut.bandwidth / cut.gpus)} per GPU)"])
        except ImportError:
            pass
    out.print(fit_table(SUMMARY_COLUMNS, summary, out.width, title="Bandwidth")[0])
    return 0


#: Bandwidths are each way; NICs of several speeds stack one speed a line when narrow.
BOX_COLUMNS = (Column("box", "left"), Column("count", drop=1), Column("ranks"),
               Column("GPUs"), Column("in-box\nper GPU"), Column("NICs", stack=" + "),
               Column("injection\nper box"))
SUMMARY_COLUMNS = (Column("measure", "left", wrap=True), Column("value", "left"))


def nic_summary(nics: tuple[Nic, ...]) -> str:
    """``2 x 12.5 GB/s + 2 x 25 GB/s``: a box's NICs by speed, slowest first; ``-`` for none."""
    speeds = Counter(nic.bandwidth for nic in nics)
    return " + ".join(f"{speeds[bw]} x {format_bandwidth(bw)}" for bw in sorted(speeds)) or "-"


def cmd_lint(args: argparse.Namespace) -> int:
    out = console()
    warned = False
    for path in args.cluster:
        cluster, found = _load_warned(path)
        verdict = "ok" if not found else f"{len(found)} warning{'s' * (len(found) > 1)}"
        warned = warned or bool(found)
        out.print(f"{path}: {verdict}: {cluster.name}, {cluster.nranks} ranks in "
                  f"{len(cluster.boxes)} boxes, {len(cluster.switches)} switches", soft_wrap=True)
    return 1 if warned and args.strict else 0


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
    return _emit(text, args.output, f"{cluster.nranks} ranks in {len(cluster.boxes)} boxes, "
                                    f"{len(cluster.switches)} switches")


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
                 f"{imported.nranks} ranks in {imported.document['boxes'][0]['count']} node(s); "
                 f"{len(imported.assumptions)} assumptions noted at the top")
