#!/usr/bin/env python3
"""Plan quality of the baseline planners: predicted time / lower bound.

For every planner and every shipped topology (topologies/*.yaml) at 1 MiB and
256 MiB, plan, simulate with :func:`topoplan.simulate` and print the predicted
time divided by the topology's lower bound (ForestColl's cut bound), one row per
topology. 1.00 is optimal; lower is better. Also prints how long planning took.

    python scripts/bench_planners.py                  # every topology, both sizes
    python scripts/bench_planners.py --max-ranks 256  # skip the 1024-rank cluster
    python scripts/bench_planners.py --json out.json  # the rows as data too
    python scripts/bench_planners.py --plan-times 64,1024   # planning time only
    python scripts/bench_planners.py --collective allgather --profile ideal --sizes 256MiB
    python scripts/bench_planners.py --profile ideal --sizes 256MiB --planners mcf --channels auto

``--collective`` benches reduce-scatter or allgather (the planners that plan it; the
bound is then ForestColl's shard bound). ``--profile`` plans *and* simulates under that
cost profile (default ``nccl``, :data:`topoplan.analysis.cost.DEFAULT_PROFILE`): each plan
is made as the pipeline makes it (:func:`topoplan.planners.run` on one validated
request), so ``nccl``'s native row and every planner take the same arguments.
``--channels`` passes a channel count (or ``auto``) to the planners that plan their
channels (mcf).

Each row also says which bound the ratios are over. For an allreduce that is the
allreduce lower bound; the column ``RS+AG / lower`` gives the RS+AG cut bound over it:
``=`` where the two are equal (the optimum is known, and reachable by packing trees),
else their ratio (the optimum is only bracketed; structure-free flows can beat the RS+AG
bound there). Reduce-scatter and allgather are over their own cut bound, which is
reachable (``=``).

``main()`` returns the rows (one dict per planner x topology x size) so other
scripts can reuse them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoplan.cluster import load_cluster  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.ir.collectives import COLLECTIVES  # noqa: E402
from topoplan.planners import PLANNERS, PlanRequest, candidates, planners_for, run  # noqa: E402
from topoplan.units import format_size, parse_size  # noqa: E402


def bench(paths: list[Path], planners: list[str], sizes: list[int], max_ranks: int,
          verify_plans: bool, collective: str = "allreduce",
          profile: str | None = None, channels: int | str = 1) -> list[dict[str, Any]]:
    """Plan + simulate every (topology, planner, size); one record each."""
    try:
        from topoplan.analysis.sim import simulate
    except ImportError:
        raise SystemExit("bench_planners: topoplan.simulate is not available in this checkout "
                         "(the simulator has not been merged yet)") from None
    from topoplan.analysis.bound import lower_bound, rsag_bound
    from topoplan.ir.verify import verify
    from topoplan.planners.registry import spec_of

    rows: list[dict[str, Any]] = []
    for path in paths:
        cluster = load_cluster(path)
        if cluster.nranks > max_ranks:
            print(f"# skipping {path.name}: {cluster.nranks} ranks > --max-ranks {max_ranks}",
                  file=sys.stderr)
            continue
        for size in sizes:
            for name in planners:
                record: dict[str, Any] = {"topology": path.stem, "nranks": cluster.nranks,
                                          "planner": name, "size_bytes": size,
                                          "collective": collective, "profile": profile}
                if collective == "allreduce":
                    lower, rsag = lower_bound(cluster, size), rsag_bound(cluster, size)
                    record["bounds_ratio"] = rsag / lower if lower > 0 else 1.0
                else:
                    record["bounds_ratio"] = 1.0
                try:
                    request = PlanRequest.make(cluster, size=size, collective=collective,
                                               profile=profile)
                    t0 = time.perf_counter()
                    own = ({"channels": channels}
                           if channels != 1 and "channels" in spec_of(name).options else None)
                    schedule = run(request, name, own)
                    record["plan_s"] = time.perf_counter() - t0
                    if verify_plans:
                        verify(schedule)
                    t0 = time.perf_counter()
                    report = simulate(cluster, schedule, size=size, profile=request.profile,
                                      yardsticks=request.yardsticks)
                    record["sim_s"] = time.perf_counter() - t0
                except TopoplanError as exc:
                    record["error"] = str(exc)
                    print(f"# {path.stem} {name} {format_size(size)}: {exc}", file=sys.stderr)
                    rows.append(record)
                    continue
                record.update(time_s=report.time_s, lower_bound_s=report.lower_bound_s,
                              ratio=report.time_s / report.lower_bound_s,
                              busbw_GBps=report.busbw / 1e9, nops=schedule.nops,
                              nchunks=schedule.nchunks,
                              construction=schedule.meta.get("construction"))
                rows.append(record)
                print(f"# {path.stem:24s} {format_size(size):>8s} {name:13s} "
                      f"ratio {record['ratio']:7.2f}  plan {record['plan_s']:6.2f}s  "
                      f"sim {record['sim_s']:6.2f}s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]], planners: list[str], sizes: list[int]) -> str:
    """Markdown: one row per topology, one column per (size, planner): time / bound."""
    head = (["topology", "ranks", "RS+AG / lower"]
            + [f"{format_size(s)} {p}" for s in sizes for p in planners])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    topologies = list(dict.fromkeys((r["topology"], r["nranks"]) for r in rows))
    index = {(r["topology"], r["planner"], r["size_bytes"]): r for r in rows}
    for topo, nranks in topologies:
        first = next(r for r in rows if r["topology"] == topo)
        bounds = first.get("bounds_ratio", 1.0)
        cells = [topo, str(nranks), "=" if abs(bounds - 1) < 1e-9 else f"{bounds:.3f}"]
        for s in sizes:
            best = min((index[(topo, p, s)].get("ratio", float("inf")) for p in planners
                        if (topo, p, s) in index), default=float("inf"))
            for p in planners:
                r = index.get((topo, p, s))
                if r is None or "ratio" not in r:
                    cells.append("err" if r else "-")
                else:
                    text = f"{r['ratio']:.3f}"
                    cells.append(f"**{text}**" if r["ratio"] == best else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def leaf_spine_yaml(boxes: int) -> str:
    """topologies/leaf_spine_1024.yaml scaled to ``boxes`` x 8 GPUs (8 boxes per leaf,
    one 200 Gbit/s NIC per GPU, 4 spines)."""
    leaves = max(1, boxes // 8)
    return (f"name: leaf-spine-{boxes * 8}\nswitches:\n  - {{name: 'leaf{{i}}', count: {leaves}}}\n"
            "  - {name: 'spine{i}', count: 4}\n"
            f"boxes:\n  - {{name: 'node{{i}}', count: {boxes}, gpus: 8,\n"
            "     fabric: {bandwidth: 300 GB/s, latency: 0.5 us},\n"
            "     nics: [" + ", ".join(f"{{switch: 'leaf{{i//8}}', bandwidth: 200 Gbit/s, "
                                   f"latency: 1 us, gpus: [{j}]}}" for j in range(8)) + "]}\n"
            f"links:\n  - {{a: 'leaf{{i//4}}', b: 'spine{{i%4}}', count: {4 * leaves}, "
            "bandwidth: 200 GB/s, latency: 0.5 us}\n")


def plan_times(planners: list[str], ranks: list[int], size: int) -> list[dict[str, Any]]:
    """Planning time per planner on leaf-spine clusters of ``ranks`` GPUs.

    Reported with a baseline measured in the same run (the machine may be shared):
    the time to construct as many bare ``Op`` objects as the plan holds.
    """
    import gc

    from topoplan.cluster import loads_cluster
    from topoplan.ir.schedule import Op, OpKind

    rows = []
    for n in ranks:
        cluster = loads_cluster(leaf_spine_yaml(max(1, n // 8)))
        cluster.graph  # built once, outside the timings
        for name in planners:
            t0 = time.perf_counter()
            schedule = PLANNERS[name](cluster, size=size)
            elapsed = time.perf_counter() - t0
            nops = schedule.nops
            del schedule
            gc.disable()
            t0 = time.perf_counter()
            ops = [Op(OpKind.SEND, i & 1023, i) for i in range(nops)]
            baseline = time.perf_counter() - t0
            gc.enable()
            del ops
            rows.append({"nranks": cluster.nranks, "planner": name, "plan_s": elapsed,
                         "nops": nops, "op_baseline_s": baseline})
            print(f"{cluster.nranks:6d} ranks  {name:13s} {elapsed:7.2f} s  {nops:9d} ops  "
                  f"(bare Op() x nops: {baseline:6.2f} s, ratio {elapsed / baseline:5.2f})",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="*", type=Path,
                        help="cluster YAML files (default: topologies/*.yaml)")
    parser.add_argument("--planners", default=None,
                        help="comma-separated planner names (default: every registered one "
                             "that plans the collective)")
    parser.add_argument("--collective", default="allreduce", choices=list(COLLECTIVES),
                        help="what to plan (default allreduce)")
    parser.add_argument("--profile", default=None,
                        help="plan and simulate under this cost profile (e.g. ideal, nccl)")
    parser.add_argument("--sizes", default="1MiB,256MiB", help="comma-separated sizes")
    parser.add_argument("--max-ranks", type=int, default=1 << 30,
                        help="skip topologies with more ranks")
    parser.add_argument("--verify", action="store_true", help="also verify every plan")
    parser.add_argument("--channels", default="1",
                        help="channels for the planners that plan them (mcf): a count or "
                             "'auto' (default 1)")
    parser.add_argument("--json", type=Path, help="also write the records here")
    parser.add_argument("--plan-times", metavar="RANKS", default=None,
                        help="instead: time planning on leaf-spine clusters of these rank "
                             "counts (comma-separated, e.g. 64,1024); no simulation")
    args = parser.parse_args(argv)
    paths = args.topologies or sorted((ROOT / "topologies").glob("*.yaml"))
    if args.planners is None:
        planners = [n for n in candidates() if n in planners_for(args.collective)]
    else:
        planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        parser.error(f"unknown planners {unknown}; known: {', '.join(PLANNERS)}")
    sizes = [int(parse_size(s)) for s in args.sizes.split(",")]
    if args.plan_times:
        rows = plan_times(planners, [int(r) for r in args.plan_times.split(",")], sizes[-1])
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return rows
    channels: int | str = args.channels if args.channels == "auto" else int(args.channels)
    rows = bench(paths, planners, sizes, args.max_ranks, args.verify, args.collective,
                 args.profile, channels)
    print(f"{args.collective}: predicted time / lower bound (1.00 = optimal; best per size "
          f"in bold; profile {args.profile or 'nccl'}; channels {args.channels})\n")
    print(table(rows, planners, sizes))
    timed = [r["plan_s"] for r in rows if "plan_s" in r]
    if timed:
        worst = max((r for r in rows if "plan_s" in r), key=lambda r: r["plan_s"])
        print(f"\nslowest plan: {worst['planner']} on {worst['topology']} "
              f"({worst['nranks']} ranks, {worst.get('nops', 0)} ops): {worst['plan_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
