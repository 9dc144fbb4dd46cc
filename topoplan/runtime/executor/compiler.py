"""The per-rank compiler: a schedule -> one rank's program -> its steps on a buffer.

:func:`compile_program` turns the calling rank's part of a schedule, for a buffer of
``n`` elements, into flat step lists (:class:`Program`): element ranges of each chunk,
messages with their sequence tags, and slots of one reusable scratch arena for the data
that must not land in the user's buffer directly (see :mod:`topoplan.runtime.executor` for the
semantics they keep). :func:`bind_steps` then lays a program over a work buffer and a
scratch arena: buffer views, and the transport's wires for them, made once.

Channels (IR v4): a rank's program is compiled channel by channel
(:meth:`~topoplan.ir.schedule.Schedule.channel_steps`), each channel's steps one after
another in :attr:`Program.steps` (channel 0's first) with :attr:`Program.channels`
saying where each channel's run of steps lies, and a scratch region of its own, so
channels can run at the same time. Sequence numbers count per (peer, channel): the
k-th message of a pair on channel ``c`` matches the k-th at the peer on channel ``c``,
and is tagged ``offset[c] + k``, where channel ``c``'s tags start after the most
messages any pair sends on the channels below it (:func:`channel_tags`). So the tags
of different channels never meet, and :func:`pair_span` (what epochs and lanes shift
by) is the sum of the channels' spans; without channels it is what it always was.
When a call's tags do not fit below :data:`~topoplan.runtime.transports.base.TAG_LIMIT`
they wrap, as before, and channels may then share tags: the executor runs such a
program's channels one after another, which non-overtaking keeps correct (every rank
posts all of a pair's channel-``c`` messages before any of channel ``c + 1``'s).

A native step (IR v3) compiles to a :class:`NativePlan`: the element range of its chunks
and the offsets of its parts in it (reduce-scatter, allgather: part ``i`` is member
``group[i]``'s, ``count / len(group)`` chunks, so parts differ in elements when the
chunks' fractions do). :func:`native_groups` checks a schedule's native ops against the
transport and lists their groups in the order every rank makes them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable

from ...errors import ScheduleError
from ...ir.schedule import Native, OpKind, Schedule, chunk_text, ranges_text
from ..transports.base import TAG_LIMIT, Group, Message

__all__ = ["Span", "MessagePlan", "NativePlan", "StepPlan", "Program", "BoundStep",
           "BoundProgram", "ChannelRun", "pair_span", "channel_tags", "native_groups",
           "compile_program", "bind_steps"]

Span = tuple[int, int]  # elements [start, end) of the buffer an op carries
#: A channel's run of steps in a program: (channel, first index, one past the last).
ChannelRun = tuple[int, int, int]


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
    more: tuple[tuple[int, int], ...] = ()  # a vectored message's further ranges (IR v4)

    def what(self) -> str:
        chunks = ranges_text(((self.chunk, self.count),) + self.more)
        return f"send of {chunks} to" if self.send else f"recv of {chunks} from"


@dataclass(slots=True)
class NativePlan:
    """A compiled native step: ``op`` over elements ``span``, cut at ``parts``."""

    op: Native
    span: Span
    parts: tuple[int, ...]  # len(group) + 1 offsets into span (parted kinds), else (0, len)
    index: int              # this rank's place in op.group
    root: int | None        # the root's place in op.group (broadcast, reduce)

    def what(self) -> str:
        return f"native {self.op.text()}"


@dataclass(slots=True)
class StepPlan:
    """A compiled step that moves data: messages, or one native collective."""

    messages: list[MessagePlan]
    snapshots: list[tuple[Span, tuple[int, int]]]  # span -> scratch slot, copied at step start
    reduces: list[tuple[Span, tuple[int, int]]]    # span += scratch slot, after the wait
    native: NativePlan | None = None
    channel: int = 0
    copies: list[tuple[Span, tuple[int, int]]] = field(default_factory=list)
    # span = scratch slot, after the wait (a vectored recv that overwrites, IR v4)


@dataclass(slots=True)
class Program:
    """A rank's program for an ``n``-element buffer (:func:`compile_program`)."""

    n: int
    bounds: list[tuple[int, int]]
    steps: list[StepPlan]      # only steps that move data, channel by channel
    step_index: list[int]      # the schedule's step number of each entry in ``steps``
    scratch: int               # elements of scratch the rank needs (every channel's own)
    channels: list[ChannelRun] = field(default_factory=list)  # where each channel's steps lie


