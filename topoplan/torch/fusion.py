"""Tensor fusion: which gradients share one flat buffer, and copying them in and out.

Horovod's tensor fusion (Sergeev and Del Balso, arXiv:1802.05799): gradients are packed,
in the order given, into flat buffers of at most a threshold in bytes, one dtype and
device a buffer, so that one allreduce moves many small gradients.
:class:`~topoplan.torch.DistributedOptimizer` lays its buffers out with :func:`fuse`.
"""

from __future__ import annotations

import torch

__all__ = ["FusionGroup", "fuse"]


class FusionGroup:
    """Parameters fused into one flat buffer: same dtype, at most the threshold in bytes.

    ``params``, ``names`` and ``numels`` are in buffer order: parameter i's gradient
    sits at ``sum(numels[:i])`` in the flat buffer.
    """

    __slots__ = ("params", "names", "numels", "dtype")

    def __init__(self, dtype: torch.dtype) -> None:
        self.params: list[torch.nn.Parameter] = []
        self.names: list[str] = []
        self.numels: list[int] = []
        self.dtype = dtype

    @property
    def numel(self) -> int:
        return sum(self.numels)

    def empty(self) -> torch.Tensor:
        """A new flat buffer for this group's gradients (uninitialised)."""
        return torch.empty(self.numel, dtype=self.dtype, device=self.params[0].device)

    def pack(self, flat: torch.Tensor, world_size: int) -> torch.Tensor:
        """Copy the gradients into ``flat`` divided by ``world_size``; returns ``flat``.

        A parameter without a gradient (unused this step) contributes zeros, as Horovod
        does. Pre-scaling makes the sum the mean: it keeps fp16 in range and needs no
        divide afterwards.
        """
        offset = 0
        with torch.no_grad():
            for p, n in zip(self.params, self.numels):
                piece = flat[offset:offset + n]
                if p.grad is None:
                    piece.zero_()
                else:
                    piece.copy_(p.grad.reshape(-1))
                offset += n
            flat.div_(world_size)
        return flat

    def unpack(self, flat: torch.Tensor) -> None:
        """Write ``flat`` back into the gradients (a missing ``p.grad`` gets a copy)."""
        offset = 0
        for p, n in zip(self.params, self.numels):
            piece = flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = piece.clone()
            else:
                p.grad.copy_(piece)
            offset += n


def fuse(named: list[tuple[str, torch.nn.Parameter]], threshold: int) -> list[FusionGroup]:
    """Pack ``named`` in order into groups of at most ``threshold`` bytes a (dtype, device).

    A parameter larger than the threshold gets a group of its own; ``threshold`` 0: one
    group a parameter. Each (dtype, device) fills one open group at a time, so groups
    of different dtypes interleave in the order their first parameter came.
    """
    groups: list[FusionGroup] = []
    open_group: dict[tuple[torch.dtype, torch.device], FusionGroup] = {}
    for name, p in named:
        key = (p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        group = open_group.get(key)
        if (group is None or threshold == 0
                or (group.numel * p.element_size() + nbytes > threshold)):
            group = FusionGroup(p.dtype)
            groups.append(group)
            open_group[key] = group
        group.params.append(p)
        group.names.append(name)
        group.numels.append(p.numel())
    return groups
