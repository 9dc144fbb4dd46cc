"""Channelled schedules (IR v4) on a transport, inside real multi-rank launches.

:func:`channel_cases` runs on every rank of a launch (threads: tests/test_channels_exec.py;
mpiexec: tests/mpi_channels.py; torch gloo: tests/test_channels_exec.py) and returns its
failures as strings; :func:`failed_peer_run` has one rank exit when it starts a step and
reports what every other rank raised. Results are checked element by element on
integer-valued floats, whose sums are exact in any order.

The schedules are written by hand here, so that what they test does not depend on a
planner: two rings in opposite directions, one per channel, and two small schedules
that only run when a rank's channels move independently (:func:`lockstep_trap`,
:func:`handoff`).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Sequence

import numpy as np

from topoplan.errors import TopoplanError, TransportError
from topoplan.ir.schedule import Schedule, build_schedule, equal_chunks, native_op, recv, send
from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter

SIZES = (0, 1, 2, 7, 1001, 40_009)  # elements of an allreduce buffer
SHARDS = (0, 1, 7, 1000)            # elements per rank of a reduce-scatter or allgather

Steps = list[list[list[Any]]]  # steps[rank][step]: ops (and natives: build_schedule says Op)


def ring_ops(steps: Steps, ring: Sequence[int], own: Sequence[int], channel: int, *,
             first: int = 0, phases: str = "rs+ag") -> None:
    """Add a ring's ops on ``channel`` to ``steps[rank][step]`` from step ``first`` on:
    position ``p`` of ``ring`` ends its reduce-scatter holding the sum of chunk
    ``own[p]`` and starts its allgather from it (``phases``: ``"rs"``, ``"ag"`` or both)."""
    n = len(ring)
    seg = [own[(q - 1) % n] for q in range(n)]  # seg[(p + 1) % n] is own[p]
    for p, rank in enumerate(ring):
        succ, pred = ring[(p + 1) % n], ring[(p - 1) % n]
        at = first
        if "rs" in phases:
            for k in range(n - 1):
                steps[rank][at + k] += [send(succ, seg[(p - k) % n], channel=channel),
                                        recv(pred, seg[(p - k - 1) % n], True, channel=channel)]
            at += n - 1
        if "ag" in phases:
            for k in range(n - 1):
                steps[rank][at + k] += [send(succ, seg[(p + 1 - k) % n], channel=channel),
                                        recv(pred, seg[(p - k) % n], channel=channel)]


def _empty(n: int, nsteps: int) -> Steps:
    return [[[] for _ in range(nsteps)] for _ in range(n)]


def two_rings(n: int, collective: str = "allreduce") -> Schedule:
    """Chunks ``2r`` (channel 0, ring 0 -> 1 -> ...) and ``2r + 1`` (channel 1, the ring
    the other way, one step later): rank ``r``'s shard is chunks ``2r`` and ``2r + 1``,
    so the same rings make the sharded collectives."""
    phases = {"allreduce": "rs+ag", "reduce_scatter": "rs", "allgather": "ag"}[collective]
    steps = _empty(n, 2 * n)
    forward, backward = list(range(n)), list(reversed(range(n)))
    ring_ops(steps, forward, [2 * r for r in forward], 0, phases=phases)
    ring_ops(steps, backward, [2 * r + 1 for r in backward], 1, first=1, phases=phases)
    return build_schedule(n, equal_chunks(2 * n), steps, collective=collective,
                          algorithm="two-rings")


def native_beside_a_ring(n: int) -> Schedule:
    """Channel 0: a native allreduce of chunks ``0 .. n - 1``; channel 1: a ring allreduce
    of chunks ``n .. 2n - 1`` the other way round, beside it."""
    steps = _empty(n, 2 * n)
    for r in range(n):
        steps[r][0].append(native_op("allreduce", range(n), 0, n))
    backward = list(reversed(range(n)))
    ring_ops(steps, backward, [n + r for r in backward], 1, first=1)
    return build_schedule(n, equal_chunks(2 * n), steps, algorithm="native+ring")


def lockstep_trap(n: int) -> Schedule:
    """An allreduce of ranks 0 and 1 (the others idle) that runs only if each rank's
    channels move on their own: rank 0's channel 0 first waits for chunk 0 that rank 1
    sends in its step 1, and rank 1's channel 1 first waits for chunk 1 that rank 0 sends
    in its step 1. Run in lock-step (every step of a rank waiting for all its ops) both
    ranks wait in step 0 for good; run channel by channel, or at once, it ends."""
    steps = _empty(n, 4)
    steps[0][0] = [recv(1, 0, True, channel=0)]
    steps[0][1] = [send(1, 1, channel=1)]
    steps[0][2] = [send(1, 0, channel=0)]
    steps[0][3] = [recv(1, 1, channel=1)]
    steps[1][0] = [recv(0, 1, True, channel=1)]
    steps[1][1] = [send(0, 0, channel=0)]
    steps[1][2] = [recv(0, 0, channel=0)]
    steps[1][3] = [send(0, 1, channel=1)]
    return build_schedule(n, equal_chunks(2), steps, algorithm="lockstep-trap")


def handoff(n: int) -> Schedule:
    """For ``n >= 3``: rank 0's channel 0 receives chunk 0 from rank 2 (added), and its
    channel 1 (a step later) sends chunk 1 to rank 1 and gets the pair's sum back. Rank 2
    is let go (:func:`channel_cases`) only once rank 1's call returned, so the call ends
    only if rank 0 runs channel 1 while channel 0 waits: it hangs when a rank runs its
    channels one after another (channel 0 first) or in lock-step. Not an allreduce:
    rank 0 ends with chunk 0 of ranks 0 and 2 and chunk 1 of ranks 0 and 1, rank 1 with
    its chunk 0 and chunk 1 of ranks 0 and 1, every other rank as it was."""
    steps = _empty(n, 3)
    steps[0][0] = [recv(2, 0, True, channel=0)]
    steps[0][1] = [send(1, 1, channel=1)]
    steps[0][2] = [recv(1, 1, channel=1)]
    steps[1][1] = [recv(0, 1, True, channel=1)]
    steps[1][2] = [send(0, 1, channel=1)]
    steps[2][0] = [send(0, 0, channel=0)]
    return build_schedule(n, equal_chunks(2), steps, algorithm="handoff")


def _ints(size: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small integers as float64: every order of additions gives the exact sum."""
    return ((np.arange(size) * 7 + 13 * rank + salt) % 23 - 5).astype(np.float64)


