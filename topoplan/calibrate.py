"""Measure a transport's costs on this machine and fit a :class:`~topoplan.cost.CostProfile`.

:func:`calibrate` runs micro-benchmarks on any :class:`~topoplan.transports.Transport`,
collectively on all ranks (``topoplan calibrate`` launches them under ``mpiexec``):

- ``pingpong``: ranks 0 and 1 bounce 8-byte messages with the transport API alone (one
  ``start``/``wait`` per trip, outside the executor) while the other ranks sleep, with one
  and with four messages per trip; half a round trip is the one-way time, and the line
  through the two is the transport's latency (``alpha``) plus its posting cost per message;
- executor runs (:class:`~topoplan.executor.Allreduce`) of schedules built to separate the
  costs (:func:`calibration_cases`): tiny rings run once and four times in a row (steps of
  two ops, many steps), four rings side by side (steps of eight ops), a direct all-to-all
  allreduce run twice (steps of ``2 (n - 1)`` ops, few steps), a ring and the direct one
  again with 16 KiB messages (past MPI's eager limits), and a ring and a direct allreduce
  of 4 MiB (bytes, for the host bandwidth);
- ``reduce``: the executor's add (``chunk += scratch``) of 4 MiB alone, on every rank at
  once as in a step: ``reduce_bandwidth`` is bytes over its time.

Every case is timed as the slowest rank's time of a block of back-to-back calls between
barriers (as ``topoplan bench`` times), the block repeated and the cases interleaved so
that the machine's noise spreads over all of them; a sample is the median over the
repeats. Every allreduce case is checked for an exact sum first.

:func:`fit` fits costs to the executor samples by least squares (bounds >= 0) against the
simulator itself: each sample's time is linearised in the parameters by finite
differences of :func:`topoplan.simulate` on the machine as a cluster
(:meth:`CostProfile.host_cluster`) and the fit re-linearised a few times (Gauss-Newton).
Times are fitted relative to their size, so microsecond and millisecond cases count alike.
Here it fits a per-step cost, ``op_overhead``, ``call_overhead`` and ``1 / host_bandwidth``
(one rank's copy rate with a core to itself; the chain of one pair at a time pins it);
the testbed (:mod:`topoplan.testbed.calibrate`) fits its ``alpha`` with the same code.

On one host every message is of one link class, and every step of a schedule pays both
``step_overhead`` and ``alpha`` once on its critical path: executor runs alone cannot tell
them apart, only their sum (the per-step cost). The ping-pong separates them by
definition: ``alpha`` is the transport's one-way latency of a message, net of posting it
(the ping-pongs' intercept at zero messages per trip: posting is what ``op_overhead``
charges), and ``step_overhead`` is the per-step cost less ``alpha``. ``alpha`` is clamped to between 0 and the per-step cost, so that
``step_overhead`` stays >= 0 and the two still add up to the per-step cost the executor
runs showed. On this host the split moves predictions little (``step_overhead`` delays a
step's posting, ``alpha`` each of its messages); it decides what a plan is charged per
message rather than per step. The fitted samples are re-simulated with the split profile,
so the residuals recorded are those of the profile written.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass, field, replace
from functools import partial
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from .bench import array_kind, expected_sum
from .bench import pattern as check_pattern
from .cost import CostProfile
from .errors import TopoplanError
from .schedule import Schedule, build_schedule, equal_chunks, recv, send

__all__ = ["Case", "Sample", "FittedSample", "Fit", "PARAMETERS", "HOST_PARAMETERS",
           "calibration_cases", "measure", "fit", "fit_profile", "calibrate", "SPLIT_RULE",
           "host_cores", "small_limit",
           "array_kind", "transport_info", "load_average"]

#: What :func:`fit` can fit: profile costs in seconds, and two bandwidths, fitted as their
#: inverse (seconds per byte) so that times stay linear in every parameter.
PARAMETERS = ("step_overhead", "op_overhead", "call_overhead", "alpha", "host_bandwidth",
              "reduce_bandwidth")
_INVERSE = ("host_bandwidth", "reduce_bandwidth")
#: Finite-difference steps: a fraction of the value, at least the minimum of its kind.
_REL_STEP = 0.1
_MIN_STEP = {"seconds": 1e-6, "inverse": 1e-12}
#: Lower bounds (an inverse bandwidth of 0 would be an infinitely fast host).
_LOWER = {"seconds": 0.0, "inverse": 1e-15}
#: The initial guess for a bandwidth the start profile does not have (bytes/s).
_GUESS_BANDWIDTH = 1e9

#: How ``alpha`` and ``step_overhead`` are told apart (printed and recorded).
SPLIT_RULE = ("on one host executor runs fix only the per-step cost (step_overhead + alpha); "
              "alpha := the transport's one-way latency from ping-pongs of 1 and 4 messages "
              "per trip (the line's value at 0 messages), clamped to [0, per-step cost]; "
              "step_overhead := per-step cost - alpha; with a small-message protocol "
              "(MPI's eager sends) that alpha is the small messages', and larger ones pay "
              "it plus the extra their runs showed")

#: Bytes of the bandwidth cases and of the reduce case.
BIG = 4 << 20
#: Bytes per chunk of the tiny cases (4 float32 elements: latency-bound, never empty).
TINY_CHUNK = 16
#: Bytes per chunk of the medium cases (past eager limits, still latency-bound).
MEDIUM_CHUNK = 16 << 10
#: Ping-pong message bytes, and the messages per trip of the second ping-pong.
PING_BYTES = 8
PING_MESSAGES = 4


# ----------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One micro-benchmark.

    Attributes
    ----------
    label : str
    kind : {"allreduce", "pingpong", "reduce"}
    size : int
        Bytes per rank (float32 elements x 4); per message for ``pingpong``.
    schedule : Schedule or None
        For ``allreduce``.
    messages : int
        Messages per trip of a ``pingpong``.
    what : str
        What it is, in words (``"14 steps x 2 ops, 16 B messages"``).
    """

    label: str
    kind: str
    size: int
    schedule: Schedule | None = None
    what: str = ""
    messages: int = 1


