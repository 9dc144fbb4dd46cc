"""Ring allreduce: reduce-scatter then allgather around one ring of all ranks; either
phase alone is a ring reduce-scatter or a ring allgather."""

from __future__ import annotations

from typing import Any, Sequence

from ..cluster import Cluster
from ..analysis.native.clusters import runtime_cluster
from ..analysis.cost import CostProfile, get_profile
from ..ir.schedule import Schedule, equal_chunks
from ._checks import check_cap_args, check_chunks, check_collective, check_size
from ._lockstep import Timeline, empty_schedule, no_gc, ring_allgather, ring_reduce_scatter
from ._order import resolve_order
from ._pipeline_depth import fit_depth

__all__ = ["plan_ring", "plan_ring_topo"]


@no_gc
def plan_ring(cluster: Cluster, *, size: int, order: str | Sequence[int] = "rank",
              chunks: int | None = None, algorithm: str = "ring",
              profile: CostProfile | str | None = None, max_step_ops: int | None = None,
              max_chunks: int | None = None, collective: str = "allreduce") -> Schedule:
    """Plan a ring allreduce (reduce-scatter then allgather around one ring), or either
    phase alone: a ring reduce-scatter or a ring allgather.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (checked; the ring's shape does not depend on it).
    order : {"rank", "topo"} or sequence of int
        The ring: ranks in file order, a topology-aware order (:func:`topo_order`:
        a DFS over the switch tree, NVLink neighbours inside boxes, so the ring
        crosses every narrow cut the fewest times, DDL's A->B->C->D), or an explicit
        permutation of the ranks.
    chunks : int, optional
        Slices per ring segment (pipelining, as NCCL's slices): slice ``p`` runs its
        own ring ``p`` slots after slice 0. Default 1 under every profile: a ring step
        already moves ``M/n`` on every link, so ``c`` slices only add ``c - 1`` steps,
        each paying the per-step cost of :func:`~topoplan.planners._pipeline_depth.message_latency`
        (step overhead, posting ``2c`` ops instead of 2, alpha), and a step adds what it
        received after its messages (the simulator's and the executor's order), so
        slicing hides no reduction either.
    algorithm : str
        The name written to ``meta["algorithm"]``.
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`); recorded in
        ``meta["profile"]`` (the ring's shape does not depend on it, see ``chunks``).
    max_step_ops : int, optional
        Most ops a rank may post in one step: a ring posts 2 per slice in flight.
    max_chunks : int, optional
        Most chunks the plan may hold: ``n`` per slice.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan (:mod:`topoplan.ir.collectives`). A reduce-scatter is the allreduce's
        first phase, an allgather its second; both with chunk ``r * chunks + p``
        (slice ``p`` of shard ``r``) ending (reduce-scatter) or starting (allgather) on
        rank ``r``, whatever the ring's order.

    Returns
    -------
    Schedule
        ``n * chunks`` equal chunks, ``2 (n - 1) + chunks - 1`` steps per rank
        (``n - 1 + chunks - 1`` for one phase), each rank sending ``M / n`` per step to
        its successor.

    Raises
    ------
    PlannerError
        For a bad ``size``, ``chunks``, ``order``, cap or collective.
    InfeasiblePlanError
        When the plan breaks ``max_step_ops`` or ``max_chunks`` (a ring of ``n`` ranks
        needs ``n`` chunks and 2 ops a step at least), naming the cap.

    References
    ----------
    P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters
    of workstations", JPDC 69(2), 2009. M. Cho et al., "PowerAI DDL", arXiv 1708.02188.

    Notes
    -----
    ``4 n (n - 1) chunks`` ops: 4.2 M at 1024 ranks (every ring step moves another single
    chunk, so IR v2's chunk ranges do not shrink a flat ring).
    """
    size = check_size(size, algorithm)
    given = check_chunks(chunks, algorithm, "slices per ring segment")
    check_cap_args(max_step_ops, max_chunks, algorithm)
    collective = check_collective(collective, algorithm)
    costs = get_profile(profile)
    cluster = runtime_cluster(cluster, costs)  # NVLink as the profile's runtime moves data
    ring, label = resolve_order(cluster, order, algorithm)
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, algorithm, collective=collective, order=label, ring=ring,
                              slices=1, profile=costs.name)
    # Ring position l reduces and gathers segment owner[l]: for an allreduce any segment
    # will do (the l-th), for the sharded collectives it must be its rank's own shard.
    owner = range(n) if collective == "allreduce" else ring

    def build(slices: int) -> Schedule:
        tl = Timeline(n)
        # Chunk l * slices + p is slice p of segment l: a segment's slices stay contiguous.
        for p in range(slices):
            segments = [[seg * slices + p] for seg in owner]
            t = p
            if collective != "allgather":
                t = ring_reduce_scatter(tl, t, ring, segments)
            if collective != "reduce_scatter":
                ring_allgather(tl, t, ring, segments)
        meta: dict[str, Any] = {"order": label, "ring": ring, "slices": slices,
                                "profile": costs.name}
        return tl.build(equal_chunks(n * slices), collective=collective, algorithm=algorithm,
                        cluster=cluster.name, **meta)

    return fit_depth(build, given or 1, chosen=given is None, chunks_per_depth=n,
                     max_step_ops=max_step_ops, max_chunks=max_chunks, algorithm=algorithm)


def plan_ring_topo(cluster: Cluster, *, size: int, chunks: int | None = None,
                   order: str | Sequence[int] = "topo", profile: CostProfile | str | None = None,
                   max_step_ops: int | None = None, max_chunks: int | None = None,
                   collective: str = "allreduce") -> Schedule:
    """:func:`plan_ring` with the topology-aware order (the ``"ring-topo"`` candidate)."""
    return plan_ring(cluster, size=size, order=order, chunks=chunks, algorithm="ring-topo",
                     profile=profile, max_step_ops=max_step_ops, max_chunks=max_chunks,
                     collective=collective)
