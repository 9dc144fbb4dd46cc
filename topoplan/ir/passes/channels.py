"""A pass: a schedule run on ``C`` independent channels over disjoint slices of the data
(IR v4), as NCCL splits its buffer over its channels.

:func:`channelize` cuts every chunk into ``C`` sub-chunks and gives channel ``c`` a copy
of every op on its own sub-chunks. Under IR v4's semantics (docs/SCHEDULE.md, "Version 4:
channels") each channel's steps then wait only for that channel's previous step; the data
each op moves is cut over the channels, the number of ops is multiplied by ``C``. Equal
slices run in phase and take what the plan takes on one channel; slices of unequal size
(each ``skew`` times the next) end their steps apart, so one channel's step latency
hides behind another's transfer.

``topoplan.plan(..., channels=N, channel_skew=R)`` and ``topoplan plan --channels N
[--channel-skew R]`` apply it after planning (:mod:`topoplan.planners.channels` holds the
planners' side: the default skew, the caps per channel); ``channels=1`` applies nothing.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import replace
from typing import cast

from ...errors import PlannerError
from ..collectives import collective_of, shard_chunks
from ..schedule import Native, Op, RankProgram, Schedule, fast_op

__all__ = ["channelize", "check_channels", "check_skew", "slices", "MAX_CHANNELS"]

#: The most channels the pass makes (NCCL's MAXCHANNELS, ``src/include/device.h``).
MAX_CHANNELS = 32


def check_channels(channels: object) -> int:
    """``channels`` if it is an integer in 1..:data:`MAX_CHANNELS`, else a
    :class:`PlannerError` saying so."""
    if isinstance(channels, bool) or not isinstance(channels, int) or \
            not 1 <= channels <= MAX_CHANNELS:
        raise PlannerError(f"channels: must be an integer in 1..{MAX_CHANNELS}, got {channels!r}")
    return channels


def check_skew(skew: object) -> float:
    """``skew`` if it is a number in [1, 16], else a :class:`PlannerError` saying so."""
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 1 <= skew <= 16:
        raise PlannerError(f"channel skew: must be a number from 1 (equal slices) to 16, "
                           f"got {skew!r}")
    return float(skew)


def slices(channels: int, skew: float = 1.0) -> tuple[float, ...]:
    """Each channel's share of every chunk: ``skew ** -c``, normalised (equal for 1)."""
    weights = [skew ** -c for c in range(channels)]
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


def _layout(schedule: Schedule, channels: int, skew: float
            ) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """The shards' chunk ranges of ``schedule`` (one range, every chunk, for an allreduce)
    and the new chunks' fractions, laid out channel by channel within each shard."""
    k = schedule.nchunks
    if collective_of(schedule).sharded:
        shards = shard_chunks(schedule.nranks, schedule.chunks, schedule.collective)
    else:
        shards = ((0, k),)
    share = slices(channels, skew)
    fractions: list[float] = []
    for a, b in shards:
        for c in range(channels):
            fractions.extend(f * share[c] for f in schedule.chunks[a:b])
    return shards, tuple(fractions)


def _split(op: Op, shards: tuple[tuple[int, int], ...], starts: list[int], channel: int,
           channels: int, base_channel: int) -> list[Op]:
    """``op``'s copy on ``channel``: one op per shard its range touches, each on channel
    ``channel``'s block of that shard (new chunk ``channels * a + channel * (b - a) + k
    - a`` for old chunk ``k`` of shard ``[a, b)``). ``starts``: the shards' first chunks,
    to find the shards an op touches by bisection."""
    out = []
    lane = base_channel * channels + channel
    for i in range(bisect_right(starts, op.chunk) - 1, len(shards)):
        a, b = shards[i]
        if a >= op.end:
            break
        lo, hi = max(op.chunk, a), min(op.end, b)
        if lo >= hi:
            continue
        out.append(fast_op(op.kind, op.peer, channels * a + channel * (b - a) + (lo - a),
                       op.reduce, hi - lo, lane))
    return out


