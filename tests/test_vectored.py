"""Vectored messages (IR v4): one send/recv carries several chunk ranges as one message.

The JSON form and its errors, pairing, the verifier (per-range reduces, overwrites,
clashes and channels), the simulator (one message, one op a side), the executor on
Local threads, real MPI processes and gloo processes, :func:`vectorize` on planners'
reduce-scatters and allgathers, ``plan(..., vectored=True)`` and ``topoplan plan
--vectored``, and the MSCCL export (one step per range).
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import forkserver
from tests.support import vectored_cases as V
from tests.support.clusters import flat_cluster_yaml
from tests.support.vectorize_reference import split_vectored_reference, vectorize_reference
from topoplan.analysis.cost import CostProfile
from topoplan.analysis.sim import simulate
from topoplan.cluster import loads_cluster
from topoplan.errors import PlannerError, ScheduleError
from topoplan.ir.matching import match_messages
from topoplan.ir.parse import loads_schedule
from topoplan.ir.passes import coalesce, split_vectored, vectorize
from topoplan.ir.schedule import (Native, Schedule, build_schedule, equal_chunks, native_op, recv,
                                  send, vrecv, vsend)
from topoplan.ir.verify import verify
from topoplan.runtime.transports import Local

ROOT = Path(__file__).resolve().parents[1]


def exchange(ranges_0: list, ranges_1: list, *, reduce: bool = True, channel: int = 0):
    """Two ranks, four chunks: rank 0 sends ``ranges_0`` to rank 1, which receives
    ``ranges_1`` (a reduce-scatter's halves when they agree)."""
    return build_schedule(2, equal_chunks(4), [
        [[vsend(1, ranges_0, channel)]], [[vrecv(0, ranges_1, reduce, channel)]]],
        algorithm="hand")


# -- JSON ------------------------------------------------------------------------------
def test_json_writes_ranges_reads_them_back_and_needs_version_4() -> None:
    s = V.vectored_allreduce(3)
    assert s.version == 4
    data = json.loads(s.to_json())
    first = data["ranks"][0]["steps"][0][0]
    assert first == {"op": "send", "peer": 1, "ranges": [[1, 1], [4, 1]]}
    assert data["ranks"][0]["steps"][0][2] == {"op": "recv", "peer": 1,
                                               "ranges": [[0, 1], [3, 1]], "reduce": True}
    back = loads_schedule(s.to_json())
    assert back == s and back.ranks[0].steps[0][0].ranges == ((1, 1), (4, 1))
    # One range is written as before (and a schedule without several stays below v4).
    plain = build_schedule(2, equal_chunks(2), [[[send(1, 0)]], [[recv(0, 0, True)]]])
    assert plain.version == 1 and '"ranges"' not in plain.to_json()
    one = loads_schedule(plain.to_json().replace('"chunk":0', '"ranges":[[0,1]]')
                         .replace('"version": 1', '"version": 4'))
    assert one == plain


def _doc(op: dict, version: int = 4) -> str:
    return json.dumps({"format": "topoplan-schedule", "version": version, "nranks": 2,
                       "chunks": [0.25] * 4, "ranks": [
                           {"rank": 0, "steps": [[{"op": "send", "peer": 1, **op}]]},
                           {"rank": 1, "steps": []}]})


@pytest.mark.parametrize("op, version, message", [
    ({"ranges": [[0, 1], [2, 1]]}, 3, r"ranges \(a vectored message\) need \"version\": 4"),
    ({"ranges": [[0, 1], [2, 1]], "chunk": 0}, 4, "give either ranges or chunk"),
    ({"ranges": [[0, 1], [2, 1]], "count": 1}, 4, "give either ranges or chunk"),
    ({"ranges": [0, 2]}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": []}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": [[0, 1, 2]]}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": [[0, True]]}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": [[0, 1.5]]}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": "0..3"}, 4, r"ranges must be a non-empty list of \[chunk, count\] pairs"),
    ({"ranges": [[0, 1], [4, 1]]}, 4, r"ranges\[1\]: chunk 4 out of range\(4\)"),
    ({"ranges": [[-1, 1]]}, 4, r"ranges\[0\]: chunk -1 out of range\(4\)"),
    ({"ranges": [[0, 1], [2, 0]]}, 4, r"ranges\[1\]: count must be >= 1, got 0"),
    ({"ranges": [[0, 1], [2, 3]]}, 4, r"ranges\[1\]: chunks 2..4 run past the last chunk 3"),
    ({"ranges": [[0, 2], [1, 2]]}, 4, r"ranges\[1\]: chunks 1..2 starts before the end of "
                                      r"the range before it \(chunks 0..1\)"),
    ({"ranges": [[2, 1], [0, 1]]}, 4, r"ranges\[1\]: chunk 0 starts before the end"),
])
def test_every_bad_ranges_is_named_where_it_is(op: dict, version: int, message: str) -> None:
    with pytest.raises(ScheduleError, match=r"<x>: ranks\[0\]\.steps\[0\]\[0\]: " + message):
        loads_schedule(_doc(op, version), "<x>")