def _sum(size: int, n: int, salt: int = 0) -> np.ndarray:
    return sum(_ints(size, r, salt) for r in range(n))  # type: ignore[return-value]


def channel_cases(t: Any, *, let_go: Callable[[], Any] | None = None,
                  wait_to_go: Callable[[], Any] | None = None, timeout: float = 30.0
                  ) -> tuple[list[str], int, str]:
    """Every channel case on transport ``t``: (failures, cases run, the executor's way of
    running channels). ``let_go`` (on rank 1) and ``wait_to_go`` (on rank 2) carry the
    hand-off of :func:`handoff` between ranks 1 and 2 (skipped without them)."""
    n, rank = t.size, t.rank
    failures: list[str] = []
    count = 0

    def check(ok: bool, what: str) -> None:
        nonlocal count
        count += 1
        if not ok:
            failures.append(f"rank {rank}: {what}")

    # Allreduce over two rings, one per channel: exact sums at every size, three calls
    # in a row and then more than EPOCHS calls in flight at once (tags of every epoch).
    run = Allreduce(two_rings(n), t, timeout=timeout)
    mode = run._channel_mode
    for size in SIZES:
        for salt in range(3):
            x = _ints(size, rank, salt)
            run(x)
            check(np.array_equal(x, _sum(size, n, salt)), f"two rings, {size} elements, call {salt}")
    bufs = [_ints(1001, rank, salt) for salt in range(6)]
    handles = [run.start(b) for b in bufs]
    for salt, (h, b) in enumerate(zip(handles, bufs)):
        h.wait()
        check(np.array_equal(b, _sum(1001, n, salt)), f"two rings in flight, call {salt}")
    # Beside a schedule without channels, in flight together (lanes).
    from . import schedules as S
    plain = Allreduce(S.ring(n), t, timeout=timeout)
    a, b = _ints(999, rank, 1), _ints(999, rank, 2)
    ha, hb = run.start(a), plain.start(b)
    hb.wait()
    ha.wait()
    check(np.array_equal(a, _sum(999, n, 1)) and np.array_equal(b, _sum(999, n, 2)),
          "two rings in flight beside a plain ring")

    # Reduce-scatter and allgather over the same rings.
    rs = ReduceScatter(two_rings(n, "reduce_scatter"), t, timeout=timeout)
    ag = AllGather(two_rings(n, "allgather"), t, timeout=timeout)
    for m in SHARDS:
        full = _ints(n * m, rank)
        out = np.zeros(m)
        rs(full, out)
        check(np.array_equal(out, _sum(n * m, n)[rank * m:(rank + 1) * m]),
              f"two-ring reduce-scatter, {m} per rank")
        check(np.array_equal(full, _ints(n * m, rank)), "reduce-scatter left its input")
        whole = np.zeros(n * m)
        ag(_ints(m, rank), whole)
        check(np.array_equal(whole, np.concatenate([_ints(m, r) for r in range(n)])),
              f"two-ring allgather, {m} per rank")

    # A native step on channel 0 beside a ring on channel 1 (where the transport has them).
    try:
        beside = Allreduce(native_beside_a_ring(n), t, timeout=timeout)
    except TopoplanError as exc:
        check("runs no native" in str(exc), f"native beside a ring refused: {exc}")
    else:
        for size in (0, 7, 1001):
            x = _ints(size, rank)
            beside(x)
            check(np.array_equal(x, _sum(size, n)), f"native beside a ring, {size} elements")
        x = _ints(1001, rank, 5)
        beside.start(x).wait()
        check(np.array_equal(x, _sum(1001, n, 5)), "native beside a ring, in flight")

    # Channels that move on their own: the lock-step trap, to the end and in flight.
    trap = Allreduce(lockstep_trap(n), t, timeout=timeout, verified=True)  # ranks 0, 1
    for how in ("call", "start"):
        x = _ints(100, rank)
        (trap(x) if how == "call" else trap.start(x).wait())
        want = _sum(100, 2) if rank < 2 else _ints(100, rank)
        check(np.array_equal(x, want), f"lock-step trap ({how})")

    if let_go is not None and wait_to_go is not None and n >= 3:
        run_handoff = Allreduce(handoff(n), t, timeout=timeout, verified=True)
        x = _ints(100, rank)
        if rank == 2:
            wait_to_go()
        try:
            run_handoff(x)
        except TransportError as exc:
            check(False, f"hand-off: {exc}")
        else:
            mine = _ints(100, rank)
            if rank == 0:
                want = np.concatenate([mine[:50] + _ints(100, 2)[:50], _sum(100, 2)[50:]])
            elif rank == 1:
                want = np.concatenate([mine[:50], _sum(100, 2)[50:]])
            else:
                want = mine
            check(np.array_equal(x, want), "hand-off: the channels' results")
        if rank == 1:
            let_go()
    t.barrier()
    return failures, count, mode


