"""The LP core of the ``mcf`` planner: link loads of GPU pairs, and tree packing.

Allreduce as *reduce + broadcast over a weighted set of spanning trees* (Blink,
MLSys'20; ForestColl, arXiv 2402.06787): tree ``T`` carries a fraction ``phi_T`` of
the buffer; every tree edge ``{u, v}`` moves that fraction once up (the partial
sum, reduce) and once down (the result, broadcast). Data is copied and summed at
GPUs, so a narrow cut is crossed once per tree edge, not once per destination.
Each logical edge follows the cluster's own routes (``Cluster.routes``, split
evenly over equal-cost paths), so the link loads the LP sees are the ones the
simulator and the hardware see.

The LP (``_solve``)::

    minimize   t
    subject to sum_T phi_T = 1
               sum_T phi_T * load_e(T) / cap_e <= t      for every directed link e
               phi >= 0

``t`` is seconds per byte: the steady-state time of a pipelined plan is
``t * size``. Columns come from column generation: the reduced cost of a tree is
the sum of its edge weights under the link duals, so *pricing is a minimum
spanning tree* and the LP is solved exactly over all spanning trees (for
clusters small enough to price every GPU pair).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Literal, NoReturn, overload

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, milp, LinearConstraint, Bounds
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree

from ...cluster import Box, Cluster
from ...errors import InfeasiblePlanError

__all__ = ["LinkModel", "Packing", "solve_packing", "price_mst", "quiet_milp"]


@contextlib.contextmanager
def _stdout_muted() -> Iterator[None]:
    """Point file descriptor 1 at /dev/null: HiGHS' MIP solver (inside scipy's milp) can
    print lines of its own with C's printf, which would land in the middle of
    ``topoplan plan --json``."""
    try:
        fd = sys.__stdout__.fileno() if sys.__stdout__ is not None else -1
    except (OSError, ValueError):
        fd = -1
    if fd < 0:
        yield
        return
    for stream in (sys.stdout, sys.__stdout__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    saved = os.dup(fd)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def quiet_milp(*args: Any, **kwargs: Any) -> Any:
    """``scipy.optimize.milp`` with HiGHS' own printing kept off standard output."""
    with _stdout_muted():
        return milp(*args, **kwargs)

# (side, position-or-global-index, weight, [count]) arrays of one pair class's route loads.
_Template = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# --------------------------------------------------------------------------------------
# Link model: directed physical links, and the load a GPU pair puts on them
# --------------------------------------------------------------------------------------

