"""The executor's engine: one rank's calls of a schedule over a transport.

:class:`Executor` compiles the rank's program (:mod:`~topoplan.runtime.executor.compiler`) once
per element count, binds the call's buffers (cached per buffer address), and runs calls
to the end or in flight (moved by every poll of any call on the transport,
:mod:`~topoplan.runtime.executor.lanes`). How a call's buffers lie over the full buffer the
schedule runs on comes from the schedule's collective
(:class:`~topoplan.ir.collectives.Collective`: its input and output parts, and whether it
adds), so one engine runs all three; the public calls
(:mod:`~topoplan.runtime.executor.calls`) only name their collective and their arguments. The
rules it keeps are in :mod:`topoplan.runtime.executor`.

Native steps (IR v3): the constructor checks the schedule's native ops
(:func:`~topoplan.runtime.executor.compiler.native_groups`) and has the transport make the
sub-communicators of their groups (:meth:`~topoplan.runtime.transports.Transport.make_groups`,
collective over every rank, so every rank must build the same executors in the same
order, which calls need anyway); binding a buffer binds each native step once
(:meth:`~topoplan.runtime.transports.Transport.native`); a call then runs a native step where
its turn comes, started after the step before it ended and before the next one starts,
with the step's deadline. Calls that share a group run one after another in start
order, so every member issues the group's collectives in the same order.

Channels (IR v4): a program of several channels (:mod:`~topoplan.runtime.executor.compiler`)
runs them at once where the transport allows it, how depending on the transport:

- tagged and pollable (MPI, Local): one loop posts every channel's current step and
  moves each channel as its step completes (``test`` on each, then the next step of that
  channel at once); with nothing done it waits in
  :meth:`~topoplan.runtime.transports.Transport.wait_any` (Local: on the world's
  condition; MPI: ``Test`` with ``sched_yield`` between rounds, as its ``wait``), never a
  bare spin. Calls in flight move the same way, a round per poll. A native step (channel
  0) is started and tested like the others' messages; MPI's ``blocking_natives`` does not
  apply to it (a blocking collective would stop the other channels).
- tagged, not pollable (torch/gloo: a step completes only inside ``Work.wait``): one
  thread per channel, channel 0 on the caller's, each waiting on its own step (gloo's
  ``wait`` is per work; every channel's tags are its own). Channel threads come from
  a pool of the executor's (started on first use, reused). A call that fails in one
  channel stops the others before their next step, so it ends at most one step timeout
  after the failure. The cost: a thread hand-off per channel per call (tens of us).
- untagged (NCCL, which pairs messages by the order they are posted) or with tags that
  do not fit (they wrap, see the compiler): one channel after another, every rank
  running channel 0's whole program, then channel 1's; each channel alone is
  deadlock-free, so this is too, but channels do not overlap: NCCL runs everything
  on the transport's one stream anyway, and concurrent channels there would need a
  communicator and a stream per channel.

A failed call aborts every channel's posted step and leaves behind the receives of each
channel from its current step on; errors name the channel when the schedule has
several (``rank 3: mpi ring allreduce, channel 1 step 2: recv of chunk 5 from peer 2
...``, ``rank 3 channel 0 step 2: native ...``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, ClassVar, Sequence

from ...ir.collectives import collective_of
from ...errors import ScheduleError, TopoplanError, TransportError
from ...ir.schedule import Native, Schedule
from ..transports.base import TAG_LIMIT, Collective, Message, NoNative, PeerFailure, Transport
from .arrays import ArrayOps, array_ops
from .compiler import (BoundProgram, BoundStep, NativePlan, Program, bind_steps, channel_tags,
                       compile_program, native_groups)
from .handle import Handle
from .lanes import LANES, CallQueue, epochs_for, fits_a_lane, queue_of, tag_shift

__all__ = ["Executor", "BOUND_CACHE"]

#: How many bound buffers an executor keeps views for (a training loop alternates few).
BOUND_CACHE = 8


class Cursor:
    """One channel of a call that runs its channels at once: its steps ``at .. end - 1``
    of the bound program, the step it posted (a transport handle or a native work) and
    that step's deadline."""

    __slots__ = ("channel", "at", "end", "posted", "deadline")

    def __init__(self, channel: int, at: int, end: int) -> None:
        self.channel, self.at, self.end = channel, at, end
        self.posted: Any = None
        self.deadline = 0.0

    def __repr__(self) -> str:
        return f"<channel {self.channel} at {self.at} of {self.end}>"


