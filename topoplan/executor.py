"""Replay a schedule over a transport: ``topoplan.Allreduce(schedule, transport)(buffer)``,
``topoplan.ReduceScatter(schedule, transport)(input, output)`` and
``topoplan.AllGather(schedule, transport)(input, output)``.

A reduce-scatter runs its schedule on a private copy of the full input (the input is
left as it was) and copies the rank's shard out; an allgather runs in place on the
output, the rank's input copied into its shard first (docs/SCHEDULE.md, Collectives).

The executor compiles the calling rank's program once per (element count, dtype,
array kind) into flat step lists: element ranges of each chunk, messages with
their sequence tags, and slots of one reusable scratch arena for the data that
must not land in the user's buffer directly. Binding a buffer then only slices
views (cached per buffer address), and a call runs, per step: copy the few send
snapshots, post every receive and send at once, wait with a deadline, and add the
received partial sums in place. No copy of the user's buffer is made.

Semantics (docs/SCHEDULE.md): a send carries the chunk as it was when
its step started; a ``reduce`` receive adds into the chunk and a plain receive
overwrites it when the step ends. Reduce receives always land in scratch and
are added after the wait, so they never race a send of the same chunk; a plain
receive lands in the chunk itself unless the same step also sends that chunk,
and only then is the chunk copied to a send snapshot first.

Tags: every message of a call is tagged with its sequence number on its pair of ranks,
offset by the call's *epoch*. Calls take the epochs ``0 .. EPOCHS - 1`` in turn (every
rank makes the same calls, so they agree without talking), so a message that a call
which failed left in flight cannot match a receive of the next ``EPOCHS - 1`` calls:
the retry after a timeout, in particular. Before each call the executor drops, with
:meth:`Transport.discard`, the messages a failed call left behind that have arrived since:
a peer is never more than one call ahead of this rank (no allreduce, reduce-scatter or
allgather can finish without every rank's data), so a message still tagged with a failed call's epoch is
stale, never one of the calls still to come.

Calls in flight (:meth:`Allreduce.start`, :class:`AllreduceHandle`): a started call is
a small state machine (the step it is at, that step's posted messages, its deadline)
that moves whenever anything polls the transport: ``start``, ``handle.test()``,
``handle.wait()`` or :meth:`Allreduce.progress`, for every call in flight on the
transport, in start order. No thread is started; MPI's progress engine runs inside the
``Test`` calls that polling makes (a rank that never polls still makes progress in the
other ranks' calls only as far as MPI's own buffering carries its sends). Several calls
of one executor run side by side on tagged transports when their epochs (so their tags)
differ and they do not share a scratch arena. Calls of different executors run side by
side in tag *lanes*: the k-th call on a transport, of any executor, takes lane
``k % LANES`` and offsets its tags by ``lane * LANE_WIDTH`` (every rank makes the same
calls in the same order, which the calls need anyway, so ranks agree on lanes without
talking); a call waits for earlier ones of its lane, and an executor whose tags do not
fit a lane runs its calls alone. Every call on an untagged transport (NCCL) runs one
after another in start order, since its messages could be confused. On gloo (``Transport.pollable``
False: its point-to-point work completes only inside a wait) calls also run one at a
time, and move only in ``wait()``: a caller that needs them to move while it computes
waits on a thread of its own, as the DDP hook's progress thread does.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

from .collectives import collective_of
from .errors import TopoplanError, TransportError
from .schedule import OpKind, Schedule, chunk_text
from .transports.base import TAG_LIMIT, Message, PeerFailure, Transport

__all__ = ["Allreduce", "ReduceScatter", "AllGather", "AllreduceHandle", "array_ops"]

#: How many bound buffers an Allreduce keeps views for (a training loop alternates few).
BOUND_CACHE = 8
#: Calls take turns through this many tag epochs (see the module docstring). A failed
#: call's late messages are dropped by the start of the next EPOCHS - 1 calls, and the
#: transport keeps a set of per-step requests per epoch (MPI's persistent ones).
EPOCHS = 4
#: Calls of different executors on one tagged, pollable transport run side by side in
#: this many tag lanes: each call, of any executor, takes lane ``k % LANES`` for the k-th
#: call on the transport (every rank makes the same calls in the same order, so they
#: agree), and its tags are offset by ``lane * LANE_WIDTH``. An executor whose tags of
#: all epochs do not fit in a lane (more than LANE_WIDTH / EPOCHS messages on a pair)
#: runs its calls alone.
LANES = 4
LANE_WIDTH = TAG_LIMIT // LANES


# ---------------------------------------------------------------------------
# Array kinds: numpy, torch, cupy behind four operations
# ---------------------------------------------------------------------------
class _NumpyOps:
    kind = "numpy"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.flags.c_contiguous:
            raise TopoplanError("allreduce needs a contiguous buffer; pass np.ascontiguousarray(x) "
                                "and copy the result back")
        if not buf.flags.writeable:
            raise TopoplanError("allreduce works in place, but the numpy buffer is read-only")
        return buf.reshape(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.__array_interface__["data"][0], "cpu")

    @staticmethod
    def fast_key(buf: Any) -> Any:
        # A numpy array's memory moves only through ndarray.resize, which changes its size.
        return buf.size

    @staticmethod
    def dtype(buf: Any) -> str:
        return str(buf.dtype)

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import numpy as np
        return np.empty(n, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def float32(buf: Any) -> Any:
        import numpy as np
        return np.float32

    @staticmethod
    def add(dst: Any, src: Any) -> None:
        dst += src

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst[...] = src


class _TorchOps:
    kind = "torch"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.is_contiguous():
            raise TopoplanError("allreduce needs a contiguous tensor; pass t.contiguous() and "
                                "copy the result back")
        return buf.view(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.data_ptr(), str(buf.device))

    @staticmethod
    def fast_key(buf: Any) -> Any:
        return (buf.data_ptr(), buf.numel())

    @staticmethod
    def dtype(buf: Any) -> str:
        return str(buf.dtype).removeprefix("torch.")

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import torch
        return torch.empty(n, dtype=like.dtype if dtype is None else dtype, device=like.device)

    @staticmethod
    def float32(buf: Any) -> Any:
        import torch
        return torch.float32

    @staticmethod
    def add(dst: Any, src: Any) -> None:
        dst.add_(src)

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst.copy_(src)


class _CupyOps(_NumpyOps):
    kind = "cupy"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.flags.c_contiguous:
            raise TopoplanError("allreduce needs a contiguous buffer; pass cupy.ascontiguousarray(x)"
                                " and copy the result back")
        return buf.reshape(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.data.ptr, f"cuda:{buf.device.id}")

    @staticmethod
    def fast_key(buf: Any) -> Any:
        return (buf.data.ptr, buf.size)

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import cupy
        with like.device:
            return cupy.empty(n, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def float32(buf: Any) -> Any:
        import cupy
        return cupy.float32


#: The operations of one array kind (the classes above are used as namespaces).
ArrayOps = type[_NumpyOps] | type[_TorchOps]


def array_ops(buf: Any) -> ArrayOps:
    """The operations for ``buf``'s array kind (numpy, torch or cupy).

    Raises
    ------
    TopoplanError
        For anything else, naming the type.
    """
    module = type(buf).__module__.split(".")[0]
    if module == "numpy" and hasattr(buf, "__array_interface__"):
        return _NumpyOps
    if module == "torch" and hasattr(buf, "data_ptr"):
        return _TorchOps
    if module == "cupy":
        return _CupyOps
    raise TopoplanError(f"allreduce buffers are numpy arrays, torch tensors or cupy arrays, got "
                        f"{type(buf).__module__}.{type(buf).__name__}")


# ---------------------------------------------------------------------------
# Compiled and bound programs
# ---------------------------------------------------------------------------
Span = tuple[int, int]  # elements [start, end) of the buffer an op carries


@dataclass(slots=True)
class _MsgPlan:
    send: bool
    peer: int
    chunk: int
    count: int
    span: Span
    tag: int
    reduce: bool
    slot: tuple[int, int] | None  # scratch [start, end) when not the span itself

    def what(self) -> str:
        chunks = chunk_text(self.chunk, self.count)
        return f"send of {chunks} to" if self.send else f"recv of {chunks} from"


@dataclass(slots=True)
class _StepPlan:
    messages: list[_MsgPlan]
    snapshots: list[tuple[Span, tuple[int, int]]]  # span -> scratch slot, copied at step start
    reduces: list[tuple[Span, tuple[int, int]]]    # span += scratch slot, after the wait


@dataclass(slots=True)
class _Compiled:
    n: int
    bounds: list[tuple[int, int]]
    steps: list[_StepPlan]     # only steps that move data
    step_index: list[int]      # the schedule's step number of each entry in ``steps``
    scratch: int               # elements of scratch the rank needs


@dataclass(slots=True)
class _BoundStep:
    index: int
    snapshots: list[tuple[Any, Any]]  # (scratch view, chunk view)
    messages: list[Message]
    plans: list[_MsgPlan]
    reduces: list[tuple[Any, Any]]    # (chunk view, scratch view)
    batches: list[Any] = field(default_factory=list)  # per lane and epoch: transport.batch(...)


@dataclass(slots=True)
class _Bound:
    steps: list[_BoundStep]
    keep: Any            # the buffers, kept alive so the cached addresses stay valid
    work: Any            # what the steps run on: the flat buffer, its fp32 shadow, or a copy
    scratch: Any
    copy_in: list[tuple[Any, Any]]   # (dst, src) before the first step: user data -> work
    copy_out: list[tuple[Any, Any]]  # (dst, src) after the last step: work -> user data


def _pair_span(schedule: Schedule) -> int:
    """The most messages one ordered pair of ranks exchanges in a call (at least 1)."""
    counts: dict[tuple[int, int], int] = {}
    for rank, _, op in schedule.ops():
        if op.kind is OpKind.SEND:
            key = (rank, op.peer)
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=1)


def _compile(schedule: Schedule, rank: int, n: int) -> _Compiled:
    bounds = schedule.chunk_bounds(n)
    seq_out: dict[int, int] = {}
    seq_in: dict[int, int] = {}
    steps, step_index, scratch = [], [], 0
    for s, ops in enumerate(schedule.steps_of(rank)):
        # Chunk ranges overwritten by this step's recvs: a send that overlaps one must
        # carry the value from the step's start, so it goes out of a snapshot.
        # (Recv ranges of a step are disjoint, so sorted by start their ends sort too.)
        overwritten = sorted((op.chunk, op.end) for op in ops
                             if op.kind is OpKind.RECV and not op.reduce)
        ow_starts = [a for a, _ in overwritten]
        offset = 0
        snap_slot: dict[Span, tuple[int, int]] = {}
        messages, snapshots, reduces = [], [], []
        for op in ops:
            # Tags count every message on the pair, empty or not, so both ends agree.
            counter = seq_out if op.kind is OpKind.SEND else seq_in
            seq = counter.get(op.peer, 0)
            counter[op.peer] = seq + 1
            span = (bounds[op.chunk][0], bounds[op.end - 1][1])
            start, end = span
            if start == end:
                continue  # empty pieces: both ends skip them, nothing to carry
            length = end - start
            slot = None
            if op.kind is OpKind.SEND:
                i = bisect_left(ow_starts, op.end) - 1
                if i >= 0 and overwritten[i][1] > op.chunk:
                    if span not in snap_slot:
                        snap_slot[span] = (offset, offset + length)
                        snapshots.append((span, snap_slot[span]))
                        offset += length
                    slot = snap_slot[span]
            elif op.reduce:
                slot = (offset, offset + length)
                offset += length
                reduces.append((span, slot))
            messages.append(_MsgPlan(op.kind is OpKind.SEND, op.peer, op.chunk, op.count, span,
                                     seq % TAG_LIMIT, op.reduce, slot))
        scratch = max(scratch, offset)
        # Receives first (a stable sort keeps each pair's order): a send then finds
        # its receive already posted, which saves a copy in MPI and gloo.
        messages.sort(key=lambda m: m.send)
        if messages:
            steps.append(_StepPlan(messages, snapshots, reduces))
            step_index.append(s)
    return _Compiled(n, bounds, steps, step_index, scratch)


class _CallQueue:
    """The calls in flight on one transport, in start order, across executors."""

    __slots__ = ("calls", "lock", "made")

    def __init__(self) -> None:
        self.calls: list[AllreduceHandle] = []
        self.lock = threading.RLock()
        self.made = 0  # calls made on the transport so far, by every executor: lanes

    def lane(self) -> int:
        """The lane of a new call (and count it)."""
        lane = self.made % LANES
        self.made += 1
        return lane


def _queue_of(transport: Transport) -> _CallQueue:
    queue = getattr(transport, "_topoplan_calls", None)
    if queue is None:
        queue = _CallQueue()
        transport._topoplan_calls = queue  # type: ignore[attr-defined]
    return queue


class AllreduceHandle:
    """A call in flight, returned by :meth:`Allreduce.start` (and the ``start`` of
    :class:`ReduceScatter` and :class:`AllGather`).

    ``test()`` moves it (and every other call in flight on the transport) as far as it
    goes without blocking and says whether it is done (when another thread is moving
    them at that moment, it leaves them to that thread); ``wait()`` blocks until it is and
    returns the buffer (the output, for a reduce-scatter or an allgather). A failed call
    raises its :class:`~topoplan.TransportError` from either, every time they are called.
    """

    __slots__ = ("_owner", "buffer", "_bound", "_ops", "call", "epoch", "lane", "_step",
                 "_posted", "_deadline", "_begun", "done", "_error")

    def __init__(self, owner: _Executor, buffer: Any, bound: _Bound, ops: ArrayOps,
                 call: int, epoch: int, lane: int) -> None:
        self._owner, self.buffer, self._bound, self._ops = owner, buffer, bound, ops
        self.call, self.epoch, self.lane = call, epoch, lane
        self._step = 0
        self._posted: Any = None
        self._deadline = 0.0
        self._begun = False
        self.done = False
        self._error: TransportError | None = None

    def test(self) -> bool:
        """Progress without blocking; True once the call is done.

        Raises
        ------
        TransportError
            The call failed (a step timed out or a peer failed).
        """
        owner = self._owner
        lock = owner._queue.lock
        # Another thread moving the calls (a progress thread) does this call's work too:
        # waiting for it would only stall the caller, e.g. backward in a gradient hook.
        if not self.done and lock.acquire(blocking=False):
            try:
                owner._progress_all()
            finally:
                lock.release()
        if self._error is not None:
            raise self._error
        return self.done

    def wait(self) -> Any:
        """Block until the call is done; returns the buffer (summed in place), or the
        output of a reduce-scatter or an allgather.

        Raises
        ------
        TransportError
            The call failed (a step timed out or a peer failed).
        """
        owner = self._owner
        idle = 0
        while not self.done:
            with owner._queue.lock:
                moved = owner._progress_all()
                begun = [h for h in owner._queue.calls if h._begun and not h.done]
                if len(begun) == 1 and not self.done:
                    # Alone, or the others wait for it to finish (one at a time on NCCL
                    # and gloo): wait on it, not in a poll loop.
                    begun[0]._owner._advance(begun[0], block=True)
                    continue
            if self.done:
                break
            idle = 0 if moved else idle + 1
            if idle > 64:
                time.sleep(min(1e-3, 1e-5 * idle))  # others' turn on a crowded machine
        if self._error is not None:
            raise self._error
        return self.buffer

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done else (
            f"at step {self._step}" if self._begun else "queued")
        return f"<AllreduceHandle call {self.call} {state}>"


class _Executor:
    """What :class:`Allreduce`, :class:`ReduceScatter` and :class:`AllGather` share:
    compiling the rank's program, binding buffers, running calls in flight, tags and
    epochs. A subclass names its :attr:`collective` and lays its buffers out
    (:meth:`_layout`).
    """

    collective = "allreduce"

    def __init__(self, schedule: Schedule, transport: Transport, *, timeout: float = 60.0,
                 accumulate_fp32: bool = False) -> None:
        if schedule.collective != self.collective:
            raise TopoplanError(f"{type(self).__name__} runs {self.collective} schedules, got "
                                f"{schedule.collective!r}")
        if schedule.nranks != transport.size:
            raise TopoplanError(
                f"the {schedule.algorithm} schedule is for {schedule.nranks} ranks but the "
                f"{transport.name} transport has {transport.size}; plan for {transport.size} "
                f"ranks or launch {schedule.nranks}")
        if not timeout > 0:
            raise TopoplanError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.schedule = schedule
        self.transport = transport
        self.rank = transport.rank
        self.timeout = float(timeout)
        self.accumulate_fp32 = accumulate_fp32
        span = _pair_span(schedule)
        # Epochs must not share tags: with more messages per pair than TAG_LIMIT / EPOCHS
        # in one call, every call uses the same tags (and nothing is drained).
        self._epochs = EPOCHS if span * EPOCHS <= TAG_LIMIT else 1
        self._tag_shift = span
        # Calls side by side with other executors' in lanes (see LANES) when all the
        # epochs' tags fit in one; else every call runs alone, in lane 0's tags.
        self._laned = span * self._epochs <= LANE_WIDTH
        self._calls = 0
        # (call, peer, tag) of receives a failed call left posted or never posted.
        self._stale: list[tuple[int, int, int]] = []
        self._compiled: dict[int, _Compiled] = {}
        self._bound: OrderedDict[tuple, _Bound] = OrderedDict()
        self._scratch: dict[tuple, Any] = {}
        # The buffers of the last call: training loops pass the same ones again and
        # again, and recognising them skips building the cache key (microseconds).
        self._last: tuple | None = None
        self._queue = _queue_of(transport)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.schedule.algorithm}, "
                f"nranks={self.schedule.nranks}, transport={self.transport!r})")

    def _layout(self, ops: ArrayOps, flats: list[Any], shadow: bool
                ) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """The full buffer the steps run on, and the copies into it before the first step
        and out of it after the last, for the call's flat user buffers."""
        raise NotImplementedError

    # -- compile and bind ------------------------------------------------------
    def compiled(self, n: int) -> _Compiled:
        """The rank's program for an ``n``-element buffer (cached)."""
        plan = self._compiled.get(n)
        if plan is None:
            plan = self._compiled[n] = _compile(self.schedule, self.rank, n)
        return plan

    def _bind(self, *buffers: Any) -> tuple[_Bound, ArrayOps]:
        ops = array_ops(buffers[0])
        flats = [ops.flat(b) for b in buffers]
        flat = flats[0]
        dtype = ops.dtype(flat)
        for other in buffers[1:]:
            if array_ops(other) is not ops or ops.dtype(ops.flat(other)) != dtype:
                raise TopoplanError(
                    f"{self.collective}: input and output must be arrays of one kind and "
                    f"dtype, got {ops.kind} {dtype} and {array_ops(other).kind} "
                    f"{array_ops(other).dtype(other)}")
        shadow = self.accumulate_fp32 and dtype in ("float16", "bfloat16")
        key = (*(a for f in flats for a in ops.address(f)), *(f.shape[0] for f in flats),
               dtype, ops.kind)
        bound = self._bound.get(key)
        if bound is not None:
            self._bound.move_to_end(key)
            return bound, ops
        work, copy_in, copy_out = self._layout(ops, flats, shadow)
        n = work.shape[0]
        plan = self.compiled(n)
        skey = (ops.kind, ops.address(flat)[1], ops.dtype(work), plan.scratch)
        scratch = self._scratch.get(skey)
        if scratch is None:
            scratch = self._scratch[skey] = ops.empty(plan.scratch, work)
        prepare = self.transport.prepare
        views: dict[Span, Any] = {}

        def view_of(span: Span) -> Any:
            v = views.get(span)
            if v is None:
                v = views[span] = work[span[0]:span[1]]
            return v

        wires: dict[tuple[str, Any], Any] = {}  # (kind, span or slot) -> transport wire

        def wire_of(kind: str, index: Any, view: Any) -> Any:
            w = wires.get((kind, index))
            if w is None:
                w = wires[(kind, index)] = prepare(view)
            return w

        steps = []
        for index, sp in zip(plan.step_index, plan.steps):
            messages = []
            for m in sp.messages:
                if m.slot is None:
                    view = view_of(m.span)
                    wire = wire_of("span", m.span, view)
                else:
                    view = scratch[m.slot[0]:m.slot[1]]
                    wire = wire_of("scratch", m.slot, view)
                messages.append(Message(m.send, wire, m.peer, m.tag))
            steps.append(_BoundStep(
                index,
                [(scratch[a:b], view_of(c)) for c, (a, b) in sp.snapshots],
                messages, sp.messages,
                [(view_of(c), scratch[a:b]) for c, (a, b) in sp.reduces],
                [None] * (self._epochs * (LANES if self._laned else 1))))
        bound = _Bound(steps, buffers, work, scratch, copy_in, copy_out)
        self._bound[key] = bound
        while len(self._bound) > BOUND_CACHE:
            self._bound.popitem(last=False)
        return bound, ops

    # -- calls in flight --------------------------------------------------------
    def _start(self, *buffers: Any) -> AllreduceHandle:
        """Start a call on ``buffers`` (the last one is the result); returns at once."""
        bound, ops = self._bind(*buffers)
        queue = self._queue
        with queue.lock:
            for other in queue.calls:
                if other._bound is bound:
                    raise TopoplanError(
                        f"rank {self.rank}: this buffer already has an {self.collective} in "
                        f"flight (call {other.call}); wait for it before starting another")
            call = self._calls
            self._calls = call + 1
            handle = AllreduceHandle(self, buffers[-1], bound, ops, call, call % self._epochs,
                                     self._lane_of(queue.lane()))
            queue.calls.append(handle)
            self._progress_all()
        return handle

    def progress(self) -> int:
        """Move every call in flight on the transport as far as it goes without
        blocking; returns how many are still in flight. A failed call keeps its error
        for its handle."""
        with self._queue.lock:
            self._progress_all()
            return len(self._queue.calls)

    def _progress_all(self) -> bool:
        moved = False
        for handle in list(self._queue.calls):
            if not handle.done:
                moved |= handle._owner._advance(handle, block=False)
        return moved

    def _lane_of(self, lane: int) -> int:
        """The lane a call of this executor runs in: its turn's, or 0 when unlaned."""
        return lane if self._laned else 0

    def _can_begin(self, handle: AllreduceHandle) -> bool:
        """Whether ``handle`` may begin beside every call started before it that is
        still running: never on an untagged or unpollable transport; with a call of
        this executor when their epochs (tags) and scratch differ; with another
        executor's when both are laned and their lanes differ."""
        transport = self.transport
        for other in self._queue.calls:
            if other is handle:
                return True
            if other.done:
                continue
            if not transport.tagged or not transport.pollable:
                return False
            if other._owner is self:
                if (handle.call - other.call >= self._epochs
                        or other._bound.scratch is handle._bound.scratch):
                    return False
            elif not (self._laned and other._owner._laned) or other.lane == handle.lane:
                return False
        return True  # pragma: no cover - a handle is in its queue until it is done

    def _advance(self, h: AllreduceHandle, *, block: bool) -> bool:
        """Run ``h`` as far as it goes (``block``: to the end); whether it moved."""
        if not h._begun:
            if not self._can_begin(h):
                return False
            h._begun = True
            if self._stale:
                self._drain(h.call)
            for dst, src in h._bound.copy_in:
                h._ops.copy(dst, src)
        transport, steps = self.transport, h._bound.steps
        moved = False
        try:
            with transport.compute_context():
                while h._step < len(steps):
                    step = steps[h._step]
                    if h._posted is None:
                        for dst, src in step.snapshots:
                            h._ops.copy(dst, src)
                        slot = h.lane * self._epochs + h.epoch
                        batch = step.batches[slot]
                        if batch is None:
                            batch = step.batches[slot] = transport.batch(
                                self._messages(step, h.epoch, h.lane))
                        h._posted = transport.start(batch)
                        h._deadline = time.monotonic() + self.timeout
                        moved = True
                    if block:
                        pending = transport.wait(h._posted, max(0.0, h._deadline - time.monotonic()))
                    elif not transport.pollable:
                        return moved  # it moves in wait()
                    elif transport.test(h._posted):
                        pending = transport.wait(h._posted, 0.0)
                    elif time.monotonic() >= h._deadline:
                        pending = transport.wait(h._posted, 0.0)
                    else:
                        return moved
                    if pending:
                        transport.abort(h._posted)
                        self._leave_behind(steps[h._step:], h.call, h.epoch, h.lane)
                        raise self._error(step, pending, None)
                    for dst, src in step.reduces:
                        h._ops.add(dst, src)
                    h._posted = None
                    h._step += 1
                    moved = True
                for dst, src in h._bound.copy_out:
                    h._ops.copy(dst, src)
        except PeerFailure as exc:
            transport.abort(h._posted)
            self._leave_behind(steps[h._step:], h.call, h.epoch, h.lane)
            h._error = self._error(steps[h._step], [exc.index], exc.reason)
        except TransportError as exc:
            h._error = exc
        h.done = True
        self._queue.calls.remove(h)
        return True

    # -- run ------------------------------------------------------------------
    def _call(self, *buffers: Any) -> Any:
        """Run a call on ``buffers`` to the end; returns the last one (the result)."""
        if self._queue.calls:  # others in flight: take a turn with them
            return self._start(*buffers).wait()
        last = self._last
        if (last is not None and len(buffers) == len(last[0])
                and all(b is c for b, c in zip(buffers, last[0]))
                and [last[1].fast_key(b) for b in buffers] == last[2]):
            bound, ops = last[3], last[1]
        else:
            bound, ops = self._bind(*buffers)
            self._last = (buffers, ops, [ops.fast_key(b) for b in buffers], bound)
        with self._queue.lock, self.transport.compute_context():
            self._run(bound, ops, self._lane_of(self._queue.lane()))
        return buffers[-1]

    def _run(self, bound: _Bound, ops: ArrayOps, lane: int) -> None:
        call = self._calls
        self._calls = call + 1
        if self._stale:
            self._drain(call)
        epoch = call % self._epochs
        slot = lane * self._epochs + epoch
        add, copy = ops.add, ops.copy
        for dst, src in bound.copy_in:
            copy(dst, src)
        transport, timeout = self.transport, self.timeout
        for s, step in enumerate(bound.steps):
            for dst, src in step.snapshots:
                copy(dst, src)
            batch = step.batches[slot]
            if batch is None:
                batch = step.batches[slot] = transport.batch(self._messages(step, epoch, lane))
            handle = transport.start(batch)
            try:
                pending = transport.wait(handle, timeout)
            except PeerFailure as exc:
                transport.abort(handle)
                self._leave_behind(bound.steps[s:], call, epoch, lane)
                raise self._error(step, [exc.index], exc.reason) from None
            if pending:
                transport.abort(handle)
                self._leave_behind(bound.steps[s:], call, epoch, lane)
                raise self._error(step, pending, None)
            for dst, src in step.reduces:
                add(dst, src)
        for dst, src in bound.copy_out:
            copy(dst, src)

    # -- epochs -------------------------------------------------------------------
    def _shift(self, epoch: int, lane: int) -> int:
        """What the tags of a call in ``epoch`` and ``lane`` are offset by."""
        return epoch * self._tag_shift + lane * LANE_WIDTH

    def _messages(self, step: _BoundStep, epoch: int, lane: int) -> list[Message]:
        """The step's messages with the tags of ``epoch`` in ``lane``."""
        shift = self._shift(epoch, lane)
        if shift == 0:
            return step.messages
        return [Message(m.send, m.wire, m.peer, (m.tag + shift) % TAG_LIMIT)
                for m in step.messages]

    def _leave_behind(self, steps: Sequence[_BoundStep], call: int, epoch: int,
                      lane: int) -> None:
        """Note the receives of a failed call from its failed step on: their messages may
        still come, and must be dropped before their tags come round again."""
        if self._epochs == 1:
            return
        shift = self._shift(epoch, lane)
        self._stale += [(call, m.peer, (m.tag + shift) % TAG_LIMIT)
                        for step in steps for m in step.messages if not m.send]

    def _drain(self, call: int) -> None:
        """Drop the failed calls' messages that have arrived since (see the module
        docstring); forget those that can no longer be told from live ones."""
        keep = []
        for made, peer, tag in self._stale:
            age = call - made
            if age < self._epochs and self.transport.discard(peer, tag, self.timeout):
                continue
            if age < self._epochs - 1:
                keep.append((made, peer, tag))
        self._stale = keep

    def _error(self, step: _BoundStep, indices: Sequence[int], reason: str | None) -> TransportError:
        # Blame a receive first: a dead peer's sends never arrive, while our own
        # sends to it may already have completed into its buffers.
        plans = [step.plans[i] for i in indices]
        blamed = next((p for p in plans if not p.send), plans[0])
        what = f"{blamed.what()} peer {blamed.peer}"
        others = len(plans) - 1
        more = f" (and {others} more op{'s' if others > 1 else ''})" if others else ""
        if reason is None:
            why = (f"timed out after {self.timeout:g} s: the peer died, hangs, or runs a "
                   f"different schedule")
        else:
            why = f"failed: {reason}"
        return TransportError(
            f"rank {self.rank}: {self.transport.name} {self.schedule.algorithm} {self.collective}, "
            f"step {step.index}: {what}{more} {why}",
            rank=self.rank, step=step.index, peer=blamed.peer, chunk=blamed.chunk)


