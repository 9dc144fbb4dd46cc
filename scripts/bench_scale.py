"""Benchmark planning at scale: 64 to 8192 GPUs on generated rail-optimised and fat-tree clusters.

    PYTHONPATH=. python scripts/bench_scale.py [--gpus 64,1024,4096,8192] [--size 256MiB]
        [--fabrics rail,fat] [--max-sim-ops 600000] [--timeout 900]

For every fabric (``topoplan.cluster.generate``: ``rail`` = rail_optimized, 8 rails of
32-box leaves, 4 spines, non-blocking; ``fat`` = fat_tree, 8 boxes per leaf, 8 spines,
2:1) and GPU count (boxes of 8 GPUs), one subprocess (so peak memory is the case's own)
plans ``mcf`` under the default profile, verifies, and simulates when the plan has at
most ``--max-sim-ops`` ops. It prints plan, verify and simulate seconds, the peak
resident memory, the ops, the planner's estimate and the simulated time over the cut
lower bound, and the estimate under the ``nccl`` profile (a second plan). Cases that
run past ``--timeout`` seconds say so.
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


def case(fabric: str, gpus: int, size: int, max_sim_ops: int) -> dict:
    """Run one case in this process; a dict of its numbers."""
    import resource
    import warnings

    from topoplan.bound import lower_bound
    from topoplan.cluster import loads_cluster
    from topoplan.cluster.generate import fat_tree, rail_optimized
    from topoplan.planners.mcf import plan_mcf
    from topoplan.simulate import simulate
    from topoplan.verify import verify

    make = rail_optimized if fabric == "rail" else fat_tree
    cluster = loads_cluster(make(gpus // 8))
    bound = lower_bound(cluster, size)
    out: dict = {"fabric": fabric, "gpus": cluster.nranks}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        schedule = plan_mcf(cluster, size=size, check=False)
        out["plan_s"] = time.perf_counter() - t
        t = time.perf_counter()
        verify(schedule)
        out["verify_s"] = time.perf_counter() - t
        out["ops"] = schedule.nops
        out["construction"] = schedule.meta.get("construction", "")
        out["est_lb"] = schedule.meta["estimate_s"] / bound
        if schedule.nops <= max_sim_ops:
            t = time.perf_counter()
            out["sim_lb"] = simulate(cluster, schedule, size).time_s / bound
            out["sim_s"] = time.perf_counter() - t
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        del schedule
        nccl = plan_mcf(cluster, size=size, check=False, profile="nccl")
        out["nccl_est_lb"] = nccl.meta["estimate_s"] / bound
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
    p.add_argument("--max-sim-ops", type=int, default=600_000)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    p.add_argument("--case", help=argparse.SUPPRESS)  # fabric:gpus, run in a subprocess
    args = p.parse_args(argv)
    size = parse_size(args.size)
    if args.case:
        fabric, gpus = args.case.split(":")
        print(json.dumps(case(fabric, int(gpus), size, args.max_sim_ops)))
        return 0
    print(f"mcf at {args.size} per rank; times in seconds, ratios over the cut lower bound "
          "(default profile; nccl_est: the nccl profile's plan)")
    head = (f"{'fabric':6s} {'GPUs':>5s} {'plan_s':>7s} {'verify_s':>8s} {'sim_s':>7s} "
            f"{'peak_MB':>7s} {'ops':>9s} {'est/lb':>6s} {'sim/lb':>6s} {'nccl_est':>8s}  "
            "construction")
    print(head)
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
            print(f"{fabric:6s} {row['gpus']:5d} {_cell(row, 'plan_s', '.1f', 7)} "
                  f"{_cell(row, 'verify_s', '.1f', 8)} {_cell(row, 'sim_s', '.1f', 7)} "
                  f"{_cell(row, 'peak_mb', '.0f', 7)} {row['ops']:9d} "
                  f"{_cell(row, 'est_lb', '.3f', 6)} {_cell(row, 'sim_lb', '.3f', 6)} "
                  f"{_cell(row, 'nccl_est_lb', '.3f', 8)}  {row['construction']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
