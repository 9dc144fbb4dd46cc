"""The progress thread shared by the DDP hook state and DistributedOptimizer: it starts
at the first wake, steps only while there is work, drains or stops at close, and is
closed at interpreter exit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

from topoplan.torch.progress import ProgressThread  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class Queue:
    """Work items the thread takes one a step; ``gate`` holds each step until opened."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.done: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # a step is under way
        self.progress = ProgressThread(self.take, lambda: bool(self.items), name="test-progress")

    def take(self) -> None:
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        with self.progress.lock:
            self.done.append(self.items.pop(0))
            self.progress.lock.notify_all()

    def put(self, *items: int) -> None:
        with self.progress.lock:
            self.items.extend(items)
            self.progress.wake()

    def wait_done(self, n: int) -> None:
        with self.progress.lock:
            assert self.progress.lock.wait_for(lambda: len(self.done) >= n, 10), self.done


def test_the_thread_starts_at_the_first_wake_and_steps_while_there_is_work():
    q = Queue()
    assert q.progress.thread is None
    q.put(1, 2)
    q.wait_done(2)
    assert q.progress.thread.is_alive() and q.progress.thread.name == "test-progress"
    q.put(3)
    q.wait_done(3)
    assert q.done == [1, 2, 3]
    q.progress.close()
    assert q.progress.closed and not q.progress.thread.is_alive()


@pytest.mark.parametrize("drain", [True, False])
def test_close_drains_the_work_or_stops_after_the_step_under_way(drain):
    q = Queue()
    q.progress.drain = drain
    q.gate.clear()
    q.put(1, 2, 3)
    assert q.entered.wait(10)  # the first step waits at the gate
    closer = threading.Thread(target=q.progress.close)
    closer.start()
    while not q.progress.closed:
        closer.join(0.01)
    q.gate.set()
    closer.join(10)
    assert not closer.is_alive() and not q.progress.thread.is_alive()
    assert q.done == ([1, 2, 3] if drain else [1])


def test_wake_after_close_starts_nothing():
    q = Queue()
    q.progress.close()
    q.put(1)
    assert q.progress.thread is None and q.items == [1]


def test_the_interval_spaces_the_steps():
    import time
    stamps: list[float] = []
    progress = ProgressThread(lambda: stamps.append(time.perf_counter()),
                              lambda: len(stamps) < 3, name="test-interval", interval=0.05)
    progress.wake()
    deadline = time.perf_counter() + 10
    while len(stamps) < 3 and time.perf_counter() < deadline:
        time.sleep(0.01)
    progress.close()
    assert len(stamps) == 3 and all(b - a >= 0.05 for a, b in zip(stamps, stamps[1:]))


def test_threads_still_running_at_exit_are_closed_first():
    """Exit handlers run last-registered first: one registered before the module's own
    sees the thread stopped (a poll after mpi4py finalizes MPI at exit would fail)."""
    code = """
import atexit, threading
seen = []
atexit.register(lambda: print("alive at exit:", seen[0].is_alive(), flush=True))
from topoplan.torch.progress import ProgressThread
gate = threading.Event()
progress = ProgressThread(lambda: gate.wait(0.01), lambda: True, name="left-running")
progress.wake()
seen.append(progress.thread)
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "alive at exit: False", out
