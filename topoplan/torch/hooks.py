"""DDP communication hooks that run topoplan schedules.

Same contract as ``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``::

    with TopoplanHookState(cluster, algorithm="ring") as state:
        ddp.register_comm_hook(state, allreduce_hook)      # or fp16_compress_hook
        train(ddp)
    dist.destroy_process_group()

(or ``with register_hook(ddp, cluster) as state:``; ``register`` is the same function).
Leaving the block closes the state and
collects the reference cycles training left (see :meth:`TopoplanHookState.__exit__`);
``state.close()`` and ``gc.collect()`` by hand do the same.

Each hook takes ``(state, bucket: dist.GradBucket)`` and returns a
``torch.futures.Future[torch.Tensor]`` holding the averaged bucket. The state plans
(and caches) one schedule per bucket byte size and replays it over the Torch
transport. A hook *starts* the bucket's allreduce (:meth:`topoplan.Allreduce.start`)
in the order DDP hands buckets over (bucket index order on every rank) and returns a
Future that the handle completes, so the allreduce of bucket k overlaps the backward
pass that fills bucket k+1. DDP waits on the Futures from C++, where nothing moves the
transport, and gloo's point-to-point work only completes inside a wait, so one progress
thread per state (a :class:`~topoplan.torch.progress.ProgressThread`) waits on the calls
in flight in start order and completes their Futures (one thread for all calls, not one
per call). An ``allreduce`` callable without ``start`` runs whole on that thread
instead. :meth:`TopoplanHookState.close` stops the thread; threads still running at
interpreter exit are closed by an ``atexit`` handler, because a progress thread that
has run DDP's Future callbacks and is still alive when the interpreter shuts down
aborts the process (``terminate called without an active exception``, seen on about
half of 2-rank gloo runs).
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# against dist.GradBucket and Future[Tensor] as objects, and strings fail that check.
import gc
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..errors import TopoplanError
from .compression import Compression
from .planned import PlannedAllreduce
from .progress import ProgressThread

__all__ = ["TopoplanHookState", "allreduce_hook", "fp16_compress_hook", "register_hook",
           "register"]


def _value(future: torch.futures.Future) -> Any:
    """``future.value()``: raises what the call raised (see :meth:`TopoplanHookState.launch`)."""
    return future.value()


class TopoplanHookState:
    """What the hooks need: the cluster, the planned allreduce per size, a progress thread.

    Parameters
    ----------
    cluster : topoplan.cluster.Cluster, optional
        The topology; ``cluster.nranks`` must equal the process group's size. Required
        unless ``allreduce`` is given.
    algorithm : str
        Planner passed to :func:`topoplan.plan` for every bucket size.
    process_group : torch.distributed.ProcessGroup, optional
        Group the Torch transport sends over (default: the world).
    allreduce : callable, optional
        Use this ``allreduce(tensor)`` (in-place sum with an ``nranks`` attribute)
        instead of planning, e.g. :func:`~topoplan.torch.planned.torch_native_allreduce`
        as a baseline.
    timeout : float
        Seconds any transfer may wait before :class:`topoplan.TransportError`.
    profile : str, CostProfile or path, optional
        What plans are priced with (default: the transport's own:
        :class:`~topoplan.torch.PlannedAllreduce`).
    mode : {"measured", "model"}, optional
        For ``auto``: time the best candidates on the first calls of each size class
        (default, unless ``TOPOPLAN_AUTO=model``) or keep the model's choice.

    Raises
    ------
    TopoplanError
        If torch.distributed is not initialised or the cluster's rank count is not the
        process group's size.
    """

    def __init__(self, cluster: Any = None, *, algorithm: str = "auto",
                 process_group: Any = None, allreduce: Callable[[Any], Any] | None = None,
                 timeout: float = 60.0, profile: Any = None, mode: str | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise TopoplanError("TopoplanHookState needs torch.distributed initialised: "
                                "call dist.init_process_group('gloo') first")
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        if allreduce is None:
            if cluster is None:
                raise TopoplanError("TopoplanHookState needs a cluster (or an allreduce callable)")
            if cluster.nranks != self.world_size:
                raise TopoplanError(
                    f"cluster {cluster.name!r} has {cluster.nranks} ranks but the process group "
                    f"has {self.world_size}; pick a cluster with {self.world_size} ranks")
            from topoplan.runtime.transports import Torch

            allreduce = PlannedAllreduce(cluster, Torch(process_group), algorithm=algorithm,
                                         share=self._share, timeout=timeout, profile=profile,
                                         mode=mode)
        elif getattr(allreduce, "nranks", self.world_size) != self.world_size:
            raise TopoplanError(f"allreduce callable spans {allreduce.nranks} ranks, "  # type: ignore[attr-defined]
                                f"the process group {self.world_size}")
        self.cluster = cluster
        self.algorithm = algorithm
        self.allreduce = allreduce
        self.hook_seconds = 0.0   # wall time from each hook's start to its Future's result
        # Wall time with a call in flight (time when several were counted once).
        self.comm_seconds = 0.0
        self._last_done = 0.0
        # Calls in flight in start order, guarded by the progress thread's lock; at close
        # the thread finishes them all (drain) before it stops.
        self._inflight: list[tuple[Any, torch.futures.Future, Callable[[], torch.Tensor],
                                   float]] = []
        self._progress = ProgressThread(self._complete_first, lambda: bool(self._inflight),
                                        name="topoplan-ddp-progress", drain=True)

    def _share(self, obj: Any) -> Any:
        holder = [obj]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(self.process_group, 0)
                                   if self.process_group is not None else 0,
                                   group=self.process_group)
        return holder[0]

    def launch(self, buffer: torch.Tensor, finish: Callable[[], torch.Tensor]
               ) -> torch.futures.Future:
        """Start the allreduce of ``buffer`` now; a Future of ``finish()``, which runs
        once the allreduce is done (on the progress thread)."""
        future: torch.futures.Future = torch.futures.Future()
        # DDP's reducer reads the Future in C++, where an exception set from Python is
        # only an object ("Unable to cast <message> to Tensor"); a callback that raises
        # marks the Future it returns failed, with the message, as C++ expects.
        handed = future.then(_value)
        start = getattr(self.allreduce, "start", None)
        began = time.perf_counter()
        try:
            handle = start(buffer) if start is not None else _Deferred(self.allreduce, buffer)
        except BaseException as exc:  # noqa: BLE001 - handed to DDP, which re-raises it
            future.set_exception(exc)
            return handed
        with self._progress.lock:
            if self._progress.closed:
                raise TopoplanError("TopoplanHookState is closed")
            self._inflight.append((handle, future, finish, began))
            self._progress.wake()
        return handed

    def _complete_first(self) -> None:
        """The progress thread's step: wait for the oldest call, complete its Future."""
        with self._progress.lock:
            # Start order: every rank waits for the same call first.
            handle, future, finish, began = self._inflight[0]
        result: Any = None
        try:
            handle.wait()  # moves this call and those behind it (gloo: only in wait)
            result = finish()
        except BaseException as exc:  # noqa: BLE001 - handed to DDP, which re-raises it
            result = exc
        with self._progress.lock:
            self._inflight.pop(0)
            now = time.perf_counter()
            self.hook_seconds += now - began
            # Calls finish in start order: each adds the time since it began or
            # since the one before it finished, whichever is later.
            self.comm_seconds += now - max(began, self._last_done)
            self._last_done = now
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def close(self) -> None:
        """Finish the calls in flight and stop the progress thread."""
        self._progress.close()

    def __enter__(self) -> "TopoplanHookState":
        return self

    def __exit__(self, *exc: Any) -> None:
        """:meth:`close`, then collect reference cycles: training leaves some that keep
        the gloo process group alive, and one still alive when the interpreter shuts
        down aborts the process (``terminate called without an active exception``);
        so leave the block before ``dist.destroy_process_group()``."""
        self.close()
        gc.collect()


