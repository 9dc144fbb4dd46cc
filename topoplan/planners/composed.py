"""The ``composed`` planner: native collectives inside the boxes, a planned exchange across
them (PowerAI DDL's design).

Inside a box the transport's own library is at its strongest (NCCL: fused kernels, many
channels, NVLS reduction in the NVSwitch); across the fabric its rings and trees follow
the rank order and one NIC per channel, where a plan can follow the topology. A composed
schedule therefore runs, on every rank:

1. a **native step inside its box**: a ``reduce_scatter`` over the box's GPUs (variant
   ``scatter``: every GPU of a box then owns a part of the box's sum, and every NIC
   carries its GPU's part) or a ``reduce`` to one GPU (variant ``root``: one GPU a box
   crosses the fabric with the whole buffer; fewer, larger messages, for single-NIC
   boxes and small sizes);
2. a **planned exchange across the boxes** among the owners of each part (one GPU per
   box): an allreduce of the part, planned by the point-to-point planners (``mcf``,
   ``hierarchical``, ``ring-topo``, ...) on the *box-level cluster*, the cluster's
   switches and links with one GPU a box, whose NICs carry that part's share of the
   box's NICs and whose switch links carry its share of theirs (every part crosses
   them at once). So oversubscribed uplinks, rails (GPU ``j``'s part leaves through NIC
   ``j``) and spines are respected, and the boxes are ordered by the topology, not by
   rank (NCCL's ring crosses an uplink once per box pair out of order; the plan does
   not). Planners that weigh links (``mcf``'s tree packing) give boxes with less NIC
   bandwidth a smaller share of the reduction;
3. a **native step inside its box** that undoes the first: an ``allgather`` (or a
   ``broadcast`` from the root).

Boxes of different GPU counts split the buffer into ``L = lcm`` of the counts units:
GPU ``i`` of a box of ``g`` owns units ``i L / g .. (i + 1) L / g - 1``, so every native
reduce-scatter cuts its range into equal parts and every unit has one owner per box;
the per-unit share of a box's NICs is its NIC bandwidth over ``L`` (a box with fewer
NICs per unit gets a narrower box-level NIC, and the planner a reason to load it less).

Reduce-scatter and allgather (FSDP) follow the same shape. A reduce-scatter (variant
``scatter``, boxes of equal GPU counts) runs one native reduce-scatter per box ``b'``
over the range of ``b'``'s shards, which leaves GPU ``j`` of every box with its box's sum
of the shards of the GPUs ``j`` of all boxes, then a planned reduce-scatter across the
boxes among the GPUs ``j`` (the rail); an allgather runs it backwards. Variant ``root``
reduces the whole buffer to one GPU a box, reduce-scatters the boxes' ranges among the
roots and hands each GPU its shard from the root (an allgather: the reverse, ending in a
native broadcast); it takes boxes of any sizes.

Pipelining. A native op stands alone in its step (docs/SCHEDULE.md), and the ranks of
a box all take part in their box's native op, so no rank can overlap an in-box step
with a fabric step: the overlap comes from pipelining the cross-box exchange, which the
chosen planner does at the part's size (``mcf``'s pieces, ``hierarchical``'s parts).
The in-box phases stay one native op each: cutting them into pieces would pay the
library's launch latency per piece and overlap nothing.

The variant and the cross-box planner are chosen by an estimate: the in-box native
steps priced as the simulator prices them under the profile
(:func:`topoplan.analysis.native.price.native_price`: NCCL's own collective over the
box under ``nccl``), plus the simulated time of the cross-box plan on the box-level
cluster (``meta["estimate_s"]``, ``meta["variants"]``; within 1% of the simulated time
of the whole plan on the target clusters). ``auto`` then prices the whole schedule like
every other candidate, or ranks it by this estimate when it is too big to simulate.

References
----------
M. Cho, U. Finkler, M. Serrano, D. Kung, H. Hunter, "BlueConnect: Decomposing all-reduce
for deep learning on heterogeneous network hierarchy", IBM J. Res. Dev. 63(6), 2019
(PowerAI DDL). M. Cho, "Efficient Communication Library for Large-Scale Deep Learning",
GTC 2018.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ..analysis.cost import CostProfile
from ..cluster import Cluster
from ..cluster.model import Box, SwitchLink
from ..errors import InfeasiblePlanError, PlannerError, ScheduleError
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE, collective_of, shard_chunks
from ..ir.schedule import Native, OpKind, RankProgram, Schedule, native_op
from ._checks import check_caps
from ._lockstep import empty_schedule, no_gc, schedule_from_arrays
from .native import native_schedule
from .request import PlanRequest

__all__ = ["plan_composed", "VARIANTS", "INNER", "MAX_UNITS", "SUB_SIM_OPS", "box_level_cluster",
           "root_of"]

#: The variants: where a box's data goes before it crosses the fabric.
VARIANTS = ("scatter", "root")
#: The planners the cross-box exchange is chosen among (those that plan the collective).
INNER = ("mcf", "hierarchical", "ring-topo", "ring", "rhd", "tree")
#: Most units (the lcm of the box sizes) variant ``scatter`` cuts the buffer into.
MAX_UNITS = 64
#: Cross-box plans with more ops are ranked by their planner's estimate, not simulated
#: (``mcf``'s 45 k-op plan for the 128 boxes of leaf_spine_1024 takes 100 s to simulate
#: and its estimate is within 1% of that).
SUB_SIM_OPS = 20_000


# --------------------------------------------------------------------------------------
# The box-level cluster
# --------------------------------------------------------------------------------------

def _nics_of(box: Box, local: int) -> list[int]:
    """The NICs GPU ``local`` of ``box`` sends through: those that serve it, else (it
    hops to a GPU that has one) all of the box's NICs."""
    direct = [k for k, nic in enumerate(box.nics) if local in nic.gpus]
    return direct or list(range(len(box.nics)))


