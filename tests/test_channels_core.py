"""Channels (IR v4) in the step model the verifier and the simulator share.

Each (rank, channel) is a sequence of steps of its own (topoplan.ir.matching.Messages):
its step k waits only for its own step k - 1. These tests build channelled schedules
by hand (two rings over disjoint halves of the chunks, running in opposite directions)
and check the matching, the verifier's rules and deadlock analysis, and the
simulator's pricing of channels as independent sequences, on both engines.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.support.clusters import leaf_spine_cluster, switch_cluster
from tests.test_simulate import assert_same_report
from topoplan.analysis.cost import IDEAL
from topoplan.analysis.sim import simulate
from topoplan.analysis.sim.reference import simulate_reference
from topoplan.errors import ScheduleError
from topoplan.ir.passes import lower_native
from topoplan.ir.matching import Messages
from topoplan.ir.schedule import (RankProgram, Schedule, build_schedule, equal_chunks, native_op,
                                  recv, send)
from topoplan.ir.verify import verify


def two_rings(n: int, delay: dict[int, int] | None = None) -> Schedule:
    """An allreduce of ``2 n`` chunks as two rings: channel 0 runs a ring 0 -> 1 -> ...
    on chunks ``0 .. n - 1``, channel 1 the ring the other way round on chunks
    ``n .. 2 n - 1``. ``delay[r]``: rank ``r``'s channel-1 ops come that many steps later
    in its program (its first steps then hold channel 0 alone)."""
    delay = delay or {}
    steps: list[list[list]] = [[] for _ in range(n)]
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        d = delay.get(r, 0)
        steps[r] = [[] for _ in range(2 * (n - 1) + d)]
        for s in range(2 * (n - 1)):
            red = s < n - 1
            t = s if red else s - (n - 1)
            out = (r - t) % n if red else (r + 1 - t) % n
            into = (r - t - 1) % n if red else (r - t) % n
            steps[r][s] += [send(nxt, out), recv(prv, into, reduce=red)]
            out = (r + t) % n if red else (r - 1 + t) % n
            into = (r + t + 1) % n if red else (r + t) % n
            steps[r][s + d] += [send(prv, n + out, channel=1),
                                recv(nxt, n + into, reduce=red, channel=1)]
    return build_schedule(n, equal_chunks(2 * n), steps, algorithm="two-rings")


def on_channel(schedule: Schedule, channel: int) -> Schedule:
    """Every op of ``schedule`` moved to ``channel``: the same ops run lock-step."""
    return replace(schedule, ranks=tuple(
        RankProgram(p.rank, tuple(tuple(replace(op, channel=channel) for op in step)
                                  for step in p.steps)) for p in schedule.ranks))


def edit(schedule: Schedule, rank: int, step: int, index: int, **changes) -> Schedule:
    """``schedule`` with op ``index`` of ``rank``'s step ``step`` changed."""
    ranks = list(schedule.ranks)
    steps = [list(ops) for ops in ranks[rank].steps]
    steps[step][index] = replace(steps[step][index], **changes)
    ranks[rank] = RankProgram(rank, tuple(tuple(ops) for ops in steps))
    return replace(schedule, ranks=tuple(ranks))


# ---- matching and the verifier ----------------------------------------------------------

@pytest.mark.parametrize("n", [3, 4, 6])
def test_two_channel_rings_verify_and_number_their_sequences(n):
    schedule = two_rings(n)
    report = verify(schedule)
    assert report.nchannels == 2 and report.nmessages == 4 * n * (n - 1)
    found = Messages(schedule)
    steps = 2 * (n - 1)
    # Each rank: its channel-0 sequence, then its channel-1 one, each in program order.
    assert found.nglobal == 2 * n * steps
    assert found.step_base.tolist() == [2 * steps * r for r in range(n + 1)]
    assert found.step_channel.tolist() == ([0] * steps + [1] * steps) * n
    assert found.step_local.tolist() == list(range(steps)) * (2 * n)
    assert found.step_rank.tolist() == np.repeat(np.arange(n), 2 * steps).tolist()
    g = found.step_base[1] + steps + 3  # rank 1, channel 1, step 3
    assert (found.step_first[g], found.step_last[g]) == (g - 3, g - 3 + steps)
    assert found.local(g) == 3 and found.global_step(1, 3) == g - steps
    # Messages pair within a channel: every message's two steps are on one channel.
    assert (found.step_channel[found.t_sstep] == found.step_channel[found.t_rstep]).all()
    assert (found.step_channel[found.t_sstep] == (found.t_chunk >= n)).all()
    # The same ops without channels are a valid (lock-step) allreduce too.
    assert verify(on_channel(schedule, 0)).nchannels == 1