def _warn_priced_elsewhere(schedule: Schedule, transport: Transport) -> None:
    """A :class:`~topoplan.TopoplanWarning` (rank 0's) when the schedule was priced for
    another runtime (:func:`topoplan.runtime.choice.priced_elsewhere`)."""
    from ..transports.families import priced_elsewhere
    text = priced_elsewhere(schedule, transport)
    if text:
        import warnings

        from ...errors import TopoplanWarning
        warnings.warn(text, TopoplanWarning, stacklevel=4)


def _check(schedule: Schedule, who: str, rank: int) -> None:
    """Refuse a schedule that does not compute its collective (verified once per schedule
    in this process: :func:`~topoplan.ir.verify.verify_once`). Every rank verifies the
    same schedule alike, so every rank refuses it, before anything is sent."""
    from ...ir.verify import verify_once
    try:
        verify_once(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"rank {rank}: {who} refuses a schedule that does not compute its "
                            f"{schedule.collective}: {exc} (topoplan verify names the same; "
                            "plan it again)") from None


class Executor:
    """What :class:`Allreduce`, :class:`ReduceScatter` and :class:`AllGather` share:
    compiling the rank's program, binding buffers, running calls in flight, tags and
    epochs, for any schedule; the buffers' layout is the schedule's collective's
    (:attr:`spec`). A subclass that names its :attr:`collective` runs only schedules of it.
    """

    #: The collective a subclass runs (the schedule's ``collective``); None: any.
    collective: ClassVar[str | None] = None

    def __init__(self, schedule: Schedule, transport: Transport, *, timeout: float = 60.0,
                 accumulate_fp32: bool = False, verified: bool = False) -> None:
        if self.collective is not None and schedule.collective != self.collective:
            raise TopoplanError(f"{type(self).__name__} runs {self.collective} schedules, got "
                                f"{schedule.collective!r}")
        if schedule.nranks != transport.size:
            raise TopoplanError(
                f"the {schedule.algorithm} schedule is for {schedule.nranks} ranks but the "
                f"{transport.name} transport has {transport.size}; plan for {transport.size} "
                f"ranks or launch {schedule.nranks}")
        if not timeout > 0:
            raise TopoplanError(f"timeout must be > 0 seconds, got {timeout!r}")
        if transport.rank == 0:
            _warn_priced_elsewhere(schedule, transport)
        self.schedule = schedule
        #: What the schedule computes, over its ranks and chunks: the buffers' layout.
        self.spec = collective_of(schedule)
        self.transport = transport
        self.rank = transport.rank
        self.timeout = float(timeout)
        self.accumulate_fp32 = accumulate_fp32
        tags = channel_tags(schedule)
        self._tags = tags
        span = sum(width for _, width in tags.values())
        #: Whether the schedule has several channels (IR v4): errors then name them.
        self.channelled = len(tags) > 1
        # How a program of several channels runs (see the module docstring): at once,
        # polled ("poll") or a thread each ("threads"), or one after another ("serial")
        # where messages pair by post order or the tags wrap.
        self._channel_mode = ("serial" if not transport.tagged or span > TAG_LIMIT
                              else "poll" if transport.pollable else "threads")
        self._pool: ThreadPoolExecutor | None = None
        # Epochs must not share tags: with more messages per pair than TAG_LIMIT / EPOCHS
        # in one call, every call uses the same tags (and nothing is drained).
        self._epochs = epochs_for(span)
        self._tag_shift = span
        # Calls side by side with other executors' in lanes (see LANES) when all the
        # epochs' tags fit in one; else every call runs alone, in lane 0's tags.
        self._laned = fits_a_lane(span, self._epochs)
        self._calls = 0
        # (call, peer, tag) of receives a failed call left posted or never posted.
        self._stale: list[tuple[int, int, int]] = []
        self._compiled: dict[int, Program] = {}
        self._bound: OrderedDict[tuple, BoundProgram] = OrderedDict()
        self._scratch: dict[tuple, Any] = {}
        # The buffers of the last call: training loops pass the same ones again and
        # again, and recognising them skips building the cache key (microseconds).
        self._last: tuple | None = None
        self._queue: CallQueue[Handle] = queue_of(transport)
        #: The groups of the schedule's native steps (their sub-communicators are made).
        self.groups = frozenset(self._make_groups(verified))
        #: Where each call's step times go (:class:`topoplan.runtime.health.StepTrace`),
        #: or None: the calls that run their steps one after another record when each
        #: step ended (a clock read per step); calls that run channels at once do not.
        self.trace: Any = None

    def _make_groups(self, verified: bool) -> list[tuple[int, ...]]:
        """Check the native ops, verify the schedule (unless ``verified``), and have the
        transport make their groups' sub-communicators (see the module docstring); the
        groups, in the order they were made. Every check comes before anything collective,
        so a schedule refused is refused on every rank alike."""
        transport = self.transport
        groups = native_groups(self.schedule, transport.size, f"{transport.name} transport")
        if not verified:
            _check(self.schedule, type(self).__name__, transport.rank)
        if not groups or all(transport.has_group(g) for g in groups):
            return groups
        # Making a sub-communicator blocks until every rank makes it (MPI_Comm_split,
        # new_group). A rank blocked there cannot move its calls in flight, which a
        # peer may be waiting on: finish them first (every rank has the same ones).
        queue = self._queue
        while True:
            with queue.lock:
                pending = [h for h in queue.calls if not h.done]
            if not pending:
                break
            try:
                pending[0].wait()
            except TopoplanError:
                pass  # the call's own handle reports it
        try:
            transport.make_groups(groups)
        except NoNative as exc:
            r, s, op = next((r, s, op) for r, s, op in self.schedule.ops()
                             if isinstance(op, Native))
            raise TopoplanError(f"rank {self.rank}: the {self.schedule.algorithm} schedule has "
                                f"native steps (rank {r} step {s}: native {op.text()}): "
                                f"{exc}") from None
        return groups

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.schedule.algorithm}, "
                f"nranks={self.schedule.nranks}, transport={self.transport!r})")

    def _layout(self, ops: ArrayOps, flats: list[Any], shadow: bool
                ) -> tuple[Any, list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """The full buffer the steps run on, and the copies into it before the first step
        and out of it after the last, for the call's flat user buffers: one (the input is
        the output, in place) or an input and an output, each all of the full buffer or
        the rank's shard of it (:attr:`spec`).

        The steps run in the output itself when it is the full buffer (an allreduce in
        place, an allgather: the input copied into its shard first); otherwise, or with
        ``shadow`` (a float32 copy to add in), in a buffer of their own, the input
        copied in first and the output copied out last. So a reduce-scatter's input is
        left as it was.
        """
        spec, inp, out = self.spec, flats[0], flats[-1]
        full = self._full_size(inp.shape[0], out.shape[0])
        a, b = spec.input_range(self.rank, full)
        c, d = spec.output_range(self.rank, full)
        if spec.output_part == "all" and not shadow:
            return out, ([] if inp is out else [(out[a:b], inp)]), []
        work = ops.empty(full, inp, ops.float32(inp) if shadow else None)
        return work, [(work[a:b], inp)], [(out, work[c:d])]

    def _full_size(self, n_in: int, n_out: int) -> int:
        """The full buffer's elements for a call's input and output of ``n_in`` and
        ``n_out`` elements, checked against the collective's layout."""
        spec, nranks = self.spec, self.schedule.nranks
        full = n_out if spec.output_part == "all" else n_in
        if spec.sharded and (full % nranks or (n_in, n_out) != (spec.input_size(full),
                                                                 spec.output_size(full))):
            whole, part = ("output", "input") if spec.output_part == "all" else ("input", "output")
            raise TopoplanError(
                f"{spec.name} of {nranks} ranks: input of {n_in} and output of {n_out} "
                f"elements; expected an {whole} of nranks ({nranks}) times the {part}'s "
                "elements")
        return full

    # -- compile and bind ------------------------------------------------------
    def compiled(self, n: int) -> Program:
        """The rank's program for an ``n``-element buffer (cached)."""
        plan = self._compiled.get(n)
        if plan is None:
            plan = self._compiled[n] = compile_program(self.schedule, self.rank, n, self._tags)
        return plan

    def _bind(self, *buffers: Any) -> tuple[BoundProgram, ArrayOps]:
        ops = array_ops(buffers[0])
        flats = [ops.flat(b) for b in buffers]
        flat = flats[0]
        dtype = ops.dtype(flat)
        for other in buffers[1:]:
            if array_ops(other) is not ops or ops.dtype(ops.flat(other)) != dtype:
                raise TopoplanError(
                    f"{self.spec.name}: input and output must be arrays of one kind and "
                    f"dtype, got {ops.kind} {dtype} and {array_ops(other).kind} "
                    f"{array_ops(other).dtype(other)}")
        shadow = self.accumulate_fp32 and self.spec.reduces and dtype in ("float16", "bfloat16")
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
        transport = self.transport

        def native(step: NativePlan, view: Any) -> Any:
            op = step.op
            return transport.native(Collective(op.kind.value, op.group, step.index, view,
                                               step.parts, step.root,
                                               lambda k: ops.empty(k, view)))

        steps = bind_steps(plan, work, scratch, transport.prepare,
                           self._epochs * (LANES if self._laned else 1), native)
        bound = BoundProgram(steps, buffers, work, scratch, copy_in, copy_out, plan.channels)
        self._bound[key] = bound
        while len(self._bound) > BOUND_CACHE:
            self._bound.popitem(last=False)
        return bound, ops

    # -- calls in flight --------------------------------------------------------
    def _start(self, *buffers: Any) -> Handle:
        """Start a call on ``buffers`` (the last one is the result); returns at once."""
        bound, ops = self._bind(*buffers)
        queue = self._queue
        with queue.lock:
            for other in queue.calls:
                if other._bound is bound:
                    raise TopoplanError(
                        f"rank {self.rank}: this buffer already has an {self.spec.name} in "
                        f"flight (call {other.call}); wait for it before starting another")
            call = self._calls
            self._calls = call + 1
            handle = Handle(self, buffers[-1], bound, ops, call, call % self._epochs,
                                     self._lane_of(queue.lane()))
            if self._concurrent(bound):
                handle._cursors = self._cursors(bound)
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

    def _concurrent(self, bound: BoundProgram) -> bool:
        """Whether a call on ``bound`` runs its channels at once (it has several, and the
        transport lets them: see the module docstring)."""
        return len(bound.channels) > 1 and self._channel_mode != "serial"

    @staticmethod
    def _cursors(bound: BoundProgram) -> list[Cursor]:
        return [Cursor(c, first, end) for c, first, end in bound.channels]

    def _lane_of(self, lane: int) -> int:
        """The lane a call of this executor runs in: its turn's, or 0 when unlaned."""
        return lane if self._laned else 0

    def _can_begin(self, handle: Handle) -> bool:
        """Whether ``handle`` may begin beside every call started before it that is
        still running: never on an untagged or unpollable transport, nor with a call
        whose schedule has native steps over a group this one's has (collectives carry
        no tags: every member must issue them in one order); with a call of this
        executor when their epochs (tags) and scratch differ; with another executor's
        when both are laned and their lanes differ."""
        transport = self.transport
        for other in self._queue.calls:
            if other is handle:
                return True
            if other.done:
                continue
            if not transport.tagged or not transport.pollable:
                return False
            if self.groups and not self.groups.isdisjoint(other._owner.groups):
                return False
            if other._owner is self:
                if (handle.call - other.call >= self._epochs
                        or other._bound.scratch is handle._bound.scratch):
                    return False
            elif not (self._laned and other._owner._laned) or other.lane == handle.lane:
                return False
        return True  # pragma: no cover - a handle is in its queue until it is done

    def _advance(self, h: Handle, *, block: bool) -> bool:
        """Run ``h`` as far as it goes (``block``: to the end); whether it moved."""
        if not h._begun:
            if not self._can_begin(h):
                return False
            h._begun = True
            if self._stale:
                self._drain(h.call)
            for dst, src in h._bound.copy_in:
                h._ops.copy(dst, src)
            if self.trace is not None and h._cursors is None:
                h._ends = [time.perf_counter()]
        if h._cursors is not None:
            return self._advance_channels(h, h._cursors, block=block)
        transport, steps = self.transport, h._bound.steps
        moved = False
        try:
            with transport.compute_context():
                while h._step < len(steps):
                    step = steps[h._step]
                    work = step.native
                    if work is not None:
                        if h._posted is None:
                            work.start()
                            h._posted = work
                            h._deadline = time.monotonic() + self.timeout
                            moved = True
                        if block:
                            done = work.wait(max(0.0, h._deadline - time.monotonic()))
                        elif not transport.pollable:
                            return moved  # it moves in wait()
                        elif work.test():
                            done = True
                        elif time.monotonic() >= h._deadline:
                            done = work.wait(0.0)
                        else:
                            return moved
                        if not done:
                            work.abort()
                            self._leave_behind(steps[h._step:], h.call, h.epoch, h.lane)
                            raise self._native_error(step, None)
                        work.finish()
                        h._posted = None
                        h._step += 1
                        if h._ends is not None:
                            h._ends.append(time.perf_counter())
                        moved = True
                        continue
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
                    for dst, src in step.copies:  # vectored recvs (IR v4)
                        h._ops.copy(dst, src)
                    h._posted = None
                    h._step += 1
                    if h._ends is not None:
                        h._ends.append(time.perf_counter())
                    moved = True
                for dst, src in h._bound.copy_out:
                    h._ops.copy(dst, src)
                if h._ends is not None and self.trace is not None:
                    self.trace.add(h._bound, h._ends)
        except PeerFailure as exc:
            step = steps[h._step]
            if step.native is not None:
                step.native.abort()
                h._error = self._native_error(step, exc.reason)
            else:
                transport.abort(h._posted)
                h._error = self._error(step, [exc.index], exc.reason)
            self._leave_behind(steps[h._step:], h.call, h.epoch, h.lane)
        except TransportError as exc:
            h._error = exc
        h.done = True
        self._queue.calls.remove(h)
        return True

    def _advance_channels(self, h: Handle, cursors: list[Cursor], *, block: bool) -> bool:
        """:meth:`_advance` for a call that runs its channels at once."""
        moved = False
        try:
            with self.transport.compute_context():
                if self._channel_mode == "poll":
                    moved = self._poll(cursors, h._bound, h._ops, h.call, h.epoch, h.lane,
                                       block=block)
                elif block:
                    self._threads(cursors, h._bound, h._ops, h.call, h.epoch, h.lane)
                else:
                    return False  # on threads, in wait()
                if any(cur.at < cur.end for cur in cursors):
                    return moved
                for dst, src in h._bound.copy_out:
                    h._ops.copy(dst, src)
        except TransportError as exc:
            h._error = exc
        h.done = True
        self._queue.calls.remove(h)
        return True

    # -- channels at once ----------------------------------------------------------
    def _post(self, cur: Cursor, step: BoundStep, ops: ArrayOps, epoch: int, lane: int) -> None:
        """Start ``step`` of channel ``cur``: its native collective, or its snapshots and
        messages (batched once per lane and epoch)."""
        work = step.native
        if work is not None:
            work.start()
            cur.posted = work
        else:
            for dst, src in step.snapshots:
                ops.copy(dst, src)
            slot = lane * self._epochs + epoch
            batch = step.batches[slot]
            if batch is None:
                batch = step.batches[slot] = self.transport.batch(
                    self._messages(step, epoch, lane))
            cur.posted = self.transport.start(batch)
        cur.deadline = time.monotonic() + self.timeout

    def _poll(self, cursors: list[Cursor], bound: BoundProgram, ops: ArrayOps, call: int,
              epoch: int, lane: int, *, block: bool) -> bool:
        """Move every channel of a call on a pollable transport: post each channel's
        current step, test each, and on completion finish it and post the channel's next
        (``block``: until every channel is done, waiting in ``wait_any`` when none moved;
        else as far as they go without waiting). Whether anything moved.

        Raises
        ------
        TransportError
            A channel's step failed or timed out (every channel's posted step is
            aborted and its receives from there on are left behind first).
        """
        transport, steps = self.transport, bound.steps
        clock = time.monotonic
        moved = False
        while True:
            progressed = False
            running = 0
            cur: Cursor | None = None
            try:
                # Every channel's next step is posted before any is tested: on MPI an
                # idle Test may give the CPU away, with the other channels' sends unsent.
                for cur in cursors:
                    if cur.posted is None and cur.at < cur.end:
                        self._post(cur, steps[cur.at], ops, epoch, lane)
                        progressed = True
                for cur in cursors:
                    if cur.at == cur.end:
                        continue
                    step = steps[cur.at]
                    work = step.native
                    if work is not None:
                        if not work.test():
                            if clock() < cur.deadline:
                                running += 1
                                continue
                            if not work.wait(0.0):
                                self._fail(cursors, bound, call, epoch, lane)
                                raise self._native_error(step, None)
                        work.finish()
                    else:
                        if not transport.test(cur.posted) and clock() < cur.deadline:
                            running += 1
                            continue
                        pending = transport.wait(cur.posted, 0.0)
                        if pending:
                            self._fail(cursors, bound, call, epoch, lane)
                            raise self._error(step, pending, None)
                        for dst, src in step.reduces:
                            ops.add(dst, src)
                        for dst, src in step.copies:  # vectored recvs (IR v4)
                            ops.copy(dst, src)
                    cur.posted = None
                    cur.at += 1
                    progressed = True
                    if cur.at < cur.end:
                        running += 1
            except PeerFailure as exc:
                assert cur is not None  # set by the loop that raised
                step = steps[cur.at]
                self._fail(cursors, bound, call, epoch, lane)
                if step.native is not None:
                    raise self._native_error(step, exc.reason) from None
                raise self._error(step, [exc.index], exc.reason) from None
            moved |= progressed
            if not running or (not block and not progressed):
                return moved
            if not progressed:
                waiting = [c for c in cursors if c.at < c.end]
                tests: list[Callable[[], bool]] = [
                    c.posted.test if steps[c.at].native is not None
                    else partial(transport.test, c.posted) for c in waiting]
                left = min(c.deadline for c in waiting) - clock()
                transport.wait_any(tests, max(0.0, left))

    def _fail(self, cursors: list[Cursor], bound: BoundProgram, call: int, epoch: int,
              lane: int) -> None:
        """After a channel failed: give up every channel's posted step, and leave behind
        each channel's receives from its current step on."""
        for cur in cursors:
            if cur.posted is not None:
                try:
                    if bound.steps[cur.at].native is not None:
                        cur.posted.abort()
                    else:
                        self.transport.abort(cur.posted)
                except Exception:  # noqa: BLE001 - best effort after a failure
                    pass
                cur.posted = None
        self._leave_channels(cursors, bound, call, epoch, lane)

    def _leave_channels(self, cursors: list[Cursor], bound: BoundProgram, call: int,
                        epoch: int, lane: int) -> None:
        for cur in cursors:
            if cur.at < cur.end:
                self._leave_behind(bound.steps[cur.at:cur.end], call, epoch, lane)

    def _threads(self, cursors: list[Cursor], bound: BoundProgram, ops: ArrayOps, call: int,
                 epoch: int, lane: int) -> None:
        """Run every channel of a call to the end on a transport that cannot be polled:
        channel ``cursors[0]`` on this thread, each other on a thread of the executor's
        pool, each waiting on its own steps (see the module docstring).

        Raises
        ------
        TransportError
            The first failed channel's error (in channel order), once every channel has
            stopped and left its receives behind.
        """
        pool = self._pool
        if pool is None:
            pool = self._pool = ThreadPoolExecutor(
                max_workers=max(1, len(self._tags) - 1),
                thread_name_prefix=f"topoplan-channel-r{self.rank}")
        stop = threading.Event()
        futures = [pool.submit(self._run_channel, cur, bound, ops, epoch, lane, stop)
                   for cur in cursors[1:]]
        errors: list[BaseException] = []
        try:
            self._run_channel(cursors[0], bound, ops, epoch, lane, stop)
        except BaseException as exc:  # noqa: BLE001 - raised below, once every channel stopped
            errors.append(exc)
        for future in futures:
            failure = future.exception()  # waits for the channel
            if failure is not None:
                errors.append(failure)
        if errors:
            self._leave_channels(cursors, bound, call, epoch, lane)
            raise errors[0]  # in channel order (a stopped channel raises nothing)

    def _run_channel(self, cur: Cursor, bound: BoundProgram, ops: ArrayOps, epoch: int,
                     lane: int, stop: threading.Event) -> None:
        """Run channel ``cur``'s steps one after another, waiting on each; stop before the
        next step once ``stop`` is set (another channel failed), and set it on failure."""
        transport, steps, timeout = self.transport, bound.steps, self.timeout
        try:
            while cur.at < cur.end and not stop.is_set():
                step = steps[cur.at]
                work = step.native
                if work is not None:
                    try:
                        done = work.run(timeout)
                    except PeerFailure as exc:
                        work.abort()
                        raise self._native_error(step, exc.reason) from None
                    if not done:
                        work.abort()
                        raise self._native_error(step, None)
                    work.finish()
                else:
                    self._post(cur, step, ops, epoch, lane)
                    handle, cur.posted = cur.posted, None
                    try:
                        pending = transport.wait(handle, timeout)
                    except PeerFailure as exc:
                        transport.abort(handle)
                        raise self._error(step, [exc.index], exc.reason) from None
                    if pending:
                        transport.abort(handle)
                        raise self._error(step, pending, None)
                    for dst, src in step.reduces:
                        ops.add(dst, src)
                    for dst, src in step.copies:  # vectored recvs (IR v4)
                        ops.copy(dst, src)
                cur.at += 1
        except BaseException:
            stop.set()
            raise

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

    def _run(self, bound: BoundProgram, ops: ArrayOps, lane: int) -> None:
        call = self._calls
        self._calls = call + 1
        if self._stale:
            self._drain(call)
        epoch = call % self._epochs
        slot = lane * self._epochs + epoch
        add, copy = ops.add, ops.copy
        for dst, src in bound.copy_in:
            copy(dst, src)
        if self._concurrent(bound):
            cursors = self._cursors(bound)
            if self._channel_mode == "poll":
                self._poll(cursors, bound, ops, call, epoch, lane, block=True)
            else:
                self._threads(cursors, bound, ops, call, epoch, lane)
            for dst, src in bound.copy_out:
                copy(dst, src)
            return
        transport, timeout = self.transport, self.timeout
        trace = self.trace
        ends = [time.perf_counter()] if trace is not None else None
        for s, step in enumerate(bound.steps):
            work = step.native
            if work is not None:
                try:
                    done = work.run(timeout)
                except PeerFailure as exc:
                    work.abort()
                    self._leave_behind(bound.steps[s:], call, epoch, lane)
                    raise self._native_error(step, exc.reason) from None
                if not done:
                    work.abort()
                    self._leave_behind(bound.steps[s:], call, epoch, lane)
                    raise self._native_error(step, None)
                work.finish()
                if ends is not None:
                    ends.append(time.perf_counter())
                continue
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
            for dst, src in step.copies:  # vectored recvs (IR v4)
                copy(dst, src)
            if ends is not None:
                ends.append(time.perf_counter())
        for dst, src in bound.copy_out:
            copy(dst, src)
        if ends is not None:
            trace.add(bound, ends)

    # -- epochs -------------------------------------------------------------------
    def _shift(self, epoch: int, lane: int) -> int:
        """What the tags of a call in ``epoch`` and ``lane`` are offset by."""
        return tag_shift(epoch, lane, self._tag_shift)

    def _messages(self, step: BoundStep, epoch: int, lane: int) -> list[Message]:
        """The step's messages with the tags of ``epoch`` in ``lane``."""
        shift = self._shift(epoch, lane)
        if shift == 0:
            return step.messages
        return [Message(m.send, m.wire, m.peer, (m.tag + shift) % TAG_LIMIT)
                for m in step.messages]

    def _leave_behind(self, steps: Sequence[BoundStep], call: int, epoch: int,
                      lane: int) -> None:
        """Note the receives of a failed call from its failed step on: their messages may
        still come, and must be dropped before their tags come round again."""
        if self._epochs == 1:
            return
        shift = self._shift(epoch, lane)
        # extend: channel threads may leave theirs at once (one call, atomic).
        self._stale.extend([(call, m.peer, (m.tag + shift) % TAG_LIMIT)
                            for step in steps for m in step.messages if not m.send])

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

    def _where(self, step: BoundStep) -> str:
        """``step 2``, or ``channel 1 step 2`` when the schedule has several channels."""
        if self.channelled:
            return f"channel {step.channel} step {step.index}"
        return f"step {step.index}"

    def _native_error(self, step: BoundStep, reason: str | None) -> TransportError:
        """``rank 3 step 2: native reduce_scatter over {2, 3} of chunks 0..3
        (MPI_Ireduce_scatter_block) timed out after 2 s: ...``."""
        plan = step.what
        assert plan is not None  # a native step has its plan
        if reason is None:
            why = (f"timed out after {self.timeout:g} s: a member of the group died, hangs, "
                   "or runs a different schedule")
        else:
            why = f"failed: {reason}"
        return TransportError(
            f"rank {self.rank} {self._where(step)}: {plan.what()} ({step.native.call}, "
            f"{self.transport.name} {self.schedule.algorithm} {self.spec.name}) {why}",
            rank=self.rank, step=step.index, chunk=plan.op.chunk, channel=step.channel)

    def _error(self, step: BoundStep, indices: Sequence[int], reason: str | None) -> TransportError:
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
            f"rank {self.rank}: {self.transport.name} {self.schedule.algorithm} {self.spec.name}, "
            f"{self._where(step)}: {what}{more} {why}",
            rank=self.rank, step=step.index, peer=blamed.peer, chunk=blamed.chunk,
            channel=step.channel)
