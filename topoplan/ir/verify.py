"""Symbolic execution of a schedule: the oracle every planner is tested against.

Each (rank, chunk) holds the set of ranks whose contribution it contains, as a
bitmask (0: nothing yet); a rank's chunks are kept as runs of equal bitmasks
(:class:`_Chunks`), so an op over a range of chunks (IR v2) costs the runs it touches,
not its length. The schedule's collective (:mod:`topoplan.ir.collectives`) gives the
state every rank starts in and what it must end with.
Steps run with the semantics of docs/SCHEDULE.md: sends snapshot the chunk when
their step starts, recvs overwrite or reduce when their step ends, messages between
an ordered pair match in order (:mod:`topoplan.ir.matching`). A send completes only once
the receiver has started the matching step (rendezvous), so a schedule that verifies
cannot deadlock on any transport. Which steps complete, and in which order, does not
depend on the values: numpy finds it first (:meth:`_Flow.rounds`), and the values then
flow in that order (:meth:`_Flow.run`).

Native steps (IR v3, docs/SCHEDULE.md "Version 3") run on the same two paths: the
k-th native op over a group is matched at every member (:mod:`topoplan.ir.matching`),
its rendezvous becomes waits of the kind messages have (a rank made for the call, that
waits for every member to start its step, and that every member's step waits for:
:meth:`_Flow._rendezvous`), and its values are read at each member's step start and
written at its end (:class:`_Natives`).

Channels (IR v4, docs/SCHEDULE.md) make each (rank, channel) an independent sequence
of steps (:class:`~topoplan.ir.matching.Messages`): the flow runs sequences where it ran
ranks, so a channel's step waits only for its own previous step and for its messages'
peers on that channel. The values need no more care: every chunk belongs to one channel
(:func:`_check_channels` checks it first), so a rank's channels never touch the same
chunk and the order they interleave in does not change what any chunk ends with.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from .collectives import Collective, collective_of
from ..errors import ScheduleError
from .passes.vectorize import split_vectored
from .schedule import NativeKind, Op, OpKind, Schedule, chunk_text, recv_clash

if TYPE_CHECKING:
    import numpy as np

    from .matching import Messages, NativeCall

__all__ = ["verify", "VerifyReport", "verify_once", "mark_verified"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked."""

    nranks: int
    nchunks: int
    nsteps: int
    nmessages: int
    collective: str = "allreduce"
    nnative: int = 0  #: native steps (IR v3), one per member of each native collective
    ncollectives: int = 0  #: native collectives, each over its group
    nchannels: int = 1  #: channels (IR v4): independent sequences of steps per rank


def _ranks_text(mask: int, nranks: int) -> str:
    members = [r for r in range(nranks) if mask >> r & 1]
    if len(members) > 12:
        return "{" + ", ".join(map(str, members[:10])) + f", ... ({len(members)} ranks)" + "}"
    return "{" + ", ".join(map(str, members)) + "}"


def _disjoint_union(a: int, b: int) -> int | None:
    """``a | b``, or None when ``a`` and ``b`` share a rank."""
    return None if a & b else a | b


class _Unions:
    """:func:`_disjoint_union`, computed once per pair of mask objects.

    A schedule's chunks hold few distinct masks, over and over: on the 8192-rank mcf
    plan, 16 k distinct values among 700 k runs, and 980 distinct pairs among 850 k
    reduces. Computed once and shared, the masks stay few (equal masks are one object,
    compared by identity first) and a reduce of thousands of ranks is a dict lookup.
    Pairs are keyed by the objects' ids, and the table keeps the objects alive, so an
    id is never reused while its entry stands. Past :attr:`LIMIT` pairs (a schedule
    whose every reduce makes a new mask, as a flat ring's) the table starts afresh.
    """

    LIMIT = 1 << 16

    __slots__ = ("known", "pairs")

    def __init__(self) -> None:
        self.known: dict[tuple[int, int, int], int] = {}  # a mask by its fingerprint
        self.pairs: dict[tuple[int, int], tuple[int, int, int | None]] = {}

    def __call__(self, a: int, b: int) -> int | None:
        hit = self.pairs.get((id(a), id(b)))
        if hit is not None:
            return hit[2]
        union = _disjoint_union(a, b)
        if union is not None:
            # Not keyed by the mask itself: an int's hash is its value mod 2^61 - 1, so
            # masks alike but for a shift by 61 ranks collide (a ring's partial sums).
            key = hash(union), union.bit_length(), union.bit_count()
            same = self.known.setdefault(key, union)
            if same == union:
                union = same
        if len(self.pairs) >= self.LIMIT:
            self.pairs.clear()
            self.known.clear()
        self.pairs[id(a), id(b)] = a, b, union
        return union


