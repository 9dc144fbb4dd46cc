"""``topoplan simulate CLUSTER.yaml PLAN.json``: predicted time per size vs the lower bound."""

from __future__ import annotations

import argparse
import json
import sys

from typing import Any

from ..analysis.bound import best_partition, bottleneck, latency_bound, lower_bound, rsag_bound
from ..cluster import load_cluster
from ..analysis.cost import get_profile
from ..errors import ScheduleError
from ..ir.fingerprint import check_fingerprint
from ..ir.parse import load_schedule
from ..analysis.sim.base import EPS_T
from ..analysis.sim import SimReport, simulate
from ..units import format_size, parse_bandwidth, parse_latency
from .common import (Column, add_nccl_arguments, add_profile_argument, checked_arg, console,
                     fit_table, left_out_note, plan_name, plural, sizes_arg)
from .verify import verify_plan

#: The parts of SimReport.breakdown, in the order the table and JSON show them
#: (``native`` only for a schedule with native steps, IR v3).
PARTS = ("bandwidth", "latency", "overhead", "reduce", "contention", "native")


_bandwidth = checked_arg(parse_bandwidth, lambda v: v > 0, "must be > 0")
_latency = checked_arg(parse_latency, lambda v: v >= 0, "must be >= 0")


def _notes(reports: list[SimReport]) -> list[str]:
    """The reports' notes, each once, in order."""
    return list(dict.fromkeys(note for r in reports for note in r.notes))


