"""verify() as an oracle: correct rings pass, each kind of broken schedule names its fault."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tests.support import schedules as S
from tests.support.schedules import ring_schedule
from topoplan.errors import ScheduleError
from topoplan.ir.passes import coalesce
from topoplan.ir.schedule import build_schedule, equal_chunks, recv, send
from topoplan.ir.verify import _Chunks, verify


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 9).flatmap(lambda n: st.permutations(range(n))))
def test_rings_in_any_order_verify(order):
    report = verify(ring_schedule(list(order)))
    n = len(order)
    assert (report.nranks, report.nchunks, report.nsteps) == (n, n, 2 * (n - 1))
    assert report.nmessages == 2 * (n - 1) * n


def test_one_rank_needs_nothing():
    assert verify(build_schedule(1, [1.0], [[]])).nmessages == 0


CASES = {
    "unmatched": (build_schedule(2, [1.0], [[[send(1, 0)]], [[]]]),
                  "unmatched send: rank 0 step 0 sends chunk 0 to rank 1, which receives only "
                  "0 of 1 messages"),
    "chunk mismatch": (build_schedule(2, [0.5, 0.5], [[[send(1, 0)]], [[recv(0, 1)]]]),
                       "rank 0 step 0 sends chunk 0 but rank 1 step 0 receives it as chunk 1"),
    "deadlock": (build_schedule(2, [1.0], [[[recv(1, 0)], [send(1, 0)]],
                                           [[recv(0, 0)], [send(0, 0)]]]),
                 "deadlock: 2 ranks cannot finish; rank 0 step 0 waits"),
    "double count": (build_schedule(2, [1.0], [
        [[send(1, 0), recv(1, 0, reduce=True)], [send(1, 0)]],
        [[send(0, 0), recv(0, 0, reduce=True)], [recv(0, 0, reduce=True)]]]),
        "rank 1 step 1 reduces chunk 0 from rank 0: contributions {0, 1} would be counted twice"),
    "incomplete": (build_schedule(2, [1.0], [[[send(1, 0)]], [[recv(0, 0, reduce=True)]]]),
                   "rank 0 ends with chunk 0 holding {0}; expected all of 0..1 once "
                   "(missing {1})"),
    "range mismatch": (build_schedule(2, equal_chunks(4), [[[send(1, 0, count=3)]],
                                                           [[recv(0, 0, count=2)]]]),
                       "rank 0 step 0 sends chunks 0..2 but rank 1 step 0 receives it as "
                       "chunks 0..1"),
    "range double count": (build_schedule(2, equal_chunks(4), [
        [[send(1, 0, count=4)], [recv(1, 2, reduce=True, count=2)]],
        [[recv(0, 0, reduce=True, count=4)], [send(0, 2, count=2)]]]),
        "rank 0 step 1 reduces chunk 2 from rank 1: contributions {0} would be counted twice"),
    "overlapping range recvs": (build_schedule(3, equal_chunks(4), [
        [[recv(1, 0, count=2), recv(2, 1, count=3)]], [[send(0, 0, count=2)]],
        [[send(0, 1, count=3)]]]),
        "rank 0 step 0: two recvs into chunk 1 in one step"),
    "range incomplete": (build_schedule(2, equal_chunks(5), [
        [[send(1, 1, count=3)]], [[recv(0, 1, reduce=True, count=3)]]]),
        "rank 0 ends with chunk 0 holding {0}"),
    "overwrite overlapping a reduce": (build_schedule(3, equal_chunks(2), [
        [[recv(1, 0, reduce=True, count=2), recv(2, 1)]], [[send(0, 0, count=2)]],
        [[send(0, 1)]]]),
        "rank 0 step 0: two recvs into chunk 1 in one step"),
    "two reduces counting one rank twice": (build_schedule(3, [1.0], [
        [[send(1, 0)], [], [send(2, 0)]],
        [[recv(0, 0, reduce=True)], [send(2, 0)]],
        [[], [recv(1, 0, reduce=True), recv(0, 0, reduce=True)]]]),
        "rank 2 step 1 reduces chunk 0 from rank 0: contributions {0} would be counted twice"),
    "range out of bounds": (build_schedule(2, equal_chunks(3), [[[send(1, 2, count=2)]],
                                                                [[recv(0, 2, count=2)]]]),
                            "rank 0 step 0: chunks 2..3 out of range(3)"),
}


@pytest.mark.parametrize("case", CASES)
def test_broken_schedules_name_the_fault(case):
    schedule, message = CASES[case]
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    assert message in str(info.value)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_several_reducing_recvs_of_one_chunk_in_a_step_add_up(n):
    schedule = S.all_to_all(n)
    assert schedule.version == 2  # v1 allows one recv per chunk in a step
    assert verify(schedule).nsteps == 2


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_hand_written_range_schedule_verifies(n):
    report = verify(S.halving_ranges(n))
    assert report.nmessages == 2 * n * n.bit_length() - 2 * n  # 2 log2(n) messages per rank


@pytest.mark.parametrize("n", [3, 5, 8])
def test_coalesce_merges_back_to_back_messages_and_keeps_the_result(n):
    # One message per chunk, a pair's chunks consecutive within a step: direct exchange.
    steps: list[list[list]] = [[] for _ in range(n)]
    per = 3  # chunks per rank
    for r in range(n):
        for k in range(1, n):
            to, frm = (r + k) % n, (r - k) % n
            steps[r].append([send(to, per * to + j) for j in range(per)]
                            + [recv(frm, per * r + j, reduce=True) for j in range(per)])
        for k in range(1, n):
            to, frm = (r + k) % n, (r - k) % n
            steps[r].append([send(to, per * r + j) for j in range(per)]
                            + [recv(frm, per * frm + j) for j in range(per)])
    v1 = build_schedule(n, equal_chunks(per * n), steps, algorithm="direct")
    v2 = coalesce(v1)
    assert v1.version == 1 and v2.version == 2
    assert v2.nops * per == v1.nops
    assert verify(v2).nmessages * per == verify(v1).nmessages


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n), st.booleans(),
                       st.integers(0, n - 1), st.integers(0, 63)), max_size=25))))
def test_chunk_runs_behave_like_a_plain_list(case):
    """_Chunks (runs of equal bitmasks) against one mask per chunk, under random
    overwrites and disjoint adds of random ranges."""
    n, ops = case
    runs, plain = _Chunks(n, 1), [1] * n
    src_runs, src_plain = _Chunks(n, 2), [2] * n
    for a, count, reduce, src, mask in ops:
        count = min(count, n - a)
        b = a + count
        src = min(src, n - count)
        value = src_runs.read(src, src + count)
        if reduce:
            twice = runs.add(a, value)
            clash = [k for k in range(a, b) if plain[k] & src_plain[src + k - a]]
            assert (twice is None) == (not clash)
            if clash:
                assert twice[0] == clash[0]
                break
            for k in range(a, b):
                plain[k] |= src_plain[src + k - a]
        else:
            runs.write(a, b, value)
            plain[a:b] = src_plain[src:src + count]
        # Scramble the source a little so values differ from chunk to chunk.
        src_runs.write(a, b, [(a, b, mask << 2)])
        src_plain[a:b] = [mask << 2] * count
        flat = [m for s, e, m in runs.read(0, n) for _ in range(s, e)]
        assert flat == plain
        assert all(x != y for x, y in zip(runs.masks, runs.masks[1:]))  # runs stay merged
