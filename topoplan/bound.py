"""The bandwidth lower bound for allreduce on any topology, and the cut that sets it.

Allreduce done as reduce-scatter + allgather needs at least

    T >= 2 * (M / N) * max_S |S ∩ GPUs| / B_out(S)

seconds, the maximum over node sets ``S`` of the topology graph that hold at least one
GPU but not every GPU, with ``B_out(S)`` the total bandwidth of the directed edges
leaving ``S`` (ForestColl, Zhao et al., arXiv 2402.06787, Theorem 1). We compute
``x* = min_S B_out(S) / |S ∩ GPUs|`` (bytes/s per GPU) with max-flow, never by
enumerating cuts, and return ``2 (M/N) / x*``.
"""

from __future__ import annotations

from typing import Any

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from ._cache import ObjectCache
from .cluster import Box, Cluster

__all__ = ["Cut", "bottleneck", "lower_bound", "latency_bound", "sink_classes"]

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
    """

    gpus: int
    bandwidth: float
    nodes: frozenset[str]
    ratio: float

    def __str__(self) -> str:
        from .units import format_bandwidth
        return (f"{self.gpus} GPUs behind {format_bandwidth(self.bandwidth)} "
                f"({len(self.nodes)} nodes)")


def lower_bound(cluster: Cluster, size: float) -> float:
    """Seconds an allreduce of ``size`` bytes needs at least on ``cluster``.

    Parameters
    ----------
    cluster : Cluster
    size : float
        Bytes per rank (``M``).

    Returns
    -------
    float
        ``2 * (M / N) * max_S |S ∩ GPUs| / B_out(S)``; 0 for a one-GPU cluster. On a
        single switch with N NICs of bandwidth B it is ``2 (N-1)/N * M / B`` (Patarasuk
        and Yuan, 2009). Latency is not counted.

    References
    ----------
    L. Zhao et al., "ForestColl: Efficient Collective Communications on Heterogeneous
    Network Fabrics", arXiv 2402.06787 (2024).
    """
    n = cluster.nranks
    if n < 2:
        return 0.0
    return 2.0 * (float(size) / n) * bottleneck(cluster).ratio


def latency_bound(cluster: Cluster, size: float, profile: Any = None) -> float:
    """The bandwidth bound plus what the fewest steps cost under a cost profile.

    A bandwidth-optimal allreduce reduces every chunk before it broadcasts it: at
    least one reduce-scatter step and one allgather step, each posting a send and a
    receive and paying alpha (the network class when the cluster has several boxes).
    So ``lower_bound + call_overhead + 2 (step_overhead + 2 op_overhead + alpha)``: a
    yardstick for plans under a profile (a latency-aware bound), exact for
    a two-rank exchange; plans that trade bandwidth for fewer steps (a direct
    all-to-all) are not bound by it.

    Parameters
    ----------
    cluster : Cluster
    size : float
        Bytes per rank.
    profile : CostProfile or str, optional
        Default: :data:`topoplan.cost.DEFAULT_PROFILE`.
    """
    from .cost import get_profile
    costs = get_profile(profile)
    if cluster.nranks < 2:
        return 0.0
    network = len(cluster.boxes) > 1
    return (lower_bound(cluster, size) + costs.call_overhead
            + 2 * costs.message_cost(network=network, ops=2))


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
        return Cut(1, math.inf, frozenset({cluster.gpu_node(0)}), 0.0)
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
    return Cut(gpus=gpus, bandwidth=bandwidth, nodes=nodes, ratio=gpus / bandwidth)


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