@dataclass(slots=True)
class BoundStep:
    """A step laid over buffers: views, and the transport's messages on them."""

    index: int
    snapshots: list[tuple[Any, Any]]  # (scratch view, chunk view)
    messages: list[Message]
    plans: list[MessagePlan]
    reduces: list[tuple[Any, Any]]    # (chunk view, scratch view)
    batches: list[Any] = field(default_factory=list)  # per lane and epoch: transport.batch(...)
    native: Any = None                # a native step: its NativeWork (transport.native(...))
    what: NativePlan | None = None    # ... and its plan, for errors
    channel: int = 0
    copies: list[tuple[Any, Any]] = field(default_factory=list)  # (chunk view, scratch view)


@dataclass(slots=True)
class BoundProgram:
    """A program bound to a call's buffers (cached per buffer address by the executor)."""

    steps: list[BoundStep]
    keep: Any            # the buffers, kept alive so the cached addresses stay valid
    work: Any            # what the steps run on: the flat buffer, its fp32 shadow, or a copy
    scratch: Any
    copy_in: list[tuple[Any, Any]]   # (dst, src) before the first step: user data -> work
    copy_out: list[tuple[Any, Any]]  # (dst, src) after the last step: work -> user data
    channels: list[ChannelRun] = field(default_factory=list)  # the program's channel runs


def channel_tags(schedule: Schedule) -> dict[int, tuple[int, int]]:
    """Each channel's tags in a call: ``{channel: (offset, span)}``, its messages tagged
    ``offset .. offset + span - 1``, ``span`` the most messages one ordered pair of ranks
    exchanges on it (at least 1), the channels' ranges laid end to end in channel order
    (the same on every rank: it is the schedule's, not the rank's). Channels no op
    names get none. Without channels: ``{0: (0, pair_span)}``."""
    counts: dict[tuple[int, int, int], int] = {}
    channels = {0}
    for rank, _, op in schedule.ops():
        if isinstance(op, Native):
            continue  # channel 0, no tags
        if op.kind is OpKind.SEND:
            key = (op.channel, rank, op.peer)
            counts[key] = counts.get(key, 0) + 1
        elif op.channel:
            channels.add(op.channel)
    spans: dict[int, int] = {c: 1 for c in channels}
    for (c, _, _), k in counts.items():
        spans[c] = max(spans.get(c, 1), k)
    out, offset = {}, 0
    for c in sorted(spans):
        out[c] = (offset, spans[c])
        offset += spans[c]
    return out


def pair_span(schedule: Schedule) -> int:
    """The tags one call uses on an ordered pair of ranks (at least 1): the most messages
    one pair exchanges, summed over the channels (:func:`channel_tags`)."""
    return sum(span for _, span in channel_tags(schedule).values())


def native_groups(schedule: Schedule, nranks: int, transport: str = "transport") -> list[Group]:
    """The groups of ``schedule``'s native ops, checked, in the order every rank makes
    their sub-communicators: by first appearance, rank by rank, step by step (the same
    list on every rank, members or not). Groups of one rank need none and are left out.

    A schedule read from a file was checked when read; one built in Python was not, so
    this checks what running it needs: members in ``range(nranks)`` (the transport's
    size, named ``transport``) and distinct, the rank in its group, the op alone in its
    step, its chunks in range, a count that splits into the group's parts, and a root in
    the group where the kind has one.

    Raises
    ------
    ScheduleError
        Naming the rank, step and op: ``rank 3 step 2: native reduce_scatter over
        {2, 5} of chunks 0..3: group names rank 5, but the mpi transport has 4 ranks``.
    """
    groups: dict[Group, None] = {}
    for program in schedule.ranks:
        for s, step in enumerate(program.steps):
            for op in step:
                if not isinstance(op, Native):
                    continue
                problem = _native_problem(op, program.rank, len(step), schedule.nchunks, nranks,
                                          transport)
                if problem:
                    raise ScheduleError(f"rank {program.rank} step {s}: native {op.text()}: "
                                        f"{problem}")
                if len(op.group) > 1:
                    groups.setdefault(op.group, None)
    return list(groups)


