"""The schedule IR: frozen dataclasses and their JSON form (docs/SCHEDULE.md).

A :class:`Schedule` says, for every rank, a list of steps; each step is a set of
point-to-point ops (``send``/``recv``) on numbered chunks of the buffer. The IR
imports nothing from planners or executors; passes return new schedules.

Version 2 (docs/SCHEDULE.md) adds to version 1 an op's ``count``, the number of
consecutive chunks it carries (``chunk .. chunk + count - 1``, contiguous in the
buffer, one message), and lets several *reducing* recvs of one chunk share a step.
A bandwidth-optimal allreduce moves every chunk to every rank, so with one chunk per
op (v1) it needs ``Omega(N^2)`` ops; with ranges a multi-level reduce-scatter needs
``O(N * sum of level sizes)``, and a direct (all-to-all) level pays one step latency
where a ring pays ``b - 1``. A schedule that uses neither is written as version 1,
so files that v1 readers can read stay v1.

Version 3 adds *native steps*: a step that holds one :class:`Native` op, a collective
(``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``) over a
group of ranks on a chunk range, which the transport's own library runs (NCCL, MPI,
torch.distributed) over a sub-communicator of the group. That is how a plan composes
with NCCL: the in-box steps are NCCL's, the fabric steps are planned (PowerAI DDL's
design). Native ops are a class of their own, not an :class:`Op` kind, so code written
for point-to-point ops fails loudly on them (no ``peer``) instead of misreading them.

Version 4 adds *channels*, as NCCL has: an op's ``channel`` (0 when absent). A rank's
ops of one channel, in step order, are that channel's program: its steps run in order,
and its step ``k`` waits only for its own step ``k - 1``, not for the other channels'
steps, so one channel's step latency hides behind another's transfer. Every chunk
belongs to one channel (all ops on it, at every rank, are of that channel), so the
channels of a rank never touch the same data and any interleaving of them computes the
same result. Messages pair within a channel. Native ops are on channel 0.

Version 4 also has *vectored messages*: an op's ``more`` ranges, after its first
(``chunk``, ``count``), so that one send (and its recv) carries several chunk ranges as
one message, their chunks concatenated in range order (:attr:`Op.ranges`). A shard
exchange then costs one op per peer, not one per shard. A send snapshots every range
when its step starts; a recv adds (``reduce``) or writes every range when its step
ends; a message's two ops name the same ranges. :func:`vectorize` merges a step's
messages to one peer into one.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import chain, repeat
from operator import attrgetter, is_
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from .collectives import (COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE, chunk_bounds, collective_of,
                          shard_chunks)
from .._files import atomic_write  # noqa: F401 - topoplan.ir.schedule.atomic_write, as before
from .._gc import no_gc
from ..errors import ScheduleError, TopoplanError

if TYPE_CHECKING:
    import numpy as np  # imported where used: import topoplan loads no numpy

__all__ = ["OpKind", "Op", "send", "recv", "vsend", "vrecv", "NativeKind", "Native", "native",
           "is_native", "RankProgram", "Schedule", "load_schedule",
           "loads_schedule", "chunk_bounds", "chunk_text", "recv_clash", "coalesce", "FORMAT",
           "VERSION", "VERSIONS", "vectorize", "split_vectored", "ranges_text", "fast_op"]

FORMAT = "topoplan-schedule"
VERSION = 4  #: the newest version written and read; versions 1 to 3 are read too
VERSIONS = (1, 2, 3, 4)
FRACTION_TOLERANCE = 1e-9


class OpKind(str, Enum):
    """An op's code, as written in the JSON."""

    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class Op:
    """One point-to-point op of a step.

    ``send`` transmits chunks ``chunk .. chunk + count - 1`` (their value at the start
    of the step) to ``peer`` as one message; ``recv`` receives them from ``peer`` and
    adds them (``reduce=True``) or overwrites. ``channel`` (IR v4) is the independent
    pipeline the op runs in (see the module docstring); 0 by default. ``more`` (IR v4,
    vectored messages) are further ``(chunk, count)`` ranges the same message carries
    after the first, non-overlapping and in increasing chunk order; ``()`` for a plain
    op. ``chunk``, ``count`` and ``end`` are the *first* range's: code that handles
    only one range must check ``more`` (or use :attr:`ranges`).
    """

    kind: OpKind
    peer: int
    chunk: int
    reduce: bool = False
    count: int = 1
    channel: int = 0
    more: tuple[tuple[int, int], ...] = ()

    @property
    def end(self) -> int:
        """One past the last chunk of the op's first range."""
        return self.chunk + self.count

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Every ``(chunk, count)`` range the op carries, in message order."""
        return ((self.chunk, self.count),) + self.more if self.more else (
            (self.chunk, self.count),)

    @property
    def total(self) -> int:
        """The chunks the op carries, over all its ranges."""
        return self.count + sum(c for _, c in self.more)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.kind.value, "peer": self.peer}
        if self.more:
            out["ranges"] = [[a, c] for a, c in self.ranges]
        else:
            out["chunk"] = self.chunk
            if self.count != 1:
                out["count"] = self.count
        if self.kind is OpKind.RECV:
            out["reduce"] = self.reduce
        if self.channel:
            out["channel"] = self.channel
        return out

    def chunk_text(self) -> str:
        """``"chunk 3"`` or ``"chunks 3..6"`` for messages (``"chunks 0..1 + 8..9"`` for
        a vectored op)."""
        if self.more:
            return ranges_text(self.ranges)
        return chunk_text(self.chunk, self.count)


def _fast_op_factory() -> Callable[..., Op]:
    """An ``Op`` constructor about 2x faster than ``Op(...)`` (which goes through the frozen
    dataclass's ``object.__setattr__`` per field): fills the slots directly, as the
    dataclass's own ``__setstate__`` does. Falls back to ``Op`` if ``Op`` has no slots.
    For the passes that make millions of ops (the planners' ``schedule_from_arrays``,
    :func:`vectorize`, :func:`split_vectored`)."""
    try:
        setters = [getattr(Op, f).__set__ for f in ("kind", "peer", "chunk", "reduce", "count",
                                                   "channel", "more")]
    except AttributeError:  # pragma: no cover - Op without slots
        return Op
    new = object.__new__
    set_kind, set_peer, set_chunk, set_reduce, set_count, set_channel, set_more = setters

    def make(kind: OpKind, peer: int, chunk: int, reduce: bool, count: int = 1,
             channel: int = 0, more: tuple[tuple[int, int], ...] = ()) -> Op:
        op = new(Op)
        set_kind(op, kind)
        set_peer(op, peer)
        set_chunk(op, chunk)
        set_reduce(op, reduce)
        set_count(op, count)
        set_channel(op, channel)
        set_more(op, more)  # a tuple of (chunk, count) tuples, as _ranges makes it
        return op

    if (make(OpKind.RECV, 1, 2, True, 3, 4, ((6, 1),))
            != Op(OpKind.RECV, 1, 2, True, 3, 4, ((6, 1),))):  # pragma: no cover - layout changed
        return Op
    return make


#: ``fast_op(kind, peer, chunk, reduce, count=1, channel=0, more=())``: an :class:`Op`
#: as ``Op(...)`` makes it, about twice as fast, for code that makes millions of them
#: (the planners' arrays, :func:`vectorize`, :func:`split_vectored`). The arguments are
#: not checked: ``more`` must be a tuple of ``(chunk, count)`` tuples of ints.
fast_op = _fast_op_factory()


def ranges_text(ranges: Sequence[tuple[int, int]]) -> str:
    """Several ranges in messages: ``"chunks 0..1 + 8 + 10..11"``; one as :func:`chunk_text`."""
    if len(ranges) == 1:
        return chunk_text(*ranges[0])
    return "chunks " + " + ".join(str(a) if c == 1 else f"{a}..{a + c - 1}" for a, c in ranges)


def chunk_text(first: int, count: int = 1) -> str:
    """Chunks ``first .. first + count - 1`` in messages: ``"chunk 3"`` or ``"chunks 3..6"``."""
    return f"chunk {first}" if count == 1 else f"chunks {first}..{first + count - 1}"


def send(peer: int, chunk: int, count: int = 1, channel: int = 0,
         more: Sequence[tuple[int, int]] = ()) -> Op:
    return Op(OpKind.SEND, peer, chunk, False, count, channel, _ranges(more))


def recv(peer: int, chunk: int, reduce: bool = False, count: int = 1, channel: int = 0,
         more: Sequence[tuple[int, int]] = ()) -> Op:
    return Op(OpKind.RECV, peer, chunk, reduce, count, channel, _ranges(more))


def _ranges(more: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """``more`` as a tuple of ``(chunk, count)`` tuples (from lists too)."""
    return tuple((a, c) for a, c in more) if more else ()


def vsend(peer: int, ranges: Sequence[tuple[int, int]], channel: int = 0) -> Op:
    """A send of several ``(chunk, count)`` ranges as one message (IR v4)."""
    (chunk, count), *more = ranges
    return send(peer, chunk, count, channel, more)


def vrecv(peer: int, ranges: Sequence[tuple[int, int]], reduce: bool = False,
          channel: int = 0) -> Op:
    """A recv of several ``(chunk, count)`` ranges as one message (IR v4)."""
    (chunk, count), *more = ranges
    return recv(peer, chunk, reduce, count, channel, more)


class NativeKind(str, Enum):
    """A native op's collective, as written in the JSON."""

    ALLREDUCE = "allreduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE = "reduce"

    @property
    def rooted(self) -> bool:
        """Broadcast and reduce have a root."""
        return self in (NativeKind.BROADCAST, NativeKind.REDUCE)

    @property
    def parted(self) -> bool:
        """Reduce-scatter and allgather cut their range into one part per member."""
        return self in (NativeKind.REDUCE_SCATTER, NativeKind.ALLGATHER)


@dataclass(frozen=True, slots=True)
class Native:
    """A collective over ``group`` on chunks ``chunk .. chunk + count - 1`` (IR v3).

    Every member of ``group`` runs the same op (same kind, group, range and root), alone
    in one of its steps; the k-th native op over a group at one member is the k-th at
    every other member. Values are read when the member's step starts and written when
    its step ends, and the op completes once every member has started its step (the
    rendezvous rule of point-to-point messages, over the whole group). With ``m`` the
    member at index ``i`` of ``group`` and ``g = len(group)``:

    - ``allreduce``: every member's range ends as the sum of the members' ranges;
    - ``reduce_scatter``: the range is cut into ``g`` parts of ``count / g`` chunks,
      in group order; part ``i`` of member ``i`` ends as the sum of the members' part
      ``i``; the other parts of each member keep their values;
    - ``allgather``: part ``j`` of every member ends as member ``j``'s part ``j``;
    - ``broadcast``: every member's range ends as ``root``'s;
    - ``reduce``: ``root``'s range ends as the sum; the others keep theirs.

    ``root`` is a rank of the group (broadcast and reduce only).
    """

    kind: NativeKind
    group: tuple[int, ...]
    chunk: int
    count: int = 1
    root: int | None = None

    @property
    def end(self) -> int:
        """One past the last chunk the op covers."""
        return self.chunk + self.count

    @property
    def channel(self) -> int:
        """Native ops run on channel 0 (IR v4)."""
        return 0

    @property
    def more(self) -> tuple[tuple[int, int], ...]:
        """A native op covers one range (no vectored ranges, IR v4)."""
        return ()

    def part(self, index: int) -> tuple[int, int]:
        """Chunks ``[start, end)`` of part ``index`` (reduce-scatter, allgather)."""
        size = self.count // len(self.group)
        return self.chunk + index * size, self.chunk + (index + 1) * size

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.kind.value, "group": list(self.group),
                               "chunk": self.chunk}
        if self.count != 1:
            out["count"] = self.count
        if self.root is not None:
            out["root"] = self.root
        return out

    def chunk_text(self) -> str:
        return chunk_text(self.chunk, self.count)

    def text(self) -> str:
        """``"reduce_scatter over {0, 1, 2, 3} of chunks 0..7"`` for messages."""
        root = f" from root {self.root}" if self.kind is NativeKind.BROADCAST else (
            f" to root {self.root}" if self.kind is NativeKind.REDUCE else "")
        return (f"{self.kind.value} over {{{', '.join(map(str, self.group))}}} of "
                f"{self.chunk_text()}{root}")


