"""``auto``: plan with every candidate, simulate each, keep the fastest.

The candidates are the registered planners: the point-to-point plans (``mcf``,
``hierarchical``, ``ring``, ``ring-topo``, ``tree``, ``rhd``), ``composed`` (native
collectives inside the boxes around a planned exchange across them) and ``nccl``, the
transport's own collective over every rank as one native step. All are priced by the
same simulator under the same profile, and under the ``nccl`` profile the ``nccl``
candidate's time is the NCCL model's own row, so ``auto`` is never slower than NCCL
wherever the model is right: where no plan beats it, it picks it, and the executor
runs the native collective. Each plans against the runtime's cost profile
(:mod:`topoplan.analysis.cost`, default :data:`~topoplan.analysis.cost.DEFAULT_PROFILE`) within the
plan-size caps (``max_step_ops``, ``max_chunks``), is timed (planning seconds) and
simulated with :func:`topoplan.simulate` under the same profile at the requested size,
so small messages go to the plans whose steps cost least in all (latency-optimal:
``rhd``, ``tree``) and large ones to the bandwidth-optimal plans (``mcf``) without a
size threshold written anywhere: where the switch happens follows from the profile.
Candidates that cannot meet the caps (:class:`~topoplan.errors.InfeasiblePlanError`)
are left out, and ``meta["left_out"]`` says why.

Affordability: the event simulator costs about ``ops x events``; candidates whose
schedule has more than ``max_sim_ops`` ops (default 250 000: mcf's 475 k ops on
leaf_spine_1024 take about 40 s to simulate, and its estimate is within 1% of that) are
not simulated but ranked, among the simulated ones, by their own estimate when they
give one (``meta["estimate_s"]``: mcf's lock-step model, composed's native steps plus
its simulated cross-box plan) and otherwise dropped, and on clusters above
``max_plan_ranks`` (default 256) only ``mcf``, ``hierarchical``, ``composed`` and
``nccl`` are planned (the flat ring needs ``4 N^2`` ops). ``meta["comparison"]`` says,
per candidate, which was done.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..cluster import Cluster
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule
from .comparison import Candidate, compare as compare_request
from .request import MAX_PLAN_RANKS, MAX_SIM_OPS, PlanRequest

__all__ = ["plan_auto", "compare", "choose", "DEFAULT_CANDIDATES"]

#: The planners ``auto`` compares by default (those declared candidates in
#: :data:`topoplan.planners.SPECS`).
DEFAULT_CANDIDATES = ("mcf", "hierarchical", "ring", "ring-topo", "tree", "rhd", "nccl",
                      "composed")


def compare(cluster: Cluster, size: int | str, candidates: Sequence[str] | None = None, *,
            profile: CostProfile | str | None = None, max_step_ops: int | None = None,
            max_chunks: int | None = None, max_sim_ops: int = MAX_SIM_OPS,
            max_plan_ranks: int = MAX_PLAN_RANKS, left_out: dict[str, str] | None = None,
            machine: Cluster | None = None, collective: str = "allreduce",
            **options: Any) -> list[Candidate]:
    """Plan and simulate every candidate under ``profile``; fastest first.

    A front door to :func:`topoplan.planners.comparison.compare`: the arguments become one
    ``auto`` :class:`~topoplan.planners.request.PlanRequest`.

    Parameters
    ----------
    cluster : Cluster
    size : int or str
        Bytes of the buffer, or a size such as ``"256MiB"``.
    candidates : sequence of str, optional
        Planner names (default :data:`DEFAULT_CANDIDATES`, those that plan
        ``collective``; above ``max_plan_ranks`` ranks only those declared ``large``:
        ``mcf``, ``hierarchical``, ``composed`` and ``nccl``).
    profile : CostProfile or str, optional
        The runtime's costs (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`).
    max_step_ops, max_chunks : int, optional
        Plan-size caps.
    max_sim_ops : int
        Schedules with more ops are not simulated (their report is ``None``).
    max_plan_ranks : int
        Above this many ranks only the ``large`` planners are planned, unless
        ``candidates`` names others explicitly.
    left_out : dict, optional
        Filled with ``name -> reason`` for the candidates left out.
    machine : Cluster, optional
        Where the plan will run, when not on ``cluster`` (a calibrated profile's host,
        :meth:`~topoplan.analysis.cost.CostProfile.host_cluster`): the candidates are planned for
        ``cluster`` and simulated on ``machine``, which must have as many ranks.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan.
    **options
        Passed to the planners that take them.

    Returns
    -------
    list of Candidate
        Sorted by time, simulated or (too big to simulate) their ``meta["estimate_s"]``;
        each also unpacks as ``(name, schedule, report, plan_seconds)``.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a schedule, or ``machine`` has another rank count.
    PlannerError
        For an unknown candidate, a size that is not a positive number of bytes, a cap
        that is not an integer >= 1, an option no candidate takes, or a candidate that
        does not plan ``collective`` (naming those that do).
    """
    request = PlanRequest.make(cluster, size=size, collective=collective, profile=profile,
                               max_step_ops=max_step_ops, max_chunks=max_chunks,
                               machine=machine, algorithm="auto", candidates=candidates,
                               max_sim_ops=max_sim_ops, max_plan_ranks=max_plan_ranks,
                               **options)
    found: dict[str, str] = dict(request.left_out)
    try:
        return compare_request(request, left_out=found)
    finally:
        if left_out is not None:
            left_out.update(found)


def choose(request: PlanRequest, candidates: Sequence[str] | None = None, *,
           max_sim_ops: int = MAX_SIM_OPS, max_plan_ranks: int = MAX_PLAN_RANKS) -> Schedule:
    """The fastest candidate of ``request`` in simulation, stamped with the comparison
    (see :func:`plan_auto`): :func:`topoplan.planners.pipeline.execute` of the request
    as an ``auto`` request."""
    from .pipeline import execute

    again = PlanRequest.make(request.cluster, size=request.size,
                             collective=request.collective, profile=request.profile,
                             max_step_ops=request.max_step_ops,
                             max_chunks=request.max_chunks, machine=request.machine,
                             algorithm="auto", candidates=candidates,
                             max_sim_ops=max_sim_ops, max_plan_ranks=max_plan_ranks,
                             **request.options)
    return execute(again).schedule


def plan_auto(cluster: Cluster, *, size: int | str = 256 << 20,
              candidates: Sequence[str] | None = None,
              profile: CostProfile | str | None = None, max_step_ops: int | None = None,
              max_chunks: int | None = None, machine: Cluster | None = None,
              collective: str = "allreduce", **options: Any) -> Schedule:
    """The fastest candidate's schedule in simulation at ``size`` under ``profile``:
    :func:`topoplan.plan` with ``algorithm="auto"``.

    Parameters
    ----------
    cluster : Cluster
    size : int or str
        Bytes per rank, or a size such as ``"256MiB"``.
    candidates : sequence of str, optional
        Planner names to compare (default :data:`DEFAULT_CANDIDATES`: mcf,
        hierarchical, ring, ring-topo, tree, rhd, nccl, composed).
    profile : CostProfile or str, optional
        The runtime's costs the candidates plan against and are simulated under
        (default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`).
    max_step_ops, max_chunks : int, optional
        Plan-size caps every candidate must meet (see :func:`compare`).
    machine : Cluster, optional
        Where the plan will run, if not on ``cluster`` (see :func:`compare`): the
        candidates are ranked by their time there.
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan: the candidates that plan it are compared (see :func:`compare`).
    **options
        Passed to the planners (``max_sim_ops`` and ``max_plan_ranks`` to
        :func:`compare`).

    Returns
    -------
    Schedule
        The chosen plan with ``meta["algorithm"] == "auto"``, ``meta["chosen"]`` (the
        planner's name), ``meta["chosen_algorithm_meta"]`` (its own meta, trimmed),
        ``meta["profile"]`` (the profile's name), ``meta["comparison"]``: per candidate,
        simulated seconds (or ``None``), its own estimate, whether it was simulated, ops,
        planning seconds, ``messages`` (that move bytes; all sends when not simulated),
        ``steps``, ``chunks``, the simulated ``breakdown`` of its time into bandwidth,
        latency, overhead and reduce (or ``None``) and ``speedup_vs_nccl`` (the
        ``nccl`` row's time over its own: the transport's own collective under the same
        profile, NCCL's model under ``nccl``), fastest first; and
        ``meta["left_out"]`` (``name -> reason``) when candidates could not meet the
        caps; and what :func:`topoplan.plan` stamps on every plan.

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a plan.
    PlannerError
        If ``size`` is not a positive number of bytes, or an option no candidate takes.
    """
    from . import plan
    return plan(cluster, "auto", size=size, candidates=candidates, profile=profile,
                max_step_ops=max_step_ops, max_chunks=max_chunks, machine=machine,
                collective=collective, **options)
