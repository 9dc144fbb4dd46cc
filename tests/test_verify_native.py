"""verify() on native steps (IR v3), and their lowering to point-to-point steps.

Composed schedules (a native collective inside each box, messages or a native op across,
a native collective inside each box again) verify on every shape tried; each kind of
op ends each member's chunks as docs/SCHEDULE.md says; each fault is named with its
rank, step and group. The lowering is checked against the native semantics: random
programs of native ops and messages end in exactly the same contribution sets, or fail
both, before and after lowering.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support import native_programs as N
from tests.test_schedule_native import two_boxes
from topoplan.cluster import load_cluster
from topoplan.errors import ScheduleError
from topoplan.ir.matching import match_messages
from topoplan.ir.parse import loads_schedule
from topoplan.ir.passes import lower_call, lower_native
from topoplan.ir.schedule import Native, NativeKind, build_schedule, native_op, recv, send
from topoplan.ir.verify import _execute, verify

ROOT = Path(__file__).resolve().parents[1]


def _masks(schedule) -> list[list[int]]:
    """Every rank's chunks at the end, one contribution bitmask per chunk."""
    _, _, _, state = _execute(schedule)
    out = []
    for chunks in state:
        masks = [0] * schedule.nchunks
        for a, b, mask in chunks.read(0, schedule.nchunks):
            masks[a:b] = [mask] * (b - a)
        out.append(masks)
    return out


def _set(*ranks: int) -> int:
    return sum(1 << r for r in ranks)


# ---- correct composed schedules --------------------------------------------------

def test_the_format_s_example_is_the_two_box_composed_allreduce():
    import re

    text = (ROOT / "docs" / "SCHEDULE.md").read_text(encoding="utf-8")
    example = re.findall(r"```json\n(.*?)```", text, re.S)[2]
    assert loads_schedule(example) == two_boxes()


def test_the_two_box_composed_allreduce_verifies():
    report = verify(two_boxes())
    assert (report.nranks, report.nsteps, report.nmessages) == (4, 3, 4)
    assert (report.nnative, report.ncollectives) == (8, 4)
    assert report.collective == "allreduce"