class Allreduce(_Executor):
    """Run an allreduce schedule over a transport, in place.

    Parameters
    ----------
    schedule : Schedule
        A verified schedule (:func:`topoplan.verify`) for ``transport.size`` ranks.
    transport : Transport
        :class:`~topoplan.transports.MPI`, :class:`~topoplan.transports.Torch`,
        :class:`~topoplan.transports.NCCL` or :class:`~topoplan.transports.Local`.
    timeout : float
        Seconds any one step may wait for its messages. A peer that died or never
        posts its side ends the call with :class:`~topoplan.TransportError` after
        at most this long, on every rank that waits for it.
    accumulate_fp32 : bool
        For float16/bfloat16 buffers: run the schedule on a float32 copy (twice the
        bytes on the wire) and round once at the end, instead of rounding every
        partial sum to the buffer dtype. Ignored for other dtypes.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport
        (before anything is sent), or is not an allreduce.

    Examples
    --------
    >>> from topoplan.transports import Local
    >>> def rank_fn(t):
    ...     x = np.full(10, t.rank + 1.0)
    ...     Allreduce(schedule, t)(x)
    ...     return x
    >>> Local.launch(4, rank_fn)  # doctest: +SKIP

    Several in flight, overlapping other work (``start`` returns at once)::

        handles = [allreduce.start(bucket) for bucket in buckets]
        ...                       # compute; every start/test/wait moves them all
        for h in handles:
            h.wait()
    """

    collective = "allreduce"

    def _layout(self, ops: ArrayOps, flats: list[Any], shadow: bool
                ) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        flat, = flats
        if not shadow:
            return flat, [], []
        work = ops.empty(flat.shape[0], flat, ops.float32(flat))
        return work, [(work, flat)], [(flat, work)]

    def start(self, buffer: Any) -> AllreduceHandle:
        """Start summing ``buffer`` over all ranks, in place; returns at once.

        Every rank must start the same calls in the same order. The buffer must not be
        read or written until the handle's ``wait()`` (or a true ``test()``) says the
        call is done. See the module docstring for how calls in flight progress.

        Raises
        ------
        TopoplanError
            When ``buffer`` already has a call of this executor in flight.
        """
        return self._start(buffer)

    def __call__(self, buffer: Any) -> Any:
        """Sum ``buffer`` over all ranks, in place; returns ``buffer``.

        Parameters
        ----------
        buffer : numpy.ndarray, torch.Tensor or cupy.ndarray
            Contiguous, same element count and dtype on every rank.

        Raises
        ------
        TransportError
            When a step's messages do not complete within ``timeout`` or the
            transport reports a failed peer; names rank, step, peer and chunk.
        """
        return self._call(buffer)

    allreduce = __call__


