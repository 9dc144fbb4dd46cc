"""The executor on the in-process Local transport: semantics, edge sizes, failures.

Real-process transports (mpiexec, torch gloo) run the same cases in
tests/test_transports_mpi.py and tests/test_transports_torch.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests.support import schedules as S
from topoplan.errors import TopoplanError, TransportError
from topoplan.runtime.executor import Allreduce, _compile
from topoplan.ir.schedule import build_schedule, recv, send
from topoplan.runtime.transports import Local
from topoplan.runtime.transports.local import LocalWorld
from topoplan.ir.verify import verify


def _all_schedules() -> list[tuple[str, int, object]]:
    out = []
    for n in range(1, 9):
        for name, schedule in {**S.builders(n), **S.planner_schedules(n)}.items():
            out.append((name, n, schedule))
    return out


SCHEDULES = _all_schedules()


@pytest.mark.parametrize("name, n, schedule", SCHEDULES,
                         ids=[f"{name}-n{n}" for name, n, _ in SCHEDULES])
def test_exact_sum_and_identical_bits(name: str, n: int, schedule) -> None:
    verify(schedule)
    sizes = sorted({0, 1, max(schedule.nchunks - 1, 1), schedule.nchunks + 1, 997})

    def rank_fn(t: Local) -> list[np.ndarray]:
        run = Allreduce(schedule, t, timeout=10)
        out = []
        for size in sizes:
            x = (np.arange(size, dtype=np.float64) % 13) + 2.0 * t.rank
            run(x)
            y = np.random.default_rng(t.rank * 7919 + size).standard_normal(size).astype(np.float32)
            run(y)
            out += [x, y]
        return out

    results = Local.launch(n, rank_fn, timeout=30)
    for i, size in enumerate(sizes):
        expected = (np.arange(size) % 13) * n + 2.0 * sum(range(n))
        for rank in range(n):
            assert np.array_equal(results[rank][2 * i], expected), (name, size, rank)
            assert results[rank][2 * i + 1].tobytes() == results[0][2 * i + 1].tobytes(), (
                f"{name}: rank {rank} and rank 0 differ bitwise at n={size}")


def test_compile_uses_views_and_snapshots_only_when_needed() -> None:
    ring = _compile(S.ring(4), rank=1, n=1000)
    # Ring reduce-scatter steps reduce into scratch; no step of a ring needs a snapshot.
    assert all(not step.snapshots for step in ring.steps)
    assert sum(len(step.reduces) for step in ring.steps) == 3
    assert ring.scratch == 250
    swap = _compile(S.swap(2), rank=0, n=10)
    assert len(swap.steps[0].snapshots) == 1  # sends chunk 0 while overwriting it
    empty = _compile(S.ring(4), rank=0, n=2)  # chunks 0 and 2 are empty: no messages for them
    assert all(m.chunk in (1, 3) for step in empty.steps for m in step.messages)


def test_bound_views_alias_the_user_buffer() -> None:
    def rank_fn(t: Local) -> bool:
        x = np.ones(100)
        run = Allreduce(S.ring(2), t)
        run(x)
        bound = next(iter(run._bound.values()))
        chunk_views = [m.wire for st in bound.steps for m in st.messages if m.wire.base is not None
                       and np.shares_memory(m.wire, x)]
        return bool(chunk_views) and bound.work is not None and np.shares_memory(bound.work, x)

    assert all(Local.launch(2, rank_fn))


def test_send_carries_the_value_at_step_start() -> None:
    def rank_fn(t: Local) -> np.ndarray:
        x = np.full(1001, float(t.rank))
        Allreduce(S.swap(3), t, verified=True)(x)  # not an allreduce: as it is
        return x

    for rank, x in enumerate(Local.launch(3, rank_fn)):
        assert np.all(x == (rank - 1) % 3)


def test_a_range_send_overlapping_a_range_recv_goes_out_of_a_snapshot() -> None:
    # 4 chunks of 250 elements; rank r sends chunks 0..2 and overwrites chunks 1..3.
    swap = _compile(S.shifted_swap(3), rank=0, n=1000)
    assert [s for s, _ in swap.steps[0].snapshots] == [(0, 750)]
    assert [m.span for m in swap.steps[0].messages] == [(250, 1000), (0, 750)]

    def rank_fn(t: Local) -> np.ndarray:
        x = np.arange(1000, dtype=np.float64) + 10000.0 * t.rank
        Allreduce(S.shifted_swap(3), t, verified=True)(x)  # not an allreduce
        return x

    for rank, x in enumerate(Local.launch(3, rank_fn)):
        left = (rank - 1) % 3
        expected = np.concatenate([np.arange(250) + 10000.0 * rank,
                                   np.arange(750) + 10000.0 * left])
        assert np.array_equal(x, expected), rank


def test_wrong_nranks_is_refused_before_anything_is_sent() -> None:
    world = LocalWorld(3)
    with pytest.raises(TopoplanError, match=r"for 4 ranks but the local transport has 3"):
        Allreduce(S.ring(4), world.transport(0))
    assert not world.mail


def test_bad_buffers_are_refused() -> None:
    t = LocalWorld(1).transport(0)
    run = Allreduce(S.ring(1), t)
    with pytest.raises(TopoplanError, match="contiguous"):
        run(np.zeros((4, 4))[:, ::2])
    with pytest.raises(TopoplanError, match="numpy arrays, torch tensors or cupy arrays"):
        run([1.0, 2.0])
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(TopoplanError, match="read-only"):
        run(frozen)
    with pytest.raises(TopoplanError, match="timeout"):
        Allreduce(S.ring(1), t, timeout=0)


def test_silent_peer_times_out_on_every_waiting_rank() -> None:
    """Rank 2 is alive but never posts: the others fail within the timeout."""
    timeout = 0.5

    def rank_fn(t: Local):
        if t.rank == 2:
            time.sleep(timeout * 3)  # alive, silent, then leaves
            return None
        t0 = time.monotonic()
        try:
            Allreduce(S.ring(3), t, timeout=timeout)(np.ones(30))
        except TransportError as exc:
            return exc, time.monotonic() - t0
        return None

    results = Local.launch(3, rank_fn)
    for rank in (0, 1):
        exc, elapsed = results[rank]
        assert exc.rank == rank and exc.step is not None and exc.chunk is not None
        assert f"rank {rank}:" in str(exc)
        assert elapsed < timeout * 2.5
    # Rank 0 receives from the silent rank 2; rank 1 waits on rank 0 and either times
    # out too or learns first that rank 0 gave up.
    assert results[0][0].peer == 2 and "timed out after 0.5 s" in str(results[0][0])
    assert ("timed out" in str(results[1][0])
            or "peer 0 finished without sending" in str(results[1][0]))


@pytest.mark.parametrize("n", [2, 3])
def test_a_retry_after_a_timeout_never_takes_the_failed_calls_messages(n: int) -> None:
    """Rank n-1 starts late: every other rank times out in call 0 and retries; rank n-1
    then runs call 0 on its own, sending messages nobody waits for any more, and fails
    too. Calls 1..5 must each sum their own inputs: the stale messages (call 0's tags)
    neither match the retry nor, four calls on, the call that reuses call 0's epoch."""
    late = n - 1
    others_failed = threading.Barrier(n)

    def rank_fn(t: Local):
        run = Allreduce(S.ring(n), t, timeout=0.3)
        outcomes = []
        if t.rank == late:
            others_failed.wait(timeout=30)
        try:
            run(np.full(16, 1000.0 + t.rank))
            outcomes.append("ok")
        except TransportError:
            outcomes.append("failed")
        if t.rank != late:
            others_failed.wait(timeout=30)
        run.timeout = 30  # every rank retries together now
        for call in range(1, 6):
            x = np.full(16, float(t.rank + 1 + 100 * call))
            run(x)
            outcomes.append(x[0])
        return outcomes

    results = Local.launch(n, rank_fn, timeout=60)
    for rank, outcome in enumerate(results):
        assert outcome[0] == "failed", (rank, outcome)
        assert outcome[1:] == [sum(r + 1 + 100 * call for r in range(n)) for call in range(1, 6)]


def test_late_messages_of_a_failed_call_are_dropped_from_the_mailbox() -> None:
    """What the retry test relies on, seen in the mailboxes: nothing is left over."""
    world = LocalWorld(2)
    gate = threading.Event()

    def run_rank(rank: int, out: list) -> None:
        t = Local(world, rank, timeout=30)
        run = Allreduce(S.ring(2), t, timeout=0.3)
        if rank == 1:
            gate.wait(30)
        try:
            run(np.ones(8))
        except TransportError:
            pass
        if rank == 0:
            gate.set()
        run.timeout = 30
        for _ in range(4):
            x = np.ones(8)
            run(x)
            out.append(float(x[0]))

    outs: list[list] = [[], []]
    threads = [threading.Thread(target=run_rank, args=(r, outs[r])) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert outs == [[2.0] * 4, [2.0] * 4]
    assert all(not box for box in world.mail.values()), world.mail


@pytest.mark.parametrize("n, victim", [(2, 1), (4, 2)])
def test_killed_peer_fails_fast_with_names(n: int, victim: int) -> None:
    def rank_fn(t: Local):
        if t.rank == victim:
            real = t.start
            calls = [0]

            def dying(messages):
                calls[0] += 1
                if calls[0] == 2:
                    raise SystemExit("simulated crash")
                return real(messages)

            t.start = dying
        t0 = time.monotonic()
        try:
            Allreduce(S.ring(n), t, timeout=5)(np.ones(64))
        except TransportError as exc:
            return exc, time.monotonic() - t0

    results = Local.launch(n, rank_fn, return_exceptions=True)
    assert isinstance(results[victim], SystemExit)
    for rank in range(n):
        if rank == victim:
            continue
        exc, elapsed = results[rank]
        assert exc.rank == rank and None not in (exc.step, exc.peer, exc.chunk)
        assert f"step {exc.step}" in str(exc) and f"peer {exc.peer}" in str(exc)
        assert f"chunk {exc.chunk}" in str(exc)
        assert elapsed < 5.5
    # The victim's ring successor learns of it at once (no waiting out the timeout).
    succ = (victim + 1) % n
    assert results[succ][0].peer == victim and "failed" in str(results[succ][0])


def test_accumulate_fp32_rounds_once() -> None:
    n = 8
    values = [np.float16(1.0), *[np.float16(0.0004)] * (n - 1)]  # each alone vanishes next to 1

    def rank_fn(t: Local, acc: bool) -> np.ndarray:
        x = np.full(16, values[t.rank], dtype=np.float16)
        Allreduce(S.reduce_bcast(n), t, accumulate_fp32=acc)(x)
        return x

    plain = Local.launch(n, lambda t: rank_fn(t, False))
    accumulated = Local.launch(n, lambda t: rank_fn(t, True))
    exact = np.float16(np.sum([np.float32(v) for v in values], dtype=np.float32))
    assert all(np.all(x == exact) for x in accumulated)
    assert all(np.all(x == np.float16(1.0)) for x in plain)  # fp16 partial sums lose it
    assert exact != np.float16(1.0)
    assert all(x.dtype == np.float16 for x in accumulated)


def test_ordering_many_messages_per_pair_in_one_step() -> None:
    # Rank 0 sends chunks 3, 1, 2, 0 to rank 1 in one step; rank 1 overwrites each:
    # with in-order matching the data lands in the named chunks.
    order = [3, 1, 2, 0]
    steps = [[[send(1, c) for c in order]], [[recv(0, c) for c in order]]]
    schedule = build_schedule(2, (0.25,) * 4, steps, algorithm="test-order")

    def rank_fn(t: Local) -> np.ndarray:
        x = np.arange(8, dtype=np.float64) + 100 * t.rank
        Allreduce(schedule, t, verified=True)(x)  # not an allreduce: run as it is
        return x

    assert np.array_equal(Local.launch(2, rank_fn)[1], np.arange(8))


def test_local_launch_helpers() -> None:
    assert Local.launch(4, lambda t: t.allreduce_max(t.rank)) == [3.0] * 4

    def native(t: Local) -> np.ndarray:
        x = np.full(5, t.rank + 1.0)
        t.native_allreduce(x)
        return x

    assert all(np.all(x == 10.0) for x in Local.launch(4, native))
    with pytest.raises(ZeroDivisionError):
        Local.launch(2, lambda t: 1 / 0)


def test_run_bench_returns_rows_with_a_real_check() -> None:
    from topoplan.runtime.bench import format_rows, run_bench

    rows = Local.launch(3, lambda t: run_bench(S.direct(3), t, [1024, 40_000], baseline=True,
                                               iters=2))
    assert rows[0] == rows[1] == rows[2]  # every rank returns the same rows
    for row in rows[0]:
        assert row.wrong == 0 and row.native_wrong == 0 and row.iters == 2
        assert row.busbw == pytest.approx(row.algbw * 4 / 3) and row.ratio > 0
    text = format_rows(rows[0], native_name="local sum")
    assert "size(B)" in text and "local sum" in text and "40000" in text


def test_run_bench_counts_wrong_elements() -> None:
    from topoplan.runtime.bench import run_bench

    # A schedule that is not an allreduce: the check must notice.
    rows = Local.launch(2, lambda t: run_bench(S.swap(2), t, [4096], iters=1, verified=True))
    # The pattern is i % 7 + rank % 3, so the sum is 2 (i % 7) + 1. After the swap rank 0
    # holds rank 1's i % 7 + 1, right only where i % 7 == 0; rank 1 holds i % 7, never
    # right. #wrong sums both ranks, as nccl-tests does.
    count = 4096 // 4
    assert rows[0][0].wrong == sum(1 for i in range(count) if i % 7) + count


def test_benchmarks_and_the_simulator_share_one_bus_bandwidth_convention() -> None:
    """busbw = algbw x 2(n-1)/n (nccl-tests), which is 0 for one rank, everywhere."""
    from topoplan.runtime.bench import run_bench
    from topoplan.cluster import loads_cluster
    from topoplan.analysis.sim import simulate
    from topoplan.ir.collectives import bus_factor

    assert bus_factor(1) == 0.0 and bus_factor(4) == 1.5
    alone = build_schedule(1, [1.0], [[]], algorithm="none")
    row = Local.launch(1, lambda t: run_bench(alone, t, [4096], iters=1))[0][0]
    assert row.algbw > 0 and row.busbw == 0.0
    report = simulate(loads_cluster("name: one\nboxes: [{name: a, gpus: 1}]\n"), alone, 4096)
    assert report.busbw == 0.0
    rows = Local.launch(4, lambda t: run_bench(S.ring(4), t, [4096], iters=1))[0]
    assert rows[0].busbw == pytest.approx(rows[0].algbw * 1.5)


# ---- calls in flight: start / test / wait ------------------------------------------------

@pytest.mark.parametrize("tagged, pollable", [(True, True), (False, True), (True, False)],
                         ids=["tagged", "untagged-like-nccl", "unpollable-like-gloo"])
def test_calls_in_flight_sum_their_own_inputs(tagged: bool, pollable: bool) -> None:
    n = 4

    def rank_fn(t: Local):
        t.tagged, t.pollable = tagged, pollable
        ring, rhd = Allreduce(S.ring(n), t, timeout=10), Allreduce(S.butterfly(n), t, timeout=10)
        runs = [ring, ring, rhd, ring, ring, ring]
        bufs = [np.full(100 + i, t.rank + 1.0 + i) for i in range(len(runs))]
        handles = [r.start(b) for r, b in zip(runs, bufs)]
        states = [repr(h) for h in handles]
        for h in reversed(handles):
            assert h.wait() is h.buffer
        ring.progress()
        return [float(b[0]) for b in bufs], states, all(h.test() for h in handles)

    for values, states, tested in Local.launch(n, rank_fn, timeout=30):
        assert values == [10.0 + n * i for i in range(6)]
        assert tested
        if not (tagged and pollable):  # one call at a time, in start order
            assert "queued" in states[-1]


def test_calls_of_different_executors_run_side_by_side_in_lanes() -> None:
    """A small buffer's call started first does not hold back a big one of another
    executor: with rank 3 late, rank 0's second call begins at once (in the next lane)
    and finishes first once rank 3 comes; a fifth call, whose lane is the first's,
    waits for it. Tags of the lanes are disjoint, so every call sums its own input."""
    n = 4

    def rank_fn(t: Local):
        if t.rank == 3:
            time.sleep(0.3)
        runs = [Allreduce(S.ring(n), t, timeout=10), Allreduce(S.direct(n), t, timeout=10),
                Allreduce(S.all_to_all(n), t, timeout=10), Allreduce(S.reduce_bcast(n), t, timeout=10),
                Allreduce(S.butterfly(n), t, timeout=10)]
        bufs = [np.full(50 + 10 * i, t.rank + 1.0 + i) for i in range(len(runs))]
        handles = [r.start(b) for r, b in zip(runs, bufs)]
        begun = [h._begun for h in handles]
        lanes = [h.lane for h in handles]
        order = [4, 1, 3, 0, 2] if t.rank % 2 else [0, 1, 2, 3, 4]
        for i in order:
            handles[i].wait()
        return [float(b[0]) for b in bufs], begun, lanes

    for rank, (values, begun, lanes) in enumerate(Local.launch(n, rank_fn, timeout=30)):
        assert values == [10.0 + n * i for i in range(5)]
        assert lanes == [0, 1, 2, 3, 0]
        if rank == 0:  # rank 3 is late: nothing can finish, yet four calls began
            assert begun == [True, True, True, True, False]


def test_an_executor_whose_tags_do_not_fit_a_lane_runs_alone(monkeypatch) -> None:
    """An executor with more messages per pair than a lane holds takes lane 0's tags and
    runs its calls alone; the others still run side by side around it."""
    from topoplan.runtime.executor import lanes
    n = 4
    monkeypatch.setattr(lanes, "LANE_WIDTH", 8)  # the ring's 6 messages a pair x 4 epochs > 8

    def rank_fn(t: Local):
        if t.rank == 3:
            time.sleep(0.3)
        ring = Allreduce(S.ring(n), t, timeout=10)
        direct, swap = Allreduce(S.direct(n), t, timeout=10), Allreduce(S.all_to_all(n), t, timeout=10)
        bufs = [np.full(40, t.rank + 1.0 + i) for i in range(3)]
        handles = [direct.start(bufs[0]), ring.start(bufs[1]), swap.start(bufs[2])]
        state = ([h._begun for h in handles], [h.lane for h in handles], ring._laned)
        for h in handles[::-1]:
            h.wait()
        return [float(b[0]) for b in bufs], state

    for rank, (values, (begun, lanes, laned)) in enumerate(Local.launch(n, rank_fn, timeout=30)):
        assert values == [10.0 + n * i for i in range(3)]
        assert lanes == [0, 0, 2] and not laned
        if rank == 0:
            assert begun == [True, False, False]


def test_start_returns_the_exported_handle_of_every_call() -> None:
    import topoplan
    from topoplan.runtime.executor import AllreduceHandle, Handle
    assert AllreduceHandle is Handle is topoplan.Handle is topoplan.AllreduceHandle

    def rank_fn(t: Local):
        x, y = np.full(4, t.rank + 1.0), np.empty(2)
        handles = [Allreduce(S.ring(2), t, timeout=10).start(x),
                   topoplan.ReduceScatter(S.ring_reduce_scatter([0, 1]), t, timeout=10).start(
                       np.ones(4), y)]
        kinds = [type(h) for h in handles]
        return kinds, [h.wait() is b for h, b in zip(handles, (x, y))], repr(handles[0])

    for kinds, results, text in Local.launch(2, rank_fn, timeout=30):
        assert kinds == [Handle, Handle] and all(results)
        assert text == "<Handle call 0 done>"


def test_a_call_in_flight_moves_while_the_caller_polls() -> None:
    def rank_fn(t: Local):
        run = Allreduce(S.ring(3), t, timeout=10)
        x = np.full(1000, t.rank + 1.0)
        handle = run.start(x)
        polls = 0
        while not handle.test():
            polls += 1
            time.sleep(1e-4)  # "compute"
        return float(x[0]), polls

    assert [v for v, _ in Local.launch(3, rank_fn)] == [6.0, 6.0, 6.0]


def test_test_leaves_the_calls_to_a_thread_already_moving_them() -> None:
    """While another thread of the rank moves the calls in flight (holds their lock),
    ``test()`` returns at once instead of waiting for it, as a gradient hook must; once
    that thread lets go, ``test()`` moves them again and the call finishes."""
    def rank_fn(t: Local):
        run = Allreduce(S.ring(3), t, timeout=10)
        x = np.full(100, t.rank + 1.0)
        handle = run.start(x)
        held, release = threading.Event(), threading.Event()

        def holder() -> None:
            with run._queue.lock:
                held.set()
                release.wait(10)

        thread = threading.Thread(target=holder)
        thread.start()
        held.wait(10)
        t0 = time.monotonic()
        busy = [handle.test() for _ in range(20)]
        blocked = time.monotonic() - t0
        release.set()
        thread.join()
        while not handle.test():
            time.sleep(1e-4)
        return float(x[0]), busy, blocked

    for value, busy, blocked in Local.launch(3, rank_fn, timeout=30):
        assert value == 6.0
        assert busy == [False] * 20 and blocked < 1.0


def test_a_failed_call_in_flight_raises_from_test_and_wait() -> None:
    """Rank 2 never starts: the others' handles fail within the timeout, naming the
    rank, step and peer, and keep failing; the buffer's next start is allowed."""
    timeout = 0.5

    def rank_fn(t: Local):
        if t.rank == 2:
            time.sleep(timeout * 3)
            return None
        run = Allreduce(S.ring(3), t, timeout=timeout)
        x = np.ones(30)
        handle = run.start(x)
        with pytest.raises(TopoplanError, match="in flight"):
            run.start(x)
        t0 = time.monotonic()
        with pytest.raises(TransportError) as first:
            while not handle.test():
                time.sleep(1e-3)
        with pytest.raises(TransportError):
            handle.wait()
        return first.value, time.monotonic() - t0, run.progress()

    results = Local.launch(3, rank_fn)
    exc, elapsed, left = results[0]
    assert exc.rank == 0 and exc.peer == 2 and exc.step is not None
    assert "timed out after 0.5 s" in str(exc) and elapsed < timeout * 2.5
    assert left == 0
