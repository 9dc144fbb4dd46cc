"""Composed schedules written by hand (IR v3 native steps), and a check that they
allreduce.

``composed(cluster)`` is PowerAI DDL's shape, independent of the composed planner so
that the simulator and the bound are tested where a planner may be wrong:

- boxes of equal size ``G`` (``B`` boxes, ``G * B`` chunks): a native reduce-scatter
  inside each box (local GPU ``l`` ends with part ``l``: chunks ``l B .. l B + B - 1``),
  then a ring among the GPUs of local index ``l`` of every box over part ``l``
  (point-to-point, ``2 (B - 1)`` steps; ``cross="native"``: one native allreduce over
  that rail instead), then a native allgather inside each box;
- boxes of different sizes (``leaders``): a native reduce to each box's first GPU, a
  ring among those GPUs (``B`` chunks), a native broadcast from it.

``allreduces(schedule)`` runs the schedule on contribution sets (the rendezvous rule of
docs/SCHEDULE.md: a step runs when every peer it pairs with, and every member of its
native op, is at the matching step) and says whether every rank ends with every
chunk summed over all ranks once: the test oracle until ``topoplan.verify`` reads
native steps.

The executor's native-step tests run the builders after those on every transport
(tests/support/native_cases.py). Each says what its schedule computes; the composed
ones have the same shape (a collective inside each box, an exchange across boxes, a
collective inside each box again), on rank numbers rather than a cluster. :func:`reference`
computes, with numpy, what a schedule of native steps only leaves in every rank's
buffer, following docs/SCHEDULE.md ("Version 3") literally, so schedules whose result is
no collective (a lone broadcast, a reduce whose other members keep their values) are
checked too.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from topoplan.cluster import Cluster
from topoplan.ir.schedule import (Native, NativeKind, OpKind, Schedule, build_schedule,
                                  equal_chunks, native_op, recv, send)


def _ring(steps: list[list[list[Any]]], ranks: list[int], first: int) -> None:
    """Append a ring allreduce over ``ranks`` on chunks ``first .. first + len - 1``."""
    n = len(ranks)
    for i, r in enumerate(ranks):
        nxt, prv = ranks[(i + 1) % n], ranks[(i - 1) % n]
        for s in range(n - 1):
            steps[r].append([send(nxt, first + (i - s) % n),
                             recv(prv, first + (i - s - 1) % n, reduce=True)])
        for s in range(n - 1):
            steps[r].append([send(nxt, first + (i + 1 - s) % n), recv(prv, first + (i - s) % n)])


def composed(cluster: Cluster, cross: str = "ring") -> Schedule:
    """The composed schedule of ``cluster`` (see the module notes)."""
    n, boxes = cluster.nranks, cluster.boxes
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    sizes = {box.gpus for box in boxes}
    if len(sizes) == 1:
        g, b = boxes[0].gpus, len(boxes)
        for box in boxes:
            for r in box.ranks:
                steps[r].append([native_op("reduce_scatter", box.ranks, 0, g * b)])
        for local in range(g):
            rail = [box.first_rank + local for box in boxes]
            if b > 1 and cross == "native":
                for r in rail:
                    steps[r].append([native_op("allreduce", rail, local * b, b)])
            elif b > 1:
                _ring(steps, rail, local * b)
        for box in boxes:
            for r in box.ranks:
                steps[r].append([native_op("allgather", box.ranks, 0, g * b)])
        return build_schedule(n, equal_chunks(g * b), steps, algorithm=f"composed-{cross}")
    leaders = [box.first_rank for box in boxes]
    for box in boxes:
        for r in box.ranks:
            steps[r].append([native_op("reduce", box.ranks, 0, len(boxes), root=box.first_rank)])
    _ring(steps, leaders, 0)
    for box in boxes:
        for r in box.ranks:
            steps[r].append([native_op("broadcast", box.ranks, 0, len(boxes), root=box.first_rank)])
    return build_schedule(n, equal_chunks(len(boxes)), steps, algorithm="composed-leaders")


def allreduces(schedule: Schedule) -> bool:
    """Whether ``schedule`` ends with every chunk of every rank summed over all ranks
    once (raises ``AssertionError`` naming the problem otherwise)."""
    n, c = schedule.nranks, schedule.nchunks
    value = [[frozenset([r]) for _ in range(c)] for r in range(n)]
    at = [0] * n
    programs = [p.steps for p in schedule.ranks]
    sent: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (src, dst) -> [(step, k)]
    got: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, steps in enumerate(programs):
        for s, step in enumerate(steps):
            for op in step:
                if isinstance(op, Native):
                    continue
                pair = (r, op.peer) if op.kind is OpKind.SEND else (op.peer, r)
                (sent if op.kind is OpKind.SEND else got).setdefault(pair, []).append((s, 0))
    partner: dict[tuple[int, int, int], tuple[int, int]] = {}  # (rank, step, j) -> (peer, step)
    for pair, out in sent.items():
        into = got.get(pair, [])
        assert len(out) == len(into), f"messages {pair}: {len(out)} sends, {len(into)} recvs"
        for (s, _), (t, _) in zip(out, into):
            partner.setdefault((pair[0], s, pair[1]), (pair[1], t))
            partner.setdefault((pair[1], t, pair[0]), (pair[0], s))

    def peers(r: int, s: int) -> list[tuple[int, int]]:
        out = []
        for op in programs[r][s]:
            if isinstance(op, Native):
                seen = [i for i, p in enumerate(programs[r][:s])
                        if any(isinstance(x, Native) and x.group == op.group for x in p)]
                k = len(seen)
                for m in op.group:
                    hits = [i for i, p in enumerate(programs[m])
                            if any(isinstance(x, Native) and x.group == op.group for x in p)]
                    assert len(hits) > k, f"rank {m} never runs op {k} over {op.group}"
                    out.append((m, hits[k]))
            else:
                out.append(partner[(r, s, op.peer)])
        return out

    while any(at[r] < len(programs[r]) for r in range(n)):
        ready = [r for r in range(n) if at[r] < len(programs[r])
                 and all(at[m] == t for m, t in peers(r, at[r]))]
        assert ready, f"deadlock at steps {at}"
        before = [list(v) for v in value]
        for r in ready:
            s = at[r]
            for op in programs[r][s]:
                if isinstance(op, Native):
                    _native(op, r, before, value)
                elif op.kind is OpKind.RECV:
                    for ch in range(op.chunk, op.end):
                        incoming = before[op.peer][ch]
                        if op.reduce:
                            assert not incoming & value[r][ch], f"rank {r} chunk {ch} twice"
                            value[r][ch] = value[r][ch] | incoming
                        else:
                            value[r][ch] = incoming
        for r in ready:
            at[r] += 1
    everyone = frozenset(range(n))
    for r in range(n):
        for ch in range(c):
            assert value[r][ch] == everyone, f"rank {r} chunk {ch} holds {sorted(value[r][ch])}"
    return True


def _native(op: Native, r: int, before: list[list[frozenset]], value: list[list[frozenset]]
            ) -> None:
    group, i = op.group, op.group.index(r)

    def total(ch: int) -> frozenset:
        out: frozenset = frozenset()
        for m in group:
            assert not out & before[m][ch], f"native {op.text()} counts a rank twice"
            out = out | before[m][ch]
        return out

    if op.kind is NativeKind.ALLREDUCE or (op.kind is NativeKind.REDUCE and r == op.root):
        for ch in range(op.chunk, op.end):
            value[r][ch] = total(ch)
    elif op.kind is NativeKind.REDUCE_SCATTER:
        lo, hi = op.part(i)
        for ch in range(lo, hi):
            value[r][ch] = total(ch)
    elif op.kind is NativeKind.ALLGATHER:
        for j, m in enumerate(group):
            lo, hi = op.part(j)
            for ch in range(lo, hi):
                value[r][ch] = before[m][ch]
    elif op.kind is NativeKind.BROADCAST:
        for ch in range(op.chunk, op.end):
            value[r][ch] = before[op.root][ch]  # type: ignore[index]


# -- the executor's cases ------------------------------------------------------------
def boxes(nboxes: int, per_box: int) -> list[list[int]]:
    """Ranks ``b * per_box .. (b + 1) * per_box - 1`` share box ``b``."""
    return [list(range(b * per_box, (b + 1) * per_box)) for b in range(nboxes)]


def composed_allreduce(nboxes: int, per_box: int, chunks: Sequence[float] | None = None
                       ) -> Schedule:
    """An allreduce of native steps only: reduce-scatter in each box, allreduce of each
    part over its rail (the ranks at the same place in every box), allgather in each box.

    ``chunks`` (a multiple of ``per_box`` of them; default ``per_box`` equal ones) may be
    unequal, so the parts differ in elements.
    """
    chunks = tuple(chunks) if chunks is not None else (1.0 / per_box,) * per_box
    k = len(chunks)
    part = k // per_box
    steps = []
    for r in range(nboxes * per_box):
        box, local = divmod(r, per_box)
        group = boxes(nboxes, per_box)[box]
        rail = [b * per_box + local for b in range(nboxes)]
        steps.append([[native_op("reduce_scatter", group, 0, k)],
                      [native_op("allreduce", rail, local * part, part)],
                      [native_op("allgather", group, 0, k)]])
    return build_schedule(nboxes * per_box, chunks, steps, algorithm="composed-rails")


def two_boxes(per_box: int = 2, chunks: Sequence[float] | None = None) -> Schedule:
    """The composed allreduce of two boxes with a planned exchange across them: native
    reduce-scatter in each box, each rank swaps its part with the rank at its place in
    the other box (a send and a reducing receive), native allgather in each box
    (``tests/test_schedule_native.py::two_boxes`` for ``per_box=2``)."""
    chunks = tuple(chunks) if chunks is not None else (1.0 / (2 * per_box),) * (2 * per_box)
    k = len(chunks)
    part = k // per_box
    n = 2 * per_box
    steps = []
    for r in range(n):
        box, local = divmod(r, per_box)
        group = boxes(2, per_box)[box]
        peer = (r + per_box) % n
        steps.append([[native_op("reduce_scatter", group, 0, k)],
                      [send(peer, local * part, part), recv(peer, local * part, True, part)],
                      [native_op("allgather", group, 0, k)]])
    return build_schedule(n, chunks, steps, algorithm="composed-two-boxes")


def native_allreduce(n: int) -> Schedule:
    """One step: the transport's own allreduce over every rank (the ``nccl`` candidate)."""
    return build_schedule(n, (1.0,), [[[native_op("allreduce", range(n), 0)]] for _ in range(n)],
                          algorithm="native")


