"""verify() against the verifier it replaced (tests/support/verify_reference.py).

Correct schedules (hand-built and planned, all three collectives) are broken at random:
messages dropped, moved to other steps, pointed at other chunks, duplicated, reduces
flipped, steps swapped. Both verifiers must accept the same schedules with the same
report and reject the others with the same first error, word for word.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support import schedules as S
from tests.support.clusters import flat_cluster_yaml, leaf_spine_cluster
from tests.support.verify_reference import verify_reference
from topoplan.errors import ScheduleError
from topoplan.ir.schedule import Op, OpKind, RankProgram, Schedule, build_schedule, recv, send
from topoplan.ir.verify import _Chunks, verify


def _outcome(check, schedule: Schedule) -> tuple[str, object]:
    try:
        return "ok", check(schedule)
    except ScheduleError as exc:
        return "error", str(exc)


def _same(schedule: Schedule) -> tuple[str, object]:
    """What both verifiers say about ``schedule``, after checking that they agree."""
    new = _outcome(verify, replace(schedule))  # replace: a new object, matched afresh
    old = _outcome(verify_reference, replace(schedule))
    assert new == old
    return new


@functools.lru_cache(maxsize=None)
def _bases() -> dict[str, Schedule]:
    """Correct schedules of every shape the verifier handles."""
    from topoplan.cluster import loads_cluster
    from topoplan.planners import plan
    from topoplan.ir.passes import coalesce

    out = {"ring rs": S.ring_reduce_scatter([2, 0, 3, 1]),
           "ring ag": S.ring_allgather([1, 3, 0, 2, 4]),
           "direct v2": coalesce(S.direct(4)), "hierarchical": S.hierarchical_schedule(8, 2)}
    for n in (3, 4):
        out.update({f"{name} {n}": schedule for name, schedule in S.builders(n).items()})
    clusters = {"flat": loads_cluster(flat_cluster_yaml(6, 2)),
                "leaves": leaf_spine_cluster(2, gpus=2)}
    for where, cluster in clusters.items():
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            out[f"mcf {collective} {where}"] = plan(cluster, "mcf", size=1 << 20,
                                                    collective=collective)
    out["tree flat"] = plan(clusters["flat"], "tree", size=1 << 20)
    return out


def _steps(schedule: Schedule) -> list[list[list[Op]]]:
    return [[list(step) for step in p.steps] for p in schedule.ranks]


def _rebuild(schedule: Schedule, steps: list[list[list[Op]]]) -> Schedule:
    return replace(schedule, ranks=tuple(RankProgram(r, tuple(map(tuple, s)))
                                         for r, s in enumerate(steps)))


def _ops(steps, kind: OpKind) -> list[tuple[int, int, int]]:
    return [(r, s, j) for r, program in enumerate(steps) for s, step in enumerate(program)
            for j, op in enumerate(step) if op.kind is kind]


def _partner(steps, r: int, s: int, j: int) -> tuple[int, int, int] | None:
    """The recv that the send at ``steps[r][s][j]`` pairs with (in-order matching)."""
    op = steps[r][s][j]
    k = sum(o.kind is OpKind.SEND and o.peer == op.peer
            for t, step in enumerate(steps[r]) for i, o in enumerate(step) if (t, i) < (s, j))
    for t, step in enumerate(steps[op.peer]):
        for i, o in enumerate(step):
            if o.kind is OpKind.RECV and o.peer == r:
                if k == 0:
                    return op.peer, t, i
                k -= 1
    return None


def _mutate(schedule: Schedule, kind: str, a: int, b: int, c: int) -> Schedule:
    """``schedule`` broken one way; ``a``, ``b``, ``c`` pick where (taken modulo sizes)."""
    steps = _steps(schedule)
    sends = _ops(steps, OpKind.SEND)
    if not sends:
        return schedule
    r, s, j = sends[a % len(sends)]
    op = steps[r][s][j]
    pair = _partner(steps, r, s, j)
    if kind == "drop op":
        del steps[r][s][j]
    elif pair is None:
        return schedule
    elif kind == "drop message":
        p, t, i = pair
        del steps[p][t][i]
        del steps[r][s][j]
    elif kind == "other chunk":  # both ends agree, on the wrong chunks
        p, t, i = pair
        chunk = b % (schedule.nchunks - op.count + 1)
        steps[r][s][j] = replace(op, chunk=chunk)
        steps[p][t][i] = replace(steps[p][t][i], chunk=chunk)
    elif kind == "flip reduce":
        p, t, i = pair
        steps[p][t][i] = replace(steps[p][t][i], reduce=not steps[p][t][i].reduce)
    elif kind == "move send":  # to another step of the sender (maybe a new one)
        del steps[r][s][j]
        t = b % (len(steps[r]) + 1)
        if t == len(steps[r]):
            steps[r].append([])
        steps[r][t].insert(c % (len(steps[r][t]) + 1), op)
    elif kind == "move recv":
        p, t, i = pair
        moved = steps[p][t].pop(i)
        u = b % (len(steps[p]) + 1)
        if u == len(steps[p]):
            steps[p].append([])
        steps[p][u].insert(c % (len(steps[p][u]) + 1), moved)
    elif kind == "duplicate":  # the same message again, at the end of both programs
        p, t, i = pair
        steps[r].append([op])
        steps[p].append([replace(steps[p][t][i], reduce=bool(b % 2))])
    elif kind == "swap steps":
        program = steps[r]
        u = b % len(program)
        program[s], program[u] = program[u], program[s]
    elif kind == "collective":
        names = ("allreduce", "reduce_scatter", "allgather")
        return _rebuild(replace(schedule, collective=names[b % 3]), steps)
    return _rebuild(schedule, steps)


KINDS = ("drop op", "drop message", "other chunk", "flip reduce", "move send", "move recv",
         "duplicate", "swap steps", "collective")


def test_every_base_schedule_verifies_the_same():
    for name, schedule in _bases().items():
        assert _same(schedule)[0] == "ok", name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_broken_schedules_get_the_same_verdict(data):
    schedule = data.draw(st.sampled_from(list(_bases().values())))
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(KINDS))
        a, b, c = (data.draw(st.integers(0, 1 << 16)) for _ in range(3))
        schedule = _mutate(schedule, kind, a, b, c)
    _same(schedule)


@pytest.mark.parametrize("base, kind, words", [
    ("mcf allreduce leaves", "drop message", "ends with chunk"),
    ("mcf allgather leaves", "drop message", "held nothing there"),
    ("mcf reduce_scatter leaves", "other chunk", "ends with chunk"),
    ("mcf allreduce leaves", "flip reduce", "ends with chunk"),
    ("mcf allgather leaves", "flip reduce", "into a chunk that holds nothing yet"),
    ("mcf allreduce leaves", "duplicate", "would be counted twice"),
    ("test-direct 4", "swap steps", "deadlock"),
    ("test-reduce-bcast 4", "move send", "deadlock"),
    ("mcf allreduce leaves", "drop op", "unmatched"),
])
def test_known_faults_are_found_the_same_way(base, kind, words):
    """Each kind of mutation, somewhere in a planned schedule, breaks it the named way,
    and both verifiers say so in the same words."""
    schedule = _bases()[base]
    texts = [text for a in range(0, 300, 7) for b in range(4)
             for verdict, text in [_same(_mutate(schedule, kind, a, b, 0))] if verdict == "error"]
    assert any(words in str(text) for text in texts)


def test_of_two_faults_the_old_verifier_s_first_is_reported():
    """Rank 1 counts rank 2 twice at its step 1, rank 0 counts rank 3 twice at its step 2.
    The old verifier ran rank 0 as far as it could before rank 1, so it met rank 0's
    fault first, though rank 1's comes earlier in the rounds of the dependency graph."""
    schedule = build_schedule(4, [1.0], [
        [[recv(2, 0, reduce=True)], [recv(3, 0, reduce=True)], [recv(3, 0, reduce=True)]],
        [[recv(2, 0, reduce=True)], [recv(2, 0, reduce=True)]],
        [[send(0, 0), send(1, 0), send(1, 0)]],
        [[send(0, 0), send(0, 0)]]], algorithm="bad")
    assert _same(schedule)[1] == ("bad schedule: rank 0 step 2 reduces chunk 0 from rank 3: "
                                  "contributions {3} would be counted twice")


