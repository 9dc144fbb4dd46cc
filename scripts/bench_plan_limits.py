"""Benchmark ``topoplan plan`` at scale as a user runs it: time, peak memory, the file.

    PYTHONPATH=. python scripts/bench_plan_limits.py [--gpus 1024,4096,8192,16384]
        [--size 1MiB] [-a auto] [--timeout 1800] [--json]
    PYTHONPATH=. python scripts/bench_plan_limits.py --gpus 1024,2048,4096,8192 \\
        -a mcf,composed,hierarchical,nccl          # one row per planner named alone

For every GPU count it generates the rail-optimised cluster of ``topoplan topo generate
rail`` (boxes of 8 GPUs, 32-box rail leaves, 4 spines) and runs ``topoplan plan CLUSTER
--size SIZE -a A -o PLAN.json --max-memory 0`` (no budget: the run is measured, not
refused) in a child process, one at a time. Each row gives the command's wall time, its
peak resident memory (``ru_maxrss`` of that child alone, taken by a process between),
the size of the file ``-o`` wrote, the chosen row, and what ``plan`` estimated
beforehand for time and memory (:func:`topoplan.planners.budget.estimate_work`).
The per-planner rows (``-a mcf`` and so on: the planner alone beside NCCL's row) are
what the estimate's model is fitted to (docs/RESULTS.md, "Planning at scale").

Timings depend on the machine and its load; peak memory and the file sizes do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_case(gpus: int, size: str, algorithm: str, timeout: float, folder: Path) -> dict:
    """Plan the ``gpus``-GPU rail cluster with ``algorithm`` in a child process and
    measure it."""
    from topoplan.cluster import loads_cluster
    from topoplan.cluster.generate import rail_optimized
    from topoplan.planners import PlanRequest
    from topoplan.planners.budget import estimate_work
    from topoplan.units import parse_size

    text = rail_optimized(gpus // 8, 8)
    cluster_file = folder / f"rail{gpus}.yaml"
    cluster_file.write_text(text)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the plausible-range warning of 16384 GPUs
        cluster = loads_cluster(text, file=str(cluster_file))
    request = PlanRequest.make(cluster, size=parse_size(size), algorithm=algorithm)
    guess = estimate_work(request)
    plan_file = folder / f"plan{gpus}-{algorithm}.json"
    command = [sys.executable, "-m", "topoplan", "plan", str(cluster_file), "--size", size,
               "-a", algorithm, "-o", str(plan_file), "--max-memory", "0", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    # One child measures the command, its only child: RUSAGE_CHILDREN is then that
    # command's own peak memory.
    measure = [sys.executable, __file__, "--measure", "--", *command]
    try:
        done = subprocess.run(measure, capture_output=True, env=env, cwd=ROOT,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"gpus": gpus, "algorithm": algorithm, "error": f"over {timeout:g} s"}
    taken = json.loads(done.stderr.decode().strip().splitlines()[-1])
    wall, peak, code = taken["wall_s"], taken["peak_bytes"], taken["rc"]
    out, err = done.stdout, taken["stderr"]
    row = {"gpus": gpus, "algorithm": algorithm, "size": size, "wall_s": round(wall, 2),
           "peak_mb": round(peak / 2**20),
           "file_mb": round(plan_file.stat().st_size / 2**20, 3) if plan_file.exists()
           else None,
           "estimate_s": round(guess.seconds, 2), "estimate_mb": round(guess.bytes / 2**20),
           "estimate_parts": {c.name: [round(c.seconds or 0.0, 2),
                                       round((c.bytes or 0.0) / 2**20)]
                              for c in guess.parts}}
    if code != 0:
        row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
        return row
    data = json.loads(out)
    row["chosen"] = data["chosen"]
    row["rows"] = {c["algorithm"]: c["plan_s"] for c in data["candidates"]}
    row["left_out"] = sorted(data["left_out"])
    plan_file.unlink(missing_ok=True)
    return row


def measure(command: list[str]) -> int:
    """Run ``command`` (stdout passed through) and write one JSON line on stderr: its
    wall time, exit status, stderr and peak resident bytes (Linux: ``ru_maxrss`` KiB)."""
    import resource
    t0 = time.perf_counter()
    done = subprocess.run(command, stdout=sys.stdout, stderr=subprocess.PIPE)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"wall_s": time.perf_counter() - t0, "rc": done.returncode,
                      "peak_bytes": peak, "stderr": done.stderr.decode(errors="replace")}),
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="1024,4096,8192,16384",
                   help="GPU counts, comma-separated (default 1024,4096,8192,16384)")
    p.add_argument("--size", default="1MiB", help="message size (default 1MiB)")
    p.add_argument("-a", "--algorithms", default="auto",
                   help="planners, comma-separated, each run alone (default auto)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        return measure(args.command)
    rows = []
    with tempfile.TemporaryDirectory(prefix="topoplan-limits-") as tmp:
        for gpus in (int(g) for g in args.gpus.split(",")):
            for algorithm in args.algorithms.split(","):
                row = run_case(gpus, args.size, algorithm, args.timeout, Path(tmp))
                rows.append(row)
                if not args.json:
                    print(_line(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


HEADER = (f"{'GPUs':>6} {'planner':<13} {'time (s)':>9} {'est (s)':>8} {'peak (MB)':>9} "
          f"{'est (MB)':>8} {'-o (MB)':>8}  chosen")


def _line(row: dict) -> str:
    if not _line.__dict__.get("shown"):
        _line.__dict__["shown"] = True
        print(HEADER)
    if "error" in row and "wall_s" not in row:
        return f"{row['gpus']:>6} {row['algorithm']:<13} {row['error']}"
    file_mb = "-" if row.get("file_mb") is None else f"{row['file_mb']:.2f}"
    peak = str(row["peak_mb"])
    tail = row.get("chosen", "") if "error" not in row else f"error: {row['error']}"
    return (f"{row['gpus']:>6} {row['algorithm']:<13} {row['wall_s']:>9.1f} "
            f"{row['estimate_s']:>8.1f} {peak:>9} {row['estimate_mb']:>8} {file_mb:>8}  {tail}")


if __name__ == "__main__":
    sys.exit(main())
