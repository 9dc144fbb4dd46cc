"""The cost profile of this machine: :func:`fit_profile` from samples, :func:`calibrate`
the whole run (measure, then fit).

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
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from ...analysis.cost import CostProfile
from ...errors import TopoplanError
from .cases import calibration_cases
from .fitting import fit_costs
from .measuring import Sample, measure
from .probe import host_cores, load_average, small_limit, transport_info

__all__ = ["HOST_PARAMETERS", "SPLIT_RULE", "FULL", "QUICK", "fit_profile", "calibrate",
           "Measured", "measure_all", "fit_measured"]

#: How ``alpha`` and ``step_overhead`` are told apart (printed and recorded).
SPLIT_RULE = ("on one host executor runs fix only the per-step cost (step_overhead + alpha); "
              "alpha := the transport's one-way latency from ping-pongs of 1 and 4 messages "
              "per trip (the line's value at 0 messages), clamped to [0, per-step cost]; "
              "step_overhead := per-step cost - alpha; with a small-message protocol "
              "(MPI's eager sends) that alpha is the small messages', and larger ones pay "
              "it plus the extra their runs showed")

#: Fitted to the executor runs on the host: the per-step cost goes into step_overhead
#: first (alpha 0) and is split afterwards (:data:`SPLIT_RULE`).
HOST_PARAMETERS = ("step_overhead", "op_overhead", "call_overhead", "host_bandwidth")
#: Repeats and block seconds of a full and a quick calibration.
FULL = (15, 0.04)
QUICK = (5, 0.01)


def fit_profile(samples: Sequence[Sample], *, name: str = "calibrated", nranks: int,
                transport: str = "?", context: Mapping[str, Any] | None = None,
                iterations: int = 4, cores: int | None = None,
                small_max: int | None = None, native_samples: Sequence[Sample] = (),
                native_skipped: Sequence[str] = ()) -> CostProfile:
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
    native_samples : sequence of Sample, optional
        The transport's own collectives over groups
        (:func:`~topoplan.runtime.calibrate.native.measure_native`): fitted into the
        profile's ``native`` section (:func:`~topoplan.runtime.calibrate.native.fit_native`).
    native_skipped : sequence of str, optional
        What was not measured of them, and why (recorded).

    Returns
    -------
    CostProfile
        ``reduce_bandwidth`` from the adds alone; ``op_overhead``, ``call_overhead``,
        ``host_bandwidth`` and the per-step cost fitted (:func:`~.fitting.fit_costs`) on
        :meth:`CostProfile.host_cluster`; ``alpha`` and ``step_overhead`` split from the
        per-step cost by :data:`SPLIT_RULE`. ``calibration`` records how, where and when,
        and every sample measured, fitted and its residual (with the final profile).

    Raises
    ------
    TopoplanError
        When a kind of sample is missing.
    """
    from ...analysis.sim import simulate

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
    result = fit_costs([(s.label, s.case.schedule, s.case.size, s.measured_s) for s in runs
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
    if native_samples or native_skipped:
        from .native import fit_native, native_record
        costs, native = fit_native(native_samples)
        record["native"] = native_record(costs, native, native_skipped)
        profile = replace(profile, native_costs=costs)
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
        See :func:`fit_profile`; with a ``native`` section where the transport makes
        sub-communicators (MPI, torch.distributed).

    Examples
    --------
    >>> from topoplan.runtime.transports import Local
    >>> profiles = Local.launch(4, lambda t: calibrate(t, quick=True))  # doctest: +SKIP
    >>> print(profiles[0].summary())                                    # doctest: +SKIP
    """
    measured = measure_all(transport, quick=quick, timeout=timeout, progress=progress)
    if root is not None and transport.rank != root:
        return None
    return fit_measured(transport, measured, name=name, progress=progress)


@dataclass(frozen=True)
class Measured:
    """What one calibration run measured, the same on every rank but ``load_average``
    (each rank's own probe): :func:`fit_measured` makes it a profile."""

    samples: tuple[Sample, ...]
    native_samples: tuple[Sample, ...]
    native_skipped: tuple[str, ...]
    load_average: tuple[float, ...]
    repeats: int


def measure_all(transport: Any, *, quick: bool = False, timeout: float = 60.0,
                progress: Callable[[str], None] | None = None) -> Measured:
    """The measuring half of :func:`calibrate`; collective (every rank calls it).

    Split from the fit so that a caller that fits on one rank
    (:func:`topoplan.runtime.calibrate.cache.job_profile`) knows that an error past this
    point is that rank's alone, and can tell the others instead of leaving them waiting.
    """
    from .native import measure_native, native_cases
    cases = calibration_cases(transport.size)
    repeats, block = QUICK if quick else FULL
    load = [load_average()]
    samples = measure(transport, cases, repeats=repeats, block_s=block, timeout=timeout,
                      progress=progress)
    natives, skipped = measure_native(transport, native_cases(transport.size), repeats=repeats,
                                      block_s=block, progress=progress)
    load.append(load_average())
    return Measured(tuple(samples), tuple(natives), tuple(skipped), tuple(load), repeats)


def fit_measured(transport: Any, measured: Measured, *, name: str = "calibrated",
                 progress: Callable[[str], None] | None = None) -> CostProfile:
    """The fitting half of :func:`calibrate` (:func:`fit_profile` with what this host and
    transport say of themselves); on one rank, no collective."""
    if progress is not None and transport.rank == 0:
        progress("fitting")
    return fit_profile(measured.samples, name=name, nranks=transport.size,
                       transport=transport_info(transport),
                       context={"load_average": list(measured.load_average),
                                "repeats": measured.repeats},
                       cores=host_cores(transport), small_max=small_limit(transport),
                       native_samples=measured.native_samples,
                       native_skipped=measured.native_skipped)
