"""``Torch``: point-to-point over torch.distributed (``batch_isend_irecv``).

gloo moves CPU tensors, nccl CUDA tensors. numpy buffers are wrapped with
``torch.from_numpy`` (no copy). Every wait carries the time left to the step's
deadline (``Work.wait(timeout)``), so a dead or silent peer ends in a
:class:`~topoplan.TransportError`, not a hang.

:meth:`Torch.launch` starts ``nranks`` processes with a gloo (or nccl) process
group and runs a function in each (:mod:`topoplan.runtime.transports.launch`): the multi-process
counterpart of :meth:`topoplan.runtime.transports.Local.launch`.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from functools import partial
from typing import Any, Callable, Sequence

from ...errors import TopoplanError
from .base import Deadline, Message, NoNative, PeerFailure, Transport

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
                raise PeerFailure(i, str(exc).strip().splitlines()[0]) from None
        return []

    def _tensor(self, buffer: Any) -> Any:
        flat = buffer.reshape(-1)
        return self.prepare(flat)

    def native_allreduce(self, buffer: Any) -> None:
        self._dist.all_reduce(self._tensor(buffer), group=self.group)

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
            raise

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
        t = self._torch.tensor([float(value)], dtype=self._torch.float64, device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    # -- launching ---------------------------------------------------------------
    @staticmethod
    def launch(nranks: int, fn: Callable[..., Any], *args: Any, backend: str = "gloo",
               timeout: float = 120.0, return_exceptions: bool = False) -> list[Any]:
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
                                 return_exceptions=return_exceptions)


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