def root_of(box: Box) -> int:
    """The GPU of ``box`` that carries its data across in variant ``root``: the one with
    the most NIC bandwidth of its own (the first such)."""
    served = [sum(nic.bandwidth for nic in box.nics if local in nic.gpus)
              for local in range(box.gpus)]
    return max(range(box.gpus), key=lambda local: (served[local], -local))


def box_level_cluster(cluster: Cluster, owners: Sequence[int], units: int | None) -> Cluster:
    """``cluster`` with one GPU a box, the GPU ``owners[b]`` of box ``b``, for a
    cross-box exchange that runs ``units`` times at once (one per part), or once
    between the owners alone (``units=None``).

    Each box keeps the NICs its owner sends through and their switches. With
    ``units``, their bandwidth is the box's share for one unit (all its NIC bandwidth
    over ``units``, in proportion to the owner's NICs: every GPU of the box sends its
    units at once) and every switch link carries ``1 / units`` of its bandwidth;
    without, the owner's NICs and the links keep theirs. A box without NICs keeps none
    (it cannot take part: the planners say so).
    """
    boxes = []
    for b, (box, local) in enumerate(zip(cluster.boxes, owners)):
        used = _nics_of(box, local)
        own = sum(box.nics[k].bandwidth for k in used)
        total = sum(nic.bandwidth for nic in box.nics)
        scale = 1.0 if units is None else total / units / own if own > 0 else 0.0
        nics = tuple(replace(box.nics[k], bandwidth=box.nics[k].bandwidth * scale, gpus=(0,))
                     for k in used)
        boxes.append(Box(name=box.name, gpus=1, first_rank=b, nics=nics,
                         template=box.template, gpu=box.gpu))
    share = 1 if units is None else units
    links = tuple(SwitchLink(link.a, link.b, link.bandwidth / share, link.latency)
                  for link in cluster.links)
    return Cluster(name=f"{cluster.name} (boxes)", boxes=tuple(boxes),
                   switches=cluster.switches, links=links, source=cluster.source,
                   sharp=cluster.sharp)


