"""Passes over vectored messages (IR v4): :func:`vectorize` merges a step's messages to one
peer into one message of several ranges; :func:`split_vectored` cuts each back into one
message per range."""

from __future__ import annotations

from dataclasses import replace
from itertools import chain, repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING

from ..._util import no_gc
from ..schedule import Native, Op, OpKind, RankProgram, Schedule, Step, _flat_more, fast_op

if TYPE_CHECKING:
    import numpy as np  # imported where used: import topoplan loads no numpy

__all__ = ["vectorize", "split_vectored"]


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


def _offsets(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]`` (numpy): where each group of ``counts`` starts, and the end."""
    import numpy as np

    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
