"""``C10d``: point-to-point over a bare c10d backend object (``ProcessGroupGloo``,
``ProcessGroupNCCL``), not over a registered torch.distributed group.

The ``topoplan`` torch.distributed backend (:mod:`topoplan.torch.backend`) is itself a
process group: the :class:`~topoplan.runtime.transports.Torch` transport over it would
send through ``dist.batch_isend_irecv`` on that group, i.e. back into the backend. This
transport instead calls the methods of an inner backend object directly
(``backend.send([t], peer, tag)``, ``backend.recv(...)``, ``backend.allreduce([t])``),
so nothing goes through torch.distributed's group registry and nothing recurses.

Everything else is :class:`~topoplan.runtime.transports.Torch`'s: waits carry the time
left to the step's deadline, gloo is not pollable (its point-to-point work completes
only inside ``wait``), and the native collectives of the whole group
(``native_allreduce``, ``native_reduce_scatter``, ``native_allgather``, and native steps
over every rank) are the inner backend's own. Native steps over a part of the group
raise :class:`~topoplan.runtime.transports.NoNative` when the executor is built: the
measured choice then drops such a candidate on every rank alike.

On NCCL, one step's messages are posted between ``_start_coalescing`` and
``_end_coalescing`` (what ``batch_isend_irecv`` does), so that a step that sends to and
receives from one peer cannot deadlock.
"""

from __future__ import annotations

import pickle
from typing import Any, Sequence

from .base import Collective, Group, Message, NativeWork, NoNative, PeerFailure
from .torch import Torch, _WorksNative, _first_line, _torch

__all__ = ["C10d"]


def _c10d() -> Any:
    """torch's c10d bindings (``AllgatherOptions`` is not re-exported by
    torch.distributed)."""
    import torch._C._distributed_c10d as c10d
    return c10d


class _Whole:
    """The native group of every rank: the inner backend itself."""

    def __init__(self, backend: Any) -> None:
        self.inner = backend


class _BackendNative(_WorksNative):
    """A native step over every rank, on the inner backend's own collective."""

    def __init__(self, transport: C10d, op: Collective) -> None:
        self.t, self.op = transport, op
        self.tensor = transport.prepare(op.view)
        self.works: list[Any] = []
        self.copy_out: list[tuple[Any, Any]] = []
        self.copy_in: list[tuple[Any, Any]] = []
        dist, backend, tensor = transport._dist, transport.inner, self.tensor
        kind = op.kind
        if kind == "allreduce":
            self.call = f"{transport.backend} allreduce"
            self.post = lambda: [backend.allreduce([tensor], dist.AllreduceOptions())]
        elif kind in ("reduce_scatter", "allgather") and op.equal:
            a, b = op.part(op.index)
            part = transport.prepare(op.empty(b - a))
            if kind == "reduce_scatter":
                self.call = f"{transport.backend} _reduce_scatter_base"
                self.copy_out.append((tensor[a:b], part))
                self.post = lambda: [backend._reduce_scatter_base(
                    part, tensor, dist.ReduceScatterOptions())]
            else:
                self.call = f"{transport.backend} _allgather_base"
                self.copy_in.append((part, tensor[a:b]))
                self.post = lambda: [backend._allgather_base(tensor, part,
                                                             _c10d().AllgatherOptions())]
        elif kind == "broadcast":
            self.call = f"{transport.backend} broadcast"
            options = dist.BroadcastOptions()
            options.rootRank = op.group[op.root]  # type: ignore[index]
            self.post = lambda: [backend.broadcast([tensor], options)]
        else:
            raise NoNative(f"the {transport.name} transport runs native {kind} over every "
                           "rank only as equal parts")

    def start(self) -> None:
        for dst, src in self.copy_in:
            dst.copy_(src)
        try:
            self.works = self.post()
        except RuntimeError as exc:
            raise PeerFailure(0, _first_line(exc)) from None



class C10d(Torch):
    """Point-to-point messages over a c10d backend object.

    Parameters
    ----------
    backend : torch.distributed.ProcessGroupGloo or ProcessGroupNCCL
        Made by the caller (one per process group, every rank alike); peers are its
        ranks.
    device : torch.device
        What it moves: CPU tensors (gloo) or this rank's GPU (nccl).
    """

    name = "torch"
    native_name = "c10d allreduce"

    def __init__(self, backend: Any, device: Any) -> None:  # noqa: D107 - no super call
        torch, dist = _torch()
        self._torch, self._dist = torch, dist
        self.inner = backend
        self.backend = str(backend.name()) if hasattr(backend, "name") else "c10d"
        self.group = None
        self.rank = int(backend.rank())
        self.size = int(backend.size())
        self.device = torch.device(device)
        self.name = f"torch/{self.backend}"
        self._global = list(range(self.size))
        self._broken: dict[Group, str] = {}
        self._lacks: dict[str, bool] = {}
        self._coalesce = self.device.type == "cuda"

    # -- the hot path ----------------------------------------------------------------
    def start(self, messages: Sequence[Message]) -> list[Any]:
        backend = self.inner
        if not messages:
            return []
        if self._coalesce:
            backend._start_coalescing(self.device)
        works = [backend.send([m.wire], m.peer, m.tag) if m.send
                 else backend.recv([m.wire], m.peer, m.tag) for m in messages]
        if self._coalesce:
            work = backend._end_coalescing(self.device)
            return [work] if work is not None else works
        return works

    # -- native steps: the whole group only ---------------------------------------------
    def _new_group(self, group: Group) -> Any:
        if tuple(group) == tuple(range(self.size)):
            return _Whole(self.inner)
        raise NoNative(f"the {self.name} transport of the topoplan backend runs native steps "
                       "over every rank only")

    def native(self, op: Collective) -> NativeWork:
        if not isinstance(self.group_of(op.group), _Whole):
            raise NoNative(f"the {self.name} transport runs native steps over every rank only")
        return _BackendNative(self, op)

    def native_allreduce(self, buffer: Any) -> None:
        self.inner.allreduce([self._tensor(buffer)], self._dist.AllreduceOptions()).wait()

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        self.inner._reduce_scatter_base(self._tensor(output), self._tensor(input),
                                          self._dist.ReduceScatterOptions()).wait()

    def native_allgather(self, input: Any, output: Any) -> None:
        self.inner._allgather_base(self._tensor(output), self._tensor(input),
                                     _c10d().AllgatherOptions()).wait()

    def native_name_of(self, collective: str) -> str:
        return {"reduce_scatter": f"{self.backend} _reduce_scatter_base",
                "allgather": f"{self.backend} _allgather_base"}.get(
                    collective, f"{self.backend} allreduce")

    # -- small collectives --------------------------------------------------------------
    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        dist = self._dist
        t = self._torch.tensor([float(v) for v in values], dtype=self._torch.float64,
                               device=self.device)
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self.inner.allreduce([t], options).wait()
        return [float(v) for v in t.tolist()]

    def allreduce_max(self, value: float) -> float:
        return self.allreduce_max_many([value])[0]

    def barrier(self) -> None:
        self.inner.barrier(self._dist.BarrierOptions()).wait()

    def share(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled, two broadcasts): plans are made on
        rank 0 only, so ranks cannot disagree on them."""
        torch, dist = self._torch, self._dist
        data = pickle.dumps(obj) if self.rank == 0 else b""
        length = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.inner.broadcast([length], options).wait()
        payload = torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device)
        if self.rank == 0:
            payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.inner.broadcast([payload], options).wait()
        return obj if self.rank == 0 else pickle.loads(payload.cpu().numpy().tobytes())
