"""Reading a measured collective curve: nccl-tests output, ``topoplan bench --json``,
``topoplan testbed bench --json``, or a CSV of sizes and bus bandwidths.

:func:`read_log` finds the format itself and returns a :class:`BenchLog`: the
collective, the rank count the log states (``None`` where it states none), and per
algorithm and size the measured time and bus bandwidth. Every line it cannot read is a
:class:`DoctorLogError` that names the file and line (``LOG:LINE: what is wrong``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ...units import parse_size

__all__ = ["DoctorLogError", "Point", "BenchLog", "read_log", "parse_log", "bus_factor",
           "PLACES", "FORMATS"]

#: Which nccl-tests columns to take: in-place, out-of-place, or the faster of the two.
PLACES = ("best", "in", "out")
#: The formats :func:`parse_log` reads.
FORMATS = ("nccl-tests", "topoplan-bench", "testbed-bench", "csv")

#: nccl-tests' binaries and topoplan's names of what they run.
_BINARIES = {"all_reduce_perf": "allreduce", "reduce_scatter_perf": "reduce_scatter",
             "all_gather_perf": "allgather", "broadcast_perf": "broadcast",
             "reduce_perf": "reduce"}
_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
#: Bytes per element of nccl-tests' ``type`` column (``src/common.cu``, ``test_typenames``).
_TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "int32": 4, "uint32": 4, "int": 4,
               "int64": 8, "uint64": 8, "half": 2, "float16": 2, "float": 4, "float32": 4,
               "double": 8, "float64": 8, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "f8e4m3": 1, "f8e5m2": 1}
#: Lines an MPI launcher or a job script puts in front of a rank's output.
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s)")
#: mpirun --tag-output's ``[0]`` in front of each rank's piece of a line (NVIDIA/nccl#1453).
_TAG = re.compile(r"\[\d+\]")


class DoctorLogError(SpecError):
    """A benchmark log ``topoplan doctor`` cannot read: the message reads ``LOG:LINE: what
    is wrong`` (a truncated or garbled row, a header missing, no data rows at all)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One measured size of one algorithm.

    ``time_s`` is the time of one collective (``None`` where the log gives only a
    bandwidth: :meth:`BenchLog.with_ranks` derives it), ``busbw`` nccl-tests' bus
    bandwidth in bytes/s (``None`` likewise), ``line`` where it was read.
    """

    algorithm: str
    size: int
    time_s: float | None
    busbw: float | None
    line: int
    predicted_s: float | None = None


@dataclass(frozen=True)
class BenchLog:
    """A measured curve: what ran (``collective``, ``nranks`` as the log states it), the
    points, and how they were read.

    ``algorithm`` of a point is ``"nccl"`` for nccl-tests and for the native rows of a
    ``topoplan bench --transport nccl`` log, ``"native"`` for another transport's own
    collective (the testbed's gloo or MPI: no model prices it), else the planner that
    ran (``ring``, ``hierarchical``, ``ring:0,2,1,3``).
    """

    path: str
    format: str
    collective: str
    nranks: int | None
    points: tuple[Point, ...]
    place: str = "best"
    cluster: str | None = None
    scale: float | None = None
    notes: tuple[str, ...] = field(default=())
    #: The testbed's fitted software costs (``Calibration.to_dict``), where the log has them.
    calibration: dict[str, Any] | None = None

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The algorithms measured, in the order the log first names them."""
        return tuple(dict.fromkeys(p.algorithm for p in self.points))

    def curve(self, algorithm: str) -> tuple[Point, ...]:
        """The points of ``algorithm``, smallest size first."""
        return tuple(sorted((p for p in self.points if p.algorithm == algorithm),
                            key=lambda p: p.size))

    def with_ranks(self, nranks: int) -> BenchLog:
        """The log with ``nranks`` ranks, each point's missing time or bus bandwidth
        derived from the other (``busbw = size / time x`` :func:`bus_factor`)."""
        factor = bus_factor(nranks, self.collective)
        points = []
        for p in self.points:
            time_s, busbw = p.time_s, p.busbw
            if time_s is None and busbw:
                time_s = p.size * factor / busbw if factor else None
            if busbw is None and time_s:
                busbw = p.size / time_s * factor
            points.append(replace(p, time_s=time_s, busbw=busbw))
        usable = tuple(p for p in points if p.time_s and p.time_s > 0 and p.size > 0)
        if not usable:
            raise DoctorLogError("no row with a time or a bus bandwidth above 0 "
                                 "(every size is 0 bytes or measured as 0)", file=self.path)
        return replace(self, nranks=nranks, points=usable)


def bus_factor(nranks: int, collective: str) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth (``doc/PERFORMANCE.md``):
    ``2(n-1)/n`` for allreduce, ``(n-1)/n`` for reduce-scatter and allgather, 1 for
    broadcast and reduce."""
    if collective in ("broadcast", "reduce"):
        return 1.0
    if nranks < 1:
        return 0.0
    return (2.0 if collective == "allreduce" else 1.0) * (nranks - 1) / nranks


def read_log(path: str | Path, *, place: str = "best", collective: str | None = None
             ) -> BenchLog:
    """Read the benchmark log at ``path`` (:func:`parse_log`).

    Raises
    ------
    DoctorLogError
        The log cannot be read; the message names the file and line.
    OSError
        The file cannot be opened.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return parse_log(text, str(path), place=place, collective=collective)


def parse_log(text: str, name: str = "<log>", *, place: str = "best",
              collective: str | None = None) -> BenchLog:
    """Read a benchmark log, its format found from its content.

    Parameters
    ----------
    text : str
        The log: nccl-tests output as printed (``all_reduce_perf``, ``reduce_scatter_perf``,
        ``all_gather_perf``; the layouts with and without the ``root`` column, ``#wrong``
        as a count, ``N/A`` or an error), ``topoplan bench --json``, ``topoplan testbed
        bench --json``, or a CSV whose header names ``size`` and ``busbw`` (GB/s) and
        optionally ``time_us`` and ``algorithm``.
    name : str
        What error messages call it (the file name).
    place : {"best", "in", "out"}
        nccl-tests' in-place or out-of-place columns, or per size the faster.
    collective : str, optional
        What ran, over what the log says (nccl-tests output names no collective unless
        the command line is in it: then the ``count`` column tells an allreduce from a
        reduce-scatter or an allgather, and an allreduce is assumed, with a note).

    Returns
    -------
    BenchLog

    Raises
    ------
    DoctorLogError
        A truncated or garbled row (``LOG:LINE: ...``), a log of none of these formats,
        or one without a data row.
    """
    if place not in PLACES:
        raise DoctorLogError(f"place {place!r}: use one of {', '.join(PLACES)}", file=name)
    if collective is not None and collective not in _COLLECTIVES:
        raise DoctorLogError(f"collective {collective!r}: use one of "
                             f"{', '.join(_COLLECTIVES)}", file=name)
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return _parse_json(text, name, collective)
    first = next((line for line in text.splitlines()
                  if line.strip() and not line.lstrip().startswith("#")), "")
    if "," in first and "size" in first.lower():
        return _parse_csv(text, name, collective)
    return _parse_nccl_tests(text, name, place, collective)


# ---------------------------------------------------------------------------
# nccl-tests
# ---------------------------------------------------------------------------
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+"
                   r"device\s+\d+")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _number(token: str) -> float | None:
    if re.fullmatch(_NUMBER, token):
        value = float(token)
        return value if math.isfinite(value) else None
    return None


