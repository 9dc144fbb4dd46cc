"""The executor runs native steps (IR v3): compiled element ranges, checked groups, and
every case of tests/support/native_cases.py on Local thread ranks, with a member that
fails, one that never comes, and members that disagree.

The same cases run over real MPI processes (tests/test_transports_mpi.py), torch gloo
(tests/test_transports_torch.py) and NCCL (tests/test_transports_nccl.py, on a GPU).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.support import native_cases as C
from tests.support import native_schedules as N
from topoplan.errors import ScheduleError, TopoplanError, TransportError
from topoplan.ir.schedule import build_schedule, native_op, send
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.executor.compiler import NativePlan, compile_program, native_groups
from topoplan.runtime.transports import Local


@pytest.mark.parametrize("nranks", [2, 3, 4, 6])
def test_every_native_case_on_thread_ranks(nranks: int) -> None:
    results = Local.launch(nranks, lambda t: C.native_cases(t, with_torch=True), timeout=120)
    for rank, (failures, count) in enumerate(results):
        assert failures == [], "\n".join(failures)
        assert count > 80, rank


def test_native_steps_compile_to_element_ranges_of_their_chunks() -> None:
    # Unequal chunks: the reduce-scatter's parts differ in elements.
    schedule = N.two_boxes(2, chunks=(0.1, 0.2, 0.3, 0.4))
    program = compile_program(schedule, 1, 1000)
    assert program.bounds == [(0, 100), (100, 300), (300, 600), (600, 1000)]
    first, middle, last = program.steps
    assert isinstance(first.native, NativePlan) and first.messages == []
    assert first.native.span == (0, 1000) and first.native.parts == (0, 300, 1000)
    assert first.native.index == 1 and first.native.root is None
    assert middle.native is None and len(middle.messages) == 2  # the exchange across boxes
    assert last.native.op.kind.value == "allgather" and program.step_index == [0, 1, 2]
    # Nothing to move: an empty buffer, or a group of one rank, compile to no step.
    assert compile_program(schedule, 1, 0).steps == []
    assert [s.native for s in compile_program(N.composed_allreduce(1, 4), 0, 100).steps
            if s.native and s.native.op.kind.value == "allreduce"] == []


def test_the_groups_are_listed_in_one_order_for_every_rank() -> None:
    schedule = N.composed_allreduce(2, 3)
    assert native_groups(schedule, 6) == [(0, 1, 2), (0, 3), (1, 4), (2, 5), (3, 4, 5)]
    assert native_groups(N.native_allreduce(1), 1) == []  # a group of one needs none


@pytest.mark.parametrize("op, extra, message", [
    (native_op("allreduce", [0, 4], 0), None,
     r"rank 0 step 0: native allreduce over \{0, 4\} of chunk 0: group names rank 4, but "
     r"the local transport has 4 ranks"),
    (native_op("allreduce", [1, 2], 0), None, "rank 0 step 0: .*rank 0 is not in the group"),
    (native_op("allreduce", [0, 0, 1], 0), None, "a group names distinct ranks"),
    (native_op("allreduce", [0, 1], 0), send(1, 1), "stands alone in its step; this step has 2"),
    (native_op("allreduce", [0, 1], 1, 2), None, "outside the schedule's 2 chunks"),
    (native_op("reduce_scatter", [0, 1, 2], 0, 2), None,
     "count 2 does not split into 3 equal parts"),
    (native_op("broadcast", [0, 1], 0), None, "root None is not in the group"),
    (native_op("reduce", [0, 1], 0, root=3), None, "root 3 is not in the group"),
    (native_op("allgather", [0, 1], 0, 2, root=0), None, "a native allgather has no root"),
])
def test_bad_native_ops_are_refused_before_anything_moves(op, extra, message) -> None:
    steps = [[[op, extra] if extra else [op]]] + [[] for _ in range(3)]
    schedule = build_schedule(4, (0.5, 0.5), steps, algorithm="bad")
    with pytest.raises(ScheduleError, match=message):
        native_groups(schedule, 4, "local transport")
    world = Local.launch(4, lambda t: t)  # transports whose ranks have ended
    with pytest.raises(ScheduleError, match=message):
        Allreduce(schedule, world[0])


def test_a_member_that_fails_ends_the_others_at_once() -> None:
    def rank_fn(t: Local):
        def die() -> None:
            raise RuntimeError("rank 2 gives up")
        return C.killed_member_run(t, victim=2, timeout=30, schedule=N.composed_allreduce(2, 2),
                                   die=die)

    results = Local.launch(4, rank_fn, timeout=60, return_exceptions=True)
    assert isinstance(results[2], RuntimeError)
    # Rank 3 shares rank 2's box, rank 0 its rail after the box, rank 1 then rank 3's.
    where = {0: "step 1: native allreduce over {0, 2}", 3: "step 0: native reduce_scatter over "
             "{2, 3}", 1: "step 1: native allreduce over {1, 3}"}
    for rank, text in where.items():
        kill = results[rank]
        assert kill["type"] == "TransportError" and kill["step"] is not None, kill
        assert text in kill["error"], kill
        assert kill["elapsed"] < 10, kill  # at once, not after the 30 s timeout
    assert "member 2 failed" in results[3]["error"] or "member 2 " in results[3]["error"]


def test_a_member_that_never_comes_times_out_naming_the_step_and_group() -> None:
    def rank_fn(t: Local):
        if t.rank == 1:
            time.sleep(1.0)
            return None
        x = np.ones(10)
        try:
            Allreduce(N.scatter_then_gather(2), t, timeout=0.2)(x)
        except TransportError as exc:
            return exc
        return None

    exc = Local.launch(2, rank_fn, timeout=30)[0]
    assert isinstance(exc, TransportError) and exc.rank == 0 and exc.step == 0
    assert str(exc).startswith("rank 0 step 0: native reduce_scatter over {0, 1} of chunks 0..1")
    assert "timed out after 0.2 s" in str(exc)


def test_members_that_disagree_fail_naming_what_each_runs() -> None:
    steps = [[[native_op("broadcast", [0, 1], 0, root=r)]] for r in range(2)]
    schedule = build_schedule(2, (1.0,), steps, algorithm="disagree")

    def rank_fn(t: Local):
        with pytest.raises(TransportError) as info:
            Allreduce(schedule, t, timeout=5, verified=True)(np.ones(4))  # the run's error
        return str(info.value)

    for text in Local.launch(2, rank_fn, timeout=30):
        assert "the members disagree: rank 0 runs broadcast of parts [4] root 0; rank 1 runs " \
               "broadcast of parts [4] root 1" in text


def test_a_group_given_up_on_fails_every_later_call_over_it_at_once() -> None:
    """A collective cannot be taken back: after a member times out, the group is broken
    for every member (as MPI's and torch's), and calls over it fail at once."""
    def rank_fn(t: Local):
        run = Allreduce(N.native_allreduce(2), t, timeout=0.3)
        if t.rank == 1:
            time.sleep(0.8)
        outcomes = []
        for _ in range(2):
            began = time.monotonic()
            try:
                run(np.full(3, t.rank + 1.0))
                outcomes.append(("ok", 0.0))
            except TransportError as exc:
                outcomes.append((str(exc), time.monotonic() - began))
        return outcomes

    first, second = Local.launch(2, rank_fn, timeout=30)
    assert "timed out after 0.3 s" in first[0][0]
    for text, took in (first[1], *second):
        assert text.startswith(f"rank {1 if (text, took) in second else 0} step 0: native "
                               "allreduce over {0, 1}"), text
        assert "the group is broken: rank 0's local allreduce failed or timed out" in text
        assert took < 0.2, (text, took)


@pytest.mark.parametrize("nranks", [2, 3, 4, 6])
def test_the_cases_collective_schedules_verify(nranks: int) -> None:
    """The hand-built schedules the cases check by their sums also pass the symbolic
    verifier (an oracle written apart from them)."""
    from topoplan.ir.verify import verify

    schedules = dict(C.allreduce_schedules(nranks))
    schedules.update(rs=N.native_reduce_scatter(nranks), ag=N.native_allgather(nranks))
    if nranks % 2 == 0:
        half = nranks // 2
        schedules.update(crs=N.composed_reduce_scatter(half),
                         crs_unequal=N.composed_reduce_scatter(half, (0.2, 0.5, 0.3)),
                         cag=N.composed_allgather(half),
                         cag_unequal=N.composed_allgather(half, (0.6, 0.4)))
    for name, schedule in schedules.items():
        verify(schedule)  # raises ScheduleError naming the rank and chunk
