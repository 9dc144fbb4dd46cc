"""Pipelined multi-level reduce-scatter/allgather for the ``mcf`` planner.

The construction (BlueConnect's per-level decomposition, SysML'19, with the rings of
every level chosen by an LP and the pipeline depth by a lock-step cost model):

- the ranks are laid out on a grid ``dims = (b_0, ..., b_{L-1})``: in-box levels
  first (the box, or its NVLink islands then the islands), then the boxes under one
  switch, then the switch groups. A rank's coordinate on a level is its position on
  that level's ring;
- reduce-scatter runs level by level, a ring reduce-scatter among the ranks that
  differ in one coordinate only, each on the chunks its earlier levels left it;
  allgather undoes the levels in reverse. Every rank ends with ``N`` final chunks,
  each reduced exactly once along a tree (one root per chunk, as in ForestColl);
- the buffer is split over several *rings* of the first level (Hamiltonian cycles
  of an NVLink mesh, weighted by an LP so that every link carries its share), and
  over ``Q`` pipeline *pieces*; piece ``p`` runs one step after piece ``p - 1``, so
  in-box steps of one piece overlap network steps of the others and every step
  loads the narrow links with the same bytes.

On a level with ``b`` ranks on a non-blocking switch a ring reduce-scatter moves
``(b-1)/b`` of its data through each NIC, the least possible, so the total
through a box's NICs is ``2 (B-1)/B`` of the buffer: the cut bound of the boxes.

Final chunks are numbered in mixed radix, first level most significant, so the
segment a rank hands on at level ``d`` is one run of consecutive chunks: one op
(a chunk range, IR v2) per ring step. Ops: ``4 sum_d (b_d - 1)`` per rank per
piece and ring (116 at 1024 ranks as 8 x 16 x 8; one chunk per op would take
about ``4 N``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ...cluster import Box, Cluster
from ...cost import CostProfile
from ...errors import InfeasiblePlanError
from ...schedule import OpKind, Schedule
from .._lockstep import no_gc, schedule_from_arrays

__all__ = ["Layout", "layouts", "Messages", "messages", "message_count", "estimate", "choose_pieces",
           "build", "box_rings", "box_ring_sets", "SoftCosts", "shard_messages",
           "shard_message_count", "owners", "build_sharded", "rail_layouts"]

_SEND, _RECV = OpKind.SEND, OpKind.RECV
#: The least relative gain for which choose_pieces doubles the pipeline depth.
MIN_GAIN = 2e-3
#: Seconds per fewest-rings MILP (over undirected cycles: ~0.03 s each on a DGX-1).
MILP_SECONDS = 2.0


@dataclass(frozen=True)
class Layout:
    """A grid of the ranks and the first-level rings.

    Attributes
    ----------
    name : str
        Short description for ``meta`` (``"box[8]x2 rings > rail[4]"``).
    dims : tuple of int
        Level sizes, first level first; their product is the rank count.
    grids : tuple of ndarray
        One rank grid (shape ``dims``) per ring of the first level.
    weights : ndarray
        Share of the buffer each ring carries (sums to 1).
    direct : tuple of bool
        Per level: a direct (all-to-all) exchange in one step instead of a ring of
        ``b - 1`` steps (empty: every level a ring). Only for levels whose members
        share a switch or fabric, where both move the least bytes possible.
    """

    name: str
    dims: tuple[int, ...]
    grids: tuple[np.ndarray, ...]
    weights: np.ndarray
    direct: tuple[bool, ...] = ()
    #: A sharded-only construction (:mod:`.rails`): ``dims`` are (groups, boxes a
    #: group, GPUs a box), ``grids[0]`` is that grid of ranks and the chunks are
    #: numbered along it, ``parts`` a shard; not a grid of levels.
    rails: bool = False
    #: Rail layouts: units (``1 / parts`` of a shard) of group offsets sent each round.
    rounds: tuple[int, ...] = ()
    parts: int = 1

    def is_direct(self, d: int) -> bool:
        return bool(self.direct) and self.direct[d]


# --------------------------------------------------------------------------------------
# Rings inside a box: Hamiltonian cycles weighted by an LP
# --------------------------------------------------------------------------------------

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
    from scipy.optimize import Bounds, LinearConstraint

    from .lp import quiet_milp
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


# --------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------

def _switch_groups(cluster: Cluster) -> list[list[int]]:
    """Boxes grouped by the set of switches their NICs plug into, in box order."""
    groups: dict[tuple, list[int]] = {}
    for b, box in enumerate(cluster.boxes):
        key = tuple(sorted({nic.switch for nic in box.nics}))
        groups.setdefault(key, []).append(b)
    return list(groups.values())


def layouts(cluster: Cluster) -> list[Layout]:
    """The grids worth trying on ``cluster`` (empty when its boxes differ).

    In-box: the LP rings over the whole box, or (a box with a fabric whose NVLinks
    form equal islands, e.g. the K80 boards of a p2.8xlarge) islands then the
    fabric. Across boxes: one level per switch group then the groups (when the
    groups are equal), or one level of all boxes.
    """
    boxes = cluster.boxes
    sig = boxes[0].signature()
    if any(box.signature() != sig for box in boxes[1:]):
        return []
    box = boxes[0]
    g, nb = box.gpus, len(boxes)
    first = np.array([b.first_rank for b in boxes], dtype=np.int64)

    # Cross-box level options: lists of box-index grids (shape = cross dims).
    cross: list[tuple[str, tuple[int, ...], np.ndarray]] = []
    if nb > 1:
        groups = _switch_groups(cluster)
        sizes = {len(grp) for grp in groups}
        if len(groups) > 1 and len(sizes) == 1 and sizes != {1}:
            grid = np.array(groups, dtype=np.int64).T  # (boxes per group, groups)
            cross.append((f"switch[{grid.shape[0]}]>groups[{grid.shape[1]}]", grid.shape, grid))
        cross.append((f"boxes[{nb}]", (nb,), np.arange(nb, dtype=np.int64)))
    else:
        cross.append(("", (), np.zeros((), dtype=np.int64)))

    # In-box options: (name, dims, list of local-index grids, weights).
    inbox: list[tuple[str, tuple[int, ...], list[np.ndarray], np.ndarray]] = []
    if g == 1:
        inbox.append(("", (), [np.zeros((), dtype=np.int64)], np.ones(1)))
    else:
        # One option per ring count up to the fewest rings at the LP optimum: more
        # rings load more links but post more ops (the cost profile decides).
        for rings, w, _ in box_ring_sets(cluster, box):
            inbox.append((f"box[{g}]x{len(rings)}", (g,),
                          [np.array(r, dtype=np.int64) for r in rings], w))
        if box.fabric is not None and box.gpu_links:
            islands = nx.Graph()
            islands.add_nodes_from(range(g))
            islands.add_edges_from((l.a, l.b) for l in box.gpu_links)
            comps = [sorted(c) for c in nx.connected_components(islands)]
            comps.sort()
            k = len(comps[0])
            if 1 < k < g and all(len(c) == k for c in comps):
                grid = np.array(comps, dtype=np.int64).T  # (island size, islands)
                inbox.append((f"island[{k}]>fabric[{len(comps)}]", grid.shape, [grid], np.ones(1)))

    out = []
    for iname, idims, igrids, w in inbox:
        # Levels that go through a switch (fabric or network) may be factored into
        # prime levels: recursive halving (log2 b steps instead of b - 1, the same
        # bytes on a non-blocking switch); NVLink rings may not.
        switched = [len(igrids) == 1 and (box.fabric is not None and not box.gpu_links
                                          or iname.startswith("island"))] * len(idims)
        if iname.startswith("island"):
            switched = [False, True]
        for cname, cdims, cgrid in cross:
            dims = tuple(d for d in idims + cdims)
            grids = []
            for lg in igrids:
                # rank = first[box] + local: outer sum over the two grids.
                r = first[cgrid].reshape((1,) * len(idims) + cgrid.shape) + \
                    lg.reshape(lg.shape + (1,) * len(cdims))
                grids.append(r)
            flags = switched + [True] * len(cdims)
            keep = tuple(i for i, d in enumerate(dims) if d > 1)
            flags = [flags[i] for i in keep]
            dims = tuple(dims[i] for i in keep)
            grids = [gr.reshape(dims) for gr in grids]
            name = " > ".join(s for s in (iname, cname) if s) or "single"
            weights = np.asarray(w, dtype=np.float64)
            out.append(Layout(name, dims, tuple(grids), weights))
            fdims, fgrids, fflags = _factored(dims, grids, flags)
            if fdims != dims:
                out.append(Layout(name + " (halving)", fdims, tuple(fgrids), weights))
            if any(d > 2 for d, f in zip(dims, flags) if f):
                # Direct levels: one step (latency) per level instead of b - 1 or log2 b,
                # at most 16 members a level (b - 1 messages in flight per rank).
                seen = {fdims}
                for radix in (16, 4):
                    rdims, rgrids, rflags = _factored(dims, grids, flags, radix=radix)
                    if rdims not in seen:
                        seen.add(rdims)
                        out.append(Layout(f"{name} (direct{'' if radix == 16 else ' radix 4'})",
                                          rdims, tuple(rgrids), weights, tuple(rflags)))
    return out


def _prime_factors(b: int) -> list[int]:
    out, p = [], 2
    while p * p <= b:
        while b % p == 0:
            out.append(p)
            b //= p
        p += 1
    if b > 1:
        out.append(b)
    return out


def _radix_factors(b: int, radix: int) -> list[int]:
    """``b`` as a product of factors, each a product of primes up to ``radix`` when it
    can be (16 -> [4, 4], 8 -> [4, 2], 12 -> [4, 3], 7 -> [7])."""
    out: list[int] = []
    for p in _prime_factors(b):
        if out and out[-1] * p <= radix:
            out[-1] *= p
        else:
            out.append(p)
    return out


def _factored(dims: tuple[int, ...], grids: list[np.ndarray], flags: list[bool],
              radix: int | None = None
              ) -> tuple[tuple[int, ...], list[np.ndarray], list[bool]]:
    """Split every switched level into its prime factors (or factors up to ``radix``),
    nearest members first; the new levels' switched flags."""
    new_dims: list[int] = []
    new_flags: list[bool] = []
    axes_shape: list[int] = []
    perm: list[int] = []
    for d, b in enumerate(dims):
        f = ([b] if not flags[d] else
             _prime_factors(b) if radix is None else _radix_factors(b, radix))
        start = len(axes_shape)
        axes_shape += f
        # C order: the last factor has stride 1 (nearest members); run it first.
        perm += list(range(start + len(f) - 1, start - 1, -1))
        new_dims += f[::-1]
        new_flags += [flags[d]] * len(f)
    out = [g.reshape(axes_shape).transpose(perm) for g in grids]
    return tuple(new_dims), [np.ascontiguousarray(g) for g in out], new_flags


