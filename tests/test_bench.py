"""topoplan.runtime.bench's helpers that need no transport (run_bench runs in
tests/test_executor_collectives.py and under MPI and gloo in tests/test_transports_*.py)."""

from __future__ import annotations

import math
import os

import pytest

from topoplan.runtime.bench import load_average


def test_load_average_is_the_one_minute_load_or_nan(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.25, 2.0, 3.0))
    assert load_average() == 1.25

    def none():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", none)
    assert math.isnan(load_average())


def test_the_testbed_records_the_same_load_average():
    """One reader: the testbed's calibration and benchmark record topoplan.runtime.bench's."""
    testbed_bench = pytest.importorskip("topoplan.testbed.bench")
    testbed_calibrate = pytest.importorskip("topoplan.testbed.calibrate")
    assert testbed_bench.load_average is load_average
    assert testbed_calibrate.load_average is load_average
