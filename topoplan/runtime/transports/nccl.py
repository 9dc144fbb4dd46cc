"""``NCCL``: point-to-point over NCCL through CuPy (``cupy.cuda.nccl``).

Each step is one NCCL group (``groupStart``; ``send``/``recv`` per message;
``groupEnd``) enqueued on the transport's CUDA stream, followed by an event the
host polls against the step's deadline while checking the communicator for
asynchronous errors (``ncclCommGetAsyncError``). On a timeout or error the
communicator is aborted (``ncclCommAbort``), since NCCL cannot cancel a
posted transfer. The executor runs the whole call inside
:meth:`NCCL.compute_context`: snapshots and reductions go on the transport's
stream (as CuPy's and, for CUDA tensors, torch's current stream), so the next
step's sends are ordered after them without a host synchronization, and the
stream is joined to both libraries' caller streams on entry and exit (see
``_OnStream`` for why).

Channels (IR v4): NCCL pairs point-to-point calls by the order they are posted, not by
tag, and every step goes on the one transport stream, so the executor runs a
channelled schedule's channels one after another (every rank: channel 0's whole program,
then channel 1's), which pairs every message within its channel. They do not overlap
here; that would take a communicator and a stream per channel.

Buffers are CuPy arrays or CUDA torch tensors; bytes move as ``ncclUint8``, so
every dtype (bfloat16 included) works. CUDA only.

Native steps run NCCL's collectives on an ``NcclCommunicator`` per group, made once:
the group's first rank makes its unique id and sends it to the other members over the
transport's own communicator (NCCL point-to-point, so a transport built from a bare
communicator needs no MPI), then every member joins (``ncclCommInitRank``); the whole
world in rank order is the transport's own communicator. They go on the transport's
stream, in order with the point-to-point steps, followed by the event the host polls
against the step's deadline. ``ncclAllReduce``; ``ncclReduceScatter`` and
``ncclAllGather`` in place (``recvbuff == sendbuff + rank * recvcount``), or, when the
parts differ in size (which NCCL's equal counts cannot carry), one ``ncclReduce`` or
``ncclBroadcast`` per part to or from its member, fused in one NCCL group;
``ncclBroadcast``; ``ncclReduce`` (in place at the root; NCCL leaves the others'
buffers alone).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Sequence

from ...errors import TopoplanError
from .base import Collective, Deadline, Group, Message, NativeWork, PeerFailure, Transport

__all__ = ["NCCL", "share_gpu"]

#: Seconds between polls of a step's completion event.
POLL_INTERVAL = 20e-6
#: Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
NCCL_ID_BYTES = 128
#: Seconds a member waits for its group's NCCL id from the group's first rank.
SETUP_TIMEOUT = 300.0


def _cupy() -> tuple[Any, Any]:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError:
        raise ImportError("topoplan.runtime.transports.nccl needs CuPy with NCCL: "
                          "pip install 'topoplan[gpu]'") from None
    if not getattr(nccl, "available", True):
        raise ImportError("CuPy was built without NCCL; install a cupy-cuda12x wheel with NCCL")
    return cupy, nccl


def _torch_cuda() -> Any:
    """``torch`` when this process imported it and it has initialized CUDA, else None.

    Never imports torch: a CuPy-only program must not pay for it, and a torch
    that never touched CUDA has queued no GPU work the transport must order
    against (its CUDA tensors would have initialized it).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken torch must not break a CuPy call
        return None


def share_gpu(rank: int, *, loopback: bool = True) -> None:
    """Let this process's NCCL rank share a GPU with other ranks of its host.

    NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"): it
    tells hosts apart by a hash of ``NCCL_HOSTID`` when that is set. Giving each
    rank its own host id makes NCCL treat every rank as a host of its own, so it
    moves all messages over its network transport (sockets; InfiniBand is
    switched off), as between machines. Call it before the rank's communicator
    is made; variables the user set are kept.

    Parameters
    ----------
    rank : int
        The rank's number in its communicator.
    loopback : bool
        Every rank is on this host: NCCL's sockets use the loopback interface
        (``NCCL_SOCKET_IFNAME=lo``), as no other interface may join them.
    """
    import os
    import socket
    os.environ.setdefault("NCCL_HOSTID", f"{socket.gethostname()}-topoplan-rank{rank}")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    if loopback:
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