def reduce_then_broadcast(n: int, root: int) -> Schedule:
    """An allreduce: native reduce to ``root``, native broadcast from it."""
    group = list(range(n))
    return build_schedule(n, (0.5, 0.5), [[[native_op("reduce", group, 0, 2, root=root)],
                                           [native_op("broadcast", group, 0, 2, root=root)]]
                                          for _ in range(n)], algorithm="reduce-broadcast")


def scatter_then_gather(n: int, order: Sequence[int] | None = None,
                        chunks: Sequence[float] | None = None) -> Schedule:
    """An allreduce: native reduce-scatter then allgather over every rank, the group in
    ``order`` (default rank order: the whole world, the transport's own communicator)."""
    group = list(order) if order is not None else list(range(n))
    chunks = tuple(chunks) if chunks is not None else (1.0 / n,) * n
    k = len(chunks)
    return build_schedule(n, chunks, [[[native_op("reduce_scatter", group, 0, k)],
                                       [native_op("allgather", group, 0, k)]] for _ in range(n)],
                          algorithm="scatter-gather")


def lone(kind: str, n: int, group: Sequence[int], *, chunk: int = 0, count: int | None = None,
         nchunks: int | None = None, root: int | None = None,
         chunks: Sequence[float] | None = None) -> Schedule:
    """One native op over ``group`` (the other ranks idle): results by :func:`reference`."""
    k = nchunks if nchunks is not None else (len(chunks) if chunks else 2 * len(group))
    fractions = tuple(chunks) if chunks is not None else (1.0 / k,) * k
    op = native_op(kind, group, chunk, count if count is not None else k - chunk, root=root)
    return build_schedule(n, fractions, [[[op]] if r in group else [] for r in range(n)],
                          algorithm=f"lone-{kind}")


