"""``topoplan plan CLUSTER.yaml``: every candidate planner side by side, and the chosen schedule."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

from ..cluster import Cluster, load_cluster
from ..errors import TopoplanError
from ..units import format_bandwidth, format_size, format_time
from .common import console, size_arg, status, table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="plan an allreduce for a cluster; compare every candidate",
        description="Plan an allreduce with every candidate planner, simulate each on the "
                    "cluster, print them side by side against the lower bound, and write the "
                    "chosen schedule.")
    p.add_argument("cluster", help="cluster YAML file")
    p.add_argument("-a", "--algorithm", default="auto",
                   help="planner to choose (default auto: the fastest in simulation)")
    p.add_argument("-s", "--size", type=size_arg, default=256 << 20, metavar="SIZE",
                   help="message size, e.g. 1MiB (default 256MiB)")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the chosen schedule here")
    p.add_argument("--candidates", metavar="A,B,...",
                   help="planners to compare (default: all registered)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=cmd_plan)


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    schedule: object
    report: object
    plan_s: float


def compare(cluster: Cluster, size: int, algorithms: list[str]) -> list[Candidate]:
    """Plan, verify and simulate each algorithm; the rows of the table."""
    from ..planners import plan
    from ..simulate import simulate
    from ..verify import verify

    rows = []
    for name in algorithms:
        with status(f"planning {name} for {cluster.nranks} ranks ..."):
            start = time.perf_counter()
            schedule = plan(cluster, algorithm=name, size=size)
            elapsed = time.perf_counter() - start
            verify(schedule)
            report = simulate(cluster, schedule, size)
        rows.append(Candidate(name, schedule, report, elapsed))
    return rows


def candidate_names(requested: str | None) -> list[str]:
    from ..planners import PLANNERS
    known = [name for name in PLANNERS if name != "auto"]
    if not requested:
        return known
    names = [n.strip() for n in requested.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLANNERS]
    if unknown:
        raise TopoplanError(f"unknown planner {unknown[0]!r}; known: {', '.join(PLANNERS)}")
    return names


def cmd_plan(args: argparse.Namespace) -> int:
    from ..bound import bottleneck, lower_bound

    cluster = load_cluster(args.cluster)
    names = candidate_names(args.candidates)
    if args.algorithm != "auto" and args.algorithm not in names:
        names = candidate_names(args.algorithm) + names
    rows = compare(cluster, args.size, names)
    if args.algorithm == "auto":
        chosen = min(rows, key=lambda c: c.report.time_s)
    else:
        chosen = next(c for c in rows if c.algorithm == args.algorithm)
    bound = lower_bound(cluster, args.size)

    if args.output:
        chosen.schedule.with_meta(
            size_bytes=args.size, predicted_time_s=chosen.report.time_s,
            lower_bound_s=bound).save(args.output)

    if args.json:
        print(json.dumps({
            "cluster": cluster.name, "nranks": cluster.nranks, "size_bytes": args.size,
            "lower_bound_s": bound, "chosen": chosen.algorithm,
            "candidates": [{"algorithm": c.algorithm, "time_s": c.report.time_s,
                            "algbw_GBps": _finite(c.report.algbw / 1e9),
                            "busbw_GBps": _finite(c.report.busbw / 1e9),
                            "percent_of_bound": _percent(bound, c.report.time_s),
                            "steps": c.schedule.nsteps, "chunks": c.schedule.nchunks,
                            "plan_s": c.plan_s}
                           for c in rows]}))
        return 0

    out = console()
    out.print(f"[bold]{cluster.name}[/bold]: {cluster.nranks} ranks, allreduce of "
              f"{format_size(args.size)}; lower bound {format_time(bound)}")
    t = table("algorithm", "time", "algbw (GB/s)", "busbw (GB/s)", "% of bound", "steps", "chunks",
              "plan time")
    for c in sorted(rows, key=lambda c: c.report.time_s):
        mark = " *" if c is chosen else ""
        t.add_row(c.algorithm + mark, format_time(c.report.time_s), _gbps(c.report.algbw),
                  _gbps(c.report.busbw), f"{_percent(bound, c.report.time_s):.1f}",
                  str(c.schedule.nsteps), str(c.schedule.nchunks), format_time(c.plan_s))
    out.print(t)
    if cluster.nranks > 1:
        cut = bottleneck(cluster)
        out.print(f"bottleneck cut: {cut.gpus} GPUs behind {format_bandwidth(cut.bandwidth)} out")
    out.print(f"chosen: {chosen.algorithm}" + (f" -> {args.output}" if args.output else
                                               " (write it with -o PLAN.json)"))
    return 0


def _percent(bound: float, time_s: float) -> float:
    return 100.0 * bound / time_s if time_s > 0 else 100.0


def _finite(value: float) -> float | None:
    """JSON has no infinity: a 1-rank allreduce moves nothing and has no bandwidth."""
    return value if value != float("inf") else None


def _gbps(bytes_per_s: float) -> str:
    return "-" if bytes_per_s in (0.0, float("inf")) else f"{bytes_per_s / 1e9:.2f}"