def native(kind: str | NativeKind, group: Iterable[int], chunk: int, count: int = 1,
           root: int | None = None) -> Native:
    """A :class:`Native` op (``kind`` by name or :class:`NativeKind`)."""
    return Native(NativeKind(kind), tuple(group), chunk, count, root)


def is_native(op: Op | Native) -> bool:
    """Whether ``op`` is a native collective (IR v3), not a send or recv."""
    return isinstance(op, Native)


Step = tuple["Op | Native", ...]


@dataclass(frozen=True, slots=True)
class RankProgram:
    """The steps one rank runs, in order."""

    rank: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Schedule:
    """A collective's schedule (IR v2: v1 plus chunk ranges).

    Attributes
    ----------
    nranks : int
    chunks : tuple of float
        Fractions of the buffer, positive, summing to 1.
    ranks : tuple of RankProgram
        ``ranks[r].rank == r``.
    collective : str
        What it computes: ``"allreduce"`` (the default), ``"reduce_scatter"`` or
        ``"allgather"`` (:mod:`topoplan.ir.collectives`, docs/SCHEDULE.md).
    meta : mapping
        Free-form: ``algorithm``, ``cluster``, planner notes. Not compared.
    """

    nranks: int
    chunks: tuple[float, ...]
    ranks: tuple[RankProgram, ...]
    collective: str = "allreduce"
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def nchunks(self) -> int:
        return len(self.chunks)

    @property
    def nsteps(self) -> int:
        """The most steps any rank runs."""
        return max((len(p.steps) for p in self.ranks), default=0)

    @property
    def nops(self) -> int:
        return sum(len(step) for p in self.ranks for step in p.steps)

    @property
    def nmessages(self) -> int:
        """Messages (sends; each pairs with one recv)."""
        return sum(op.kind is OpKind.SEND for p in self.ranks for step in p.steps for op in step)

    @property
    def nnative(self) -> int:
        """Native collective ops (IR v3), counted once per member."""
        return sum(isinstance(op, Native) for p in self.ranks for step in p.steps for op in step)

    @property
    def nchannels(self) -> int:
        """One more than the highest channel any op names (1 without channels)."""
        return 1 + max((op.channel for p in self.ranks for step in p.steps for op in step),
                       default=0)

    def channel_steps(self, rank: int) -> dict[int, list[tuple[int, Step]]]:
        """``rank``'s program split by channel (IR v4): for each channel it uses, its
        steps in order as ``(step index, ops of that channel in the step)``; steps with
        no op of the channel are left out. Without channels: ``{0: every step}``."""
        out: dict[int, list[tuple[int, Step]]] = {}
        for s, step in enumerate(self.ranks[rank].steps):
            if all(op.channel == 0 for op in step):
                out.setdefault(0, []).append((s, step))
                continue
            for c in sorted({op.channel for op in step}):
                out.setdefault(c, []).append((s, tuple(op for op in step if op.channel == c)))
        return dict(sorted(out.items()))

    @property
    def max_step_ops(self) -> int:
        """The most ops any rank posts in one step."""
        return max((len(step) for p in self.ranks for step in p.steps), default=0)

    @property
    def version(self) -> int:
        """The JSON version this schedule needs: 4 if an op is on a channel other than
        0 or carries several ranges (a vectored message), 3 if it has native steps, 2
        if an op carries a chunk range or a step has several recvs of one chunk (all
        reducing), else 1."""
        need = 1
        for program in self.ranks:
            for step in program.steps:
                recvs = []
                for op in step:
                    if op.channel:
                        return 4
                    if isinstance(op, Native):
                        need = 3
                        continue
                    if op.more:
                        return 4
                    if op.count != 1:
                        need = max(need, 2)
                    if op.kind is OpKind.RECV:
                        recvs.append((op.chunk, op.end, False))
                if recv_clash(recvs) is not None:  # overlapping recvs: legal only in v2
                    need = max(need, 2)
        return need

    @property
    def algorithm(self) -> str:
        return str(self.meta.get("algorithm", "?"))

    def chunk_bounds(self, n: int) -> list[tuple[int, int]]:
        """Element ranges of each chunk for a full buffer of ``n`` elements (for a
        reduce-scatter or allgather, shard boundaries fall exactly on
        ``floor(r * n / nranks)``: :meth:`topoplan.ir.collectives.Collective.chunk_bounds`)."""
        return collective_of(self).chunk_bounds(n)

    def steps_of(self, rank: int) -> tuple[Step, ...]:
        return self.ranks[rank].steps

    def with_meta(self, **meta: Any) -> Schedule:
        """A copy with ``meta`` updated."""
        return replace(self, meta={**self.meta, **meta})

    def ops(self) -> Iterator[tuple[int, int, Op | Native]]:
        """Every ``(rank, step, op)``, native ops (IR v3) included."""
        for program in self.ranks:
            for s, step in enumerate(program.steps):
                for op in step:
                    yield program.rank, s, op

    # ---- JSON --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": self.version,
            "collective": self.collective,
            "nranks": self.nranks,
            "chunks": list(self.chunks),
            "ranks": [{"rank": p.rank, "steps": [[op.to_dict() for op in step] for step in p.steps]}
                      for p in self.ranks],
            "meta": dict(self.meta),
        }

    def to_json(self, indent: int | None = None) -> str:
        if indent is not None:
            return json.dumps(self.to_dict(), indent=indent)
        # One line per rank keeps big schedules small and still diffable.
        d = self.to_dict()
        ranks = d.pop("ranks")
        head = json.dumps(d, separators=(",", ": "))[:-1]
        body = ",\n  ".join(json.dumps(r, separators=(",", ":")) for r in ranks)
        return f'{head}, "ranks": [\n  {body}\n]}}\n'

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON atomically (a crash leaves no half-written file).

        Raises
        ------
        TopoplanError
            If the file cannot be written (missing folder, no permission).
        """
        try:
            atomic_write(Path(path), self.to_json())
        except OSError as exc:
            raise TopoplanError(f"{path}: cannot write schedule: {exc.strerror}") from None

    @classmethod
    def from_dict(cls, data: Any, source: str = "<schedule>") -> Schedule:
        return _parse(data, source)


def load_schedule(path: str | os.PathLike) -> Schedule:
    """Read and validate a schedule JSON file.

    Raises
    ------
    ScheduleError
        If the file is unreadable or breaks the format (unknown op, chunk out of range,
        fractions not summing to 1, ...), naming the place: ``plan.json: ranks[2].steps[0][1]: ...``.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"{source}: cannot read schedule: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes().count(b"\n", 0, exc.start) + 1
        raise ScheduleError(f"{source}:{line}: not a text file (UTF-8 expected, byte "
                            f"0x{exc.object[exc.start]:02x})") from None
    return loads_schedule(text, source)


