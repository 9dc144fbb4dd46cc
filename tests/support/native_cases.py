"""The executor's native steps (IR v3) on a transport, inside real multi-rank launches.

:func:`native_cases` runs on every rank of a launch (mpiexec: tests/mpi_native.py; torch
gloo: tests/test_transports_torch.py; threads: tests/test_executor_native.py) and
returns its failures as strings; :func:`killed_member_run` has one rank exit at its first
native step and reports what every other rank raised. Every result is checked element by
element: integer-valued floats, whose sums are exact in any order, or a numpy reference.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from . import native_schedules as N
from . import schedules as S
from topoplan.errors import ScheduleError, TopoplanError, TransportError
from topoplan.ir.schedule import build_schedule, native_op
from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter

SIZES = (0, 1, 2, 7, 1001, 40_009)  # elements of an allreduce buffer
SHARDS = (0, 1, 7, 1000)            # elements per rank of a reduce-scatter or allgather
UNEQUAL = (0.1, 0.3, 0.2, 0.4)      # chunk fractions (normalised) whose parts differ


def _normal(fractions: tuple[float, ...], count: int) -> tuple[float, ...]:
    """``count`` fractions cycling through ``fractions``, summing to 1."""
    raw = [fractions[i % len(fractions)] for i in range(count)]
    return tuple(f / sum(raw) for f in raw)


def allreduce_schedules(n: int) -> dict[str, Any]:
    """Allreduce schedules with native steps for ``n`` ranks, by name."""
    out: dict[str, Any] = {
        "native": N.native_allreduce(n),
        f"reduce-broadcast@root{n - 1}": N.reduce_then_broadcast(n, n - 1),
        "scatter-gather": N.scatter_then_gather(n),
        "scatter-gather/reversed": N.scatter_then_gather(n, order=list(reversed(range(n)))),
        "scatter-gather/unequal": N.scatter_then_gather(n, chunks=_normal(UNEQUAL, 2 * n)),
        f"composed 1x{n}": N.composed_allreduce(1, n),  # rails of one rank: no step
        f"composed {n}x1": N.composed_allreduce(n, 1),  # boxes of one rank: no step
    }
    for per_box in range(2, n):
        if n % per_box == 0:
            nb = n // per_box
            out[f"composed {nb}x{per_box}"] = N.composed_allreduce(nb, per_box)
            out[f"composed {nb}x{per_box}/unequal"] = N.composed_allreduce(
                nb, per_box, _normal(UNEQUAL, 2 * per_box))
    if n % 2 == 0:
        half = n // 2
        out[f"two-boxes {half}+{half}"] = N.two_boxes(half)
        out[f"two-boxes {half}+{half}/unequal"] = N.two_boxes(half, _normal(UNEQUAL, 2 * n))
    return out


def lone_schedules(n: int) -> dict[str, Any]:
    """One native op each, over part of the world, whose results are no collective."""
    sub = list(range(1, n)) if n > 2 else list(range(n))
    sub.reverse()  # not in rank order: a sub-communicator of its own even over every rank
    g = len(sub)
    return {
        "lone broadcast": N.lone("broadcast", n, sub, root=sub[-1]),
        "lone reduce": N.lone("reduce", n, sub, root=sub[0]),
        "lone reduce_scatter of a sub-range": N.lone("reduce_scatter", n, sub, chunk=1,
                                                     count=g, nchunks=g + 2),
        "lone allgather, unequal parts": N.lone("allgather", n, sub,
                                                chunks=_normal(UNEQUAL, 2 * g)),
        "lone allreduce of one chunk": N.lone("allreduce", n, sub, chunk=2, count=1,
                                              nchunks=3),
    }


def _ints(size: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small integers as float64: every order of additions gives the exact sum."""
    return ((np.arange(size) * 7 + 13 * rank + salt) % 23 - 5).astype(np.float64)


