"""``Torch``: point-to-point over torch.distributed (``batch_isend_irecv``).

gloo moves CPU tensors, nccl CUDA tensors. numpy buffers are wrapped with
``torch.from_numpy`` (no copy). Every wait carries the time left to the step's
deadline (``Work.wait(timeout)``), so a dead or silent peer ends in a
:class:`~topoplan.TransportError`, not a hang.

gloo's point-to-point work completes only inside ``wait`` (the transport is not
pollable), so the executor runs a channelled schedule's channels (IR v4) on a thread
each, every thread posting its channel's steps and waiting on its own works (their tags
never meet); see :mod:`topoplan.runtime.executor.engine`.

:meth:`Torch.launch` starts ``nranks`` processes with a gloo (or nccl) process
group and runs a function in each (:mod:`topoplan.runtime.transports.launch`): the multi-process
counterpart of :meth:`topoplan.runtime.transports.Local.launch`.

Native steps run torch.distributed's collectives (``async_op=True``) on a process group
per group, made once with ``dist.new_group`` (every rank of the world calls it, in the
same order; members in the op's order, ``sort_ranks=False`` where torch has it). The
whole world gets a group of its own too, not the transport's: the application issues
its own collectives on that group from its own threads (DDP's, the hook's plan
sharing), while the executor may issue from a progress thread, and two threads issuing
collectives on one group can order them differently on different ranks. A group of the
same ranks runs the same collective at the same cost. ``all_reduce``,
``reduce_scatter_tensor`` (parts of unequal size, or a group that torch ordered
otherwise, go through a padded copy; a backend without it, through ``all_reduce`` of a
copy of the range), ``all_gather_into_tensor`` (padded likewise; ``all_gather`` of a
list where that is missing), ``broadcast`` and ``reduce`` (on a copy at the other
members: gloo's reduce overwrites their buffers).
"""

from __future__ import annotations

import datetime
import inspect
import os
import re
import tempfile
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NoReturn, Sequence

from ...errors import TopoplanError, TransportError
from .base import (Collective, Deadline, Group, Message, NativeWork, NoNative, PeerFailure,
                   Transport)

__all__ = ["Torch"]


