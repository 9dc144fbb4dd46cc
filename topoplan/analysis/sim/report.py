"""What the simulator returns: :class:`SimReport` and its :class:`TransferRecord` s."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["SimReport", "TransferRecord", "NativeRecord", "Edge", "Yardsticks"]

Edge = tuple[str, str]


@dataclass(frozen=True)
class Yardsticks:
    """What a simulation of ``collective`` over ``size`` bytes is measured against, when
    the caller has computed it already (a plan request compares many schedules on one
    cluster): the lower bound for any schedule and NCCL's own row (None where NCCL does
    not run). :func:`~topoplan.analysis.sim.simulate` uses them for that size and
    collective only."""

    size: int
    collective: str
    lower_bound_s: float
    nccl: Any = None


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """One simulated message (``record=True``).

    ``start_s`` is when both its send and its recv are posted; ``end_s`` the arrival of
    the last byte (a reducing recv adds it when its step's messages are all done).
    Messages of zero bytes are not sent: their ``start_s`` and ``end_s`` are equal.
    """

    src: int
    dst: int
    src_step: int
    dst_step: int
    chunk: int
    nbytes: int
    start_s: float
    end_s: float
    count: int = 1  #: chunks ``chunk .. chunk + count - 1`` (IR v2 ranges)
    #: a vectored message's ranges after the first (IR v4); ``nbytes`` counts them all
    more: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NativeRecord:
    """One native collective (IR v3) as simulated: every member's op at once.

    ``start_s`` is when the last member posted it (its step started, plus the step
    overhead); ``end_s`` when it ended for all members. ``steps`` holds each member's
    step, in group order; ``priced_by`` who priced it
    (:attr:`topoplan.analysis.native.price.NativePrice.source`: ``"NCCL Ring/Simple
    x16"``, ``"measured"``, ``"ring"``).
    """

    kind: str
    group: tuple[int, ...]
    chunk: int
    count: int
    nbytes: int
    start_s: float
    end_s: float
    steps: tuple[int, ...]
    priced_by: str


@dataclass(frozen=True)
class SimReport:
    """What :func:`simulate` predicts for one schedule, cluster and size.

    Attributes
    ----------
    cluster, algorithm : str
        Names (``cluster.name``, ``schedule.meta["algorithm"]``).
    nranks, size : int
        Ranks; bytes of the full buffer (an allreduce's buffer on every rank, a
        reduce-scatter's input, an allgather's output).
    time_s : float
        When the last rank finishes its last step.
    lower_bound_s : float
        :func:`topoplan.analysis.bound.collective_bound` for this cluster, size and the schedule's
        collective (:func:`~topoplan.analysis.bound.lower_bound` for an allreduce).
    algbw, busbw : float
        ``size / time_s`` and ``algbw * 2(n-1)/n`` (``(n-1)/n`` for a reduce-scatter or
        an allgather) in bytes/s (nccl-tests conventions).
    link_bytes : mapping
        Bytes that crossed each directed edge ``(u, v)`` of ``cluster.graph``.
    link_busy_s : mapping
        Seconds each directed edge carried at least one flow.
    step_times : tuple
        ``step_times[rank][step] == (start_s, end_s)``, per step of the rank's program as
        written. A step whose ops are on several channels (IR v4) runs as one step of
        each channel's sequence: it spans from the first of them to start to the last
        to end (the channels' parts may run at different times).
    transfers : tuple of TransferRecord
        Every message, only with ``record=True`` (else empty).
    link_timeline : mapping
        ``edge -> ((t, rate), ...)``: the piecewise-constant rate (bytes/s) on each edge,
        one entry per change; only with ``record=True`` (else empty).
    profile : str
        The cost profile's name.
    breakdown : mapping
        ``time_s`` split along the critical path: ``bandwidth`` (bytes flowing, link
        sharing included), ``latency`` (alpha and path latency), ``overhead`` (call, step
        and posting costs), ``reduce`` (adds), ``contention`` (ranks taking turns on a
        host with fewer cores than ranks; 0 elsewhere) and, for a schedule with native
        steps, ``native`` (time inside native collectives); the parts sum to ``time_s``.
    messages : int
        Messages that move bytes at this size.
    resolution : float
        The relative time resolution it ran at (see :func:`topoplan.simulate`).
    nccl : NcclChoice or None
        What NCCL itself runs for this collective and size on the cluster, and its
        time there (:func:`topoplan.analysis.native.nccl.nccl_time`): the yardstick; ``None`` on
        a host of a calibrated profile.
    natives : tuple of NativeRecord
        Every native collective the schedule runs (IR v3), in order of first appearance.
    notes : tuple of str
        What the reader should know about the prices: a native step priced as a
        point-to-point ring because the profile does not price its kind.
    """

    cluster: str
    algorithm: str
    nranks: int
    size: int
    time_s: float
    lower_bound_s: float
    algbw: float
    busbw: float
    link_bytes: Mapping[Edge, float]
    link_busy_s: Mapping[Edge, float]
    step_times: tuple[tuple[tuple[float, float], ...], ...]
    transfers: tuple[TransferRecord, ...] = ()
    link_timeline: Mapping[Edge, tuple[tuple[float, float], ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    profile: str = "ideal"
    breakdown: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    messages: int = 0
    resolution: float = 1e-7
    nccl: Any = None
    natives: tuple[NativeRecord, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def native_time(self) -> float:
        """Seconds of ``time_s`` spent inside native collectives on the critical path
        (``breakdown["native"]``; 0 without native steps)."""
        return float(self.breakdown.get("native", 0.0))

    @property
    def speedup_vs_nccl(self) -> float | None:
        """NCCL's time over this schedule's (above 1: faster than NCCL); ``None``
        without the ``nccl`` row."""
        if self.nccl is None or not self.time_s > 0:
            return None
        return self.nccl.time_s / self.time_s

    @property
    def efficiency(self) -> float:
        """``lower_bound_s / time_s`` (1.0 = optimal; 1.0 when nothing had to move)."""
        if self.time_s <= 0:
            return 1.0
        return self.lower_bound_s / self.time_s

    def busiest_links(self, k: int = 5) -> list[tuple[Edge, float, float]]:
        """The ``k`` edges busy longest, as ``(edge, busy_s, bytes)``, busiest first."""
        ranked = sorted(self.link_busy_s.items(),
                        key=lambda item: (-item[1], -self.link_bytes.get(item[0], 0.0), item[0]))
        return [(edge, busy, self.link_bytes.get(edge, 0.0)) for edge, busy in ranked[:k]]
