"""Overlap: each fusion buffer's allreduce started from the gradient hooks during backward.

As Horovod and DDP do: a hook on each parameter's gradient accumulator counts the
gradients its buffer still waits for and, when the last is in, packs the buffer and
*starts* its allreduce (:meth:`topoplan.Allreduce.start`) while backward goes on with
the earlier layers. Buffers start in index order on every rank (a buffer that fills
early waits for those before it). Between the hooks a :class:`ProgressThread` polls the
calls in flight, since MPI moves messages only inside MPI calls; :meth:`Overlap.finish`
waits for a buffer set's calls in start order and restores the buffers.
:class:`~topoplan.torch.DistributedOptimizer` keeps one :class:`Overlap` when its
allreduce has ``start``.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from ..errors import TopoplanError
from .buffers import BufferPool
from .compression import Compressor
from .progress import ProgressThread
from .timing import CommTime

__all__ = ["Overlap"]


def _seen_done(calls: list[Any], spans: list[list[float]]) -> None:
    """Stamp the calls a poll sees done with the time (``spans[i]``: [start, done])."""
    now = 0.0
    for call, span in zip(calls, spans):
        if span[1] != span[1] and call is not None and getattr(call[2], "done", False):
            now = now or time.perf_counter()
            span[1] = now


class Overlap:
    """The gradient hooks, the calls they start, and the thread that polls them.

    Parameters
    ----------
    allreduce : callable with ``start``
        ``allreduce.start(buffer) -> handle`` with ``test()``, ``wait()`` and ``done``.
    compression : Compressor
        Applied to each packed buffer before it starts, undone by :meth:`finish`.
    world_size : int
        Ranks the allreduce spans (packing divides by it).
    clock : CommTime
        Where :meth:`finish` counts the time in communication and the time waited.
    poll_interval : float
        Seconds between the progress thread's polls; 0: no thread (the hooks alone
        poll). Only on a transport with ``pollable`` set.

    Attributes
    ----------
    made : list of str or None
        Parameter names in the order backward made their gradients in the first step
        (repeats included); the owner sets it to None to stop recording.
    which : int
        The buffer set this step packs into (:meth:`next_step` sets it).
    hooks : list
        The hook handles on the parameters (empty after :meth:`close`).
    progress : ProgressThread
        The polling thread (started at the first buffer that starts on a pollable
        transport).
    """

    def __init__(self, allreduce: Any, compression: type[Compressor] | Compressor,
                 world_size: int, clock: CommTime, *, poll_interval: float) -> None:
        self.allreduce = allreduce
        self.compression = compression
        self.world_size = world_size
        self.clock = clock
        self.poll_interval = poll_interval
        self.made: list[str] | None = []
        self.which = 0
        self.hooks: list[Any] = []
        self._polling = False  # guarded by progress.lock
        self.progress = ProgressThread(self._poll_in_thread, lambda: self._polling,
                                       name="topoplan-overlap-progress", interval=poll_interval)

    def layout(self, pool: BufferPool) -> None:
        """Hook the pool's parameters (replacing earlier hooks) and start an empty step."""
        self.pool = pool
        groups = pool.groups
        # Per buffer, gradients still to come this step, and calls in flight per buffer
        # set: (wire, ctx, handle) in start order ...
        self._missing: list[int] = [len(g.params) for g in groups]
        self._started = 0                    # buffers of this step started so far
        self._calls: list[list[tuple[torch.Tensor, Any, Any] | None]] = [
            [None] * len(groups) for _ in range(pool.nsets)]
        # ... and when each started and when a poll first saw it done (comm_seconds).
        self._spans: list[list[list[float]]] = [[] for _ in range(pool.nsets)]
        self._remove_hooks()
        for index, group in enumerate(groups):
            for name, p in zip(group.names, group.params):
                self.hooks.append(p.register_post_accumulate_grad_hook(
                    self._make_hook(index, name)))

    def _remove_hooks(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def _make_hook(self, index: int, name: str) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            if self._missing[index] == 0:
                raise TopoplanError(
                    f"DistributedOptimizer(overlap=True): the gradient of {name!r} changed "
                    "after its buffer's allreduce started; call step() after each backward "
                    "(or pass overlap=False to accumulate gradients over several)")
            if self.made is not None:
                self.made.append(name)
            self._missing[index] -= 1
            if self._missing[index] == 0:
                self.start_ready()
            elif self._started:
                self.poll()  # move the calls in flight while backward goes on
        return hook

    def start_ready(self, everything: bool = False) -> None:
        """Start the full buffers in index order (``everything``: the rest too)."""
        which = self.which
        calls = self._calls[which]
        start = self.allreduce.start
        while self._started < len(self.pool.groups) and (
                everything or self._missing[self._started] == 0):
            index = self._started
            flat = self.pool.pack_one(index, which, self.world_size)
            wire, ctx = self.compression.compress(flat)
            calls[index] = (wire, ctx, start(wire))
            self._spans[which].append([time.perf_counter(), math.nan])
            self._missing[index] = 0
            self._started += 1
        if self._started and self.poll_interval > 0 and getattr(
                getattr(self.allreduce, "transport", None), "pollable", False):
            with self.progress.lock:
                self._polling = True
                self.progress.wake()

    def poll(self) -> None:
        """Move the calls in flight one step on; stamp those now done."""
        which = self.which
        started = self._started
        call = self._calls[which][started - 1] if started else None
        if call is not None:
            call[2].test()  # moves every call in flight on the transport
        for calls, spans in zip(self._calls, self._spans):  # both sets: double buffering
            _seen_done(calls, spans)

    def _poll_in_thread(self) -> None:
        try:
            self.poll()
        except Exception:  # noqa: BLE001 - the handle keeps its error for step()
            self._pause()

    def _pause(self) -> None:
        with self.progress.lock:
            self._polling = False

    def finish(self, which: int) -> bool:
        """Wait for the buffers of set ``which`` in start order and restore them;
        whether there were any."""
        calls = self._calls[which]
        if calls[0] is None:
            return False
        self._pause()
        began = time.perf_counter()
        try:
            for index, call in enumerate(calls):
                assert call is not None
                wire, ctx, handle = call
                handle.wait()
                _seen_done(calls[index:index + 1], self._spans[which][index:index + 1])
                flat = self.pool.flat(index, which)
                restored = self.compression.decompress(wire, ctx)
                if restored.data_ptr() != flat.data_ptr():
                    flat.copy_(restored)
        finally:
            self.clock.wait_seconds += time.perf_counter() - began
            # Double buffering: the other set's calls may have been in flight meanwhile.
            self.clock.add_spans(self._spans[which])
            self._calls[which] = [None] * len(self.pool.groups)
            self._spans[which] = []
        return True

    def next_step(self, which: int) -> None:
        """A new step that packs into set ``which``: every buffer waits for all its
        gradients again."""
        self.which = which
        self._missing = [len(g.params) for g in self.pool.groups]
        self._started = 0

    def close(self) -> None:
        """Finish the calls in flight, remove the hooks and stop the progress thread."""
        for which in range(len(self._calls)):
            self.finish(which)
        self._remove_hooks()
        self.progress.close()
