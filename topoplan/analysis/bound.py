"""Bandwidth lower bounds for allreduce on any topology, and the cuts that set them.

(Reduce-scatter and allgather have one bound of their own, half the RS+AG cut bound
below: :func:`shard_bound`; :func:`collective_bound` picks a collective's.)

Two bounds, for ``M`` bytes per rank on ``N`` GPUs (latency not counted):

**The allreduce bound** (:func:`lower_bound`) holds for every allreduce schedule. Split
the GPUs into ``m`` groups, each a set ``P`` of graph nodes (nodes in no group are
allowed). Seen from the groups, every element must be summed over ``m`` inputs and the
sum delivered to all ``m``: an allreduce among ``m`` super-nodes, which needs at least
``2 (m - 1)`` messages per element between groups (the one-way gossip bound), and every
group must send at least one of them (its input must get out) and receive one. Each
such message leaves its group over an edge out of it and enters the other over an edge
into it, and group ``P`` sends at most ``B_out(P)`` and receives at most ``B_in(P)``
bytes/s, so

    T >= 2 (m - 1) M / sum over P of B_out(P)      (and the same with B_in)
    T >= M / B_out(P) and T >= M / B_in(P) for every group P.

**Hardware that reduces.** An NVSwitch with NVLS (``fabric.nvls``) or a SHARP switch
(``switches[].sharp``) sums and multicasts data itself. A partition that leaves such a
node outside every group keeps only the per-group terms (every group's input must get
out, and the result in): one message into the switch can carry the sum of several
groups, and one out of it can reach several. On one H100 box with NVLS that is
``M / B`` for a GPU's NVLink bandwidth ``B``, where point-to-point schedules need
``2 (N - 1) / N * M / B``.

Any partition gives a valid bound; :func:`partitions` tries the ones that bind on
real clusters (every GPU alone, every box, every level of the switch hierarchy, the
minimum 2-cut, and the reduce-scatter + allgather cut below) and the largest wins.

**The RS+AG cut bound** (:func:`rsag_bound`) holds for schedules that reduce-scatter
and then allgather, each phase over before the next (ring):

    T >= 2 * (M / N) * max_S |S ∩ GPUs| / B_out(S)

the maximum over node sets ``S`` that hold at least one GPU but not every GPU
(ForestColl, Zhao et al., arXiv 2402.06787, Theorem 1). We compute
``x* = min_S B_out(S) / |S ∩ GPUs|`` (bytes/s per GPU) with max-flow, never by
enumerating cuts, and return ``2 (M/N) / x*``. It is not a bound for schedules that
reduce inside a group before crossing a cut that holds more than half of the GPUs
(tree, rhd's fold): those move ``M``, not ``2 |S| M / N``, each way across it. Nor for
schedules that overlap one chunk's reduce-scatter with another's allgather across such a
cut (the bound adds the two phases' times; overlapped, they share the time, one in each
direction). Plans that do either run below it on unequal clusters (64 MiB, ``ideal``
profile: mcf on ``topologies/targets/unequal_nics.yaml``, hierarchical and rhd on
``unequal_gpus.yaml``). A ring moves
``2 (N - 1) M / N`` out of every such set and always meets it. Where every cut is
balanced the two bounds agree.
"""

from __future__ import annotations

from typing import Any

import functools
import math
import weakref
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, connected_components, maximum_flow

from .._util import ObjectCache
from ..cluster import Box, Cluster
from ..cluster.spec import check_cluster
from ..ir.collectives import get_collective
from ..units import as_bytes

__all__ = ["Cut", "Partition", "bottleneck", "best_partition", "partitions", "lower_bound",
           "rsag_bound", "shard_bound", "collective_bound", "latency_bound", "rounds_time", "sink_classes"]

# scipy's max-flow works on int32 capacities; the flow value must stay below 2**31.
_INT_SCALE = float(1 << 30)
_REL = 1e-12  # a new ratio must beat the current one by this much (float round-off)


