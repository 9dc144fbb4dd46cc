"""``topoplan topo show|lint CLUSTER.yaml``: look at a cluster file."""

from __future__ import annotations

import argparse
from itertools import groupby

from ..cluster import load_cluster
from ..units import format_bandwidth, format_time
from .common import console, table


def register(subparsers: argparse._SubParsersAction) -> None:
    topo = subparsers.add_parser("topo", help="show or lint a cluster YAML file")
    sub = topo.add_subparsers(dest="topo_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="ranks, boxes, links, per-box and bisection bandwidth")
    show.add_argument("cluster", help="cluster YAML file")
    show.add_argument("--links", type=int, default=24, metavar="N",
                      help="list at most N switch links (default 24)")
    show.set_defaults(func=cmd_show)
    lint = sub.add_parser("lint", help="validate a cluster file; exit 0 when it is good")
    lint.add_argument("cluster", nargs="+", help="cluster YAML file(s)")
    lint.set_defaults(func=cmd_lint)


def cmd_show(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    out = console()
    graph = cluster.graph
    out.print(f"[bold]{cluster.name}[/bold]  ({args.cluster})")
    out.print(f"{cluster.nranks} ranks in {len(cluster.boxes)} boxes, {len(cluster.switches)} "
              f"switches, {len(cluster.links)} switch links; graph: {graph.number_of_nodes()} "
              f"nodes, {graph.number_of_edges()} directed edges")

    boxes = table("box", "count", "ranks", "GPUs", "in-box per GPU", "NICs", "injection per box",
                  title="Boxes")
    for template, group in groupby(cluster.boxes, key=lambda b: (b.template, b.signature())):
        members = list(group)
        first, last = members[0], members[-1]
        label = first.name if len(members) == 1 else f"{first.name} .. {last.name}"
        nic_bw = sorted({nic.bandwidth for nic in first.nics})
        nics = (f"{len(first.nics)} x " + "/".join(format_bandwidth(b) for b in nic_bw)
                if first.nics else "-")
        inbox = first.in_box_bandwidth()
        boxes.add_row(label, str(len(members)), f"{first.first_rank}..{last.ranks[-1]}",
                      str(first.gpus), format_bandwidth(inbox) if inbox else "-", nics,
                      format_bandwidth(cluster.injection_bandwidth(first)) if first.nics else "-")
    out.print(boxes)

    if cluster.links:
        links = table("a", "b", "bandwidth", "latency", title="Switch links")
        for link in cluster.links[:args.links]:
            links.add_row(link.a, link.b, format_bandwidth(link.bandwidth), format_time(link.latency))
        if len(cluster.links) > args.links:
            links.add_row(f"... {len(cluster.links) - args.links} more", "", "", "")
        out.print(links)

    summary = table("measure", "value", title="Bandwidth")
    if len(cluster.boxes) > 1:
        inj = [cluster.injection_bandwidth(b) for b in cluster.boxes]
        summary.add_row("per-box injection (min .. max)",
                        f"{format_bandwidth(min(inj))} .. {format_bandwidth(max(inj))}")
    per_gpu = [b.in_box_bandwidth() for b in cluster.boxes if b.gpus > 1]
    if per_gpu:
        summary.add_row("in-box per GPU (min)", format_bandwidth(min(per_gpu)))
    if cluster.nranks < 2:
        # One GPU: no cut separates GPUs and an allreduce moves nothing.
        summary.add_row("bisection (rank-order halves)", "- (one GPU)")
        summary.add_row("lower bound partition", "none: one GPU, nothing to move")
        out.print(summary)
        return 0
    summary.add_row("bisection (rank-order halves)", format_bandwidth(cluster.bisection_bandwidth()))
    try:
        from ..bound import best_partition, bottleneck
        summary.add_row("lower bound partition (any schedule)", str(best_partition(cluster)))
        cut = bottleneck(cluster)
        summary.add_row("RS+AG bottleneck cut",
                        f"{cut.gpus} GPUs behind {format_bandwidth(cut.bandwidth)} "
                        f"({format_bandwidth(cut.bandwidth / cut.gpus)} per GPU)")
    except ImportError:
        pass
    out.print(summary)
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    out = console()
    for path in args.cluster:
        cluster = load_cluster(path)
        out.print(f"{path}: ok: {cluster.name}, {cluster.nranks} ranks in {len(cluster.boxes)} "
                  f"boxes, {len(cluster.switches)} switches")
    return 0
