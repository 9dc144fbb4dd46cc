"""The time in communication: what DistributedOptimizer's ``comm_seconds`` and
``wait_seconds`` count.

``comm_seconds`` is the wall time with a gradient allreduce in flight: inside the
blocking calls, in the double-buffering worker, or (overlap) from each call's start
until a poll saw it done, counting time when several were in flight once; so it
compares with the time of a blocking exchange. ``wait_seconds`` is the part the
training thread waited for, the exposed communication.
"""

from __future__ import annotations

import math

__all__ = ["CommTime", "covered"]


def covered(spans: list[list[float]], reach: float = -math.inf) -> tuple[float, float]:
    """Seconds covered by the [start, done] intervals (overlaps counted once) after
    ``reach``, the end of the time already counted; and the new end. Intervals whose
    end is NaN (never seen done) count nothing."""
    total = 0.0
    for start, done in sorted(s for s in spans if s[1] == s[1]):
        if done > reach:
            total += done - max(start, reach)
            reach = done
    return total, reach


class CommTime:
    """The two counters, shared by the parts of an optimizer that communicate.

    Attributes
    ----------
    comm_seconds : float
        Wall time with an allreduce in flight (see the module docstring).
    wait_seconds : float
        The part of it the training thread waited for.
    """

    __slots__ = ("comm_seconds", "wait_seconds", "_reach")

    def __init__(self) -> None:
        self.comm_seconds = 0.0
        self.wait_seconds = 0.0
        self._reach = -math.inf   # where the time counted from spans ends

    def add_spans(self, spans: list[list[float]]) -> None:
        """Count the [start, done] intervals of calls that overlapped (see :func:`covered`);
        time that intervals added before already covered counts once."""
        seconds, self._reach = covered(spans, self._reach)
        self.comm_seconds += seconds
