"""Benchmark channels (IR v4): the best point-to-point plans on 1, 2 and 4 channels, simulated.

    PYTHONPATH=. python scripts/bench_channels.py [--clusters dgx_a100_x4,fat64,rail64]
        [--sizes 1MiB,16MiB,256MiB] [--planners mcf,ring] [--channels 1,2,4]
        [--skews 1,1.2] [--profile nccl] [--planned] [--json]
    PYTHONPATH=. python scripts/bench_channels.py --shipped [--sizes 256MiB]
        [--collectives allreduce,reduce_scatter,allgather] [--max-sim-ops 250000]

For every cluster, size and planner, the plan is made once under the profile (``nccl``
by default), put on each channel count with
:func:`topoplan.ir.passes.channelize` (what ``topoplan plan --channels N``
does, with each slice ratio of ``--skews``), verified and simulated
(:func:`topoplan.simulate`). The table gives the predicted time, the ratio against the
same plan on one channel measured in the same run (``vs 1ch``: above 1.00x the channels
are faster), the time over the cut lower bound and over the latency-aware bound
(:func:`topoplan.analysis.bound.latency_bound`), the ops and the seconds the simulation
took. ``--planned`` adds, for mcf on each channel count and skew, the plan mcf makes
for those channels itself (``topoplan.plan(..., "mcf", channels=N)``: its pipeline sized
for them, row ``mcf*``), with its estimate (the planner's channel model) over the
simulated time (``est/sim``).

``--shipped`` measures how near the latency-aware bound mcf comes on every shipped
topology (``topologies/*.yaml``): for each collective, mcf as planned by default (one channel)
and mcf picking its channels (``channels="auto"``, vectored for reduce-scatter and
allgather), over the latency-aware bound; simulated up to ``--max-sim-ops`` ops, the
planner's estimate (``~``) above.

Clusters: ``dgx_a100_x4`` (shipped: 4 DGX A100 boxes, 32 GPUs), ``fat64`` (a two-tier fat
tree of 8 boxes x 8 GPUs, 2:1, :func:`topoplan.cluster.generate.fat_tree`), ``rail64``
(8 boxes x 8 GPUs on 8 rails, :func:`topoplan.cluster.generate.rail_optimized`), or any
shipped topology by its file name (``leaf_spine_1024``: minutes per case).

The simulator runs a rank's channels independently (IR v4). Channels of equal slices
(skew 1) run in phase, each paying the same step latencies on its share of the bytes,
and take exactly what one channel takes; unequal slices end their steps apart, so one
channel's latency hides behind another's transfer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_CLUSTERS = ("dgx_a100_x4", "fat64", "rail64")
DEFAULT_SIZES = ("1MiB", "16MiB", "256MiB")


def load(name: str) -> Any:
    """A cluster by the names above."""
    from topoplan.cluster import loads_cluster
    from topoplan.cluster.generate import fat_tree, rail_optimized

    if name == "fat64":
        return loads_cluster(fat_tree(8, name="fat-tree-64"), "fat64")
    if name == "rail64":
        return loads_cluster(rail_optimized(8, name="rail-64"), "rail64")
    from topoplan.cluster import load_cluster
    return load_cluster(ROOT / "topologies" / f"{name}.yaml")


def run(clusters: list[str], sizes: list[str], planners: list[str], channels: list[int],
        profile: str = "nccl", out: Any = sys.stdout,
        skews: tuple[float, ...] = (1.0, 1.2), planned: bool = False) -> list[dict[str, Any]]:
    """Measure every case, print a row each as it is measured, and return the rows."""
    import topoplan
    from topoplan.analysis.bound import latency_bound
    from topoplan.ir.passes import channelize
    from topoplan.units import format_time, parse_size

    rows: list[dict[str, Any]] = []
    head = (f"{'cluster':14s} {'size':>6s} {'planner':8s} {'ch':>2s} {'skew':>4s} "
            f"{'time':>10s} {'vs 1ch':>7s} {'x bound':>7s} {'x lat':>6s} {'ops':>8s} "
            f"{'sim_s':>6s} {'est/sim':>7s}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for cname in clusters:
        cluster = load(cname)
        for size_text in sizes:
            size = parse_size(size_text)
            latency = latency_bound(cluster, size, profile, "allreduce")
            for planner in planners:
                t0 = time.perf_counter()
                base = topoplan.plan(cluster, planner, size=size, profile=profile)
                plan_s = time.perf_counter() - t0
                one = None
                cases = [(n, skew) for n in channels for skew in (skews if n > 1 else (1.0,))]
                todo = [(n, skew, False) for n, skew in cases]
                if planned and planner == "mcf":
                    todo += [(n, skew, True) for n, skew in cases if n > 1]
                for n, skew, own in todo:
                    if own:
                        schedule = topoplan.plan(cluster, "mcf", size=size, profile=profile,
                                                 channels=n, channel_skew=skew)
                    else:
                        schedule = channelize(base, n, skew)
                    topoplan.verify(schedule)
                    est = schedule.meta.get("estimate_s") if own or n == 1 else None
                    t0 = time.perf_counter()
                    report = topoplan.simulate(cluster, schedule, size=size, profile=profile)
                    sim_s = time.perf_counter() - t0
                    if n == 1:
                        one = report.time_s
                    row = {"cluster": cluster.name, "nranks": cluster.nranks, "size": size,
                           "planner": planner, "channels": n, "skew": skew,
                           "time_s": report.time_s, "one_channel_s": one,
                           "vs_one_channel": one / report.time_s if one else None,
                           "lower_bound_s": report.lower_bound_s,
                           "x_bound": report.time_s / report.lower_bound_s
                           if report.lower_bound_s > 0 else None,
                           "latency_bound_s": latency, "x_latency_bound": report.time_s / latency,
                           "ops": schedule.nops, "plan_s": plan_s, "sim_s": sim_s,
                           "planned_for_channels": own, "estimate_s": est}
                    rows.append(row)
                    vs = f"{row['vs_one_channel']:.2f}x" if row["vs_one_channel"] else "-"
                    xb = f"{row['x_bound']:.2f}x" if row["x_bound"] else "-"
                    ratio = f"{est / report.time_s:7.3f}" if est else f"{'-':>7s}"
                    name = planner + ("*" if own else "")
                    print(f"{cname[:14]:14s} {size_text:>6s} {name:8s} {n:2d} {skew:4.2g} "
                          f"{format_time(report.time_s):>10s} {vs:>7s} {xb:>7s} "
                          f"{row['x_latency_bound']:5.3f} {schedule.nops:8d} {sim_s:6.2f} "
                          f"{ratio}", file=out, flush=True)
    return rows


def shipped(sizes: list[str], collectives: list[str], profile: str, max_sim_ops: int,
            out: Any = sys.stdout) -> list[dict[str, Any]]:
    """mcf on one channel and on the channels it picks, every shipped topology."""
    import warnings

    import topoplan
    from topoplan.analysis.bound import latency_bound
    from topoplan.cluster import load_cluster
    from topoplan.units import parse_size

    rows: list[dict[str, Any]] = []
    head = (f"{'topology':20s} {'collective':14s} {'size':>6s} {'1 channel':>10s} "
            f"{'picked':>10s} {'ch':>2s} {'vec':>3s} {'gain':>6s} {'plan_s':>6s}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        cluster = load_cluster(path)
        for collective in collectives:
            for size_text in sizes:
                size = parse_size(size_text)
                bound = latency_bound(cluster, size, profile, collective)
                timed = []
                t0 = time.perf_counter()
                for options in ({}, {"channels": "auto",
                                     "vectored": collective != "allreduce"}):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        schedule = topoplan.plan(cluster, "mcf", size=size, profile=profile,
                                                 collective=collective, **options)
                    if schedule.nops <= max_sim_ops:
                        t = topoplan.simulate(cluster, schedule, size=size,
                                              profile=profile).time_s
                        timed.append((t, "", schedule))
                    else:
                        timed.append((schedule.meta["estimate_s"], "~", schedule))
                plan_s = time.perf_counter() - t0
                (one, m1, _), (best, m2, picked) = timed
                row = {"topology": path.stem, "collective": collective, "size": size,
                       "one_channel": one / bound, "picked": best / bound,
                       "channels": picked.nchannels, "vectored": bool(picked.meta.get("vectored")),
                       "estimated": bool(m2), "seconds": plan_s}
                rows.append(row)
                print(f"{path.stem[:20]:20s} {collective:14s} {size_text:>6s} "
                      f"{m1:>1s}{one / bound:9.3f} {m2:>1s}{best / bound:9.3f} "
                      f"{picked.nchannels:2d} {'yes' if row['vectored'] else 'no':>3s} "
                      f"{one / best:5.2f}x {plan_s:6.1f}", file=out, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", default=",".join(DEFAULT_CLUSTERS))
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES))
    p.add_argument("--planners", default="mcf,ring")
    p.add_argument("--channels", default="1,2,4")
    p.add_argument("--skews", default="1,1.2",
                   help="slice ratios to put each plan on channels with (1: equal slices)")
    p.add_argument("--profile", default="nccl")
    p.add_argument("--planned", action="store_true",
                   help="also mcf planned for each channel count (its channel model)")
    p.add_argument("--shipped", action="store_true",
                   help="mcf on one channel and on the channels it picks, every shipped "
                        "topology and collective")
    p.add_argument("--collectives", default="allreduce,reduce_scatter,allgather")
    p.add_argument("--max-sim-ops", type=int, default=250_000)
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = p.parse_args(argv)
    split = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    t0 = time.perf_counter()
    quiet = open("/dev/null", "w") if args.json else sys.stdout
    if args.shipped:
        sizes = split(args.sizes) if args.sizes != ",".join(DEFAULT_SIZES) else ["256MiB"]
        rows = shipped(sizes, split(args.collectives), args.profile, args.max_sim_ops, quiet)
        legend = ("time over the latency-aware bound (topoplan.analysis.bound.latency_bound); "
                  "picked: mcf with channels='auto' (vectored for reduce-scatter and "
                  "allgather); ~: the planner's estimate (over --max-sim-ops ops)")
    else:
        channels = sorted({int(c) for c in split(args.channels)})
        if channels[0] != 1:
            channels.insert(0, 1)  # the baseline of the ratios, measured in the same run
        rows = run(split(args.clusters), split(args.sizes), split(args.planners), channels,
                   args.profile, out=quiet, skews=tuple(float(k) for k in split(args.skews)),
                   planned=args.planned)
        legend = ("vs 1ch: the same plan's simulated time on one channel / on N (above 1.00x: "
                  "faster on channels); skew: each channel's slice over the next one's; "
                  "x bound: time / cut lower bound; x lat: time / latency-aware bound; mcf*: "
                  "mcf planned for the channels, est/sim: its estimate over the simulated time")
    if args.json:
        quiet.close()
        print(json.dumps(rows))
    else:
        print(f"\nprofile {args.profile}; {legend}; {len(rows)} cases in "
              f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
