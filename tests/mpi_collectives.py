"""ReduceScatter and AllGather under real MPI: ``mpiexec -n N python -m tests.mpi_collectives
--plans DIR``, from the repository root.

DIR holds planned schedules named ``COLLECTIVE-ALGORITHM.json`` (written by
tests/test_transports_mpi.py). Every rank runs each of them with
:class:`topoplan.ReduceScatter` or :class:`topoplan.AllGather` over
:class:`topoplan.runtime.transports.MPI` on uneven shard sizes and two dtypes, then with calls in
flight (``start`` twice on one executor, a reduce-scatter and an allgather started
together and waited for in reverse order), checks every element against numpy, checks
the native MPI_Reduce_scatter_block / MPI_Allgather give the same, and prints one line
``TOPOPLAN-RESULT {json}``: its failures, the cases run and the plans.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import numpy as np

import topoplan
from topoplan.ir.parse import load_schedule
from topoplan.runtime.transports import MPI

SHARDS = (0, 1, 7, 1000, (1 << 16) + 3)  # elements per shard


def rs_input(n: int, m: int, rank: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s reduce-scatter input: small integers, so sums are exact."""
    return ((np.arange(n * m) % 13) + 2 * rank + (np.arange(n * m) // 5) % 3).astype(dtype)


def rs_expected(n: int, m: int, rank: int, dtype: str) -> np.ndarray:
    total = sum(rs_input(n, m, q, "float64") for q in range(n))
    return total[rank * m:(rank + 1) * m].astype(dtype)


def ag_input(m: int, rank: int, dtype: str) -> np.ndarray:
    return ((np.arange(m) * 3 + 11 * rank) % 17 - rank).astype(dtype)


def ag_expected(n: int, m: int, dtype: str) -> np.ndarray:
    return np.concatenate([ag_input(m, q, dtype) for q in range(n)]) if m else np.zeros(0, dtype)


def run_plan(t: MPI, name: str, schedule: topoplan.Schedule) -> tuple[list[str], int]:
    n, rank = t.size, t.rank
    failures: list[str] = []
    cases = 0
    rs = schedule.collective == "reduce_scatter"
    run = (topoplan.ReduceScatter if rs else topoplan.AllGather)(schedule, t, timeout=60)
    for dtype in ("float64", "float32"):
        for m in SHARDS:
            cases += 1
            if rs:
                x = rs_input(n, m, rank, dtype)
                before = x.copy()
                y = np.full(m, np.nan, dtype=dtype)
                if run(x, y) is not y:
                    failures.append(f"rank {rank}: {name} m={m}: did not return the output")
                if not np.array_equal(x, before):
                    failures.append(f"rank {rank}: {name} m={m} {dtype}: input changed")
                want = rs_expected(n, m, rank, dtype)
                native = np.full(m, np.nan, dtype=dtype)
                t.native_reduce_scatter(x, native)
            else:
                x = ag_input(m, rank, dtype)
                y = np.full(n * m, np.nan, dtype=dtype)
                if run(x, y) is not y:
                    failures.append(f"rank {rank}: {name} m={m}: did not return the output")
                want = ag_expected(n, m, dtype)
                native = np.full(n * m, np.nan, dtype=dtype)
                t.native_allgather(x, native)
            if not np.array_equal(y, want):
                bad = int(np.count_nonzero(y != want))
                failures.append(f"rank {rank}: {name} m={m} {dtype}: {bad} wrong elements")
            if not np.array_equal(native, want):
                failures.append(f"rank {rank}: native {schedule.collective} m={m} {dtype} "
                                "disagrees with numpy")
    # Two calls of one executor in flight on distinct buffers, waited for out of order.
    m = 1001
    if rs:
        inputs = [rs_input(n, m, rank, "float64"), 3 * rs_input(n, m, rank, "float64")]
        outputs = [np.full(m, np.nan) for _ in inputs]
        wants = [rs_expected(n, m, rank, "float64"), 3 * rs_expected(n, m, rank, "float64")]
    else:
        inputs = [ag_input(m, rank, "float64"), ag_input(m, rank, "float64") + 0.5]
        outputs = [np.full(n * m, np.nan) for _ in inputs]
        wants = [ag_expected(n, m, "float64"), ag_expected(n, m, "float64") + 0.5]
    handles = [run.start(x, y) for x, y in zip(inputs, outputs)]
    for k in reversed(range(len(handles))):
        cases += 1
        if handles[k].wait() is not outputs[k] or not np.array_equal(outputs[k], wants[k]):
            failures.append(f"rank {rank}: {name}: call {k} in flight gave a wrong result")
    return failures, cases


def mixed_in_flight(t: MPI, rs_schedule: topoplan.Schedule, ag_schedule: topoplan.Schedule
                    ) -> tuple[list[str], int]:
    """A reduce-scatter and an allgather (two executors) started together, then the
    allgather waited for first: FSDP's overlap of the next layer's gather with this
    layer's gradient reduce-scatter."""
    n, rank, m = t.size, t.rank, 4099
    rs = topoplan.ReduceScatter(rs_schedule, t, timeout=60)
    ag = topoplan.AllGather(ag_schedule, t, timeout=60)
    x, y = rs_input(n, m, rank, "float32"), np.full(m, np.nan, dtype=np.float32)
    u, v = ag_input(m, rank, "float32"), np.full(n * m, np.nan, dtype=np.float32)
    h1 = rs.start(x, y)
    h2 = ag.start(u, v)
    failures = []
    if h2.wait() is not v or not np.array_equal(v, ag_expected(n, m, "float32")):
        failures.append(f"rank {rank}: allgather in flight beside a reduce-scatter: wrong")
    if h1.wait() is not y or not np.array_equal(y, rs_expected(n, m, rank, "float32")):
        failures.append(f"rank {rank}: reduce-scatter in flight beside an allgather: wrong")
    return failures, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=Path, required=True)
    args = parser.parse_args()
    t = MPI()
    record: dict = {"rank": t.rank, "size": t.size, "plans": [], "failures": [], "ncases": 0}
    try:
        schedules = {p.stem: load_schedule(p) for p in sorted(args.plans.glob("*.json"))}
        for name, schedule in schedules.items():
            failures, cases = run_plan(t, name, schedule)
            record["failures"] += failures
            record["ncases"] += cases
            record["plans"].append(name)
        rs = next(s for k, s in schedules.items() if k.startswith("reduce_scatter-"))
        ag = next(s for k, s in schedules.items() if k.startswith("allgather-"))
        failures, cases = mixed_in_flight(t, rs, ag)
        record["failures"] += failures
        record["ncases"] += cases
    except Exception:  # noqa: BLE001 - reported, the test fails on it
        record["failures"].append(traceback.format_exc())
    print("TOPOPLAN-RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
