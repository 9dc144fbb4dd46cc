"""``auto``: plan with every candidate, simulate each, keep the fastest.

The candidates are the registered planners (``mcf``, ``hierarchical``, ``ring``,
``ring-topo``, ``tree``, ``rhd``). Each is timed (planning seconds) and simulated
with :func:`topoplan.simulate` at the requested size, so small messages go to the
plans with the fewest steps (latency-optimal: ``rhd``, ``tree``) and large ones to the
bandwidth-optimal plans (``mcf``) without a size threshold written anywhere.

Affordability: the event simulator costs about ``ops x events``; candidates whose
schedule has more than ``max_sim_ops`` ops (default 400 000) are not simulated but
ranked by their own estimate when they give one (``meta["estimate_s"]``, mcf's
lock-step model) and otherwise dropped, and on clusters above ``max_plan_ranks``
(default 256) only ``mcf`` and ``hierarchical`` are planned (the flat ring needs
``4 N^2`` ops). ``meta["comparison"]`` says, per candidate, which was done.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Sequence

from ..cluster import Cluster
from ..errors import InfeasiblePlanError
from ..schedule import Schedule

__all__ = ["plan_auto", "compare", "DEFAULT_CANDIDATES"]

DEFAULT_CANDIDATES = ("mcf", "hierarchical", "ring", "ring-topo", "tree", "rhd")
MAX_SIM_OPS = 400_000
MAX_PLAN_RANKS = 256
_LARGE = ("mcf", "hierarchical")


def compare(cluster: Cluster, size: int, candidates: Sequence[str] | None = None, *,
            max_sim_ops: int = MAX_SIM_OPS, max_plan_ranks: int = MAX_PLAN_RANKS,
            **options: Any) -> list[tuple[str, Schedule, Any, float]]:
    """Plan and simulate every candidate; fastest first.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes per rank.
    candidates : sequence of str, optional
        Planner names (keys of :data:`topoplan.planners.PLANNERS`); default
        :data:`DEFAULT_CANDIDATES` (those registered).
    max_sim_ops : int
        Schedules with more ops are not simulated (their report is ``None``).
    max_plan_ranks : int
        Above this many ranks only ``mcf`` and ``hierarchical`` are planned, unless
        ``candidates`` names others explicitly.
    **options
        Passed to the planners that take them.

    Returns
    -------
    list of (name, schedule, report, plan_seconds)
        ``report`` is a :class:`topoplan.simulate.SimReport`, or ``None`` when not
        simulated; sorted by simulated time (unsimulated ones last, by their
        ``meta["estimate_s"]``). Candidates that raise :class:`InfeasiblePlanError`
        are left out.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a schedule (the last error is chained).
    """
    from . import PLANNERS
    from ..simulate import simulate

    explicit = candidates is not None
    names = list(candidates) if candidates is not None else [
        c for c in DEFAULT_CANDIDATES if c in PLANNERS]
    if not explicit and cluster.nranks > max_plan_ranks:
        names = [c for c in names if c in _LARGE]
    rows: list[tuple[str, Schedule, Any, float]] = []
    last: Exception | None = None
    for name in names:
        planner = PLANNERS.get(name)
        if planner is None or name == "auto":
            raise InfeasiblePlanError(f"auto: unknown candidate {name!r}; known: "
                                      f"{', '.join(sorted(set(PLANNERS) - {'auto'}))}")
        params = inspect.signature(planner).parameters
        usable = {k: v for k, v in options.items() if k in params}
        t0 = time.perf_counter()
        try:
            schedule = planner(cluster, size=size, **usable)
        except InfeasiblePlanError as exc:
            last = exc
            continue
        plan_s = time.perf_counter() - t0
        report = None
        if schedule.nops <= max_sim_ops:
            report = simulate(cluster, schedule, size)
        rows.append((name, schedule, report, plan_s))
    if not rows:
        raise InfeasiblePlanError(f"auto on {cluster.name!r}: no candidate produced a plan "
                                  f"({', '.join(names)})") from last

    def key(row: tuple[str, Schedule, Any, float]) -> tuple[int, float, int]:
        # Ties (equal simulated time to 1e-9 relative) go to the smaller schedule.
        _, schedule, report, _ = row
        if report is not None:
            return (0, float(f"{report.time_s:.9e}"), schedule.nops)
        est = schedule.meta.get("estimate_s")
        return (1, float(est) if isinstance(est, (int, float)) else float("inf"), schedule.nops)

    rows.sort(key=key)
    return rows


def plan_auto(cluster: Cluster, *, size: int = 256 << 20, candidates: Sequence[str] | None = None,
              **options: Any) -> Schedule:
    """The fastest candidate's schedule in simulation at ``size``.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes per rank.
    candidates : sequence of str, optional
        Planner names to compare (default: mcf, hierarchical, ring, ring-topo, tree, rhd).
    **options
        Passed to :func:`compare` and the planners.

    Returns
    -------
    Schedule
        The chosen plan with ``meta["algorithm"] == "auto"``, ``meta["chosen"]`` (the
        planner's name), ``meta["chosen_algorithm_meta"]`` (its own meta, trimmed) and
        ``meta["comparison"]``: per candidate, simulated seconds (or ``None``), ops,
        planning seconds and whether it was simulated.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a plan, or ``size`` is not positive.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0:
        raise InfeasiblePlanError(f"auto: size must be > 0 bytes, got {size!r}")
    rows = compare(cluster, int(size), candidates, **options)
    name, schedule, report, _ = rows[0]
    comparison = [{"algorithm": n, "time_s": r.time_s if r is not None else None,
                   "estimate_s": s.meta.get("estimate_s"), "simulated": r is not None,
                   "nops": s.nops, "plan_s": round(p, 4)} for n, s, r, p in rows]
    inner = {k: v for k, v in schedule.meta.items()
             if isinstance(v, (int, float, str, bool)) or v is None}
    return schedule.with_meta(algorithm="auto", chosen=name, cluster=cluster.name,
                              chosen_algorithm_meta=inner, comparison=comparison,
                              predicted_time_s=report.time_s if report is not None else None)