def test_a_file_whose_vectored_recvs_share_a_chunk_is_refused_per_range() -> None:
    text = json.dumps({"format": "topoplan-schedule", "version": 4, "nranks": 3,
                       "chunks": [0.25] * 4, "ranks": [
                           {"rank": 0, "steps": [[{"op": "recv", "peer": 1,
                                                   "ranges": [[0, 1], [2, 1]]},
                                                  {"op": "recv", "peer": 2, "chunk": 2}]]},
                           {"rank": 1, "steps": []}, {"rank": 2, "steps": []}]})
    with pytest.raises(ScheduleError, match=r"ranks\[0\]\.steps\[0\]: two recvs into chunk 2"):
        loads_schedule(text, "<x>")


# -- matching and verify ---------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4])
def test_verify_accepts_a_vectored_allreduce_and_counts_its_messages(n: int) -> None:
    s = V.vectored_allreduce(n)
    report = verify(s)
    assert report.nmessages == 2 * n * (n - 1) == s.nmessages
    assert max(len(st) for p in s.ranks for st in p.steps) == 2 * (n - 1)


def test_a_pair_that_disagrees_on_the_ranges_is_named_with_both() -> None:
    with pytest.raises(ScheduleError, match=r"hand schedule: message 0 from rank 0 to rank 1: "
                                            r"rank 0 step 0 sends chunks 0 \+ 2 but rank 1 "
                                            r"step 0 receives it as chunks 0 \+ 3"):
        verify(exchange([(0, 1), (2, 1)], [(0, 1), (3, 1)]))
    with pytest.raises(ScheduleError, match=r"sends chunks 0 \+ 2 but rank 1 step 0 receives "
                                            r"it as chunk 0$"):
        verify(exchange([(0, 1), (2, 1)], [(0, 1)]))


def test_ranges_built_in_python_that_overlap_are_named() -> None:
    with pytest.raises(ScheduleError, match=r"rank 0 step 0: chunks 0..1 \+ 1: ranges out of "
                                            r"range\(4\), overlapping or out of order"):
        verify(exchange([(0, 2), (1, 1)], [(0, 2), (1, 1)]))


def test_a_vectored_recv_reduces_or_overwrites_every_range() -> None:
    # Overwriting where the allreduce must add: the sum misses contributions.
    s = V.vectored_allreduce(2)
    broken = build_schedule(2, s.chunks, [
        [[op if op.kind.value == "send" else vrecv(op.peer, op.ranges, False) for op in st]
         if k == 0 else list(st) for k, st in enumerate(p.steps)] for p in s.ranks])
    with pytest.raises(ScheduleError, match=r"rank 0 ends with chunk 0 holding \{1\}; "
                                            r"expected all of 0..1 once \(missing \{0\}\)"):
        verify(broken)
    # A recv that names only the first range of its message is a mismatch, not a silent
    # use of the first range.
    s = V.vectored_allreduce(3)
    short = build_schedule(3, s.chunks, [
        [[op if op.kind.value == "send" or k == 0 else recv(op.peer, op.chunk)
          for op in st] for k, st in enumerate(p.steps)] for p in s.ranks])
    with pytest.raises(ScheduleError, match="message 1 from rank 0 to rank 1: rank 0 step 1 "
                                            r"sends chunks 0 \+ 3 but rank 1 step 1 receives "
                                            "it as chunk 0$"):
        verify(short)


