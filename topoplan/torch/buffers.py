"""The double-buffer pool: the fusion buffers' memory, in one set or two that steps alternate.

With double buffering (ChainerMN's ``double_buffering=True``, Suzuki 2018) step ``t``
packs its gradients into set ``t % 2`` and starts their allreduce while set
``1 - t % 2``, the previous step's, is still in flight or waiting to be applied; without
it every step uses set 0. :class:`~topoplan.torch.DistributedOptimizer` keeps one
:class:`BufferPool` a layout.
"""

from __future__ import annotations

import torch

from .fusion import FusionGroup

__all__ = ["BufferPool"]


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
