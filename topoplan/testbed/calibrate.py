"""Calibrate the simulator's software costs on the testbed itself.

The simulator moves bytes over links; a real transport also pays per message
(Python dispatch, gloo's rendezvous, waking a process on a busy core) and per byte
reduced (the CPU adding a received chunk). On an idle GPU cluster both are small; on
this shared machine a step costs milliseconds, so a pipelined plan with hundreds of
steps takes far longer than its bytes alone.

:func:`calibration_cases` are runs where those costs dominate: schedules with many
steps of small messages, and the adds of a reduction alone. :func:`fit` turns their
times into ``alpha`` (seconds per message, :func:`topoplan.simulate`'s ``alpha``) by
least squares against the simulator's own sensitivity to ``alpha``, and a
``reduce_bandwidth``. The calibration runs differ from the measured cases (small
sizes, ring and tree only), so a calibrated prediction of a large ``mcf`` run is
still a prediction.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..cluster import Cluster
from ..schedule import Schedule

__all__ = ["Calibration", "CalibrationSample", "calibration_cases", "fit", "predict",
           "PROBE_ALPHA"]

#: The alpha (s) at which the simulator's sensitivity d(time)/d(alpha) is taken.
PROBE_ALPHA = 1e-3
#: Pipelined calibration runs: chunks, and seconds per message on the slowest link.
PIPELINE_CHUNKS = 32
STEP_SECONDS = 1.5e-3
#: Bytes of the reduce-only case: large enough to time, small enough for any cache.
REDUCE_BYTES = 4 << 20


@dataclass(frozen=True)
class CalibrationSample:
    """One calibration run: measured time, the simulator's time without software costs,
    and how many alphas its critical path holds (``d time / d alpha``)."""

    label: str
    size: int
    steps: int
    measured_s: float
    base_s: float
    alphas: float


@dataclass(frozen=True)
class Calibration:
    """Software costs of the testbed's transport, for :func:`topoplan.simulate`.

    ``alpha_s`` is per message, fitted on pipelined runs (the regime of large
    sizes); ``latency_alpha_s`` the same fitted on a latency-bound run of small
    messages, for information; ``reduce_bandwidth`` in bytes/s (``None``: not
    measured); ``load`` the 1-minute load average when it was measured.
    """

    alpha_s: float
    reduce_bandwidth: float | None
    load: float
    samples: tuple[CalibrationSample, ...] = ()
    latency_alpha_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def calibration_cases(cluster: Cluster) -> list[tuple[str, int, str, Schedule | None]]:
    """``(label, size, kind, schedule)`` runs that measure per-message and reduce costs.

    ``cluster`` is the scaled cluster the testbed emulates. Two pipelined schedules
    of many steps whose messages each take ``STEP_SECONDS`` on the slowest link (a
    ring cut into 32 slices, a double binary tree of 32 chunks): the regime of
    large, pipelined allreduces, where a step's software cost partly hides behind
    the previous transfer (gloo's send returns once the socket has the data). A
    plain ring of 4 KiB, latency-bound: one step's full round of wake-ups, reported
    as ``latency_alpha_s`` but not used for predictions at large sizes. And the adds
    alone of a 4 MiB reduction.
    """
    from ..planners import plan
    n = cluster.nranks
    slowest = min(d["bandwidth"] for _, _, d in cluster.graph.edges(data=True))
    slices = PIPELINE_CHUNKS
    # Ring slice messages carry size / (n * slices) bytes.
    size = int(STEP_SECONDS * slowest * n * slices) // 4096 * 4096 or 4096
    cases: list[tuple[str, int, str, Schedule | None]] = [
        ("cal:reduce", REDUCE_BYTES, "reduce", None)]
    runs: tuple[tuple[str, str, int, dict[str, Any]], ...] = (
        ("cal:latency", "ring", 4 << 10, {}),
        ("cal:ring-pipelined", "ring", size, {"chunks": slices}),
        ("cal:tree-pipelined", "tree", size, {"chunks": slices}))
    for label, algorithm, nbytes, options in runs:
        cases.append((label, nbytes, "schedule", plan(cluster, algorithm=algorithm, size=nbytes,
                                                      profile="ideal", **options)))
    return cases


def predict(cluster: Cluster, schedule: Schedule, size: int,
            calibration: Calibration | None = None) -> float:
    """The simulator's time for ``schedule``, with the calibrated software costs if given."""
    from ..simulate import simulate
    if calibration is None:
        return float(simulate(cluster, schedule, size=size).time_s)
    return float(simulate(cluster, schedule, size=size, alpha=calibration.alpha_s,
                          reduce_bandwidth=calibration.reduce_bandwidth).time_s)


def fit(cluster: Cluster, cases: Sequence[tuple[str, int, str, Schedule | None]],
        measured: dict[str, float]) -> Calibration:
    """Fit ``alpha`` and ``reduce_bandwidth`` from the measured times of ``cases``.

    Parameters
    ----------
    cluster : Cluster
        The scaled cluster.
    cases : sequence
        From :func:`calibration_cases`.
    measured : dict
        Label -> measured seconds (median over iterations).

    Returns
    -------
    Calibration
        ``alpha`` minimises ``sum (measured - base - alpha * alphas)^2`` over the
        pipelined runs (clamped at 0), where ``base`` is the simulated time with the
        measured reduce bandwidth and no alpha, and ``alphas`` the simulator's
        sensitivity to alpha.
    """
    from ..simulate import simulate
    reduce_bw = None
    for label, size, kind, _ in cases:
        if kind == "reduce" and measured.get(label, 0) > 0:
            reduce_bw = size / measured[label]
    samples = []
    for label, size, kind, schedule in cases:
        if kind != "schedule" or schedule is None or label not in measured:
            continue
        base = float(simulate(cluster, schedule, size=size, reduce_bandwidth=reduce_bw).time_s)
        probed = float(simulate(cluster, schedule, size=size, reduce_bandwidth=reduce_bw,
                                alpha=PROBE_ALPHA).time_s)
        steps = max(len(schedule.steps_of(r)) for r in range(schedule.nranks))
        samples.append(CalibrationSample(label, size, steps, measured[label], base,
                                         (probed - base) / PROBE_ALPHA))
    pipelined = [s for s in samples if s.label != "cal:latency"]
    latency = [s for s in samples if s.label == "cal:latency"]
    return Calibration(_least_squares(pipelined), reduce_bw, _load(), tuple(samples),
                       _least_squares(latency) if latency else None)


def _least_squares(samples: Sequence[CalibrationSample]) -> float:
    """The alpha >= 0 minimising the squared error of ``base + alpha * alphas``."""
    num = sum(s.alphas * (s.measured_s - s.base_s) for s in samples)
    den = sum(s.alphas ** 2 for s in samples)
    return max(0.0, num / den) if den > 0 else 0.0


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")
