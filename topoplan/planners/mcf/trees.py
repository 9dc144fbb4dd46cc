"""Trees for the ``mcf`` planner: shapes, rooting, and the pipelined schedule.

``_decompose`` side of the planner: a packing of spanning trees with fractions
becomes a schedule IR v1 program. Tree ``T`` gets ``Q`` equal chunks; chunk ``q``
is reduced up the tree and broadcast down, one step per hop, and chunk ``q + 1``
follows one step behind (a pipeline). All trees share one step clock, so in the
steady state every step moves ``1/Q`` of every tree's fraction and the link
loads per step are the LP's loads divided by ``Q``.

Because a chunk may be received at most once per step (docs/SCHEDULE.md), the children
of a node send the same chunk in distinct steps ("slots"); a node is ready to
send its partial sum the step after its last child's slot.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

from ...ir.schedule import RankProgram, Schedule
from .._lockstep import schedule_from_arrays


__all__ = ["Tree", "make_tree", "inorder_edges", "path_edges", "materialize"]


class Tree:
    """A rooted spanning tree on ranks ``0..n-1`` with pipeline timing.

    Attributes
    ----------
    parent : ndarray
        ``parent[v]`` (``-1`` at the root).
    up : ndarray
        Step offset at which ``v`` sends its partial sum of chunk ``q`` to its parent
        (at global step ``q + up[v]``).
    down : ndarray
        Step offset at which ``v`` receives the result of chunk ``q`` from its parent.
    span : int
        Steps from the first send of a chunk to its last receive (the pipeline fill).
    """

    __slots__ = ("parent", "up", "down", "span", "root", "order")

    def __init__(self, parent: np.ndarray, root: int, order: np.ndarray) -> None:
        self.parent, self.root, self.order = parent, root, order
        n = len(parent)
        ready = np.zeros(n, dtype=np.int64)
        up = np.zeros(n, dtype=np.int64)
        kids: list[list[int]] = [[] for _ in range(n)]
        for v in order[1:].tolist():
            kids[int(parent[v])].append(v)
        for v in order[::-1].tolist():  # leaves first
            if kids[v]:
                slot = -1
                for c in sorted(kids[v], key=lambda c: (ready[c], c)):
                    slot = max(int(ready[c]), slot + 1)
                    up[c] = slot
                ready[v] = slot + 1
        depth = np.zeros(n, dtype=np.int64)
        for v in order[1:].tolist():
            depth[v] = depth[parent[v]] + 1
        top = int(ready[root])
        down = top + depth - 1
        down[root] = -1
        self.up, self.down = up, down
        self.span = top + int(depth.max())


def make_tree(n: int, us: np.ndarray, vs: np.ndarray, root: int | None = None) -> Tree:
    """Root the undirected spanning tree ``(us[i], vs[i])`` on ``n`` nodes.

    Without ``root``, the tree's center (the middle of a longest path), which keeps
    the pipeline fill short.
    """
    adj = sp.csr_matrix((np.ones(len(us)), (us, vs)), shape=(n, n))
    adj = adj + adj.T
    if root is None:
        order, pred = breadth_first_order(adj, 0, directed=False)
        far = _farthest(order, pred)
        order, pred = breadth_first_order(adj, far, directed=False)
        other = _farthest(order, pred)
        path = [other]
        while path[-1] != far:
            path.append(int(pred[path[-1]]))
        root = path[len(path) // 2]
    order, pred = breadth_first_order(adj, root, directed=False)
    if len(order) != n:
        raise ValueError(f"tree with {len(us)} edges does not span {n} nodes")
    parent = np.asarray(pred, dtype=np.int64)
    parent[root] = -1
    return Tree(parent, int(root), np.asarray(order, dtype=np.int64))


def _farthest(order: np.ndarray, pred: np.ndarray) -> int:
    depth = {int(order[0]): 0}
    for v in order[1:].tolist():
        depth[v] = depth[int(pred[v])] + 1
    return max(depth, key=lambda v: (depth[v], -v))


def inorder_edges(seq: list[int], arity: int) -> list[tuple[int, int]]:
    """A tree over ``seq`` whose subtrees are (near) contiguous runs of ``seq``.

    The root is the middle element and the rest splits into ``arity`` runs,
    recursively: depth ~ log_arity(n), and a run of the sequence that sits under
    one switch is entered by few tree edges (topology-aware when ``seq`` is
    sorted by switch).
    """
    edges: list[tuple[int, int]] = []
    stack = [list(seq)]
    while stack:
        items = stack.pop()
        mid = len(items) // 2
        root = items[mid]
        rest = items[:mid] + items[mid + 1:]
        k = min(arity, len(rest))
        for i in range(k):
            run = rest[round(i * len(rest) / k):round((i + 1) * len(rest) / k)]
            if run:
                child = run[len(run) // 2]
                edges.append((root, child))
                stack.append(run)
    return edges


def btree_edges(seq: list[int]) -> list[tuple[int, int]]:
    """NCCL's in-order binary tree over ``seq`` (position ``p`` at level = trailing
    zeros of ``p``, 1-indexed). Its leaves are the odd positions, so the same tree
    over ``seq`` shifted by one has them interior: the pair balances degrees
    (a double binary tree, Sanders et al. 2009)."""
    n = len(seq)
    edges = []
    for p in range(1, n + 1):
        h = (p & -p).bit_length() - 1
        q = p
        while True:
            par = q + (1 << h) if not (q >> (h + 1)) & 1 else q - (1 << h)
            if par == 0 or par > n:
                if par == 0 or q == 1 << (n.bit_length() - 1):
                    par = -1
                    break
                q, h = par, h + 1
                continue
            break
        if par > 0 and par != p:
            edges.append((seq[par - 1], seq[p - 1]))
    return edges


def path_edges(seq: list[int]) -> list[tuple[int, int]]:
    return list(zip(seq, seq[1:]))


def choose_pipeline(trees: list[Tree], fractions: np.ndarray, seconds: float,
                    step_latency: float, max_ops: int, nranks: int) -> int:
    """Chunks per tree ``Q``: balance fill time (span/Q of the work) against per-step
    latency (Q steps), within an op budget."""
    fill = max(t.span for t in trees)
    best = max(1.0, (fill * seconds / max(step_latency, 1e-9)) ** 0.5)
    ops_per_q = 4 * len(trees) * max(nranks - 1, 1)
    cap = max(1, max_ops // ops_per_q)
    return int(max(1, min(best, cap, 512)))


def materialize(nranks: int, trees: list[Tree], fractions: np.ndarray, q: int,
                **meta) -> Schedule:
    """The pipelined reduce+broadcast schedule for ``trees`` with ``q`` chunks each.

    Complexity: ``4 * len(trees) * (nranks - 1) * q`` ops, built with one Python
    loop per (tree, rank) and list slicing per chunk.
    """
    if nranks == 1:
        return Schedule(nranks=1, chunks=(1.0,), ranks=(RankProgram(0, ()),), meta=dict(meta))
    chunks: list[float] = []
    for phi in fractions.tolist():
        chunks += [phi / q] * q
    total = sum(chunks[:-1])
    chunks[-1] = 1.0 - total
    # Every message of every tree and chunk as flat arrays, then one lexsort puts
    # each rank's ops in (step, peer, chunk, kind) order: sends before recvs, and
    # the messages of a pair within a step in chunk order on both sides.
    ranks_l, steps_l, peers_l, chunks_l, codes_l = [], [], [], [], []
    ks = np.arange(q, dtype=np.int64)
    for t_index, tree in enumerate(trees):
        v = np.flatnonzero(tree.parent >= 0)
        p = tree.parent[v]
        ch = (t_index * q + ks)[None, :]
        up = tree.up[v][:, None] + ks[None, :]
        dn = tree.down[v][:, None] + ks[None, :]
        shape = (len(v), q)
        vv = np.broadcast_to(v[:, None], shape)
        pp = np.broadcast_to(p[:, None], shape)
        cc = np.broadcast_to(ch, shape)
        for rank, step, peer, code in ((vv, up, pp, 0), (pp, up, vv, 2), (pp, dn, vv, 0),
                                       (vv, dn, pp, 1)):
            ranks_l.append(rank.ravel())
            steps_l.append(step.ravel())
            peers_l.append(peer.ravel())
            chunks_l.append(cc.ravel())
            codes_l.append(np.full(rank.size, code, dtype=np.int64))
    rk, st, pe, ck, cd = (np.concatenate(x) for x in (ranks_l, steps_l, peers_l, chunks_l,
                                                          codes_l))
    del ranks_l, steps_l, peers_l, chunks_l, codes_l
    return schedule_from_arrays(nranks, rk, st, pe, ck, cd, chunks, **meta)
