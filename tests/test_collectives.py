"""The collective objects: layouts, shards, initial states and postconditions, and the
schedule reader's ``collective`` key."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from tests.support import schedules as S
from topoplan.ir.collectives import (COLLECTIVES, AllGatherSpec, AllReduceSpec, ReduceScatterSpec,
                                  collective_of, get_collective, shard_chunks)
from topoplan.errors import ScheduleError
from topoplan.ir.parse import loads_schedule
from topoplan.ir.schedule import OpKind, RankProgram, build_schedule, equal_chunks, recv, send
from topoplan.ir.verify import verify


def test_registry_names_the_three_collectives():
    assert COLLECTIVES == {"allreduce": AllReduceSpec, "reduce_scatter": ReduceScatterSpec,
                           "allgather": AllGatherSpec}
    for name, cls in COLLECTIVES.items():
        assert get_collective(name) is cls and cls.name == name


@pytest.mark.parametrize("old, new, call", [("AllReduce", AllReduceSpec, "Allreduce"),
                                            ("ReduceScatter", ReduceScatterSpec, "ReduceScatter"),
                                            ("AllGather", AllGatherSpec, "AllGather")])
def test_the_old_class_names_work_with_a_warning_naming_the_new_one(old, new, call):
    import topoplan.ir.collectives as C
    with pytest.warns(DeprecationWarning, match=rf"topoplan\.ir\.collectives\.{old} is deprecated; "
                                                rf"use topoplan\.ir\.collectives\.{new.__name__} "
                                                rf"\(topoplan\.{call} is the executor's call"):
        assert getattr(C, old) is new
    with pytest.raises(AttributeError, match="has no attribute 'Allreduce'"):
        C.Allreduce  # noqa: B018 - the executor's name was never one of this module's


@pytest.mark.parametrize("name", ["alltoall", "AllGather", "", 3])
def test_unknown_collective_names_the_valid_ones(name):
    with pytest.raises(ScheduleError, match="unknown collective .*expected one of 'allreduce', "
                                            "'reduce_scatter', 'allgather'"):
        get_collective(name)


@pytest.mark.parametrize("cls, sizes", [(AllReduceSpec, (12, 12)), (ReduceScatterSpec, (12, 3)),
                                        (AllGatherSpec, (3, 12))])
def test_buffer_layout(cls, sizes):
    coll = cls(4, equal_chunks(8))
    assert (coll.input_size(12), coll.output_size(12)) == sizes


@pytest.mark.parametrize("cls, rank1, reduces", [
    (AllReduceSpec, ((0, 12), (0, 12)), True),
    (ReduceScatterSpec, ((0, 12), (3, 6)), True),
    (AllGatherSpec, ((3, 6), (0, 12)), False)])
def test_each_rank_passes_in_and_gets_out_its_part_of_the_full_buffer(cls, rank1, reduces):
    coll = cls(4, equal_chunks(8))
    assert (coll.input_range(1, 12), coll.output_range(1, 12)) == rank1
    assert coll.reduces is reduces
    for rank in range(4):
        for part, (a, b) in ((coll.input_part, coll.input_range(rank, 12)),
                             (coll.output_part, coll.output_range(rank, 12))):
            assert (a, b) == ((0, 12) if part == "all" else (3 * rank, 3 * rank + 3))


@pytest.mark.parametrize("cls", [ReduceScatterSpec, AllGatherSpec])
def test_sharded_sizes_must_divide_by_the_ranks(cls):
    coll = cls(4, equal_chunks(4))
    with pytest.raises(ScheduleError, match=r"\(10 elements\) must be a multiple of 4"):
        coll.output_size(10) if cls is ReduceScatterSpec else coll.input_size(10)


def test_shards_group_chunks_in_order():
    # 3 ranks, shards of 1, 2 and 3 chunks.
    chunks = (1 / 3, 1 / 6, 1 / 6, 1 / 9, 1 / 9, 1 / 9)
    assert shard_chunks(3, chunks) == ((0, 1), (1, 3), (3, 6))
    coll = AllGatherSpec(3, chunks)
    assert [coll.shard_of(k) for k in range(6)] == [0, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("cls", [ReduceScatterSpec, AllGatherSpec])
def test_a_chunk_straddling_two_shards_is_refused(cls):
    with pytest.raises(ScheduleError, match=r"of 3 ranks: chunk 1 covers 0.25..0.5 of the buffer "
                                            r"and straddles shards 0 and 1 \(each 1/3 of it\)"):
        cls(3, equal_chunks(4))
    with pytest.raises(ScheduleError, match="straddles shards 0 and 1"):
        cls(2, (1.0,))  # fewer chunks than ranks


def test_allreduce_needs_no_shards():
    coll = AllReduceSpec(3, equal_chunks(4))
    assert coll.shards == ()
    assert coll.initial(2) == [(0, 4, 0b100)]
    assert coll.postcondition(0) == [(0, 4, 0b111)]
    assert not coll.starts_empty


def test_reduce_scatter_states():
    coll = ReduceScatterSpec(3, equal_chunks(6))
    assert coll.initial(1) == [(0, 6, 0b010)]
    assert coll.postcondition(0) == [(0, 2, 0b111), (2, 6, None)]
    assert coll.postcondition(1) == [(0, 2, None), (2, 4, 0b111), (4, 6, None)]
    assert coll.postcondition(2) == [(0, 4, None), (4, 6, 0b111)]
    assert not coll.starts_empty


def test_allgather_states():
    coll = AllGatherSpec(3, equal_chunks(6))
    assert coll.initial(0) == [(0, 2, 0b001), (2, 6, 0)]
    assert coll.initial(1) == [(0, 2, 0), (2, 4, 0b010), (4, 6, 0)]
    for r in range(3):
        assert coll.postcondition(r) == [(0, 2, 0b001), (2, 4, 0b010), (4, 6, 0b100)]
    assert coll.starts_empty
    assert not AllGatherSpec(1, (1.0,)).starts_empty


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(1, 4), min_size=9, max_size=9),
       st.integers(0, 50))
def test_shard_element_bounds_are_exact(nranks, per_shard, scale):
    """Uneven chunks inside shards: the element ranges tile the buffer and every shard
    boundary sits at ``r * size / nranks`` exactly."""
    chunks = [1 / (nranks * per_shard[r]) for r in range(nranks) for _ in range(per_shard[r])]
    size = nranks * scale
    for cls in (ReduceScatterSpec, AllGatherSpec):
        coll = cls(nranks, chunks)
        bounds = coll.chunk_bounds(size)
        assert bounds[0][0] == 0 and bounds[-1][1] == size
        assert all(a <= b for a, b in bounds)
        assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        for r, (a, b) in enumerate(coll.shards):
            assert b - a == per_shard[r]
            assert bounds[a][0] == r * scale and bounds[b - 1][1] == (r + 1) * scale
        uneven = coll.chunk_bounds(size + 1)  # shard r starts at floor(r * size / nranks)
        assert [uneven[a][0] for a, _ in coll.shards] == [r * (size + 1) // nranks
                                                        for r in range(nranks)]
        assert uneven[-1][1] == size + 1


def _pair(collective: str):
    return build_schedule(2, equal_chunks(2), [[[send(1, 0), recv(1, 1)]],
                                               [[send(0, 1), recv(0, 0)]]],
                          collective=collective, algorithm="pair")


@pytest.mark.parametrize("name", ["allreduce", "reduce_scatter", "allgather"])
def test_schedule_json_round_trips_the_collective(name):
    schedule = _pair(name)
    back = loads_schedule(schedule.to_json())
    assert back == schedule and back.collective == name
    assert collective_of(back) == COLLECTIVES[name](2, (0.5, 0.5))


def test_schedule_without_collective_is_an_allreduce():
    data = _pair("allgather").to_dict()
    del data["collective"]
    assert loads_schedule(json.dumps(data)).collective == "allreduce"


@pytest.mark.parametrize("bad", ["alltoall", "reducescatter", None, 1])
def test_schedule_reader_refuses_unknown_collectives(bad):
    data = _pair("allreduce").to_dict()
    data["collective"] = bad
    with pytest.raises(ScheduleError, match=r"^plan.json: collective: expected one of 'allreduce', "
                                            r"'reduce_scatter', 'allgather', got "):
        loads_schedule(json.dumps(data), "plan.json")


def test_schedule_reader_refuses_chunks_straddling_shards():
    data = build_schedule(3, equal_chunks(4), [[], [], []], collective="reduce_scatter").to_dict()
    with pytest.raises(ScheduleError, match=r"^plan.json: chunks: reduce_scatter of 3 ranks: "
                                            r"chunk 1 covers .* straddles shards 0 and 1"):
        loads_schedule(json.dumps(data), "plan.json")
    data["collective"] = "allreduce"  # an allreduce has no shards
    assert loads_schedule(json.dumps(data)).nchunks == 4


# --------------------------------------------------------------------------------------
# verify() against each collective's initial state and postcondition
# --------------------------------------------------------------------------------------

ORDERS = st.integers(1, 9).flatmap(lambda n: st.permutations(range(n)))


@settings(max_examples=25, deadline=None)
@given(ORDERS)
def test_rings_of_each_collective_verify_in_any_order(order):
    n = len(order)
    for build, name in ((S.ring_reduce_scatter, "reduce_scatter"),
                        (S.ring_allgather, "allgather")):
        report = verify(build(list(order)))
        assert (report.collective, report.nsteps, report.nmessages) == (name, n - 1, n * (n - 1))


def _without_message(schedule, rank: int, step: int):
    """``schedule`` less the first send of ``rank``'s ``step`` and the recv it pairs with
    (rings send one message per step, so the recv is the peer's op in the same step)."""
    op = next(op for op in schedule.ranks[rank].steps[step] if op.kind is OpKind.SEND)
    steps = [[list(st_) for st_ in p.steps] for p in schedule.ranks]
    steps[rank][step].remove(op)
    steps[op.peer][step] = [o for o in steps[op.peer][step]
                            if not (o.kind is OpKind.RECV and o.peer == rank)]
    return replace(schedule, ranks=tuple(RankProgram(r, tuple(map(tuple, s)))
                                         for r, s in enumerate(steps)))


def _error(schedule) -> str:
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    return str(info.value)


def test_an_allgather_that_never_delivers_a_shard_fails():
    # 0 -> 1 -> 2 -> 3 -> 0; the last hop of shard 1 (rank 0 -> rank 1, step 2) is dropped.
    broken = _without_message(S.ring_allgather([0, 1, 2, 3]), 0, 2)
    assert _error(broken) == ("ring schedule: rank 1 ends with chunk 2 holding nothing; "
                              "expected exactly {2} (rank 2's shard, never reduced)")


def test_an_allgather_forwarding_a_chunk_it_never_received_fails():
    # Rank 2 never gets shard 1, then forwards it at the next step.
    broken = _without_message(S.ring_allgather([0, 1, 2, 3]), 1, 0)
    assert _error(broken) == ("ring schedule: rank 3 step 1 receives chunk 1 from rank 2, "
                              "which held nothing there when its send's step started (it had "
                              "not received that chunk yet)")


def test_an_allgather_sending_a_shard_it_does_not_own_fails():
    schedule = build_schedule(2, equal_chunks(2), [[[send(1, 1), recv(1, 1)]],
                                                   [[send(0, 1), recv(0, 1)]]],
                              collective="allgather", algorithm="bad")
    assert _error(schedule) == ("bad schedule: rank 1 step 0 receives chunk 1 from rank 0, "
                                "which held nothing there when its send's step started (it "
                                "had not received that chunk yet)")


def test_an_allgather_may_not_add_into_an_empty_chunk():
    # An allreduce ring relabelled: its reduce-scatter adds into chunks that hold nothing.
    schedule = replace(S.ring(3), collective="allgather")
    assert "rank 0 step 0 reduces chunk 2 from rank 2 into a chunk that holds nothing yet; " \
           "receive it without reduce" in _error(schedule)


def test_a_reduce_scatter_missing_a_contribution_fails():
    # Position 0 (rank 0) never passes its partial sum of shard 3 to rank 1.
    broken = _without_message(S.ring_reduce_scatter([0, 1, 2, 3]), 0, 0)
    assert _error(broken) == ("ring schedule: rank 3 ends with chunk 3 holding {1, 2, 3}; "
                              "expected all of 0..3 once (missing {0})")


def test_a_reduce_scatter_counting_a_contribution_twice_fails():
    # Rank 0 sends its chunk 1 to rank 1 twice, and rank 1 adds both.
    schedule = build_schedule(2, equal_chunks(2), [[[send(1, 1)], [send(1, 1)]],
                                                   [[recv(0, 1, reduce=True)],
                                                    [recv(0, 1, reduce=True)]]],
                              collective="reduce_scatter", algorithm="bad")
    assert "rank 1 step 1 reduces chunk 1 from rank 0: contributions {0} would be counted " \
           "twice" in _error(schedule)


def test_a_reduce_scatter_ignores_the_other_shards():
    # One message: rank 1 adds rank 0's shard 1 and rank 0 adds rank 1's shard 0 ...
    good = build_schedule(2, equal_chunks(2), [[[send(1, 1), recv(1, 0, reduce=True)]],
                                               [[send(0, 0), recv(0, 1, reduce=True)]]],
                          collective="reduce_scatter")
    assert verify(good).nmessages == 2
    # ... which is not an allreduce: rank 0's chunk 1 holds only its own contribution.
    assert _error(replace(good, collective="allreduce")) == (
        "? schedule: rank 0 ends with chunk 1 holding {0}; expected all of 0..1 once "
        "(missing {1})")


def test_collective_schedules_are_not_allreduces():
    for schedule in (S.ring_reduce_scatter([0, 1, 2]), S.ring_allgather([0, 1, 2])):
        assert "expected all of 0..2 once" in _error(replace(schedule, collective="allreduce"))


def test_verify_refuses_chunks_straddling_shards():
    schedule = build_schedule(3, equal_chunks(4), [[], [], []], collective="allgather",
                              algorithm="odd")
    assert _error(schedule).startswith("odd schedule: allgather of 3 ranks: chunk 1 covers "
                                       "0.25..0.5 of the buffer and straddles shards 0 and 1")


def test_one_rank_needs_nothing_for_any_collective():
    for name in COLLECTIVES:
        assert verify(build_schedule(1, [1.0], [[]], collective=name)).nmessages == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.permutations(range(n)), st.sampled_from(["reduce_scatter", "allgather"]),
    st.integers(0, n - 1), st.integers(0, n - 2), st.booleans())))
def test_every_single_fault_in_a_ring_is_caught(case):
    """Dropping any one message of a ring reduce-scatter or allgather, or flipping any one
    recv between reducing and overwriting, breaks it; verify() must say so."""
    order, name, rank, step, drop = case
    schedule = (S.ring_reduce_scatter if name == "reduce_scatter" else S.ring_allgather)(order)
    if drop:
        broken = _without_message(schedule, rank, step)
    else:
        steps = [[list(st_) for st_ in p.steps] for p in schedule.ranks]
        steps[rank][step] = [replace(op, reduce=not op.reduce) if op.kind is OpKind.RECV else op
                             for op in steps[rank][step]]
        broken = replace(schedule, ranks=tuple(RankProgram(r, tuple(map(tuple, s)))
                                               for r, s in enumerate(steps)))
    with pytest.raises(ScheduleError):
        verify(broken)
