"""A certificate with every plan: the bound it is measured against, its gap to it, and
whether the optimum is known or only bracketed.

A plan's time means little without a yardstick that no plan of its kind can beat.
:func:`certify` picks, of the request's bounds (:class:`~.request.Bounds`), the largest
that provably applies to the plan (docs/SCHEDULE.md, "The certificate"):

- the **bandwidth bound** of its collective, which holds for every plan: the allreduce
  lower bound (:func:`~topoplan.analysis.bound.lower_bound`), or a reduce-scatter's or
  allgather's shard cut bound (:func:`~topoplan.analysis.bound.shard_bound`);
- for an allreduce, the **RS+AG cut bound** (:func:`~topoplan.analysis.bound.rsag_bound`)
  when the plan is RS+AG-structured (its planner declares so:
  :attr:`~.registry.PlannerSpec.rsag`), or when it equals the lower bound (it then holds
  for every plan);
- under a profile that charges latency, the **latency-aware bound**
  (:func:`~topoplan.analysis.bound.latency_bound`) for a point-to-point plan on one
  channel. It does not bound native steps (NCCL's tuner latencies are not the profile's
  point-to-point ones), and a plan on several channels can hide one channel's step
  latency behind another's transfer, which its bandwidth-plus-steps term does not allow
  for.

The optimum is **known** when the bandwidth bound is reachable: a reduce-scatter's or an
allgather's cut bound always is (ForestColl), an allreduce's when the RS+AG cut bound
(reachable by reduce-scatter then allgather) equals the lower bound (within
:data:`SAME`). Otherwise it is **bracketed**: the fastest allreduce's bandwidth time lies
between the two. Latency is not part of that statement: no latency-aware bound is proved
reachable.

``topoplan verify PLAN --cluster C`` recomputes a plan's certificate from the schedule
(:func:`check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ScheduleError
from ..ir.collectives import get_collective

if TYPE_CHECKING:
    from ..analysis.cost import CostProfile
    from ..cluster import Cluster
    from ..ir.schedule import Schedule
    from .request import Bounds

__all__ = ["Certificate", "certify", "certify_schedule", "recompute", "check", "SAME", "GAP_TOLERANCE",
           "LOWER", "RSAG", "SHARD"]

#: Two bounds within this relative difference are one (the optimum is then known).
SAME = 1e-9
#: A recorded gap holds when the recomputed one is within this relative difference (the
#: simulator is deterministic; a plan too big to simulate when planned was priced by its
#: planner's estimate, within 1% of the simulated time on the plans measured).
GAP_TOLERANCE = 0.01
#: A recorded bound holds when the recomputed one is within this relative difference.
BOUND_TOLERANCE = 1e-6

LOWER = "allreduce lower bound"
RSAG = "RS+AG cut bound"
SHARD = "shard cut bound"


def latency_name(profile: str) -> str:
    """The latency-aware bound's name under ``profile``: ``latency-aware bound (profile
    nccl)``."""
    return f"latency-aware bound (profile {profile})"


@dataclass(frozen=True)
class Certificate:
    """What a plan's time is measured against.

    Attributes
    ----------
    bound : str
        Which bound: ``"allreduce lower bound"``, ``"RS+AG cut bound"``, ``"shard cut
        bound"`` or ``"latency-aware bound (profile NAME)"``.
    bound_s : float
        Its value: no plan of the kind is faster.
    time_s : float or None
        The plan's time (simulated, or its planner's estimate); None without one.
    gap : float or None
        ``time_s / bound_s`` (1.0: as fast as the bound allows); None without a time.
    optimum : str
        ``"known"``: the bandwidth bound is reachable; ``"bracketed"``: the fastest
        plan's bandwidth time lies in :attr:`bracket_s`.
    bracket_s : tuple of float
        ``(lower, upper)``: the allreduce lower bound and the RS+AG cut bound (an
        allreduce), or the shard cut bound twice (a reduce-scatter or an allgather).
    rsag_structured : bool or None
        An allreduce plan's planner declares it RS+AG-structured (None for the other
        collectives).
    native_steps : bool
        The plan holds native steps (IR v3), which the latency-aware bound does not
        bound.
    """

    bound: str
    bound_s: float
    time_s: float | None
    gap: float | None
    optimum: str
    bracket_s: tuple[float, float]
    rsag_structured: bool | None
    native_steps: bool

    def to_dict(self) -> dict[str, Any]:
        """The certificate as ``plan --json`` and a plan's ``meta`` record it."""
        return {"bound": self.bound, "bound_s": self.bound_s, "time_s": self.time_s,
                "gap": self.gap, "optimum": self.optimum, "bracket_s": list(self.bracket_s),
                "rsag_structured": self.rsag_structured, "native_steps": self.native_steps}

    def text(self, name: str) -> str:
        """One line: ``mcf at 1.003x the RS+AG cut bound (= allreduce lower bound:
        optimum known)``."""
        from ..units import format_time
        at = "with no time" if self.gap is None else f"at {self.gap:.3f}x"
        head = f"{name} {at} the {self.bound} of {format_time(self.bound_s)}"
        low, high = self.bracket_s
        if self.optimum == "bracketed":
            kind = " (an RS+AG plan)" if self.rsag_structured else ""
            return (f"{head}{kind}; optimum bracketed in [{format_time(low)}, "
                    f"{format_time(high)}] ({LOWER}, {RSAG})")
        if self.bound == RSAG:
            return f"{head} (= {LOWER}: optimum known)"
        if self.bound == SHARD:
            return f"{head} (reachable: optimum known)"
        reached = SHARD if self.rsag_structured is None else f"{RSAG} = {LOWER}"
        return f"{head}; bandwidth optimum known ({reached}: {format_time(high)})"


