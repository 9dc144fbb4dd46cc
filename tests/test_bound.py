"""The lower bounds: hand-solved cases, brute force over every cut (RS+AG), and every
planner on every shipped topology and on random clusters at or above the allreduce bound."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from tests.support.cluster_shapes import brute_force_ratio, small_clusters, uneven_clusters
from tests.support.clusters import ROOT, switch_cluster, topology_text
from topoplan.analysis.bound import (_bottleneck, best_partition, bottleneck, lower_bound, partitions,
                            rsag_bound, sink_classes)
from topoplan.cluster import load_cluster, loads_cluster

M = 256 << 20


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_single_switch_is_the_ring_bound(n):
    cluster = switch_cluster(n, bandwidth="12.5 GB/s")
    assert lower_bound(cluster, M) == pytest.approx(2 * (n - 1) / n * M / 12.5e9, rel=1e-12)
    assert rsag_bound(cluster, M) == pytest.approx(lower_bound(cluster, M), rel=1e-12)
    cut = bottleneck(cluster)
    # The binding cut: everything but one GPU, fed through that GPU's NIC.
    assert (cut.gpus, cut.bandwidth) == (n - 1, 12.5e9)
    assert cut.ratio == pytest.approx((n - 1) / 12.5e9)


def test_dgx1_hybrid_cube_mesh_algbw_is_85_7_GBps(topology):
    cluster = topology("dgx1_v100")
    assert all(cluster.gpu_bandwidth(r) == 150e9 for r in range(8))
    algbw = M / lower_bound(cluster, M)
    assert algbw == pytest.approx(600e9 / 7, rel=1e-12)  # 85.714 GB/s
    assert rsag_bound(cluster, M) == pytest.approx(lower_bound(cluster, M), rel=1e-12)
    assert round(algbw / 1e9, 1) == 85.7
    assert bottleneck(cluster).gpus == 7


def test_ddl_two_switch_narrow_link_sets_the_bound(topology):
    cluster = topology("ddl_two_switch")
    # Hand: S = {A, B, their NICs, switch0}: 2 GPUs behind 10 GB/s -> T = 2 (M/4) 2 / 10 GB/s.
    assert lower_bound(cluster, M) == pytest.approx(M / 10e9, rel=1e-12)
    cut = bottleneck(cluster)
    assert (cut.gpus, cut.bandwidth) == (2, 10e9)
    assert {"switch0", "switch1"} & cut.nodes and not {"switch0", "switch1"} <= cut.nodes


def test_one_gpu_needs_no_time():
    cluster = loads_cluster("name: one\nboxes: [{name: a, gpus: 1}]\n")
    assert lower_bound(cluster, M) == 0.0 == rsag_bound(cluster, M)
    assert bottleneck(cluster).ratio == 0.0


def test_bound_scales_linearly_with_size(topology):
    cluster = topology("ddl_two_switch")
    assert lower_bound(cluster, 2 * M) == pytest.approx(2 * lower_bound(cluster, M))


LEAF_SPINE = """
name: leaf-spine
switches:
  - {name: "leaf{i}", count: 4}
  - {name: "spine{i}", count: 2}
boxes:
  - name: "n{i}"
    count: 8
    gpus: 4
    fabric: {bandwidth: 100 GB/s}
    nics:
      - {switch: "leaf{i//2}", bandwidth: 25 GB/s, gpus: [0, 1]}
      - {switch: "leaf{i//2}", bandwidth: 25 GB/s, gpus: [2, 3]}
links:
  - {a: "leaf{i//2}", b: "spine{i%2}", count: 8, bandwidth: UPLINK}
