"""Measured choice: ``auto`` times the model's best candidates on the live job and keeps
the fastest.

The model (:func:`topoplan.planners.pipeline.execute` under the transport's profile)
ranks every planner; :func:`model_options` keeps its best few plans and the transport's
own collective (``native``: one native step over every rank). :class:`MeasuredChoice`
then runs the first calls of each *size class* (sizes in ``(2^(k-1), 2^k]`` bytes) with
those candidates in turn, timed, and keeps the fastest measured for the calls after:

- **Rounds.** Round 0 runs each candidate once, untimed (it compiles the executor and
  makes sub-communicators). Rounds 1 .. ``probes`` time each live candidate once per
  round, interleaved, so drift on a shared machine falls on all of them alike. After
  round 1, a candidate slower than ``prune`` times the fastest is dropped. After round
  ``probes``, the candidates within ``close`` (10%) of the fastest median race on, alone,
  up to ``max_probes`` (8) timed rounds, until one is left or all are within ``TIE``
  (3%) of the fastest: a noisy machine needs more calls to tell close candidates apart,
  and candidates within 3% are as good as each other.
- **Every rank picks the same.** After each timed call the ranks agree in one small
  collective (:meth:`~topoplan.runtime.transports.base.Transport.allreduce_max_many`)
  on whether it failed anywhere and on its slowest rank's time; the statistics are then
  the same floats on every rank, and so is the choice (the smallest median, ties to the
  model's order; the native collective when it is within ``TIE`` of it: as good, and
  the cheapest for the host). A rank's own clock never decides alone.
- **Exact while exploring.** Every candidate is verified before it runs. A call that
  fails on any rank (a timeout, a transport without that native collective) drops the
  candidate with a note; every rank puts its input back (a copy taken before the call)
  and runs the call again with the model's best candidate still standing, so the
  result is exact and the run goes on.
- **Budget.** ``(top + 1) * (1 + probes)`` calls of a size class explore (16 by default)
  when the candidates are told apart in ``probes`` rounds, at most
  ``(top + 1) * (1 + max_probes)`` (36) when they race; each is started by a barrier and
  followed by one collective of two floats; the sizes of a class after the first take its
  decision.
- **Re-probing.** After the decision the first ``FIRST_TIMED`` (16) blocking calls are
  sampled, then one in ``SAMPLE_EVERY`` (8), and only those the caller cannot claim to
  run bare (below): a training job's calls run bare within a few dozen steps (claiming
  none of the first 64 calls of each size class cost a DDP step 2 ms on the testbed).
  Every blocking call is timed (two clock reads: link health's checks of the native
  collective read them); every ``recheck_every`` (64) sampled calls the ranks agree
  on the chosen candidate's recent median (the first check, at call 400, confirms the
  exploration's few samples); more than ``drift`` times its measured median starts a new
  exploration (without the untimed round). Every ``reprobe_every`` calls of a class
  (doubling each time) it explores again anyway.
- **Claimed calls.** A call of a class that chose ``native`` and has nothing else to do
  (not timed, no check or re-probe due) can be claimed by the caller
  (:meth:`MeasuredChoice.claim_native`), which then runs the library's own collective
  itself: the torch backend starts it on the caller's thread, with no executor between.
- **Off switch.** ``TOPOPLAN_AUTO=model`` (or ``mode="model"``): the model's choice,
  deterministic, nothing timed.

Each decision is a :class:`Decision` (measured and predicted times of every candidate),
logged on the ``topoplan.choice`` logger by rank 0.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import TopoplanError, TransportError
from ..ir.schedule import Schedule
from .health import CHECK_EVERY, RECOVER_EVERY, TRIGGER
from .transports.families import priced_elsewhere

__all__ = ["ENV", "MODES", "Option", "Decision", "MeasuredChoice", "auto_mode",
           "model_options", "size_class", "class_range", "NATIVE", "TOP", "PROBES", "PRUNE",
           "RECHECK_EVERY", "CLAIM_EVERY", "DRIFT", "CLOSE", "MAX_PROBES", "SAMPLE_EVERY",
           "TIE", "REPROBE_EVERY", "explore_budget", "snapshot",
           "priced_elsewhere", "NativeCall", "executor_for", "shared_options", "traceable",
           "BEFORE"]

log = logging.getLogger("topoplan.choice")

#: The environment variable that turns measuring off: ``model`` or ``measured``.
ENV = "TOPOPLAN_AUTO"
MODES = ("measured", "model")
#: The candidate that is the transport's own collective.
NATIVE = "native"
#: The model's best plans measured (the native collective comes on top).
TOP = 3
#: Timed calls per candidate.
PROBES = 3
#: After the first timed round, a candidate over this many times the fastest is dropped.
PRUNE = 2.0
#: After PROBES timed rounds, the candidates within this fraction of the fastest median
#: are timed on, up to MAX_PROBES rounds in all (a noisy machine needs more calls to
#: tell close candidates apart).
CLOSE = 0.10
MAX_PROBES = 8
#: Candidates within this fraction of the fastest median are as good as it: no racing.
TIE = 0.03
#: After the decision, one blocking call in this many is sampled for the drift checks
#: (and cannot be claimed to run bare).
SAMPLE_EVERY = 8
#: Timed calls between the checks of the chosen candidate's time (64: every 512 calls).
RECHECK_EVERY = 64
#: The blocking calls right after the decision that are all timed (then one in
#: SAMPLE_EVERY; at most ``recheck_every``).
FIRST_TIMED = 16
#: After FIRST_TIMED calls, one call in this many of a class that chose ``native`` is
#: not claimed to run bare (it runs through ``auto``, timed): in the torch backend
#: such a call goes through the group's worker thread, which cost DDP steps 1-3% on
#: the testbed at one in 8 (0-1% at one in 64).
CLAIM_EVERY = 64
#: The chosen candidate's recent median over its measured one that starts a re-probe.
DRIFT = 1.3
#: Calls of a class after which it is explored again anyway (doubled each time).
REPROBE_EVERY = 4096
#: What a candidate kept from before link health re-planned is called: ``"old ring"``.
BEFORE = "old "


def explore_budget(top: int = TOP, probes: int = PROBES, max_probes: int = MAX_PROBES) -> int:
    """The most calls one exploration of a size class takes: every candidate (``top``
    plans and the native collective) once untimed and ``probes`` times timed, and the
    close ones up to ``max_probes`` times (``max_probes = probes``: no racing)."""
    return (top + 1) * (1 + max(probes, max_probes))


def auto_mode(mode: str | None = None) -> str:
    """``measured`` or ``model``: ``mode`` when given, else ``$TOPOPLAN_AUTO``, else
    ``measured``.

    Raises
    ------
    TopoplanError
        Another value, naming where it came from.
    """
    where = "mode"
    if mode is None:
        mode, where = os.environ.get(ENV, "").strip().lower() or "measured", ENV
    if mode not in MODES:
        raise TopoplanError(f"{where}={mode!r}: use 'measured' (time the best candidates on "
                            "the job, the default) or 'model' (the model's choice, nothing "
                            "timed)")
    return mode


def size_class(nbytes: int) -> int:
    """The size class of ``nbytes``: ``k`` for sizes in ``(2^(k-1), 2^k]`` (0 for 1 byte
    and less)."""
    return max(0, int(nbytes) - 1).bit_length()


def class_range(k: int) -> str:
    """``"(512KiB, 1MiB]"``: the sizes of class ``k``."""
    from ..units import format_size
    if k == 0:
        return "1B"
    return f"({format_size(1 << (k - 1))}, {format_size(1 << k)}]"


@dataclass(eq=False)
class Option:
    """One candidate of a size class: a verified schedule, its predicted time, and what
    running it measured (the slowest rank's seconds of each timed call)."""

    algorithm: str
    schedule: Schedule
    predicted_s: float | None = None
    samples: list[float] = field(default_factory=list)
    failed: str | None = None
    pruned: bool = False
    executor: Any = None

    @property
    def live(self) -> bool:
        return self.failed is None and not self.pruned

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples) if self.samples else math.inf

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the timed calls; None with fewer than two."""
        if len(self.samples) < 2:
            return None
        return (max(self.samples) - min(self.samples)) / self.median_s

    def record(self) -> dict[str, Any]:
        """The JSON form: ``algorithm``, ``measured_us`` (median), ``spread``,
        ``predicted_us``, ``calls`` and ``note`` (why it was dropped)."""
        note = self.failed or ("dropped after one round: over "
                               f"{PRUNE:g}x the fastest" if self.pruned else None)
        return {"algorithm": self.algorithm,
                "measured_us": None if not self.samples else self.median_s * 1e6,
                "spread": self.spread,
                "predicted_us": None if self.predicted_s is None else self.predicted_s * 1e6,
                "calls": len(self.samples), "note": note}


@dataclass(frozen=True)
class Decision:
    """What a size class runs, and why.

    ``chosen`` is the algorithm kept (``native``: the transport's own collective);
    ``model_choice`` the model's; ``candidates`` their :meth:`Option.record`;
    ``calls`` and ``seconds`` what exploring cost; ``reason`` is ``measured``,
    ``model`` (nothing timed), or ``drift`` / ``re-probe`` for a later exploration.
    """

    size_class: int
    nbytes: int
    chosen: str
    model_choice: str
    candidates: tuple[dict[str, Any], ...]
    calls: int
    seconds: float
    reason: str

    @property
    def contradicted(self) -> bool:
        """Whether the run chose otherwise than the model."""
        return self.chosen != self.model_choice

    @property
    def measured_us(self) -> float | None:
        return next((c["measured_us"] for c in self.candidates
                     if c["algorithm"] == self.chosen), None)

    def to_dict(self) -> dict[str, Any]:
        return {"size_class": class_range(self.size_class), "nbytes": self.nbytes,
                "chosen": self.chosen, "model_choice": self.model_choice,
                "contradicted": self.contradicted, "reason": self.reason,
                "exploration_calls": self.calls, "exploration_s": self.seconds,
                "candidates": list(self.candidates)}

    def line(self, what: str = "allreduce") -> str:
        """One line for the log: the choice, then each candidate measured (model)."""
        def us(v: float | None) -> str:
            return "-" if v is None else (f"{v / 1e3:.3g} ms" if v >= 1e3 else f"{v:.3g} us")
        parts = []
        for c in self.candidates:
            text = f"{c['algorithm']} {us(c['measured_us'])} (model {us(c['predicted_us'])})"
            parts.append(text + (f" [{c['note']}]" if c["note"] else ""))
        head = (f"auto {what} {class_range(self.size_class)}: {self.chosen}"
                + (f", the model chose {self.model_choice}" if self.contradicted else "")
                + f" ({self.reason}, {self.calls} calls)")
        return head + ": " + "; ".join(parts)


def model_options(cluster: Any, size: int, collective: str = "allreduce", *,
                  profile: Any = None, machine: Any = None, top: int = TOP,
                  native: bool = True) -> tuple[list[Option], str]:
    """The model's ``top`` best plans for ``size`` bytes and the transport's own
    collective, fastest predicted first; and the model's choice.

    The model is the pipeline's ``auto`` (:func:`topoplan.planners.pipeline.execute`)
    under ``profile`` on ``machine`` (the cluster the runtime moves bytes on; default
    ``cluster``). Its chosen plan is taken as it runs (channels, vectored messages); the
    next ones as planned, each verified. ``native`` is the ``nccl`` row's plan (one
    native step over every rank), predicted as the model prices it; it is always a
    candidate when ``native`` is true.

    Raises
    ------
    InfeasiblePlanError, PlannerError
        As :func:`topoplan.plan`.
    """
    from ..ir.verify import verify
    from ..planners.native import native_schedule
    from ..planners.pipeline import NCCL, PlanRequest, execute

    request = PlanRequest.make(cluster, size=max(int(size), 1), collective=collective,
                               profile=profile, machine=machine, algorithm="auto")
    result = execute(request)
    model_choice = NATIVE if result.chosen.name == NCCL else result.chosen.name
    options: list[Option] = []
    for row in result.rows:
        if row.name == NCCL or row.schedule is None or not math.isfinite(row.time_s):
            continue
        if len(options) >= top:
            break
        if row is result.chosen:
            schedule, predicted = result.schedule, result.time_s
        else:
            schedule, predicted = row.schedule, row.time_s
            verify(schedule)
        options.append(Option(row.name, schedule, predicted))
    if native and cluster.nranks > 1:
        nccl = result.nccl
        predicted_native = nccl.time_s if math.isfinite(nccl.time_s) else None
        options.append(Option(NATIVE, native_schedule(cluster.nranks, collective,
                                                      algorithm=NATIVE),
                              predicted_native))
    options.sort(key=lambda o: math.inf if o.predicted_s is None else o.predicted_s)
    return options, model_choice


class NativeCall:
    """The transport's own collective over every rank, as a candidate runs it: a
    blocking call goes to the library directly (``native_allreduce``,
    ``native_reduce_scatter``, ``native_allgather``: what a user of the library calls),
    ``start`` to the executor's native step (non-blocking, polled)."""

    def __init__(self, executor: Any, direct: Callable[..., None]) -> None:
        self.executor, self._direct = executor, direct

    def __call__(self, *args: Any) -> Any:
        self._direct(*args)
        return args[-1]

    def start(self, *args: Any) -> Any:
        return self.executor.start(*args)


