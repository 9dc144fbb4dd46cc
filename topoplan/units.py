"""Units of bandwidth, latency and size, as written in cluster files and on the CLI.

Internally topoplan works in bytes, bytes per second and seconds. A bare number
is GB/s for a bandwidth and microseconds for a latency (docs/CLUSTER.md); the readers of
cluster files and profiles warn about each one (:func:`bare_number_note`). GB, MB, TB are
decimal (1 GB/s = 1e9 bytes/s, as nccl-tests reports); KiB, MiB, GiB are binary.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


__all__ = [
    "parse_bandwidth", "parse_latency", "parse_size", "parse_size_range", "bare_number_note",
    "as_bytes", "parse_count", "MAX_SIZE", "QuantityRange", "BANDWIDTH_RANGE", "LATENCY_RANGE",
    "format_size", "format_bandwidth", "format_time", "plural",
]

_BANDWIDTH_UNITS = {
    "B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "bit/s": 1 / 8, "Kbit/s": 1e3 / 8, "Mbit/s": 1e6 / 8, "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8,
    "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8,
    "Kbps": 1e3 / 8, "Mbps": 1e6 / 8, "Gbps": 1e9 / 8, "Tbps": 1e12 / 8,
    "GiB/s": 2.0**30, "MiB/s": 2.0**20,
}
_LATENCY_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_UNITS = {
    "": 1, "B": 1,
    "K": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MiB": 1 << 20,
    "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
_NUMBER_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-zµ/]*)\s*$")


#: The largest message size topoplan takes (1 EiB): times of it over the slowest link a
#: cluster file may hold (1 bit/s) stay finite, and its element counts fit the C longs
#: of numpy's arrays (docs/CLUSTER.md, "Ranges").
MAX_SIZE = 1 << 60

_EXAMPLES = {"bandwidth": "25 GB/s", "latency": "2 us", "size": "256MiB"}


@dataclass(frozen=True, slots=True)
class QuantityRange:
    """What a quantity of an input file may be: its ``limits``, beyond which topoplan's
    arithmetic does not hold (an error), and its ``plausible`` range, which real systems
    fall in (outside it: a :class:`~topoplan.errors.RangeWarning`). Both ends inclusive;
    the texts say them to a reader. Cluster files (docs/CLUSTER.md, "Ranges") and cost
    profiles (docs/COST_MODEL.md, "Ranges") check their numbers with these.
    """

    what: str  # "bandwidth", "latency", ... as the messages say it
    limits: tuple[float, float]
    plausible: tuple[float, float]
    limits_text: str
    plausible_text: str
    hint: str = "check the unit"  # what the warning suggests

    def problems(self, number: float, shown: str) -> tuple[str | None, str | None]:
        """``(error, warning)`` for ``number`` (``shown`` as written, with its unit): the
        error's text when it is beyond the limits (NaN included), else None; the
        warning's when it is outside the plausible range, else None."""
        low, high = self.limits
        if not low <= number <= high:
            return (f"{shown} is out of range: a {self.what} must be {self.limits_text}, "
                    f"what topoplan computes with (plausible: {self.plausible_text})", None)
        if not self.plausible[0] <= number <= self.plausible[1]:
            return None, (f"{shown} is outside the plausible range {self.plausible_text}; "
                          f"{self.hint}")
        return None, None


# The ranges of docs/CLUSTER.md ("Ranges"). Beyond the limits a value is an error: the
# arithmetic of the bounds, the planners and the simulator holds only inside them
# (tests/test_cluster_ranges.py plans and simulates at both ends). Beyond them it did not:
# a 1e308 GB/s link is inf in bytes/s, a 1e-310 GB/s one makes transfer times inf, a
# 1e300 us latency leaves the simulator's clock too coarse to tell events apart.
#: Bytes/s: limits 1 bit/s to 1000 TB/s (1 PB/s): a message of the largest size
#: (:data:`MAX_SIZE`) then takes at most 2**63 s on one link, and one byte at least 1e-15
#: s. Plausible: 1 Mbit/s (a slow management Ethernet) to 100 TB/s (111 times the 900 GB/s
#: each way of an NVLink 5 GPU).
BANDWIDTH_RANGE = QuantityRange("bandwidth", (1 / 8, 1e15), (1e6 / 8, 1e14),
                                "1 bit/s to 1000 TB/s", "1 Mbit/s to 100 TB/s")