class LinkModel:
    """Index of the cluster's directed links and cached per-pair loads.

    ``pair_load(u, v)`` is the vector (as ``(link indexes, weights)``) of bytes each
    link carries per byte sent from rank ``u`` to rank ``v``. Loads are computed
    once per *equivalence class* of pairs (box signature, the switches its NICs
    plug into, box-local GPU indexes) and re-instantiated by offset, so 8192 GPUs
    cost a few thousand route look-ups rather than millions.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        graph = cluster.graph
        index: dict[tuple[str, str], int] = {}
        caps: list[float] = []
        # Box-local links (incl. NIC<->switch) get a canonical position per box so
        # that equal boxes share templates.
        self.box_base = np.zeros(len(cluster.boxes), dtype=np.int64)
        self._box_pos: list[dict[tuple[str, str], int]] = []
        for b, box in enumerate(cluster.boxes):
            self.box_base[b] = len(caps)
            prefix = box.name + "/"
            local = []
            for node in _box_nodes(box):
                for _, w, data in graph.out_edges(node, data=True):
                    local.append((node, w, data["bandwidth"]))
                if node.startswith(prefix + "nic"):
                    for x, _, data in graph.in_edges(node, data=True):
                        if not x.startswith(prefix):
                            local.append((x, node, data["bandwidth"]))
            local.sort(key=lambda e: (_strip(e[0], prefix), _strip(e[1], prefix)))
            pos: dict[tuple[str, str], int] = {}
            for u, w, bw in local:
                pos[(_strip(u, prefix), _strip(w, prefix))] = len(caps) - int(self.box_base[b])
                index[(u, w)] = len(caps)
                caps.append(bw)
            self._box_pos.append(pos)
        self.nbox_links = len(caps)
        for u, w, data in graph.edges(data=True):
            if (u, w) not in index:  # switch <-> switch
                index[(u, w)] = len(caps)
                caps.append(data["bandwidth"])
        self.index = index
        self.cap = np.asarray(caps, dtype=float)
        self.nlinks = len(caps)
        self._rank_box = np.asarray([cluster.box_index(r) for r in range(cluster.nranks)],
                                    dtype=np.int64)
        self._rank_local = np.asarray([cluster.local_index(r) for r in range(cluster.nranks)],
                                      dtype=np.int64)
        # None marks a pair class with no route (cached so the routing runs once per class).
        self._templates: dict[tuple, _Template | None] = {}
        self._box_key = [(box.signature(), tuple(n.switch for n in box.nics))
                         for box in cluster.boxes]
        kid: dict[tuple, int] = {}
        self._box_kid = np.asarray([kid.setdefault(k, len(kid)) for k in self._box_key],
                                   dtype=np.int64)
        self.route_lookups = 0

    def _template_missing(self, u: int, v: int) -> NoReturn:
        raise InfeasiblePlanError(
            f"no route from rank {u} ({self.cluster.gpu_node(u)}) to rank {v} "
            f"({self.cluster.gpu_node(v)}); the cut around {self.cluster.box_of(u).name!r} "
            "has no usable link")

    def label(self, link: int) -> str:
        """A readable name for link ``link`` ("A/nic0->switch0")."""
        if not hasattr(self, "_names"):
            self._names = {i: f"{u}->{w}" for (u, w), i in self.index.items()}
        return self._names[link]

    @overload
    def _template(self, u: int, v: int, allow_missing: Literal[False] = ...) -> _Template: ...

    @overload
    def _template(self, u: int, v: int, allow_missing: bool) -> _Template | None: ...

    def _template(self, u: int, v: int, allow_missing: bool = False) -> _Template | None:
        """(side, position-or-global-index, weight) arrays for the class of pair (u, v)."""
        bu, bv = int(self._rank_box[u]), int(self._rank_box[v])
        lu, lv = int(self._rank_local[u]), int(self._rank_local[v])
        key = (self._box_key[bu], lu, bu == bv, self._box_key[bv], lv)
        if key in self._templates:
            found = self._templates[key]
            if found is None and not allow_missing:
                self._template_missing(u, v)
            return found
        self.route_lookups += 1
        routes = self.cluster.routes(u, v)
        if not routes or (u != v and len(routes[0]) < 2):
            self._templates[key] = None
        if not routes or (u != v and len(routes[0]) < 2):
            if allow_missing:
                return None
            raise InfeasiblePlanError(
                f"no route from rank {u} ({self.cluster.gpu_node(u)}) to rank {v} "
                f"({self.cluster.gpu_node(v)}); the cut around {self.cluster.box_of(u).name!r} "
                "has no usable link")
        share = 1.0 / len(routes)
        acc: dict[tuple[int, int], float] = {}
        box_u, box_v = self.cluster.boxes[bu], self.cluster.boxes[bv]
        pu, pv = box_u.name + "/", box_v.name + "/"
        for path in routes:
            for a, c in zip(path, path[1:]):
                if a.startswith(pu) or (c.startswith(pu) and not a.startswith(pv)):
                    side, pos = 0, self._box_pos[bu][(_strip(a, pu), _strip(c, pu))]
                elif a.startswith(pv) or c.startswith(pv):
                    side, pos = 1, self._box_pos[bv][(_strip(a, pv), _strip(c, pv))]
                else:
                    side, pos = 2, self.index[(a, c)]
                acc[(side, pos)] = acc.get((side, pos), 0.0) + share
        items = sorted(acc.items())
        sides = np.fromiter((s for (s, _), _ in items), dtype=np.int8, count=len(items))
        poss = np.fromiter((p for (_, p), _ in items), dtype=np.int64, count=len(items))
        wts = np.fromiter((w for _, w in items), dtype=float, count=len(items))
        found = (sides, poss, wts, np.asarray([len(items)]))
        self._templates[key] = found
        return found

    def edges_load(self, us: np.ndarray, vs: np.ndarray) -> np.ndarray:
        """Dense load vector of sending one byte along every (us[i] -> vs[i]) and back.

        Vectorized per pair class: one template per class, instantiated by box offsets.
        """
        us, vs = np.asarray(us, dtype=np.int64), np.asarray(vs, dtype=np.int64)
        cols, vals = [], []
        for a_arr, b_arr in ((us, vs), (vs, us)):
            bu, bv = self._rank_box[a_arr], self._rank_box[b_arr]
            keys = np.stack([self._box_kid[bu], self._rank_local[a_arr], (bu == bv).astype(np.int64),
                             self._box_kid[bv], self._rank_local[b_arr]], axis=1)
            uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
            inverse = inverse.ravel()
            order = np.argsort(inverse, kind="stable")
            bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
            for g in range(len(uniq)):
                idx = order[bounds[g]:bounds[g + 1]]
                i0 = int(idx[0])
                sides, poss, wts, _ = self._template(int(a_arr[i0]), int(b_arr[i0]))
                base = np.where(sides[None, :] == 0, self.box_base[bu[idx]][:, None],
                                np.where(sides[None, :] == 1, self.box_base[bv[idx]][:, None], 0))
                cols.append((base + poss[None, :]).ravel())
                vals.append(np.broadcast_to(wts, base.shape).ravel())
        if not cols:
            return np.zeros(self.nlinks)
        return np.bincount(np.concatenate(cols), weights=np.concatenate(vals),
                           minlength=self.nlinks)

    def pair_matrix(self, nodes: list[int]) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        """Sparse (pairs x links) loads of every unordered pair of ``nodes``, both directions."""
        ii, jj = np.triu_indices(len(nodes), k=1)
        rows, cols, vals = [], [], []
        self.missing = np.zeros(len(ii), dtype=bool)
        for p, (i, j) in enumerate(zip(ii.tolist(), jj.tolist())):
            fwd = self._template(nodes[i], nodes[j], allow_missing=True)
            back = self._template(nodes[j], nodes[i], allow_missing=True)
            if fwd is None or back is None:
                self.missing[p] = True  # no direct route: relaying through GPUs may still work
                continue
            for (u, v), temp in zip(((nodes[i], nodes[j]), (nodes[j], nodes[i])), (fwd, back)):
                sides, poss, wts, _ = temp
                base = np.where(sides == 0, self.box_base[self._rank_box[u]],
                                np.where(sides == 1, self.box_base[self._rank_box[v]], 0))
                rows.append(np.full(len(poss), p))
                cols.append(base + poss)
                vals.append(wts)
        if not rows:
            return sp.csr_matrix((0, self.nlinks)), ii, jj
        matrix = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                               shape=(len(ii), self.nlinks))
        return matrix, ii, jj


def _box_nodes(box: Box) -> list[str]:
    nodes = [box.gpu_node(j) for j in range(box.gpus)]
    if box.fabric is not None:
        nodes.append(box.fabric_node)
    nodes += [box.nic_node(k) for k in range(len(box.nics))]
    return nodes


def _strip(node: str, prefix: str) -> str:
    if node.startswith(prefix):
        return node[len(prefix):]
    return "@" if "/" not in node else node  # the switch a NIC plugs into, or another box


# --------------------------------------------------------------------------------------
# Tree packing LP with column generation
# --------------------------------------------------------------------------------------

@dataclass
class Packing:
    """A solved packing: columns (trees) with fractions and the LP's seconds per byte."""

    fractions: np.ndarray
    columns: list  # opaque per-column payloads (trees), aligned with fractions
    t: float  # seconds per byte of the buffer (steady-state, no latency)
    iterations: int = 0
    lp_seconds: float = 0.0
    status: str = "optimal"
    bottleneck: list[int] = field(default_factory=list)  # link indexes at the max load