def native_cases(t: Any, *, with_torch: bool = False,
                 device: Callable[[np.ndarray], Any] = np.array,
                 host: Callable[[Any], np.ndarray] = np.asarray, torch_device: str = "cpu"
                 ) -> tuple[list[str], int]:
    """Every native-step case on transport ``t``; returns (failures, cases run).

    Buffers are numpy arrays, or what ``device`` makes of them (``cupy.asarray`` for
    NCCL; ``host`` brings them back); ``with_torch`` adds torch tensors on
    ``torch_device``.
    """
    n, rank = t.size, t.rank
    failures: list[str] = []
    count = 0

    def check(ok: bool, what: str) -> None:
        nonlocal count
        count += 1
        if not ok:
            failures.append(f"rank {rank}: {what}")

    def want_sum(size: int, salt: int = 0) -> np.ndarray:
        return sum((_ints(size, r, salt) for r in range(n)), np.zeros(size))

    # Allreduce schedules: composed, every kind, unequal parts, sizes 0 and 1 and odd.
    for name, schedule in allreduce_schedules(n).items():
        run = Allreduce(schedule, t, timeout=30)
        for size in SIZES:
            x = device(_ints(size, rank))
            run(x)
            got = host(x)
            check(np.array_equal(got, want_sum(size)),
                  f"{name} n={size}: {np.count_nonzero(got != want_sum(size))} wrong elements")
        y = device(_ints(1001, rank).astype(np.float32))
        run(y)
        check(np.array_equal(host(y), want_sum(1001).astype(np.float32)),
              f"{name} float32: wrong sum")

    # float16 (small integers: exact), and float16 added in a float32 shadow.
    composed = N.composed_allreduce(2, n // 2) if n % 2 == 0 else N.scatter_then_gather(n)
    for accumulate in (False, True):
        h = device((np.arange(3001) % 7 + rank).astype(np.float16))
        Allreduce(composed, t, timeout=30, accumulate_fp32=accumulate)(h)
        want_h = ((np.arange(3001) % 7) * n + sum(range(n))).astype(np.float16)
        check(np.array_equal(host(h), want_h), f"float16 accumulate_fp32={accumulate}: wrong")

    # One op each, checked against the reference (values other ranks keep included).
    for name, schedule in lone_schedules(n).items():
        run = Allreduce(schedule, t, timeout=30, verified=True)  # no collective: as it is
        for size in (1, 7, 1001):
            x = device(_ints(size, rank, salt=size))
            expected = N.reference(schedule, [_ints(size, r, salt=size) for r in range(n)])[rank]
            run(x)
            got = host(x)
            check(np.array_equal(got, expected),
                  f"{name} n={size}: {np.count_nonzero(got != expected)} elements differ from "
                  "the reference")

    # Reduce-scatter and allgather schedules (collective != allreduce).
    rs_ag: dict[str, Any] = {"native-rs": N.native_reduce_scatter(n),
                             "native-ag": N.native_allgather(n)}
    if n % 2 == 0:
        rs_ag.update({"composed-rs": N.composed_reduce_scatter(n // 2),
                      "composed-rs/unequal": N.composed_reduce_scatter(n // 2, (0.2, 0.5, 0.3)),
                      "composed-ag": N.composed_allgather(n // 2),
                      "composed-ag/unequal": N.composed_allgather(n // 2, (0.6, 0.4))})
    for name, schedule in rs_ag.items():
        if schedule.collective == "reduce_scatter":
            run_rs = ReduceScatter(schedule, t, timeout=30)
            for m in SHARDS:
                x = device(_ints(n * m, rank))
                out = device(np.full(m, np.nan))
                run_rs(x, out)
                want = want_sum(n * m)[rank * m:(rank + 1) * m]
                check(np.array_equal(host(out), want) and np.array_equal(host(x),
                                                                         _ints(n * m, rank)),
                      f"{name} shard {m}: wrong shard or input changed")
        else:
            run_ag = AllGather(schedule, t, timeout=30)
            for m in SHARDS:
                mine = device(_ints(m, rank))
                out = device(np.full(n * m, np.nan))
                run_ag(mine, out)
                want = np.concatenate([_ints(m, r) for r in range(n)]) if m else np.zeros(0)
                check(np.array_equal(host(out), want), f"{name} shard {m}: wrong gather")

    # Torch tensors: the dtypes a trainer sends (fp16 compression, bfloat16).
    torch = None
    if with_torch:
        try:
            import torch
        except ImportError:
            pass
    if torch is not None:
        composed = (N.composed_allreduce(2, n // 2) if n % 2 == 0 and n > 2
                    else N.scatter_then_gather(n))
        for schedule in (composed, N.native_allreduce(n)):
            run = Allreduce(schedule, t, timeout=30)
            for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
                tt = (torch.arange(2003, device=torch_device) % 5 + rank).to(dtype)
                run(tt)
                want_t = ((torch.arange(2003, device=torch_device) % 5) * n
                          + sum(range(n))).to(dtype)
                check(bool(torch.equal(tt, want_t)), f"{schedule.algorithm} torch {dtype}: wrong")

    # Calls in flight: native and point-to-point executors started in one order, waited
    # for in a rank-dependent one; calls sharing a group take turns, each sums its own.
    names = [k for k in allreduce_schedules(n) if k.startswith(("composed", "two-boxes"))]
    composed = allreduce_schedules(n)[names[-1]]
    runs = [Allreduce(composed, t, timeout=30), Allreduce(S.ring(n), t, timeout=30),
            Allreduce(N.native_allreduce(n), t, timeout=30)]
    order = [0, 1, 2, 0, 2, 1]
    bufs = [device(_ints(5_000 + 3 * i, rank, salt=i)) for i in range(len(order))]
    handles = [runs[k].start(b) for k, b in zip(order, bufs)]
    for i in (range(len(bufs)) if rank % 2 else reversed(range(len(bufs)))):
        handles[i].wait()
    for i, b in enumerate(bufs):
        check(np.array_equal(host(b), want_sum(5_000 + 3 * i, salt=i)),
              f"call {i} in flight: wrong sum")

    # Bad input, refused on every rank before anything moves, naming rank, step, group.
    bad = build_schedule(n, (1.0,), [[[native_op("allreduce", [r, n], 0)]] for r in range(n)],
                         algorithm="bad")
    try:
        Allreduce(bad, t)
        check(False, "a group naming rank n was accepted")
    except ScheduleError as exc:
        check(f"rank 0 step 0: native allreduce over {{0, {n}}}" in str(exc)
              and f"has {n} ranks" in str(exc), f"bad group: unlocated message: {exc}")
    bad = build_schedule(n, (0.5, 0.5), [[[native_op("reduce_scatter", range(n), 0, 2)]]
                                         for _ in range(n)], algorithm="bad")
    if n > 2:
        try:
            Allreduce(bad, t)
            check(False, f"a reduce-scatter of 2 chunks over {n} ranks was accepted")
        except ScheduleError as exc:
            check("step 0: native reduce_scatter" in str(exc) and "equal parts" in str(exc),
                  f"bad count: unlocated message: {exc}")

    # Groups are made once per transport: another executor over them makes none.
    made = dict(t._groups())
    Allreduce(allreduce_schedules(n)[names[-1]], t, timeout=30)
    check(t._groups() == made and all(t._groups()[g] is made[g] for g in made),
          "a second executor made its groups again")
    t.barrier()
    return failures, count


def killed_member_run(t: Any, victim: int, timeout: float, schedule: Any = None,
                      die: Callable[[], None] | None = None) -> dict:
    """Rank ``victim`` leaves (``die``, default ``os._exit(9)``) when it starts its first
    native step; every other rank reports what it raised and how long it took."""
    schedule = schedule if schedule is not None else N.scatter_then_gather(t.size)
    if t.rank == victim:
        real = t.native

        def dying(op: Any) -> Any:
            work = real(op)
            start = work.start

            def leave() -> None:
                (die or (lambda: os._exit(9)))()
                start()

            work.start = leave
            return work

        t.native = dying
    buf = np.ones(1 << 14)
    t0 = time.monotonic()
    try:
        Allreduce(schedule, t, timeout=timeout)(buf)
        return {"error": None, "elapsed": time.monotonic() - t0}
    except TransportError as exc:
        return {"error": str(exc), "type": type(exc).__name__, "rank": exc.rank,
                "step": exc.step, "chunk": exc.chunk, "elapsed": time.monotonic() - t0}
    except TopoplanError as exc:  # pragma: no cover - reported as a failure by the test
        return {"error": str(exc), "type": type(exc).__name__, "elapsed": time.monotonic() - t0}


def torch_rank_main(t: Any, victim: int | None, timeout: float) -> dict:
    """The body of each rank of a Torch.launch in tests/test_transports_torch.py: the
    native cases, then (with ``victim``) a run in which that rank exits."""
    failures, ncases = native_cases(t, with_torch=True)
    record: dict = {"rank": t.rank, "failures": failures, "ncases": ncases, "transport": t.name}
    if victim is not None:
        t.barrier()
        record["kill"] = killed_member_run(t, victim=victim, timeout=timeout)
    return record