@dataclass(frozen=True, slots=True)
class Cut:
    """A node set ``S`` of the topology graph and its load factor.

    Attributes
    ----------
    gpus : int
        ``|S ∩ GPUs|``.
    bandwidth : float
        ``B_out(S)``, bytes/s on the directed edges leaving ``S``.
    nodes : frozenset of str
        The graph nodes of ``S``.
    ratio : float
        ``gpus / bandwidth`` (seconds per byte per GPU); the lower bound is
        ``2 * (M / N) * ratio``. 0 for a one-GPU cluster (nothing to cross).
    behind : int
        The GPUs a user sees behind the cut: the smaller side, ``S`` or the rest (``S``
        on a tie). The cut that binds is mostly every box but one, whose ``gpus`` shards
        must all get into that one box: ``behind`` is then the box's GPUs.
    where : str
        Those GPUs by name: ``"box node3"``, ``"boxes A, B"``, ``"dgx1/gpu7"``.
    """

    gpus: int
    bandwidth: float
    nodes: frozenset[str]
    ratio: float
    behind: int = 0
    where: str = ""

    def __str__(self) -> str:
        """``8 GPUs (box node3) behind 200 GB/s``."""
        from ..units import format_bandwidth, plural
        where = f" ({self.where})" if self.where else ""
        return f"{plural(self.behind or self.gpus, 'GPU')}{where} behind " \
               f"{format_bandwidth(self.bandwidth)}"

    def crossing(self) -> str:
        """Whose data crosses the cut, and how fast per GPU: ``the other 24 GPUs' shards
        cross it at 8.333 GB/s each`` (the rate the RS+AG bound charges)."""
        from ..units import format_bandwidth
        whose = (f"the other {self.gpus} GPUs'" if self.behind and self.behind != self.gpus
                 else "their")
        return (f"{whose} shards cross it at {format_bandwidth(self.bandwidth / self.gpus)} "
                "each")


@dataclass(frozen=True, slots=True)
class Partition:
    """Groups of GPUs (node sets of the topology graph) and what leaves them.

    Attributes
    ----------
    name : str
        How the groups were formed: ``"every GPU"``, ``"boxes"``, ``"switch level 1"``,
        ``"minimum 2-cut"``, ``"RS+AG cut"``.
    groups : tuple of frozenset of str
        The graph nodes of each group (``m = len(groups)``).
    bandwidth : float
        ``sum over P of B_out(P)``, bytes/s on the directed edges leaving the groups.
    ratio : float
        Seconds per byte: the allreduce bound is ``M * ratio``, with ``ratio`` the
        largest of ``2 (m - 1) / sum B_out(P)``, ``2 (m - 1) / sum B_in(P)`` and
        ``1 / B_out(P)``, ``1 / B_in(P)`` for each group. 0 for a one-GPU cluster.
    """

    name: str
    groups: tuple[frozenset[str], ...]
    bandwidth: float
    ratio: float

    def __str__(self) -> str:
        from ..units import format_bandwidth
        return (f"{len(self.groups)} groups ({self.name}), "
                f"{format_bandwidth(self.bandwidth)} out of them in all")


def lower_bound(cluster: Cluster, size: float | str) -> float:
    """Seconds any allreduce of ``size`` bytes needs at least on ``cluster``.

    Parameters
    ----------
    cluster : Cluster
    size : float or str
        Bytes per rank (``M``), or a size such as ``"256MiB"``.

    Returns
    -------
    float
        ``2 (m - 1) M / sum over P of B_out(P)`` (or what one group can send or receive,
        see the module docstring) for the best partition of the GPUs into ``m`` groups
        that :func:`partitions` finds; 0 for a one-GPU cluster. On a
        single switch with N NICs of bandwidth B (every GPU alone) it is
        ``2 (N-1)/N * M / B`` (Patarasuk and Yuan, 2009), as the RS+AG bound. Latency
        is not counted. Valid for every schedule, whatever it reduces where.

    References
    ----------
    P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", J. Parallel Distrib. Comput. 69 (2009). The message count is the
    one-way gossip bound, 2n - 2 (S. Hedetniemi et al., "A survey of gossiping and
    broadcasting in communication networks", Networks 18, 1988).

    Raises
    ------
    ClusterSpecError
        For a cluster built in code with a bandwidth or latency beyond what topoplan
        computes with (:func:`topoplan.cluster.spec.check_cluster`).
    """
    check_cluster(cluster, "lower_bound")
    if cluster.nranks < 2:
        return 0.0
    return float(as_bytes(size)) * best_partition(cluster).ratio


def rsag_bound(cluster: Cluster, size: float | str) -> float:
    """Seconds a reduce-scatter + allgather allreduce of ``size`` bytes needs at least.

    Parameters
    ----------
    cluster : Cluster
    size : float or str
        Bytes per rank (``M``), or a size such as ``"256MiB"``.

    Returns
    -------
    float
        ``2 * (M / N) * max_S |S ∩ GPUs| / B_out(S)`` (:func:`bottleneck`); 0 for a
        one-GPU cluster. At least :func:`lower_bound`'s value where every cut is
        balanced; schedules that reduce before they cross an unbalanced cut can beat it.

    References
    ----------
    L. Zhao et al., "ForestColl: Efficient Collective Communications on Heterogeneous
    Network Fabrics", arXiv 2402.06787 (2024).
    """
    return 2.0 * shard_bound(cluster, size)


