"""The ``forest`` planner: allgather and reduce-scatter (and an allreduce as the two)
over an LP-optimal packing of spanning out-trees, one set per root, with a certificate
(ForestColl).

An allgather delivers every rank's shard to every other rank. ForestColl (Zhao et al.,
arXiv 2402.06787) proves that broadcasting each shard down a weighted set of spanning
out-trees rooted at its owner, GPUs copying and forwarding (switches do not), reaches
the cut bound ``(M / N) max_S |S ∩ GPUs| / B_out(S)``
(:func:`~topoplan.analysis.bound.shard_bound`). A reduce-scatter is the same trees with
the arcs reversed, summing on the way up.

Here (:func:`solve_forest`) the trees live on the complete digraph of the GPUs, each arc one
message that follows the cluster's own routes (``Cluster.route_loads``: split evenly over
the equal-cost paths, as the simulator moves it), and the LP::

    minimize   t
    subject to sum_T w[r, T] = 1                                   for every root r
               sum_{r, T} w[r, T] load_e(T) / cap_e <= t            for every link e
               w >= 0

is solved by column generation: with the link duals ``y_e``, an arc costs the
dual-weighted length of its route, and the best new tree of root ``r`` is a minimum-cost
arborescence rooted at ``r`` (Chu-Liu/Edmonds, :func:`_arborescence`). When no tree
prices out, ``t`` is the LP optimum over *all* trees, and by ForestColl's theorem it
equals the cut bound wherever the routes can carry the bound's flow: ``meta["gap"]``
reports ``t * (M / N)`` against :func:`~topoplan.analysis.bound.shard_bound`. A tree's
images under the shifts of interchangeable boxes (:func:`_box_shifts`) join the LP with
it, and columns the LP leaves unused are dropped between rounds. A second LP (phase 2)
then keeps every link within :data:`SLACK` of ``t`` and minimizes the trees' relays
(:func:`_relay_costs`), priced the same way: most trees come out two levels deep, and
:func:`_settle` lifts ranks nearer their roots where the links have room.

The schedule (:func:`_piece`, :func:`_materialize`): each tree carries its weight of its
root's shard; an allgather sends it down one tree level per step (a reduce-scatter up,
adding), every tree in the same steps, and the buffer is cut into pipeline pieces, piece
``p`` ``p`` steps behind piece ``p - 1``, sized by ``mcf``'s lock-step LP
(:func:`~topoplan.planners.mcf.pieces.piece_sizes`, :func:`_choose_pieces`) under the
request's profile, on the request's channels (IR v4; with ``"auto"``, the fewest that
its channel model prices best). An allreduce is the reduce-scatter then the allgather
over the same trees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ..analysis.bound import shard_bound
from ..analysis.cost import CostProfile
from ..cluster import Cluster
from ..errors import InfeasiblePlanError, PlannerError
from ..ir.passes import channelize, check_channels, check_skew, slices
from ..ir.schedule import Schedule
from ._checks import check_caps, check_collective
from ._lockstep import empty_schedule, no_gc
from .mcf.build import pieces_schedule
from .mcf.layout import PieceMessages
from .mcf.pieces import piece_sizes
from .mcf.pricing import CostModel, SoftCosts, piece_profile
from .channels import SKEW, check_caps_on_channels, per_channel
from .request import PlanRequest

__all__ = ["plan_forest", "forest_core", "ForestPacking", "solve_forest", "MAX_RANKS"]

#: What ``forest`` plans.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
#: Most ranks ``forest`` plans: its LP prices every ordered GPU pair and a tree per root
#: per round (about 4 s at 64 GPUs); above, ``mcf`` plans the large clusters.
MAX_RANKS = 128
#: Most ops a plan may hold: ``auto`` simulates plans up to
#: :data:`~topoplan.planners.request.MAX_SIM_OPS` and the pipeline deepens to this.
MAX_OPS = 200_000
#: Column generation stops when no tree prices out by this much (relative to ``t``) ...
TOLERANCE = 1e-9
#: ... or after this many rounds (each round prices one tree per root).
MAX_ROUNDS = 400
#: Most box shifts whose images of each tree column generation adds (:func:`_box_shifts`).
MAX_SHIFTS = 64
#: Column generation keeps at most this many trees (or 4 per LP row) between rounds,
#: dropping the unused ones of largest reduced cost to half of it.
KEEP_COLUMNS = 400
#: Phase 2 keeps every link within this much of the LP optimum while it trades trees for
#: shallower ones.
SLACK = 1e-5
#: Phase 2's cost of a link on a tree arc's route (a relay costs 1).
HOP_COST = 0.01
#: The channel counts ``channels="auto"`` prices, and how much more channels must gain
#: on the estimate to be taken (the NCCL transport runs a plan's channels one after
#: another: more of them for no gain is a cost).
CHANNEL_CHOICES = (1, 2, 4)
CHANNEL_GAIN = 1e-3
#: An allgather's default channel skew: its trees send over the network in their first
#: level, when every channel starts at once, and closer slices did better (256 MiB,
#: ideal, skew 1.1 / 1.2: dgx_a100_x4 1.018x / 1.022x the bound, unequal_nics
#: 1.0061x / 1.0066x, unequal_gpus 1.0036x / 1.0052x; a reduce-scatter did as well or
#: better at 1.2).
ALLGATHER_SKEW = 1.1
#: The pipeline depths :func:`_choose_pieces` tries.
PIECE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
#: Trees lighter than this share of their root's shard are dropped (the rest scaled up).
MIN_WEIGHT = 1e-4
_BIG = 1e30  # the cost of an arc with no route


@dataclass(frozen=True)
class ForestPacking:
    """An LP-optimal weighted set of spanning out-trees per root.

    Attributes
    ----------
    parents : ndarray
        ``(trees, N)``: tree ``j``'s parent of each rank (``-1`` at its root).
    roots : ndarray
        Each tree's root, in order (a root's trees are consecutive).
    weights : ndarray
        Each tree's share of its root's shard (they sum to 1 per root).
    t : float
        The busiest link's load under these trees and weights: seconds per byte of one
        shard (``t * M / N`` seconds for an ``M``-byte buffer).
    lp : float
        The LP optimum, the same unit: over every spanning tree when ``status`` is
        ``"optimal"`` (``t`` is within :data:`SLACK` and the dropped light trees of it).
    status : str
        ``"optimal"`` (no tree prices out) or ``"rounds"`` (stopped at
        :data:`MAX_ROUNDS`, ``t`` an upper bound).
    rounds, columns : int
        Column-generation rounds, and trees the LP saw.
    """

    parents: np.ndarray
    roots: np.ndarray
    weights: np.ndarray
    t: float
    lp: float
    status: str
    rounds: int
    columns: int

    def depths(self) -> np.ndarray:
        """``(trees, N)``: each rank's depth in each tree (0 at the root)."""
        return np.stack([_depth(p) for p in self.parents]) if len(self.parents) else \
            np.zeros((0, 0), np.int64)


