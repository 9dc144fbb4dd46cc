"""Gradient buckets: which tensors share one allreduce, and when backward makes each
gradient ready."""

from __future__ import annotations

from ..runtime.fusion import fusion_buckets
from .models import Model

__all__ = ["fuse", "ready_times"]


def fuse(model: Model, threshold: int, bytes_per_param: int) -> list[tuple[int, int, int]]:
    """Gradient buckets in the order backward fills them: ``(bytes, tensors, first)``.

    Tensors are taken in reverse layer order and packed into buckets of at most
    ``threshold`` bytes (a larger tensor gets a bucket of its own) by the rule the hooks
    of :class:`topoplan.torch.DistributedOptimizer` use, Horovod's tensor fusion
    (:func:`topoplan.runtime.fusion.fusion_buckets`); ``threshold == 0``: one bucket per
    tensor. Tensors of no bytes are left out. ``first`` is the forward index of the
    bucket's earliest layer, whose gradient completes it.
    """
    order = [i for i in range(len(model.tensors) - 1, -1, -1)
             if model.tensors[i].numel * bytes_per_param]
    sizes = [model.tensors[i].numel * bytes_per_param for i in order]
    return [(sum(sizes[k] for k in bucket), len(bucket), order[bucket[-1]])
            for bucket in fusion_buckets(sizes, threshold)]


def ready_times(model: Model, forward_s: float, backward_s: float) -> list[float]:
    """When each tensor's gradient is ready: backward walks the layers in reverse, each
    taking time in proportion to its multiply-accumulates (to its size if none has any)."""
    weights = [t.macs for t in model.tensors]
    if not any(weights):
        weights = [t.numel for t in model.tensors]
    total = float(sum(weights)) or 1.0
    ready = [0.0] * len(weights)
    done = 0.0
    for i in range(len(weights) - 1, -1, -1):
        done += weights[i]
        ready[i] = forward_s + backward_s * done / total
    return ready
