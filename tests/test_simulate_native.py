"""Native collective steps (IR v3) in the simulator: their prices under every profile
(the NCCL model over the group, the measured collective, a ring on the links), the group
rendezvous, link sharing with concurrent messages, the bound, and the profile's
``native`` section from parsing to ``topoplan calibrate`` over real MPI."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.support.clusters import SHIPPED, load_topology, switch_cluster
from tests.support.native_schedules import allreduces, composed
from tests.support.schedules import ring as ring_schedule
from tests.test_nccl_model import GiB, h100, pick, rails
from topoplan.analysis.cost import (CostProfile, NativeCost, get_profile, loads_profile,
                                    native_bus_factor, profile_names)
from topoplan.analysis.native.clusters import group_cluster
from topoplan.analysis.native.nccl import nccl_group_time, nccl_model, nccl_time
from topoplan.analysis.native.price import native_price
from topoplan.analysis.sim import simulate
from topoplan.analysis.sim.reference import simulate_reference
from topoplan.cluster import loads_cluster
from topoplan.errors import ProfileError, ScheduleError
from topoplan.ir.schedule import build_schedule, equal_chunks, native_op, recv, send

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def native_only(n: int, kind: str, group, *, chunks: int = 1, root=None, others=()):
    """Every rank of ``group`` runs one native ``kind`` over all ``chunks``; ranks in
    ``others`` (rank -> steps) run those instead."""
    steps = [[] for _ in range(n)]
    for r in group:
        steps[r] = [[native_op(kind, group, 0, chunks, root=root)]]
    for r, program in dict(others).items():
        steps[r] = program
    return build_schedule(n, equal_chunks(chunks), steps, algorithm=f"native-{kind}")


def two_switches(latency: str = "0 us") -> object:
    """Ranks 0, 1 on switch0 and 2, 3 on switch1, NICs 100 GB/s, the switches 10 GB/s."""
    boxes = "\n".join(f"  - {{name: {b}, gpus: 1, nics: [{{switch: switch{s}, bandwidth: "
                      f"100 GB/s, latency: {latency}}}]}}"
                      for b, s in (("A", 0), ("B", 0), ("C", 1), ("D", 1)))
    return loads_cluster(f"name: two\nswitches: [switch0, switch1]\nboxes:\n{boxes}\n"
                         f"links: [{{a: switch0, b: switch1, bandwidth: 10 GB/s, "
                         f"latency: {latency}}}]\n")


# ---- nccl: the NCCL model over the group ---------------------------------------------
@pytest.mark.parametrize("name", ["dgx_a100_x4", "ddl_two_switch", "aws_p3_16xlarge_x4",
                                  "ndv2_x2", "dgx1_v100"])
@pytest.mark.parametrize("size", [4 << 10, 16 * MiB, 256 * MiB])
def test_native_allreduce_over_every_rank_is_the_nccl_row(name, size):
    cluster = load_topology(name)
    n = cluster.nranks
    report = simulate(cluster, native_only(n, "allreduce", range(n)), size, profile="nccl")
    row = nccl_time(cluster, size)
    assert report.time_s == pytest.approx(row.time_s, rel=1e-12)
    assert report.time_s == pytest.approx(report.nccl.time_s, rel=1e-12)
    assert report.speedup_vs_nccl == pytest.approx(1.0, rel=1e-12)
    assert report.native_time == pytest.approx(report.time_s, rel=1e-12)
    assert sum(report.breakdown.values()) == pytest.approx(report.time_s, rel=1e-12)
    [record] = report.natives
    assert record.priced_by == f"NCCL {row.label()}" and record.group == tuple(range(n))
    assert record.steps == (0,) * n and report.notes == ()


def test_native_allreduce_in_one_nvswitch_box_is_the_models_nvls_by_hand():
    cluster = loads_cluster(rails(2, nvls=True))  # two HGX H100 boxes; box 0's GPUs alone
    report = simulate(cluster, native_only(16, "allreduce", range(8)), GiB, profile="nccl")
    # tests/test_nccl_model.py's NVLS by hand: 8 channels x min(40 x 0.85 x 7/8 x 2, 60)
    # GB/s busBw, algbw x 8/14, latency hwLatencies[NVLINK][NVLS][Simple] = 25 us.
    algbw = 8 * min(40 * 0.85 * 7 / 8 * 2, 60.0) * 8 / 14
    assert report.time_s == pytest.approx((25.0 + GiB / (1000 * algbw)) * 1e-6, rel=1e-12)
    assert report.natives[0].priced_by == "NCCL NVLS/Simple x16"
    # The same as one HGX H100 on its own: a box's NICs do not enter a one-node search.
    assert report.time_s == pytest.approx(nccl_time(loads_cluster(h100()), GiB).time_s)


def test_every_box_runs_its_own_native_at_once():
    cluster = loads_cluster(rails(2, nvls=True))
    steps = [[[native_op("allreduce", range(8 * (r // 8), 8 * (r // 8) + 8), 0)]]
             for r in range(16)]
    both = simulate(cluster, build_schedule(16, (1.0,), steps), GiB, profile="nccl")
    one = simulate(cluster, native_only(16, "allreduce", range(8)), GiB, profile="nccl")
    assert both.time_s == pytest.approx(one.time_s, rel=1e-12)  # no link in common
    assert len(both.natives) == 2


@pytest.mark.parametrize("kind", ["allreduce", "reduce_scatter", "allgather"])
def test_a_rail_is_nccl_between_those_boxes_over_their_nics(kind):
    cluster = loads_cluster(rails(4))
    rail = [3, 11, 19, 27]  # GPU 3 of every node, served by its NIC 3 on switch rail3
    sub = group_cluster(cluster, rail)
    assert [(b.name, b.gpus, len(b.nics), b.nics[0].gpus) for b in sub.cluster.boxes] == \
        [(f"n{i}", 1, 1, (0,)) for i in range(4)]
    assert sub.ranks == tuple(rail) and sub.edge(("n2/gpu0", "n2/nic0")) == ("n2/gpu3", "n2/nic3")
    # The same as four one-GPU boxes on that rail's switch, written by hand.
    alone = loads_cluster(
        "name: rail\nswitches: [{name: 'rail{i}', count: 8}, spine]\n"
        "links: [{a: 'rail{i}', b: spine, count: 8, bandwidth: 3.2 Tbit/s}]\n"
        "boxes: [{name: 'n{i}', count: 4, gpus: 1, gpu: H100, "
        "nics: [{switch: rail3, bandwidth: 400 Gbit/s, gpus: [0]}]}]\n")
    expected = nccl_model(alone).choose(kind, GiB)
    chunks = 4 if kind != "allreduce" else 1
    report = simulate(cluster, native_only(32, kind, rail, chunks=chunks), GiB, profile="nccl")
    assert report.time_s == pytest.approx(expected.time_s, rel=1e-12)
    assert report.natives[0].priced_by == f"NCCL {expected.label()}"
    # Its bytes cross the rail's NICs and nothing else of the boxes.
    assert all("nic3" in u or "nic3" in v or u.startswith("rail") or v.startswith("rail")
               or v == "spine" or u == "spine" for u, v in report.link_bytes)


def test_rooted_and_sharded_kinds_are_priced_as_nccl_prices_them():
    # tuning.cc on one NVSwitch box (12 ring channels of 30 GB/s, hwLatencies[NVLINK]
    # [Ring][Simple] 3.4 us, baseLatencies 8.4 us): reduce-scatter and allgather take
    # n - 1 steps and algbw = busBw x n / (n - 1); broadcast and reduce n steps, algbw
    # = busBw, and one step's latency (every channel the same ring).
    model = nccl_model(loads_cluster(h100(nvls=False)))
    for kind in ("reduce_scatter", "allgather"):
        ring = pick(model, kind, GiB, "Ring", "Simple")
        assert ring.tuner_time_s == pytest.approx((8.4 + 7 * 3.4 + GiB / (1000 * 360 * 8 / 7))
                                                  * 1e-6)
    for kind in ("broadcast", "reduce"):
        assert {c.algorithm for c in model.candidates(kind, GiB)} == {"Ring"}
        ring = pick(model, kind, GiB, "Ring", "Simple")
        assert ring.tuner_time_s == pytest.approx((8.4 + 3.4 + GiB / (1000 * 360)) * 1e-6)
    cluster = loads_cluster(rails(2))
    for kind, chunks, root in (("reduce_scatter", 8, None), ("allgather", 8, None),
                               ("broadcast", 1, 2), ("reduce", 1, 5)):
        report = simulate(cluster, native_only(16, kind, range(8), chunks=chunks, root=root),
                          GiB, profile="nccl")
        choice, _, _ = nccl_group_time(cluster, range(8), kind, GiB)
        assert report.time_s == pytest.approx(choice.time_s, rel=1e-12), kind


def test_nccl_loads_map_onto_the_clusters_own_links():
    cluster = load_topology("dgx_a100_x4")
    for group in (range(8), range(0, 32, 8), [0, 1, 8, 9, 16, 17]):
        price = native_price(cluster, "allreduce", group, 64 * MiB, "nccl")
        assert price.loads and all(cluster.graph.has_edge(*e) for e in price.loads)
        assert price.time_s >= price.floor_s > 0 and price.source.startswith("NCCL ")


# ---- ideal: NCCL's algorithm on the links alone -----------------------------------
def test_ideal_native_step_is_nccls_algorithm_on_the_links_alone(topology):
    cluster = topology("ddl_two_switch")
    size = 4 * MiB
    crossing = {}
    for order, crossings in (([0, 1, 2, 3], 1), ([0, 2, 1, 3], 2)):
        report = simulate(cluster, native_only(4, "allreduce", order), size, profile="ideal")
        price = native_price(cluster, "allreduce", order, size, "ideal")
        assert price.source.startswith("NCCL ") and price.source.endswith("links alone")
        # 2 (g - 1) = 6 steps of 3 us path latency (NIC, switch link, NIC), then the
        # bytes NCCL's choice lays on the 10 GB/s switch link (its ring in group order
        # crosses it once or twice each way; its protocol's wire bytes included)
        wire = report.link_bytes[("switch0", "switch1")]
        assert wire == pytest.approx(price.loads[("switch0", "switch1")])
        assert wire >= crossings * 1.5 * size * (1 - 1e-12)
        assert report.time_s == pytest.approx(6 * 3e-6 + wire / 10e9, rel=1e-12), order
        assert report.notes == ()
        crossing[crossings] = wire
        # no faster than the point-to-point ring in the same order on the same links
        p2p = simulate(cluster, ring_schedule(4) if order == [0, 1, 2, 3] else
                       _relabel(ring_schedule(4), order), size, profile="ideal")
        assert report.time_s >= p2p.time_s * (1 - 1e-9), order
    assert crossing[2] == pytest.approx(2 * crossing[1])


def _relabel(schedule, order):
    """``schedule`` with its rank ``i`` played by ``order[i]``."""
    steps = [None] * schedule.nranks
    for i, program in enumerate(schedule.ranks):
        steps[order[i]] = [[op.__class__(op.kind, order[op.peer], op.chunk, op.reduce, op.count)
                            for op in step] for step in program.steps]
    return build_schedule(schedule.nranks, schedule.chunks, steps, algorithm="relabelled")


@pytest.mark.parametrize("kind, factor", [("reduce_scatter", 0.75), ("allgather", 0.75),
                                          ("broadcast", 1.0), ("reduce", 1.0)])
def test_ideal_ring_carries_the_bus_factor_of_each_kind(kind, factor):
    cluster = switch_cluster(4, bandwidth="10 GB/s", latency="1 us")
    size = 4 * MiB
    root = 1 if kind in ("broadcast", "reduce") else None
    report = simulate(cluster, native_only(4, kind, range(4), chunks=4, root=root), size,
                      profile="ideal")
    assert native_bus_factor(kind, 4) == factor
    # g - 1 = 3 steps of two NIC latencies, then bus(g) x size over a 10 GB/s NIC.
    assert report.time_s == pytest.approx(3 * 2e-6 + factor * size / 10e9, rel=1e-12)


def test_nothing_to_move_costs_nothing():
    cluster = switch_cluster(4)
    assert simulate(cluster, native_only(4, "allreduce", [2]), MiB, profile="ideal").time_s == 0
    assert simulate(cluster, native_only(4, "allreduce", range(4)), 0, profile="nccl").time_s == 0
    price = native_price(cluster, "allgather", [0], MiB, "nccl")
    assert (price.time_s, price.loads, price.source) == (0.0, {}, "nothing to move")


# ---- the rendezvous ------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["ideal", "nccl"])
def test_one_late_member_makes_every_member_wait(profile):
    cluster = switch_cluster(4, bandwidth="10 GB/s", latency="1 us")
    size = 4 * MiB
    # Ranks 2 and 3 first exchange a message; ranks 0 and 1 reach the native at once.
    late = {2: [[send(3, 0)], [native_op("allreduce", range(4), 0, 4)]],
            3: [[recv(2, 0)], [native_op("allreduce", range(4), 0, 4)]]}
    schedule = native_only(4, "allreduce", range(4), chunks=4, others=late)
    report = simulate(cluster, schedule, size, profile=profile)
    costs = get_profile(profile)
    message_end = report.step_times[3][0][1]
    # the message: posted one op into its step on both sides, then alpha, two NIC
    # latencies, a quarter of the buffer at 10 GB/s
    assert message_end == pytest.approx(costs.call_overhead + costs.step_overhead
                                        + costs.op_overhead + costs.alpha_network + 2e-6
                                        + size / 4 / 10e9, rel=1e-9)
    [op] = report.natives
    assert op.start_s == pytest.approx(message_end + costs.step_overhead, rel=1e-12)
    alone = native_price(cluster, "allreduce", range(4), size, profile).time_s
    assert op.end_s == pytest.approx(op.start_s + alone, rel=1e-9)
    assert report.step_times[0][0][0] == 0.0  # rank 0 reached it at once (all native: no call)
    for r, step in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert report.step_times[r][step][1] == op.end_s  # it ends for every member at once
    assert report.time_s == pytest.approx(simulate_reference(cluster, schedule, size,
                                                             profile=profile).time_s, rel=1e-9)
    assert sum(report.breakdown.values()) == pytest.approx(report.time_s, rel=1e-9)
    assert report.breakdown["native"] == pytest.approx(alone, rel=1e-9)


# ---- contention with concurrent messages ----------------------------------------------
@pytest.mark.parametrize("message, shared", [(1.0, 1.0), (0.5, 0.5)])
def test_a_native_shares_its_links_with_messages_of_other_ranks(message, shared):
    cluster = two_switches()
    size = 100 * MiB
    alone = simulate(cluster, native_only(4, "allreduce", [0, 2]), size, profile="ideal")
    # With g = 2 the ring carries the buffer once each way over the 10 GB/s switch link.
    assert alone.time_s == pytest.approx(size / 10e9, rel=1e-12)
    # Meanwhile rank 1 sends rank 3 ``message`` x the buffer over the same link.
    chunks = (message, 1 - message) if message < 1 else (1.0,)
    steps = [[[native_op("allreduce", [0, 2], 0, len(chunks))]], [[send(3, 0)]],
             [[native_op("allreduce", [0, 2], 0, len(chunks))]], [[recv(1, 0)]]]
    schedule = build_schedule(4, chunks, steps, algorithm="contended")
    report = simulate(cluster, schedule, size, profile="ideal", record=True)
    # Both get 5 GB/s of the link while the message lasts; the native then has it alone.
    sent = message * size
    by_hand = sent / 5e9 + (size - sent) / 10e9
    assert report.step_times[0][0][1] == pytest.approx(by_hand, rel=1e-9)
    assert report.step_times[3][0][1] == pytest.approx(sent / 5e9, rel=1e-9)
    assert report.link_bytes[("switch0", "switch1")] == pytest.approx(size + sent)
    assert report.link_timeline[("switch0", "switch1")][0] == (0.0, 10e9)
    oracle = simulate_reference(cluster, schedule, size, profile="ideal")
    assert oracle.time_s == pytest.approx(report.time_s, rel=1e-9)


@pytest.mark.parametrize("name", ["ddl_two_switch", "dgx_a100_x4", "mn1_10gbe"])
@pytest.mark.parametrize("profile", ["ideal", "nccl", "mpi"])
def test_engines_agree_on_composed_schedules(name, profile):
    cluster = load_topology(name)
    schedule = composed(cluster)
    for size in (64 << 10, 64 * MiB):
        fast = simulate(cluster, schedule, size, profile=profile)
        slow = simulate_reference(cluster, schedule, size, profile=profile)
        assert fast.time_s == pytest.approx(slow.time_s, rel=1e-6)
        assert fast.natives == slow.natives or all(
            math.isclose(a.end_s, b.end_s, rel_tol=1e-6) for a, b in zip(fast.natives, slow.natives))
        assert sum(fast.breakdown.values()) == pytest.approx(fast.time_s, rel=1e-9)


# ---- the bound -----------------------------------------------------------------------
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name == "leaf_spine_1024" else name for name in SHIPPED])
def test_composed_schedules_never_beat_the_bound(name):
    cluster = load_topology(name)
    # Point-to-point rings across the boxes where that is cheap to simulate; native
    # allreduces over each rail on the big clusters.
    crosses = ("ring", "native") if cluster.nranks <= 64 else ("native",)
    for cross in crosses:
        schedule = composed(cluster, cross)
        if cluster.nranks <= 64:
            assert allreduces(schedule)
        for profile in profile_names():
            for size in (4 << 10, MiB, 256 * MiB):
                report = simulate(cluster, schedule, size, profile=profile)
                assert report.time_s >= report.lower_bound_s * (1 - 1e-9), (cross, profile, size)


def test_leaders_schedule_of_unequal_boxes_allreduces_and_keeps_the_bound():
    cluster = loads_cluster(
        "name: uneven\nswitches: [sw]\nboxes:\n"
        "  - {name: a, gpus: 4, fabric: {bandwidth: 100 GB/s}, nics: [{switch: sw, "
        "bandwidth: 100 Gbit/s}]}\n"
        "  - {name: b, gpus: 2, fabric: {bandwidth: 100 GB/s}, nics: [{switch: sw, "
        "bandwidth: 25 Gbit/s}]}\n"
        "  - {name: c, gpus: 1, nics: [{switch: sw, bandwidth: 100 Gbit/s}]}\n")
    schedule = composed(cluster)
    assert schedule.algorithm == "composed-leaders" and allreduces(schedule)
    for profile in profile_names():
        for size in (4 << 10, 64 * MiB):
            report = simulate(cluster, schedule, size, profile=profile)
            assert report.time_s >= report.lower_bound_s
            assert {r.kind for r in report.natives} == {"reduce", "broadcast"}


# ---- calibrated profiles: measured, or the ring with a note ---------------------------
def test_a_profile_without_native_prices_a_ring_on_its_costs_and_says_so():
    mpi = get_profile("mpi")
    cluster = mpi.host_cluster(4)
    size = 4 * MiB
    report = simulate(cluster, native_only(4, "allreduce", range(4), chunks=4), size,
                      profile=mpi)
    assert report.notes == ("native allreduce priced as a point-to-point ring over its group: "
                            "profile 'mpi' has no native.allreduce (topoplan calibrate "
                            "measures it)",)
    assert report.natives[0].priced_by == "ring"
    # The point-to-point ring on the same costs: 2 (g - 1) steps of step overhead, two
    # posted ops and alpha (large messages), the adds of g - 1 quarters, the bytes at
    # the host's rate; the rank pays no call overhead (it has no message of its own).
    step = mpi.step_overhead + 2 * mpi.op_overhead + mpi.alpha_network
    by_hand = 6 * step + 3 * (size / 4) / mpi.reduce_bandwidth + 1.5 * size / mpi.host_bandwidth
    alone = native_price(cluster, "allreduce", range(4), size, mpi)
    assert alone.time_s == pytest.approx(by_hand, rel=1e-12) and alone.busy
    # Four ranks on the host's two cores take turns while the ring works them.
    assert report.time_s == pytest.approx(mpi.step_overhead + 2 * by_hand, rel=1e-9)
    assert report.breakdown["contention"] > 0


def test_a_measured_native_prices_at_its_fit_on_top_of_the_links():
    measured = NativeCost(alpha=50e-6, alpha_per_rank=10e-6, bandwidth=1e9)
    profile = CostProfile("measured", native_costs=(("allreduce", measured),))
    cluster = switch_cluster(4, bandwidth="10 GB/s", latency="1 us")
    size = 8 * MiB
    report = simulate(cluster, native_only(4, "allreduce", range(4)), size, profile=profile)
    fit = 50e-6 + 3 * 10e-6 + 1.5 * size / 1e9
    assert report.time_s == pytest.approx(fit, rel=1e-12)  # slower than the links' 1.5 M/10
    assert report.natives[0].priced_by == "measured" and report.notes == ()
    fast = CostProfile("fast", native_costs=(("allreduce", NativeCost(1e-6, 1e12)),))
    links = simulate(cluster, native_only(4, "allreduce", range(4)), size, profile=fast)
    assert links.time_s == pytest.approx(6 * 2e-6 + 1.5 * size / 10e9, rel=1e-12)  # the links
    # A kind the profile does not measure goes to the ring, with a note.
    gathered = simulate(cluster, native_only(4, "allgather", range(4), chunks=4), size,
                        profile=profile)
    assert gathered.notes and "no native.allgather" in gathered.notes[0]


# ---- the profile's native section ------------------------------------------------------
def test_native_section_round_trips_and_the_nccl_profile_names_the_model():
    assert get_profile("nccl").native_model == "nccl"
    assert get_profile("ideal").native_model is None and not get_profile("mpi").native_costs
    text = ("name: x\nnative:\n  allreduce: {alpha: 30 us, alpha_per_rank: 2 us, "
            "bandwidth: 2 GB/s}\n  reduce_scatter: {alpha: 10 us, bandwidth: 1 GB/s}\n")
    profile = loads_profile(text)
    allreduce, scatter = profile.native_cost("allreduce"), profile.native_cost("reduce_scatter")
    assert (allreduce.alpha, allreduce.alpha_per_rank, allreduce.bandwidth) == pytest.approx(
        (30e-6, 2e-6, 2e9), rel=1e-12)
    assert (scatter.alpha, scatter.alpha_per_rank, scatter.bandwidth) == pytest.approx(
        (10e-6, 0.0, 1e9), rel=1e-12)
    assert profile.native_cost("allgather") is None
    assert loads_profile(profile.dumps()) == profile and hash(profile) == hash(
        loads_profile(profile.dumps()))
    assert "native allreduce/reduce_scatter measured" in profile.summary()


@pytest.mark.parametrize("text, where", [
    ("name: x\nnative: mpi\n", "f.yaml:2: native: expected nccl"),
    ("name: x\nnative: [1]\n", "f.yaml:2: native: expected a mapping of collectives"),
    ("name: x\nnative:\n  alltoall: {alpha: 1 us, bandwidth: 1 GB/s}\n",
     "f.yaml:3: native.alltoall: unknown collective"),
    ("name: x\nnative:\n  allreduce: 3 us\n", "f.yaml:3: native.allreduce: expected a mapping"),
    ("name: x\nnative:\n  allreduce: {alpha: 1 us}\n",
     "f.yaml:3: native.allreduce.bandwidth: missing required key"),
    ("name: x\nnative:\n  allgather:\n    alpha: -1 us\n    bandwidth: 1 GB/s\n",
     "f.yaml:4: native.allgather.alpha: must be >= 0"),
    ("name: x\nnative:\n  allgather:\n    alpha: 1 us\n    bandwidth: 0 GB/s\n",
     "f.yaml:5: native.allgather.bandwidth: must be > 0"),
    ("name: x\nnative:\n  allgather:\n    alpha: 1 us\n    bandwidth: fast\n",
     "f.yaml:5: native.allgather.bandwidth: not a bandwidth"),
    ("name: x\nnative:\n  reduce: {alpha: 1 us, bandwidth: 1 GB/s, beta: 2 us}\n",
     "f.yaml:3: native.reduce.beta: unknown key"),
])
def test_bad_native_sections_name_file_line_and_key(text, where):
    with pytest.raises(ProfileError) as info:
        loads_profile(text, "f.yaml")
    assert str(info.value).startswith(where)


# ---- bad schedules ---------------------------------------------------------------------
def test_unmatched_and_disagreeing_native_ops_are_named():
    cluster = switch_cluster(3)
    missing = build_schedule(3, (1.0,), [[[native_op("allreduce", [0, 1, 2], 0)]],
                                         [[native_op("allreduce", [0, 1, 2], 0)]], []],
                             algorithm="x")
    with pytest.raises(ScheduleError, match=r"unmatched native op: rank 0 step 0 runs "
                                            r"allreduce over \{0, 1, 2\} of chunk 0 as op 0 over "
                                            r"that group, but rank 2 runs only 0 native ops"):
        simulate(cluster, missing, MiB, profile="ideal")
    other = build_schedule(3, equal_chunks(3), [[[native_op("allreduce", [0, 1], 0, 3)]],
                                                [[native_op("allreduce", [0, 1], 0, 2)]], []],
                           algorithm="x")
    with pytest.raises(ScheduleError, match=r"rank 0 step 0 runs allreduce over \{0, 1\} of "
                                            r"chunks 0..2 but rank 1 step 0 runs allreduce "
                                            r"over \{0, 1\} of chunks 0..1"):
        simulate(cluster, other, MiB, profile="ideal")
    crowded = build_schedule(3, (1.0,), [[[native_op("allreduce", [0, 1], 0), send(2, 0)]],
                                         [[native_op("allreduce", [0, 1], 0)]], [[recv(0, 0)]]],
                             algorithm="x")
    with pytest.raises(ScheduleError, match="stands alone in its step; this step has 2 ops"):
        simulate(cluster, crowded, MiB, profile="ideal")
    outsider = build_schedule(3, (1.0,), [[[native_op("allreduce", [1, 2], 0)]], [], []],
                              algorithm="x")
    with pytest.raises(ScheduleError, match="rank 0 step 0: runs allreduce over {1, 2} of "
                                            "chunk 0, a group it is not in"):
        simulate(cluster, outsider, MiB, profile="ideal")


def test_a_native_waiting_on_a_stuck_member_is_a_deadlock_naming_the_group():
    cluster = switch_cluster(2)
    steps = [[[native_op("allreduce", [0, 1], 0)], [recv(1, 0)]],
             [[send(0, 0)], [native_op("allreduce", [0, 1], 0)]]]
    with pytest.raises(ScheduleError, match=r"deadlock: 2 ranks cannot finish; rank 0 step 0 "
                                            r"waits to run allreduce over \{0, 1\} of chunk 0 "
                                            r"with rank 1, which is stuck at step 0 before its "
                                            r"matching step 1"):
        simulate(cluster, build_schedule(2, (1.0,), steps, algorithm="x"), MiB, profile="ideal")


def test_ranks_with_messages_pay_the_call_and_ranks_of_natives_alone_do_not():
    cluster = switch_cluster(4, bandwidth="10 GB/s", latency="1 us")
    mixed = native_only(4, "allreduce", [0, 1], others={2: [[send(3, 0)]], 3: [[recv(2, 0)]]})
    report = simulate(cluster, mixed, MiB, profile="nccl")
    call = get_profile("nccl").call_overhead
    assert report.step_times[0][0][0] == 0.0 and report.step_times[2][0][0] == call


# ---- calibrate: the native section from measurements ---------------------------------
def test_fit_native_recovers_the_costs_that_made_the_times():
    from topoplan.runtime.calibrate import Sample, fit_native, native_cases
    truth = {"allreduce": NativeCost(40e-6, 3e9, 8e-6), "reduce_scatter": NativeCost(25e-6, 2e9),
             "allgather": NativeCost(20e-6, 5e9, 4e-6)}
    cases = native_cases(8)
    samples = [Sample(c, truth[c.collective].time(c.collective, c.group, c.size), (), 1)
               for c in cases]
    costs, record = fit_native(samples)
    for kind, cost in costs:
        assert cost.alpha == pytest.approx(truth[kind].alpha, rel=1e-6, abs=1e-12)
        assert cost.alpha_per_rank == pytest.approx(truth[kind].alpha_per_rank, abs=1e-12)
        assert cost.bandwidth == pytest.approx(truth[kind].bandwidth, rel=1e-6)
    assert len(record["samples"]) == len(cases) == 27 and record["rms_residual_pct"] == 0
    assert {c.group for c in cases} == {2, 4, 8} and record["unidentified"] == []
    # Two ranks give one group size: alpha_per_rank cannot be told from alpha.
    two = [Sample(c, 1e-4 + c.size / 1e9, (), 1) for c in native_cases(2)]
    costs, record = fit_native(two)
    assert all(c.alpha_per_rank == 0 for _, c in costs)
    assert "allreduce.alpha_per_rank (one group size)" in record["unidentified"]


@pytest.mark.mpi
@pytest.mark.slow
def test_calibrate_fits_the_native_section_from_real_mpi_collectives(tmp_path):
    pytest.importorskip("mpi4py")
    from topoplan.runtime.calibrate import Sample, fit_native, native_cases
    from topoplan.runtime.calibrate.native import native_record
    from topoplan.runtime.mpirun import mpiexec
    proc = mpiexec(4, [sys.executable, "-m", "tests.mpi_native_calibrate"], timeout=240,
                   cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TOPOPLAN-RESULT "))
    result = json.loads(line.split(" ", 1)[1])
    assert result["skipped"] == []
    cases = {c.label: c for c in native_cases(4, sizes=(4 << 10, 1 << 20))}
    samples = [Sample(cases[s["label"]], s["measured_s"], tuple(s["repeats_s"]), s["calls"])
               for s in result["samples"]]
    assert {s.case.collective for s in samples} == {"allreduce", "reduce_scatter", "allgather"}
    assert {s.case.group for s in samples} == {2, 4} and all(s.measured_s > 0 for s in samples)
    costs, record = fit_native(samples)
    assert [kind for kind, _ in costs] == ["allreduce", "reduce_scatter", "allgather"]
    for kind, cost in costs:
        assert math.isfinite(cost.bandwidth) and cost.bandwidth > 0
        assert cost.alpha >= 0 and cost.alpha_per_rank >= 0
        assert cost.time(kind, 4, 1 << 20) > cost.time(kind, 4, 4 << 10)
    for row in record["samples"]:
        assert row["fitted_us"] > 0 and math.isfinite(row["residual_pct"])
    # The fitted section goes into a profile that loads back and prices native steps.
    profile = CostProfile("mpi-native", native_costs=costs,
                          calibration={"native": native_record(costs, record, [])})
    path = tmp_path / "p.yaml"
    profile.save(path)
    again = get_profile(str(path))
    assert again.native_costs == tuple((k, c) for k, c in costs) or all(
        math.isclose(a[1].alpha, b[1].alpha, rel_tol=1e-5) for a, b in zip(again.native_costs,
                                                                          costs))
    report = simulate(switch_cluster(4), native_only(4, "allreduce", range(4)), 1 << 20,
                      profile=again)
    assert report.natives[0].priced_by == "measured" and report.notes == ()


# ---- topoplan simulate -----------------------------------------------------------------
def test_simulate_command_shows_native_time_and_the_notes(tmp_path, capsys):
    from topoplan.cli import main
    plan = tmp_path / "composed.json"
    composed(load_topology("dgx_a100_x4")).save(plan)
    cluster = str(ROOT / "topologies" / "dgx_a100_x4.yaml")
    assert main(["simulate", cluster, str(plan), "--sizes", "1MiB", "--profile", "mpi",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [result] = data["results"]
    assert set(result["breakdown"]) == {"bandwidth", "latency", "overhead", "reduce",
                                        "contention", "native"}
    assert result["breakdown"]["native"] > 0
    assert sum(result["breakdown"].values()) == pytest.approx(result["time_s"], rel=1e-9)
    # The point-to-point latency bound does not bind native steps: not given.
    assert result["latency_bound_s"] is None
    assert data["notes"] == [
        f"native {kind} priced as a point-to-point ring over its group: profile 'mpi' has "
        f"no native.{kind} (topoplan calibrate measures it)"
        for kind in ("reduce_scatter", "allgather")]
    assert main(["simulate", cluster, str(plan), "--sizes", "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "native: inside native collectives (priced by NCCL Ring/LL)" in out
    assert "lat bound" not in out and "note:" not in out