# --------------------------------------------------------------------------------------
# The cross-box plan and its copies
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cross:
    """The cross-box exchange: a plan on the box-level cluster and its simulated time."""

    planner: str
    schedule: Schedule
    time_s: float


def _cross_plan(sub: Cluster, size: int, collective: str, profile: CostProfile,
                inner: Sequence[str], max_step_ops: int | None,
                max_chunks: int | None, copies: int = 1) -> _Cross:
    """The fastest of ``inner`` for ``collective`` of ``size`` bytes on the box-level
    cluster ``sub``: simulated there, or for plans of more than :data:`SUB_SIM_OPS` ops
    by their planner's own estimate (``mcf``'s lock-step model, within 1% of the
    simulation on the shipped topologies' box-level clusters; plans without one are
    dropped). InfeasiblePlanError when none plans it. Inside a plan request's pipeline,
    a cross-box plan already made for the request (the box-level cluster is the
    cluster itself when every box has one GPU) is taken as it is
    (:func:`~topoplan.planners.comparison.shared`)."""
    from .comparison import price, too_big
    from .registry import planners_for

    names = planners_for(collective, inner)
    if not names:
        raise PlannerError(f"composed: none of the cross-box planners {', '.join(inner)} "
                           f"plans {collective}")
    request = PlanRequest.make(sub, size=max(1, size), collective=collective,
                               profile=profile, max_step_ops=max_step_ops,
                               max_chunks=max_chunks, who="composed")
    left_out: dict[str, str] = {}
    found = []
    for name in names:
        why = too_big(request, name, SUB_SIM_OPS)  # dropped below anyway: do not build it
        if why is not None:
            left_out[name] = why
            continue
        try:
            found.append(price(request, name, {}, max_sim_ops=SUB_SIM_OPS))
        except InfeasiblePlanError as exc:
            left_out[name] = str(exc)
    if not found:
        share = (f" (max_chunks over its {copies} copies: {max_chunks} each)"
                 if copies > 1 and max_chunks is not None else "")
        raise InfeasiblePlanError(f"composed: no planner could plan the cross-box exchange"
                                  f"{share}: " + "; ".join(left_out.values()))
    rows = [row for row in found if math.isfinite(row.time_s)]
    if not rows:
        raise InfeasiblePlanError(f"composed: no cross-box planner of {', '.join(names)} "
                                  f"gave a plan it could price on {sub.name!r}")
    best = min(rows, key=lambda row: row.time_s)
    assert best.schedule is not None
    return _Cross(best.name, best.schedule, best.time_s)


def _op_arrays(schedule: Schedule) -> tuple[np.ndarray, ...]:
    """Every point-to-point op of ``schedule`` as arrays (rank, step, peer, chunk, count,
    code: 0 send, 1 recv, 2 recv and reduce)."""
    for r, s, op in schedule.ops():
        if not isinstance(op, Native) and op.more:
            raise ScheduleError(f"{schedule.algorithm} schedule: rank {r} step {s}: "
                                f"{op.kind.value} of {op.chunk_text()} with rank {op.peer} is "
                                "a vectored message (IR v4), which the composed planner "
                                "does not read yet")
    rows = [(r, s, op.peer, op.chunk, op.count,
             0 if op.kind is OpKind.SEND else 1 + op.reduce)
            for r, s, op in schedule.ops() if not isinstance(op, Native)]
    if not rows:
        return tuple(np.zeros(0, np.int64) for _ in range(6))
    table = np.array(rows, dtype=np.int64)
    return tuple(table[:, i] for i in range(6))