#: Seconds: above 1e6 (11.6 days) an error; above 1 s a warning: no link takes a second to
#: deliver a byte.
LATENCY_RANGE = QuantityRange("latency", (0.0, 1e6), (0.0, 1.0), "0 to 1e6 s (11.6 days)",
                              "0 to 1 s")


def _split(text: str, what: str, units: dict) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"not a {what}: {text!r} (expected a number and a unit, e.g. "
                         f"{_EXAMPLES.get(what, next(iter(units)))})")
    number, unit = match.groups()
    if unit and unit not in units:  # a bare number is allowed; the caller picks its unit
        known = ", ".join(u for u in units if u)
        raise ValueError(f"unknown unit {unit!r} in {text!r}; use one of {known}")
    amount = float(number)
    if not math.isfinite(amount):  # "1e999 GB/s" overflows to inf
        raise ValueError(f"not a finite {what}: {text!r}")
    return amount, unit


def _number(value: object, what: str) -> float | None:
    if isinstance(value, bool):
        raise ValueError(f"expected a {what}, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            raise ValueError(f"expected a finite {what}, got a {len(str(value))}-digit "
                             "number") from None
        if not math.isfinite(number):  # YAML's .inf / .nan would poison every sum downstream
            raise ValueError(f"expected a finite {what}, got {value!r}")
        return number
    if not isinstance(value, str):
        raise ValueError(f"expected a {what}, got {type(value).__name__} {value!r}")
    return None


def parse_bandwidth(value: object) -> float:
    """Bytes per second from ``"100 Gbit/s"``, ``"25 GB/s"`` or a bare number (GB/s)."""
    number = _number(value, "bandwidth")
    if number is not None:
        return number * 1e9
    amount, unit = _split(str(value), "bandwidth", _BANDWIDTH_UNITS)
    if unit == "":
        return amount * 1e9
    return amount * _BANDWIDTH_UNITS[unit]


def parse_latency(value: object) -> float:
    """Seconds from ``"2 us"``, ``"500 ns"`` or a bare number (microseconds)."""
    number = _number(value, "latency")
    if number is not None:
        return number * 1e-6
    amount, unit = _split(str(value), "latency", _LATENCY_UNITS)
    return amount * (1e-6 if unit == "" else _LATENCY_UNITS[unit])


