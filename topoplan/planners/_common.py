"""Shared machinery of the baseline planners.

- :class:`Timeline`: a lock-step builder. Every message puts its ``send`` and its
  ``recv`` in the same global slot, so any schedule built with it is free of
  deadlock under the rendezvous rule of docs/SCHEDULE.md, and phases compose by
  slot offsets (pipelining = running copies on disjoint chunks at staggered
  offsets). Empty slots are dropped when the schedule is built.
- :func:`topo_tree` / :func:`topo_order`: the cluster as a tree of groups (GPUs
  inside a box in NVLink-neighbour order, boxes under their switch, switches under
  a root switch), and its leaf order: a ring in that order crosses every link of
  the switch tree once per direction, the fewest a ring can (DDL's A->B->C->D).
- Ring reduce-scatter / allgather over a group of ranks whose segments are lists
  of chunks (used by ``ring`` and ``hierarchical``).
- Argument checks and the pipeline-depth heuristic.
"""

from __future__ import annotations

import functools
import gc
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from ..cluster import Box, Cluster
from ..cost import CostProfile, get_profile
from ..errors import InfeasiblePlanError, PlannerError
from ..units import as_bytes
from ..collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ..schedule import Op, OpKind, RankProgram, Schedule

__all__ = ["PlannerError", "Timeline", "TopoNode", "topo_tree", "topo_order", "box_order",
           "resolve_order", "check_size", "check_chunks", "unknown_options", "ring_reduce_scatter",
           "ring_allgather", "link_params", "message_latency", "pipeline_depth", "split",
           "no_gc", "check_caps", "check_cap_args", "fit_depth", "OP_BUDGET",
           "check_collective"]

# Ops a default plan may hold. A flat ring needs Theta(n^2) ops (one chunk per step),
# about 4.2 M at 1024 ranks; pipelining only multiplies chunk counts while the plan
# stays under this budget. (Multi-level plans send segments as chunk ranges, IR v2.)
OP_BUDGET = 1 << 21


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------

def check_size(size: Any, algorithm: str) -> int:
    """``size`` in bytes as a positive int, or :class:`PlannerError`; a string such as
    ``"256MiB"`` is read as the CLI reads it (:func:`~topoplan.units.parse_size`)."""
    try:
        size = as_bytes(size)
    except ValueError as exc:
        raise PlannerError(f"{algorithm}: size: {exc}") from None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0 \
            or not math.isfinite(size):
        raise PlannerError(f"{algorithm}: size must be a positive number of bytes, got {size!r}")
    return int(size)