def shard_bound(cluster: Cluster, size: float | str) -> float:
    """Seconds any allgather or reduce-scatter of a ``size``-byte buffer needs at least.

    Parameters
    ----------
    cluster : Cluster
    size : float or str
        Bytes of the full buffer (``M``: an allgather's output, a reduce-scatter's
        input), ``M / N`` per shard; or a size such as ``"256MiB"``.

    Returns
    -------
    float
        ``(M / N) * max_S |S ∩ GPUs| / B_out(S)`` (:func:`bottleneck`); 0 for a one-GPU
        cluster. Half of :func:`rsag_bound`: an allreduce built of the two pays it twice.

    Notes
    -----
    ForestColl's allgather bound is ``(M / N) max_S |GPUs - S| / B_in(S)`` over node sets
    ``S`` holding at least one GPU and missing one: the shards of the GPUs outside ``S``
    must all enter it. With ``T`` the complement of ``S``, ``B_in(S) = B_out(T)`` and
    ``|GPUs - S| = |T ∩ GPUs|``: the ratio :func:`bottleneck` maximizes. A reduce-scatter
    must bring into every ``S`` one (pre-summed) value per shard of its GPUs:
    ``(M / N) |S ∩ GPUs| / B_in(S)``, the same ratio on the reversed graph, and the
    topology graph is symmetric (every link is full duplex,
    :mod:`topoplan.cluster.graph`), so both collectives share one bound. Unlike an
    allreduce, no schedule can beat it by reducing inside a group first.

    References
    ----------
    L. Zhao et al., "ForestColl: Efficient Collective Communications on Heterogeneous
    Network Fabrics", arXiv 2402.06787 (2024).

    Raises
    ------
    ClusterSpecError
        As :func:`lower_bound`.
    """
    check_cluster(cluster, "shard_bound")
    n = cluster.nranks
    if n < 2:
        return 0.0
    return (float(as_bytes(size)) / n) * bottleneck(cluster).ratio


def collective_bound(cluster: Cluster, size: float | str,
                     collective: str = "allreduce") -> float:
    """The bandwidth lower bound of ``collective`` over a ``size``-byte buffer.

    :func:`lower_bound` for an allreduce, :func:`shard_bound` for a reduce-scatter or
    an allgather (``size`` is the full buffer in every case, as nccl-tests counts it).

    Raises
    ------
    ScheduleError
        For an unknown collective, naming the known ones.
    """
    if get_collective(collective).sharded:
        return shard_bound(cluster, size)
    return lower_bound(cluster, size)


def latency_bound(cluster: Cluster, size: float | str, profile: Any = None,
                  collective: str = "allreduce") -> float:
    """A lower bound on a point-to-point schedule's time under a cost profile: the larger
    of a bandwidth term and a rounds term.

    - **Bandwidth**: :func:`collective_bound` on the links as the profile's runtime moves
      data on them (``nvlink: nccl``: NVLink at NCCL's per-link rate,
      :func:`topoplan.analysis.native.clusters.nccl_links`), plus ``call_overhead``, plus the
      fewest steps a schedule must pay beside its bytes: an allreduce reduces every chunk
      before it broadcasts it (a reduce-scatter step and an allgather step), a
      reduce-scatter or allgather one step, each posting a send and a receive and paying
      alpha (the network class when the cluster has several boxes). Exact for a
      two-rank exchange. A plan that pipelines several independent channels can hide
      the latency of one channel's step behind another's transfer, so this term is the
      bound's yardstick, not a proof: the rounds term below is one.
    - **Rounds**: ``call_overhead`` plus :func:`rounds_time`, the least time in which
      any rank can hold a contribution of every rank (every collective needs that: an
      allreduce's every rank, a reduce-scatter's every shard owner, an allgather's every
      rank). About ``ceil(log2 N)`` message latencies, fewer when a rank receives from
      several peers in a step and its posting costs allow it.

    Native collective steps (IR v3) are priced by their library's own model (NCCL's
    tuner latencies are not the profile's point-to-point alphas); they are bound by the
    bandwidth bound (:func:`collective_bound`) alone.

    Parameters
    ----------
    cluster : Cluster
    size : float or str
        Bytes of the full buffer, or a size such as ``"256MiB"``.
    profile : CostProfile or str, optional
        Default: :data:`topoplan.analysis.cost.DEFAULT_PROFILE`.
    collective : str
        ``"allreduce"`` (default), ``"reduce_scatter"`` or ``"allgather"``.
    """
    from .cost import get_profile
    costs = get_profile(profile)
    if cluster.nranks < 2:
        return 0.0
    network = len(cluster.boxes) > 1
    steps = 1 if get_collective(collective).sharded else 2
    links = cluster
    if costs.nvlink == "nccl":
        from .native.clusters import nccl_links
        links = nccl_links(cluster)
    bandwidth = (collective_bound(links, size, collective) + costs.call_overhead
                 + steps * costs.message_cost(network=network, ops=2))
    return max(bandwidth, costs.call_overhead + rounds_time(cluster, costs))


