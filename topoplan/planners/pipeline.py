"""One path from a plan request to priced candidates.

A :class:`PlanRequest` (cluster, collective, size, cost profile, caps, options) is built
and validated once (:meth:`PlanRequest.make`), then handed whole to the planners
(:func:`run`), to the comparison of candidates (:func:`compare`) and to the NCCL
yardstick (:func:`nccl_candidate`). :func:`topoplan.plan`, ``auto`` and ``topoplan plan``
all go this way, and all get :class:`Candidate` rows back.

Planners are declared, not discovered: a :class:`PlannerSpec` says which collectives a
planner plans and which options it takes beyond the request's own (``size``,
``profile``, ``collective``, the caps).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .._util import step
from ..ir.collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ..analysis.cost import CostProfile, get_profile
from ..errors import InfeasiblePlanError, PlannerError
from ..ir.schedule import Schedule
from ..ir.collectives import bus_factor
from ._checks import check_cap_args, check_caps, check_size, unknown_options
from .registry import SPECS, PlannerSpec, planners_for

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..analysis.native.nccl import NcclChoice
    from ..analysis.sim import SimReport

__all__ = ["PlanRequest", "Candidate", "run", "compare", "nccl_candidate",
           "MAX_SIM_OPS", "MAX_PLAN_RANKS", "NCCL"]

#: Candidates with more ops are not simulated but ranked by their own estimate (the
#: simulator re-rates every flow at each event: mcf's 1024-GPU plan of 475 k ops took
#: ~40 s to simulate, its own estimate was 0.5% from the simulated time).
#: ``topoplan simulate`` simulates any plan.
MAX_SIM_OPS = 250_000
#: Above this many ranks only the planners declared ``large`` are compared by default.
MAX_PLAN_RANKS = 256
#: The row of the transport's own collective (:mod:`topoplan.planners.native`).
NCCL = "nccl"

Planner = Callable[..., Schedule]


@dataclass(frozen=True)
class PlanRequest:
    """One validated request: everything a planner, ``auto`` and the simulator need.

    Attributes
    ----------
    cluster : Cluster
    collective : str
        ``allreduce``, ``reduce_scatter`` or ``allgather``.
    size : int
        Bytes of the full buffer: an allreduce's buffer on every rank, a
        reduce-scatter's input, an allgather's output (as nccl-tests counts them).
    profile : CostProfile
        The runtime's costs; planners plan against it and the simulator charges it.
    max_step_ops, max_chunks : int or None
        Plan-size caps: most ops a rank posts in one step, most chunks.
    options : mapping
        Planner options (``chunks``, ``order``, ...), given to the planners that take them.
    machine : Cluster or None
        Where the plans will run when not on ``cluster`` (a calibrated profile's host):
        candidates are simulated there.
    """

    cluster: Cluster
    collective: str = DEFAULT_COLLECTIVE
    size: int = 256 << 20
    profile: CostProfile = field(default_factory=lambda: get_profile(None))
    max_step_ops: int | None = None
    max_chunks: int | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    machine: Cluster | None = None

    @classmethod
    def make(cls, cluster: Cluster | str | os.PathLike, *, size: int | str = 256 << 20,
             collective: str = DEFAULT_COLLECTIVE, profile: CostProfile | str | None = None,
             max_step_ops: int | None = None, max_chunks: int | None = None,
             machine: Cluster | None = None, who: str = "plan",
             **options: Any) -> PlanRequest:
        """Check every argument once and build the request.

        Raises
        ------
        PlannerError
            A size that is not a positive number of bytes (an int, or a string such as
            ``"256MiB"``), an unknown collective, or a cap that is not an integer >= 1.
        ProfileError
            An unknown profile name or a bad profile file.
        InfeasiblePlanError
            A ``machine`` with another rank count than ``cluster``.
        """
        from ..cluster import as_cluster  # networkx and yaml load with the first plan
        cluster = as_cluster(cluster, who)
        if isinstance(collective, str) and collective in COLLECTIVES:
            pass
        else:
            raise PlannerError(f"unknown collective {collective!r}; known: "
                               f"{', '.join(COLLECTIVES)}")
        size = check_size(size, who)
        check_cap_args(max_step_ops, max_chunks, who)
        if machine is not None and machine.nranks != cluster.nranks:
            raise InfeasiblePlanError(f"{who}: the machine {machine.name!r} has "
                                      f"{machine.nranks} ranks but cluster {cluster.name!r} "
                                      f"has {cluster.nranks}")
        return cls(cluster=cluster, collective=collective, size=size,
                   profile=get_profile(profile), max_step_ops=max_step_ops,
                   max_chunks=max_chunks, options=MappingProxyType(dict(options)),
                   machine=machine)

    @property
    def where(self) -> Cluster:
        """The cluster the candidates are simulated on."""
        return self.cluster if self.machine is None else self.machine

    @property
    def caps(self) -> dict[str, int]:
        return {k: v for k, v in (("max_step_ops", self.max_step_ops),
                                  ("max_chunks", self.max_chunks)) if v is not None}

    def with_options(self, **options: Any) -> PlanRequest:
        return replace(self, options=MappingProxyType({**self.options, **options}))


def _spec(name: str) -> PlannerSpec:
    spec = SPECS.get(name)
    if spec is None or name == "auto":
        known = ", ".join(sorted(n for n in SPECS if n != "auto"))
        raise PlannerError(f"unknown algorithm {name!r}; known: {known}")
    return spec


def _require(spec: PlannerSpec, collective: str) -> None:
    if not spec.plans(collective):
        raise PlannerError(f"planner {spec.name!r} plans only "
                           f"{', '.join(spec.collectives)}; {collective} is planned by "
                           f"{', '.join(planners_for(collective))}")


def run(request: PlanRequest, name: str, options: Mapping[str, Any] | None = None) -> Schedule:
    """Plan ``request`` with planner ``name`` (its own ``options``: default the request's).

    Raises
    ------
    PlannerError
        An unknown planner, one that does not plan the request's collective, or an
        option it does not take (naming those it takes).
    InfeasiblePlanError
        When it cannot meet the caps.
    """
    spec = _spec(name)
    _require(spec, request.collective)
    options = dict(request.options if options is None else options)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise unknown_options(name, unknown, list(spec.options))
    kwargs: dict[str, Any] = {"size": request.size, **options}
    if spec.profile:
        kwargs["profile"] = request.profile
    if spec.caps:
        kwargs.update(request.caps)
    if len(spec.collectives) > 1:
        kwargs["collective"] = request.collective
    schedule = spec.function(request.cluster, **kwargs)
    if request.caps and spec.caps:
        check_caps(schedule, request.max_step_ops, request.max_chunks, name)
    elif request.caps:
        _check_plan(schedule, request.max_step_ops, request.max_chunks, name)
    return schedule


def _check_plan(schedule: Schedule, max_step_ops: int | None, max_chunks: int | None,
                name: str) -> None:
    """InfeasiblePlanError when the plan of a planner that does not take the caps breaks
    one."""
    if max_chunks is not None and schedule.nchunks > max_chunks:
        raise InfeasiblePlanError(f"{name}: its plan has {schedule.nchunks} chunks, over "
                                  f"max_chunks={max_chunks} (the planner does not fit its "
                                  "plans to the caps)")
    if max_step_ops is not None and schedule.max_step_ops > max_step_ops:
        raise InfeasiblePlanError(f"{name}: its plan posts {schedule.max_step_ops} ops in one "
                                  f"step, over max_step_ops={max_step_ops} (the planner does "
                                  "not fit its plans to the caps)")


@dataclass(frozen=True)
class Candidate:
    """One row of a comparison: a planner's schedule and its simulated (or estimated)
    time. NCCL's own collective is the row ``nccl``: its schedule is one native op over
    every rank (:func:`~topoplan.planners.native.plan_native`), priced by the simulator
    like any other, and ``nccl`` says what NCCL runs for it (algorithm, protocol,
    channels; ``None`` on a machine NCCL does not run on).

    For code written against the 4-tuples :func:`topoplan.planners.auto.compare` used
    to return, a candidate also unpacks as ``(name, schedule, report, plan_s)``.
    """

    name: str
    schedule: Schedule | None
    report: SimReport | None
    plan_s: float = 0.0
    nccl: NcclChoice | None = None

    # -- the old tuple view ------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return iter((self.name, self.schedule, self.report, self.plan_s))

    def __getitem__(self, index: int) -> Any:
        return (self.name, self.schedule, self.report, self.plan_s)[index]

    # -- what the tables show ----------------------------------------------------
    @property
    def algorithm(self) -> str:
        return self.name

    @property
    def simulated(self) -> bool:
        return self.report is not None or self.nccl is not None

    @property
    def time_s(self) -> float:
        """Simulated seconds; else NCCL's by its model, else the planner's own estimate."""
        if self.report is not None:
            return float(self.report.time_s)
        if self.nccl is not None:
            return float(self.nccl.time_s)
        assert self.schedule is not None
        est = self.schedule.meta.get("estimate_s")
        return float(est) if isinstance(est, (int, float)) else float("nan")

    @property
    def messages(self) -> int | None:
        """Messages that move bytes (simulated), else every send; None for NCCL."""
        if self.schedule is None:
            return None
        if self.report is not None:
            return int(self.report.messages)
        return int(self.schedule.nmessages)

    @property
    def breakdown(self) -> dict[str, float] | None:
        """The simulated time split into bandwidth, latency, overhead, reduce and
        contention (NCCL's: its latency term and the rest); None when estimated."""
        if self.report is not None:
            return dict(self.report.breakdown)
        if self.nccl is not None:
            latency = min(self.nccl.latency_s, self.nccl.time_s)
            return {"bandwidth": self.nccl.time_s - latency, "latency": latency,
                    "overhead": 0.0, "reduce": 0.0, "contention": 0.0}
        return None

    def algbw(self, size: int, nranks: int, collective: str = DEFAULT_COLLECTIVE
              ) -> tuple[float, float]:
        """(algbw, busbw) in bytes/s."""
        if self.report is not None:
            return self.report.algbw, self.report.busbw
        if not self.time_s > 0:
            return math.inf, math.inf
        algbw = size / self.time_s
        return algbw, algbw * bus_factor(nranks, collective)

    def speedup_over(self, other: Candidate | None) -> float | None:
        """``other``'s time over this one's (above 1: this is faster)."""
        if other is None or not self.time_s > 0 or not math.isfinite(self.time_s):
            return None
        return other.time_s / self.time_s

    def sort_key(self) -> tuple[float, int]:
        # By time, simulated or the planner's own estimate for a schedule too big to
        # simulate (mcf's is within 1% of its simulation; a plan without an estimate goes
        # last); ties to 1e-9 relative go to the smaller schedule.
        nops = self.schedule.nops if self.schedule is not None else 0
        time_s = self.report.time_s if self.report is not None else self.time_s
        return (float(f"{time_s:.9e}") if math.isfinite(time_s) else math.inf, nops)


def default_names(request: PlanRequest, max_plan_ranks: int = MAX_PLAN_RANKS) -> list[str]:
    """The planners ``auto`` compares for ``request``: every declared candidate that plans
    its collective, only the ``large`` ones above ``max_plan_ranks`` ranks."""
    return [s.name for s in SPECS.values()
            if s.candidate and s.plans(request.collective)
            and (request.cluster.nranks <= max_plan_ranks or s.large)]


def compare(request: PlanRequest, names: Sequence[str] | None = None, *,
            max_sim_ops: int = MAX_SIM_OPS, max_plan_ranks: int = MAX_PLAN_RANKS,
            left_out: dict[str, str] | None = None,
            progress: Callable[[str], None] | None = None) -> list[Candidate]:
    """Plan and price every candidate of ``request``; fastest first.

    Parameters
    ----------
    request : PlanRequest
    names : sequence of str, optional
        Planners to compare (default :func:`default_names`); each must plan the
        request's collective.
    max_sim_ops : int
        Schedules with more ops are not simulated: their planner's own estimate
        (``meta["estimate_s"]``) ranks them among the others.
    max_plan_ranks : int
        See :func:`default_names`.
    left_out : dict, optional
        Filled with ``name -> reason`` for the candidates that could not meet the caps.
    progress : callable, optional
        Called with each planner's name before it plans (each step is also told to
        :func:`topoplan._progress.step`, which the CLI's status line shows).

    Returns
    -------
    list of Candidate
        Sorted by time: simulated, or for a schedule too big to simulate its planner's
        own estimate (none: last).

    Raises
    ------
    InfeasiblePlanError
        If no candidate produced a schedule (the last error is chained).
    PlannerError
        An unknown planner, one that does not plan the collective, or an option that no
        candidate takes.
    """
    from ..analysis.sim import simulate

    names = list(names) if names is not None else default_names(request, max_plan_ranks)
    specs = []
    for name in names:
        try:
            spec = _spec(name)
        except PlannerError as exc:
            raise InfeasiblePlanError(f"auto: {exc}") from None
        _require(spec, request.collective)
        specs.append(spec)
    # An option no candidate takes is a mistake (a misspelling), not one to drop.
    unused = sorted(k for k in request.options if not any(k in s.options for s in specs))
    if unused:
        known = sorted({o for s in specs for o in s.options})
        raise unknown_options("auto", unused, known)
    rows: list[Candidate] = []
    last: Exception | None = None
    for spec in specs:
        if progress is not None:
            progress(spec.name)
        step(f"{spec.name}: planning {request.cluster.nranks} ranks ...")
        options = {k: v for k, v in request.options.items() if k in spec.options}
        t0 = time.perf_counter()
        try:
            schedule = run(request, spec.name, options)
        except InfeasiblePlanError as exc:
            last = exc
            if left_out is not None:
                left_out[spec.name] = str(exc)
            continue
        plan_s = time.perf_counter() - t0
        report = None
        if schedule.nops <= max_sim_ops:
            step(f"{spec.name}: simulating {schedule.nops} ops ...")
            report = simulate(request.where, schedule, request.size, profile=request.profile)
        rows.append(Candidate(spec.name, schedule, report, plan_s,
                              nccl=_nccl_choice(request) if spec.name == NCCL else None))
    if not rows:
        raise InfeasiblePlanError(f"auto on {request.cluster.name!r}: no candidate produced a "
                                  f"plan ({', '.join(names)})"
                                  + (f": {last}" if last is not None else "")) from last
    rows.sort(key=Candidate.sort_key)
    return rows


def nccl_candidate(request: PlanRequest, rows: Sequence[Candidate] = ()) -> Candidate:
    """The transport's own collective over every rank for ``request``, as the row
    ``nccl``: the ``nccl`` plan (one native op, :mod:`topoplan.planners.native`)
    simulated under the request's profile, with what NCCL runs for it
    (:mod:`topoplan.analysis.native.nccl`; ``None`` on a calibrated profile's host).
    Under the ``nccl`` profile its time is the NCCL model's exactly. The row of
    ``rows`` (a comparison that ran it) when there is one.
    """
    found = next((row for row in rows if row.name == NCCL), None)
    if found is not None:
        return found
    from ..analysis.sim import simulate

    t0 = time.perf_counter()
    # the request's options are its planners' (mcf's channels): the native row takes none
    schedule = run(request, NCCL, {k: v for k, v in request.options.items()
                                   if k in SPECS[NCCL].options})
    plan_s = time.perf_counter() - t0
    report = simulate(request.where, schedule, request.size, profile=request.profile)
    return Candidate(NCCL, schedule, report, plan_s, nccl=_nccl_choice(request))


def _nccl_choice(request: PlanRequest) -> NcclChoice | None:
    from ..analysis.sim.run import nccl_row
    return nccl_row(request.where, request.size, request.collective)