class _Chunks:
    """One rank's chunks as runs ``[starts[i], starts[i+1])`` of equal bitmasks.

    Adjacent runs with equal masks are merged after every write, so chunks that
    move together (a segment of a reduce-scatter level) stay one run. ``union`` adds
    masks (:func:`_disjoint_union`, or a shared :class:`_Unions`).
    """

    __slots__ = ("starts", "masks", "n", "union")

    def __init__(self, n: int, mask: int,
                 union: Callable[[int, int], int | None] = _disjoint_union) -> None:
        self.n = n
        self.starts = [0]
        self.masks = [mask]
        self.union = union

    @classmethod
    def from_runs(cls, n: int, runs: list[tuple[int, int, int]],
                  union: Callable[[int, int], int | None] = _disjoint_union) -> _Chunks:
        """Chunks ``0 .. n - 1`` holding the ``(start, end, mask)`` runs, which tile them in order."""
        chunks = cls(n, runs[0][2], union)
        chunks.write(0, n, runs)
        return chunks

    def _split(self, k: int) -> int:
        """Make ``k`` a run boundary; return the index of the run starting at ``k``."""
        starts = self.starts
        i = bisect_right(starts, k) - 1
        if k >= self.n:
            return len(starts)
        if starts[i] != k:
            i += 1
            starts.insert(i, k)
            self.masks.insert(i, self.masks[i - 1])
        return i

    def read(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """``(start, end, mask)`` runs covering ``[a, b)``, clipped to it."""
        starts, masks = self.starts, self.masks
        i = bisect_right(starts, a) - 1
        out = []
        nruns = len(starts)
        while i < nruns and starts[i] < b:
            end = starts[i + 1] if i + 1 < nruns else self.n
            out.append((max(a, starts[i]), min(b, end), masks[i]))
            i += 1
        return out

    def write(self, a: int, b: int, value: list[tuple[int, int, int]]) -> None:
        """Overwrite ``[a, b)`` with the runs of ``value`` (which start at their source's
        first chunk: only their lengths and masks matter)."""
        i = self._split(a)
        j = self._split(b)
        base = value[0][0]
        self.starts[i:j] = [a + s - base for s, _, _ in value]
        self.masks[i:j] = [m for _, _, m in value]
        self._merge(i - 1, i + len(value) + 1)

    def first_empty(self, a: int, b: int) -> int | None:
        """The first chunk of ``[a, b)`` that holds nothing (mask 0), or None."""
        return next((s for s, _, m in self.read(a, b) if not m), None)

    def add(self, a: int, value: list[tuple[int, int, int]]) -> tuple[int, int] | None:
        """OR ``value`` into the runs from ``a`` on; the first chunk and the ranks counted
        twice, or None."""
        base = value[0][0]
        lo = hi = -1
        for s, e, m in value:
            i = self._split(a + s - base)
            j = self._split(a + e - base)
            masks = self.masks
            for k in range(i, j):
                union = self.union(masks[k], m)
                if union is None:
                    return self.starts[k], masks[k] & m
                masks[k] = union
            lo = i if lo < 0 else lo
            hi = j
        self._merge(lo - 1, hi + 1)
        return None

    def get(self, a: int, b: int) -> int | list[tuple[int, int, int]]:
        """The mask of chunks ``[a, b)`` when one run covers them (the common case), else
        their runs, as :meth:`read`."""
        starts = self.starts
        i = bisect_right(starts, a) - 1
        if i + 1 == len(starts) or starts[i + 1] >= b:
            return self.masks[i]
        return self.read(a, b)

    def put(self, a: int, b: int, mask: int) -> None:
        """Overwrite chunks ``[a, b)`` with ``mask``: :meth:`write` of one run."""
        starts = self.starts
        i = bisect_right(starts, a) - 1
        end = starts[i + 1] if i + 1 < len(starts) else self.n
        if b > end:
            self.write(a, b, [(a, b, mask)])
        elif self.masks[i] != mask:
            self._set(i, end, a, b, mask)

    def add_mask(self, a: int, b: int, mask: int) -> tuple[int, int] | None:
        """OR ``mask`` into chunks ``[a, b)``: :meth:`add` of one run."""
        starts = self.starts
        i = bisect_right(starts, a) - 1
        end = starts[i + 1] if i + 1 < len(starts) else self.n
        if b > end:
            return self.add(a, [(a, b, mask)])
        old = self.masks[i]
        union = self.union(old, mask)
        if union is None:
            return a, old & mask
        self._set(i, end, a, b, union)
        return None

    def _set(self, i: int, end: int, a: int, b: int, mask: int) -> None:
        """Give chunks ``[a, b)``, inside run ``i`` (which ends at ``end`` and holds another
        mask), the mask ``mask``, keeping runs merged."""
        starts, masks = self.starts, self.masks
        old = masks[i]
        last = i + 1 == len(starts)
        if a > starts[i]:  # the run keeps its head
            if b < end:
                starts[i + 1:i + 1] = a, b
                masks[i + 1:i + 1] = mask, old
            elif not last and masks[i + 1] == mask:
                starts[i + 1] = a  # the next run grows back to a
            else:
                starts.insert(i + 1, a)
                masks.insert(i + 1, mask)
        elif i and masks[i - 1] == mask:  # the previous run grows to b
            if b < end:
                starts[i] = b
            elif not last and masks[i + 1] == mask:
                del starts[i:i + 2], masks[i:i + 2]
            else:
                del starts[i], masks[i]
        elif b < end:
            starts.insert(i + 1, b)
            masks.insert(i + 1, old)
            masks[i] = mask
        else:
            masks[i] = mask
            if not last and masks[i + 1] == mask:
                del starts[i + 1], masks[i + 1]

    def holds(self, expected: list[tuple[int, int, int | None]]) -> bool:
        """Whether every run ``(start, end, mask)`` of ``expected`` holds ``mask`` on all its
        chunks (``None``: anything)."""
        starts, masks = self.starts, self.masks
        if masks == [want for _, _, want in expected] and starts == [a for a, _, _ in expected]:
            return True  # the same runs (the common case: a passing allgather)
        nruns = len(starts)
        for a, b, want in expected:
            if want is not None:
                i = bisect_right(starts, a) - 1
                if masks[i] != want or (i + 1 < nruns and starts[i + 1] < b):
                    return False
        return True

    def _merge(self, i: int, j: int) -> None:
        """Merge equal neighbours among runs ``i .. j`` (clipped)."""
        starts, masks = self.starts, self.masks
        i = max(i, 1)
        j = min(j, len(starts) - 1)
        k = j
        while k >= i:
            if masks[k] == masks[k - 1]:
                del starts[k], masks[k]
            k -= 1


def verify(schedule: Schedule) -> VerifyReport:
    """Check that ``schedule`` computes its collective and cannot deadlock.

    The collective (``schedule.collective``: allreduce, reduce-scatter or allgather,
    :mod:`topoplan.ir.collectives`) gives each rank's chunks at the start and what they
    must hold at the end (docs/SCHEDULE.md).

    Parameters
    ----------
    schedule : Schedule

    Returns
    -------
    VerifyReport
        Counts of what was checked.

    Raises
    ------
    ScheduleError
        At the first violation, naming the algorithm, rank, step, peer and chunk:
        unmatched messages, a send and its recv naming different chunks, two recvs into
        one chunk in a step, a contribution counted twice, a deadlock, a chunk sent or
        added into before it holds anything (allgather), or a final chunk that does not
        hold what the collective promises (for an allreduce: every rank's contribution
        exactly once; for a reduce-scatter, on the rank's own shard; for an allgather,
        each shard's owner's contribution alone). Also for a reduce-scatter or allgather
        whose chunks straddle two shards. For native steps (IR v3), naming the rank,
        step and group: a malformed op, a member without the k-th op over its group or
        running another one (kind, group order, chunks, root), a native step sharing its
        step, a sum that would count a rank twice, a chunk read while it holds nothing
        (an allgather's part before it arrived), a deadlock through a group's
        rendezvous. For channels (IR v4): a message whose send and recv are on
        different channels, a chunk used on two channels (the first op, in file order,
        that puts it on a second one, and where it was first met), and a deadlock named
        with the channel of the blocked step and of the peers it waits for.

    Notes
    -----
    Which steps can complete, and in what order, does not depend on the chunks'
    values: numpy finds it first, in rounds (every rank whose current step's peers have
    all reached their matching steps completes it), in O(ops) array operations plus
    O(ranks) per round. The values then flow in that order, one message at a time:
    O(sum over ops of the runs of equal bitmasks the op touches) big-integer operations,
    nearly always one, and unions of masks are computed once per pair
    (:class:`_Unions`). Memory O(ops + runs). On a 2-core machine
    (``scripts/bench_verify.py``): mcf's 1024-GPU fat-tree plan (950 k ops) in 0.7 s,
    its 8192-GPU rail plan (3.4 M ops) in 3.5 s, the leaf_spine_1024 allgather (3.1 M
    ops) in 2.3 s, 2.5 to 2.9 times faster than the rank-by-rank queue of earlier
    versions. The first violation is the one that queue met first: a schedule found
    faulty is run again in the queue's order to name it.

    Native steps take both paths: a call of ``g`` members adds a rank of one step and
    ``2 g`` waits (the rendezvous), and its values cost O(g) unions of the runs of its
    range (an allreduce's sum and an allgather's result are computed once per call), so
    the whole stays linear in the ops, native ones counted once per member
    (``scripts/bench_verify_native.py``: a composed allreduce on 2048 ranks, 6 k native
    ops, in 0.7 s; its lowering, 2.1 M point-to-point ops, in 23 s).
    """
    from .matching import match_messages

    try:  # the collective's chunk layout first, as _execute checks it (same first fault)
        collective_of(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{schedule.algorithm} schedule: {exc}") from None
    # Vectored messages (IR v4): once their two ops agree on the ranges (matching), a
    # message of several ranges moves what one message per range, in the same steps,
    # moves; recv clashes and channels are then checked range by range, on the messages
    # of split_vectored(schedule), cut from these (Messages.split).
    matched = match_messages(schedule, natives=True, vectored=True)
    nmessages = len(matched.t_src)
    collective, found, flow, state = _execute(schedule, matched.split())
    n = schedule.nranks
    for r in range(n):
        expected = collective.postcondition(r)
        if state[r].holds(expected):
            continue
        for a, b, want in expected:
            if want is None:
                continue
            for k, _, mask in state[r].read(a, b):
                if mask != want:
                    raise ScheduleError(f"{schedule.algorithm} schedule: "
                                        + _wrong_end(collective, r, k, mask, want))
    _PASSED.note(schedule)
    return VerifyReport(nranks=n, nchunks=schedule.nchunks, nsteps=schedule.nsteps,
                        nmessages=nmessages, collective=collective.name,
                        nnative=sum(len(call.steps) for call in found.calls),
                        ncollectives=len(found.calls), nchannels=found.nchannels)


# ----------------------------------------------------------------------------------
# Schedules that passed: what the executors trust
# ----------------------------------------------------------------------------------
class _Passed:
    """The schedules :func:`verify` passed in this process, still alive: by identity
    (free to look up), and by content (``hash`` and ``==`` of the schedule: its ranks'
    ops, chunk layout and collective, not its meta), so that a schedule read again from
    the same file, or rank 0's plan received as JSON, is not verified twice while an
    equal one lives. A schedule is frozen, so what passed stays correct; entries go
    with their schedules (weak references), so nothing is kept alive here."""

    def __init__(self) -> None:
        self._ids: dict[int, None] = {}
        self._content: weakref.WeakSet[Schedule] = weakref.WeakSet()
        #: Held while a schedule is verified for an executor: ranks on threads (Local)
        #: building executors of one schedule at once wait for the first to verify it.
        self.lock = threading.RLock()

    def note(self, schedule: Schedule, *, content: bool = False) -> None:
        """Record that ``schedule`` passed (``content``: also as its content, which costs
        a hash of every op)."""
        key = id(schedule)
        if key not in self._ids:
            self._ids[key] = None
            weakref.finalize(schedule, self._ids.pop, key, None)
        if content:
            self._content.add(schedule)

    def __contains__(self, schedule: Schedule) -> bool:
        if id(schedule) in self._ids:
            return True
        if schedule in self._content:  # an equal schedule passed and is still alive
            self.note(schedule)
            return True
        return False


_PASSED = _Passed()


def verify_once(schedule: Schedule) -> bool:
    """:func:`verify` ``schedule`` unless it, or an equal schedule still alive, passed
    before in this process; what the executors call on a schedule they are given.

    A schedule passes once for every buffer size: the proof is over its chunks, and a
    buffer of any element count lays them out (``Schedule.chunk_bounds``), empty ones
    included. The cache looks up a schedule by identity first (free: every executor of
    one schedule object, a schedule :func:`verify` or :func:`topoplan.plan` returned),
    then by content (a hash of its ops, a small part of verifying it: 10 ms against
    160 ms for a 65 k-op ring, and ``==`` against the equal schedule found). Its meta (``meta["verified"]`` of a file
    included) is never trusted.

    Returns
    -------
    bool
        True when ``schedule`` was verified now, False when it had passed before.

    Raises
    ------
    ScheduleError
        As :func:`verify`; a schedule that fails is not remembered, and fails again.
    """
    with _PASSED.lock:
        if schedule in _PASSED:
            return False
        verify(schedule)
        _PASSED.note(schedule, content=True)
        return True


def mark_verified(schedule: Schedule) -> None:
    """Record that ``schedule`` computes its collective without verifying it: for the
    code that has just verified an equal schedule (the planning pipeline stamps a copy
    of the schedule it verified; rank 0's verified plan arrives on the others as JSON)."""
    with _PASSED.lock:
        _PASSED.note(schedule)


def _execute(schedule: Schedule, found: Messages | None = None
             ) -> tuple[Collective, Messages, _Flow, list[_Chunks]]:
    """Run ``schedule`` symbolically: its collective, its messages, the flow and every
    rank's chunks at the end; raises for every fault but a wrong end.

    ``found`` are the messages to run: by default ``schedule``'s, which then has no
    vectored op (IR v4); for a vectored schedule, those of
    :func:`~topoplan.ir.passes.split_vectored` (:meth:`Messages.split`), so that it runs
    as its split form, which is made only to name a fault in its ops.
    """
    # numpy comes in here, on first use, not with ``import topoplan``.
    from .matching import deadlock_error, match_messages, native_wait_text, wait_text

    n, nchunks = schedule.nranks, schedule.nchunks
    name = f"{schedule.algorithm} schedule"

    def fail(message: str) -> ScheduleError:
        return ScheduleError(f"{name}: {message}")

    try:
        collective = collective_of(schedule)
    except ScheduleError as exc:
        raise fail(str(exc)) from None

    # Bad peers and chunks, then the static matching: the k-th send src->dst pairs with
    # the k-th recv at dst from src (shared with the simulator).
    if found is None:
        found = match_messages(schedule, natives=True)
    flow = _Flow(found, nchunks)
    if found.nchannels > 1:
        _check_channels(schedule, found, fail)
    clashing = flow.clashing_recvs()
    written = split_vectored(schedule) if clashing else schedule  # as found has its ops
    for g in clashing:
        r = int(found.step_rank[g])
        s = found.local(g)
        step = written.ranks[r].steps[s]
        twice = recv_clash([(op.chunk, op.end, op.reduce) for op in step
                            if isinstance(op, Op) and op.kind is OpKind.RECV])
        if twice is not None:
            raise fail(f"rank {r} step {s}: two recvs into chunk {twice} in one step")
    pc, order = flow.rounds()

    try:
        state = flow.run(order, collective, fail)
    except ScheduleError:
        # Faults do not depend on the order, but which comes first does: name the one
        # that the rank-by-rank queue of earlier versions meets first.
        try:
            flow.run(flow.queue_order(), collective, fail)
        except ScheduleError as first:
            raise first from None
        raise

    nseq = flow.nseq
    blocked = [q for q in range(nseq) if pc[q] < flow.nsteps[q]]
    if blocked:
        seq_base = flow.step_base
        channels = found.nchannels > 1

        def at(q: int, k: int) -> int:
            """Step ``k`` of sequence ``q``, as written in its rank's program."""
            return found.local(seq_base[q] + k) if k < flow.nsteps[q] else k

        q = blocked[0]
        g = seq_base[q] + pc[q]
        r, s, c = int(found.step_rank[g]), found.local(g), int(found.step_channel[g])
        native = found.native_step(g)
        if native is not None:  # the members that have not reached the op
            call = native[0]
            waits = []
            for m, h in zip(call.group, call.steps):
                lane, need = int(found.step_seq[h]), int(h - found.step_first[h])
                if pc[lane] < need:
                    waits.append(native_wait_text(call.op, m, at(lane, pc[lane]),
                                                  found.local(h)))
        else:
            lo = flow.op_ptr[g]
            peer = flow.peer[lo:flow.op_ptr[g + 1]].tolist()
            need = flow.need[lo:flow.op_ptr[g + 1]].tolist()
            ops = [op for op in split_vectored(schedule).ranks[r].steps[s]  # as found has them
                   if isinstance(op, Op) and op.channel == c]
            waits = [wait_text(op.kind, op.chunk, op.count, op.peer, at(lane, pc[lane]),
                               at(lane, k), c if channels else None)
                     for op, lane, k in zip(ops, peer, need) if pc[lane] < k]
        nranks = len({int(found.seq_rank[x]) for x in blocked})
        raise deadlock_error(name, nranks, r, s, waits, c if channels else None)
    return collective, found, flow, state


def _check_channels(schedule: Schedule, found: Messages,
                    fail: Callable[[str], ScheduleError]) -> None:
    """Every chunk belongs to one channel (IR v4): all ops on it, at every rank, are of
    that channel. Raise for the first op, in file order (rank, step, op), on a chunk that
    an earlier op put on another channel.

    A message's two ops are on one channel (:mod:`topoplan.ir.matching`), so it is
    enough to count, per channel, the messages and native ops (channel 0) covering each
    chunk: O(ops + channels x chunks). Only a schedule that breaks the rule is walked op
    by op, to name the first op that does.
    """
    import numpy as np

    nchan, nchunks = found.nchannels, schedule.nchunks
    chan = found.step_channel[found.t_sstep]
    lo, hi = found.t_chunk, found.t_chunk + found.t_count
    if found.calls:
        lo = np.concatenate([lo, [call.op.chunk for call in found.calls]])
        hi = np.concatenate([hi, [call.op.end for call in found.calls]])
        chan = np.concatenate([chan, np.zeros(len(found.calls), np.int64)])
    cover = np.zeros((nchan, nchunks + 1), np.int64)
    np.add.at(cover, (chan, lo), 1)
    np.add.at(cover, (chan, hi), -1)
    used = (np.cumsum(cover, axis=1)[:, :nchunks] > 0).sum(axis=0)
    shared = np.flatnonzero(used > 1).tolist()
    if not shared:
        return
    owner: dict[int, tuple[int, int, int]] = {}  # chunk -> (channel, rank, step) first met
    for r, s, op in split_vectored(schedule).ops():  # range by range
        i = bisect_right(shared, op.chunk - 1)
        while i < len(shared) and shared[i] < op.end:
            k = shared[i]
            first = owner.setdefault(k, (op.channel, r, s))
            if first[0] != op.channel:
                raise fail(f"rank {r} step {s}: chunk {k} is on channel {op.channel} here but "
                           f"on channel {first[0]} at rank {first[1]} step {first[2]}: every "
                           "chunk belongs to one channel")
            i += 1


class _Flow:
    """A matched schedule (:class:`~topoplan.ir.matching.Messages`) arranged for the run.

    Steps are numbered globally, as in ``Messages``; the flow runs *sequences*, each a
    rank's program on one channel (IR v4; without channels, a sequence is a rank), whose
    step ``k`` waits only for its own step ``k - 1``. The sends of global step ``g`` are
    ``sends[send_ptr[g]:send_ptr[g + 1]]`` (messages, in program order), its recvs
    ``recvs[recv_ptr[g]:recv_ptr[g + 1]]``. Per op (``Messages`` order): its ``peer``
    sequence and the step ``need`` (within that sequence) that holds the other op of its
    message. All numpy arrays, but for the lists ``step_base``, ``nsteps``, ``op_ptr``.

    The waits (``peer``, ``need``, indexed by ``op_ptr``) are what a step waits for:
    its ops' peers, and for a native step (IR v3) the rank made for its call
    (:meth:`_rendezvous`). ``step_base`` and ``nsteps`` are per sequence; with native
    steps, they and ``op_ptr`` go on past the sequences with one of one step per call.
    """

    def __init__(self, found: Messages, nchunks: int) -> None:
        import numpy as np

        self.found = found
        self.nchunks = nchunks
        self.nmessages = nmessages = len(found.t_src)
        nops = int(found.op_ptr[-1])
        ids = np.arange(nmessages, dtype=np.int64)
        # Each op's message, peer and the peer's step of the message's other op.
        message = np.empty(nops, np.int64)
        message[found.t_sop] = ids
        message[found.t_rop] = ids
        is_recv = np.zeros(nops, bool)
        is_recv[found.t_rop] = True
        self.peer = np.empty(nops, np.int64)
        self.peer[found.t_sop] = found.t_dst
        self.peer[found.t_rop] = found.t_src
        if found.nchannels > 1:  # wait on the peer's sequence on the message's channel
            self.peer[found.t_sop] = found.step_seq[found.t_rstep]
            self.peer[found.t_rop] = found.step_seq[found.t_sstep]
        self.need = np.empty(nops, np.int64)
        self.need[found.t_sop] = found.t_rstep - found.step_first[found.t_rstep]
        self.need[found.t_rop] = found.t_sstep - found.step_first[found.t_sstep]
        nglobal = found.nglobal
        self.sends, self.recvs = message[~is_recv], message[is_recv]  # grouped by step
        self.send_ptr = _offsets(np.bincount(found.t_sstep, minlength=nglobal))
        self.recv_ptr = _offsets(np.bincount(found.t_rstep, minlength=nglobal))
        self.nranks = found.nranks
        self.nseq = len(found.seq_rank)  # the sequences: the ranks, without channels
        step_base, op_ptr = found.seq_base, found.op_ptr
        if found.calls:
            step_base, op_ptr = self._rendezvous(found)
        # The steps and the waits of every rank: for each step, its ops' (peer, need).
        self.wait_base, self.wait_ptr = step_base, op_ptr
        self.step_base = step_base.tolist()
        self.op_ptr = op_ptr.tolist()
        self.nsteps = np.diff(step_base).tolist()

    def _rendezvous(self, found: Messages) -> tuple[np.ndarray, np.ndarray]:
        """Make a native call's rendezvous waits of the kind messages have.

        Call ``c`` becomes a rank of its own, ``nseq + c`` (after the sequences), with
        one step that waits for every member to reach its step of the call; each
        member's step waits for that rank to be done. So a member's step completes exactly once every member
        has started it, at ``2 g`` waits per call of ``g`` members (not ``g^2``).
        Returns the step bases and wait pointers of all ranks, real and made.
        """
        import numpy as np

        n, nglobal, calls = self.nseq, found.nglobal, found.calls
        native_steps = np.flatnonzero(found.step_call >= 0)
        waits = found.ops_per_step.copy()
        waits[native_steps] += 1
        sizes = np.fromiter((len(call.steps) for call in calls), np.int64, count=len(calls))
        op_ptr = _offsets(np.concatenate([waits, sizes]))
        p2p_step = np.repeat(np.arange(nglobal), found.ops_per_step)
        moved = op_ptr[p2p_step] + np.arange(len(p2p_step)) - found.op_ptr[p2p_step]
        peer = np.empty(int(op_ptr[-1]), np.int64)
        need = np.empty_like(peer)
        peer[moved], need[moved] = self.peer, self.need
        peer[op_ptr[native_steps]] = n + found.step_call[native_steps]
        need[op_ptr[native_steps]] = 1  # the call's own rank is done
        made = op_ptr[nglobal]
        members = np.asarray([g for call in calls for g in call.steps], np.int64)
        peer[made:] = found.step_seq[members]  # each member's sequence (channel 0)
        need[made:] = members - found.step_first[members]
        self.peer, self.need = peer, need
        step_base = np.concatenate([found.seq_base, nglobal + 1 + np.arange(len(calls))])
        return step_base.astype(np.int64), op_ptr

    def clashing_recvs(self) -> list[int]:
        """The global steps, in order, where two recvs share a chunk and one of them
        overwrites it (several reducing recvs of one chunk all add: IR v2)."""
        import numpy as np

        found = self.found
        # Recvs by step, then first chunk; step g's chunks are numbered from g * width,
        # so each step's numbers lie above the previous step's.
        width = self.nchunks + 1
        start = found.t_rstep * width + found.t_chunk
        order = np.argsort(start, kind="stable")  # recvs come nearly in that order
        start = start[order]
        end = start + found.t_count[order]
        overwrite_end = np.where(found.t_reduce[order], 0, end)
        # A recv clashes with an earlier one of its step when it starts before the
        # furthest end of an overwrite so far, or overwrites and starts before the
        # furthest end of any recv so far (recv_clash's scan, for every step at once).
        clash = start[1:] < np.maximum.accumulate(overwrite_end)[:-1]
        clash |= (overwrite_end[1:] > 0) & (start[1:] < np.maximum.accumulate(end)[:-1])
        return np.unique(found.t_rstep[order][1:][clash]).tolist()

    def rounds(self) -> tuple[list[int], list[int]]:
        """Which steps complete, and an order to run them in.

        Returns the step each rank ends in (its number of steps when it finishes) and
        the global steps that complete, rounds apart: in each round every rank whose
        current step has all its peers at or past their matching steps completes it. A
        rank that cannot waits on the first op it found late, and is checked again once
        that op's peer has got there.
        """
        import numpy as np

        peer, need = self.peer, self.need
        step_base, op_ptr = self.wait_base, self.wait_ptr
        nsteps = np.diff(step_base)
        pc = np.zeros(len(nsteps), np.int64)
        done = []
        check = np.flatnonzero(nsteps > 0)
        waiting = wait_peer = wait_need = np.zeros(0, np.int64)
        while len(check):
            g = step_base[check] + pc[check]
            lo = op_ptr[g]
            size = op_ptr[g + 1] - lo
            ops = _ranges(lo, size)
            late = np.flatnonzero(pc[peer[ops]] < need[ops])
            owner = np.repeat(np.arange(len(check)), size)[late]
            first = late[np.flatnonzero(np.diff(owner, prepend=-1))]  # per blocked rank
            ready = np.ones(len(check), bool)
            ready[owner] = False
            done.append(g[ready])
            moved = check[ready]
            pc[moved] += 1
            waiting = np.concatenate([waiting, check[~ready]])
            wait_peer = np.concatenate([wait_peer, peer[ops[first]]])
            wait_need = np.concatenate([wait_need, need[ops[first]]])
            woken = pc[wait_peer] >= wait_need
            check = np.concatenate([moved[pc[moved] < nsteps[moved]], waiting[woken]])
            waiting, wait_peer, wait_need = (x[~woken] for x in (waiting, wait_peer, wait_need))
        order = np.concatenate(done) if done else np.zeros(0, np.int64)
        return pc.tolist(), order.tolist()

    def queue_order(self) -> list[int]:
        """The global steps that complete, in the order the verifier of earlier versions
        completed them: a queue of ranks, each run as far as its peers let it."""
        n = len(self.nsteps)
        nsteps, step_base, op_ptr = self.nsteps, self.step_base, self.op_ptr
        peer, need = self.peer.tolist(), self.need.tolist()
        pc = [0] * n
        order = []
        queue = deque(range(n))
        queued = [True] * n
        while queue:
            r = queue.popleft()
            queued[r] = False
            while pc[r] < nsteps[r]:
                g = step_base[r] + pc[r]
                ops = range(op_ptr[g], op_ptr[g + 1])
                if any(pc[peer[i]] < need[i] for i in ops):
                    break  # some peer has not reached the matching step yet
                order.append(g)
                pc[r] += 1
                if pc[r] < nsteps[r]:
                    ops = range(op_ptr[g], op_ptr[g + 2])  # peers of this step and the next
                for i in ops:
                    if not queued[peer[i]]:
                        queued[peer[i]] = True
                        queue.append(peer[i])
        return order

    def run(self, order: Sequence[int], collective: Collective,
            fail: Callable[[str], ScheduleError]) -> list[_Chunks]:
        """Every rank's chunks after completing the global steps ``order`` (a
        topological order of the steps' dependencies), from the collective's initial
        state.

        Sends snapshot their chunks when their step starts, recvs overwrite or add when
        their step ends. A step's overwriting recvs overlap no other recv, and adds
        commute, so applying its recvs one by one is the same as applying them together
        when the step ends (several reducing recvs of one chunk all add: IR v2). The
        messages are laid out in the order they are used, so the run reads its lists
        front to back (on 8192 ranks, jumping about them cost more than the work).
        A native step (IR v3) snapshots its member's range when it starts and writes
        the member's result when it ends (:class:`_Natives`); the steps of the calls'
        own ranks (:meth:`_rendezvous`) are only waits, and are skipped.
        """
        import numpy as np

        found = self.found
        n = self.nranks
        nranks = collective.nranks
        empty_possible = collective.starts_empty
        union = _Unions()
        state = [_Chunks.from_runs(collective.nchunks, collective.initial(r), union)
                 for r in range(n)]
        natives = _Natives(found, state, union, nranks, fail) if found.calls else None
        # The steps entered: every sequence's first, then the next one after each step.
        steps = np.asarray(order, np.int64)
        if natives is not None:
            steps = steps[steps < found.nglobal]
            order = steps.tolist()
        ranks = found.step_rank[steps]
        # (every sequence's first: a rank's, without channels)
        first = found.seq_base[:-1][np.asarray(self.nsteps[:self.nseq]) > 0]
        entered = np.concatenate([first, np.where(steps + 1 < found.step_last[steps],
                                                  steps + 1, -1)])
        nsends = np.where(entered >= 0, self.send_ptr[entered + 1] - self.send_ptr[entered], 0)
        sends = self.sends[_ranges(self.send_ptr[entered], nsends)]  # in snapshot order
        nrecvs = self.recv_ptr[steps + 1] - self.recv_ptr[steps]
        recvs = self.recvs[_ranges(self.recv_ptr[steps], nrecvs)]  # in the order they land
        position = np.zeros(self.nmessages, np.int64)
        position[sends] = np.arange(len(sends))
        end = found.t_chunk + found.t_count
        send_a, send_b = found.t_chunk[sends].tolist(), end[sends].tolist()
        recv_at = position[recvs].tolist()
        recv_a, recv_b = found.t_chunk[recvs].tolist(), end[recvs].tolist()
        recv_reduce = found.t_reduce[recvs].tolist()
        recv_src = found.t_src[recvs]  # for faults only
        value: list = [None] * len(sends)  # each send's value, snapshot when its step starts
        lo = 0
        for r, count in zip(found.step_rank[first].tolist(), nsends[:len(first)].tolist()):
            value[lo:lo + count] = map(state[r].get, send_a[lo:lo + count],
                                       send_b[lo:lo + count])
            lo += count
        if natives is not None:
            # Per step of the order: whether it is native, and whether the step it enters is.
            calls = found.step_call
            ends = (calls[steps] >= 0).tolist()
            enters = np.where(entered >= 0, calls[entered], -1) >= 0
            for h in entered[:len(first)][enters[:len(first)]].tolist():
                natives.start(h)
            starts = np.where(enters[len(first):], entered[len(first):], -1).tolist()
        i = 0  # the next recv
        for k, (g, r, nr, ns) in enumerate(zip(order, ranks.tolist(), nrecvs.tolist(),
                                               nsends[len(first):].tolist())):
            chunks = state[r]
            for at, a, b, reduce in zip(recv_at[i:i + nr], recv_a[i:i + nr], recv_b[i:i + nr],
                                        recv_reduce[i:i + nr]):
                v = value[at]
                if empty_possible and (reduce or type(v) is not int or not v):
                    why = _unfilled(chunks, int(recv_src[i]), a, b, reduce, v)
                    if why:
                        raise fail(f"rank {r} step {found.local(g)} {why}")
                if reduce:
                    clash = chunks.add_mask(a, b, v) if type(v) is int else chunks.add(a, v)
                    if clash is not None:
                        raise fail(f"rank {r} step {found.local(g)} reduces chunk "
                                   f"{clash[0]} from rank {int(recv_src[i])}: contributions "
                                   f"{_ranks_text(clash[1], nranks)} would be counted twice")
                elif type(v) is int:
                    chunks.put(a, b, v)
                else:
                    chunks.write(a, b, v)
                i += 1
            if natives is not None:
                if ends[k]:
                    natives.end(g)
                if starts[k] >= 0:
                    natives.start(starts[k])
            if ns:  # the rank enters its next step
                value[lo:lo + ns] = map(chunks.get, send_a[lo:lo + ns], send_b[lo:lo + ns])
                lo += ns
        return state


class _Natives:
    """The values of native steps (IR v3) during :meth:`_Flow.run`.

    A member's range is read when its step starts (:meth:`start`) and its result
    written when its step ends (:meth:`end`), by the rendezvous after every member
    started. Contributions add as bitmasks, as for reducing recvs: a sum that would
    count a rank twice is a fault, and so is reading a chunk that holds nothing (an
    allgather's chunks start empty). An allreduce's sum and an allgather's result are
    the same at every member: computed once per call. Cost per call of ``g`` members:
    O(g * runs of the range) unions, O(g^2 * runs / g) for a reduce-scatter's parts.
    """

    def __init__(self, found: Messages, state: list[_Chunks],
                 union: Callable[[int, int], int | None], nranks: int,
                 fail: Callable[[str], ScheduleError]) -> None:
        self.found, self.state, self.union = found, state, union
        self.nranks, self.fail = nranks, fail
        self.inputs: dict[int, list] = {}  # call -> each member's range when it started
        self.shared: dict[int, list[tuple[int, int, int]]] = {}  # call -> its one result

    def start(self, g: int) -> None:
        """Member step ``g`` starts: read its range."""
        at = self.found.native_step(g)
        assert at is not None
        call, i = at
        c = int(self.found.step_call[g])
        inputs = self.inputs.setdefault(c, [None] * len(call.steps))
        inputs[i] = self.state[call.group[i]].read(call.op.chunk, call.op.end)

    def end(self, g: int) -> None:
        """Member step ``g`` ends: write its result."""
        at = self.found.native_step(g)
        assert at is not None
        call, i = at
        c = int(self.found.step_call[g])
        op, inputs = call.op, self.inputs[c]
        kind, group, rank = op.kind, op.group, op.group[i]
        if kind is NativeKind.ALLREDUCE or kind is NativeKind.ALLGATHER:
            result = self.shared.get(c)
            if result is None:
                result = self.shared[c] = (self._sum(call, inputs, op.chunk, op.end)
                                           if kind is NativeKind.ALLREDUCE
                                           else self._gather(call, inputs))
            self.state[rank].write(op.chunk, op.end, result)
        elif kind is NativeKind.REDUCE_SCATTER:
            a, b = op.part(i)
            if c not in self.shared:  # every member's whole range is read: check it once
                self._filled(call, inputs, op.chunk, op.end, "add")
                self.shared[c] = []
            self.state[rank].write(a, b, self._sum(call, inputs, a, b, filled=True))
        elif kind is NativeKind.BROADCAST:
            root = group.index(op.root)
            self._filled(call, inputs, op.chunk, op.end, "broadcast", [root])
            if rank != op.root:
                self.state[rank].write(op.chunk, op.end, inputs[root])
        elif rank == op.root:  # a reduce, at its root; the others keep their values
            self.state[rank].write(op.chunk, op.end, self._sum(call, inputs, op.chunk, op.end))

    def _where(self, call: NativeCall, i: int) -> str:
        rank = call.group[i]
        return f"rank {rank} step {call.local[i]}"

    def _filled(self, call: NativeCall, inputs: list, a: int, b: int, verb: str,
                members: Sequence[int] | None = None) -> None:
        """Fail when a member's chunk of ``[a, b)`` that the op reads holds nothing."""
        for i in members if members is not None else range(len(inputs)):
            k = next((max(s, a) for s, e, m in inputs[i] if not m and s < b and e > a), None)
            if k is not None:
                raise self.fail(f"{self._where(call, i)} runs {call.op.text()} with "
                                f"{chunk_text(k)} holding nothing (it has not received that "
                                f"chunk yet): there is nothing to {verb}")

    def _sum(self, call: NativeCall, inputs: list, a: int, b: int,
             filled: bool = False) -> list[tuple[int, int, int]]:
        """The members' chunks ``[a, b)`` added up, as runs."""
        if not filled:
            self._filled(call, inputs, a, b, "add")
        total = _Chunks(b, 0, self.union)  # only [a, b) is used
        total.write(a, b, _clip(inputs[0], a, b))
        for i in range(1, len(inputs)):
            clash = total.add(a, _clip(inputs[i], a, b))
            if clash is not None:
                raise self.fail(f"{self._where(call, i)} runs {call.op.text()}: adding rank "
                                f"{call.group[i]}'s chunk {clash[0]} would count contributions "
                                f"{_ranks_text(clash[1], self.nranks)} twice")
        return total.read(a, b)

    def _gather(self, call: NativeCall, inputs: list) -> list[tuple[int, int, int]]:
        """Part ``j`` of member ``j``, for every ``j``, in order."""
        out: list[tuple[int, int, int]] = []
        for j in range(len(inputs)):
            a, b = call.op.part(j)
            self._filled(call, inputs, a, b, "gather", [j])
            out += _clip(inputs[j], a, b)
        return out


def _clip(runs: list[tuple[int, int, int]], a: int, b: int) -> list[tuple[int, int, int]]:
    """The runs (as :meth:`_Chunks.read` gives them) clipped to ``[a, b)``."""
    return [(max(s, a), min(e, b), m) for s, e, m in runs if s < b and e > a]


def _offsets(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]``: where each group of ``counts`` starts, and the end."""
    import numpy as np

    return np.concatenate([[0], np.cumsum(counts)])


def _ranges(lo: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The concatenated ranges ``lo[i] .. lo[i] + size[i] - 1``."""
    import numpy as np

    total = int(size.sum())
    starts = np.repeat(lo - _offsets(size)[:-1], size)
    return starts + np.arange(total, dtype=np.int64)


def _unfilled(chunks: _Chunks, peer: int, a: int, b: int, reduce: bool,
              value: int | list[tuple[int, int, int]]) -> str | None:
    """A recv must bring something, and may add only into a chunk that holds something
    (an allgather's chunks start empty: they have no value to send or to add to)."""
    for start, _, mask in [(a, b, value)] if isinstance(value, int) else value:
        if not mask:
            return (f"receives {chunk_text(start)} from rank {peer}, which held nothing there "
                    f"when its send's step started (it had not received that chunk yet)")
    if reduce:
        k = chunks.first_empty(a, b)
        if k is not None:
            return (f"reduces {chunk_text(k)} from rank {peer} into a chunk that holds "
                    f"nothing yet; receive it without reduce")
    return None


def _wrong_end(collective: Collective, rank: int, chunk: int, mask: int, want: int) -> str:
    """Why ``rank`` ending with ``chunk`` holding ``mask`` breaks the postcondition ``want``."""
    n = collective.nranks
    holding = _ranks_text(mask, n) if mask else "nothing"
    if want == collective.full:
        return (f"rank {rank} ends with chunk {chunk} holding {holding}; expected all of "
                f"0..{n - 1} once (missing {_ranks_text(want & ~mask, n)})")
    owner = want.bit_length() - 1  # an allgather: the shard's owner alone
    return (f"rank {rank} ends with chunk {chunk} holding {holding}; expected exactly "
            f"{{{owner}}} (rank {owner}'s shard, never reduced)")