def failed_peer_run(t: Any, victim: int, timeout: float, die_at: int = 2) -> dict:
    """Rank ``victim`` ends (``os._exit`` in a process, an exception on a thread) when it
    starts its ``die_at``-th step of a two-ring allreduce; every other rank reports
    what it raised and how long it took."""
    n = t.size
    if t.rank == victim:
        real_start, started = t.start, [0]

        def dying_start(messages: Any) -> Any:
            if started[0] == die_at:
                if t.name == "local":
                    raise RuntimeError("the victim leaves")
                os._exit(9)
            started[0] += 1
            return real_start(messages)

        t.start = dying_start
    buf = np.ones(1 << 14)
    t0 = time.monotonic()
    try:
        Allreduce(two_rings(n), t, timeout=timeout)(buf)
        return {"error": None, "elapsed": time.monotonic() - t0}
    except TransportError as exc:
        return {"error": str(exc), "type": type(exc).__name__, "rank": exc.rank,
                "step": exc.step, "peer": exc.peer, "chunk": exc.chunk,
                "elapsed": time.monotonic() - t0}


def torch_rank_main(t: Any, victim: int | None, timeout: float) -> dict:
    """The body of each rank of a Torch.launch (tests/test_channels_exec.py): the cases,
    the hand-off between ranks 1 and 2 over a process group of their own, then (with
    ``victim``) a run in which that rank exits."""
    import torch
    import torch.distributed as dist
    pair = dist.new_group([1, 2]) if t.size >= 3 else None  # every rank makes it
    token = torch.zeros(1)

    def let_go() -> None:
        dist.send(token, 2, group=pair)

    def wait_to_go() -> None:
        dist.recv(token, 1, group=pair)

    failures, ncases, mode = channel_cases(t, let_go=let_go, wait_to_go=wait_to_go,
                                           timeout=timeout * 10)
    record: dict = {"rank": t.rank, "failures": failures, "ncases": ncases, "mode": mode}
    if victim is not None:
        t.barrier()
        record["kill"] = failed_peer_run(t, victim=victim, timeout=timeout)
    return record
