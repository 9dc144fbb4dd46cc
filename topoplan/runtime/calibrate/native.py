"""The transport's own collectives over groups of ranks: measured, then fitted into a
profile's ``native`` section (:class:`~topoplan.analysis.cost.NativeCost`).

A composed plan runs native steps (IR v3): the transport's allreduce, reduce-scatter or
allgather over a sub-communicator of a group. To price them, :func:`native_cases` asks
for each of those collectives over groups of 2, 4, ... and all ranks, at a few sizes;
:func:`measure_native` runs them with every rank in a group of consecutive ranks, all
groups at once (as a composed plan's in-box steps run), each case timed like the
executor's (the slowest rank's time of a block of back-to-back calls, the median over
repeats, the cases taking turns); :func:`fit_native` fits per collective, by least
squares on the relative error with every term >= 0::

    time = alpha + (g - 1) * alpha_per_rank + bus(g) * bytes / bandwidth

(``bus(g)``: nccl-tests' bus factor, :func:`topoplan.analysis.cost.native_bus_factor`).
Sub-communicators are MPI's ``Comm.Split`` and torch.distributed's ``new_group``; a
transport without them (threads, NCCL through CuPy here) has no native section, and
its profile prices native steps as point-to-point rings.
"""

from __future__ import annotations

import math
import statistics
from functools import partial
from typing import Any, Callable, Mapping, Sequence

from ...analysis.cost import NativeCost, native_bus_factor
from ...errors import TopoplanError
from ..transports.base import NoNative
from .cases import Case, _bytes_text
from .measuring import Sample, _Arrays, _calls, _observed

__all__ = ["NATIVE_COLLECTIVES", "NATIVE_SIZES", "NATIVE_RULE", "group_sizes", "native_cases",
           "split", "measure_native", "fit_native"]

#: The collectives measured (a composed plan's native steps).
NATIVE_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
#: Bytes of each collective's buffer (an allreduce's, a reduce-scatter's input, an
#: allgather's output): latency-bound, past eager limits, bandwidth-bound.
NATIVE_SIZES = (4 << 10, 256 << 10, 4 << 20)
#: How the native section is fitted (printed and recorded).
NATIVE_RULE = ("per collective: time = alpha + (g - 1) alpha_per_rank + bus(g) bytes / "
               "bandwidth (bus(g): 2 (g - 1) / g for allreduce, (g - 1) / g for "
               "reduce_scatter and allgather), least squares on the relative error, every "
               "term >= 0; measured with every rank in a group of g consecutive ranks, all "
               "groups at once")


def group_sizes(nranks: int) -> tuple[int, ...]:
    """The group sizes measured on ``nranks`` ranks: 2, 4, 8, ... and ``nranks``."""
    sizes = {nranks}
    g = 2
    while g < nranks:
        sizes.add(g)
        g *= 2
    return tuple(sorted(s for s in sizes if s >= 2))