def _rings(n: int, rounds: int, parallel: int, algorithm: str) -> Schedule:
    """``rounds`` ring allreduces one after another, each of ``parallel`` rings side by
    side on their own chunks (``2 (n - 1) rounds`` steps of ``2 parallel`` ops)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for q in range(rounds):
        for phase in (0, 1):  # reduce-scatter, then allgather
            for s in range(n - 1):
                for r in range(n):
                    nxt, prv = (r + 1) % n, (r - 1) % n
                    ops = []
                    for j in range(parallel):
                        base = (q * parallel + j) * n
                        if phase == 0:
                            ops += [send(nxt, base + (r - s) % n),
                                    recv(prv, base + (r - s - 1) % n, reduce=True)]
                        else:
                            ops += [send(nxt, base + (r + 1 - s) % n),
                                    recv(prv, base + (r - s) % n)]
                    steps[r].append(ops)
    return build_schedule(n, equal_chunks(rounds * parallel * n), steps, algorithm=algorithm)


def _direct(n: int, rounds: int, algorithm: str) -> Schedule:
    """``rounds`` direct allreduces one after another: a reduce-scatter step in which every
    rank sends every other rank its chunk, then an allgather step (``2 rounds`` steps of
    ``2 (n - 1)`` ops)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for q in range(rounds):
        base = q * n
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            steps[r].append([recv(p, base + r, reduce=True) for p in peers]
                            + [send(p, base + p) for p in peers])
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            steps[r].append([recv(p, base + p) for p in peers] + [send(p, base + r) for p in peers])
    return build_schedule(n, equal_chunks(rounds * n), steps, algorithm=algorithm)


