"""The progress thread: moves a transport's calls in flight while the training thread computes.

A transport moves a call only inside its own calls: MPI inside MPI calls, gloo's
point-to-point work only inside a wait. While backward runs nothing calls into it, so
the DDP hook state (:class:`~topoplan.torch.TopoplanHookState`, which waits on the
calls in start order and completes DDP's Futures) and
:class:`~topoplan.torch.DistributedOptimizer` with overlap (which polls the buffers in
flight) each run one :class:`ProgressThread`.

Threads still running at interpreter exit are closed by one ``atexit`` handler, before
the transport shuts down: mpi4py finalizes MPI at exit, and a poll after that is an MPI
error; and a thread that has run DDP's Future callbacks and is still alive when the
interpreter shuts down aborts the process (``terminate called without an active
exception``, seen on about half of 2-rank gloo runs).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Callable

__all__ = ["ProgressThread"]


class ProgressThread:
    """One daemon thread that runs ``step()`` while ``ready()`` holds.

    The thread starts at the first :meth:`wake`, sleeps on :attr:`lock` while
    ``ready()`` is false, and stops at :meth:`close` (or at interpreter exit).

    Parameters
    ----------
    step : callable
        One move of the calls in flight, run on the thread without :attr:`lock` held.
        It handles its own errors (an exception it raises ends the thread).
    ready : callable
        Whether there is work; called with :attr:`lock` held, so the owner changes what
        it reads under :attr:`lock`, then calls :meth:`wake`.
    name : str
        The thread's name.
    interval : float
        Seconds the thread sleeps after each step; 0: none.
    drain : bool
        At :meth:`close`: go on stepping until ``ready()`` is false (True), or stop
        after the step under way (False).

    Attributes
    ----------
    lock : threading.Condition
        Guards what ``ready()`` reads; re-entrant, so :meth:`wake` may be called with it
        held.
    thread : threading.Thread or None
        The thread, once started (kept after :meth:`close`).
    closed : bool
        Whether :meth:`close` was called; :meth:`wake` does nothing then.
    """

    def __init__(self, step: Callable[[], object], ready: Callable[[], bool], *, name: str,
                 interval: float = 0.0, drain: bool = False) -> None:
        self.step = step
        self.ready = ready
        self.name = name
        self.interval = float(interval)
        self.drain = bool(drain)
        self.lock = threading.Condition()
        self.thread: threading.Thread | None = None
        self.closed = False

    def wake(self) -> None:
        """Start the thread if it has not started, and have it look at ``ready()``."""
        with self.lock:
            if self.closed:
                return
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self.thread.start()
                _RUNNING.add(self)
            self.lock.notify()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.closed and not self.ready():
                    self.lock.wait()
                if self.closed and not (self.drain and self.ready()):
                    return
            self.step()
            if self.interval > 0:
                time.sleep(self.interval)

    def close(self) -> None:
        """Stop the thread (with ``drain``: once ``ready()`` is false) and join it."""
        with self.lock:
            self.closed = True
            self.lock.notify()
            thread = self.thread
        if thread is not None:
            thread.join()
        _RUNNING.discard(self)


#: Progress threads started and not closed yet; closed at exit (see the module docstring).
_RUNNING: weakref.WeakSet[ProgressThread] = weakref.WeakSet()


@atexit.register
def _close_running() -> None:
    for progress in list(_RUNNING):
        progress.close()
