"""Calibrate the simulator's software costs on the testbed itself.

The simulator moves bytes over links; a real transport also pays per message
(Python dispatch, gloo's rendezvous, waking a process on a busy core) and per byte
reduced (the CPU adding a received chunk). On an idle GPU cluster both are small; on
this shared machine a step costs milliseconds, so a pipelined plan with hundreds of
steps takes far longer than its bytes alone.

:func:`calibration_cases` are runs where those costs dominate: schedules with many
steps of small messages, and the adds of a reduction alone. :func:`fit` turns their
times into ``alpha`` (seconds per message, :func:`topoplan.simulate`'s ``alpha``) with
the fitting code of ``topoplan calibrate`` (:func:`topoplan.runtime.calibrate.fit_costs`: least
squares through the simulator, re-linearised), and a ``reduce_bandwidth``. On the
testbed every rank is its own namespace, so messages cross shaped links and the runs
separate ``alpha`` from the transfers; the step, op and call overheads of the host
profile are folded into it. The calibration runs differ from the measured cases (small
sizes, ring and tree only), so a calibrated prediction of a large ``mcf`` run is
still a prediction.

Three modules are named calibrate: this one (the testbed's, used by
:mod:`topoplan.testbed.bench` behind ``topoplan testbed bench``);
:mod:`topoplan.runtime.calibrate`, the library that calibrates a transport on one host (and whose
:func:`~topoplan.runtime.calibrate.fit_costs` this module fits with); and
:mod:`topoplan.commands.calibrate`, the ``topoplan calibrate`` command in front of that
library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..runtime.bench import load_average
from ..cluster import Cluster
from ..ir.schedule import Schedule

if TYPE_CHECKING:
    from ..analysis.cost import CostProfile

__all__ = ["Calibration", "CalibrationSample", "calibration_cases", "fit", "predict",
           "PROBE_ALPHA"]

#: The smallest finite-difference step (s) of the fit in alpha (10% of alpha when larger).
PROBE_ALPHA = 1e-4
#: Pipelined calibration runs: chunks, and seconds per message on the slowest link.
PIPELINE_CHUNKS = 32
STEP_SECONDS = 1.5e-3
#: Direct all-to-all allreduces one after another in the many-ops case.
DIRECT_ROUNDS = 4
#: Bytes of the reduce-only case: large enough to time, small enough for any cache.
REDUCE_BYTES = 4 << 20


@dataclass(frozen=True)
class CalibrationSample:
    """One calibration run: measured time, the simulator's time without per-message costs
    (the reduce bandwidth only), how many alphas its critical path holds at the fit
    (``d time / d alpha``), and the simulator's time with the fitted alpha."""

    label: str
    size: int
    steps: int
    measured_s: float
    base_s: float
    alphas: float
    fitted_s: float | None = None


@dataclass(frozen=True)
class Calibration:
    """Software costs of the testbed's transport, for :func:`topoplan.simulate`.

    ``alpha_s`` is per message and ``op_overhead_s`` per op a rank posts, fitted on
    pipelined runs (the regime of large sizes); ``latency_alpha_s`` the alpha fitted on
    a latency-bound run of small messages, for information; ``reduce_bandwidth`` in bytes/s (``None``: not
    measured); ``load`` the 1-minute load average when it was measured.
    """

    alpha_s: float
    reduce_bandwidth: float | None
    load: float
    samples: tuple[CalibrationSample, ...] = ()
    latency_alpha_s: float | None = None
    op_overhead_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "note": self.note}

    @property
    def profile(self) -> CostProfile:
        """The fitted costs as a profile for :func:`topoplan.simulate`."""
        from ..analysis.cost import CostProfile
        return CostProfile("testbed", alpha_box=self.alpha_s, alpha_network=self.alpha_s,
                           op_overhead=self.op_overhead_s,
                           reduce_bandwidth=self.reduce_bandwidth,
                           description="software costs fitted on the testbed")

    @property
    def planning_profile(self) -> CostProfile:
        """The profile to plan with: :attr:`profile` with the latency-bound alpha where it
        is the larger. A plan's depth is chosen by what a step costs when a rank waits
        for its message; where the pipelined runs hid that cost (alpha 0 over MPI here),
        the planners would otherwise cut a tree into hundreds of steps that each pay it."""
        import dataclasses
        alpha = max(self.alpha_s, self.latency_alpha_s or 0.0)
        return dataclasses.replace(self.profile, alpha_box=alpha, alpha_network=alpha)

    @property
    def note(self) -> str | None:
        """Why ``alpha_s`` is 0, when it is (``None`` otherwise)."""
        if self.alpha_s > 0:
            return None
        runs = [s for s in self.samples if s.label != "cal:latency"]
        if not runs:
            return "alpha 0: no pipelined calibration run was measured"
        worst = min(runs, key=lambda s: s.measured_s / s.base_s)
        if worst.measured_s <= worst.base_s:
            text = (f"alpha 0: {worst.label} took {worst.measured_s * 1e3:.1f} ms, no longer "
                    f"than the links and adds alone ({worst.base_s * 1e3:.1f} ms simulated): "
                    f"per-message costs hid behind transfers, or the emulated links ran faster "
                    f"than shaped (bursts through the shapers)")
        else:
            text = ("alpha 0: the least-squares fit over the pipelined runs put it at its "
                    "bound; their extra time over the links does not grow with their messages")
        lone = next((s for s in self.samples if s.label == "cal:latency"), None)
        if self.latency_alpha_s == 0 and lone is not None:
            text += (f"; the latency-bound run too ({lone.measured_s * 1e3:.2f} ms measured, "
                     f"{lone.base_s * 1e3:.2f} ms simulated)")
        return text


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
    if n > 2:
        # Every rank exchanging with every other at once, DIRECT_ROUNDS times: steps of
        # 2 (n - 1) ops, which the ring and tree (2 and 3 ops a step) cannot tell from alpha.
        from ..runtime.calibrate import direct_schedule
        direct = direct_schedule(n, DIRECT_ROUNDS, "calibrate-direct")
        nbytes = int(STEP_SECONDS * slowest * n * DIRECT_ROUNDS) // 4096 * 4096 or 4096
        cases.append(("cal:direct", nbytes, "schedule", direct))
    return cases