def _copies(ops: tuple[np.ndarray, ...], ranks: np.ndarray,
            chunks: np.ndarray) -> tuple[np.ndarray, ...]:
    """The ops of ``C`` copies of a box-level plan: copy ``c`` runs box-level rank ``b``'s
    program on rank ``ranks[c, b]`` and its chunk ``k`` is chunk ``chunks[c, k]`` of the
    schedule (``-1``: the copy has no such chunk, and its ops on it are dropped).

    A box-level op on a chunk range becomes one op per run of the range that every copy
    maps to consecutive chunks, so a message stays one message wherever it can.
    """
    rank, step, peer, chunk, count, code = ops
    ncopies, nchunks = chunks.shape
    if not len(rank):
        return tuple(np.zeros(0, np.int64) for _ in range(6))
    # Where a run of box-level chunks must end: after k when some copy does not map
    # k + 1 right after k (or maps one of them and not the other).
    a, b = chunks[:, :-1], chunks[:, 1:]
    joined = ((a >= 0) & (b == a + 1)) | ((a < 0) & (b < 0))
    ends = ~joined.all(axis=0)
    segment = np.concatenate([[0], np.cumsum(ends)]).astype(np.int64)
    lo = np.flatnonzero(np.concatenate([[True], ends]))
    hi = np.concatenate([lo[1:] - 1, [nchunks - 1]])
    s0, s1 = segment[chunk], segment[chunk + count - 1]
    pieces = s1 - s0 + 1
    which = np.repeat(np.arange(len(rank)), pieces)
    seg = np.repeat(s0, pieces) + (np.arange(int(pieces.sum()))
                                   - np.repeat(np.cumsum(pieces) - pieces, pieces))
    first = np.maximum(chunk[which], lo[seg])
    last = np.minimum(chunk[which] + count[which] - 1, hi[seg])
    full = chunks[:, first]  # (copies, pieces)
    keep = full >= 0
    c_idx = np.broadcast_to(np.arange(ncopies)[:, None], full.shape)[keep]
    w = np.broadcast_to(which[None, :], full.shape)[keep]
    return (ranks[c_idx, rank[w]], step[w], ranks[c_idx, peer[w]], full[keep],
            np.broadcast_to((last - first + 1)[None, :], full.shape)[keep], code[w])


def _check_lockstep(schedule: Schedule, planner: str) -> None:
    """Copies that share a rank are merged step by step, which pairs their messages
    right only if every message of the box-level plan is sent and received in the same
    lock-step slot (every planner here builds them so)."""
    from ..ir.matching import match_messages

    found = match_messages(schedule)
    slot_s = found.step_local[found.t_sstep]  # the steps as written in the programs
    slot_r = found.step_local[found.t_rstep]
    pairs = np.stack([found.t_src, found.t_dst, slot_s], axis=1)
    if len(pairs):
        order = np.lexsort((slot_r, pairs[:, 2], pairs[:, 1], pairs[:, 0]))
        p, r = pairs[order], slot_r[order]
        same = (p[1:] == p[:-1]).all(axis=1)
        if np.any(same & (r[1:] != r[:-1])):
            raise InfeasiblePlanError(f"composed: the cross-box {planner} plan is not "
                                      "lock-step; its copies cannot share ranks")


# --------------------------------------------------------------------------------------
# Pricing the in-box native steps (to choose a variant)
# --------------------------------------------------------------------------------------

class _Natives:
    """What the in-box native steps cost under ``profile``
    (:func:`topoplan.analysis.native.price.native_price`, as the simulator prices them:
    NCCL's own collective over the box under ``nccl``, the measured one under a
    calibrated profile, a ring on the links under ``ideal``), priced once per kind of
    box, op and size."""

    def __init__(self, cluster: Cluster, profile: CostProfile) -> None:
        self.cluster, self.profile = cluster, profile
        self._seen: dict[tuple, float] = {}

    def seconds(self, box: Box, kind: str, nbytes: float) -> float:
        """Seconds of a native ``kind`` over the GPUs of ``box`` on ``nbytes`` bytes
        (its whole range)."""
        from ..analysis.native.price import native_price

        if box.gpus < 2 or nbytes <= 0:
            return 0.0
        key = (box.signature(), kind, int(nbytes))
        if key not in self._seen:
            self._seen[key] = float(native_price(self.cluster, kind, tuple(box.ranks),
                                                 max(1, int(nbytes)), self.profile).time_s)
        return self._seen[key]


# --------------------------------------------------------------------------------------
# The variants
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    """One variant's schedule and its estimate."""

    variant: str
    schedule: Schedule
    estimate_s: float
    detail: dict[str, Any]


