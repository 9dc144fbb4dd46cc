"""The flow simulator: hand-computed times, conservation of bytes, the lower bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.support.clusters import leaf_spine_cluster, switch_cluster
from tests.support.schedules import hierarchical_schedule, ring_schedule
from topoplan.cluster import loads_cluster
from topoplan.errors import ScheduleError
from topoplan.ir.passes import coalesce
from topoplan.ir.schedule import build_schedule, recv, send
from topoplan.analysis.sim.base import EPS_T
from topoplan.analysis.sim import SimReport, simulate
from topoplan.ir.verify import verify

M = 1 << 20


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_on_one_switch_matches_hand_computation(n):
    cluster = switch_cluster(n, bandwidth="10 GB/s", latency="1 us")
    schedule = ring_schedule(list(range(n)))
    size = n * 4096 * 4  # chunks divide exactly
    report = simulate(cluster, schedule, size, profile="ideal")
    # 2(n-1) steps; each moves M/n over a 10 GB/s NIC and pays two NIC latencies.
    step = (size / n) / 10e9 + 2e-6
    assert report.time_s == pytest.approx(2 * (n - 1) * step, rel=1e-9)
    assert report.algbw == pytest.approx(size / report.time_s)
    assert report.busbw == pytest.approx(report.algbw * 2 * (n - 1) / n)
    assert report.lower_bound_s == pytest.approx(2 * (n - 1) / n * size / 10e9)
    assert report.lower_bound_s <= report.time_s
    assert 0 < report.efficiency < 1
    # Every rank runs its steps back to back, all in lock step.
    for r in range(n):
        times = report.step_times[r]
        assert len(times) == 2 * (n - 1)
        for s, (start, end) in enumerate(times):
            assert start == pytest.approx(s * step, abs=1e-15)
            assert end == pytest.approx((s + 1) * step, abs=1e-15)


def test_ddl_two_switch_bad_ring_order_is_twice_as_slow(topology):
    cluster = topology("ddl_two_switch")
    size = 4 * (1 << 20)
    good = simulate(cluster, ring_schedule([0, 1, 2, 3]), size, profile="ideal")
    bad = simulate(cluster, ring_schedule([0, 2, 1, 3]), size, profile="ideal")
    chunk = size / 4
    # Good: the 10 GB/s link carries one chunk per direction per step; path latency 3 us.
    assert good.time_s == pytest.approx(6 * (chunk / 10e9 + 3e-6), rel=1e-9)
    # Bad: two flows share it in each direction, so the bandwidth term doubles.
    assert bad.time_s == pytest.approx(6 * (2 * chunk / 10e9 + 3e-6), rel=1e-9)
    assert (bad.time_s - 6 * 3e-6) == pytest.approx(2 * (good.time_s - 6 * 3e-6), rel=1e-9)
    assert good.lower_bound_s == pytest.approx(size / 10e9)
    assert bad.link_bytes[("switch0", "switch1")] == pytest.approx(2 * good.link_bytes[("switch0", "switch1")])


def test_link_bytes_add_up_to_bytes_times_hops(topology):
    cluster = topology("ddl_two_switch")
    schedule = ring_schedule([0, 2, 1, 3])
    size = 3 * 1000 * 4  # 3000 elements: chunks of 750
    report = simulate(cluster, schedule, size, record=True, profile="ideal")
    expected = 0.0
    for rank, step, op in schedule.ops():
        if op.kind.value == "send":
            hops = len(cluster.routes(rank, op.peer)[0]) - 1
            expected += 750 * 4 * hops
    assert math.fsum(report.link_bytes.values()) == pytest.approx(expected, rel=1e-12)
    assert len(report.transfers) == 24
    assert all(t.nbytes == 3000 for t in report.transfers)
    assert all(t.start_s < t.end_s for t in report.transfers)
    # The timeline integrates to the bytes on each link.
    for edge, changes in report.link_timeline.items():
        moved = sum(rate * (t1 - t0) for (t0, rate), (t1, _) in zip(changes, changes[1:]))
        assert moved == pytest.approx(report.link_bytes[edge], rel=1e-9)
        assert changes[-1][1] == 0.0
    busiest = report.busiest_links(2)
    assert {edge for edge, _, _ in busiest} == {("switch0", "switch1"), ("switch1", "switch0")}


def test_ecmp_splits_evenly_over_equal_paths():
    cluster = loads_cluster("""
