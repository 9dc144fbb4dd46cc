"""Relayout: fusion buffers laid out again in the order backward produced the gradients.

With overlap, :class:`~topoplan.torch.DistributedOptimizer` lays its buffers out in
reverse parameter order, the order backward produces gradients in when a model registers
its layers in forward order, and starts each buffer as soon as its last gradient is in.
A model that registers its layers out of forward order would start its first buffer only
when its last gradient came; so after the first step the optimizer lays the buffers out
in the order backward really made the gradients, as DDP rebuilds its buckets. The ranks
must agree on the layout: each allreduces a fingerprint of the order it saw (one small
call, once), and on any difference all keep the layout they share.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .fusion import FusionGroup

__all__ = ["backward_order"]


def _fingerprint(order: list[str], position: dict[str, int]) -> torch.Tensor:
    """Two sums over ``order``, a permutation of ``position``'s names, that tell
    permutations apart: sum(w * i) and sum(w * i^2), with ``i`` a name's position in the
    current layout and ``w`` its place in ``order``."""
    weight = torch.arange(1, len(order) + 1, dtype=torch.float64)  # place in the order
    index = torch.tensor([position[name] for name in order], dtype=torch.float64)
    return torch.stack([(weight * index).sum(), (weight * index * index).sum()])


def backward_order(groups: list[FusionGroup], made: list[str],
                   allreduce: Callable[[torch.Tensor], Any], world_size: int
                   ) -> list[tuple[str, torch.nn.Parameter]] | None:
    """The parameters in the order backward made their gradients, or None to keep ``groups``.

    Parameters
    ----------
    groups : list of FusionGroup
        The current layout, the same on every rank.
    made : list of str
        Parameter names in the order their gradients arrived in the first step; names
        of unused parameters are missing and go last, in layout order.
    allreduce : callable
        Sums the fingerprint across ranks in place; every rank must call this function
        with more than one group, or none may.
    world_size : int
        Ranks the allreduce spans.

    Returns
    -------
    list of (str, Parameter) or None
        None where there is one group (no order to fix), where the ranks saw different
        orders, or where the current layout already starts every buffer the moment it
        is full (a buffer is full when its last gradient arrives).
    """
    if len(groups) < 2:
        return None  # (one buffer: no order to fix; the same on every rank)
    current = [(name, p) for g in groups for name, p in zip(g.names, g.params)]
    position = {name: i for i, (name, _) in enumerate(current)}
    order = list(dict.fromkeys(made))
    arrived = {name: i for i, name in enumerate(order)}
    order += [name for name, _ in current if name not in arrived]  # unused ones last
    mine = _fingerprint(order, position)
    total = mine.clone()
    allreduce(total)
    if not torch.equal(total, mine * world_size):
        return None  # ranks saw different orders: keep the layout they share
    # A buffer is full when its last gradient arrives (never, with an unused one):
    # in index order, every buffer starts the moment it is full; keep that layout.
    full = [max(arrived.get(name, math.inf) for name in g.names) for g in groups]
    if all(a <= b for a, b in zip(full, full[1:])):
        return None
    by_name = dict(current)
    return [(name, by_name[name]) for name in order]