def loads_schedule(text: str, source: str = "<string>") -> Schedule:
    """Parse schedule JSON text; see :func:`load_schedule`."""
    if not text.strip():
        raise ScheduleError(f"{source}: empty file; a schedule is a JSON object "
                            "(topoplan plan CLUSTER.yaml -o PLAN.json writes one)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if _CLUSTER_KEY.search(text):
            raise ScheduleError(f"{source}: looks like a cluster YAML file; a schedule JSON "
                                f"is wanted here (topoplan plan {source} -o PLAN.json writes "
                                "one)") from None
        raise ScheduleError(f"{source}:{exc.lineno}: {_json_problem(text, exc)}") from None
    except RecursionError:
        raise ScheduleError(f"{source}: not a schedule: JSON nested too deeply") from None
    return _parse(data, source)


#: A top-level key of a cluster file (docs/CLUSTER.md) at the start of a line.
_CLUSTER_KEY = re.compile(r"^(?:boxes|switches)\s*:", re.M)


def _json_problem(text: str, exc: json.JSONDecodeError) -> str:
    """json's message as a whole sentence, saying when the text stops too early."""
    # Some of json's messages end in "at" and expect the position after them.
    reason = exc.msg.removesuffix(" at")
    message = f"not valid JSON: {reason[:1].lower()}{reason[1:]} at column {exc.colno}"
    if _ends_open(text):
        message += "; the text ends before its brackets close: a truncated file?"
    return message


def _ends_open(text: str) -> bool:
    """Whether ``text`` ends inside a string or an unclosed ``[`` or ``{``."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0


def _parse(data: Any, source: str) -> Schedule:
    def fail(where: str, message: str) -> ScheduleError:
        return ScheduleError(f"{source}: {where}: {message}" if where else f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("", f"a schedule is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
    version = data.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise fail("version", f"this topoplan reads versions 1 to 4, got {version!r}")
    collective = data.get("collective", DEFAULT_COLLECTIVE)
    if not isinstance(collective, str) or collective not in COLLECTIVES:
        known = ", ".join(repr(name) for name in COLLECTIVES)
        raise fail("collective", f"expected one of {known}, got {collective!r}")
    nranks = data.get("nranks")
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise fail("nranks", f"expected an integer >= 1, got {nranks!r}")

    chunks = data.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise fail("chunks", "expected a non-empty list of fractions")
    for k, c in enumerate(chunks):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0:
            raise fail(f"chunks[{k}]", f"fractions must be positive numbers, got {c!r}")
    try:
        total = math.fsum(chunks)
    except OverflowError:  # an integer beyond any float
        total = math.inf
    if abs(total - 1.0) > FRACTION_TOLERANCE:
        raise fail("chunks", f"fractions must sum to 1, got {total!r}")
    nchunks = len(chunks)

    ranks = data.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != nranks:
        got = len(ranks) if isinstance(ranks, list) else type(ranks).__name__
        raise fail("ranks", f"expected a list of {nranks} rank programs, got {got}")
    programs: list[RankProgram | None] = [None] * nranks
    for i, entry in enumerate(ranks):
        where = f"ranks[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, "expected an object with rank and steps")
        rank = entry.get("rank", i)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nranks:
            raise fail(f"{where}.rank", f"expected a rank in range({nranks}), got {rank!r}")
        if programs[rank] is not None:
            raise fail(f"{where}.rank", f"rank {rank} appears twice")
        steps = entry.get("steps")
        if not isinstance(steps, list):
            raise fail(f"{where}.steps", "expected a list of steps")
        parsed_steps = []
        for s, step in enumerate(steps):
            if not isinstance(step, list):
                raise fail(f"{where}.steps[{s}]", "a step is a list of ops")
            parsed_steps.append(_parse_step(step, rank, nranks, nchunks, version,
                                            lambda j, m, s=s: fail(f"{where}.steps[{s}][{j}]", m),
                                            lambda m, s=s: fail(f"{where}.steps[{s}]", m)))
        programs[rank] = RankProgram(rank, tuple(parsed_steps))
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise fail("meta", "expected an object")
    if COLLECTIVES[collective].sharded:
        try:
            shard_chunks(nranks, chunks, collective)
        except ScheduleError as exc:
            raise fail("chunks", str(exc)) from None
    return Schedule(nranks=nranks, chunks=tuple(float(c) for c in chunks),
                    ranks=tuple(p for p in programs if p is not None), collective=collective,
                    meta=meta)


_OPS = {"send": OpKind.SEND, "recv": OpKind.RECV}
_NATIVE = {kind.value: kind for kind in NativeKind}


def _parse_native(raw: dict, rank: int, nranks: int, nchunks: int, version: int,
                  fail) -> Native:
    kind = _NATIVE[raw["op"]]
    if version < 3:
        raise fail(f"a native {kind.value} needs \"version\": 3")
    group = raw.get("group")
    if (not isinstance(group, list) or len(group) < 1
            or any(isinstance(m, bool) or not isinstance(m, int) for m in group)):
        raise fail(f"group must be a non-empty list of ranks, got {group!r}")
    outside = [m for m in group if not 0 <= m < nranks]
    if outside:
        raise fail(f"group names rank {outside[0]}, outside range({nranks})")
    if len(set(group)) != len(group):
        twice = next(m for m in group if group.count(m) > 1)
        raise fail(f"group names rank {twice} twice")
    if rank not in group:
        raise fail(f"rank {rank} runs a native {kind.value} over group {group} it is not in")
    chunk, count = raw.get("chunk"), raw.get("count", 1)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < nchunks:
        raise fail(f"chunk {chunk!r} out of range({nchunks})")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise fail(f"count must be an integer >= 1, got {count!r}")
    if chunk + count > nchunks:
        raise fail(f"{chunk_text(chunk, count)} run past the last chunk {nchunks - 1}")
    if kind.parted and count % len(group):
        raise fail(f"a native {kind.value} over {len(group)} ranks cuts its range into "
                   f"{len(group)} equal parts: count {count} is not a multiple of {len(group)}")
    root = raw.get("root")
    if kind.rooted:
        if isinstance(root, bool) or not isinstance(root, int) or root not in group:
            raise fail(f"a native {kind.value} needs a root in its group {group}, "
                       f"got {root!r}")
    elif root is not None:
        raise fail(f"a native {kind.value} has no root (got root {root!r})")
    return Native(kind, tuple(group), chunk, count, root)


def _parse_step(step: list, rank: int, nranks: int, nchunks: int, version: int, fail_op,
                fail_step) -> Step:
    ops: list[Op | Native] = []
    received: list[tuple[int, int, bool]] = []
    for j, raw in enumerate(step):
        if not isinstance(raw, dict):
            raise fail_op(j, "an op is an object with op, peer and chunk")
        if raw.get("op") in _NATIVE:
            if len(step) != 1:
                raise fail_step(f"a native {raw.get('op')} stands alone in its step; this "
                                f"step has {len(step)} ops")
            ops.append(_parse_native(raw, rank, nranks, nchunks, version,
                                     lambda m, j=j: fail_op(j, m)))
            continue
        kind = _OPS.get(raw.get("op"))  # type: ignore[arg-type]
        if kind is None:
            raise fail_op(j, f"unknown op {raw.get('op')!r}; expected 'send', 'recv' or a "
                             f"native collective ({', '.join(map(repr, _NATIVE))})")
        peer, chunk = raw.get("peer"), raw.get("chunk")
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < nranks:
            raise fail_op(j, f"peer {peer!r} out of range({nranks})")
        if peer == rank:
            raise fail_op(j, f"rank {rank} names itself as peer")
        more: tuple[tuple[int, int], ...] = ()
        if "ranges" in raw:
            chunk, count, more = _parse_ranges(raw, nchunks, version,
                                               lambda m, j=j: fail_op(j, m))
        elif isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < nchunks:
            raise fail_op(j, f"chunk {chunk!r} out of range({nchunks})")
        else:
            count = raw.get("count", 1)
            if "count" in raw and version < 2:
                raise fail_op(j, "count (a chunk range) needs \"version\": 2")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise fail_op(j, f"count must be an integer >= 1, got {count!r}")
            if chunk + count > nchunks:
                raise fail_op(j, f"{chunk_text(chunk, count)} run past the last chunk "
                                 f"{nchunks - 1}")
        reduce = raw.get("reduce", False)
        if not isinstance(reduce, bool):
            raise fail_op(j, f"reduce must be true or false, got {reduce!r}")
        channel = raw.get("channel", 0)
        if "channel" in raw and version < 4:
            raise fail_op(j, "channel needs \"version\": 4")
        if isinstance(channel, bool) or not isinstance(channel, int) or channel < 0:
            raise fail_op(j, f"channel must be an integer >= 0, got {channel!r}")
        op = Op(kind, peer, chunk, reduce if kind is OpKind.RECV else False, count, channel,
                more)
        if kind is OpKind.RECV:
            received.extend((a, a + c, reduce) for a, c in op.ranges)
        ops.append(op)
    # Version 1 allows one recv per chunk in a step; version 2 lets reducing recvs
    # share a chunk (they all add).
    clash = recv_clash(received if version >= 2 else [(a, b, False) for a, b, _ in received])
    if clash is not None:
        v2_ok = version < 2 and recv_clash(received) is None
        raise fail_step(f"two recvs into chunk {clash} in one step"
                        + (" (several reducing recvs need version 2)" if v2_ok else ""))
    return tuple(ops)


def _parse_ranges(raw: dict, nchunks: int, version: int,
                  fail) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """An op's ``"ranges"`` (a vectored message, IR v4): its first chunk and count and
    the ranges after them."""
    if "chunk" in raw or "count" in raw:
        raise fail("give either ranges or chunk (and count), not both")
    if version < 4:
        raise fail("ranges (a vectored message) need \"version\": 4")
    ranges = raw["ranges"]
    if (not isinstance(ranges, list) or not ranges
            or any(not isinstance(r, list) or len(r) != 2
                   or any(isinstance(x, bool) or not isinstance(x, int) for x in r)
                   for r in ranges)):
        raise fail(f"ranges must be a non-empty list of [chunk, count] pairs of integers, "
                   f"got {ranges!r}")
    end = 0
    for k, (a, c) in enumerate(ranges):
        if not 0 <= a < nchunks:
            raise fail(f"ranges[{k}]: chunk {a} out of range({nchunks})")
        if c < 1:
            raise fail(f"ranges[{k}]: count must be >= 1, got {c}")
        if a + c > nchunks:
            raise fail(f"ranges[{k}]: {chunk_text(a, c)} run past the last chunk "
                       f"{nchunks - 1}")
        if k and a < end:
            raise fail(f"ranges[{k}]: {chunk_text(a, c)} starts before the end of the range "
                       f"before it ({chunk_text(*ranges[k - 1])}); ranges are disjoint and "
                       "in increasing chunk order")
        end = a + c
    return ranges[0][0], ranges[0][1], tuple((a, c) for a, c in ranges[1:])


def recv_clash(ranges: Sequence[tuple[int, int, bool]]) -> int | None:
    """A chunk that two recvs of one step may not share, or None.

    ``ranges`` are ``(start, end, reduce)``. Reducing recvs may overlap each other
    (IR v2: they all add); a recv that overwrites may overlap no other recv.
    """
    if len(ranges) < 2:
        return None
    end_any = end_overwrite = -1  # furthest end so far, of any recv / of overwrites
    for start, end, reduce in sorted(ranges):
        if start < end_overwrite or (not reduce and start < end_any):
            return start
        end_any = max(end_any, end)
        if not reduce:
            end_overwrite = max(end_overwrite, end)
    return None


def build_schedule(nranks: int, chunks: Iterable[float], steps: Sequence[Sequence[Iterable[Op]]],
                   *, collective: str = DEFAULT_COLLECTIVE, **meta: Any) -> Schedule:
    """Assemble a Schedule from ``steps[rank][step] -> ops`` (planners' helper).

    Trailing empty steps are dropped; empty steps in the middle are kept (a rank may idle).
    ``collective`` names what it computes (:mod:`topoplan.ir.collectives`); ``meta`` is the rest.
    """
    programs = []
    for rank in range(nranks):
        rank_steps = [tuple(ops) for ops in steps[rank]]
        while rank_steps and not rank_steps[-1]:
            rank_steps.pop()
        programs.append(RankProgram(rank, tuple(rank_steps)))
    return Schedule(nranks=nranks, chunks=tuple(chunks), ranks=tuple(programs),
                    collective=collective, meta=dict(meta))


def coalesce(schedule: Schedule) -> Schedule:
    """Merge each pair's back-to-back messages over consecutive chunks into ranges (v2).

    Messages ``k`` and ``k + 1`` from ``src`` to ``dst`` merge when both sides run
    them in the same step, their chunks are consecutive and the recv's ``reduce``
    agrees; the merged op takes the first one's place on both sides. The result
    computes the same thing with fewer, larger messages. Unmatched messages are left
    as they are (:func:`topoplan.verify` reports them). Vectored messages (IR v4) are
    left as they are; :func:`vectorize` merges those.
    """
    n = schedule.nranks
    sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for program in schedule.ranks:
        for s, step in enumerate(program.steps):
            for j, op in enumerate(step):
                if isinstance(op, Native):
                    continue
                if op.kind is OpKind.SEND:
                    sends.setdefault((program.rank, op.peer), []).append((s, j))
                else:
                    recvs.setdefault((op.peer, program.rank), []).append((s, j))
    steps = [[list(step) for step in p.steps] for p in schedule.ranks]
    dropped: set[tuple[int, int, int]] = set()
    for (src, dst), out in sends.items():
        into = recvs.get((src, dst), [])
        if len(into) != len(out):
            continue
        head = 0
        for k in range(1, len(out)):
            (s0, j0), (r0, i0) = out[head], into[head]
            (s1, j1), (r1, i1) = out[k], into[k]
            first, op_s, op_r = steps[src][s0][j0], steps[src][s1][j1], steps[dst][r1][i1]
            merged_r = steps[dst][r0][i0]
            assert isinstance(op_r, Op) and isinstance(merged_r, Op)  # natives are skipped
            if (s1 == s0 and r1 == r0 and op_s.channel == first.channel
                    and not (first.more or op_s.more or op_r.more or merged_r.more)
                    and op_s.chunk == first.end and op_r.chunk == merged_r.end
                    and op_r.chunk == op_s.chunk and op_r.reduce == merged_r.reduce
                    and first.chunk == merged_r.chunk):
                steps[src][s0][j0] = replace(first, count=first.count + op_s.count)
                steps[dst][r0][i0] = replace(merged_r, count=merged_r.count + op_r.count)
                dropped.add((src, s1, j1))
                dropped.add((dst, r1, i1))
            else:
                head = k
    programs = tuple(
        RankProgram(r, tuple(tuple(op for j, op in enumerate(step) if (r, s, j) not in dropped)
                             for s, step in enumerate(steps[r])))
        for r in range(n))
    return replace(schedule, ranks=programs)


@no_gc
def vectorize(schedule: Schedule) -> Schedule:
    """Merge each step's messages from one rank to one peer into one vectored message.

    Messages of a pair ``src -> dst`` on one channel merge when their sends are in one
    step at ``src``, their recvs in one step at ``dst``, the recvs agree on ``reduce``,
    each send names the ranges its recv does, and their ranges do not overlap: the
    merged op carries all their ranges, sorted by chunk (ranges that touch join into
    one), and takes the first one's place on both sides. Sends snapshot their ranges
    when their step starts and recvs land when theirs ends, whatever message carries
    them, so the result computes the same with one op per peer and step, not one per
    range (a shard exchange of a reduce-scatter or allgather: one op per peer, not one
    per shard). Unmatched messages are left as they are (:func:`topoplan.verify`
    reports them), and so is a schedule whose programs are not ranks ``0 .. nranks - 1``
    in order. The result is IR version 4 when some message now has several ranges; a
    schedule with nothing to merge comes back as it is.

    Notes
    -----
    On arrays, as the planners build schedules (``schedule_from_arrays``): the ops are
    read into numpy columns once, their messages grouped by sorts
    (:func:`_message_groups`) and each group's ranges sorted and joined at once
    (:func:`_joined_ranges`); only the merged messages become new ops, and only the
    steps that lose ops new tuples. On a loaded 2-core machine the leaf_spine_1024
    reduce-scatter of ``mcf`` (2.1 M ops into 217 k) takes 2 to 4 s, where a loop over
    the ops took 8 to 50 s.
    """
    import numpy as np

    n, programs = schedule.nranks, schedule.ranks
    if len(programs) != n or any(p.rank != r for r, p in enumerate(programs)):
        return schedule  # not a schedule the pairs can be found in: verify names it
    nprog = np.fromiter(map(len, map(attrgetter("steps"), programs)), np.int64, count=n)
    steps = list(chain.from_iterable(p.steps for p in programs))
    ops = list(chain.from_iterable(steps))
    total = len(ops)
    op_step = np.repeat(np.arange(len(steps), dtype=np.int64),
                        np.fromiter(map(len, steps), np.int64, count=len(steps)))
    # Point-to-point ops only: native ones (IR v3) have no peer and stay as they are.
    at = np.arange(total, dtype=np.int64)  # each one's place among all ops
    try:
        peer = np.fromiter(map(attrgetter("peer"), ops), np.int64, count=total)
        p2p = ops
    except AttributeError:
        at = at[~np.fromiter(map(isinstance, ops, repeat(Native)), bool, count=total)]
        p2p = [ops[i] for i in at.tolist()]
        peer = np.fromiter(map(attrgetter("peer"), p2p), np.int64, count=len(p2p))
    m = len(p2p)
    if m < 2:
        return schedule
    is_send = np.fromiter(map(is_, map(attrgetter("kind"), p2p), repeat(OpKind.SEND)), bool,
                          count=m)
    sends, recvs, group = _message_groups(
        np.repeat(np.arange(n, dtype=np.int64), nprog)[op_step[at]], peer, is_send,
        np.fromiter(map(attrgetter("channel"), p2p), np.int64, count=m),
        np.fromiter(map(attrgetter("reduce"), p2p), bool, count=m), op_step[at])
    if not len(group):
        return schedule
    ids: dict[tuple, int] = {(): 0}  # the ranges after the first, interned
    more = (np.fromiter((ids.setdefault(x, len(ids)) for x in map(attrgetter("more"), p2p)),
                        np.int64, count=m)
            if any(map(attrgetter("more"), p2p)) else np.zeros(m, np.int64))
    ok, ranges, bounds = _joined_ranges(
        np.fromiter(map(attrgetter("chunk"), p2p), np.int64, count=m),
        np.fromiter(map(attrgetter("count"), p2p), np.int64, count=m), more, list(ids),
        sends, recvs, group)
    if not ranges:
        return schedule
    # The first message of each merged group takes its ranges; the others go.
    merging = ok[group]
    sends, recvs, group = at[sends[merging]], at[recvs[merging]], group[merging]
    lead = np.ones(len(group), bool)
    lead[1:] = group[1:] != group[:-1]
    out = list(ops)
    for i, j, lo, hi in zip(sends[lead].tolist(), recvs[lead].tolist(), bounds[:-1],
                            bounds[1:]):
        (chunk, count), rest = ranges[lo], tuple(ranges[lo + 1:hi])
        for x in (i, j):
            op = ops[x]
            out[x] = fast_op(op.kind, op.peer, chunk, op.reduce, count, op.channel, rest)
    # New tuples for the steps that lost ops, new programs for the ranks that hold them.
    gone = np.concatenate([sends[~lead], recvs[~lead]])
    changed = np.zeros(len(steps), bool)
    changed[op_step[gone]] = True
    kept = changed[op_step]
    kept[gone] = False
    kept_at = np.flatnonzero(kept)
    left = [out[i] for i in kept_at.tolist()]
    where = np.flatnonzero(changed)
    cuts = _offsets(np.bincount(op_step[kept_at], minlength=len(steps))[where]).tolist()
    for s, lo, hi in zip(where.tolist(), cuts[:-1], cuts[1:]):
        steps[s] = tuple(left[lo:hi])
    base = _offsets(nprog).tolist()
    touched = set(np.repeat(np.arange(n), nprog)[where].tolist())
    return replace(schedule, ranks=tuple(
        RankProgram(r, tuple(steps[base[r]:base[r + 1]])) if r in touched else p
        for r, p in enumerate(programs)))


def _message_groups(rank: np.ndarray, peer: np.ndarray, is_send: np.ndarray,
                    channel: np.ndarray, reduce: np.ndarray,
                    step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The messages :func:`vectorize` may merge, from the columns of the point-to-point
    ops (numpy arrays, in program order; ``step`` numbers program steps across ranks):
    the sends' and the recvs' indices, and each message's group, ascending, in message
    order within a group.

    The k-th send of a pair (``src``, ``dst``, channel) meets its k-th recv, in pairs
    with as many of both (the others are left to verify). A group is a pair's messages
    whose sends share a step and whose recvs share a step and one ``reduce``; only groups
    of two or more messages are given.
    """
    import numpy as np

    m = len(rank)
    src, dst = np.where(is_send, rank, peer), np.where(is_send, peer, rank)
    # Each pair's sends, then its recvs, each in program order (a stable sort).
    order = np.lexsort((~is_send, channel, dst, src))
    head = np.zeros(m, bool)
    head[0] = True
    for key in (src, dst, channel):
        key = key[order]
        head[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(head)
    nsend = np.add.reduceat(is_send[order].astype(np.int64), starts)
    paired = np.flatnonzero(2 * nsend == np.diff(np.append(starts, m)))
    npairs = nsend[paired]
    first = np.repeat(starts[paired], npairs)
    k = np.arange(len(first), dtype=np.int64) - np.repeat(_offsets(npairs)[:-1], npairs)
    sends, recvs = order[first + k], order[first + np.repeat(npairs, npairs) + k]
    # A pair's steps only grow along its messages, so (pair, send step, recv step) come in
    # runs; a stable sort by (run, reduce) keeps each group in message order.
    pair, s_step, r_step = np.repeat(paired, npairs), step[sends], step[recvs]
    run = np.ones(len(sends), bool)
    run[1:] = (pair[1:] != pair[:-1]) | (s_step[1:] != s_step[:-1]) | (r_step[1:] != r_step[:-1])
    key = 2 * np.cumsum(run) + reduce[recvs]
    grouped = np.argsort(key, kind="stable")
    key = key[grouped]
    head = np.ones(len(key), bool)
    head[1:] = key[1:] != key[:-1]
    group = np.cumsum(head) - 1
    several = np.bincount(group)[group] >= 2 if len(group) else head
    return sends[grouped][several], recvs[grouped][several], group[several]


def _joined_ranges(chunk: np.ndarray, count: np.ndarray, more: np.ndarray,
                   more_of: list[tuple], sends: np.ndarray, recvs: np.ndarray,
                   group: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]], list[int]]:
    """Each group's ranges (of :func:`_message_groups`), sorted by ``(chunk, count)`` and
    those that touch joined, for the groups :func:`vectorize` merges: whether to merge
    each group (a numpy array by group), the ranges of the merged groups one after the
    other (ints), and where each merged group's start, and the end.

    A group merges when each of its sends names the ranges its recv does (``chunk``,
    ``count`` and ``more``, the ranges after the first as indices into ``more_of``),
    else verify names the pair; and when no range of it starts before the end of the
    one before it (reducing recvs of one chunk, IR v2), as the loop of earlier versions
    read them.
    """
    import numpy as np

    ok = np.zeros(int(group[-1]) + 1, bool)  # (groups of one message are not given)
    ok[group] = True
    ok[group[(chunk[sends] != chunk[recvs]) | (count[sends] != count[recvs])
             | (more[sends] != more[recvs])]] = False
    # Every range of every send: its first, then the ones after it.
    nmore, flat = _flat_more(more_of)
    pieces = 1 + nmore[more[sends]]
    owner = np.repeat(np.arange(len(sends), dtype=np.int64), pieces)
    a, c, g = chunk[sends][owner], count[sends][owner], group[owner]
    nth = np.arange(len(owner)) - np.repeat(_offsets(pieces)[:-1], pieces)  # its op's nth
    rest = np.flatnonzero(nth)
    if len(rest):
        at = _offsets(nmore)[more[sends]][owner[rest]] + nth[rest] - 1
        a[rest], c[rest] = flat[at, 0], flat[at, 1]
    by = np.lexsort((c, a, g))
    a, c, g = a[by], c[by], g[by]
    same, end = g[1:] == g[:-1], a[:-1] + c[:-1]
    ok[g[1:][same & (a[1:] < end)]] = False  # overlaps
    fresh = np.ones(len(a), bool)  # a range that does not join the one before it
    fresh[1:] = ~(same & (a[1:] == end))
    take = ok[g]
    a, c, g, fresh = a[take], c[take], g[take], fresh[take]
    lo = np.flatnonzero(fresh)
    ranges = list(zip(a[lo].tolist(), np.add.reduceat(c, lo).tolist() if len(lo) else []))
    return ok, ranges, _offsets(np.bincount(g[lo], minlength=len(ok))[ok]).tolist()


@no_gc
def split_vectored(schedule: Schedule) -> Schedule:
    """Each vectored op (IR v4) as one op per range, in its place and in range order.

    Both ops of a message name the same ranges, so the k-th send of a pair still pairs
    with the k-th recv, and every range moves in the same steps as before: the result
    computes what ``schedule`` does, with one message per range. A schedule without
    vectored ops comes back as it is. The verifier checks a vectored schedule as this
    one, from its arrays (:meth:`topoplan.ir.matching.Messages.split`), and splits the
    schedule itself only to name a fault in its ops.
    """
    more = attrgetter("more")
    if not any(map(more, chain.from_iterable(chain.from_iterable(
            p.steps for p in schedule.ranks)))):
        return schedule
    programs = []
    for program in schedule.ranks:
        if not any(map(more, chain.from_iterable(program.steps))):
            programs.append(program)
            continue
        steps: list[Step] = []
        for step in program.steps:
            if any(map(more, step)):
                step = tuple(piece for op in step for piece in (
                    [fast_op(op.kind, op.peer, a, op.reduce, c, op.channel)
                     for a, c in op.ranges]  # type: ignore[union-attr]
                    if isinstance(op, Op) and op.more else [op]))
            steps.append(step)
        programs.append(RankProgram(program.rank, tuple(steps)))
    return replace(schedule, ranks=tuple(programs))


def _flat_more(more_of: Sequence[tuple[tuple[int, int], ...]]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Ops' ``more`` ranges (IR v4) as numpy arrays: how many each has, and all of them,
    one ``(chunk, count)`` row each, one tuple after the other. Each range is unpacked
    as ``for a, c in more`` would, and fails as it would."""
    import numpy as np

    nmore = np.fromiter(map(len, more_of), np.int64, count=len(more_of))
    flat = np.fromiter(chain.from_iterable((a, c) for more in more_of for a, c in more),
                       np.int64, count=2 * int(nmore.sum()))
    return nmore, flat.reshape(-1, 2)


def _offsets(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]`` (numpy): where each group of ``counts`` starts, and the end."""
    import numpy as np

    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def equal_chunks(n: int) -> tuple[float, ...]:
    """``n`` equal fractions that sum to 1 as exactly as floats allow."""
    return tuple([1.0 / n] * n)
