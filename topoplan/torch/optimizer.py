"""Horovod-style DistributedOptimizer: tensor fusion, fp16 allreduce, double buffering.

For training without DDP (e.g. under ``mpiexec`` with the MPI transport)::

    allreduce = PlannedAllreduce(cluster, topoplan.transports.MPI(comm), algorithm="ring")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce=allreduce,
                               named_parameters=model.named_parameters(),
                               compression=Compression.fp16, double_buffering=True)
    for x, y in batches:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    opt.finalize()      # double buffering: apply the last step's gradients

Double buffering follows ChainerMN (``create_multi_node_optimizer(...,
double_buffering=True)``, Suzuki 2018): step ``t`` packs its gradients, starts
their allreduce in the background and applies the averaged gradients of step
``t-1``, so the allreduce overlaps step ``t+1``'s forward and backward. With
``g_t`` the gradient averaged over ranks at the parameters ``w_t``:

    step 0:      w_1 = w_0                        (nothing to apply yet; the inner
                                                   optimizer is not stepped at all)
    step t >= 1: w_{t+1} = update(w_t, g_{t-1})   (one step stale)
    finalize():  w_{T+1} = update(w_T, g_{T-1})   (flushes the last pending gradients)

so T steps plus ``finalize()`` apply exactly the T gradients computed, each once.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable

import torch

from .compression import Compression, Compressor

__all__ = ["DistributedOptimizer", "broadcast_parameters"]


class _Group:
    """Parameters fused into one flat buffer: same dtype, at most the threshold in bytes."""

    __slots__ = ("params", "names", "numels", "dtype", "buffers")

    def __init__(self, dtype: torch.dtype) -> None:
        self.params: list[torch.nn.Parameter] = []
        self.names: list[str] = []
        self.numels: list[int] = []
        self.dtype = dtype
        self.buffers: list[torch.Tensor] = []   # two of them with double buffering

    @property
    def numel(self) -> int:
        return sum(self.numels)


class DistributedOptimizer:
    """Wrap a torch optimizer so that ``step()`` applies gradients averaged over ranks.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The local optimizer; its ``step()`` runs on the averaged gradients.
    allreduce : callable
        ``allreduce(buffer)`` sums a contiguous 1-D tensor across ranks in place, e.g.
        :class:`topoplan.torch.PlannedAllreduce` over ``topoplan.transports.MPI(comm)``.
        Every rank must pass the same parameters in the same order.
    named_parameters : iterable of (str, Parameter), optional
        Names for messages and the order of fusion; default: the optimizer's params.
    compression : Compressor
        ``Compression.fp16`` (the default) sends fp16 and restores
        the gradient dtype; ``Compression.none`` sends the gradients as they are.
        Gradients are divided by the world size *before* compression, so the fp16 sum
        on the wire is already the mean and stays in range.
    fusion_threshold : int
        Bytes per fused buffer (Horovod's 64 MiB default). Gradients are packed in
        parameter order into buffers of up to this many bytes; a larger gradient gets a
        buffer of its own. ``0`` turns fusion off: one allreduce per parameter.
    double_buffering : bool
        Overlap step t's allreduce with step t+1's compute and apply gradients one step
        late (see the module docstring for the exact sequence). Call :meth:`finalize`
        after the last step.
    world_size : int, optional
        Ranks the allreduce spans; default ``allreduce.nranks``.

    Raises
    ------
    ValueError
        If a named parameter is not in the optimizer, a parameter is listed twice, or the
        world size is unknown.

    References
    ----------
    Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in
    TensorFlow", arXiv:1802.05799 (tensor fusion). Suzuki, "New ChainerMN functions for
    improved performance in cloud environments", Preferred Networks, 2018 (double
    buffering, fp16 allreduce).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, allreduce: Callable[[torch.Tensor], Any], *,
                 named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
                 compression: type[Compressor] | Compressor = Compression.fp16,
                 fusion_threshold: int = 64 << 20, double_buffering: bool = False,
                 world_size: int | None = None) -> None:
        self.optimizer = optimizer
        self.allreduce = allreduce
        self.compression = compression
        self.fusion_threshold = int(fusion_threshold)
        self.double_buffering = bool(double_buffering)
        world = world_size if world_size is not None else getattr(allreduce, "nranks", None)
        if world is None or int(world) < 1:
            raise ValueError("DistributedOptimizer: pass world_size= (the allreduce callable "
                             "has no 'nranks' attribute)")
        self.world_size = int(world)
        if self.fusion_threshold < 0:
            raise ValueError(f"fusion_threshold must be >= 0 bytes, got {fusion_threshold}")
        self.groups = self._fuse(self._named(named_parameters))
        nsets = 2 if self.double_buffering else 1
        for group in self.groups:
            group.buffers = [torch.empty(group.numel, dtype=group.dtype,
                                         device=group.params[0].device) for _ in range(nsets)]
        self.steps = 0               # step() calls so far
        self.applied = 0             # inner optimizer steps taken
        self.wait_seconds = 0.0      # time step() spent blocked on communication
        self._synced = False         # synchronize() already ran for this step
        self._ready = False          # p.grad holds averaged gradients to apply
        self._pending: Future | None = None
        self._pending_set = 0
        self._worker = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="topoplan-dbuf")
                        if self.double_buffering else None)

    # -- set-up -----------------------------------------------------------------------------
    def _named(self, named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None
               ) -> list[tuple[str, torch.nn.Parameter]]:
        in_optimizer = [p for group in self.optimizer.param_groups for p in group["params"]]
        if named_parameters is None:
            named = [(f"param.{i}", p) for i, p in enumerate(in_optimizer)]
        else:
            named = list(named_parameters)
            known = {id(p) for p in in_optimizer}
            for name, p in named:
                if id(p) not in known:
                    raise ValueError(f"named parameter {name!r} is not in the optimizer's "
                                     "param_groups; pass the same parameters to both")
        seen: dict[int, str] = {}
        for name, p in named:
            if id(p) in seen:
                raise ValueError(f"parameter {name!r} is listed twice (also as {seen[id(p)]!r})")
            seen[id(p)] = name
        return [(name, p) for name, p in named if p.requires_grad]

    def _fuse(self, named: list[tuple[str, torch.nn.Parameter]]) -> list[_Group]:
        groups: list[_Group] = []
        open_group: dict[tuple[torch.dtype, torch.device], _Group] = {}
        for name, p in named:
            key = (p.dtype, p.device)
            nbytes = p.numel() * p.element_size()
            group = open_group.get(key)
            if (group is None or self.fusion_threshold == 0
                    or (group.numel * p.element_size() + nbytes > self.fusion_threshold)):
                group = _Group(p.dtype)
                groups.append(group)
                open_group[key] = group
            group.params.append(p)
            group.names.append(name)
            group.numels.append(p.numel())
        return groups

    # -- the exchange -----------------------------------------------------------------------
    def _pack(self, which: int) -> list[torch.Tensor]:
        buffers = []
        for group in self.groups:
            flat = group.buffers[which]
            offset = 0
            for p, n in zip(group.params, group.numels):
                piece = flat[offset:offset + n]
                if p.grad is None:   # unused this step: contribute zeros, as Horovod does
                    piece.zero_()
                else:
                    piece.copy_(p.grad.reshape(-1))
                offset += n
            # Pre-scale so the sum is the mean: keeps fp16 in range and needs no post-divide.
            flat.div_(self.world_size)
            buffers.append(flat)
        return buffers

    def _reduce(self, buffers: list[torch.Tensor]) -> None:
        for flat in buffers:
            wire, ctx = self.compression.compress(flat)
            self.allreduce(wire)
            restored = self.compression.decompress(wire, ctx)
            if restored.data_ptr() != flat.data_ptr():
                flat.copy_(restored)

    def _unpack(self, which: int) -> None:
        for group in self.groups:
            flat = group.buffers[which]
            offset = 0
            for p, n in zip(group.params, group.numels):
                piece = flat[offset:offset + n].view_as(p)
                if p.grad is None:
                    p.grad = piece.clone()
                else:
                    p.grad.copy_(piece)
                offset += n

    def synchronize(self) -> bool:
        """Exchange gradients; afterwards ``p.grad`` holds what :meth:`step` will apply.

        Without double buffering: allreduce this step's gradients and write the mean
        into ``p.grad``. With it: wait for the previous step's allreduce, start this
        step's in the background and write the previous step's mean into ``p.grad``.
        Call it before :meth:`step` to clip or inspect the averaged gradients.

        Returns
        -------
        bool
            Whether ``p.grad`` now holds averaged gradients (False only at the first
            double-buffered step, when nothing has been reduced yet).
        """
        if self._synced:
            return self._ready
        self._synced = True
        if not self.double_buffering:
            buffers = self._pack(0)
            start = time.perf_counter()
            self._reduce(buffers)
            self.wait_seconds += time.perf_counter() - start
            self._unpack(0)
            self._ready = True
            return True
        had_pending = self._wait()
        which = self.steps % 2
        buffers = self._pack(which)
        assert self._worker is not None
        self._pending = self._worker.submit(self._reduce, buffers)
        self._pending_set = which
        if had_pending:
            self._unpack(1 - which)
        self._ready = had_pending
        return had_pending

    def _wait(self) -> bool:
        """Block until the background allreduce (if any) is done; whether there was one."""
        if self._pending is None:
            return False
        start = time.perf_counter()
        try:
            self._pending.result()   # re-raises a TransportError from the worker
        finally:
            self.wait_seconds += time.perf_counter() - start
            self._pending = None
        return True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Synchronize (if not done yet) and step the inner optimizer on averaged gradients.

        With double buffering the first call applies nothing (see the module docstring).
        A ``closure`` is passed to the inner optimizer; it must not call ``backward``
        again expecting another exchange.
        """
        ready = self.synchronize()
        result = None
        if ready:
            result = self.optimizer.step(closure)
            self.applied += 1
        self.steps += 1
        self._synced = False
        self._ready = False
        return result

    def finalize(self) -> bool:
        """Double buffering: apply the last pending gradients (one inner step); else no-op.

        Returns whether an inner step was taken. Call it after the last :meth:`step`,
        before evaluating or saving the model.
        """
        if not self.double_buffering or not self._wait():
            return False
        self._unpack(self._pending_set)
        self.optimizer.step()
        self.applied += 1
        return True

    flush = finalize

    def close(self) -> None:
        """Finish pending work and stop the background thread."""
        self._wait()
        if self._worker is not None:
            self._worker.shutdown(wait=True)

    # -- the rest behaves like the wrapped optimizer ----------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, world_size={self.world_size}, "
                f"compression={getattr(self.compression, '__name__', self.compression)}, "
                f"groups={len(self.groups)}, double_buffering={self.double_buffering})")


def broadcast_parameters(tensors: Iterable[torch.Tensor], allreduce: Callable[[torch.Tensor], Any],
                         rank: int, root: int = 0) -> None:
    """Give every rank ``root``'s values of ``tensors`` using only the allreduce.

    The root keeps its values, every other rank contributes zeros, and the sum is the
    root's copy: a broadcast over any transport the executor runs on.
    """
    tensors = [t for t in tensors]
    if not tensors:
        return
    with torch.no_grad():
        # Ordered, not a set: every rank must reduce the dtypes in the same order.
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            if rank != root:
                flat.zero_()
            allreduce(flat)
            offset = 0
            for t in same:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
