"""A call in flight: what :meth:`Allreduce.start` (and the ``start`` of
:class:`ReduceScatter` and :class:`AllGather`) returns.

A started call is a small state machine (the step it is at, that step's posted
messages, its deadline) that the executor (:mod:`topoplan.runtime.executor.engine`) moves
whenever anything polls the transport; the handle is how the caller polls it and
waits for it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import TransportError

if TYPE_CHECKING:
    from .arrays import ArrayOps
    from .compiler import BoundProgram
    from .lanes import CallQueue

__all__ = ["Handle", "AllreduceHandle"]


class _Owner(Protocol):
    """What a handle, and the executors of the calls beside it, need of the executor
    that started it (:class:`~topoplan.runtime.executor.engine.Executor`)."""

    _queue: CallQueue[Handle]
    _laned: bool
    groups: frozenset[tuple[int, ...]]

    def _progress_all(self) -> bool: ...

    def _advance(self, h: Handle, *, block: bool) -> bool: ...


class Handle:
    """A call in flight, returned by :meth:`Allreduce.start` (and the ``start`` of
    :class:`ReduceScatter` and :class:`AllGather`).

    ``test()`` moves it (and every other call in flight on the transport) as far as it
    goes without blocking and says whether it is done (when another thread is moving
    them at that moment, it leaves them to that thread); ``wait()`` blocks until it is and
    returns the buffer (the output, for a reduce-scatter or an allgather). A failed call
    raises its :class:`~topoplan.TransportError` from either, every time they are called.
    """

    __slots__ = ("_owner", "buffer", "_bound", "_ops", "call", "epoch", "lane", "_step",
                 "_posted", "_deadline", "_begun", "done", "_error", "_cursors", "_ends")

    def __init__(self, owner: _Owner, buffer: Any, bound: BoundProgram, ops: ArrayOps,
                 call: int, epoch: int, lane: int) -> None:
        self._owner, self.buffer, self._bound, self._ops = owner, buffer, bound, ops
        self.call, self.epoch, self.lane = call, epoch, lane
        self._step = 0
        self._posted: Any = None
        self._deadline = 0.0
        self._begun = False
        self.done = False
        self._error: TransportError | None = None
        # A call that runs its channels at once: each channel's place (engine.Cursor).
        self._cursors: list[Any] | None = None
        # When each step ended (perf_counter; the call's start first), for the executor's
        # trace (link health); None when it keeps none.
        self._ends: list[float] | None = None

    def test(self) -> bool:
        """Progress without blocking; True once the call is done.

        Raises
        ------
        TransportError
            The call failed (a step timed out or a peer failed).
        """
        owner = self._owner
        lock = owner._queue.lock
        # Another thread moving the calls (a progress thread) does this call's work too:
        # waiting for it would only stall the caller, e.g. backward in a gradient hook.
        if not self.done and lock.acquire(blocking=False):
            try:
                owner._progress_all()
            finally:
                lock.release()
        if self._error is not None:
            raise self._error
        return self.done

    def wait(self) -> Any:
        """Block until the call is done; returns the buffer (summed in place), or the
        output of a reduce-scatter or an allgather.

        Raises
        ------
        TransportError
            The call failed (a step timed out or a peer failed).
        """
        owner = self._owner
        idle = 0
        while not self.done:
            with owner._queue.lock:
                moved = owner._progress_all()
                begun = [h for h in owner._queue.calls if h._begun and not h.done]
                if len(begun) == 1 and not self.done:
                    # Alone, or the others wait for it to finish (one at a time on NCCL
                    # and gloo): wait on it, not in a poll loop.
                    begun[0]._owner._advance(begun[0], block=True)
                    continue
            if self.done:
                break
            idle = 0 if moved else idle + 1
            if idle > 64:
                time.sleep(min(1e-3, 1e-5 * idle))  # others' turn on a crowded machine
        if self._error is not None:
            raise self._error
        return self.buffer

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done else (
            "queued" if not self._begun else f"at step {self._step}" if self._cursors is None
            else "at " + ", ".join(
                f"channel {c.channel} " + (f"step {self._bound.steps[c.at].index}"
                                           if c.at < c.end else "done")
                for c in self._cursors))
        return f"<Handle call {self.call} {state}>"


#: The handle's first name, from when only :class:`~topoplan.runtime.executor.Allreduce` had one.
AllreduceHandle = Handle