def _solve(loads: sp.csc_matrix, cap: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
    """Solve the restricted master LP. Returns (phi, t, link duals, convexity dual)."""
    k = loads.shape[1]
    used = np.flatnonzero(loads.getnnz(axis=1))
    scaled = sp.diags(1.0 / cap[used]) @ loads[used]
    nrow = len(used)
    a_ub = sp.hstack([scaled, -sp.csc_matrix(np.ones((nrow, 1)))], format="csc")
    a_eq = sp.csr_matrix(np.concatenate([np.ones(k), [0.0]])[None, :])
    c = np.zeros(k + 1)
    c[-1] = 1.0
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(nrow), A_eq=a_eq, b_eq=[1.0],
                  bounds=[(0, None)] * (k + 1), method="highs")
    if res.status != 0:
        raise InfeasiblePlanError(f"tree-packing LP failed: {res.message}")
    duals = np.zeros(len(cap))
    duals[used] = -np.asarray(res.ineqlin.marginals) / cap[used]  # >= 0, per unit load
    return res.x[:k], float(res.x[-1]), duals, float(res.eqlin.marginals[0])


def solve_packing(initial: list, load_of, cap: np.ndarray, *, pricer=None,
                  max_iter: int = 400, time_limit: float = 5.0) -> Packing:
    """Column generation for the tree-packing LP.

    Parameters
    ----------
    initial : list
        Starting columns (opaque tree payloads).
    load_of : callable
        ``load_of(column) -> dense load vector`` (bytes per byte on each link).
    cap : ndarray
        Link capacities, bytes/s.
    pricer : callable, optional
        ``pricer(link_weights) -> (column, cost)``: the cheapest column under the
        weights (a minimum spanning tree). Without one the LP is solved over
        ``initial`` only.
    max_iter, time_limit
        Column-generation limits; hitting one returns the best packing so far with
        ``status`` saying so (the LP is still feasible, just maybe not optimal).

    Returns
    -------
    Packing
    """
    start = time.perf_counter()
    # Work in units of the fastest link: raw bytes/s (1e10) make every coefficient
    # look like zero to the solver's tolerances.
    scale = float(cap.max())
    cap = cap / scale
    columns = list(initial)
    vecs = [load_of(c) for c in columns]
    it = 0
    status = "optimal" if pricer is not None else "restricted"
    while True:
        loads = sp.csc_matrix(np.column_stack(vecs))
        phi, t, w, mu = _solve(loads, cap)
        if pricer is None:
            break
        it += 1
        if it > max_iter or time.perf_counter() - start > time_limit:
            status = f"stopped after {it - 1} pricing rounds ({time.perf_counter() - start:.1f} s)"
            break
        col, cost = pricer(w)
        if cost >= mu * (1 - 1e-7) - 1e-15:
            break
        vec = load_of(col)
        if any(np.array_equal(vec, old) for old in vecs[-4:]):
            break
        columns.append(col)
        vecs.append(vec)
    loads = np.column_stack(vecs) @ phi / cap
    peak = loads.max()
    keep = phi > 1e-9 * max(phi.max(), 1e-300)
    phi = np.where(keep, phi, 0.0)
    phi = phi / phi.sum()
    return Packing(fractions=phi, columns=columns, t=float(t) / scale, iterations=it,
                   lp_seconds=time.perf_counter() - start, status=status,
                   bottleneck=np.flatnonzero(loads >= peak * (1 - 1e-6)).tolist())