def flat_ring_layout(order: list[int], name: str = "ring") -> Layout:
    """One level: a ring over all ranks in ``order``."""
    return Layout(name, (len(order),), (np.asarray(order, dtype=np.int64),), np.ones(1))


# --------------------------------------------------------------------------------------
# Messages of one piece
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Messages:
    """Every message of one piece of every ring: step, src, dst, first chunk (piece-local),
    chunk count, reduce.

    Chunks are ``ring * N + final index``; ``nsteps`` steps per piece.
    """

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    count: np.ndarray
    reduce: np.ndarray
    nsteps: int
    nchunks: int


def message_count(layout: Layout) -> int:
    """``len(messages(layout).step)``, without building them."""
    n = int(np.prod(layout.dims)) if layout.dims else 1
    return 2 * n * sum(b - 1 for b in layout.dims) * len(layout.grids)


def messages(layout: Layout) -> Messages:
    """The reduce-scatter and allgather messages of one pipeline piece."""
    dims = layout.dims
    nd = len(dims)
    n = int(np.prod(dims)) if nd else 1
    strides = [int(np.prod(dims[d + 1:])) for d in range(nd)]
    coords = np.indices(dims).reshape(nd, -1) if nd else np.zeros((0, 1), np.int64)
    nsteps_of = [1 if layout.is_direct(d) else dims[d] - 1 for d in range(nd)]
    rs_base, t0 = [], 0
    for d in range(nd):
        rs_base.append(t0)
        t0 += nsteps_of[d]
    ag_base = {}
    for d in reversed(range(nd)):
        ag_base[d] = t0
        t0 += nsteps_of[d]
    nsteps = t0
    parts: list[tuple[np.ndarray, ...]] = []
    for r, grid in enumerate(layout.grids):
        ranks = grid.reshape(-1)
        for d in range(nd):
            b = dims[d]
            fixed = np.zeros(n, dtype=np.int64)
            for e in range(d):
                fixed += coords[e] * strides[e]
            t = np.arange(b - 1, dtype=np.int64)
            c = coords[d][:, None]
            direct = layout.is_direct(d)
            # Peer coordinate of each of the b - 1 messages of a rank: the next on the
            # ring, or (direct) every other member once, all in one step.
            peer = (c + 1 + t[None, :]) % b if direct else np.broadcast_to((c + 1) % b, (n, b - 1))
            dst = ranks[(peer - c) * strides[d] + np.arange(n)[:, None]]
            for phase in (0, 1):  # reduce-scatter, allgather
                # Rank c ends the reduce-scatter owning segment c (ring and direct alike).
                if direct:
                    seg = peer if phase == 0 else np.broadcast_to(c, (n, b - 1))
                    step = np.zeros_like(t)
                else:
                    seg = (c - t[None, :] - 1 + phase) % b
                    step = t
                base = rs_base[d] if phase == 0 else ag_base[d]
                # shape (n, b-1): the segment is chunks fixed + seg * stride + [0, stride)
                first = fixed[:, None] + seg * strides[d]
                shape = first.shape
                parts.append((np.broadcast_to((base + step)[None, :], shape).ravel(),
                              np.broadcast_to(ranks[:, None], shape).ravel(),
                              dst.ravel(),
                              (first + r * n).ravel(),
                              np.full(first.size, strides[d], dtype=np.int64),
                              np.full(first.size, phase == 0)))
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return Messages(z, z, z, z, z, np.zeros(0, bool), 0, n * len(layout.grids))
    cat = [np.concatenate(x) for x in zip(*parts)]
    return Messages(cat[0], cat[1], cat[2], cat[3], cat[4], cat[5], nsteps, n * len(layout.grids))


