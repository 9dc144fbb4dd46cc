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
"""

from __future__ import annotations

from typing import Any

from topoplan.cluster import Cluster
from topoplan.ir.schedule import Native, NativeKind, OpKind, Schedule, build_schedule, \
    equal_chunks, native, recv, send


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
                steps[r].append([native("reduce_scatter", box.ranks, 0, g * b)])
        for local in range(g):
            rail = [box.first_rank + local for box in boxes]
            if b > 1 and cross == "native":
                for r in rail:
                    steps[r].append([native("allreduce", rail, local * b, b)])
            elif b > 1:
                _ring(steps, rail, local * b)
        for box in boxes:
            for r in box.ranks:
                steps[r].append([native("allgather", box.ranks, 0, g * b)])
        return build_schedule(n, equal_chunks(g * b), steps, algorithm=f"composed-{cross}")
    leaders = [box.first_rank for box in boxes]
    for box in boxes:
        for r in box.ranks:
            steps[r].append([native("reduce", box.ranks, 0, len(boxes), root=box.first_rank)])
    _ring(steps, leaders, 0)
    for box in boxes:
        for r in box.ranks:
            steps[r].append([native("broadcast", box.ranks, 0, len(boxes), root=box.first_rank)])
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