def rounds_time(cluster: Cluster, profile: Any = None) -> float:
    """The least time, after the call overhead, in which any rank of ``cluster`` can hold
    a contribution of every rank, in the simulator's step model under ``profile``.

    A rank that ends a step at time ``T`` holding ``n`` contributions received ``k``
    messages in it: its own value was read when the step started, at most
    ``T - sigma - max(k o, o + alpha)`` (it posts ``k`` receives, and the first message
    lands ``alpha`` after its post), and each sender's at its step's start, at most
    ``T - (sigma + o + alpha)``. So with ``f(t)`` the most contributions any rank can
    hold at ``t``, ``f(t) <= max over k of f(t - sigma - max(k o, o + alpha)) + k f(t -
    sigma - o - alpha)``, ``f = 1`` before any message can land; the least ``t`` with
    ``f(t) >= N`` bounds every schedule. ``alpha`` is the smallest the profile has for
    this cluster (the small-message one included; the network's alone when every box
    holds one GPU). With ``k = 1`` this is ``ceil(log2 N)`` rounds of ``sigma + o +
    alpha``; a rank that receives from several peers in a step trades posting time for
    fewer rounds. 0 under the ``ideal`` profile. O(T / o x T / alpha) states.

    Parameters
    ----------
    cluster : Cluster
    profile : CostProfile or str, optional
    """
    from .cost import get_profile
    costs = get_profile(profile)
    n = cluster.nranks
    if n < 2:
        return 0.0
    one_per_box = all(len(box.ranks) == 1 for box in cluster.boxes)
    alphas = [costs.alpha_network] if one_per_box else [costs.alpha_box, costs.alpha_network]
    if costs.small_max is not None:
        alphas += [costs.small_alpha_network] if one_per_box else [costs.small_alpha_box,
                                                                     costs.small_alpha_network]
    return _rounds(n, min(alphas), costs.step_overhead, costs.op_overhead)


@functools.lru_cache(maxsize=256)
def _rounds(n: int, alpha: float, sigma: float, o: float) -> float:
    """:func:`rounds_time` of ``n`` ranks with these costs."""
    hop = sigma + o + alpha                     # a sender's step start -> its message lands
    if hop <= 0:
        return 0.0
    # Time in quanta of hop / 256, each cost rounded down (a faster model: the result
    # stays a bound, at most 0.4% per round below the exact one).
    quantum = hop / 256
    h = 256
    ks = np.arange(1, n, dtype=np.int64)
    own = np.floor((sigma + np.maximum(ks * o, o + alpha)) / quantum + 1e-9).astype(np.int64)
    f = [1] * h                                 # f(t) for t < hop: nothing has landed
    i = h
    while True:
        usable = own <= i
        reach = np.asarray(f, dtype=np.int64)[i - own[usable]] + ks[usable] * f[i - h]
        best = int(min(n, max(1, int(reach.max(initial=1)))))
        if best >= n:
            return i * quantum
        f.append(best)
        i += 1


def bottleneck(cluster: Cluster) -> Cut:
    """The cut ``S`` maximizing ``|S ∩ GPUs| / B_out(S)``: what limits allreduce.

    Parameters
    ----------
    cluster : Cluster

    Returns
    -------
    Cut
        For a one-GPU cluster: ``Cut(gpus=1, bandwidth=inf, nodes={gpu}, ratio=0)``.

    Notes
    -----
    Dinkelbach's method on the ratio. For a trial ``x`` (bytes/s per GPU), the
    least ``B_out(S) - x |S ∩ GPUs|`` over sets ``S`` that miss GPU ``v`` is one minimum
    cut: add a source ``s`` with an edge ``s -> c`` of capacity ``x`` to every GPU ``c`` and
    cut ``s`` from ``v``; a cut with source side ``S + s`` costs ``B_out(S) + x (N - |S ∩ GPUs|)``.
    If it costs less than ``x N``, ``S`` has a ratio below ``x``: take that ratio as the
    new ``x`` and cut again; when no sink ``v`` finds a cheaper cut, ``x = x*``. Since
    ``x`` only falls, a sink that found nothing need not be tried again.

    Only one sink per *symmetry class* is cut (:func:`sink_classes`): two GPUs that an
    automorphism of the weighted graph swaps see the same minimum. The classes are
    built only from swaps we can prove are automorphisms, so the result is exact;
    anything not proven symmetric is its own class (the fallback is every GPU a sink).

    Capacities are scaled to integers for ``scipy.sparse.csgraph.maximum_flow``
    (int32; edges clipped at ``x N``, which no minimum cut exceeds); the cut found is
    then re-priced exactly in floating point, so the bound returned is always the
    ratio of a real cut. Rounding can only hide a cut within ~1e-6 of the optimum.
    Cost: (#classes + #improvements) max-flows on the topology graph, O(V^2 E) each
    (Dinic) but close to linear on these shallow graphs.
    """
    return _BOTTLENECKS(cluster)


_PARTITIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Sinks tried for the minimum 2-cut: the source GPU's box mates and one GPU of at most
#: this many other boxes. Any cut gives a valid bound; more sinks only tighten it.
MAX_CUT_SINKS = 64


def best_partition(cluster: Cluster) -> Partition:
    """The partition of :func:`partitions` with the largest bound (cached per cluster)."""
    found = _PARTITIONS.get(cluster)
    if found is None:
        found = _PARTITIONS[cluster] = max(partitions(cluster), key=lambda p: p.ratio)
    return found


def partitions(cluster: Cluster) -> list[Partition]:
    """The partitions of the GPUs the allreduce bound tries, each with its bound.

    Parameters
    ----------
    cluster : Cluster

    Returns
    -------
    list of Partition
        In this order, those with at least two groups: every GPU alone (its own node);
        every box (all its nodes: GPUs, fabric, NICs); each level ``L`` of the switch
        hierarchy (the connected pieces of the boxes and the switches at most ``L - 1``
        switch hops from a NIC, joined by links between switches of different levels;
        the rest in no group); the minimum 2-cut (two sides of
        least bandwidth between them in both directions, by max-flow from rank 0 to its
        box mates and to one GPU of up to ``MAX_CUT_SINKS`` other boxes); and the RS+AG
        cut of :func:`bottleneck` with the rest of the graph. A one-GPU cluster gives one
        partition of ratio 0.

    Notes
    -----
    Cost: one pass over the edges per partition, plus up to ``MAX_CUT_SINKS`` + box
    size max-flows for the 2-cut and the RS+AG cut's own.
    """
    n = cluster.nranks
    if n < 2:
        node = cluster.gpu_node(0)
        return [Partition("one GPU", (frozenset({node}),), math.inf, 0.0)]
    fg = _FlowGraph(cluster)
    graph = cluster.graph
    nodes = fg.names
    found: list[Partition] = []

    def add(name: str, labels: np.ndarray) -> None:
        labels = labels.copy()
        ids = np.unique(labels[fg.gpus])
        if (ids < 0).any():
            raise AssertionError(f"{name}: a GPU in no group")
        if len(ids) < 2:
            return
        labels[~np.isin(labels, ids)] = -1  # groups without a GPU are no groups
        dense = np.searchsorted(ids, labels)  # group g -> 0..m-1 (meaningless for -1)
        lu, lv = labels[fg.u], labels[fg.v]
        out = (lu >= 0) & (lu != lv)
        into = (lv >= 0) & (lu != lv)
        m = len(ids)
        sent = np.bincount(dense[fg.u[out]], weights=fg.bw[out], minlength=m)
        received = np.bincount(dense[fg.v[into]], weights=fg.bw[into], minlength=m)
        bandwidth = math.fsum(sent)
        ratio = max(1.0 / float(sent.min()), 1.0 / float(received.min()))
        if not (labels[reducing] < 0).any():
            ratio = max(ratio, 2.0 * (m - 1) / bandwidth, 2.0 * (m - 1) / math.fsum(received))
        groups = tuple(frozenset(nodes[i] for i in np.flatnonzero(labels[:fg.source] == g))
                       for g in ids)
        found.append(Partition(name, groups, bandwidth, ratio))

    # Nodes that reduce or multicast (NVLS fabrics, SHARP switches) outside every group
    # void the message-count term: one message into such a node can carry the sum of
    # several groups' data, or reach several groups.
    reducing = np.array([i for i, name in enumerate(nodes) if name in cluster.reducing_nodes],
                        dtype=np.int64)
    size = fg.source
    alone = np.full(size, -1)
    alone[fg.gpus] = np.arange(n)
    add("every GPU", alone)

    box_of = np.full(size, -1)
    for i, name in enumerate(nodes):
        box = graph.nodes[name].get("box")
        if box is not None:
            box_of[i] = box
    add("boxes", box_of)

    for level, labels in enumerate(_switch_levels(cluster, fg, box_of), start=1):
        add(f"switch level {level}", labels)

    cut = _min_two_cut(cluster, fg)
    if cut is not None:
        add("minimum 2-cut", cut.astype(int))
    rsag = bottleneck(cluster)
    add("RS+AG cut", np.array([name in rsag.nodes for name in nodes], dtype=int))
    return found