def certify(bounds: Bounds, *, collective: str, planner: str, time_s: float | None,
            native: bool, channels: int, profile: CostProfile) -> Certificate | None:
    """The certificate of one plan (see the module's notes for which bound applies).

    Parameters
    ----------
    bounds : Bounds
        The request's bounds (:attr:`~.request.PlanRequest.bounds`).
    collective : str
    planner : str
        The planner whose plan it is (its :attr:`~.registry.PlannerSpec.rsag` says
        whether the RS+AG cut bound holds for it; an unknown name: not).
    time_s : float or None
        The plan's time; NaN or None: no gap.
    native : bool
        The plan holds native steps.
    channels : int
        Channels the plan runs on.
    profile : CostProfile
        The profile ``bounds`` were computed under (it names the latency-aware bound).

    Returns
    -------
    Certificate or None
        None on one GPU (nothing moves: there is no bound to measure against).
    """
    from .registry import SPECS
    lower = bounds.lower_s
    if not lower > 0:
        return None
    if get_collective(collective).sharded:
        rsag_structured = None
        candidates = [(SHARD, lower)]
        bracket = (lower, lower)
        known = True
    else:
        rsag = bounds.rsag_s if bounds.rsag_s is not None else lower
        spec = SPECS.get(planner)
        rsag_structured = bool(spec is not None and spec.rsag and not native)
        known = abs(rsag - lower) <= SAME * max(rsag, lower)
        bracket = (lower, rsag)
        if known:
            candidates = [(RSAG, max(rsag, lower))]
        else:
            candidates = [(LOWER, lower)] + ([(RSAG, rsag)] if rsag_structured else [])
    if bounds.latency_s is not None and not native and channels == 1:
        candidates.append((latency_name(profile.name), bounds.latency_s))
    # The largest that applies; on a tie the bandwidth bound (listed first) names it.
    name, value = max(candidates, key=lambda c: c[1])
    time = None if time_s is None or not math.isfinite(time_s) else float(time_s)
    return Certificate(name, value, time, None if time is None else time / value,
                       "known" if known else "bracketed", bracket, rsag_structured, native)


def planner_of(schedule: Schedule) -> str:
    """The planner whose plan ``schedule`` is: ``meta["chosen"]``, else its algorithm."""
    chosen = schedule.meta.get("chosen")
    return chosen if isinstance(chosen, str) else schedule.algorithm


def certify_schedule(schedule: Schedule, bounds: Bounds, time_s: float | None,
                     profile: CostProfile, planner: str | None = None
                     ) -> Certificate | None:
    """:func:`certify` for ``schedule`` (its collective, native steps and channels), made
    by ``planner`` (default :func:`planner_of`)."""
    return certify(bounds, collective=schedule.collective,
                   planner=planner or planner_of(schedule), time_s=time_s,
                   native=schedule.nnative > 0, channels=schedule.nchannels,
                   profile=profile)


