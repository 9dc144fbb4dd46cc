"""Symbolic execution of a schedule: the oracle every planner is tested against.

Each (rank, chunk) holds the set of ranks whose contribution it contains, as a
bitmask. Steps run with the semantics of DESIGN.md: sends snapshot the chunk when
their step starts, recvs overwrite or reduce when their step ends, messages
between an ordered pair match in order. A send completes only once the receiver
has started the matching step (rendezvous), so a schedule that verifies cannot
deadlock on any transport.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from .errors import ScheduleError
from .schedule import OpKind, Schedule

__all__ = ["verify", "VerifyReport"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked."""

    nranks: int
    nchunks: int
    nsteps: int
    nmessages: int


def _ranks_text(mask: int, nranks: int) -> str:
    members = [r for r in range(nranks) if mask >> r & 1]
    if len(members) > 12:
        return "{" + ", ".join(map(str, members[:10])) + f", ... ({len(members)} ranks)" + "}"
    return "{" + ", ".join(map(str, members)) + "}"


def verify(schedule: Schedule) -> VerifyReport:
    """Check that ``schedule`` computes an allreduce and cannot deadlock.

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
        one chunk in a step, a contribution counted twice, a deadlock, or a final chunk
        that does not hold every rank's contribution exactly once.

    Notes
    -----
    Time and memory are O(ops + nranks * nchunks) with big-integer bitmasks.
    """
    n, nchunks = schedule.nranks, schedule.nchunks
    name = f"{schedule.algorithm} schedule"

    def fail(message: str) -> ScheduleError:
        return ScheduleError(f"{name}: {message}")

    if len(schedule.ranks) != n or any(p.rank != r for r, p in enumerate(schedule.ranks)):
        raise fail(f"expected programs for ranks 0..{n - 1} in order")

    # Static matching: the k-th send src->dst pairs with the k-th recv at dst from src.
    sends: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for program in schedule.ranks:
        r = program.rank
        for s, step in enumerate(program.steps):
            received: set[int] = set()
            for j, op in enumerate(step):
                if not 0 <= op.peer < n or op.peer == r:
                    raise fail(f"rank {r} step {s}: bad peer {op.peer}")
                if not 0 <= op.chunk < nchunks:
                    raise fail(f"rank {r} step {s}: chunk {op.chunk} out of range({nchunks})")
                if op.kind is OpKind.SEND:
                    sends[(r, op.peer)].append((s, j, op.chunk))
                else:
                    if op.chunk in received:
                        raise fail(f"rank {r} step {s}: two recvs into chunk {op.chunk} in one step")
                    received.add(op.chunk)
                    recvs[(op.peer, r)].append((s, j, op.chunk))

    # partner[(rank, step, j)] = (peer, peer_step, peer_j)
    partner: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    nmessages = 0
    for pair in set(sends) | set(recvs):
        src, dst = pair
        out, into = sends.get(pair, []), recvs.get(pair, [])
        for k in range(min(len(out), len(into))):
            (ss, sj, sc), (rs, rj, rc) = out[k], into[k]
            if sc != rc:
                raise fail(f"message {k} from rank {src} to rank {dst}: rank {src} step {ss} sends "
                           f"chunk {sc} but rank {dst} step {rs} receives it as chunk {rc}")
            partner[(src, ss, sj)] = (dst, rs, rj)
            partner[(dst, rs, rj)] = (src, ss, sj)
        if len(out) != len(into):
            if len(out) > len(into):
                s, _, c = out[len(into)]
                raise fail(f"unmatched send: rank {src} step {s} sends chunk {c} to rank {dst}, "
                           f"which receives only {len(into)} of {len(out)} messages from rank {src}")
            s, _, c = into[len(out)]
            raise fail(f"unmatched recv: rank {dst} step {s} waits for chunk {c} from rank {src}, "
                       f"which sends only {len(out)} of {len(into)} messages to rank {dst}")
        nmessages += len(out)

    # Dynamic execution.
    state = [[1 << r] * nchunks for r in range(n)]
    pc = [0] * n  # the step each rank is in (== len(steps) when done)
    snapshot: dict[tuple[int, int, int], int] = {}
    programs = [p.steps for p in schedule.ranks]

    def enter(r: int) -> None:
        s = pc[r]
        if s < len(programs[r]):
            for j, op in enumerate(programs[r][s]):
                if op.kind is OpKind.SEND:
                    snapshot[(r, s, j)] = state[r][op.chunk]

    for r in range(n):
        enter(r)
    queue = deque(range(n))
    queued = [True] * n
    while queue:
        r = queue.popleft()
        queued[r] = False
        while pc[r] < len(programs[r]):
            s = pc[r]
            step = programs[r][s]
            if any(pc[partner[(r, s, j)][0]] < partner[(r, s, j)][1] for j in range(len(step))):
                break  # some peer has not reached the matching step yet
            updates = []
            for j, op in enumerate(step):
                if op.kind is OpKind.RECV:
                    value = snapshot.pop(partner[(r, s, j)])
                    if op.reduce:
                        twice = value & state[r][op.chunk]
                        if twice:
                            raise fail(f"rank {r} step {s} reduces chunk {op.chunk} from rank "
                                       f"{op.peer}: contributions {_ranks_text(twice, n)} would "
                                       "be counted twice")
                        updates.append((op.chunk, state[r][op.chunk] | value))
                    else:
                        updates.append((op.chunk, value))
            for chunk, value in updates:
                state[r][chunk] = value
            pc[r] += 1
            enter(r)
            for op in programs[r][s]:  # peers may have been waiting for this rank
                if not queued[op.peer]:
                    queued[op.peer] = True
                    queue.append(op.peer)
            if pc[r] < len(programs[r]):
                for op in programs[r][pc[r]]:
                    if not queued[op.peer]:
                        queued[op.peer] = True
                        queue.append(op.peer)

    blocked = [r for r in range(n) if pc[r] < len(programs[r])]
    if blocked:
        r = blocked[0]
        s = pc[r]
        waits = []
        for j, op in enumerate(programs[r][s]):
            peer, peer_step, _ = partner[(r, s, j)]
            if pc[peer] < peer_step:
                waits.append(f"{op.kind.value} chunk {op.chunk} with rank {peer}, which is stuck "
                             f"at step {pc[peer]} before its matching step {peer_step}")
        raise fail(f"deadlock: {len(blocked)} ranks cannot finish; rank {r} step {s} waits to "
                   + "; ".join(waits[:3]))

    full = (1 << n) - 1
    for r in range(n):
        for k in range(nchunks):
            if state[r][k] != full:
                missing = full & ~state[r][k]
                raise fail(f"rank {r} ends with chunk {k} holding {_ranks_text(state[r][k], n)}; "
                           f"expected all of 0..{n - 1} once (missing {_ranks_text(missing, n)})")
    return VerifyReport(nranks=n, nchunks=nchunks, nsteps=schedule.nsteps, nmessages=nmessages)