def rail_layouts(cluster: Cluster, model: CostModel | None = None,
                 profile: CostProfile | None = None, size: float = 256 << 20) -> list[Layout]:
    """Rail exchanges with in-box fan-out (:mod:`.rails`)."""
    from .rails import rail_layouts as _rails
    return _rails(cluster, model, profile, size)


def shard_message_count(layout: Layout) -> int:
    """``len(shard_messages(layout, ...).step)``, without building them: one message per
    final chunk a segment holds, ``R N sum_d (b_d - 1) stride_d`` (one phase)."""
    if layout.rails:
        from .rails import rail_message_count
        return rail_message_count(layout)
    dims = layout.dims
    n = int(np.prod(dims)) if dims else 1
    strides = [int(np.prod(dims[d + 1:])) for d in range(len(dims))]
    return n * sum((b - 1) * s for b, s in zip(dims, strides)) * len(layout.grids)


def shard_messages(layout: Layout, collective: str) -> Messages:
    """One piece of a reduce-scatter (the grid's first half) or an allgather (its second
    half), one message per final chunk (count 1), steps from 0.

    Chunks stay piece-local (``ring * N + final``, as in :func:`messages`) so that
    :func:`chunk_fractions` prices them; :func:`build_sharded` renumbers them by owner.
    A segment a rank hands on is a run of final chunks, but the final chunks of one
    owner (its shard) are the same final index in every ring and piece: a run of finals
    is a run of owners only by accident, so each becomes its own op.
    """
    if layout.rails:
        from .rails import rail_messages
        return rail_messages(layout, collective)
    full = messages(layout)
    keep = full.reduce if collective == "reduce_scatter" else ~full.reduce
    half = full.nsteps // 2
    count = full.count[keep]
    reps = lambda a: np.repeat(a[keep], count)  # noqa: E731
    offset = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count,
                                                                      count)
    step = reps(full.step) - (0 if collective == "reduce_scatter" else half)
    return Messages(step, reps(full.src), reps(full.dst), reps(full.chunk) + offset,
                    np.ones(len(step), dtype=np.int64), reps(full.reduce), half, full.nchunks)