def test_schedule_without_channels_numbers_steps_as_before():
    schedule = on_channel(two_rings(4), 0)
    found = Messages(schedule)
    assert found.nchannels == 1
    assert found.seq_base is found.step_base  # one sequence per rank
    assert found.step_first.tolist() == np.repeat(found.step_base[:-1], 6).tolist()
    assert found.step_local.tolist() == list(range(6)) * 4


def test_a_chunk_on_two_channels_is_named():
    # Rank 1 step 2 sends chunk 3 to rank 2 on channel 0 (ring 0); move that whole
    # message to channel 1: it still pairs, but chunk 3 is now on both channels.
    schedule = edit(edit(two_rings(4), 1, 2, 0, channel=1), 2, 2, 1, channel=1)
    with pytest.raises(ScheduleError, match=r"two-rings schedule: rank 1 step 2: chunk 3 is on "
                       r"channel 1 here but on channel 0 at rank 0 step 0: every chunk "
                       r"belongs to one channel$"):
        verify(schedule)


def test_a_native_op_owns_its_chunks_on_channel_0():
    # A native allreduce on chunks 0..1 (channel 0) and a channel-1 op on chunk 1.
    schedule = build_schedule(2, equal_chunks(4), [
        [[native_op("allreduce", (0, 1), 0, 2)], [send(1, 1, channel=1), recv(1, 3, channel=1)]],
        [[native_op("allreduce", (0, 1), 0, 2)], [recv(0, 1, channel=1), send(0, 3, channel=1)]]])
    with pytest.raises(ScheduleError, match=r"rank 0 step 1: chunk 1 is on channel 1 here but "
                       r"on channel 0 at rank 0 step 0"):
        verify(schedule)


def test_a_native_op_stands_alone_in_its_step_whatever_the_channels():
    # The channel-1 send would be a global step of its own; the program step is shared.
    schedule = build_schedule(2, equal_chunks(4), [
        [[native_op("allreduce", (0, 1), 0, 2), send(1, 2, channel=1)]],
        [[native_op("allreduce", (0, 1), 0, 2), recv(0, 2, channel=1)]]])
    with pytest.raises(ScheduleError, match=r"rank 0 step 0: a native allreduce over \{0, 1\} "
                       r"of chunks 0..1 stands alone in its step; this step has 2 ops"):
        verify(schedule)


def test_a_send_and_its_recv_on_two_channels_are_named():
    # Only the send moves to channel 1: its recv waits on channel 0.
    schedule = edit(two_rings(4), 1, 2, 0, channel=1)
    expected = (r"message from rank 1 to rank 2 on two channels: rank 1 step 2 sends chunk 3 "
                r"on channel 1 but rank 2 step 2 receives chunk 3 from rank 1 on channel 0: "
                r"a message's send and recv are on one channel")
    for check in (verify, lambda s: simulate(switch_cluster(4), s, 1 << 20),
                  lambda s: simulate_reference(switch_cluster(4), s, 1 << 20)):
        with pytest.raises(ScheduleError, match=expected):
            check(schedule)