def test_recv_clashes_and_channels_are_checked_range_by_range() -> None:
    clash = build_schedule(3, equal_chunks(4), [
        [[vrecv(1, [(0, 1), (2, 1)]), recv(2, 2)]], [[vsend(0, [(0, 1), (2, 1)])]],
        [[send(0, 2)]]], algorithm="hand")
    with pytest.raises(ScheduleError, match="rank 0 step 0: two recvs into chunk 2"):
        verify(clash)
    # Chunk 2 is channel 1's by its vectored message and channel 0's by the plain one.
    chans = build_schedule(3, equal_chunks(4), [
        [[vsend(1, [(0, 1), (2, 1)], channel=1)], [send(2, 2)]],
        [[vrecv(0, [(0, 1), (2, 1)], True, channel=1)]], [[], [recv(0, 2, True)]]],
        algorithm="hand")
    with pytest.raises(ScheduleError, match="chunk 2 is on channel 0 here but on channel 1"):
        verify(chans)


def test_code_that_reads_one_range_refuses_a_vectored_schedule_by_name() -> None:
    s = V.vectored_allreduce(2)
    with pytest.raises(ScheduleError, match=r"rank 0 step 0 sends chunks 1 \+ 3 to rank 1 as "
                                            r"one vectored message \(IR v4\), which this part "
                                            "of topoplan does not handle yet"):
        match_messages(s)
    assert match_messages(s, vectored=True).t_more
    from topoplan.ir.passes import channelize
    with pytest.raises(PlannerError, match=r"rank 0 step 0 sends or receives chunks 1 \+ 3 "
                                           "to or from rank 1 as one vectored message"):
        channelize(s, 2)


