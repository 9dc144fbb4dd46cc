"""vectorize() and split_vectored() as they were before they worked on arrays: the
oracles of the tests.

Copies of ``topoplan/ir/schedule.py`` at commit 6e4492e: a Python loop over every op that
gathers each pair's messages in dicts and merges each group's ranges in lists, and a split
through ``dataclasses.replace``. tests/test_vectored.py checks that the array versions
give the same schedules, op for op, on planned and random (often malformed) schedules.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from topoplan.ir.schedule import Native, Op, OpKind, RankProgram, Schedule, Step

__all__ = ["vectorize_reference", "split_vectored_reference"]


def vectorize_reference(schedule: Schedule) -> Schedule:
    """topoplan.ir.schedule.vectorize as it was at 6e4492e: a loop over the ops."""
    sends: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for program in schedule.ranks:
        r = program.rank
        for s, step in enumerate(program.steps):
            for j, op in enumerate(step):
                if isinstance(op, Native):
                    continue
                if op.kind is OpKind.SEND:
                    sends.setdefault((r, op.peer, op.channel), []).append((s, j))
                else:
                    recvs.setdefault((op.peer, r, op.channel), []).append((s, j))
    steps: list[list[list[Any]]] = [[list(step) for step in p.steps] for p in schedule.ranks]
    dropped: set[tuple[int, int, int]] = set()
    for (src, dst, _), out in sends.items():
        into = recvs.get((src, dst, _))
        if into is None or len(into) != len(out):
            continue
        groups: dict[tuple[int, int, bool], list[int]] = {}
        for k, ((s, j), (t, i)) in enumerate(zip(out, into)):
            groups.setdefault((s, t, steps[dst][t][i].reduce), []).append(k)
        for (s, t, _), ks in groups.items():
            if len(ks) < 2:
                continue
            pairs = [(steps[src][s][out[k][1]], steps[dst][t][into[k][1]]) for k in ks]
            if any(a.ranges != b.ranges for a, b in pairs):
                continue  # a mismatched pair: left for verify to name
            ranges = sorted(rng for a, _b in pairs for rng in a.ranges)
            merged: list[list[int]] = []
            for a, c in ranges:
                if merged and a < merged[-1][0] + merged[-1][1]:
                    break  # overlapping ranges (reducing recvs of one chunk): leave them
                if merged and a == merged[-1][0] + merged[-1][1]:
                    merged[-1][1] += c
                else:
                    merged.append([a, c])
            else:
                (chunk, count), more = merged[0], tuple((a, c) for a, c in merged[1:])
                first_s, first_r = pairs[0]
                steps[src][s][out[ks[0]][1]] = replace(first_s, chunk=chunk, count=count,
                                                       more=more)
                steps[dst][t][into[ks[0]][1]] = replace(first_r, chunk=chunk, count=count,
                                                        more=more)
                for k in ks[1:]:
                    dropped.add((src, s, out[k][1]))
                    dropped.add((dst, t, into[k][1]))
    if not dropped:
        return schedule
    programs = tuple(
        RankProgram(r, tuple(tuple(op for j, op in enumerate(step) if (r, s, j) not in dropped)
                             for s, step in enumerate(steps[r])))
        for r in range(schedule.nranks))
    return replace(schedule, ranks=programs)


def split_vectored_reference(schedule: Schedule) -> Schedule:
    """topoplan.ir.schedule.split_vectored as it was at 6e4492e."""
    if not any(op.more for _, _, op in schedule.ops()):
        return schedule
    programs = []
    for program in schedule.ranks:
        steps: list[Step] = []
        for step in program.steps:
            if any(op.more for op in step):
                step = tuple(piece for op in step for piece in (
                    [replace(op, chunk=a, count=c, more=())
                     for a, c in op.ranges]  # type: ignore[union-attr]
                    if isinstance(op, Op) and op.more else [op]))
            steps.append(step)
        programs.append(RankProgram(program.rank, tuple(steps)))
    return replace(schedule, ranks=tuple(programs))