class _OnStream:
    """Run a whole allreduce on the transport's stream, ordered after the caller's
    streams and before them.

    Why: the executor's snapshot copies and reductions are launched by CuPy or
    torch on *their* current stream, while NCCL's sends and receives go on the
    transport's own non-blocking stream, which does not wait for either. The
    host polls each step's event before it launches the step's reductions, so a
    reduction never reads a receive buffer early; but nothing ordered a send
    after the kernels that wrote its chunk: the caller's last kernel on the
    buffer, this step's snapshot copy, or the previous step's ``add_``, all
    possibly still queued on torch's stream. So, for the duration of the call:

    - on entry the transport stream waits for the work already queued on CuPy's
      current stream and, when torch has initialized CUDA, on torch's current
      stream of the device (the kernels that produced the buffer);
    - both libraries' current stream *is* the transport stream, so every copy,
      reduction and NCCL group of every step is one in-order stream: step k's
      sends come after step k-1's reductions, and a reduction after its
      receives, with no host synchronization;
    - on exit both callers' streams are restored and made to wait for the
      transport stream, so whatever the caller queues next (on either library)
      sees the reduced buffer.

    None of it blocks the host; the step deadline still comes from the event
    :meth:`NCCL.wait` polls.
    """

    def __init__(self, transport: NCCL) -> None:
        self.t = transport
        self.device: Any = None        # the cupy.cuda.Device context while inside
        self.caller: Any = None        # CuPy's current stream on entry
        self.torch: Any = None         # torch, when its streams were joined
        self.torch_caller: Any = None  # torch's current stream of the device on entry

    def __enter__(self) -> Any:
        t = self.t
        cupy, stream = t._cupy, t.stream
        # The transport's device, so "current stream" means that device's stream.
        self.device = cupy.cuda.Device(t.device)
        self.device.__enter__()
        self.caller = cupy.cuda.get_current_stream()
        if self.caller.ptr != stream.ptr:
            stream.wait_event(self.caller.record())
        torch = _torch_cuda()
        if torch is not None:
            ours = t._torch_stream(torch)
            self.torch_caller = torch.cuda.current_stream(ours.device)
            if self.torch_caller.cuda_stream != stream.ptr:
                ours.wait_stream(self.torch_caller)
            torch.cuda.set_stream(ours)
            self.torch = torch
        stream.use()
        return stream

    def __exit__(self, *exc: Any) -> None:
        stream = self.t.stream
        try:
            if self.torch is not None:
                self.torch.cuda.set_stream(self.torch_caller)
                if self.torch_caller.cuda_stream != stream.ptr:
                    self.torch_caller.wait_stream(self.t._torch_stream(self.torch))
                self.torch = self.torch_caller = None
            if self.caller is not None:
                self.caller.use()
                if self.caller.ptr != stream.ptr:
                    self.caller.wait_event(stream.record())
                self.caller = None
        finally:
            if self.device is not None:
                self.device.__exit__(*exc)
                self.device = None


