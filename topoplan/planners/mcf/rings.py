"""Rings inside a box for the ``mcf`` grids: Hamiltonian cycles of its NVLink mesh,
weighted by an LP so that every link carries its share (:func:`box_rings`), and the
sets of fewest rings that reach the LP optimum or come near it (:func:`box_ring_sets`,
a MILP per ring count).

LP size: (directed links of the box) x (its directed Hamiltonian cycles, at most 10000).
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, linprog

from ...cluster import Box, Cluster
from .lp import quiet_milp

__all__ = ["MILP_SECONDS", "box_rings", "box_ring_sets"]


#: Seconds per fewest-rings MILP (over undirected cycles: ~0.03 s each on a DGX-1).
MILP_SECONDS = 2.0


def _hamiltonian_cycles(graph: nx.Graph, limit: int = 5000) -> list[tuple[int, ...]]:
    """Directed Hamiltonian cycles of ``graph`` (starting at node 0), at most ``limit``."""
    n = graph.number_of_nodes()
    adj = {v: sorted(graph.neighbors(v)) for v in graph.nodes}
    out: list[tuple[int, ...]] = []
    path = [0]
    seen = {0}

    def dfs() -> bool:
        v = path[-1]
        if len(path) == n:
            if 0 in adj[v]:
                out.append(tuple(path))
            return len(out) >= limit
        for w in adj[v]:
            if w not in seen:
                seen.add(w)
                path.append(w)
                if dfs():
                    return True
                path.pop()
                seen.discard(w)
        return False

    dfs()
    return out


def _cycle_loads(cluster: Cluster, box: Box) -> tuple[list[tuple[int, ...]], sp.csr_array,
                                                      np.ndarray] | None:
    """Directed Hamiltonian cycles of a box's NVLink mesh (local indexes), the bytes each
    puts on every directed link per byte of ring data (along the cluster's routes), and
    the links' capacities; None when the box has no such cycle."""
    g = box.gpus
    if g <= 2 or not box.gpu_links or g > 10:
        return None
    links = nx.Graph()
    links.add_nodes_from(range(g))
    links.add_edges_from((l.a, l.b) for l in box.gpu_links)
    cycles = _hamiltonian_cycles(links) if nx.is_connected(links) else []
    if not cycles:
        return None
    cycles = cycles + [c[:1] + c[1:][::-1] for c in cycles]
    cycles = list(dict.fromkeys(cycles))
    graph = cluster.graph
    edges: dict[tuple[str, str], int] = {}
    rows, cols, vals = [], [], []
    base = box.first_rank
    pair_cache: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for k, cyc in enumerate(cycles):
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            if (a, b) not in pair_cache:
                paths = cluster.route_edges(base + a, base + b)
                use: dict[int, float] = {}
                for path in paths:
                    for e in path:
                        i = edges.setdefault(e, len(edges))
                        use[i] = use.get(i, 0.0) + 1.0 / len(paths)
                pair_cache[(a, b)] = list(use.items())
            for i, w in pair_cache[(a, b)]:
                rows.append(i)
                cols.append(k)
                vals.append(w)
    cap = np.array([graph.edges[e]["bandwidth"] for e in edges])
    load = sp.csr_array((vals, (rows, cols)), shape=(len(edges), len(cycles)))
    return cycles, load, cap


def _ring_lp(load: sp.csr_array, cap: np.ndarray, max_rings: int | None = None
             ) -> tuple[np.ndarray, float] | None:
    """``min t : sum x = 1, sum_c x_c load_e(c) <= t cap_e`` (an LP), or with at most
    ``max_rings`` cycles used (a MILP: binary y_c >= x_c, sum y <= max_rings).

    Returns the shares ``x`` and ``t`` relative to the widest link, or None.
    """
    nlinks, m = load.shape
    # Capacities relative to the widest link: HiGHS' tolerances are absolute.
    scaled = sp.diags(cap.max() / cap) @ load
    if max_rings is None:
        a_ub = sp.hstack([scaled, -np.ones((nlinks, 1))]).tocsr()
        a_eq = np.concatenate([np.ones(m), [0.0]])[None, :]
        c = np.zeros(m + 1)
        c[-1] = 1.0
        res = linprog(c, A_ub=a_ub, b_ub=np.zeros(nlinks), A_eq=a_eq, b_eq=[1.0],
                      bounds=[(0, None)] * (m + 1), method="highs")
        return (res.x[:-1], float(res.x[-1])) if res.status == 0 else None
    # Variables x (m), y (m), t.
    z = sp.csr_array((nlinks, m))
    rows = sp.vstack([
        sp.hstack([scaled, z, -np.ones((nlinks, 1))]),
        sp.hstack([sp.eye(m), -sp.eye(m), np.zeros((m, 1))]),
        sp.csr_array(np.concatenate([np.zeros(m), np.ones(m), [0.0]])[None, :]),
        sp.csr_array(np.concatenate([np.ones(m), np.zeros(m), [0.0]])[None, :])]).tocsr()
    lo = np.concatenate([np.full(nlinks + m, -np.inf), [0.0, 1.0]])
    hi = np.concatenate([np.zeros(nlinks + m), [float(max_rings), 1.0]])
    c = np.zeros(2 * m + 1)
    c[-1] = 1.0
    res = quiet_milp(c, constraints=LinearConstraint(rows, lo, hi),
                     integrality=np.concatenate([np.zeros(m), np.ones(m), [0]]),
                     bounds=Bounds(np.zeros(2 * m + 1),
                                   np.concatenate([np.ones(2 * m), [np.inf]])),
                     options={"time_limit": MILP_SECONDS})
    if res.x is None:
        return None
    return res.x[:m], float(res.x[-1])


def _keep(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.flatnonzero(x > 1e-6 * x.max())
    return keep, x[keep] / x[keep].sum()


def box_rings(cluster: Cluster, box: Box) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Rings over a box's GPUs (local indexes) and the share of data each carries.

    For an NVLink mesh of up to 10 GPUs: every Hamiltonian cycle (both directions)
    is a column of the LP ``min t : sum x = 1, sum_c x_c load_e(c) <= t cap_e``, with
    ``load_e(c)`` the bytes cycle ``c`` puts on directed link ``e`` (along the
    cluster's routes) per byte of ring data. The LP's own solution may use many
    cycles (13 on a DGX-1): :func:`box_ring_sets` finds the fewest that do as well.
    Otherwise the index-order ring.
    """
    ident = [tuple(range(box.gpus))]
    problem = _cycle_loads(cluster, box)
    if problem is None:
        return ident, np.ones(1)
    cycles, load, cap = problem
    solved = _ring_lp(load, cap)
    if solved is None:
        return ident, np.ones(1)
    keep, w = _keep(solved[0])
    return [cycles[k] for k in keep], w


_RING_SETS: dict[tuple, list[tuple[list[tuple[int, ...]], np.ndarray, float]]] = {}


def box_ring_sets(cluster: Cluster, box: Box) -> list[tuple[list[tuple[int, ...]], np.ndarray,
                                                             float]]:
    """Ring sets of a box with few rings, up to the fewest that reach the LP optimum:
    ``[(rings, shares, slowdown)]``, ``slowdown`` the set's time over the optimum's (1.0
    for the last).

    More rings load more NVLinks but cost ops: every ring is a message per rank and
    step, so the planner weighs them under the runtime's cost profile. The sets: the
    best single directed cycle, then ``k = 1, 2, ...`` undirected cycles each run both
    ways (links are full duplex), the best ``k`` by a MILP (``y_c`` binary,
    ``x_c <= y_c``, ``sum y <= k``) over the undirected cycles. On a DGX-1 the
    optimum (the LP's own solution uses 13 rings) takes 2 cycles both ways, 4 rings;
    1 and 2 rings are 3x and 1.5x slower. 30 undirected cycles on a DGX-1: ~0.1 s in
    all (the MILP over directed cycles takes seconds), cached per box type.
    """
    key = (box.signature(),)
    cached = _RING_SETS.get(key)
    if cached is not None:
        return cached
    ident = [tuple(range(box.gpus))]
    problem = _cycle_loads(cluster, box)
    out: list[tuple[list[tuple[int, ...]], np.ndarray, float]] = []
    best = None if problem is None else _ring_lp(problem[1], problem[2])
    if problem is None or best is None:
        out.append((ident, np.ones(1), 1.0))
    else:
        cycles, load, cap = problem
        t_opt = best[1]
        scaled = sp.diags(cap.max() / cap) @ load
        single = np.asarray(scaled.max(axis=0).todense()).ravel()
        k = int(np.argmin(single))
        out.append(([cycles[k]], np.ones(1), float(single[k]) / t_opt))
        # Undirected cycles: each directed cycle with its reverse, equal shares.
        index = {c: i for i, c in enumerate(cycles)}
        pairs: list[tuple[int, int]] = []
        seen: set[int] = set()
        for i, c in enumerate(cycles):
            j = index[c[:1] + c[1:][::-1]]
            if i not in seen:
                seen.update((i, j))
                pairs.append((i, j))
        both = sp.hstack([(load[:, [i]] + load[:, [j]]) / 2 for i, j in pairs]).tocsr()
        last = out[0][2] * t_opt
        for kk in range(1, len(pairs) + 1):
            solved = _ring_lp(both, cap, max_rings=kk)
            if solved is None or solved[1] >= last * (1 - 1e-6):
                if solved is not None and solved[1] <= t_opt * (1 + 1e-6):
                    break
                continue
            keep, w = _keep(solved[0])
            last = solved[1]
            rings = [cycles[x] for p in keep for x in pairs[p]]
            out.append((rings, np.repeat(w / 2, 2), last / t_opt))
            if last <= t_opt * (1 + 1e-6):
                break
        if out[-1][2] > 1 + 1e-6:  # asymmetric optimum: the LP's own set
            keep, w = _keep(best[0])
            out.append(([cycles[j] for j in keep], w, 1.0))
    _RING_SETS[key] = out
    return out