name: two-spines
switches: [leaf0, leaf1, spine0, spine1]
boxes:
  - {name: a, gpus: 1, nics: [{switch: leaf0, bandwidth: 100 GB/s}]}
  - {name: b, gpus: 1, nics: [{switch: leaf1, bandwidth: 100 GB/s}]}
links:
  - {a: leaf0, b: spine0, bandwidth: 10 GB/s}
  - {a: leaf0, b: spine1, bandwidth: 10 GB/s}
  - {a: leaf1, b: spine0, bandwidth: 10 GB/s}
  - {a: leaf1, b: spine1, bandwidth: 10 GB/s}
""")
    schedule = build_schedule(2, [1.0], [[[send(1, 0)], [recv(1, 0)]],
                                         [[recv(0, 0, reduce=True)], [send(0, 0)]]])
    verify(schedule)
    report = simulate(cluster, schedule, 8000, profile="ideal")
    assert report.link_bytes[("leaf0", "spine0")] == report.link_bytes[("leaf0", "spine1")] == 4000
    assert report.time_s == pytest.approx(2 * 4000 / 10e9)  # two 10 GB/s paths in parallel


def test_reduce_bandwidth_adds_reduction_time():
    cluster = switch_cluster(2, bandwidth="10 GB/s", latency="0 us")
    schedule = ring_schedule([0, 1])
    size = 8000
    free = simulate(cluster, schedule, size, profile="ideal")
    slow = simulate(cluster, schedule, size, reduce_bandwidth=1e9, profile="ideal")
    assert free.time_s == pytest.approx(2 * 4000 / 10e9)
    # Only the reduce-scatter step reduces: 4000 bytes at 1 GB/s.
    assert slow.time_s == pytest.approx(free.time_s + 4000 / 1e9)


def test_alpha_is_paid_per_message_step():
    cluster = switch_cluster(4, latency="0 us")
    schedule = ring_schedule([0, 1, 2, 3])
    base = simulate(cluster, schedule, 1 << 16, profile="ideal")
    slow = simulate(cluster, schedule, 1 << 16, alpha=5e-6, profile="ideal")
    assert slow.time_s == pytest.approx(base.time_s + 6 * 5e-6)


def test_tiny_buffers_have_empty_chunks_and_still_finish():
    cluster = switch_cluster(4)
    # 2 fp32 elements, 4 chunks
    report = simulate(cluster, ring_schedule([0, 1, 2, 3]), 8, profile="ideal")
    # Chunks hold 0, 1, 0, 1 elements: every step some rank still moves one element.
    assert report.time_s == pytest.approx(6 * (2e-6 + 4 / 10e9), rel=1e-9)
    # An empty buffer sends nothing (the executor skips empty messages): no time at all.
    zero = simulate(cluster, ring_schedule([0, 1, 2, 3]), 0, profile="ideal")
    assert zero.link_bytes == {} and zero.time_s == 0.0 and zero.messages == 0


def test_resolution_batches_events_and_is_reported(monkeypatch):
    import topoplan.analysis.sim.base as base

    cluster = leaf_spine_cluster(4, boxes_per_leaf=2, gpus=4)
    schedule = hierarchical_schedule(cluster.nranks, 4)
    fine = simulate(cluster, schedule, 12345 * 4, profile="nccl")
    assert fine.resolution == EPS_T
    coarse = simulate(cluster, schedule, 12345 * 4, profile="nccl", resolution=1e-4)
    assert coarse.resolution == 1e-4
    # Batching moves a time by at most the resolution per batch along a chain of steps.
    assert coarse.time_s == pytest.approx(fine.time_s, rel=50 * 1e-4)
    # Schedules above COARSE_OPS ops get the coarse resolution by default.
    monkeypatch.setattr(base, "COARSE_OPS", schedule.nops - 1)
    assert simulate(cluster, schedule, 12345 * 4, profile="nccl").resolution == base.COARSE
    for bad in (0.0, -1e-7, 0.5):
        with pytest.raises(ValueError, match="resolution must be in"):
            simulate(cluster, schedule, 4000, resolution=bad, profile="ideal")


def test_report_fields_are_the_contract():
    import dataclasses
    names = [f.name for f in dataclasses.fields(SimReport)]
    assert names == ["cluster", "algorithm", "nranks", "size", "time_s", "lower_bound_s", "algbw",
                     "busbw", "link_bytes", "link_busy_s", "step_times", "transfers",
                     "link_timeline", "profile", "breakdown", "messages", "resolution", "nccl",
                     "natives", "notes"]
    report = simulate(switch_cluster(2), ring_schedule([0, 1]), M, profile="ideal")
    assert report.nccl is not None and report.nccl.collective == "allreduce"
    assert report.speedup_vs_nccl == pytest.approx(report.nccl.time_s / report.time_s)
    assert (report.cluster, report.algorithm, report.nranks, report.size) == ("switch-2", "ring", 2, M)
    assert report.transfers == () and dict(report.link_timeline) == {}
    assert report.natives == () and report.notes == () and report.native_time == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.time_s = 0  # type: ignore[misc]


def test_wrong_rank_count_is_refused():
    with pytest.raises(ScheduleError, match="schedule has 3 ranks but cluster 'switch-4' has 4"):
        simulate(switch_cluster(4), ring_schedule([0, 1, 2]), M)


def test_unverified_schedules_fail_cleanly():
    cluster = switch_cluster(2)
    unmatched = build_schedule(2, [1.0], [[[send(1, 0)]], [[]]])
    with pytest.raises(ScheduleError, match="unmatched send: rank 0 step 0 sends chunk 0 to rank 1"):
        simulate(cluster, unmatched, M)
    deadlock = build_schedule(2, [1.0], [[[recv(1, 0)], [send(1, 0)]],
                                         [[recv(0, 0)], [send(0, 0)]]])
    with pytest.raises(ScheduleError, match="deadlock: 2 ranks cannot finish; rank 0 step 0"):
        simulate(cluster, deadlock, M)
    mismatch = build_schedule(2, [0.5, 0.5], [[[send(1, 0)]], [[recv(0, 1)]]])
    with pytest.raises(ScheduleError, match="sends chunk 0 but rank 1 step 0 receives it as chunk 1"):
        simulate(cluster, mismatch, M)


def test_progress_callback_is_optional_and_harmless():
    calls = []
    simulate(switch_cluster(3), ring_schedule([0, 1, 2]), M, profile="ideal",
             progress=lambda f, t: calls.append(f))
    assert all(0 <= f <= 1 for f in calls)


@st.composite
def cluster_and_ring(draw):
    nswitch = draw(st.integers(1, 3))
    bw = st.sampled_from(["1 GB/s", "5 GB/s", "10 GB/s", "40 GB/s"])
    lines = ["name: random", "switches: [" + ", ".join(f"s{k}" for k in range(nswitch)) + "]",
             "boxes:"]
    nboxes = draw(st.integers(1 if nswitch == 1 else 2, 4))
    for b in range(nboxes):
        gpus = draw(st.integers(1, 3))
        sw = b % nswitch if b < nswitch else draw(st.integers(0, nswitch - 1))
        line = f"  - {{name: b{b}, gpus: {gpus}, nics: [{{switch: s{sw}, bandwidth: {draw(bw)}}}]"
        if gpus > 1:
            line += f", fabric: {{bandwidth: {draw(bw)}}}"
        lines.append(line + "}")
    if nswitch > 1:
        lines.append("links:")
        for k in range(1, nswitch):
            lines.append(f"  - {{a: s{k - 1}, b: s{k}, bandwidth: {draw(bw)}}}")
    cluster = loads_cluster("\n".join(lines) + "\n")
    order = draw(st.permutations(range(cluster.nranks)))
    return cluster, list(order)


@settings(max_examples=30, deadline=None)
@given(cluster_and_ring(), st.sampled_from([4096, 1 << 20, 3 * 1000 * 4]))
def test_simulated_time_never_beats_the_lower_bound(case, size):
    cluster, order = case
    if cluster.nranks < 2:
        return
    report = simulate(cluster, ring_schedule(order), size, profile="ideal")
    assert report.time_s >= report.lower_bound_s * (1 - 1e-9)
    assert report.time_s > 0


# ---- the fast engine against the reference engine -------------------------------------
# topoplan.analysis.sim.reference.simulate_reference is the first engine (every event batch in global
# time order, global progressive filling): the fast engine must give the same answers.

from topoplan.analysis.sim.reference import simulate_reference as _simulate_reference  # noqa: E402


def exchange_schedule(n: int, rounds: list[list[list[int]]], nchunks: int,
                      reduce_odd: bool = True, nchannels: int = 1) -> "Schedule":
    """Round ``r``: for each permutation ``p`` of the round every rank ``i`` sends chunk
    ``(i + k) % nchunks`` to ``p[i]`` (several sends and recvs per step, links shared);
    the ``k``-th permutation's recvs reduce when ``k`` is odd and ``reduce_odd``. Chunk
    ``c`` is on channel ``c % nchannels`` (IR v4: each rank's channels run apart)."""
    steps = [[] for _ in range(n)]
    for perms in rounds:
        ops = [[] for _ in range(n)]
        for k, perm in enumerate(perms):
            for i in range(n):
                j = perm[i]
                if j == i:
                    continue
                chunk = (i + k) % nchunks
                c = chunk % nchannels
                ops[i].append(send(j, chunk, channel=c))
                ops[j].append(recv(i, chunk, reduce=reduce_odd and bool(k % 2), channel=c))
        for i in range(n):
            steps[i].append(ops[i])
    return build_schedule(n, [1.0 / nchunks] * nchunks, steps, algorithm="exchange")


def assert_same_report(fast, ref, rel=50 * EPS_T):
    # Both engines treat events within EPS_T (relative to the clock) of a batch as part
    # of it, in batches of their own, so times drift by up to that much per batch along a
    # chain of steps.
    scale = max(ref.time_s, 1e-12)
    assert fast.time_s == pytest.approx(ref.time_s, rel=rel, abs=1e-18)
    for rank_fast, rank_ref in zip(fast.step_times, ref.step_times, strict=True):
        for (s0, e0), (s1, e1) in zip(rank_fast, rank_ref, strict=True):
            assert abs(s0 - s1) <= rel * scale and abs(e0 - e1) <= rel * scale
    assert fast.link_bytes.keys() == ref.link_bytes.keys()
    for edge, moved in ref.link_bytes.items():
        assert fast.link_bytes[edge] == pytest.approx(moved, rel=1e-12)
    assert set(fast.link_busy_s) == set(ref.link_busy_s)
    for edge, busy in ref.link_busy_s.items():
        # The reference sums busy time over event batches and ends a flow up to EPS_T
        # (relative to the clock) early or late per batch; over a link's flows that adds
        # up (the fast engine is exact on fixed-rate links, see the leaf-spine test).
        assert fast.link_busy_s[edge] == pytest.approx(busy, rel=1e-6, abs=rel * scale)
    assert len(fast.transfers) == len(ref.transfers)
    for a, b in zip(fast.transfers, ref.transfers, strict=True):
        assert (a.src, a.dst, a.src_step, a.dst_step, a.chunk, a.nbytes) == \
            (b.src, b.dst, b.src_step, b.dst_step, b.chunk, b.nbytes)
        assert abs(a.start_s - b.start_s) <= rel * scale and abs(a.end_s - b.end_s) <= rel * scale
    assert fast.link_timeline.keys() == ref.link_timeline.keys()
    for edge, changes in ref.link_timeline.items():
        # The same load over time, except within the tolerance of a change: either engine
        # may record a change by rounding only, or split one instant in two.
        mine = fast.link_timeline[edge]
        assert mine[-1][1] == changes[-1][1] == 0.0
        cuts = sorted({t for t, _ in mine} | {t for t, _ in changes})
        probes = [(a + b) / 2 for a, b in zip(cuts, cuts[1:]) if b - a > 40 * EPS_T * scale]
        for probe in probes:
            assert load_at(mine, probe) == pytest.approx(load_at(changes, probe),
                                                         rel=1e-9, abs=1e-3), (edge, probe)


def load_at(changes, t):
    load = 0.0
    for when, rate in changes:
        if when > t:
            break
        load = rate
    return load


@pytest.mark.parametrize("nboxes", [2, 6])
@pytest.mark.parametrize("size", [256 << 20, 1000 * 4 + 4, 12345 * 4])
def test_leaf_spine_ring_and_hierarchical_match_the_reference(nboxes, size):
    cluster = leaf_spine_cluster(nboxes, boxes_per_leaf=2, gpus=4)
    n = cluster.nranks
    for schedule in (ring_schedule(list(range(n))), hierarchical_schedule(n, 4)):
        for kw in ({}, {"record": True, "reduce_bandwidth": 5e10, "alpha": 2e-6}):
            fast = simulate(cluster, schedule, size, **kw)
            assert_same_report(fast, _simulate_reference(cluster, schedule, size, **kw))
            # In-box links carry one flow at a time at full rate: busy = bytes / 300 GB/s
            # (up to a batch's EPS_T of the clock per flow).
            for (u, v), busy in fast.link_busy_s.items():
                if "fabric" in u + v:
                    assert busy == pytest.approx(fast.link_bytes[u, v] / 300e9, rel=1e-12,
                                                 abs=50 * EPS_T * fast.time_s)


def test_a_first_step_with_nothing_to_do_is_not_a_deadlock():
    # The first engine never ended an empty first step and reported a deadlock.
    cluster = switch_cluster(2, latency="0 us")
    schedule = build_schedule(2, [1.0], [[[], [send(1, 0)]], [[], [recv(0, 0)]]])
    for size in (0, 4000):
        report = simulate(cluster, schedule, size, profile="ideal")
        assert report.step_times[0][0] == (0.0, 0.0)
        assert report.time_s == pytest.approx(size / 10e9)
        assert report.time_s == _simulate_reference(cluster, schedule, size, profile="ideal").time_s


def test_hierarchical_helper_schedule_is_correct():
    verify(hierarchical_schedule(16, 4))
    verify(hierarchical_schedule(24, 8))


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_shared_links_and_merged_messages_match_the_reference(data):
    """Random exchanges: several messages per step, to several peers, on a leaf-spine
    (shared NICs, leaves and spines: the windowed dynamic engine) or one switch; on one
    channel or on several (IR v4: a rank's channels run at once and share its links)."""
    nboxes = data.draw(st.integers(2, 4))
    gpus = data.draw(st.sampled_from([1, 2, 4]))
    if data.draw(st.booleans()):
        cluster = leaf_spine_cluster(nboxes, boxes_per_leaf=data.draw(st.integers(1, 2)),
                                     spines=data.draw(st.integers(1, 3)), gpus=gpus)
    else:
        cluster = switch_cluster(nboxes * gpus, latency=data.draw(st.sampled_from(["0 us", "1 us"])))
    n = cluster.nranks
    nrounds = data.draw(st.integers(1, 4))
    rounds = []
    for _ in range(nrounds):
        if data.draw(st.booleans()):
            rounds.append([data.draw(st.permutations(range(n)))
                           for _ in range(data.draw(st.integers(1, 3)))])
        else:  # one permutation repeated: back-to-back chunks that coalesce() merges
            rounds.append([data.draw(st.permutations(range(n)))] * data.draw(st.integers(2, 3)))
    schedule = exchange_schedule(n, rounds, nchunks=data.draw(st.integers(1, 5)),
                                 reduce_odd=data.draw(st.booleans()),
                                 nchannels=data.draw(st.sampled_from([1, 1, 2, 3])))
    size = data.draw(st.sampled_from([0, 4, 4000, 1 << 20, 3 * 1000 * 4 + 8]))
    kw = {"record": data.draw(st.booleans()),
          "alpha": data.draw(st.sampled_from([0.0, 1e-6])),
          "reduce_bandwidth": data.draw(st.sampled_from([None, 2e10]))}
    fast = simulate(cluster, schedule, size, **kw)
    assert_same_report(fast, _simulate_reference(cluster, schedule, size, **kw))
    # The same exchanges with each pair's back-to-back chunks as one range (IR v2).
    merged = coalesce(schedule)
    fast_merged = simulate(cluster, merged, size, **kw)
    assert_same_report(fast_merged, _simulate_reference(cluster, merged, size, **kw))
    # Same bytes on every link; times may differ, since links are shared fairly per
    # flow and a merged pair holds one flow instead of several.
    assert fast_merged.link_bytes == pytest.approx(fast.link_bytes)


@settings(max_examples=10, deadline=None)
@given(cluster_and_ring(), st.sampled_from([4096, 1 << 20, 3 * 1000 * 4]))
def test_random_rings_match_the_reference(case, size):
    cluster, order = case
    if cluster.nranks < 2:
        return
    schedule = ring_schedule(order)
    assert_same_report(simulate(cluster, schedule, size, record=True, profile="ideal"),
                       _simulate_reference(cluster, schedule, size, record=True, profile="ideal"))


def test_one_schedule_at_many_sizes_reuses_its_flattened_ops():
    cluster = leaf_spine_cluster(4, boxes_per_leaf=2, gpus=2)
    schedule = hierarchical_schedule(8, 2)
    first = [simulate(cluster, schedule, size, profile="ideal").time_s
             for size in (1 << 10, 1 << 20, 8)]
    again = [simulate(cluster, hierarchical_schedule(8, 2), size, profile="ideal").time_s
             for size in (1 << 10, 1 << 20, 8)]
    assert first == again


def test_two_messages_on_one_link_share_it_then_the_larger_speeds_up():
    # Chunks of 1000 and 3000 bytes from rank 0 to rank 1 in one step, one 10 GB/s link
    # each way (latency 0): both at 5 GB/s until the small one ends at 0.2 us, then the
    # large one alone at 10 GB/s: 0.4 us in all (processor sharing, by hand).
    cluster = switch_cluster(2, latency="0 us")
    schedule = build_schedule(2, [0.25, 0.75], [[[send(1, 0), send(1, 1)]],
                                                [[recv(0, 0), recv(0, 1)]]])
    report = simulate(cluster, schedule, 4000, record=True, profile="ideal")
    small, large = sorted(report.transfers, key=lambda t: t.nbytes)
    assert (small.nbytes, large.nbytes) == (1000, 3000)
    assert small.end_s == pytest.approx(2e-7, rel=1e-12)
    assert large.end_s == pytest.approx(4e-7, rel=1e-12)
    assert report.link_timeline[("sw0", "b1/nic0")] == ((0.0, 10e9), (pytest.approx(4e-7), 0.0))
    assert report.link_busy_s[("b0/nic0", "sw0")] == pytest.approx(4e-7, rel=1e-12)


@pytest.mark.parametrize("size", [256 << 20, 12345 * 4])
def test_mcf_pipelined_multi_level_plan_matches_the_reference(size):
    """The mcf planner's grid plan (levels in the box, the leaf and across spines, in
    pipeline pieces): many flows on shared NICs and spines at once, one big component."""
    import topoplan
    from topoplan.analysis.cost import IDEAL
    from topoplan.analysis.sim.engine import Engine as _Engine

    cluster = leaf_spine_cluster(8, boxes_per_leaf=2, spines=2, gpus=4)
    # Under the ideal profile (free messages) mcf pipelines even 1 MiB.
    schedule = topoplan.plan(cluster, algorithm="mcf", size=1 << 20, profile="ideal")
    assert schedule.meta["algorithm"] == "mcf" and schedule.meta.get("pieces", 1) > 1
    for kw in ({}, {"record": True, "reduce_bandwidth": 5e10, "alpha": 1e-6}):
        fast = simulate(cluster, schedule, size, **kw)
        assert_same_report(fast, _simulate_reference(cluster, schedule, size, **kw))
    # Each GPU's edges to and from its NIC carry the same paths: one link class each.
    engine = _Engine(cluster, schedule, size, 4, IDEAL, False, None)
    assert (engine.edge_rep != np.arange(len(engine.edges))).sum() >= 2 * cluster.nranks


def progressive_filling(weight: list[int], links: list[list[int]], cap: list[float]) -> list[float]:
    """Max-min fair rates the textbook way (Bertsekas and Gallager, 6.5.2): raise every
    unfrozen flow's rate together until a link fills, freeze that link's flows, repeat."""
    rate = [0.0] * len(weight)
    frozen = [False] * len(weight)
    remaining = list(cap)
    while not all(frozen):
        users = [[f for f in range(len(weight)) if not frozen[f] and e in links[f]]
                 for e in range(len(cap))]
        shares = [remaining[e] / sum(weight[f] for f in users[e])
                  for e in range(len(cap)) if users[e]]
        level = min(shares)
        tight = [e for e in range(len(cap))
                 if users[e] and remaining[e] / sum(weight[f] for f in users[e]) <= level * (1 + 1e-12)]
        for f in sorted({f for e in tight for f in users[e]}):
            frozen[f] = True
            rate[f] = level
            for e in links[f]:
                remaining[e] -= weight[f] * level
    return rate


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5).flatmap(lambda nlinks: st.tuples(
    st.lists(st.floats(1.0, 100.0), min_size=nlinks, max_size=nlinks),
    st.lists(st.tuples(st.integers(1, 3), st.sets(st.integers(0, nlinks - 1), min_size=1)),
             min_size=1, max_size=8))))
