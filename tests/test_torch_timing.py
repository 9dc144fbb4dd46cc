"""The time in communication (topoplan/torch/timing.py): intervals of calls in flight
together count once, also across the two buffer sets of double buffering."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from topoplan.torch.timing import CommTime, covered  # noqa: E402


def test_covered_counts_overlapping_calls_once():
    nan = float("nan")
    assert covered([]) == (0.0, -math.inf)
    assert covered([[0.0, 1.0], [0.5, 1.5], [3.0, 4.0]]) == pytest.approx((2.5, 4.0))
    assert covered([[0.0, 2.0], [0.5, 1.0]]) == pytest.approx((2.0, 2.0))  # inside another
    assert covered([[0.0, 1.0], [0.2, nan]]) == pytest.approx((1.0, 1.0))  # never seen done
    # the other buffer set (double buffering) counted up to 3.5 already
    assert covered([[3.0, 4.0], [5.0, 6.0]], 3.5) == pytest.approx((1.5, 6.0))


def test_comm_time_carries_what_it_counted_from_one_set_to_the_next():
    clock = CommTime()
    assert (clock.comm_seconds, clock.wait_seconds) == (0.0, 0.0)
    clock.add_spans([[0.0, 2.0], [1.0, 3.0]])
    clock.add_spans([[2.5, 4.0]])  # in flight with the first set until 3.0
    assert clock.comm_seconds == pytest.approx(4.0)
    clock.comm_seconds += 1.0  # a blocking call adds its own time
    assert clock.comm_seconds == pytest.approx(5.0) and clock.wait_seconds == 0.0
