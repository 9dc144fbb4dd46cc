"""ReduceScatter and AllGather on the in-process Local transport (threads): exact results
with the collective's buffer layout, from hand-written rings and from the planners."""

from __future__ import annotations

import numpy as np
import pytest

import topoplan
from tests.support import schedules as S
from tests.support.cluster_shapes import cluster
from topoplan.errors import TopoplanError
from topoplan.planners import plan
from topoplan.runtime.transports import Local
from topoplan.runtime.transports.local import LocalWorld
from topoplan.ir.verify import verify


def _schedules(collective: str) -> list[tuple[str, int, object]]:
    ring = S.ring_reduce_scatter if collective == "reduce_scatter" else S.ring_allgather
    out = []
    for n in (1, 2, 3, 5, 8):
        out.append((f"hand-ring-n{n}", n, ring(list(reversed(range(n))))))
        for planner in ("ring", "ring-topo", "rhd"):
            for chunks in (1, 3):
                c = cluster("two-switch", n)
                out.append((f"{planner}-c{chunks}-n{n}", n,
                            plan(c, planner, size=1 << 20, collective=collective,
                                 chunks=chunks)))
    return out


RS, AG = _schedules("reduce_scatter"), _schedules("allgather")


@pytest.mark.parametrize("name, n, schedule", RS, ids=[name for name, _, _ in RS])
def test_reduce_scatter_gives_each_rank_its_shard_of_the_sum(name, n, schedule):
    verify(schedule)

    def rank_fn(t: Local) -> list[tuple[np.ndarray, np.ndarray]]:
        run = topoplan.ReduceScatter(schedule, t, timeout=10)
        out = []
        for m in (0, 1, 7, 250):  # elements per shard
            x = (np.arange(n * m, dtype=np.float64) % 13) + 2.0 * t.rank
            before = x.copy()
            y = np.full(m, np.nan)
            assert run(x, y) is y
            assert np.array_equal(x, before)  # the input is left as it was
            out.append((y, x))
        return out

    results = Local.launch(n, rank_fn, timeout=30)
    for i, m in enumerate((0, 1, 7, 250)):
        total = (np.arange(n * m) % 13) * n + 2.0 * sum(range(n))
        for rank in range(n):
            assert np.array_equal(results[rank][i][0], total[rank * m:(rank + 1) * m]), (
                name, m, rank)


@pytest.mark.parametrize("name, n, schedule", AG, ids=[name for name, _, _ in AG])
def test_allgather_gives_every_rank_every_shard(name, n, schedule):
    verify(schedule)

    def rank_fn(t: Local) -> list[np.ndarray]:
        run = topoplan.AllGather(schedule, t, timeout=10)
        out = []
        for m in (0, 1, 7, 250):
            x = np.random.default_rng(t.rank * 31 + m).standard_normal(m).astype(np.float32)
            y = np.full(n * m, np.nan, dtype=np.float32)
            assert run(x, y) is y
            out.append((x, y))
        return out

    results = Local.launch(n, rank_fn, timeout=30)
    for i in range(4):
        expected = np.concatenate([results[rank][i][0] for rank in range(n)])
        for rank in range(n):
            assert results[rank][i][1].tobytes() == expected.tobytes(), (name, rank)


def test_allgather_in_place_and_async():
    """The input may be the rank's own shard of the output; start/wait as Allreduce's,
    with two calls in flight on distinct buffers."""
    n, m = 4, 100
    schedule = plan(cluster("single-switch", n), "rhd", size=1 << 20, collective="allgather")

    def rank_fn(t: Local):
        run = topoplan.AllGather(schedule, t, timeout=10)
        a = np.zeros(n * m)
        a[t.rank * m:(t.rank + 1) * m] = t.rank + 1
        b = np.zeros(n * m)
        first = run.start(a[t.rank * m:(t.rank + 1) * m], a)
        second = run.start(np.full(m, -t.rank, dtype=np.float64), b)
        return first.wait() is a and second.wait() is b, a, b

    for ok, a, b in Local.launch(n, rank_fn, timeout=30):
        assert ok
        assert np.array_equal(a, np.repeat(np.arange(1.0, n + 1), m))
        assert np.array_equal(b, np.repeat(-np.arange(float(n)), m))