def composed_reduce_scatter(per_box: int, shard_chunks: Sequence[float] | None = None
                            ) -> Schedule:
    """A reduce-scatter schedule over two boxes: each rank first swaps with the rank at
    its place in the other box the half of the buffer whose shards the other box holds
    (a send and a reducing receive), then each box reduce-scatters its own half natively.

    ``shard_chunks``: the fractions of one shard's chunks (they may be unequal).
    """
    n = 2 * per_box
    inner = tuple(shard_chunks) if shard_chunks is not None else (1.0,)
    chunks = tuple(f / sum(inner) / n for _ in range(n) for f in inner)
    per = len(inner) * per_box  # chunks of one box's half
    steps = []
    for r in range(n):
        box, _ = divmod(r, per_box)
        peer = (r + per_box) % n
        mine, theirs = box * per, (1 - box) * per
        steps.append([[send(peer, theirs, per), recv(peer, mine, True, per)],
                      [native_op("reduce_scatter", boxes(2, per_box)[box], mine, per)]])
    return build_schedule(n, chunks, steps, collective="reduce_scatter",
                          algorithm="composed-rs")


def composed_allgather(per_box: int, shard_chunks: Sequence[float] | None = None) -> Schedule:
    """An allgather schedule over two boxes: each box allgathers its half natively, then
    each rank swaps halves with the rank at its place in the other box (overwriting)."""
    n = 2 * per_box
    inner = tuple(shard_chunks) if shard_chunks is not None else (1.0,)
    chunks = tuple(f / sum(inner) / n for _ in range(n) for f in inner)
    per = len(inner) * per_box
    steps = []
    for r in range(n):
        box, _ = divmod(r, per_box)
        peer = (r + per_box) % n
        mine, theirs = box * per, (1 - box) * per
        steps.append([[native_op("allgather", boxes(2, per_box)[box], mine, per)],
                      [send(peer, mine, per), recv(peer, theirs, False, per)]])
    return build_schedule(n, chunks, steps, collective="allgather", algorithm="composed-ag")


