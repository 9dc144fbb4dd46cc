#!/usr/bin/env python
"""Planned reduce-scatter and allgather (and allreduce) against the transport's own, for real.

For each transport (Open MPI, torch.distributed/gloo), collective and algorithm it runs
``topoplan bench --algorithm ALG --cluster CLUSTER --collective C --baseline native
--profile mpi|gloo --json`` (one ``mpiexec`` launch: every rank replays the plan with
``topoplan.ReduceScatter`` / ``AllGather`` / ``Allreduce``, checks every element, and
times the native collective, ``MPI_Reduce_scatter_block`` / ``MPI_Allgather`` or
``dist.reduce_scatter_tensor`` / ``all_gather_into_tensor``, on the same buffers in the
same launch), ``--repeat`` times round robin, and prints per cell the medians: the
plan's and the native busbw (nccl-tests' factor: ``(N-1)/N`` for reduce-scatter and
allgather), the plan over the native (median of the per-launch ratios, with their
range), and measured over the simulator's prediction on this machine (the shipped
calibrated ``mpi`` / ``gloo`` profiles, measured on the 2-core VM this project is
developed on). Exit 1 if any element of any run was wrong.

    PYTHONPATH=. python scripts/bench_collectives.py [--cluster topologies/dgx1_v100.yaml]
        [--transport mpi,torch] [--collective allgather,reduce_scatter]
        [--algorithms ring,auto] [--sizes 1MiB,16MiB,64MiB] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoplan.runtime.bench import load_average  # noqa: E402
from topoplan.units import format_size  # noqa: E402

PROFILE = {"mpi": "mpi", "torch": "gloo"}


def _run(transport: str, collective: str, algorithm: str, cluster: str, sizes: str,
         timeout: float) -> dict:
    argv = [sys.executable, "-m", "topoplan", "bench", "--algorithm", algorithm, "--cluster",
            cluster, "--collective", collective, "--sizes", sizes, "--baseline", "native",
            "--transport", transport, "--profile", PROFILE[transport], "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"bench_collectives: {' '.join(argv[3:])} failed "
                         f"({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default=str(ROOT / "topologies" / "dgx1_v100.yaml"))
    parser.add_argument("--transport", default="mpi,torch", help="comma list of mpi, torch")
    parser.add_argument("--collective", default="allgather,reduce_scatter",
                        help="comma list of allreduce, reduce_scatter, allgather")
    parser.add_argument("--algorithms", default="ring,auto", help="comma list of planners")
    parser.add_argument("--sizes", default="1MiB,16MiB,64MiB",
                        help="full-buffer sizes (default 1MiB,16MiB,64MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="launches per cell, round robin")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    parser.add_argument("--json", type=Path, default=None, help="write every launch's rows here")
    args = parser.parse_args()
    cells = [(t, c, a) for t in args.transport.split(",") for c in args.collective.split(",")
             for a in args.algorithms.split(",")]
    runs: dict[tuple[str, str, str], list[dict]] = {cell: [] for cell in cells}
    started, load = time.perf_counter(), [load_average()]
    for k in range(args.repeat):
        for cell in cells:
            print(f"[{k + 1}/{args.repeat}] {' '.join(cell)}", file=sys.stderr, flush=True)
            runs[cell].append(_run(*cell, args.cluster, args.sizes, args.timeout))
            load.append(load_average())
    seconds = time.perf_counter() - started
    first = next(iter(runs.values()))[0]
    nranks = first["schedule"]["nranks"]
    print(f"# {Path(args.cluster).stem}, {nranks} ranks on {os.cpu_count()} cores; median of "
          f"{args.repeat} launches per cell, round robin ({seconds:.0f} s, load average "
          f"{min(load):.1f}-{max(load):.1f}); float32")
    print(f"{'transport':<10} {'collective':<15} {'plan':<12} {'size':>6} {'busbw':>7} "
          f"{'native':>26} {'busbw':>7} {'plan/native':>17} {'meas/pred':>9} {'#wrong':>6}")
    wrong = 0
    for (transport, collective, algorithm), launches in runs.items():
        chosen = launches[0]["schedule"].get("chosen")
        name = f"{algorithm} ({chosen})" if chosen else algorithm
        for i, row in enumerate(launches[0]["rows"]):
            rows = [launch["rows"][i] for launch in launches]
            wrong += sum(r["wrong"] + (r["native_wrong"] or 0) for r in rows)
            busbw = statistics.median(r["busbw"] for r in rows)
            native = [r for r in rows if r["native_busbw"] is not None]
            ratios = [r["ratio"] for r in native]
            nat = (f"{statistics.median(r['native_busbw'] for r in native):>7.3f}"
                   if native else f"{'-':>7}")
            ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                     if ratios else "-")
            pred = [r["measured_over_predicted"] for r in rows
                    if r["measured_over_predicted"] is not None]
            print(f"{transport:<10} {collective:<15} {name:<12} {format_size(row['size']):>6} "
                  f"{busbw:>7.3f} {launches[0]['native']:>26} {nat} {ratio:>17} "
                  f"{statistics.median(pred) if pred else float('nan'):>9.2f} "
                  f"{sum(r['wrong'] for r in rows):>6}")
            for note in dict.fromkeys(r["native_note"] for r in rows if r["native_note"]):
                print(f"    native not run: {note}")
    if args.json:
        args.json.write_text(json.dumps({" ".join(cell): launches
                                         for cell, launches in runs.items()}, indent=1))
    print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
