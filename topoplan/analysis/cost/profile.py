"""A cost profile: what a runtime pays besides moving bytes (the model:
:mod:`topoplan.analysis.cost`, docs/COST_MODEL.md), and its YAML form.

:class:`CostProfile` holds the costs, checks them when made and writes itself
(:meth:`CostProfile.to_dict`, :meth:`CostProfile.dumps`, :meth:`CostProfile.save`);
:class:`NativeCost` is a transport's own collective as measured. Reading a profile file and
the shipped profiles are :mod:`topoplan.analysis.cost.read`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ...errors import ProfileError
from ...units import BANDWIDTH_RANGE, MAX_SIZE, QuantityRange

__all__ = ["CostProfile", "NativeCost", "DEFAULT_PROFILE", "IDEAL", "NATIVE_KINDS",
           "NATIVE_MODELS", "NVLINK_MODELS", "native_bus_factor", "PROFILE_RANGES"]

#: The profile the CLI, :func:`topoplan.plan` and :func:`topoplan.simulate` use when none
#: is named: GPU clusters run NCCL (topoplan's NCCL transport posts each step as one NCCL
#: group).
DEFAULT_PROFILE = "nccl"

#: What ``nvlink:`` may say: ``nccl``, NVLink moves what NCCL counts per link
#: (:func:`topoplan.analysis.native.nccl_search.nvlink_view`), not the specification's rate.
NVLINK_MODELS = ("nccl",)
#: What ``native:`` may name instead of measured costs: ``nccl``, native steps are priced
#: by the NCCL model over their group (:mod:`topoplan.analysis.native.price`).
NATIVE_MODELS = ("nccl",)
#: The native collectives a profile may price (IR v3's native ops, docs/SCHEDULE.md).
NATIVE_KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")

#: What each number of a profile may be (docs/COST_MODEL.md, "Ranges"): beyond the limits
#: an error (the file's ``file:line: key``, or the field of a profile built in code),
#: outside the plausible range a :class:`~topoplan.errors.RangeWarning`.
#:
#: - times (``alpha``, the small messages' ``alpha``, ``op_overhead``, ``step_overhead``,
#:   ``call_overhead``, a native collective's ``alpha`` and ``alpha_per_rank``): limits
#:   0 to 1e6 s, as a cluster's latencies (beyond, the simulator's clock can no longer
#:   tell events apart); plausible up to 100 ms: the slowest shipped cost is gloo's call
#:   overhead, 2.5 ms on a loaded 2-CPU machine, and a runtime that takes a tenth of a
#:   second to post an op is a unit mixed up (``ms`` for ``us``);
#: - bandwidths (``reduce_bandwidth``, ``host.bandwidth``, a native collective's
#:   ``bandwidth``): a cluster link's range (:data:`~topoplan.units.BANDWIDTH_RANGE`);
#: - ``small_messages.max_bytes``: limits 0 to 2**60 bytes (a message size,
#:   :data:`~topoplan.units.MAX_SIZE`); plausible up to 1 GiB (MPI's eager and NCCL's
#:   LL thresholds are kilobytes to megabytes);
#: - ``host.ranks``: 1 to 4096, the GPUs one box may hold (``host_cluster`` is one box);
#:   plausible up to 1024; ``host.cores``: 1 to 2**20, plausible up to 4096.
PROFILE_RANGES = {
    "time": QuantityRange("time", (0.0, 1e6), (0.0, 0.1), "0 to 1e6 s (11.6 days)",
                          "0 to 100 ms"),
    "bandwidth": BANDWIDTH_RANGE,
    "bytes": QuantityRange("message size", (0, MAX_SIZE), (0, 1 << 30),
                           "0 to 2**60 bytes (1 EiB)", "0 to 1 GiB", "check the unit (bytes)"),
    "ranks": QuantityRange("rank count", (1, 4096), (1, 1024), "1 to 4096 (one box)",
                           "1 to 1024", "is the count wrong?"),
    "cores": QuantityRange("core count", (1, 1 << 20), (1, 4096), "1 to 1048576",
                           "1 to 4096", "is the count wrong?"),
}


def _out_of_range(kind: str, value: Any, shown: str) -> str | None:
    """The error for ``value`` of a profile field of ``kind`` (a key of
    :data:`PROFILE_RANGES`) beyond its limits, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {value!r}"
    error, _ = PROFILE_RANGES[kind].problems(value, shown)
    return error


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
        # The reader checks a file's numbers line by line (naming file:line: key); these
        # checks hold a profile built in code to the same limits (PROFILE_RANGES).
        for key in ("alpha_box", "alpha_network", "small_alpha_box", "small_alpha_network",
                    "op_overhead", "step_overhead", "call_overhead"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ProfileError(f"must be a finite number of seconds >= 0, got {value!r}",
                                   key=f"{self.name}: {key}")
            self._in_range(key, "time", value, f"{value!r} s")
        if self.small_max is not None and (isinstance(self.small_max, bool)
                                           or not isinstance(self.small_max, int)
                                           or self.small_max < 0):
            raise ProfileError(f"must be a whole number of bytes >= 0 or None, got "
                               f"{self.small_max!r}", key=f"{self.name}: small_max")
        if self.small_max is not None:
            self._in_range("small_max", "bytes", self.small_max, f"{self.small_max} bytes")
        for key, kind in (("host_ranks", "ranks"), ("host_cores", "cores")):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ProfileError(f"must be a whole number or None, got {value!r}",
                                   key=f"{self.name}: {key}")
            if value is not None:
                self._in_range(key, kind, value, str(value))
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
                self._in_range(f"native.{kind}.{key}", "time", value, f"{value!r} s")
            if not (math.isfinite(cost.bandwidth) and cost.bandwidth > 0):
                raise ProfileError(f"must be > 0 bytes/s, got {cost.bandwidth!r}",
                                   key=f"{self.name}: native.{kind}.bandwidth")
            self._in_range(f"native.{kind}.bandwidth", "bandwidth", cost.bandwidth,
                           f"{cost.bandwidth!r} bytes/s")
        if self.nvlink is not None and self.nvlink not in NVLINK_MODELS:
            raise ProfileError(f"must be one of {', '.join(NVLINK_MODELS)} or None, got "
                               f"{self.nvlink!r}", key=f"{self.name}: nvlink")
        for key in ("reduce_bandwidth", "host_bandwidth"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not value > 0):
                raise ProfileError(f"must be > 0 bytes/s or None, got {value!r}",
                                   key=f"{self.name}: {key}")
            if value is not None:
                self._in_range(key, "bandwidth", value, f"{value!r} bytes/s")

    def _in_range(self, key: str, kind: str, value: Any, shown: str) -> None:
        """Raise :class:`ProfileError` for ``value`` beyond the limits of ``kind``."""
        error = _out_of_range(kind, value, shown)
        if error is not None:
            raise ProfileError(error, key=f"{self.name}: {key}")

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
        from ...cluster import host_cluster
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
        from ..._util import atomic_write
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
