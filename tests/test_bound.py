"""The allreduce lower bound: hand-solved cases and brute force over every cut."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from tests.support.clusters import switch_cluster
from topoplan.bound import _bottleneck, bottleneck, lower_bound, sink_classes
from topoplan.cluster import loads_cluster

M = 256 << 20


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_single_switch_is_the_ring_bound(n):
    cluster = switch_cluster(n, bandwidth="12.5 GB/s")
    assert lower_bound(cluster, M) == pytest.approx(2 * (n - 1) / n * M / 12.5e9, rel=1e-12)
    cut = bottleneck(cluster)
    # The binding cut: everything but one GPU, fed through that GPU's NIC.
    assert (cut.gpus, cut.bandwidth) == (n - 1, 12.5e9)
    assert cut.ratio == pytest.approx((n - 1) / 12.5e9)


def test_dgx1_hybrid_cube_mesh_algbw_is_85_7_GBps(topology):
    cluster = topology("dgx1_v100")
    assert all(cluster.gpu_bandwidth(r) == 150e9 for r in range(8))
    algbw = M / lower_bound(cluster, M)
    assert algbw == pytest.approx(600e9 / 7, rel=1e-12)  # 85.714 GB/s
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
    assert lower_bound(cluster, M) == 0.0
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
    import topoplan.bound as bound_module
    monkeypatch.setattr(bound_module, "sink_classes", lambda c: list(range(c.nranks)))
    slow = _bottleneck(cluster)
    assert fast.ratio == pytest.approx(slow.ratio, rel=1e-12)


def test_asymmetric_gpus_are_their_own_class(topology):
    assert sink_classes(topology("dgx1_v100")) == list(range(8))
    assert sink_classes(topology("ddl_two_switch")) == [0]  # A<->B and switch0<->switch1 are swaps


def _brute_force_ratio(cluster) -> float:
    """max over every node set S (some, not all GPUs) of |S ∩ GPUs| / B_out(S)."""
    graph = cluster.graph
    nodes = list(graph.nodes)
    gpus = {cluster.gpu_node(r) for r in range(cluster.nranks)}
    best = 0.0
    for bits in itertools.product((False, True), repeat=len(nodes)):
        inside = {v for v, b in zip(nodes, bits) if b}
        g = len(inside & gpus)
        if g == 0 or g == len(gpus):
            continue
        out = math.fsum(d["bandwidth"] for u, v, d in graph.edges(data=True)
                        if u in inside and v not in inside)
        best = max(best, g / out)
    return best


@st.composite
def small_clusters(draw):
    nswitch = draw(st.integers(1, 2))
    bw = st.sampled_from([1, 2, 3, 5, 8, 13])
    lines = ["name: random", "switches: [" + ", ".join(f"s{k}" for k in range(nswitch)) + "]",
             "boxes:"]
    nboxes = draw(st.integers(2, 3))
    nodes = nswitch
    for b in range(nboxes):
        gpus = draw(st.integers(1, 2))
        sw = draw(st.integers(0, nswitch - 1))
        line = f"  - {{name: b{b}, gpus: {gpus}, nics: [{{switch: s{sw}, bandwidth: {draw(bw)}}}]"
        if gpus == 2:
            line += f", gpu_links: [{{a: 0, b: 1, bandwidth: {draw(bw)}}}]"
        lines.append(line + "}")
        nodes += gpus + 1
    if nswitch == 2:
        lines.append(f"links: [{{a: s0, b: s1, bandwidth: {draw(bw)}}}]")
    return loads_cluster("\n".join(lines) + "\n")


@settings(max_examples=25, deadline=None)
@given(small_clusters())
def test_max_flow_matches_brute_force(cluster):
    assert len(cluster.graph) <= 11
    assert bottleneck(cluster).ratio == pytest.approx(_brute_force_ratio(cluster), rel=1e-9)


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