def owners(layout: Layout) -> tuple[np.ndarray, np.ndarray, int]:
    """The rank that owns each piece-local chunk after the reduce-scatter, the chunk's
    index among that rank's chunks of the piece, and how many it owns per piece.

    A grid's chunk ``ring * N + k`` (final index ``k`` of ring ``r``) ends at
    ``grids[r].flat[k]``, ``R`` chunks a rank; a rail layout's chunk
    ``position * parts + i`` at ``grids[0].flat[position]``, ``parts`` a rank.
    """
    if layout.rails:
        flat = layout.grids[0].reshape(-1).astype(np.int64)
        c = np.arange(flat.size * layout.parts, dtype=np.int64)
        return flat[c // layout.parts], c % layout.parts, layout.parts
    own = np.concatenate([g.reshape(-1) for g in layout.grids]).astype(np.int64)
    n = int(layout.grids[0].size)
    return own, np.arange(own.size, dtype=np.int64) // n, len(layout.grids)


@no_gc
def build_sharded(nranks: int, msgs: Messages, layout: Layout, sizes: np.ndarray,
                  collective: str, **meta: Any) -> Schedule:
    """Materialize ``len(sizes)`` pieces of :func:`shard_messages` as a ``collective``
    schedule whose chunks are grouped into shards in rank order (docs/SCHEDULE.md).

    Piece ``p`` runs ``p`` steps after piece ``p - 1``. Rank ``o``'s shard is its own
    chunks of every piece (:func:`owners`: ``K`` a piece, one per ring or per part of a
    rail shard), ordered by (piece, index): chunk ``o * Q K + p K + i``. A message's
    chunk range stays one range (its chunks are consecutive parts of one owner's).
    """
    q = len(sizes)
    own, sub, k = owners(layout)
    per_piece = msgs.nchunks
    old = chunk_fractions(layout, np.asarray(sizes, dtype=float))
    p_all = np.arange(q, dtype=np.int64)
    new_id = own[None, :] * (q * k) + p_all[:, None] * k + sub[None, :]
    fractions = np.empty(q * per_piece)
    fractions[new_id.ravel()] = old
    return _materialize(nranks, msgs, q, lambda p, c: new_id[p, c], fractions,
                        collective=collective, **meta)


def chunk_fractions(layout: Layout, sizes: np.ndarray) -> np.ndarray:
    """Fraction of each chunk: pieces (of ``sizes``) x rings x final index (a rail
    layout: pieces x positions x parts, all equal)."""
    n = int(layout.grids[0].size)
    if layout.rails:
        per = np.full(n * layout.parts, 1.0 / (n * layout.parts))
    else:
        per = np.repeat(layout.weights / n, n)
    fr = (np.asarray(sizes)[:, None] * per[None, :]).ravel()
    fr[-1] = 1.0 - fr[:-1].sum()
    return fr


# --------------------------------------------------------------------------------------
# Lock-step cost model
# --------------------------------------------------------------------------------------

class CostModel:
    """Per-pair link incidence (ECMP split) for a lock-step estimate of a schedule."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        graph = cluster.graph
        self.edges = list(graph.edges)
        self.index = {e: i for i, e in enumerate(self.edges)}
        self.cap = np.array([graph.edges[e]["bandwidth"] for e in self.edges])
        self.lat = np.array([graph.edges[e]["latency"] for e in self.edges])
        self.box_of_rank = np.asarray([cluster.box_index(r) for r in range(cluster.nranks)],
                                      dtype=np.int64)
        self._pairs: dict[int, tuple[list[int], list[float], float]] = {}

    def incidence(self, keys: np.ndarray) -> tuple[sp.csr_array, np.ndarray]:
        """(pairs x links) bytes per byte sent, and each pair's worst path latency."""
        n = self.cluster.nranks
        rows, cols, vals, lat = [], [], [], np.zeros(len(keys))
        for i, key in enumerate(keys.tolist()):
            if key not in self._pairs:
                src, dst = divmod(key, n)
                paths = self.cluster.route_edges(src, dst)
                if not paths:
                    raise InfeasiblePlanError(
                        f"no route from rank {src} ({self.cluster.gpu_node(src)}) to rank {dst} "
                        f"({self.cluster.gpu_node(dst)}) in cluster {self.cluster.name!r}; "
                        "connect their boxes or switches")
                use: dict[int, float] = {}
                worst = 0.0
                for path in paths:
                    idx = [self.index[e] for e in path]
                    worst = max(worst, float(self.lat[idx].sum()))
                    for j in idx:
                        use[j] = use.get(j, 0.0) + 1.0 / len(paths)
                self._pairs[key] = (list(use), list(use.values()), worst)
            c, v, w = self._pairs[key]
            rows += [i] * len(c)
            cols += c
            vals += v
            lat[i] = w
        return sp.csr_array((vals, (rows, cols)), shape=(len(keys), len(self.edges))), lat


@dataclass(frozen=True)
class SoftCosts:
    """What a runtime pays per step of one piece beyond its bytes (a cost profile applied
    to a layout): ``ops[s]``, the most ops any rank posts in step ``s``; the profile's
    ``step_overhead``, ``op_overhead`` and ``call_overhead`` (seconds)."""

    ops: np.ndarray
    step: float = 0.0
    op: float = 0.0
    call: float = 0.0

    def total(self, q: int) -> float:
        """Seconds of software cost of ``q`` pieces, piece ``p`` ``p`` steps late: every
        combined step pays the step overhead once and posts the ops of all its pieces
        (serially, at the busiest rank), and the call pays its overhead."""
        nsteps = len(self.ops) + q - 1 if len(self.ops) else 0
        return self.call + nsteps * self.step + q * float(self.ops.sum()) * self.op

    def peak_ops(self, q: int) -> int:
        """The most ops a rank posts in one combined step of ``q`` pieces."""
        if not len(self.ops):
            return 0
        return int(np.convolve(self.ops, np.ones(q, dtype=np.int64)).max())


NO_COSTS = SoftCosts(np.zeros(0, np.int64))


def piece_profile(model: CostModel, msgs: Messages, fractions: np.ndarray,
                  profile: CostProfile | None = None
                  ) -> tuple[np.ndarray, np.ndarray, SoftCosts]:
    """Seconds each link is busy per byte of buffer in each step of one piece
    (``(nsteps, links)``, for a piece of the whole buffer), each step's latency, and the
    software costs of its steps under ``profile``.

    With a profile, a step's latency adds the worst alpha of its messages (box or
    network class) and every link column adds the seconds the busiest rank spends
    adding what the step's reducing recvs brought (the executor adds after the wait),
    per byte of buffer.
    """
    n = model.cluster.nranks
    key = msgs.src * n + msgs.dst
    pairs, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    inc, lat = model.incidence(pairs)
    cum = np.concatenate([[0.0], np.cumsum(fractions)])
    w = cum[msgs.chunk + msgs.count] - cum[msgs.chunk]
    sp_steps = sp.csr_array((w, (msgs.step, inv)), shape=(msgs.nsteps, len(pairs)))
    loads = (sp_steps @ inc).toarray() / model.cap[None, :]
    # Ops per rank and step: a send at src, a recv at dst.
    per_rank = np.zeros((msgs.nsteps, n), dtype=np.int64)
    np.add.at(per_rank, (msgs.step, msgs.src), 1)
    np.add.at(per_rank, (msgs.step, msgs.dst), 1)
    ops = per_rank.max(axis=1) if n else np.zeros(msgs.nsteps, np.int64)
    step_lat = np.zeros(msgs.nsteps)
    if profile is None or profile.is_ideal:
        np.maximum.at(step_lat, msgs.step, lat[inv])
        return loads, step_lat, SoftCosts(ops)
    box = model.box_of_rank
    alpha = np.where(box[msgs.src] == box[msgs.dst], profile.alpha_box, profile.alpha_network)
    np.maximum.at(step_lat, msgs.step, lat[inv] + alpha)
    if profile.reduce_bandwidth is not None:
        red = np.zeros((msgs.nsteps, n))
        np.add.at(red, (msgs.step[msgs.reduce], msgs.dst[msgs.reduce]), w[msgs.reduce])
        loads = loads + (red.max(axis=1) / profile.reduce_bandwidth)[:, None]
    return loads, step_lat, SoftCosts(ops, profile.step_overhead, profile.op_overhead,
                                      profile.call_overhead)


def _window_max(step_lat: np.ndarray, q: int) -> np.ndarray:
    """Latency of each of the ``S + q - 1`` steps: the worst of the pieces in it."""
    s = len(step_lat)
    padded = np.concatenate([np.zeros(q - 1), step_lat, np.zeros(q - 1)])
    if q <= 256:
        return np.lib.stride_tricks.sliding_window_view(padded, q).max(axis=1)[: s + q - 1]
    return np.full(s + q - 1, step_lat.max())


def _link_classes(loads: np.ndarray) -> np.ndarray:
    """The distinct link columns of ``loads`` that carry anything (symmetric links
    have equal columns; one constraint each is enough)."""
    cols = loads[:, loads.max(axis=0) > 0]
    if cols.shape[1] == 0:
        return np.zeros((loads.shape[0], 1))
    scale = cols.max()
    _, keep = np.unique(np.round(cols / scale, 9), axis=1, return_index=True)
    return cols[:, np.sort(keep)]


def estimate(loads: np.ndarray, step_lat: np.ndarray, sizes: np.ndarray, size: float,
             soft: SoftCosts = NO_COSTS) -> float:
    """Lock-step time of pieces of ``sizes`` (fractions, piece ``p`` ``p`` steps late).

    ``loads[s, e]``: seconds per byte of buffer that link ``e`` is busy in step ``s``
    of a piece carrying the whole buffer. A step lasts as long as its busiest link
    plus its worst path latency (and alpha), plus the software costs ``soft`` (step
    overhead, and posting the ops of every piece in it).
    """
    q = len(sizes)
    s, m = loads.shape
    total = np.zeros((s + q - 1, m))
    for p, x in enumerate(sizes.tolist()):
        total[p:p + s] += x * loads
    return float((total.max(axis=1) * size).sum() + _window_max(step_lat, q).sum()
                 + soft.total(q))


def piece_sizes(loads: np.ndarray, step_lat: np.ndarray, q: int, size: float,
                soft: SoftCosts = NO_COSTS) -> tuple[np.ndarray, float]:
    """Piece sizes that minimize the lock-step time (an LP), and that time.

    ``min sum_s T_s  s.t.  T_s >= sum_p x_p loads[s - p, e]  (every step s, link e),
    sum_p x_p = 1, x_p >= 1e-3 / q``. Equal pieces leave the narrow links idle while
    the first piece crosses the box and after the last one left it; small first and
    last pieces shorten that fill. One constraint per distinct link column. The
    software costs do not depend on the sizes: they are added to the time.
    """
    if q == 1:
        ones = np.ones(1)
        return ones, estimate(loads, step_lat, ones, size, soft)
    cols = _link_classes(loads)
    s, m = cols.shape
    nt = s + q - 1
    # variables: x (q), T (nt)
    rows, cidx, vals = [], [], []
    r = 0
    for t in range(nt):
        ps = [p for p in range(q) if 0 <= t - p < s]
        for e in range(m):
            coeffs = [(p, cols[t - p, e]) for p in ps if cols[t - p, e] > 0]
            if not coeffs:
                continue
            for p, v in coeffs:
                rows.append(r)
                cidx.append(p)
                vals.append(v)
            rows.append(r)
            cidx.append(q + t)
            vals.append(-1.0)
            r += 1
    scale = 1.0 / cols.max()
    a_ub = sp.csr_array((np.array(vals) * np.where(np.array(cidx) < q, scale, 1.0),
                         (rows, cidx)), shape=(r, q + nt))
    c = np.concatenate([np.zeros(q), np.ones(nt)])
    a_eq = np.concatenate([np.ones(q), np.zeros(nt)])[None, :]
    bounds = [(1e-3 / q, None)] * q + [(0, None)] * nt
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(r), A_eq=a_eq, b_eq=[1.0], bounds=bounds,
                  method="highs")
    if res.status != 0:
        x = np.full(q, 1.0 / q)
    else:
        x = np.maximum(res.x[:q], 1e-3 / q)
        x /= x.sum()
    return x, estimate(loads, step_lat, x, size, soft)