class _NCCLNative(NativeWork):
    """A native step over a group's communicator: enqueued on the transport's stream,
    then an event the host polls."""

    def __init__(self, transport: NCCL, op: Collective, comm: Any) -> None:
        self.t, self.op, self.comm = transport, op, comm
        nccl, stream = transport._nccl, transport.stream.ptr
        ptr, nbytes = transport.prepare(op.view)
        item = nbytes // op.size
        g, i = len(op.group), op.index
        kind = op.kind
        self.event: Any = None
        self.grouped = False
        self.launch: Callable[[], None]
        if kind in ("allreduce", "reduce_scatter", "reduce"):
            dtype = transport._dtype(op.view.dtype)
        if kind == "allreduce":
            self.call = "ncclAllReduce"
            self.launch = lambda: comm.allReduce(ptr, ptr, op.size, dtype, nccl.NCCL_SUM, stream)
        elif kind == "reduce_scatter" and op.equal:
            self.call = "ncclReduceScatter"
            part = op.size // g
            mine = ptr + i * part * item  # in place
            self.launch = lambda: comm.reduceScatter(ptr, mine, part, dtype, nccl.NCCL_SUM,
                                                     stream)
        elif kind == "reduce_scatter":
            self.call = "ncclReduce per part (grouped)"
            self.grouped = True
            parts = [(j, *op.part(j)) for j in range(g) if op.part(j)[1] > op.part(j)[0]]

            def reduces() -> None:
                for j, a, b in parts:
                    at = ptr + a * item
                    comm.reduce(at, at, b - a, dtype, nccl.NCCL_SUM, j, stream)
            self.launch = reduces
        elif kind == "allgather" and op.equal:
            self.call = "ncclAllGather"
            part = nbytes // g
            mine = ptr + i * part  # in place
            self.launch = lambda: comm.allGather(mine, ptr, part, nccl.NCCL_UINT8, stream)
        elif kind == "allgather":
            self.call = "ncclBroadcast per part (grouped)"
            self.grouped = True
            parts = [(j, *op.part(j)) for j in range(g) if op.part(j)[1] > op.part(j)[0]]

            def broadcasts() -> None:
                for j, a, b in parts:
                    at = ptr + a * item
                    comm.broadcast(at, at, (b - a) * item, nccl.NCCL_UINT8, j, stream)
            self.launch = broadcasts
        elif kind == "broadcast":
            self.call = "ncclBroadcast"
            self.launch = lambda: comm.broadcast(ptr, ptr, nbytes, nccl.NCCL_UINT8, op.root,
                                                 stream)
        elif kind == "reduce":
            self.call = "ncclReduce"
            self.launch = lambda: comm.reduce(ptr, ptr, op.size, dtype, nccl.NCCL_SUM, op.root,
                                              stream)
        else:  # pragma: no cover - NativeKind has no other value
            raise TopoplanError(f"unknown native collective {kind!r}")

    def start(self) -> None:
        t, nccl = self.t, self.t._nccl
        if t._aborted:
            raise PeerFailure(0, "the NCCL communicators were aborted after a failure; build a "
                                 "new transport")
        try:
            if self.grouped:
                nccl.groupStart()
                try:
                    self.launch()
                finally:
                    nccl.groupEnd()
            else:
                self.launch()
        except nccl.NcclError as exc:
            raise PeerFailure(0, f"NCCL: {exc}") from None
        self.event = t._cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
        self.event.record(t.stream)

    def test(self) -> bool:
        return bool(self.event.done)

    def wait(self, timeout: float) -> bool:
        if self.event.done:
            return True
        deadline = Deadline(timeout)
        nccl = self.t._nccl
        while not self.event.done:
            try:
                self.comm.check_async_error()
                self.t.comm.check_async_error()
            except nccl.NcclError as exc:
                raise PeerFailure(0, f"NCCL: {exc}") from None
            if deadline.passed():
                return False
            time.sleep(POLL_INTERVAL)
        return True

    def abort(self) -> None:
        # A posted collective cannot be cancelled: abort its communicator (and the
        # transport's, as a failed point-to-point step does) to free the stream.
        if self.comm is not self.t.comm:
            try:
                self.comm.abort()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass
        self.t.abort(None)


