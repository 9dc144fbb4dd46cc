"""Fitting the faults to a measured curve: each hypothesis's cluster priced at every
measured size, its parameter chosen on its grid, and the hypotheses ranked by how well
they explain the whole curve.

The score of a hypothesis is the root mean square of ``log(measured / expected)`` over
the sizes (0: a perfect fit; 0.05: about 5 % off on average), plus :data:`PENALTY` for
each thing the fit chose (the fault and where, its parameter), so that the healthy
cluster wins a tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...cluster.model import Cluster
from ...errors import TopoplanError
from ..native.nccl import nccl_time
from .hypotheses import KINDS, Hypothesis, hypotheses
from .logs import BenchLog, Point, bus_factor

__all__ = ["Predictor", "nccl_predictor", "Fit", "Diagnosis", "diagnose", "PENALTY", "NOISE",
           "BANDS", "DoctorError"]

#: Added to the score per thing a fit chose (the fault and where; its parameter).
PENALTY = 0.01
#: A score below this is within the run-to-run noise of a benchmark (about 5 %).
NOISE = 0.05
#: The size bands the explanation speaks of (bytes): small below 64 KiB, large from 16 MiB.
BANDS = (("small", 0, 64 << 10), ("mid", 64 << 10, 16 << 20), ("large", 16 << 20, 1 << 62))

#: ``predict(cluster, algorithm, collective, sizes) -> seconds per size``: what an
#: algorithm takes on a cluster. The doctor prices the ``nccl`` row itself
#: (:func:`nccl_predictor`); a planned schedule needs the planners, a layer above this
#: one, so the caller hands it in (``topoplan doctor`` re-plans with
#: :func:`topoplan.plan` and prices with :func:`topoplan.simulate`).
Predictor = Callable[[Cluster, str, str, Sequence[int]], Sequence[float]]


class DoctorError(TopoplanError, ValueError):
    """A log and a cluster that do not go together (rank counts differ, nothing to
    price), with what to give instead."""


def nccl_predictor(cluster: Cluster, algorithm: str, collective: str,
                   sizes: Sequence[int]) -> list[float]:
    """The ``nccl`` row: :func:`~topoplan.analysis.native.nccl.nccl_time` at each size
    (the version and forcing of the enclosing ``nccl_settings``)."""
    return [nccl_time(cluster, int(size), collective).time_s for size in sizes]


@dataclass(frozen=True)
class Fit:
    """A hypothesis at its best parameter: the expected time per measured size, its
    score, and what it explains."""

    kind: str
    label: str
    parameter: str | None
    value: float | None
    score: float
    rms: float
    expected_s: tuple[float, ...]
    stands_for: str
    explains: str
    check: str

    def to_dict(self, points: Sequence[Point], busbw: Callable[[int, float], float]
                ) -> dict[str, Any]:
        return {"kind": self.kind, "label": self.label, "parameter": self.parameter,
                "value": self.value, "score": self.score, "rms": self.rms,
                "stands_for": self.stands_for, "explains": self.explains,
                "check": self.check, "meaning": KINDS[self.kind][0],
                "expected": [{"algorithm": p.algorithm, "size": p.size, "time_us": t * 1e6,
                              "busbw_GBps": busbw(p.size, t) / 1e9}
                             for p, t in zip(points, self.expected_s)]}


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found for the curves it fitted (``algorithm``: their names
    joined by `` + ``): the measured points (curve by curve, each smallest size first),
    the healthy fit, every fit best first, and the verdict in one sentence."""

    algorithm: str
    collective: str
    nranks: int
    points: tuple[Point, ...]
    healthy: Fit
    fits: tuple[Fit, ...]
    verdict: str
    notes: tuple[str, ...] = field(default=())

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(p.size for p in self.points)

    def busbw(self, size: int, time_s: float) -> float:
        """nccl-tests' bus bandwidth of ``size`` bytes in ``time_s`` (bytes/s)."""
        return size / time_s * bus_factor(self.nranks, self.collective) if time_s > 0 else 0.0

    def to_dict(self, top: int = 3) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "collective": self.collective,
                "nranks": self.nranks, "verdict": self.verdict, "notes": list(self.notes),
                "algorithms": sorted({p.algorithm for p in self.points},
                                     key=[p.algorithm for p in self.points].index),
                "measured": [{"algorithm": p.algorithm, "size": p.size,
                              "time_us": p.time_s * 1e6,
                              "busbw_GBps": (p.busbw or 0) / 1e9, "line": p.line}
                             for p in self.points if p.time_s],
                "healthy": self.healthy.to_dict(self.points, self.busbw),
                "best": [f.to_dict(self.points, self.busbw) for f in self.fits[:top]],
                "all": [{"kind": f.kind, "label": f.label, "score": f.score, "rms": f.rms}
                        for f in self.fits]}