def _native_problem(op: Native, rank: int, step_ops: int, nchunks: int, nranks: int,
                    transport: str) -> str | None:
    """What keeps ``op`` (in ``rank``'s step of ``step_ops`` ops) from running, or None."""
    outside = [m for m in op.group if not 0 <= m < nranks]
    if outside:
        return (f"group names rank {outside[0]}, but the {transport} has {nranks} rank"
                f"{'s' if nranks != 1 else ''}")
    if not op.group or len(set(op.group)) != len(op.group):
        return "a group names distinct ranks, at least one"
    if rank not in op.group:
        return f"rank {rank} is not in the group"
    if step_ops != 1:
        return f"a native op stands alone in its step; this step has {step_ops} ops"
    if op.count < 1 or not 0 <= op.chunk or op.chunk + op.count > nchunks:
        return f"the chunk range is outside the schedule's {nchunks} chunks"
    if op.kind.parted and op.count % len(op.group):
        return (f"count {op.count} does not split into {len(op.group)} equal parts, one per "
                "member")
    if op.kind.rooted and op.root not in op.group:
        return f"root {op.root!r} is not in the group"
    if not op.kind.rooted and op.root is not None:
        return f"a native {op.kind.value} has no root (got {op.root!r})"
    return None


def _native_plan(op: Native, rank: int, bounds: list[tuple[int, int]]) -> NativePlan | None:
    """``op``'s compiled form over chunk element ``bounds``; None when it moves nothing
    (an empty range, a group of one), on every member alike."""
    start, end = bounds[op.chunk][0], bounds[op.end - 1][1]
    if start == end or len(op.group) == 1:
        return None
    if op.kind.parted:
        cuts = [op.part(i)[0] for i in range(len(op.group))] + [op.end]
        parts = tuple(bounds[c][0] - start if c < op.end else end - start for c in cuts)
    else:
        parts = (0, end - start)
    root = op.group.index(op.root) if op.root is not None else None
    return NativePlan(op, (start, end), parts, op.group.index(rank), root)


def compile_program(schedule: Schedule, rank: int, n: int,
                    tags: dict[int, tuple[int, int]] | None = None) -> Program:
    """``rank``'s program of ``schedule`` for a buffer of ``n`` elements.

    A send that overlaps a chunk range a receive of its step overwrites goes out of a
    snapshot; a reducing receive lands in a scratch slot of its own and is added after
    the wait; everything else moves the buffer's views directly. Empty pieces are
    skipped (both ends skip them) but still count for the pair's tags. A native step
    is a step of its own (:class:`NativePlan`); one that moves nothing is skipped by
    every member alike. Channels (IR v4) compile one after another, each with its own
    tags (``tags``: :func:`channel_tags` of the schedule, computed when not given) and
    its own region of scratch; see the module docstring.
    """
    bounds = schedule.chunk_bounds(n)
    if tags is None:
        tags = channel_tags(schedule)
    steps: list[StepPlan] = []
    step_index: list[int] = []
    runs: list[ChannelRun] = []
    base = 0  # where the channel's scratch starts: after the channels before it
    for channel, channel_steps in schedule.channel_steps(rank).items():
        first = len(steps)
        base = _compile_channel(rank, channel, channel_steps, bounds, tags[channel][0], base,
                                steps, step_index)
        if len(steps) > first:
            runs.append((channel, first, len(steps)))
    return Program(n, bounds, steps, step_index, base, runs)