def bare_number_note(value: object, what: str) -> str | None:
    """For a bandwidth or latency written without a unit (``100``, ``"100"``): what it was
    read as and how to write the unit; ``None`` when it has a unit, or is 0 (in any unit).

    ``what`` is ``"bandwidth"`` or ``"latency"``. The text is the reason of a
    :class:`~topoplan.errors.UnitWarning`: ``bare number 100 read as 100 GB/s
    (800 Gbit/s); write '100 GB/s' or '100 Gbit/s'``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match is None or match.group(2):
            return None
        number = float(match.group(1))
    else:
        number = float(value)
    if number == 0:  # 0 is 0 in any unit
        return None
    shown = f"{number:g}"
    if what == "bandwidth":
        return (f"bare number {shown} read as {shown} GB/s ({number * 8:g} Gbit/s); "
                f"write '{shown} GB/s' or '{shown} Gbit/s'")
    if what == "latency":
        return (f"bare number {shown} read as {shown} us; write '{shown} us' "
                f"(or '{shown} ns', '{shown} ms' if that is what you meant)")
    raise ValueError(f"what must be 'bandwidth' or 'latency', got {what!r}")


def parse_size(value: object) -> int:
    """Bytes from ``"256MiB"``, ``"1G"``, ``"4096"`` or an int. K/M/G are binary."""
    number = _number(value, "size")
    if number is None:
        amount, unit = _split(str(value), "size", _SIZE_UNITS)
        number = amount * _SIZE_UNITS[unit]
    if number < 0 or number != math.floor(number):
        raise ValueError(f"a size must be a whole number of bytes >= 0, got {value!r}")
    if number > MAX_SIZE:
        raise ValueError(f"a size must be at most 2**60 bytes (1 EiB), got {value!r}")
    return int(number)


def as_bytes(size: float | str) -> float:
    """A size as the API takes it: a number of bytes, as it is, or a string such as
    ``"256MiB"`` (:func:`parse_size`), so ``topoplan.plan(cluster, size="256MiB")`` works
    as ``topoplan plan --size 256MiB`` does.

    Raises
    ------
    ValueError
        For a string that is not a size.
    """
    return parse_size(size) if isinstance(size, str) else size


_COUNT = re.compile(r"^\s*((?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([KMBGT]?)\s*$", re.I)
_COUNT_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_count(value: object) -> int:
    """A whole count such as a model's parameters from ``1557611200``, ``"1.5e9"``,
    ``"1.5B"``, ``"350M"``, ``"7B"`` or ``"64K"`` (decimal: K 1e3, M 1e6, B or G 1e9,
    T 1e12; case is ignored).

    Raises
    ------
    ValueError
        For anything else, or a count that is not a whole number >= 1.
    """
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a count, got {type(value).__name__} {value!r}")
    match = _COUNT.match(str(value))
    if match is None:
        raise ValueError(f"not a count: {value!r} (e.g. 350M, 1.5B, 7B or 1.5e9)")
    try:
        count = Decimal(match.group(1)) * _COUNT_SCALE[match.group(2).upper()]
    except InvalidOperation:
        raise ValueError(f"not a count: {value!r} (e.g. 350M, 1.5B, 7B or 1.5e9)") from None
    if count != count.to_integral_value() or count < 1:
        raise ValueError(f"a count must be a whole number >= 1, got {value!r}")
    return int(count)


def parse_size_range(text: str) -> list[int]:
    """Sizes from ``"1KiB:1GiB"`` (powers of two), ``"1K:1G:4"`` (factor 4) or ``"8,64,1M"``."""
    if "," in text:
        return [parse_size(part) for part in text.split(",")]
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(parts[0])]
    if len(parts) not in (2, 3):
        raise ValueError(f"not a size range: {text!r} (expected MIN:MAX or MIN:MAX:FACTOR)")
    low, high = parse_size(parts[0]), parse_size(parts[1])
    try:
        factor = int(parts[2]) if len(parts) == 3 else 2
    except ValueError:
        raise ValueError(f"not a size range: {text!r} (FACTOR must be an integer >= 2)") from None
    if low <= 0 or high < low or factor < 2:
        raise ValueError(f"not a size range: {text!r} (need 0 < MIN <= MAX and FACTOR >= 2)")
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(nbytes: float) -> str:
    """``268435456`` -> ``"256MiB"``; exact binary multiples stay exact."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{int(nbytes)}B"


def format_bandwidth(bytes_per_s: float) -> str:
    """``25e9`` -> ``"25 GB/s"``."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g} {unit}"
    return f"{bytes_per_s:.4g} B/s"


def format_time(seconds: float) -> str:
    """``0.00123`` -> ``"1.23 ms"``."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and ``word``, in the plural unless ``count`` is 1: ``"1 switch"``,
    ``"12 switches"``, ``"0 GPUs"``.

    The plural adds ``es`` after s, x, z, ch and sh (``box`` -> ``boxes``), else ``s``
    (``thread block`` -> ``thread blocks``); ``many`` gives an irregular one
    (``plural(n, "leaf", "leaves")``). Every count the CLI prints goes through here.
    """
    if count == 1:
        return f"{count} {word}"
    if many is None:
        many = word + ("es" if word.endswith(("s", "x", "z", "ch", "sh")) else "s")
    return f"{count} {many}"


def __getattr__(name: str) -> object:
    # bus_factor moved to topoplan.ir.collectives (it depends on the collective).
    if name == "bus_factor":
        import importlib
        import warnings
        warnings.warn("topoplan.units.bus_factor moved: use topoplan.ir.collectives.bus_factor",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module("topoplan.ir.collectives").bus_factor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
