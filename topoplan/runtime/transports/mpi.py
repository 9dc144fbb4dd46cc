"""``MPI``: point-to-point over mpi4py (persistent sends/receives on byte views, polled
with a deadline).

Every buffer view is sent as raw bytes, so any dtype works (bfloat16 included)
and no MPI datatype lookup happens per message. Each step of a bound buffer gets
persistent requests (``Send_init``/``Recv_init``) once; a step then only calls
``Startall``, plus ``Isend`` for sends small enough for Open MPI's inline path.
MPI has no wait-with-timeout, so waits poll ``Request.Test``: a few polls in a
row, then giving the CPU away between polls with ``sched_yield`` (on an
oversubscribed box that is what lets the awaited peer run at all).

Launch with ``topoplan bench`` or :func:`topoplan.runtime.mpirun.mpiexec`, which pick the
launcher of mpi4py's MPI and give it what it needs to run as root and oversubscribed.
To have survivors of a crashed rank report a :class:`~topoplan.TransportError` rather
than be killed by ``mpiexec``, launch with Open MPI 5's ``mpiexec --with-ft ulfm`` (the
helper's ``fault_tolerant=True``; other launchers end the whole job) and end survivors
with :func:`leave_after_failure`.

Native steps run MPI's non-blocking collectives on a sub-communicator per group, made
once with ``Comm.Split`` over the transport's communicator (every rank calls it, in the
same order; non-members pass ``MPI_UNDEFINED``); the whole world in rank order is the
transport's own communicator. ``MPI_Iallreduce``, ``MPI_Ireduce_scatter_block`` (or
``MPI_Ireduce_scatter`` with per-member counts, when parts differ in elements),
``MPI_Iallgather`` (``MPI_Iallgatherv``), ``MPI_Ibcast`` and ``MPI_Ireduce``, polled
with ``Test`` against the step's deadline like messages. A collective cannot be
cancelled, so one that failed or timed out leaves its sub-communicator broken: later
native steps over it fail at once.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Callable, NoReturn, Sequence

from ...errors import TopoplanError, TransportError
from .base import Collective, Group, Message, NativeWork, NoNative, PeerFailure, Transport

__all__ = ["MPI", "byte_view", "leave_after_failure", "LEAVE_GRACE"]

#: Seconds a survivor asks MPI which ranks failed, after a failure, while the news of it
#: reaches this process.
FAILED_WAIT = 2.0
#: Seconds a survivor waits before it leaves (:func:`leave_after_failure`): enough for the
#: others, whose calls fail at once on the revoked communicator, to say what they saw
#: before ``mpiexec`` ends the job.
LEAVE_GRACE = 3.0


def _mpi() -> Any:
    try:
        from mpi4py import MPI as mpi
    except ImportError:
        raise ImportError("topoplan.runtime.transports.mpi needs mpi4py and an MPI library: "
                          "pip install 'topoplan[mpi]'") from None
    return mpi


def byte_view(view: Any) -> Any:
    """A zero-copy uint8 view of a 1-D contiguous numpy/torch/cupy view."""
    module = type(view).__module__.split(".")[0]
    if module == "torch":
        import torch
        if view.device.type != "cpu":
            # CUDA-aware MPI reads device memory through __cuda_array_interface__/DLPack.
            return view.view(torch.uint8)
        return view.view(torch.uint8).numpy()
    if module in ("numpy", "cupy"):
        return view.view("u1")
    raise TopoplanError(f"the MPI transport moves numpy, torch or cupy buffers, got "
                        f"{type(view).__name__}")


class _Batch:
    """One step's messages and their MPI requests (see :meth:`MPI.batch`).

    ``requests`` is in message order; ``persistent`` holds the persistent ones
    (started with ``Startall``) and ``fresh`` the small sends posted anew with
    ``Isend`` each step, as ``(index, wire, peer, tag)``.
    """

    __slots__ = ("__weakref__", "fresh", "messages", "persistent", "requests")

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages
        self.requests: list[Any] = [None] * len(messages)
        self.persistent: list[Any] = []
        self.fresh: list[tuple[int, Any, int, int]] = []


def _free_requests(mpi: Any, requests: list[Any]) -> None:
    """Free persistent requests (an active one is freed once it completes)."""
    if mpi.Is_finalized():
        return
    for r in requests:
        try:
            if r:  # not MPI_REQUEST_NULL
                r.Free()
        except Exception:  # noqa: BLE001 - best effort; a dead peer's request may refuse
            pass


def _typed(view: Any) -> Any:
    """``view`` as mpi4py sums it: a numpy (or device) array with its dtype."""
    if type(view).__module__.split(".")[0] == "torch" and view.device.type == "cpu":
        return view.numpy()
    return view


def _is_bfloat16(view: Any) -> bool:
    return str(getattr(view, "dtype", "")).removeprefix("torch.") == "bfloat16"


class _MPINative(NativeWork):
    """A native step over a sub-communicator: one non-blocking collective per call."""

    def __init__(self, transport: MPI, op: Collective, comm: Any) -> None:
        mpi = transport._mpi
        self.t, self.op, self.comm, self.mpi = transport, op, comm, mpi
        self.request: Any = None
        self.post: Callable[[], Any]   # the non-blocking collective: a request
        self.block: Callable[[], Any]  # the blocking one, for run()
        self.copy_in: list[tuple[Any, Any]] = []   # (dst, src) before posting
        self.copy_out: list[tuple[Any, Any]] = []  # (dst, src) after it is done
        kind, g, i = op.kind, len(op.group), op.index
        counts = list(op.counts)
        view = op.view
        typed: Any = None  # what MPI sums: the view with its dtype
        if kind in ("allreduce", "reduce_scatter", "reduce"):
            if _is_bfloat16(view):
                # MPI has no bfloat16 type: add in a float32 copy, round once at the end.
                wide = _torch_float32(view)
                self.copy_in.append((wide, view))
                self.copy_out.append((view, wide))
                typed = _typed(wide)
            else:
                typed = _typed(view)
        if kind == "allreduce":
            self._use("Allreduce", mpi.IN_PLACE, typed, op=mpi.SUM)
        elif kind == "reduce_scatter":
            # In place, MPI would leave the member's sum at the start of its buffer: the
            # sum lands in scratch and is copied to the member's part.
            a, b = op.part(i)
            out = _typed(op.empty(b - a)) if not self.copy_in else typed[a:b].copy()
            self.copy_out.insert(0, (typed[a:b], out))
            if op.equal:
                self._use("Reduce_scatter_block", typed, out, op=mpi.SUM)
            else:
                self._use("Reduce_scatter", typed, out, recvcounts=counts, op=mpi.SUM)
        elif kind == "allgather":
            raw = byte_view(view)
            size = raw.shape[0] // op.size if op.size else 0
            if op.equal:
                self._use("Allgather", mpi.IN_PLACE, [raw, mpi.BYTE])
            else:
                spec = ([c * size for c in counts], [op.part(j)[0] * size for j in range(g)])
                self._use("Allgatherv", mpi.IN_PLACE, [raw, spec, mpi.BYTE])
        elif kind == "broadcast":
            raw = byte_view(view)
            self._use("Bcast", [raw, mpi.BYTE], root=op.root)
        elif kind == "reduce":
            if i == op.root:
                self._use("Reduce", mpi.IN_PLACE, typed, op=mpi.SUM, root=op.root)
            else:
                self.copy_out.clear()  # the others keep their values
                self._use("Reduce", typed, None, op=mpi.SUM, root=op.root)
        else:  # pragma: no cover - NativeKind has no other value
            raise TopoplanError(f"unknown native collective {kind!r}")

    def _use(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Run mpi4py's ``comm.<name>`` (blocking) or ``comm.I<name>`` (non-blocking)."""
        nonblocking = "I" + name[0].lower() + name[1:]
        self.call = self.nonblocking_call = f"MPI_{nonblocking}"
        self.blocking_call = f"MPI_{name}"
        post, block = getattr(self.comm, nonblocking), getattr(self.comm, name)
        self.post = lambda: post(*args, **kwargs)
        self.block = lambda: block(*args, **kwargs)

    def run(self, timeout: float) -> bool:
        if not self.t.blocking_natives:
            return super().run(timeout)
        # MPI's blocking collective: the same algorithm and cost as calling it directly,
        # but no deadline (see MPI's blocking_natives).
        if self.op.group in self.t._broken:
            raise PeerFailure(0, f"its sub-communicator is broken: {self.t._broken[self.op.group]}")
        for dst, src in self.copy_in:
            _copy(dst, src)
        self.call = self.blocking_call
        try:
            self.block()
        except self.mpi.Exception as exc:
            raise PeerFailure(0, self.t._describe(exc, self.comm)) from None
        return True

    def start(self) -> None:
        self.call = self.nonblocking_call
        if self.op.group in self.t._broken:
            raise PeerFailure(0, f"its sub-communicator is broken: {self.t._broken[self.op.group]}")
        for dst, src in self.copy_in:
            _copy(dst, src)
        try:
            self.request = self.post()
        except self.mpi.Exception as exc:
            raise PeerFailure(0, self.t._describe(exc, self.comm)) from None

    def test(self) -> bool:
        try:
            return bool(self.request.Test())
        except self.mpi.Exception as exc:
            raise PeerFailure(0, self.t._describe(exc, self.comm)) from None

    def wait(self, timeout: float) -> bool:
        request, pause, spin = self.request, self.t._pause, self.t.spin
        deadline = time.monotonic() + timeout
        polls = 0
        try:
            while not request.Test():
                polls += 1
                if time.monotonic() >= deadline:
                    return False
                if polls > spin:
                    pause()
            return True
        except self.mpi.Exception as exc:
            raise PeerFailure(0, self.t._describe(exc, self.comm)) from None

    def finish(self) -> None:
        for dst, src in self.copy_out:
            _copy(dst, src)

    def abort(self) -> None:
        # MPI cannot cancel a collective: a late completion may still write the buffer,
        # and the members are out of step on this communicator for good.
        self.t._broken.setdefault(self.op.group, f"{self.call} failed or timed out")


