"""Reading cost profiles: the shipped ones by name, a YAML file or text, every mistake
named by ``file:line: key``.

:func:`get_profile` turns what a caller names (a
:class:`~topoplan.analysis.cost.profile.CostProfile`, a shipped name, a path, or nothing for
:data:`~topoplan.analysis.cost.profile.DEFAULT_PROFILE`) into a profile; :func:`load_profile`
and :func:`loads_profile` read YAML (``topoplan/analysis/cost/profiles/*.yaml`` are the
shipped ones, each citing its sources).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ...errors import ProfileError, RangeWarning, UnitWarning
from .profile import (DEFAULT_PROFILE, IDEAL, NATIVE_KINDS, NATIVE_MODELS, NVLINK_MODELS,
                      PROFILE_RANGES, CostProfile, NativeCost)

__all__ = ["get_profile", "load_profile", "loads_profile", "profile_names"]

_PROFILE_DIR = Path(__file__).with_name("profiles")
_CLASSES = ("box", "network")
_KEYS = ("name", "description", "sources", "alpha", "small_messages", "op_overhead",
         "step_overhead", "call_overhead", "reduce_bandwidth", "nvlink", "native", "host",
         "calibration")
_NATIVE_KEYS = ("alpha", "alpha_per_rank", "bandwidth")


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def profile_names() -> list[str]:
    """The shipped profiles (``topoplan/analysis/cost/profiles/*.yaml``)."""
    return sorted(p.stem for p in _PROFILE_DIR.glob("*.yaml"))


def get_profile(spec: CostProfile | str | Path | None = None) -> CostProfile:
    """A profile from a :class:`CostProfile`, a shipped name, a YAML path, or ``None``
    (:data:`DEFAULT_PROFILE`).

    Raises
    ------
    ProfileError
        For an unknown name (listing the shipped ones) or a bad file.
    """
    if isinstance(spec, CostProfile):
        return spec
    if spec is None:
        spec = DEFAULT_PROFILE
    text = str(spec)
    if text == "ideal":
        return IDEAL
    shipped = _PROFILE_DIR / f"{text}.yaml"
    if "/" not in text and not text.endswith((".yaml", ".yml")) and shipped.exists():
        return _shipped(text)
    path = Path(text)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_profile(path)
    raise ProfileError(f"unknown cost profile {text!r}: name one of {', '.join(profile_names())} "
                       "or give a profile YAML file (topoplan calibrate writes one)")


_SHIPPED_CACHE: dict[str, CostProfile] = {}


def _shipped(name: str) -> CostProfile:
    profile = _SHIPPED_CACHE.get(name)
    if profile is None:
        profile = _SHIPPED_CACHE[name] = load_profile(_PROFILE_DIR / f"{name}.yaml")
    return profile


def load_profile(path: str | Path) -> CostProfile:
    """Read a cost profile YAML file.

    Raises
    ------
    ProfileError
        Naming ``file:line: key`` for any mistake, or the file when it cannot be read.
    """
    from ..._yaml import read_text
    return loads_profile(read_text(path, "cost profile", ProfileError), str(path))


def loads_profile(text: str, file: str = "<string>") -> CostProfile:
    """Like :func:`load_profile`, from YAML text; ``file`` names it in errors.

    The format (bare numbers are microseconds and GB/s, as in cluster files, and warned
    about as :class:`~topoplan.errors.UnitWarning`; every number has limits, beyond which
    it is an error, and a plausible range, outside which it is a
    :class:`~topoplan.errors.RangeWarning`: :data:`~topoplan.analysis.cost.profile.PROFILE_RANGES`,
    docs/COST_MODEL.md "Ranges")::

        name: mpi
        description: topoplan's executor over Open MPI, 8 ranks on one host
        sources: measured by topoplan calibrate ...
        alpha: 12 us                     # or {box: 3.4 us, network: 9.6 us}
        op_overhead: 1.5 us
        step_overhead: 8 us
        call_overhead: 20 us
        reduce_bandwidth: 4 GB/s         # or none
        nvlink: nccl                     # NVLink at NCCL's per-link rate (optional)
        native: nccl                     # native steps priced by the NCCL model, or
        native:                          # the transport's own collectives, measured
          allreduce: {alpha: 30 us, alpha_per_rank: 4 us, bandwidth: 2 GB/s}
        host: {bandwidth: 3 GB/s, cores: 2, ranks: 8}   # calibrated profiles only
        calibration: {...}               # what topoplan calibrate recorded
    """
    from ..._yaml import LineDict, load_yaml
    from ...units import bare_number_note, parse_bandwidth, parse_latency, parse_size

    doc = load_yaml(text, file, ProfileError)
    if doc is None:
        raise ProfileError("empty file; a cost profile is a mapping with name and costs",
                           file=file, line=1)
    if not isinstance(doc, LineDict):
        raise ProfileError(f"a cost profile is a mapping with name and costs, got "
                           f"{type(doc).__name__}", file=file, line=getattr(doc, "line", 1))

    def fail(mapping: LineDict, key: str, message: str, path: str | None = None) -> ProfileError:
        return ProfileError(message, file=file, line=mapping.line_of(key), key=path or key)

    for key in doc:
        if key not in _KEYS:
            raise fail(doc, key, f"unknown key; allowed: {', '.join(_KEYS)}")
    if "name" not in doc:
        raise ProfileError("missing required key", file=file, line=doc.line, key="name")

    def string(key: str) -> str:
        value = doc.get(key, "")
        if not isinstance(value, str):
            raise fail(doc, key, f"expected a string, got {value!r}")
        return value

    def unit_note(mapping: LineDict, key: str, path: str, what: str) -> None:
        """Warn about a bare number: it has a default unit, which may not be the one meant."""
        note = bare_number_note(mapping[key], what)
        if note is not None:
            warnings.warn(UnitWarning(note, file=file, line=mapping.line_of(key), key=path),
                          stacklevel=3)

    def with_limits(message: str, kind: str) -> str:
        """A parse error, with the limits where the number was NaN or infinite."""
        if "finite" not in message:
            return message
        limits = PROFILE_RANGES[kind]
        return f"{message}: a {limits.what} must be {limits.limits_text}"

    def in_range(mapping: LineDict, key: str, path: str, kind: str, number: float,
                 unit: str = "") -> None:
        """Refuse ``number`` beyond the limits of ``kind`` (:data:`PROFILE_RANGES`), warn
        outside its plausible range; ``unit`` is a bare number's default unit."""
        value = mapping[key]
        shown = (value if isinstance(value, str) else
                 f"{value:g}" if isinstance(value, float) else str(value))
        if unit and (bare_number_note(value, "latency") is not None
                     or not isinstance(value, str)):  # a bare number: its default unit
            shown += unit
        error, warning = PROFILE_RANGES[kind].problems(number, shown)
        if error is not None:
            raise fail(mapping, key, error, path)
        if warning is not None:
            warnings.warn(RangeWarning(warning, file=file, line=mapping.line_of(key),
                                       key=path), stacklevel=3)

    def seconds(mapping: LineDict, key: str, path: str) -> float:
        value = mapping[key]
        try:
            out = parse_latency(value)
        except ValueError as exc:
            raise fail(mapping, key, with_limits(str(exc), "time"), path) from None
        if out < 0:
            raise fail(mapping, key, f"must be >= 0, got {value!r}", path)
        in_range(mapping, key, path, "time", out, " us")
        unit_note(mapping, key, path, "latency")
        return out

    def bandwidth(mapping: LineDict, key: str, path: str, allow_none: bool) -> float | None:
        value = mapping[key]
        if allow_none and (value is None or (isinstance(value, str)
                                              and value.strip().lower() in ("none", "free"))):
            return None
        try:
            out = parse_bandwidth(value)
        except ValueError as exc:
            raise fail(mapping, key, with_limits(str(exc), "bandwidth"), path) from None
        if not out > 0:
            raise fail(mapping, key, f"must be > 0, got {value!r}", path)
        in_range(mapping, key, path, "bandwidth", out, " GB/s")
        unit_note(mapping, key, path, "bandwidth")
        return out

    name = string("name")
    if not name:
        raise fail(doc, "name", "expected a non-empty string")
    costs: dict[str, Any] = {}
    def per_class(mapping: LineDict, key: str, path: str) -> tuple[float, float]:
        """(box, network) seconds from one number for both or a mapping of the two."""
        value = mapping[key]
        if not isinstance(value, LineDict):
            both = seconds(mapping, key, path)
            return both, both
        for cls in value:
            if cls not in _CLASSES:
                raise ProfileError(f"unknown link class; use {' and '.join(_CLASSES)}",
                                   file=file, line=value.line_of(cls), key=f"{path}.{cls}")
        for cls in _CLASSES:
            if cls not in value:
                raise ProfileError("missing: give alpha for both link classes, or one "
                                   "number for both", file=file, line=value.line,
                                   key=f"{path}.{cls}")
        box, network = (seconds(value, cls, f"{path}.{cls}") for cls in _CLASSES)
        return box, network

    if "alpha" in doc:
        costs["alpha_box"], costs["alpha_network"] = per_class(doc, "alpha", "alpha")
    if "small_messages" in doc:
        small = doc["small_messages"]
        if not isinstance(small, LineDict):
            raise fail(doc, "small_messages", "expected a mapping with max_bytes and alpha")
        for key in small:
            if key not in ("max_bytes", "alpha"):
                raise ProfileError("unknown key; allowed: max_bytes, alpha", file=file,
                                   line=small.line_of(key), key=f"small_messages.{key}")
        for key in ("max_bytes", "alpha"):
            if key not in small:
                raise ProfileError("missing required key", file=file, line=small.line,
                                   key=f"small_messages.{key}")
        try:
            costs["small_max"] = parse_size(small["max_bytes"])
        except ValueError as exc:
            raise fail(small, "max_bytes", str(exc), "small_messages.max_bytes") from None
        in_range(small, "max_bytes", "small_messages.max_bytes", "bytes", costs["small_max"],
                 " bytes")
        costs["small_alpha_box"], costs["small_alpha_network"] = per_class(
            small, "alpha", "small_messages.alpha")
    for key in ("op_overhead", "step_overhead", "call_overhead"):
        if key in doc:
            costs[key] = seconds(doc, key, key)
    if "reduce_bandwidth" in doc:
        costs["reduce_bandwidth"] = bandwidth(doc, "reduce_bandwidth", "reduce_bandwidth", True)
    if "nvlink" in doc:
        value = doc["nvlink"]
        if value is not None and value not in NVLINK_MODELS:
            raise fail(doc, "nvlink", f"expected {' or '.join(NVLINK_MODELS)} (NVLink as NCCL "
                                      f"counts it), or leave the key out; got {value!r}")
        costs["nvlink"] = value
    if "native" in doc:
        costs.update(_native_section(doc, file, seconds, bandwidth))
    if "host" in doc:
        host = doc["host"]
        if not isinstance(host, LineDict):
            raise fail(doc, "host", "expected a mapping with bandwidth (and ranks)")
        for key in host:
            if key not in ("bandwidth", "cores", "ranks"):
                raise ProfileError("unknown key; allowed: bandwidth, cores, ranks",
                                   file=file, line=host.line_of(key), key=f"host.{key}")
        if "bandwidth" not in host:
            raise ProfileError("missing required key", file=file, line=host.line,
                               key="host.bandwidth")
        costs["host_bandwidth"] = bandwidth(host, "bandwidth", "host.bandwidth", False)
        for key, attr in (("ranks", "host_ranks"), ("cores", "host_cores")):
            if key in host:
                value = host[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ProfileError(f"expected an integer >= 1, got {value!r}", file=file,
                                       line=host.line_of(key), key=f"host.{key}")
                in_range(host, key, f"host.{key}", key, value)
                costs[attr] = value
    calibration = doc.get("calibration") or {}
    if not isinstance(calibration, dict):
        raise fail(doc, "calibration", "expected a mapping")
    return CostProfile(name=name, description=string("description"), sources=string("sources"),
                       calibration=_freeze(calibration), **costs)


def _native_section(doc: Any, file: str, seconds: Any, bandwidth: Any) -> dict[str, Any]:
    """``native:`` of a profile: a model's name, or the measured collectives by kind."""
    from ..._yaml import LineDict

    value = doc["native"]
    if isinstance(value, str) or value is None:
        if value not in NATIVE_MODELS:
            raise ProfileError(f"expected {' or '.join(NATIVE_MODELS)} (the NCCL model prices "
                               f"native steps) or a mapping of measured collectives "
                               f"({', '.join(NATIVE_KINDS)}); got {value!r}", file=file,
                               line=doc.line_of("native"), key="native")
        return {"native_model": value}
    if not isinstance(value, LineDict):
        raise ProfileError(f"expected a mapping of collectives ({', '.join(NATIVE_KINDS)}) "
                           f"to {{alpha, alpha_per_rank, bandwidth}}, got {value!r}", file=file,
                           line=doc.line_of("native"), key="native")
    found = []
    for kind in value:
        where = f"native.{kind}"
        if kind not in NATIVE_KINDS:
            raise ProfileError(f"unknown collective; allowed: {', '.join(NATIVE_KINDS)}",
                               file=file, line=value.line_of(kind), key=where)
        entry = value[kind]
        if not isinstance(entry, LineDict):
            raise ProfileError("expected a mapping with alpha, alpha_per_rank (optional) and "
                               "bandwidth", file=file, line=value.line_of(kind), key=where)
        for key in entry:
            if key not in _NATIVE_KEYS:
                raise ProfileError(f"unknown key; allowed: {', '.join(_NATIVE_KEYS)}",
                                   file=file, line=entry.line_of(key), key=f"{where}.{key}")
        for key in ("alpha", "bandwidth"):
            if key not in entry:
                raise ProfileError("missing required key", file=file, line=entry.line,
                                   key=f"{where}.{key}")
        per_rank = (seconds(entry, "alpha_per_rank", f"{where}.alpha_per_rank")
                    if "alpha_per_rank" in entry else 0.0)
        found.append((str(kind), NativeCost(
            alpha=seconds(entry, "alpha", f"{where}.alpha"),
            bandwidth=bandwidth(entry, "bandwidth", f"{where}.bandwidth", False),
            alpha_per_rank=per_rank)))
    return {"native_costs": tuple(found)}
