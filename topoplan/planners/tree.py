"""NCCL's double binary tree: two complementary binary trees, each reducing then
broadcasting half of the data, pipelined over chunks."""

from __future__ import annotations

from typing import Sequence

from ..cluster import Cluster
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule, equal_chunks
from ._checks import check_chunks
from ._lockstep import Timeline, empty_schedule, no_gc
from ._order import TopoNode, resolve_order, topo_tree
from ._pipeline_depth import OP_BUDGET, fit_depth, link_params, message_latency, pipeline_depth
from .request import PlanRequest

__all__ = ["plan_tree", "tree_core", "tree_min_ops", "btree", "double_btree", "STEP_OPS"]

#: Ops a rank posts per step once the pipeline is full, for the depth model's per-step
#: cost: a rank interior to one tree (receives from two children and sends to its parent,
#: receives from its parent and sends to two children: 6 ops) is a leaf of the other
#: (sends up and receives down: 2 more). The plans for the shipped topologies post 8 to
#: 10 at most, and a simulated extra chunk costs one step of 8 ops under nccl.
STEP_OPS = 8


def btree(n: int, rank: int) -> tuple[int, list[int]]:
    """Parent and children of ``rank`` in NCCL's in-order binary tree over ``0..n-1``.

    A rank's level is its lowest set bit; rank 0 is the root with a single child
    (the largest power of two below ``n``). Odd ranks are leaves. Same as NCCL's
    ``ncclGetBtree`` (src/graph/trees.cc).
    """
    bit = 1
    while bit < n:
        if bit & rank:
            break
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    children = []
    if lowbit:
        children.append(rank - lowbit)
        down1 = rank + lowbit
        while down1 >= n and lowbit:
            lowbit >>= 1
            down1 = rank + lowbit if lowbit else -1
        if lowbit and down1 >= 0:
            children.append(down1)
    return up, children


def double_btree(n: int) -> tuple[list[int], list[int]]:
    """Parents of each position in NCCL's two trees (``-1`` for the roots).

    The second tree mirrors the first (``n - 1 - r``) when ``n`` is even and shifts it
    by one when ``n`` is odd, so the first tree's leaves (odd positions) are interior
    in the second (``ncclGetDtree``).
    """
    first = [btree(n, r)[0] for r in range(n)]
    second = [-1] * n
    for r in range(n):
        if n % 2 == 0:
            up = btree(n, n - 1 - r)[0]
            second[r] = -1 if up == -1 else n - 1 - up
        else:
            up = btree(n, (r - 1) % n)[0]
            second[r] = -1 if up == -1 else (up + 1) % n
    return first, second


def _schedule_tree(tl: Timeline, parent: Sequence[int], ranks: Sequence[int],
                   chunk_ids: Sequence[int]) -> None:
    """Pipelined reduce then broadcast of ``chunk_ids`` over one tree (positions -> ranks).

    A node sends chunk ``k`` up at slot ``k + up[v]`` and down at ``k + down[v]``. Its
    children's up-slots are one and two before its own, because a step may hold only
    one recv per chunk; the broadcast starts the slot after the root has all.
    """
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    root = -1
    for v, p in enumerate(parent):
        if p < 0:
            root = v
        else:
            children[p].append(v)
    up = [0] * n
    depth = [0] * n
    stack = [root]
    order = []
    while stack:  # preorder: a parent's offsets are set before its children's
        v = stack.pop()
        order.append(v)
        kids = children[v]
        for i, c in enumerate(kids):
            # The last child sends 1 slot before the parent, the one before it 2, ...
            up[c] = up[v] - (len(kids) - i)
            depth[c] = depth[v] + 1
            stack.append(c)
    shift = -min(up)
    for v in range(n):
        up[v] += shift
    top = up[root]  # the root holds the full sum of chunk k from slot k + top on
    for i, k in enumerate(chunk_ids):
        for v in order:
            if v == root:
                continue
            p = parent[v]
            tl.msg(i + up[v], ranks[v], ranks[p], k, True)
            tl.msg(i + top + depth[p], ranks[p], ranks[v], k, False)


def _box_trees(cluster: Cluster) -> tuple[list[int], list[int], list[int]]:
    """NCCL's shape on a multi-box cluster: a double binary tree over the boxes, a chain
    inside each box.

    Returns ``(ranks, first, second)``: positions -> ranks, and each tree's parent per
    position. In the first tree a box's head is its first GPU in ring order and the
    chain runs forward; in the second the head is its last GPU and the chain runs
    backward, so the two trees enter a box through different GPUs (and NICs, where
    GPUs have their own).
    """
    boxes = [node.ranks() for node in _box_nodes(topo_tree(cluster))]
    ranks = [r for box in boxes for r in box]
    where = {r: i for i, r in enumerate(ranks)}
    first_box, second_box = double_btree(len(boxes))
    first = [-1] * len(ranks)
    second = [-1] * len(ranks)
    for b, box in enumerate(boxes):
        for j in range(1, len(box)):  # chains toward the head
            first[where[box[j]]] = where[box[j - 1]]
            second[where[box[-1 - j]]] = where[box[-j]]
        if first_box[b] >= 0:
            first[where[box[0]]] = where[boxes[first_box[b]][0]]
        if second_box[b] >= 0:
            second[where[box[-1]]] = where[boxes[second_box[b]][-1]]
    return ranks, first, second