def solve_exact(packing: Packing, load_of, cap: np.ndarray, *, time_limit: float,
                slack: float = 1e-6) -> tuple[Packing, bool]:
    """MILP: the fewest trees (among the generated columns) that still reach the LP optimum.

    Fewer trees mean fewer chunks, ops and pipeline fills for the same steady-state
    time. Returns the packing and whether the solver proved optimality (False when
    it hit ``time_limit``; the best incumbent, or the LP packing, is returned then).
    """
    scale = float(cap.max())
    cap = cap / scale
    t_lp = packing.t * scale
    vecs = np.column_stack([load_of(c) for c in packing.columns])
    used = np.flatnonzero(vecs.sum(axis=1) > 0)
    k = vecs.shape[1]
    scaled = vecs[used] / cap[used, None]
    # x = [phi (k), z (k, binary)]; loads <= t_lp (1 + slack); phi <= z; sum phi = 1.
    rows = [np.hstack([scaled, np.zeros((len(used), k))]),
            np.hstack([np.eye(k), -np.eye(k)]),
            np.concatenate([np.ones(k), np.zeros(k)])[None, :]]
    lo = np.concatenate([np.full(len(used), -np.inf), np.full(k, -np.inf), [1.0]])
    hi = np.concatenate([np.full(len(used), t_lp * (1 + slack)), np.zeros(k), [1.0]])
    c = np.concatenate([np.zeros(k), np.ones(k)])
    integrality = np.concatenate([np.zeros(k), np.ones(k)])
    res = quiet_milp(c, constraints=LinearConstraint(sp.csr_matrix(np.vstack(rows)), lo, hi),
                     integrality=integrality, bounds=Bounds(np.zeros(2 * k), np.ones(2 * k)),
                     options={"time_limit": time_limit})
    if res.x is None:
        return replace(packing, status="exact-mode time limit (no incumbent; LP packing)"), False
    phi = np.where(res.x[:k] > 1e-9, res.x[:k], 0.0)
    phi = phi / phi.sum()
    proved = res.status == 0
    t = float((scaled @ phi).max()) / scale
    return replace(packing, fractions=phi, t=t,
                   status="exact" if proved else "exact-mode time limit (best incumbent)"), proved