def recompute(schedule: Schedule, cluster: Cluster, *, profile: Any = None,
              where: str = "the plan") -> Certificate | None:
    """The certificate of ``schedule`` on ``cluster``, recomputed from the schedule: the
    bounds for the size it was planned for (``meta["size_bytes"]``) and its time,
    simulated under ``profile`` (default the profile it records, ``meta["profile"]``).

    Raises
    ------
    ScheduleError
        A plan without ``size_bytes`` in its meta, one priced on another machine
        (``meta["machine"]``), or one whose profile is not a shipped name and no
        ``profile`` was given (naming ``where``, the file).
    InfeasiblePlanError, ScheduleError
        A cluster of another rank count, or whose fingerprint differs from the one the
        plan records (:func:`~topoplan.ir.fingerprint.check_fingerprint`).
    """
    from ..analysis.cost import get_profile
    from ..analysis.sim import simulate
    from ..errors import ProfileError
    from ..ir.fingerprint import check_fingerprint
    from .request import PlanRequest

    size = schedule.meta.get("size_bytes")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ScheduleError(f"{where}: its meta has no size_bytes (the size it was planned "
                            "for), so its bounds cannot be recomputed; plan it with "
                            "topoplan plan -o")
    machine = schedule.meta.get("machine")
    if machine is not None:
        raise ScheduleError(f"{where}: it was priced on the machine {machine!r}, not on the "
                            "cluster it was planned for, so its certificate cannot be "
                            "recomputed from that cluster")
    if schedule.nranks != cluster.nranks:
        raise ScheduleError(f"{where} has {schedule.nranks} ranks but cluster "
                            f"{cluster.name!r} has {cluster.nranks} GPUs")
    check_fingerprint(schedule, cluster, plan=where)
    if profile is None:
        profile = schedule.meta.get("profile")
    try:
        costs = get_profile(profile)
    except ProfileError as exc:
        raise ScheduleError(f"{where}: planned under profile {profile!r}, which is not a "
                            f"shipped name; give it with --profile FILE ({exc})") from None
    request = PlanRequest.make(cluster, size=size, collective=schedule.collective,
                               profile=costs)
    report = simulate(cluster, schedule, size, profile=costs, yardsticks=request.yardsticks)
    return certify_schedule(schedule, request.bounds, report.time_s, costs)


def check(recorded: Any, actual: Certificate | None, *, where: str) -> None:
    """Check a recorded certificate (a plan's ``meta["certificate"]``) against the one
    recomputed from the schedule: the same bound, its value within
    :data:`BOUND_TOLERANCE`, the same optimum, bracket, structure and native steps, the
    gap and the time within :data:`GAP_TOLERANCE` (unless it records neither: a plan
    that had no time), and the plan no faster than its bound.

    Raises
    ------
    ScheduleError
        At the first claim that does not hold, naming ``where`` (the file), the claim,
        what it records and what was recomputed.
    """
    def fail(what: str) -> ScheduleError:
        return ScheduleError(f"{where}: the recorded certificate does not hold: {what}")

    if actual is None:
        if recorded is not None:
            raise fail("it records a bound, but on one GPU nothing moves and none applies")
        return
    if not isinstance(recorded, Mapping):
        raise fail(f"expected an object in meta 'certificate', got {recorded!r}")
    if recorded.get("bound") != actual.bound:
        raise fail(f"it names the bound {recorded.get('bound')!r}; the plan is measured "
                   f"against the {actual.bound}")
    if not _near(recorded.get("bound_s"), actual.bound_s, BOUND_TOLERANCE):
        raise fail(f"bound_s {recorded.get('bound_s')!r}; the {actual.bound} is "
                   f"{actual.bound_s!r} s here")
    if recorded.get("optimum") != actual.optimum:
        raise fail(f"optimum {recorded.get('optimum')!r}; recomputed {actual.optimum!r} "
                   f"(bracket {_pair(actual.bracket_s)})")
    bracket = recorded.get("bracket_s")
    if not (isinstance(bracket, (list, tuple)) and len(bracket) == 2
            and all(_near(b, a, BOUND_TOLERANCE) for b, a in zip(bracket, actual.bracket_s))):
        raise fail(f"bracket_s {bracket!r}; recomputed {_pair(actual.bracket_s)}")
    for key in ("rsag_structured", "native_steps"):
        if recorded.get(key) != getattr(actual, key):
            raise fail(f"{key} {recorded.get(key)!r}; the plan's is "
                       f"{getattr(actual, key)!r}")
    if actual.gap is None:
        return
    gap, time_s = recorded.get("gap"), recorded.get("time_s")
    # A plan recorded without a time (too big to simulate, no estimate) claims no gap.
    if gap is not None or time_s is not None:
        if not _near(gap, actual.gap, GAP_TOLERANCE):
            raise fail(f"gap {_x(gap)} to the {actual.bound}; simulated, the plan is at "
                       f"{actual.gap:.4f}x it")
        if not _near(time_s, actual.time_s or 0.0, GAP_TOLERANCE):
            raise fail(f"time_s {time_s!r}; simulated, the plan takes {actual.time_s!r} s")
    if actual.gap < 1 - GAP_TOLERANCE:
        raise fail(f"simulated, the plan runs at {actual.gap:.4f}x the {actual.bound}: "
                   "below it, so that bound does not apply to it")


def _near(value: Any, expected: float, rel: float) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(float(value) - expected) <= rel * max(abs(expected), 1e-300)


def _pair(pair: tuple[float, float]) -> str:
    return f"[{pair[0]!r}, {pair[1]!r}]"


def _x(gap: Any) -> str:
    return f"{gap:.4f}x" if isinstance(gap, (int, float)) and not isinstance(gap, bool) \
        else repr(gap)