class _Sharded(_Executor):
    """A reduce-scatter or an allgather: an input and an output of different sizes."""

    def _shard(self, flats: list[Any]) -> tuple[int, tuple[int, int]]:
        """The full buffer's size and this rank's shard ``[start, end)`` in it, checking
        the call's input and output sizes against the collective's layout."""
        (inp, out), nranks = flats, self.schedule.nranks
        full = inp.shape[0] if self.collective == "reduce_scatter" else out.shape[0]
        coll = collective_of(self.schedule)
        if full % nranks or (inp.shape[0], out.shape[0]) != (coll.input_size(full),
                                                             coll.output_size(full)):
            raise TopoplanError(
                f"{self.collective} of {nranks} ranks: input of {inp.shape[0]} and output of "
                f"{out.shape[0]} elements; expected {self._expected()}")
        m = full // nranks
        return full, (self.rank * m, (self.rank + 1) * m)

    def _expected(self) -> str:
        raise NotImplementedError

    def start(self, input: Any, output: Any) -> AllreduceHandle:
        """Start the collective from ``input`` into ``output``; returns at once.

        As :meth:`Allreduce.start`; neither buffer may be touched until the handle is
        done, and its ``wait()`` returns ``output``.
        """
        return self._start(input, output)

    def __call__(self, input: Any, output: Any) -> Any:
        """Run the collective from ``input`` into ``output``; returns ``output``.

        Parameters
        ----------
        input : numpy.ndarray, torch.Tensor or cupy.ndarray
            Contiguous, the same element count and dtype on every rank: ``size``
            elements for a reduce-scatter, ``size / nranks`` (this rank's shard) for an
            allgather.
        output : same kind and dtype
            ``size / nranks`` elements for a reduce-scatter (this rank's shard of the
            sum), ``size`` for an allgather (every shard, in rank order).

        Raises
        ------
        TopoplanError
            For buffers of the wrong sizes, kinds or dtypes.
        TransportError
            As for :class:`Allreduce`.
        """
        return self._call(input, output)


