"""Tensor fusion's bucketing: which tensors share one flat buffer and so one collective.

Horovod's tensor fusion (Sergeev and Del Balso, arXiv:1802.05799): tensors are packed, in
the order given, into buckets of at most a threshold in bytes, so that one allreduce moves
many small tensors. :func:`fusion_buckets` is the rule alone, on sizes, without torch:
:func:`topoplan.torch.fusion.fuse` lays the trainer's buffers out with it, and
:func:`topoplan.estimate.fuse` the buckets a training iteration is estimated with.
"""

from __future__ import annotations

from typing import Hashable, Sequence

__all__ = ["fusion_buckets"]


def fusion_buckets(sizes: Sequence[int], threshold: int,
                   keys: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Pack tensors of ``sizes`` bytes, in order, into buckets of at most ``threshold`` bytes.

    Parameters
    ----------
    sizes : sequence of int
        Each tensor's bytes, in the order the tensors are packed.
    threshold : int
        The most bytes a bucket holds; a tensor larger than it gets a bucket of its own.
        0: one bucket per tensor.
    keys : sequence, optional
        Each tensor's kind (a dtype and device): a bucket holds tensors of one kind, and
        each kind fills one open bucket at a time, so buckets of different kinds
        interleave in the order their first tensor came. Default: one kind.

    Returns
    -------
    list of list of int
        The buckets, in the order their first tensor came, each the indices of its
        tensors in order.

    Notes
    -----
    O(len(sizes)). A tensor opens a new bucket when its kind has none open, when the
    threshold is 0, or when it would take the open one over the threshold.
    """
    buckets: list[list[int]] = []
    open_bucket: dict[Hashable, list[int]] = {}
    filled: dict[Hashable, int] = {}
    for i, nbytes in enumerate(sizes):
        key = None if keys is None else keys[i]
        bucket = open_bucket.get(key)
        if bucket is None or threshold == 0 or filled[key] + nbytes > threshold:
            bucket = open_bucket[key] = []
            filled[key] = 0
            buckets.append(bucket)
        bucket.append(i)
        filled[key] += nbytes
    return buckets