def choose_pieces(loads: np.ndarray, step_lat: np.ndarray, size: float, ops_per_piece: int,
                  max_ops: int, max_q: int = 256, soft: SoftCosts = NO_COSTS,
                  max_step_ops: int | None = None, chunks_per_piece: int = 1,
                  max_chunks: int | None = None) -> tuple[np.ndarray, float]:
    """Piece sizes (their count ``Q`` within the op budget and the caps) of least
    lock-step time: ``Q`` doubles until the estimate stops gaining; when the budget
    stops the doubling first, the most pieces that fit are tried too.

    Every piece adds a step of fill and its ops to post, so under a cost profile the
    best ``Q`` falls as messages get smaller or dearer. A deeper pipeline must gain at
    least :data:`MIN_GAIN` of the time: without software costs (the ``ideal`` profile)
    a single-level ring gains only rounding from pieces, which made 8-GPU plans of
    128 pieces and 186 k messages. ``max_step_ops`` caps the ops a
    rank posts in one step, ``max_chunks`` the chunks (``chunks_per_piece * Q``).
    """
    def fits(q: int) -> bool:
        return (q <= max_q and q * ops_per_piece <= max_ops
                and (max_chunks is None or q * chunks_per_piece <= max_chunks)
                and (max_step_ops is None or soft.peak_ops(q) <= max_step_ops))

    best = piece_sizes(loads, step_lat, 1, size, soft)
    q = 2
    while fits(q):
        cand = piece_sizes(loads, step_lat, q, size, soft)
        if cand[1] < best[1] * (1 - MIN_GAIN):
            best = cand
        elif cand[1] > best[1] * 1.01:
            return best
        q *= 2
    # Doubling ran out of budget while it still gained: the most pieces that fit.
    most = min(max_q, max_ops // max(ops_per_piece, 1))
    if max_chunks is not None:
        most = min(most, max_chunks // max(chunks_per_piece, 1))
    while most > q // 2 and not fits(most):
        most -= 1
    if most > q // 2 and len(best[0]) == q // 2:
        cand = piece_sizes(loads, step_lat, most, size, soft)
        if cand[1] < best[1] * (1 - MIN_GAIN):
            best = cand
    return best


# --------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------

@no_gc
def build(nranks: int, msgs: Messages, fractions: np.ndarray, q: int, **meta: Any) -> Schedule:
    """Materialize ``q`` pieces of ``msgs`` (piece ``p`` shifted by ``p`` steps)."""
    return _materialize(nranks, msgs, q, lambda p, c: c + p * msgs.nchunks, fractions, **meta)


def _materialize(nranks: int, msgs: Messages, q: int,
                 chunk_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 fractions: np.ndarray, **meta: Any) -> Schedule:
    """``q`` pieces of ``msgs``, piece ``p`` ``p`` steps late; ``chunk_of(p, c)``
    numbers piece ``p``'s piece-local chunk ``c`` in the schedule."""
    m = len(msgs.step)
    p = np.repeat(np.arange(q, dtype=np.int64), m)
    step = np.tile(msgs.step, q) + p
    src = np.tile(msgs.src, q)
    dst = np.tile(msgs.dst, q)
    chunk = chunk_of(p, np.tile(msgs.chunk, q))
    count = np.tile(msgs.count, q)
    red = np.tile(msgs.reduce, q)
    # Each message twice: the send at src (code 0), the recv at dst (code 1 or 2).
    rk = np.concatenate([src, dst])
    st = np.concatenate([step, step])
    pe = np.concatenate([dst, src])
    ck = np.concatenate([chunk, chunk])
    cn = np.concatenate([count, count])
    cd = np.concatenate([np.zeros(len(step), np.int64), 1 + red.astype(np.int64)])
    del step, src, dst, chunk, count, red, p
    return schedule_from_arrays(nranks, rk, st, pe, ck, cd, fractions.tolist(), count=cn, **meta)
