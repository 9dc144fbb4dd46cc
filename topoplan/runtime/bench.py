"""Benchmarking a schedule for real: the core of ``topoplan bench`` and the scripts.

:func:`run_bench` replays a schedule over a transport at every size (collective: all
ranks call it) and returns nccl-tests rows (:class:`BenchRow`); :func:`format_rows`
prints them as nccl-tests does::

    size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong

The schedule's collective decides what runs: an allreduce in place, a reduce-scatter
(:class:`topoplan.ReduceScatter`) or an allgather (:class:`topoplan.AllGather`). As in
nccl-tests, ``size`` is the full buffer (a reduce-scatter's input, an allgather's
output; a multiple of the rank count in elements), ``count`` the elements of one rank's
shard for a reduce-scatter or an allgather (of the buffer for an allreduce), ``algbw``
is ``size / time`` and busbw is algbw times :func:`bus_factor` of the collective
(``2(n-1)/n`` for an allreduce, ``(n-1)/n`` for the others; 0 for one rank).

``#wrong`` comes from a real check: every size is first run on an integer-valued
pattern (:func:`pattern`) whose sum (:func:`expected_sum`) is exact in the chosen
dtype, and each rank's output is compared element by element with
:func:`expected_output` (rank ``r``'s shard of the sum for a reduce-scatter; every
rank's shard of the pattern for an allgather). The testbed's workers, the calibration
runs and ``scripts/bench_executor.py`` check with the same pattern. :func:`predict_rows`
adds the simulator's time for each size on the machine a calibrated profile was
measured on.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Sequence

from ..ir.collectives import get_collective
from ..errors import TopoplanError
from ..ir.schedule import Schedule
from .choice import size_class
from .transports.base import NoNative
from ..ir.collectives import bus_factor

__all__ = ["BenchRow", "run_bench", "format_rows", "predict_rows", "bus_factor", "pattern",
           "load_average",
           "expected_sum", "expected_output", "count_wrong", "check_sizes", "array_kind",
           "DTYPES", "ITEMSIZE"]

DTYPES = ("float32", "float64", "float16", "bfloat16")
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One size of a benchmark; times are the slowest rank's mean, in microseconds.

    ``size`` is the full buffer in bytes; ``count`` the elements of one rank's shard
    for a reduce-scatter or an allgather, of the buffer for an allreduce (nccl-tests'
    columns). ``native_*`` are the transport's own collective on the same buffers
    (``None`` when not run, or when the transport has none: ``native_note`` says why).
    """

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
    collective: str = "allreduce"
    native_note: str | None = None
    chosen: str | None = None
    model_choice: str | None = None
    candidates: tuple[dict[str, Any], ...] | None = None
    exploration_calls: int | None = None

    @property
    def contradicted(self) -> bool:
        """Whether ``auto``'s run chose otherwise than its model."""
        return self.chosen is not None and self.chosen != self.model_choice

    @property
    def ratio(self) -> float | None:
        """The schedule's bandwidth over the native collective's (algbw and busbw give
        the same ratio; algbw's holds for one rank too, where busbw is 0)."""
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