def _compile_channel(rank: int, channel: int, channel_steps: list[tuple[int, Any]],
                     bounds: list[tuple[int, int]], tag0: int, base: int,
                     steps: list[StepPlan], step_index: list[int]) -> int:
    """Compile one channel's steps onto ``steps`` and ``step_index``, its messages tagged
    from ``tag0`` on and its scratch from ``base``; returns where its scratch ends."""
    seq_out: dict[int, int] = {}
    seq_in: dict[int, int] = {}
    scratch = base
    for s, ops in channel_steps:
        # Chunk ranges overwritten by this step's recvs: a send that overlaps one must
        # carry the value from the step's start, so it goes out of a snapshot.
        # (Recv ranges of a step are disjoint, so sorted by start their ends sort too.)
        overwritten = sorted((a, a + c) for op in ops
                             if op.kind is OpKind.RECV and not op.reduce for a, c in op.ranges)
        ow_starts = [a for a, _ in overwritten]
        offset = base
        snap_slot: dict[Span, tuple[int, int]] = {}
        messages: list[MessagePlan] = []
        snapshots: list[tuple[Span, tuple[int, int]]] = []
        reduces: list[tuple[Span, tuple[int, int]]] = []
        copies: list[tuple[Span, tuple[int, int]]] = []
        if ops and isinstance(ops[0], Native):
            plan = _native_plan(ops[0], rank, bounds)
            if plan is not None:
                steps.append(StepPlan([], [], [], plan, channel))
                step_index.append(s)
            continue
        for op in ops:
            if isinstance(op, Native):  # pragma: no cover - native_groups refuses it
                raise ScheduleError(f"rank {rank} step {s}: a native op stands alone in its "
                                    "step")
            # Tags count every message on the pair, empty or not, so both ends agree.
            counter = seq_out if op.kind is OpKind.SEND else seq_in
            seq = counter.get(op.peer, 0)
            counter[op.peer] = seq + 1
            if op.more:  # a vectored message (IR v4): its ranges packed in one slot
                offset = _vectored(op, bounds, offset, snapshots, reduces, copies,
                                   messages, (tag0 + seq) % TAG_LIMIT)
                continue
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
                                        span, (tag0 + seq) % TAG_LIMIT, op.reduce, slot))
        scratch = max(scratch, offset)
        # Receives first (a stable sort keeps each pair's order): a send then finds
        # its receive already posted, which saves a copy in MPI and gloo.
        messages.sort(key=lambda m: m.send)
        if messages:
            steps.append(StepPlan(messages, snapshots, reduces, None, channel, copies))
            step_index.append(s)
    return scratch


def _vectored(op: Any, bounds: list[tuple[int, int]], offset: int, snapshots: list,
              reduces: list, copies: list, messages: list[MessagePlan], tag: int) -> int:
    """Compile a vectored op (IR v4) onto its step's lists; returns the next free scratch.

    The message is one scratch slot holding the op's ranges back to back, in range
    order (both ends name the same ranges, so they agree on the layout). A send packs
    its ranges into the slot when its step starts (snapshots: the values at the step's
    start, as every send carries); a recv lands in the slot and, after the wait, adds
    (``reduces``) or copies (``copies``) each part into its range. Empty ranges take no
    room; a message whose ranges are all empty is skipped by both ends (its tag still
    counted by the caller).
    """
    pieces = [(bounds[a][0], bounds[a + c - 1][1]) for a, c in op.ranges]
    length = sum(end - start for start, end in pieces)
    if length == 0:
        return offset
    slot = (offset, offset + length)
    into = snapshots if op.kind is OpKind.SEND else reduces if op.reduce else copies
    at = offset
    for start, end in pieces:
        if end > start:
            into.append(((start, end), (at, at + end - start)))
            at += end - start
    messages.append(MessagePlan(op.kind is OpKind.SEND, op.peer, op.chunk, op.count,
                                (pieces[0][0], pieces[-1][1]), tag, op.reduce, slot, op.more))
    return offset + length


def bind_steps(program: Program, work: Any, scratch: Any, prepare: Callable[[Any], Any],
               batches: int, native: Callable[[NativePlan, Any], Any] | None = None
               ) -> list[BoundStep]:
    """``program``'s steps over the ``work`` buffer and the ``scratch`` arena.

    Every range and scratch slot gets one view and one wire (``prepare``, the transport's
    :meth:`~topoplan.runtime.transports.Transport.prepare`), however many messages use it; each
    step keeps ``batches`` empty places for the transport's batches (one per lane and
    epoch, made on first use). A native step gets its bound work from ``native(plan,
    view of its range)`` (the executor's wrapper of the transport's
    :meth:`~topoplan.runtime.transports.Transport.native`).
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
        if sp.native is not None:
            if native is None:  # pragma: no cover - the executor always passes it
                raise ScheduleError("bind_steps: a native step needs native=")
            a, b = sp.native.span
            steps.append(BoundStep(index, [], [], [], [], [], native(sp.native, work[a:b]),
                                   sp.native, sp.channel))
            continue
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
            [None] * batches, channel=sp.channel,
            copies=[(view_of(c), scratch[a:b]) for c, (a, b) in sp.copies]))
    return steps
