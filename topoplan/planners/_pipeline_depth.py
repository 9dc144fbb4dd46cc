"""Pipeline depth: how many chunks a baseline planner cuts the buffer into.

- :func:`pipeline_depth`: the classic trade-off of per-message latency against fill,
  with :func:`link_params` and :func:`message_latency` giving the latency and bandwidth
  of a message between far ranks (under a cost profile);
- :func:`fit_depth`: that depth lowered until the plan fits the caps;
- :data:`OP_BUDGET`: the ops a default plan may hold.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from ..cluster import Cluster
from ..analysis.cost import CostProfile, get_profile
from ..errors import InfeasiblePlanError
from ..ir.schedule import Schedule
from ._checks import check_cap_args, check_caps

__all__ = ["OP_BUDGET", "link_params", "message_latency", "pipeline_depth", "fit_depth"]

# Ops a default plan may hold. A flat ring needs Theta(n^2) ops (one chunk per step),
# about 4.2 M at 1024 ranks; pipelining only multiplies chunk counts while the plan
# stays under this budget. (Multi-level plans send segments as chunk ranges, IR v2.)
OP_BUDGET = 1 << 21


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