def _box_nodes(node: TopoNode) -> list[TopoNode]:
    if node.kind == "box":
        return [node]
    return [box for child in node.children for box in _box_nodes(child)]


@no_gc
def plan_tree(cluster: Cluster, *, size: int, chunks: int | None = None,
              order: str | Sequence[int] = "topo", profile: CostProfile | str | None = None,
              max_step_ops: int | None = None, max_chunks: int | None = None) -> Schedule:
    """Plan NCCL's double binary tree allreduce.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes; sets the default pipeline depth.
    chunks : int, optional
        Pipeline depth: chunks per tree (each tree carries half of the buffer). By
        default ``sqrt(fill * M / (alpha * B))`` (the optimum of
        ``(c + fill)(alpha + M / (c B))``, with fill the tree's depth in slots, B the
        bottleneck bandwidth between far ranks and alpha what one step costs before
        its bytes flow under ``profile``: path latency, step overhead, posting
        :data:`STEP_OPS` ops and the alpha of their link class,
        :func:`~topoplan.planners._pipeline_depth.message_latency`), at most 256 and capped so
        the plan stays under ~2 M ops; then lowered until the plan fits ``max_chunks``
        and ``max_step_ops``. Under ``ideal`` alpha is the path latency alone (the
        depth of profile-free topoplan); a costlier runtime gets fewer, larger chunks.
    order : {"topo", "rank"} or sequence of int
        ``"topo"`` (default): on a cluster of several boxes, NCCL's own shape, two
        complementary binary trees over the boxes (in topology order) with a chain
        of GPUs inside each box, so each tree edge crosses the network once per box;
        on one box, the two trees over its GPUs in ring order. ``"rank"`` or a
        permutation: the two trees directly over the ranks in that order.
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`); sets the
        default depth; recorded in ``meta["profile"]``.
    max_step_ops : int, optional
        Most ops a rank may post in one step (an interior rank posts more as the
        pipeline deepens, up to about 10).
    max_chunks : int, optional
        Most chunks the plan may hold (``2 * chunks``).

    Returns
    -------
    Schedule
        ``2 * chunks`` chunks; chunks ``0..c-1`` go over the first tree, ``c..2c-1``
        over the second. About ``c + 3 * depth`` steps.

    Raises
    ------
    PlannerError
        For a bad ``size``, ``chunks``, ``order`` or cap.
    InfeasiblePlanError
        When even depth 1 (or the asked-for ``chunks``) breaks a cap, naming it.

    References
    ----------
    S. Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA
    blog, 2019; P. Sanders, J. Speck, J. L. Traeff, "Two-tree algorithms for full
    bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009.

    Notes
    -----
    ``8 (n - 1) c`` ops.
    """
    request = PlanRequest.make(cluster, size=size, profile=profile,
                               max_step_ops=max_step_ops, max_chunks=max_chunks, who="tree")
    return tree_core(request, chunks=chunks, order=order)


def tree_min_ops(request: PlanRequest) -> int:
    """Fewest ops a tree plan of ``request`` holds, without planning it: every rank but a
    root sends its part up and receives the sum down, a send and a recv each way, in
    each of the two trees (``8 (n - 1)``)."""
    return 8 * (request.cluster.nranks - 1)


@no_gc
def tree_core(request: PlanRequest, *, chunks: int | None = None,
              order: str | Sequence[int] = "topo") -> Schedule:
    """:func:`plan_tree` on a validated request."""
    given = check_chunks(chunks, "tree", "chunks per tree")
    costs, size = request.profile, request.size
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    cluster = request.runtime  # NVLink as the profile's runtime moves data
    n = cluster.nranks
    if isinstance(order, str) and order == "topo" and len(cluster.boxes) > 1:
        positions, first, second = _box_trees(cluster)
        label, shape = "topo", "box trees + in-box chains"
    else:
        positions, label = resolve_order(cluster, order, "tree")
        shape = "rank trees"
        first, second = double_btree(n) if n > 1 else ([-1], [-1])
    if n == 1:
        return empty_schedule(cluster, "tree", order=label, pipeline=1, profile=costs.name)
    depth = given
    if depth is None:
        _, bandwidth = link_params(cluster, positions)
        latency = message_latency(cluster, positions, costs, ops=STEP_OPS)
        fill = 3 * max(_height(first), _height(second))
        cap = max(1, min(256, OP_BUDGET // (16 * n)))
        depth = pipeline_depth(size, fill, latency, bandwidth, cap)

    def build(depth: int) -> Schedule:
        tl = Timeline(n)
        _schedule_tree(tl, first, positions, range(depth))
        _schedule_tree(tl, second, positions, range(depth, 2 * depth))
        return tl.build(equal_chunks(2 * depth), algorithm="tree", cluster=cluster.name,
                        order=label, shape=shape, pipeline=depth, profile=costs.name)

    return fit_depth(build, depth, chosen=given is None, chunks_per_depth=2,
                     max_step_ops=max_step_ops, max_chunks=max_chunks, algorithm="tree")

def _height(parent: Sequence[int]) -> int:
    """Edges on the longest leaf-to-root path."""
    memo: dict[int, int] = {}

    def up(v: int) -> int:
        path = []
        while v >= 0 and v not in memo:
            path.append(v)
            v = parent[v]
        base = memo.get(v, -1) if v >= 0 else -1
        for u in reversed(path):
            base += 1
            memo[u] = base
        return memo[path[0]] if path else base

    return max((up(v) for v in range(len(parent))), default=0)