def native_cases(nranks: int, sizes: Sequence[int] = NATIVE_SIZES) -> list[Case]:
    """One ``native`` case per collective, group size and buffer size (whole float32
    parts per member).

    Raises
    ------
    TopoplanError
        For fewer than 2 ranks.
    """
    n = int(nranks)
    if n < 2:
        raise TopoplanError(f"native collectives need at least 2 ranks, got {n}")
    cases = []
    for collective in NATIVE_COLLECTIVES:
        for g in group_sizes(n):
            for size in sizes:
                size = max(4 * g, size // (4 * g) * 4 * g)
                cases.append(Case(f"native {collective} g{g} {_bytes_text(size)}", "native",
                                  size, what=f"{n // g} x {g} ranks, {_bytes_text(size)} "
                                             f"buffer", collective=collective, group=g))
    return cases


def split(transport: Any, g: int) -> Any:
    """The sub-transport of this rank's group of ``g`` consecutive ranks (``None`` for a
    rank left out, past the last whole group); collective over all ranks.

    Raises
    ------
    NoNative
        For a transport that makes no sub-communicators (threads, NCCL through CuPy).
    """
    n, rank = transport.size, transport.rank
    member = rank < (n // g) * g
    name = getattr(transport, "name", "")
    if name == "mpi":
        from mpi4py import MPI as mpi

        from ..transports.mpi import MPI
        sub = transport.comm.Split(rank // g if member else mpi.UNDEFINED, rank)
        return MPI(sub, dup=False) if member else None
    if name.startswith("torch"):
        import torch.distributed as dist

        from ..transports.torch import Torch
        mine = None
        for first in range(0, (n // g) * g, g):
            group = dist.new_group(list(range(first, first + g)))
            if first <= rank < first + g:
                mine = group
        return Torch(mine) if member else None
    raise NoNative(f"the {name or type(transport).__name__} transport makes no "
                   "sub-communicators here")


def _run(sub: Any, kit: _Arrays, collective: str, count: int, g: int) -> tuple[Any, int]:
    """A call of ``collective`` on ``sub`` (buffers of ones checked once, then zeros: sums
    of repeated calls would grow) and the wrong elements of its first result."""
    part = count // g
    if collective == "allreduce":
        buf = kit.zeros(count)
        buf[...] = 1
        sub.native_allreduce(buf)
        kit.sync()
        wrong = _count(kit, buf, g)
        buf[...] = 0
        return partial(sub.native_allreduce, buf), wrong
    if collective == "reduce_scatter":
        inp, out = kit.zeros(count), kit.zeros(part)
        inp[...] = 1
        sub.native_reduce_scatter(inp, out)
        kit.sync()
        wrong = _count(kit, out, g)
        inp[...] = 0
        return partial(sub.native_reduce_scatter, inp, out), wrong
    inp, out = kit.zeros(part), kit.zeros(count)
    inp[...] = 1
    sub.native_allgather(inp, out)
    kit.sync()
    return partial(sub.native_allgather, inp, out), _count(kit, out, 1)


def _count(kit: _Arrays, buf: Any, value: int) -> int:
    import numpy as np
    values = buf.cpu().numpy() if kit.kind in ("torch", "torch-cuda") else buf
    return int(np.count_nonzero(np.asarray(values) != value))


def measure_native(transport: Any, cases: Sequence[Case], *, repeats: int = 15,
                   block_s: float = 0.04, min_calls: int = 3, max_calls: int = 500,
                   arrays: str | None = None,
                   progress: Callable[[str], None] | None = None
                   ) -> tuple[list[Sample], list[str]]:
    """Time every ``native`` case on ``transport``; collective (every rank calls it).

    Each case runs in groups of ``case.group`` consecutive ranks, all groups at once; a
    sample is the median over ``repeats`` blocks of the slowest rank's seconds per call
    (as :func:`~topoplan.runtime.calibrate.measure`, whose parameters these are).

    Returns
    -------
    (list of Sample, list of str)
        The samples of the collectives the transport has, and what was left out and
        why (a transport without sub-communicators: every case; a backend without a
        reduce-scatter: that collective's). The same on every rank.

    Raises
    ------
    TopoplanError
        When a collective computes a wrong result (on every rank).
    """
    from ..bench import array_kind

    n, rank = transport.size, transport.rank
    kit = _Arrays(arrays or array_kind(transport))

    def say(text: str) -> None:
        if progress is not None and rank == 0:
            progress(text)

    subs: dict[int, Any] = {}
    skipped: list[str] = []
    kept: list[Case] = []
    runners: list[Callable[[int], float]] = []
    for case in cases:
        if case.kind != "native":
            raise TopoplanError(f"calibration case {case.label!r} is not a native case")
        g = case.group
        if g not in subs:
            try:
                subs[g] = split(transport, g)
            except NoNative as exc:
                return [], [f"native collectives not measured: {exc}"]
        sub = subs[g]
        runner: Callable[[int], float] = _idle
        wrong = 0
        missing = ""
        if sub is not None:
            try:
                fn, wrong = _run(sub, kit, case.collective, case.size // 4, g)
                runner = _calls(fn, kit)
            except NoNative as exc:
                missing = str(exc)
        # Every rank learns whether the collective exists and is right (a rank left out
        # of every group knows neither).
        if transport.allreduce_max(1.0 if missing else 0.0):
            note = f"native {case.collective} not measured: {missing or 'not on every rank'}"
            if note not in skipped:
                skipped.append(note)
            continue
        if transport.allreduce_max(float(wrong)):
            raise TopoplanError(f"calibration case {case.label!r}: the transport's own "
                                f"{case.collective} computed {int(wrong)} wrong elements on "
                                "some rank")
        kept.append(case)
        runners.append(runner)
    calls = []
    for case, runner in zip(kept, runners):
        transport.barrier()
        runner(1)
        one = transport.allreduce_max(runner(1))
        calls.append(int(min(max_calls, max(min_calls, 1, block_s // max(one, 1e-9)))))
        say(f"{case.label}: {one * 1e6:.1f} us a call, {calls[-1]} call"
            f"{'s' if calls[-1] > 1 else ''} a block")
    times: list[list[float]] = [[] for _ in kept]
    for rep in range(repeats):
        for i in [(rep + k) % len(kept) for k in range(len(kept))] if kept else []:
            transport.barrier()
            times[i].append(_observed(runners[i], transport.allreduce_max(runners[i](calls[i]))))
        say(f"native: repeat {rep + 1}/{repeats} done")
    return ([Sample(case, statistics.median(t), tuple(t), k)
             for case, t, k in zip(kept, times, calls)], skipped)


def _idle(k: int) -> float:
    """A rank in no group: nothing to time."""
    return 0.0


def fit_native(samples: Sequence[Sample]) -> tuple[tuple[tuple[str, NativeCost], ...],
                                                     dict[str, Any]]:
    """The ``native`` section from measured ``native`` samples (see the module notes).

    Returns
    -------
    (tuple of (str, NativeCost), dict)
        The fitted costs by collective, and the record of the fit: the rule, each
        sample measured, fitted and its residual, the rms residual, and what the samples
        could not pin (``alpha_per_rank`` with one group size; ``bandwidth`` when no time
        grew with the bytes: then the fastest bus bandwidth seen, a bound).
    """
    import numpy as np
    from scipy.optimize import nnls

    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        if s.case.kind == "native" and s.measured_s > 0:
            by_kind.setdefault(s.case.collective, []).append(s)
    costs: list[tuple[str, NativeCost]] = []
    rows: list[dict[str, Any]] = []
    unidentified: list[str] = []
    for kind in NATIVE_COLLECTIVES:
        found = by_kind.get(kind)
        if not found:
            continue
        groups = {s.case.group for s in found}
        bus = np.array([native_bus_factor(kind, s.case.group) * s.case.size for s in found])
        t = np.array([s.measured_s for s in found])
        columns = [np.ones(len(found)), np.array([s.case.group - 1.0 for s in found]), bus]
        if len(groups) < 2:
            columns[1] = np.zeros(len(found))
            unidentified.append(f"{kind}.alpha_per_rank (one group size)")
        matrix = np.stack(columns, axis=1) / t[:, None]
        x, _ = nnls(matrix, np.ones(len(found)))
        alpha, per_rank, inverse = (float(v) for v in x)
        if inverse > 0:
            bandwidth = 1.0 / inverse
        else:
            bandwidth = float(np.max(bus / t))
            unidentified.append(f"{kind}.bandwidth (no time grew with the bytes: the fastest "
                                f"bus bandwidth seen)")
        cost = NativeCost(alpha=alpha, bandwidth=bandwidth, alpha_per_rank=per_rank)
        costs.append((kind, cost))
        for s in found:
            fitted = cost.time(kind, s.case.group, s.case.size)
            rows.append({"case": s.label, "what": s.case.what, "collective": kind,
                         "group": s.case.group, "bytes": s.case.size,
                         "measured_us": _us(s.measured_s), "fitted_us": _us(fitted),
                         "residual_pct": round(100 * (s.measured_s - fitted) / s.measured_s, 1),
                         "calls": s.calls, "repeats": len(s.repeats_s),
                         "spread_pct": round(100 * s.spread, 1)})
    rms = (math.sqrt(sum(r["residual_pct"] ** 2 for r in rows) / len(rows)) if rows else None)
    record: dict[str, Any] = {"rule": NATIVE_RULE, "samples": rows,
                              "rms_residual_pct": None if rms is None else round(rms, 1),
                              "unidentified": unidentified}
    return tuple(costs), record


def native_record(costs: Sequence[tuple[str, NativeCost]], record: Mapping[str, Any],
                  skipped: Sequence[str]) -> dict[str, Any]:
    """``record`` with what was not measured (``skipped``) and the fitted values in
    microseconds and GB/s (for the profile's ``calibration.native``)."""
    out = dict(record)
    out["skipped"] = list(skipped)
    out["fitted"] = {kind: {"alpha_us": _us(c.alpha), "alpha_per_rank_us": _us(c.alpha_per_rank),
                            "bandwidth_GBps": float(f"{c.bandwidth / 1e9:.6g}")}
                     for kind, c in costs}
    return out


def _us(seconds: float) -> float:
    return float(f"{seconds * 1e6:.6g}")
