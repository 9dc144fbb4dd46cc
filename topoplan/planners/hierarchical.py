"""Hierarchical allreduce (BlueConnect): reduce-scatter up the levels of the
topology (box, then switch, then higher switches), allgather back down."""

from __future__ import annotations

import math
from typing import Any, Union

from ..cluster import Cluster
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule, equal_chunks
from ._checks import check_chunks
from ._lockstep import Timeline, empty_schedule, no_gc, ring_allgather, ring_reduce_scatter, split
from ._order import TopoNode, topo_order, topo_tree
from ._pipeline_depth import OP_BUDGET, fit_depth, link_params, message_latency
from .request import PlanRequest

__all__ = ["plan_hierarchical", "hierarchical_core", "hierarchical_min_ops", "hierarchy",
           "STEP_OPS"]

#: Ops a rank posts per step of a pipelined plan, for the per-step cost of the depth
#: rule: a ring step is a send and a receive, and while one part runs an in-box stage
#: the part before it runs a network stage (2 + 2).
STEP_OPS = 4

Tree = Union[int, list]  # a rank, or a list of subtrees


def hierarchy(cluster: Cluster) -> tuple[list, int, list[str]]:
    """The topology tree as nested lists of ranks with every rank at the same depth.

    Levels from the bottom: boxes (ranks in NVLink ring order), then the boxes under
    one switch, then the switch subtrees under the next switch up, ... A box that
    hangs higher than others (e.g. on the root switch next to leaf switches) is
    wrapped in single-child lists, so it forms a group of one at the levels it skips.

    Returns
    -------
    (tree, depth, names)
        ``depth`` is the number of levels (1 for a single box); ``names[i]`` says what
        level ``i`` groups ("box", "switch", "switch^2", ...). Levels whose groups
        all have one member (boxes of one GPU) are dropped.
    """
    def convert(node: TopoNode) -> list:
        if node.kind == "box":
            return list(node.children)
        return [convert(child) for child in node.children]

    def height(t: Tree) -> int:
        return 0 if isinstance(t, int) else 1 + max(height(c) for c in t)

    def pad(t: Tree, want: int) -> Tree:
        if isinstance(t, int):
            return t
        if height(t) < want:  # a box (or subtree) shallower than its siblings
            return pad([t], want)
        return [pad(c, want - 1) for c in t]

    def lift(t: Tree, d: int, level_depth: int) -> Tree:
        """Replace every node at ``level_depth`` by its only child."""
        if isinstance(t, int):
            return t
        if d == level_depth:
            return lift(t[0], d, level_depth)
        return [lift(c, d + 1, level_depth) for c in t]

    tree: Tree = convert(topo_tree(cluster))
    depth = height(tree)
    tree = pad(tree, depth)
    names = ["box", "switch"] + [f"switch^{k}" for k in range(2, depth)]
    # Levels where every group has one member move nothing (boxes of 1 GPU): drop them.
    level = 0
    while depth > 1 and level < depth:
        if all(len(g) == 1 for g in _groups_at(tree, depth, level)):
            tree = lift(tree, 0, depth - 1 - level)
            depth -= 1
            del names[level]
        else:
            level += 1
    # pad/lift keep the root a list: it has depth >= 1 levels below it.
    assert isinstance(tree, list)
    return tree, depth, names


def _groups_at(tree: Tree, depth: int, level: int) -> list[list]:
    """The nodes whose children are level ``level`` groups' members (level 0: boxes)."""
    target = depth - 1 - level
    out: list[list] = []

    def walk(t: Tree, d: int) -> None:
        if isinstance(t, int):
            return
        if d == target:
            out.append(t)
            return
        for c in t:
            walk(c, d + 1)

    walk(tree, 0)
    return out


def _collapse(tree: Tree, depth: int, j: int) -> Tree:
    """Each bottom group replaced by its member owning piece ``j`` (member ``j mod size``)."""
    assert isinstance(tree, list)  # depth >= 1: an inner node, never a bare rank
    if depth == 1:
        return tree[j % len(tree)]
    return [_collapse(c, depth - 1, j) for c in tree]


