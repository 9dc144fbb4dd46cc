"""Benchmarking a schedule for real: the core of ``topoplan bench`` and the scripts.

:func:`run_bench` replays a schedule over a transport at every size (collective: all
ranks call it) and returns nccl-tests rows (:class:`BenchRow`); :func:`format_rows`
prints them as nccl-tests does::

    size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong

``#wrong`` comes from a real check: every size is first reduced from an integer-valued
pattern (:func:`pattern`) whose sum (:func:`expected_sum`) is exact in the chosen
dtype, and compared element by element. The testbed's workers, the calibration runs and
``scripts/bench_executor.py`` check with the same pattern. :func:`predict_rows` adds the
simulator's time for each size on the machine a calibrated profile was measured on.
busbw is algbw times :func:`bus_factor` (nccl-tests' convention, 0 for one rank).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .errors import TopoplanError
from .schedule import Schedule
from .units import bus_factor

__all__ = ["BenchRow", "run_bench", "format_rows", "predict_rows", "bus_factor", "pattern",
           "expected_sum", "count_wrong", "DTYPES", "ITEMSIZE"]

DTYPES = ("float32", "float64", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One size of a benchmark; times are the slowest rank's mean, in microseconds."""

    size: int
    count: int
    type: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int
    iters: int
    native_time_us: float | None = None
    native_algbw: float | None = None
    native_busbw: float | None = None
    native_wrong: int | None = None
    predicted_us: float | None = None
    measured_over_predicted: float | None = None

    @property
    def ratio(self) -> float | None:
        """The schedule's bandwidth over the native allreduce's (algbw and busbw give the
        same ratio; algbw's holds for one rank too, where busbw is 0)."""
        if self.native_algbw is None or not self.native_algbw:
            return None
        return self.algbw / self.native_algbw


def pattern(index: Any, rank: int) -> Any:
    """Rank ``rank``'s check data at elements ``index`` (an integer ``arange`` of numpy,
    torch or cupy): ``index % 7 + rank % 3``. Small integers, so that a sum over up to 256
    ranks is exact in float16 (32 in bfloat16) and any element lost, doubled or misplaced
    shows (a chunk shifted by a multiple of 7 elements aside)."""
    return index % 7 + rank % 3


def expected_sum(index: Any, nranks: int) -> Any:
    """The allreduce of every rank's :func:`pattern` at elements ``index``."""
    return (index % 7) * nranks + sum(r % 3 for r in range(nranks))


def _make_buffer(count: int, dtype: str, use_torch: bool) -> tuple[Any, Callable]:
    """A buffer and a function that fills it with the check pattern."""
    if use_torch or dtype == "bfloat16":
        import torch
        buf = torch.empty(count, dtype=getattr(torch, dtype))

        def fill(rank: int | None) -> None:
            if rank is None:
                buf.zero_()
            else:
                buf.copy_(pattern(torch.arange(count), rank))

        return buf, fill
    import numpy as np
    arr = np.empty(count, dtype=dtype)

    def fill_np(rank: int | None) -> None:
        arr[...] = 0 if rank is None else pattern(np.arange(count), rank)

    return arr, fill_np


def _sum_over_ranks(transport: Any, count: int, use_torch: bool) -> int:
    """A count summed over ranks with the transport's own allreduce (float64 is exact here)."""
    import numpy as np
    total = np.array([count], dtype=np.float64)
    if use_torch:
        import torch
        tensor = torch.from_numpy(total)
        transport.native_allreduce(tensor)
        return int(tensor[0])
    transport.native_allreduce(total)
    return int(total[0])


def count_wrong(buf: Any, nranks: int) -> int:
    """Elements of ``buf`` (numpy or torch) that differ from :func:`expected_sum`."""
    import numpy as np
    values = buf.float().numpy() if hasattr(buf, "numpy") and hasattr(buf, "float") else buf
    count = values.shape[0]
    expected = expected_sum(np.arange(count), nranks)
    return int(np.count_nonzero(np.asarray(values, dtype=np.float64) != expected))


def _time(fn: Callable[[], Any], transport: Any, iters: int) -> float:
    transport.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return transport.allreduce_max((time.perf_counter() - t0) / iters)


