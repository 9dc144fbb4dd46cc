"""The per-rank compiler: a schedule -> one rank's program -> its steps on a buffer.

:func:`compile_program` turns the calling rank's part of a schedule, for a buffer of
``n`` elements, into flat step lists (:class:`Program`): element ranges of each chunk,
messages with their sequence tags, and slots of one reusable scratch arena for the data
that must not land in the user's buffer directly (see :mod:`topoplan.runtime.executor` for the
semantics they keep). :func:`bind_steps` then lays a program over a work buffer and a
scratch arena: buffer views, and the transport's wires for them, made once.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import ScheduleError
from ...ir.schedule import Native, OpKind, Schedule, chunk_text
from ..transports.base import TAG_LIMIT, Message

__all__ = ["Span", "MessagePlan", "StepPlan", "Program", "BoundStep", "BoundProgram",
           "pair_span", "compile_program", "bind_steps"]

Span = tuple[int, int]  # elements [start, end) of the buffer an op carries


@dataclass(slots=True)
class MessagePlan:
    """One message of a compiled step: a send or a receive of ``span`` with ``peer``."""

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
class StepPlan:
    """A compiled step that moves data."""

    messages: list[MessagePlan]
    snapshots: list[tuple[Span, tuple[int, int]]]  # span -> scratch slot, copied at step start
    reduces: list[tuple[Span, tuple[int, int]]]    # span += scratch slot, after the wait


@dataclass(slots=True)
class Program:
    """A rank's program for an ``n``-element buffer (:func:`compile_program`)."""

    n: int
    bounds: list[tuple[int, int]]
    steps: list[StepPlan]      # only steps that move data
    step_index: list[int]      # the schedule's step number of each entry in ``steps``
    scratch: int               # elements of scratch the rank needs


@dataclass(slots=True)
class BoundStep:
    """A step laid over buffers: views, and the transport's messages on them."""

    index: int
    snapshots: list[tuple[Any, Any]]  # (scratch view, chunk view)
    messages: list[Message]
    plans: list[MessagePlan]
    reduces: list[tuple[Any, Any]]    # (chunk view, scratch view)
    batches: list[Any] = field(default_factory=list)  # per lane and epoch: transport.batch(...)


@dataclass(slots=True)
class BoundProgram:
    """A program bound to a call's buffers (cached per buffer address by the executor)."""

    steps: list[BoundStep]
    keep: Any            # the buffers, kept alive so the cached addresses stay valid
    work: Any            # what the steps run on: the flat buffer, its fp32 shadow, or a copy
    scratch: Any
    copy_in: list[tuple[Any, Any]]   # (dst, src) before the first step: user data -> work
    copy_out: list[tuple[Any, Any]]  # (dst, src) after the last step: work -> user data


def pair_span(schedule: Schedule) -> int:
    """The most messages one ordered pair of ranks exchanges in a call (at least 1)."""
    counts: dict[tuple[int, int], int] = {}
    for rank, _, op in schedule.ops():
        if op.kind is OpKind.SEND:
            key = (rank, op.peer)
            counts[key] = counts.get(key, 0) + 1
    return max(counts.values(), default=1)


def compile_program(schedule: Schedule, rank: int, n: int) -> Program:
    """``rank``'s program of ``schedule`` for a buffer of ``n`` elements.

    A send that overlaps a chunk range a receive of its step overwrites goes out of a
    snapshot; a reducing receive lands in a scratch slot of its own and is added after
    the wait; everything else moves the buffer's views directly. Empty pieces are
    skipped (both ends skip them) but still count for the pair's tags.
    """
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
            if isinstance(op, Native):
                raise ScheduleError(f"rank {rank}: the executor does not run native steps "
                                    f"yet ({op.text()})")
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
            messages.append(MessagePlan(op.kind is OpKind.SEND, op.peer, op.chunk, op.count,
                                        span, seq % TAG_LIMIT, op.reduce, slot))
        scratch = max(scratch, offset)
        # Receives first (a stable sort keeps each pair's order): a send then finds
        # its receive already posted, which saves a copy in MPI and gloo.
        messages.sort(key=lambda m: m.send)
        if messages:
            steps.append(StepPlan(messages, snapshots, reduces))
            step_index.append(s)
    return Program(n, bounds, steps, step_index, scratch)


def bind_steps(program: Program, work: Any, scratch: Any, prepare: Callable[[Any], Any],
               batches: int) -> list[BoundStep]:
    """``program``'s steps over the ``work`` buffer and the ``scratch`` arena.

    Every range and scratch slot gets one view and one wire (``prepare``, the transport's
    :meth:`~topoplan.runtime.transports.Transport.prepare`), however many messages use it; each
    step keeps ``batches`` empty places for the transport's batches (one per lane and
    epoch, made on first use).
    """
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
    for index, sp in zip(program.step_index, program.steps):
        messages = []
        for m in sp.messages:
            if m.slot is None:
                view = view_of(m.span)
                wire = wire_of("span", m.span, view)
            else:
                view = scratch[m.slot[0]:m.slot[1]]
                wire = wire_of("scratch", m.slot, view)
            messages.append(Message(m.send, wire, m.peer, m.tag))
        steps.append(BoundStep(
            index,
            [(scratch[a:b], view_of(c)) for c, (a, b) in sp.snapshots],
            messages, sp.messages,
            [(view_of(c), scratch[a:b]) for c, (a, b) in sp.reduces],
            [None] * batches))
    return steps