def _allreduce(tl: Timeline, t0: int, tree: Tree, depth: int, data: list[int],
               pieces: list[int]) -> int:
    """BlueConnect on ``tree``: RS in the bottom groups, recurse per piece, AG; returns end slot."""
    if depth == 0 or not data:
        return t0
    m = pieces[0]
    parts = split(data, m)
    groups = _groups_at(tree, depth, 0)
    # Piece j goes to member j mod |G|: one piece each when |G| == m, round-robin otherwise.
    owned = [[[k for j in range(pos, m, len(g)) for k in parts[j]] for pos in range(len(g))]
             for g in groups]
    t1 = max(ring_reduce_scatter(tl, t0, g, seg) for g, seg in zip(groups, owned))
    t2 = t1
    for j in range(m):
        sub = _collapse(tree, depth, j)
        t2 = max(t2, _allreduce(tl, t1, sub, depth - 1, parts[j], pieces[1:]))
    return max(ring_allgather(tl, t2, g, seg) for g, seg in zip(groups, owned))


def _pieces_per_level(tree: Tree, depth: int,
                      names: list[str]) -> tuple[list[int], list[dict[str, Any]]]:
    """Pieces each level deals out, and a description of every level for ``meta``.

    ``m`` = the lcm of the level's group sizes (everyone gets an equal share) when that
    is at most 4x the largest group; otherwise the largest group size (the smaller
    groups' members then hold one piece more or less than each other).
    """
    pieces, info = [], []
    for level in range(depth):
        sizes = [len(g) for g in _groups_at(tree, depth, level)]
        largest = max(sizes)
        lcm = math.lcm(*sizes)
        m = lcm if lcm <= 4 * largest else largest
        pieces.append(m)
        entry: dict[str, Any] = {"level": names[level], "groups": len(sizes),
                                 "sizes": sorted(set(sizes)), "pieces": m}
        if len(set(sizes)) > 1:
            entry["note"] = (f"groups of different sizes {sorted(set(sizes))}: each deals {m} "
                             "pieces round-robin to its members"
                             + ("" if m == lcm else " (unequal shares: lcm too large)"))
        info.append(entry)
    return pieces, info


def _default_parts(cluster: Cluster, size: int, per_part: int, profile: CostProfile) -> int:
    """Pipeline parts: split while a chunk still takes several step latencies to send.

    Each extra part costs one box stage of steps and lets box stages of one part
    hide under network stages of another. A chunk of ``size / (per_part * parts)``
    bytes should take at least ``4 x`` the per-step latency over the bottleneck link:
    path latency plus, under ``profile``, the step overhead, posting :data:`STEP_OPS`
    ops and alpha (:func:`~topoplan.planners._pipeline_depth.message_latency`), or per-step
    costs eat the overlap (measured with topoplan.simulate on the shipped topologies:
    under ``ideal`` 256 MiB gains 5-30% and 1 MiB loses with any split; under ``nccl``
    this picks the best depth of 1..64 or one within 2%). At most 16 parts, and 1 when
    the plan would exceed ~2 M ops (about ``4 n`` ops per chunk).
    """
    order = topo_order(cluster)
    _, bandwidth = link_params(cluster, order)
    latency = message_latency(cluster, order, profile, ops=STEP_OPS)
    per_chunk = size / per_part / bandwidth
    budget = OP_BUDGET // max(1, 4 * cluster.nranks * per_part)
    return max(1, min(16, budget, int(per_chunk / (4 * latency))))


