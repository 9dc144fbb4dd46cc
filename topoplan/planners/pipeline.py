"""One path from a plan request to the plan: compare, choose, channels and vectored
messages, verify, stamp.

:func:`execute` takes a :class:`~topoplan.planners.request.PlanRequest` made with an
algorithm (``auto`` or a planner's name) and returns a :class:`PlanResult`: every row it
compared, the ``nccl`` row, the bounds, the chosen row and the schedule as it will run,
verified and stamped. :func:`topoplan.plan` returns that schedule; ``topoplan plan``
prints the result and writes the same schedule. Each argument is checked once (by
:meth:`PlanRequest.make`), each row planned and priced once (:func:`~.comparison.shared`),
each bound computed once (:attr:`PlanRequest.bounds`).

The steps:

1. **Compare**: plan and price the request's candidates (:func:`~.comparison.compare`):
   with ``auto`` every candidate, with a planner's name that planner (and the
   candidates named beside it). Planners that cannot meet the caps are left out, and
   the result says why; on channels, so are the planners whose plans hold native steps.
2. **Choose**: ``auto`` keeps the fastest row; a named planner is its own row.
3. **Channels and vectored messages**: a planner that plans them itself (``mcf``) has
   done so; any other plan is cut over the channels
   (:func:`~topoplan.ir.passes.channelize`) and vectorized
   (:func:`~topoplan.ir.passes.vectorize`) now, and priced again.
4. **Verify** the schedule that will run (:func:`~topoplan.ir.verify.verify`), unless
   its planner verified it.
5. **Stamp** it (:func:`stamp`): what it was planned for and what it was measured
   against, so that the file and the API agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Mapping

from .._util import step
from ..errors import InfeasiblePlanError
from ..ir.fingerprint import META_KEY, cluster_fingerprint
from ..ir.schedule import Schedule
from ..ir.verify import mark_verified
from .certificate import Certificate, certify_schedule
from .comparison import NCCL, Candidate, compare, nccl_candidate, price, run, shared
from .registry import default_names
from .request import AUTO, MAX_PLAN_RANKS, MAX_SIM_OPS, Bounds, PlanRequest

__all__ = ["PlanRequest", "PlanResult", "Candidate", "Bounds", "execute", "stamp", "run",
           "compare", "price", "nccl_candidate", "default_names", "MAX_SIM_OPS",
           "MAX_PLAN_RANKS", "NCCL"]


@dataclass(frozen=True)
class PlanResult:
    """What :func:`execute` made of a request.

    Attributes
    ----------
    request : PlanRequest
    rows : tuple of Candidate
        Every candidate compared, fastest first (each as planned, on one channel unless
        its planner planned the channels).
    chosen : Candidate
        The row kept: the fastest with ``auto``, else the named planner's.
    nccl : Candidate
        The transport's own collective over every rank (a row of ``rows`` when it was a
        candidate).
    left_out : mapping
        ``name -> why`` for the candidates that gave no row.
    schedule : Schedule
        The chosen plan as it will run (on its channels, vectored), verified and
        stamped (:func:`stamp`).
    time_s : float
        Its predicted time: simulated, or its planner's estimate when too big to
        simulate.
    simulated : bool
        Whether ``time_s`` was simulated.
    notes : mapping
        What changed between the chosen row and the schedule: ``one_channel_s`` (the
        chosen plan's time on one channel, when it runs on several) and
        ``unvectored_s`` (its time before vectorizing, when that changed it).
    """

    request: PlanRequest
    rows: tuple[Candidate, ...]
    chosen: Candidate
    nccl: Candidate
    left_out: Mapping[str, str]
    schedule: Schedule
    time_s: float
    simulated: bool
    notes: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def bounds(self) -> Bounds:
        return self.request.bounds

    @property
    def channels(self) -> int:
        """Channels the schedule runs on."""
        return self.schedule.nchannels

    @cached_property
    def certificate(self) -> Certificate | None:
        """The schedule's certificate (as it runs: on its channels, vectored), as its
        ``meta["certificate"]`` records it; None on one GPU."""
        return certify_schedule(self.schedule, self.bounds, self.time_s,
                                self.request.profile, planner=self.chosen.name)

    def row_certificate(self, row: Candidate) -> Certificate | None:
        """A row's certificate (its plan as compared; None on one GPU)."""
        assert row.schedule is not None
        return certify_schedule(row.schedule, self.bounds, row.time_s,
                                self.request.profile, planner=row.name)

    @property
    def shown(self) -> tuple[Candidate, ...]:
        """The rows and, when it was not a candidate, the ``nccl`` row last."""
        return self.rows + (() if self.nccl in self.rows else (self.nccl,))


def execute(request: PlanRequest) -> PlanResult:
    """Plan ``request`` (made with an algorithm: ``auto`` or a planner's name) from the
    comparison to the stamped schedule (see the module's notes).

    Raises
    ------
    InfeasiblePlanError
        No candidate produced a plan (the reasons are chained), or the named planner
        could not (its reason), or the plan on its channels breaks a cap.
    PlannerError
        The request was made without an algorithm.
    """
    if request.algorithm is None:
        from ..errors import PlannerError
        raise PlannerError("execute: the request names no algorithm; make it with "
                           "PlanRequest.make(..., algorithm='auto')")
    left_out = dict(request.left_out)
    with shared():
        try:
            rows = compare(request, left_out=left_out)
        except InfeasiblePlanError as exc:
            if request.algorithm in left_out:  # the planner asked for, alone, could not
                raise _on_channels(request, left_out[request.algorithm]) from None
            raise _on_channels(request, str(exc)) from exc.__cause__
        nccl = nccl_candidate(request, rows)
        if request.algorithm == AUTO:
            chosen = rows[0]
        elif request.algorithm in left_out:
            raise _on_channels(request, left_out[request.algorithm])
        else:
            chosen = next(c for c in rows if c.name == request.algorithm)
        schedule, time_s, simulated, notes = _as_it_runs(request, chosen)
    schedule = stamp(request, schedule, rows=rows, chosen=chosen, nccl=nccl,
                     left_out=left_out, time_s=time_s)
    mark_verified(schedule)  # verified above (or by its planner): executors trust it
    return PlanResult(request, tuple(rows), chosen, nccl, MappingProxyType(left_out),
                      schedule, time_s, simulated, MappingProxyType(notes))


def _on_channels(request: PlanRequest, reason: str) -> InfeasiblePlanError:
    """The error of a plan that could not meet the caps, saying what they were per
    channel when the planners planned to them over the channels."""
    channels = request.channels
    if not isinstance(channels, int) or channels == 1 or not request.caps:
        return InfeasiblePlanError(reason)
    from .channels import per_channel
    return InfeasiblePlanError(
        f"{reason} (on {channels} channels the caps per channel are max_chunks="
        f"{per_channel(request.max_chunks, channels)}, max_step_ops="
        f"{per_channel(request.max_step_ops, channels)})")


def _as_it_runs(request: PlanRequest, chosen: Candidate
                ) -> tuple[Schedule, float, bool, dict[str, float]]:
    """The chosen plan on its channels and vectored, as the request asks and its planner
    did not do itself, verified; its predicted time, whether simulated, and notes."""
    from ..ir.verify import verify

    schedule = chosen.schedule
    assert schedule is not None
    time_s, simulated = chosen.time_s, chosen.simulated
    notes: dict[str, float] = {}
    channels_itself, vectors_itself = request.plans_itself(chosen.name)
    changed = False
    if channels_itself:
        one = schedule.meta.get("estimate_one_channel_s")
        if isinstance(one, (int, float)):
            notes["one_channel_s"] = float(one)
    elif isinstance(request.channels, int) and request.channels > 1:
        from ..ir.passes import channelize
        from .channels import check_caps_on_channels
        step(f"{chosen.name}: cutting over {request.channels} channels ...")
        notes["one_channel_s"] = time_s
        schedule = check_caps_on_channels(
            channelize(schedule, request.channels, request.channel_skew), request.channels,
            request.max_step_ops, request.max_chunks)
        changed = True
    if request.vectored and not vectors_itself:
        from ..ir.passes import vectorize
        step(f"{chosen.name}: vectorizing ...")
        before = schedule.nops
        vectored = vectorize(schedule)
        if vectored.nops != before:
            if changed:  # priced on its channels first: what vectorizing saves is its own
                time_s, simulated = _price_again(request, schedule)
            notes["unvectored_s"] = time_s
            schedule, changed = vectored, True
    if changed:
        step(f"{chosen.name}: verifying {schedule.nops} ops ...")
        verify(schedule)
        time_s, simulated = _price_again(request, schedule)
    elif not schedule.meta.get("verified"):  # mcf verifies what it builds
        step(f"{chosen.name}: verifying {schedule.nops} ops ...")
        verify(schedule)
    return schedule, time_s, simulated, notes


def _price_again(request: PlanRequest, schedule: Schedule) -> tuple[float, bool]:
    """Simulated seconds of ``schedule`` (a changed plan), or NaN when too big."""
    from ..analysis.sim import simulate

    if schedule.nops > request.max_sim_ops:
        return math.nan, False
    report = simulate(request.where, schedule, request.size, profile=request.profile,
                      yardsticks=request.yardsticks)
    return report.time_s, True


def stamp(request: PlanRequest, schedule: Schedule, *, rows: Any = (),
          chosen: Candidate | None = None, nccl: Candidate | None = None,
          left_out: Mapping[str, str] | None = None,
          time_s: float | None = None) -> Schedule:
    """``schedule`` with what the plan records (docs/SCHEDULE.md, "meta"): the cluster's
    fingerprint, the size it was made for, the profile, the ``nccl`` row, the bounds,
    and, from :func:`execute`, the predicted time, the chosen planner, its certificate
    (:mod:`~topoplan.planners.certificate`) and the comparison (with ``auto``:
    ``algorithm`` is ``"auto"``, the chosen planner's own meta kept as
    ``chosen_algorithm_meta``)."""
    # The size it was made for: simulate marks the sizes it runs that are not this one.
    extra: dict[str, Any] = {META_KEY: cluster_fingerprint(request.cluster),
                             "size_bytes": request.size, **request.bounds.meta()}
    if "profile" not in schedule.meta:
        extra["profile"] = request.profile.name
    choice = request.yardsticks.nccl
    if choice is not None:
        extra["nccl"] = choice.to_dict()
    if time_s is not None:
        extra["predicted_time_s"] = time_s if math.isfinite(time_s) else None
    if chosen is not None:
        extra["chosen"] = chosen.name
        extra["comparison"] = [_comparison_row(c, nccl) for c in rows]
        found = certify_schedule(schedule, request.bounds, time_s, request.profile,
                                 planner=chosen.name)
        extra["certificate"] = found.to_dict() if found is not None else None
    if left_out:
        extra["left_out"] = dict(left_out)
    if request.machine is not None:
        extra["machine"] = request.machine.name
    if request.algorithm == AUTO:
        extra["chosen_algorithm_meta"] = {
            k: v for k, v in schedule.meta.items()
            if isinstance(v, (int, float, str, bool)) or v is None}
        extra.update(algorithm=AUTO, cluster=request.cluster.name)
    return schedule.with_meta(**extra)


def _comparison_row(c: Candidate, nccl: Candidate | None) -> dict[str, Any]:
    return {"algorithm": c.name,
            "time_s": c.report.time_s if c.report is not None else None,
            "estimate_s": c.schedule.meta.get("estimate_s") if c.schedule else None,
            "simulated": c.report is not None,
            "nops": c.schedule.nops if c.schedule else None,
            "plan_s": round(c.plan_s, 4), "messages": c.messages,
            "steps": c.schedule.nsteps if c.schedule else None,
            "chunks": c.schedule.nchunks if c.schedule else None,
            "breakdown": c.breakdown, "speedup_vs_nccl": c.speedup_over(nccl)}