SHAPES = {
    "2x2 messages": lambda: N.rails(2, 2, cross="direct"),
    "4x2 native rails": lambda: N.rails(4, 2),
    "4x2 direct rails": lambda: N.rails(4, 2, cross="direct"),
    "2x4 three chunks a part": lambda: N.rails(2, 4, part=3),
    "one box of 8": lambda: N.rails(1, 8),
    "8 boxes of 1": lambda: N.rails(8, 1),
    "unequal boxes 3+2": lambda: N.rooted([[0, 1, 2], [3, 4]]),
    "unequal boxes 3+2, messages across": lambda: N.rooted([[0, 1, 2], [3, 4]], cross="direct"),
    "unequal boxes 1+3+2": lambda: N.rooted([[0], [1, 2, 3], [4, 5]], nchunks=5),
    "boxes in another rank order": lambda: N.rooted([[4, 0], [2, 1, 3]]),
    "reduce-scatter 4x2": lambda: N.composed_reduce_scatter(4, 2),
    "reduce-scatter 3x3": lambda: N.composed_reduce_scatter(3, 3),
    "allgather 2x3": lambda: N.composed_allgather(2, 3),
    "allgather 4x2": lambda: N.composed_allgather(4, 2),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_composed_schedules_verify_native_and_lowered(shape):
    schedule = SHAPES[shape]()
    report = verify(schedule)
    assert report.nnative == schedule.nnative > 0
    lowered = lower_native(schedule)
    assert lowered.nnative == 0 and lowered.version <= 2
    assert verify(lowered).collective == schedule.collective
    assert _masks(lowered) == _masks(schedule)


def _topologies() -> list[str]:
    return sorted(p.name for p in (ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("name", _topologies())
def test_composed_schedules_on_every_shipped_topology(name):
    """Native ops over each box of the cluster (and over its rails, when its boxes are
    equal), native and lowered, verify."""
    cluster = load_cluster(ROOT / "topologies" / name)
    boxes = [list(box.ranks) for box in cluster.boxes]
    cases = [N.rooted(boxes)]
    sizes = {len(box) for box in boxes}
    if len(sizes) == 1:
        cases.append(N.rails(len(boxes), sizes.pop(), cross="native"))
    for schedule in cases:
        assert verify(schedule).nranks == cluster.nranks
        assert verify(lower_native(schedule)).nnative == 0


# ---- what each op does -----------------------------------------------------------

ALL = _set(0, 1, 2)


@pytest.mark.parametrize("op, ends", [
    (native_op("allreduce", [0, 1, 2], 0, 3), [[ALL] * 3] * 3),
    # part i of member i (rank group[i]) is summed; the other parts keep their values
    (native_op("reduce_scatter", [2, 0, 1], 0, 3),
     [[_set(0), ALL, _set(0)], [_set(1), _set(1), ALL], [ALL, _set(2), _set(2)]]),
    (native_op("allgather", [2, 0, 1], 0, 3), [[_set(2), _set(0), _set(1)]] * 3),
    (native_op("broadcast", [0, 1, 2], 0, 3, root=1), [[_set(1)] * 3] * 3),
    (native_op("reduce", [0, 1], 1, 2, root=1),
     [[_set(0)] * 3, [_set(1), _set(0, 1), _set(0, 1)], [_set(2)] * 3]),
    (native_op("allreduce", [1], 0, 3), [[_set(r)] * 3 for r in range(3)]),
])
def test_each_native_op_ends_as_the_format_says(op, ends):
    schedule = N.global_order(3, 3, [op])
    assert _masks(schedule) == ends
    assert _masks(lower_native(schedule)) == ends


def test_values_are_read_when_each_member_s_step_starts():
    """Rank 1 sends its chunk 0 to rank 0 before both allreduce it: rank 0 adds it first,
    so the allreduce would count rank 1 twice."""
    schedule = N.global_order(2, 1, [(1, 0, 0, 1, True), native_op("allreduce", [0, 1], 0)])
    with pytest.raises(ScheduleError, match=r"rank 1 step 1 runs allreduce over \{0, 1\} of "
                                            r"chunk 0: adding rank 1's chunk 0 would count "
                                            r"contributions \{1\} twice"):
        verify(schedule)


# ---- faults, each located ----------------------------------------------------------

def _boxes(*programs) -> object:
    n = len(programs)
    return build_schedule(n, [0.25] * 4, [list(p) for p in programs], algorithm="composed")


AR01 = native_op("allreduce", [0, 1], 0, 4)
AR0123 = native_op("allreduce", [0, 1, 2, 3], 0, 4)

FAULTS = {
    "counted twice": (
        _boxes([[AR01], [AR01]], [[AR01], [AR01]]),
        "composed schedule: rank 1 step 1 runs allreduce over {0, 1} of chunks 0..3: adding "
        "rank 1's chunk 0 would count contributions {0, 1} twice"),
    "incomplete": (
        _boxes([[AR01]], [[AR01]], [[native_op("allreduce", [2, 3], 0, 4)]],
               [[native_op("allreduce", [2, 3], 0, 4)]]),
        "rank 0 ends with chunk 0 holding {0, 1}; expected all of 0..3 once (missing {2, 3})"),
    "another kind": (
        _boxes([[AR01]], [[native_op("reduce_scatter", [0, 1], 0, 4)]]),
        "rank 1 step 0 runs reduce_scatter over {0, 1} of chunks 0..3 as its native op 0 over "
        "group {0, 1}, but rank 0 step 0 runs allreduce over {0, 1} of chunks 0..3: every "
        "member runs the same op (kind, group order, chunks, root)"),
    "another group order": (
        _boxes([[AR01]], [[native_op("allreduce", [1, 0], 0, 4)]]),
        "rank 1 step 0 runs allreduce over {1, 0} of chunks 0..3 as its native op 0 over "
        "group {0, 1}, but rank 0 step 0 runs allreduce over {0, 1}"),
    "other chunks": (
        _boxes([[AR01]], [[], [native_op("allreduce", [0, 1], 1, 3)]]),
        "rank 1 step 1 runs allreduce over {0, 1} of chunks 1..3 as its native op 0 over "
        "group {0, 1}, but rank 0 step 0 runs allreduce over {0, 1} of chunks 0..3"),
    "another root": (
        _boxes([[native_op("broadcast", [0, 1], 0, 4, root=0)]],
               [[native_op("broadcast", [0, 1], 0, 4, root=1)]]),
        "rank 1 step 0 runs broadcast over {0, 1} of chunks 0..3 from root 1 as its native "
        "op 0 over group {0, 1}, but rank 0 step 0 runs broadcast over {0, 1} of chunks 0..3 "
        "from root 0"),
    "a member without it": (
        _boxes([[AR01], [AR01]], [[AR01]]),
        "rank 0 step 1 runs allreduce over {0, 1} of chunks 0..3 as its native op 1 over "
        "group {0, 1}, but rank 1 runs only 1 native op over that group"),
    "deadlock: two groups in opposite orders": (
        _boxes([[AR0123], [AR01]], [[AR01], [AR0123]], [[AR0123]], [[AR0123]]),
        "composed schedule: deadlock: 4 ranks cannot finish; rank 0 step 0 waits to run "
        "allreduce over {0, 1, 2, 3} of chunks 0..3 with rank 1, which is stuck at step 0 "
        "before its step 1 of that op"),
    "deadlock: a message across a native step": (
        _boxes([[send(1, 0)], [AR01]], [[AR01], [recv(0, 0)]]),
        "deadlock: 2 ranks cannot finish; rank 0 step 0 waits to send chunk 0 with rank 1, "
        "which is stuck at step 0 before its matching step 1"),
    "deadlock seen from the native step": (
        _boxes([[AR01], [recv(1, 0)]], [[send(0, 0)], [AR01]]),
        "deadlock: 2 ranks cannot finish; rank 0 step 0 waits to run allreduce over {0, 1} "
        "of chunks 0..3 with rank 1, which is stuck at step 0 before its step 1 of that op"),
    "sharing its step": (
        _boxes([[AR01, send(1, 0)]], [[AR01]]),
        "rank 0 step 0: a native allreduce over {0, 1} of chunks 0..3 stands alone in its "
        "step; this step has 2 ops"),
    "not a member": (
        _boxes([[AR01]], [[AR01]], [[AR01]]),
        "rank 2 step 0: allreduce over {0, 1}: rank 2 runs an op of a group it is not in"),
    "a rank outside": (
        _boxes([[native_op("allreduce", [0, 5], 0, 4)]]),
        "rank 0 step 0: allreduce over {0, 5}: the group names rank 5, outside range(1)"),
    "a rank twice": (
        _boxes([[native_op("allreduce", [0, 0], 0, 4)]]),
        "rank 0 step 0: allreduce over {0, 0}: the group names a rank twice"),
    "parts that do not cut": (
        _boxes([[native_op("reduce_scatter", [0, 1], 0, 3)]], [[native_op("reduce_scatter", [0, 1],
                                                                    0, 3)]]),
        "rank 0 step 0: reduce_scatter over {0, 1}: count 3 does not cut into 2 equal parts"),
    "past the last chunk": (
        _boxes([[native_op("allreduce", [0, 1], 2, 3)]], [[native_op("allreduce", [0, 1], 2, 3)]]),
        "rank 0 step 0: allreduce over {0, 1}: chunks 2..4 out of range(4)"),
    "no root": (
        _boxes([[Native(NativeKind.BROADCAST, (0,), 0, 4)]]),
        "rank 0 step 0: broadcast over {0}: needs a root in its group, got None"),
    "a root not a member": (
        _boxes([[native_op("reduce", [0, 1], 0, 4, root=2)]], [[native_op("reduce", [0, 1], 0, 4,
                                                                    root=2)]], []),
        "rank 0 step 0: reduce over {0, 1}: needs a root in its group, got 2"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_faults_are_named_with_rank_step_and_group(fault):
    schedule, message = FAULTS[fault]
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    assert message in str(info.value)


EMPTY = {
    "an allgather part before it arrived": (
        N.global_order(2, 2, [native_op("allgather", [1, 0], 0, 2)], "allgather"),
        "rank 1 step 0 runs allgather over {1, 0} of chunks 0..1 with chunk 0 holding "
        "nothing (it has not received that chunk yet): there is nothing to gather"),
    "a sum of nothing": (
        N.global_order(2, 2, [native_op("allreduce", [0, 1], 0, 2)], "allgather"),
        "rank 0 step 0 runs allreduce over {0, 1} of chunks 0..1 with chunk 1 holding "
        "nothing (it has not received that chunk yet): there is nothing to add"),
    "a broadcast of nothing": (
        N.global_order(2, 2, [native_op("broadcast", [0, 1], 1, 1, root=0)], "allgather"),
        "rank 0 step 0 runs broadcast over {0, 1} of chunk 1 from root 0 with chunk 1 "
        "holding nothing"),
}


@pytest.mark.parametrize("case", EMPTY)
def test_a_chunk_that_holds_nothing_cannot_be_read(case):
    schedule, message = EMPTY[case]
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    assert message in str(info.value)


def test_a_gathered_part_that_has_arrived_is_fine():
    """Shard 1 reaches rank 0 by a message first; then the allgather in the other order
    over {1, 0} reads parts that hold something."""
    schedule = N.global_order(2, 2, [(1, 0, 1, 1, False), (0, 1, 0, 1, False),
                                     native_op("allgather", [0, 1], 0, 2)], "allgather")
    assert verify(schedule).nnative == 2


def test_of_two_faults_the_first_in_the_queue_order_is_named():
    """The fast path finds a fault, the queue path names it: both give one message, and the
    same one on a fresh copy."""
    schedule = _boxes([[AR01], [AR01]], [[AR01], [AR01]])
    first = str(pytest.raises(ScheduleError, verify, schedule).value)
    again = str(pytest.raises(ScheduleError, verify, replace(schedule)).value)
    assert first == again


def test_a_caller_that_does_not_handle_native_steps_is_told_so():
    with pytest.raises(ScheduleError, match=r"rank 0 step 0 runs a native reduce_scatter over "
                                            r"\{0, 1\} of chunks 0..3, which this part of "
                                            r"topoplan does not handle yet; .*lower_native"):
        match_messages(two_boxes())
    found = match_messages(two_boxes(), natives=True)
    assert [call.group for call in found.calls] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert found.ops_per_step.tolist() == [0, 2, 0] * 4


# ---- both paths, random programs ---------------------------------------------------

@st.composite
def programs(draw, min_group: int = 2):
    nranks = draw(st.integers(2, 5))
    nchunks = draw(st.integers(1, 6))
    items = draw(st.lists(N.events(nranks, nchunks, min_group), min_size=1, max_size=6))
    return N.global_order(nranks, nchunks, items)


def _outcome(schedule):
    try:
        return "ok", _masks(schedule)
    except ScheduleError:
        return "error", None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_lowering_ends_in_the_same_chunks_or_fails_too(schedule):
    """Random native ops and messages in one global order: the lowered schedule ends with
    exactly the same contribution sets on every rank, or both fail (a rank counted twice,
    a chunk read that holds nothing)."""
    native_outcome = _outcome(schedule)
    lowered = lower_native(schedule)
    assert lowered.nnative == 0
    assert _outcome(lowered) == native_outcome


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(min_group=1))
def test_the_queue_order_and_the_rounds_give_the_same_chunks(schedule):
    """Both paths of verify() run native steps alike: the same chunks at the end, or a
    fault on both."""
    from topoplan.ir.collectives import collective_of
    from topoplan.ir.verify import _Flow

    flow = _Flow(match_messages(schedule, natives=True), schedule.nchunks)
    pc, order = flow.rounds()
    collective = collective_of(schedule)

    def fail(message):
        return ScheduleError(message)

    def run(order):
        try:
            state = flow.run(order, collective, fail)
        except ScheduleError:  # which member meets a fault first depends on the order
            return "error"
        return [chunks.read(0, schedule.nchunks) for chunks in state]

    assert pc[:schedule.nranks] == [len(p.steps) for p in schedule.ranks]
    assert run(order) == run(flow.queue_order())


# ---- lowering ------------------------------------------------------------------------

def test_lowering_is_a_pass_that_returns_a_new_schedule():
    schedule = two_boxes()
    before = schedule.to_json()
    lowered = lower_native(schedule)
    assert schedule.to_json() == before and schedule.nnative == 8
    assert lowered is not schedule and lowered.meta["lowered_native"] == 4
    assert lowered.meta["algorithm"] == "composed"
    # rank 0: a direct reduce-scatter (one step), the swap, a ring allgather (one step)
    assert [len(step) for step in lowered.ranks[0].steps] == [2, 2, 2]
    assert lowered.ranks[0].steps[1] == schedule.ranks[0].steps[1]


def test_a_schedule_without_native_steps_is_returned_as_it_is():
    schedule = build_schedule(2, [1.0], [[[send(1, 0), recv(1, 0, True)]],
                                         [[send(0, 0), recv(0, 0, True)]]])
    assert lower_native(schedule) is schedule


def test_later_steps_move_by_the_lowered_steps():
    """A broadcast over 5 ranks is a 3-step tree at the root; the rank's next step moves
    from 1 to 3."""
    group = [3, 0, 1, 2, 4]
    items = [native_op("broadcast", group, 0, 2, root=3), (3, 0, 0, 2, False)]
    schedule = N.global_order(5, 2, items)
    lowered = lower_native(schedule)
    assert len(lowered.ranks[3].steps) == 4
    assert lowered.ranks[3].steps[3] == schedule.ranks[3].steps[1]
    assert _masks(lowered) == _masks(schedule)


@pytest.mark.parametrize("kind, g, count, steps", [
    ("allgather", 4, 8, 3), ("reduce_scatter", 4, 8, 1), ("allreduce", 4, 8, 6),
    ("allreduce", 4, 6, 6), ("allreduce", 4, 3, 1), ("broadcast", 5, 1, 3),
    ("reduce", 5, 2, 1), ("allreduce", 1, 4, 0)])
def test_each_kind_lowers_to_its_algorithm(kind, g, count, steps):
    root = 0 if kind in ("broadcast", "reduce") else None
    members = lower_call(native_op(kind, range(g), 0, count, root))
    assert len(members) == g
    assert max(map(len, members)) == steps


@pytest.mark.parametrize("kind", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("g", [2, 3, 5, 8])
def test_a_collective_over_all_ranks_lowers_to_a_correct_schedule(kind, g):
    """The native op over every rank is the whole collective; so is its lowering."""
    collective = kind
    count = g * 2
    schedule = N.global_order(g, count, [native_op(kind, list(range(g)), 0, count)], collective)
    verify(schedule)
    verify(lower_native(schedule))


LOWERED_RUNS = {"two boxes": two_boxes, "4x2 rails": lambda: N.rails(4, 2, part=2),
                "unequal boxes": lambda: N.rooted([[0, 1, 2], [3, 4]], nchunks=5),
                "reduce-scatter 2x3": lambda: N.composed_reduce_scatter(2, 3),
                "allgather 3x2": lambda: N.composed_allgather(3, 2)}


@pytest.mark.parametrize("name", LOWERED_RUNS)
def test_lowered_schedules_run_exactly_on_the_executor(name):
    """The lowered schedule through the real executor, one thread per rank (the Local
    transport): exact sums, every size from empty chunks up."""
    import numpy as np

    import topoplan
    from topoplan.runtime.transports import Local

    schedule = lower_native(LOWERED_RUNS[name]())
    n = schedule.nranks
    sizes = (0, 1, 7, 250)  # elements, per shard for a reduce-scatter or an allgather

    def rank_fn(t: Local) -> list:
        out = []
        for m in sizes:
            if schedule.collective == "allreduce":
                x = (np.arange(m, dtype=np.float64) % 13) + 2.0 * t.rank
                topoplan.Allreduce(schedule, t, timeout=10)(x)
                out.append(x)
            elif schedule.collective == "reduce_scatter":
                x = (np.arange(n * m, dtype=np.float64) % 13) + 2.0 * t.rank
                out.append(topoplan.ReduceScatter(schedule, t, timeout=10)(x, np.empty(m)))
            else:
                x = np.arange(m, dtype=np.float64) + 1000.0 * t.rank
                out.append(topoplan.AllGather(schedule, t, timeout=10)(x, np.empty(n * m)))
        return out

    results = Local.launch(n, rank_fn, timeout=60)
    for i, m in enumerate(sizes):
        for rank in range(n):
            if schedule.collective == "allreduce":
                expected = (np.arange(m) % 13) * n + 2.0 * sum(range(n))
            elif schedule.collective == "reduce_scatter":
                total = (np.arange(n * m) % 13) * n + 2.0 * sum(range(n))
                expected = total[rank * m:(rank + 1) * m]
            else:
                expected = np.concatenate([np.arange(m) + 1000.0 * q for q in range(n)])
            assert np.array_equal(results[rank][i], expected), (name, m, rank)


# ---- the command line ------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_topoplan_verify_counts_native_steps(tmp_path):
    plan = tmp_path / "composed.json"
    two_boxes().save(plan)
    done = _cli("verify", str(plan))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"{plan}: ok: composed allreduce, 4 ranks, 4 chunks, 3 "
                                   "steps, 4 messages, 8 native steps (4 collectives)")
    done = _cli("verify", "--json", str(plan))
    record = json.loads(done.stdout)["plans"][0]
    assert (record["nnative"], record["ncollectives"], record["nmessages"]) == (8, 4, 4)


def test_topoplan_verify_names_a_native_fault(tmp_path):
    plan = tmp_path / "bad.json"
    FAULTS["another group order"][0].save(plan)
    done = _cli("verify", str(plan))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert (f"topoplan: error: {plan}: composed schedule: rank 1 step 0 runs allreduce over "
            "{1, 0}") in done.stderr
