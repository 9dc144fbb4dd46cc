"""IR v3: native collective steps, read and written (docs/SCHEDULE.md, "Version 3")."""

from __future__ import annotations

import json

import pytest

from topoplan.errors import ScheduleError
from topoplan.ir.parse import loads_schedule
from topoplan.ir.schedule import (GROUP_RANGE_MIN, Native, NativeKind, OpKind, Schedule,
                                  build_schedule, group_json, native_op, recv, send)


def two_boxes() -> Schedule:
    """4 ranks, 2 boxes {0, 1} {2, 3}: reduce-scatter in each box, swap across, allgather."""
    steps = []
    for r in range(4):
        box = [0, 1] if r < 2 else [2, 3]
        half = 0 if r % 2 == 0 else 2
        peer = r ^ 2
        steps.append([[native_op("reduce_scatter", box, 0, 4)],
                      [send(peer, half, 2), recv(peer, half, True, 2)],
                      [native_op("allgather", box, 0, 4)]])
    return build_schedule(4, [0.25] * 4, steps, algorithm="composed")


def test_a_schedule_with_native_steps_is_version_3_and_reads_back_equal():
    schedule = two_boxes()
    assert schedule.version == 3 and schedule.nnative == 8 and schedule.nmessages == 4
    text = schedule.to_json()
    assert json.loads(text)["ranks"][0]["steps"][0] == [
        {"op": "reduce_scatter", "group": [0, 1], "chunk": 0, "count": 4}]
    again = loads_schedule(text)
    assert again == schedule
    op = again.ranks[3].steps[2][0]
    assert isinstance(op, Native) and op.kind is NativeKind.ALLGATHER and op.part(1) == (2, 4)


def test_a_schedule_without_native_steps_stays_version_1():
    schedule = build_schedule(2, [1.0], [[[send(1, 0), recv(1, 0, True)]],
                                         [[send(0, 0), recv(0, 0, True)]]])
    assert schedule.version == 1 and schedule.nnative == 0


def test_rooted_ops_carry_their_root():
    op = native_op("broadcast", [2, 0, 1], 0, 3, root=2)
    assert op.to_dict() == {"op": "broadcast", "group": [2, 0, 1], "chunk": 0, "count": 3,
                            "root": 2}
    assert "from root 2" in op.text() and OpKind.SEND is not op.kind


def _file(op: dict, *, version: int = 3, nranks: int = 4, nchunks: int = 4,
          extra: list | None = None) -> str:
    step = [op] + (extra or [])
    ranks = [{"rank": r, "steps": [step] if r == 0 else []} for r in range(nranks)]
    return json.dumps({"format": "topoplan-schedule", "version": version, "nranks": nranks,
                       "chunks": [1 / nchunks] * nchunks, "ranks": ranks})


@pytest.mark.parametrize("op, extra, version, message", [
    ({"op": "allreduce", "group": [0, 4], "chunk": 0}, None, 3,
     r"ranks\[0\]\.steps\[0\]\[0\]: group names rank 4, outside range\(4\)"),
    ({"op": "allreduce", "group": [0, 1, 1], "chunk": 0}, None, 3, "names rank 1 twice"),
    ({"op": "allreduce", "group": [1, 2], "chunk": 0}, None, 3,
     "rank 0 runs a native allreduce over group \\[1, 2\\] it is not in"),
    ({"op": "allreduce", "group": [0, 1], "chunk": 3, "count": 2}, None, 3,
     "chunks 3..4 run past the last chunk 3"),
    ({"op": "reduce_scatter", "group": [0, 1, 2], "chunk": 0, "count": 4}, None, 3,
     "count 4 is not a multiple of 3"),
    ({"op": "broadcast", "group": [0, 1], "chunk": 0}, None, 3, "needs a root in its group"),
    ({"op": "allgather", "group": [0, 1], "chunk": 0, "count": 2, "root": 0}, None, 3,
     "has no root"),
    ({"op": "allreduce", "group": [0, 1], "chunk": 0}, [{"op": "send", "peer": 1, "chunk": 1}],
     3, r"ranks\[0\]\.steps\[0\]: a native allreduce stands alone in its step"),
    ({"op": "allreduce", "group": [0, 1], "chunk": 0}, None, 2, 'needs "version": 3'),
    ({"op": "allreduce", "group": [], "chunk": 0}, None, 3, "group must be a non-empty list"),
    ({"op": "alltoall", "group": [0, 1], "chunk": 0}, None, 3, "unknown op 'alltoall'"),
    ({"op": "allreduce", "group": "0..4", "chunk": 0}, None, 3,
     r"group names rank 4, outside range\(4\)"),
    ({"op": "allreduce", "group": "2..1", "chunk": 0}, None, 3, "the first rank is after"),
    ({"op": "allreduce", "group": "1..3", "chunk": 0}, None, 3,
     "rank 0 runs a native allreduce over group 1..3 it is not in"),
    ({"op": "allreduce", "group": "0-3", "chunk": 0}, None, 3,
     "a non-empty list of ranks or a range 'first..last', got '0-3'"),
])
def test_bad_native_ops_are_located(op, extra, version, message):
    with pytest.raises(ScheduleError, match=message):
        loads_schedule(_file(op, version=version, extra=extra), "plan.json")


def test_a_big_group_of_consecutive_ranks_is_written_as_a_range_and_read_back():
    # The nccl row over 16384 ranks would repeat the 16384 ranks in every rank's program.
    from topoplan.planners.native import native_schedule

    schedule = native_schedule(GROUP_RANGE_MIN, "allreduce", algorithm="nccl")
    text = schedule.to_json()
    assert json.loads(text)["ranks"][5]["steps"][0] == [
        {"op": "allreduce", "group": f"0..{GROUP_RANGE_MIN - 1}", "chunk": 0}]
    again = loads_schedule(text)
    assert again == schedule
    assert again.ranks[0].steps[0][0].group is again.ranks[7].steps[0][0].group  # one tuple
    # fewer ranks, or not consecutive and ascending: the list, as before
    assert group_json(tuple(range(GROUP_RANGE_MIN - 1))) == list(range(GROUP_RANGE_MIN - 1))
    shuffled = (1, 0, *range(2, GROUP_RANGE_MIN))
    assert group_json(shuffled) == list(shuffled)
    assert group_json(tuple(range(3, 3 + GROUP_RANGE_MIN))) == f"3..{GROUP_RANGE_MIN + 2}"


def test_a_newer_version_is_refused_naming_the_ones_read():
    with pytest.raises(ScheduleError, match="reads versions 1 to 4, got 5"):
        loads_schedule(_file({"op": "allreduce", "group": [0], "chunk": 0}, version=5))
