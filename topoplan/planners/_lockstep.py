"""Building schedules in lock-step: every message puts its send and its recv in the same
global step.

- :class:`Timeline`: ops appended per (rank, slot); any schedule built with it is free
  of deadlock under the rendezvous rule of docs/SCHEDULE.md, and phases compose by
  slot offsets (pipelining = running copies on disjoint chunks at staggered offsets).
  Empty slots are dropped when the schedule is built.
- :func:`schedule_from_arrays`: the same from flat op arrays (millions of ops in
  seconds), for the planners that generate their messages with numpy.
- :func:`ring_reduce_scatter` / :func:`ring_allgather`: ring phases over a group of
  ranks whose segments are lists of chunks (used by ``ring`` and ``hierarchical``).
- :func:`no_gc`: a planner run with the cyclic garbage collector paused.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._util import no_gc
from ..cluster import Cluster
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE
from ..ir.schedule import Op, OpKind, RankProgram, Schedule, fast_op

__all__ = ["Timeline", "schedule_from_arrays", "runs", "empty_schedule", "no_gc", "split",
           "ring_reduce_scatter", "ring_allgather"]

_SEND, _RECV = OpKind.SEND, OpKind.RECV
# Op(...) about 2x faster; planners plan on channel 0, one range an op (vectorize merges).
_op = fast_op
_CODE_KINDS = (OpKind.SEND, OpKind.RECV, OpKind.RECV)
_CODE_REDUCE = (False, False, True)


def schedule_from_arrays(nranks: int, rank: np.ndarray, step: np.ndarray, peer: np.ndarray,
                         chunk: np.ndarray, code: np.ndarray, chunks: Sequence[float],
                         count: np.ndarray | None = None,
                         collective: str = DEFAULT_COLLECTIVE, **meta: Any) -> Schedule:
    """A Schedule of ``collective`` from flat op arrays (code 0 = send, 1 = recv, 2 = recv
    and reduce).

    One lexsort puts each rank's ops in (step, peer, chunk, code) order, so the
    messages of a pair within a step are in chunk order on both sides and sends come
    before recvs. Steps with no op are dropped: a rank simply waits for its peers.
    ``count`` (default all 1) gives each op's chunk range. Builds millions of ops in
    seconds where per-op Python loops take minutes.
    """
    order = np.lexsort((code, chunk, peer, step, rank))
    rk, st, pe, ck, cd = rank[order], step[order], peer[order], chunk[order], code[order]
    cn = count[order].tolist() if count is not None else [1] * len(order)
    del order
    codes = cd.tolist()
    ops = list(map(_op, map(_CODE_KINDS.__getitem__, codes), pe.tolist(), ck.tolist(),
                   map(_CODE_REDUCE.__getitem__, codes), cn))
    rank_bounds = np.searchsorted(rk, np.arange(nranks + 1))
    new_step = np.ones(len(st), dtype=bool)
    new_step[1:] = (st[1:] != st[:-1]) | (rk[1:] != rk[:-1])
    starts = np.flatnonzero(new_step).tolist() + [len(st)]
    programs = []
    s_iter = 0
    for r in range(nranks):
        end = int(rank_bounds[r + 1])
        steps = []
        while starts[s_iter] < end:
            steps.append(tuple(ops[starts[s_iter]:starts[s_iter + 1]]))
            s_iter += 1
        programs.append(RankProgram(r, tuple(steps)))
    return Schedule(nranks=nranks, chunks=tuple(chunks), ranks=tuple(programs),
                    collective=collective, meta=dict(meta))


def runs(chunks: Sequence[int]) -> list[tuple[int, int]]:
    """``chunks`` as ``(first, count)`` runs of consecutive numbers, in order."""
    out: list[tuple[int, int]] = []
    for k in chunks:
        if out and out[-1][0] + out[-1][1] == k:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((k, 1))
    return out


class Timeline:
    """Per-rank ops in global slots; a message's send and recv share a slot.

    Parameters
    ----------
    nranks : int

    Notes
    -----
    Lock-step by construction: at slot ``t`` every op pairs with an op of slot ``t``
    of its peer, so a rank never waits on a peer that waits on it. Ops of one pair
    within a slot are appended to both sides in the same order, so the in-order
    matching of docs/SCHEDULE.md pairs them as intended.
    """

    __slots__ = ("nranks", "slots")

    def __init__(self, nranks: int) -> None:
        self.nranks = nranks
        self.slots: list[list[list[Op]]] = [[] for _ in range(nranks)]

    def _at(self, rank: int, t: int) -> list[Op]:
        steps = self.slots[rank]
        while t >= len(steps):
            steps.append([])
        return steps[t]

    def msg(self, t: int, src: int, dst: int, chunk: int, reduce: bool) -> None:
        """Send ``chunk`` from ``src`` to ``dst`` in slot ``t``; ``reduce`` adds, else overwrites."""
        self._at(src, t).append(_op(_SEND, dst, chunk, False, 1))
        self._at(dst, t).append(_op(_RECV, src, chunk, reduce, 1))

    def msgs(self, t: int, src: int, dst: int, chunks: Sequence[int], reduce: bool) -> None:
        """:meth:`msg` for several chunks of one segment: one op per run of consecutive
        chunks (a chunk range, IR v2), in the order given."""
        if not chunks:
            return
        out, into = self._at(src, t), self._at(dst, t)
        for k, count in runs(chunks):
            out.append(_op(_SEND, dst, k, False, count))
            into.append(_op(_RECV, src, k, reduce, count))

    @property
    def nslots(self) -> int:
        return max((len(s) for s in self.slots), default=0)

    def build(self, chunks: Sequence[float], *, collective: str = DEFAULT_COLLECTIVE,
              **meta: Any) -> Schedule:
        """The Schedule of ``collective``, with empty slots dropped (a rank waits only on
        its peers anyway)."""
        programs = tuple(RankProgram(r, tuple(tuple(ops) for ops in steps if ops))
                         for r, steps in enumerate(self.slots))
        return Schedule(nranks=self.nranks, chunks=tuple(chunks), ranks=programs,
                        collective=collective, meta=dict(meta))


def empty_schedule(cluster: Cluster, algorithm: str, *, collective: str = DEFAULT_COLLECTIVE,
                   **meta: Any) -> Schedule:
    """The 1-rank ``collective``: nothing to move."""
    return Timeline(cluster.nranks).build((1.0,), collective=collective, algorithm=algorithm,
                                          cluster=cluster.name, **meta)


def split(items: Sequence[int], parts: int) -> list[list[int]]:
    """``items`` cut into ``parts`` contiguous lists, sizes differing by at most one."""
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


# --------------------------------------------------------------------------------------
# Ring phases over a group
# --------------------------------------------------------------------------------------

def ring_reduce_scatter(tl: Timeline, t0: int, group: Sequence[int],
                        segments: Sequence[Sequence[int]]) -> int:
    """Ring reduce-scatter: position ``l`` of ``group`` ends holding the sum of ``segments[l]``.

    Takes ``len(group) - 1`` slots from ``t0``; returns the first free slot. At slot
    ``t0 + s`` position ``l`` sends segment ``(l - s - 1) mod g`` to position ``l + 1``
    (Patarasuk and Yuan, 2009).
    """
    g = len(group)
    for s in range(g - 1):
        for pos in range(g):
            tl.msgs(t0 + s, group[pos], group[(pos + 1) % g], segments[(pos - s - 1) % g], True)
    return t0 + max(g - 1, 0)


def ring_allgather(tl: Timeline, t0: int, group: Sequence[int],
                   segments: Sequence[Sequence[int]]) -> int:
    """Ring allgather: position ``l`` starts owning ``segments[l]``; all end with all.

    Takes ``len(group) - 1`` slots from ``t0``; returns the first free slot.
    """
    g = len(group)
    for s in range(g - 1):
        for pos in range(g):
            tl.msgs(t0 + s, group[pos], group[(pos + 1) % g], segments[(pos - s) % g], False)
    return t0 + max(g - 1, 0)
