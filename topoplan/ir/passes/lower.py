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

from dataclasses import replace

from ..schedule import Native, NativeKind, Op, RankProgram, Schedule, recv, send

__all__ = ["lower_native", "lower_call"]

Steps = list[list[Op]]  # one member's lowered steps


def lower_native(schedule: Schedule) -> Schedule:
    """``schedule`` with every native step replaced by point-to-point steps.

    Parameters
    ----------
    schedule : Schedule
        Any schedule; one without native steps is returned as it is.

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
    lowered: dict[tuple[int, int], Steps] = {}  # (rank, step) -> its lowered steps
    for call in found.calls:
        for m, s, steps in zip(call.group, call.local, lower_call(call.op)):
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
    return replace(schedule, ranks=tuple(programs),
                   meta={**schedule.meta, "lowered_native": len(found.calls)})


def lower_call(op: Native) -> list[Steps]:
    """The point-to-point steps of each member of ``op``, in group order (see the
    module docstring for the algorithm of each kind)."""
    group, g = op.group, len(op.group)
    if g == 1:
        return [[]]
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