def test_messages_pair_in_order_within_each_channel():
    # Two messages 0 -> 1, one per channel, written in opposite orders on the two sides:
    # on one channel they would pair the wrong way round; per channel they pair right.
    schedule = build_schedule(2, equal_chunks(2), [
        [[send(1, 0), send(1, 1, channel=1)], [recv(1, 1, channel=1)], [recv(1, 0)]],
        [[recv(0, 1, reduce=True, channel=1)], [recv(0, 0, reduce=True), send(0, 1, channel=1)],
         [send(0, 0)]]])
    found = Messages(schedule)
    assert sorted(zip(found.t_chunk.tolist(), found.step_local[found.t_rstep].tolist(),
                      found.t_src.tolist())) == [(0, 1, 0), (0, 2, 1), (1, 0, 0), (1, 1, 1)]
    verify(schedule)
    with pytest.raises(ScheduleError, match="message 0 from rank 0 to rank 1: rank 0 step 0 "
                       "sends chunk 0 but rank 1 step 0 receives it as chunk 1"):
        verify(on_channel(schedule, 0))


def test_channels_wait_only_on_their_own_previous_step():
    # Rank 0's channel-1 ring starts 3 steps late. Lock-step, its step 3 would hold rank
    # 1's first channel-1 message, which rank 1 sends in its step 0, which waits for it:
    # rank 0 cannot get there before rank 1 does its step 1 (ring 0). A deadlock, unless
    # channels run apart.
    schedule = two_rings(4, delay={0: 3})
    assert verify(schedule).nchannels == 2
    for time in (simulate(switch_cluster(4), schedule, 1 << 20).time_s,
                 simulate_reference(switch_cluster(4), schedule, 1 << 20).time_s):
        assert 0 < time < float("inf")
    lockstep = on_channel(schedule, 0)
    with pytest.raises(ScheduleError, match="deadlock"):
        verify(lockstep)
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(switch_cluster(4), lockstep, 1 << 20)


def test_a_deadlock_within_a_channel_is_named_with_its_channel():
    # Channel 0 adds chunk 0 in one step; on channel 1 both ranks receive chunk 1 first.
    schedule = build_schedule(2, equal_chunks(2), [
        [[send(1, 0), recv(1, 0, reduce=True), recv(1, 1, reduce=True, channel=1)],
         [send(1, 1, channel=1)]],
        [[send(0, 0), recv(0, 0, reduce=True), recv(0, 1, reduce=True, channel=1)],
         [send(0, 1, channel=1)]]], algorithm="two-rings")
    expected = ("two-rings schedule: deadlock: 2 ranks cannot finish; rank 0 step 0 on channel 1 "
                "waits to recv chunk 1 with rank 1 on channel 1, which is stuck at step 0 "
                "before its matching step 1")
    messages = []
    for check in (verify, lambda s: simulate(switch_cluster(2), s, 1 << 20),
                  lambda s: simulate_reference(switch_cluster(2), s, 1 << 20)):
        with pytest.raises(ScheduleError) as info:
            check(schedule)
        messages.append(str(info.value))
    assert messages == [expected] * 3


def test_native_steps_with_channels_verify_lower_and_simulate():
    # A native allreduce of chunks 0..3 (channel 0) beside a channel-1 ring on 4..7.
    n = 4
    ring = two_rings(n)
    programs = []
    for p in ring.ranks:
        steps = [tuple(op for op in step if op.channel == 1) for step in p.steps]
        programs.append(RankProgram(p.rank, ((native_op("allreduce", range(n), 0, n),),)
                                    + tuple(steps)))
    schedule = replace(ring, ranks=tuple(programs))
    assert verify(schedule).nchannels == 2
    found = Messages(schedule)
    assert [call.local for call in found.calls] == [(0, 0, 0, 0)]
    assert all(found.step_channel[g] == 0 for g in found.calls[0].steps)
    lowered = lower_native(schedule)
    assert lowered.nnative == 0 and verify(lowered).nchannels == 2
    cluster = switch_cluster(n)
    for s in (schedule, lowered):
        assert_same_report(simulate(cluster, s, 1 << 20, record=True),
                           simulate_reference(cluster, s, 1 << 20, record=True))


# ---- the simulator ----------------------------------------------------------------------

#: A large per-step cost: a channel of many tiny steps takes long without moving bytes.
SLOW_STEPS = IDEAL.with_costs(step_overhead=20e-6, op_overhead=1e-6, alpha_box=5e-6,
                              alpha_network=5e-6)


