"""Executors trust only verified schedules, under real MPI: ``mpiexec -n N python -m
tests.mpi_trust --plans DIR``, from the repository root.

DIR holds ``good.json`` (a ring allreduce for N ranks) and ``flipped.json`` (the same
with one reduce flag flipped: it runs, and sums wrong). Every rank builds
:class:`topoplan.Allreduce` of ``load_schedule(flipped.json)`` over
:class:`topoplan.runtime.transports.MPI`, which must raise a ScheduleError naming what
is wrong before anything is sent; runs the good plan twice over (two executors, the
second not verified again: the verifier's calls are counted); and, with
``verified=True``, runs the flipped plan to show the wrong sums the check keeps out.
Each rank prints ``TOPOPLAN-RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import topoplan
import topoplan.ir.verify as V
from topoplan.errors import ScheduleError
from topoplan.ir.parse import load_schedule
from topoplan.runtime.transports import MPI


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=Path, required=True)
    args = parser.parse_args()
    t = MPI()
    n, rank = t.size, t.rank
    record: dict[str, Any] = {"rank": rank}
    calls = []
    real = V.verify

    def counted(schedule: Any) -> Any:
        calls.append(schedule.algorithm)
        return real(schedule)

    V.verify = counted
    try:
        try:
            topoplan.Allreduce(load_schedule(args.plans / "flipped.json"), t, timeout=30)
            record["refused"] = None
        except ScheduleError as exc:
            record["refused"] = str(exc)
        good = load_schedule(args.plans / "good.json")
        sums = []
        for _ in range(2):
            x = np.arange(1001, dtype=np.float64) + rank
            topoplan.Allreduce(good, t, timeout=30)(x)
            sums.append(bool(np.array_equal(x, n * np.arange(1001) + sum(range(n)))))
        record["good"] = sums
        x = np.arange(1001, dtype=np.float64) + rank
        flipped = load_schedule(args.plans / "flipped.json")
        topoplan.Allreduce(flipped, t, timeout=30, verified=True)(x)
        wrong = int(np.count_nonzero(x != n * np.arange(1001) + sum(range(n))))
        record["wrong_when_trusted"] = int(t.allreduce_max(float(wrong)))
        record["verify_calls"] = calls
    except Exception:  # noqa: BLE001 - reported, the test fails on it
        record["error"] = traceback.format_exc()
    print("TOPOPLAN-RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