def channelize(schedule: Schedule, channels: int, skew: float = 1.0) -> Schedule:
    """``schedule`` on ``channels`` independent channels over disjoint slices of the data.

    Every chunk ``k`` is cut into ``channels`` sub-chunks, channel ``c``'s a share
    ``skew ** -c`` (normalised, :func:`slices`) of it: ``1 / channels`` each with
    ``skew=1``, as NCCL cuts its buffer. Channel ``c`` runs a copy of every op, in the
    same step, on its own sub-chunks. The new chunks are laid out channel by channel within each shard, so
    that an op's range stays one range per channel:

    - allreduce: the whole buffer is one block per channel, old chunk ``k`` of channel
      ``c`` is new chunk ``c * nchunks + k``;
    - reduce-scatter and allgather: each shard ``[a, b)`` of the old chunks
      (:func:`topoplan.ir.collectives.shard_chunks`) becomes ``channels`` blocks of
      ``b - a`` chunks, so every shard keeps its place and size and the shard layout
      stays valid; an op whose range spans several shards becomes one op per shard it
      touches on each channel (both ends of its message are cut the same way).

    A step's ops come out op by op, each op's copies in channel order, so the k-th
    message of a pair of ranks on a channel pairs with the k-th recv on that channel,
    and the k-th over all channels with the k-th over all channels too: the result also
    runs and verifies as before IR v4 (lock-step). A schedule that is already on
    several channels keeps them apart: its channel ``b`` becomes channels ``b *
    channels .. b * channels + channels - 1``.

    Each channel moves its slice of every message, so the result computes what
    ``schedule`` computes, with ``channels`` times the ops and chunks. ``meta`` is kept,
    with ``meta["channels"]`` set to the result's channel count and
    ``meta["channel_skew"]`` to ``skew``.

    Parameters
    ----------
    schedule : Schedule
        A point-to-point schedule (no native steps, no vectored messages), any collective.
    channels : int
        Channels to run it on, 1 to :data:`MAX_CHANNELS`; 1 returns ``schedule`` as it is.
    skew : float
        The ratio of each channel's slice to the next one's, 1 to 16. Equal slices (1)
        run in phase, each channel paying the same step latencies on its share of the
        bytes, so they take what one channel takes; unequal ones (the planners' default,
        :data:`topoplan.planners.channels.SKEW`) end their steps at different times, so one
        channel's latency hides behind another's transfer (docs/RESULTS.md, "Channels").

    Returns
    -------
    Schedule
        Version 4 (version as before for ``channels == 1``), ``nchannels ==
        schedule.nchannels * channels``.

    Raises
    ------
    PlannerError
        ``channels`` out of range, ``schedule`` has vectored messages (IR v4: vectorize
        after channelize), or it has native steps (IR v3): a native
        collective runs on channel 0 over its whole range and cannot be cut over
        channels, so the pass refuses the schedule (naming the first native step)
        rather than returning it unchanged.

    Notes
    -----
    O(ops * channels * shards touched per op) time; NCCL cuts its buffer over its
    channels the same way (``src/enqueue.cc``, each channel a contiguous slice of every
    step's data).
    """
    check_channels(channels)
    skew = check_skew(skew)
    if channels == 1:
        return schedule
    for rank, at, op in schedule.ops():
        if isinstance(op, Native):
            raise PlannerError(
                f"{schedule.algorithm} schedule: rank {rank} step {at} runs a native "
                f"{op.text()}, which runs on channel 0 over its whole range and cannot be "
                f"cut over {channels} channels; plan with a point-to-point planner (ring, "
                "rhd, hierarchical, mcf) or leave channels at 1")
        if op.more:
            raise PlannerError(
                f"{schedule.algorithm} schedule: rank {rank} step {at} sends or receives "
                f"{op.chunk_text()} to or from rank {op.peer} as one vectored message (IR "
                "v4), which channelize does not cut yet; cut the plan over channels first, "
                "then vectorize it (topoplan.plan(..., channels=C, vectored=True) does)")
    shards, fractions = _layout(schedule, channels, skew)
    starts = [a for a, _ in shards]
    programs = []
    lanes = range(channels)
    whole = shards == ((0, schedule.nchunks),)  # one block per channel (an allreduce)
    k = schedule.nchunks
    for program in schedule.ranks:
        steps = []
        for step in program.steps:
            ops: list[Op] = []
            if whole:  # what _split makes there, without its search (1024 GPUs: 1 M ops)
                ops = [fast_op(op.kind, op.peer, c * k + op.chunk, op.reduce, op.count,
                               op.channel * channels + c)
                       for op in cast("tuple[Op, ...]", step) for c in lanes]
            else:
                for op in step:
                    assert isinstance(op, Op)  # natives refused above
                    for c in lanes:
                        ops.extend(_split(op, shards, starts, c, channels, op.channel))
            steps.append(tuple(ops))
        programs.append(RankProgram(program.rank, tuple(steps)))
    out = replace(schedule, chunks=fractions, ranks=tuple(programs))
    return out.with_meta(channels=out.nchannels, channel_skew=skew)
