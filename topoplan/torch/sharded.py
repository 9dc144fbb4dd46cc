"""Planned ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` for FSDP-style code.

:class:`PlannedCollectives` gives the two collectives of sharded data parallelism
(PyTorch FSDP, ZeRO) with torch.distributed's signatures, run by topoplan schedules
over the ranks of a process group::

    planned = PlannedCollectives(cluster, algorithm="auto")   # after init_process_group
    planned.all_gather_into_tensor(full, shard)                # was dist.all_gather_into_tensor
    planned.reduce_scatter_tensor(grad_shard, full_grads, op=dist.ReduceOp.AVG)

Layout, as torch's: flattened, rank ``r``'s shard is elements ``r * m`` to
``(r + 1) * m`` of the full buffer (``m`` the shard's element count), so an N-D input
of shape ``(world * d0, ...)`` is the dim-0 concatenation of the ranks' shards.

As :class:`~topoplan.torch.PlannedAllreduce`, it plans a schedule per (collective,
element count, dtype) the first time it sees one (``topoplan.plan(cluster,
algorithm=..., size=nbytes, collective=...)``) and caches the executor built on it;
group rank ``r`` plays cluster rank ``r``. :func:`register_fsdp` plugs it into
PyTorch's FSDP2 (``fully_shard``) as its custom all-gather and reduce-scatter.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from ..errors import TopoplanError
from .planned import AllreduceStats

__all__ = ["PlannedCollectives", "PlannedWork", "FSDPAllGather", "FSDPReduceScatter",
           "register_fsdp"]

#: dtypes a planned reduce-scatter sums (``add_`` on every transport's wire type).
REDUCE_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})
#: dtypes a planned allgather moves (it only copies).
GATHER_DTYPES = REDUCE_DTYPES | {torch.bool}
_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
_ALL = {"reduce_scatter": "reduce_scatter_tensor", "allgather": "all_gather_into_tensor"}


def _op_name(op: Any) -> str:
    """``"SUM"``, ``"AVG"``, ... for a ``dist.ReduceOp`` (or its ``RedOpType``)."""
    if isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        for name in _OPS:
            member = getattr(dist.ReduceOp, name, None)
            if member is not None and op == member:
                return name
    return repr(op)


class PlannedWork(dist.Work):
    """The work object of an ``async_op=True`` call: ``wait()`` (returns True, as torch's)
    and ``is_completed()``. A ``dist.Work``, so code that checks for one (FSDP2) waits
    on it.

    ``wait``'s ``timeout`` is accepted for torch's signature; what bounds the wait is
    the executor's per-step ``timeout`` (:class:`PlannedCollectives`), after which it
    raises :class:`topoplan.TransportError`.
    """

    def __init__(self, handle: Any, output: torch.Tensor, finish: Any = None) -> None:
        super().__init__()
        self._handle, self._output, self._finish = handle, output, finish
        self._done = handle is None
        if self._done and finish is not None:
            finish()

    def _complete(self) -> None:
        self._done = True
        self._handle = None
        if self._finish is not None:
            self._finish()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:  # noqa: ARG002
        if not self._done:
            self._handle.wait()
            self._complete()
        return True

    def is_completed(self) -> bool:
        """Whether the call is done; moves it without blocking where the transport can
        be polled (gloo cannot: its calls move only in ``wait()``)."""
        if not self._done and self._handle.test():
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self) -> list[torch.Tensor]:
        return [self._output]

    def __repr__(self) -> str:
        return f"<PlannedWork {'done' if self._done else 'in flight'}>"


class PlannedCollectives:
    """``reduce_scatter_tensor`` and ``all_gather_into_tensor`` run by topoplan schedules.

    Parameters
    ----------
    cluster : topoplan.cluster.Cluster
        The topology; ``cluster.nranks`` must equal the size of every process group the
        calls run on. Group rank ``r`` plays cluster rank ``r``.
    algorithm : str
        Planner for :func:`topoplan.plan` (``ring``, ``ring-topo``, ``rhd``, ``auto``,
        and whatever else plans reduce-scatter and allgather).
    group : ProcessGroup, optional
        The group a call with ``group=None`` runs on (default: the world).
    share : bool
        Plan on the group's rank 0 only and broadcast the schedule to the others, so
        ranks cannot disagree on it (one ``broadcast_object_list`` per new plan; every
        rank must make the same calls in the same order, as with torch's collectives).
    timeout : float
        Seconds any transfer may wait before :class:`topoplan.TransportError`.
    accumulate_fp32 : bool
        For float16/bfloat16 reduce-scatters: sum in float32 and round once.
    profile : str, CostProfile or path, optional
        What plans are priced with (default: the transport's own,
        :func:`~topoplan.runtime.choice.job_pricing`).
    mode : {"measured", "model"}, optional
        For ``auto``: time the model's best candidates and the native collective on the
        first calls of each size class and keep the fastest (``measured``, the default
        unless ``TOPOPLAN_AUTO=model``), or take the model's choice.
    transport : Transport, optional
        Run every call on this transport (its ranks are the group's) instead of a
        :class:`~topoplan.runtime.transports.Torch` transport over ``group``; it must have
        ``share(obj) -> rank 0's obj``. The ``topoplan`` backend passes its inner
        backend's (:class:`~topoplan.runtime.transports.c10d.C10d`); torch.distributed
        need not be initialised then.

    Raises
    ------
    TopoplanError
        If torch.distributed is not initialised, or the cluster's rank count is not the
        default group's size.

    Attributes
    ----------
    stats : dict
        ``{"reduce_scatter": AllreduceStats, "allgather": AllreduceStats}``: calls, bytes
        (of the full buffer) and seconds of the blocking calls.
    chosen : dict
        ``(collective, nbytes, dtype) -> algorithm`` the planner picked (what ``auto``
        chose, for ``auto``).
    """

    def __init__(self, cluster: Any, *, algorithm: str = "auto", group: Any = None,
                 share: bool = True, timeout: float = 60.0,
                 accumulate_fp32: bool = False, profile: Any = None,
                 mode: str | None = None, transport: Any = None) -> None:
        self._fixed = transport
        if transport is None and (not dist.is_available() or not dist.is_initialized()):
            raise TopoplanError("PlannedCollectives needs torch.distributed initialised: "
                                "call dist.init_process_group('gloo') first")
        if cluster is None or not hasattr(cluster, "nranks"):
            raise TopoplanError(f"PlannedCollectives needs a topoplan cluster, got {cluster!r}")
        self.cluster = cluster
        self.algorithm = algorithm
        self.group = group
        self.share = share
        self.timeout = float(timeout)
        self.accumulate_fp32 = accumulate_fp32
        self.nranks = int(cluster.nranks)
        self.stats = {"reduce_scatter": AllreduceStats(), "allgather": AllreduceStats()}
        self.chosen: dict[tuple[str, int, str], str] = {}
        self._transports: dict[int, tuple[Any, Any]] = {}  # id(group) -> (group, transport)
        self._executors: dict[tuple[int, str, int, torch.dtype], Any] = {}
        self.profile, self.mode = profile, mode
        self._pricing: dict[int, Any] = {}
        # auto: (group, collective, dtype) -> its MeasuredChoice
        self.choices: dict[tuple[int, str, torch.dtype], Any] = {}
        self._inflight: list[Any] = []
        self._check_group(None if transport is not None else self._group(None))

    # -- groups, plans, executors ---------------------------------------------------
    def _group(self, group: Any) -> Any:
        if self._fixed is not None:
            return None    # one transport: its calls ignore ``group``
        if group is not None:
            return group
        return self.group if self.group is not None else dist.group.WORLD

    def _check_group(self, group: Any) -> int:
        size = self._fixed.size if self._fixed is not None else dist.get_world_size(group)
        if size != self.nranks:
            raise TopoplanError(
                f"cluster {getattr(self.cluster, 'name', '?')!r} has {self.nranks} ranks but "
                f"the process group has {size}; pick a cluster with {size} ranks")
        return size

    def _transport(self, group: Any) -> Any:
        if self._fixed is not None:
            return self._fixed
        entry = self._transports.get(id(group))
        if entry is None:
            self._check_group(group)
            from topoplan.runtime.transports import Torch

            entry = self._transports[id(group)] = (group, Torch(group))
        return entry[1]

    def _share(self, group: Any, obj: Any) -> Any:
        if self._fixed is not None:
            return self._fixed.share(obj)
        holder = [obj]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, 0), group=group)
        return holder[0]

    def executor_for(self, collective: str, numel: int, dtype: torch.dtype,
                     group: Any = None) -> Any:
        """The cached executor of ``collective`` (``"reduce_scatter"`` or ``"allgather"``)
        for a full buffer of ``numel`` elements of ``dtype`` on ``group``, planning it if
        new."""
        group = self._group(group)
        key = (id(group), collective, int(numel), dtype)
        executor = self._executors.get(key)
        if executor is None:
            import topoplan
            from topoplan.runtime.executor import AllGather, ReduceScatter

            transport = self._transport(group)
            nbytes = int(numel) * torch.empty((), dtype=dtype).element_size()
            pricing = self.pricing(group)
            if self.share:   # rank 0 plans, the others take its schedule (or its error)
                shared, failed = ("", ""), None
                if transport.rank == 0:
                    try:
                        shared = ("plan", topoplan.plan(
                            self.cluster, algorithm=self.algorithm, size=max(nbytes, 1),
                            collective=collective, profile=pricing.profile,
                            machine=pricing.machine).to_json())
                    except Exception as exc:  # noqa: BLE001 - every rank raises
                        failed, shared = exc, ("error", f"{type(exc).__name__}: {exc}")
                kind, text = self._share(group, shared)
                if failed is not None:
                    raise failed
                if kind == "error":
                    raise TopoplanError(f"{_ALL[collective]}: planning {nbytes} bytes failed "
                                        f"on rank 0: {text}")
                schedule = topoplan.loads_schedule(text)
            else:
                schedule = topoplan.plan(self.cluster, algorithm=self.algorithm,
                                         size=max(nbytes, 1), collective=collective,
                                         profile=pricing.profile, machine=pricing.machine)
            cls = ReduceScatter if collective == "reduce_scatter" else AllGather
            executor = cls(schedule, transport, timeout=self.timeout,  # planned: verified
                           accumulate_fp32=self.accumulate_fp32, verified=True)
            self._executors[key] = executor
            self.chosen[(collective, nbytes, str(dtype).removeprefix("torch."))] = \
                str(schedule.meta.get("chosen", schedule.algorithm))
        return executor

    def pricing(self, group: Any = None) -> Any:
        """The profile and machine the plans of ``group`` are priced with (found on first
        use, collective over the group: :func:`~topoplan.runtime.choice.job_pricing`)."""
        group = self._group(group)
        pricing = self._pricing.get(id(group))
        if pricing is None:
            from topoplan.runtime.calibrate import job_pricing
            pricing = self._pricing[id(group)] = job_pricing(self._transport(group),
                                                             self.cluster, profile=self.profile)
        return pricing

    def choice_for(self, collective: str, dtype: torch.dtype, group: Any = None) -> Any:
        """``auto``'s :class:`~topoplan.runtime.choice.MeasuredChoice` of ``collective``
        for ``dtype`` tensors on ``group``."""
        group = self._group(group)
        key = (id(group), collective, dtype)
        choice = self.choices.get(key)
        if choice is None:
            from topoplan.runtime.choice import MeasuredChoice, executor_for, snapshot
            transport = self._transport(group)

            def executor(schedule: Any) -> Any:
                return executor_for(schedule, transport, timeout=self.timeout,
                                    accumulate_fp32=self.accumulate_fp32, verified=True)

            def options(nbytes: int, slow: Any = None) -> tuple[list[Any], str]:
                return self._options(collective, nbytes, group, self.choices[key], slow)

            choice = self.choices[key] = MeasuredChoice(
                transport, options, executor, mode=self.mode, snapshot=snapshot,
                drain=self._drain, what=collective)
        return choice

    def _options(self, collective: str, nbytes: int, group: Any, choice: Any,
                 slow: Any = None) -> tuple[list[Any], str]:
        """auto's candidates for a new size class: rank 0's (or its error), with ``share``;
        ``slow``: planned on the cluster with those links at their measured rates."""
        from topoplan.runtime.choice import model_options, shared_options
        from topoplan.runtime.health import with_slow_links
        transport = self._transport(group)
        pricing = self.pricing(group)
        if group is None or transport.size == self.cluster.nranks:
            choice.enable_health(pricing.machine or self.cluster, pricing.profile)
        cluster, machine = with_slow_links(slow, self.cluster, pricing.machine)

        def make() -> tuple[list[Any], str]:
            return model_options(cluster, nbytes, collective, profile=pricing.profile,
                                 machine=machine)

        if not self.share:
            return make()
        return shared_options(transport.rank, lambda obj: self._share(group, obj), make,
                              f"{_ALL[collective]} of {nbytes} bytes")

    def claim_native(self, collective: str, full: torch.Tensor, group: Any = None) -> bool:
        """Whether this ``collective`` call (``reduce_scatter``, ``allgather``) of the
        ``full`` tensor (the input of a reduce-scatter, the output of an all-gather) is one
        ``auto`` runs with the transport's own collective and nothing else; then it is
        counted, and the caller runs that collective itself (as
        :meth:`PlannedAllreduce.claim_native <topoplan.torch.PlannedAllreduce.claim_native>`)."""
        if self.algorithm != "auto":
            return False
        choice = self.choices.get((id(self._group(group)), collective, full.dtype))
        nbytes = full.numel() * full.element_size()
        if choice is None or not choice.claim_native(nbytes):
            return False
        key = (collective, nbytes, str(full.dtype).removeprefix("torch."))
        self.chosen[key] = "native"
        self.stats[collective].add(nbytes, 0.0)
        return True

    def _drain(self) -> None:
        while self._inflight:
            self._inflight.pop(0).wait()

    # -- the collectives ----------------------------------------------------------------
    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor,
                              op: Any = dist.ReduceOp.SUM, group: Any = None,
                              async_op: bool = False) -> PlannedWork | None:
        """Reduce ``input`` over the group's ranks and scatter it: rank ``r``'s ``output``
        gets shard ``r`` of the sum (``SUM``) or of the mean (``AVG``, floating types).

        Parameters
        ----------
        output : torch.Tensor
            Contiguous, ``m`` elements (any shape).
        input : torch.Tensor
            Contiguous, ``world * m`` elements, ``output``'s dtype and device; left as it
            was.
        op : torch.distributed.ReduceOp
            ``SUM`` or ``AVG`` (the sum, then divided by the group's size).
        group : ProcessGroup, optional
            Default: the ``group`` given to the constructor, else the world.
        async_op : bool
            Return a :class:`PlannedWork` at once instead of blocking.

        Returns
        -------
        PlannedWork or None
            The work object when ``async_op``, else None (as torch).

        Raises
        ------
        TopoplanError
            Before anything is sent: for sizes, dtypes, devices, layouts or ops this
            cannot run, or a group of another size than the cluster.
        TransportError
            A transfer timed out or a peer failed.
        """
        name = _op_name(op)
        if name not in ("SUM", "AVG"):
            raise TopoplanError(f"reduce_scatter_tensor: planned reduce-scatter sums (SUM) or "
                                f"averages (AVG); got op {name}; use "
                                f"torch.distributed.reduce_scatter_tensor for it")
        group = self._group(group)
        world = self._transport(group).size
        self._check("reduce_scatter", output, input, REDUCE_DTYPES, world)
        if name == "AVG" and not (output.is_floating_point() or output.is_complex()):
            raise TopoplanError(f"reduce_scatter_tensor: AVG needs a floating-point dtype, "
                                f"got {output.dtype}; use SUM and divide")
        finish = (lambda: output.div_(world)) if name == "AVG" and world > 1 else None
        return self._run("reduce_scatter", input, output, group, world, async_op, finish)

    def all_gather_into_tensor(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                               group: Any = None, async_op: bool = False) -> PlannedWork | None:
        """Gather every rank's ``input_tensor`` into ``output_tensor``, in rank order.

        Parameters
        ----------
        output_tensor : torch.Tensor
            Contiguous, ``world * m`` elements (any shape; torch's layout: the dim-0
            concatenation of the ranks' inputs).
        input_tensor : torch.Tensor
            Contiguous, ``m`` elements, ``output_tensor``'s dtype and device. It may be
            this rank's own shard of ``output_tensor`` (FSDP's in-place all-gather).
        group, async_op
            As for :meth:`reduce_scatter_tensor`.

        Returns
        -------
        PlannedWork or None

        Raises
        ------
        TopoplanError, TransportError
            As for :meth:`reduce_scatter_tensor`.
        """
        group = self._group(group)
        world = self._transport(group).size
        self._check("allgather", output_tensor, input_tensor, GATHER_DTYPES, world)
        return self._run("allgather", input_tensor, output_tensor, group, world, async_op, None)

    # -- shared ---------------------------------------------------------------------------
    def _check(self, collective: str, output: Any, input: Any, dtypes: frozenset,
                world: int) -> None:
        """Raise a :class:`TopoplanError` naming what is wrong with a call's tensors."""
        what = _ALL[collective]
        out_name, in_name = (("output", "input") if collective == "reduce_scatter"
                             else ("output_tensor", "input_tensor"))
        for name, t in ((out_name, output), (in_name, input)):
            if not isinstance(t, torch.Tensor):
                raise TopoplanError(f"{what}: {name} must be a torch.Tensor, "
                                    f"got {type(t).__name__}")
        if output.dtype != input.dtype:
            raise TopoplanError(f"{what}: {in_name} is {input.dtype} but {out_name} is "
                                f"{output.dtype}; both must have one dtype")
        if output.dtype not in dtypes:
            known = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
            raise TopoplanError(f"{what}: dtype {output.dtype} is not supported; "
                                f"expected one of {known}")
        if output.device != input.device:
            raise TopoplanError(f"{what}: {in_name} is on {input.device} but {out_name} on "
                                f"{output.device}; both must be on one device")
        for name, t in ((out_name, output), (in_name, input)):
            if not t.is_contiguous():
                raise TopoplanError(f"{what}: {name} is not contiguous (shape "
                                    f"{tuple(t.shape)}, strides {t.stride()}); pass "
                                    f"{name}.contiguous() and copy the result back")
        (full_name, full), (shard_name, shard) = (
            ((in_name, input), (out_name, output)) if collective == "reduce_scatter"
            else ((out_name, output), (in_name, input)))
        if full.numel() != world * shard.numel():
            raise TopoplanError(
                f"{what}: the {full_name} must have world size ({world}) x the {shard_name}'s "
                f"{shard.numel()} = {world * shard.numel()} elements, got {full.numel()}")

    def _run(self, collective: str, input: torch.Tensor, output: torch.Tensor, group: Any,
             world: int, async_op: bool, finish: Any) -> PlannedWork | None:
        full = input if collective == "reduce_scatter" else output
        nbytes = full.numel() * full.element_size()
        stats = self.stats[collective]
        if world == 1 or full.numel() == 0:   # nothing to move
            if output.data_ptr() != input.data_ptr() or output.numel() != input.numel():
                output.view(-1).copy_(input.view(-1))
            if finish is not None:
                finish()
            stats.add(nbytes, 0.0)
            return PlannedWork(None, output) if async_op else None
        device = self._transport(group).device
        if output.device.type != device.type:
            backend = (self._fixed.name if self._fixed is not None
                       else dist.get_backend(group))
            raise TopoplanError(f"{_ALL[collective]}: the process group's backend "
                                f"({backend}) moves {device.type} tensors, "
                                f"got {output.device.type} ones")
        if self.algorithm == "auto":
            choice = self.choice_for(collective, full.dtype, group)
            key = (collective, nbytes, str(full.dtype).removeprefix("torch."))
            if async_op:
                handle = choice.start(nbytes, input.view(-1), output.view(-1))
                self.chosen[key] = choice.chosen(nbytes) or "exploring"
                self._inflight = [h for h in self._inflight if not getattr(h, "done", False)]
                self._inflight.append(handle)
                stats.add(nbytes, 0.0)
                return PlannedWork(handle, output, finish)
            start = time.perf_counter()
            choice.call(nbytes, input.view(-1), output.view(-1))
            self.chosen[key] = choice.chosen(nbytes) or "exploring"
            if finish is not None:
                finish()
            stats.add(nbytes, time.perf_counter() - start)
            return None
        executor = self.executor_for(collective, full.numel(), full.dtype, group)
        if async_op:
            handle = executor.start(input.view(-1), output.view(-1))
            stats.add(nbytes, 0.0)
            return PlannedWork(handle, output, finish)
        start = time.perf_counter()
        executor(input.view(-1), output.view(-1))
        if finish is not None:
            finish()
        stats.add(nbytes, time.perf_counter() - start)
        return None

    def __repr__(self) -> str:
        return (f"PlannedCollectives(cluster={getattr(self.cluster, 'name', '?')!r}, "
                f"algorithm={self.algorithm!r}, nranks={self.nranks})")


# -- FSDP2 ---------------------------------------------------------------------------------
class FSDPAllGather:
    """FSDP2's custom all-gather (``FSDPModule.set_custom_all_gather``) over a
    :class:`PlannedCollectives`: ``allocate`` and ``__call__`` as FSDP2's ``AllGather``."""

    def __init__(self, planned: PlannedCollectives) -> None:
        self.planned = planned

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(tuple(size), dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> PlannedWork | None:
        return self.planned.all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                                   async_op=async_op)


class FSDPReduceScatter:
    """FSDP2's custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``) over a
    :class:`PlannedCollectives`. FSDP2 asks for ``AVG`` (float32/bfloat16 gradients) or
    ``SUM`` with its own pre/post division (float16); a ``gradient_divide_factor`` that
    makes it ask for ``PREMUL_SUM`` raises :class:`~topoplan.TopoplanError`."""

    def __init__(self, planned: PlannedCollectives) -> None:
        self.planned = planned

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(tuple(size), dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 op: Any = dist.ReduceOp.SUM, async_op: bool = False) -> PlannedWork | None:
        return self.planned.reduce_scatter_tensor(output_tensor, input_tensor, op=op,
                                                  group=group, async_op=async_op)


def register_fsdp(module: torch.nn.Module, cluster: Any = None, *, algorithm: str = "auto",
                  planned: PlannedCollectives | None = None,
                  **kwargs: Any) -> PlannedCollectives:
    """Run the all-gathers and reduce-scatters of an FSDP2 model (``fully_shard``) with
    topoplan schedules: sets :class:`FSDPAllGather` and :class:`FSDPReduceScatter` on
    every FSDP module in ``module`` (itself included). Call it after ``fully_shard``.

    Parameters
    ----------
    module : torch.nn.Module
        A model with ``fully_shard`` applied to it or to some of its submodules.
    cluster, algorithm, **kwargs
        For a new :class:`PlannedCollectives` (unless ``planned`` is given).
    planned : PlannedCollectives, optional
        Share this one (and its plans) instead.

    Returns
    -------
    PlannedCollectives
        Its ``stats`` and ``chosen`` say what ran.

    Raises
    ------
    TopoplanError
        When no submodule is an FSDP2 module, or this PyTorch's FSDP2 has no custom
        collectives (``set_custom_all_gather``).
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        raise TopoplanError(f"register_fsdp: PyTorch {torch.__version__} has no FSDP2 "
                            "(torch.distributed.fsdp.FSDPModule); use PlannedCollectives' "
                            "methods directly") from None
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        raise TopoplanError(f"register_fsdp: FSDP2 in PyTorch {torch.__version__} has no "
                            "set_custom_all_gather / set_custom_reduce_scatter; use "
                            "PlannedCollectives' methods directly")
    modules = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise TopoplanError(f"register_fsdp: no FSDP2 module in {type(module).__name__}; "
                            "apply torch.distributed.fsdp.fully_shard(...) first")
    if planned is None:
        planned = PlannedCollectives(cluster, algorithm=algorithm, **kwargs)
    gather, scatter = FSDPAllGather(planned), FSDPReduceScatter(planned)
    for m in modules:
        m.set_custom_all_gather(gather)  # type: ignore[arg-type]  # duck-typed Comm
        m.set_custom_reduce_scatter(scatter)  # type: ignore[arg-type]
    return planned