def test_reduce_scatter_of_torch_tensors_with_fp32_accumulation():
    torch = pytest.importorskip("torch")
    n, m = 3, 64
    schedule = plan(cluster("mixed", n), "ring", size=1 << 20, collective="reduce_scatter")

    def rank_fn(t: Local):
        run = topoplan.ReduceScatter(schedule, t, timeout=10, accumulate_fp32=True)
        x = torch.full((n * m,), 0.1 * (t.rank + 1), dtype=torch.float16)
        y = torch.empty(m, dtype=torch.float16)
        handle = run.start(x, y)
        return handle.wait()

    for y in Local.launch(n, rank_fn, timeout=30):
        expected = torch.tensor(sum(0.1 * (r + 1) for r in range(n)), dtype=torch.float32)
        assert torch.equal(y, torch.full((m,), expected.item(), dtype=torch.float16))


def test_bad_buffers_and_schedules_are_refused():
    schedule = S.ring_reduce_scatter([0, 1])
    with pytest.raises(TopoplanError, match="ReduceScatter runs reduce_scatter schedules, got "
                                            "'allgather'"):
        topoplan.ReduceScatter(S.ring_allgather([0, 1]), LocalWorld(2).transport(0))
    with pytest.raises(TopoplanError, match="AllGather runs allgather schedules, got "
                                            "'allreduce'"):
        topoplan.AllGather(S.ring(2), LocalWorld(2).transport(0))
    with pytest.raises(TopoplanError, match="Allreduce runs allreduce schedules, got "
                                            "'reduce_scatter'"):
        topoplan.Allreduce(schedule, LocalWorld(2).transport(0))
    run = topoplan.ReduceScatter(schedule, LocalWorld(2).transport(0))
    with pytest.raises(TopoplanError, match=r"reduce_scatter of 2 ranks: input of 10 and output "
                                            r"of 4 elements; expected an input of nranks \(2\) "
                                            r"times the output's elements"):
        run(np.zeros(10), np.zeros(4))
    with pytest.raises(TopoplanError, match="input and output must be arrays of one kind and "
                                            "dtype, got numpy float64 and numpy float32"):
        run(np.zeros(10), np.zeros(5, dtype=np.float32))
    gather = topoplan.AllGather(S.ring_allgather([0, 1]), LocalWorld(2).transport(0))
    with pytest.raises(TopoplanError, match=r"allgather of 2 ranks: input of 3 and output of 7 "
                                            r"elements; expected an output of nranks \(2\)"):
        gather(np.zeros(3), np.zeros(7))


def test_one_engine_lays_out_every_collective_from_the_schedules_spec():
    """The engine behind the three calls has no branch per collective: given any schedule,
    it takes the buffers' layout from the schedule's collective and computes the same as
    the call that names it."""
    from topoplan.runtime.executor.engine import Executor
    n, m = 3, 4
    cases = [(topoplan.Allreduce, S.ring(n), n * m, n * m),
             (topoplan.ReduceScatter, S.ring_reduce_scatter(list(range(n))), n * m, m),
             (topoplan.AllGather, S.ring_allgather(list(range(n))), m, n * m)]

    def rank_fn(t: Local) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for call, schedule, n_in, n_out in cases:
            engine = Executor(schedule, t, timeout=10)
            assert Executor.collective is None and engine.spec.name == call.collective
            results = []
            for run in (engine._call, call(schedule, t, timeout=10)):
                x = np.arange(n_in, dtype=np.float64) + 100.0 * t.rank
                buffers = (x,) if call is topoplan.Allreduce else (x, np.full(n_out, np.nan))
                results.append(run(*buffers).copy())
            out.append(tuple(results))
        return out

    total = n * np.arange(n * m) + 100.0 * sum(range(n))
    gathered = np.concatenate([np.arange(m) + 100.0 * r for r in range(n)])
    for rank, rank_results in enumerate(Local.launch(n, rank_fn, timeout=30)):
        expected = [total, total[rank * m:(rank + 1) * m], gathered]
        for want, (engine_result, call_result) in zip(expected, rank_results):
            assert np.array_equal(engine_result, want), rank
            assert np.array_equal(call_result, want), rank


