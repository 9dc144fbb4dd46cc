"""DDP communication hooks that run topoplan schedules.

Same contract as ``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``::

    state = TopoplanHookState(cluster, algorithm="ring")
    ddp.register_comm_hook(state, allreduce_hook)          # or fp16_compress_hook

Each hook takes ``(state, bucket: dist.GradBucket)`` and returns a
``torch.futures.Future[torch.Tensor]`` holding the averaged bucket. The state plans
(and caches) one schedule per bucket byte size and replays it over the Torch
transport. The work runs on one background thread per state, in the order DDP
hands buckets over (DDP launches buckets in index order on every rank), so the
allreduce of bucket k overlaps the backward pass that fills bucket k+1.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# against dist.GradBucket and Future[Tensor] as objects, and strings fail that check.
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..errors import TopoplanError
from .compression import Compression
from .planned import PlannedAllreduce

__all__ = ["TopoplanHookState", "allreduce_hook", "fp16_compress_hook", "register"]


class TopoplanHookState:
    """What the hooks need: the cluster, the planned allreduce per size, a worker thread.

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

    Raises
    ------
    TopoplanError
        If torch.distributed is not initialised or the cluster's rank count is not the
        process group's size.
    """

    def __init__(self, cluster: Any = None, *, algorithm: str = "auto",
                 process_group: Any = None, allreduce: Callable[[Any], Any] | None = None,
                 timeout: float = 60.0) -> None:
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
            from topoplan.transports import Torch

            allreduce = PlannedAllreduce(cluster, Torch(process_group), algorithm=algorithm,
                                         share=self._share, timeout=timeout)
        elif getattr(allreduce, "nranks", self.world_size) != self.world_size:
            raise TopoplanError(f"allreduce callable spans {allreduce.nranks} ranks, "  # type: ignore[attr-defined]
                                f"the process group {self.world_size}")
        self.cluster = cluster
        self.algorithm = algorithm
        self.allreduce = allreduce
        self.hook_seconds = 0.0   # wall time of the hooks' work on the worker thread
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="topoplan-ddp")

    def _share(self, obj: Any) -> Any:
        holder = [obj]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(self.process_group, 0)
                                   if self.process_group is not None else 0,
                                   group=self.process_group)
        return holder[0]

    def submit(self, work: Callable[[], torch.Tensor]) -> torch.futures.Future:
        """Run ``work()`` on the state's worker thread; a Future of its tensor."""
        future: torch.futures.Future = torch.futures.Future()

        def run() -> None:
            start = time.perf_counter()
            try:
                result = work()
            except BaseException as exc:  # noqa: BLE001 - handed to DDP, which re-raises it
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self.hook_seconds += time.perf_counter() - start

        self._worker.submit(run)
        return future

    def close(self) -> None:
        """Stop the worker thread (after the work already submitted)."""
        self._worker.shutdown(wait=True)


def allreduce_hook(state: TopoplanHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket across ranks with the state's planned allreduce (fp32 on the wire).

    Matches DDP's default: divide by the world size, then sum.
    """
    tensor = bucket.buffer()

    def work() -> torch.Tensor:
        tensor.div_(state.world_size)
        state.allreduce(tensor)
        return tensor

    return state.submit(work)


def fp16_compress_hook(state: TopoplanHookState,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress to fp16, run the planned allreduce, decompress, average.

    The bucket is divided by the world size *before* the cast, so the fp16 sum is the
    mean and cannot overflow unless the mean itself exceeds 65504.
    """
    buffer = bucket.buffer()

    def work() -> torch.Tensor:
        wire, ctx = Compression.fp16.compress(buffer.div_(state.world_size))
        state.allreduce(wire)
        buffer.copy_(Compression.fp16.decompress(wire, ctx))
        return buffer

    return state.submit(work)


def register(ddp: torch.nn.parallel.DistributedDataParallel, cluster: Any = None, *,
             algorithm: str = "auto", fp16: bool = False, **state_kwargs: Any) -> TopoplanHookState:
    """Build a :class:`TopoplanHookState` and register the right hook on ``ddp``.

    Returns the state (its ``allreduce.stats`` hold the communication time).
    """
    state = TopoplanHookState(cluster, algorithm=algorithm,
                              process_group=ddp.process_group, **state_kwargs)
    ddp.register_comm_hook(state, fp16_compress_hook if fp16 else allreduce_hook)
    return state