def hiding(steps: int, tiny: bool = True, big: bool = True, channels: bool = True) -> Schedule:
    """Two ranks; channel 0 (``tiny``): rank 0 sends rank 1 ``steps`` tiny chunks, one
    per step; channel 1 (``big``): rank 1 sends rank 0 one big chunk, in step 0, over
    the links of the other direction. ``channels=False``: the same ops all on channel 0."""
    chunks = [0.99] + [0.01 / steps] * steps
    c = 1 if channels else 0
    programs: list[list[list]] = [[[] for _ in range(steps)] for _ in range(2)]
    for k in range(steps):
        if tiny:
            programs[0][k].append(send(1, 1 + k))
            programs[1][k].append(recv(0, 1 + k))
    if big:
        programs[0][0].append(recv(1, 0, channel=c))
        programs[1][0].append(send(0, 0, channel=c))
    return build_schedule(2, chunks, programs, algorithm="hiding")


@pytest.mark.parametrize("steps", [20, 50])
def test_one_channels_step_latency_hides_behind_anothers_transfer(steps):
    cluster, size = switch_cluster(2), 8 << 20
    kw = {"profile": SLOW_STEPS, "record": True}
    both = simulate(cluster, hiding(steps), size, **kw)
    assert_same_report(both, simulate_reference(cluster, hiding(steps), size, **kw))
    tiny = simulate(cluster, hiding(steps, big=False), size, **kw).time_s
    big = simulate(cluster, hiding(steps, tiny=False), size, **kw).time_s
    lockstep = simulate(cluster, hiding(steps, channels=False), size, **kw)
    assert_same_report(lockstep,
                       simulate_reference(cluster, hiding(steps, channels=False), size, **kw))
    # Each channel runs as if alone; lock-step, the tiny steps after the first wait for
    # the big transfer and then still pay their steps.
    assert both.time_s == pytest.approx(max(tiny, big), rel=1e-9)
    assert lockstep.time_s > 1.4 * both.time_s
    assert lockstep.time_s == pytest.approx(big + (steps - 1) * (tiny / steps), rel=0.02)
    # Per program step: step 0 spans the big transfer (channel 1) and the first tiny one.
    assert len(both.step_times[0]) == steps
    assert both.step_times[0][0] == pytest.approx((0.0, big))
    assert both.step_times[0][1][0] == pytest.approx(tiny / steps, rel=1e-3)
    assert [t.src_step for t in both.transfers if t.src == 1] == [0]


def test_posting_costs_are_paid_per_channel():
    # Both channels' ops in one program step: each channel pays its own step overhead
    # and posts its own ops, at once with the other's.
    cluster = switch_cluster(2, latency="0 us")
    costs = IDEAL.with_costs(step_overhead=10e-6, op_overhead=3e-6)
    ops = [[send(1, 0), recv(1, 1), send(1, 2, channel=1), recv(1, 3, channel=1)],
           [recv(0, 0), send(0, 1), recv(0, 2, channel=1), send(0, 3, channel=1)]]
    schedule = build_schedule(2, equal_chunks(4), [[ops[0]], [ops[1]]], algorithm="post")
    for engine in (simulate, simulate_reference):
        # 4 bytes a message: the time is the posting. Receives are posted first, then
        # sends; a message starts once its send is posted, the step's last op.
        one = engine(cluster, schedule, 16, profile=costs)
        assert one.time_s == pytest.approx(10e-6 + 2 * 3e-6, rel=1e-3)
        lock = engine(cluster, on_channel(schedule, 0), 16, profile=costs)
        assert lock.time_s == pytest.approx(10e-6 + 4 * 3e-6, rel=1e-3)


@pytest.mark.parametrize("delay", [{}, {0: 3}, {1: 1, 2: 2}])
@pytest.mark.parametrize("profile", ["ideal", "nccl"])
def test_engines_agree_on_channelled_rings(delay, profile):
    schedule = two_rings(8, delay=delay)
    for cluster in (switch_cluster(8), leaf_spine_cluster(4, boxes_per_leaf=2, spines=1,
                                                          gpus=2)):
        for size in (4096, 8 << 20):
            kw = {"profile": profile, "record": True}
            assert_same_report(simulate(cluster, schedule, size, **kw),
                               simulate_reference(cluster, schedule, size, **kw))