def price_mst(weights: np.ndarray, nodes: list[int], missing: np.ndarray | None = None,
              names: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Minimum spanning tree of the complete graph on ``nodes`` with ``weights`` (condensed
    upper-triangle order), leaving out ``missing`` pairs. Returns edge index arrays
    (i, j) into ``nodes``; raises InfeasiblePlanError naming the cut if none spans."""
    n = len(nodes)
    ii, jj = np.triu_indices(n, k=1)
    dense = np.zeros((n, n))
    # csgraph treats 0 as "no edge": shift so every pair is present.
    w = weights + 1e-30 + 1e-12 * (weights.max() if len(weights) else 0.0)
    if missing is not None:
        w = np.where(missing, 0.0, w)
    dense[ii, jj] = w
    graph = sp.csr_matrix(dense)
    ncomp, labels = connected_components(graph, directed=False)
    if ncomp > 1:
        side = [names[i] if names else str(nodes[i]) for i in np.flatnonzero(labels == labels[0])]
        other = [names[i] if names else str(nodes[i]) for i in np.flatnonzero(labels != labels[0])]
        raise InfeasiblePlanError(
            f"the GPUs are not connected: no route crosses the cut {{{', '.join(side[:8])}"
            f"{', ...' if len(side) > 8 else ''}}} | {{{', '.join(other[:8])}"
            f"{', ...' if len(other) > 8 else ''}}}")
    tree = minimum_spanning_tree(graph).tocoo()
    return tree.row.astype(np.int64), tree.col.astype(np.int64)


def components_text(labels: np.ndarray, names: list[str]) -> str:
    groups: dict[int, list[str]] = {}
    for i, lab in enumerate(labels.tolist()):
        groups.setdefault(lab, []).append(names[i])
    parts = ["{" + ", ".join(g[:6]) + (", ..." if len(g) > 6 else "") + "}" for g in groups.values()]
    return " | ".join(parts)

