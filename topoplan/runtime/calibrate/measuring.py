"""Timing the micro-benchmarks on a transport: :func:`measure` gives a :class:`Sample` each.

Every case is timed as the slowest rank's time of a block of back-to-back calls between
barriers (as ``topoplan bench`` times), the block repeated and the cases interleaved so
that the machine's noise spreads over all of them; a sample is the median over the
repeats. Every allreduce case is checked for an exact sum first.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

from ..bench import array_kind, expected_sum
from ..bench import pattern as check_pattern
from ...errors import TopoplanError
from .cases import Case

__all__ = ["Sample", "measure"]


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
        """The benchmarks' check data (:func:`topoplan.runtime.bench.pattern`)."""
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
    from ..executor import Allreduce

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
        from ..transports.base import Message
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
            from ...errors import TransportError
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
