"""The planners' side of the channels pass (:func:`topoplan.ir.passes.channelize`): the
default skew a plan's channels get, which planners' plans it refuses, and the plan-size
caps on a plan cut over channels.

``topoplan.plan(..., channels=N, channel_skew=R)`` and ``topoplan plan --channels N
[--channel-skew R]`` apply the pass after planning; ``channels=1`` (the default) applies
nothing.
"""

from __future__ import annotations

from .._compat import moved_names
from ..errors import InfeasiblePlanError
from ..ir.schedule import Schedule

__all__ = ["check_caps_on_channels", "per_channel", "NATIVE_PLANNERS", "SKEW"]

#: The planners whose plans hold native steps, which :func:`~topoplan.ir.passes.channelize`
#: refuses (``auto`` with ``channels`` compares the others).
NATIVE_PLANNERS = ("nccl", "composed")

#: The default ratio of one channel's slice to the next one's (``topoplan plan --channels
#: N``): unequal slices make the channels' steps end at different times, so one channel's
#: step latency meets another's transfer. Channels of equal slices run in phase and gain
#: nothing (each pays the same latencies on 1/N of the bytes). Measured with
#: ``scripts/bench_channels.py`` (docs/RESULTS.md): 1.2 is within a few percent of the best
#: of 1.1, 1.2 and 1.35 on 2 to 4 channels at 16 MiB and 256 MiB.
SKEW = 1.2


#: The pass and the checks of its arguments, now in the IR (the IR imports nothing from
#: the planners).
__getattr__ = moved_names(__name__, {
    name: "topoplan.ir.passes"
    for name in ("channelize", "check_channels", "check_skew", "slices", "MAX_CHANNELS")})


def per_channel(cap: int | None, channels: int) -> int | None:
    """A plan-size cap (``max_chunks``, ``max_step_ops``) for the plan that
    :func:`~topoplan.ir.passes.channelize` puts on ``channels`` channels: each chunk and op
    is ``channels`` of them after the pass."""
    if cap is None or channels == 1 or isinstance(cap, bool) or not isinstance(cap, int):
        return cap  # a bad cap is the request's to refuse
    return max(1, cap // channels)


def check_caps_on_channels(schedule: Schedule, channels: int, max_step_ops: int | None,
                           max_chunks: int | None) -> Schedule:
    """``schedule`` (a :func:`~topoplan.ir.passes.channelize` result) if it meets the
    plan-size caps, else an :class:`InfeasiblePlanError` naming the cap and what to lower."""
    name = f"{schedule.algorithm} on {channels} channels"
    if max_chunks is not None and schedule.nchunks > max_chunks:
        raise InfeasiblePlanError(
            f"{name}: {schedule.nchunks} chunks ({schedule.nchunks // channels} per "
            f"channel), over max_chunks={max_chunks}: use fewer channels or raise max_chunks")
    if max_step_ops is not None and schedule.max_step_ops > max_step_ops:
        raise InfeasiblePlanError(
            f"{name}: {schedule.max_step_ops} ops in one step, over max_step_ops="
            f"{max_step_ops}: use fewer channels or raise max_step_ops")
    return schedule
