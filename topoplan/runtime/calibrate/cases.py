"""The micro-benchmarks of a calibration: :func:`calibration_cases` for ``n`` ranks.

- ``pingpong``: ranks 0 and 1 bounce 8-byte messages with the transport API alone (one
  ``start``/``wait`` per trip, outside the executor) while the other ranks sleep, with one
  and with four messages per trip; half a round trip is the one-way time, and the line
  through the two is the transport's latency (``alpha``) plus its posting cost per message;
- executor runs (:class:`~topoplan.runtime.executor.Allreduce`) of schedules built to separate the
  costs: tiny rings run once and four times in a row (steps of two ops, many steps), four
  rings side by side (steps of eight ops), a direct all-to-all allreduce run twice (steps
  of ``2 (n - 1)`` ops, few steps), a ring and the direct one again with 16 KiB messages
  (past MPI's eager limits), and a ring and a direct allreduce of 4 MiB (bytes, for the
  host bandwidth);
- ``reduce``: the executor's add (``chunk += scratch``) of 4 MiB alone, on every rank at
  once as in a step: ``reduce_bandwidth`` is bytes over its time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import TopoplanError
from ...ir.schedule import Schedule, build_schedule, equal_chunks, recv, send

__all__ = ["Case", "calibration_cases", "direct_schedule", "BIG", "TINY_CHUNK", "MEDIUM_CHUNK",
           "PING_BYTES", "PING_MESSAGES"]

#: Bytes of the bandwidth cases and of the reduce case.
BIG = 4 << 20
#: Bytes per chunk of the tiny cases (4 float32 elements: latency-bound, never empty).
TINY_CHUNK = 16
#: Bytes per chunk of the medium cases (past eager limits, still latency-bound).
MEDIUM_CHUNK = 16 << 10
#: Ping-pong message bytes, and the messages per trip of the second ping-pong.
PING_BYTES = 8
PING_MESSAGES = 4


@dataclass(frozen=True)
class Case:
    """One micro-benchmark.

    Attributes
    ----------
    label : str
    kind : {"allreduce", "pingpong", "reduce", "native"}
    size : int
        Bytes per rank (float32 elements x 4); per message for ``pingpong``.
    schedule : Schedule or None
        For ``allreduce``.
    messages : int
        Messages per trip of a ``pingpong``.
    what : str
        What it is, in words (``"14 steps x 2 ops, 16 B messages"``).
    collective : str
        For ``native``: the transport's own collective (``allreduce``,
        ``reduce_scatter``, ``allgather``; :mod:`.native`).
    group : int
        For ``native``: ranks per group (the ranks run it in groups of consecutive
        ranks, all groups at once).
    """

    label: str
    kind: str
    size: int
    schedule: Schedule | None = None
    what: str = ""
    messages: int = 1
    collective: str = ""
    group: int = 0


def _rings(n: int, rounds: int, parallel: int, algorithm: str) -> Schedule:
    """``rounds`` ring allreduces one after another, each of ``parallel`` rings side by
    side on their own chunks (``2 (n - 1) rounds`` steps of ``2 parallel`` ops)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for q in range(rounds):
        for phase in (0, 1):  # reduce-scatter, then allgather
            for s in range(n - 1):
                for r in range(n):
                    nxt, prv = (r + 1) % n, (r - 1) % n
                    ops = []
                    for j in range(parallel):
                        base = (q * parallel + j) * n
                        if phase == 0:
                            ops += [send(nxt, base + (r - s) % n),
                                    recv(prv, base + (r - s - 1) % n, reduce=True)]
                        else:
                            ops += [send(nxt, base + (r + 1 - s) % n),
                                    recv(prv, base + (r - s) % n)]
                    steps[r].append(ops)
    return build_schedule(n, equal_chunks(rounds * parallel * n), steps, algorithm=algorithm)


