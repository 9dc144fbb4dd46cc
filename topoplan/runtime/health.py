"""Link health: which link runs slow, found from the step times of normal calls.

The executor knows every message a step moves, and :meth:`Cluster.route_loads` the links
each crosses. An executor with a :class:`StepTrace` records when each of its steps ended
(a clock read per step). From the last calls' step times of every rank (gathered in one
collective, :func:`gather_durations`), :func:`fit_links` finds which single link, slowed
to which fraction of its modelled rate, explains them best: each hypothesis (the healthy
cluster, and every link the schedule loads at each factor of :data:`FACTORS`) is the
simulator's per-rank step times of the same schedule on the cluster with that link
slower (:func:`topoplan.cluster.links.degraded`), scored by the squared error over every
rank's steps relative to the measured (least squares over the steps that share links).
A link is **slow** when its best factor is at most :data:`THRESHOLD` and it explains the
times clearly better than the healthy model (:data:`IMPROVE`). Links whose fits are
about as good as the best (:data:`AMBIGUOUS`, :data:`NOISE`) cannot be told apart by
these calls (in a ring, every rank waits on the slowest hop at once): the verdict names
them all and the plan goes around all of them. One more hypothesis is every loaded link
slower alike (a host busier than when the plans were measured, ``Verdict.uniform``):
clearly better than any single link, it names no link; about as good, the verdict says
these calls cannot tell the links from a slower host. Calls of several plans are fitted
together (``also``: an exploration's candidates), which tells apart what one plan's
steps cannot (a ring waits on its slowest hop, whatever else is slower).

:class:`LinkHealth` is the state a job keeps (one per planned collective object): the
links known slow, and the verdict waiting for confirmation (:data:`CONFIRM` fits in a
row must agree before anything changes). :class:`~topoplan.runtime.choice.MeasuredChoice`
drives it: every :data:`CHECK_EVERY` calls of a size class the ranks agree on the
chosen plan's recent time (the fastest rank's: ranks arriving apart do not read as a slow
link); :data:`TRIGGER` times its measured time at two checks in a row starts a fit (one
that finds nothing makes that time the reference, and the class's next fit waits twice
as many calls); a
confirmed slow link re-plans every size class on the cluster with that link at its
measured rate (the old plan stays a candidate), and the ranks measure the new candidates
as ``auto`` always does. While a link is slow, one call in :data:`RECOVER_EVERY` runs the
plan of the healthy model and fits its times: a link back at its rate is noticed, and the
plans of the healthy model come back.

``TOPOPLAN_HEALTH=off`` turns it off; it is off where the ranks share one host (a
:class:`~topoplan.cluster.HostCluster`: there are no links to find).
"""

from __future__ import annotations

import logging
import math
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..cluster.links import degraded, link_of_edge, links
from ..errors import TopoplanError

__all__ = ["ENV", "StepTrace", "LinkFit", "Verdict", "LinkHealth", "fit_links",
           "predicted_durations", "gather_durations", "health_enabled", "FACTORS",
           "THRESHOLD", "IMPROVE", "AMBIGUOUS", "NOISE", "CONFIRM", "CHECK_EVERY", "TRIGGER",
           "RECOVER_EVERY", "WINDOW", "MAX_GATHER", "with_slow_links", "encode", "decode"]

log = logging.getLogger("topoplan.health")

#: ``off`` turns link health off; ``on`` (default) keeps it on where there are links.
ENV = "TOPOPLAN_HEALTH"
#: The fractions of a link's modelled rate tried (then refined around the best).
FACTORS = (1.0, 0.85, 0.7, 0.55, 0.45, 0.35, 0.28, 0.22, 0.17, 0.12, 0.08)
#: A link at most this fraction of its modelled rate is slow.
THRESHOLD = 0.7
#: ... when its fit's error is at most this fraction of the healthy model's.
IMPROVE = 0.5
#: Links whose fit's error is within this factor of the best's, plus NOISE, cannot be
#: told apart from it...
AMBIGUOUS = 2.0
#: ... NOISE: the error a right fit leaves when every step time is off by 5% at random
#: (about 0.0008), with room.
NOISE = 0.002
#: Fits in a row that must agree before the plan changes (each over WINDOW calls).
CONFIRM = 2
#: Calls of a size class between two checks of its recent time.
CHECK_EVERY = 4
#: The recent time over the measured one that starts a fit.
TRIGGER = 1.25
#: While a link is slow: calls of a size class between two probes of the healthy plan.
RECOVER_EVERY = 256
#: Calls a trace keeps per buffer size (the step times fitted are their medians).
WINDOW = 4
#: Predictions a job's :class:`LinkHealth` keeps (:func:`fit_links`'s ``cache``).
CACHE = 4096
#: Ranks x steps above which step times are not gathered (one collective of as many
#: floats): link health then waits for a cheaper gather (left to do).
MAX_GATHER = 1 << 16


