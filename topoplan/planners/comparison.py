"""Planning and pricing candidates: one row per planner, the ``nccl`` row, the comparison.

:func:`run` plans a validated :class:`~topoplan.planners.request.PlanRequest` with one
planner; :func:`price` plans it and prices the plan (simulated under the request's
profile, or for a plan too big to simulate its planner's own estimate) as a
:class:`Candidate`; :func:`compare` does that for every candidate, fastest first.
Inside :func:`shared` (the pipeline's request), each row is made once: ``composed``,
which compares planners on the box-level cluster, takes the rows already made when
that cluster is the request's own (one GPU a box).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from .._util import step
from ..errors import InfeasiblePlanError
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE, bus_factor
from ..ir.schedule import Schedule
from ._checks import check_caps, unknown_options
from .registry import SPECS, default_names, require_collective, spec_of
from .request import PlanRequest

if TYPE_CHECKING:
    from ..analysis.native.nccl import NcclChoice
    from ..analysis.sim import SimReport

__all__ = ["Candidate", "run", "price", "compare", "too_big", "nccl_candidate", "shared", "NCCL"]

#: The row of the transport's own collective (:mod:`topoplan.planners.native`).
NCCL = "nccl"


def run(request: PlanRequest, name: str, options: Mapping[str, Any] | None = None) -> Schedule:
    """Plan ``request`` with planner ``name`` (its own ``options``: default the request's,
    with the channels and vectored messages when it plans them itself).

    A planner that does not plan the channels itself plans to the caps over the
    request's channels (:meth:`PlanRequest.for_planner`).

    Raises
    ------
    PlannerError
        An unknown planner, one that does not plan the request's collective, or an
        option it does not take (naming those it takes).
    InfeasiblePlanError
        When it cannot meet the caps.
    """
    spec = spec_of(name)
    require_collective(name, request.collective)
    own = dict(request.options if options is None else options)
    if options is None:
        own.update({k: v for k, v in request.planner_options(name).items()
                    if k not in request.options})
    unknown = sorted(set(own) - set(spec.options))
    if unknown:
        raise unknown_options(name, unknown, list(spec.options))
    request = request.for_planner(name)
    if spec.core is not None:
        schedule = spec.core(request, **own)
    else:  # registered from outside: its function checks its arguments itself
        kwargs: dict[str, Any] = {"size": request.size, **own}
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
        """Simulated seconds; else NCCL's by its model, else the planner's own estimate;
        NaN when there is none (:attr:`unpriced` says why)."""
        if self.report is not None:
            return float(self.report.time_s)
        if self.nccl is not None:
            return float(self.nccl.time_s)
        assert self.schedule is not None
        est = self.schedule.meta.get("estimate_s")
        return float(est) if isinstance(est, (int, float)) else float("nan")

    @property
    def unpriced(self) -> str | None:
        """Why the row has no time, in words (the tables print it instead of a number);
        None when it has one: simulated, NCCL's by its model, or its planner's estimate."""
        if math.isfinite(self.time_s):
            return None
        if self.report is None and self.nccl is None and self.schedule is not None:
            est = self.schedule.meta.get("estimate_s")
            if est is None:
                return ("too many ops to simulate here, and no estimate from the planner "
                        "(topoplan simulate CLUSTER PLAN.json prices it)")
            return f"not simulated, and its planner's own estimate is not a number ({est!r})"
        return f"its time is not a number ({self.time_s!r})"

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

    @property
    def native(self) -> bool:
        """Whether its plan holds native steps (the transport's own collectives)."""
        return self.schedule is not None and self.schedule.nnative > 0

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


# The rows made for the pipeline's request, by what they depend on (see :func:`shared`).
_ROWS: ContextVar[dict[tuple, Candidate] | None] = ContextVar("topoplan_rows", default=None)


@contextmanager
def shared() -> Iterator[None]:
    """Make each row once inside the block: a row asked for again (the same planner on
    the same network, collective, size, profile, caps and options) is the row made
    before, simulated then if it was not and may be now."""
    if _ROWS.get() is not None:
        yield
        return
    token = _ROWS.set({})
    try:
        yield
    finally:
        _ROWS.reset(token)


def _row_key(request: PlanRequest, name: str, options: Mapping[str, Any]) -> tuple:
    from ..ir.fingerprint import cluster_fingerprint

    request = request.for_planner(name)
    where = None if request.machine is None else cluster_fingerprint(request.machine)
    return (name, cluster_fingerprint(request.cluster), where, request.collective,
            request.size, request.profile, request.max_step_ops, request.max_chunks,
            repr(sorted(options.items())))


def price(request: PlanRequest, name: str, options: Mapping[str, Any] | None = None, *,
          max_sim_ops: int | None = None) -> Candidate:
    """Plan ``request`` with ``name`` (:func:`run`) and price the plan: simulated on
    :attr:`~PlanRequest.where` under the request's profile, or, with more ops than
    ``max_sim_ops`` (default the request's), by its planner's own estimate."""
    from ..analysis.sim import simulate

    limit = request.max_sim_ops if max_sim_ops is None else max_sim_ops
    own = request.planner_options(name) if options is None else dict(options)
    rows = _ROWS.get()
    key = _row_key(request, name, own) if rows is not None else ()
    row = rows.get(key) if rows is not None else None
    if row is None:
        step(f"{name}: planning {request.cluster.nranks} ranks ...")
        t0 = time.perf_counter()
        schedule = run(request, name, own)
        row = Candidate(name, schedule, None, time.perf_counter() - t0,
                        nccl=request.yardsticks.nccl if name == NCCL else None)
    assert row.schedule is not None
    if row.report is None and row.schedule.nops <= limit:
        step(f"{name}: simulating {row.schedule.nops} ops ...")
        report = simulate(request.where, row.schedule, request.size, profile=request.profile,
                          yardsticks=request.yardsticks)
        row = Candidate(name, row.schedule, report, row.plan_s, row.nccl)
    if rows is not None:
        rows[key] = row
    return row


def too_big(request: PlanRequest, name: str, limit: int) -> str | None:
    """Why planner ``name``'s plan of ``request`` would have no time, worked out without
    planning it, or None: its planner makes no estimate of its own
    (:attr:`~.registry.PlannerSpec.min_ops` declared) and even its fewest ops are over
    the simulator's ``limit``. The planner's own options (``chunks``) only add ops."""
    spec = SPECS[name]
    if spec.min_ops is None:
        return None
    fewest = spec.min_ops(request.for_planner(name))
    if fewest <= limit:
        return None
    return (f"{name}: its plan would hold at least {fewest:,} ops, over the {limit:,} the "
            "simulator takes here, and its planner makes no estimate of its own: it would "
            "have no time")


def compare(request: PlanRequest, names: Sequence[str] | None = None, *,
            max_sim_ops: int | None = None, max_plan_ranks: int | None = None,
            left_out: dict[str, str] | None = None,
            progress: Callable[[str], None] | None = None) -> list[Candidate]:
    """Plan and price every candidate of ``request``; fastest first.

    Parameters
    ----------
    request : PlanRequest
    names : sequence of str, optional
        Planners to compare: default the request's candidates, or for a request made
        without an algorithm :func:`~topoplan.planners.registry.default_names`; each
        must plan the request's collective.
    max_sim_ops : int, optional
        Schedules with more ops are not simulated: their planner's own estimate
        (``meta["estimate_s"]``) ranks them among the others (default the request's).
    max_plan_ranks : int, optional
        See :func:`~topoplan.planners.registry.default_names`.
    left_out : dict, optional
        Filled with ``name -> reason`` for the candidates that could not meet the caps.
    progress : callable, optional
        Called with each planner's name before it plans (each step is also told to
        :func:`topoplan._util.step`, which the CLI's status line shows).

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
    if names is None:
        names = request.candidates if request.algorithm is not None else \
            default_names(request, max_plan_ranks)
    names = list(names)
    for name in names:
        require_collective(name, request.collective)
    # An option no candidate takes is a mistake (a misspelling), not one to drop.
    unused = sorted(k for k in request.options if not any(k in SPECS[n].options for n in names))
    if unused:
        known = sorted({o for n in names for o in SPECS[n].options})
        raise unknown_options("auto", unused, known)
    rows: list[Candidate] = []
    last: Exception | None = None
    limit = request.max_sim_ops if max_sim_ops is None else max_sim_ops
    for name in names:
        # On a large cluster, a row that could have no time is not built (ring over
        # 16384 ranks: 1 G ops); one named (-a) is, and small clusters show every row.
        why = too_big(request, name, limit) \
            if request.cluster.nranks > request.max_plan_ranks and name != request.algorithm \
            else None
        if why is not None:
            why += f" (name it, -a {name}, to plan it anyway)"
            if left_out is not None:
                left_out[name] = why
            last = InfeasiblePlanError(why)
            continue
        if progress is not None:
            progress(name)
        try:
            rows.append(price(request, name, max_sim_ops=max_sim_ops))
        except InfeasiblePlanError as exc:
            last = exc
            if left_out is not None:
                left_out[name] = str(exc)
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
    # the request's options are its planners' (mcf's channels): the native row takes none
    return price(request, NCCL, {}, max_sim_ops=max(request.max_sim_ops, 1))