def executor_for(schedule: Schedule, transport: Any, *, timeout: float = 60.0,
                 accumulate_fp32: bool = False, verified: bool = False) -> Any:
    """What runs a candidate: :class:`~topoplan.Allreduce`, ``ReduceScatter`` or
    ``AllGather`` by the schedule's collective; for :data:`NATIVE` (one native step over
    every rank), a :class:`NativeCall` around it. ``verified``: the caller verified
    ``schedule`` (the candidates of :func:`model_options` and :func:`shared_options`
    were), so the executor does not verify it again."""
    from .executor import AllGather, Allreduce, ReduceScatter
    cls = {"allreduce": Allreduce, "reduce_scatter": ReduceScatter,
           "allgather": AllGather}[schedule.collective]
    executor = cls(schedule, transport, timeout=timeout, accumulate_fp32=accumulate_fp32,
                   verified=verified)
    if schedule.meta.get("algorithm") != NATIVE or schedule.nranks != transport.size:
        return executor
    direct = {"allreduce": transport.native_allreduce,
              "reduce_scatter": transport.native_reduce_scatter,
              "allgather": transport.native_allgather}[schedule.collective]
    return NativeCall(executor, direct)


def traceable(option: Option) -> bool:
    """Whether link health can read ``option``'s step times: point-to-point messages in
    one channel (a native step's links are the library's; channels run at once)."""
    schedule = option.schedule
    return (option.algorithm != NATIVE and schedule.nnative == 0
            and schedule.nchannels <= 1)


