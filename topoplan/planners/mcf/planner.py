"""The ``mcf`` planner: a portfolio of LP-shaped constructions, priced by a lock-step
cost model, the cheapest built and verified (:func:`plan_mcf`).

The constructions: the grids (:mod:`.grids`, in-box rings by :mod:`.rings`), the flat
rings in rank and topology order, the rails for a reduce-scatter or an allgather
(:mod:`.rails`), each pipelined over pieces (:mod:`.pieces`) and priced by
:mod:`.pricing`; and, where no grid applies, the tree packing (:mod:`.packing`).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ...cluster import Cluster
from ...analysis.cost import CostProfile
from ...errors import InfeasiblePlanError, PlannerError
from ...ir.passes import channelize, check_channels, check_skew, slices, vectorize
from ...ir.schedule import Schedule
from ...ir.collectives import DEFAULT as DEFAULT_COLLECTIVE
from .._checks import check_caps
from .._lockstep import empty_schedule
from .._order import topo_order
from ...ir.passes import channelize, check_channels, check_skew, slices
from ..channels import SKEW, check_caps_on_channels, per_channel
from ..request import PlanRequest
from .build import build, build_sharded
from .grids import flat_ring_layout, layouts
from .layout import RankGrid
from .messages import chunk_fractions, message_count, messages, shard_message_count, shard_messages
from .packing import FLAT_MAX, GOOD_STATUS, solve_mcf
from .pieces import choose_pieces, piece_sizes
from .pricing import CostModel, estimate, piece_profile
from .rails import rail_layouts
from .trees import choose_pipeline, materialize

__all__ = ["plan_mcf", "mcf_core", "default_ops"]

GRID_OPS = 4_400_000  # a one-piece grid may be this big (a flat ring at ~1024 ranks)
SOFT_OPS = 400_000  # pipelining op budget: keeps planning within ~1 s up to 64 GPUs
OPS_PER_RANK = 1000  # ... and above 400 ranks this many ops per rank (IR v2 ranges)
MAX_OPS = 6_900_000  # the default budget's cap (8192 GPUs: 6.5 M ops, 9 pieces; plan +
#                      verify under a minute, 2.9 GiB at peak)
SIM_OPS = 200_000  # the event simulator checks the best candidates, this many ops in all
CHANNEL_CHOICES = (1, 2, 4)  # what ``channels="auto"`` prices
LAYOUT_MESSAGES = 64  # above 256 ranks, layouts of more messages per rank are not priced


def _step_latency(cluster: Cluster) -> float:
    """A per-step latency estimate: the slowest route between the first and last ranks."""
    n = cluster.nranks
    graph = cluster.graph
    worst = 0.0
    for a, b in ((0, n - 1), (n - 1, 0), (0, min(1, n - 1))):
        for path in cluster.routes(a, b)[:2]:
            worst = max(worst, sum(graph[u][v]["latency"] for u, v in zip(path, path[1:])))
    return worst + 1e-6


# --------------------------------------------------------------------------------------
# The planner: a portfolio of LP-shaped constructions, picked by a lock-step cost model
# --------------------------------------------------------------------------------------

@dataclass
class _Candidate:
    """One construction considered by :func:`plan_mcf`."""

    name: str
    estimate_s: float
    nops: int
    make: Callable[[], Schedule]
    info: dict[str, Any] = field(default_factory=dict)
    channels: int = 1  # what it is priced on; ``nops`` counts them all


def _grid_candidate(cluster: Cluster, model: CostModel, layout: RankGrid, size: int,
                    chunks: int | None, max_ops: int, pieces: int | None = None,
                    profile: CostProfile | None = None, max_step_ops: int | None = None,
                    max_chunks: int | None = None,
                    collective: str = DEFAULT_COLLECTIVE,
                    shares: tuple[float, ...] | None = None,
                    vectored: bool = False) -> _Candidate | None:
    """A pipelined multi-level reduce-scatter/allgather on ``layout`` (see :mod:`.grids`),
    or for a sharded ``collective`` its one half; None when even one piece is over the
    op budget or a cap. ``shares``: priced on channels of these shares (its ops and
    caps are per channel); ``vectored``: with a step's messages to one peer one op."""
    n = cluster.nranks
    sharded = collective != DEFAULT_COLLECTIVE
    # One piece holds 2 ops per message; refuse layouts whose single piece is over budget
    # before generating anything (a flat ring: about 4 N ops per rank per piece).
    ops_per_piece = 2 * (shard_message_count(layout) if sharded else message_count(layout))
    if ops_per_piece > max(max_ops, GRID_OPS):
        return None
    msgs = shard_messages(layout, collective) if sharded else messages(layout)
    if max_chunks is not None and msgs.nchunks > max_chunks:
        return None
    loads, lat, soft = piece_profile(model, msgs, chunk_fractions(layout, np.ones(1)),
                                     profile, vectored)
    if max_step_ops is not None and soft.peak_ops(1) > max_step_ops:
        return None
    if pieces is not None:
        sizes, est = piece_sizes(loads, lat, pieces, size, soft, shares)
    elif chunks is not None:
        sizes, est = piece_sizes(loads, lat, max(1, chunks // max(1, msgs.nchunks)), size,
                                   soft, shares)
    else:
        sizes, est = choose_pieces(loads, lat, size, ops_per_piece,
                                     max(max_ops, ops_per_piece), soft=soft,
                                     max_step_ops=max_step_ops, chunks_per_piece=msgs.nchunks,
                                     max_chunks=max_chunks, shares=shares)
    q = len(sizes)

    def make() -> Schedule:
        if sharded:
            return build_sharded(n, msgs, layout, sizes, collective)
        return build(n, msgs, chunk_fractions(layout, sizes), q)

    info: dict[str, Any] = {}
    if shares is not None:
        info["one_channel_s"] = estimate(loads, lat, sizes, size, soft)
    return _Candidate(f"grid {layout.name}", est, ops_per_piece * q, make,
                      {**info, "layout": layout.name, "dims": list(layout.dims),
                       "rings": len(layout.grids), "pieces": q,
                       "piece_sizes": [round(float(x), 6) for x in sizes],
                       "peak_step_ops": soft.peak_ops(q)})


def _tree_candidate(cluster: Cluster, size: int, chunks: int | None, exact: bool | None,
                    time_limit: float, max_ops: int, flat_max: int,
                    profile: CostProfile | None = None, max_chunks: int | None = None
                    ) -> _Candidate:
    """The tree-packing LP (Blink/ForestColl style) pipelined over its trees.

    A step of the pipeline costs the slowest path's latency plus, under a profile, the
    step overhead, alpha and posting: about two ops per tree and direction at a rank
    (a child's partial sum up, the result down), ``4 x trees`` in all.
    """
    n = cluster.nranks
    sol = solve_mcf(cluster, exact=exact, flat_max=flat_max, time_limit=time_limit)
    lat = _step_latency(cluster)
    call = 0.0
    if profile is not None:
        network = len(cluster.boxes) > 1
        lat += profile.message_cost(network=network, ops=4 * len(sol.trees))
        call = profile.call_overhead
    if chunks is not None:
        q = max(1, int(chunks) // len(sol.trees))
    else:
        q = choose_pipeline(sol.trees, sol.fractions, sol.t * size, lat, max_ops, n)
    if max_chunks is not None:
        q = max(1, min(q, max_chunks // len(sol.trees)))
    span = max(t.span for t in sol.trees)
    est = sol.t * size * (q + span) / q + (q + span) * lat + call

    def make() -> Schedule:
        return materialize(n, sol.trees, sol.fractions, q)

    info = {"mode": sol.mode, "lp_time_s": sol.t * size, "trees": len(sol.trees), "pipeline": q,
            "span_steps": span, "columns": sol.columns, "pricing_rounds": sol.iterations,
            "status": sol.status, "bottleneck": sol.bottleneck}
    return _Candidate(f"trees {sol.mode}", est, 4 * len(sol.trees) * (n - 1) * q, make, info)


def _to_simulate(cands: list[_Candidate], best_est: float, pick: _Candidate
                 ) -> list[_Candidate]:
    """The candidates the event simulator checks: those within 5% of the best estimate
    (and the plain ring), the pick and then the best estimates first, while their ops
    fit in :data:`SIM_OPS` in all; a candidate over what is left is passed over."""
    near = sorted((c for c in cands if c.estimate_s <= best_est * 1.05 or c.name == "grid ring"),
                  key=lambda c: (c is not pick, c.estimate_s))
    out: list[_Candidate] = []
    left = SIM_OPS
    for c in near:
        if c.nops <= left:
            out.append(c)
            left -= c.nops
        elif c is pick:
            return []  # the pick itself is too big to simulate: the estimates decide
    return out


def _check_connected(cluster: Cluster) -> None:
    """InfeasiblePlanError naming the cut when some GPUs cannot reach the others.

    The cut is the set of nodes GPU 0 reaches (or that reach it): no link with
    bandwidth leaves (enters) it, so no allreduce can finish.
    """
    import networkx as nx
    graph = cluster.graph
    live = nx.DiGraph((u, v) for u, v, bw in graph.edges(data="bandwidth") if bw and bw > 0)
    live.add_nodes_from(graph.nodes)
    gpus = [cluster.gpu_node(r) for r in range(cluster.nranks)]
    for side, reach in (("leaves", nx.descendants(live, gpus[0])),
                        ("enters", nx.ancestors(live, gpus[0]))):
        reach = reach | {gpus[0]}
        if any(g not in reach for g in gpus):
            inside = [g for g in gpus if g in reach]
            outside = [g for g in gpus if g not in reach]
            raise InfeasiblePlanError(
                f"cluster {cluster.name!r} is disconnected: no link {side} the cut of "
                f"{len(inside)} GPUs ({', '.join(inside[:6])}{', ...' if len(inside) > 6 else ''}"
                f"; {len(reach)} nodes) toward {', '.join(outside[:6])}; add a NIC, fabric or "
                "switch link across it")


def plan_mcf(cluster: Cluster, *, size: int = 256 << 20, chunks: int | None = None,
             profile: CostProfile | str | None = None, max_step_ops: int | None = None,
             max_chunks: int | None = None, exact: bool | None = None,
             time_limit: float = 20.0, max_ops: int | None = None,
             flat_max: int = FLAT_MAX, check: bool = True,
             collective: str = DEFAULT_COLLECTIVE, channels: int | str = 1,
             channel_skew: float = SKEW, vectored: bool = False) -> Schedule:
    """Plan an allreduce (or a reduce-scatter or an allgather) near the cut lower bound:
    LP-shaped, pipelined, verified.

    Constructions (each a reduce-scatter + allgather in which every data shard is
    reduced along an in-tree into one root and broadcast back along the same tree,
    one root per final chunk, as in ForestColl):

    - *grid*: levels in-box -> boxes under a switch -> switch groups, a ring
      reduce-scatter per level (BlueConnect); the in-box rings are Hamiltonian
      cycles of the NVLink mesh weighted by an LP (on a DGX-1: 6 rings at 85.7
      GB/s); ``Q`` pipeline pieces one step apart, their sizes set by a second LP
      that keeps the narrow links busy in every step (small first and last pieces
      shorten the pipeline fill);
    - *flat ring* in topology order (DDL's A->B->C->D);
    - *trees*: the tree-packing LP (Blink; column generation with MST pricing, a
      MILP for fewest trees in exact mode, hierarchical composition above
      ``flat_max`` ranks), used where the grid does not apply (boxes that differ).

    Each is priced by a lock-step model (every step lasts as long as its busiest
    link, plus its worst path latency) and the cheapest is built.

    On ``channels`` channels (IR v4) the grids are priced as
    :func:`~topoplan.ir.passes.channelize` will run them: each channel the
    lock-step pipeline on its slice of the buffer, on its own clock, the channels
    sharing the links (:func:`.pricing.channel_time`), so that the pipeline depth is
    chosen for channels that hide each other's step latency. The pick is built,
    verified on one channel, and cut over the channels.

    A reduce-scatter is the grid's (or ring's) first half and an allgather its second
    half: every rank owns one final chunk per ring and pipeline piece, ``1/N`` of the
    buffer in all, and the chunks are numbered so that each rank's own make its shard
    (docs/SCHEDULE.md). A segment a rank hands on then holds one op per shard it spans
    (about ``N`` ops per rank per piece and ring, against ``sum_d (b_d - 1)`` for the
    allreduce's chunk ranges). The trees construction is not offered for them: its
    reduce-and-broadcast trees have no sharded half (boxes that differ get the rings).

    Under the runtime's cost profile a step also pays its alpha, the step overhead,
    the posting of its ops at the busiest rank and the adds of its reducing recvs.
    Rings and pipeline pieces load more links but cost ops and steps, so the profile
    sets how many: on a DGX-1 at 256 MiB under ``nccl``, the 4 rings that reach the
    LP optimum and one piece.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (sets the pipeline depth: latency vs fill).
    chunks : int, optional
        Chunk budget: pipeline pieces are ``chunks // chunks_per_piece`` (at least 1).
    profile : CostProfile or str, optional
        The runtime's costs (default ``nccl``, :data:`topoplan.analysis.cost.DEFAULT_PROFILE`).
    max_step_ops : int, optional
        Cap on the ops any rank posts in one step (constructions and pipeline depths
        over it are skipped).
    max_chunks : int, optional
        Cap on the plan's chunks.
    exact : bool, optional
        Exact mode of the tree LP (MILP over the generated trees). Default: on up to
        16 ranks, for the trees construction.
    time_limit : float
        Seconds for the solvers; on expiry the best plan found is used,
        ``meta["status"]`` says so and a ``RuntimeWarning`` is issued.
    max_ops : int, optional
        Op budget for pipelining (more pieces cost ops: materializing and verifying
        take a few us per op). Default: 400 k, or 1000 per rank above 400 ranks, at most
        6.9 M. A construction whose single piece needs more is still built up to 4.4 M.
    flat_max : int
        Above this many ranks the tree LP is solved hierarchically.
    check : bool
        Run :func:`topoplan.verify` on the result.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan (:mod:`topoplan.ir.collectives`); ``size`` is the full buffer. The
        sharded ones are within 1.05x of :func:`topoplan.analysis.bound.shard_bound` at 256 MiB
        on every shipped topology (scripts/bench_planners.py --collective).
    channels : int or "auto"
        Channels to run the plan on (default 1). ``chunks``, ``max_ops`` and the caps
        are the result's: each channel gets ``1 / channels`` of them. The trees
        construction is priced on one channel (channels never make a plan slower).
        ``"auto"``: every construction is priced on each of :data:`CHANNEL_CHOICES`
        channels and the least estimate wins (within 1%, the fewest ops);
        ``meta["channel_candidates"]`` gives each count's best estimate. More channels
        hide step latency but split the op budget, so fewer pipeline pieces fit; above
        400 ranks the default budget is 1000 ops a rank on each channel (up to 6.9 M in
        all).
    channel_skew : float
        The ratio of one channel's slice to the next one's
        (:data:`~topoplan.planners.channels.SKEW`).
    vectored : bool
        Merge each step's messages from one rank to one peer into one vectored message
        (IR v4, :func:`topoplan.ir.passes.vectorize`, after the channels), and price
        the constructions so: a reduce-scatter or allgather then posts one op per peer
        and step, not one per shard, and its rounds and pipeline are chosen for that.

    Returns
    -------
    Schedule
        ``meta``: algorithm "mcf", ``construction`` (what was picked), ``estimate_s``
        (lock-step time; on channels, the channel model's), ``candidates``
        (construction -> estimate), pieces, status, and solve / materialize / verify
        seconds; on channels also ``channels``, ``channel_skew`` and
        ``estimate_one_channel_s`` (the pick's lock-step time on one channel).

    Raises
    ------
    PlannerError
        A size that is not a positive number of bytes, a cap that is not an integer
        >= 1, ``channels`` not 1 to 32 or "auto", a skew out of [1, 16], or ``vectored``
        not a bool.
    InfeasiblePlanError
        GPUs with no route between them (names the cut), or no construction within the
        caps.

    References
    ----------
    M. Cho et al., BlueConnect, SysML 2019; G. Wang et al., Blink, MLSys 2020;
    L. Zhao et al., ForestColl, arXiv 2402.06787; P. Patarasuk and X. Yuan, 2009.
    LP sizes: ring LP, (box links) x (Hamiltonian cycles, <= 10000); piece LP,
    (steps x distinct link loads) x (pieces + steps).
    """
    request = PlanRequest.make(cluster, size=size, profile=profile, collective=collective,
                               max_step_ops=max_step_ops, max_chunks=max_chunks, who="mcf")
    if channels != "auto":
        check_channels(channels)
    channel_skew = check_skew(channel_skew)
    if not isinstance(vectored, bool):
        raise PlannerError(f"mcf: vectored must be True or False, got {vectored!r}")
    return mcf_core(request, chunks=chunks, exact=exact, time_limit=time_limit,
                    max_ops=max_ops, flat_max=flat_max, check=check, channels=channels,
                    channel_skew=channel_skew, vectored=vectored)


def default_ops(nranks: int, channels: int = 1) -> int:
    """mcf's default op budget, over all channels: :data:`SOFT_OPS`, or above 400 ranks
    :data:`OPS_PER_RANK` a rank on each channel, at most :data:`MAX_OPS` in all. Split
    over channels, a channel would fit too few pieces to gain (1024 GPUs under ``nccl``:
    3 channels fit 4 pieces, 1.115x the latency-aware bound, against 1.06x on 4
    channels at 1000 ops a rank each)."""
    per_rank = OPS_PER_RANK * nranks
    if per_rank <= SOFT_OPS:
        return SOFT_OPS
    return min(per_rank * channels, MAX_OPS)


def mcf_core(request: PlanRequest, *, chunks: int | None = None, exact: bool | None = None,
             time_limit: float = 20.0, max_ops: int | None = None,
             flat_max: int = FLAT_MAX, check: bool = True, channels: int | str = 1,
             channel_skew: float = SKEW, vectored: bool = False) -> Schedule:
    """:func:`plan_mcf` on a validated request (``channels``, ``channel_skew`` and
    ``vectored`` checked by the caller)."""
    size, collective, costs = request.size, request.collective, request.profile
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    sharded = collective != DEFAULT_COLLECTIVE
    cluster = request.runtime  # NVLink as the profile's runtime moves data
    counts = CHANNEL_CHOICES if channels == "auto" else (int(channels),)
    result_caps = (max_step_ops, max_chunks)
    n = cluster.nranks
    default_budget = max_ops is None
    if max_ops is None:
        max_ops = default_ops(n)
    start = time.perf_counter()
    if n == 1:
        if sharded:
            return empty_schedule(cluster, "mcf", collective=collective, construction="none",
                                  profile=costs.name)
        return materialize(1, [], np.ones(1), 1, algorithm="mcf", cluster=cluster.name,
                           construction="none", profile=costs.name)
    _check_connected(cluster)
    model = CostModel(cluster)
    cands: list[_Candidate] = []
    status = "optimal"
    grids = layouts(cluster)
    if n > 256:
        # Pricing a layout costs a pass over its messages and a route per new pair:
        # skip those with over 64 messages per rank (a ring of all boxes, ~2 N).
        small = [g for g in grids if message_count(g) <= LAYOUT_MESSAGES * n]
        grids = small or grids
    seen: set[bytes] = set()
    unique = []
    for g in grids:  # equal rank grids (boxes already in switch order) once
        key = (b"".join(x.tobytes() for x in g.grids) + np.asarray(g.dims).tobytes()
               + np.asarray(g.direct, dtype=bool).tobytes())
        if key not in seen:
            seen.add(key)
            unique.append(g)
    grids = unique
    if n <= 256 or not grids:
        order = topo_order(cluster)
        grids.append(flat_ring_layout(order, "ring-topo"))
    if sharded:
        grids += rail_layouts(cluster, model, costs, size, vectored)
    failure: InfeasiblePlanError | None = None
    for nch in counts:
        # Each chunk and op is ``nch`` of them once cut: plan one channel to 1/C.
        shares = slices(nch, channel_skew) if nch > 1 else None
        caps = {"max_step_ops": per_channel(max_step_ops, nch),
                "max_chunks": per_channel(max_chunks, nch)}
        budget = max(1, (default_ops(n, nch) if default_budget else max_ops) // nch)
        found: list[_Candidate] = []
        if n <= 256:
            # The plain ring (rank order, one piece), so that mcf is never behind it.
            try:
                cand = _grid_candidate(cluster, model, flat_ring_layout(list(range(n)), "ring"),
                                       size, None, budget, pieces=1, profile=costs,
                                       collective=collective, shares=shares,
                                       vectored=vectored, **caps)
                if cand is not None:
                    found.append(cand)
            except InfeasiblePlanError as exc:
                failure = exc
        for layout in grids:
            try:
                cand = _grid_candidate(cluster, model, layout, size, per_channel(chunks, nch),
                                       budget, profile=costs, collective=collective,
                                       shares=shares, vectored=vectored, **caps)
            except InfeasiblePlanError as exc:  # e.g. a ring across rails that never meet
                failure = exc
                continue
            if cand is not None:
                found.append(cand)
        if not sharded and not any(c.name.startswith("grid")
                                   and c.name not in ("grid ring", "grid ring-topo")
                                   for c in found):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # reported below, once
                tree = _tree_candidate(cluster, size, per_channel(chunks, nch), exact,
                                       time_limit, budget, flat_max, profile=costs,
                                       max_chunks=caps["max_chunks"])
            found.append(tree)
            if tree.info["status"] not in GOOD_STATUS:
                status = tree.info["status"]
        for cand in found:
            cand.channels, cand.nops = nch, cand.nops * nch
        cands += found
    if not cands:
        if failure is not None:
            raise failure
        caps_text = ", ".join(f"{k}={v}" for k, v in zip(("max_step_ops", "max_chunks"),
                                                         result_caps) if v is not None)
        raise InfeasiblePlanError(f"mcf {collective} on {cluster.name!r}: no construction fits "
                                  f"in {max_ops} "
                                  f"ops{' and ' + caps_text if caps_text else ''}")
    best_est = min(c.estimate_s for c in cands)
    # Within 1% of the best, a schedule of at most half the ops wins (faster to build,
    # verify and replay); else the best estimate.
    near = [c for c in cands if c.estimate_s <= best_est * 1.01]
    best = min(near, key=lambda c: c.estimate_s)
    smaller = [c for c in near if c.nops <= best.nops // 2]
    pick = min(smaller, key=lambda c: c.nops) if smaller else best
    solved = time.perf_counter()
    schedule = pick.make()
    mat_s = time.perf_counter() - solved
    # The lock-step model ignores that ranks drift apart and that flows share a link
    # fairly, not in the proportions that would end them together (a direct level whose
    # NIC carries both switch-local messages and messages throttled by a trunk: 1.003x
    # the bound priced, 1.075x simulated on two_leaf_oversubscribed). So the event
    # simulator has the last word among the candidates near the best, the best
    # estimates first, as many as :data:`SIM_OPS` ops hold. The plain ring takes part
    # where it fits, so that mcf is never behind it where it is cheap to check (the
    # lock-step model can misjudge trees by more than 5%).
    close = _to_simulate(cands, best_est, pick)

    def label(c: _Candidate) -> str:
        return c.name if len(counts) == 1 else f"{c.name} on {c.channels} channels"

    if len(close) > 1:
        from ...analysis.sim import simulate
        timed = []
        # Ties go to fewer ops, then to the earlier candidate in ``close`` (the pick,
        # then the better estimates), never to anything that differs between processes:
        # every rank that plans for itself must pick the same schedule.
        for k, c in enumerate(close):
            sched = schedule if c is pick else c.make()
            cut = channelize(sched, c.channels, channel_skew)
            if vectored:
                cut = vectorize(cut)
            # on the cluster as written, measured against the request's yardsticks
            yardsticks = request.yardsticks if request.machine is None else None
            timed.append((simulate(request.cluster, cut, size, profile=costs,
                                   yardsticks=yardsticks).time_s, c.nops, k, c, sched))
        _, _, _, pick, schedule = min(timed, key=lambda t: t[:3])
        pick.info["simulated_s"] = {label(c): t for t, _, _, c, _ in timed}
    if max_step_ops is not None or max_chunks is not None:  # trees: checked once built
        check_caps(schedule, per_channel(max_step_ops, pick.channels),
                   per_channel(max_chunks, pick.channels), "mcf")
    verify_s = 0.0
    if check:
        from ...ir.verify import verify
        v0 = time.perf_counter()
        verify(schedule.with_meta(algorithm="mcf"))
        verify_s = time.perf_counter() - v0
    meta = {
        "algorithm": "mcf", "cluster": cluster.name, "construction": pick.name,
        "profile": costs.name, "estimate_s": pick.estimate_s,
        "candidates": {label(c): c.estimate_s for c in cands},
        **{k: v for k, v in pick.info.items() if k != "one_channel_s"},
        "status": status,
        "solve_s": round(solved - start, 4), "materialize_s": round(mat_s, 4),
        "verify_s": round(verify_s, 4), "verified": check,
        "plan_s": round(time.perf_counter() - start - verify_s, 4),
    }
    if status not in GOOD_STATUS:
        meta["time_limit_hit"] = True
        warnings.warn(f"mcf on {cluster.name}: {status}; using the best plan found",
                      RuntimeWarning, stacklevel=2)
    if len(counts) > 1:
        meta["channels"] = pick.channels
        meta["channel_candidates"] = {
            str(nch): min((c.estimate_s for c in cands if c.channels == nch), default=None)
            for nch in counts}
    if pick.channels > 1:
        meta["estimate_one_channel_s"] = pick.info.get("one_channel_s", pick.estimate_s)
        schedule = check_caps_on_channels(channelize(schedule, pick.channels, channel_skew),
                                          pick.channels, *result_caps)
    if vectored:
        meta["vectored"] = True
        schedule = vectorize(schedule)
    return schedule.with_meta(**meta)
