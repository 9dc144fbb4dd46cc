"""verify() as it was before the fast engine: the oracle of the tests and the benchmark.

A copy of ``topoplan/ir/verify.py`` at commit cf175d6: a Python queue runs each rank as far
as its peers let it, op by op, over :class:`_Chunks` runs. The tests check that the fast
:func:`topoplan.verify.verify` accepts and rejects the same schedules with the same
message; ``scripts/bench_verify.py`` times both.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from typing import Callable

from topoplan.ir.collectives import Collective, collective_of
from topoplan.errors import ScheduleError
from topoplan.ir.schedule import Op, OpKind, Schedule, chunk_text, recv_clash
from topoplan.ir.verify import VerifyReport

__all__ = ["verify_reference"]


def _ranks_text(mask: int, nranks: int) -> str:
    members = [r for r in range(nranks) if mask >> r & 1]
    if len(members) > 12:
        return "{" + ", ".join(map(str, members[:10])) + f", ... ({len(members)} ranks)" + "}"
    return "{" + ", ".join(map(str, members)) + "}"


class _Chunks:
    """One rank's chunks as runs ``[starts[i], starts[i+1])`` of equal bitmasks.

    Adjacent runs with equal masks are merged after every write, so chunks that
    move together (a segment of a reduce-scatter level) stay one run.
    """

    __slots__ = ("starts", "masks", "n")

    def __init__(self, n: int, mask: int) -> None:
        self.n = n
        self.starts = [0]
        self.masks = [mask]

    @classmethod
    def from_runs(cls, n: int, runs: list[tuple[int, int, int]]) -> _Chunks:
        """Chunks ``0 .. n - 1`` holding the ``(start, end, mask)`` runs, which tile them in order."""
        chunks = cls(n, runs[0][2])
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
                if masks[k] & m:
                    return self.starts[k], masks[k] & m
                masks[k] |= m
            lo = i if lo < 0 else lo
            hi = j
        self._merge(lo - 1, hi + 1)
        return None

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


def verify_reference(schedule: Schedule) -> VerifyReport:
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
        whose chunks straddle two shards.

    Notes
    -----
    Time is O(sum over ops of the runs of equal bitmasks the op touches) big-integer
    operations; memory O(ops + runs). A v1 ring at 1024 ranks (4 M ops) and a
    multi-level v2 plan for 8192 ranks both take seconds.
    """
    # numpy comes in here, on first use, not with ``import topoplan``.
    import numpy as np

    from topoplan.ir.matching import deadlock_error, match_messages, wait_text

    n, nchunks = schedule.nranks, schedule.nchunks
    name = f"{schedule.algorithm} schedule"

    def fail(message: str) -> ScheduleError:
        return ScheduleError(f"{name}: {message}")

    try:
        collective = collective_of(schedule)
    except ScheduleError as exc:
        raise fail(str(exc)) from None
    empty_possible = collective.starts_empty

    # Bad peers and chunks, then the static matching: the k-th send src->dst pairs with
    # the k-th recv at dst from src (shared with the simulator).
    found = match_messages(schedule)
    step_base, op_ptr = found.step_base.tolist(), found.op_ptr.tolist()
    recvs_per_step = np.bincount(found.t_rstep, minlength=found.nglobal)
    for g in np.flatnonzero(recvs_per_step > 1).tolist():
        r = int(found.step_rank[g])
        s = g - step_base[r]
        step = schedule.ranks[r].steps[s]
        twice = recv_clash([(op.chunk, op.end, op.reduce) for op in step
                            if op.kind is not OpKind.SEND])
        if twice is not None:
            raise fail(f"rank {r} step {s}: two recvs into chunk {twice} in one step")
    # For every op (in program order): its message (an index into the snapshot list)
    # and the step its peer must have reached for the message to complete.
    mid, need = found.op_messages()
    nmessages = len(found.t_src)
    del found, recvs_per_step

    # Dynamic execution.
    programs = [p.steps for p in schedule.ranks]
    state = [_Chunks.from_runs(nchunks, collective.initial(r)) for r in range(n)]
    pc = [0] * n  # the step each rank is in (== len(steps) when done)
    snapshot: list = [None] * nmessages  # a send's value, from its step's start to its recv
    _send = OpKind.SEND

    def enter(r: int) -> None:
        s = pc[r]
        if s < len(programs[r]):
            read = state[r].read
            lo = op_ptr[step_base[r] + s]
            for j, op in enumerate(programs[r][s]):
                if op.kind is _send:
                    snapshot[mid[lo + j]] = read(op.chunk, op.chunk + op.count)

    for r in range(n):
        enter(r)
    queue = deque(range(n))
    queued = [True] * n
    while queue:
        r = queue.popleft()
        queued[r] = False
        steps_r, base_r, chunks_r = programs[r], step_base[r], state[r]
        while pc[r] < len(steps_r):
            s = pc[r]
            step = steps_r[s]
            lo = op_ptr[base_r + s]
            if any(pc[op.peer] < need[lo + j] for j, op in enumerate(step)):
                break  # some peer has not reached the matching step yet
            # A step's overwriting recvs overlap no other recv, and adds commute, so
            # applying its recvs one by one is the same as applying them together when
            # the step ends (several reducing recvs of one chunk all add: IR v2).
            for j, op in enumerate(step):
                if op.kind is not _send:
                    m = mid[lo + j]
                    value = snapshot[m]
                    snapshot[m] = None
                    if empty_possible:
                        _check_filled(fail, chunks_r, r, s, op, value)
                    if op.reduce:
                        clash = chunks_r.add(op.chunk, value)
                        if clash is not None:
                            chunk, mask = clash
                            raise fail(f"rank {r} step {s} reduces chunk {chunk} from rank "
                                       f"{op.peer}: contributions {_ranks_text(mask, n)} would "
                                       "be counted twice")
                    else:
                        chunks_r.write(op.chunk, op.chunk + op.count, value)
            pc[r] += 1
            enter(r)
            for op in step:  # peers may have been waiting for this rank
                if not queued[op.peer]:
                    queued[op.peer] = True
                    queue.append(op.peer)
            if pc[r] < len(steps_r):
                for op in steps_r[pc[r]]:
                    if not queued[op.peer]:
                        queued[op.peer] = True
                        queue.append(op.peer)

    blocked = [r for r in range(n) if pc[r] < len(programs[r])]
    if blocked:
        r = blocked[0]
        s = pc[r]
        lo = op_ptr[step_base[r] + s]
        waits = [wait_text(op.kind, op.chunk, op.count, op.peer, pc[op.peer], need[lo + j])
                 for j, op in enumerate(programs[r][s]) if pc[op.peer] < need[lo + j]]
        raise deadlock_error(name, len(blocked), r, s, waits)

    for r in range(n):
        for a, b, want in collective.postcondition(r):
            if want is None:
                continue
            for k, _, mask in state[r].read(a, b):
                if mask != want:
                    raise fail(_wrong_end(collective, r, k, mask, want))
    return VerifyReport(nranks=n, nchunks=nchunks, nsteps=schedule.nsteps, nmessages=nmessages,
                        collective=collective.name)


def _check_filled(fail: Callable[[str], ScheduleError], chunks: _Chunks, rank: int, step: int,
                  op: Op, value: list[tuple[int, int, int]]) -> None:
    """A recv must bring something, and may add only into a chunk that holds something
    (an allgather's chunks start empty: they have no value to send or to add to)."""
    for start, _, mask in value:
        if not mask:
            raise fail(f"rank {rank} step {step} receives {chunk_text(start)} from rank "
                       f"{op.peer}, which held nothing there when its send's step started "
                       f"(it had not received that chunk yet)")
    if op.reduce:
        k = chunks.first_empty(op.chunk, op.end)
        if k is not None:
            raise fail(f"rank {rank} step {step} reduces {chunk_text(k)} from rank {op.peer} "
                       f"into a chunk that holds nothing yet; receive it without reduce")


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