def run_bench(schedule: Schedule, transport: Any, sizes: Sequence[int], *,
              dtype: str = "float32", baseline: bool = False, iters: int | None = None,
              warmup: int = 1, seconds_per_size: float = 0.3, max_iters: int = 200,
              timeout: float = 60.0, use_torch: bool = False) -> list[BenchRow]:
    """Replay ``schedule`` over ``transport`` for every size; collective (all ranks call it).

    Parameters
    ----------
    schedule : Schedule
    transport : Transport
    sizes : sequence of int
        Message sizes in bytes (rounded down to whole elements).
    dtype : str
        One of float32, float64, float16, bfloat16 (bfloat16 uses torch tensors).
    baseline : bool
        Also time the transport's own allreduce on the same buffer.
    iters : int, optional
        Timed iterations per size; by default as many as fit ``seconds_per_size``
        (at least 2, at most ``max_iters``), judged from the warm-up.
    warmup : int
        Untimed runs per size, after the correctness check.
    timeout : float
        The executor's per-step timeout.
    use_torch : bool
        Use torch tensors as buffers (the torch transport's native form).

    Returns
    -------
    list of BenchRow
        The same rows on every rank. ``wrong`` is the number of wrong elements summed
        over all ranks (as nccl-tests counts them); timings are the slowest rank's.
    """
    from .executor import Allreduce

    if dtype not in DTYPES:
        raise TopoplanError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    run = Allreduce(schedule, transport, timeout=timeout)
    n, rank = transport.size, transport.rank
    rows = []
    for size in sizes:
        count = size // ITEMSIZE[dtype]
        buf, fill = _make_buffer(count, dtype, use_torch)
        nbytes = count * ITEMSIZE[dtype]
        methods = [("schedule", lambda b=buf: run(b))]
        if baseline:
            methods.append(("native", lambda b=buf: transport.native_allreduce(b)))
        measured = {}
        for name, fn in methods:
            fill(rank)
            fn()
            wrong = _sum_over_ranks(transport, count_wrong(buf, n), use_torch)
            # Timed runs reduce zeros: repeated sums of the pattern would overflow
            # (it grows n-fold per run), and 0 + 0 costs what any normal add costs.
            fill(None)
            for _ in range(max(0, warmup - 1)):
                fn()
            if iters is None:
                estimate = _time(fn, transport, 1)
                k = int(min(max_iters, max(2, math.ceil(seconds_per_size / max(estimate, 1e-7)))))
            else:
                k = iters
            seconds = _time(fn, transport, k)
            measured[name] = (seconds, wrong, k)
        seconds, wrong, k = measured["schedule"]
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        row: dict[str, Any] = dict(size=nbytes, count=count, type=dtype, redop="sum", time_us=seconds * 1e6,
                   algbw=algbw, busbw=algbw * bus_factor(n), wrong=wrong, iters=k)
        if baseline:
            s2, w2, _ = measured["native"]
            a2 = nbytes / s2 / 1e9 if s2 > 0 else 0.0
            row.update(native_time_us=s2 * 1e6, native_algbw=a2, native_busbw=a2 * bus_factor(n),
                       native_wrong=w2)
        rows.append(BenchRow(**row))
    return rows


def predict_rows(rows: Sequence[BenchRow], schedule: Schedule, profile: Any,
                 nranks: int) -> list[BenchRow]:
    """The rows with the simulator's time for each size on the machine ``profile`` was
    calibrated on (:meth:`~topoplan.cost.CostProfile.host_cluster` of ``nranks``), and
    measured over predicted.

    Raises
    ------
    ProfileError
        When the profile has no host bandwidth (it was not measured on a machine).
    """
    from dataclasses import replace

    from .cost import get_profile
    from .simulate import simulate
    profile = get_profile(profile)
    host = profile.host_cluster(nranks)
    out = []
    for r in rows:
        predicted = simulate(host, schedule, r.size, profile=profile,
                             dtype_size=ITEMSIZE[r.type]).time_s
        out.append(replace(r, predicted_us=predicted * 1e6,
                           measured_over_predicted=r.time_us / (predicted * 1e6)
                           if predicted > 0 else None))
    return out


def format_rows(rows: Sequence[BenchRow], *, native_name: str | None = None) -> str:
    """The rows as nccl-tests text columns (plus the native baseline and ratio, if run,
    and the predicted time and measured/predicted, if predicted)."""
    head = (f"{'size(B)':>12} {'count':>11} {'type':>8} {'redop':>5} {'time(us)':>10} "
            f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")
    native = any(r.native_time_us is not None for r in rows)
    predicted = any(r.predicted_us is not None for r in rows)
    if native:
        head += f"   {'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6} {'ratio':>6}"
    if predicted:
        head += f"   {'pred(us)':>10} {'meas/pred':>9}"
    lines = []
    if native:
        lines.append(f"#{'':>61}schedule   {'':>18}{native_name or 'native'}")
    lines.append("#" + head[1:])
    for r in rows:
        line = (f"{r.size:>12} {r.count:>11} {r.type:>8} {r.redop:>5} {r.time_us:>10.1f} "
                f"{r.algbw:>11.3f} {r.busbw:>11.3f} {r.wrong:>6}")
        if native:
            line += (f"   {r.native_time_us:>10.1f} {r.native_algbw:>11.3f} "
                     f"{r.native_busbw:>11.3f} {r.native_wrong:>6} {r.ratio or 0:>5.2f}x")
        if predicted:
            pred = "-" if r.predicted_us is None else f"{r.predicted_us:.1f}"
            ratio = ("-" if r.measured_over_predicted is None
                     else f"{r.measured_over_predicted:.2f}")
            line += f"   {pred:>10} {ratio:>9}"
        lines.append(line)
    return "\n".join(lines)