# ---- run_bench: nccl-tests rows for reduce-scatter and allgather ------------------------------

@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_run_bench_runs_the_schedules_collective_with_a_real_check(collective):
    from topoplan.runtime.bench import format_rows, run_bench
    n = 3
    schedule = plan(cluster("two-switch", n), "ring", size=1 << 20, collective=collective)
    sizes = [12, 12 * 1000 + 24]

    rows = Local.launch(n, lambda t: run_bench(schedule, t, sizes, baseline=True, iters=2))
    assert rows[0] == rows[1] == rows[2]
    for row, size in zip(rows[0], sizes):
        assert row.collective == collective and row.size == size
        assert row.count == size // 4 // n  # one rank's shard (nccl-tests)
        assert row.redop == ("none" if collective == "allgather" else "sum")
        assert row.wrong == 0 and row.native_wrong == 0 and row.native_note is None
        assert row.busbw == pytest.approx(row.algbw * 2 / 3)  # (n-1)/n
        assert row.native_busbw == pytest.approx(row.native_algbw * 2 / 3)
    text = format_rows(rows[0], native_name=Local.native_names[collective])
    assert Local.native_names[collective] in text
    assert (" none " in text) == (collective == "allgather")
    # bfloat16 runs on torch tensors: the check still exact.
    torch = pytest.importorskip("torch")  # noqa: F841
    rows = Local.launch(n, lambda t: run_bench(schedule, t, [24], iters=1, dtype="bfloat16"))
    assert rows[0][0].wrong == 0 and rows[0][0].count == 4


def _wrong_reduce_scatter() -> object:
    """Each rank overwrites its own shard with the peer's input instead of adding it."""
    from tests.support.schedules import build_schedule, recv, send
    steps = [[[send(1 - r, 1 - r), recv(1 - r, r, reduce=False)]] for r in range(2)]
    return build_schedule(2, (0.5, 0.5), steps, collective="reduce_scatter", algorithm="broken")


def test_run_bench_counts_wrong_elements_of_a_reduce_scatter_and_an_allgather():
    from tests.support.schedules import build_schedule
    from topoplan.runtime.bench import run_bench
    count = 4096 // 4
    m = count // 2
    rows = Local.launch(2, lambda t: run_bench(_wrong_reduce_scatter(), t, [4096], iters=1,
                                                      verified=True))
    # Pattern i % 7 + rank % 3, sum 2 (i % 7) + 1. Rank 0 holds rank 1's i % 7 + 1, right
    # only where i % 7 == 0; rank 1 holds rank 0's i % 7, never right.
    assert rows[0][0].wrong == sum(1 for i in range(m) if i % 7) + m
    # An "allgather" that moves nothing: every rank misses the other's shard (the output
    # starts as -1, which no result holds).
    idle = build_schedule(2, (0.5, 0.5), [[], []], collective="allgather", algorithm="idle")
    rows = Local.launch(2, lambda t: run_bench(idle, t, [4096], iters=1, verified=True))
    assert rows[0][0].wrong == 2 * m


def test_run_bench_refuses_sizes_that_do_not_shard_and_reports_a_missing_native():
    from topoplan.runtime.bench import format_rows, run_bench
    from topoplan.runtime.transports.base import NoNative
    schedule = S.ring_allgather([0, 1, 2])
    with pytest.raises(TopoplanError, match=r"size 1000 B: an allgather of 3 ranks cuts the "
                                            r"full buffer into 3 equal shards, so it must be "
                                            r"a multiple of 3 float32 elements \(12 B\); use "
                                            r"996 or 1008 B"):
        run_bench(schedule, LocalWorld(3).transport(0), [1000])

    class NoGather(Local):
        def native_allgather(self, input, output):
            raise NoNative("this transport has no allgather")

    def rank_fn(t: Local):
        return run_bench(schedule, NoGather(t.world, t.rank), [1200], baseline=True, iters=1)

    row = Local.launch(3, rank_fn)[0][0]
    assert row.wrong == 0 and row.native_time_us is None and row.ratio is None
    assert row.native_note == "this transport has no allgather"
    text = format_rows([row], native_name="native gather")
    assert "# native: not run: this transport has no allgather" in text
    assert text.splitlines()[2].split()[-5:] == ["-"] * 5
