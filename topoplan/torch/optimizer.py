"""Horovod-style DistributedOptimizer: tensor fusion, fp16 allreduce, double buffering.

For training without DDP (e.g. under ``mpiexec`` with the MPI transport)::

    allreduce = PlannedAllreduce(cluster, topoplan.runtime.transports.MPI(comm), algorithm="ring")
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

Overlap (``overlap=True``, the default when the allreduce has ``start``, as
:class:`~topoplan.torch.PlannedAllreduce` does), as Horovod and DDP do: the fusion
buffers are laid out in reverse parameter order, the order backward produces gradients
in, and a hook on each parameter's gradient accumulator packs a buffer and *starts*
its allreduce (:meth:`topoplan.Allreduce.start`) as soon as the buffer's last gradient
is in, while backward goes on with the earlier layers. Buffers start in index order on
every rank (a buffer that fills early waits for those before it), the ones unused
parameters keep from filling start in :meth:`step`, which waits for them all. After the
first step the buffers are laid out again in the order backward made the gradients if
a buffer filled before the one ahead of it (a model that registers its layers out of
forward order), as DDP rebuilds its buckets; the ranks check with one small allreduce
that they saw the same order, and otherwise keep the first layout. The
allreduce and so the gradients are the same as packing after backward with the same
layout: only the time changes. One backward pass per step.

The wrapper is an instance of the wrapped optimizer's class (``isinstance(opt,
torch.optim.SGD)``), as Horovod's is, so learning-rate schedulers and code that checks
the type take it; ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's.

The optimizer composes one part a concept, each in its module: :mod:`.fusion` (which
gradients share a buffer; packing), :mod:`.buffers` (the buffer sets double buffering
alternates, and its background worker), :mod:`.overlap` (the gradient hooks and the calls
they start, polled by a :mod:`.progress` thread), :mod:`.relayout` (the layout after the
first step) and :mod:`.timing` (``comm_seconds``, ``wait_seconds``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch

from .buffers import Background, BufferPool
from .compression import Compression, Compressor
from .fusion import fuse
from .overlap import Overlap
from .relayout import backward_order
from .timing import CommTime

__all__ = ["DistributedOptimizer", "broadcast_parameters"]


_SUBCLASSES: dict[type, type] = {}


#: Momentum from which double buffering's one-step-late gradients are warned about.
STALE_MOMENTUM = 0.9


def _warn_if_stale_momentum(optimizer: Any) -> None:
    """Warn when double buffering meets momentum >= :data:`STALE_MOMENTUM`: momentum
    carries each late gradient into many later updates (see the class docstring)."""
    import warnings
    momenta = [g.get("momentum") for g in getattr(optimizer, "param_groups", [])]
    high = max((float(m) for m in momenta if isinstance(m, (int, float))), default=0.0)
    if high >= STALE_MOMENTUM:
        warnings.warn(
            f"DistributedOptimizer(double_buffering=True) applies each gradient one step "
            f"late, and momentum {high:g} carries the stale gradients on: training can "
            "diverge where synchronous training converges; lower the learning rate or the "
            "momentum (e.g. 0.5)", UserWarning, stacklevel=3)


def _counter(name: str, doc: str) -> Any:
    """A read-write attribute of DistributedOptimizer kept in its :class:`CommTime`, which
    the parts that communicate add to."""
    return property(lambda self: getattr(self._time, name),
                    lambda self, seconds: setattr(self._time, name, seconds), doc=doc)


#: Seconds between the overlap thread's polls of the calls in flight; 0: no thread (the
#: gradient hooks alone poll). On 4 ranks sharing 2 cores it costs more compute than it
#: hides (scripts/bench_train.py --overlap); with spare cores it keeps MPI moving.
POLL_INTERVAL = 1e-3


class DistributedOptimizer:
    """Wrap a torch optimizer so that ``step()`` applies gradients averaged over ranks.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The local optimizer; its ``step()`` runs on the averaged gradients.
    allreduce : callable
        ``allreduce(buffer)`` sums a contiguous 1-D tensor across ranks in place, e.g.
        :class:`topoplan.torch.PlannedAllreduce` over ``topoplan.runtime.transports.MPI(comm)``.
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
        after the last step. Stale gradients change the optimisation: on the digits CNN
        (scripts/train.py) with SGD at momentum 0.9 and a constant learning rate of 0.1,
        synchronous training reached 99.2% test accuracy and double buffering diverged
        to 10%; at momentum 0.5, or learning rate 0.03, both converged. Lower the
        learning rate or the momentum; a ``UserWarning`` says so for momentum >= 0.9.
    world_size : int, optional
        Ranks the allreduce spans; default ``allreduce.nranks``.
    overlap : bool, optional
        Start each fusion buffer's allreduce from the gradient hooks during backward
        (see the module docstring). Default: when ``allreduce`` has ``start``.
    poll_interval : float
        With overlap: seconds between the progress thread's polls of the buffers in
        flight (each poll may move a call one step on); 0: no thread, the gradient
        hooks alone poll. Default :data:`POLL_INTERVAL`.

    Attributes
    ----------
    comm_seconds : float
        Wall time with the gradients' allreduce in flight: inside the blocking calls
        (no overlap; with double buffering, in the background thread), or with overlap
        from each call's start until a poll saw it done, counting time when several
        were in flight once. So it compares with the time of a blocking exchange.
    wait_seconds : float
        The part of it :meth:`step` (and :meth:`finalize`) waited for: the exposed
        communication; the rest ran beside forward and backward.

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

    def __new__(cls, optimizer: Any = None, *args: Any, **kwargs: Any) -> DistributedOptimizer:
        # An instance of the wrapped optimizer's class too (Horovod's trick), so that
        # isinstance checks and LR schedulers accept it.
        base = type(optimizer)
        if cls is DistributedOptimizer and isinstance(optimizer, torch.optim.Optimizer):
            sub = _SUBCLASSES.get(base)
            if sub is None:
                sub = _SUBCLASSES[base] = type(f"Distributed{base.__name__}", (cls, base),
                                               {"__module__": __name__})
            return object.__new__(sub)
        return object.__new__(cls)

    def __init__(self, optimizer: torch.optim.Optimizer, allreduce: Callable[[torch.Tensor], Any], *,
                 named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
                 compression: type[Compressor] | Compressor = Compression.fp16,
                 fusion_threshold: int = 64 << 20, double_buffering: bool = False,
                 world_size: int | None = None, overlap: bool | None = None,
                 poll_interval: float = POLL_INTERVAL) -> None:
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
        can_start = callable(getattr(allreduce, "start", None))
        if overlap and not can_start:
            raise ValueError("DistributedOptimizer(overlap=True) needs an allreduce with "
                             "start(buffer) -> handle, e.g. topoplan.torch.PlannedAllreduce")
        self.overlap = can_start if overlap is None else bool(overlap)
        if not poll_interval >= 0:
            raise ValueError(f"poll_interval must be >= 0 seconds, got {poll_interval!r}")
        self.poll_interval = float(poll_interval)
        if self.double_buffering:
            _warn_if_stale_momentum(optimizer)
        named = self._named(named_parameters)
        self._time = CommTime()      # comm_seconds and wait_seconds (see Attributes)
        # Overlap: the gradient hooks start the buffers, a progress thread polls them.
        self._overlap = (Overlap(allreduce, compression, self.world_size, self._time,
                                 poll_interval=self.poll_interval) if self.overlap else None)
        # Double buffering without overlap: a worker reduces while the next step computes.
        self._background = (Background(self._reduce, self._time)
                            if self.double_buffering and not self.overlap else None)
        # Overlap: buffers in the order backward fills them (last layers first), until
        # the first step shows the real order (see _relayout).
        self._layout(named[::-1] if self.overlap else named)
        self.steps = 0               # step() calls so far
        self.applied = 0             # inner optimizer steps taken
        self._synced = False         # synchronize() already ran for this step
        self._ready = False          # p.grad holds averaged gradients to apply
        self._pending_set = 0        # double buffering: the set in flight, to apply next

    comm_seconds = _counter("comm_seconds", "Wall time with an allreduce in flight "
                                            "(see Attributes).")
    wait_seconds = _counter("wait_seconds", "Time :meth:`step` and :meth:`finalize` spent "
                                            "blocked on communication.")

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

    def _layout(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """Fuse ``named`` (in buffer order) into groups with their buffers, and (overlap)
        the per-step state and the gradient hooks."""
        self.groups = fuse(named, self.fusion_threshold)
        self._pool = BufferPool(self.groups, 2 if self.double_buffering else 1)
        if self._overlap is not None:
            self._overlap.layout(self._pool)

    def _relayout(self) -> None:
        """After the first overlapped step: lay the buffers out in the order backward made
        the gradients (see :mod:`topoplan.torch.relayout`). Not with double buffering,
        whose previous buffers are still in flight."""
        assert self._overlap is not None
        made, self._overlap.made = self._overlap.made, None
        if made is None or self.double_buffering:
            return
        order = backward_order(self.groups, made, self.allreduce, self.world_size)
        if order is not None:
            self._layout(order)

    def _this_set(self) -> int:
        """The buffer set this step packs into (double buffering alternates two)."""
        return self._pool.set_of(self.steps)

    # -- the exchange -----------------------------------------------------------------------
    def _reduce(self, buffers: list[torch.Tensor]) -> None:
        began = time.perf_counter()
        try:
            self._reduce_all(buffers)
        finally:
            self._time.comm_seconds += time.perf_counter() - began

    def _reduce_all(self, buffers: list[torch.Tensor]) -> None:
        for flat in buffers:
            wire, ctx = self.compression.compress(flat)
            self.allreduce(wire)
            restored = self.compression.decompress(wire, ctx)
            if restored.data_ptr() != flat.data_ptr():
                flat.copy_(restored)

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
        if self._overlap is not None:
            which = self._this_set()
            self._overlap.start_ready(everything=True)
            if not self.double_buffering:
                self._overlap.finish(0)
                self._pool.unpack(0)
                self._ready = True
                return True
            had_pending = self._overlap.finish(1 - which)
            if had_pending:
                self._pool.unpack(1 - which)
            self._pending_set = which
            self._ready = had_pending
            return had_pending
        if not self.double_buffering:
            buffers = self._pool.pack(0, self.world_size)
            start = time.perf_counter()
            self._reduce(buffers)
            self._time.wait_seconds += time.perf_counter() - start
            self._pool.unpack(0)
            self._ready = True
            return True
        assert self._background is not None
        had_pending = self._background.wait()
        which = self._this_set()
        self._background.submit(self._pool.pack(which, self.world_size))
        self._pending_set = which
        if had_pending:
            self._pool.unpack(1 - which)
        self._ready = had_pending
        return had_pending

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
        if self._overlap is not None:
            self._overlap.next_step(self._this_set())
            if self._overlap.made is not None:
                self._relayout()
        return result

    def finalize(self) -> bool:
        """Double buffering: apply the last pending gradients (one inner step); else no-op.

        Returns whether an inner step was taken. Call it after the last :meth:`step`,
        before evaluating or saving the model.
        """
        if not self.double_buffering:
            return False
        if self._overlap is not None:
            if not self._overlap.finish(self._pending_set):
                return False
        elif self._background is None or not self._background.wait():
            return False
        self._pool.unpack(self._pending_set)
        self.optimizer.step()
        self.applied += 1
        return True

    flush = finalize

    def close(self) -> None:
        """Finish pending work, stop the background thread and remove the hooks."""
        if self._background is not None:
            self._background.close()
        if self._overlap is not None:
            self._overlap.close()

    def __enter__(self) -> DistributedOptimizer:
        return self

    def __exit__(self, *exc: Any) -> None:
        """:meth:`close` (it does not apply pending gradients: :meth:`finalize` does)."""
        self.close()

    # -- the rest behaves like the wrapped optimizer ----------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        return self.optimizer.state

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, world_size={self.world_size}, "
                f"compression={getattr(self.compression, '__name__', self.compression)}, "
                f"groups={len(self.groups)}, double_buffering={self.double_buffering}, "
                f"overlap={self.overlap})")


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
