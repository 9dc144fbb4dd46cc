"""The double-buffer pool: the fusion buffers' memory, in one set or two that steps alternate.

With double buffering (ChainerMN's ``double_buffering=True``, Suzuki 2018) step ``t``
packs its gradients into set ``t % 2`` and starts their allreduce while set
``1 - t % 2``, the previous step's, is still in flight or waiting to be applied; without
it every step uses set 0. :class:`~topoplan.torch.DistributedOptimizer` keeps one
:class:`BufferPool` a layout and, with double buffering but without overlap, one
:class:`Background` worker that reduces a set while the next step computes.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from .fusion import FusionGroup
from .timing import CommTime

__all__ = ["BufferPool", "Background"]


class BufferPool:
    """A flat buffer per fusion group and buffer set.

    Parameters
    ----------
    groups : list of FusionGroup
        The layout (:func:`~topoplan.torch.fusion.fuse`).
    nsets : int
        Buffer sets: 1, or 2 with double buffering.
    """

    def __init__(self, groups: list[FusionGroup], nsets: int) -> None:
        self.groups = groups
        self.nsets = nsets
        self._flats = [[group.empty() for _ in range(nsets)] for group in groups]

    def set_of(self, step: int) -> int:
        """The buffer set step number ``step`` packs into."""
        return step % self.nsets

    def flat(self, index: int, which: int) -> torch.Tensor:
        """Group ``index``'s buffer in set ``which``."""
        return self._flats[index][which]

    def pack_one(self, index: int, which: int, world_size: int) -> torch.Tensor:
        """Pack group ``index``'s gradients, divided by ``world_size``, into set ``which``."""
        return self.groups[index].pack(self._flats[index][which], world_size)

    def pack(self, which: int, world_size: int) -> list[torch.Tensor]:
        """Pack every group into set ``which``; the buffers in group order."""
        return [self.pack_one(index, which, world_size) for index in range(len(self.groups))]

    def unpack(self, which: int) -> None:
        """Write set ``which`` back into the gradients."""
        for group, flats in zip(self.groups, self._flats):
            group.unpack(flats[which])


class Background:
    """One worker thread that reduces a packed buffer set while the next step computes.

    Parameters
    ----------
    reduce : callable
        ``reduce(buffers)`` allreduces the buffers in place (on the worker thread).
    clock : CommTime
        :meth:`wait` adds the time it blocked to ``clock.wait_seconds``.
    """

    def __init__(self, reduce: Callable[[list[torch.Tensor]], None], clock: CommTime) -> None:
        self.reduce = reduce
        self.clock = clock
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="topoplan-dbuf")
        self._pending: Future | None = None

    def submit(self, buffers: list[torch.Tensor]) -> None:
        """Start reducing ``buffers`` on the worker (after :meth:`wait` for the last)."""
        self._pending = self._worker.submit(self.reduce, buffers)

    def wait(self) -> bool:
        """Block until the reduction submitted last (if any) is done; whether there was one."""
        if self._pending is None:
            return False
        start = time.perf_counter()
        try:
            self._pending.result()   # re-raises a TransportError from the worker
        finally:
            self.clock.wait_seconds += time.perf_counter() - start
            self._pending = None
        return True

    def close(self) -> None:
        """Wait for the pending reduction and stop the worker."""
        self.wait()
        self._worker.shutdown(wait=True)