def _torch_float32(view: Any) -> Any:
    import torch
    return torch.empty(view.shape[0], dtype=torch.float32, device=view.device)


def _copy(dst: Any, src: Any) -> None:
    if hasattr(dst, "copy_"):
        dst.copy_(src)
    else:
        dst[...] = src


class MPI(Transport):
    """Point-to-point messages over an MPI communicator.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm, optional
        Defaults to ``COMM_WORLD``. It is duplicated (``dup=True``) so the
        executor's messages never match the application's own.
    dup : bool
    poll_yield : bool
        Give the CPU away between polls (``sched_yield``) once ``spin`` polls
        found nothing; keep it on when ranks outnumber cores.
    spin : int
        Polls of a wait before it starts yielding the CPU.
    inline_max : int
        Sends of at most this many bytes are posted with ``Isend`` every step
        rather than through a persistent request, because only ``MPI_Isend`` takes
        Open MPI's inline shared-memory path (``btl_sm_max_inline_send``, 256 bytes
        by default); a persistent send takes the full request path.
    blocking_natives : bool
        Run the native steps of a call that runs to the end (``allreduce(buffer)``,
        not ``start``) with MPI's blocking collectives (``MPI_Allreduce``, ...): then
        a schedule whose only step is a native allreduce costs what ``MPI_Allreduce``
        costs. By default they run the non-blocking ones, polled against the step's
        deadline like messages; Open MPI's non-blocking collectives (libnbc) took up
        to twice as long as its blocking ones between 256 KiB and 4 MiB here
        (scripts/bench_native_step.py). The price: a blocking step has no deadline. A
        member that died ends it with an error under ULFM (``mpiexec --with-ft
        ulfm``); one that hangs, or runs another schedule, hangs it.

    Notes
    -----
    MPI has no wait with a timeout, so a step's requests are polled with
    ``MPI_Test``, spinning a little and then yielding the CPU between polls.
    Blocking in ``MPI_Waitall`` and revoking the communicator from a watchdog
    thread at the deadline (ULFM) was tried and dropped: with a
    dead rank in the communicator, the rank that revoked never came back from
    its ``Waitall`` (Open MPI 5.0.11), so it could not report.
    """

    name = "mpi"
    native_name = "MPI_Allreduce"
    native_names = {"allreduce": "MPI_Allreduce", "reduce_scatter": "MPI_Reduce_scatter_block",
                    "allgather": "MPI_Allgather"}

    def __init__(self, comm: Any = None, *, dup: bool = True, poll_yield: bool = True,
                 spin: int = 64, inline_max: int = 256, blocking_natives: bool = False) -> None:
        if spin < 0:
            raise TopoplanError(f"spin must be >= 0 polls, got {spin!r}")
        mpi = _mpi()
        self.spin = int(spin)
        self.inline_max = int(inline_max)
        self.blocking_natives = bool(blocking_natives)
        self._mpi = mpi
        comm = mpi.COMM_WORLD if comm is None else comm
        self.comm = comm.Dup() if dup else comm
        # Errors come back as exceptions, never as an abort of the whole job.
        self.comm.Set_errhandler(mpi.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self._startall = mpi.Prequest.Startall
        self._isend = self.comm.Isend
        # sched_yield, not time.sleep(0): sleep(0) is a timed sleep that the kernel's
        # default 50 us timer slack stretches to ~56 us per poll (measured here),
        # which made every small step cost ~60 us; sched_yield costs ~0.5 us and
        # still lets the awaited peer run when ranks outnumber cores. Open MPI's
        # own Waitall does the same with mpi_yield_when_idle.
        sched_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))
        self._pause = sched_yield if poll_yield else (lambda: None)
        self._broken: dict[Group, str] = {}  # groups whose collective failed: why

    def prepare(self, view: Any) -> Any:
        return byte_view(view)

    def batch(self, messages: Sequence[Message]) -> _Batch:
        batch = _Batch(messages)
        self._fill(batch)
        # mpi4py does not free a request it garbage-collects (measured: ~750 bytes
        # leak per request), and a loop that allreduces a fresh buffer every call
        # binds new steps every call, so free them when the executor drops the step.
        # Not at exit: MPI may be finalized by then, and the process is ending.
        weakref.finalize(batch, _free_requests, self._mpi, batch.persistent).atexit = False
        return batch

    def _fill(self, batch: _Batch) -> None:
        # Persistent requests: the views are fixed once bound, so the per-step
        # Isend/Irecv set-up (request objects, buffer parsing: ~3 us a pair here)
        # is paid once, and a step only calls Startall. Small sends are the
        # exception (see ``inline_max``): measured on 8 ranks, 2 cores, a 1 KiB
        # ring (128-byte messages) took ~43 us a step with persistent sends and
        # ~34 us with Isend, while from 512-byte messages up persistent sends
        # were ~25% faster than Isend.
        comm, inline_max = self.comm, self.inline_max
        for i, m in enumerate(batch.messages):
            if m.send and m.wire.nbytes <= inline_max:
                batch.fresh.append((i, m.wire, m.peer, m.tag))
                continue
            r = (comm.Send_init(m.wire, m.peer, m.tag) if m.send
                 else comm.Recv_init(m.wire, m.peer, m.tag))
            batch.requests[i] = r
            batch.persistent.append(r)

    def start(self, batch: _Batch) -> _Batch:
        # The executor lists receives before sends and only sends are fresh, so
        # a send finds its receive posted. Posting fresh sends after persistent
        # ones reorders sends only across different tags, which match by tag.
        if batch.persistent:
            self._startall(batch.persistent)
        if batch.fresh:
            isend, requests = self._isend, batch.requests
            for i, wire, peer, tag in batch.fresh:
                requests[i] = isend(wire, peer, tag)
        return batch

    def wait(self, handle: _Batch, timeout: float) -> list[int]:
        # One request at a time with Request.Test (~0.2 us a call, a third of
        # Testall on a list, which converts the list on every call): every Test
        # runs MPI's progress engine, so the other requests move too. The first
        # ``spin`` polls do not yield: the awaited message is often already on
        # its way (the peer runs on the other core), and giving the CPU away at
        # once costs a context switch or more before this rank runs again
        # (measured: 65 -> 52 us per 1 KiB ring step on 8 ranks, 2 cores). Under
        # ``mpi_yield_when_idle`` (set by topoplan's launcher and by Open MPI
        # itself when oversubscribed), an idle Test yields inside MPI anyway.
        requests = handle.requests
        pause, clock, spin = self._pause, time.monotonic, self.spin
        polls = 0
        deadline = 0.0
        try:
            for request in requests:
                while not request.Test():
                    polls += 1
                    if polls == 1:
                        # Started at the first failed poll, so a step that is
                        # already done costs no clock read.
                        deadline = clock() + timeout
                    elif clock() >= deadline:
                        return [i for i, r in enumerate(requests) if not r.Test()]
                    if polls > spin:
                        pause()
            return []
        except self._mpi.Exception as exc:
            raise PeerFailure(self._failed_index(requests), self._describe(exc)) from None

    def wait_any(self, tests: Sequence[Callable[[], bool]], timeout: float) -> bool:
        # One test a poll, in turn, as wait() polls one request at a time: every Test
        # of a running request runs MPI's progress engine (which moves every request)
        # and, under mpi_yield_when_idle, yields the CPU when idle; testing every
        # channel each round would pay that once per channel.
        pause, spin, count = self._pause, self.spin, len(tests)
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            try:
                if tests[polls % count]():
                    return True
            except PeerFailure:
                return True
            polls += 1
            if time.monotonic() >= deadline:
                return False
            if polls > spin:
                pause()

    def test(self, handle: _Batch) -> bool:
        # Test on a completed request (persistent: inactive; fresh: null) is true at
        # once, so this can be repeated; every Test also runs MPI's progress engine, so
        # testing stops at the first request still running: testing the others too
        # only costs (an idle Test yields the CPU under mpi_yield_when_idle).
        requests = handle.requests
        try:
            for request in requests:
                if not request.Test():
                    return False
            return True
        except self._mpi.Exception as exc:
            raise PeerFailure(self._failed_index(requests), self._describe(exc)) from None

    def _failed_index(self, requests: list[Any]) -> int:
        for i, r in enumerate(requests):
            try:
                r.Test()
            except self._mpi.Exception:
                return i
        return 0

    def _describe(self, exc: Any, comm: Any = None) -> str:
        """What ``exc`` says, and, after a process failure (ULFM), which ranks died.

        The first rank to learn of a death revokes the communicator (and ``comm``, a
        native step's sub-communicator), so every survivor's pending call fails at once
        with ``MPI_ERR_REVOKED`` instead of waiting out its deadline on a live peer that
        has stopped; each then asks MPI which ranks failed, for up to
        :data:`FAILED_WAIT` s while the news spreads."""
        try:
            code = exc.Get_error_class()
            text = f"{exc.Get_error_string().strip()} (MPI error class {code})"
        except Exception:  # noqa: BLE001 - describing an error must not raise another
            return str(exc)
        mpi = self._mpi
        if code not in (getattr(mpi, "ERR_PROC_FAILED", -1), getattr(mpi, "ERR_REVOKED", -1),
                        getattr(mpi, "ERR_PROC_FAILED_PENDING", -1)):
            return text
        self._revoke(comm)
        dead = self._dead()
        if not dead:
            return f"{text}; MPI cannot tell which rank failed"
        names = ", ".join(str(r) for r in dead)
        return f"rank{'s' if len(dead) > 1 else ''} {names} died ({text})"

    def _revoke(self, comm: Any = None) -> None:
        for c in (comm, self.comm):
            if c is None:
                continue
            try:
                if not c.Is_revoked():
                    c.Revoke()
            except Exception:  # noqa: BLE001 - no ULFM (MPICH, Open MPI 4): nothing to do
                pass

    def _dead(self) -> list[int]:
        """The ranks of the transport's communicator that MPI knows to have failed."""
        mpi, deadline = self._mpi, time.monotonic() + FAILED_WAIT
        while True:
            try:
                failed = self.comm.Get_failed()
                size = failed.Get_size()
                if size:
                    return sorted(mpi.Group.Translate_ranks(failed, list(range(size)),
                                                            self.comm.Get_group()))
            except Exception:  # noqa: BLE001 - no ULFM: MPI cannot tell
                return []
            if time.monotonic() >= deadline:
                return []
            # The news arrives as a runtime event that only MPI's progress engine takes
            # in: a probe drives it (without one, a rank that learned of the failure by
            # the revoke alone could ask for seconds and hear of no failed rank).
            mpi.COMM_SELF.Iprobe()
            time.sleep(0.01)

    def _agree(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, a collective over the whole communicator (the agreement on timings,
        the result check); an MPI failure in it becomes the located error every other
        failure is."""
        try:
            return call()
        except self._mpi.Exception as exc:
            raise TransportError(f"rank {self.rank}: mpi {what} failed: "
                                 f"{self._describe(exc)}", rank=self.rank) from None

    def abort(self, handle: _Batch) -> None:
        # Cancel what is still pending so a late message cannot land in a buffer
        # the caller reuses (sends cannot be cancelled portably; MPI-4 deprecates
        # it), then give the step fresh requests: a persistent request that is
        # still active cannot be started again, and the caller may retry.
        for r in handle.requests:
            try:
                if r is not None and not r.Test():
                    r.Cancel()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass
        _free_requests(self._mpi, list(handle.persistent))
        handle.persistent.clear()  # in place: the batch's finalizer holds this list
        handle.fresh.clear()
        handle.requests[:] = [None] * len(handle.messages)
        try:
            self._fill(handle)
        except Exception:  # noqa: BLE001 - best effort; the next start reports the failure
            pass

    def discard(self, peer: int, tag: int, timeout: float) -> bool:
        # Iprobe sees a message once its envelope is here; the receive then takes it
        # whole (a rendezvous send completes on the sender's side too). A peer that
        # dies mid-message leaves the receive cancelled, as abort() does.
        mpi = self._mpi
        try:
            status = mpi.Status()
            if not self.comm.Iprobe(peer, tag, status):
                return False
            sink = bytearray(max(1, status.Get_count(mpi.BYTE)))
            request = self.comm.Irecv(sink, peer, tag)
            deadline = time.monotonic() + timeout
            while not request.Test():
                if time.monotonic() >= deadline:
                    request.Cancel()
                    return False
                self._pause()
            return True
        except mpi.Exception:  # a dead peer: nothing to drop
            return False

    # -- native steps --------------------------------------------------------------
    def _world_group(self) -> Any:
        return self.comm

    def _new_group(self, group: Group) -> Any:
        mpi = self._mpi
        member = self.rank in group
        sub = self.comm.Split(0 if member else mpi.UNDEFINED,
                              group.index(self.rank) if member else 0)
        if sub == mpi.COMM_NULL:
            return None
        sub.Set_errhandler(mpi.ERRORS_RETURN)
        return sub

    def native(self, op: Collective) -> NativeWork:
        return _MPINative(self, op, self.group_of(op.group))

    def _summable(self, buffer: Any, what: str) -> Any:
        """``buffer`` flat, as MPI sums it (a torch CPU tensor as its numpy array).

        Raises NoNative for bfloat16, which MPI cannot add (on every rank alike)."""
        flat = buffer.reshape(-1) if hasattr(buffer, "reshape") else buffer
        if type(flat).__module__.startswith("torch"):
            if str(flat.dtype) == "torch.bfloat16":
                raise NoNative(f"{what} has no bfloat16 sum (MPI has no bfloat16 type)")
            flat = flat.numpy() if flat.device.type == "cpu" else flat
        return flat

    def native_allreduce(self, buffer: Any) -> None:
        mpi = self._mpi
        flat = self._summable(buffer, "MPI_Allreduce")
        self._agree("MPI_Allreduce", lambda: self.comm.Allreduce(mpi.IN_PLACE, flat, op=mpi.SUM))

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        """``MPI_Reduce_scatter_block`` (sum) from ``input`` into ``output``."""
        mpi = self._mpi
        what = "MPI_Reduce_scatter_block"
        src, dst = self._summable(input, what), self._summable(output, what)
        self._agree(what, lambda: self.comm.Reduce_scatter_block(src, dst, op=mpi.SUM))

    def native_allgather(self, input: Any, output: Any) -> None:
        """``MPI_Allgather`` of ``input`` into ``output`` (moved as bytes: any dtype)."""
        src, dst = byte_view(input.reshape(-1)), byte_view(output.reshape(-1))
        self._agree("MPI_Allgather", lambda: self.comm.Allgather(src, dst))

    def allreduce_max(self, value: float) -> float:
        return float(self._agree("allreduce of the slowest time", lambda: self.comm.allreduce(
            float(value), op=self._mpi.MAX)))

    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        import numpy as np
        array = np.array([float(v) for v in values], dtype=np.float64)
        self._agree("agreement (allreduce MAX)", lambda: self.comm.Allreduce(
            self._mpi.IN_PLACE, array, op=self._mpi.MAX))
        return [float(v) for v in array]

    def barrier(self) -> None:
        self._agree("barrier", self.comm.Barrier)

    @classmethod
    def world(cls, **kwargs: Any) -> MPI:
        """The transport over ``COMM_WORLD``."""
        return cls(None, **kwargs)


def leave_after_failure(code: int = 1, grace: float = 0.0) -> NoReturn:
    """End this MPI process after a :class:`~topoplan.TransportError`, without hanging.

    ``MPI_Finalize`` would wait for the dead peer forever, so this flushes the
    standard streams and calls ``os._exit``. It first waits ``grace`` seconds: the
    other survivors' own timeouts may end a little later (a rank waiting on a
    live but stuck peer times out after that peer does), and ``mpiexec`` tears
    the job down as soon as one rank leaves without finalizing. Pass the
    executor's timeout to let every survivor report.
    """
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe must not stop the exit
            pass
    if grace > 0:
        time.sleep(grace)
    os._exit(code)
