"""Recursive halving-doubling (Rabenseifner): reduce-scatter by recursive halving,
allgather by recursive doubling; non-powers of two fold the extra ranks first. Either
phase alone (with the fold and unfold) is a reduce-scatter or an allgather."""

from __future__ import annotations

from typing import Sequence

from ..cluster import Cluster
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule, equal_chunks
from ._checks import check_chunks
from ._lockstep import Timeline, empty_schedule, no_gc
from ._order import resolve_order
from ._pipeline_depth import fit_depth
from .request import PlanRequest

__all__ = ["plan_rhd", "rhd_core", "rhd_min_ops"]


@no_gc
def plan_rhd(cluster: Cluster, *, size: int, chunks: int | None = None,
             order: str | Sequence[int] = "topo", profile: CostProfile | str | None = None,
             max_step_ops: int | None = None, max_chunks: int | None = None,
             collective: str = "allreduce") -> Schedule:
    """Plan Rabenseifner's recursive halving-doubling allreduce, or one of its phases.

    With ``p`` the largest power of two <= ``n`` and ``r = n - p``: the first ``2r``
    ranks of ``order`` pair up and the first of each pair folds its whole buffer into
    the second (1 step); the ``p`` survivors reduce-scatter by recursive halving
    (step ``i`` exchanges half of the current range with the partner at distance
    ``2^i``, nearest first, so the biggest exchanges stay inside boxes) and allgather
    by recursive doubling in reverse; the folded ranks get the result back (1 step).

    A reduce-scatter is the fold, the halving and an unfold that hands each folded rank
    its own shard; an allgather is a fold that hands each folded rank's shard to its
    partner, the doubling, and an unfold of the other shards. Their buffers hold one
    shard per rank (``n`` segments, not ``p``): survivor ``v`` ends the halving (starts
    the doubling) with the shards of its own rank and of the rank it absorbed.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (checked).
    chunks : int, optional
        Slices (pipelining): slice ``s`` of every segment runs the same schedule
        ``s`` slots later, so near (in-box) exchanges of one slice overlap far ones
        of the previous. Default 1 under every profile: rhd is the candidate with the
        fewest steps (``2 log2 p``), for messages where the per-step cost
        (:func:`~topoplan.planners._pipeline_depth.message_latency`) dominates, and each slice
        adds a step. Large messages can gain from slices where the levels use different
        links (simulated under nccl, 256 MiB on a DGX-1: 14.3 ms unsliced, 7.7 ms with 4
        slices), but no depth is chosen for them yet: ask with ``chunks``.
    order : {"topo", "rank"} or sequence of int
        Virtual-rank order; ``"topo"`` makes distance-1 partners NVLink/box neighbours.
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`); recorded in
        ``meta["profile"]``.
    max_step_ops : int, optional
        Most ops a rank may post in one step: 2 per slice in flight.
    max_chunks : int, optional
        Most chunks the plan may hold: ``p`` per slice (``n`` for a reduce-scatter or an
        allgather).
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan (:mod:`topoplan.ir.collectives`).

    Returns
    -------
    Schedule
        ``p * chunks`` chunks (``n * chunks`` for a reduce-scatter or an allgather, chunk
        ``r * chunks + s`` slice ``s`` of shard ``r``); ``log2 p`` steps per phase (+1
        fold and +1 unfold step when ``n`` is not a power of two); a survivor sends
        ``(p - 1) / p`` of the buffer per phase.

    Raises
    ------
    PlannerError
        For a bad ``size``, ``chunks``, ``order``, cap or collective.
    InfeasiblePlanError
        When the plan breaks ``max_step_ops`` or ``max_chunks`` (it needs ``p`` chunks
        and 2 ops a step at least), naming the cap.

    References
    ----------
    R. Thakur, R. Rabenseifner, W. Gropp, "Optimization of collective communication
    operations in MPICH", IJHPCA 19(1), 2005; R. Rabenseifner, "Optimization of
    collective reduction operations", ICCS 2004.

    Notes
    -----
    ``4 p (p - 1) chunks + 4 r p chunks`` ops.
    """
    request = PlanRequest.make(cluster, size=size, profile=profile, collective=collective,
                               max_step_ops=max_step_ops, max_chunks=max_chunks, who="rhd")
    return rhd_core(request, chunks=chunks, order=order)