def _rms(measured: Sequence[float], expected: Sequence[float]) -> float:
    logs = [math.log(m / e) for m, e in zip(measured, expected) if m > 0 and e > 0]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else math.inf


def _band_ratios(sizes: Sequence[int], numerator: Sequence[float],
                 denominator: Sequence[float]) -> dict[str, float]:
    """Per band, the geometric mean of ``numerator / denominator`` over its sizes:
    times in, a bandwidth ratio out (``denominator`` at half the bandwidth: 0.5)."""
    out = {}
    for name, low, high in BANDS:
        ratios = [n / d for s, n, d in zip(sizes, numerator, denominator)
                  if low <= s < high and n > 0 and d > 0]
        if ratios:
            out[name] = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return out


def describe_bands(ratios: dict[str, float]) -> str:
    """``small x1.00, mid x0.62, large x0.25 of the healthy bandwidth: bandwidth-bound``."""
    if not ratios:
        return ""
    text = ", ".join(f"{name} sizes x{r:.2f}" for name, r in ratios.items())
    first, last = next(iter(ratios.values())), list(ratios.values())[-1]
    if all(r >= 0.9 for r in ratios.values()):
        what = "no size slower than healthy"
    elif first < 0.8 * last:
        what = "latency-bound: the small sizes slowed most"
    elif last < 0.8 * first:
        what = "bandwidth-bound: the large sizes slowed most"
    else:
        what = "every size slowed alike"
    return f"{text} of the healthy bandwidth ({what})"