def _switch_levels(cluster: Cluster, fg: _FlowGraph, box_of: np.ndarray) -> list[np.ndarray]:
    """Group labels per level of the switch hierarchy, lowest first, distinct ones only."""
    if not cluster.switches:
        return []
    index = {name: i for i, name in enumerate(fg.names)}
    neighbours: dict[str, set[str]] = {s: set() for s in cluster.switches}
    for link in cluster.links:
        neighbours[link.a].add(link.b)
        neighbours[link.b].add(link.a)
    tier: dict[str, int] = {}
    frontier = sorted({nic.switch for box in cluster.boxes for nic in box.nics})
    level = 1
    while frontier:
        for switch in frontier:
            tier[switch] = level
        frontier = sorted({w for s in frontier for w in neighbours[s] if w not in tier})
        level += 1
    out: list[np.ndarray] = []
    seen: set[bytes] = set()
    undirected_u = np.concatenate([fg.u, fg.v])
    undirected_v = np.concatenate([fg.v, fg.u])
    node_tier = np.zeros(fg.source, dtype=int)  # 0: not a switch
    for switch, t in tier.items():
        node_tier[index[switch]] = t
    tier_u, tier_v = node_tier[undirected_u], node_tier[undirected_v]
    # Links between two switches of one tier (switch0 <-> switch1 of two racks) join
    # nothing: a level groups what hangs below each switch of that level.
    peers = (tier_u > 0) & (tier_u == tier_v)
    for top in range(1, max(tier.values(), default=0) + 1):
        keep = box_of >= 0
        for switch, t in tier.items():
            if t <= top:
                keep[index[switch]] = True
        both = keep[undirected_u] & keep[undirected_v] & ~peers
        matrix = sp.csr_array((np.ones(int(both.sum()), dtype=np.int8),
                               (undirected_u[both], undirected_v[both])),
                              shape=(fg.source, fg.source))
        _, parts = connected_components(matrix, directed=False)
        labels = np.where(keep, parts, -1)
        key = labels.tobytes()
        if key not in seen:
            seen.add(key)
            out.append(labels)
    return out


