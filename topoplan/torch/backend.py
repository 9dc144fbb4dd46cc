"""The ``topoplan`` torch.distributed backend: ``init_process_group("topoplan")``.

``import topoplan.torch`` registers it. A job then changes two lines and nothing else::

    import topoplan.torch                      # registers the backend
    dist.init_process_group("topoplan")        # was "gloo" (or "nccl")

and runs with the cluster named in ``TOPOPLAN_CLUSTER`` (a cluster YAML,
docs/CLUSTER.md), or given as ``pg_options=TopoplanOptions(cluster=...)``.

What it is: a Python :class:`torch.distributed.ProcessGroup` (the kind torch's own
``test_c10d_pypg.py`` trains DDP over) wrapping an *inner* backend, gloo for CPU tensors
and nccl for CUDA ones. It runs with topoplan schedules, chosen by ``auto`` (measured on
the job: :class:`~topoplan.runtime.choice.MeasuredChoice`, whose candidates include the
inner backend's own collective, so a job is never stuck with a plan slower than it):

- ``allreduce`` (``SUM``, ``AVG``) and ``allreduce_coalesced`` (DDP's buckets, ``dist.all_reduce``);
- ``reduce_scatter_tensor`` (``reduce_scatter_single``, ``_reduce_scatter_base``) and
  ``all_gather_into_tensor`` (``all_gather_single``, ``_allgather_base``), and their
  coalesced forms (FSDP2's).

Everything else goes to the inner backend as it is: other reduce ops, dtypes the
executor does not sum (``bool``...), non-contiguous tensors, ``broadcast``, ``barrier``,
``all_to_all``, ``send``/``recv``, ``gather``, ``scatter``, ``reduce``, the list forms of
all-gather and reduce-scatter, and the object collectives (built on those).

Ranks: group rank ``r`` of the world is cluster rank ``r`` (the cluster's ranks in file
order, as ``topoplan launch`` and ``torchrun`` number them); a sub-group
(``new_group``, a device mesh's dimension) plans on its ranks' slice of the cluster
(:func:`~topoplan.analysis.native.clusters.group_cluster`), and delegates everything
when its ranks are not in the cluster's order.

Calls are asynchronous: a planned call is queued on the process group's worker thread
(one per group, so every rank runs its calls in the order it made them) and returns a
:class:`TopoplanWork` with a future (``get_future()``: DDP's reducer waits on it). The
planned traffic and its small agreement collectives run on an inner backend of their
own; delegated calls on another; neither can reorder the other's collectives.

Errors: a bad or missing cluster is one :class:`~topoplan.TopoplanError` at init on every
rank (the ranks agree through the rendezvous store before any connection is made, so
none is left waiting); a planned step that fails raises torch's
:class:`torch.distributed.DistBackendError` naming the rank, the step and the peer.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import queue
import threading
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch._C._distributed_c10d as _c10d
import torch.distributed as dist

from ..errors import TopoplanError, TransportError
from .sharded import REDUCE_DTYPES, _op_name

__all__ = ["NAME", "ENV", "TopoplanOptions", "TopoplanProcessGroup", "TopoplanWork",
           "register_backend"]

log = logging.getLogger("topoplan.backend")

#: The backend's name: ``dist.init_process_group(NAME)``.
NAME = "topoplan"
#: The environment variable naming the cluster file.
ENV = "TOPOPLAN_CLUSTER"
#: Ops the planned allreduce and reduce-scatter run (the others are delegated).
PLANNED_OPS = ("SUM", "AVG")


@dataclass
class TopoplanOptions:
    """The backend's options: ``init_process_group("topoplan", pg_options=...)`` (also
    ``new_group(..., pg_options=...)``; a sub-group without them takes the world's).

    Parameters
    ----------
    cluster : Cluster, str or path, optional
        The cluster, or its YAML file. Default: ``$TOPOPLAN_CLUSTER``.
    algorithm : str
        Planner for every planned call (``auto``, the default, measures; ``ring``,
        ``rhd``, ... as :func:`topoplan.plan`).
    timeout : float, optional
        Seconds a planned step may wait before it fails (default: the process group's
        timeout).
    mode : {"measured", "model"}, optional
        For ``auto`` (default ``$TOPOPLAN_AUTO``, else ``measured``).
    """

    cluster: Any = None
    algorithm: str = "auto"
    timeout: float | None = None
    mode: str | None = None


# -- the work object ---------------------------------------------------------------------
def _value(future: torch.futures.Future) -> Any:
    """``future.value()``: raises what the call raised (see :class:`TopoplanWork`)."""
    return future.value()


class TopoplanWork(dist.Work):
    """A call of the backend: done when its job on the worker thread is (planned), with
    a :class:`torch.futures.Future` of its output tensors.

    ``wait()`` raises the call's :class:`~torch.distributed.DistBackendError`, if any.
    """

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._outcome: torch.futures.Future = torch.futures.Future()
        # What get_future() hands out: DDP's reducer reads it in C++, where an exception
        # set from Python is only an object ("Unable to cast <message> to Tensor"); a
        # callback that raises marks the Future it returns failed, as C++ expects.
        self._future: torch.futures.Future = self._outcome.then(_value)

    def _finish(self, error: BaseException | None = None) -> None:
        # Done first: a caller woken by the future (DDP's callbacks run inside
        # set_result) sees the work completed.
        self._error = error
        self._done.set()
        if error is None:
            self._outcome.set_result(self._result)
        else:
            self._outcome.set_exception(error)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        # Each planned step has its deadline (TopoplanOptions.timeout); ``timeout``
        # (torch's: zero is none) bounds this wait too.
        seconds = timeout.total_seconds() if timeout else None
        if not self._done.wait(seconds or None):
            raise dist.DistBackendError(f"topoplan backend: the call did not finish within "
                                        f"the {seconds:g} s wait() was given")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._future

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else (
            "done" if self._done.is_set() else "queued")
        return f"<TopoplanWork {state}>"


def _done_work(result: list[torch.Tensor]) -> TopoplanWork:
    work = TopoplanWork(result)
    work._finish()
    return work


class _Joined(TopoplanWork):
    """Works of the inner backend that have no future (gloo's ``_reduce_scatter_base``):
    done when all of them are, found out by waiting for them in :meth:`wait` (or when
    :meth:`is_completed` sees them done). A future, when asked for, is completed by a
    thread that waits."""

    def __init__(self, result: list[torch.Tensor], works: list[Any],
                 finish: Callable[[], None] | None,
                 describe: Callable[[BaseException], BaseException]) -> None:
        super().__init__(result)
        self._works, self._after, self._describe = works, finish, describe
        self._joining = threading.Lock()
        self._waiter: threading.Thread | None = None

    def _join(self) -> None:
        with self._joining:
            if self._done.is_set():
                return
            try:
                for w in self._works:
                    w.wait()
                if self._after is not None:
                    self._after()
            except Exception as exc:  # noqa: BLE001 - handed to wait()
                self._finish(self._describe(exc))
            else:
                self._finish()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._join()
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if not self._done.is_set() and all(w.is_completed() for w in self._works):
            self._join()
        return self._done.is_set()

    def get_future(self) -> torch.futures.Future:
        with self._joining:
            if self._waiter is None and not self._done.is_set():
                self._waiter = threading.Thread(target=self._join, daemon=True,
                                                name="topoplan-join")
                self._waiter.start()
        return self._future


def _completion(works: list[Any], result: list[torch.Tensor],
                finish: Callable[[], None] | None,
                describe: Callable[[BaseException], BaseException]) -> TopoplanWork:
    """A work done when the inner backend's ``works`` are (then ``finish()``): their
    futures complete it, with no thread of ours (one alive at the interpreter's exit
    after running DDP's callbacks aborts the process); works without futures are
    waited for (:class:`_Joined`)."""
    try:
        futures = [w.get_future() for w in works]
    except RuntimeError:   # "Work::getFuture not implemented"
        return _Joined(result, works, finish, describe)
    work = TopoplanWork(result)

    def done(all_done: torch.futures.Future) -> None:
        try:
            for future in all_done.value():
                future.value()   # raises the first call's error
            if finish is not None:
                finish()
        except Exception as exc:  # noqa: BLE001 - handed to the caller's wait()
            work._finish(describe(exc))
        else:
            work._finish()

    torch.futures.collect_all(futures).add_done_callback(done)
    return work


class _Worker:
    """One thread running a process group's planned calls in the order they were made
    (every rank makes them in one order, so the ranks' threads agree)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0          # jobs queued or running
        self._direct: list[Any] = []  # the inner backend's works started directly
        #: Calls started directly (:meth:`direct`).
        self.direct_calls = 0
        self.closed = False

    def submit(self, job: Callable[[], None], work: TopoplanWork,
               describe: Callable[[BaseException], BaseException]) -> TopoplanWork:
        with self._lock:
            if self.closed:
                raise dist.DistBackendError(f"{self.name}: the process group was shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
                _WORKERS.add(self)
            self._pending += 1
            self._queue.put((job, work, describe))
        return work

    def direct(self, start: Callable[[], Any]) -> Any:
        """``start()`` on the caller's thread, when no job is queued or running (every
        earlier call has then sent what it sends: starting now keeps the order the
        calls were made in), under the lock :meth:`submit` takes; None when busy.
        ``start`` returns None, or the inner backend's work it started (held until
        done: :meth:`close` waits for it)."""
        with self._lock:
            if self.closed or self._pending:
                return None
            started = start()
            if started is not None:
                self._direct = [w for w in self._direct if not w.is_completed()]
                self._direct.append(started)
                self.direct_calls += 1
            return started

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, work, describe = item
            error: BaseException | None = None
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - handed to the caller's wait()
                error = describe(exc)
            with self._lock:
                self._pending -= 1
            work._finish(error)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            thread, direct = self._thread, self._direct
        if thread is not None:
            self._queue.put(None)
            if thread is not threading.current_thread():
                thread.join(timeout=10)
        for started in direct:   # their callbacks run Python: done before the exit
            try:
                started.wait()
            except Exception:  # noqa: BLE001 - its caller was told
                pass


_WORKERS: weakref.WeakSet[_Worker] = weakref.WeakSet()


@atexit.register
def _close_workers() -> None:
    # A thread that ran DDP's future callbacks and is alive at interpreter shutdown
    # aborts the process (see topoplan/torch/progress.py).
    for worker in list(_WORKERS):
        worker.close()


# -- the cluster ---------------------------------------------------------------------------
def _load(cluster: Any) -> Any:
    if cluster is None:
        path = os.environ.get(ENV, "").strip()
        if not path:
            raise TopoplanError(
                f"the topoplan backend needs a cluster: set {ENV} to a cluster YAML file "
                f"(e.g. {ENV}=topologies/ddl_two_switch.yaml) or pass "
                f"init_process_group('topoplan', pg_options=TopoplanOptions(cluster=...))")
        source = f"{ENV}={path}"
        cluster = path
    else:
        source = "TopoplanOptions.cluster"
    if hasattr(cluster, "nranks"):
        return cluster
    from ..cluster import load_cluster
    if not os.path.exists(os.fspath(cluster)):
        raise TopoplanError(f"{source}: no such cluster file; set {ENV} to a cluster YAML "
                            "file (docs/CLUSTER.md)")
    try:
        return load_cluster(cluster)
    except TopoplanError as exc:
        raise TopoplanError(f"{source}: {exc}") from None


def _cluster_for(options: TopoplanOptions, world: int, ranks: list[int]) -> tuple[Any, str]:
    """The cluster the group's plans are made on (None: delegate everything) and a note."""
    cluster = _load(options.cluster)
    where = f"{ENV}" if options.cluster is None else "TopoplanOptions.cluster"
    if cluster.nranks != world:
        raise TopoplanError(
            f"{where}: cluster {cluster.name!r} has {cluster.nranks} ranks but the job has "
            f"{world}; name a cluster of {world} ranks (its ranks in file order are the "
            f"job's ranks 0..{world - 1})")
    if ranks == list(range(world)):
        return cluster, ""
    from ..analysis.native.clusters import group_cluster
    sub = group_cluster(cluster, ranks)
    if list(sub.ranks) != ranks:
        return None, (f"group of ranks {ranks} is not in the cluster's rank order; its calls "
                      f"go to the inner backend unplanned")
    return sub.cluster, ""


def _agree(store: Any, rank: int, size: int, key: str, error: BaseException | None) -> None:
    """Every rank says through the store whether it failed, then all raise the lowest
    failed rank's error: no rank goes on to connect and wait for one that gave up."""
    store.set(f"topoplan/{key}/{rank}", "" if error is None else f"{error}")
    failed = [(r, store.get(f"topoplan/{key}/{r}").decode()) for r in range(size)]
    failed = [(r, text) for r, text in failed if text]
    if not failed:
        return
    first, text = failed[0]
    if len(failed) < size or any(t != text for _, t in failed):
        text = f"rank {first}: {text}"     # not every rank alike: say whose it is
    if error is not None and str(error) == text:
        raise error
    raise TopoplanError(text)


# -- the process group ----------------------------------------------------------------------
class TopoplanProcessGroup(dist.ProcessGroup):
    """The process group ``init_process_group("topoplan")`` and ``new_group`` make.

    Made by the registered creator (:func:`register_backend`), not by hand. Its methods
    are torch.distributed's process-group API; see the module docstring for which are
    planned and which go to the inner backend.

    Attributes
    ----------
    cluster : Cluster or None
        What the group's calls are planned on (None: every call is delegated).
    allreduce_planned : PlannedAllreduce or None
    collectives : PlannedCollectives or None
        What ran the planned calls: their ``chosen`` and ``stats`` say what ran.
    """

    def __init__(self, rank: int, size: int, *, cluster: Any, options: TopoplanOptions,
                 inner: dict[str, tuple[Any, Any]], timeout: float, name: str) -> None:
        super().__init__(rank, size)
        self.cluster = cluster
        self.options = options
        # device type -> (the backend delegated calls run on, the one planned calls do)
        self._inner = inner
        self._timeout = timeout
        self._worker = _Worker(f"topoplan-{name}")
        self._made: dict[str, tuple[Any, Any]] = {}
        # What torch calls from C++ without a Python override (functional collectives:
        # DTensor's redistribution; the group's name and description) goes to the
        # delegated backend of the tensors' device.
        types = {"cpu": dist.ProcessGroup.BackendType.GLOO,
                 "cuda": dist.ProcessGroup.BackendType.NCCL}
        for kind, (delegate, _) in inner.items():
            self._register_backend(torch.device(kind), types[kind], delegate)
        self._set_default_backend(types["cpu"])

    @property
    def _delegate(self) -> Any:
        return self._inner["cpu"][0]

    def _delegate_for(self, tensors: list[torch.Tensor]) -> Any:
        kind = tensors[0].device.type if tensors else "cpu"
        return self._inner.get(kind, self._inner["cpu"])[0]

    @property
    def allreduce_planned(self) -> Any:
        """The :class:`~topoplan.torch.PlannedAllreduce` of CPU tensors (None before
        the first planned call)."""
        return self._made.get("cpu", (None, None))[0]

    @property
    def direct_calls(self) -> int:
        """Calls run with the inner backend's own collective started on the caller's
        thread (``auto`` chose it, and the call had nothing else to do)."""
        return self._worker.direct_calls

    @property
    def collectives(self) -> Any:
        """The :class:`~topoplan.torch.PlannedCollectives` of CPU tensors."""
        return self._made.get("cpu", (None, None))[1]

    # -- torch's identity calls ----------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return NAME

    def name(self) -> str:
        return NAME

    def _get_backend_name(self) -> str:
        return NAME

    # -- what runs the planned calls -----------------------------------------------------
    def _planned(self, kind: str) -> tuple[Any, Any]:
        """The planned allreduce and collectives of ``kind`` tensors (``cpu``,
        ``cuda``), made on first use, on the worker."""
        made = self._made.get(kind)
        if made is None:
            from ..runtime.transports.c10d import C10d
            from .planned import PlannedAllreduce
            from .sharded import PlannedCollectives

            device = (torch.device("cuda", torch.cuda.current_device()) if kind == "cuda"
                      else torch.device("cpu"))
            transport = C10d(self._inner[kind][1], device)
            options = self.options
            made = self._made[kind] = (
                PlannedAllreduce(self.cluster, transport, algorithm=options.algorithm,
                                 share=transport.share, timeout=self._timeout,
                                 mode=options.mode),
                PlannedCollectives(self.cluster, algorithm=options.algorithm,
                                   timeout=self._timeout, mode=options.mode,
                                   transport=transport))
        return made

    def _plannable(self, tensors: list[torch.Tensor], dtypes: frozenset = REDUCE_DTYPES) -> bool:
        if self.cluster is None or self.size() == 1 or self._worker.closed or not tensors:
            return False
        kind = tensors[0].device.type
        return kind in self._inner and all(
            isinstance(t, torch.Tensor) and t.dtype in dtypes and t.is_contiguous()
            and t.device == tensors[0].device for t in tensors)

    def _describe(self, what: str) -> Callable[[BaseException], BaseException]:
        rank = self.rank()

        def describe(exc: BaseException) -> BaseException:
            if isinstance(exc, dist.DistBackendError):
                return exc
            if isinstance(exc, TransportError):
                text = f"topoplan backend: {what}: {exc}"   # names rank, step and peer
            else:
                text = f"topoplan backend: rank {rank}: {what}: {type(exc).__name__}: {exc}"
            error = dist.DistBackendError(text)
            error.__cause__ = exc
            return error

        return describe

    def _submit(self, what: str, job: Callable[[], None],
                result: list[torch.Tensor]) -> TopoplanWork:
        return self._worker.submit(job, TopoplanWork(result), self._describe(what))

    def _direct(self, what: str, kind: str, claim: Callable[[Any, Any], bool],
                call: Callable[[Any], Any], result: list[torch.Tensor],
                finish: Callable[[], None] | None = None) -> Any:
        """A call ``auto`` runs with the inner backend's own collective and nothing
        else, started here on the caller's thread (no hop to the worker: what a job
        feels on every call): ``claim(allreduce, collectives)`` says whether this call
        is one (:meth:`PlannedAllreduce.claim_native`); ``call(inner)`` starts it on
        the inner backend and returns its work. With nothing to do after it, that work
        is the call's, as a delegated call's is: its future completes DDP's bucket
        with no Python callback between (a callback waits for the GIL: DDP steps on
        two_leaf_oversubscribed's testbed cut took 6 ms longer). With ``finish()``
        (AVG's division), its future completes ours after it. None: the call goes to
        the worker (the worker is busy, the planned objects are not made yet, or it is
        not such a call)."""
        made = self._made.get(kind)
        if made is None:
            return None

        def start() -> Any:
            return call(self._inner[kind][1]) if claim(*made) else None

        started = self._worker.direct(start)
        if started is None or finish is None:
            return started
        return _completion([started], result, finish, self._describe(what))

    # -- allreduce ---------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """``dist.all_reduce``: planned for ``SUM`` and ``AVG`` (floating types) on
        contiguous tensors of the dtypes the executor sums; else the inner backend's."""
        if opts is None or not hasattr(opts, "reduceOp"):
            opts = _allreduce_options(opts)
        op = _op_name(opts.reduceOp)
        if not self._reducible(tensors, op):
            return self._delegate_for(tensors).allreduce(tensors, opts)
        return self._run_allreduce("allreduce", tensors, op)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        """Several tensors in one call: each dtype's tensors flattened into one buffer and
        allreduced by one plan (``dist.all_reduce_coalesced``, a coalescing manager)."""
        op = _op_name(opts.reduceOp) if opts is not None else "SUM"
        if not self._reducible(tensors, op):
            return self._delegate_for(tensors).allreduce_coalesced(tensors, opts)
        return self._run_allreduce("allreduce_coalesced", tensors, op)

    def _reducible(self, tensors: list[torch.Tensor], op: str) -> bool:
        if op not in PLANNED_OPS or not self._plannable(tensors):
            return False
        return op == "SUM" or all(t.is_floating_point() or t.is_complex() for t in tensors)

    def _run_allreduce(self, what: str, tensors: list[torch.Tensor], op: str) -> TopoplanWork:
        world, kind = self.size(), tensors[0].device.type
        if len(tensors) == 1 and tensors[0].numel():
            t = tensors[0]
            work = self._direct(
                what, kind, lambda run, _: run.claim_native(t.view(-1)),
                lambda inner: inner.allreduce([t], _allreduce_options(dist.ReduceOp.SUM)),
                [t], (lambda: t.div_(world)) if op == "AVG" else None)
            if work is not None:
                return work

        def job() -> None:
            run, _ = self._planned(kind)
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for t in tensors:
                if t.numel():
                    by_dtype.setdefault(t.dtype, []).append(t)
            for group in by_dtype.values():
                if len(group) == 1:
                    run(group[0].view(-1))
                    if op == "AVG":
                        group[0].div_(world)
                    continue
                flat = torch.cat([t.view(-1) for t in group])
                run(flat)
                if op == "AVG":
                    flat.div_(world)
                offset = 0
                for t in group:
                    t.view(-1).copy_(flat[offset:offset + t.numel()])
                    offset += t.numel()

        return self._submit(what, job, list(tensors))

    # -- reduce-scatter and all-gather into one tensor ----------------------------------
    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Any:
        """``dist.reduce_scatter_tensor``: planned for ``SUM``/``AVG``."""
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """FSDP2's coalesced reduce-scatter (a coalescing manager): one planned call per
        pair, run back to back on the worker."""
        if opts is None:
            opts = dist.ReduceScatterOptions()
        op = _op_name(opts.reduceOp)
        pairs = list(zip(outputs, inputs))
        if not self._reducible([*outputs, *inputs], op) or not all(
                o.dtype == i.dtype and i.numel() == self.size() * o.numel() for o, i in pairs):
            inner = self._delegate_for(list(outputs))
            if len(pairs) == 1:
                return inner._reduce_scatter_base(outputs[0], inputs[0], opts)
            return _delegate_each([partial(inner._reduce_scatter_base, o, i, opts)
                                   for o, i in pairs], list(outputs))
        dist_op = dist.ReduceOp.AVG if op == "AVG" else dist.ReduceOp.SUM
        kind = outputs[0].device.type
        if len(pairs) == 1 and inputs[0].numel():
            (o, i), world = pairs[0], self.size()
            work = self._direct(
                "reduce_scatter_tensor", kind,
                lambda _, planned: planned.claim_native("reduce_scatter", i),
                lambda inner: inner._reduce_scatter_base(o, i, dist.ReduceScatterOptions()),
                [o], (lambda: o.div_(world)) if op == "AVG" else None)
            if work is not None:
                return work

        def job() -> None:
            _, collectives = self._planned(kind)
            for o, i in pairs:
                collectives.reduce_scatter_tensor(o, i, op=dist_op)

        return self._submit("reduce_scatter_tensor", job, list(outputs))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:
        """``dist.all_gather_into_tensor``: planned."""
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> Any:
        """FSDP's coalesced all-gather: one planned call per pair, back to back."""
        from .sharded import GATHER_DTYPES

        if opts is None:
            opts = _c10d.AllgatherOptions()
        pairs = list(zip(outputs, inputs))
        if not self._plannable([*outputs, *inputs], GATHER_DTYPES) or not all(
                o.dtype == i.dtype and o.numel() == self.size() * i.numel() for o, i in pairs):
            inner = self._delegate_for(list(outputs))
            if len(pairs) == 1:
                return inner._allgather_base(outputs[0], inputs[0], opts)
            return _delegate_each([partial(inner._allgather_base, o, i, opts)
                                   for o, i in pairs], list(outputs))
        kind = outputs[0].device.type
        if len(pairs) == 1 and outputs[0].numel():
            o, i = pairs[0]
            work = self._direct(
                "all_gather_into_tensor", kind,
                lambda _, planned: planned.claim_native("allgather", o),
                lambda inner: inner._allgather_base(o, i, _c10d.AllgatherOptions()), [o])
            if work is not None:
                return work

        def job() -> None:
            _, collectives = self._planned(kind)
            for o, i in pairs:
                collectives.all_gather_into_tensor(o, i)

        return self._submit("all_gather_into_tensor", job, list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- delegated ---------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate_for(tensors).broadcast(tensors, opts if opts is not None
                                        else dist.BroadcastOptions())

    def barrier(self, opts: Any = None) -> Any:
        return self._delegate.barrier(opts if opts is not None else dist.BarrierOptions())

    def allgather(self, output_tensors: list[list[torch.Tensor]],
                  input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate_for(input_tensors).allgather(output_tensors, input_tensors,
                                        opts if opts is not None else _c10d.AllgatherOptions())

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_list: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate_for(input_list).allgather_coalesced(
            output_lists, input_list, opts if opts is not None else _c10d.AllgatherOptions())

    def gather(self, output_tensors: list[list[torch.Tensor]],
               input_tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate_for(input_tensors).gather(output_tensors, input_tensors,
                                     opts if opts is not None else dist.GatherOptions())

    def scatter(self, output_tensors: list[torch.Tensor],
                input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        return self._delegate_for(output_tensors).scatter(output_tensors, input_tensors,
                                      opts if opts is not None else dist.ScatterOptions())

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._delegate_for(tensors).reduce(tensors, opts if opts is not None else dist.ReduceOptions())

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> Any:
        return self._delegate_for(output_tensors).reduce_scatter(
            output_tensors, input_tensors,
            opts if opts is not None else dist.ReduceScatterOptions())

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Any:
        return self._delegate_for(input_tensors).alltoall(output_tensors, input_tensors,
                                       opts if opts is not None else dist.AllToAllOptions())

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Any:
        return self._delegate_for([input]).alltoall_base(output, input, output_split_sizes,
                                            input_split_sizes,
                                            opts if opts is not None else dist.AllToAllOptions())

    alltoall_base = all_to_all_single

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._delegate_for(tensors).send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._delegate_for(tensors).recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        return self._delegate_for(tensors).recv_anysource(tensors, tag)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        return self._delegate.monitored_barrier(timeout, wait_all_ranks)

    # -- the end -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the worker thread (after the calls queued) and the inner backends."""
        self._worker.close()
        for backend in (b for pair in self._inner.values() for b in pair):
            try:
                backend.shutdown()
            except Exception:  # noqa: BLE001 - best effort at the end
                pass

    def abort(self) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (f"TopoplanProcessGroup(rank={self.rank()}, size={self.size()}, "
                f"cluster={getattr(self.cluster, 'name', None)!r}, "
                f"algorithm={self.options.algorithm!r})")


def _allreduce_options(op: Any) -> Any:
    opts = dist.AllreduceOptions()
    if op is not None:
        opts.reduceOp = op
    return opts


def _delegate_each(calls: list[Callable[[], Any]], outputs: list[torch.Tensor]) -> TopoplanWork:
    """Start each delegated call now; a work done when all of theirs are."""
    return _completion([call() for call in calls], outputs, None, lambda exc: exc)


# -- the creator torch calls -----------------------------------------------------------------
def _inner(store: Any, prefix: str, rank: int, size: int, timeout: datetime.timedelta,
           device: str) -> Any:
    sub = dist.PrefixStore(prefix, store)
    if device == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(sub, rank, size, options)
    return dist.ProcessGroupGloo(sub, rank, size, timeout)


def _create(common: Any, options: Any) -> TopoplanProcessGroup:
    """The creator registered with torch (``extended_api=True``): ``common`` holds the
    store, the group rank and size, the timeout and the group's global ranks; ``options``
    is what ``pg_options`` passed (a :class:`TopoplanOptions`, or None)."""
    store, rank, size = common.store, int(common.group_rank), int(common.group_size)
    timeout = common.timeout
    ranks = [int(r) for r in (common.global_ranks_in_group or range(size))]
    error: BaseException | None = None
    cluster, note = None, ""
    try:
        options = _options(options)
        world = dist.get_world_size() if dist.is_initialized() else size
        cluster, note = _cluster_for(options, world, ranks)
    except Exception as exc:  # noqa: BLE001 - every rank raises, just below
        error = exc
    _agree(store, rank, size, "cluster", error)
    if note and rank == 0:
        log.warning("topoplan backend: %s", note)
    # gloo for CPU tensors; nccl for CUDA ones where there is a GPU (its communicators
    # connect at their first call)
    kinds = ["cpu", "cuda"] if torch.cuda.is_available() and dist.is_nccl_available() \
        else ["cpu"]
    inner = {kind: (_inner(store, f"delegated/{kind}/", rank, size, timeout, kind),
                    _inner(store, f"planned/{kind}/", rank, size, timeout, kind))
             for kind in kinds}
    seconds = options.timeout if options.timeout is not None else timeout.total_seconds()
    return TopoplanProcessGroup(rank, size, cluster=cluster, options=options, inner=inner,
                                timeout=float(seconds),
                                name=str(getattr(common, "group_id", "") or "group"))


def _options(given: Any) -> TopoplanOptions:
    if isinstance(given, TopoplanOptions):
        return given
    if given is not None:
        raise TopoplanError(f"the topoplan backend takes pg_options=TopoplanOptions(...), "
                            f"got {type(given).__name__}")
    if dist.is_initialized():   # a sub-group: the world's options
        world = dist.distributed_c10d._get_default_group()
        if isinstance(world, TopoplanProcessGroup):
            return world.options
    return TopoplanOptions()


def register_backend() -> None:
    """Register the ``topoplan`` backend with torch.distributed (``import topoplan.torch``
    does; calling it again does nothing)."""
    if NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