def health_enabled(machine: Any = None) -> bool:
    """Whether link health runs: not when ``$TOPOPLAN_HEALTH`` is ``off`` (``0``,
    ``false``), nor on a :class:`~topoplan.cluster.HostCluster` machine.

    Raises
    ------
    TopoplanError
        ``$TOPOPLAN_HEALTH`` is another value.
    """
    from ..cluster import HostCluster
    value = os.environ.get(ENV, "").strip().lower() or "on"
    if value not in ("on", "off", "1", "0", "true", "false"):
        raise TopoplanError(f"{ENV}={value!r}: use 'on' (find slow links from step times, "
                            "the default) or 'off'")
    return value in ("on", "1", "true") and not isinstance(machine, HostCluster)


class StepTrace:
    """When each step of an executor's last calls ended, per buffer size.

    The executor calls :meth:`add` after every call that ran its steps one after
    another, with the call's start and each step's end (``perf_counter``); the trace keeps
    the last ``window`` calls of each size (their bound steps, and the durations).
    """

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._calls: dict[int, deque] = {}
        #: The element count and element size of the last call recorded.
        self.last: tuple[int, int] | None = None

    def add(self, bound: Any, ends: Sequence[float]) -> None:
        work = bound.work
        n = int(work.shape[0])
        calls = self._calls.get(n)
        if calls is None:
            calls = self._calls[n] = deque(maxlen=self.window)
        calls.append((bound.steps, ends))
        self.last = (n, int(work.itemsize))  # numpy, CuPy and torch arrays have it

    def calls(self, n: int) -> int:
        """How many calls of ``n`` elements it holds."""
        return len(self._calls.get(n, ()))

    def clear(self) -> None:
        self._calls.clear()
        self.last = None

    def call_time(self, n: int) -> float:
        """The median time of the held calls of ``n`` elements (0: none)."""
        calls = self._calls.get(n)
        if not calls:
            return 0.0
        return float(np.median([ends[-1] - ends[0] for _, ends in calls]))

    def durations(self, n: int, nsteps: int) -> np.ndarray:
        """The median duration of each schedule step over the held calls of ``n``
        elements: ``nsteps`` seconds, 0 where this rank moves nothing (from the end of its
        previous step, or the call's start, to the end of this one)."""
        out = np.zeros(nsteps)
        calls = self._calls.get(n)
        if not calls:
            return out
        steps, _ = calls[-1]
        index = np.array([s.index for s in steps], dtype=int)
        times = np.array([np.diff(ends) for st, ends in calls if st is steps
                          and len(ends) == len(index) + 1])
        if times.size and index.size:
            out[index] = np.median(times, axis=0)
        return out


def gather_durations(transport: Any, own: np.ndarray) -> np.ndarray | None:
    """Every rank's step durations (``ranks x steps``) on every rank: one collective
    (a max of the rows each rank fills its own of); None above :data:`MAX_GATHER`."""
    n, size = own.shape[0], transport.size
    if n * size > MAX_GATHER:
        return None
    flat = np.zeros(n * size)
    flat[transport.rank * n:(transport.rank + 1) * n] = own
    return np.asarray(transport.allreduce_max_many(flat.tolist())).reshape(size, n)