class ReduceScatter(_Sharded):
    """Run a reduce-scatter schedule over a transport: ``ReduceScatter(schedule, t)(input, output)``.

    Every rank passes an input of ``size`` elements; rank ``r``'s output (``size /
    nranks`` elements) receives shard ``r`` (elements ``r * size / nranks`` up to
    ``(r + 1) * size / nranks``) of the sum of every rank's input, as
    ``MPI_Reduce_scatter_block`` and torch's ``reduce_scatter_tensor``. The schedule runs on
    a private copy of the input, so the input is left as it was.

    Parameters
    ----------
    schedule : Schedule
        A verified ``reduce_scatter`` schedule (``topoplan.plan(..., collective=
        "reduce_scatter")``) for ``transport.size`` ranks.
    transport : Transport
        As for :class:`Allreduce`.
    timeout : float
        As for :class:`Allreduce`.
    accumulate_fp32 : bool
        For float16/bfloat16 buffers: sum in a float32 copy and round once into the
        output.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport, or is
        not a reduce-scatter.
    """

    collective = "reduce_scatter"

    def _expected(self) -> str:
        return f"an input of nranks ({self.schedule.nranks}) times the output's elements"

    def _layout(self, ops: ArrayOps, flats: list[Any], shadow: bool
                ) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        inp, out = flats
        full, (a, b) = self._shard(flats)
        work = ops.empty(full, inp, ops.float32(inp) if shadow else None)
        return work, [(work, inp)], [(out, work[a:b])]

    reduce_scatter = _Sharded.__call__


class AllGather(_Sharded):
    """Run an allgather schedule over a transport: ``AllGather(schedule, t)(input, output)``.

    Rank ``r`` passes an input of ``size / nranks`` elements, its shard; every rank's
    output (``size`` elements) receives every rank's shard in rank order, as
    ``MPI_Allgather`` and torch's ``all_gather_into_tensor``. The schedule runs in place
    on the output, the input copied into shard ``r`` first (the input may be that very
    shard of the output).

    Parameters
    ----------
    schedule : Schedule
        A verified ``allgather`` schedule (``topoplan.plan(..., collective="allgather")``)
        for ``transport.size`` ranks.
    transport : Transport
        As for :class:`Allreduce`.
    timeout : float
        As for :class:`Allreduce`.
    accumulate_fp32 : bool
        Ignored: an allgather adds nothing.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport, or is
        not an allgather.
    """

    collective = "allgather"

    def _expected(self) -> str:
        return f"an output of nranks ({self.schedule.nranks}) times the input's elements"

    def _layout(self, ops: ArrayOps, flats: list[Any], shadow: bool
                ) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        inp, out = flats
        _, (a, b) = self._shard(flats)
        return out, [(out[a:b], inp)], []

    allgather = _Sharded.__call__