def _shards(schedule: Schedule) -> list[tuple[int, int]]:
    return list(collective_of(schedule).shards)


def _shard_map(cluster: Cluster, sub: Schedule, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """The chunks of a reduce-scatter (allgather) whose box-level plan is ``sub``: chunk
    ``k`` of box-level shard ``b'`` becomes, for ``j < g(b')``, chunk ``k`` of the shard
    of GPU ``j`` of box ``b'``; shards in rank order, each as many chunks as its
    box-level shard. Returns the map (``pieces x K``, ``-1`` past a box's GPUs) and the
    fractions of the schedule's chunks (a box-level chunk's fraction times ``B / N``)."""
    boxes = cluster.boxes
    nb, n = len(boxes), cluster.nranks
    shards = _shards(sub)
    sizes = [e - s for s, e in shards]
    start = np.concatenate([[0], np.cumsum([sizes[b] for b, box in enumerate(boxes)
                                            for _ in range(box.gpus)])]).astype(np.int64)
    nchunks = int(start[-1])
    cmap = np.full((pieces, sub.nchunks), -1, dtype=np.int64)
    fractions = np.empty(nchunks)
    f = np.asarray(sub.chunks, dtype=float) * nb / n
    for b, (box, (s, e)) in enumerate(zip(boxes, shards)):
        for j in range(min(pieces, box.gpus)):
            r = box.first_rank + j
            cmap[j, s:e] = start[r] + np.arange(e - s)
            fractions[start[r]:start[r + 1]] = f[s:e]
    return cmap, fractions


def _assemble(cluster: Cluster, arrays: tuple[np.ndarray, ...], fractions: np.ndarray,
              before: dict[int, list[Native]], after: dict[int, list[Native]],
              collective: str, **meta: Any) -> Schedule:
    """The schedule of the point-to-point ``arrays``, with each rank's native steps
    ``before`` and ``after`` them."""
    rank, step, peer, chunk, count, code = arrays
    body = schedule_from_arrays(cluster.nranks, rank, step, peer, chunk, code,
                                fractions.tolist(), count=count, collective=collective,
                                **meta)
    programs = tuple(RankProgram(r, tuple((op,) for op in before.get(r, ()))
                                 + p.steps + tuple((op,) for op in after.get(r, ())))
                     for r, p in enumerate(body.ranks))
    return replace(body, ranks=programs)


def _allreduce_scatter(cluster: Cluster, size: int, profile: CostProfile,
                       inner: Sequence[str], caps: dict[str, int | None],
                       natives: _Natives) -> _Plan:
    boxes = cluster.boxes
    units = math.lcm(*(box.gpus for box in boxes))
    if units > MAX_UNITS:
        raise InfeasiblePlanError(f"composed: variant scatter cuts the buffer into the lcm "
                                  f"of the box sizes, {units} units, over {MAX_UNITS}")
    per = [units // box.gpus for box in boxes]
    owners = [0] * len(boxes)  # unit 0's owner in every box
    sub = box_level_cluster(cluster, owners, units)
    cap_chunks = caps["max_chunks"]
    cross = _cross_plan(sub, size // units, "allreduce", profile, inner,
                        caps["max_step_ops"], None if cap_chunks is None
                        else max(1, cap_chunks // units), units)
    k = cross.schedule.nchunks
    ranks = np.array([[box.first_rank + u // p for box, p in zip(boxes, per)]
                      for u in range(units)], dtype=np.int64)
    if any(p > 1 for p in per):
        _check_lockstep(cross.schedule, cross.planner)
    chunks = np.arange(units * k, dtype=np.int64).reshape(units, k)
    fractions = np.tile(np.asarray(cross.schedule.chunks, dtype=float) / units, units)
    arrays = _copies(_op_arrays(cross.schedule), ranks, chunks)
    before: dict[int, list[Native]] = {}
    after: dict[int, list[Native]] = {}
    inbox = 0.0
    for box in boxes:
        if box.gpus > 1:
            group = tuple(box.ranks)
            for r in group:
                before[r] = [native_op("reduce_scatter", group, 0, units * k)]
                after[r] = [native_op("allgather", group, 0, units * k)]
            inbox = max(inbox, natives.seconds(box, "reduce_scatter", size)
                        + natives.seconds(box, "allgather", size))
    schedule = _assemble(cluster, arrays, fractions, before, after, "allreduce")
    return _Plan("scatter", schedule, inbox + cross.time_s,
                 {"units": units, "cross": cross.planner, "cross_s": cross.time_s,
                  "inbox_s": inbox, "cross_chunks": k})


def _allreduce_root(cluster: Cluster, size: int, profile: CostProfile,
                    inner: Sequence[str], caps: dict[str, int | None],
                    natives: _Natives) -> _Plan:
    boxes = cluster.boxes
    roots = [root_of(box) for box in boxes]
    sub = box_level_cluster(cluster, roots, None)
    cross = _cross_plan(sub, size, "allreduce", profile, inner, caps["max_step_ops"],
                        caps["max_chunks"])
    k = cross.schedule.nchunks
    ranks = np.array([[box.first_rank + root for box, root in zip(boxes, roots)]],
                     dtype=np.int64)
    arrays = _copies(_op_arrays(cross.schedule), ranks, np.arange(k, dtype=np.int64)[None])
    before: dict[int, list[Native]] = {}
    after: dict[int, list[Native]] = {}
    inbox = 0.0
    for box, root in zip(boxes, roots):
        if box.gpus > 1:
            group = tuple(box.ranks)
            for r in group:
                before[r] = [native_op("reduce", group, 0, k, root=box.first_rank + root)]
                after[r] = [native_op("broadcast", group, 0, k, root=box.first_rank + root)]
            inbox = max(inbox, natives.seconds(box, "reduce", size)
                        + natives.seconds(box, "broadcast", size))
    schedule = _assemble(cluster, arrays, np.asarray(cross.schedule.chunks, dtype=float),
                         before, after, "allreduce")
    return _Plan("root", schedule, inbox + cross.time_s,
                 {"root_gpus": sorted(set(roots)), "cross": cross.planner, "cross_s": cross.time_s,
                  "inbox_s": inbox, "cross_chunks": k})


def _sharded(cluster: Cluster, size: int, collective: str, variant: str,
             profile: CostProfile, inner: Sequence[str],
             caps: dict[str, int | None], natives: _Natives) -> _Plan:
    """A reduce-scatter or an allgather, variant ``scatter`` or ``root``."""
    boxes = cluster.boxes
    nb, n = len(boxes), cluster.nranks
    gmax = max(box.gpus for box in boxes)
    if variant == "scatter":
        if any(box.gpus != gmax for box in boxes):
            sizes = sorted({box.gpus for box in boxes})
            raise InfeasiblePlanError(f"composed: variant scatter of a {collective} needs "
                                      f"boxes of one GPU count, got {sizes}; variant root "
                                      "takes any")
        owners = [0] * nb
        sub = box_level_cluster(cluster, owners, gmax)
        sub_size = size // gmax
        ranks = np.array([[box.first_rank + j for box in boxes] for j in range(gmax)],
                         dtype=np.int64)
    else:
        owners = [root_of(box) for box in boxes]
        sub = box_level_cluster(cluster, owners, None)
        sub_size = size
        ranks = np.array([[box.first_rank + root for box, root in zip(boxes, owners)]] * gmax,
                         dtype=np.int64)
    cap_chunks = caps["max_chunks"]
    cross = _cross_plan(sub, sub_size, collective, profile, inner, caps["max_step_ops"],
                        None if cap_chunks is None else max(1, cap_chunks // gmax), gmax)
    cmap, fractions = _shard_map(cluster, cross.schedule, gmax)
    if variant == "root" and gmax > 1:
        _check_lockstep(cross.schedule, cross.planner)
    arrays = _copies(_op_arrays(cross.schedule), ranks, cmap)
    # Where each rank's shard lies in the schedule's chunks.
    shard = shard_chunks(n, fractions.tolist(), collective)
    before: dict[int, list[Native]] = {}
    after: dict[int, list[Native]] = {}
    extra: list[tuple[int, int, int, int, int, int]] = []  # in-box sends and recvs
    inbox = 0.0
    last = int(arrays[1].max()) + 1 if len(arrays[1]) else 0
    for b, box in enumerate(boxes):
        if box.gpus < 2:
            continue
        group = tuple(box.ranks)
        if variant == "scatter":
            # One native op per box b' over b''s shards: part j is GPU j of b''s shard.
            ops = [native_op(collective, group, shard[other.first_rank][0],
                          shard[other.first_rank + other.gpus - 1][1]
                          - shard[other.first_rank][0]) for other in boxes]
            for r in group:
                (before if collective == "reduce_scatter" else after)[r] = list(ops)
            kind = collective
            inbox = max(inbox, sum(natives.seconds(box, kind, size * other.gpus / n)
                                   for other in boxes))
        else:
            root = box.first_rank + owners[b]
            total = shard[-1][1]
            kind = "reduce" if collective == "reduce_scatter" else "broadcast"
            op = native_op(kind, group, 0, total, root=root)
            for r in group:
                (before if collective == "reduce_scatter" else after)[r] = [op]
            # The root hands each GPU its shard (reduce-scatter), or gathers them first.
            for r in group:
                if r == root:
                    continue
                a, e = shard[r]
                if collective == "reduce_scatter":
                    extra += [(root, last, r, a, e - a, 0), (r, last, root, a, e - a, 1)]
                else:
                    extra += [(r, -1, root, a, e - a, 0), (root, -1, r, a, e - a, 1)]
            inbox = max(inbox, natives.seconds(box, kind, size)
                        + (box.gpus - 1) * size / n / _in_box_bandwidth(box))
    if extra:
        table = np.array(extra, dtype=np.int64)
        arrays = tuple(np.concatenate([col, table[:, i]]) for i, col in enumerate(arrays))
    schedule = _assemble(cluster, arrays, fractions, before, after, collective)
    return _Plan(variant, schedule, inbox + cross.time_s,
                 {"cross": cross.planner, "cross_s": cross.time_s, "inbox_s": inbox,
                  "cross_chunks": cross.schedule.nchunks,
                  **({"root_gpus": sorted(set(owners))} if variant == "root" else {})})


def _in_box_bandwidth(box: Box) -> float:
    """What the root's link into its box moves per second (its fabric port, or its
    GPU links), for the gather and scatter of variant ``root``."""
    return max(box.in_box_bandwidth(), 1.0)


# --------------------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------------------

@no_gc
def plan_composed(cluster: Cluster, *, size: int = 256 << 20,
                  profile: CostProfile | str | None = None,
                  collective: str = DEFAULT_COLLECTIVE, max_step_ops: int | None = None,
                  max_chunks: int | None = None, variant: str | None = None,
                  inner: Sequence[str] | None = None) -> Schedule:
    """Plan ``collective`` as native steps inside the boxes around a planned exchange
    across them (see the module's notes).

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes of the full buffer (checked).
    profile : CostProfile or str, optional
        The runtime's costs the cross-box plans are planned against and simulated under
        (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`).
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan.
    max_step_ops, max_chunks : int, optional
        Plan-size caps, passed on to the cross-box planners (``max_chunks`` divided by
        the copies of the cross-box plan) and checked on the result.
    variant : {"scatter", "root"}, optional
        Force a variant; default: each is built and the one of the least estimate
        kept.
    inner : sequence of str, optional
        The planners the cross-box exchange is chosen among (default :data:`INNER`,
        those that plan ``collective``); none may itself hold native steps.

    Returns
    -------
    Schedule
        An IR v3 schedule (``meta["algorithm"] == "composed"``; ``meta["variant"]``,
        ``meta["cross"]``: the cross-box planner, ``meta["estimate_s"]``: the native
        steps as the profile prices them plus the cross-box plan's simulated time,
        ``meta["variants"]``: each variant's estimate or why it was left out). On one
        box: one native op over the box; on boxes of one GPU: the cross-box plan alone.

    Raises
    ------
    PlannerError
        For a bad ``size``, collective, cap, ``variant`` or ``inner``.
    InfeasiblePlanError
        When no variant can be planned (or the forced one cannot), or the plan breaks a
        cap, saying why.
    """
    request = PlanRequest.make(cluster, size=size, profile=profile, collective=collective,
                               max_step_ops=max_step_ops, max_chunks=max_chunks,
                               who="composed")
    return composed_core(request, variant=variant, inner=inner)


@no_gc
def composed_core(request: PlanRequest, *, variant: str | None = None,
                  inner: Sequence[str] | None = None) -> Schedule:
    """:func:`plan_composed` on a validated request."""
    if variant is not None and variant not in VARIANTS:
        raise PlannerError(f"composed: variant must be one of {', '.join(VARIANTS)} or None, "
                           f"got {variant!r}")
    inner = _check_inner(inner)
    # the cluster as written: the NCCL model counts NVLink itself, and the box-level
    # cluster's cross-box plans are planned on their own runtime cluster
    cluster, size, collective, costs = (request.cluster, request.size, request.collective,
                                        request.profile)
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    n, nb = cluster.nranks, len(cluster.boxes)
    base = {"cluster": cluster.name, "profile": costs.name}
    if n == 1:
        return empty_schedule(cluster, "composed", collective=collective, profile=costs.name)
    if nb == 1:
        schedule = native_schedule(n, collective, algorithm="composed", variant="one box",
                                   note="one box: the transport's own collective over it",
                                   **base)
        return check_caps(schedule, max_step_ops, max_chunks, "composed")
    caps = {"max_step_ops": max_step_ops, "max_chunks": max_chunks}
    names = VARIANTS if variant is None else (variant,)
    if all(box.gpus == 1 for box in cluster.boxes):
        names = names[:1]  # with one GPU a box both variants are the cross-box plan
    plans: list[_Plan] = []
    notes: dict[str, Any] = {}
    natives = _Natives(cluster, costs)
    last: InfeasiblePlanError | None = None
    for name in names:
        try:
            if collective == "allreduce":
                build = _allreduce_scatter if name == "scatter" else _allreduce_root
                found = build(cluster, size, costs, inner, caps, natives)
            else:
                found = _sharded(cluster, size, collective, name, costs, inner, caps,
                                 natives)
            check_caps(found.schedule, max_step_ops, max_chunks, "composed")
        except InfeasiblePlanError as exc:
            last = exc
            notes[name] = str(exc)
            continue
        plans.append(found)
        notes[name] = {"estimate_s": found.estimate_s, **found.detail}
    if not plans:
        assert last is not None
        raise last
    best = min(plans, key=lambda p: p.estimate_s)
    return best.schedule.with_meta(algorithm="composed", variant=best.variant,
                                   cross=best.detail["cross"], estimate_s=best.estimate_s,
                                   variants=notes, **base)


def _check_inner(inner: Sequence[str] | None) -> tuple[str, ...]:
    from .registry import SPECS, check_names

    if inner is None:
        return INNER
    if isinstance(inner, str) or not all(isinstance(name, str) for name in inner):
        raise PlannerError(f"composed: inner must be a list of planner names, got {inner!r}")
    if not inner:
        raise PlannerError("composed: inner: the list of cross-box planners is empty")
    try:
        check_names(inner)
    except PlannerError as exc:
        raise PlannerError(f"composed: inner: {exc}") from None
    bad = [name for name in inner if name in ("composed", "nccl")]
    if bad:
        usable = ", ".join(sorted(set(SPECS) - {"auto", "composed", "nccl"}))
        raise PlannerError(f"composed: inner: {bad[0]!r} plans native steps, which cannot "
                           f"be the cross-box exchange; usable: {usable}")
    return tuple(inner)

