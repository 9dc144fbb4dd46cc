"""Tensor fusion: which gradients share one flat buffer, and copying them in and out.

Horovod's tensor fusion (Sergeev and Del Balso, arXiv:1802.05799): gradients are packed,
in the order given, into flat buffers of at most a threshold in bytes, one dtype and
device a buffer, so that one allreduce moves many small gradients
(:func:`topoplan.runtime.fusion.fusion_buckets`, the rule the estimator uses too).
:class:`~topoplan.torch.DistributedOptimizer` lays its buffers out with :func:`fuse`.
"""

from __future__ import annotations

import torch

from ..runtime.fusion import fusion_buckets

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
    params = [p for _, p in named]
    groups = []
    for bucket in fusion_buckets([p.numel() * p.element_size() for p in params], threshold,
                                 [(p.dtype, p.device) for p in params]):
        group = FusionGroup(params[bucket[0]].dtype)
        for i in bucket:
            name, p = named[i]
            group.params.append(p)
            group.names.append(name)
            group.numels.append(p.numel())
        groups.append(group)
    return groups
