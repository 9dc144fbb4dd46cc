"""What an estimate says: :class:`IterationEstimate`, one training iteration, and its
fused allreduces (:class:`Bucket`)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from typing import Any

__all__ = ["Bucket", "IterationEstimate", "JSON_KEYS"]

#: The headline numbers of :meth:`IterationEstimate.to_dict` (and
#: :meth:`IterationEstimate.to_json`), its first keys, in order (``topoplan estimate --json``).
JSON_KEYS = ("iteration_s", "compute_s", "comm_s", "exposed_comm_s", "samples_per_s",
             "efficiency")


@dataclass(frozen=True, slots=True)
class Bucket:
    """One fused allreduce: ``nbytes`` on the wire, ready, started and done (seconds from
    the start of the iteration), and the plan it ran (``algorithm``)."""

    nbytes: int
    tensors: int
    ready_s: float
    start_s: float
    end_s: float
    algorithm: str


@dataclass(frozen=True)
class IterationEstimate:
    """One iteration of data-parallel training on a cluster, estimated.

    ``efficiency`` is the throughput over ``nranks`` times one GPU's (compute alone);
    ``efficiency_box`` over ``nranks / box GPUs`` times one box's, estimated the same way
    on the cluster's first box alone.
    """

    cluster: str
    nranks: int
    model: str
    params: int
    batch_per_gpu: int
    mode: str
    bytes_per_param: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    iteration_s: float
    samples_per_s: float
    efficiency: float
    efficiency_box: float
    box_gpus: int
    buckets: tuple[Bucket, ...] = ()
    compute_source: str = ""
    gpu: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data: the six headline numbers (:data:`JSON_KEYS`), then
        the efficiency against one box, what was estimated, and the buckets (each fused
        allreduce: bytes, tensors, ready, start and end in seconds, its plan)."""
        out: dict[str, Any] = {key: float(getattr(self, key)) for key in JSON_KEYS}
        out.update(efficiency_box=float(self.efficiency_box), box_gpus=self.box_gpus,
                   cluster=self.cluster, nranks=self.nranks, model=self.model,
                   params=self.params, batch_per_gpu=self.batch_per_gpu, mode=self.mode,
                   bytes_per_param=self.bytes_per_param, gpu=self.gpu,
                   compute_source=self.compute_source,
                   buckets=[{"bytes": b.nbytes, "tensors": b.tensors, "ready_s": b.ready_s,
                             "start_s": b.start_s, "end_s": b.end_s,
                             "algorithm": b.algorithm} for b in self.buckets])
        return out

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON text (``topoplan estimate --json``), as
        :meth:`topoplan.ir.schedule.Schedule.to_json` returns text.

        It used to return the dict; for a deprecation period the text still answers the
        dict's lookups (``["iteration_s"]``, ``get``, ``keys``, ``items``, ``values``),
        each with a DeprecationWarning naming :meth:`to_dict`.
        """
        return _JsonText(self.to_dict(), indent)


class _JsonText(str):
    """JSON text that also answers, with a DeprecationWarning, the dict lookups callers of
    :meth:`IterationEstimate.to_json` made when it returned the dict. Everything else
    (iterating, ``len``, ``in``, ``json.dumps``) sees the text it is."""

    _data: dict[str, Any]

    def __new__(cls, data: dict[str, Any], indent: int | None = None) -> _JsonText:
        text = super().__new__(cls, json.dumps(data, indent=indent))
        text._data = data
        return text

    def _dict(self, use: str) -> dict[str, Any]:
        warnings.warn(f"IterationEstimate.to_json() returns JSON text; {use} on it is "
                      "deprecated: use IterationEstimate.to_dict() for the dict",
                      DeprecationWarning, stacklevel=3)
        return self._data

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return self._dict(f"[{key!r}]")[key]
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self._dict(".get()").get(key, default)

    def keys(self) -> Any:
        return self._dict(".keys()").keys()

    def items(self) -> Any:
        return self._dict(".items()").items()

    def values(self) -> Any:
        return self._dict(".values()").values()
