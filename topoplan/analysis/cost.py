"""Cost profiles: what a runtime pays besides moving bytes, for the simulator and planners.

A link model alone says how long bytes take. A runtime also pays for every message it
sends, every op it posts and every step it runs, and for adding what it receives. A
:class:`CostProfile` holds those costs; :func:`topoplan.simulate` charges them and every
planner plans against them, so a plan is as good as its time on the runtime that runs it.

The model (docs/COST_MODEL.md has the full statement and a worked ring):

- a rank runs its steps in order; a step with ops pays ``step_overhead`` before it posts
  anything (the executor's bookkeeping, a kernel launch), then posts its ops one after
  another, receives first (the executor's order), ``op_overhead`` each;
- a message flows once its send and its receive are both posted, after ``alpha`` of its
  link class (``box``: both ranks in one box; ``network``: different boxes) plus the
  latency of its path; links are then shared max-min fairly;
- a step ends when its last op is posted and all its messages are done, then adds what
  its reducing receives brought, one after another, at ``reduce_bandwidth``;
- a call pays ``call_overhead`` once (launch, entering the library).

Messages of zero bytes are not sent (the executor skips them): they cost nothing.

Shipped profiles (``topoplan/analysis/profiles/*.yaml``, each citing its sources): ``ideal`` (links
only, the model before profiles), ``nccl`` (NCCL point-to-point, from NCCL's own tuning
tables and published measurements; the default of :func:`topoplan.plan`,
:func:`topoplan.simulate` and the CLI),
``mpi`` and ``gloo`` (this project's executor over Open MPI and torch.distributed/gloo,
measured by ``topoplan calibrate``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ..errors import ProfileError, UnitWarning

__all__ = ["CostProfile", "NativeCost", "load_profile", "loads_profile", "get_profile",
           "profile_names", "DEFAULT_PROFILE", "IDEAL", "NATIVE_KINDS", "NATIVE_MODELS",
           "native_bus_factor"]

#: The profile the CLI, :func:`topoplan.plan` and :func:`topoplan.simulate` use when none
#: is named: GPU clusters run NCCL (topoplan's NCCL transport posts each step as one NCCL
#: group).
DEFAULT_PROFILE = "nccl"

_PROFILE_DIR = Path(__file__).with_name("profiles")
_CLASSES = ("box", "network")
_KEYS = ("name", "description", "sources", "alpha", "small_messages", "op_overhead",
         "step_overhead", "call_overhead", "reduce_bandwidth", "nvlink", "native", "host",
         "calibration")
#: What ``nvlink:`` may say: ``nccl``, NVLink moves what NCCL counts per link
#: (:func:`topoplan.analysis.native.nccl_search.nvlink_view`), not the specification's rate.
NVLINK_MODELS = ("nccl",)
#: What ``native:`` may name instead of measured costs: ``nccl``, native steps are priced
#: by the NCCL model over their group (:mod:`topoplan.analysis.native.price`).
NATIVE_MODELS = ("nccl",)
#: The native collectives a profile may price (IR v3's native ops, docs/SCHEDULE.md).
NATIVE_KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
_NATIVE_KEYS = ("alpha", "alpha_per_rank", "bandwidth")


@dataclass(frozen=True, slots=True)
class NativeCost:
    """A transport's own collective of one kind, as ``topoplan calibrate`` measured it.

    Over a group of ``g`` ranks, on ``nbytes`` bytes (an allreduce's buffer, a
    reduce-scatter's input, an allgather's output, a broadcast's or reduce's buffer)::

        time = alpha + (g - 1) * alpha_per_rank + bus(g) * nbytes / bandwidth

    with nccl-tests' bus factor ``bus(g)``: ``2 (g - 1) / g`` for an allreduce,
    ``(g - 1) / g`` for a reduce-scatter or an allgather, 1 for a broadcast or a reduce.
    ``bandwidth`` is therefore the bus bandwidth (bytes/s) the collective reaches at large
    sizes, as nccl-tests reports it; ``alpha`` and ``alpha_per_rank`` are seconds.
    """

    alpha: float
    bandwidth: float
    alpha_per_rank: float = 0.0

    def time(self, kind: str, group: int, nbytes: float) -> float:
        """Seconds for ``kind`` over ``group`` ranks on ``nbytes`` bytes (0 for one rank
        or no bytes: the transport returns at once)."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        return (self.alpha + (group - 1) * self.alpha_per_rank
                + native_bus_factor(kind, group) * nbytes / self.bandwidth)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha": _time_text(self.alpha)}
        if self.alpha_per_rank:
            out["alpha_per_rank"] = _time_text(self.alpha_per_rank)
        out["bandwidth"] = _bandwidth_text(self.bandwidth)
        return out