def _chain(n: int, algorithm: str) -> Schedule:
    """Reduce along the chain ``0 -> 1 -> ... -> n-1``, then broadcast back: ``2 (n - 1)``
    steps, each moving the whole buffer between one pair while the other ranks wait (what
    one rank's copies cost with the machine to itself)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for r in range(n - 1):
        steps[r].append([send(r + 1, 0)])
        steps[r + 1].append([recv(r, 0, reduce=True)])
    for r in range(n - 1, 0, -1):
        steps[r].append([send(r - 1, 0)])
        steps[r - 1].append([recv(r, 0)])
    return build_schedule(n, (1.0,), steps, algorithm=algorithm)


def calibration_cases(nranks: int) -> list[Case]:
    """The micro-benchmarks of :func:`calibrate` for ``nranks`` ranks (at least 2).

    Returns
    -------
    list of Case
        ``pingpong`` and ``pingpong x4``; with 16 B messages ``ring``, ``ring x4`` (four in a row), ``rings
        x4`` (four side by side) and ``direct x2``; ``ring`` and ``direct x2`` again with
        16 KiB messages; ``ring 4MiB`` and ``direct 4MiB`` (every rank moves bytes at
        once: the machine's total copy rate); ``chain 4MiB`` (one pair at a time: one
        rank's rate); ``reduce 4MiB``.

    Raises
    ------
    TopoplanError
        For fewer than 2 ranks.
    """
    n = int(nranks)
    if n < 2:
        raise TopoplanError(f"calibration needs at least 2 ranks (a ping-pong), got {n}")
    cases = [Case("pingpong", "pingpong", PING_BYTES,
                  what=f"ranks 0 and 1, one {PING_BYTES} B message per start/wait"),
             Case(f"pingpong x{PING_MESSAGES}", "pingpong", PING_BYTES, messages=PING_MESSAGES,
                  what=f"ranks 0 and 1, {PING_MESSAGES} messages of {PING_BYTES} B per "
                       "start/wait")]

    def add(label: str, schedule: Schedule, size: int) -> None:
        steps = max(len(schedule.steps_of(r)) for r in range(n))
        ops = schedule.max_step_ops
        chunk = size // schedule.nchunks
        cases.append(Case(label, "allreduce", size, schedule,
                          f"{steps} steps x {ops} ops, {_bytes_text(chunk)} messages"))

    for label, schedule in (("ring", _rings(n, 1, 1, "calibrate-ring")),
                            ("ring x4", _rings(n, 4, 1, "calibrate-ring-x4")),
                            ("rings x4", _rings(n, 1, 4, "calibrate-rings-x4")),
                            ("direct x2", _direct(n, 2, "calibrate-direct-x2"))):
        add(label, schedule, TINY_CHUNK * schedule.nchunks)
    # Messages past the eager limits of MPI libraries (a few KiB): another protocol, often
    # a costlier step. The fit averages the two regimes; the residuals show how far apart.
    for label, schedule in (("ring", _rings(n, 1, 1, "calibrate-ring")),
                            ("direct x2", _direct(n, 2, "calibrate-direct-x2"))):
        size = MEDIUM_CHUNK * schedule.nchunks
        add(f"{label} {_bytes_text(size)}", schedule, size)
    big = BIG // (4 * n) * 4 * n  # whole float32 chunks
    add(f"ring {_bytes_text(big)}", _rings(n, 1, 1, "calibrate-ring"), big)
    add(f"direct {_bytes_text(big)}", _direct(n, 1, "calibrate-direct"), big)
    add(f"chain {_bytes_text(BIG)}", _chain(n, "calibrate-chain"), BIG)
    cases.append(Case(f"reduce {_bytes_text(BIG)}", "reduce", BIG,
                      what="chunk += scratch alone, every rank at once"))
    return cases


def _bytes_text(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n} B"


# ----------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """A measured case: the median over repeats of the slowest rank's time per call
    (``pingpong``: per one-way trip; ``reduce``: per add).

    ``repeats_s`` holds every repeat, ``calls`` the back-to-back calls of each.
    """

    case: Case
    measured_s: float
    repeats_s: tuple[float, ...] = ()
    calls: int = 1

    @property
    def label(self) -> str:
        return self.case.label

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 with fewer than 4 repeats)."""
        r = sorted(self.repeats_s)
        if len(r) < 4 or not self.measured_s:
            return 0.0
        q = statistics.quantiles(r, n=4)
        return (q[2] - q[0]) / self.measured_s


class _Arrays:
    """Buffers of the transport's array kind: numpy, torch (CPU or CUDA) or cupy."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "numpy":
            import numpy
            self.lib: Any = numpy
        elif kind in ("torch", "torch-cuda"):
            import torch
            self.lib = torch
        elif kind == "cupy":
            import cupy
            self.lib = cupy
        else:
            raise TopoplanError(f"unknown array kind {kind!r}; use numpy, torch, torch-cuda "
                                "or cupy")

    def zeros(self, count: int) -> Any:
        if self.kind == "numpy":
            return self.lib.zeros(count, dtype="float32")
        if self.kind == "cupy":
            return self.lib.zeros(count, dtype=self.lib.float32)
        device = "cuda" if self.kind == "torch-cuda" else "cpu"
        return self.lib.zeros(count, dtype=self.lib.float32, device=device)

    def pattern(self, buf: Any, rank: int) -> None:
        """The benchmarks' check data (:func:`topoplan.bench.pattern`)."""
        count = buf.shape[0]
        if self.kind in ("torch", "torch-cuda"):
            buf.copy_(check_pattern(self.lib.arange(count, device=buf.device), rank))
        else:
            buf[...] = check_pattern(self.lib.arange(count), rank)

    def wrong(self, buf: Any, nranks: int) -> int:
        import numpy as np
        if self.kind in ("torch", "torch-cuda"):
            values = buf.cpu().numpy()
        elif self.kind == "cupy":
            values = self.lib.asnumpy(buf)
        else:
            values = buf
        count = values.shape[0]
        expected = expected_sum(np.arange(count), nranks)
        return int(np.count_nonzero(values != expected))

    def add(self, dst: Any, src: Any) -> None:
        if self.kind in ("torch", "torch-cuda"):
            dst.add_(src)
        else:
            dst += src

    def sync(self) -> None:
        if self.kind == "cupy":
            self.lib.cuda.get_current_stream().synchronize()
        elif self.kind == "torch-cuda":
            self.lib.cuda.synchronize()


def measure(transport: Any, cases: Sequence[Case], *, repeats: int = 15,
            block_s: float = 0.04, min_calls: int = 3, max_calls: int = 500,
            timeout: float = 60.0,
            arrays: str | None = None,
            progress: Callable[[str], None] | None = None) -> list[Sample]:
    """Time every case on ``transport``; collective (every rank calls it).

    Parameters
    ----------
    transport : Transport
    cases : sequence of Case
        From :func:`calibration_cases`.
    repeats : int
        Timed blocks per case; the cases take turns, one block each, ``repeats`` times.
    block_s : float
        Seconds a block should last: each case runs as many back-to-back calls per block
        as its warm-up time says fit, at least ``min_calls`` (the steady state of calls
        in a row, as ``topoplan bench`` times them) and at most ``max_calls``; every
        block starts with one more call, untimed, that lines the ranks up.
    timeout : float
        The executor's per-step timeout.
    arrays : str, optional
        Buffer kind (:func:`array_kind` of the transport by default).
    progress : callable, optional
        Called with a line of text on rank 0 as the measurement goes.

    Returns
    -------
    list of Sample
        In the order of ``cases``, the same on every rank.

    Raises
    ------
    TopoplanError
        When an allreduce case computes a wrong sum (on every rank), or the transport
        has fewer than 2 ranks.
    TransportError
        When a message fails or times out.
    """
    from .executor import Allreduce

    n, rank = transport.size, transport.rank
    if n < 2:
        raise TopoplanError(f"calibration needs at least 2 ranks (a ping-pong), got {n}")
    kit = _Arrays(arrays or array_kind(transport))

    def say(text: str) -> None:
        if progress is not None and rank == 0:
            progress(text)

    runners: list[Any] = []  # runner(k) -> seconds per call on this rank
    for case in cases:
        if case.kind == "allreduce":
            if case.schedule is None:
                raise TopoplanError(f"calibration case {case.label!r} has no schedule")
            run = Allreduce(case.schedule, transport, timeout=timeout)
            buf = kit.zeros(case.size // 4)
            kit.pattern(buf, rank)
            run(buf)
            kit.sync()
            wrong = int(transport.allreduce_max(float(kit.wrong(buf, n))))
            if wrong:
                raise TopoplanError(f"calibration case {case.label!r} ({case.schedule.algorithm} "
                                    f"over {transport.name}) computed {wrong} wrong elements on "
                                    "some rank; the transport or executor is broken here")
            buf[...] = 0  # timed runs add zeros: repeated sums of the pattern would overflow
            runners.append(_calls(partial(run, buf), kit))
        elif case.kind == "reduce":
            dst, src = kit.zeros(case.size // 4), kit.zeros(case.size // 4)
            runners.append(_calls(partial(kit.add, dst, src), kit))
        elif case.kind == "pingpong":
            runners.append(_PingPong(transport, kit, case.size, case.messages, timeout))
        else:
            raise TopoplanError(f"calibration case {case.label!r}: unknown kind {case.kind!r}")
    # Warm up (first touches of fresh buffers, lazy connections) and size the blocks: the
    # slowest rank's time of one call decides for all; for the adds, which wait for no one,
    # the fastest rank's, so that the blocks of all ranks overlap and the adds compete for
    # the cores as the adds of a step do.
    calls = []
    for case, runner in zip(cases, runners):
        transport.barrier()
        runner(1)
        if case.kind == "reduce":
            one = -transport.allreduce_max(-runner(1))
        else:
            one = _observed(runner, transport.allreduce_max(runner(1)))
        calls.append(int(min(max_calls, max(min_calls, 1, block_s // max(one, 1e-9)))))
        say(f"{case.label}: {one * 1e6:.1f} us a call, {calls[-1]} "
            f"call{'s' if calls[-1] > 1 else ''} a block")
    times: list[list[float]] = [[] for _ in cases]
    for rep in range(repeats):
        # Rotate the order so that no case always follows the same one.
        order = [(rep + i) % len(cases) for i in range(len(cases))]
        for i in order:
            transport.barrier()
            times[i].append(_observed(runners[i], transport.allreduce_max(runners[i](calls[i]))))
        say(f"repeat {rep + 1}/{repeats} done")
    return [Sample(case, statistics.median(t), tuple(t), k)
            for case, t, k in zip(cases, times, calls)]


def _observed(runner: Any, seconds: float) -> float:
    observe = getattr(runner, "observe", None)
    if observe is not None:
        observe(seconds)
    return seconds


def _calls(fn: Callable[[], Any], kit: _Arrays) -> Callable[[int], float]:
    """A runner: ``k + 1`` back-to-back calls of ``fn``, seconds per call on this rank over
    the last ``k``. The first call lines the ranks up (they leave a barrier seconds apart
    on a busy machine; a collective call ends within a message of each other)."""
    def runner(k: int) -> float:
        fn()
        kit.sync()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        kit.sync()
        return (time.perf_counter() - t0) / k
    return runner


class _PingPong:
    """A runner of ``k`` round trips between ranks 0 and 1 with the transport API alone
    (``messages`` sends, then as many receives, per trip), seconds per one-way trip. The
    other ranks sleep through it (as long as the last block took, plus a quarter),
    leaving the machine to the two."""

    def __init__(self, transport: Any, kit: _Arrays, size: int, messages: int,
                 timeout: float) -> None:
        from .transports.base import Message
        self.transport, self.kit, self.timeout = transport, kit, timeout
        self.rank = transport.rank
        self.last = 1e-3  # seconds per one-way trip in the last block (all ranks know it)
        if self.rank in (0, 1):
            self.peer = 1 - self.rank
            count = max(1, size // 4)
            buf = kit.zeros(count * messages)
            wires = [transport.prepare(buf[i * count:(i + 1) * count]) for i in range(messages)]
            tag = 1 << 14  # apart from the executor's sequence tags (never concurrent anyway)
            out = transport.batch([Message(True, w, self.peer, tag + i)
                                   for i, w in enumerate(wires)])
            into = transport.batch([Message(False, w, self.peer, tag + i)
                                    for i, w in enumerate(wires)])
            self.order = (out, into) if self.rank == 0 else (into, out)

    def _trip(self, batch: Any) -> None:
        t = self.transport
        if t.wait(t.start(batch), self.timeout):
            from .errors import TransportError
            raise TransportError(f"rank {self.rank}: {t.name} ping-pong with rank {self.peer}: "
                                 f"no message within {self.timeout:g} s", rank=self.rank,
                                 peer=self.peer)

    def __call__(self, k: int) -> float:
        if self.rank not in (0, 1):
            time.sleep(1.25 * 2 * (k + 1) * self.last + 1e-3)
            return 0.0
        first, second = self.order
        self._trip(first)  # one round trip untimed: lines the two up
        self._trip(second)
        t0 = time.perf_counter()
        for _ in range(k):
            self._trip(first)
            self._trip(second)
        self.kit.sync()
        return (time.perf_counter() - t0) / (2 * k)

    def observe(self, seconds: float) -> None:
        """The block's time as every rank learned it (the slowest of ranks 0 and 1)."""
        self.last = seconds


# ----------------------------------------------------------------------------------
# Fitting
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FittedSample:
    """A sample next to the fitted model: ``residual`` is ``(measured - fitted) /
    measured``; ``sensitivity`` maps each parameter to d(time)/d(parameter) at the fit
    (seconds per second, or per second/byte for a bandwidth)."""

    label: str
    measured_s: float
    fitted_s: float
    sensitivity: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def residual(self) -> float:
        return (self.measured_s - self.fitted_s) / self.measured_s if self.measured_s else 0.0


@dataclass(frozen=True)
class Fit:
    """What :func:`fit` found.

    Attributes
    ----------
    profile : CostProfile
        The start profile with the fitted parameters.
    values : mapping
        Each fitted parameter in its own unit (seconds; bytes/s for bandwidths).
    samples : tuple of FittedSample
    iterations : int
        Linearisations done.
    unidentified : tuple of str
        Parameters no sample's time depends on: left at their start value.
    """

    profile: CostProfile
    values: Mapping[str, float]
    samples: tuple[FittedSample, ...]
    iterations: int
    unidentified: tuple[str, ...] = ()

    @property
    def rms(self) -> float:
        """Root mean square of the relative residuals."""
        if not self.samples:
            return 0.0
        return math.sqrt(sum(s.residual ** 2 for s in self.samples) / len(self.samples))


def _unit(name: str) -> str:
    return "inverse" if name in _INVERSE else "seconds"


def _theta_of(profile: CostProfile, name: str) -> float:
    if name == "alpha":
        return float(profile.alpha_box)
    if name in _INVERSE:
        value = getattr(profile, name)
        return 1.0 / (value if value is not None else _GUESS_BANDWIDTH)
    return float(getattr(profile, name))


def _with_theta(profile: CostProfile, names: Sequence[str], theta: Any) -> CostProfile:
    changes: dict[str, Any] = {}
    for name, value in zip(names, theta):
        value = float(value)
        if name == "alpha":
            changes["alpha_box"] = changes["alpha_network"] = value
        elif name in _INVERSE:
            changes[name] = 1.0 / value
        else:
            changes[name] = value
    return replace(profile, **changes)


def fit(cases: Sequence[tuple[str, Schedule, int, float]], start: CostProfile,
        parameters: Sequence[str], *, cluster: Any = None, iterations: int = 4,
        min_steps: Mapping[str, float] | None = None) -> Fit:
    """Fit ``parameters`` of ``start`` to measured times by least squares, through the
    simulator.

    Parameters
    ----------
    cases : sequence of (label, schedule, size, measured_s)
        Allreduce runs and how long they took (seconds per call).
    start : CostProfile
        The costs not fitted, and the starting point of those fitted.
    parameters : sequence of str
        Names from :data:`PARAMETERS`. ``alpha`` sets both link classes;
        ``host_bandwidth`` and ``reduce_bandwidth`` are fitted as their inverse.
    cluster : Cluster, optional
        The cluster every run is simulated on; by default the profile's own host
        (:meth:`CostProfile.host_cluster` with the schedule's ranks), which then depends
        on ``host_bandwidth``.
    iterations : int
        Gauss-Newton linearisations at most (fewer when the parameters stop moving).
    min_steps : mapping, optional
        Smallest finite-difference step per parameter (default 1 us for times,
        1e-12 s/B for inverse bandwidths); the step is otherwise 10% of the value.

    Returns
    -------
    Fit

    Notes
    -----
    Each iteration simulates every case once at the current parameters ``theta`` and
    once per parameter at ``theta + h``, giving ``time(theta') ~ base + J (theta' -
    theta)``, and solves ``min || (base + J (theta' - theta) - measured) / measured ||``
    with ``theta' >= 0`` (``scipy.optimize.lsq_linear``, columns scaled to unit norm). The
    simulated time is piecewise linear in every cost, so one or two iterations usually
    settle it; the next ones check it.
    """
    import numpy as np
    from scipy.optimize import lsq_linear

    from .simulate import simulate

    names = list(parameters)
    for name in names:
        if name not in PARAMETERS:
            raise TopoplanError(f"cannot fit {name!r}; fittable: {', '.join(PARAMETERS)}")
    if not cases:
        raise TopoplanError("nothing to fit: no measured cases")
    for label, _, _, seconds in cases:
        if not (seconds > 0 and math.isfinite(seconds)):
            raise TopoplanError(f"case {label!r}: measured time must be > 0 s, got {seconds!r}")
    steps = {**{name: _MIN_STEP[_unit(name)] for name in names}, **(min_steps or {})}
    measured = np.array([c[3] for c in cases], dtype=float)
    weights = 1.0 / measured

    def times(theta: Any) -> Any:
        profile = _with_theta(start, names, theta)
        out = []
        for _, schedule, size, _ in cases:
            where = cluster if cluster is not None else profile.host_cluster(schedule.nranks)
            # force: the cases ran on this host, whatever cluster they were planned for.
            out.append(simulate(where, schedule, size, profile=profile, force=True).time_s)
        return np.array(out, dtype=float)

    theta = np.array([max(_theta_of(start, name), _LOWER[_unit(name)]) for name in names])
    lower = np.array([_LOWER[_unit(name)] for name in names])
    free = np.ones(len(names), dtype=bool)
    done = 0
    base = times(theta)
    jac = np.zeros((len(cases), len(names)))
    for it in range(max(1, iterations)):
        done = it + 1
        jac = np.zeros((len(cases), len(names)))
        for j in range(len(names)):
            h = max(_REL_STEP * abs(theta[j]), steps[names[j]])
            probe = theta.copy()
            probe[j] += h
            jac[:, j] = (times(probe) - base) / h
        # A parameter counts when moving it by its step moves some time by more than a
        # part in a billion; the others stay where they are.
        effect = np.abs(jac * weights[:, None]).max(axis=0) * np.array(
            [max(_REL_STEP * abs(theta[j]), steps[names[j]]) for j in range(len(names))])
        free = effect > 1e-9
        new = theta.copy()
        if free.any():
            a = jac[:, free] * weights[:, None]
            b = (measured - base + jac[:, free] @ theta[free]) * weights
            scale = np.linalg.norm(a, axis=0)
            scale[scale == 0] = 1.0
            result = lsq_linear(a / scale, b, bounds=(lower[free] * scale, np.inf),
                                method="bvls")
            new[free] = np.maximum(result.x / scale, lower[free])
        moved = np.abs(new - theta) > 1e-6 * np.maximum(np.abs(theta), lower.clip(min=1e-30))
        theta = new
        base = times(theta)
        if not moved.any() and it > 0:
            break
    profile = _with_theta(start, names, theta)
    values = {name: float(1.0 / v if name in _INVERSE else v) for name, v in zip(names, theta)}
    samples = tuple(
        FittedSample(label, float(m), float(t), MappingProxyType(
            {name: float(jac[i, j]) for j, name in enumerate(names)}))
        for i, ((label, _, _, m), t) in enumerate(zip(cases, base)))
    unidentified = tuple(name for name, f in zip(names, free) if not f)
    return Fit(profile, MappingProxyType(values), samples, done, unidentified)


# ----------------------------------------------------------------------------------
# The profile of this machine
# ----------------------------------------------------------------------------------
#: Fitted to the executor runs on the host: the per-step cost goes into step_overhead
#: first (alpha 0) and is split afterwards (:data:`SPLIT_RULE`).
HOST_PARAMETERS = ("step_overhead", "op_overhead", "call_overhead", "host_bandwidth")
#: Repeats and block seconds of a full and a quick calibration.
FULL = (15, 0.04)
QUICK = (5, 0.01)


def transport_info(transport: Any) -> str:
    """The transport and its library, in words (``"mpi (Open MPI v5.0.5)"``)."""
    name = getattr(transport, "name", type(transport).__name__)
    try:
        if name == "mpi":
            from mpi4py import MPI as mpi
            return f"mpi ({mpi.Get_library_version().splitlines()[0].split(',')[0].strip()})"
        if name.startswith("torch"):
            import torch
            return f"{name} (torch {torch.__version__})"
        if name == "nccl":
            from cupy.cuda import nccl
            v = nccl.get_version()
            return f"nccl (NCCL {v // 10000}.{v // 100 % 100}.{v % 100}, CuPy)"
    except Exception:  # noqa: BLE001 - a version string is a nicety
        pass
    return name


def fit_profile(samples: Sequence[Sample], *, name: str = "calibrated", nranks: int,
                transport: str = "?", context: Mapping[str, Any] | None = None,
                iterations: int = 4, cores: int | None = None,
                small_max: int | None = None) -> CostProfile:
    """The cost profile of this machine from the samples of :func:`measure`.

    Parameters
    ----------
    samples : sequence of Sample
        Must hold ``pingpong`` samples (two message counts separate latency from
        posting), a ``reduce`` sample and allreduce samples that vary steps,
        ops per step and bytes (:func:`calibration_cases`).
    name : str
        The profile's name.
    nranks : int
        Ranks of the runs (the profile's ``host.ranks``).
    transport : str
        The transport in words (:func:`transport_info`), for the description.
    context : mapping, optional
        Recorded as is in ``calibration`` (``host``, ``date``, ``load_average``, ...);
        host, CPUs and date default to this machine and now.
    small_max : int, optional
        The transport's small-message limit (MPI's eager limit, :func:`small_limit`):
        messages above it get their own ``alpha``, fitted on the runs of larger
        messages; those up to it pay the ping-pong's latency.
    cores : int, optional
        The cores the ranks ran on, when fewer than the ranks (processes of one host):
        the costs are then fitted as those of a rank with a core to itself, the
        simulator stretching the time ranks work at once (the profile's ``host.cores``).

    Returns
    -------
    CostProfile
        ``reduce_bandwidth`` from the adds alone; ``op_overhead``, ``call_overhead``,
        ``host_bandwidth`` and the per-step cost fitted (:func:`fit`) on
        :meth:`CostProfile.host_cluster`; ``alpha`` and ``step_overhead`` split from the
        per-step cost by :data:`SPLIT_RULE`. ``calibration`` records how, where and when,
        and every sample measured, fitted and its residual (with the final profile).

    Raises
    ------
    TopoplanError
        When a kind of sample is missing.
    """
    from .simulate import simulate

    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.case.kind, []).append(s)
    for kind in ("pingpong", "reduce", "allreduce"):
        if not by_kind.get(kind):
            raise TopoplanError(f"cannot fit a profile without a {kind} sample")
    contended = cores is not None and cores < nranks
    reduce = by_kind["reduce"][0]
    reduce_bandwidth = reduce.case.size / reduce.measured_s
    if contended:
        # Every rank added at once, ``nranks / cores`` of them to a core: one rank with a
        # core to itself adds that much faster (the simulator shares the cores again).
        reduce_bandwidth *= nranks / cores  # type: ignore[operator]
    latency, per_message = _pingpong_line(by_kind["pingpong"])
    runs = by_kind["allreduce"]
    start = CostProfile(name, reduce_bandwidth=reduce_bandwidth, host_ranks=nranks,
                        host_cores=cores if contended else None, small_max=small_max)
    parameters = HOST_PARAMETERS + (("alpha",) if small_max is not None else ())
    result = fit([(s.label, s.case.schedule, s.case.size, s.measured_s) for s in runs
                  if s.case.schedule is not None], start, parameters, iterations=iterations)
    fitted = result.profile
    per_step = fitted.step_overhead
    alpha = min(max(0.0, latency), per_step)
    step = per_step - alpha
    # With two protocols the fit gave large messages an alpha on top of the per-step
    # cost; the split moves the small messages' alpha out of the step, so it goes back
    # into the large messages' alpha (every message still costs what the fit found).
    large = fitted.alpha_box + alpha if small_max is not None else alpha
    clamped = []
    if latency < 0:
        clamped.append("alpha: the ping-pongs' line crosses zero messages below 0 s")
    elif latency > per_step:
        clamped.append("step_overhead: the ping-pongs' latency exceeds the executor's "
                       "per-step cost, so alpha is capped at it")
    ctx = {"host": socket.gethostname(), "cpus": os.cpu_count(),
           "platform": platform.platform(terse=True),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           **(context or {})}
    load = ctx.get("load_average")
    load_text = ""
    if isinstance(load, (list, tuple)) and load:
        load_text = f", 1-minute load average {min(load):.2f}-{max(load):.2f}"
    profile = replace(
        fitted, alpha_box=large, alpha_network=large, step_overhead=step,
        small_alpha_box=alpha if small_max is not None else 0.0,
        small_alpha_network=alpha if small_max is not None else 0.0,
        description=f"topoplan's executor over {transport}, {nranks} ranks on one host "
                    f"({ctx['host']})",
        sources=f"measured by topoplan calibrate on {ctx['host']} ({ctx['cpus']} CPUs, "
                f"{ctx['platform']}), {ctx['date']}, {transport}, {nranks} ranks{load_text}; "
                f"least-squares fit through topoplan.simulate")
    rows = []
    for s in samples:
        row: dict[str, Any] = {"case": s.label, "what": s.case.what,
                               "measured_us": _us(s.measured_s), "calls": s.calls,
                               "repeats": len(s.repeats_s), "spread_pct": round(100 * s.spread, 1)}
        model: float | None = None
        if s.case.kind == "allreduce" and s.case.schedule is not None:
            model = simulate(profile.host_cluster(nranks), s.case.schedule, s.case.size,
                             profile=profile, force=True).time_s
        if model is not None:
            row["fitted_us"] = _us(model)
            row["residual_pct"] = round(100 * (s.measured_s - model) / s.measured_s, 1)
        else:
            row["fitted_us"] = None
            row["residual_pct"] = None
        rows.append(row)
    fitted_rows = [r for r in rows if r["residual_pct"] is not None]
    rms = math.sqrt(sum(r["residual_pct"] ** 2 for r in fitted_rows) / len(fitted_rows))
    record = {
        "tool": "topoplan calibrate",
        "transport": transport,
        "ranks": nranks,
        **ctx,
        "rule": SPLIT_RULE,
        "per_step_cost_us": _us(per_step),
        "pingpong_latency_us": _us(latency),
        "pingpong_per_message_us": _us(per_message),
        "clamped": clamped,
        "iterations": result.iterations,
        "unidentified": list(result.unidentified),
        "rms_residual_pct": round(rms, 1),
        "samples": rows,
    }
    return replace(profile, calibration=_frozen(record))


def _pingpong_line(samples: Sequence[Sample]) -> tuple[float, float]:
    """Least-squares line of one-way time over messages per trip: (latency at zero
    messages, seconds per message). One ping-pong alone: all of it is latency."""
    points = [(s.case.messages, s.measured_s) for s in samples]
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return statistics.fmean(y for _, y in points), 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / sum((x - mx) ** 2 for x, _ in points))
    return my - slope * mx, slope


def _us(seconds: float) -> float:
    return float(f"{seconds * 1e6:.6g}")


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def calibrate(transport: Any, *, name: str = "calibrated", quick: bool = False,
              timeout: float = 60.0, root: int | None = 0,
              progress: Callable[[str], None] | None = None) -> CostProfile | None:
    """Measure ``transport`` on this machine and fit its cost profile; collective.

    Parameters
    ----------
    transport : Transport
        At least 2 ranks, all on this host.
    name : str
        The profile's name.
    quick : bool
        5 repeats of 10 ms blocks instead of 15 of 40 ms (seconds instead of tens).
    timeout : float
        Seconds any one step may wait.
    root : int or None
        The rank that fits and gets the profile (the others get ``None``); ``None``:
        every rank fits.
    progress : callable, optional
        Gets a line of text at each stage, on rank 0.

    Returns
    -------
    CostProfile or None
        See :func:`fit_profile`.

    Examples
    --------
    >>> from topoplan.transports import Local
    >>> profiles = Local.launch(4, lambda t: calibrate(t, quick=True))  # doctest: +SKIP
    >>> print(profiles[0].summary())                                    # doctest: +SKIP
    """
    cases = calibration_cases(transport.size)
    repeats, block = QUICK if quick else FULL
    load = [load_average()]
    samples = measure(transport, cases, repeats=repeats, block_s=block, timeout=timeout,
                      progress=progress)
    load.append(load_average())
    if root is not None and transport.rank != root:
        return None
    if progress is not None and transport.rank == 0:
        progress("fitting")
    return fit_profile(samples, name=name, nranks=transport.size,
                       transport=transport_info(transport),
                       context={"load_average": load, "repeats": repeats},
                       cores=host_cores(transport), small_max=small_limit(transport))


def small_limit(transport: Any) -> int | None:
    """The transport's small-message limit in bytes: Open MPI's shared-memory eager limit
    (``btl_sm_eager_limit``, from ``ompi_info``; 4096 when it cannot be read) for MPI;
    None for the others (gloo sends every message the same way)."""
    if getattr(transport, "name", "") != "mpi":
        return None
    import shutil
    import subprocess
    import sys as _sys
    from pathlib import Path
    tool = Path(_sys.executable).with_name("ompi_info")
    found = str(tool) if tool.exists() else shutil.which("ompi_info")
    if found:
        try:
            out = subprocess.run([found, "--param", "btl", "sm", "--level", "9", "--parsable"],
                                 capture_output=True, text=True, timeout=30).stdout
            for line in out.splitlines():
                if line.startswith("mca:btl:sm:param:btl_sm_eager_limit:value:"):
                    return int(line.rsplit(":", 1)[1])
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return 4096


def host_cores(transport: Any) -> int | None:
    """The cores this process may run on, for a transport of processes on one host
    (MPI, torch.distributed); None for threads of one process (:class:`Local`), whose
    waits are not work and whose work shares one interpreter."""
    if getattr(transport, "name", "") == "local":
        return None
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")
