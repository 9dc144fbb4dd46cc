"""Least squares through the simulator: :func:`fit_costs` finds the costs that explain
measured times.

:func:`fit_costs` fits costs to executor samples by least squares (bounds >= 0) against the
simulator itself: each sample's time is linearised in the parameters by finite
differences of :func:`topoplan.simulate` on the machine as a cluster
(:meth:`CostProfile.host_cluster`) and the fit re-linearised a few times (Gauss-Newton).
Times are fitted relative to their size, so microsecond and millisecond cases count alike.
:func:`topoplan.runtime.calibrate.fit_profile` fits with it a host's per-step cost,
``op_overhead``, ``call_overhead`` and ``1 / host_bandwidth`` (one rank's copy rate with a
core to itself; the chain of one pair at a time pins it); the testbed
(:mod:`topoplan.testbed.calibrate`) fits its ``alpha`` with the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ..._compat import moved_names
from ...analysis.cost import CostProfile
from ...errors import TopoplanError
from ...ir.schedule import Schedule

__all__ = ["PARAMETERS", "FittedSample", "Fit", "fit_costs"]

#: ``fit`` was renamed: it clashed with the class :class:`Fit` but for case.
__getattr__ = moved_names(__name__, {"fit": "topoplan.runtime.calibrate.fitting:fit_costs"})

#: What :func:`fit_costs` can fit: profile costs in seconds, and two bandwidths, fitted as their
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
    """What :func:`fit_costs` found.

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


def fit_costs(cases: Sequence[tuple[str, Schedule, int, float]], start: CostProfile,
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

    from ...analysis.sim import simulate

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