def diagnose(log: BenchLog, cluster: Cluster, *, algorithm: str | None = None,
             predict: Predictor | None = None, nranks: int | None = None
             ) -> Diagnosis:
    """Rank the faults of :func:`~topoplan.analysis.doctor.hypotheses.hypotheses` by how
    well each explains ``log``'s measured curve on ``cluster``.

    Parameters
    ----------
    log : BenchLog
        The measured curve (:func:`~topoplan.analysis.doctor.logs.read_log`).
    cluster : Cluster
        The cluster as it should be: every hypothesis is a change of it.
    algorithm : str, optional
        Which of the log's curves: one name, several joined by commas, or ``all``
        (default: every curve that can be priced). Several curves are fitted together:
        each hypothesis is one cluster that must explain every curve at once, so a log
        of plans that load the links differently (a ring in two orders, a hierarchical
        plan) tells apart faults that one curve cannot.
    predict : Predictor, optional
        Prices an algorithm other than ``nccl`` (a planned schedule); ``nccl`` is
        priced with :func:`nccl_predictor` always.
    nranks : int, optional
        The rank count, over what the log states.

    Returns
    -------
    Diagnosis

    Raises
    ------
    DoctorError
        The log's rank count is not the cluster's, or its curve cannot be priced.
    DoctorLogError
        The log has no usable row.

    Notes
    -----
    Cost: one price per hypothesis, grid value and size (some 30 clusters x 30 sizes);
    the ``nccl`` row builds its search once per cluster and prices a size in a few
    table look-ups, a planned schedule costs one simulation per size.
    """
    stated = nranks or log.nranks
    if stated is not None and stated != cluster.nranks:
        raise DoctorError(f"{log.path} has {stated} ranks but cluster {cluster.name!r} has "
                          f"{cluster.nranks} GPUs: give the cluster file of the machine that "
                          "ran it (or --nranks if the log's count is wrong)")
    notes = list(log.notes)
    if stated is None:
        notes.append(f"the log states no rank count: the cluster's {cluster.nranks} assumed")
    log = log.with_ranks(cluster.nranks)
    chosen = _curves(log, algorithm, predict)
    if len(chosen) > 1:
        notes.append(f"{len(chosen)} curves fitted together ({', '.join(chosen)}): each "
                     "hypothesis explains all of them at once")

    def price(changed: Cluster, name: str, sizes: Sequence[int]) -> list[float]:
        priced: Predictor = nccl_predictor if name == "nccl" or predict is None else predict
        return [float(t) for t in priced(changed, name, log.collective, sizes)]

    curves = [(name, log.curve(name)) for name in chosen]
    points = tuple(p for _, curve in curves for p in curve)
    sizes = [p.size for p in points]
    measured = [p.time_s or 0.0 for p in points]
    healthy_s: list[float] | None = None
    fits: list[Fit] = []
    for hyp in hypotheses(cluster):
        tried = []
        for value in hyp.values:
            changed = hyp.build(value)
            expected = [t for name, curve in curves
                        for t in price(changed, name, [p.size for p in curve])]
            tried.append((_rms(measured, expected), value, expected))
        rms, value, expected = min(tried, key=lambda t: t[0])
        if healthy_s is None:  # the first hypothesis is the healthy cluster
            healthy_s = expected
        explains = describe_bands(_band_ratios(sizes, healthy_s, expected))
        fits.append(Fit(hyp.kind, hyp.label(value), hyp.parameter, value,
                        rms + PENALTY * hyp.free_parameters, rms, tuple(expected),
                        hyp.stands_for, explains, KINDS[hyp.kind][1]))
    ranked = sorted(fits, key=lambda f: (f.score, f.kind != "healthy"))
    healthy = fits[0]
    measured_bands = describe_bands(_band_ratios(sizes, healthy.expected_s, measured))
    best_fit = ranked[0]
    if best_fit.kind == "healthy":
        verdict = (f"fits the healthy cluster within noise (RMS {healthy.rms:.1%} off)"
                   if healthy.rms <= NOISE else
                   f"no fault tried explains it better than the healthy cluster, which is "
                   f"{healthy.rms:.0%} off (RMS): the model may be off for this machine, or "
                   "the fault is not among those tried")
    else:
        verdict = (f"best explained by {best_fit.label} (RMS {best_fit.rms:.1%} off, the "
                   f"healthy cluster {healthy.rms:.1%})")
        tied = [f.label for f in ranked[1:] if f.score - best_fit.score < 0.005]
        if tied:
            verdict += f"; as good a fit: {', '.join(tied)} (the curve cannot tell them apart)"
        if best_fit.rms > 3 * NOISE:
            verdict += ("; no hypothesis fits within noise: the fault may be another, or "
                        "the model off for this machine")
    notes.append(f"measured against healthy: {measured_bands}")
    return Diagnosis(" + ".join(chosen), log.collective, cluster.nranks, points, healthy,
                     tuple(ranked), verdict, tuple(notes))


def _curves(log: BenchLog, algorithm: str | None, predict: Predictor | None) -> list[str]:
    """The curves of ``log`` that :func:`diagnose` fits: ``algorithm`` (a name, names
    joined by commas, ``all`` or None: every curve that can be priced)."""
    names = [a for a in log.algorithms if a != "native"]
    if algorithm is None or algorithm == "all":
        chosen = [a for a in names if a == "nccl" or predict is not None]
        if not chosen:
            raise DoctorError(f"{log.path}: no curve topoplan can price "
                              f"({', '.join(names) or 'only native rows'})")
        return chosen
    chosen = _split(algorithm, log.algorithms)
    for name in chosen:
        if name not in log.algorithms:
            raise DoctorError(f"{log.path} has no {name!r} rows; it has "
                              f"{', '.join(log.algorithms)}")
        if name != "nccl" and predict is None:
            raise DoctorError(f"{name!r}: a planned schedule needs a predictor (the planners "
                              "re-plan it); only 'nccl' is priced here")
    return chosen


def _split(algorithm: str, known: Sequence[str]) -> list[str]:
    """``"ring,ring:0,2,1,3,mcf"`` -> ``["ring", "ring:0,2,1,3", "mcf"]``: a ring order's
    commas belong to it (the names of ``known`` are taken whole where they match)."""
    if algorithm in known:
        return [algorithm]
    out: list[str] = []
    for part in algorithm.split(","):
        part = part.strip()
        if out and part.isdigit() and out[-1].startswith("ring:"):
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out
