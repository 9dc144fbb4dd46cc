"""Allreduce callables the trainers take: planned (topoplan schedules) or native.

The DDP hook and :class:`~topoplan.torch.DistributedOptimizer` only need a
callable ``allreduce(buffer)`` that sums a contiguous 1-D buffer across ranks in
place and has an ``nranks`` attribute. :class:`PlannedAllreduce` is the real one:
it plans a schedule for each byte size it sees (``topoplan.plan(cluster,
algorithm=..., size=nbytes)``), caches the executor built on it and runs it over a
transport. :func:`torch_native_allreduce` and :func:`mpi_native_allreduce` wrap
the transports' own allreduce as baselines for benchmarks.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import TopoplanError

__all__ = ["AllreduceStats", "PlannedAllreduce", "torch_native_allreduce",
           "mpi_native_allreduce", "nbytes_of"]


def nbytes_of(buffer: Any) -> int:
    """Bytes of a numpy array or torch tensor."""
    if hasattr(buffer, "nbytes") and not hasattr(buffer, "element_size"):
        return int(buffer.nbytes)
    return int(buffer.numel() * buffer.element_size())


class AllreduceStats:
    """Calls, bytes and seconds spent inside an allreduce callable (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0
        self.bytes = 0
        self.seconds = 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.calls += 1
            self.bytes += nbytes
            self.seconds += seconds

    def reset(self) -> None:
        with self._lock:
            self.calls, self.bytes, self.seconds = 0, 0, 0.0


class PlannedAllreduce:
    """Sum a buffer across ranks in place with a topoplan schedule planned for its size.

    Parameters
    ----------
    cluster : topoplan.cluster.Cluster
        The topology; ``cluster.nranks`` must equal the transport's world size, and
        transport rank ``r`` plays cluster rank ``r``.
    transport : object
        A topoplan transport (``topoplan.runtime.transports.Torch(pg)``, ``MPI(comm)``, ...).
    algorithm : str
        Planner name for :func:`topoplan.plan` (``ring``, ``tree``, ``rhd``,
        ``hierarchical``, ``mcf``, ``auto``...). ``auto`` measures: each size class's
        first calls time the model's best candidates and the transport's own allreduce,
        and the fastest measured runs the calls after
        (:class:`~topoplan.runtime.choice.MeasuredChoice`); ``mode="model"`` or
        ``TOPOPLAN_AUTO=model`` keeps the model's choice.
    share : callable, optional
        ``share(obj) -> obj`` returns rank 0's ``obj`` on every rank (a broadcast).
        When given, only rank 0's plans are used, so ranks cannot disagree on them even
        if a planner were not deterministic. Called once per new size (``auto``: per new
        size class), in the same order on all ranks (the trainers call allreduce in a
        fixed order).
    timeout : float
        Seconds the executor waits on any transfer before raising
        :class:`topoplan.TransportError` (never a hang).
    schedule : Schedule, optional
        Run this allreduce schedule at every size instead of planning one (a plan read
        from a file, a composed plan with native steps); ``cluster`` may then be None.
    profile : str, CostProfile or path, optional
        What plans are priced with. Default: the transport's own (a calibration cached
        for this cluster, transport and hosts, else the shipped profile of the
        transport: ``mpi``, ``gloo`` or ``nccl``; :func:`~topoplan.runtime.choice.job_pricing`),
        found on the first call (collective).
    machine : Cluster, optional
        The cluster the bytes move on, for pricing (default: this host when every rank
        runs on it and the profile was measured on one; the emulated cluster on the
        testbed; else ``cluster``).
    mode : {"measured", "model"}, optional
        For ``auto``: default ``$TOPOPLAN_AUTO``, else ``measured``.

    Attributes
    ----------
    chosen : dict
        Byte size -> the algorithm its calls run (``exploring`` while ``auto`` measures;
        ``native`` for the transport's own allreduce).
    choice : MeasuredChoice or None
        ``auto``'s decisions (``choice.decisions``, ``choice.history``).

    Notes
    -----
    Planning happens once per distinct byte size (``auto``: once per size class, its
    candidates planned for the first size seen); DDP buckets and fusion buffers have a
    handful of sizes, so after the first steps every call is a cache hit.

    Schedules with native steps (IR v3: the transport's own collectives over groups of
    ranks) run like any other: the first executor over a group makes the group's
    sub-communicator on the transport (collective over every rank; the trainers make
    their calls in the same order on every rank, which this needs), later ones reuse it.
    A schedule whose only step is a native allreduce over every rank runs the
    transport's own allreduce.
    """

    def __init__(self, cluster: Any, transport: Any, *, algorithm: str = "auto",
                 share: Callable[[Any], Any] | None = None, timeout: float = 60.0,
                 schedule: Any = None, profile: Any = None, machine: Any = None,
                 mode: str | None = None) -> None:
        if cluster is None and schedule is None:
            raise TopoplanError("PlannedAllreduce needs a cluster to plan for (or a schedule "
                                "to run)")
        self.cluster = cluster
        self.transport = transport
        self.algorithm = algorithm if schedule is None else schedule.algorithm
        self.share = share
        self.timeout = timeout
        self.schedule = schedule
        self.nranks = int(cluster.nranks if cluster is not None else schedule.nranks)
        if schedule is not None and schedule.nranks != self.nranks:
            raise TopoplanError(f"the schedule is for {schedule.nranks} ranks, the cluster "
                                f"{getattr(cluster, 'name', '?')!r} has {self.nranks}")
        if cluster is not None and cluster.nranks != transport.size:
            raise TopoplanError(f"cluster {getattr(cluster, 'name', '?')!r} has "
                                f"{cluster.nranks} ranks but the {transport.name} transport "
                                f"has {transport.size}; pick a cluster with {transport.size}")
        self.stats = AllreduceStats()
        self._executors: dict[int, Any] = {}
        self.chosen: dict[int, str] = {}   # byte size -> algorithm its calls run
        self._profile, self._machine = profile, machine
        self._pricing: Any = None
        self._inflight: list[Any] = []
        self._noted: dict[int, int] = {}
        self.choice: Any = None
        if schedule is None and algorithm == "auto":
            from topoplan.runtime.choice import MeasuredChoice, snapshot
            self.choice = MeasuredChoice(transport, self._options, self._make_executor,
                                         mode=mode, snapshot=snapshot, drain=self._drain)

    @property
    def pricing(self) -> Any:
        """The profile and machine plans are priced with (found on first use: collective)."""
        if self._pricing is None:
            from topoplan.runtime.calibrate import job_pricing
            self._pricing = job_pricing(self.transport, self.cluster, profile=self._profile,
                                        machine=self._machine)
        return self._pricing

    def _make_executor(self, schedule: Any, verified: bool = True) -> Any:
        """The executor of ``schedule``; ``verified``: planned here (the pipeline verified
        it, or rank 0's did), so not verified again. A schedule given to the constructor
        is verified by its first executor."""
        from topoplan.runtime.choice import executor_for
        return executor_for(schedule, self.transport, timeout=self.timeout,
                            verified=verified)

    def _options(self, nbytes: int, slow: Any = None) -> tuple[list[Any], str]:
        """auto's candidates for a new size class (rank 0's, with ``share``); ``slow``:
        planned on the cluster with those links at their measured rates (link health)."""
        from topoplan.runtime.choice import model_options, shared_options
        from topoplan.runtime.health import with_slow_links
        pricing = self.pricing
        self.choice.enable_health(pricing.machine or self.cluster, pricing.profile)
        cluster, machine = with_slow_links(slow, self.cluster, pricing.machine)

        def make() -> tuple[list[Any], str]:
            return model_options(cluster, nbytes, profile=pricing.profile, machine=machine)

        if self.share is None:
            return make()
        return shared_options(self.transport.rank, self.share, make,
                              f"auto allreduce of {nbytes} bytes")

    def executor_for(self, nbytes: int) -> Any:
        """The cached executor for buffers of ``nbytes`` bytes, planning it if new
        (a named planner or a schedule; ``auto`` chooses per call)."""
        executor = self._executors.get(nbytes)
        if executor is None:
            import topoplan

            if self.schedule is not None:
                # One schedule: one executor (it compiles each size once).
                schedule = self.schedule
                executor = next(iter(self._executors.values()), None)
            else:
                pricing = self.pricing
                schedule = topoplan.plan(self.cluster, algorithm=self.algorithm,
                                         size=max(nbytes, 1), profile=pricing.profile,
                                         machine=pricing.machine)
                if self.share is not None:
                    schedule = topoplan.loads_schedule(self.share(schedule.to_json()))
            if executor is None:
                executor = self._make_executor(schedule, verified=self.schedule is None)
            self._executors[nbytes] = executor
            # auto's schedules name what it picked in their meta
            self.chosen[nbytes] = str(schedule.meta.get("chosen", schedule.algorithm))
        return executor

    def _note_choice(self, nbytes: int) -> None:
        """``chosen[nbytes]``, kept current (only looked up when a decision moved)."""
        version = self.choice.version
        if self._noted.get(nbytes) != version:
            self._noted[nbytes] = version
            self.chosen[nbytes] = self.choice.chosen(max(nbytes, 1)) or "exploring"

    def _drain(self) -> None:
        """Wait for the calls this started that are still in flight."""
        while self._inflight:
            self._inflight.pop(0).wait()

    def __call__(self, buffer: Any) -> Any:
        nbytes = nbytes_of(buffer)
        start = time.perf_counter()
        if self.choice is not None:
            self.choice.call(max(nbytes, 1), buffer)
            self._note_choice(nbytes)
        else:
            self.executor_for(nbytes)(buffer)
        self.stats.add(nbytes, time.perf_counter() - start)
        return buffer

    def claim_native(self, buffer: Any) -> bool:
        """Whether this call of ``buffer`` is one ``auto`` runs with the transport's own
        allreduce and nothing else (:meth:`MeasuredChoice.claim_native
        <topoplan.runtime.choice.MeasuredChoice.claim_native>`); then it is counted as
        a call, and the caller runs that allreduce itself (the torch backend starts its
        inner backend's, asynchronous)."""
        if self.choice is None:
            return False
        nbytes = nbytes_of(buffer)
        if not self.choice.claim_native(max(nbytes, 1)):
            return False
        self._note_choice(nbytes)
        self.stats.add(nbytes, 0.0)
        return True

    def start(self, buffer: Any) -> Any:
        """Start the planned allreduce of ``buffer``; an
        :class:`~topoplan.AllreduceHandle` (``test()``, ``wait()``). Planning a new size
        happens here, before it returns; so does an exploring call of ``auto`` (run to
        the end, timed alone). ``stats`` counts the call and its bytes (its seconds are
        the caller's to measure: they overlap other work)."""
        nbytes = nbytes_of(buffer)
        if self.choice is not None:
            handle = self.choice.start(max(nbytes, 1), buffer)
            self._note_choice(nbytes)
            self._inflight = [h for h in self._inflight if not getattr(h, "done", False)]
            self._inflight.append(handle)
        else:
            handle = self.executor_for(nbytes).start(buffer)
        self.stats.add(nbytes, 0.0)
        return handle

    def __repr__(self) -> str:
        return (f"PlannedAllreduce(cluster={getattr(self.cluster, 'name', '?')!r}, "
                f"algorithm={self.algorithm!r}, nranks={self.nranks})")


class _Native:
    """Shared timing wrapper of the native baselines."""

    nranks: int

    def __init__(self) -> None:
        self.stats = AllreduceStats()
        self.algorithm = "native"
        self.chosen: dict[int, str] = {}

    def _run(self, buffer: Any) -> None:
        raise NotImplementedError

    def __call__(self, buffer: Any) -> Any:
        start = time.perf_counter()
        self._run(buffer)
        self.stats.add(nbytes_of(buffer), time.perf_counter() - start)
        return buffer

    def start(self, buffer: Any) -> _NativeHandle:
        """The library's own non-blocking allreduce; a handle with ``test()``/``wait()``."""
        self.stats.add(nbytes_of(buffer), 0.0)
        return self._start(buffer)

    def _start(self, buffer: Any) -> _NativeHandle:
        raise NotImplementedError


class _NativeHandle:
    """A native non-blocking allreduce: ``poll()`` says done, ``finish()`` completes it."""

    def __init__(self, buffer: Any, poll: Callable[[], bool], finish: Callable[[], None]) -> None:
        self.buffer, self._poll, self._finish = buffer, poll, finish
        self.done = False

    def test(self) -> bool:
        if not self.done and self._poll():
            self._finish()
            self.done = True
        return self.done

    def wait(self) -> Any:
        if not self.done:
            self._finish()
            self.done = True
        return self.buffer


class torch_native_allreduce(_Native):  # noqa: N801 - used like a function
    """``torch.distributed.all_reduce`` (sum) as an allreduce callable: the baseline."""

    def __init__(self, group: Any = None) -> None:
        super().__init__()
        import torch.distributed as dist

        self._dist, self.group = dist, group
        self.nranks = dist.get_world_size(group)

    def _run(self, buffer: Any) -> None:
        self._dist.all_reduce(buffer, group=self.group)

    def _start(self, buffer: Any) -> _NativeHandle:
        work = self._dist.all_reduce(buffer, group=self.group, async_op=True)
        return _NativeHandle(buffer, work.is_completed, work.wait)


class mpi_native_allreduce(_Native):  # noqa: N801 - used like a function
    """``comm.Allreduce(IN_PLACE, ...)`` (sum) on numpy arrays or CPU torch tensors."""

    def __init__(self, comm: Any) -> None:
        super().__init__()
        from mpi4py import MPI

        self._mpi, self.comm = MPI, comm
        self.nranks = comm.Get_size()

    def _run(self, buffer: Any) -> None:
        array = buffer.numpy() if hasattr(buffer, "numpy") else buffer
        if array.dtype.kind == "f" and array.dtype.itemsize == 2:
            # MPI has no standard half type: sum in float32 (same result, twice the bytes).
            wide = array.astype("float32")
            self.comm.Allreduce(self._mpi.IN_PLACE, wide, op=self._mpi.SUM)
            array[...] = wide
            return
        try:
            self.comm.Allreduce(self._mpi.IN_PLACE, array, op=self._mpi.SUM)
        except KeyError as exc:  # mpi4py has no MPI datatype for this dtype
            raise TopoplanError(f"MPI allreduce cannot sum dtype {array.dtype}") from exc

    def _start(self, buffer: Any) -> _NativeHandle:
        array = buffer.numpy() if hasattr(buffer, "numpy") else buffer
        wide = array.astype("float32") if (array.dtype.kind == "f"
                                           and array.dtype.itemsize == 2) else array
        try:
            request = self.comm.Iallreduce(self._mpi.IN_PLACE, wide, op=self._mpi.SUM)
        except KeyError as exc:
            raise TopoplanError(f"MPI allreduce cannot sum dtype {array.dtype}") from exc

        def finish() -> None:
            request.Wait()
            if wide is not array:
                array[...] = wide

        return _NativeHandle(buffer, request.Test, finish)