# --------------------------------------------------------------------------------------
# Minimum-cost arborescence (Chu-Liu/Edmonds), dense
# --------------------------------------------------------------------------------------

def _arborescence(cost: np.ndarray, root: int) -> np.ndarray:
    """Parents of a minimum-cost spanning arborescence rooted at ``root`` (``-1`` there).

    ``cost[u, v]`` is the cost of arc ``u -> v``; :data:`_BIG` marks a missing arc. Dense
    Chu-Liu/Edmonds: every node takes its cheapest in-arc, each cycle of those is
    contracted into one node with the in-arcs re-priced by the arc they replace, and
    the solution of the contracted graph is expanded. ``O(n^3)`` at worst, ``O(n^2)``
    numpy work per contraction.

    References
    ----------
    Y. J. Chu and T. H. Liu, "On the shortest arborescence of a directed graph",
    Scientia Sinica 14 (1965); J. Edmonds, "Optimum branchings", J. Res. NBS 71B (1967).
    """
    n = cost.shape[0]
    c = cost.astype(float, copy=True)
    np.fill_diagonal(c, _BIG)
    c[:, root] = _BIG
    pre = np.argmin(c, axis=0)
    pre[root] = -1
    # Cycles of the cheapest in-arcs: follow each node's chain until it ends or repeats.
    mark = np.full(n, -1, dtype=np.int64)
    comp = np.full(n, -1, dtype=np.int64)
    cycles: list[list[int]] = []
    pre_list = pre.tolist()
    for start in range(n):
        v = start
        while v != -1 and mark[v] == -1:
            mark[v] = start
            v = pre_list[v]
        if v != -1 and mark[v] == start and comp[v] == -1:
            cyc = [v]
            u = pre_list[v]
            while u != v:
                cyc.append(u)
                u = pre_list[u]
            for u in cyc:
                comp[u] = len(cycles)
            cycles.append(cyc)
    if not cycles:
        return pre
    # Contract: the cycles first (ids 0..k-1), then every other node.
    k = len(cycles)
    rest = np.flatnonzero(comp == -1)
    comp[rest] = k + np.arange(len(rest))
    m = k + len(rest)
    in_cost = np.zeros(n)
    in_cyc = comp < k
    in_cost[in_cyc] = c[pre[in_cyc], np.flatnonzero(in_cyc)]
    adj = c - in_cost[None, :]
    adj[c >= _BIG] = _BIG
    order = np.argsort(comp, kind="stable")
    starts = np.searchsorted(comp[order], np.arange(m))
    by_row = np.minimum.reduceat(adj[order], starts, axis=0)
    small = np.minimum.reduceat(by_row[:, order], starts, axis=1)
    np.fill_diagonal(small, _BIG)
    sub = _arborescence(small, int(comp[root]))
    out = pre.copy()
    members = [order[starts[g]:(starts[g + 1] if g + 1 < m else n)] for g in range(m)]
    for g, h in enumerate(sub.tolist()):
        if h < 0:
            continue
        # The arc into group g that the contracted arc h -> g stands for; a cycle keeps
        # its other arcs.
        rows, cols = members[h], members[g]
        if len(rows) == 1 and len(cols) == 1:
            out[cols[0]] = rows[0]
        elif len(cols) == 1:
            out[cols[0]] = rows[int(np.argmin(adj[rows, cols[0]]))]
        elif len(rows) == 1:
            out[cols[int(np.argmin(adj[rows[0], cols]))]] = rows[0]
        else:
            block = adj[rows][:, cols]
            i, j = divmod(int(np.argmin(block)), len(cols))
            out[cols[j]] = rows[i]
    out[root] = -1
    return out


