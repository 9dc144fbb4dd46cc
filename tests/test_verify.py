"""verify() as an oracle: correct rings pass, each kind of broken schedule names its fault."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from simhelpers import ring_schedule
from topoplan.errors import ScheduleError
from topoplan.schedule import build_schedule, recv, send
from topoplan.verify import verify


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
}


@pytest.mark.parametrize("case", CASES)
def test_broken_schedules_name_the_fault(case):
    schedule, message = CASES[case]
    with pytest.raises(ScheduleError) as info:
        verify(schedule)
    assert message in str(info.value)