def _torch() -> tuple[Any, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise ImportError("topoplan.runtime.transports.torch needs PyTorch: "
                          "pip install 'topoplan[torch]'") from None
    if not dist.is_available():
        raise ImportError("this PyTorch build has no torch.distributed; install a build with it")
    return torch, dist


def _timed_out(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


def _unsupported(exc: BaseException) -> bool:
    """Whether ``exc`` says the backend lacks the collective (raised before anything
    moves, on every rank alike)."""
    low = str(exc).lower()
    return "not support" in low or "not implemented" in low


@dataclass(frozen=True, slots=True)
class _Group:
    """A native group's process group, and each member's rank in it (torch may sort)."""

    pg: Any
    rank_of: tuple[int, ...]  # rank_of[i]: the process group rank of the op's member i

    @property
    def in_order(self) -> bool:
        return self.rank_of == tuple(range(len(self.rank_of)))


class _WorksNative(NativeWork):
    """A native step whose calls are c10d works (``self.works``), with results copied
    out of scratch tensors (``self.copy_out``) once they completed."""

    works: list[Any]
    copy_out: list[tuple[Any, Any]]

    def test(self) -> bool:
        return all(work.is_completed() for work in self.works)

    def wait(self, timeout: float) -> bool:
        deadline = Deadline(timeout)
        for work in self.works:
            try:
                # timedelta(0) would mean "the group's default": never pass it.
                work.wait(datetime.timedelta(seconds=max(deadline.left(), 1e-3)))
            except RuntimeError as exc:
                if _timed_out(exc):
                    return False
                raise PeerFailure(0, _first_line(exc)) from None
        return True

    def finish(self) -> None:
        for dst, src in self.copy_out:
            dst.copy_(src)


class _TorchNative(_WorksNative):
    """A native step over a process group: one or two async collectives per call."""

    def __init__(self, transport: Torch, op: Collective, group: _Group) -> None:
        self.t, self.op, self.group = transport, op, group
        self.tensor = transport.prepare(op.view)
        self.works: list[Any] = []
        self.copy_in: list[tuple[Any, Any]] = []
        self.copy_out: list[tuple[Any, Any]] = []
        self.post: Callable[[], list[Any]]
        self._bind()

    def _bind(self) -> None:
        """Choose the calls and scratch (again after the backend turned out to lack one)."""
        transport, op, group, tensor = self.t, self.op, self.group, self.tensor
        self.copy_in, self.copy_out = [], []
        dist, pg = transport._dist, group.pg
        g, i = len(op.group), op.index
        a, b = op.part(i) if op.kind in ("reduce_scatter", "allgather") else (0, op.size)
        width = max(op.counts)  # a part, padded
        direct = op.equal and group.in_order

        def empty(n: int, zero: bool = False) -> Any:
            made = transport.prepare(op.empty(n))
            return made.zero_() if zero else made

        kind = op.kind
        if kind == "allreduce":
            self.call = "dist.all_reduce"
            self.post = lambda: [dist.all_reduce(tensor, group=pg, async_op=True)]
        elif kind == "reduce_scatter":
            name, fn = transport._native_fn(Torch._RS)
            if fn is None or transport._lacks.get("reduce_scatter"):
                self._by_allreduce()
            else:
                out = empty(width)
                self.copy_out.append((tensor[a:b], out[:b - a]))
                if direct:
                    self.call = name
                    self.post = lambda: [fn(out, tensor, group=pg, async_op=True)]
                else:
                    self.call = f"{name} (padded)"
                    padded = empty(g * width, zero=True)
                    for j in range(g):
                        c, d = op.part(j)
                        at = group.rank_of[j] * width
                        self.copy_in.append((padded[at:at + d - c], tensor[c:d]))
                    self.post = lambda: [fn(out, padded, group=pg, async_op=True)]
        elif kind == "allgather":
            name, fn = transport._native_fn(Torch._AG)
            mine = empty(width, zero=True)
            self.copy_in.append((mine[:b - a], tensor[a:b]))
            if fn is None or transport._lacks.get("allgather"):
                fn, name = self._gather_list(dist), "dist.all_gather"
            if direct:
                self.call = name
                self.post = lambda: [fn(tensor, mine, group=pg, async_op=True)]
            else:
                self.call = f"{name} (padded)"
                out = empty(g * width)
                for j in range(g):
                    c, d = op.part(j)
                    at = group.rank_of[j] * width
                    self.copy_out.append((tensor[c:d], out[at:at + d - c]))
                self.post = lambda: [fn(out, mine, group=pg, async_op=True)]
        elif kind == "broadcast":
            self.call = "dist.broadcast"
            src = transport._global[op.group[op.root]]  # type: ignore[index]
            self.post = lambda: [dist.broadcast(tensor, src=src, group=pg, async_op=True)]
        elif kind == "reduce":
            self.call = "dist.reduce"
            dst = transport._global[op.group[op.root]]  # type: ignore[index]
            target = tensor
            if i != op.root:
                target = empty(op.size)
                self.copy_in.append((target, tensor))
            self.post = lambda: [dist.reduce(target, dst=dst, group=pg, async_op=True)]
        else:  # pragma: no cover - NativeKind has no other value
            raise TopoplanError(f"unknown native collective {kind!r}")

    def _by_allreduce(self) -> None:
        """A backend without reduce-scatter: allreduce a copy of the range, keep the part."""
        op, dist, pg = self.op, self.t._dist, self.group.pg
        a, b = op.part(op.index)
        copy = self.t.prepare(op.empty(op.size))
        self.call = "dist.all_reduce (no reduce-scatter here)"
        self.copy_in = [(copy, self.tensor)]
        self.copy_out = [(self.tensor[a:b], copy[a:b])]
        self.post = lambda: [dist.all_reduce(copy, group=pg, async_op=True)]

    @staticmethod
    def _gather_list(dist: Any) -> Callable[..., Any]:
        """``all_gather_into_tensor``'s contract over the list form ``all_gather``."""
        def gather(out: Any, mine: Any, group: Any, async_op: bool) -> Any:
            return dist.all_gather(list(out.chunk(dist.get_world_size(group))), mine,
                                   group=group, async_op=async_op)
        return gather

    def start(self) -> None:
        t = self.t
        if self.op.group in t._broken:
            raise PeerFailure(0, f"its process group is broken: {t._broken[self.op.group]}")
        for dst, src in self.copy_in:
            dst.copy_(src)
        try:
            self.works = self.post()
        except RuntimeError as exc:
            kind = self.op.kind
            if (_unsupported(exc) and kind in ("reduce_scatter", "allgather")
                    and not t._lacks.get(kind)):
                # Said before anything moved, on every rank alike: fall back for good.
                t._lacks[kind] = True
                self._bind()
                self.start()
                return
            raise PeerFailure(0, _first_line(exc)) from None


    def abort(self) -> None:
        # A collective cannot be taken back: the members are out of step on this group.
        self.t._broken.setdefault(self.op.group, f"{self.call} failed or timed out")


def _first_line(exc: BaseException) -> str:
    """What a c10d error says, in one line: gloo's source location and its closing advice
    left out, and, where a connection closed, who that can be."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text.splitlines()[0])
    line = re.split(r"\.\s+This is typically caused by", line)[0].rstrip(". ")
    if _CLOSED.search(line):
        line += " (the peer's process died or left after an error of its own)"
    return line


#: gloo's words for a connection its peer closed.
_CLOSED = re.compile(r"closed by peer|reset by peer|broken pipe|end of file", re.IGNORECASE)


def _reraise(exc: BaseException) -> NoReturn:
    raise exc


class Torch(Transport):
    """Point-to-point messages over a torch.distributed process group.

    Parameters
    ----------
    group : ProcessGroup, optional
        Defaults to the world group; ``torch.distributed.init_process_group``
        must have run. Peers are ranks within ``group``.
    """

    name = "torch"
    native_name = "dist.all_reduce"
    # gloo's isend/irecv work only completes inside wait() (is_completed() stays False
    # until someone waits), so steps cannot be polled.
    pollable = False

    def __init__(self, group: Any = None) -> None:
        torch, dist = _torch()
        if not dist.is_initialized():
            raise TopoplanError("the Torch transport needs a process group: call "
                                "torch.distributed.init_process_group(...) first, or use "
                                "Torch.launch(nranks, fn)")
        self._torch, self._dist = torch, dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        if self.backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.name = f"torch/{self.backend}"
        # P2POp takes global ranks as ``peer``; translate group ranks once.
        self._global = [dist.get_global_rank(group, r) if group is not None else r
                        for r in range(self.size)]
        self._broken: dict[Group, str] = {}  # native groups whose collective failed: why
        self._lacks: dict[str, bool] = {}    # native collectives this backend turned out to lack

    def prepare(self, view: Any) -> Any:
        torch = self._torch
        module = type(view).__module__.split(".")[0]
        if module == "numpy":
            tensor = torch.from_numpy(view)
        elif module == "cupy":
            tensor = torch.from_dlpack(view)
        else:
            tensor = view
        if tensor.device.type != self.device.type:
            raise TopoplanError(f"the torch/{self.backend} transport moves {self.device.type} "
                                f"tensors, got a {tensor.device.type} buffer; use gloo for CPU "
                                f"buffers and nccl for CUDA ones")
        return tensor

    def start(self, messages: Sequence[Message]) -> list[Any]:
        dist = self._dist
        ops = [dist.P2POp(dist.isend if m.send else dist.irecv, m.wire, self._global[m.peer],
                          self.group, m.tag) for m in messages]
        return dist.batch_isend_irecv(ops) if ops else []

    def wait(self, handle: list[Any], timeout: float) -> list[int]:
        deadline = Deadline(timeout)
        for i, work in enumerate(handle):
            left = deadline.left()
            if left <= 0:
                return [j for j in range(i, len(handle)) if not handle[j].is_completed()]
            try:
                # timedelta(0) would mean "the group's default": never pass it.
                work.wait(datetime.timedelta(seconds=max(left, 1e-3)))
            except RuntimeError as exc:
                if _timed_out(exc):
                    return [j for j in range(i, len(handle)) if not handle[j].is_completed()]
                raise PeerFailure(i, _first_line(exc)) from None
        return []

    # -- native steps --------------------------------------------------------------
    def _new_group(self, group: Group) -> Any:
        # Also for the whole world (no _world_group override): see the module docstring.
        dist = self._dist
        ranks = [self._global[m] for m in group]
        takes = inspect.signature(dist.new_group).parameters
        options: dict[str, Any] = {}
        if "sort_ranks" in takes:
            options["sort_ranks"] = False  # group rank i is the op's member i
        if self.size != dist.get_world_size():
            # Ranks outside this transport's process group run no executor: only the
            # members make the group.
            if "use_local_synchronization" not in takes:
                raise NoNative("native steps over a transport smaller than the world need "
                               "torch.distributed's new_group(use_local_synchronization=True)")
            if self.rank not in group:
                return None
            options["use_local_synchronization"] = True
        pg = dist.new_group(ranks, **options)
        if self.rank not in group:
            return None
        return _Group(pg, tuple(dist.get_group_rank(pg, r) for r in ranks))

    def native(self, op: Collective) -> NativeWork:
        return _TorchNative(self, op, self.group_of(op.group))

    def _tensor(self, buffer: Any) -> Any:
        flat = buffer.reshape(-1)
        return self.prepare(flat)

    def native_allreduce(self, buffer: Any) -> None:
        tensor = self._tensor(buffer)
        self._agree("dist.all_reduce", lambda: self._dist.all_reduce(tensor, group=self.group))

    def _agree(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, a collective over the whole group (a native collective, the
        agreement on timings, the result check); a failure in it becomes a located
        :class:`~topoplan.TransportError`. A collective does not say which member failed."""
        try:
            return call()
        except RuntimeError as exc:
            raise TransportError(f"rank {self.rank}: {self.name} {what} failed: "
                                 f"{_first_line(exc)}; {self.name} cannot tell which rank "
                                 "failed", rank=self.rank) from None

    def _native_fn(self, names: tuple[str, ...]) -> tuple[str, Any]:
        """The first of ``names`` this torch.distributed has (newer names first: 2.13
        deprecated ``*_into_tensor`` / ``*_tensor`` for ``*_single``)."""
        for name in names:
            fn = getattr(self._dist, name, None)
            if fn is not None:
                return f"dist.{name}", fn
        return f"dist.{names[-1]}", None

    _RS = ("reduce_scatter_single", "reduce_scatter_tensor")
    _AG = ("all_gather_single", "all_gather_into_tensor")

    def native_name_of(self, collective: str) -> str:
        names = {"reduce_scatter": self._RS, "allgather": self._AG}.get(collective)
        return self.native_name if names is None else self._native_fn(names)[0]

    def _native(self, names: tuple[str, ...], output: Any, input: Any) -> None:
        name, fn = self._native_fn(names)
        if fn is None:
            raise NoNative(f"this PyTorch has no {name}")
        try:
            fn(self._tensor(output), self._tensor(input), group=self.group)
        except RuntimeError as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            low = text.lower()
            if "not support" in low or "does not support" in low or "not implemented" in low:
                # Raised by the backend before anything moves, on every rank alike.
                raise NoNative(f"{name} on {self.backend}: {text}") from None
            self._agree(name, lambda: _reraise(exc))

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        """``reduce_scatter_tensor`` (sum) from ``input`` into ``output``.

        Raises
        ------
        NoNative
            When the backend has no reduce-scatter (gloo before PyTorch 2.x had none).
        """
        self._native(self._RS, output, input)

    def native_allgather(self, input: Any, output: Any) -> None:
        """``all_gather_into_tensor`` of ``input`` into ``output``."""
        self._native(self._AG, output, input)

    def allreduce_max(self, value: float) -> float:
        return self.allreduce_max_many([value])[0]

    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        t = self._torch.tensor([float(v) for v in values], dtype=self._torch.float64,
                               device=self.device)
        self._agree("agreement (all_reduce MAX)", lambda: self._dist.all_reduce(
            t, op=self._dist.ReduceOp.MAX, group=self.group))
        return [float(v) for v in t.tolist()]

    def barrier(self) -> None:
        self._agree("barrier", lambda: self._dist.barrier(group=self.group))

    # -- launching ---------------------------------------------------------------
    @staticmethod
    def launch(nranks: int, fn: Callable[..., Any], *args: Any, backend: str = "gloo",
               timeout: float = 120.0, return_exceptions: bool = False,
               start_method: str = "spawn") -> list[Any]:
        """Run ``fn(transport, *args)`` in ``nranks`` fresh processes; return their results
        (:func:`topoplan.runtime.transports.launch.run_processes`, each rank joining a process
        group through a file in a temporary folder).

        Parameters
        ----------
        nranks : int
        fn : callable
            A module-level function (it is pickled into spawned processes).
        backend : str
            ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank).
        timeout : float
            Seconds to wait for all ranks; the process group gets the same timeout.
        return_exceptions : bool
            Return each failed rank's error in its slot instead of raising. A rank
            that died without a word gets a :class:`TransportError` naming its exit code.
        start_method : str
            ``"spawn"`` or ``"forkserver"`` (ranks fork from a server that imported torch
            once: see :func:`~topoplan.runtime.transports.launch.run_processes`).

        Raises
        ------
        TopoplanError
            The first rank's error (lowest rank) unless ``return_exceptions``.
        """
        from .launch import run_processes
        _torch()
        with tempfile.TemporaryDirectory(prefix="topoplan-torch-") as tmp:
            init = f"file://{os.path.join(tmp, 'store')}"
            return run_processes(nranks, fn, args, partial(_connect_rank, backend, init, timeout),
                                 close=_destroy_group, timeout=timeout, name="topoplan-torch",
                                 return_exceptions=return_exceptions, start_method=start_method)


def _init_group(init_method: str, *, rank: int, size: int, backend: str = "gloo",
                   timeout: float = 120.0) -> Torch:
    """Join ``size`` ranks in torch.distributed's default process group through
    ``init_method`` (``tcp://HOST:PORT``, ``file://PATH``) and return the transport over
    it. With ``backend="nccl"`` the rank first takes GPU ``rank % device_count``.

    Raises
    ------
    ImportError
        Without PyTorch, or with a build without torch.distributed.
    """
    torch, dist = _torch()
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    return Torch()


def _connect_rank(backend: str, init: str, timeout: float, rank: int, nranks: int) -> Torch:
    """A rank of :meth:`Torch.launch` (in its spawned process): over loopback."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return _init_group(init, rank=rank, size=nranks, backend=backend, timeout=timeout)


def _destroy_group() -> None:
    """End a rank of :meth:`Torch.launch`: leave the process group, if it joined one."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group after a failure
            pass