def predicted_durations(machine: Any, schedule: Any, nbytes: int, *, profile: Any,
                        dtype_size: int = 4) -> tuple[np.ndarray, float]:
    """The simulator's step durations of ``schedule`` on ``machine`` (``ranks x steps``,
    as :meth:`StepTrace.durations` measures them: a rank's step ends when its last
    message of the step arrived), and the call's time."""
    from ..analysis.sim import simulate
    from ..analysis.sim.report import Yardsticks
    # No yardsticks: the lower bound and NCCL's row are most of a small simulation's
    # cost, and step times need neither (the report's bound is then nan).
    effective = (int(nbytes) // dtype_size) * dtype_size
    report = simulate(machine, schedule, nbytes, profile=profile, dtype_size=dtype_size,
                      record=True, force=True,
                      yardsticks=Yardsticks(effective, schedule.collective, math.nan))
    ends = np.full((schedule.nranks, schedule.nsteps), -1.0)
    for t in report.transfers:
        if t.nbytes == 0:
            continue
        ends[t.src, t.src_step] = max(ends[t.src, t.src_step], t.end_s)
        ends[t.dst, t.dst_step] = max(ends[t.dst, t.dst_step], t.end_s)
    out = np.zeros_like(ends)
    for r in range(schedule.nranks):
        last = 0.0
        for s in np.flatnonzero(ends[r] >= 0):
            out[r, s] = ends[r, s] - last
            last = ends[r, s]
    return out, report.time_s


@dataclass(frozen=True)
class LinkFit:
    """One link's best explanation: its ``factor`` of the modelled rate, the fit's
    ``error`` (squared, relative to the measured), the modelled ``bandwidth`` (bytes/s
    per direction, on the machine the bytes move on) and the call's predicted time with
    the link at that factor."""

    link: str
    factor: float
    error: float
    bandwidth: float
    predicted_s: float

    @property
    def measured_bandwidth(self) -> float:
        return self.factor * self.bandwidth


@dataclass(frozen=True)
class Verdict:
    """What a fit says: the links found slow (name -> factor; empty: healthy), the links
    it could not tell apart from them, the healthy model's error and each link's best
    fit, best first."""

    slow: Mapping[str, float]
    healthy_error: float
    fits: tuple[LinkFit, ...] = ()
    ambiguous: tuple[str, ...] = ()
    predicted_healthy_s: float = math.nan
    #: The links the fitted schedule loads: what these calls can say anything about.
    loaded: tuple[str, ...] = ()
    #: Set when every loaded link slowed alike (to this factor) explains the calls as
    #: well as the best single link: with ``slow`` empty it explains them clearly
    #: better (a slower host, not a link); with ``slow`` set, these calls cannot tell
    #: those links from a slower host.
    uniform: float | None = None

    @property
    def healthy(self) -> bool:
        return not self.slow

    def describe(self) -> str:
        """One clause: ``"leaf0-leaf1 at 0.26x its model (16.3 of 62.5 MB/s)"``,
        ``"healthy"``; with the links it cannot tell apart."""
        from ..units import format_bandwidth
        if self.uniform is not None and not self.slow:
            return (f"every link the calls cross alike at {self.uniform:.2f}x its model: "
                    "a slower host, not one link (nothing to plan around)")
        if self.healthy:
            return "every link at its model's rate"
        parts = []
        for fit in self.fits:
            if fit.link in self.slow:
                parts.append(f"{fit.link} at {fit.factor:.2f}x its model "
                             f"({format_bandwidth(fit.measured_bandwidth)} of "
                             f"{format_bandwidth(fit.bandwidth)})")
        text = " or ".join(parts)
        if len(parts) > 1:
            text += " (these calls cannot tell them apart: planning around each, measured)"
        if self.uniform is not None:
            text += (f"; as good a fit: every link alike at {self.uniform:.2f}x (a slower "
                     "host)")
        return text


def _loaded_links(machine: Any, schedule: Any) -> list[str]:
    """The links the schedule's messages cross, in :func:`links` order."""
    pairs = {(r, op.peer) for r, _, op in schedule.ops() if getattr(op, "kind", None) is not None
             and op.kind.value == "send"}
    used = set()
    for src, dst in pairs:
        for edge in machine.route_loads(src, dst)[0]:
            used.add(link_of_edge(machine, edge).name)
    return [link.name for link in links(machine) if link.name in used]


def _error(measured: np.ndarray, predicted: np.ndarray, scale: float) -> float:
    return float(np.sum((measured - predicted) ** 2) / scale)


def fit_links(machine: Any, schedule: Any, nbytes: int, measured: np.ndarray, *,
              profile: Any, dtype_size: int = 4, factors: Sequence[float] = FACTORS,
              known: Mapping[str, float] | None = None,
              cache: dict | None = None, also: Sequence[tuple[Any, int, Any, int]] = ()
              ) -> Verdict:
    """Which link, slowed to which factor, explains the measured step durations.

    Parameters
    ----------
    machine : Cluster
        What the bytes move on, healthy (its modelled rates).
    schedule : Schedule
        What ran (point-to-point steps).
    nbytes : int
        The call's bytes.
    measured : ndarray
        ``ranks x steps`` durations (:func:`gather_durations`).
    profile : CostProfile
        The runtime's costs, as the plans were priced.
    known : mapping, optional
        Links known slow (name -> factor): every hypothesis keeps the others of them.
    cache : dict, optional
        Predictions of earlier fits (filled here; :class:`LinkHealth` keeps one): a job
        fits the same schedules at the same sizes again and again, and each hypothesis's
        simulation gives the same step times every time.
    also : sequence of (schedule, nbytes, measured, dtype_size), optional
        Calls of other schedules over the same time (an exploration's candidates),
        fitted together with the first: each hypothesis is scored by its mean error over
        all of them. Plans that load links differently tell apart what one cannot.

    Returns
    -------
    Verdict
        With ``uniform`` set when every loaded link slowed alike explains the calls as
        well as the best single link: a host slower than when the plans were priced (or
        the whole fabric), which no plan goes around. Clearly better than any single
        link (outside :data:`AMBIGUOUS` and :data:`NOISE` of it), ``slow`` is empty;
        about as good, ``slow`` names the links as usual and the two cannot be told
        apart. One ring's steps cannot (every hop waits on the slowest); several plans
        often can.

    Notes
    -----
    Cost: one simulation of each schedule per loaded link and factor (11 factors, then
    4 around the best), and as many for every loaded link alike, each O(messages): a
    4-rank schedule over 5 links, 0.15-0.8 s on a 2-core machine; with ``cache``, the
    fits after the first of a schedule and size cost microseconds.
    """
    known = dict(known or {})
    runs = [(schedule, int(nbytes), np.asarray(measured, dtype=float), dtype_size)]
    runs += [(s, int(n), np.asarray(m, dtype=float), d) for s, n, m, d in also]
    scales = [float(np.sum(m ** 2)) or 1.0 for _, _, m, _ in runs]

    def predict(run: tuple, faults: dict[str, float]) -> tuple[np.ndarray, float]:
        plan, size, _, itemsize = run
        key = (id(plan), size, itemsize, tuple(sorted(faults.items())))
        hit = cache.get(key) if cache is not None else None
        if hit is not None and hit[0] is plan:
            return hit[1], hit[2]
        cluster = degraded(machine, faults) if faults else machine
        predicted, time_s = predicted_durations(cluster, plan, size, profile=profile,
                                                dtype_size=itemsize)
        if cache is not None:
            if len(cache) >= CACHE:
                del cache[next(iter(cache))]  # the oldest
            cache[key] = (plan, predicted, time_s)  # holds the schedule: ids stay
        return predicted, time_s

    def score(faults: dict[str, float]) -> tuple[float, float]:
        """The mean error over the runs and the first run's predicted time."""
        errors, first = [], math.nan
        for i, run in enumerate(runs):
            predicted, time_s = predict(run, faults)
            errors.append(_error(run[2], predicted, scales[i]))
            first = time_s if i == 0 else first
        return float(np.mean(errors)), first

    def trial(link: str, factor: float) -> tuple[float, float]:
        faults = {k: v for k, v in known.items() if k != link}
        if factor != 1.0:
            faults[link] = factor
        return score(faults)

    healthy_error, healthy_s = score({})  # the healthy model: none of the known faults
    by_name = {link.name: link for link in links(machine)}
    used = set().union(*(_loaded_links(machine, run[0]) for run in runs))
    loaded = [link.name for link in links(machine) if link.name in used]
    fits = []
    for name in loaded:
        best, (error, time_s) = _best_factor(lambda f: trial(name, f), factors)
        fits.append(LinkFit(name, best, error, by_name[name].bandwidth, time_s))
    fits.sort(key=lambda fit: (fit.error, -fit.factor))
    slow: dict[str, float] = {}
    ambiguous: tuple[str, ...] = ()
    uniform: float | None = None
    if fits:
        top = fits[0]
        if top.factor <= THRESHOLD and top.error <= IMPROVE * healthy_error:
            alike_error = math.inf
            if len(loaded) > 1:
                def alike(f: float) -> tuple[float, float]:
                    faults = dict(known)
                    faults.update({k: known.get(k, 1.0) * f for k in loaded})
                    return score(faults)

                factor, (alike_error, _) = _best_factor(alike, factors)
                if alike_error <= AMBIGUOUS * top.error + NOISE:
                    uniform = factor
            if top.error <= AMBIGUOUS * alike_error + NOISE:  # not clearly every link
                close = [f for f in fits if f.error <= AMBIGUOUS * top.error + NOISE
                         and f.factor <= THRESHOLD]
                slow = {f.link: f.factor for f in close}
                ambiguous = tuple(f.link for f in close[1:])
    # A verdict of every link alike speaks for none of them: it leaves the links known
    # slow as they are (:meth:`LinkHealth.observe`).
    return Verdict(slow, healthy_error, tuple(fits), ambiguous, healthy_s,
                   () if uniform is not None and not slow else tuple(loaded), uniform)


def _best_factor(trial: Any, factors: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """The factor whose ``trial(factor) -> (error, time)`` errs least (ties: the larger),
    from ``factors`` and then four between its neighbours; with its trial."""
    tried = {f: trial(f) for f in factors}
    best = min(tried, key=lambda f: (tried[f][0], -f))
    step = list(factors)
    i = step.index(best)
    lo, hi = step[min(i + 1, len(step) - 1)], step[max(i - 1, 0)]
    for f in np.linspace(lo, hi, 6)[1:-1]:
        f = float(round(f, 3))
        if f not in tried:
            tried[f] = trial(f)
    best = min(tried, key=lambda f: (tried[f][0], -f))
    return best, tried[best]


@dataclass
class LinkHealth:
    """A job's link health: the links known slow, and the verdict waiting to be
    confirmed (:data:`CONFIRM` in a row). Every rank holds one and feeds it the same
    verdicts (rank 0's, shared), so every rank changes at the same call.

    ``machine`` is what the bytes move on (healthy), ``profile`` what plans are priced
    with; ``history`` has one record per change: the call it came at (the collective
    object's count), the links slow after it, and the line logged.
    """

    machine: Any
    profile: Any
    confirm: int = CONFIRM
    slow: dict[str, float] = field(default_factory=dict)
    pending: tuple[tuple[str, ...], int] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    #: The latest verdict (rank 0's has the fits; the others' only the links).
    verdict: Verdict | None = None
    #: Counts the changes of ``slow``.
    version: int = 0
    #: Slow links the last change could not tell apart (one of them is slow, maybe
    #: not all): plans are made around each, and measured (:meth:`planning_faults`).
    alternatives: tuple[str, ...] = ()
    #: Verdicts observed (fits run), whatever they found.
    fits: int = 0
    #: The simulations of earlier fits (:func:`fit_links`'s ``cache``).
    cache: dict = field(default_factory=dict, repr=False)
    _recovered: tuple[str, ...] = ()

    def observe(self, verdict: Verdict, *, calls: int = 0, weight: int = 1) -> bool:
        """Feed one verdict (worth ``weight`` fits: a fit of several exploring calls
        counts as confirmed); True when it changes the links known slow (confirmed).

        A verdict speaks for the links its schedule loads (``verdict.loaded``): a link
        known slow that the fitted plan does not cross stays known slow. So a plan that
        goes around one of several links that could not be told apart clears the ones it
        crosses at their rate, and the next plan goes around the rest."""
        self.fits += 1
        known = tuple(sorted(self.slow))
        after = {k: v for k, v in self.slow.items() if k not in verdict.loaded}
        after.update(verdict.slow)
        seen = tuple(sorted(after))
        self.verdict = verdict
        if seen == known:
            self.slow = after  # the same links: follow their measured rates
            self.pending = None
            return False
        count = weight + (self.pending[1] if self.pending and self.pending[0] == seen else 0)
        self.pending = (seen, count)
        if count < self.confirm:
            return False
        self._recovered = tuple(k for k in known if k not in after)
        self.alternatives = tuple(sorted(verdict.slow)) if verdict.ambiguous else ()
        self.slow, self.pending = after, None
        self.version += 1
        self.history.append({"call": calls, "slow": dict(self.slow),
                             "recovered": list(self._recovered), "line": self.describe()})
        return True

    def describe(self) -> str:
        """What the latest change found: the slow links, measured against modelled, or
        the links back at their rate."""
        verdict = self.verdict
        if self.slow:
            text = verdict.describe() if verdict is not None and verdict.fits else ", ".join(
                f"{k} at {v:.2f}x its model" for k, v in self.slow.items())
            return text + f" ({self.confirm} fits in a row agree)"
        back = ", ".join(self._recovered) or "every link"
        fits = {f.link: f for f in verdict.fits} if verdict is not None else {}
        rates = [f"{k} at {fits[k].factor:.2f}x its model" for k in self._recovered if k in fits]
        return f"{back} back at its modelled rate" + (f" ({', '.join(rates)})" if rates else "")

    def planning_cluster(self, cluster: Any) -> Any:
        """``cluster`` with the slow links at their measured rates."""
        return degraded(cluster, self.slow) if self.slow else cluster

    def planning_faults(self) -> list[dict[str, float]]:
        """What to plan around: the slow links at their rates, or, when the last change
        could not tell some apart, one set per such link (with the other slow links)."""
        if len(self.alternatives) < 2:
            return [dict(self.slow)] if self.slow else []
        rest = {k: v for k, v in self.slow.items() if k not in self.alternatives}
        return [{**rest, k: self.slow[k]} for k in self.alternatives if k in self.slow]

    def predict(self, schedule: Any, nbytes: int) -> float | None:
        """``schedule``'s time on the machine with the slow links at their measured
        rates (None when it cannot be simulated)."""
        from ..analysis.sim import simulate
        try:
            return simulate(self.planning_cluster(self.machine), schedule, nbytes,
                            profile=self.profile, force=True).time_s
        except Exception:  # noqa: BLE001 - a prediction for the log only
            return None


def with_slow_links(slow: Mapping[str, float] | None, cluster: Any, machine: Any
                    ) -> tuple[Any, Any]:
    """``cluster`` and ``machine`` (what the bytes move on; None: the cluster) with the
    ``slow`` links at their factors: what a size class is planned on while they are
    slow. Unchanged when ``slow`` is empty."""
    if not slow:
        return cluster, machine
    return degraded(cluster, slow), None if machine is None else degraded(machine, slow)


def encode(verdict: Verdict | None, machine: Any) -> list[float]:
    """A verdict as floats: two, then one per link of the machine (2 + its factor when
    slow, 1 when the schedule loads it, 0 otherwise). The first is 1 when the fit was
    ambiguous; the second 1 + the factor of every link alike (``uniform``), else 0. One
    max-collective hands rank 0's to every rank (the others send 0s)."""
    if verdict is None:
        return [0.0] * (len(links(machine)) + 2)
    head = [1.0 if verdict.ambiguous else 0.0,
            1.0 + verdict.uniform if verdict.uniform is not None else 0.0]
    return head + [
        2.0 + verdict.slow[link.name] if link.name in verdict.slow
        else 1.0 if link.name in verdict.loaded else 0.0 for link in links(machine)]


def decode(values: Sequence[float], machine: Any) -> Verdict:
    """The verdict :func:`encode` made (links, rates and what was loaded; no fits)."""
    names = [link.name for link in links(machine)]
    slow = {k: round(float(v) - 2.0, 3) for k, v in zip(names, values[2:]) if v >= 2.0}
    loaded = tuple(k for k, v in zip(names, values[2:]) if v >= 1.0)
    ambiguous = tuple(sorted(slow))[1:] if values[0] >= 1.0 else ()
    uniform = round(float(values[1]) - 1.0, 3) if values[1] >= 1.0 else None
    return Verdict(slow, math.nan, ambiguous=ambiguous, loaded=loaded, uniform=uniform)