def expected_output(collective: str, count: int, nranks: int, rank: int) -> Any:
    """What rank ``rank``'s output must hold (a float64 numpy array) after ``collective``
    of a full buffer of ``count`` elements, every rank ``q`` having put in
    :func:`pattern` of ``q`` (for an allgather: at its shard's elements).

    - allreduce: :func:`expected_sum` of the buffer;
    - reduce_scatter: the rank's shard of it (elements ``rank * count / nranks`` on);
    - allgather: shard ``q`` holds rank ``q``'s pattern, ``i % 7 + q % 3``.
    """
    import numpy as np
    if collective == "allreduce":
        return expected_sum(np.arange(count, dtype=np.float64), nranks)
    m = count // nranks
    if collective == "reduce_scatter":
        return expected_sum(np.arange(rank * m, (rank + 1) * m, dtype=np.float64), nranks)
    index = np.arange(count, dtype=np.int64)
    return (index % 7 + (index // max(m, 1)) % 3).astype(np.float64)


def check_sizes(sizes: Sequence[int], nranks: int, collective: str, dtype: str) -> None:
    """Refuse sizes a reduce-scatter or an allgather of ``nranks`` cannot cut into equal
    shards: the full buffer must be a multiple of ``nranks`` elements of ``dtype``.

    Raises
    ------
    TopoplanError
        Naming the first bad size and the nearest good ones.
    """
    if not get_collective(collective).sharded:
        return
    item = ITEMSIZE[dtype]
    step = nranks * item
    for size in sizes:
        if size % step:
            lower, upper = size // step * step, (size // step + 1) * step
            good = f"{lower} or {upper}" if lower else f"{upper}"
            raise TopoplanError(
                f"size {size} B: {with_article(collective)} of {nranks} ranks cuts the full "
                f"buffer into {nranks} equal shards, so it must be a multiple of {nranks} "
                f"{dtype} elements ({step} B); use {good} B")


def load_average() -> float:
    """This machine's 1-minute load average (NaN where the system has none): benchmarks
    record it beside their timings, which other work on the machine stretches."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def with_article(word: str) -> str:
    """``word`` with its indefinite article: "an allgather", "a reduce_scatter"."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def array_kind(transport: Any) -> str:
    """The buffers a transport moves natively: ``numpy`` (MPI, Local), ``torch`` (gloo),
    ``torch-cuda`` (torch's nccl) or ``cupy`` (NCCL)."""
    name = getattr(transport, "name", "")
    if name == "nccl":
        return "cupy"
    if name.startswith("torch"):
        return "torch-cuda" if name.endswith("nccl") else "torch"
    return "numpy"


class _Buffers:
    """One size's buffers: the call's arguments, the output to check, ``fill`` and
    ``sync``. ``arrays`` is the kind (:func:`array_kind`); bfloat16, which numpy and
    CuPy lack, takes torch tensors on the same device."""

    def __init__(self, collective: str, count: int, nranks: int, rank: int, dtype: str,
                 arrays: str) -> None:
        self.collective, self.count, self.nranks, self.rank = collective, count, nranks, rank
        m = count // nranks
        sizes = {"allreduce": (count, None), "reduce_scatter": (count, m),
                 "allgather": (m, count)}[collective]
        # The input's first element in the full buffer (an allgather's is its shard).
        self.offset = rank * m if collective == "allgather" else 0
        if dtype == "bfloat16" and arrays in ("numpy", "cupy"):
            arrays = "torch" if arrays == "numpy" else "torch-cuda"
        self.kind = arrays
        self.torch = arrays in ("torch", "torch-cuda")
        options: dict[str, Any] = {}
        if self.torch:
            import torch
            self.lib: Any = torch
            kind: Any = getattr(torch, dtype)
            options["device"] = "cuda" if arrays == "torch-cuda" else "cpu"
        elif arrays == "cupy":
            import cupy
            self.lib, kind = cupy, dtype
        else:
            import numpy as np
            self.lib, kind = np, dtype
        self.options = options
        self.input: Any = self.lib.empty(sizes[0], dtype=kind, **options)
        self.output: Any = (self.input if sizes[1] is None
                            else self.lib.empty(sizes[1], dtype=kind, **options))
        self.args = (self.input,) if sizes[1] is None else (self.input, self.output)

    def fill(self, rank: int | None) -> None:
        """The check pattern of ``rank`` in the input (and a sentinel no result holds,
        -1, in a separate output); ``None``: zeros, for timed runs."""
        n = self.input.shape[0]
        if rank is None:
            self.input[...] = 0
            return
        index = self.lib.arange(self.offset, self.offset + n, **self.options)
        if self.torch:
            self.input.copy_(pattern(index, rank))
        else:
            self.input[...] = pattern(index, rank)
        if self.output is not self.input:
            self.output[...] = -1

    def host(self, buf: Any) -> Any:
        """``buf`` as a numpy array (float64-exact values)."""
        if self.torch:
            return buf.float().cpu().numpy()
        if self.kind == "cupy":
            return self.lib.asnumpy(buf)
        return buf

    def sync(self) -> None:
        """Wait for the GPU work queued on the caller's stream (the transport's
        collectives end by making it wait for theirs); nothing for host buffers."""
        if self.kind == "cupy":
            self.lib.cuda.get_current_stream().synchronize()
        elif self.kind == "torch-cuda":
            self.lib.cuda.current_stream().synchronize()

    def wrong(self) -> int:
        """Elements of this rank's output that differ from :func:`expected_output`."""
        import numpy as np
        expected = expected_output(self.collective, self.count, self.nranks, self.rank)
        values = np.asarray(self.host(self.output), dtype=np.float64)
        return int(np.count_nonzero(values != expected))

    def total(self, transport: Any, count: int) -> int:
        """``count`` summed over ranks with the transport's own allreduce, in a float64
        buffer of this kind (exact here)."""
        total: Any
        if self.torch:
            total = self.lib.tensor([float(count)], dtype=self.lib.float64, **self.options)
        else:
            total = self.lib.array([float(count)], dtype=self.lib.float64)
        transport.native_allreduce(total)
        return int(self.host(total)[0])


def count_wrong(buf: Any, nranks: int) -> int:
    """Elements of ``buf`` (numpy or torch) that differ from :func:`expected_sum`."""
    import numpy as np
    values = buf.float().numpy() if hasattr(buf, "numpy") and hasattr(buf, "float") else buf
    count = values.shape[0]
    expected = expected_sum(np.arange(count), nranks)
    return int(np.count_nonzero(np.asarray(values, dtype=np.float64) != expected))


def _time(fn: Callable[[], Any], transport: Any, iters: int,
          sync: Callable[[], None] = lambda: None) -> float:
    """The slowest rank's mean seconds per call of ``fn`` over ``iters`` calls; ``sync``
    waits for work a call leaves queued (on a GPU) before the clock stops."""
    transport.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return transport.allreduce_max((time.perf_counter() - t0) / iters)


def run_bench(schedule: Schedule, transport: Any, sizes: Sequence[int], *,
              dtype: str = "float32", baseline: bool = False, iters: int | None = None,
              warmup: int = 1, seconds_per_size: float = 0.3, max_iters: int = 200,
              timeout: float = 60.0, use_torch: bool = False,
              choices: Mapping[int, tuple[list[Any], str]] | None = None,
              mode: str | None = None, verified: bool = False) -> list[BenchRow]:
    """Replay ``schedule`` over ``transport`` for every size; collective (all ranks call it).

    Parameters
    ----------
    schedule : Schedule
        An allreduce, reduce-scatter or allgather schedule (its ``collective``):
        run with :class:`~topoplan.Allreduce`, :class:`~topoplan.ReduceScatter` or
        :class:`~topoplan.AllGather`.
    transport : Transport
    sizes : sequence of int
        Full-buffer sizes in bytes (nccl-tests' convention: a reduce-scatter's input,
        an allgather's output). Rounded down to whole elements for an allreduce; for a
        reduce-scatter or an allgather each must be a multiple of ``nranks`` elements
        (:func:`check_sizes`).
    dtype : str
        One of float32, float64, float16, bfloat16 (bfloat16 uses torch tensors).
    baseline : bool
        Also time the transport's own collective on the same buffers
        (``native_allreduce``, ``native_reduce_scatter``, ``native_allgather``). A
        transport without one (:class:`~topoplan.runtime.transports.base.NoNative`) gets
        ``native_note`` instead of native columns.
    iters : int, optional
        Timed iterations per size; by default as many as fit ``seconds_per_size``
        (at least 2, at most ``max_iters``), judged from the warm-up.
    warmup : int
        Untimed runs per size, after the correctness check.
    timeout : float
        The executor's per-step timeout.
    use_torch : bool
        Use torch tensors as buffers (the torch transport's native form). A GPU
        transport (NCCL) always gets device buffers: CuPy arrays, or CUDA tensors for
        bfloat16 and torch's nccl.
    choices : mapping, optional
        ``auto`` measured on the job: size -> (candidates, the model's choice)
        (:func:`topoplan.runtime.choice.model_options`); ``schedule`` then only says the
        collective. Each size first explores (:class:`~topoplan.runtime.choice.MeasuredChoice`:
        every exploring call runs on the check pattern and is checked), then its
        chosen candidate is timed; the row has ``chosen``, ``model_choice``,
        ``candidates`` (measured and predicted) and ``predicted_us`` of the chosen.
    mode : str, optional
        ``measured`` or ``model`` for ``choices`` (default ``$TOPOPLAN_AUTO``).
    verified : bool
        True: ``schedule`` was verified already (:func:`topoplan.verify`) and runs as it
        is; by default the executor verifies it once (:class:`~topoplan.Allreduce`).
        ``choices`` are the model's plans, verified when planned, and always run as
        they are.

    Returns
    -------
    list of BenchRow
        The same rows on every rank. ``wrong`` is the number of wrong elements summed
        over all ranks (as nccl-tests counts them); timings are the slowest rank's.

    Raises
    ------
    TopoplanError
        An unknown dtype, or a size that is not a multiple of ``nranks`` elements for
        a reduce-scatter or an allgather.
    ScheduleError
        When ``schedule`` does not compute its collective (unless ``verified``).
    """
    from .executor import AllGather, Allreduce, ReduceScatter

    if dtype not in DTYPES:
        raise TopoplanError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    collective = schedule.collective
    n, rank = transport.size, transport.rank
    check_sizes(sizes, n, collective, dtype)
    executors: dict[str, Any] = {"allreduce": Allreduce, "reduce_scatter": ReduceScatter,
                                 "allgather": AllGather}
    run = None if choices is not None else executors[collective](schedule, transport,
                                                                   timeout=timeout,
                                                                   verified=verified)
    native_fn = {"allreduce": transport.native_allreduce,
                 "reduce_scatter": transport.native_reduce_scatter,
                 "allgather": transport.native_allgather}[collective]
    factor = bus_factor(n, collective)
    # GPU transports move device buffers; on the host, use_torch picks torch over numpy.
    arrays = array_kind(transport)
    if arrays not in ("cupy", "torch-cuda"):
        arrays = "torch" if use_torch else "numpy"
    rows = []
    for size in sizes:
        count = size // ITEMSIZE[dtype]
        bufs = _Buffers(collective, count, n, rank, dtype, arrays)
        nbytes = count * ITEMSIZE[dtype]
        chooser: Any = None
        args = bufs.args
        methods: list[tuple[str, Callable[[], Any]]]
        if choices is not None:
            chooser = _chooser(choices, size, transport, timeout, mode)
            methods = [("schedule", partial(chooser.call, nbytes, *args))]
        else:
            assert run is not None
            methods = [("schedule", partial(run, *args))]
        if baseline:
            methods.append(("native", partial(native_fn, *args)))
        measured: dict[str, tuple[float, int, int] | None] = {}
        note = None
        for name, fn in methods:
            bufs.fill(rank)
            try:
                fn()
            except NoNative as exc:  # every rank alike, before anything moved
                measured[name], note = None, str(exc)
                continue
            wrong = bufs.wrong()
            if name == "schedule" and chooser is not None:
                while chooser.exploring(nbytes):  # every exploring call on the pattern
                    bufs.fill(rank)
                    fn()
                    wrong += bufs.wrong()
            wrong = bufs.total(transport, wrong)
            # Timed runs reduce zeros: repeated sums of the pattern would overflow
            # (it grows n-fold per run), and 0 + 0 costs what any normal add costs.
            bufs.fill(None)
            for _ in range(max(0, warmup - 1)):
                fn()
            if iters is None:
                estimate = _time(fn, transport, 1, bufs.sync)
                k = int(min(max_iters, max(2, math.ceil(seconds_per_size / max(estimate, 1e-7)))))
            else:
                k = iters
            seconds = _time(fn, transport, k, bufs.sync)
            measured[name] = (seconds, wrong, k)
        result = measured["schedule"]
        assert result is not None  # the executor never raises NoNative
        seconds, wrong, k = result
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        shown = count if collective == "allreduce" else count // max(n, 1)
        row: dict[str, Any] = dict(
            size=nbytes, count=shown, type=dtype,
            redop="none" if collective == "allgather" else "sum", time_us=seconds * 1e6,
            algbw=algbw, busbw=algbw * factor, wrong=wrong, iters=k, collective=collective)
        native = measured.get("native")
        if native is not None:
            s2, w2, _ = native
            a2 = nbytes / s2 / 1e9 if s2 > 0 else 0.0
            row.update(native_time_us=s2 * 1e6, native_algbw=a2, native_busbw=a2 * factor,
                       native_wrong=w2)
        elif baseline:
            row.update(native_note=note)
        if chooser is not None:
            decision = chooser.decisions[size_class(nbytes)]
            picked = next(c for c in decision.candidates if c["algorithm"] == decision.chosen)
            row.update(chosen=decision.chosen, model_choice=decision.model_choice,
                       candidates=decision.candidates, exploration_calls=decision.calls)
            if picked["predicted_us"]:
                row.update(predicted_us=picked["predicted_us"],
                           measured_over_predicted=seconds * 1e6 / picked["predicted_us"])
        rows.append(BenchRow(**row))
    return rows


def _chooser(choices: Mapping[int, tuple[list[Any], str]], size: int, transport: Any,
             timeout: float, mode: str | None) -> Any:
    """The measured choice of one size: its own candidates (a size is its own class
    here), explored once (no re-check while the chosen one is timed)."""
    from .choice import MeasuredChoice, executor_for, snapshot
    if size not in choices:
        raise TopoplanError(f"auto: no candidates were planned for {size} B")
    options, model_choice = choices[size]
    return MeasuredChoice(transport, lambda nbytes: (list(options), model_choice),
                          lambda schedule: executor_for(schedule, transport, timeout=timeout,
                                                        verified=True),
                          mode=mode, snapshot=snapshot, recheck_every=1 << 62,
                          reprobe_every=1 << 62)


def predict_rows(rows: Sequence[BenchRow], schedule: Schedule, profile: Any,
                 nranks: int) -> list[BenchRow]:
    """The rows with the simulator's time for each size on the machine ``profile`` was
    calibrated on (:meth:`~topoplan.analysis.cost.CostProfile.host_cluster` of ``nranks``), and
    measured over predicted.

    Raises
    ------
    ProfileError
        When the profile has no host bandwidth (it was not measured on a machine).
    """
    from dataclasses import replace

    from ..analysis.cost import get_profile
    from ..analysis.sim import simulate
    profile = get_profile(profile)
    host = profile.host_cluster(nranks)
    out = []
    for r in rows:
        # force: the plan runs on this host, whatever cluster it was planned for.
        predicted = simulate(host, schedule, r.size, profile=profile,
                             dtype_size=ITEMSIZE[r.type], force=True).time_s
        out.append(replace(r, predicted_us=predicted * 1e6,
                           measured_over_predicted=r.time_us / (predicted * 1e6)
                           if predicted > 0 else None))
    return out


#: nccl-tests' column widths, used when no width is asked for.
_NCCL_TESTS_WIDTHS = {"size(B)": 12, "count": 11, "type": 8, "redop": 5, "time(us)": 10,
                      "algbw(GB/s)": 11, "busbw(GB/s)": 11, "#wrong": 6, "ratio": 6,
                      "pred(us)": 10, "meas/pred": 9, "chosen": 14}


def _contradiction(row: BenchRow) -> str:
    """``# * 1048576 B: ...``: the model's choice and the measured one, side by side."""
    def us(algorithm: str | None) -> str:
        c = next((c for c in row.candidates or () if c["algorithm"] == algorithm), None)
        if c is None:
            return ""
        measured = "-" if c["measured_us"] is None else f"{c['measured_us']:.1f}"
        predicted = "-" if c["predicted_us"] is None else f"{c['predicted_us']:.1f}"
        return f" (measured {measured} us, predicted {predicted} us)"
    return (f"# * {row.size} B: the run contradicted the model: it chose "
            f"{row.model_choice}{us(row.model_choice)}; {row.chosen}{us(row.chosen)} "
            "was faster")


def format_rows(rows: Sequence[BenchRow], *, native_name: str | None = None,
                width: int | None = None) -> str:
    """The rows as nccl-tests text columns (plus the native baseline and ratio, if run,
    and the predicted time and measured/predicted, if predicted). A native baseline the
    transport does not have shows as ``-`` with a ``# native:`` line saying why.

    ``width``: the most columns a line may take (the CLI's terminal, or 80 in a pipe).
    Columns then take the room their numbers need, and where that is still too wide,
    columns are left out in this order, with a ``#`` line naming them: count; type and
    redop (the same on every row, and said on that line); algbw (native, then the
    schedule's); busbw (likewise). Size, time, ``#wrong``, the ratio and the prediction
    always show. ``None`` (the default): nccl-tests' fixed widths, every column.
    """
    native = any(r.native_time_us is not None or r.native_note for r in rows)
    predicted = any(r.predicted_us is not None for r in rows)

    def ran(r: BenchRow) -> bool:
        return r.native_time_us is not None

    # (header, group, drop rank: higher goes first, 0 never; the cells)
    columns: list[tuple[str, int, int, list[str]]] = [
        ("size(B)", 0, 0, [str(r.size) for r in rows]),
        ("count", 0, 6, [str(r.count) for r in rows]),
        ("type", 0, 5, [r.type for r in rows]),
        ("redop", 0, 5, [r.redop for r in rows]),
        ("time(us)", 0, 0, [f"{r.time_us:.1f}" for r in rows]),
        ("algbw(GB/s)", 0, 3, [f"{r.algbw:.3f}" for r in rows]),
        ("busbw(GB/s)", 0, 1, [f"{r.busbw:.3f}" for r in rows]),
        ("#wrong", 0, 0, [str(r.wrong) for r in rows])]
    chosen = any(r.chosen is not None for r in rows)
    if chosen:
        columns.append(("chosen", 0, 0, [(r.chosen or "-") + ("*" if r.contradicted else "")
                                         for r in rows]))
    if native:
        columns += [
            ("time(us)", 1, 0, [f"{r.native_time_us:.1f}" if ran(r) else "-" for r in rows]),
            ("algbw(GB/s)", 1, 4, [f"{r.native_algbw:.3f}" if ran(r) else "-" for r in rows]),
            ("busbw(GB/s)", 1, 2, [f"{r.native_busbw:.3f}" if ran(r) else "-" for r in rows]),
            ("#wrong", 1, 0, [str(r.native_wrong) if ran(r) else "-" for r in rows]),
            ("ratio", 1, 0, [f"{r.ratio or 0:.2f}x" if ran(r) else "-" for r in rows])]
    if predicted:
        columns += [
            ("pred(us)", 2, 0, ["-" if r.predicted_us is None else f"{r.predicted_us:.1f}"
                                for r in rows]),
            ("meas/pred", 2, 0, ["-" if r.measured_over_predicted is None
                                 else f"{r.measured_over_predicted:.2f}" for r in rows])]

    def widths(shown: list[int]) -> dict[int, int]:
        if width is None:
            return {i: _NCCL_TESTS_WIDTHS[columns[i][0]] for i in shown}
        out = {i: max(len(columns[i][0]), *map(len, columns[i][3])) for i in shown}
        out[0] = max(out[0] + 1, len(columns[0][0]) + 2)  # the header's leading '# '
        return out

    def line_width(shown: list[int]) -> int:
        w = widths(shown)
        return sum(w.values()) + sum(3 if columns[i][1] != columns[j][1] else 1
                                     for i, j in zip(shown, shown[1:]))

    shown = list(range(len(columns)))
    if width is not None:
        for rank in sorted({c[2] for c in columns if c[2]}, reverse=True):
            if line_width(shown) <= width:
                break
            shown = [i for i in shown if columns[i][2] != rank]
    w = widths(shown)

    def join(cells: dict[int, str]) -> str:
        text = ""
        for k, i in enumerate(shown):
            if k:
                text += "   " if columns[i][1] != columns[shown[k - 1]][1] else " "
            text += cells[i].rjust(w[i])
        return text

    lines = []
    if native:
        # The group names over the native group: nccl-tests has none; ours say which is which.
        if width is None:
            lines.append(f"#{'':>61}schedule   {'':>18}{native_name or 'native'}")
        else:
            ends = {}
            position = 0
            for k, i in enumerate(shown):
                if k:
                    position += 3 if columns[i][1] != columns[shown[k - 1]][1] else 1
                position += w[i]
                ends[columns[i][1]] = position
            label = ("#" + "schedule".rjust(ends[0] - 1))
            name = native_name or "native"
            label += "   " + name.rjust(ends[1] - len(label) - 3)
            lines.append(label)
    head = join({i: columns[i][0] for i in shown})
    lines.append("#" + head[1:])
    for r in range(len(rows)):
        lines.append(join({i: columns[i][3][r] for i in shown}))
    notes: list[str] = []
    for row in rows:
        if native and not ran(row) and row.native_note and row.native_note not in notes:
            notes.append(row.native_note)
    lines += [f"# native: not run: {note}" for note in notes]
    lines += [_contradiction(r) for r in rows if r.contradicted]
    if len(shown) < len(columns):
        import textwrap
        left: list[str] = []
        for i in range(len(columns)):
            if i not in shown:
                name = columns[i][0].split("(")[0]
                mine = [j for j in range(len(columns)) if columns[j][0].split("(")[0] == name]
                if all(j not in shown for j in mine):
                    left += [name] if name not in left else []
                else:
                    left.append(name + (" (native)" if columns[i][1] == 1 else ""))
        said = [f"{key} {next(iter(values))}" for key, values in
                (("type", {r.type for r in rows}), ("redop", {r.redop for r in rows}))
                if key in left and len(values) == 1]
        full = line_width(list(range(len(columns))))
        text = (f"left out to fit {width} columns: {', '.join(left)} (COLUMNS={full} or "
                "--json shows them)" + (f"; {', '.join(said)} on every row" if said else ""))
        lines += textwrap.wrap(text, width=max(width or 80, 40), initial_indent="# ",
                               subsequent_indent="# ")
    return "\n".join(lines)
