"""Trees for the ``mcf`` planner: shapes, rooting, and the pipelined schedule.

``_decompose`` side of the planner: a packing of spanning trees with fractions
becomes a schedule IR v1 program. Tree ``T`` gets ``Q`` equal chunks; chunk ``q``
is reduced up the tree and broadcast down, one step per hop, and chunk ``q + 1``
follows one step behind (a pipeline). All trees share one step clock, so in the
steady state every step moves ``1/Q`` of every tree's fraction and the link
loads per step are the LP's loads divided by ``Q``.

Because a chunk may be received at most once per step (DESIGN.md), the children
of a node send the same chunk in distinct steps ("slots"); a node is ready to
send its partial sum the step after its last child's slot.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order

from ..schedule import Op, OpKind, RankProgram, Schedule

_KINDS = (OpKind.SEND, OpKind.RECV, OpKind.RECV)

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
    # steps[rank]: dict step -> list of (peer, chunk, kind code, reduce) tuples.
    # kind codes sort sends before recvs within a (peer, chunk).
    per_rank: list[dict[int, list[tuple[int, int, int]]]] = [dict() for _ in range(nranks)]
    for t_index, tree in enumerate(trees):
        base = t_index * q
        parent, up, down = tree.parent.tolist(), tree.up.tolist(), tree.down.tolist()
        for v in range(nranks):
            p = parent[v]
            if p < 0:
                continue
            mine, theirs = per_rank[v], per_rank[p]
            u_off, d_off = up[v], down[v]
            for k in range(q):
                ch = base + k
                s = u_off + k
                mine.setdefault(s, []).append((p, ch, 0))      # send partial up
                theirs.setdefault(s, []).append((v, ch, 2))    # recv + reduce
                s = d_off + k
                theirs.setdefault(s, []).append((v, ch, 0))    # send result down
                mine.setdefault(s, []).append((p, ch, 1))      # recv, overwrite
    programs = []
    for r in range(nranks):
        steps = []
        for s in sorted(per_rank[r]):
            ops = per_rank[r][s]
            ops.sort()
            step = []
            for peer, ch, code in ops:
                step.append(Op(_KINDS[code], peer, ch, code == 2))
            steps.append(tuple(step))
        per_rank[r] = {}  # free memory as we go
        programs.append(RankProgram(r, tuple(steps)))
    return Schedule(nranks=nranks, chunks=tuple(chunks), ranks=tuple(programs), meta=dict(meta))