def snapshot(*args: Any) -> Callable[[], None]:
    """A copy of each array argument (numpy, torch, CuPy) and the function that puts them
    back: what an exploring call may overwrite, restored after a failed one."""
    saved = [(a, a.clone() if hasattr(a, "clone") else a.copy()) for a in args]

    def restore() -> None:
        for a, copy in saved:
            if hasattr(a, "copy_"):
                a.copy_(copy)
            else:
                a[...] = copy

    return restore


def shared_options(rank: int, share: Callable[[Any], Any],
                   make: Callable[[], tuple[list[Option], str]], what: str
                   ) -> tuple[list[Option], str]:
    """Rank 0's candidates on every rank: ``make()`` on rank 0, handed to the others by
    ``share(obj) -> rank 0's obj`` (a broadcast) as JSON, so that ranks cannot disagree
    on them; an error of rank 0's planning is raised on every rank (``what`` says where).
    """
    from ..ir.parse import loads_schedule
    payload: Any = None
    failed: BaseException | None = None
    if rank == 0:
        try:
            options, model_choice = make()
            payload = ("plan", (model_choice, [(o.algorithm, o.schedule.to_json(),
                                                o.predicted_s) for o in options]))
        except Exception as exc:  # noqa: BLE001 - every rank raises
            failed, payload = exc, ("error", f"{type(exc).__name__}: {exc}")
    kind, value = share(payload)
    if failed is not None:
        raise failed
    if kind == "error":
        raise TopoplanError(f"{what}: planning failed on rank 0: {value}")
    model_choice, rows = value
    return [Option(a, loads_schedule(text), p) for a, text, p in rows], model_choice


class _Done:
    """The handle of a call that already ran (an exploring call runs at once)."""

    def __init__(self, result: Any) -> None:
        self.result, self.done = result, True

    def test(self) -> bool:
        return True

    def wait(self) -> Any:
        return self.result


class _Class:
    """The state of one size class."""

    def __init__(self, k: int, nbytes: int, options: list[Option], model_choice: str) -> None:
        self.k, self.nbytes = k, nbytes
        self.options, self.model_choice = options, model_choice
        self.queue: list[int] = list(range(len(options)))
        self.round = 0
        self.chosen: Option | None = None
        self.reason = "measured"
        self.explore_calls = 0
        self.explore_s = 0.0
        self.since = 0              # calls since the decision
        self.recent: list[float] = []
        self.reprobe_every = REPROBE_EVERY
        # The chosen candidate's steady-state median, once a check confirmed it: later
        # checks compare calls with calls (exploration times each call alone, after a
        # barrier; a training loop's calls also carry how late ranks arrive).
        self.reference: float | None = None
        self.drifted: tuple[str, float] | None = None  # (what ran, its agreed median)
        # Link health: the chosen plan's agreed steady time at the first check after the
        # decision (what later checks compare with), and the call (``since``) at which
        # the next probe of the plan before a re-planning runs, while a link is slow.
        self.health_reference: float | None = None
        self.probe_at = RECOVER_EVERY
        # The chosen candidate's recent call times when it cannot be traced (native).
        self.health_times: list[float] = []
        # Checks over TRIGGER in a row that found nothing (a fit with no verdict, an
        # exploration that kept the same candidate), and the job's call count before
        # which no check acts again: CHECK_EVERY << fruitless calls, up to RECOVER_EVERY.
        self.fruitless = 0
        self.quiet_until = 0
        self.timed = 0              # timed calls of the chosen candidate (native: checks)
        self.raised = 0             # checks over TRIGGER in a row
        # A check found the chosen candidate slower (this recent time): its next call
        # runs alone, to tell the job's slowness from the network's.
        self.alone: float | None = None