"""


@pytest.mark.parametrize("uplink", ["10 GB/s", "40 GB/s", "200 GB/s"])
def test_symmetry_classes_give_the_all_sinks_answer(uplink, monkeypatch):
    cluster = loads_cluster(LEAF_SPINE.replace("UPLINK", uplink))
    classes = sink_classes(cluster)
    # Leaves are twins, boxes on a leaf are twins, GPUs 0/1 and 2/3 swap: 2 classes.
    assert classes == [0, 2]
    fast = _bottleneck(cluster)
    import topoplan.analysis.bound as bound_module
    monkeypatch.setattr(bound_module, "sink_classes", lambda c: list(range(c.nranks)))
    slow = _bottleneck(cluster)
    assert fast.ratio == pytest.approx(slow.ratio, rel=1e-12)


def test_asymmetric_gpus_are_their_own_class(topology):
    assert sink_classes(topology("dgx1_v100")) == list(range(8))
    assert sink_classes(topology("ddl_two_switch")) == [0]  # A<->B and switch0<->switch1 are swaps


@settings(max_examples=25, deadline=None)
@given(small_clusters())
def test_max_flow_matches_brute_force(cluster):
    assert len(cluster.graph) <= 11
    assert bottleneck(cluster).ratio == pytest.approx(brute_force_ratio(cluster), rel=1e-9)


def test_the_bottleneck_is_cached_per_cluster_without_touching_it():
    import gc
    import weakref

    cluster = switch_cluster(4)
    first = bottleneck(cluster)
    assert bottleneck(cluster) is first  # computed once per cluster object
    assert not any("bottleneck" in key for key in vars(cluster))
    ref = weakref.ref(cluster)
    del cluster
    gc.collect()
    assert ref() is None


# ---- the allreduce bound, for every schedule ------------------------------------------
HET9 = """
name: het9
switches: [sw0]
boxes:
  - {name: big, gpus: 6, fabric: {bandwidth: 100 GB/s},
     nics: [{switch: sw0, bandwidth: 50 Gbit/s, latency: 2 us}]}
  - {name: small, gpus: 3, fabric: {bandwidth: 100 GB/s},
     nics: [{switch: sw0, bandwidth: 50 Gbit/s, latency: 2 us}]}
"""

WEAK = """
name: one-weak-gpu
switches: [sw0]
boxes:
  - {name: "n{i}", count: 4, gpus: 1, nics: [{switch: sw0, bandwidth: 100 GB/s}]}
  - {name: weak, gpus: 1, nics: [{switch: sw0, bandwidth: 10 GB/s}]}
