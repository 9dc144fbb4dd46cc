"""Rank orders: the cluster as a tree of groups, and the rings that follow it.

- :func:`topo_tree` / :func:`topo_order`: GPUs inside a box in NVLink-neighbour order
  (:func:`box_order`), boxes under their switch, switches under a root switch, and
  its leaf order: a ring in that order crosses every link of the switch tree once per
  direction, the fewest a ring can (DDL's A->B->C->D).
- :func:`rail_rings`: on a cluster with rails (GPU ``j`` of every box on NIC ``j``), one
  ring per rail (:mod:`topoplan.cluster.rails`), the boxes in :func:`topo_order`.
- :func:`resolve_order`: a planner's ``order`` argument (``"rank"``, ``"topo"`` or a
  permutation) as a list of ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import networkx as nx

from ..cluster import Box, Cluster
from ..errors import PlannerError

__all__ = ["TopoNode", "topo_tree", "topo_order", "box_order", "rail_rings", "resolve_order"]


@dataclass
class TopoNode:
    """A group of ranks: a switch subtree (``kind="switch"``) or a box (``kind="box"``).

    ``children`` are TopoNodes for a switch and ints (ranks, in ring order) for a box.
    """

    kind: str
    name: str
    children: list = field(default_factory=list)

    def ranks(self) -> list[int]:
        """Every rank below, in tree (ring) order."""
        if self.kind == "box":
            return list(self.children)
        out: list[int] = []
        for child in self.children:
            out.extend(child.ranks())
        return out


def _box_home(box: Box) -> str | None:
    """The switch a box hangs from: the one most of its NIC bandwidth goes to."""
    if not box.nics:
        return None
    weight: dict[str, float] = {}
    for nic in box.nics:
        weight[nic.switch] = weight.get(nic.switch, 0.0) + nic.bandwidth
    return max(box.nics, key=lambda nic: weight[nic.switch]).switch


def _choose_root(graph: nx.Graph, homes: set[str]) -> str:
    """The switch closest to every box-holding switch (a spine before a leaf).

    Eccentricity over box-holding switches only, then fewer boxes of its own (spines
    hold none), then more switch neighbours, then file order.
    """
    order = {s: i for i, s in enumerate(graph.nodes)}
    best, best_key = None, None
    for s in graph.nodes:
        dist = nx.single_source_shortest_path_length(graph, s)
        ecc = max((dist.get(h, math.inf) for h in homes), default=0)
        key = (ecc, s in homes, -graph.degree(s), order[s])
        if best_key is None or key < best_key:
            best, best_key = s, key
    assert best is not None
    return best


def topo_tree(cluster: Cluster) -> TopoNode:
    """The cluster as a tree: root switch -> ... -> switch -> box -> ranks.

    Parent links are a breadth-first tree of the switch graph from a central switch
    (:func:`_choose_root`), so every switch hangs under the switch nearest the root;
    each box hangs under the switch most of its NIC bandwidth goes to. A switch with
    both boxes and child switches gets its boxes as one group (first), then the
    child switches, in file/discovery order. Switch subtrees
    without boxes are dropped and single-child switch nodes collapsed. Ranks inside a
    box come in :func:`box_order`.
    """
    boxes = [TopoNode("box", box.name, box_order(cluster, b)) for b, box in enumerate(cluster.boxes)]
    homes = [_box_home(box) for box in cluster.boxes]
    if len(boxes) == 1:
        return boxes[0]
    graph = nx.Graph()
    graph.add_nodes_from(cluster.switches)
    graph.add_edges_from((link.a, link.b) for link in cluster.links)
    used = {h for h in homes if h is not None}
    root = _choose_root(graph, used)
    nodes = {s: TopoNode("switch", s) for s in graph.nodes}
    local: dict[str, list[TopoNode]] = {s: [] for s in graph.nodes}
    for node, home in zip(boxes, homes):
        local[home].append(node)  # type: ignore[index]
    below: dict[str, list[TopoNode]] = {s: [] for s in graph.nodes}
    for parent, child in nx.bfs_edges(graph, root):
        below[parent].append(nodes[child])
    for s, node in nodes.items():
        # A switch's own boxes form one group beside its child switches (DDL's
        # switch0 {A, B} next to switch1 {C, D}), not one group each.
        if local[s] and below[s]:
            node.children = [TopoNode("switch", s, local[s])] + below[s]
        else:
            node.children = local[s] + below[s]

    def prune(node: TopoNode) -> TopoNode | None:
        if node.kind == "box":
            return node
        kept = [c for c in (prune(c) for c in node.children) if c is not None]
        if not kept:
            return None
        if len(kept) == 1:
            return kept[0]
        node.children = kept
        return node

    tree = prune(nodes[root])
    assert tree is not None  # the loader guarantees every box reaches the switches
    return tree


def topo_order(cluster: Cluster) -> list[int]:
    """Ranks in ring order: the leaf order of :func:`topo_tree` (a DFS over the switch tree).

    A ring in this order crosses each link of the switch tree exactly once per
    direction, the minimum for any ring, and (where a box has an NVLink Hamiltonian
    path) moves between GPUs of a box over direct links only.
    """
    return topo_tree(cluster).ranks()


def rail_rings(cluster: Cluster) -> list[list[int]]:
    """:func:`topoplan.cluster.rails.rail_rings` with the boxes in :func:`topo_order`
    (so that the rings cross each switch link the fewest times, as one ring would)."""
    from ..cluster.rails import rail_rings as rings

    first: dict[str, int] = {}
    for rank in topo_order(cluster):
        first.setdefault(cluster.box_of(rank).name, len(first))
    return rings(cluster, sorted(cluster.boxes, key=lambda box: first[box.name]))


def box_order(cluster: Cluster, b: int) -> list[int]:
    """The ranks of box ``b`` in ring order: a Hamiltonian cycle over direct GPU links.

    Among cycles over direct links (NVLink ``gpu_links``) the one whose narrowest link
    is widest wins (then the widest in total), so on a DGX-1 hybrid cube mesh every
    hop uses a doubled NVLink. Boxes with a fabric and no links, or whose links admit
    no cycle, keep local order (a fabric makes every pair one hop; without one the
    routes relay). The search is exhaustive up to 10 GPUs and greedy above.
    """
    box = cluster.boxes[b]
    local = _box_cycle(cluster, b)
    return [box.first_rank + j for j in local]


def _box_cycle(cluster: Cluster, b: int) -> list[int]:
    box = cluster.boxes[b]
    return list(_link_cycle(box.gpus, box.gpu_links))


@lru_cache(maxsize=256)
def _link_cycle(g: int, links: tuple) -> tuple[int, ...]:
    """Local GPU order for a box of ``g`` GPUs with these (merged) GpuLinks."""
    if g <= 2 or not links:
        return tuple(range(g))
    bw: dict[tuple[int, int], float] = {}
    for link in links:
        bw[(link.a, link.b)] = bw[(link.b, link.a)] = link.bandwidth
    neighbours = {i: sorted((j for j in range(g) if (i, j) in bw), key=lambda j: -bw[(i, j)])
                  for i in range(g)}
    if g <= 10:
        best: tuple[float, float] | None = None
        best_cycle: list[int] | None = None
        path = [0]
        seen = {0}

        def dfs(width: float, total: float) -> None:
            nonlocal best, best_cycle
            last = path[-1]
            if len(path) == g:
                if (last, 0) in bw:
                    key = (min(width, bw[(last, 0)]), total + bw[(last, 0)])
                    if best is None or key > best:
                        best, best_cycle = key, list(path)
                return
            for j in neighbours[last]:
                if j not in seen:
                    w = min(width, bw[(last, j)])
                    if best is not None and w < best[0]:
                        continue  # cannot beat the best bottleneck
                    path.append(j)
                    seen.add(j)
                    dfs(w, total + bw[(last, j)])
                    path.pop()
                    seen.discard(j)

        dfs(math.inf, 0.0)
        if best_cycle is not None:
            return tuple(best_cycle)
    # Greedy: widest unvisited neighbour, else the lowest unvisited index.
    order, seen = [0], {0}
    while len(order) < g:
        nxt = next((j for j in neighbours[order[-1]] if j not in seen), None)
        if nxt is None:
            nxt = min(set(range(g)) - seen)
        order.append(nxt)
        seen.add(nxt)
    return tuple(order)


def resolve_order(cluster: Cluster, order: Any, algorithm: str) -> tuple[list[int], str]:
    """``order`` ("rank", "topo" or a permutation of the ranks) as a list and a label."""
    n = cluster.nranks
    if isinstance(order, str):
        if order == "rank":
            return list(range(n)), "rank"
        if order == "topo":
            return list(topo_order(cluster)), "topo"
        raise PlannerError(f"{algorithm}: order must be 'rank', 'topo' or a list of ranks, "
                           f"got {order!r}")
    try:
        ranks = [int(r) for r in order]
    except (TypeError, ValueError):
        raise PlannerError(f"{algorithm}: order must be 'rank', 'topo' or a list of ranks, "
                           f"got {order!r}") from None
    if sorted(ranks) != list(range(n)):
        missing = sorted(set(range(n)) - set(ranks))
        extra = sorted(set(ranks) - set(range(n)))
        dup = sorted({r for r in ranks if ranks.count(r) > 1}) if len(ranks) <= 4096 else []
        raise PlannerError(f"{algorithm}: order must list each of the {n} ranks once "
                           f"(missing {missing[:8]}, out of range {extra[:8]}, repeated {dup[:8]})")
    return ranks, "custom"