def rhd_min_ops(request: PlanRequest) -> int:
    """Fewest ops an rhd plan of ``request`` holds, without planning it: each of the
    ``p`` ranks of the largest power of two in ``n`` posts a send and a recv in each of
    the ``log2 p`` steps of a phase (``4 p log2 p`` for an allreduce)."""
    n = request.cluster.nranks
    p = 1 << (n.bit_length() - 1)
    return (2 if request.collective == "allreduce" else 1) * 2 * p * (p.bit_length() - 1)


@no_gc
def rhd_core(request: PlanRequest, *, chunks: int | None = None,
             order: str | Sequence[int] = "topo") -> Schedule:
    """:func:`plan_rhd` on a validated request."""
    given = check_chunks(chunks, "rhd", "slices")
    costs, size, collective = request.profile, request.size, request.collective
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    cluster = request.runtime  # NVLink as the profile's runtime moves data
    ranks, label = resolve_order(cluster, order, "rhd")
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, "rhd", collective=collective, order=label, slices=1,
                              power_of_two=1, folded=[], profile=costs.name)
    p = 1 << (n.bit_length() - 1)
    r = n - p
    levels = p.bit_length() - 1
    # Survivor v is ranks[2v + 1] for v < r (it absorbed ranks[2v]), then ranks[v + r].
    folded = [(ranks[2 * v], ranks[2 * v + 1]) for v in range(r)]
    survivors = [ranks[2 * v + 1] for v in range(r)] + list(ranks[2 * r:])
    fold = 1 if r else 0
    reduces, gathers = collective != "allgather", collective != "reduce_scatter"
    if collective == "allreduce":
        nsegments = p
        shards: list[list[int]] = [[g] for g in range(p)]  # segment g: chunk g of a slice
    else:
        # The halving leaves survivor v with segment bitrev(v) (it keeps the low half at
        # step i when bit i of v is 0), so that segment holds the shards of v's ranks.
        nsegments = n
        absorbed = {partner: extra for extra, partner in folded}
        shards = [sorted({survivors[v], absorbed.get(survivors[v], survivors[v])})
                  for v in (int(format(g, f"0{levels}b")[::-1], 2) for g in range(p))]

    def build(slices: int) -> Schedule:
        tl = Timeline(n)
        for s in range(slices):
            # Segment g of slice s: chunk q * slices + s of each of its shards q.
            segments = [[q * slices + s for q in qs] for qs in shards]
            every = [q * slices + s for q in range(nsegments)]
            t = s
            for extra, partner in folded:  # the extras hand their data to their partners
                tl.msgs(t, extra, partner, every if reduces else [extra * slices + s], reduces)
            t += fold
            # Reduce-scatter: v keeps [lo, hi) of the segments; step i halves it with v ^ 2^i.
            lo = [0] * p
            hi = [p] * p
            for i in range(levels):
                bit = 1 << i
                new = []
                for v in range(p):
                    mid = (lo[v] + hi[v]) // 2
                    keep_low = not (v & bit)
                    if reduces:
                        give = range(mid, hi[v]) if keep_low else range(lo[v], mid)
                        tl.msgs(t, survivors[v], survivors[v ^ bit],
                                [k for g in give for k in segments[g]], True)
                    new.append((lo[v], mid) if keep_low else (mid, hi[v]))
                lo = [a for a, _ in new]
                hi = [b for _, b in new]
                t += reduces
            # Allgather: undo the halvings in reverse, each step doubling v's range.
            for i in reversed(range(levels) if gathers else ()):
                bit = 1 << i
                for v in range(p):
                    tl.msgs(t, survivors[v], survivors[v ^ bit],
                            [k for g in range(lo[v], hi[v]) for k in segments[g]], False)
                for v in range(p):
                    partner = v ^ bit
                    if v < partner:
                        lo[v] = lo[partner] = min(lo[v], lo[partner])
                        hi[v] = hi[partner] = max(hi[v], hi[partner])
                t += 1
            for extra, partner in folded:  # and get their results back
                own = extra * slices + s
                back = every if collective == "allreduce" else (
                    [own] if not gathers else [k for k in every if k != own])
                tl.msgs(t, partner, extra, back, False)
        return tl.build(equal_chunks(nsegments * slices), collective=collective,
                        algorithm="rhd", cluster=cluster.name, order=label, slices=slices,
                        power_of_two=p, profile=costs.name, folded=[[a, b] for a, b in folded])

    return fit_depth(build, given or 1, chosen=given is None, chunks_per_depth=nsegments,
                     max_step_ops=max_step_ops, max_chunks=max_chunks, algorithm="rhd")
