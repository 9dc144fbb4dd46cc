"""Transport-agnostic executor cases, run inside real multi-process launches.

Used by tests/mpi_cases.py (under mpiexec) and tests/test_transports_torch.py (under
torch multiprocessing with gloo). Each function returns plain data (lists of
failure strings) so the launching test can assert on every rank's outcome.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import numpy as np

from . import schedules as S
from topoplan.errors import TopoplanError, TransportError
from topoplan.runtime.executor import Allreduce


def _same_on_all_ranks(t: Any, data: bytes) -> bool:
    """True on every rank iff ``data`` hashes the same everywhere (max and min agree)."""
    h = float(int(hashlib.sha256(data).hexdigest()[:12], 16))  # 48 bits: exact in a float64
    return t.allreduce_max(h) == h and -t.allreduce_max(-h) == h


def sizes_for(schedule: Any) -> list[int]:
    k = schedule.nchunks
    return sorted({0, 1, max(k - 1, 1), k + 1, 3 * k + 2, 1000, 40_009})


def schedules_for(n: int) -> dict[str, Any]:
    """The test schedules and every planner's, for ``n`` ranks.

    The launching test plans once and points TOPOPLAN_TEST_PLANS at a folder of
    ``<name>.json`` files, so the ranks of a launch do not all re-plan.
    """
    folder = os.environ.get("TOPOPLAN_TEST_PLANS")
    if folder is None:
        return {**S.builders(n), **S.planner_schedules(n)}
    from topoplan.ir.parse import load_schedule
    plans = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            schedule = load_schedule(os.path.join(folder, name))
            if schedule.nranks == n:
                plans[name.removesuffix(".json")] = schedule
    return {**S.builders(n), **plans}


def save_planner_schedules(n: int, folder: str) -> None:
    """Plan every planner for ``n`` ranks into ``folder`` (see :func:`schedules_for`)."""
    for name, schedule in S.planner_schedules(n).items():
        schedule.save(os.path.join(folder, f"{name}.json"))


def run_cases(t: Any, *, with_torch: bool = True) -> tuple[list[str], int, list[str]]:
    """Every correctness case on transport ``t``; returns (failures, count, schedule names).

    ``with_torch`` adds torch tensor buffers (float32/64/16, bfloat16); importing
    torch costs seconds per process, so launches that do not need it skip it.
    """
    n, rank = t.size, t.rank
    failures: list[str] = []
    count = 0

    def check(ok: bool, what: str) -> None:
        nonlocal count
        count += 1
        if not ok:
            failures.append(f"rank {rank}: {what}")

    schedules = schedules_for(n)
    for name, schedule in schedules.items():
        run = Allreduce(schedule, t, timeout=30)
        for size in sizes_for(schedule):
            # Integer-valued float64: every order of additions gives the exact sum.
            x = (np.arange(size, dtype=np.float64) % 17) + 3.0 * rank
            run(x)
            expected = (np.arange(size) % 17) * n + 3.0 * sum(range(n))
            check(np.array_equal(x, expected),
                  f"{name} n={size} float64: {np.count_nonzero(x != expected)} wrong elements")
            # Random float32: whatever the order, every rank must end with the same bits.
            y = np.random.default_rng(1000 * rank + size).standard_normal(size).astype(np.float32)
            run(y)
            inputs = [np.random.default_rng(1000 * r + size).standard_normal(size)
                      .astype(np.float32).astype(np.float64) for r in range(n)]
            exact = np.sum(inputs, axis=0) if size else np.zeros(0)
            check(np.allclose(y, exact, rtol=1e-5, atol=1e-5 * n),
                  f"{name} n={size} float32: not the sum (max err "
                  f"{np.max(np.abs(y - exact), initial=0):.3g})")
            check(_same_on_all_ranks(t, y.tobytes()),
                  f"{name} n={size} float32: ranks disagree bitwise")

    ring = S.ring(n)
    run = Allreduce(ring, t, timeout=30)

    # The same buffer twice (cached binding) and a 2-D buffer.
    x = np.full((4, 251), rank + 1.0)
    run(x)
    run(x)
    check(np.all(x == (n * (n + 1) / 2) * n), "2-D buffer reduced twice: wrong sum")

    # float16 with small integers is exact; accumulate_fp32 rounds once.
    h = ((np.arange(3001) % 7) + rank).astype(np.float16)
    run(h)
    check(np.array_equal(h, ((np.arange(3001) % 7) * n + sum(range(n))).astype(np.float16)),
          "float16 integers: wrong sum")
    vals = [np.float16(0.1 * (r + 1)) for r in range(n)]
    a = np.full(513, vals[rank], dtype=np.float16)
    Allreduce(ring, t, timeout=30, accumulate_fp32=True)(a)
    want = np.float16(np.sum([np.float32(v) for v in vals], dtype=np.float32))
    check(np.all(a == want), f"float16 accumulate_fp32: {a[0]!r} != {want!r}")
    check(_same_on_all_ranks(t, a.tobytes()), "float16 accumulate_fp32: ranks disagree")

    torch = None
    if with_torch:
        try:
            import torch
        except ImportError:
            pass
    if torch is not None:
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            tt = (torch.arange(2003) % 5 + rank).to(dtype)
            run(tt)
            want_t = ((torch.arange(2003) % 5) * n + sum(range(n))).to(dtype)
            check(bool(torch.equal(tt, want_t)), f"torch {dtype}: wrong sum")
        bf = torch.randn(777, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
        Allreduce(ring, t, timeout=30, accumulate_fp32=True)(bf)
        check(_same_on_all_ranks(t, bf.view(torch.int16).numpy().tobytes()),
              "torch bfloat16 accumulate_fp32: ranks disagree")

    # Sends carry the chunk as it was at step start, even when the same step
    # overwrites it (large enough for MPI's rendezvous protocol).
    z = np.full(300_001, float(rank))
    Allreduce(S.swap(n), t, timeout=30, verified=True)(z)  # not an allreduce
    check(np.all(z == float((rank - 1) % n)), f"swap: got {z[0]}, expected {(rank - 1) % n}")
    if n & (n - 1) == 0 and n > 1:
        b = np.full(100_003, rank + 1.0)
        Allreduce(S.butterfly(n), t, timeout=30)(b)
        check(np.all(b == n * (n + 1) / 2), "butterfly: send and reduce of one chunk collided")

    # Calls in flight: several buffers of one executor side by side, a call of another
    # executor queued behind them, waited for in reverse order; each sums its own input.
    other = Allreduce(ring, t, timeout=30)
    runs = [run, run, other, run, run]
    bufs = [np.full(1000 + 7 * i, rank + 1.0 + i) for i in range(len(runs))]
    handles = [r.start(b) for r, b in zip(runs, bufs)]
    handles[2].test()
    for h in reversed(handles):
        h.wait()
    for i, b in enumerate(bufs):
        check(np.all(b == n * (n + 1) / 2 + n * i), f"call {i} in flight: got {b[0]}")
    check(all(h.test() for h in handles), "a waited handle does not test done")
    run(bufs[0])  # blocking calls go on as before
    check(np.all(bufs[0] == n * (n * (n + 1) / 2)), "blocking call after calls in flight")

    # Calls of different executors side by side (tag lanes): big enough for MPI's
    # rendezvous protocol, started in one order everywhere and waited for in a
    # rank-dependent one; each sums its own input.
    lanes = [Allreduce(S.direct(n), t, timeout=30), Allreduce(ring, t, timeout=30),
             Allreduce(S.all_to_all(n), t, timeout=30), Allreduce(S.reduce_bcast(n), t, timeout=30),
             Allreduce(ring, t, timeout=30)]
    big = [np.full(60_000 + 11 * i, rank + 1.0 + i) for i in range(len(lanes))]
    handles = [r.start(b) for r, b in zip(lanes, big)]
    for i in (range(len(big)) if rank % 2 else reversed(range(len(big)))):
        handles[i].wait()
    for i, b in enumerate(big):
        check(np.all(b == n * (n + 1) / 2 + n * i), f"lane call {i}: got {b[0]}")

    # A schedule for another rank count is refused before anything is sent.
    try:
        Allreduce(S.ring(n + 1), t)
        check(False, "a schedule for n+1 ranks was accepted")
    except TopoplanError as exc:
        check(f"{n + 1} ranks" in str(exc) and f"has {n}" in str(exc),
              f"wrong-nranks message does not name both counts: {exc}")
    try:
        run(np.zeros((10, 10))[:, ::2])
        check(False, "a non-contiguous buffer was accepted")
    except TopoplanError:
        check(True, "")

    # Nothing left over: a final ring still works after all the above.
    t.barrier()
    return failures, count, sorted(schedules)


def killed_peer_run(t: Any, victim: int, timeout: float, die_at: int = 1) -> dict:
    """Rank ``victim`` exits (os._exit) when starting its step ``die_at`` of a ring
    allreduce; every other rank reports what it raised and how long it took."""
    n = t.size
    if t.rank == victim:
        real_start, started = t.start, [0]

        def dying_start(messages: Any) -> Any:
            if started[0] == die_at:
                os._exit(9)
            started[0] += 1
            return real_start(messages)

        t.start = dying_start
    buf = np.ones(1 << 16)
    t0 = time.monotonic()
    try:
        Allreduce(S.ring(n), t, timeout=timeout)(buf)
        return {"error": None, "elapsed": time.monotonic() - t0}
    except TransportError as exc:
        return {"error": str(exc), "type": type(exc).__name__, "rank": exc.rank, "step": exc.step,
                "peer": exc.peer, "chunk": exc.chunk, "elapsed": time.monotonic() - t0}


def torch_rank_main(t: Any, victim: int | None, timeout: float) -> dict:
    """The body of each rank of a Torch.launch in tests/test_transports_torch.py."""
    failures, ncases, names = run_cases(t, with_torch=True)
    record: dict = {"rank": t.rank, "failures": failures, "ncases": ncases, "schedules": names,
                    "transport": t.name}
    if victim is not None:
        t.barrier()
        record["kill"] = killed_peer_run(t, victim=victim, timeout=timeout)
    return record