"""


def test_uneven_boxes_the_allreduce_bound_is_below_the_rs_ag_one():
    """6 GPUs | 3 GPUs over 6.25 GB/s NICs: every element crosses once each way, so
    M / 6.25 GB/s (42.9 ms at 256 MiB); RS+AG charges 2 (6/9) M across (57.3 ms)."""
    cluster = loads_cluster(HET9)
    assert lower_bound(cluster, M) == pytest.approx(M / 6.25e9, rel=1e-12)
    assert round(lower_bound(cluster, M) * 1e3, 1) == 42.9
    assert rsag_bound(cluster, M) == pytest.approx(4 / 3 * M / 6.25e9, rel=1e-12)
    assert round(rsag_bound(cluster, M) * 1e3, 1) == 57.3
    part = best_partition(cluster)
    assert len(part.groups) == 2 and part.bandwidth == pytest.approx(12.5e9)


def test_a_weak_gpu_bounds_by_what_it_alone_can_send():
    """The weak GPU must send its M and receive M: M / 10 GB/s. The RS+AG cut (the four
    others behind the weak GPU's link) says 1.6 M / 10 GB/s, which a reduce to the weak
    GPU and back beats; the average over all GPUs says far less."""
    cluster = loads_cluster(WEAK)
    assert lower_bound(cluster, M) == pytest.approx(M / 10e9, rel=1e-12)
    assert rsag_bound(cluster, M) == pytest.approx(1.6 * M / 10e9, rel=1e-12)
    assert best_partition(cluster).name == "every GPU"


def test_partitions_price_their_groups():
    """Every partition's groups are disjoint, hold every GPU, and its ratio is the largest
    of 2 (m - 1) / sum B_out, 2 (m - 1) / sum B_in and 1 / B_out, 1 / B_in per group,
    recomputed here edge by edge."""
    for text in (HET9, WEAK, topology_text("ddl_two_switch"),
                 LEAF_SPINE.replace("UPLINK", "10 GB/s")):
        cluster = loads_cluster(text)
        gpus = {cluster.gpu_node(r) for r in range(cluster.nranks)}
        for part in partitions(cluster):
            union = frozenset().union(*part.groups)
            assert sum(len(g) for g in part.groups) == len(union)
            assert gpus <= union and all(g & gpus for g in part.groups)
            where = {v: k for k, g in enumerate(part.groups) for v in g}
            out = [0.0] * len(part.groups)
            into = [0.0] * len(part.groups)
            for u, v, bw in cluster.graph.edges(data="bandwidth"):
                a, b = where.get(u), where.get(v)
                if a is not None and a != b:
                    out[a] += bw
                if b is not None and a != b:
                    into[b] += bw
            m = len(part.groups)
            want = max(2 * (m - 1) / sum(out), 2 * (m - 1) / sum(into),
                       1 / min(out), 1 / min(into))
            assert part.ratio == pytest.approx(want, rel=1e-12), (cluster.name, part.name)
            assert part.bandwidth == pytest.approx(sum(out), rel=1e-12)


def test_switch_levels_group_what_hangs_below_each_switch():
    cluster = loads_cluster(topology_text("ddl_two_switch"))
    level = next(p for p in partitions(cluster) if p.name == "switch level 1")
    assert sorted(sorted(g & {"switch0", "switch1"}) for g in level.groups) == [
        ["switch0"], ["switch1"]]
    assert lower_bound(cluster, M) == pytest.approx(M / 10e9, rel=1e-12)


def _simulated(cluster, planner, size):
    from topoplan.planners import plan
    from topoplan.analysis.sim import simulate
    schedule = plan(cluster, planner, size=size, profile="ideal")
    return simulate(cluster, schedule, size, profile="ideal")


SHIPPED = sorted((Path(__file__).resolve().parent.parent / "topologies").glob("*.yaml"))
PLANNERS = ("ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf")
# Over a hundred GPUs, planning and simulating every planner takes minutes (the simulator
# re-rates every flow at each event); there the bound is checked against hierarchical.
LARGE = 100


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_no_planner_beats_the_allreduce_bound_on_a_shipped_topology(path):
    cluster = loads_cluster(path.read_text(), str(path))
    planners = PLANNERS if cluster.nranks <= LARGE else ("hierarchical",)
    size = 16 << 20
    for planner in planners:
        report = _simulated(cluster, planner, size)
        assert report.time_s >= report.lower_bound_s * (1 - 1e-9), planner
        assert report.efficiency <= 1 + 1e-9
        assert report.lower_bound_s == pytest.approx(lower_bound(cluster, size), rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(uneven_clusters(), st.sampled_from(["ring", "tree", "rhd", "hierarchical"]))
def test_no_planner_beats_the_allreduce_bound_on_uneven_clusters(cluster, planner):
    report = _simulated(cluster, planner, 16 << 20)
    assert report.time_s >= report.lower_bound_s * (1 - 1e-9)


# -- the latency-aware bound -----------------------------------------------------------------
def _costs(alpha: float, o: float, sigma: float = 0.0, call: float = 0.0):
    from topoplan.analysis.cost import get_profile
    return get_profile("ideal").with_costs(alpha_box=alpha, alpha_network=alpha, op_overhead=o,
                                           step_overhead=sigma, call_overhead=call)


@pytest.mark.parametrize("n, want_us", [(2, 2.0), (3, 2.0), (4, 3.0), (5, 4.0), (13, 4.0),
                                        (14, 5.0)])
def test_rounds_by_hand(n, want_us):
    # alpha = o = 1 us: a message lands 2 us after its sender's step starts; a step that
    # receives k messages ends max(k, 2) us after it starts at the soonest. f(2) = 3 (two
    # messages in a step from 0); f(3) = f(0) + 3 f(1) = 4; f(4) = f(0) + 4 f(2) = 13:
    # a step from 0 receives four messages sent by ranks whose steps start at 2 holding
    # three each.
    from topoplan.analysis.bound import rounds_time
    assert rounds_time(switch_cluster(n), _costs(1e-6, 1e-6)) == pytest.approx(
        want_us * 1e-6, rel=1e-2)


@pytest.mark.parametrize("alpha, o", [(1e-9, 1e-6), (3.4e-6, 0.4e-6), (14e-6, 0.0)])
def test_rounds_lie_between_one_hop_and_log2_hops(alpha, o):
    # One message a step doubles what a rank holds every hop: ceil(log2 N) hops at most.
    from topoplan.analysis.bound import rounds_time
    hop = alpha + o
    for n in (2, 5, 16, 33, 1000):
        got = rounds_time(switch_cluster(n), _costs(alpha, o))
        assert hop * (1 - 1e-2) <= got <= math.ceil(math.log2(n)) * hop * (1 + 1e-9)


def test_ideal_has_no_rounds_and_the_bound_is_the_bandwidth_one(topology):
    from topoplan.analysis.bound import latency_bound, rounds_time
    cluster = topology("dgx_a100_x4")
    assert rounds_time(cluster, "ideal") == 0.0
    assert latency_bound(cluster, 1 << 20, "ideal") == lower_bound(cluster, 1 << 20)


@pytest.mark.parametrize("planner", ["ring", "rhd", "tree", "hierarchical", "mcf"])
@pytest.mark.parametrize("profile", ["nccl", "mpi"])
def test_no_plan_beats_the_rounds_term(planner, profile):
    # At 8 bytes the bandwidth is nothing: the rounds term is what a plan must pay.
    from topoplan.analysis.bound import rounds_time
    from topoplan.analysis.cost import get_profile
    from topoplan.analysis.sim import simulate
    from topoplan.planners import plan
    costs = get_profile(profile)
    for cluster in (switch_cluster(8), switch_cluster(13)):
        schedule = plan(cluster, planner, size=8, profile=costs)
        report = simulate(cluster, schedule, 8, profile=costs, dtype_size=1)
        assert report.time_s >= costs.call_overhead + rounds_time(cluster, costs) * (1 - 1e-9)


def test_the_latency_bound_counts_one_step_for_sharded_collectives():
    from topoplan.analysis.bound import collective_bound, latency_bound
    from topoplan.analysis.cost import get_profile
    cluster, costs = switch_cluster(4), get_profile("mpi")
    size = 64 << 20
    for collective, steps in (("allreduce", 2), ("reduce_scatter", 1), ("allgather", 1)):
        want = (collective_bound(cluster, size, collective) + costs.call_overhead
                + steps * costs.message_cost(network=False, ops=2))
        assert latency_bound(cluster, size, costs, collective) == pytest.approx(want)


@pytest.mark.parametrize("name, text, crossing", [
    # A 4-GPU box on a 25 GB/s NIC beside boxes of 8: the cut is the 20 GPUs outside it,
    # whose shards must all get in; a user reads the box as behind it.
    ("targets/unequal_gpus", "4 GPUs (box small0) behind 25 GB/s",
     "the other 20 GPUs' shards cross it at 1.25 GB/s each"),
    ("dgx_a100_x4", "8 GPUs (box dgx0) behind 200 GB/s",
     "the other 24 GPUs' shards cross it at 8.333 GB/s each"),
    ("dgx1_v100", "1 GPU (dgx1/gpu0) behind 150 GB/s",
     "the other 7 GPUs' shards cross it at 21.43 GB/s each"),
    ("ddl_two_switch", "2 GPUs (boxes C, D) behind 10 GB/s", "their shards cross it at 5 GB/s each"),
])
def test_the_cut_names_the_gpus_behind_it(name, text, crossing):
    cluster = load_cluster(ROOT / "topologies" / f"{name}.yaml")
    cut = bottleneck(cluster)
    assert (str(cut), cut.crossing()) == (text, crossing)
    assert cut.behind == min(cut.gpus, cluster.nranks - cut.gpus)