class NCCL(Transport):
    """Point-to-point messages over a CuPy ``NcclCommunicator`` (one GPU per rank).

    Parameters
    ----------
    comm : cupy.cuda.nccl.NcclCommunicator
        Built with ``NcclCommunicator(nranks, unique_id, rank)``; see
        :meth:`from_mpi` for the usual way.
    stream : cupy.cuda.Stream, optional
        Where transfers and reductions run; a new non-blocking stream by default.
    """

    name = "nccl"
    native_name = "ncclAllReduce"
    native_names = {"allreduce": "ncclAllReduce", "reduce_scatter": "ncclReduceScatter",
                    "allgather": "ncclAllGather"}
    tagged = False   # NCCL pairs point-to-point calls by the order they are posted

    def __init__(self, comm: Any, *, stream: Any = None) -> None:
        cupy, nccl = _cupy()
        self._cupy, self._nccl = cupy, nccl
        self.comm = comm
        self.rank, self.size = comm.rank_id(), comm.size()
        self.device = comm.device_id()
        with cupy.cuda.Device(self.device):
            self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        self._aborted = False
        self._torch_ext: Any = None  # torch's handle on self.stream, made on first use

    def _torch_stream(self, torch: Any) -> Any:
        """The transport stream as a ``torch.cuda.ExternalStream`` (cached)."""
        if self._torch_ext is None:
            self._torch_ext = torch.cuda.ExternalStream(
                self.stream.ptr, device=torch.device("cuda", self.device))
        return self._torch_ext

    @classmethod
    def from_mpi(cls, mpi_comm: Any = None, *, device: int | None = None,
                 share_gpus: bool = False) -> NCCL:
        """Build the communicator with MPI: rank 0 makes the unique id and broadcasts it.

        Parameters
        ----------
        mpi_comm : mpi4py.MPI.Comm, optional
            Defaults to ``COMM_WORLD``.
        device : int, optional
            The GPU of this rank; by default the node-local rank modulo the GPU count.
        share_gpus : bool
            Let several ranks of a host use one GPU (:func:`share_gpu`): NCCL then
            moves every message over its socket transport. For testing on a machine
            with fewer GPUs than ranks; without it such a job is refused here, before
            NCCL fails with "Duplicate GPU detected".

        Raises
        ------
        TopoplanError
            More ranks on this host than GPUs, without ``share_gpus``.
        """
        cupy, nccl = _cupy()
        from .mpi import _mpi
        mpi = _mpi()
        comm = mpi.COMM_WORLD if mpi_comm is None else mpi_comm
        local = comm.Split_type(mpi.COMM_TYPE_SHARED)
        local_rank, local_size = local.Get_rank(), local.Get_size()
        local.Free()
        gpus = cupy.cuda.runtime.getDeviceCount()
        if share_gpus:
            share_gpu(comm.Get_rank(), loopback=local_size == comm.Get_size())
        elif device is None and local_size > gpus:
            raise TopoplanError(
                f"rank {comm.Get_rank()}: {local_size} ranks on this host but {gpus} GPU"
                f"{'s' if gpus != 1 else ''}; NCCL needs one GPU per rank (or, for testing, "
                f"share them: --share-gpus, NCCL.from_mpi(share_gpus=True))")
        if device is None:
            device = local_rank % gpus
        cupy.cuda.Device(device).use()
        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = comm.bcast(uid, root=0)
        return cls(nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank()))

    # -- the hot path -----------------------------------------------------------------
    def prepare(self, view: Any) -> tuple[int, int]:
        module = type(view).__module__.split(".")[0]
        if module == "cupy":
            if view.device.id != self.device:
                raise TopoplanError(f"rank {self.rank}: buffer is on GPU {view.device.id} but "
                                    f"the NCCL communicator uses GPU {self.device}")
            return view.data.ptr, view.nbytes
        if module == "torch" and view.is_cuda:
            if view.device.index != self.device:
                raise TopoplanError(f"rank {self.rank}: tensor is on cuda:{view.device.index} but "
                                    f"the NCCL communicator uses GPU {self.device}")
            return view.data_ptr(), view.numel() * view.element_size()
        raise TopoplanError(f"the NCCL transport moves CUDA buffers (cupy arrays or CUDA "
                            f"tensors), got {type(view).__module__}.{type(view).__name__}")

    def start(self, messages: Sequence[Message]) -> Any:
        if self._aborted:
            raise TopoplanError(f"rank {self.rank}: the NCCL communicator was aborted after a "
                                f"failure; build a new one")
        nccl, stream = self._nccl, self.stream.ptr
        nccl.groupStart()
        try:
            for m in messages:
                ptr, nbytes = m.wire
                if m.send:
                    self.comm.send(ptr, nbytes, nccl.NCCL_UINT8, m.peer, stream)
                else:
                    self.comm.recv(ptr, nbytes, nccl.NCCL_UINT8, m.peer, stream)
        finally:
            nccl.groupEnd()
        event = self._cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(self.stream)
        return (event, len(messages))

    def wait(self, handle: Any, timeout: float) -> list[int]:
        event, count = handle
        if event.done:
            return []
        deadline = Deadline(timeout)
        while not event.done:
            try:
                self.comm.check_async_error()
            except self._nccl.NcclError as exc:
                # NCCL does not say which transfer failed: blame the first.
                raise PeerFailure(0, f"NCCL: {exc}") from None
            if deadline.passed():
                return list(range(count))  # NCCL cannot tell which ones are still running
            time.sleep(POLL_INTERVAL)
        return []

    def test(self, handle: Any) -> bool:
        # A failed transfer never completes its event: the executor's step deadline
        # then calls wait(), which reports NCCL's asynchronous error.
        return bool(handle[0].done)

    def abort(self, handle: Any) -> None:
        # A posted NCCL transfer cannot be cancelled; aborting the communicator
        # frees the stream and makes the failure final for this communicator.
        if not self._aborted:
            self._aborted = True
            try:
                self.comm.abort()
            except Exception:  # noqa: BLE001 - best effort after a failure
                pass

    def compute_context(self) -> Any:
        return _OnStream(self)

    # -- native steps --------------------------------------------------------------
    def _world_group(self) -> Any:
        return self.comm

    def _new_group(self, group: Group) -> Any:
        if self.rank not in group:
            return None
        cupy, nccl = self._cupy, self._nccl
        first, stream = group[0], self.stream
        with cupy.cuda.Device(self.device):
            if self.rank == first:
                uid = nccl.get_unique_id()
                buf = cupy.array(uid, dtype=cupy.int8)
                nccl.groupStart()
                try:
                    for member in group[1:]:
                        self.comm.send(buf.data.ptr, len(uid), nccl.NCCL_INT8, member, stream.ptr)
                finally:
                    nccl.groupEnd()
                self._settle(f"sending group {list(group)}'s NCCL id")
            else:
                buf = cupy.empty(NCCL_ID_BYTES, dtype=cupy.int8)
                self.comm.recv(buf.data.ptr, NCCL_ID_BYTES, nccl.NCCL_INT8, first, stream.ptr)
                self._settle(f"receiving group {list(group)}'s NCCL id from rank {first}")
                uid = tuple(int(v) for v in buf.get())
            return nccl.NcclCommunicator(len(group), uid, group.index(self.rank))

    def _settle(self, what: str) -> None:
        """Wait for the stream's work so far, polling NCCL's errors, at most SETUP_TIMEOUT."""
        event = self._cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)
        event.record(self.stream)
        deadline = Deadline(SETUP_TIMEOUT)
        while not event.done:
            try:
                self.comm.check_async_error()
            except self._nccl.NcclError as exc:
                raise TopoplanError(f"rank {self.rank}: {what}: NCCL: {exc}") from None
            if deadline.passed():
                raise TopoplanError(f"rank {self.rank}: {what}: no answer in {SETUP_TIMEOUT:g} s")
            time.sleep(POLL_INTERVAL)

    def native(self, op: Collective) -> NativeWork:
        return _NCCLNative(self, op, self.group_of(op.group))

    # -- collectives -----------------------------------------------------------------
    def _dtype(self, dtype: Any) -> int:
        nccl = self._nccl
        table = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
                 "float64": nccl.NCCL_FLOAT64, "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
        bf16 = getattr(nccl, "NCCL_BFLOAT16", None)
        if bf16 is not None:
            table["bfloat16"] = bf16
        name = str(dtype).removeprefix("torch.")
        if name not in table:
            raise TopoplanError(f"ncclAllReduce has no {name} type here")
        return table[name]

    def native_allreduce(self, buffer: Any) -> None:
        flat = buffer.reshape(-1)
        ptr, _ = self.prepare(flat)
        count = flat.numel() if hasattr(flat, "numel") else flat.size
        # Ordered after the kernels that produced the buffer, like the replay.
        with self.compute_context():
            self.comm.allReduce(ptr, ptr, count, self._dtype(flat.dtype), self._nccl.NCCL_SUM,
                                self.stream.ptr)
        self.stream.synchronize()

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        """``ncclReduceScatter`` (sum) from ``input`` into ``output``."""
        src, dst = input.reshape(-1), output.reshape(-1)
        (sptr, _), (dptr, _) = self.prepare(src), self.prepare(dst)
        count = dst.numel() if hasattr(dst, "numel") else dst.size
        with self.compute_context():
            self.comm.reduceScatter(sptr, dptr, count, self._dtype(dst.dtype),
                                    self._nccl.NCCL_SUM, self.stream.ptr)
        self.stream.synchronize()

    def native_allgather(self, input: Any, output: Any) -> None:
        """``ncclAllGather`` of ``input`` into ``output`` (moved as bytes: any dtype)."""
        src, dst = input.reshape(-1), output.reshape(-1)
        (sptr, nbytes), (dptr, _) = self.prepare(src), self.prepare(dst)
        with self.compute_context():
            self.comm.allGather(sptr, dptr, nbytes, self._nccl.NCCL_UINT8, self.stream.ptr)
        self.stream.synchronize()

    def allreduce_max(self, value: float) -> float:
        cupy = self._cupy
        with cupy.cuda.Device(self.device):
            x = cupy.array([float(value)], dtype=cupy.float64)
            self.comm.allReduce(x.data.ptr, x.data.ptr, 1, self._nccl.NCCL_FLOAT64,
                                self._nccl.NCCL_MAX, self.stream.ptr)
            self.stream.synchronize()
            return float(x.get()[0])

    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        cupy = self._cupy
        with cupy.cuda.Device(self.device):
            x = cupy.array([float(v) for v in values], dtype=cupy.float64)
            self.comm.allReduce(x.data.ptr, x.data.ptr, len(values), self._nccl.NCCL_FLOAT64,
                                self._nccl.NCCL_MAX, self.stream.ptr)
            self.stream.synchronize()
            return [float(v) for v in x.get()]

    def barrier(self) -> None:
        self.allreduce_max(0.0)