# -- simulator -------------------------------------------------------------------------
def test_simulate_prices_a_vectored_message_as_one_op_a_side_of_all_its_bytes() -> None:
    cluster = loads_cluster(flat_cluster_yaml(2, 1))
    s = exchange([(0, 1), (2, 2)], [(0, 1), (2, 2)])
    split = split_vectored(s)
    assert split.nops == 4 and s.nops == 2
    ideal = CostProfile(name="links")
    posting = CostProfile(name="posting", op_overhead=5e-6)
    size = 1 << 10  # small: the posting does not hide behind the transfer
    # Links alone: the same bytes either way.
    a, b = (simulate(cluster, x, size, profile=ideal).time_s for x in (s, split))
    assert a == pytest.approx(b, rel=1e-9)
    # Per-op posting: one op a side, not two.
    a, b = (simulate(cluster, x, size, profile=posting).time_s for x in (s, split))
    assert b - a == pytest.approx(5e-6, rel=0.01)  # (a few ns of transfer overlap it)
    report = simulate(cluster, s, size, profile=ideal, record=True)
    (t,) = report.transfers
    assert (t.chunk, t.count, t.more, t.nbytes) == (0, 1, ((2, 2),), 3 * size // 4)


# -- executor --------------------------------------------------------------------------
def test_vectored_cases_on_local_threads() -> None:
    for failures, ncases in Local.launch(4, V.vectored_cases, timeout=120):
        assert failures == [] and ncases == 22


def test_vectored_scratch_layout() -> None:
    """A vectored send packs its ranges at its step's start; a vectored recv adds or
    copies each part after the wait."""
    from topoplan.runtime.executor.compiler import compile_program
    s = V.vectored_allreduce(2)  # chunks 0, 2 are rank 0's; 1, 3 rank 1's
    p = compile_program(s, 0, 8)
    first, second = p.steps
    assert first.snapshots == [((2, 4), (0, 2)), ((6, 8), (2, 4))]
    assert first.reduces == [((0, 2), (4, 6)), ((4, 6), (6, 8))] and first.copies == []
    assert second.copies == [((2, 4), (4, 6)), ((6, 8), (6, 8))]
    assert [m.slot for m in first.messages] == [(4, 8), (0, 4)]


@pytest.mark.mpi
def test_vectored_cases_on_mpi_processes() -> None:
    pytest.importorskip("mpi4py")
    from topoplan.runtime.mpirun import mpiexec
    proc = mpiexec(4, [sys.executable, "-m", "tests.mpi_vectored"], timeout=240, cwd=ROOT)
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("TOPOPLAN-RESULT "):
            record = json.loads(line.removeprefix("TOPOPLAN-RESULT "))
            records[record["rank"]] = record
    assert sorted(records) == [0, 1, 2, 3], f"{proc.stdout}\n{proc.stderr[-3000:]}"
    for record in records.values():
        assert record["failures"] == [] and record["ncases"] == 22, record


def test_vectored_cases_over_gloo() -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from topoplan.runtime.transports import Torch
    for record in Torch.launch(4, V.torch_rank_main, backend="gloo", timeout=200,
                               start_method=forkserver.START):
        assert record["failures"] == [] and record["ncases"] == 22, record


# -- vectorize ------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["ring", "rhd", "mcf"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_vectorize_plans_verify_and_compute_the_same_with_fewer_ops(algorithm: str,
                                                                    collective: str) -> None:
    from topoplan.planners import plan
    from topoplan.runtime.executor import AllGather, ReduceScatter
    cluster = loads_cluster(flat_cluster_yaml(8, 2))
    plain = plan(cluster, algorithm=algorithm, size=1 << 20, collective=collective)
    vec = vectorize(plain)
    verify(vec)
    assert split_vectored(vec).nops == plain.nops  # the same ranges, merged
    if algorithm == "ring":  # one shard a step to one peer: nothing to merge
        assert vec is plain
    else:
        assert vec.nops < plain.nops and vec.version == 4
    assert vectorize(vec) == vec
    m = 37

    def rank_fn(t: Local) -> list[np.ndarray]:
        out = []
        for s in (plain, vec):
            if collective == "reduce_scatter":
                y = np.full(m, np.nan)
                ReduceScatter(s, t, timeout=60)(V.ints(8 * m, t.rank, 1), y)
            else:
                y = np.full(8 * m, np.nan)
                AllGather(s, t, timeout=60)(V.ints(m, t.rank, 1), y)
            out.append(y)
        return out

    for rank, (a, b) in enumerate(Local.launch(8, rank_fn, timeout=120)):
        assert np.array_equal(a, b), rank
        want = (sum(V.ints(8 * m, r, 1) for r in range(8))[rank * m:(rank + 1) * m]
                if collective == "reduce_scatter" else
                np.concatenate([V.ints(m, r, 1) for r in range(8)]))
        assert np.array_equal(b, want), rank


def test_vectorize_leaves_what_it_cannot_merge_and_coalesce_leaves_vectored_ops() -> None:
    # Two reducing recvs of one chunk in one step (IR v2) would overlap: left as they are.
    overlap = build_schedule(2, equal_chunks(2), [
        [[send(1, 0, 2), send(1, 1)]], [[recv(0, 0, True, 2), recv(0, 1, True)]]])
    assert vectorize(overlap) is overlap
    # Different reduce flags at the receiver: two messages still.
    mixed = build_schedule(2, equal_chunks(4), [
        [[send(1, 0), send(1, 2)]], [[recv(0, 0, True), recv(0, 2, False)]]])
    assert vectorize(mixed) is mixed
    # Touching ranges join into one range (no vectored op needed).
    touching = build_schedule(2, equal_chunks(4), [
        [[send(1, 2), send(1, 0), send(1, 1)]], [[recv(0, 2), recv(0, 0), recv(0, 1)]]])
    assert vectorize(touching).ranks[0].steps[0] == (send(1, 0, 3),)
    s = V.vectored_allreduce(3)
    assert coalesce(s) == s