def _depth(parent: np.ndarray) -> np.ndarray:
    """Each node's depth in the tree of ``parent`` (``-1`` at the root)."""
    n = len(parent)
    depth = np.full(n, -1, dtype=np.int64)
    par = parent.tolist()
    for v in range(n):
        chain = []
        u = v
        while u != -1 and depth[u] < 0:
            chain.append(u)
            u = par[u]
        d = -1 if u == -1 else int(depth[u])
        for w in reversed(chain):
            d += 1
            depth[w] = d
    return depth


def _flatten(parent: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``parent`` with each node moved up to its grandparent while that arc costs no
    more: the same or a lower reduced cost, fewer levels to pipeline through."""
    par = parent.copy()
    depth = _depth(par)
    for v in np.argsort(depth, kind="stable").tolist():
        p = int(par[v])
        while p >= 0 and par[p] >= 0 and cost[par[p], v] <= cost[p, v] * (1 + 1e-12):
            p = int(par[p])
        par[v] = p
    return par


# --------------------------------------------------------------------------------------
# The LP: column generation over arborescences
# --------------------------------------------------------------------------------------

class _Arcs:
    """Link loads of every ordered GPU pair: row ``a * N + b`` of :attr:`matrix` is the
    seconds each link is busy per byte sent from ``a`` to ``b`` (times :attr:`scale`)."""

    def __init__(self, model: CostModel, n: int) -> None:
        a, b = np.divmod(np.arange(n * n, dtype=np.int64), n)
        keep = a != b
        inc, _ = model.incidence((a * n + b)[keep])
        inc = sp.csr_array(inc)
        per_s = inc.multiply(1.0 / model.cap[None, :]).tocsr()
        self.scale = float(model.cap.max())
        rows = np.flatnonzero(keep)
        coo = per_s.tocoo()
        self.matrix = sp.csr_array((coo.data * self.scale, (rows[coo.row], coo.col)),
                                   shape=(n * n, len(model.cap)))
        self.n = n
        used = np.flatnonzero(np.asarray(self.matrix.sum(axis=0)).ravel() > 0)
        self.links = used  # the links some message crosses: one LP row each
        self.sub = self.matrix[:, used].tocsc().tocsr()

    def load(self, parent: np.ndarray, upward: bool) -> np.ndarray:
        """The (scaled) link loads, on :attr:`links`, of one tree's messages."""
        v = np.flatnonzero(parent >= 0)
        p = parent[v]
        keys = v * self.n + p if upward else p * self.n + v
        return np.asarray(self.sub[keys].sum(axis=0)).ravel()

    def costs(self, duals: np.ndarray, upward: bool) -> np.ndarray:
        """``cost[p, v]``: the dual price of the tree arc ``p -> v`` (its message goes
        ``v -> p`` when ``upward``)."""
        c = (self.sub @ duals).reshape(self.n, self.n)
        return c.T.copy() if upward else c


def solve_forest(cluster: Cluster, *, upward: bool = False, time_limit: float = 60.0,
                 model: CostModel | None = None) -> ForestPacking:
    """The LP-optimal packing of spanning out-trees, one set per root (column
    generation; module docstring).

    Parameters
    ----------
    cluster : Cluster
    upward : bool
        Price the trees' messages child to parent (a reduce-scatter's in-trees) instead
        of parent to child (an allgather's out-trees). On a symmetric topology both
        have the same optimum.
    time_limit : float
        Seconds of column generation before it stops with what it has (``status``
        ``"rounds"``).
    model : CostModel, optional
        The cluster's link incidence, if the caller has one.

    Returns
    -------
    ForestPacking

    Raises
    ------
    InfeasiblePlanError
        When some rank cannot reach another (no spanning tree exists), naming them.

    Notes
    -----
    The LP has ``N`` equality rows, a row per link any message crosses and a column per
    tree (at most :data:`KEEP_COLUMNS` or 4 a row kept); each round solves it with HiGHS
    and prices an arborescence per orbit of roots under the box shifts (every root when
    those gain nothing) on the ``N x N`` arc costs (``O(N^3)`` numpy work at worst).
    Phase 1 minimizes ``t``; phase 2 the relays within :data:`SLACK` of it. 32 GPUs:
    under 1 s (``unequal_nics``) to 3 s (``dgx_a100_x4``); 64 GPUs about 4 s.
    """
    n = cluster.nranks
    model = CostModel(cluster) if model is None else model
    arcs = _Arcs(model, n)
    nl = len(arcs.links)
    start = time.monotonic()
    # Start from the trees that are cheapest by time alone (every link priced 1/cap).
    cols: list[np.ndarray] = []
    loads: list[np.ndarray] = []
    roots: list[int] = []
    seen: set[bytes] = set()

    shifts = _box_shifts(cluster)

    def add(root: int, parent: np.ndarray) -> bool:
        """Add the tree and its images under the box shifts; False if it was there."""
        fresh = False
        for perm in shifts:
            image = np.full(n, -1, dtype=np.int64)
            image[perm] = np.where(parent >= 0, perm[np.maximum(parent, 0)], -1)
            key = image.tobytes()
            if key in seen:
                continue
            seen.add(key)
            cols.append(image)
            loads.append(arcs.load(image, upward))
            roots.append(int(perm[root]))
            fresh = True
        return fresh

    orbit = np.arange(n)
    for perm in shifts[1:]:
        orbit = np.minimum(orbit, perm)  # perm of a shift's powers: each orbit's least
    firsts = [r for r in range(n) if orbit[r] == r]
    others = [r for r in range(n) if orbit[r] != r]
    first = arcs.costs(np.ones(nl), upward)
    for r in firsts:
        parent = _arborescence(first, r)
        if (first[parent[parent >= 0], np.flatnonzero(parent >= 0)] >= _BIG / 2).any():
            _unreachable(cluster, first, r)
        add(r, _flatten(parent, first))
    box = np.asarray([cluster.box_index(r) for r in range(n)], dtype=np.int64)
    hops = np.asarray((arcs.sub > 0).sum(axis=1)).reshape(n, n).astype(float)
    relay = _relay_costs(box, hops)

    keep_most = max(KEEP_COLUMNS, 4 * (n + nl))

    def generate(cap: float | None) -> tuple[bool, int]:
        """Rounds of column generation until no tree prices out (True) or the time is
        up (False): phase 1 (``cap`` None) minimizes ``t``, phase 2 the relay cost of
        the trees with every link's load at most ``cap``."""
        rounds = 0
        while True:
            rounds += 1
            obj = None if cap is None else np.asarray([_relay_cost(relay, p, r)
                                                       for p, r in zip(cols, roots)])
            pool = np.stack(loads)
            t, w, y, nu = _master(pool, np.asarray(roots), n, obj, cap)
            if len(cols) > keep_most:
                # Drop the columns the LP uses least: unused, with the largest reduced
                # costs (they may come back when they price out again).
                rc = pool @ y - nu[np.asarray(roots)] + (0.0 if obj is None else obj)
                rc[w > 0] = -np.inf
                drop = np.argsort(rc)[keep_most // 2:]
                gone = np.zeros(len(cols), dtype=bool)
                gone[drop] = True
                for j in np.flatnonzero(gone).tolist():
                    seen.discard(cols[j].tobytes())
                live = np.flatnonzero(~gone).tolist()
                cols[:] = [cols[j] for j in live]
                loads[:] = [loads[j] for j in live]
                roots[:] = [roots[j] for j in live]
            dual = arcs.costs(y, upward)
            added = 0
            # The orbits' first roots, then (when none of them gains) every other root.
            for group in (firsts, others):
                for r in group:
                    cost = dual if cap is None else dual + relay[r]
                    parent = _flatten(_arborescence(cost, r), cost)
                    v = np.flatnonzero(parent >= 0)
                    reduced = float(cost[parent[v], v].sum()) - nu[r]
                    scale = max(abs(t), abs(nu[r]), 1e-30)
                    if reduced < -TOLERANCE * scale and add(r, parent):
                        added += 1
                if added:
                    break
            if not added:
                return True, rounds
            if rounds >= MAX_ROUNDS or time.monotonic() - start > time_limit:
                return False, rounds

    solved, rounds = generate(None)
    t_lp, _, _, _ = _master(np.stack(loads), np.asarray(roots), n)
    status = "optimal" if solved else "rounds"
    # Phase 2: among the packings within SLACK of t, the one of fewest relays.
    _, more = generate(t_lp * (1 + SLACK))
    rounds += more
    pool = np.stack(loads)
    obj = np.asarray([_relay_cost(relay, p, r) for p, r in zip(cols, roots)])
    _, weights, _, _ = _master(pool, np.asarray(roots), n, obj, t_lp * (1 + SLACK))
    parents = np.stack(cols)
    root_arr = np.asarray(roots, dtype=np.int64)
    weights = np.where(weights >= MIN_WEIGHT, weights, 0.0)
    for r in range(n):
        mine = root_arr == r
        weights[mine] /= weights[mine].sum()
    keep = np.flatnonzero(weights > 0)
    # A root's trees consecutive, the heaviest last: a shard's last chunk is never tiny
    # (one under SHARD_TOLERANCE of the buffer would read as the next shard's).
    keep = keep[np.lexsort((weights[keep], root_arr[keep]))]
    t = float((weights[keep] @ pool[keep]).max())
    return ForestPacking(parents=parents[keep], roots=root_arr[keep], weights=weights[keep],
                         t=t / arcs.scale, lp=t_lp / arcs.scale, status=status,
                         rounds=rounds, columns=len(cols))


def _box_shifts(cluster: Cluster) -> list[np.ndarray]:
    """Rank permutations that map the cluster onto itself: shift ``s`` moves every box
    ``s`` places along the boxes interchangeable with it (same signature, same
    switches), GPU ``j`` to GPU ``j``; ``s = 0 .. L - 1`` for ``L`` the least common
    multiple of the class sizes (at most :data:`MAX_SHIFTS`; beyond, none).

    A tree's images under them are trees of the same cost, so column generation adds
    them together: the LP's optimum is symmetric, and it gets there in fewer rounds.
    """
    import math

    classes: dict[tuple, list[int]] = {}
    for b, box in enumerate(cluster.boxes):
        key = (box.signature(), tuple(nic.switch for nic in box.nics))
        classes.setdefault(key, []).append(b)
    order = 1
    for members in classes.values():
        order = math.lcm(order, len(members))
    n = cluster.nranks
    if order > MAX_SHIFTS:
        return [np.arange(n)]
    out = []
    for s in range(order):
        perm = np.arange(n)
        for members in classes.values():
            for i, b in enumerate(members):
                src, dst = cluster.boxes[b], cluster.boxes[members[(i + s) % len(members)]]
                perm[src.first_rank:src.first_rank + src.gpus] = np.arange(
                    dst.first_rank, dst.first_rank + dst.gpus)
        out.append(perm)
    return out


def _relay_costs(box: np.ndarray, hops: np.ndarray) -> np.ndarray:
    """``(roots, N, N)``: phase 2's cost of tree arc ``u -> v`` in a tree of root ``r``:
    0 from the root, 1 from another rank of ``v``'s box, 2 from another box, plus
    :data:`HOP_COST` per link its route crosses. Fewer relays are fewer levels for a
    piece to cross, relays across boxes load the network at more than one level, and
    shorter routes share fewer switches."""
    n = len(box)
    base = np.where(box[:, None] == box[None, :], 1.0, 2.0)
    out = np.broadcast_to(base, (n, n, n)).copy()
    out[np.arange(n), np.arange(n), :] = 0.0
    return out + HOP_COST * hops[None, :, :]


def _relay_cost(relay: np.ndarray, parent: np.ndarray, root: int) -> float:
    v = np.flatnonzero(parent >= 0)
    return float(relay[root][parent[v], v].sum())


def _master(loads: np.ndarray, roots: np.ndarray, n: int, obj: np.ndarray | None = None,
            cap: float | None = None) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """The restricted master LP over the trees so far: ``t`` (the busiest link's load),
    the weights, the link duals (>= 0) and the root duals. Phase 1 (``cap`` None)
    minimizes ``t``; phase 2 minimizes ``obj . w`` with every load at most ``cap``."""
    j, nl = loads.shape
    if cap is None:
        c = np.zeros(j + 1)
        c[-1] = 1.0
        a_ub = sp.hstack([sp.csr_array(loads.T), sp.csr_array(-np.ones((nl, 1)))]).tocsr()
        b_ub = np.zeros(nl)
        a_eq = sp.csr_array((np.ones(j), (roots, np.arange(j))), shape=(n, j + 1))
    else:
        assert obj is not None
        c = obj
        a_ub = sp.csr_array(loads.T)
        b_ub = np.full(nl, cap)
        a_eq = sp.csr_array((np.ones(j), (roots, np.arange(j))), shape=(n, j))
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(n),
                  bounds=(0, None), method="highs")
    if res.status != 0:
        raise InfeasiblePlanError(f"forest: the tree-packing LP failed ({res.message})")
    y = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
    nu = np.asarray(res.eqlin.marginals)
    w = np.asarray(res.x[:j])
    t = float(res.x[-1]) if cap is None else float((w @ loads).max())
    return t, w, y, nu


def _unreachable(cluster: Cluster, cost: np.ndarray, root: int) -> None:
    """Raise for the first rank that ``root`` cannot reach, even through other GPUs."""
    reach = {root}
    frontier = [root]
    while frontier:
        u = frontier.pop()
        for v in np.flatnonzero(cost[u] < _BIG / 2).tolist():
            if v not in reach:
                reach.add(v)
                frontier.append(v)
    lost = next(v for v in range(cluster.nranks) if v not in reach)
    raise InfeasiblePlanError(
        f"forest: rank {lost} ({cluster.gpu_node(lost)}) cannot be reached from rank {root} "
        f"({cluster.gpu_node(root)}) in cluster {cluster.name!r}, even through other GPUs; "
        "connect their boxes or switches")


def _settle(packing: ForestPacking, arcs: _Arcs, upward: bool) -> ForestPacking:
    """``packing`` with its trees made shallower where the links have room: a rank moves
    up to its grandparent while no link's load rises above the packing's busiest one.

    The LP's trees are optimal but often deep (every in-box arc costs the same, so a
    box is as likely to be a chain as a star); each level is a step every piece must
    cross. A move keeps ``t``: the certificate stands.
    """
    parents = packing.parents.copy()
    w = packing.weights
    total = np.zeros(len(arcs.links))
    for j in range(len(parents)):
        total += w[j] * arcs.load(parents[j], upward)
    limit = total.max() * (1 + 1e-9)
    sub, n = arcs.sub, arcs.n

    def row(p: int, v: int) -> sp.csr_array:
        return sub[[v * n + p if upward else p * n + v]]

    for j in range(len(parents)):
        par = parents[j]
        for v in np.argsort(_depth(par), kind="stable").tolist():
            p = int(par[v])
            while p >= 0 and par[p] >= 0:
                g = int(par[p])
                delta = (row(g, v) - row(p, v)).toarray().ravel() * w[j]
                if (total + delta > limit).any():
                    break
                total += delta
                par[v] = p = g
    return ForestPacking(parents=parents, roots=packing.roots, weights=packing.weights,
                         t=packing.t, lp=packing.lp, status=packing.status, rounds=packing.rounds,
                         columns=packing.columns)


# --------------------------------------------------------------------------------------
# The schedule: trees level by level, pipelined over pieces
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Piece:
    """One pipeline piece of every tree: its messages (chunk ``j`` is tree ``j``'s part,
    trees of a root consecutive; a message of several trees' chunks starts at its first)."""

    msgs: PieceMessages
    fractions: np.ndarray  # of each piece-local chunk, for a piece of the whole buffer


def _piece(packing: ForestPacking, collective: str) -> _Piece:
    """The messages of one piece (module docstring): an allgather's tree sends to depth
    ``d`` in step ``d - 1``; a reduce-scatter's rank at depth ``d`` sends its partial sum
    up in step ``D - d`` (``D`` the deepest level of any tree), so that every tree ends
    in the last step; an allreduce does both, ``D`` steps apart."""
    parents, roots = packing.parents, packing.roots
    n = parents.shape[1]
    depths = packing.depths()
    deepest = int(depths.max()) if depths.size else 0
    j, v = np.nonzero(parents >= 0)
    p = parents[j, v]
    d = depths[j, v]
    parts = []
    if collective != "allgather":
        parts.append((deepest - d, v, p, True))
    if collective != "reduce_scatter":
        offset = deepest if collective == "allreduce" else 0
        parts.append((offset + d - 1, p, v, False))
    step = np.concatenate([s for s, _, _, _ in parts])
    src = np.concatenate([a for _, a, _, _ in parts])
    dst = np.concatenate([b for _, _, b, _ in parts])
    red = np.concatenate([np.full(len(j), r) for _, _, _, r in parts])
    tree = np.tile(j, len(parts))
    # A run of consecutive trees of one root between the same pair in the same step is
    # one message (an IR v2 chunk range).
    order = np.lexsort((tree, dst, src, step))
    step, src, dst, red, tree = step[order], src[order], dst[order], red[order], tree[order]
    new = np.ones(len(step), dtype=bool)
    new[1:] = ((step[1:] != step[:-1]) | (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
               | (tree[1:] != tree[:-1] + 1) | (roots[tree[1:]] != roots[tree[:-1]]))
    starts = np.flatnonzero(new)
    count = np.diff(np.append(starts, len(step)))
    chunk = tree[starts]
    msgs = PieceMessages(step=step[starts], src=src[starts], dst=dst[starts], chunk=chunk,
                         count=count.astype(np.int64), reduce=red[starts],
                         nsteps=(2 if collective == "allreduce" else 1) * deepest,
                         nchunks=len(roots))
    return _Piece(msgs=msgs, fractions=packing.weights / n)


def _materialize(piece: _Piece, packing: ForestPacking, sizes: np.ndarray, collective: str,
                 **meta: Any) -> Schedule:
    """``len(sizes)`` pieces of ``piece``, piece ``p`` ``p`` steps late. Root ``r``'s
    chunks make its shard: tree ``i`` of its ``K`` trees in piece ``p`` is chunk
    ``base_r + k K + i``, a share ``sizes[p] * weight / N`` of the buffer, with ``k``
    the rank of piece ``p`` by size (the largest last)."""
    msgs = piece.msgs
    n = packing.parents.shape[1]
    q = len(sizes)
    per_root = np.bincount(packing.roots, minlength=n)
    base = np.concatenate([[0], np.cumsum(per_root)[:-1]]) * q
    first = np.searchsorted(packing.roots, np.arange(n))
    tree_index = np.arange(len(packing.roots)) - first[packing.roots]
    # Pieces numbered smallest first within each shard (the largest last, see
    # solve_forest), each piece its trees in order.
    rank_of = np.empty(q, dtype=np.int64)
    rank_of[np.argsort(sizes, kind="stable")] = np.arange(q)
    ids = (base[packing.roots][None, :] + rank_of[:, None] * per_root[packing.roots][None, :]
           + tree_index[None, :])
    fractions = np.empty(ids.size)
    fractions[ids.ravel()] = (np.asarray(sizes)[:, None] * piece.fractions[None, :]).ravel()
    # a message's chunk is its tree: in piece p, that tree's chunk of its root's shard
    return pieces_schedule(n, msgs, q, lambda p, tree: ids[p, tree], fractions,
                           collective=collective, **meta)


def _choose_pieces(loads: np.ndarray, lat: np.ndarray, size: float, soft: SoftCosts,
                   shares: tuple[float, ...] | None, ops_per_piece: int,
                   step_cap: int | None, chunks_per_piece: int, chunk_cap: int | None
                   ) -> tuple[np.ndarray, float]:
    """Piece sizes of least estimate over the counts of :data:`PIECE_COUNTS` that fit
    :data:`MAX_OPS` and the caps, tried in order until one is 1% over the best.

    ``mcf``'s :func:`~topoplan.planners.mcf.pieces.choose_pieces` doubles the count; a
    forest's pipeline has two levels, and the best count often lies between powers of
    two (unequal_nics allgather on 4 channels: 12 pieces 1.0042x the bound, 8 and 16
    1.005x and 1.0061x).
    """
    best: tuple[np.ndarray, float] | None = None
    for q in PIECE_COUNTS:
        if q * ops_per_piece > MAX_OPS and q > 1:
            break
        if (chunk_cap is not None and q * chunks_per_piece > chunk_cap) or \
                (step_cap is not None and soft.peak_ops(q) > step_cap):
            if q > 1:
                break
        cand = piece_sizes(loads, lat, q, size, soft, shares)
        if best is None or cand[1] < best[1]:
            best = cand
        elif cand[1] > best[1] * 1.01:
            break
    assert best is not None
    return best


# --------------------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------------------

@no_gc
def plan_forest(cluster: Cluster, *, size: int, profile: CostProfile | str | None = None,
                collective: str = "allgather", pieces: int | None = None,
                time_limit: float = 30.0, channels: int | str = 1,
                channel_skew: float | None = None, max_step_ops: int | None = None,
                max_chunks: int | None = None) -> Schedule:
    """Plan an allgather, a reduce-scatter or an allreduce over an LP-optimal packing of
    spanning trees (ForestColl), with its certificate.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes of the full buffer (an allgather's output, a reduce-scatter's input).
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`):
        the pipeline's depth is chosen against them.
    collective : {"allgather", "reduce_scatter", "allreduce"}
        An allreduce is the reduce-scatter then the allgather over the same trees.
    pieces : int, optional
        Pipeline pieces (default: chosen by ``mcf``'s lock-step model within
        :data:`MAX_OPS` ops and the caps).
    time_limit : float
        Seconds of column generation before it stops with the trees it has.
    channels : int or "auto"
        Run the plan on this many channels (default 1; IR v4,
        :func:`~topoplan.ir.passes.channelize`), each on a slice of every chunk, so
        that one channel's step latency hides behind another's transfer. ``"auto"``
        prices 1, 2 and 4 with ``mcf``'s channel model and keeps the fewest channels
        whose estimate is within :data:`CHANNEL_GAIN` of the least.
    channel_skew : float, optional
        The ratio of one channel's slice to the next one's: default
        :data:`ALLGATHER_SKEW` for an allgather, else
        :data:`~topoplan.planners.channels.SKEW`.
    max_step_ops, max_chunks : int, optional
        Plan-size caps (of the plan on its channels).

    Returns
    -------
    Schedule
        With ``meta``: ``bound_s`` (:func:`~topoplan.analysis.bound.shard_bound`, twice
        it for an allreduce), ``lp_s`` (the LP optimum for the size), ``gap``
        (``lp_s / bound_s - 1``: 0 up to round-off when the LP is solved and the routes
        carry the bound), ``trees_s`` (the busiest link's time under the trees kept:
        within :data:`SLACK` of ``lp_s``), ``lp_status``, ``trees``, ``depth``, ``pieces``,
        ``estimate_s`` (the lock-step estimate of the plan) and ``lp_rounds``.

    Raises
    ------
    PlannerError
        For a bad size, collective, ``pieces``, ``time_limit`` or cap.
    InfeasiblePlanError
        Above :data:`MAX_RANKS` ranks, when some rank cannot reach another, or when
        even one piece breaks a cap.

    References
    ----------
    L. Zhao et al., "ForestColl: Efficient Collective Communications on Heterogeneous
    Network Fabrics", arXiv 2402.06787 (2024), Theorem 1 and its tree packing.

    Notes
    -----
    The LP prices all ``N (N - 1)`` GPU pairs; each column-generation round solves the
    master LP (``N`` + links rows) and ``N`` arborescences (``O(N^3)`` at worst).
    """
    request = PlanRequest.make(cluster, size=size, profile=profile, collective=collective,
                               max_step_ops=max_step_ops, max_chunks=max_chunks, who="forest")
    return forest_core(request, pieces=pieces, time_limit=time_limit, channels=channels,
                       channel_skew=channel_skew)


@no_gc
def forest_core(request: PlanRequest, *, pieces: int | None = None,
                time_limit: float = 30.0, channels: int | str = 1,
                channel_skew: float | None = None) -> Schedule:
    """:func:`plan_forest` on a validated request."""
    if channels != "auto":
        check_channels(channels)
    if channel_skew is None:
        channel_skew = ALLGATHER_SKEW if request.collective == "allgather" else SKEW
    skew = check_skew(channel_skew)
    counts = CHANNEL_CHOICES if channels == "auto" else (int(channels),)
    if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, int)
                               or pieces < 1):
        raise PlannerError(f"forest: pieces must be an integer >= 1 or None, got {pieces!r}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or not time_limit > 0:
        raise PlannerError(f"forest: time_limit must be a positive number of seconds, "
                           f"got {time_limit!r}")
    collective = check_collective(request.collective, "forest", COLLECTIVES)
    costs = request.profile
    cluster = request.runtime
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, "forest", collective=collective, profile=costs.name)
    if n > MAX_RANKS:
        raise InfeasiblePlanError(
            f"forest: plans at most {MAX_RANKS} ranks (its LP prices every GPU pair), "
            f"{cluster.name!r} has {n}; use mcf")
    started = time.monotonic()
    upward = collective == "reduce_scatter"
    model = CostModel(cluster)
    # The allgather's trees for every collective: a reduce-scatter runs them upward, on
    # the reversed links (the topology is symmetric, so the loads are the same). Trees
    # priced upward have the same LP optimum but simulated up to 4% slower on
    # unequal_nics, in both directions.
    packing = solve_forest(cluster, time_limit=float(time_limit), model=model)
    lp_time = time.monotonic() - started
    packing = _settle(packing, _Arcs(model, n), upward)
    piece = _piece(packing, collective)
    ops_per_piece = 2 * len(piece.msgs.step)
    if ops_per_piece > MAX_OPS:
        raise InfeasiblePlanError(f"forest: one pipeline piece holds {ops_per_piece} ops, "
                                  f"over its budget of {MAX_OPS}; use mcf")
    loads, lat, soft = piece_profile(model, piece.msgs, piece.fractions, costs)
    size = request.size
    best: tuple[float, int, np.ndarray] | None = None
    found = {}
    for nch in counts:
        step_cap = per_channel(request.max_step_ops, nch)
        chunk_cap = per_channel(request.max_chunks, nch)
        if (step_cap is not None and soft.peak_ops(1) > step_cap) or \
                (chunk_cap is not None and piece.msgs.nchunks > chunk_cap):
            continue
        shares = slices(nch, skew) if nch > 1 else None
        if pieces is not None:
            sizes, est = piece_sizes(loads, lat, pieces, size, soft, shares)
        else:
            sizes, est = _choose_pieces(loads, lat, size, soft, shares, ops_per_piece * nch,
                                        step_cap, piece.msgs.nchunks, chunk_cap)
        found[str(nch)] = est
        # Fewest channels first: more of them must gain over CHANNEL_GAIN.
        if best is None or est < best[0] * (1 - CHANNEL_GAIN):
            best = (est, nch, sizes)
    if best is None:
        raise InfeasiblePlanError(
            f"forest: one piece posts {soft.peak_ops(1)} ops in a step and holds "
            f"{piece.msgs.nchunks} chunks, over max_step_ops={request.max_step_ops} or "
            f"max_chunks={request.max_chunks}; raise the caps or pick another planner")
    est, nch, sizes = best
    shard = size / n
    bound = shard_bound(cluster, size) * (2 if collective == "allreduce" else 1)
    phases = 2 if collective == "allreduce" else 1
    lp_s = packing.lp * shard * phases
    meta: dict[str, Any] = {
        "cluster": cluster.name, "profile": costs.name, "estimate_s": est,
        "bound_s": bound, "lp_s": lp_s, "gap": lp_s / bound - 1 if bound > 0 else 0.0,
        "trees_s": packing.t * shard * phases,
        "lp_status": packing.status, "lp_rounds": packing.rounds,
        "lp_columns": packing.columns, "lp_time_s": lp_time, "trees": len(packing.roots),
        "depth": int(packing.depths().max()), "pieces": len(sizes),
        "channel_candidates": found}
    schedule = _materialize(piece, packing, sizes, collective, algorithm="forest", **meta)
    if nch == 1:
        return check_caps(schedule, request.max_step_ops, request.max_chunks, "forest")
    return check_caps_on_channels(channelize(schedule, nch, skew), nch, request.max_step_ops,
                                  request.max_chunks)
