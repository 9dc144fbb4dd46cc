"""``auto``: plan with every candidate, simulate each, keep the fastest.

The candidates are the registered planners (``mcf``, ``hierarchical``, ``ring``,
``ring-topo``, ``tree``, ``rhd``). Each plans against the runtime's cost profile
(:mod:`topoplan.cost`, default :data:`~topoplan.cost.DEFAULT_PROFILE`) within the
plan-size caps (``max_step_ops``, ``max_chunks``), is timed (planning seconds) and
simulated with :func:`topoplan.simulate` under the same profile at the requested size,
so small messages go to the plans whose steps cost least in all (latency-optimal:
``rhd``, ``tree``) and large ones to the bandwidth-optimal plans (``mcf``) without a
size threshold written anywhere: where the switch happens follows from the profile.
Candidates that cannot meet the caps (:class:`~topoplan.errors.InfeasiblePlanError`)
are left out, and ``meta["left_out"]`` says why.

Affordability: the event simulator costs about ``ops x events``; candidates whose
schedule has more than ``max_sim_ops`` ops (default 1 000 000, which simulates every
plan ``auto`` makes up to 1024 ranks: mcf's 475 k ops on leaf_spine_1024 take about a
minute under ``nccl`` at the simulator's coarse resolution) are not simulated but
ranked by their own estimate when they give one (``meta["estimate_s"]``, mcf's
lock-step model) and otherwise dropped, and on clusters above ``max_plan_ranks``
(default 256) only ``mcf`` and ``hierarchical`` are planned (the flat ring needs
``4 N^2`` ops). ``meta["comparison"]`` says, per candidate, which was done.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from ..cluster import Cluster
from ..cost import CostProfile, get_profile
from .._progress import step
from ..errors import InfeasiblePlanError
from ..schedule import Schedule
from ._common import check_cap_args, check_collective, check_size, unknown_options

__all__ = ["plan_auto", "compare", "DEFAULT_CANDIDATES"]

DEFAULT_CANDIDATES = ("mcf", "hierarchical", "ring", "ring-topo", "tree", "rhd")
MAX_SIM_OPS = 1_000_000
MAX_PLAN_RANKS = 256
_LARGE = ("mcf", "hierarchical")


def compare(cluster: Cluster, size: int, candidates: Sequence[str] | None = None, *,
            profile: CostProfile | str | None = None, max_step_ops: int | None = None,
            max_chunks: int | None = None, max_sim_ops: int = MAX_SIM_OPS,
            max_plan_ranks: int = MAX_PLAN_RANKS, left_out: dict[str, str] | None = None,
            machine: Cluster | None = None, collective: str = "allreduce",
            **options: Any) -> list[tuple[str, Schedule, Any, float]]:
    """Plan and simulate every candidate under ``profile``; fastest first.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes per rank.
    candidates : sequence of str, optional
        Planner names (keys of :data:`topoplan.planners.PLANNERS`); default
        :data:`DEFAULT_CANDIDATES` (those registered).
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.cost.DEFAULT_PROFILE`): given to
        the planners that take it and charged by every simulation.
    max_step_ops, max_chunks : int, optional
        Plan-size caps: given to the planners that take them (they pipeline less to fit,
        or raise :class:`InfeasiblePlanError`); a plan from a planner that does not take
        them is checked against them afterwards.
    max_sim_ops : int
        Schedules with more ops are not simulated (their report is ``None``).
    max_plan_ranks : int
        Above this many ranks only ``mcf`` and ``hierarchical`` are planned, unless
        ``candidates`` names others explicitly.
    left_out : dict, optional
        Filled with ``name -> reason`` for the candidates left out.
    machine : Cluster, optional
        Where the plan will run, when not on ``cluster`` itself: the candidates are
        planned for ``cluster`` and simulated on ``machine`` (the host of a calibrated
        profile, :meth:`~topoplan.cost.CostProfile.host_cluster`, when a plan for a
        cluster is tried out on one machine, as ``topoplan bench`` does). It must have
        as many ranks.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan; by default only the candidates that plan it
        (:func:`topoplan.planners.planners_for`) are compared.
    **options
        Passed to the planners that take them.

    Returns
    -------
    list of (name, schedule, report, plan_seconds)
        ``report`` is a :class:`topoplan.simulate.SimReport` under ``profile``, or
        ``None`` when not simulated; sorted by simulated time (unsimulated ones last,
        by their ``meta["estimate_s"]``). Candidates that raise
        :class:`InfeasiblePlanError` (or whose plan breaks a cap) are left out.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a schedule (the last error is chained).
    PlannerError
        For a cap that is not an integer >= 1, or a candidate named in ``candidates``
        that does not plan ``collective`` (naming those that do).
    ProfileError
        For an unknown profile name or a bad profile file.
    """
    from . import PLANNERS, options_of, planners_for, require_collective, takes
    from ..simulate import simulate

    costs = get_profile(profile)
    check_cap_args(max_step_ops, max_chunks, "auto")
    where = cluster if machine is None else machine
    if where.nranks != cluster.nranks:
        raise InfeasiblePlanError(f"auto: the machine {where.name!r} has {where.nranks} ranks "
                                  f"but cluster {cluster.name!r} has {cluster.nranks}")
    caps = {k: v for k, v in (("max_step_ops", max_step_ops), ("max_chunks", max_chunks))
            if v is not None}
    explicit = candidates is not None
    collective = check_collective(collective, "auto")
    names = list(candidates) if candidates is not None else planners_for(
        collective, DEFAULT_CANDIDATES)
    if not explicit and cluster.nranks > max_plan_ranks:
        names = [c for c in names if c in _LARGE]
    planners = {}
    for name in names:
        planner = PLANNERS.get(name)
        if planner is None or name == "auto":
            raise InfeasiblePlanError(f"auto: unknown candidate {name!r}; known: "
                                      f"{', '.join(sorted(set(PLANNERS) - {'auto'}))}")
        require_collective(name, collective)
        planners[name] = planner
    # An option no candidate takes is a mistake (a misspelling), not one to drop.
    unused = sorted(k for k in options if not any(takes(p, k) for p in planners.values()))
    if unused:
        known = sorted({o for p in planners.values() for o in options_of(p)} - {"size"})
        raise unknown_options("auto", unused, known)
    rows: list[tuple[str, Schedule, Any, float]] = []
    last: Exception | None = None
    if collective != "allreduce":
        options = {**options, "collective": collective}
    for name, planner in planners.items():
        usable = {k: v for k, v in {**options, **caps, "profile": costs}.items()
                  if takes(planner, k)}
        step(f"{name}: planning {cluster.nranks} ranks ...")
        t0 = time.perf_counter()
        try:
            schedule = planner(cluster, size=size, **usable)
            if caps:
                _check_plan(schedule, max_step_ops, max_chunks, name)
        except InfeasiblePlanError as exc:
            last = exc
            if left_out is not None:
                left_out[name] = str(exc)
            continue
        plan_s = time.perf_counter() - t0
        report = None
        if schedule.nops <= max_sim_ops:
            step(f"{name}: simulating {schedule.nops} ops ...")
            report = simulate(where, schedule, size, profile=costs)
        rows.append((name, schedule, report, plan_s))
    if not rows:
        raise InfeasiblePlanError(f"auto on {cluster.name!r}: no candidate produced a plan "
                                  f"({', '.join(names)})"
                                  + (f": {last}" if last is not None else "")) from last

    def key(row: tuple[str, Schedule, Any, float]) -> tuple[int, float, int]:
        # Ties (equal simulated time to 1e-9 relative) go to the smaller schedule.
        _, schedule, report, _ = row
        if report is not None:
            return (0, float(f"{report.time_s:.9e}"), schedule.nops)
        est = schedule.meta.get("estimate_s")
        return (1, float(est) if isinstance(est, (int, float)) else float("inf"), schedule.nops)

    rows.sort(key=key)
    return rows


def _check_plan(schedule: Schedule, max_step_ops: int | None, max_chunks: int | None,
                name: str) -> None:
    """InfeasiblePlanError when a candidate's plan breaks a cap anyway (a planner that does
    not take the caps, or ignores them)."""
    if max_chunks is not None and schedule.nchunks > max_chunks:
        raise InfeasiblePlanError(f"{name}: its plan has {schedule.nchunks} chunks, over "
                                  f"max_chunks={max_chunks} (the planner does not fit its "
                                  "plans to the caps)")
    if max_step_ops is not None and schedule.max_step_ops > max_step_ops:
        raise InfeasiblePlanError(f"{name}: its plan posts {schedule.max_step_ops} ops in one "
                                  f"step, over max_step_ops={max_step_ops} (the planner does "
                                  "not fit its plans to the caps)")


def plan_auto(cluster: Cluster, *, size: int = 256 << 20, candidates: Sequence[str] | None = None,
              profile: CostProfile | str | None = None, max_step_ops: int | None = None,
              max_chunks: int | None = None, machine: Cluster | None = None,
              collective: str = "allreduce", **options: Any) -> Schedule:
    """The fastest candidate's schedule in simulation at ``size`` under ``profile``.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Bytes per rank.
    candidates : sequence of str, optional
        Planner names to compare (default: mcf, hierarchical, ring, ring-topo, tree, rhd).
    profile : CostProfile or str, optional
        The runtime's costs the candidates plan against and are simulated under
        (default :data:`topoplan.cost.DEFAULT_PROFILE`).
    max_step_ops, max_chunks : int, optional
        Plan-size caps every candidate must meet (see :func:`compare`).
    machine : Cluster, optional
        Where the plan will run, if not on ``cluster`` (see :func:`compare`): the
        candidates are ranked by their time there.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan: the candidates that plan it are compared (see :func:`compare`).
    **options
        Passed to :func:`compare` and the planners.

    Returns
    -------
    Schedule
        The chosen plan with ``meta["algorithm"] == "auto"``, ``meta["chosen"]`` (the
        planner's name), ``meta["chosen_algorithm_meta"]`` (its own meta, trimmed),
        ``meta["profile"]`` (the profile's name), ``meta["comparison"]``: per candidate,
        simulated seconds (or ``None``), its own estimate, whether it was simulated, ops,
        planning seconds, ``messages`` (that move bytes; all sends when not simulated),
        ``steps``, ``chunks`` and the simulated ``breakdown`` of its time into bandwidth,
        latency, overhead and reduce (or ``None``), fastest first; and
        ``meta["left_out"]`` (``name -> reason``) when candidates could not meet the caps.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a plan.
    PlannerError
        If ``size`` is not a positive number of bytes, or an option no candidate takes.
    """
    size = check_size(size, "auto")
    costs = get_profile(profile)
    left_out: dict[str, str] = {}
    rows = compare(cluster, size, candidates, profile=costs, max_step_ops=max_step_ops,
                   max_chunks=max_chunks, left_out=left_out, machine=machine,
                   collective=collective, **options)
    name, schedule, report, _ = rows[0]
    comparison = [{"algorithm": n, "time_s": r.time_s if r is not None else None,
                   "estimate_s": s.meta.get("estimate_s"), "simulated": r is not None,
                   "nops": s.nops, "plan_s": round(p, 4),
                   "messages": r.messages if r is not None else s.nmessages,
                   "steps": s.nsteps, "chunks": s.nchunks,
                   "breakdown": dict(r.breakdown) if r is not None else None}
                  for n, s, r, p in rows]
    inner = {k: v for k, v in schedule.meta.items()
             if isinstance(v, (int, float, str, bool)) or v is None}
    extra: dict[str, Any] = {"left_out": left_out} if left_out else {}
    if machine is not None:
        extra["machine"] = machine.name
    return schedule.with_meta(algorithm="auto", chosen=name, cluster=cluster.name,
                              chosen_algorithm_meta=inner, comparison=comparison,
                              profile=costs.name, **extra,
                              predicted_time_s=report.time_s if report is not None else None)
