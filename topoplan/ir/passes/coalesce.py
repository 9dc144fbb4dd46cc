"""A pass: a pair's back-to-back messages over consecutive chunks as one range (IR v2)."""

from __future__ import annotations

from dataclasses import replace

from ..schedule import Native, Op, OpKind, RankProgram, Schedule

__all__ = ["coalesce"]


def coalesce(schedule: Schedule) -> Schedule:
    """Merge each pair's back-to-back messages over consecutive chunks into ranges (v2).

    Messages ``k`` and ``k + 1`` from ``src`` to ``dst`` merge when both sides run
    them in the same step, their chunks are consecutive and the recv's ``reduce``
    agrees; the merged op takes the first one's place on both sides. The result
    computes the same thing with fewer, larger messages. Unmatched messages are left
    as they are (:func:`topoplan.verify` reports them). Vectored messages (IR v4) are
    left as they are; :func:`~topoplan.ir.passes.vectorize` merges those.
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