def unknown_options(algorithm: str, unknown: Sequence[str],
                    known: Sequence[str]) -> PlannerError:
    """The error for options ``algorithm`` does not take: names them, the closest known
    option to the first, and every option it takes."""
    import difflib

    close = difflib.get_close_matches(unknown[0], list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return PlannerError(f"planner {algorithm!r} takes no option "
                        f"{', '.join(map(repr, unknown))}{hint}; its options: "
                        f"{', '.join(known)}")


def check_chunks(chunks: Any, algorithm: str, what: str = "pipeline depth") -> int | None:
    """``chunks`` as ``None`` (planner's choice) or an int >= 1, or :class:`PlannerError`."""
    if chunks is None:
        return None
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise PlannerError(f"{algorithm}: chunks ({what}) must be an integer >= 1 or None, "
                           f"got {chunks!r}")
    return chunks


# --------------------------------------------------------------------------------------
# Lock-step schedule builder
# --------------------------------------------------------------------------------------

_SEND, _RECV = OpKind.SEND, OpKind.RECV


def _fast_op_factory() -> Callable[[OpKind, int, int, bool, int], Op]:
    """An ``Op`` constructor about 2x faster than ``Op(...)`` (which goes through the frozen
    dataclass's ``object.__setattr__`` per field): fills the slots directly, as the
    dataclass's own ``__setstate__`` does. Falls back to ``Op`` if ``Op`` has no slots."""
    try:
        setters = [getattr(Op, f).__set__ for f in ("kind", "peer", "chunk", "reduce", "count")]
    except AttributeError:  # pragma: no cover - Op without slots
        return Op
    new = object.__new__
    set_kind, set_peer, set_chunk, set_reduce, set_count = setters

    def make(kind: OpKind, peer: int, chunk: int, reduce: bool, count: int = 1) -> Op:
        op = new(Op)
        set_kind(op, kind)
        set_peer(op, peer)
        set_chunk(op, chunk)
        set_reduce(op, reduce)
        set_count(op, count)
        return op

    if make(_RECV, 1, 2, True, 3) != Op(_RECV, 1, 2, True, 3):  # pragma: no cover - layout changed
        return Op
    return make


_op = _fast_op_factory()
_CODE_KINDS = (OpKind.SEND, OpKind.RECV, OpKind.RECV)
_CODE_REDUCE = (False, False, True)


def schedule_from_arrays(nranks: int, rank: np.ndarray, step: np.ndarray, peer: np.ndarray,
                         chunk: np.ndarray, code: np.ndarray, chunks: Sequence[float],
                         count: np.ndarray | None = None,
                         collective: str = DEFAULT_COLLECTIVE, **meta: Any) -> Schedule:
    """A Schedule of ``collective`` from flat op arrays (code 0 = send, 1 = recv, 2 = recv
    and reduce).

    One lexsort puts each rank's ops in (step, peer, chunk, code) order, so the
    messages of a pair within a step are in chunk order on both sides and sends come
    before recvs. Steps with no op are dropped: a rank simply waits for its peers.
    ``count`` (default all 1) gives each op's chunk range. Builds millions of ops in
    seconds where per-op Python loops take minutes.
    """
    order = np.lexsort((code, chunk, peer, step, rank))
    rk, st, pe, ck, cd = rank[order], step[order], peer[order], chunk[order], code[order]
    cn = count[order].tolist() if count is not None else [1] * len(order)
    del order
    codes = cd.tolist()
    ops = list(map(_op, map(_CODE_KINDS.__getitem__, codes), pe.tolist(), ck.tolist(),
                   map(_CODE_REDUCE.__getitem__, codes), cn))
    rank_bounds = np.searchsorted(rk, np.arange(nranks + 1))
    new_step = np.ones(len(st), dtype=bool)
    new_step[1:] = (st[1:] != st[:-1]) | (rk[1:] != rk[:-1])
    starts = np.flatnonzero(new_step).tolist() + [len(st)]
    programs = []
    s_iter = 0
    for r in range(nranks):
        end = int(rank_bounds[r + 1])
        steps = []
        while starts[s_iter] < end:
            steps.append(tuple(ops[starts[s_iter]:starts[s_iter + 1]]))
            s_iter += 1
        programs.append(RankProgram(r, tuple(steps)))
    return Schedule(nranks=nranks, chunks=tuple(chunks), ranks=tuple(programs),
                    collective=collective, meta=dict(meta))


def runs(chunks: Sequence[int]) -> list[tuple[int, int]]:
    """``chunks`` as ``(first, count)`` runs of consecutive numbers, in order."""
    out: list[tuple[int, int]] = []
    for k in chunks:
        if out and out[-1][0] + out[-1][1] == k:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((k, 1))
    return out


class Timeline:
    """Per-rank ops in global slots; a message's send and recv share a slot.

    Parameters
    ----------
    nranks : int

    Notes
    -----
    Lock-step by construction: at slot ``t`` every op pairs with an op of slot ``t``
    of its peer, so a rank never waits on a peer that waits on it. Ops of one pair
    within a slot are appended to both sides in the same order, so the in-order
    matching of docs/SCHEDULE.md pairs them as intended.
    """

    __slots__ = ("nranks", "slots")

    def __init__(self, nranks: int) -> None:
        self.nranks = nranks
        self.slots: list[list[list[Op]]] = [[] for _ in range(nranks)]

    def _at(self, rank: int, t: int) -> list[Op]:
        steps = self.slots[rank]
        while t >= len(steps):
            steps.append([])
        return steps[t]

    def msg(self, t: int, src: int, dst: int, chunk: int, reduce: bool) -> None:
        """Send ``chunk`` from ``src`` to ``dst`` in slot ``t``; ``reduce`` adds, else overwrites."""
        self._at(src, t).append(_op(_SEND, dst, chunk, False, 1))
        self._at(dst, t).append(_op(_RECV, src, chunk, reduce, 1))

    def msgs(self, t: int, src: int, dst: int, chunks: Sequence[int], reduce: bool) -> None:
        """:meth:`msg` for several chunks of one segment: one op per run of consecutive
        chunks (a chunk range, IR v2), in the order given."""
        if not chunks:
            return
        out, into = self._at(src, t), self._at(dst, t)
        for k, count in runs(chunks):
            out.append(_op(_SEND, dst, k, False, count))
            into.append(_op(_RECV, src, k, reduce, count))

    @property
    def nslots(self) -> int:
        return max((len(s) for s in self.slots), default=0)

    def build(self, chunks: Sequence[float], *, collective: str = DEFAULT_COLLECTIVE,
              **meta: Any) -> Schedule:
        """The Schedule of ``collective``, with empty slots dropped (a rank waits only on
        its peers anyway)."""
        programs = tuple(RankProgram(r, tuple(tuple(ops) for ops in steps if ops))
                         for r, steps in enumerate(self.slots))
        return Schedule(nranks=self.nranks, chunks=tuple(chunks), ranks=programs,
                        collective=collective, meta=dict(meta))


def no_gc(planner: Callable[..., Schedule]) -> Callable[..., Schedule]:
    """Run ``planner`` with the cyclic garbage collector paused.

    A plan allocates millions of small acyclic objects (Ops, tuples); CPython's
    collector would rescan them over and over while they are built (measured: about
    half the time at 192 ranks). Nothing built here forms cycles.
    """
    @functools.wraps(planner)
    def wrapper(*args: Any, **kwargs: Any) -> Schedule:
        if not gc.isenabled():
            return planner(*args, **kwargs)
        gc.disable()
        try:
            return planner(*args, **kwargs)
        finally:
            gc.enable()
    return wrapper


def split(items: Sequence[int], parts: int) -> list[list[int]]:
    """``items`` cut into ``parts`` contiguous lists, sizes differing by at most one."""
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


# --------------------------------------------------------------------------------------
# Ring phases over a group
# --------------------------------------------------------------------------------------

def ring_reduce_scatter(tl: Timeline, t0: int, group: Sequence[int],
                        segments: Sequence[Sequence[int]]) -> int:
    """Ring reduce-scatter: position ``l`` of ``group`` ends holding the sum of ``segments[l]``.

    Takes ``len(group) - 1`` slots from ``t0``; returns the first free slot. At slot
    ``t0 + s`` position ``l`` sends segment ``(l - s - 1) mod g`` to position ``l + 1``
    (Patarasuk and Yuan, 2009).
    """
    g = len(group)
    for s in range(g - 1):
        for pos in range(g):
            tl.msgs(t0 + s, group[pos], group[(pos + 1) % g], segments[(pos - s - 1) % g], True)
    return t0 + max(g - 1, 0)


def ring_allgather(tl: Timeline, t0: int, group: Sequence[int],
                   segments: Sequence[Sequence[int]]) -> int:
    """Ring allgather: position ``l`` starts owning ``segments[l]``; all end with all.

    Takes ``len(group) - 1`` slots from ``t0``; returns the first free slot.
    """
    g = len(group)
    for s in range(g - 1):
        for pos in range(g):
            tl.msgs(t0 + s, group[pos], group[(pos + 1) % g], segments[(pos - s) % g], False)
    return t0 + max(g - 1, 0)


# --------------------------------------------------------------------------------------
# The topology as a tree of groups
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Pipelining heuristic
# --------------------------------------------------------------------------------------

def link_params(cluster: Cluster, order: Sequence[int]) -> tuple[float, float]:
    """A typical ``(latency s, bandwidth B/s)`` of one message between far ranks.

    Taken on the route from ``order[0]`` to ``order[n // 2]`` (for a tree order these
    sit in different halves of the machine): path latency and bottleneck bandwidth.
    """
    n = len(order)
    if n < 2:
        return 1e-6, 1e10
    src, dst = order[0], order[n // 2]
    graph = cluster.graph
    paths = cluster.routes(src, dst)
    if not paths:
        return 1e-6, 1e10
    path = paths[0]
    latency = sum(graph[u][v]["latency"] for u, v in zip(path, path[1:]))
    bandwidth = min(graph[u][v]["bandwidth"] for u, v in zip(path, path[1:]))
    return max(latency, 1e-7), bandwidth


def message_latency(cluster: Cluster, order: Sequence[int], profile: CostProfile | str | None,
                    ops: int = 2) -> float:
    """Seconds one step of ``ops`` ops costs before its bytes flow, between far ranks:
    the path latency of :func:`link_params` plus the profile's step overhead, posting
    and alpha (the alpha of the class of that pair: network when they sit in different
    boxes). The ``latency`` a pipelining model should trade against bandwidth."""
    latency, _ = link_params(cluster, order)
    costs = get_profile(profile)
    n = len(order)
    network = n > 1 and cluster.box_index(order[0]) != cluster.box_index(order[n // 2])
    return latency + costs.message_cost(network=network, ops=ops)


def pipeline_depth(size: float, fill_slots: int, latency: float, bandwidth: float,
                   cap: int) -> int:
    """Chunks that minimise ``(c + fill_slots) * (latency + size / (c * bandwidth))``.

    The classic pipelining trade-off: each chunk pays the per-message latency, and
    the pipeline takes ``fill_slots`` extra slots to fill and drain; the optimum is
    ``sqrt(fill_slots * size / (latency * bandwidth))``, clamped to ``[1, cap]``.
    """
    if fill_slots <= 0 or size <= 0:
        return 1
    c = math.sqrt(fill_slots * size / (latency * bandwidth))
    return max(1, min(cap, int(round(c))))


def check_cap_args(max_step_ops: Any, max_chunks: Any, algorithm: str) -> None:
    """PlannerError unless each cap is None or an integer >= 1."""
    for name, value in (("max_step_ops", max_step_ops), ("max_chunks", max_chunks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise PlannerError(f"{algorithm}: {name} must be an integer >= 1 or None, "
                               f"got {value!r}")


def check_caps(schedule: Schedule, max_step_ops: int | None, max_chunks: int | None,
               algorithm: str) -> Schedule:
    """``schedule`` if it holds at most ``max_chunks`` chunks and every rank posts at most
    ``max_step_ops`` ops in a step; else an InfeasiblePlanError saying which cap and by
    how much (a planner lowers its pipelining depth first: this fires when even its
    smallest plan is too big; ``auto`` then leaves the planner out)."""
    check_cap_args(max_step_ops, max_chunks, algorithm)
    if max_chunks is not None and schedule.nchunks > max_chunks:
        raise InfeasiblePlanError(f"{algorithm}: the smallest plan has {schedule.nchunks} chunks, over "
                           f"max_chunks={max_chunks}; raise the cap or pick another planner")
    if max_step_ops is not None:
        worst = schedule.max_step_ops
        if worst > max_step_ops:
            raise InfeasiblePlanError(f"{algorithm}: the smallest plan posts {worst} ops in one step, "
                               f"over max_step_ops={max_step_ops}; raise the cap or pick "
                               "another planner")
    return schedule


def empty_schedule(cluster: Cluster, algorithm: str, *, collective: str = DEFAULT_COLLECTIVE,
                   **meta: Any) -> Schedule:
    """The 1-rank ``collective``: nothing to move."""
    return Timeline(cluster.nranks).build((1.0,), collective=collective, algorithm=algorithm,
                                          cluster=cluster.name, **meta)


def check_collective(collective: Any, algorithm: str,
                     supported: Sequence[str] = tuple(COLLECTIVES)) -> str:
    """``collective`` if ``algorithm`` plans it, else a :class:`PlannerError` naming the
    ones it plans."""
    if not isinstance(collective, str) or collective not in supported:
        raise PlannerError(f"{algorithm}: cannot plan collective {collective!r}; it plans "
                           f"{', '.join(supported)}")
    return collective


def fit_depth(build: Callable[[int], Schedule], depth: int, *, chosen: bool,
              chunks_per_depth: int, max_step_ops: int | None, max_chunks: int | None,
              algorithm: str) -> Schedule:
    """``build(depth)``, with the depth lowered until the plan fits the caps.

    Parameters
    ----------
    build : callable
        ``build(d)``: the planner's schedule at pipelining depth ``d``.
    depth : int
        The depth the planner wants.
    chosen : bool
        True when the planner chose ``depth`` itself (``chunks=None``): it is then lowered
        until the plan fits, first to ``max_chunks // chunks_per_depth``, then, while some
        rank posts over ``max_step_ops`` ops in a step, in proportion to the excess (at
        least by one). False when the caller asked for it: a plan over a cap is an error.
    chunks_per_depth : int
        Chunks the plan holds per unit of depth (the plan has ``depth * chunks_per_depth``).
    max_step_ops, max_chunks : int, optional
        The caps (:func:`check_caps`).
    algorithm : str
        Named in errors.

    Raises
    ------
    InfeasiblePlanError
        When the asked-for depth, or even depth 1, breaks a cap (naming it).
    PlannerError
        For a cap that is not an integer >= 1.
    """
    check_cap_args(max_step_ops, max_chunks, algorithm)
    if not chosen:
        schedule = build(depth)
        if depth > 1 and max_chunks is not None and schedule.nchunks > max_chunks:
            raise InfeasiblePlanError(
                f"{algorithm}: chunks={depth} gives {schedule.nchunks} chunks, over "
                f"max_chunks={max_chunks}; ask for fewer or leave the depth to the planner")
        if depth > 1 and max_step_ops is not None and schedule.max_step_ops > max_step_ops:
            raise InfeasiblePlanError(
                f"{algorithm}: chunks={depth} posts {schedule.max_step_ops} ops in one step, "
                f"over max_step_ops={max_step_ops}; ask for fewer chunks or leave the depth "
                "to the planner")
        return check_caps(schedule, max_step_ops, max_chunks, algorithm)
    if max_chunks is not None:
        depth = min(depth, max(1, max_chunks // max(1, chunks_per_depth)))
    while True:
        schedule = build(depth)
        if depth == 1 or max_step_ops is None:
            break
        worst = schedule.max_step_ops
        if worst <= max_step_ops:
            break
        depth = max(1, min(depth - 1, depth * max_step_ops // worst))
    return check_caps(schedule, max_step_ops, max_chunks, algorithm)