def predict(cluster: Cluster, schedule: Schedule, size: int,
            calibration: Calibration | None = None) -> float:
    """The simulator's time for ``schedule``, with the calibrated software costs if given."""
    from ..analysis.sim import simulate
    if calibration is None:
        return float(simulate(cluster, schedule, size=size, profile="ideal").time_s)
    return float(simulate(cluster, schedule, size=size, profile=calibration.profile).time_s)


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
        ``reduce_bandwidth`` is the reduce case's bytes over its time; ``alpha`` is fitted
        to the pipelined runs by :func:`topoplan.runtime.calibrate.fit_costs` (the code
        ``topoplan calibrate`` fits with): least squares, ``alpha >= 0``, through the simulator on
        ``cluster`` with that reduce bandwidth, re-linearised until it settles.
        ``latency_alpha_s`` is the same fit on the latency-bound run alone.
    """
    from ..runtime.calibrate import fit_costs
    from ..analysis.cost import CostProfile
    from ..analysis.sim import simulate
    reduce_bw = None
    for label, size, kind, _ in cases:
        if kind == "reduce" and measured.get(label, 0) > 0:
            reduce_bw = size / measured[label]
    start = CostProfile("testbed", reduce_bandwidth=reduce_bw)
    runs = [(label, schedule, size, measured[label]) for label, size, kind, schedule in cases
            if kind == "schedule" and schedule is not None and label in measured]
    pipelined = [r for r in runs if r[0] != "cal:latency"]
    latency = [r for r in runs if r[0] == "cal:latency"]
    steps = {"alpha": PROBE_ALPHA, "op_overhead": PROBE_ALPHA / 10}
    fitted: dict[str, tuple[float, float]] = {}  # label -> (fitted_s, d time / d alpha)
    alpha, latency_alpha, op = 0.0, None, 0.0
    if pipelined:
        # The op cost only where a run has steps of many ops to tell it from alpha.
        names = ("alpha", "op_overhead") if any(r[0] == "cal:direct" for r in pipelined) \
            else ("alpha",)
        result = fit_costs(pipelined, start, names, cluster=cluster,
                           min_steps={k: steps[k] for k in names})
        alpha = result.values["alpha"]
        op = result.values.get("op_overhead", 0.0)
        fitted.update({s.label: (s.fitted_s, s.sensitivity["alpha"]) for s in result.samples})
    if latency:
        result = fit_costs(latency, start, ("alpha",), cluster=cluster, min_steps=steps)
        latency_alpha = result.values["alpha"]
        fitted.update({s.label: (s.fitted_s, s.sensitivity["alpha"]) for s in result.samples})
    samples = []
    for label, schedule, size, seconds in runs:
        base = float(simulate(cluster, schedule, size=size, profile=start).time_s)
        steps_of = max(len(schedule.steps_of(r)) for r in range(schedule.nranks))
        fit_s, alphas = fitted[label]
        samples.append(CalibrationSample(label, size, steps_of, seconds, base, alphas, fit_s))
    return Calibration(alpha, reduce_bw, load_average(), tuple(samples), latency_alpha, op)