# -- vectorize, split_vectored and verify against the loops they replaced -----------------
def _random_ranges(rng: random.Random, nchunks: int, free: list[int]) -> list[tuple[int, int]]:
    """One to three disjoint ranges in increasing order, starting at multiples of 4 taken
    from ``free`` while it lasts (so that a step's messages seldom overlap; some touch);
    one time in ten, ranges out of order, overlapping or running past the last chunk."""
    k = rng.choice([1, 1, 2, 3])
    if rng.random() < 0.1:
        return [(rng.randrange(nchunks), rng.choice([1, 2, 5])) for _ in range(k)]
    starts = [free.pop() if free else rng.randrange(0, nchunks, 4) for _ in range(k)]
    return [(a, rng.choice([1, 1, 2, 4])) for a in sorted(set(starts))]


def _random_schedule(rng: random.Random) -> Schedule:
    """A small schedule of plain and vectored messages placed at random, among a few
    pairs, on one of two channels, most in lock-step (the send and the recv in the same
    step, steps in message order, so that messages pair as placed and many share a step);
    a few land in another step, lose a side, name other ranges at the receiver or another
    channel or reduce flag, or name the rank itself as the peer; ops are sometimes
    shuffled within their step, and some schedules end with a native allreduce over every
    rank (IR v3). An allreduce, or a reduce-scatter or allgather where chunks cut into
    shards."""
    n, nchunks, nsteps = rng.randint(2, 4), rng.choice([32, 64]), rng.choice([1, 1, 2, 3])
    steps: list[list[list[Any]]] = [[[] for _ in range(nsteps)] for _ in range(n)]
    pairs = [(rng.randrange(n), rng.randrange(n), rng.choice([0, 0, 0, 1]), rng.random() < 0.5)
             for _ in range(rng.randint(1, 4))]  # (src, dst, channel, reduce)
    free = rng.sample(range(0, nchunks, 4), nchunks // 4)
    for t in sorted(rng.randrange(nsteps) for _ in range(rng.randint(2, 16))):
        src, dst, channel, reduce = rng.choice(pairs)
        if src == dst and rng.random() < 0.97:
            continue
        if rng.random() < 0.05:
            channel, reduce = rng.choice([0, 1]), not reduce
        ranges = _random_ranges(rng, nchunks, free)
        into = ranges if rng.random() < 0.97 else _random_ranges(rng, nchunks, free)
        if rng.random() < 0.98:
            steps[src][t if rng.random() < 0.9 else rng.randrange(nsteps)].append(
                vsend(dst, ranges, channel))
        if rng.random() < 0.98:
            steps[dst][t if rng.random() < 0.9 else rng.randrange(nsteps)].append(
                vrecv(src, into, reduce, channel))
    for program in steps:
        for step in program:
            if rng.random() < 0.1:
                rng.shuffle(step)
    if rng.random() < 0.1:
        for program in steps:
            program.append([native_op("allreduce", range(n), 0, nchunks)])
    collective = rng.choice(["allreduce", "reduce_scatter", "allgather"]) if n != 3 else (
        "allreduce")
    return build_schedule(n, equal_chunks(nchunks), steps, algorithm="random",
                          collective=collective)


def _ops_typed(schedule: Schedule) -> list:
    """Every op with the type of each field: ``==`` alone would let a numpy integer pass for
    an int, or a list of ranges for a tuple."""
    return [(r, s, op) if isinstance(op, Native) else
            (r, s, op.kind, type(op.more), [(type(x), x) for x in (
                op.peer, op.chunk, op.reduce, op.count, op.channel,
                *(x for rng in op.more for x in (type(rng), *rng)))])
            for r, s, op in schedule.ops()]


def _same(got: Schedule, want: Schedule) -> None:
    assert got == want and got.version == want.version and got.meta == want.meta
    assert _ops_typed(got) == _ops_typed(want)


def _planned() -> list[Schedule]:
    """Plans vectorize merges in (rhd, mcf; on two channels; composed, with native steps)
    and one it leaves alone (ring)."""
    from topoplan.planners import plan
    cluster = loads_cluster(flat_cluster_yaml(8, 2))
    out = [plan(cluster, algorithm=a, size=1 << 20, collective=c, channels=k)
           for a in ("ring", "rhd", "mcf") for c in ("reduce_scatter", "allgather", "allreduce")
           for k in (1, 2)]
    out.append(plan(cluster, algorithm="composed", size=1 << 20))
    assert any(op.channel for s in out for _, _, op in s.ops())
    assert any(isinstance(op, Native) for s in out for _, _, op in s.ops())
    return out


@pytest.mark.parametrize("seed", range(4))
def test_vectorize_and_split_vectored_give_what_their_loops_gave(seed: int) -> None:
    merged = 0
    rng = random.Random(seed)
    cases = [_random_schedule(rng) for _ in range(150)] + (_planned() if seed == 0 else [])
    for s in cases:
        for x in (s, vectorize_reference(s)):  # plain ops in, then vectored ones
            want, got = vectorize_reference(x), vectorize(x)
            assert (got is x) == (want is x)  # nothing to merge: the schedule itself
            _same(got, want)
            merged += got is not x
            split = split_vectored(got)
            assert (split is got) == (split_vectored_reference(got) is got)
            _same(split, split_vectored_reference(got))
    assert merged > 25  # merges happen, not only refusals


def test_the_checks_of_vectored_ranges_on_arrays_are_the_loop_they_replaced() -> None:
    from topoplan.ir.matching import _bad_more
    from topoplan.ir.schedule import _flat_more
    rng = random.Random(7)
    more_of = [()] + [tuple((rng.randrange(-2, 20), rng.randrange(-1, 5))
                            for _ in range(rng.randint(1, 4))) for _ in range(2000)]
    bad, next_start = _bad_more(*_flat_more(more_of), 16)
    for k, rest in enumerate(more_of):
        end, want = 0, False
        for a, c in rest:
            want |= a < end or c < 1 or a + c > 16
            end = a + c
        assert bad[k] == want and next_start[k] == (rest[0][0] if rest else 16)
    assert 0 < bad.sum() < len(more_of)


def test_programs_out_of_rank_order_are_left_as_they_are() -> None:
    s = V.rhd_plan(4, "reduce_scatter")
    shuffled = replace(s, ranks=s.ranks[::-1])
    assert vectorize(shuffled) is shuffled and vectorize(replace(s, ranks=s.ranks[:3])) is not s
    with pytest.raises(ScheduleError, match="expected programs for ranks 0..3 in order"):
        verify(shuffled)


def _verify_as_before(s: Schedule) -> tuple[str, object]:
    """verify() of a vectored schedule as it was: matched as it is, then run as
    split_vectored of it."""
    try:
        nmessages = len(match_messages(s, natives=True, vectored=True).t_src)
        return "ok", replace(verify(split_vectored_reference(s)), nmessages=nmessages)
    except ScheduleError as exc:
        return "error", str(exc)


def _equal(x: object, y: object) -> bool:
    """Equal, numpy arrays (of one dtype) and tuples of them included."""
    if isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    if isinstance(y, tuple) and any(isinstance(v, np.ndarray) for v in y):
        return isinstance(x, tuple) and len(x) == len(y) and all(map(_equal, x, y))
    return x == y


_FAULTS = ("bad peer", "out of range", "unmatched", "receives it as", "on two channels",
           "two recvs into", "is on channel", "counted twice", "held nothing", "holds nothing",
           "ends with chunk", "deadlock")


@pytest.mark.parametrize("seed", range(3))
def test_verify_runs_a_vectored_schedule_as_its_split_form(seed: int) -> None:
    rng = random.Random(100 + seed)
    cases = [vectorize_reference(_random_schedule(rng)) for _ in range(150)]
    if seed == 0:  # passing plans, and a deadlock between vectored messages
        stuck = build_schedule(2, equal_chunks(4), [
            [[vrecv(1, [(0, 1), (2, 1)])], [vsend(1, [(1, 1), (3, 1)])]],
            [[vrecv(0, [(1, 1), (3, 1)])], [vsend(0, [(0, 1), (2, 1)])]]], algorithm="stuck")
        cases += [vectorize(s) for s in _planned()] + [V.vectored_allreduce(3), stuck]
    outcomes = set()
    for s in cases:
        try:
            got: tuple[str, object] = "ok", verify(s)
        except ScheduleError as exc:
            got = "error", str(exc)
        assert got == _verify_as_before(replace(s))  # replace: matched afresh
        outcomes.add(next((kind for kind in _FAULTS if kind in str(got[1])), got[0]))
        # The messages verify runs are those of the split schedule, array for array.
        try:
            found = match_messages(s, natives=True, vectored=True)
        except ScheduleError:
            continue
        split, want = found.split(), match_messages(split_vectored(s), natives=True)
        assert (split is found) == (not found.vectored)
        assert vars(split).keys() == vars(want).keys()
        for name, value in vars(want).items():
            assert _equal(getattr(split, name), value), name
    assert len(outcomes) >= 8 and (seed or "ok" in outcomes), outcomes  # many kinds of fault


def test_plan_vectored_option_and_cli(tmp_path: Path) -> None:
    from topoplan.cli import main
    from topoplan.planners import plan
    cluster = loads_cluster(flat_cluster_yaml(8, 2))
    vec = plan(cluster, algorithm="rhd", collective="allgather", vectored=True)
    assert vec.version == 4 and vec.meta["cluster_fingerprint"]
    assert vec.nops < plan(cluster, algorithm="rhd", collective="allgather").nops
    verify(vec)
    with pytest.raises(PlannerError, match="vectored: must be True or False, got 'yes'"):
        plan(cluster, algorithm="rhd", vectored="yes")
    topo = tmp_path / "c.yaml"
    topo.write_text(flat_cluster_yaml(8, 2))
    out = tmp_path / "p.json"
    assert main(["plan", str(topo), "-a", "rhd", "--collective", "allgather", "--vectored",
                 "-o", str(out), "--json"]) == 0
    assert loads_schedule(out.read_text()) == vectorize(
        plan(cluster, algorithm="rhd", collective="allgather"))


# -- MSCCL export ------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["allreduce", "reduce_scatter"])
def test_msccl_export_writes_one_step_per_range(which: str) -> None:
    from topoplan.interop.msccl import export_msccl
    s = V.vectored_allreduce(4) if which == "allreduce" else vectorize(V.rhd_plan(4, which))
    result = export_msccl(s)  # checked by the MSCCL interpreter (check=True)
    assert any("vectored" in note and "one per range" in note for note in result.notes)
    # Exactly the algorithm of the plan with one message per range.
    assert result.algo == export_msccl(split_vectored(s)).algo


def test_the_docs_example_loads_verifies_and_runs() -> None:
    from tests.test_docs import blocks
    text = blocks("SCHEDULE.md", "json")[4]
    s = loads_schedule(text, "docs/SCHEDULE.md (vectored messages)")
    assert s.version == 4 and s.nops == 8 and s == V.vectored_allreduce(2).with_meta()
    assert verify(s).nmessages == 4

    def rank_fn(t: Local) -> np.ndarray:
        from topoplan.runtime.executor import Allreduce
        x = V.ints(10, t.rank)
        Allreduce(s, t, timeout=30)(x)
        return x

    for x in Local.launch(2, rank_fn, timeout=60):
        assert np.array_equal(x, V.ints(10, 0) + V.ints(10, 1))
