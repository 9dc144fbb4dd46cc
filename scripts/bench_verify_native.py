"""Benchmark verify() on composed schedules with native steps against their lowering.

    PYTHONPATH=. python scripts/bench_verify_native.py [--quick] [--repeat 3]

A composed allreduce on boxes of 8 ranks (``tests/support/native_programs.py``,
``rails``: a native reduce-scatter in each box, a native allreduce over each rail of
``part`` chunks, a native allgather in each box) at 256, 1024 and 2048 ranks (``--quick``:
256 and 1024). Per case: :func:`topoplan.verify` on the native schedule,
:func:`topoplan.ir.passes.lower_native`, and ``verify`` on the lowered schedule (the
baseline, measured in the same run: the same collective as point-to-point steps, each
rail a ring), each from scratch (a fresh copy: the matching is cached per object), best
of ``--repeat``. Prints the table and returns its rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _best(work: Callable, schedule, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        fresh = dataclasses.replace(schedule)  # a new object: no cached matching
        t = time.perf_counter()
        out = work(fresh)
        best = min(best, time.perf_counter() - t)
        del fresh
    return best, out


def main(argv: list[str] | None = None) -> list[dict]:
    from tests.support.native_programs import rails
    from topoplan.ir.passes import lower_native
    from topoplan.ir.verify import verify

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the 2048-rank case")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best of)")
    args = parser.parse_args(argv)
    per_box = 8
    nboxes = [32, 128] if args.quick else [32, 128, 256]
    rows = []
    print(f"{'ranks':>6} {'native ops':>10} {'lowered ops':>11} {'verify native':>13} "
          f"{'lower':>8} {'verify lowered':>14} {'lowered/native':>14}")
    for m in nboxes:
        schedule = rails(m, per_box, part=m)  # a rail of m ranks on m chunks: a ring
        t_native, report = _best(verify, schedule, args.repeat)
        t_lower, lowered = _best(lower_native, schedule, args.repeat)
        t_lowered, _ = _best(verify, lowered, args.repeat)
        row = {"ranks": schedule.nranks, "native_ops": schedule.nops,
               "lowered_ops": lowered.nops, "collectives": report.ncollectives,
               "verify_native_s": t_native, "lower_s": t_lower,
               "verify_lowered_s": t_lowered, "ratio": t_lowered / t_native}
        rows.append(row)
        print(f"{row['ranks']:>6} {row['native_ops']:>10} {row['lowered_ops']:>11} "
              f"{t_native:>12.3f}s {t_lower:>7.3f}s {t_lowered:>13.3f}s {row['ratio']:>13.1f}x")
    return rows


if __name__ == "__main__":
    main()