def _rsag(cluster: Any, size: int, dtype_size: int) -> float:
    """The RS+AG cut bound for the bytes the simulation moves (whole elements)."""
    return rsag_bound(cluster, (size // dtype_size) * dtype_size)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="predict a schedule's time per message size on a cluster",
        description="Event-driven simulation of PLAN.json on CLUSTER.yaml (max-min fair links, "
                    "path latency, rendezvous, and the runtime's costs from a cost profile), "
                    "one row per size, nccl-tests style, against the topology's allreduce "
                    "lower bound (valid for any schedule; the RS+AG cut bound, for "
                    "reduce-scatter + allgather schedules, beside it), with the time split "
                    "into bandwidth, latency, overhead and reduce.")
    parser.add_argument("cluster", help="cluster YAML file")
    parser.add_argument("plan", help="schedule JSON file (from topoplan plan -o)")
    parser.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1KiB:1GiB"),
                        metavar="RANGE",
                        help="bytes per rank: MIN:MAX (powers of two), MIN:MAX:FACTOR or a,b,c "
                             "(default 1KiB:1GiB)")
    parser.add_argument("--dtype-size", type=int, default=4, metavar="BYTES",
                        help="bytes per element (default 4, fp32)")
    add_profile_argument(parser, "to charge")
    parser.add_argument("--alpha", type=_latency, default=None, metavar="LATENCY",
                        help="seconds per message before it flows, e.g. '5 us', for both link "
                             "classes (default: the profile's)")
    parser.add_argument("--reduce-bandwidth", type=_bandwidth, default=None, metavar="BW",
                        help="GPU reduction speed, e.g. '500 GB/s' (default: the profile's)")
    parser.add_argument("--resolution", type=_resolution, default=None, metavar="R",
                        help="events closer than R x the clock happen at once (default 1e-7, "
                             "1e-5 above 200000 ops; see topoplan.simulate)")
    parser.add_argument("--force", action="store_true",
                        help="simulate a plan made for another cluster (its recorded cluster "
                             "fingerprint differs), or one that does not verify (a wrong "
                             "result or a deadlock, as topoplan verify says)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    add_nccl_arguments(parser)
    parser.set_defaults(func=cmd_simulate)


def _planned_size(schedule: Any) -> int | None:
    """The size the plan was made for (``meta["size_bytes"]``, which ``topoplan plan -o``
    writes), or None."""
    size = schedule.meta.get("size_bytes")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _resolution(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1e-2:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.01), got {text}")
    return value


def cmd_simulate(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    schedule = load_schedule(args.plan)
    if schedule.nranks != cluster.nranks:
        raise ScheduleError(
            f"{args.plan} has {schedule.nranks} ranks but {args.cluster} (cluster "
            f"{cluster.name!r}) has {cluster.nranks} GPUs; plan it for this cluster: "
            f"topoplan plan {args.cluster} -o PLAN.json")
    check_fingerprint(schedule, cluster, plan=args.plan, cluster_file=args.cluster,
                      force=args.force)
    if not args.force:  # a wrong plan has no time worth printing: refused as verify does
        try:
            verify_plan(schedule, args.plan)
        except ScheduleError as exc:
            raise ScheduleError(f"{exc}; pass --force to simulate it anyway") from None
    if args.dtype_size < 1:
        raise ScheduleError(f"--dtype-size must be >= 1, got {args.dtype_size}")
    costs = get_profile(args.profile)
    changes: dict[str, Any] = {}
    if args.alpha is not None:
        changes.update(alpha_box=args.alpha, alpha_network=args.alpha)
    if args.reduce_bandwidth is not None:
        changes["reduce_bandwidth"] = args.reduce_bandwidth
    if changes:
        costs = costs.with_costs(**changes)
    progress = None
    if sys.stderr.isatty():
        def progress(fraction: float, _t: float) -> None:
            print(f"\r  simulating: {fraction:4.0%}", end="", file=sys.stderr, flush=True)

    reports: list[SimReport] = []
    for size in args.sizes:
        reports.append(simulate(cluster, schedule, size, profile=costs,
                                dtype_size=args.dtype_size, progress=progress,
                                resolution=args.resolution, force=args.force))
    if progress is not None:
        print("\r" + " " * 24 + "\r", end="", file=sys.stderr)
    cut = bottleneck(cluster)
    part = best_partition(cluster) if cluster.nranks > 1 else None
    planned = _planned_size(schedule)
    # Under a profile that charges latency: the bound a point-to-point plan can meet (a
    # plan with native steps is bound by the bandwidth alone: their libraries' latencies
    # are not the profile's point-to-point ones).
    p2p_bound = not costs.is_ideal and not any(r.natives for r in reports)
    latency = {r.size: (latency_bound(cluster, r.size, costs, schedule.collective)
                        if p2p_bound else None) for r in reports}
    if args.json:
        print(json.dumps({
            "cluster": cluster.name, "algorithm": schedule.algorithm, "nranks": cluster.nranks,
            "profile": costs.to_dict(), "resolution": reports[0].resolution if reports else None,
            "planned_size_bytes": planned,
            "bottleneck": {"gpus": cut.gpus, "bandwidth_Bps": cut.bandwidth,
                           "nodes": sorted(cut.nodes), "behind": cut.behind,
                           "where": cut.where, "text": str(cut)},
            "bound_partition": ({"name": part.name, "groups": len(part.groups),
                                 "bandwidth_Bps": part.bandwidth} if part else None),
            "results": [{"size_bytes": r.size, "count": r.size // args.dtype_size,
                         "time_s": r.time_s, "algbw_GBps": r.algbw / 1e9,
                         "busbw_GBps": r.busbw / 1e9, "lower_bound_s": r.lower_bound_s,
                         "rsag_bound_s": _rsag(cluster, r.size, args.dtype_size),
                         "latency_bound_s": latency[r.size],
                         "efficiency": r.efficiency, "messages": r.messages,
                         "x_bound": (r.time_s / r.lower_bound_s if r.lower_bound_s > 0
                                     else None),
                         "at_planned_size": None if planned is None else r.size == planned,
                         "speedup_vs_nccl": r.speedup_vs_nccl,
                         "nccl": r.nccl.to_dict() if r.nccl is not None else None,
                         "breakdown": {part: r.breakdown.get(part, 0.0) for part in PARTS
                                       if part != "native" or part in r.breakdown}}
                        for r in reports],
            "notes": _notes(reports),
        }))
        return 0
    out = console()
    what = "" if schedule.collective == "allreduce" else f" {schedule.collective}"
    out.print(f"[bold]{plan_name(schedule)}[/bold]{what} on {cluster.name}: "
              f"{plural(cluster.nranks, 'rank')}, {plural(schedule.nchunks, 'chunk')}, "
              f"{plural(schedule.nsteps, 'step')}")
    out.print(f"cost profile {costs.summary()}")
    if reports and reports[0].resolution != EPS_T:
        out.print(f"time resolution {reports[0].resolution:g} of the clock (events closer "
                  "than that happen at once)")
    if part is not None and schedule.collective != "allreduce":
        out.print(f"lower bound (any {schedule.collective}, ForestColl's cut): the "
                  "bound (us) column")
    elif part is not None:
        # Both bounds grow linearly with the size: one factor says where the other is.
        factor = rsag_bound(cluster, 1 << 20) / lower_bound(cluster, 1 << 20)
        out.print(f"lower bound: {part}")
        out.print(f"RS+AG cut bound (reduce-scatter + allgather schedules): {factor:.3g} x "
                  f"the lower bound")
    if part is not None:
        out.print(f"bottleneck cut: {cut}")
    for line in _made_for(planned, args.sizes):
        out.print(line)
    sizes = [f"{r.size}{'*' if planned not in (None, r.size) else ' '}" for r in reports]
    columns = tuple(c for c in COLUMNS if c.header != LATENCY.header or p2p_bound)
    t, left_out = fit_table(columns, [
        [size, str(r.size // args.dtype_size), f"{r.time_s * 1e6:.2f}", f"{r.algbw / 1e9:.2f}",
         f"{r.busbw / 1e9:.2f}", f"{r.lower_bound_s * 1e6:.2f}",
         *_us(latency[r.size]), _x_bound(r), _vs_nccl(r)]
        for size, r in zip(sizes, reports)], out.width)
    out.print(t)
    note = left_out_note(left_out, out.width)
    if note:
        out.print(note)
    out.print("vs bound: time / lower bound (1.00x: no schedule is faster)")
    if p2p_bound:
        out.print(f"lat bound: the latency-aware bound under {costs.name}: a point-to-point "
                  f"plan's bandwidth bound plus the fewest steps it pays (docs/COST_MODEL.md)")
    if any(r.nccl is not None for r in reports):
        out.print("vs nccl: NCCL's time / the plan's (above 1.00x: faster than NCCL)")
    # Contention exists on a calibrated host only, native time with native steps only:
    # columns of zeros elsewhere.
    parts = [name for name in PARTS if name not in ("contention", "native")
             or any(r.breakdown.get(name, 0.0) for r in reports)]
    t, left_out = fit_table([Column("size\n(B)"), *(Column(f"{name}\n(us)") for name in parts)],
                            [[size, *(f"{r.breakdown.get(name, 0.0) * 1e6:.2f}"
                                      for name in parts)]
                             for size, r in zip(sizes, reports)], out.width,
                            title="Where the time goes (critical path)")
    out.print(t)
    out.print("bandwidth: bytes moving, link sharing included; latency: alpha and path")
    out.print("latency; overhead: call, step and posting costs; reduce: adds")
    if "contention" in parts:
        out.print("contention: ranks taking turns on a host with fewer cores than ranks")
    if "native" in parts:
        out.print("native: inside native collectives (priced by "
                  f"{', '.join(sorted({n.priced_by.split(' x')[0] for r in reports for n in r.natives}))})")
    for line in _notes(reports):
        out.print(f"note: {line}")
    if any(r.nccl is not None for r in reports):
        from .plan import told
        first = next(r.nccl for r in reports if r.nccl is not None)
        t, _ = fit_table(NCCL_COLUMNS, [
            [size, f"{r.nccl.time_s * 1e6:.2f}", f"{r.nccl.busbw / 1e9:.2f}",
             r.nccl.algorithm, r.nccl.protocol, str(r.nccl.channels),
             r.nccl.limited_by]
            for size, r in zip(sizes, reports) if r.nccl is not None], out.width,
            title=f"nccl: what NCCL {told(first)} runs here (docs/NCCL_MODEL.md)")
        out.print(t)
        out.print("set by: latency, NCCL's own speeds (nccl), or the fabric's busiest "
                  "link, which NCCL does not see")
    return 0


#: The latency-aware bound's column: only under a profile with latency.
LATENCY = Column("lat bound\n(us)", drop=4)
#: The table's columns: the essentials always, the others (drop > 0) while they fit.
COLUMNS = (Column("size\n(B)"), Column("count", drop=5), Column("time\n(us)"),
           Column("algbw\n(GB/s)", drop=3), Column("busbw\n(GB/s)"),
           Column("bound\n(us)", drop=1), LATENCY, Column("vs\nbound"), Column("vs\nnccl"))
NCCL_COLUMNS = (Column("size\n(B)"), Column("nccl\n(us)"), Column("busbw\n(GB/s)"),
                Column("algorithm", "left"), Column("protocol", "left"),
                Column("chan-\nnels"), Column("set by", "left", drop=1))


def _us(seconds: float | None) -> list[str]:
    """A cell in microseconds, or none (the column is left out)."""
    return [] if seconds is None else [f"{seconds * 1e6:.2f}"]


def _vs_nccl(report: SimReport) -> str:
    speedup = report.speedup_vs_nccl
    return "-" if speedup is None else f"{speedup:.2f}x"


def _x_bound(report: SimReport) -> str:
    if not report.lower_bound_s > 0:
        return "-"  # one GPU: nothing to move, no bound
    return f"{report.time_s / report.lower_bound_s:.2f}x"


def _made_for(planned: int | None, sizes: list[int]) -> list[str]:
    """The lines that say which size the plan was made for, and what ``*`` marks."""
    if planned is None:
        return ["the plan records no size it was made for (topoplan plan -o writes it);",
                "every size runs the same schedule"]
    if set(sizes) == {planned}:
        return [f"planned for this size, {format_size(planned)}"]
    return [f"planned for {format_size(planned)} ({planned} B); * marks other sizes: they run "
            "that", "schedule, which a plan for their size may beat (topoplan plan -s SIZE)"]