def _min_two_cut(cluster: Cluster, fg: _FlowGraph) -> np.ndarray | None:
    """The side of rank 0 of the least two-way cut found that separates GPUs, or None."""
    size = fg.source
    both_ways = np.concatenate([fg.bw, fg.bw])
    rows, cols = np.concatenate([fg.u, fg.v]), np.concatenate([fg.v, fg.u])
    quantum = math.fsum(fg.bw) * 2 / float(1 << 30)
    cap = np.maximum(1, np.rint(both_ways / quantum)).astype(np.int32)
    matrix = sp.csr_array((cap, (rows, cols)), shape=(size, size))
    matrix.sum_duplicates()
    first = cluster.boxes[0]
    sinks = list(range(1, first.gpus))
    others = cluster.boxes[1:]
    stride = max(1, math.ceil(len(others) / MAX_CUT_SINKS))
    sinks += [box.first_rank for box in others[::stride]]
    source = int(fg.gpus[0])
    best, best_side = math.inf, None
    for rank in sinks:
        sink = int(fg.gpus[rank])
        result = maximum_flow(matrix, source, sink, method="dinic")
        residual = (matrix - result.flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = breadth_first_order(residual, source, directed=True,
                                      return_predecessors=False)
        side = np.zeros(size, dtype=bool)
        side[reached] = True
        crossing = side[fg.u] != side[fg.v]
        value = math.fsum(fg.bw[crossing])
        if value < best:
            best, best_side = value, side
    return best_side


class _FlowGraph:
    """The topology as index arrays, plus a super source, for repeated max-flows."""

    def __init__(self, cluster: Cluster) -> None:
        graph = cluster.graph
        self.names = list(graph.nodes)
        index = {name: i for i, name in enumerate(self.names)}
        self.source = len(self.names)
        self.size = self.source + 1
        edges = list(graph.edges(data="bandwidth"))
        self.u = np.array([index[a] for a, _, _ in edges], dtype=np.int64)
        self.v = np.array([index[b] for _, b, _ in edges], dtype=np.int64)
        self.bw = np.array([float(w) for _, _, w in edges])
        self.gpus = np.array([index[cluster.gpu_node(r)] for r in range(cluster.nranks)],
                             dtype=np.int64)
        self.is_gpu = np.zeros(self.size, dtype=bool)
        self.is_gpu[self.gpus] = True

    def price(self, inside: np.ndarray) -> tuple[float, int]:
        """Exact ``(B_out(S), |S ∩ GPUs|)`` for the boolean node mask ``inside``."""
        leaving = inside[self.u] & ~inside[self.v]
        return float(math.fsum(self.bw[leaving])), int(inside[self.gpus].sum())

    def capacities(self, x: float) -> tuple[sp.csr_array, int]:
        """Integer capacity matrix for trial ratio ``x`` and the scaled ``x``."""
        n = len(self.gpus)
        quantum = x * n / _INT_SCALE
        x_int = max(1, int(round(x / quantum)))
        cap = np.minimum(np.rint(self.bw / quantum), x_int * n).astype(np.int32)
        rows = np.concatenate([self.u, np.full(n, self.source)])
        cols = np.concatenate([self.v, self.gpus])
        data = np.concatenate([cap, np.full(n, x_int, dtype=np.int32)])
        matrix = sp.csr_array((data, (rows, cols)), shape=(self.size, self.size))
        matrix.sum_duplicates()
        return matrix, x_int

    def min_cut(self, matrix: sp.csr_array, sink: int) -> tuple[int, np.ndarray]:
        """Max-flow value and the source side (minus the source) of a minimum cut."""
        result = maximum_flow(matrix, self.source, sink, method="dinic")
        residual = (matrix - result.flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)
        residual.eliminate_zeros()
        reached = breadth_first_order(residual, self.source, directed=True,
                                      return_predecessors=False)
        inside = np.zeros(self.size, dtype=bool)
        inside[reached] = True
        inside[self.source] = False
        return int(result.flow_value), inside


def _bottleneck(cluster: Cluster) -> Cut:
    n = cluster.nranks
    if n < 2:
        return Cut(1, math.inf, frozenset({cluster.gpu_node(0)}), 0.0, 1, cluster.gpu_node(0))
    fg = _FlowGraph(cluster)

    # Start from the best obvious cut (one GPU, or one box) so that most sinks find
    # nothing to improve and cost one max-flow each.
    best_mask = None
    best_x = math.inf
    candidates = []
    for r in range(n):
        mask = np.zeros(fg.size, dtype=bool)
        mask[fg.gpus[r]] = True
        candidates.append(mask)
    index = {name: i for i, name in enumerate(fg.names)}
    for box in cluster.boxes:
        if box.gpus < n:
            mask = np.zeros(fg.size, dtype=bool)
            for name in fg.names:
                if name.startswith(box.name + "/"):
                    mask[index[name]] = True
            candidates.append(mask)
    for mask in candidates:
        bandwidth, gpus = fg.price(mask)
        if bandwidth / gpus < best_x:
            best_x, best_mask = bandwidth / gpus, mask

    x = best_x
    matrix, x_int = fg.capacities(x)
    for sink_rank in sink_classes(cluster):
        sink = int(fg.gpus[sink_rank])
        while True:
            value, inside = fg.min_cut(matrix, sink)
            if value >= x_int * n or not inside.any():
                break
            bandwidth, gpus = fg.price(inside)
            if gpus == 0 or bandwidth / gpus >= x * (1 - _REL):
                break  # integer round-off, not a better cut
            x, best_mask = bandwidth / gpus, inside
            matrix, x_int = fg.capacities(x)
    assert best_mask is not None
    bandwidth, gpus = fg.price(best_mask)
    nodes = frozenset(fg.names[i] for i in np.flatnonzero(best_mask[:fg.source]))
    held = {r for r in range(n) if cluster.gpu_node(r) in nodes}
    side = sorted(held) if len(held) <= n - len(held) else \
        [r for r in range(n) if r not in held]
    return Cut(gpus=gpus, bandwidth=bandwidth, nodes=nodes, ratio=gpus / bandwidth,
               behind=len(side), where=_side_name(cluster, side))


def _side_name(cluster: Cluster, ranks: list[int]) -> str:
    """``ranks`` as a user names them: whole boxes by name (``box node3``, ``boxes A, B``,
    ``boxes node0 .. node46`` for more than four), other GPUs by node (``dgx1/gpu7``,
    ``3 GPUs of dgx1``)."""
    from ..units import plural
    chosen = set(ranks)
    whole: list[str] = []
    parts: list[str] = []
    for box in cluster.boxes:
        mine = [r for r in range(box.first_rank, box.first_rank + box.gpus) if r in chosen]
        if len(mine) == box.gpus:
            whole.append(box.name)
        elif len(mine) <= 2:
            parts.extend(cluster.gpu_node(r) for r in mine)
        elif mine:
            parts.append(f"{plural(len(mine), 'GPU')} of {box.name}")
    named = []
    if whole:
        named.append(("box " if len(whole) == 1 else "boxes ")
                     + (", ".join(whole) if len(whole) <= 4
                        else f"{whole[0]} .. {whole[-1]} ({len(whole)})"))
    if len(parts) > 4:
        parts = [f"GPUs of {len(parts)} more boxes" if whole else f"GPUs of {len(parts)} boxes"]
    return ", ".join(named + parts)


# One cut per cluster object; an entry goes with its cluster (Cluster is frozen: no
# attribute of its own can hold it).
_BOTTLENECKS: ObjectCache[Cluster, Cut] = ObjectCache(_bottleneck)


def sink_classes(cluster: Cluster) -> list[int]:
    """One representative rank per class of GPUs that graph automorphisms exchange.

    Three kinds of swaps are automorphisms of the weighted topology graph, so GPUs
    they exchange give the same minimum cut as sinks:

    1. two boxes with the same ``signature()`` whose NIC ``k`` plugs into the same switch
       for every ``k``: swap the boxes (GPU ``j`` <-> GPU ``j``);
    2. two box-local GPU indexes ``a, b`` of one box type when the transposition
       ``a <-> b`` maps the box's NVLinks (with bandwidths) and NIC GPU lists onto
       themselves (any fabric is symmetric by construction);
    3. two switches with the same switch-link neighbourhood (same neighbours, same
       bandwidths, not each other) whose boxes all plug only into them and match by
       signature: swap the switches and, pairwise, their boxes.

    Classes are the union-find closure of these swaps, a refinement of the true
    automorphism orbits, hence safe. Topologies without such symmetry fall back to
    one class per GPU.
    """
    n = cluster.nranks
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    # 1. interchangeable boxes
    groups: dict[tuple, list] = defaultdict(list)
    for box in cluster.boxes:
        groups[(box.signature(), tuple(nic.switch for nic in box.nics))].append(box)
    for members in groups.values():
        for other in members[1:]:
            for j in range(other.gpus):
                union(members[0].first_rank + j, other.first_rank + j)

    # 2. symmetric GPUs inside a box type
    seen: dict[tuple, list[tuple[int, int]]] = {}
    for box in cluster.boxes:
        sig = box.signature()
        if sig not in seen:
            seen[sig] = _local_swaps(box)
        for a, b in seen[sig]:
            union(box.first_rank + a, box.first_rank + b)

    # 3. twin switches (e.g. the leaves of a leaf-spine)
    neighbours: dict[str, dict[str, tuple[float, float]]] = {s: {} for s in cluster.switches}
    for link in cluster.links:
        neighbours[link.a][link.b] = (link.bandwidth, link.latency)
        neighbours[link.b][link.a] = (link.bandwidth, link.latency)
    homed: dict[str, list] = defaultdict(list)
    mixed: set[str] = set()
    for box in cluster.boxes:
        switches = {nic.switch for nic in box.nics}
        if len(switches) == 1:
            homed[next(iter(switches))].append(box)
        else:
            mixed |= switches
    def seen_from(u: str, twin: str) -> frozenset:
        # u's neighbourhood with its would-be twin written as a placeholder, so that two
        # linked switches (switch0 <-> switch1) can still be swapped.
        return frozenset((None if w == twin else w, bw) for w, bw in neighbours[u].items())

    by_boxes: dict[tuple, list[str]] = defaultdict(list)
    for switch in cluster.switches:
        if switch not in mixed:
            key = tuple(sorted(repr(b.signature()) for b in homed[switch]))
            by_boxes[key].append(switch)
    for members in by_boxes.values():
        reps: list[str] = []
        for switch in members:
            for rep in reps:
                if seen_from(rep, switch) == seen_from(switch, rep):
                    first = sorted(homed[rep], key=lambda b: repr(b.signature()))
                    other = sorted(homed[switch], key=lambda b: repr(b.signature()))
                    for box_a, box_b in zip(first, other):
                        for j in range(box_a.gpus):
                            union(box_a.first_rank + j, box_b.first_rank + j)
                    break
            else:
                reps.append(switch)

    return sorted({find(r) for r in range(n)})


def _local_swaps(box: Box) -> list[tuple[int, int]]:
    links = {(min(l.a, l.b), max(l.a, l.b)): (l.bandwidth, l.latency) for l in box.gpu_links}
    nic_sets = [frozenset(nic.gpus) for nic in box.nics]
    swaps = []
    for a in range(box.gpus):
        for b in range(a + 1, box.gpus):
            perm = {a: b, b: a}

            def p(j: int) -> int:
                return perm.get(j, j)

            moved = {(min(p(i), p(j)), max(p(i), p(j))): w for (i, j), w in links.items()}
            if moved != links:
                continue
            if any(frozenset(p(j) for j in s) != s for s in nic_sets):
                continue
            swaps.append((a, b))
            if box.gpus > 64:  # a star of swaps from GPU a already joins the class
                break
    return swaps
