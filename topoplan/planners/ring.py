"""Ring allreduce: reduce-scatter then allgather around one ring of all ranks; either
phase alone is a ring reduce-scatter or a ring allgather. On a cluster with rails, the
topology-aware order (``ring-topo``) runs one ring per rail, as NCCL's channels do."""

from __future__ import annotations

from typing import Any, Sequence

from ..cluster import Cluster
from ..cluster.rails import MAX_RING_OPS
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule, equal_chunks
from ._checks import check_chunks
from ._lockstep import Timeline, empty_schedule, no_gc, ring_allgather, ring_reduce_scatter
from ._order import rail_rings, resolve_order
from ._pipeline_depth import fit_depth
from .request import PlanRequest

__all__ = ["plan_ring", "plan_ring_topo", "ring_core", "ring_topo_core", "ring_min_ops"]


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
        permutation of the ranks. ``"topo"`` on a cluster with rails (GPU ``j`` of
        every box on NIC ``j``, boxes on a fabric): one ring per rail
        (:func:`~topoplan.planners._order.rail_rings`), each on its own share of the
        buffer, all in the same steps, as NCCL runs a ring per channel and NIC; each
        crosses between boxes on its own rail, so the hops between boxes spread over
        every NIC instead of two. Fewer rings where a cap or
        :data:`~topoplan.cluster.rails.MAX_RING_OPS`
        allows fewer (``meta["order"]`` is ``"rails"``, ``meta["rings"]`` the rings).
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
        its successor; with ``R`` rail rings ``R`` times the chunks, each rank sending
        ``M / (n R)`` per step to its successor on each ring.

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
    request = PlanRequest.make(cluster, size=size, profile=profile, collective=collective,
                               max_step_ops=max_step_ops, max_chunks=max_chunks, who=algorithm)
    return ring_core(request, order=order, chunks=chunks, algorithm=algorithm)


@no_gc
def ring_core(request: PlanRequest, *, order: str | Sequence[int] = "rank",
              chunks: int | None = None, algorithm: str = "ring") -> Schedule:
    """:func:`plan_ring` on a validated request."""
    given = check_chunks(chunks, algorithm, "slices per ring segment")
    collective, costs = request.collective, request.profile
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    cluster = request.runtime  # NVLink as the profile's runtime moves data
    ring, label = resolve_order(cluster, order, algorithm)
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, algorithm, collective=collective, order=label, ring=ring,
                              slices=1, profile=costs.name)
    rings = [ring]
    if isinstance(order, str) and order == "topo":
        rails = _rail_rings(cluster, given or 1, max_step_ops, max_chunks)
        if len(rails) > 1:
            rings, label = rails, "rails"
    nrings = len(rings)

    def build(slices: int) -> Schedule:
        tl = Timeline(n)
        # Chunk (l * nrings + k) * slices + p is slice p of ring k's part of segment l: a
        # segment's parts stay contiguous, so a rank's shard is one run of chunks.
        for k, each in enumerate(rings):
            # Ring position l reduces and gathers segment owner[l]: for an allreduce any
            # segment will do (the l-th), for the sharded collectives its rank's own shard.
            owner = range(n) if collective == "allreduce" else each
            for p in range(slices):
                segments = [[(seg * nrings + k) * slices + p] for seg in owner]
                t = p
                if collective != "allgather":
                    t = ring_reduce_scatter(tl, t, each, segments)
                if collective != "reduce_scatter":
                    ring_allgather(tl, t, each, segments)
        meta: dict[str, Any] = {"order": label, "ring": rings[0], "slices": slices,
                                "profile": costs.name}
        if nrings > 1:
            meta["rings"] = rings
        return tl.build(equal_chunks(n * nrings * slices), collective=collective,
                        algorithm=algorithm, cluster=cluster.name, **meta)

    return fit_depth(build, given or 1, chosen=given is None, chunks_per_depth=n * nrings,
                     max_step_ops=max_step_ops, max_chunks=max_chunks, algorithm=algorithm)


def ring_min_ops(request: PlanRequest) -> int:
    """Fewest ops a ring plan of ``request`` holds, without planning it: every rank posts
    a send and a recv in each of a ring's ``n - 1`` steps per phase (``4 n (n - 1)`` for
    an allreduce), more with slices or rail rings."""
    n = request.cluster.nranks
    return (2 if request.collective == "allreduce" else 1) * 2 * n * (n - 1)


def _rail_rings(cluster: Cluster, slices: int, max_step_ops: int | None,
                max_chunks: int | None) -> list[list[int]]:
    """The rail rings (:func:`rail_rings`) the caps leave room for: each ring adds ``n``
    chunks per slice, 2 ops per step and its ops to
    :data:`~topoplan.cluster.rails.MAX_RING_OPS`."""
    rails = rail_rings(cluster)
    n = cluster.nranks
    most = len(rails)
    if max_chunks is not None:
        most = min(most, max_chunks // (n * slices))
    if max_step_ops is not None:
        most = min(most, max_step_ops // (2 * slices))
    most = min(most, MAX_RING_OPS // (4 * n * (n - 1) * slices))
    return rails[:most] if most > 1 else []


def plan_ring_topo(cluster: Cluster, *, size: int, chunks: int | None = None,
                   order: str | Sequence[int] = "topo", profile: CostProfile | str | None = None,
                   max_step_ops: int | None = None, max_chunks: int | None = None,
                   collective: str = "allreduce") -> Schedule:
    """:func:`plan_ring` with the topology-aware order (the ``"ring-topo"`` candidate)."""
    return plan_ring(cluster, size=size, order=order, chunks=chunks, algorithm="ring-topo",
                     profile=profile, max_step_ops=max_step_ops, max_chunks=max_chunks,
                     collective=collective)


def ring_topo_core(request: PlanRequest, *, chunks: int | None = None,
                   order: str | Sequence[int] = "topo") -> Schedule:
    """:func:`plan_ring_topo` on a validated request."""
    return ring_core(request, order=order, chunks=chunks, algorithm="ring-topo")