def direct_schedule(n: int, rounds: int, algorithm: str) -> Schedule:
    """``rounds`` direct allreduces one after another: a reduce-scatter step in which every
    rank sends every other rank its chunk, then an allgather step (``2 rounds`` steps of
    ``2 (n - 1)`` ops)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for q in range(rounds):
        base = q * n
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            steps[r].append([recv(p, base + r, reduce=True) for p in peers]
                            + [send(p, base + p) for p in peers])
        for r in range(n):
            peers = [(r + k) % n for k in range(1, n)]
            steps[r].append([recv(p, base + p) for p in peers] + [send(p, base + r) for p in peers])
    return build_schedule(n, equal_chunks(rounds * n), steps, algorithm=algorithm)


def _chain(n: int, algorithm: str) -> Schedule:
    """Reduce along the chain ``0 -> 1 -> ... -> n-1``, then broadcast back: ``2 (n - 1)``
    steps, each moving the whole buffer between one pair while the other ranks wait (what
    one rank's copies cost with the machine to itself)."""
    steps: list[list[list[Any]]] = [[] for _ in range(n)]
    for r in range(n - 1):
        steps[r].append([send(r + 1, 0)])
        steps[r + 1].append([recv(r, 0, reduce=True)])
    for r in range(n - 1, 0, -1):
        steps[r].append([send(r - 1, 0)])
        steps[r - 1].append([recv(r, 0)])
    return build_schedule(n, (1.0,), steps, algorithm=algorithm)


def calibration_cases(nranks: int) -> list[Case]:
    """The micro-benchmarks of :func:`calibrate` for ``nranks`` ranks (at least 2).

    Returns
    -------
    list of Case
        ``pingpong`` and ``pingpong x4``; with 16 B messages ``ring``, ``ring x4`` (four in a row), ``rings
        x4`` (four side by side) and ``direct x2``; ``ring`` and ``direct x2`` again with
        16 KiB messages; ``ring 4MiB`` and ``direct 4MiB`` (every rank moves bytes at
        once: the machine's total copy rate); ``chain 4MiB`` (one pair at a time: one
        rank's rate); ``reduce 4MiB``.

    Raises
    ------
    TopoplanError
        For fewer than 2 ranks.
    """
    n = int(nranks)
    if n < 2:
        raise TopoplanError(f"calibration needs at least 2 ranks (a ping-pong), got {n}")
    cases = [Case("pingpong", "pingpong", PING_BYTES,
                  what=f"ranks 0 and 1, one {PING_BYTES} B message per start/wait"),
             Case(f"pingpong x{PING_MESSAGES}", "pingpong", PING_BYTES, messages=PING_MESSAGES,
                  what=f"ranks 0 and 1, {PING_MESSAGES} messages of {PING_BYTES} B per "
                       "start/wait")]

    def add(label: str, schedule: Schedule, size: int) -> None:
        steps = max(len(schedule.steps_of(r)) for r in range(n))
        ops = schedule.max_step_ops
        chunk = size // schedule.nchunks
        cases.append(Case(label, "allreduce", size, schedule,
                          f"{steps} steps x {ops} ops, {_bytes_text(chunk)} messages"))

    for label, schedule in (("ring", _rings(n, 1, 1, "calibrate-ring")),
                            ("ring x4", _rings(n, 4, 1, "calibrate-ring-x4")),
                            ("rings x4", _rings(n, 1, 4, "calibrate-rings-x4")),
                            ("direct x2", direct_schedule(n, 2, "calibrate-direct-x2"))):
        add(label, schedule, TINY_CHUNK * schedule.nchunks)
    # Messages past the eager limits of MPI libraries (a few KiB): another protocol, often
    # a costlier step. The fit averages the two regimes; the residuals show how far apart.
    for label, schedule in (("ring", _rings(n, 1, 1, "calibrate-ring")),
                            ("direct x2", direct_schedule(n, 2, "calibrate-direct-x2"))):
        size = MEDIUM_CHUNK * schedule.nchunks
        add(f"{label} {_bytes_text(size)}", schedule, size)
    big = BIG // (4 * n) * 4 * n  # whole float32 chunks
    add(f"ring {_bytes_text(big)}", _rings(n, 1, 1, "calibrate-ring"), big)
    add(f"direct {_bytes_text(big)}", direct_schedule(n, 1, "calibrate-direct"), big)
    add(f"chain {_bytes_text(BIG)}", _chain(n, "calibrate-chain"), BIG)
    cases.append(Case(f"reduce {_bytes_text(BIG)}", "reduce", BIG,
                      what="chunk += scratch alone, every rank at once"))
    return cases


def _bytes_text(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n} B"