@no_gc
def plan_hierarchical(cluster: Cluster, *, size: int, chunks: int | None = None,
                      profile: CostProfile | str | None = None, max_step_ops: int | None = None,
                      max_chunks: int | None = None) -> Schedule:
    """Plan a hierarchical (BlueConnect) allreduce over the topology's levels.

    Level 0 is the box: a ring reduce-scatter over its GPUs (in NVLink ring order)
    leaves GPU ``l`` with piece ``l`` summed over the box. Level 1 joins the GPUs
    holding the same piece in the boxes under one switch, and reduce-scatters that
    piece among them; higher levels repeat up the switch tree; the top level ends
    with every piece owner holding the global sum of its piece. Allgathers undo the
    levels in reverse. With one switch this is the classic in-box reduce-scatter ->
    across-box allreduce among GPUs with the same local index -> in-box allgather.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (checked).
    chunks : int, optional
        Pipeline parts: part ``p`` runs the whole schedule on its own slice of the
        buffer, starting one box stage later than part ``p - 1``, so in-box stages of
        one part overlap network stages of another (BlueConnect's pipelining). By
        default as many as keep each chunk's transfer >= 4 step latencies under
        ``profile`` (path latency, step overhead, posting and alpha; more parts for
        bigger messages, fewer for costlier runtimes), at most 16, and 1 when the plan
        would exceed ~2 M ops (1024 ranks); then lowered until the plan fits
        ``max_chunks`` and ``max_step_ops``. Under ``ideal`` the step latency is the
        path latency (the depth of profile-free topoplan).
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`); sets the
        default number of parts; recorded in ``meta["profile"]``.
    max_step_ops : int, optional
        Most ops a rank may post in one step (each part in flight adds a ring step's 2).
    max_chunks : int, optional
        Most chunks the plan may hold (``prod(pieces)`` per part).

    Returns
    -------
    Schedule
        ``prod(pieces) * chunks`` chunks (``meta["levels"]`` lists every level's group
        sizes and pieces). Boxes (or switch groups) of different sizes still give a
        correct schedule: each group deals ``lcm`` of the sizes (or the largest size)
        pieces round-robin, and ``meta["levels"][i]["note"]`` says so.

    Raises
    ------
    PlannerError
        For a bad ``size``, ``chunks`` or cap.
    InfeasiblePlanError
        When even one part (or the asked-for ``chunks``) breaks a cap, naming it.

    References
    ----------
    M. Cho, U. Finkler, D. Kung, H. Hunter, "BlueConnect: Decomposing all-reduce for
    deep learning on heterogeneous network hierarchy", SysML 2019.
    """
    request = PlanRequest.make(cluster, size=size, profile=profile,
                               max_step_ops=max_step_ops, max_chunks=max_chunks,
                               who="hierarchical")
    return hierarchical_core(request, chunks=chunks)


def hierarchical_min_ops(request: PlanRequest) -> int:
    """Fewest ops a hierarchical plan of ``request`` holds, without planning it: at each
    level every rank (one per piece it owns) runs a ring reduce-scatter and a ring
    allgather over a group of at least that level's smallest size ``g``, a send and a
    recv in each of their ``g - 1`` steps: ``4 n sum(g - 1)`` for one pipeline part."""
    cluster = request.runtime
    if cluster.nranks == 1:
        return 0
    tree, depth, _ = hierarchy(cluster)
    smallest = [min(len(g) for g in _groups_at(tree, depth, level)) for level in range(depth)]
    return 4 * cluster.nranks * sum(g - 1 for g in smallest)


@no_gc
def hierarchical_core(request: PlanRequest, *, chunks: int | None = None) -> Schedule:
    """:func:`plan_hierarchical` on a validated request."""
    given = check_chunks(chunks, "hierarchical", "pipeline parts")
    costs, size = request.profile, request.size
    max_step_ops, max_chunks = request.max_step_ops, request.max_chunks
    cluster = request.runtime  # NVLink as the profile's runtime moves data
    n = cluster.nranks
    if n == 1:
        return empty_schedule(cluster, "hierarchical", levels=[], pipeline=1, profile=costs.name)
    tree, depth, names = hierarchy(cluster)
    pieces, info = _pieces_per_level(tree, depth, names)
    per_part = math.prod(pieces)
    stage = max(1, max(len(g) for g in _groups_at(tree, depth, 0)) - 1)
    parts = given
    if parts is None:  # one level (one box) has no stages to overlap
        parts = _default_parts(cluster, size, per_part, costs) if depth > 1 else 1

    def build(parts: int) -> Schedule:
        tl = Timeline(n)
        for p in range(parts):
            data = list(range(p * per_part, (p + 1) * per_part))
            _allreduce(tl, p * stage, tree, depth, data, pieces)
        return tl.build(equal_chunks(per_part * parts), algorithm="hierarchical",
                        cluster=cluster.name, levels=info, pipeline=parts, profile=costs.name)

    return fit_depth(build, parts, chosen=given is None, chunks_per_depth=per_part,
                     max_step_ops=max_step_ops, max_chunks=max_chunks, algorithm="hierarchical")
