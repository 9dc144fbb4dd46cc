"""Native steps (IR v3) lowered to point-to-point steps that compute the same thing.

A format or a transport without collectives (MSCCL XML; a transport without the
group's library) runs a schedule with native steps once each native collective is
replaced by sends and recvs among its group. :func:`lower_native` does that, exactly:
every member's chunks end as the native op's semantics say (docs/SCHEDULE.md, "Version
3"), the chunks the op leaves alone included, so the lowered schedule verifies exactly
when the native one does (for a schedule without deadlock).

How each op is lowered, with ``g`` members in group order and member ``i`` the rank at
``group[i]``:

- **allgather**: a ring in group order, ``g - 1`` steps; at step ``t`` member ``i``
  sends part ``(i - t) mod g`` to member ``i + 1`` and receives part ``(i - 1 - t) mod
  g`` from member ``i - 1`` (Patarasuk and Yuan's ring allgather).
- **reduce_scatter**: direct, one step: member ``i`` sends part ``j`` to member ``j``
  and adds part ``i`` from every other member (IR v2's reducing recvs of one chunk in
  one step). A ring would leave partial sums in the parts a member does not own, where
  the native op keeps their values, and IR has no scratch space to keep them in.
- **allreduce**: a ring reduce-scatter then a ring allgather, ``2 (g - 1)`` steps, over
  ``g`` parts of ``floor`` / ``ceil`` of ``count / g`` chunks (every chunk of the range
  ends as the sum, so the ring's partial sums are overwritten); with fewer chunks than
  members, direct: every member sends its range to every other and adds theirs, one step.
- **broadcast**: a binomial tree from the root over the group order starting at the
  root, ``ceil(log2 g)`` steps; a member runs only the steps where it sends or receives.
- **reduce**: direct, one step: every other member sends its range to the root, which
  adds them all; the others keep their values, as the native op says (a tree would
  leave partial sums on the inner members).

A native op over one rank does nothing and is dropped.

**Rings of the caller's choice** (``lower_native(schedule, rings=...)``: the MSCCL export,
which asks for the rings NCCL runs on the cluster, :mod:`topoplan.cluster.rails`). An
allreduce or an allgather then runs over the ``R`` rings given for its group, each on
``1 / R`` of every part, all in the same steps (``2 (g - 1)`` and ``g - 1``), instead of
one ring in group order; and the schedule's chunks are first cut finer
(:func:`split_chunks`) until each such op has ``R`` chunks per member at least, so that
no allreduce over fewer chunks than members falls back on the direct exchange, where
every member sends the whole range to every other (``g - 1`` times the data: a native
allreduce of the whole buffer over 32 GPUs, lowered that way, is 31 copies of it).

Messages between two members keep their order: in a schedule without deadlock, the
messages between two members of a call are all before the call on both sides or all
after it (a message sent before the call and received after it, or the other way,
waits on the call, which waits on it), so the lowered messages, which take the call's
place on both sides, pair with each other.

References
----------
P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", J. Parallel Distrib. Comput. 69(2), 2009.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from ...errors import ScheduleError
from ..schedule import Native, NativeKind, Op, RankProgram, Schedule, recv, send

__all__ = ["lower_native", "lower_call", "split_chunks", "tree_allreduce"]

Steps = list[list[Op]]  # one member's lowered steps


#: ``rings(op)``: the rings (each a permutation of ``op.group``) an allreduce or an
#: allgather is lowered over.
Rings = Callable[[Native], Sequence[Sequence[int]]]


def lower_native(schedule: Schedule, *, rings: Rings | None = None,
                 tree: bool = False) -> Schedule:
    """``schedule`` with every native step replaced by point-to-point steps.

    Parameters
    ----------
    schedule : Schedule
        Any schedule; one without native steps is returned as it is.
    rings : callable, optional
        ``rings(op)`` for a native allreduce or allgather: the rings to run it over, each
        a permutation of its group (see the module docstring); the chunks are then cut
        finer first, and ``meta["split_chunks"]`` says by how much. Default: one ring in
        group order, and the chunks as they are.
    tree : bool
        Lower every allreduce as a binomial tree instead (:func:`tree_allreduce`: a
        reduce to the group's first member, then a broadcast, ``2 ceil(log2 g)``
        steps of the whole range): fewer steps than a ring's ``2 (g - 1)`` where the
        message latency outweighs the bytes, as NCCL's Tree does at small sizes.

    Returns
    -------
    Schedule
        A new schedule (version 1 or 2; 4 when it has channels) that computes the same
        thing: each native step of a rank becomes that rank's steps of
        :func:`lower_call`, so the steps after it move later by that number minus one.
        Native ops are on channel 0 (IR v4), and so are the ops they lower to; the
        other channels' ops keep their channels and their order. ``meta["lowered_native"]`` counts the
        native collectives lowered.

    Raises
    ------
    ScheduleError
        A native op that is malformed or whose members do not agree (the messages of
        :func:`topoplan.ir.matching.match_messages`), as :func:`topoplan.verify` names them.

    Notes
    -----
    Per collective of ``g`` members over ``c`` chunks: ``2 g (g - 1)`` ops for an
    allreduce (``c >= g``) or an allgather ring, ``g (g - 1)`` for a direct
    reduce-scatter or allreduce, ``2 (g - 1)`` for a broadcast or a reduce; linear time
    in the ops of the result.
    """
    from ..matching import match_messages

    found = match_messages(schedule, natives=True, vectored=True)  # p2p ops pass through
    if not found.calls:
        return schedule
    split = 1
    if rings is not None:
        for call in found.calls:
            if tree and call.op.kind is NativeKind.ALLREDUCE:
                continue
            if call.op.kind in _RINGED and len(call.op.group) > 1:
                want = len(call.op.group) * len(_checked_rings(call.op, rings))
                split = max(split, math.ceil(want / call.op.count))
        if split > 1:
            schedule = split_chunks(schedule, split)
            found = match_messages(schedule, natives=True, vectored=True)
    lowered: dict[tuple[int, int], Steps] = {}  # (rank, step) -> its lowered steps
    for call in found.calls:
        if tree and call.op.kind is NativeKind.ALLREDUCE:
            steps_of = tree_allreduce(call.op)
        elif rings is not None and call.op.kind in _RINGED and len(call.op.group) > 1:
            steps_of = lower_call(call.op, _checked_rings(call.op, rings))
        else:
            steps_of = lower_call(call.op)
        for m, s, steps in zip(call.group, call.local, steps_of):
            lowered[m, s] = steps
    programs = []
    for program in schedule.ranks:
        out: list[tuple[Op | Native, ...]] = []
        for s, step in enumerate(program.steps):
            if (program.rank, s) in lowered:
                out.extend(tuple(ops) for ops in lowered[program.rank, s])
            else:
                out.append(step)
        programs.append(RankProgram(program.rank, tuple(out)))
    meta = {**schedule.meta, "lowered_native": len(found.calls)}
    if split > 1:
        meta["split_chunks"] = split
    return replace(schedule, ranks=tuple(programs), meta=meta)


_RINGED = (NativeKind.ALLREDUCE, NativeKind.ALLGATHER)


def _checked_rings(op: Native, rings: Rings) -> list[tuple[int, ...]]:
    found = [tuple(ring) for ring in rings(op)]
    if not found or any(sorted(ring) != sorted(op.group) for ring in found):
        raise ScheduleError(f"rings for the native {op.text()}: each must hold every member "
                            f"once, got {found[:2]}")
    return found


def split_chunks(schedule: Schedule, parts: int) -> Schedule:
    """``schedule`` with every chunk cut into ``parts`` equal chunks: chunk ``k`` becomes
    chunks ``k * parts .. k * parts + parts - 1``, and every op (sends, recvs, their
    ranges, native ops) covers the same data as before. The schedule computes the same
    thing; ``meta`` is kept."""
    if parts == 1:
        return schedule

    def cut(op: Op | Native) -> Op | Native:
        if isinstance(op, Native):
            return replace(op, chunk=op.chunk * parts, count=op.count * parts)
        return replace(op, chunk=op.chunk * parts, count=op.count * parts,
                       more=tuple((a * parts, c * parts) for a, c in op.more))

    chunks = tuple(c / parts for c in schedule.chunks for _ in range(parts))
    programs = tuple(RankProgram(p.rank, tuple(tuple(cut(op) for op in step) for step in p.steps))
                     for p in schedule.ranks)
    return replace(schedule, chunks=chunks, ranks=programs)


def lower_call(op: Native, rings: Sequence[Sequence[int]] | None = None) -> list[Steps]:
    """The point-to-point steps of each member of ``op``, in group order (see the
    module docstring for the algorithm of each kind); an allreduce or an allgather over
    ``rings`` (permutations of the group) when given, each ring on ``1 / len(rings)``
    of every part: the op must then have ``len(rings)`` chunks per member at least."""
    group, g = op.group, len(op.group)
    if g == 1:
        return [[]]
    if rings is not None and op.kind in _RINGED:
        return _over_rings(op, [tuple(ring) for ring in rings])
    if op.kind is NativeKind.ALLGATHER:
        return _ring_allgather(group, [op.part(i) for i in range(g)])
    if op.kind is NativeKind.REDUCE_SCATTER:
        return _direct_reduce_scatter(group, [op.part(i) for i in range(g)])
    if op.kind is NativeKind.ALLREDUCE:
        if op.count < g:
            return _direct_allreduce(group, op.chunk, op.count)
        parts = [(op.chunk + i * op.count // g, op.chunk + (i + 1) * op.count // g)
                 for i in range(g)]
        return [rs + ag for rs, ag in zip(_ring_reduce_scatter(group, parts),
                                          _ring_allgather(group, parts))]
    if op.kind is NativeKind.BROADCAST:
        return _tree_broadcast(group, group.index(op.root), op.chunk, op.count)
    return _direct_reduce(group, group.index(op.root), op.chunk, op.count)


def tree_allreduce(op: Native) -> list[Steps]:
    """A native allreduce as a binomial tree, per member in group order: sums flow up
    to the first member (``ceil(log2 g)`` steps; an inner member adds into its own
    range, which the broadcast then overwrites), then the sum flows down the same tree
    (:func:`_tree_broadcast`)."""
    group, g = op.group, len(op.group)
    if g == 1:
        return [[]]
    whole = (op.chunk, op.chunk + op.count)
    up: list[Steps] = [[] for _ in range(g)]
    spans = []
    span = 1
    while span < g:
        spans.append(span)
        span *= 2
    for span in reversed(spans):  # the broadcast's levels, leaves first
        for p in range(min(span, g - span)):
            up[p + span].append([_range(group[p], whole)])
            up[p].append([_range(group[p + span], whole, True)])
    down = _tree_broadcast(group, 0, op.chunk, op.count)
    return [a + b for a, b in zip(up, down)]


def _over_rings(op: Native, rings: list[tuple[int, ...]]) -> list[Steps]:
    """An allreduce or allgather over ``R`` rings at once: ring ``k`` takes piece ``k`` of
    each part (of the whole range for an allreduce, cut into ``g`` parts; of each
    member's part for an allgather)."""
    group, g, nrings = op.group, len(op.group), len(rings)
    if op.count < g * nrings:
        raise ScheduleError(f"the native {op.text()} has {op.count} chunks; {nrings} rings "
                            f"of {g} members need {g * nrings} at least (split_chunks)")
    index = {m: i for i, m in enumerate(group)}
    out: list[Steps] = [[] for _ in range(g)]
    for k, ring in enumerate(rings):
        if op.kind is NativeKind.ALLREDUCE:
            a = op.chunk + k * op.count // nrings
            size = (k + 1) * op.count // nrings - k * op.count // nrings
            parts = [(a + i * size // g, a + (i + 1) * size // g) for i in range(g)]
            per_position = [rs + ag for rs, ag in zip(_ring_reduce_scatter(ring, parts),
                                                      _ring_allgather(ring, parts))]
        else:  # allgather: position p owns piece k of its member's part
            pieces = []
            for member in ring:
                start, end = op.part(index[member])
                n = end - start
                pieces.append((start + k * n // nrings, start + (k + 1) * n // nrings))
            per_position = _ring_allgather(ring, pieces)
        for position, steps in enumerate(per_position):
            mine = out[index[ring[position]]]
            for t, ops in enumerate(steps):
                if t == len(mine):
                    mine.append([])
                mine[t].extend(ops)
    return out


def _range(peer: int, part: tuple[int, int], reduce: bool | None = None) -> Op:
    """A send (``reduce`` None) or recv of the chunks ``[a, b)`` of ``part``."""
    a, b = part
    return send(peer, a, b - a) if reduce is None else recv(peer, a, reduce, b - a)


def _ring_allgather(group: tuple[int, ...], parts: list[tuple[int, int]]) -> list[Steps]:
    g = len(group)
    return [[[_range(group[(i + 1) % g], parts[(i - t) % g]),
              _range(group[(i - 1) % g], parts[(i - 1 - t) % g], False)]
             for t in range(g - 1)] for i in range(g)]


def _ring_reduce_scatter(group: tuple[int, ...], parts: list[tuple[int, int]]) -> list[Steps]:
    """Member ``i`` ends with part ``i`` summed; its other parts hold partial sums."""
    g = len(group)
    return [[[_range(group[(i + 1) % g], parts[(i - t - 1) % g]),
              _range(group[(i - 1) % g], parts[(i - t - 2) % g], True)]
             for t in range(g - 1)] for i in range(g)]


def _direct_reduce_scatter(group: tuple[int, ...],
                           parts: list[tuple[int, int]]) -> list[Steps]:
    g = len(group)
    return [[[_range(group[j], parts[j]) for j in range(g) if j != i]
             + [_range(group[j], parts[i], True) for j in range(g) if j != i]]
            for i in range(g)]


def _direct_allreduce(group: tuple[int, ...], chunk: int, count: int) -> list[Steps]:
    whole = (chunk, chunk + count)
    return _direct_reduce_scatter(group, [whole] * len(group))


def _tree_broadcast(group: tuple[int, ...], root: int, chunk: int, count: int) -> list[Steps]:
    g = len(group)
    order = [group[(root + p) % g] for p in range(g)]  # positions from the root
    whole = (chunk, chunk + count)
    steps: list[Steps] = [[] for _ in range(g)]
    span = 1
    while span < g:  # positions below span hold the value; each sends it span on
        for p in range(min(span, g - span)):
            src, dst = (root + p) % g, (root + p + span) % g
            steps[src].append([_range(order[p + span], whole)])
            steps[dst].append([_range(order[p], whole, False)])
        span *= 2
    return steps


def _direct_reduce(group: tuple[int, ...], root: int, chunk: int, count: int) -> list[Steps]:
    whole = (chunk, chunk + count)
    return [[[_range(m, whole, True) for m in group if m != group[root]]] if i == root
            else [[_range(group[root], whole)]] for i in range(len(group))]