class _Deferred:
    """A whole ``allreduce(buffer)`` call, run by the progress thread when it waits:
    for callables without ``start``."""

    def __init__(self, allreduce: Callable[[Any], Any], buffer: Any) -> None:
        self.allreduce, self.buffer = allreduce, buffer

    def wait(self) -> Any:
        return self.allreduce(self.buffer)


def allreduce_hook(state: TopoplanHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket across ranks with the state's planned allreduce (fp32 on the wire).

    Matches DDP's default: divide by the world size, then sum.
    """
    tensor = bucket.buffer()
    tensor.div_(state.world_size)
    return state.launch(tensor, lambda: tensor)


def fp16_compress_hook(state: TopoplanHookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress to fp16, run the planned allreduce, decompress, average.

    The bucket is divided by the world size *before* the cast, so the fp16 sum is the
    mean and cannot overflow unless the mean itself exceeds 65504.
    """
    buffer = bucket.buffer()
    wire, ctx = Compression.fp16.compress(buffer.div_(state.world_size))

    def finish() -> torch.Tensor:
        buffer.copy_(Compression.fp16.decompress(wire, ctx))
        return buffer

    return state.launch(wire, finish)


def register_hook(ddp: torch.nn.parallel.DistributedDataParallel, cluster: Any = None, *,
                  algorithm: str = "auto", fp16: bool = False,
                  **state_kwargs: Any) -> TopoplanHookState:
    """Register topoplan's DDP communication hook on ``ddp``; return its state.

    Builds a :class:`TopoplanHookState` on ``ddp``'s process group and calls
    ``ddp.register_comm_hook(state, hook)`` with :func:`allreduce_hook`, or
    :func:`fp16_compress_hook` with ``fp16=True``. ``register`` is the same function
    (the name it had first); neither registers a planner (:mod:`topoplan.planners`) or
    a CLI subcommand (:mod:`topoplan.commands`).

    Parameters
    ----------
    ddp : torch.nn.parallel.DistributedDataParallel
        The model to hook.
    cluster : topoplan.cluster.Cluster, optional
        The topology (see :class:`TopoplanHookState`).
    algorithm : str
        Planner for every bucket size.
    fp16 : bool
        Send fp16 on the wire.
    **state_kwargs
        More :class:`TopoplanHookState` arguments (``allreduce=``, ``timeout=``,
        ``profile=``, ``mode=``).

    Returns
    -------
    TopoplanHookState
        ``comm_seconds``: the time in communication; a context manager:
        ``with register_hook(ddp, cluster) as state: ...``.
    """
    state = TopoplanHookState(cluster, algorithm=algorithm,
                              process_group=ddp.process_group, **state_kwargs)
    ddp.register_comm_hook(state, fp16_compress_hook if fp16 else allreduce_hook)
    return state


#: The first name of :func:`register_hook`, kept: torch's own verb
#: (``register_comm_hook``) and the one the README uses.
register = register_hook