def test_deadlock_behind_a_fault_reports_the_fault():
    # Rank 0 counts rank 1 twice, then ranks 0 and 1 both wait to receive.
    schedule = build_schedule(2, [1.0], [
        [[recv(1, 0, reduce=True)], [recv(1, 0, reduce=True)], [recv(1, 0)], [send(1, 0)]],
        [[send(0, 0)], [send(0, 0)], [recv(0, 0)], [send(0, 0)]]], algorithm="bad")
    assert _same(schedule)[1] == ("bad schedule: rank 0 step 1 reduces chunk 0 from rank 1: "
                                  "contributions {1} would be counted twice")
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n), st.booleans(),
                       st.integers(0, 7)), max_size=25))))
def test_single_mask_writes_behave_like_a_plain_list(case):
    """_Chunks.get / put / add_mask (one mask over a range) against one mask per chunk."""
    n, ops = case
    runs, plain = _Chunks(n, 0), [0] * n
    for a, count, reduce, bit in ops:
        b = min(a + count, n)
        mask = 1 << bit
        got = runs.get(a, b)
        if isinstance(got, int):
            assert plain[a:b] == [got] * (b - a)
        else:
            assert [m for s, e, m in got for _ in range(s, e)] == plain[a:b]
            assert len(got) > 1
        if reduce:
            clash = runs.add_mask(a, b, mask)
            first = next((k for k in range(a, b) if plain[k] & mask), None)
            if first is not None:
                assert clash == (first, plain[first] & mask)
                break
            assert clash is None
            plain[a:b] = [m | mask for m in plain[a:b]]
        else:
            runs.put(a, b, mask)
            plain[a:b] = [mask] * (b - a)
        assert [m for s, e, m in runs.read(0, n) for _ in range(s, e)] == plain
        assert all(x != y for x, y in zip(runs.masks, runs.masks[1:]))  # runs stay merged
        assert runs.starts[0] == 0 and all(x < y for x, y in zip(runs.starts, runs.starts[1:]))


def test_the_table_of_unions_may_start_afresh(monkeypatch):
    """Cleared every few pairs, the shared unions still add up (ids of freed masks may
    come back; no entry may outlive its masks)."""
    from topoplan.ir.verify import _Unions

    monkeypatch.setattr(_Unions, "LIMIT", 3)
    for name, schedule in _bases().items():
        assert _same(schedule)[0] == "ok", name
        broken = _mutate(schedule, "duplicate", 5, 1, 0)
        _same(broken)
