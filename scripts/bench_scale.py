"""Benchmark planning at scale: 64 to 8192 GPUs on generated rail-optimised and fat-tree clusters.

    PYTHONPATH=. python scripts/bench_scale.py [--gpus 64,1024,4096,8192] [--size 256MiB]
        [--fabrics rail,fat] [--max-sim-ops 1000000] [--timeout 900]

For every fabric (``topoplan.cluster.generate``: ``rail`` = rail_optimized, 8 rails of
32-box leaves, 4 spines, non-blocking; ``fat`` = fat_tree, 8 boxes per leaf, 8 spines,
2:1) and GPU count (boxes of 8 GPUs), one subprocess (so peak memory is the case's own)
plans ``mcf`` under ``ideal`` (links only) and under ``nccl`` (NCCL's latencies and
posting costs), verifies each plan, and simulates it under its profile when it has at
most ``--max-sim-ops`` ops. It prints plan, verify and simulate seconds, the ops, the
planner's estimate and the simulated time over the cut lower bound, and the peak
resident memory. Cases that run past ``--timeout`` seconds say so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FABRICS = ("rail", "fat")
PROFILES = ("ideal", "nccl")


def case(fabric: str, gpus: int, size: int, max_sim_ops: int) -> dict:
    """Run one case in this process; a dict of its numbers per profile."""
    import resource
    import warnings

    from topoplan.analysis.bound import lower_bound
    from topoplan.cluster import loads_cluster
    from topoplan.cluster.generate import fat_tree, rail_optimized
    from topoplan.planners.mcf import plan_mcf
    from topoplan.analysis.sim import simulate
    from topoplan.ir.verify import verify

    make = rail_optimized if fabric == "rail" else fat_tree
    cluster = loads_cluster(make(gpus // 8))
    bound = lower_bound(cluster, size)
    out: dict = {"fabric": fabric, "gpus": cluster.nranks}
    for profile in PROFILES:
        row: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = time.perf_counter()
            schedule = plan_mcf(cluster, size=size, check=False, profile=profile)
            row["plan_s"] = time.perf_counter() - t
        t = time.perf_counter()
        verify(schedule)
        row["verify_s"] = time.perf_counter() - t
        row["ops"] = schedule.nops
        row["construction"] = schedule.meta.get("construction", "")
        row["est_lb"] = schedule.meta["estimate_s"] / bound
        if schedule.nops <= max_sim_ops:
            t = time.perf_counter()
            row["sim_lb"] = simulate(cluster, schedule, size, profile=profile).time_s / bound
            row["sim_s"] = time.perf_counter() - t
        del schedule
        out[profile] = row
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _cell(row: dict, key: str, fmt: str, width: int) -> str:
    value = row.get(key)
    return f"{value:{width}{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}s}"


def main(argv: list[str] | None = None) -> int:
    from topoplan.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="64,1024,4096,8192")
    p.add_argument("--size", default="256MiB")
    p.add_argument("--fabrics", default=",".join(FABRICS))
    p.add_argument("--max-sim-ops", type=int, default=1_000_000)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    p.add_argument("--case", help=argparse.SUPPRESS)  # fabric:gpus, run in a subprocess
    args = p.parse_args(argv)
    size = parse_size(args.size)
    if args.case:
        fabric, gpus = args.case.split(":")
        print(json.dumps(case(fabric, int(gpus), size, args.max_sim_ops)))
        return 0
    print(f"mcf at {args.size} per rank, planned and simulated under each profile; times in "
          "seconds, ratios over the cut lower bound; peak: the case's resident memory")
    print(f"{'':12s}" + "".join(f"| {p:^47s}" for p in PROFILES))
    print(f"{'fabric':6s} {'GPUs':>5s} " + f"| {'plan_s':>6s} {'verify_s':>8s} {'sim_s':>6s} "
          f"{'ops':>9s} {'est/lb':>6s} {'sim/lb':>6s} " * len(PROFILES) + f"{'peak_MB':>7s}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for fabric in args.fabrics.split(","):
        for gpus in (int(g) for g in args.gpus.split(",")):
            cmd = [sys.executable, __file__, "--case", f"{fabric}:{gpus}", "--size", args.size,
                   "--max-sim-ops", str(args.max_sim_ops)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                      timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{fabric:6s} {gpus:5d} did not finish in {args.timeout:.0f} s", flush=True)
                continue
            if done.returncode != 0:
                print(f"{fabric:6s} {gpus:5d} failed: {done.stderr.strip().splitlines()[-1:]}",
                      flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            line = f"{fabric:6s} {row['gpus']:5d} "
            for profile in PROFILES:
                r = row[profile]
                line += (f"| {_cell(r, 'plan_s', '.1f', 6)} {_cell(r, 'verify_s', '.1f', 8)} "
                         f"{_cell(r, 'sim_s', '.1f', 6)} {r['ops']:9d} "
                         f"{_cell(r, 'est_lb', '.3f', 6)} {_cell(r, 'sim_lb', '.3f', 6)} ")
            print(line + f"{row['peak_mb']:7.0f}", flush=True)
            for profile in PROFILES:
                print(f"{'':12s}  {profile}: {row[profile]['construction']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