def test_parallel_water_filling_gives_the_textbook_max_min_rates(case):
    """Both engines share :func:`topoplan.analysis.sim.base.maxmin`; here it meets the textbook
    algorithm, one bottleneck at a time."""
    from topoplan.analysis.sim.base import maxmin

    cap, flows = case
    weight = [w for w, _ in flows]
    links = [sorted(ls) for _, ls in flows]
    pf = np.array([f for f, ls in enumerate(links) for _ in ls], dtype=np.int64)
    pe = np.array([e for ls in links for e in ls], dtype=np.int64)
    got = maxmin(len(flows), np.array(weight, dtype=np.float64), pf, pe, np.array(cap))
    assert got.tolist() == pytest.approx(progressive_filling(weight, links, cap), rel=1e-9)


def test_simulating_or_verifying_a_schedule_does_not_keep_it_alive():
    import gc
    import weakref

    schedule = ring_schedule([0, 1, 2, 3])
    simulate(switch_cluster(4), schedule, M)
    verify(schedule)
    ref = weakref.ref(schedule)
    del schedule
    gc.collect()
    assert ref() is None


def test_verify_and_simulate_name_a_deadlock_in_the_same_words():
    deadlock = build_schedule(2, [1.0], [[[recv(1, 0)], [send(1, 0)]],
                                         [[recv(0, 0)], [send(0, 0)]]])
    messages = []
    for check in (lambda: verify(deadlock), lambda: simulate(switch_cluster(2), deadlock, M),
                  lambda: _simulate_reference(switch_cluster(2), deadlock, M)):
        with pytest.raises(ScheduleError) as info:
            check()
        messages.append(str(info.value))
    assert messages[0] == messages[1] == messages[2]
    assert "waits to recv chunk 0 with rank 1, which is stuck at step 0 before its " \
           "matching step 1" in messages[0]
