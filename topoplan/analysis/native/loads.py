"""Link loads: the bytes a collective lays on every directed edge of a cluster's graph.

:class:`LinkLoads` adds up, per byte of the buffer, what each transfer puts on each link:
between two ranks over the cluster's own routes, from a rank to a NIC (through the box to
a GPU the NIC serves, as NCCL's PXN does), across the switches between NICs, and up and
down SHARP's aggregation tree (:func:`sharp_root`). The busiest link's bytes over its
bandwidth bound a collective's time from below.
:class:`~topoplan.analysis.native.nccl.NcclModel` lays each of NCCL's algorithms on it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["LinkLoads", "sharp_root"]


class LinkLoads:
    """Bytes per byte of the buffer on each directed edge of the cluster's graph."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.edges: dict[tuple[str, str], float] = defaultdict(float)
        self.switch_flows: dict[tuple[str, str], float] = defaultdict(float)
        self.sharp_from: dict[str, float] = {}
        self._routes: dict[tuple[int, int], tuple[tuple[tuple[str, str], float], ...]] = {}
        self.sharp_box: dict[int, float] = {}

    def add(self, edge: tuple[str, str], amount: float) -> None:
        self.edges[edge] += amount

    def route(self, src: int, dst: int, amount: float) -> None:
        """``amount`` from rank ``src`` to rank ``dst`` over the cluster's own routes."""
        if src == dst:
            return
        edges = self._routes.get((src, dst))
        if edges is None:
            paths = self.cluster.route_edges(src, dst)
            share = 1.0 / len(paths)
            merged: dict[tuple[str, str], float] = defaultdict(float)
            for path in paths:
                for edge in path:
                    merged[edge] += share
            edges = self._routes[(src, dst)] = tuple(merged.items())
        for edge, share in edges:
            self.edges[edge] += share * amount

    def _to_nic(self, rank: int, nic: int | None, outbound: bool, amount: float) -> str:
        """From ``rank`` to its box's NIC ``nic`` (through the box to a GPU the NIC serves
        when it does not serve ``rank``: NCCL's PXN); returns the NIC's switch."""
        cluster = self.cluster
        box = cluster.box_of(rank)
        k = 0 if nic is None else nic
        node = box.nic_node(k)
        local = rank - box.first_rank
        served = box.nics[k].gpus
        via = local if local in served else served[0]
        if via != local:
            if outbound:
                self.route(rank, box.first_rank + via, amount)
            else:
                self.route(box.first_rank + via, rank, amount)
        gpu = box.gpu_node(via)
        if outbound:
            self.edges[(gpu, node)] += amount
            self.edges[(node, box.nics[k].switch)] += amount
        else:
            self.edges[(node, gpu)] += amount
            self.edges[(box.nics[k].switch, node)] += amount
        return box.nics[k].switch

    def net(self, b_src: int, src: int, nic_src: int | None, b_dst: int, dst: int,
            nic_dst: int | None, amount: float) -> None:
        """``amount`` from rank ``src`` out by NIC ``nic_src`` to rank ``dst`` in by NIC
        ``nic_dst``, across the switches."""
        a = self._to_nic(src, nic_src, True, amount)
        b = self._to_nic(dst, nic_dst, False, amount)
        if a != b:
            self.switch_flows[(a, b)] += amount

    def sharp(self, b: int, nic: int | None, amount: float) -> None:
        """``amount`` up from box ``b``'s NIC to SHARP's aggregation tree and the result
        back down."""
        box = self.cluster.boxes[b]
        k = 0 if nic is None else nic
        rank = box.first_rank + box.nics[k].gpus[0]
        sw = self._to_nic(rank, k, True, amount)
        self._to_nic(rank, k, False, amount)
        self.sharp_from[sw] = self.sharp_from.get(sw, 0.0)
        self.sharp_box[b] = self.sharp_box.get(b, 0.0) + amount

    def busiest(self) -> tuple[float, str]:
        """Seconds per byte of the buffer on the busiest link, and that link."""
        graph = self.cluster.graph
        worst, where = 0.0, ""
        for (u, v), amount in self.totals().items():
            bw = graph[u][v]["bandwidth"]
            t = amount / bw
            if t > worst:
                worst, where = t, f"{u} -> {v}"
        return worst, where

    def totals(self) -> dict[tuple[str, str], float]:
        """Bytes per byte of the buffer on every directed edge: switch-to-switch flows
        spread over their equal-cost paths, SHARP's aggregation tree included."""
        cluster = self.cluster
        edges = dict(self.edges)
        for (a, b), amount in self.switch_flows.items():
            paths = cluster._switch_paths(a, b)
            share = amount / len(paths)
            for path in paths:
                for u, v in zip(path, path[1:]):
                    edges[(u, v)] = edges.get((u, v), 0.0) + share
        if self.sharp_from:
            # Switches sum what comes up from below: every hop of the aggregation tree
            # carries one stream of partial sums up and the result down, the buffer once
            # (the most any box sends), however many boxes hang below it.
            root = sharp_root(cluster)
            stream = max(self.sharp_box.values())
            hops: set[tuple[str, str]] = set()
            for sw in self.sharp_from:
                if root is not None and sw != root:
                    path = cluster._switch_paths(sw, root)[0]
                    hops.update(zip(path, path[1:]))
            for u, v in hops:
                edges[(u, v)] = edges.get((u, v), 0.0) + stream
                edges[(v, u)] = edges.get((v, u), 0.0) + stream
        return edges


def sharp_root(cluster: Cluster) -> str | None:
    """The switch SHARP aggregates at: the one nearest (in hops) to every NIC's
    switch, when every switch on the way reduces; ``None`` when SHARP cannot serve
    every box."""
    if not cluster.sharp:
        return None
    attach = {nic.switch for box in cluster.boxes for nic in box.nics}
    best: tuple[int, int, str] | None = None
    for i, root in enumerate(cluster.switches):
        if root not in cluster.sharp:
            continue
        worst = 0
        for sw in attach:
            paths = cluster._switch_paths(sw, root)
            if not paths or any(s not in cluster.sharp for s in paths[0]):
                worst = -1
                break
            worst = max(worst, len(paths[0]))
        if worst >= 0 and (best is None or (worst, i) < best[:2]):
            best = (worst, i, root)
    return None if best is None else best[2]