def _parse_nccl_tests(text: str, name: str, place: str, collective: str | None) -> BenchLog:
    header: list[str] | None = None
    ranks: set[int] = set()
    binary = None
    rows: list[tuple[int, list[str]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _TAG.sub(" ", _PREFIX.sub("", raw)).rstrip()
        body = line.strip()
        if not body:
            continue
        for binary_name, what in _BINARIES.items():
            if binary is None and re.search(rf"(?<![a-z_]){binary_name}\b", body):
                binary = what
        if (m := _RANK.match(body)):  # older nccl-tests print them without '#'
            ranks.add(int(m.group(1)))
            continue
        if body.startswith("#"):
            words = body.lstrip("#").split()
            if words[:2] == ["size", "count"] and "time" in words:
                header = words
            continue
        if "NCCL INFO" in body or "NCCL WARN" in body:
            continue
        tokens = body.split()
        if not tokens[0].isdigit():
            continue  # a launcher's or the job's own line
        if header is None:
            raise DoctorLogError("a data row before nccl-tests' column header ('#  size  "
                                 "count  type ... time  algbw  busbw'): is the log cut at the "
                                 "top?", file=name, line=number)
        rows.append((number, tokens))
    if header is None:
        raise DoctorLogError("not a log topoplan doctor reads: no nccl-tests column header "
                             "('#  size  count  type ... time  algbw  busbw'), no JSON of "
                             "'topoplan bench --json' or 'testbed bench --json', no CSV "
                             "header naming size and busbw", file=name)
    if not rows:
        raise DoctorLogError("no data rows under nccl-tests' column header (did the run stop "
                             "before its first size?)", file=name)
    times = [i for i, word in enumerate(header) if word == "time"]
    groups = []  # (place, index of time, of busbw)
    for k, start in enumerate(times):
        end = times[k + 1] if k + 1 < len(times) else len(header)
        part = header[start:end]
        if "busbw" not in part:
            raise DoctorLogError(f"nccl-tests' column header has no busbw after its time "
                                 f"column {k + 1}: {' '.join(header)}", file=name)
        groups.append(("out" if k == 0 else "in", start, start + part.index("busbw")))
    if place != "best" and place not in {g[0] for g in groups}:
        raise DoctorLogError(f"--place {place}: the log has no {place}-place columns; use "
                             "--place best", file=name)
    points: list[Point] = []
    shapes: list[tuple[int, int, str, str]] = []  # size, count, type, redop
    for number, tokens in rows:
        if len(tokens) != len(header):
            what = "truncated" if len(tokens) < len(header) else "garbled"
            raise DoctorLogError(
                f"{what} row: {len(tokens)} columns where the header has {len(header)} "
                f"({' '.join(header)}): {' '.join(tokens)!r}", file=name, line=number)
        size = int(tokens[0])
        if not tokens[1].isdigit():
            raise DoctorLogError(f"garbled row: count {tokens[1]!r} is not a whole number",
                                 file=name, line=number)
        best: tuple[float, float] | None = None
        for which, t, b in groups:
            time_us, busbw = _number(tokens[t]), _number(tokens[b])
            if time_us is None or busbw is None or time_us < 0 or busbw < 0:
                bad = tokens[t] if time_us is None or time_us < 0 else tokens[b]
                raise DoctorLogError(f"garbled row: {header[t if bad == tokens[t] else b]} "
                                     f"{bad!r} is not a number >= 0", file=name, line=number)
            if place in ("best", which) and (best is None or time_us < best[0]):
                best = (time_us, busbw)
        if best is None:  # place was checked against the groups above
            raise DoctorLogError(f"no {place}-place columns", file=name, line=number)
        redop = tokens[header.index("redop")] if "redop" in header else ""
        shapes.append((size, int(tokens[1]), tokens[header.index("type")]
                       if "type" in header else "", redop))
        points.append(Point("nccl", size, best[0] * 1e-6, best[1] * 1e9, number))
    notes: list[str] = []
    found = collective or binary
    if found is None:
        found = _collective_of_shapes(shapes)
        notes.append(f"the log does not name the test binary: {found} read from its count "
                     "and redop columns (give --collective otherwise)")
    # Without the '# Rank' lines the count is unknown: nThread x nGpus is per process.
    nranks = len(ranks) or None
    return BenchLog(name, "nccl-tests", found, nranks, tuple(points), place, notes=tuple(notes))


def _collective_of_shapes(shapes: list[tuple[int, int, str, str]]) -> str:
    """allreduce where count x element bytes is the size, else reduce_scatter (a redop)
    or allgather (redop ``none``)."""
    for size, count, dtype, redop in shapes:
        width = _TYPE_BYTES.get(dtype.lower())
        if not width or not count or size < 64:
            continue
        if count * width == size:
            return "allreduce"
        return "allgather" if redop in ("none", "") else "reduce_scatter"
    return "allreduce"


# ---------------------------------------------------------------------------
# JSON: topoplan bench --json, topoplan testbed bench --json
# ---------------------------------------------------------------------------
def _json_line(text: str, key: str) -> int | None:
    """The line of the first ``"key"`` in ``text`` (for error messages)."""
    at = text.find(f'"{key}"')
    return text.count("\n", 0, at) + 1 if at >= 0 else None


def _parse_json(text: str, name: str, collective: str | None) -> BenchLog:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DoctorLogError(f"not valid JSON ({exc.msg} at column {exc.colno}); a truncated "
                             "'--json' output?", file=name, line=exc.lineno) from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise DoctorLogError("a JSON log needs 'rows' (the output of 'topoplan bench --json' "
                             "or 'topoplan testbed bench --json')", file=name)
    rows = data["rows"]
    if not rows:
        raise DoctorLogError("no data rows: 'rows' is empty", file=name,
                             line=_json_line(text, "rows"))
    testbed = "measured_s" in rows[0]
    what = collective or data.get("collective") or "allreduce"
    if what not in _COLLECTIVES:
        raise DoctorLogError(f"collective {what!r}: topoplan doctor reads "
                             f"{', '.join(_COLLECTIVES)}", file=name,
                             line=_json_line(text, "collective"))
    points: list[Point] = []
    notes: list[str] = []
    line = _json_line(text, "rows") or 1
    schedule = data.get("schedule") or {}
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict):
            raise DoctorLogError(f"{where}: not an object", file=name, line=line)
        try:
            size = int(row["size"])
            if testbed:
                predicted = row.get("calibrated_s") or row.get("predicted_s")
                points.append(Point(str(row["algorithm"]), size, _positive(row["measured_s"]),
                                    None, line, None if predicted is None
                                    else _positive(predicted)))
            else:
                algorithm = str(schedule.get("algorithm") or "plan")
                points.append(Point(algorithm, size, _positive(row["time_us"]) * 1e-6,
                                    _positive(row["busbw"]) * 1e9, line))
                if row.get("native_time_us") is not None:
                    native = "nccl" if data.get("transport") == "nccl" else "native"
                    points.append(Point(native, size, _positive(row["native_time_us"]) * 1e-6,
                                        _positive(row.get("native_busbw", 0)) * 1e9 or None,
                                        line))
        except KeyError as exc:
            raise DoctorLogError(f"{where}: no {exc.args[0]!r}", file=name, line=line) from None
        except (TypeError, ValueError):
            raise DoctorLogError(f"{where}: a size, time or bandwidth that is not a number "
                                 ">= 0", file=name, line=line) from None
    nranks = schedule.get("nranks") if not testbed else data.get("nranks")
    if testbed and any(p.algorithm == "native" for p in points):
        notes.append("native rows: the testbed's own collective (gloo or MPI), which no "
                     "model here prices; left out")
    scale = data.get("scale")
    return BenchLog(name, "testbed-bench" if testbed else "topoplan-bench", what,
                    int(nranks) if isinstance(nranks, int) else None, tuple(points),
                    cluster=data.get("cluster") or schedule.get("cluster"),
                    scale=float(scale) if isinstance(scale, (int, float)) else None,
                    notes=tuple(notes), calibration=data.get("calibration") if testbed else None)


def _positive(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(value)
    return number


# ---------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------
def _parse_csv(text: str, name: str, collective: str | None) -> BenchLog:
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    points: list[Point] = []
    for row in reader:
        number = reader.line_num
        cells = [c.strip() for c in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        if header is None:
            header = [c.lower() for c in cells]
            missing = [c for c in ("size", "busbw") if c not in header]
            if "size" in header and "busbw" not in header and "time_us" in header:
                missing = []
            if missing:
                raise DoctorLogError(f"the CSV header needs size and busbw (GB/s), optionally "
                                     f"time_us and algorithm; it has {', '.join(header)}",
                                     file=name, line=number)
            continue
        if len(cells) < len(header):
            raise DoctorLogError(f"truncated row: {len(cells)} cells where the header has "
                                 f"{len(header)}", file=name, line=number)
        cell = dict(zip(header, cells))
        try:
            size = parse_size(cell["size"])
        except ValueError as exc:
            raise DoctorLogError(f"size {cell['size']!r}: {exc}", file=name,
                                 line=number) from None
        values: dict[str, float | None] = {}
        for key in ("busbw", "time_us"):
            if cell.get(key, "") == "":
                values[key] = None
                continue
            value = _number(cell[key])
            if value is None or value < 0:
                raise DoctorLogError(f"garbled row: {key} {cell[key]!r} is not a number >= 0",
                                     file=name, line=number)
            values[key] = value
        if values["busbw"] is None and values["time_us"] is None:
            raise DoctorLogError("a row needs busbw or time_us", file=name, line=number)
        points.append(Point(cell.get("algorithm") or "nccl", size,
                            None if values["time_us"] is None else values["time_us"] * 1e-6,
                            None if values["busbw"] is None else values["busbw"] * 1e9,
                            number))
    if header is None or not points:
        raise DoctorLogError("no data rows under the CSV header", file=name)
    notes = () if collective else ("a CSV names no collective: allreduce assumed (give "
                                   "--collective otherwise)",)
    return BenchLog(name, "csv", collective or "allreduce", None, tuple(points), notes=notes)
