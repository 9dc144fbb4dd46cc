"""The collective objects: layouts, shards, initial states and postconditions, and the
schedule reader's ``collective`` key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from topoplan.collectives import (COLLECTIVES, AllGather, AllReduce, ReduceScatter,
                                  collective_of, get_collective, shard_chunks)
from topoplan.errors import ScheduleError
from topoplan.schedule import build_schedule, equal_chunks, loads_schedule, recv, send


def test_registry_names_the_three_collectives():
    assert COLLECTIVES == {"allreduce": AllReduce, "reduce_scatter": ReduceScatter,
                           "allgather": AllGather}
    for name, cls in COLLECTIVES.items():
        assert get_collective(name) is cls and cls.name == name


@pytest.mark.parametrize("name", ["alltoall", "AllGather", "", 3])
def test_unknown_collective_names_the_valid_ones(name):
    with pytest.raises(ScheduleError, match="unknown collective .*expected one of 'allreduce', "
                                            "'reduce_scatter', 'allgather'"):
        get_collective(name)


@pytest.mark.parametrize("cls, sizes", [(AllReduce, (12, 12)), (ReduceScatter, (12, 3)),
                                        (AllGather, (3, 12))])
def test_buffer_layout(cls, sizes):
    coll = cls(4, equal_chunks(8))
    assert (coll.input_size(12), coll.output_size(12)) == sizes


@pytest.mark.parametrize("cls", [ReduceScatter, AllGather])
def test_sharded_sizes_must_divide_by_the_ranks(cls):
    coll = cls(4, equal_chunks(4))
    with pytest.raises(ScheduleError, match=r"\(10 elements\) must be a multiple of 4"):
        coll.output_size(10) if cls is ReduceScatter else coll.input_size(10)


def test_shards_group_chunks_in_order():
    # 3 ranks, shards of 1, 2 and 3 chunks.
    chunks = (1 / 3, 1 / 6, 1 / 6, 1 / 9, 1 / 9, 1 / 9)
    assert shard_chunks(3, chunks) == ((0, 1), (1, 3), (3, 6))
    coll = AllGather(3, chunks)
    assert [coll.shard_of(k) for k in range(6)] == [0, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("cls", [ReduceScatter, AllGather])
def test_a_chunk_straddling_two_shards_is_refused(cls):
    with pytest.raises(ScheduleError, match=r"of 3 ranks: chunk 1 covers 0.25..0.5 of the buffer "
                                            r"and straddles shards 0 and 1 \(each 1/3 of it\)"):
        cls(3, equal_chunks(4))
    with pytest.raises(ScheduleError, match="straddles shards 0 and 1"):
        cls(2, (1.0,))  # fewer chunks than ranks


def test_allreduce_needs_no_shards():
    coll = AllReduce(3, equal_chunks(4))
    assert coll.shards == ()
    assert coll.initial(2) == [(0, 4, 0b100)]
    assert coll.postcondition(0) == [(0, 4, 0b111)]
    assert not coll.starts_empty


def test_reduce_scatter_states():
    coll = ReduceScatter(3, equal_chunks(6))
    assert coll.initial(1) == [(0, 6, 0b010)]
    assert coll.postcondition(0) == [(0, 2, 0b111), (2, 6, None)]
    assert coll.postcondition(1) == [(0, 2, None), (2, 4, 0b111), (4, 6, None)]
    assert coll.postcondition(2) == [(0, 4, None), (4, 6, 0b111)]
    assert not coll.starts_empty


def test_allgather_states():
    coll = AllGather(3, equal_chunks(6))
    assert coll.initial(0) == [(0, 2, 0b001), (2, 6, 0)]
    assert coll.initial(1) == [(0, 2, 0), (2, 4, 0b010), (4, 6, 0)]
    for r in range(3):
        assert coll.postcondition(r) == [(0, 2, 0b001), (2, 4, 0b010), (4, 6, 0b100)]
    assert coll.starts_empty
    assert not AllGather(1, (1.0,)).starts_empty


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(1, 4), min_size=9, max_size=9),
       st.integers(0, 50))
def test_shard_element_bounds_are_exact(nranks, per_shard, scale):
    """Uneven chunks inside shards: the element ranges tile the buffer and every shard
    boundary sits at ``r * size / nranks`` exactly."""
    chunks = [1 / (nranks * per_shard[r]) for r in range(nranks) for _ in range(per_shard[r])]
    size = nranks * scale
    for cls in (ReduceScatter, AllGather):
        coll = cls(nranks, chunks)
        bounds = coll.chunk_bounds(size)
        assert bounds[0][0] == 0 and bounds[-1][1] == size
        assert all(a <= b for a, b in bounds)
        assert all(b == c for (_, b), (c, _) in zip(bounds, bounds[1:]))
        for r, (a, b) in enumerate(coll.shards):
            assert b - a == per_shard[r]
            assert bounds[a][0] == r * scale and bounds[b - 1][1] == (r + 1) * scale


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