class MeasuredChoice:
    """Choose among candidates by timing them on the job; collective (every rank makes
    the same calls in the same order, as any collective needs).

    Parameters
    ----------
    transport : Transport
        Where the agreement runs (``allreduce_max_many``) and whose rank logs.
    options : callable
        ``options(nbytes) -> (list of Option, model_choice)`` for a new size class
        (:func:`model_options`).
    executor : callable
        ``executor(schedule) -> callable`` runs one call: ``executor(schedule)(*args)``
        (an :class:`~topoplan.Allreduce`, ``ReduceScatter``, ``AllGather``); built on a
        candidate's first call, in the same order on every rank.
    mode : str, optional
        ``measured`` or ``model`` (default ``$TOPOPLAN_AUTO``, else measured).
    snapshot : callable, optional
        ``snapshot(*args) -> restore``: copy what a call overwrites and return the
        function that puts it back (an allreduce's buffer); called before each exploring
        call, ``restore()`` only after a failed one. None: calls leave their input as it
        was (a reduce-scatter).
    drain : callable, optional
        Waits for the caller's calls in flight before an exploring call is timed.
    probes, max_probes, close, prune, recheck_every, sample_every, drift, reprobe_every
        See the module's notes.
    what : str
        The collective, for the log.
    health : LinkHealth, optional
        Find slow links from the chosen plan's step times and re-plan around them
        (:mod:`topoplan.runtime.health`); ``options`` is then also called as
        ``options(nbytes, slow={link: factor})`` for the cluster with those links at
        their measured rates. None (default): off.

    Attributes
    ----------
    decisions : dict
        Size class -> the latest :class:`Decision`.
    history : list
        Every :class:`Decision`, in order (re-probes too).
    """

    def __init__(self, transport: Any, options: Callable[..., tuple[list[Option], str]],
                 executor: Callable[[Schedule], Any], *, mode: str | None = None,
                 snapshot: Callable[..., Callable[[], None]] | None = None,
                 drain: Callable[[], None] | None = None, probes: int = PROBES,
                 max_probes: int = MAX_PROBES, close: float = CLOSE,
                 prune: float = PRUNE, recheck_every: int = RECHECK_EVERY,
                 sample_every: int = SAMPLE_EVERY,
                 drift: float = DRIFT, reprobe_every: int = REPROBE_EVERY,
                 what: str = "allreduce", clock: Callable[[], float] = time.perf_counter,
                 health: Any = None) -> None:
        if probes < 1:
            raise TopoplanError(f"probes={probes}: time each candidate at least once")
        self.transport = transport
        self.mode = auto_mode(mode)
        self._options, self._executor = options, executor
        self._snapshot, self._drain = snapshot, drain
        self.probes, self.prune, self.drift = probes, prune, drift
        self.max_probes, self.close = max(probes, max_probes), close
        self.sample_every = max(1, int(sample_every))
        self.recheck_every, self.reprobe_every = recheck_every, reprobe_every
        self.first_timed = min(FIRST_TIMED, recheck_every)
        self.what, self._clock = what, clock
        self._classes: dict[int, _Class] = {}
        #: Counts the decisions and re-explorations: what runs changed when it moved.
        self.version = 0
        self.decisions: dict[int, Decision] = {}
        self.history: list[Decision] = []
        #: Link health (:class:`~topoplan.runtime.health.LinkHealth`), or None: off.
        self.health: Any = health if self.mode == "measured" else None
        #: Calls made (every rank counts the same).
        self.calls = 0
        # Size class -> what it ran before link health re-planned it (a candidate still).
        self._before: dict[int, Option] = {}
        self._health_asked = health is not None

    # -- what runs ------------------------------------------------------------------
    def chosen(self, nbytes: int) -> str | None:
        """The algorithm the class of ``nbytes`` runs; None while it explores."""
        state = self._classes.get(size_class(nbytes))
        return None if state is None or state.chosen is None else state.chosen.algorithm

    def options(self, nbytes: int) -> list[Option]:
        """The candidates of the class of ``nbytes`` (empty before its first call)."""
        state = self._classes.get(size_class(nbytes))
        return [] if state is None else list(state.options)

    def exploring(self, nbytes: int) -> bool:
        """Whether the next call of ``nbytes`` explores."""
        state = self._classes.get(size_class(nbytes))
        return state is None or state.chosen is None

    def call(self, nbytes: int, *args: Any) -> Any:
        """Run one call of ``nbytes`` bytes (``executor(schedule)(*args)``) and return
        its result."""
        self.calls += 1
        state = self._state(nbytes)
        if state.chosen is None:
            return self._explore(state, args)
        return self._steady(state, args, timed=True)

    def start(self, nbytes: int, *args: Any) -> Any:
        """Start one call; a handle with ``test()`` and ``wait()``. Exploring calls run
        to the end here (timed alone); the others are started and returned."""
        self.calls += 1
        state = self._state(nbytes)
        if state.chosen is None:
            return _Done(self._explore(state, args))
        return self._steady(state, args, timed=False)

    # -- size classes ---------------------------------------------------------------
    def _state(self, nbytes: int) -> _Class:
        k = size_class(nbytes)
        state = self._classes.get(k)
        if state is None:
            options, model_choice = self._plan(k, nbytes)
            if not options:
                raise TopoplanError(f"auto {self.what} of {nbytes} B: the model gave no "
                                    "candidate to run")
            state = self._classes[k] = _Class(k, nbytes, list(options), model_choice)
            if self.mode == "model" or len(options) == 1:
                pick = next((o for o in options if o.algorithm == model_choice), options[0])
                self._decide(state, pick, "model" if self.mode == "model" else "only candidate")
        return state

    def _make(self, option: Option) -> None:
        option.executor = self._executor(option.schedule)
        if self.health is not None and traceable(option):
            from .health import StepTrace
            option.executor.trace = StepTrace()

    def _run(self, option: Option, args: tuple) -> Any:
        if option.executor is None:
            self._make(option)
        return option.executor(*args)

    def _explore(self, state: _Class, args: tuple) -> Any:
        if not state.queue:
            self._next_round(state)
            if state.chosen is not None:
                return self._steady(state, args, timed=True)
        option = state.options[state.queue.pop(0)]
        result, slowest = self._alone_call(state, option, args)
        if slowest is not None and state.round > 0:
            option.samples.append(slowest)
        return result

    def _alone_call(self, state: _Class, option: Option, args: tuple
                    ) -> tuple[Any, float | None]:
        """One call of ``option`` alone (after the caller's calls in flight, every rank
        in after a barrier): its result and the slowest rank's seconds; when it failed on
        any rank, the result of the call run again from the input as it was
        (:meth:`_fallback`) and None."""
        if self._drain is not None:
            self._drain()
        restore = self._snapshot(*args) if self._snapshot is not None else None
        result, slowest = self._attempt(state, option, args)
        if slowest is None:
            return self._fallback(state, args, restore), None
        return result, slowest

    def _attempt(self, state: _Class, option: Option, args: tuple) -> tuple[Any, float | None]:
        """Run one call with ``option`` and agree with every rank on how it went: its
        result and slowest rank's seconds, or (None, None) when it failed on any rank
        (the option is then marked failed, on every rank alike). A candidate's executor is
        built on its first call, and the ranks agree that it was first: one that a rank
        cannot build never runs."""
        if option.executor is None and not self._build(state, option):
            return None, None
        error: BaseException | None = None
        # Every rank starts together: the time is the call's, not how late a rank came
        # (on a machine with fewer cores than ranks, the work between calls staggers them).
        self.transport.barrier()
        began = self._clock()
        result: Any = None
        try:
            result = self._run(option, args)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it just below
            error = exc
        elapsed = self._clock() - began
        try:
            failed, slowest = self.transport.allreduce_max_many(
                [1.0 if error is not None else 0.0, elapsed])
        except Exception:
            if error is not None:
                raise error from None
            raise
        state.explore_calls += 1
        state.explore_s += slowest
        if not failed:
            return result, slowest
        option.failed = f"failed: {error}" if error is not None else "failed on another rank"
        if self.transport.rank == 0:
            log.warning("auto %s %s: dropped %s: %s", self.what, class_range(state.k),
                        option.algorithm, option.failed)
        return None, None

    def _build(self, state: _Class, option: Option) -> bool:
        error: BaseException | None = None
        try:
            self._make(option)
        except Exception as exc:  # noqa: BLE001 - every rank learns of it just below
            error = exc
        (failed,) = self.transport.allreduce_max_many([1.0 if error is not None else 0.0])
        if not failed:
            return True
        option.executor = None
        option.failed = (f"failed to build: {error}" if error is not None
                         else "failed to build on another rank")
        if self.transport.rank == 0:
            log.warning("auto %s %s: dropped %s: %s", self.what, class_range(state.k),
                        option.algorithm, option.failed)
        return False

    def _fallback(self, state: _Class, args: tuple, restore: Callable[[], None] | None) -> Any:
        """Run the call again, from the input as it was, with the model's best candidates
        still standing, one after another until one works on every rank."""
        while True:
            standing = [o for o in state.options if o.failed is None]
            if not standing:
                notes = "; ".join(f"{o.algorithm}: {o.failed}" for o in state.options)
                raise TransportError(f"auto {self.what} of {state.nbytes} B: every candidate "
                                     f"failed ({notes})")
            if restore is not None:
                restore()
            best = next((o for o in standing if o.algorithm == state.model_choice),
                        standing[0])
            result, slowest = self._attempt(state, best, args)
            if slowest is not None:
                return result

    def _next_round(self, state: _Class) -> None:
        state.round += 1
        live = [o for o in state.options if o.live]
        if state.round == 2 and len(live) > 1:
            fastest = min(o.samples[0] for o in live if o.samples)
            for o in live:
                if o.samples and o.samples[0] > self.prune * fastest:
                    o.pruned = True
            live = [o for o in live if o.live]
        if not live:
            return self._fallback_decision(state)
        best = min(live, key=lambda o: (o.median_s, state.options.index(o)))
        if len(live) == 1:
            return self._decide(state, best, state.reason)
        if state.round > self.probes:
            # Racing: only the candidates within CLOSE of the fastest run on, up to
            # max_probes timed rounds in all, until one is left or the rounds run out.
            close = [o for o in live if o.median_s <= (1 + self.close) * best.median_s]
            tied = all(o.median_s <= (1 + TIE) * best.median_s for o in close)
            if len(close) <= 1 or tied or state.round > self.max_probes:
                return self._decide(state, _tie_break(live, best), state.reason)
            live = close
        state.queue = [state.options.index(o) for o in live]

    def _fallback_decision(self, state: _Class) -> None:
        standing = [o for o in state.options if o.failed is None]
        if not standing:
            raise TransportError(f"auto {self.what} of {state.nbytes} B: every candidate "
                                 "failed")
        self._decide(state, standing[0], state.reason)

    def _decide(self, state: _Class, option: Option, reason: str) -> None:
        state.chosen, state.since, state.recent, state.alone = option, 0, [], None
        if state.drifted is not None and state.drifted[0] == option.algorithm:
            # Measured again, the same candidate won: its calls just run slower than
            # its probes did. Compare with what they run at from now on.
            state.reference = state.drifted[1]
        elif state.drifted is not None:
            state.fruitless = 0  # the exploration changed what runs: it found something
        state.drifted = None
        self.version += 1
        decision = Decision(state.k, state.nbytes, option.algorithm, state.model_choice,
                            tuple(o.record() for o in state.options), state.explore_calls,
                            state.explore_s, reason)
        self.decisions[state.k] = decision
        self.history.append(decision)
        if self.transport.rank == 0:
            log.info("%s", decision.line(self.what))
        state.health_reference, state.health_times = None, []
        if self.health is not None and reason == "drift":
            self._fit_explored(state)

    # -- after the decision -----------------------------------------------------------
    def _steady(self, state: _Class, args: tuple, *, timed: bool) -> Any:
        option = state.chosen
        assert option is not None
        state.since += 1
        if self.health is not None and self.health.slow and state.since >= state.probe_at:
            result = self._probe_recovery(state, args)
            return result if timed else _Done(result)
        if state.alone is not None:
            result = self._alone(state, args)
            return result if timed else _Done(result)
        check = self.health is not None and traceable(option) \
            and state.since % CHECK_EVERY == 0
        if not timed:
            result = self._start(option, args)
        elif self.mode != "measured":
            result = self._run(option, args)
        else:  # a blocking call: its time is two clock reads
            began = self._clock()
            result = self._run(option, args)
            took = self._clock() - began
            if self.health is not None and not traceable(option):
                # what the native collective's checks read: every CHECK_EVERY calls
                state.health_times = [*state.health_times[-(CHECK_EVERY - 1):], took]
                state.timed += 1
                check = state.timed % CHECK_EVERY == 0
            if self._sampled(state.since):
                state.recent.append(took)
                if len(state.recent) >= self.recheck_every:
                    self._recheck(state, option)
        if self.mode == "measured" and state.since >= state.reprobe_every:
            self._reexplore(state, "re-probe")
            state.reprobe_every *= 2
        elif check:
            self._check_health(state, option)
        return result

    def _sampled(self, since: int) -> bool:
        """Whether the time of a blocking call, ``since`` calls after the decision, is one
        the drift checks read: the first first_timed, then every sample_every-th, and
        every call the torch backend could not start bare (every CLAIM_EVERY-th)."""
        return (since <= self.first_timed or since % self.sample_every == 0
                or since % CLAIM_EVERY == 0)

    def claim_native(self, nbytes: int) -> bool:
        """Whether the next call of ``nbytes`` runs the native collective and nothing
        else: its class chose ``native``, and the call is neither timed nor due a check,
        a re-probe or a probe of a slow link. Then it is counted here (as :meth:`call`
        counts it), and the caller runs the library's own collective itself, without
        the executor: the cheapest way there is.

        Collective like :meth:`call`: every rank's answer for the same call is the same
        (it depends on the calls counted only), whichever rank asks from where."""
        state = self._classes.get(size_class(nbytes))
        if state is None or state.chosen is None or state.chosen.algorithm != NATIVE:
            return False
        since = state.since + 1
        if self.mode == "measured" and (since <= self.first_timed or since % CLAIM_EVERY == 0
                                        or since >= state.reprobe_every):
            return False
        if self.health is not None and self.health.slow and since >= state.probe_at:
            return False
        if state.alone is not None:
            return False
        self.calls += 1
        state.since = since
        return True

    def _start(self, option: Option, args: tuple) -> Any:
        if option.executor is None:
            self._make(option)
        start = getattr(option.executor, "start", None)
        return start(*args) if start is not None else _Done(option.executor(*args))

    def _recheck(self, state: _Class, option: Option) -> None:
        recent = statistics.median(state.recent)
        state.recent = []
        (agreed,) = self.transport.allreduce_max_many([recent])
        reference = state.reference if state.reference is not None else (
            option.median_s if option.samples else None)
        if reference is None:
            state.reference = agreed
        elif agreed > self.drift * reference and self.health is not None and (
                state.raised or self.health.pending):
            pass  # link health is on it: its fit names the link (the same on every rank)
        elif agreed > self.drift * reference:
            if self.transport.rank == 0:
                log.info("auto %s %s: %s now takes %.3g us, %.2fx its measured %.3g us: "
                         "measuring the candidates again", self.what, class_range(state.k),
                         option.algorithm, agreed * 1e6, agreed / reference, reference * 1e6)
            state.drifted, state.reference = (option.algorithm, agreed), None
            self._reexplore(state, "drift")
        elif state.reference is None:
            state.reference = agreed  # confirmed: from now on, calls against calls

    def _reexplore(self, state: _Class, reason: str) -> None:
        """Explore the class again from the first timed round (executors are built;
        their traces start again, so a fit after it reads only the new calls)."""
        for o in state.options:
            o.samples, o.pruned = [], False
            trace = getattr(o.executor, "trace", None)
            if trace is not None:
                trace.clear()
        self.version += 1
        state.chosen, state.reason, state.round = None, reason, 1
        state.explore_calls, state.explore_s = 0, 0.0
        state.queue = [i for i, o in enumerate(state.options) if o.live]

    # -- link health ------------------------------------------------------------------
    def enable_health(self, machine: Any, profile: Any) -> None:
        """Turn link health on, once the job's pricing is known (the first planning):
        not in ``model`` mode, nor where :func:`~topoplan.runtime.health.health_enabled`
        says no. Collective only in that every rank must call it alike."""
        if self.health is None and self.mode == "measured" and not self._health_asked:
            from .health import LinkHealth, health_enabled
            self._health_asked = True
            if health_enabled(machine):
                self.health = LinkHealth(machine, profile)
    def _plan(self, k: int, nbytes: int) -> tuple[list[Option], str]:
        """The candidates of a new size class: the model's, on the cluster with the slow
        links at their measured rates when link health found any; then what the class
        ran before (or the healthy model's choice) as a candidate named ``old ...``."""
        health = self.health
        before = self._before.pop(k, None)
        if health is None or (not health.slow and before is None):
            return self._options(nbytes)
        faults = health.planning_faults()
        if len(faults) > 1:
            options, model_choice = self._around_each(nbytes, faults)
        else:
            options, model_choice = self._options(nbytes, slow=faults[0] if faults else None)
        if before is None:  # planned for the first time while a link is slow
            healthy, healthy_choice = self._options(nbytes)
            before = next((o for o in healthy if o.algorithm == healthy_choice), None)
        if before is not None and before.algorithm != NATIVE:
            name = BEFORE + before.algorithm.removeprefix(BEFORE)
            before = Option(name, before.schedule, health.predict(before.schedule, nbytes),
                            executor=before.executor)
            options = [*options, before]
        if self.transport.rank == 0:
            new = next((o for o in options if o.algorithm == model_choice), options[0])
            log.warning("link health: %s; auto %s %s re-planned: %s %s -> %s %s predicted",
                        health.describe(), self.what, class_range(k),
                        before.algorithm if before is not None else "-",
                        _us(before.predicted_s if before is not None else None),
                        new.algorithm, _us(new.predicted_s))
        return options, model_choice

    def _around_each(self, nbytes: int, faults: list[dict[str, float]]
                     ) -> tuple[list[Option], str]:
        """Links that could not be told apart: the model's best plan around each (and
        the native collective), named ``"mcf around B/nic0"``; measuring them tells
        which link it was."""
        options: list[Option] = []
        seen: set[str] = set()
        model_choice = ""
        for fault in faults:
            link = next(k for k in fault if k in self.health.alternatives)
            found, choice = self._options(nbytes, slow=fault)
            for o in found:
                if o.algorithm == NATIVE:
                    if NATIVE not in seen:
                        seen.add(NATIVE)
                        options.append(o)
                    continue
                if o.algorithm != choice:
                    continue
                text = o.schedule.to_json()
                if text in seen:
                    continue
                seen.add(text)
                options.append(Option(f"{o.algorithm} around {link}", o.schedule,
                                      o.predicted_s))
                model_choice = model_choice or options[-1].algorithm
        return options, model_choice or options[0].algorithm

    def _check_health(self, state: _Class, option: Option) -> None:
        """Every CHECK_EVERY calls: the ranks agree on the chosen plan's recent time
        (one float); over TRIGGER times its time at the first check, a fit."""
        trace: Any = getattr(option.executor, "trace", None)
        traced = trace is not None and trace.last is not None  # alike on every rank
        if traced:
            own = trace.call_time(trace.last[0])
        elif traceable(option) or not self.sample_every:
            return
        else:  # the native collective: its calls' times say something is slower
            own = statistics.median(state.health_times) if state.health_times else 0.0
        # The fastest rank's time: a rank that came to the calls late waits least in
        # them, so ranks arriving apart (FSDP2's, a loaded host's) do not read as a
        # slower link; a slower link slows every rank's calls.
        (fastest,) = self.transport.allreduce_max_many([-own])
        recent = -fastest
        if state.health_reference is None:
            state.health_reference = recent or None
            return
        pending = self.health.pending
        if recent <= TRIGGER * state.health_reference and not pending:
            state.fruitless, state.raised = 0, 0
            return
        if not pending:
            # Slower at two checks in a row: then the calls the trace holds all came
            # after the change (a fit of calls from both sides of it says little).
            state.raised += 1
            if state.raised < 2 or self.calls < state.quiet_until:
                return
        # What this check starts may find nothing: the next one acts after twice as many
        # calls as this one (a fit is a gather and rank 0 simulating the schedule for
        # every link it loads; an exploration, a few dozen calls).
        state.raised = 0
        state.fruitless += 1
        state.quiet_until = self.calls + min(RECOVER_EVERY, CHECK_EVERY << state.fruitless)
        if not pending and option.samples:
            # First, is it slower alone? The next call runs alone, after a barrier, as
            # the candidates were measured (:meth:`_alone`).
            state.alone = recent
            return
        self._act(state, option, recent)

    def _alone(self, state: _Class, args: tuple) -> Any:
        """The call after a check found the chosen candidate slower: run it alone (every
        rank in, after a barrier) and compare with its measured time. Within TRIGGER of
        it, what slowed the calls is the job (compute overlapping them, a busier host,
        ranks arriving apart), not the network: the slower time is the new normal, with
        no fit and nothing measured again. Slower alone too: :meth:`_act`."""
        option = option_of(state)
        recent, state.alone = state.alone or 0.0, None
        result, slowest = self._alone_call(state, option, args)
        if slowest is None:
            return result
        if slowest <= TRIGGER * option.median_s:
            if self.transport.rank == 0:
                log.info("auto %s %s: %s takes %.3g us in the job, %.2fx its time before, "
                         "and %.3g us alone (measured %.3g us): the job is slower, not the "
                         "network", self.what, class_range(state.k), option.algorithm,
                         recent * 1e6, recent / (state.health_reference or recent),
                         slowest * 1e6, option.median_s * 1e6)
            state.health_reference = max(state.health_reference or 0.0, recent)
        else:
            self._act(state, option, recent)
        return result

    def _act(self, state: _Class, option: Option, recent: float) -> None:
        """The chosen candidate is slower, alone too: fit its step times, or, for the
        native collective (nothing traced), measure the candidates again."""
        trace: Any = getattr(option.executor, "trace", None)
        traced = trace is not None and trace.last is not None  # alike on every rank
        if not traced:
            # Measure the candidates again: their exploring calls are traced, and the
            # decision fits the plans' step times (:meth:`_fit_explored`).
            if self.transport.rank == 0:
                log.info("auto %s %s: %s now takes %.3g us, %.2fx its time before: "
                         "measuring the candidates again", self.what, class_range(state.k),
                         option.algorithm, recent * 1e6,
                         recent / (state.health_reference or recent))
            state.drifted = (option.algorithm, recent)
            self._reexplore(state, "drift")
            return
        verdict = self._verdict(option)
        if verdict is None:
            return
        if verdict.uniform is not None and not self.health.pending \
                and sum(traceable(o) and o.live for o in state.options) > 1:
            # Every link alike explains this plan's steps as well as its slowest links, or
            # better: a ring waits on its slowest hop whatever it is, and a host slower
            # than when the plans were measured looks the same (one plan's steps do not
            # show which). Measure the candidates again (alone, after a barrier): their
            # step times, fitted together, tell a link from the host
            # (:meth:`_fit_explored`).
            if self.transport.rank == 0:
                log.info("auto %s %s: %s now takes %.3g us, %.2fx its time before, and its "
                         "steps cannot tell a slower link from a slower host: measuring "
                         "the candidates again", self.what, class_range(state.k),
                         option.algorithm, recent * 1e6,
                         recent / (state.health_reference or recent))
            state.drifted = (option.algorithm, recent)
            self._reexplore(state, "drift")
        elif self.health.observe(verdict, calls=self.calls):
            self._replan()
        elif self.health.pending:
            state.fruitless = 0  # a verdict waits: the next check confirms it
        else:
            # The links known explain these times, or every link alike does (the calls
            # run slower for another reason: a busier host): the new normal.
            state.health_reference = max(state.health_reference or 0.0, recent)

    def _fit_explored(self, state: _Class) -> None:
        """After an exploration started by a slower native collective: fit the step times
        the exploring calls traced of the fastest plan measured (every rank alike: the
        options, their samples and traces agree), as confirmed as a steady check's."""
        traced = [o for o in state.options if o.executor is not None and o.samples
                  and getattr(o.executor, "trace", None) is not None
                  and o.executor.trace.last is not None]
        if not traced:
            return
        traced.sort(key=lambda o: (o.median_s, state.options.index(o)))
        verdict = self._verdict(traced[0], also=traced[1:])
        if verdict is not None and self.health.observe(verdict, calls=self.calls,
                                                       weight=self.health.confirm):
            self._replan()

    def _verdict(self, option: Option, also: Sequence[Option] = ()) -> Any:
        """Gather every rank's step times of ``option``'s last calls (and of ``also``'s,
        fitted together with them), fit them on rank 0 and hand its verdict to every
        rank (None: too many to gather)."""
        from .health import Verdict, decode, encode, fit_links, gather_durations
        health = self.health
        runs = []
        for o in (option, *also):
            n, itemsize = o.executor.trace.last
            measured = gather_durations(self.transport,
                                        o.executor.trace.durations(n, o.schedule.nsteps))
            if measured is None:
                return None
            runs.append((o.schedule, n * itemsize, measured, itemsize))
        verdict: Verdict | None = None
        if self.transport.rank == 0:
            schedule, nbytes, measured, itemsize = runs[0]
            try:
                verdict = fit_links(health.machine, schedule, nbytes, measured,
                                    profile=health.profile, dtype_size=itemsize,
                                    cache=health.cache, also=runs[1:])
            except Exception as exc:  # noqa: BLE001 - a fit that fails changes nothing
                log.warning("link health: the fit of %s failed: %s", option.algorithm, exc)
            else:
                if verdict.uniform is not None:
                    log.info("link health: %s (%s)", verdict.describe(),
                             ", ".join(o.algorithm for o in (option, *also)))
        agreed = decode(self.transport.allreduce_max_many(encode(verdict, health.machine)),
                        health.machine)
        if verdict is not None:  # rank 0 keeps its fits, for the log
            agreed = Verdict(agreed.slow, verdict.healthy_error, verdict.fits,
                             agreed.ambiguous, verdict.predicted_healthy_s, agreed.loaded,
                             agreed.uniform)
        return agreed

    def _replan(self) -> None:
        """The slow links changed: every size class is planned again at its next call,
        what it ran kept as a candidate; the calls in flight end as they started."""
        if self._drain is not None:
            self._drain()
        for k, st in self._classes.items():
            if st.chosen is not None:
                self._before[k] = st.chosen
        self._classes.clear()
        self.version += 1

    def _probe_recovery(self, state: _Class, args: tuple) -> Any:
        """While a link is slow: run this call with the plan from before (it crosses the
        link), timed alone, and fit its step times: a link back at its rate is noticed.
        The next probe comes RECOVER_EVERY calls later, or CHECK_EVERY while a verdict
        waits for confirmation."""
        old = next((o for o in state.options if o.algorithm.startswith(BEFORE)
                    and o.failed is None and traceable(o)), None)
        state.probe_at = state.since + RECOVER_EVERY
        if self._drain is not None:
            self._drain()
        if old is None:  # nothing crosses the slow link that could tell
            return self._run(option_of(state), args)
        if old.executor is not None:
            old.executor.trace.clear()
        restore = self._snapshot(*args) if self._snapshot is not None else None
        result, slowest = self._attempt(state, old, args)
        if slowest is None:
            return self._fallback(state, args, restore)
        if old.executor.trace.last is not None:
            verdict = self._verdict(old)
            if verdict is not None and self.health.observe(verdict, calls=self.calls):
                self._replan()
            elif self.health.pending:
                state.probe_at = state.since + CHECK_EVERY
        return result


def _tie_break(live: list[Option], best: Option) -> Option:
    """The native collective when it is within :data:`TIE` of the fastest median: as good,
    and it costs the host least (the library runs it; no Python between steps, nothing
    traced), which a job feels when calls overlap its compute; else ``best``."""
    native = next((o for o in live if o.algorithm == NATIVE), None)
    if native is not None and native.median_s <= (1 + TIE) * best.median_s:
        return native
    return best


def option_of(state: _Class) -> Option:
    """The candidate a decided class runs."""
    if state.chosen is None:
        raise TopoplanError(f"size class {class_range(state.k)} has not chosen yet")
    return state.chosen


def _us(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"
