"""A schedule's native collective steps (IR v3), matched into ops over their groups.

The k-th native op over a group at one member is the k-th over that group at every
other member (docs/SCHEDULE.md, "Version 3"); together they are one *instance*, which
starts once every member has started its step and ends for all of them at once. The
simulator matches them here, apart from the messages (:mod:`topoplan.ir.matching`
matches sends and receives): it hands the matcher the schedule with every native step
emptied, and runs the instances itself. A schedule need not be verified: a member
missing, or members that disagree on the op, raise :class:`ScheduleError` naming the
rank, step and group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from ..._util import ObjectCache
from ...errors import ScheduleError
from ...ir.schedule import Native, RankProgram, Schedule

if TYPE_CHECKING:
    from ...ir.matching import Messages

__all__ = ["NativeSteps", "native_steps"]


@dataclass(frozen=True)
class NativeSteps:
    """A schedule's native instances.

    Attributes
    ----------
    p2p : Schedule
        The schedule with every native step emptied (steps keep their places).
    ops : tuple of Native
        One op per instance, in order of first appearance (rank by rank).
    members : tuple of tuple of (int, int)
        Each instance's ``(rank, step)`` per member, in group order.
    """

    p2p: Schedule
    ops: tuple[Native, ...]
    members: tuple[tuple[tuple[int, int], ...], ...]

    def __len__(self) -> int:
        return len(self.ops)

    def global_steps(self, found: Messages) -> tuple[np.ndarray, np.ndarray]:
        """Each instance's member steps, numbered globally (as ``found``, the
        :class:`~topoplan.ir.matching.Messages` of :attr:`p2p`, numbers them), as CSR:
        ``(ptr, steps)``."""
        counts = np.fromiter((len(m) for m in self.members), np.int64, count=len(self.members))
        ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        base = found.prog_base.tolist()
        flat = [base[r] + s for m in self.members for r, s in m]
        return ptr, found.prog_first[np.asarray(flat, dtype=np.int64)]


def _split(schedule: Schedule) -> NativeSteps | None:
    name = f"{schedule.algorithm} schedule"
    found: dict[tuple[tuple[int, ...], int], dict[int, tuple[int, Native]]] = {}
    order: list[tuple[tuple[int, ...], int]] = []
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    programs = list(schedule.ranks)
    for i, program in enumerate(schedule.ranks):
        if Native not in map(type, chain.from_iterable(program.steps)):  # the common case,
            continue                                                   # at C speed
        steps = None
        for s, step in enumerate(program.steps):
            if Native not in map(type, step):
                continue
            natives = [op for op in step if isinstance(op, Native)]
            r = program.rank
            op = natives[0]
            if len(step) != 1:
                raise ScheduleError(f"{name}: rank {r} step {s}: a native {op.kind.value} "
                                    f"stands alone in its step; this step has {len(step)} ops")
            if r not in op.group:
                raise ScheduleError(f"{name}: rank {r} step {s}: runs {op.text()}, a group "
                                    f"it is not in")
            bad = [m for m in op.group if not 0 <= m < schedule.nranks]
            if bad or len(set(op.group)) != len(op.group):
                what = (f"rank {bad[0]}, outside range({schedule.nranks})" if bad
                        else "a rank twice")
                raise ScheduleError(f"{name}: rank {r} step {s}: {op.text()} names {what}")
            if op.chunk < 0 or op.count < 1 or op.end > schedule.nchunks:
                raise ScheduleError(f"{name}: rank {r} step {s}: {op.text()}: chunks out of "
                                    f"range({schedule.nchunks})")
            k = seen.get((r, op.group), 0)
            seen[(r, op.group)] = k + 1
            key = (op.group, k)
            if key not in found:
                found[key] = {}
                order.append(key)
            found[key][r] = (s, op)
            if steps is None:
                steps = list(program.steps)
            steps[s] = ()
        if steps is not None:
            programs[i] = RankProgram(program.rank, tuple(steps))
    if not order:
        return None
    ops, members = [], []
    for key in order:
        group, k = key
        at = found[key]
        first_rank = next(iter(at))
        first_step, op = at[first_rank]
        for m in group:
            if m not in at:
                ran = seen.get((m, group), 0)
                raise ScheduleError(
                    f"{name}: unmatched native op: rank {first_rank} step {first_step} runs "
                    f"{op.text()} as op {k} over that group, but rank {m} runs only {ran} "
                    f"native op{'s' if ran != 1 else ''} over it")
            s, other = at[m]
            if (other.kind, other.chunk, other.count, other.root) != (op.kind, op.chunk,
                                                                      op.count, op.root):
                raise ScheduleError(
                    f"{name}: native op {k} over group {{{', '.join(map(str, group))}}}: "
                    f"rank {first_rank} step {first_step} runs {op.text()} but rank {m} step "
                    f"{s} runs {other.text()}")
        ops.append(op)
        members.append(tuple((m, at[m][0]) for m in group))
    return NativeSteps(replace(schedule, ranks=tuple(programs)), tuple(ops), tuple(members))


_SPLIT: ObjectCache[Schedule, NativeSteps | None] = ObjectCache(_split)


def native_steps(schedule: Schedule) -> NativeSteps | None:
    """The native instances of ``schedule``, or ``None`` when it has none; computed once
    per schedule object.

    Raises
    ------
    ScheduleError
        For a native op sharing its step, naming a group it is not in or a bad rank or
        chunk, a member that never runs the op, or members that disagree on it.
    """
    return _SPLIT(schedule)
