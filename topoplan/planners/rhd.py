"""Recursive halving-doubling (Rabenseifner): reduce-scatter by recursive halving,
allgather by recursive doubling; non-powers of two fold the extra ranks first."""

from __future__ import annotations

from typing import Sequence

from ..cluster import Cluster
from ..schedule import Schedule, equal_chunks
from ._common import Timeline, check_chunks, check_size, empty_schedule, no_gc, resolve_order

__all__ = ["plan_rhd"]


@no_gc
def plan_rhd(cluster: Cluster, *, size: int, chunks: int | None = None,
             order: str | Sequence[int] = "topo") -> Schedule:
    """Plan Rabenseifner's recursive halving-doubling allreduce.

    With ``p`` the largest power of two <= ``n`` and ``r = n - p``: the first ``2r``
    ranks of ``order`` pair up and the first of each pair folds its whole buffer into
    the second (1 step); the ``p`` survivors reduce-scatter by recursive halving
    (step ``i`` exchanges half of the current range with the partner at distance
    ``2^i``, nearest first, so the biggest exchanges stay inside boxes) and allgather
    by recursive doubling in reverse; the folded ranks get the result back (1 step).

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (checked).
    chunks : int, optional
        Slices (pipelining): slice ``s`` of every segment runs the same schedule
        ``s`` slots later, so near (in-box) exchanges of one slice overlap far ones
        of the previous. Default 1.
    order : {"topo", "rank"} or sequence of int
        Virtual-rank order; ``"topo"`` makes distance-1 partners NVLink/box neighbours.

    Returns
    -------
    Schedule
        ``p * chunks`` chunks; ``log2 p`` steps per phase (+1 fold and +1 unfold step
        when ``n`` is not a power of two); a survivor sends ``(p - 1) / p`` of the
        buffer per phase.

    Raises
    ------
    PlannerError
        For a bad ``size``, ``chunks`` or ``order``.

    References
    ----------
    R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of collective communication
    operations in MPICH", IJHPCA 19(1), 2005; R. Rabenseifner, "Optimization of
    collective reduction operations", ICCS 2004.

    Notes
    -----
    ``4 p (p - 1) chunks + 4 r p chunks`` ops.
    """
    check_size(size, "rhd")
    slices = check_chunks(chunks, "rhd", "slices")
    ranks, label = resolve_order(cluster, order, "rhd")
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, "rhd", order=label, slices=1, power_of_two=1, folded=[])
    p = 1 << (n.bit_length() - 1)
    r = n - p
    slices = slices or 1  # no default slicing: see the docstring of plan_ring
    levels = p.bit_length() - 1
    # Survivor v is ranks[2v + 1] for v < r (it absorbed ranks[2v]), then ranks[v + r].
    folded = [(ranks[2 * v], ranks[2 * v + 1]) for v in range(r)]
    survivors = [ranks[2 * v + 1] for v in range(r)] + list(ranks[2 * r:])
    tl = Timeline(n)
    fold = 1 if r else 0
    for s in range(slices):
        every = [seg * slices + s for seg in range(p)]  # slice s of each segment
        t0 = s
        for extra, partner in folded:
            tl.msgs(t0, extra, partner, every, True)
        t = t0 + fold
        # Reduce-scatter: v keeps [lo, hi) of the segments; step i halves it with v ^ 2^i.
        lo = [0] * p
        hi = [p] * p
        for i in range(levels):
            bit = 1 << i
            new = []
            for v in range(p):
                mid = (lo[v] + hi[v]) // 2
                keep_low = not (v & bit)
                give = range(mid, hi[v]) if keep_low else range(lo[v], mid)
                tl.msgs(t, survivors[v], survivors[v ^ bit], [every[g] for g in give], True)
                new.append((lo[v], mid) if keep_low else (mid, hi[v]))
            lo = [a for a, _ in new]
            hi = [b for _, b in new]
            t += 1
        # Allgather: undo the halvings in reverse, each step doubling v's range.
        for i in reversed(range(levels)):
            bit = 1 << i
            for v in range(p):
                tl.msgs(t, survivors[v], survivors[v ^ bit],
                        [every[g] for g in range(lo[v], hi[v])], False)
            for v in range(p):
                partner = v ^ bit
                if v < partner:
                    lo[v] = lo[partner] = min(lo[v], lo[partner])
                    hi[v] = hi[partner] = max(hi[v], hi[partner])
            t += 1
        for extra, partner in folded:
            tl.msgs(t, partner, extra, every, False)
    return tl.build(equal_chunks(p * slices), algorithm="rhd", cluster=cluster.name, order=label,
                    slices=slices, power_of_two=p,
                    folded=[[a, b] for a, b in folded])
