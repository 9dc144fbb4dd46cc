"""Channelled plans (IR v4) as MSCCL XML and back: a plan's channel is MSCCL channels of
its own (``chan`` on the thread blocks, ``nchannels`` on the algo), and the import reads
``chan`` back into the ops' channels."""

from __future__ import annotations

from dataclasses import replace

import pytest

import topoplan
from topoplan.errors import PlannerError
from topoplan.interop.msccl import (SEGMENTS_ATTR, Limits, export_msccl, import_msccl,
                                    limit_violations, loads_msccl, to_xml, verify_msccl)
from topoplan.ir.verify import verify
from topoplan.ir.passes import channelize

from .support.clusters import load_topology
from .support.schedules import ring_schedule


def _shape(schedule):
    """Per rank and step, the (kind, peer, channel) of its ops."""
    return [[sorted({(op.kind.value, op.peer, op.channel) for op in step})
             for step in program.steps] for program in schedule.ranks]


def _shares(schedule):
    """channel -> the share of the buffer its ops touch."""
    owner: dict[int, int] = {}
    for _, _, op in schedule.ops():
        for k in range(op.chunk, op.end):
            assert owner.setdefault(k, op.channel) == op.channel, k  # one channel a chunk
    out: dict[int, float] = {}
    for k, c in owner.items():
        out[c] = out.get(c, 0.0) + schedule.chunks[k]
    return out


def _through_xml(result):
    algo = loads_msccl(to_xml(result.algo))
    assert algo == result.algo
    assert limit_violations(algo) == []
    verify_msccl(algo)
    return algo


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("algorithm", ["ring", "rhd", "mcf"])
@pytest.mark.parametrize("channels", [2, 3])
def test_channelled_plans_export_to_their_own_msccl_channels_and_come_back(
        collective, algorithm, channels):
    cluster = load_topology("dgx1_v100")
    size = 1 << 24
    plan = topoplan.plan(cluster, algorithm, size=size, collective=collective)
    schedule = channelize(plan, channels)
    result = export_msccl(schedule, grid="exact")  # the plan itself comes back
    algo = _through_xml(result)
    assert result.segments == 1 and algo.nchannels == channels
    for gpu in algo.gpus:
        assert sorted({tb.chan for tb in gpu.tbs if tb.send >= 0 or tb.recv >= 0}) == list(
            range(channels))
    back = import_msccl(algo)
    assert verify(back).collective == collective
    assert back.nchannels == channels and back.version == 4
    assert back.nsteps == schedule.nsteps and _shape(back) == _shape(schedule)
    for c, share in _shares(back).items():
        assert share == pytest.approx(1 / channels), c
    t0 = topoplan.simulate(cluster, schedule, size=size).time_s
    assert topoplan.simulate(cluster, back, size=size).time_s == pytest.approx(t0, rel=1e-5)


def test_instances_of_a_channelled_plan_stack_their_channels():
    schedule = channelize(ring_schedule(list(range(4))), 2)
    result = export_msccl(schedule, channels=3)
    algo = _through_xml(result)
    assert algo.nchannels == 6 and algo.nchunksperloop == 3 * 2 * 4
    back = import_msccl(algo)
    # each instance's channel is a slice of the buffer of its own: a channel again
    assert back.nchannels == 6 and verify(back)
    assert all(share == pytest.approx(1 / 6) for share in _shares(back).values())


def test_segments_of_a_channel_are_said_in_the_file_and_read_back():
    # 12 ranks: 22 messages per pair and channel, 6 steps a thread block: 4+ segments each
    schedule = channelize(ring_schedule(list(range(12))), 2)
    limits = Limits(max_steps=6, max_channels=16)
    result = export_msccl(schedule, limits=limits)
    assert result.segments > 1
    text = to_xml(result.algo)
    assert f'{SEGMENTS_ATTR}="{result.segments}"' in text.splitlines()[0]
    algo = loads_msccl(text)
    assert algo.segments == result.segments and algo.nchannels == 2 * result.segments
    assert limit_violations(algo, limits) == []
    verify_msccl(algo)
    back = import_msccl(algo)
    assert back.nchannels == 2 and verify(back) and _shape(back) == _shape(schedule)
    # without the attribute, MSCCL channels that share a chunk are merged: a ring's
    # chunk crosses pairs on different segments, so each channel's segments are one
    merged = import_msccl(replace(algo, segments=1))
    assert merged.nchannels == 2 and verify(merged)
    assert all(share == pytest.approx(1 / 2) for share in _shares(merged).values())


def test_a_plan_without_channels_writes_no_segments_attribute():
    result = export_msccl(ring_schedule(list(range(4))))
    assert SEGMENTS_ATTR not in to_xml(result.algo)
    assert import_msccl(result.algo).nchannels == 1


def test_channels_and_instances_beyond_the_executor_are_refused():
    schedule = channelize(ring_schedule(list(range(4))), 16)
    with pytest.raises(PlannerError, match=r"runs on 16 channels, so 3 instances need 48 "
                                           r"MSCCL channels; .* use at most 2 instances"):
        export_msccl(schedule, channels=3)


def test_messages_pair_per_channel_not_across_channels():
    # rank 1 posts its channel-1 recv before its channel-0 recv: IR v4 pairs per
    # (src, dst, channel), so the k-th send of a channel meets the k-th recv of it
    from topoplan.interop.msccl.export import _build_nodes
    from topoplan.ir.schedule import build_schedule, recv, send

    schedule = build_schedule(2, [0.25] * 4, [
        [[send(1, 0), recv(1, 1, True), send(1, 2, count=2, channel=1),
          recv(1, 2, True, 2, channel=1)], [send(1, 1), recv(1, 0)]],
        [[recv(0, 2, True, 2, channel=1), send(0, 2, count=2, channel=1), send(0, 1),
          recv(0, 0, True)], [send(0, 0), recv(0, 1)]]])
    _, msgs = _build_nodes(schedule)
    assert len(msgs) == 6
    for m in msgs:
        assert (m.send_node.chunk, m.send_node.count) == (m.recv_node.chunk, m.recv_node.count)
        assert m.channel == (1 if m.chunk == 2 else 0)
    assert sorted((m.src, m.dst, m.channel, m.k) for m in msgs) == [
        (0, 1, 0, 0), (0, 1, 0, 1), (0, 1, 1, 0), (1, 0, 0, 0), (1, 0, 0, 1), (1, 0, 1, 0)]