def native_bus_factor(kind: str, group: int) -> float:
    """nccl-tests' bus factor of a native ``kind`` over ``group`` ranks: the bytes each
    rank moves per byte of the buffer in a bandwidth-optimal ring."""
    if group <= 1:
        return 0.0
    if kind == "allreduce":
        return 2.0 * (group - 1) / group
    if kind in ("reduce_scatter", "allgather"):
        return (group - 1) / group
    return 1.0


@dataclass(frozen=True)
class CostProfile:
    """The costs of a runtime beyond its links (seconds, bytes/s).

    Attributes
    ----------
    name : str
    alpha_box, alpha_network : float
        Seconds per message before its first byte moves, for a message between two GPUs
        of one box and between boxes.
    small_max : int or None
        Messages of at most this many bytes go by the runtime's small-message protocol
        (MPI's eager sends, NCCL's LL) and pay ``small_alpha_box`` /
        ``small_alpha_network`` instead; ``None``: one protocol for all.
    op_overhead : float
        Seconds a rank takes to post one op (send or receive); the ops of a step are
        posted one after another.
    step_overhead : float
        Seconds a rank pays at the start of every step that has ops.
    call_overhead : float
        Seconds per allreduce call, paid once.
    reduce_bandwidth : float or None
        Bytes/s a rank adds received data at (the adds of a step run after its messages,
        one after another); ``None``: free.
    nvlink : str or None
        ``"nccl"``: NVLink links (and NVSwitch ports) move what NCCL counts per link
        (``src/graph/topo.h``, ``SMxx_NVLINK_BW``: 20 GB/s of an A100's 25, 20.6 of an
        H100's 25), for every schedule the simulator runs under this profile, as for
        NCCL's own (:func:`topoplan.analysis.native.clusters.nccl_links`); ``None``: the cluster
        file's bandwidths.
    host_bandwidth : float or None
        Bytes/s one rank moves in and out on the machine ``topoplan calibrate`` measured
        (with a core to itself). Used to predict runs on that machine
        (:meth:`host_cluster`); ``None`` for profiles of real clusters.
    host_cores : int or None
        Cores of that machine: with more ranks than cores, the costs above are those of
        a rank with a core to itself, and the simulator stretches the time ranks spend
        working at once beyond the cores (contention).
    host_ranks : int or None
        Ranks of the calibration run.
    native_model : str or None
        ``"nccl"``: native collective steps (IR v3) are priced by the NCCL model over
        their group (:mod:`topoplan.analysis.native.price`).
    native_costs : tuple of (str, NativeCost)
        The transport's own collectives, as measured (``topoplan calibrate``), by kind.
        A native step of a kind neither field prices runs as a point-to-point ring over
        its group on this profile's costs (the report says so).
    description, sources : str
        What the profile describes; where its numbers come from.
    calibration : mapping
        What ``topoplan calibrate`` recorded (transport, date, samples, residuals).
    """

    name: str = "custom"
    alpha_box: float = 0.0
    alpha_network: float = 0.0
    small_max: int | None = None
    small_alpha_box: float = 0.0
    small_alpha_network: float = 0.0
    op_overhead: float = 0.0
    step_overhead: float = 0.0
    call_overhead: float = 0.0
    reduce_bandwidth: float | None = None
    nvlink: str | None = None
    host_bandwidth: float | None = None
    host_cores: int | None = None
    host_ranks: int | None = None
    native_model: str | None = None
    native_costs: tuple[tuple[str, NativeCost], ...] = ()
    description: str = ""
    sources: str = ""
    calibration: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}),
                                           compare=False)

    def __post_init__(self) -> None:
        for key in ("alpha_box", "alpha_network", "small_alpha_box", "small_alpha_network",
                    "op_overhead", "step_overhead", "call_overhead"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ProfileError(f"must be a finite number of seconds >= 0, got {value!r}",
                                   key=f"{self.name}: {key}")
        if self.small_max is not None and (isinstance(self.small_max, bool)
                                           or not isinstance(self.small_max, int)
                                           or self.small_max < 0):
            raise ProfileError(f"must be a whole number of bytes >= 0 or None, got "
                               f"{self.small_max!r}", key=f"{self.name}: small_max")
        if self.native_model is not None and self.native_model not in NATIVE_MODELS:
            raise ProfileError(f"must be one of {', '.join(NATIVE_MODELS)} or None, got "
                               f"{self.native_model!r}", key=f"{self.name}: native")
        for kind, cost in self.native_costs:
            if kind not in NATIVE_KINDS or not isinstance(cost, NativeCost):
                raise ProfileError(f"expected (kind, NativeCost) pairs with a kind of "
                                   f"{', '.join(NATIVE_KINDS)}, got {kind!r}",
                                   key=f"{self.name}: native")
            for key in ("alpha", "alpha_per_rank"):
                value = getattr(cost, key)
                if not (math.isfinite(value) and value >= 0):
                    raise ProfileError(f"must be a finite number of seconds >= 0, got "
                                       f"{value!r}", key=f"{self.name}: native.{kind}.{key}")
            if not (math.isfinite(cost.bandwidth) and cost.bandwidth > 0):
                raise ProfileError(f"must be > 0 bytes/s, got {cost.bandwidth!r}",
                                   key=f"{self.name}: native.{kind}.bandwidth")
        if self.nvlink is not None and self.nvlink not in NVLINK_MODELS:
            raise ProfileError(f"must be one of {', '.join(NVLINK_MODELS)} or None, got "
                               f"{self.nvlink!r}", key=f"{self.name}: nvlink")
        for key in ("reduce_bandwidth", "host_bandwidth"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ProfileError(f"must be > 0 bytes/s or None, got {value!r}",
                                   key=f"{self.name}: {key}")

    # -- queries ----------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """The smaller alpha (a message costs at least this)."""
        return min(self.alpha_box, self.alpha_network)

    @property
    def is_ideal(self) -> bool:
        """True when the profile charges nothing beyond the links (native steps
        included: it prices them as rings on the links)."""
        small = self.small_max is None or self.small_alpha_box == self.small_alpha_network == 0
        return (self.alpha_box == self.alpha_network == self.op_overhead == self.step_overhead
                == self.call_overhead == 0 and self.reduce_bandwidth is None and small
                and self.nvlink is None and self.native_model is None
                and not self.native_costs)

    def native_cost(self, kind: str) -> NativeCost | None:
        """The measured cost of the transport's own ``kind`` (``native_costs``), or None."""
        for name, cost in self.native_costs:
            if name == kind:
                return cost
        return None

    def alphas(self, nbytes: Any, network: Any) -> Any:
        """Alpha of messages of ``nbytes`` bytes (arrays welcome), between boxes where
        ``network`` is true: the small-message protocol's up to ``small_max`` bytes."""
        import numpy as np
        large = np.where(network, self.alpha_network, self.alpha_box)
        if self.small_max is None:
            return large * np.ones_like(np.asarray(nbytes, dtype=np.float64))
        small = np.where(network, self.small_alpha_network, self.small_alpha_box)
        return np.where(np.asarray(nbytes) <= self.small_max, small, large)

    def message_cost(self, network: bool = True, ops: int = 2) -> float:
        """Seconds a lone step of ``ops`` ops costs before its bytes flow: the step
        overhead, posting, and alpha (the per-step term of an alpha-beta model)."""
        return (self.step_overhead + ops * self.op_overhead
                + (self.alpha_network if network else self.alpha_box))

    def with_costs(self, **changes: Any) -> CostProfile:
        """A copy with some costs replaced (``name`` says it was changed)."""
        name = changes.pop("name", None) or (self.name if self.name.endswith("*")
                                             else f"{self.name}*")
        return replace(self, name=name, **changes)

    def host_cluster(self, nranks: int | None = None) -> Any:
        """The machine this profile was calibrated on, as a cluster: one box of ``nranks``
        GPUs (default: the calibration's), each moving at most ``host_bandwidth``, on
        ``host_cores`` cores (:func:`topoplan.cluster.host_cluster`).

        Predicts runs of any plan on that machine (``bench --profile``): a rank's
        messages share its port, and ranks working at once share the cores.

        Raises
        ------
        ProfileError
            When the profile was not measured on a host (no ``host.bandwidth``).
        """
        if self.host_bandwidth is None:
            raise ProfileError("has no host bandwidth: it describes a cluster's runtime, not "
                               "a machine it was measured on; calibrate one with topoplan "
                               "calibrate", key=self.name)
        from ..cluster import host_cluster
        n = int(nranks or self.host_ranks or 1)
        return host_cluster(f"host-{self.name}", n, self.host_bandwidth, self.host_cores)

    # -- YAML -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The YAML form (times as ``"3.4 us"``, bandwidths as ``"1.2 GB/s"``)."""
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.sources:
            out["sources"] = self.sources
        if self.alpha_box == self.alpha_network:
            out["alpha"] = _time_text(self.alpha_box)
        else:
            out["alpha"] = {"box": _time_text(self.alpha_box),
                            "network": _time_text(self.alpha_network)}
        if self.small_max is not None:
            alpha: Any = (_time_text(self.small_alpha_box)
                          if self.small_alpha_box == self.small_alpha_network else
                          {"box": _time_text(self.small_alpha_box),
                           "network": _time_text(self.small_alpha_network)})
            out["small_messages"] = {"max_bytes": self.small_max, "alpha": alpha}
        out["op_overhead"] = _time_text(self.op_overhead)
        out["step_overhead"] = _time_text(self.step_overhead)
        out["call_overhead"] = _time_text(self.call_overhead)
        out["reduce_bandwidth"] = ("none" if self.reduce_bandwidth is None
                                   else _bandwidth_text(self.reduce_bandwidth))
        if self.nvlink is not None:
            out["nvlink"] = self.nvlink
        if self.native_model is not None:
            out["native"] = self.native_model
        elif self.native_costs:
            out["native"] = {kind: cost.to_dict() for kind, cost in self.native_costs}
        if self.host_bandwidth is not None:
            host: dict[str, Any] = {"bandwidth": _bandwidth_text(self.host_bandwidth)}
            if self.host_cores is not None:
                host["cores"] = self.host_cores
            if self.host_ranks is not None:
                host["ranks"] = self.host_ranks
            out["host"] = host
        if self.calibration:
            out["calibration"] = _plain(self.calibration)
        return out

    def dumps(self) -> str:
        """YAML text that :func:`loads_profile` reads back to an equal profile."""
        import yaml
        return yaml.safe_dump(self.to_dict(), sort_keys=False, width=100)

    def save(self, path: str | Path, header: str = "") -> None:
        """Write the YAML form to ``path`` (atomically: a half-written file never stays),
        after ``header`` as ``#`` comment lines."""
        from .._util import atomic_write
        comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
        atomic_write(path, comment + self.dumps())

    def summary(self) -> str:
        """One line: ``nccl: alpha 3.4 us (box) / 9.6 us (network), op 0.5 us, ...``."""
        if self.alpha_box == self.alpha_network:
            alpha = f"alpha {_time_text(self.alpha_box)}"
        else:
            alpha = (f"alpha {_time_text(self.alpha_box)} (box) / "
                     f"{_time_text(self.alpha_network)} (network)")
        red = "free" if self.reduce_bandwidth is None else _bandwidth_text(self.reduce_bandwidth)
        if self.small_max is not None:
            small = (_time_text(self.small_alpha_box) if self.small_alpha_box ==
                     self.small_alpha_network else f"{_time_text(self.small_alpha_box)} / "
                     f"{_time_text(self.small_alpha_network)}")
            alpha += f" ({small} up to {self.small_max} B)"
        nvlink = f", NVLink at {self.nvlink.upper()}'s rate" if self.nvlink else ""
        native = ""
        if self.native_model is not None:
            native = f", native steps by the {self.native_model.upper()} model"
        elif self.native_costs:
            native = f", native {'/'.join(kind for kind, _ in self.native_costs)} measured"
        return (f"{self.name}: {alpha}, op {_time_text(self.op_overhead)}, step "
                f"{_time_text(self.step_overhead)}, call {_time_text(self.call_overhead)}, "
                f"reduce {red}{nvlink}{native}")


IDEAL = CostProfile(name="ideal", description="links only: no software costs")


def _time_text(seconds: float) -> str:
    if seconds == 0:
        return "0 us"
    return f"{seconds * 1e6:.6g} us"


def _bandwidth_text(bps: float) -> str:
    return f"{bps / 1e9:.6g} GB/s"


def _plain(value: Any) -> Any:
    """Mappings and sequences as plain dicts and lists (for yaml.safe_dump)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


# ----------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------
def profile_names() -> list[str]:
    """The shipped profiles (``topoplan/analysis/profiles/*.yaml``)."""
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
    from .._yaml import read_text
    return loads_profile(read_text(path, "cost profile", ProfileError), str(path))


def loads_profile(text: str, file: str = "<string>") -> CostProfile:
    """Like :func:`load_profile`, from YAML text; ``file`` names it in errors.

    The format (bare numbers are microseconds and GB/s, as in cluster files, and warned
    about as :class:`~topoplan.errors.UnitWarning`)::

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
    from .._yaml import LineDict, load_yaml
    from ..units import bare_number_note, parse_bandwidth, parse_latency, parse_size

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

    def seconds(mapping: LineDict, key: str, path: str) -> float:
        value = mapping[key]
        try:
            out = parse_latency(value)
        except ValueError as exc:
            raise fail(mapping, key, str(exc), path) from None
        if out < 0:
            raise fail(mapping, key, f"must be >= 0, got {value!r}", path)
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
            raise fail(mapping, key, str(exc), path) from None
        if not out > 0:
            raise fail(mapping, key, f"must be > 0, got {value!r}", path)
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
                costs[attr] = value
    calibration = doc.get("calibration") or {}
    if not isinstance(calibration, dict):
        raise fail(doc, "calibration", "expected a mapping")
    return CostProfile(name=name, description=string("description"), sources=string("sources"),
                       calibration=_freeze(calibration), **costs)


def _native_section(doc: Any, file: str, seconds: Any, bandwidth: Any) -> dict[str, Any]:
    """``native:`` of a profile: a model's name, or the measured collectives by kind."""
    from .._yaml import LineDict

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
