"""Argument checks shared by the planners: size, chunks, collective, caps, options.

Each returns the value it accepts (normalised) or raises :class:`PlannerError` naming
the planner, the argument and what it takes; :func:`check_caps` holds a built schedule
to the plan-size caps (:class:`InfeasiblePlanError`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..ir.collectives import COLLECTIVES
from ..errors import InfeasiblePlanError, PlannerError
from ..ir.schedule import Schedule
from ..units import MAX_SIZE, as_bytes

__all__ = ["PlannerError", "check_size", "check_chunks", "check_collective", "check_cap_args",
           "check_caps", "unknown_options"]


def check_size(size: Any, algorithm: str) -> int:
    """``size`` in bytes as a positive int, or :class:`PlannerError`; a string such as
    ``"256MiB"`` is read as the CLI reads it (:func:`~topoplan.units.parse_size`)."""
    try:
        size = as_bytes(size)
    except ValueError as exc:
        raise PlannerError(f"{algorithm}: size: {exc}") from None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0 \
            or not math.isfinite(size):
        raise PlannerError(f"{algorithm}: size must be a positive number of bytes, got {size!r}")
    if size > MAX_SIZE:
        raise PlannerError(f"{algorithm}: size must be at most 2**60 bytes (1 EiB), got "
                           f"{size!r}")
    return int(size)


def unknown_options(algorithm: str, unknown: Sequence[str],
                    known: Sequence[str]) -> PlannerError:
    """The error for options ``algorithm`` does not take: names them, the closest known
    option to the first, and every option it takes."""
    import difflib

    close = difflib.get_close_matches(unknown[0], list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return PlannerError(f"planner {algorithm!r} takes no option "
                        f"{', '.join(map(repr, unknown))}{hint}; its options: "
                        f"{', '.join(known)}")


def check_chunks(chunks: Any, algorithm: str, what: str = "pipeline depth") -> int | None:
    """``chunks`` as ``None`` (planner's choice) or an int >= 1, or :class:`PlannerError`."""
    if chunks is None:
        return None
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise PlannerError(f"{algorithm}: chunks ({what}) must be an integer >= 1 or None, "
                           f"got {chunks!r}")
    return chunks


def check_collective(collective: Any, algorithm: str,
                     supported: Sequence[str] = tuple(COLLECTIVES)) -> str:
    """``collective`` if ``algorithm`` plans it, else a :class:`PlannerError` naming the
    ones it plans."""
    if not isinstance(collective, str) or collective not in supported:
        raise PlannerError(f"{algorithm}: cannot plan collective {collective!r}; it plans "
                           f"{', '.join(supported)}")
    return collective


def check_cap_args(max_step_ops: Any, max_chunks: Any, algorithm: str) -> None:
    """PlannerError unless each cap is None or an integer >= 1."""
    for name, value in (("max_step_ops", max_step_ops), ("max_chunks", max_chunks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise PlannerError(f"{algorithm}: {name} must be an integer >= 1 or None, "
                               f"got {value!r}")


def check_caps(schedule: Schedule, max_step_ops: int | None, max_chunks: int | None,
               algorithm: str) -> Schedule:
    """``schedule`` if it holds at most ``max_chunks`` chunks and every rank posts at most
    ``max_step_ops`` ops in a step; else an InfeasiblePlanError saying which cap and by
    how much (a planner lowers its pipelining depth first: this fires when even its
    smallest plan is too big; ``auto`` then leaves the planner out)."""
    check_cap_args(max_step_ops, max_chunks, algorithm)
    if max_chunks is not None and schedule.nchunks > max_chunks:
        raise InfeasiblePlanError(f"{algorithm}: the smallest plan has {schedule.nchunks} chunks, over "
                           f"max_chunks={max_chunks}; raise the cap or pick another planner")
    if max_step_ops is not None:
        worst = schedule.max_step_ops
        if worst > max_step_ops:
            raise InfeasiblePlanError(f"{algorithm}: the smallest plan posts {worst} ops in one step, "
                               f"over max_step_ops={max_step_ops}; raise the cap or pick "
                               "another planner")
    return schedule