def native_reduce_scatter(n: int) -> Schedule:
    """A reduce-scatter schedule of one native reduce-scatter over every rank."""
    return build_schedule(n, (1.0 / n,) * n,
                          [[[native_op("reduce_scatter", range(n), 0, n)]] for _ in range(n)],
                          collective="reduce_scatter", algorithm="native-rs")


def native_allgather(n: int) -> Schedule:
    """An allgather schedule of one native allgather over every rank."""
    return build_schedule(n, (1.0 / n,) * n,
                          [[[native_op("allgather", range(n), 0, n)]] for _ in range(n)],
                          collective="allgather", algorithm="native-ag")


def reference(schedule: Schedule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Every rank's buffer after ``schedule`` (native steps only) ran on ``inputs`` (the
    full buffers, float64), by docs/SCHEDULE.md's rules: the ops of a group meet when
    every member reaches its next one, read the values of that moment and write their
    results at once. Sums add the members in group order."""
    n = len(inputs[0])
    bounds = schedule.chunk_bounds(n)
    bufs = [np.array(x, dtype=np.float64) for x in inputs]
    at = [0] * schedule.nranks
    programs = [p.steps for p in schedule.ranks]
    while any(at[r] < len(programs[r]) for r in range(schedule.nranks)):
        for r in range(schedule.nranks):
            if at[r] >= len(programs[r]):
                continue
            op = programs[r][at[r]][0]
            if not isinstance(op, Native):
                raise ValueError("reference() runs native steps only")
            if all(at[m] < len(programs[m]) and programs[m][at[m]][0] == op for m in op.group):
                _apply(op, bufs, bounds)
                for m in op.group:
                    at[m] += 1
                break
        else:
            raise ValueError("the native steps never meet: a deadlock")
    return bufs


def _apply(op: Native, bufs: list[np.ndarray], bounds: list[tuple[int, int]]) -> None:
    a, b = bounds[op.chunk][0], bounds[op.end - 1][1]
    seen = [bufs[m][a:b].copy() for m in op.group]
    total = np.sum(seen, axis=0) if seen else None
    g = len(op.group)

    def part(i: int) -> tuple[int, int]:
        lo, hi = op.part(i)
        return bounds[lo][0] - a, (bounds[hi - 1][1] - a) if hi > lo else bounds[lo][0] - a

    for i, m in enumerate(op.group):
        out = bufs[m][a:b]
        if op.kind is NativeKind.ALLREDUCE:
            out[...] = total
        elif op.kind is NativeKind.REDUCE_SCATTER:
            lo, hi = part(i)
            out[lo:hi] = total[lo:hi]
        elif op.kind is NativeKind.ALLGATHER:
            for j in range(g):
                lo, hi = part(j)
                out[lo:hi] = seen[j][lo:hi]
        elif op.kind is NativeKind.BROADCAST:
            out[...] = seen[op.group.index(op.root)]
        elif op.kind is NativeKind.REDUCE and m == op.root:
            out[...] = total
