"""Benchmark channels (IR v4): the best point-to-point plans on 1, 2 and 4 channels, simulated.

    PYTHONPATH=. python scripts/bench_channels.py [--clusters dgx_a100_x4,fat64,rail64]
        [--sizes 1MiB,16MiB,256MiB] [--planners mcf,ring] [--channels 1,2,4]
        [--profile nccl] [--json]

For every cluster, size and planner, the plan is made once under the profile (``nccl``
by default), put on each channel count with
:func:`topoplan.planners.channels.channelize` (what ``topoplan plan --channels N``
does), verified and simulated (:func:`topoplan.simulate`). The table gives the predicted
time, the ratio against the same plan on one channel measured in the same run (``vs
1ch``: above 1.00x the channels are faster), the time over the cut lower bound, the ops
and the seconds the simulation took.

Clusters: ``dgx_a100_x4`` (shipped: 4 DGX A100 boxes, 32 GPUs), ``fat64`` (a two-tier fat
tree of 8 boxes x 8 GPUs, 2:1, :func:`topoplan.cluster.generate.fat_tree`), ``rail64``
(8 boxes x 8 GPUs on 8 rails, :func:`topoplan.cluster.generate.rail_optimized`), or any
shipped topology by its file name (``leaf_spine_1024``: minutes per case).

What the numbers mean depends on the simulator: one that runs a rank's channels
independently (IR v4) hides a channel's step latency behind another's transfer; one
that runs them in lock-step gains nothing from channels and pays for the extra, smaller
messages. The script prints what it measured either way.
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
        profile: str = "nccl", out: Any = sys.stdout) -> list[dict[str, Any]]:
    """Measure every case, print a row each as it is measured, and return the rows."""
    import topoplan
    from topoplan.planners.channels import channelize
    from topoplan.units import format_time, parse_size

    rows: list[dict[str, Any]] = []
    head = (f"{'cluster':14s} {'size':>6s} {'planner':8s} {'ch':>2s} {'time':>10s} "
            f"{'vs 1ch':>7s} {'x bound':>7s} {'ops':>8s} {'sim_s':>6s}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for cname in clusters:
        cluster = load(cname)
        for size_text in sizes:
            size = parse_size(size_text)
            for planner in planners:
                t0 = time.perf_counter()
                base = topoplan.plan(cluster, planner, size=size, profile=profile)
                plan_s = time.perf_counter() - t0
                one = None
                for n in channels:
                    schedule = channelize(base, n)
                    topoplan.verify(schedule)
                    t0 = time.perf_counter()
                    report = topoplan.simulate(cluster, schedule, size=size, profile=profile)
                    sim_s = time.perf_counter() - t0
                    if n == 1:
                        one = report.time_s
                    row = {"cluster": cluster.name, "nranks": cluster.nranks, "size": size,
                           "planner": planner, "channels": n, "time_s": report.time_s,
                           "one_channel_s": one,
                           "vs_one_channel": one / report.time_s if one else None,
                           "lower_bound_s": report.lower_bound_s,
                           "x_bound": report.time_s / report.lower_bound_s
                           if report.lower_bound_s > 0 else None,
                           "ops": schedule.nops, "plan_s": plan_s, "sim_s": sim_s}
                    rows.append(row)
                    vs = f"{row['vs_one_channel']:.2f}x" if row["vs_one_channel"] else "-"
                    xb = f"{row['x_bound']:.2f}x" if row["x_bound"] else "-"
                    print(f"{cname[:14]:14s} {size_text:>6s} {planner:8s} {n:2d} "
                          f"{format_time(report.time_s):>10s} {vs:>7s} {xb:>7s} "
                          f"{schedule.nops:8d} {sim_s:6.2f}", file=out, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", default=",".join(DEFAULT_CLUSTERS))
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES))
    p.add_argument("--planners", default="mcf,ring")
    p.add_argument("--channels", default="1,2,4")
    p.add_argument("--profile", default="nccl")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = p.parse_args(argv)
    split = lambda text: [part.strip() for part in text.split(",") if part.strip()]  # noqa: E731
    channels = sorted({int(c) for c in split(args.channels)})
    if channels[0] != 1:
        channels.insert(0, 1)  # the baseline of the ratios, measured in the same run
    t0 = time.perf_counter()
    quiet = open("/dev/null", "w") if args.json else sys.stdout
    rows = run(split(args.clusters), split(args.sizes), split(args.planners), channels,
               args.profile, out=quiet)
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"\nprofile {args.profile}; vs 1ch: the same plan's simulated time on one "
              f"channel / on N (above 1.00x: faster on channels); x bound: time / cut lower "
              f"bound; {len(rows)} cases in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
