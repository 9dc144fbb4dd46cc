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
ends; a message's two ops name the same ranges. :func:`~topoplan.ir.passes.vectorize`
merges a step's messages to one peer into one.

This module holds the types and their JSON form (:meth:`Schedule.to_json`,
:meth:`Schedule.save`); :mod:`topoplan.ir.parse` reads and checks the JSON, and the
passes over schedules are in :mod:`topoplan.ir.passes`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from .collectives import DEFAULT as DEFAULT_COLLECTIVE, chunk_bounds, collective_of
from .._compat import moved_function, moved_names
from .._util import atomic_write
from ..errors import TopoplanError

if TYPE_CHECKING:
    import numpy as np  # imported where used: import topoplan loads no numpy

__all__ = ["OpKind", "Op", "send", "recv", "vsend", "vrecv", "NativeKind", "Native", "native_op",
           "is_native", "RankProgram", "Schedule", "build_schedule", "equal_chunks",
           "chunk_bounds", "chunk_text", "recv_clash", "FORMAT", "VERSION", "VERSIONS",
           "ranges_text", "fast_op"]

FORMAT = "topoplan-schedule"
VERSION = 4  #: the newest version written and read; versions 1 to 3 are read too
VERSIONS = (1, 2, 3, 4)

#: The names that left this module (the reader and the passes) or were renamed
#: (``native``: it clashed with the class :class:`Native` but for case).
__getattr__ = moved_names(__name__, {
    "load_schedule": "topoplan.ir.parse", "loads_schedule": "topoplan.ir.parse",
    "FRACTION_TOLERANCE": "topoplan.ir.parse",
    "coalesce": "topoplan.ir.passes", "vectorize": "topoplan.ir.passes",
    "split_vectored": "topoplan.ir.passes", "native": "topoplan.ir.schedule:native_op"})


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
    :func:`~topoplan.ir.passes.vectorize`, :func:`~topoplan.ir.passes.split_vectored`)."""
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
#: (the planners' arrays, the vectored passes). The arguments are
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


#: A native op's group of at least this many consecutive ranks in ascending order is
#: written as the text ``"first..last"`` (docs/SCHEDULE.md): as a list, the ``nccl``
#: row's group over 16384 ranks, repeated in every rank's program, is 1.4 GB of JSON.
GROUP_RANGE_MIN = 64


def group_json(group: Sequence[int]) -> list[int] | str:
    """A native op's group as the JSON writes it: ``"0..16383"`` for
    :data:`GROUP_RANGE_MIN` or more consecutive ranks in ascending order, else the list."""
    n = len(group)
    if n >= GROUP_RANGE_MIN and group[-1] - group[0] == n - 1 \
            and all(b == a + 1 for a, b in zip(group, group[1:])):
        return f"{group[0]}..{group[-1]}"
    return list(group)


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

    def to_dict(self, group: list[int] | str | None = None) -> dict[str, Any]:
        """The op's JSON object; ``group``: its group's JSON form when the caller has it
        already (:func:`group_json`, computed once per group for a whole schedule)."""
        out: dict[str, Any] = {"op": self.kind.value,
                               "group": group_json(self.group) if group is None else group,
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


def native_op(kind: str | NativeKind, group: Iterable[int], chunk: int, count: int = 1,
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
        groups: dict[int, list[int] | str] = {}  # id(group) -> its JSON, once per group
        return {
            "format": FORMAT, "version": self.version,
            "collective": self.collective,
            "nranks": self.nranks,
            "chunks": list(self.chunks),
            "ranks": [{"rank": p.rank, "steps": [[_op_dict(op, groups) for op in step]
                                                  for step in p.steps]}
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

    from_dict = staticmethod(moved_function("topoplan.ir.schedule.Schedule.from_dict",
                                            "topoplan.ir.parse:schedule_from_dict"))


def _op_dict(op: Op | Native, groups: dict[int, list[int] | str]) -> dict[str, Any]:
    """``op.to_dict()``, a native op's group made JSON once per group object (``groups``:
    ``id(group) -> JSON``; the members of a native op share its group)."""
    if isinstance(op, Op):
        return op.to_dict()
    found = groups.get(id(op.group))
    if found is None:
        found = groups[id(op.group)] = group_json(op.group)
    return op.to_dict(found)


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


def equal_chunks(n: int) -> tuple[float, ...]:
    """``n`` equal fractions that sum to 1 as exactly as floats allow."""
    return tuple([1.0 / n] * n)
