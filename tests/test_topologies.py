"""Every shipped topology loads, has the expected ranks, and its graph carries the
bandwidths its header comment promises (bytes/s)."""

from __future__ import annotations

import networkx as nx
import pytest

from tests.support.clusters import SHIPPED, TOPOLOGIES
from tests.support.clusters import load_topology as cluster
from topoplan.cluster import Cluster

RANKS = {
    "ddl_two_switch": 4,
    "ddl_three_racks": 192,
    "mn1_infiniband": 32,
    "mn1_10gbe": 32,
    "aws_p3_16xlarge_x4": 32,
    "aws_p2_8xlarge": 8,
    "dgx1_v100": 8,
    "ndv2_x2": 16,
    "dgx_a100_x4": 32,
    "leaf_spine_1024": 1024,
}

# `nvidia-smi topo -m` of a DGX-1V: number of NVLinks between GPU pairs (NV1 / NV2).
DGX1V_NVLINKS = {
    0: {1: 1, 2: 1, 3: 2, 4: 2}, 1: {0: 1, 2: 2, 3: 1, 5: 2},
    2: {0: 1, 1: 2, 3: 2, 6: 1}, 3: {0: 2, 1: 1, 2: 2, 7: 1},
    4: {0: 2, 5: 1, 6: 1, 7: 2}, 5: {1: 2, 4: 1, 6: 2, 7: 1},
    6: {2: 1, 4: 1, 5: 2, 7: 2}, 7: {3: 1, 4: 2, 5: 1, 6: 2},
}


def test_the_shipped_set_is_the_expected_one():
    assert sorted(SHIPPED) == sorted(RANKS)


@pytest.mark.parametrize("name", sorted(RANKS))
def test_loads_with_expected_ranks_and_a_source_comment(name):
    c = cluster(name)
    assert c.nranks == RANKS[name]
    graph = c.graph
    assert sum(kind == "gpu" for _, kind in graph.nodes(data="kind")) == RANKS[name]
    for u, v, data in graph.edges(data=True):
        assert data["bandwidth"] > 0 and data["latency"] >= 0, (u, v)
        assert graph[v][u]["bandwidth"] == data["bandwidth"]
    # Every file says where its numbers come from before anything else.
    text = (TOPOLOGIES / f"{name}.yaml").read_text()
    header = text.split("\nname:")[0]
    assert header.startswith("#") and len(header.splitlines()) >= 4


@pytest.mark.parametrize("name", sorted(RANKS))
def test_routes_between_gpus_start_and_end_at_the_right_nodes(name):
    c = cluster(name)
    n = c.nranks
    last_box = c.boxes[-1]
    pairs = {(0, 1), (1, 0), (0, n - 1), (n - 1, 0), (n // 2, n // 3),
             (0, last_box.first_rank), (c.boxes[0].gpus - 1, n - 1)}
    for src, dst in sorted(pairs):
        if src == dst:
            continue
        routes = c.routes(src, dst)
        assert routes, (src, dst)
        assert len(set(routes)) == len(routes)
        for path in routes:
            assert path[0] == c.gpu_node(src) and path[-1] == c.gpu_node(dst)
            assert all(c.graph.has_edge(u, v) for u, v in zip(path, path[1:])), path


def nvlink_matrix(c: Cluster, box_index: int, per_link: float) -> dict[int, dict[int, int]]:
    """Links per GPU pair read back from the graph: edge bandwidth / one link's bandwidth."""
    box = c.boxes[box_index]
    graph = c.graph
    matrix: dict[int, dict[int, int]] = {}
    for a in range(box.gpus):
        for b in range(box.gpus):
            if a != b and graph.has_edge(box.gpu_node(a), box.gpu_node(b)):
                links = graph[box.gpu_node(a)][box.gpu_node(b)]["bandwidth"] / per_link
                assert links == int(links)
                matrix.setdefault(a, {})[b] = int(links)
    return matrix


def test_dgx1_v100_hybrid_cube_mesh():
    c = cluster("dgx1_v100")
    graph = c.graph
    assert graph["dgx1/gpu0"]["dgx1/gpu3"]["bandwidth"] == 50e9  # NV2
    assert graph["dgx1/gpu0"]["dgx1/gpu1"]["bandwidth"] == 25e9  # NV1
    assert not graph.has_edge("dgx1/gpu0", "dgx1/gpu5")
    assert nvlink_matrix(c, 0, 25e9) == DGX1V_NVLINKS
    assert all(c.gpu_bandwidth(r) == 150e9 for r in range(8))  # 6 links x 25 GB/s
    # GPU0 and GPU7 share no link: the route relays through one GPU.
    assert {len(p) for p in c.routes(0, 7)} == {3}


@pytest.mark.parametrize("name, nic", [("aws_p3_16xlarge_x4", 25e9 / 8), ("ndv2_x2", 100e9 / 8)])
def test_dgx1_like_instances(name, nic):
    c = cluster(name)
    for b, box in enumerate(c.boxes):
        assert nvlink_matrix(c, b, 25e9) == DGX1V_NVLINKS
        assert len(box.nics) == 1 and box.nics[0].gpus == tuple(range(8))
        assert c.graph[box.nic_node(0)][box.nics[0].switch]["bandwidth"] == nic
        assert c.graph[box.gpu_node(5)][box.nic_node(0)]["bandwidth"] == nic


def test_dgx_a100_rails():
    c = cluster("dgx_a100_x4")
    graph = c.graph
    assert graph["dgx0/gpu0"]["dgx0/fabric"]["bandwidth"] == 300e9
    assert graph["dgx3/fabric"]["dgx3/gpu7"]["bandwidth"] == 300e9
    for box in c.boxes:
        for k in range(8):
            nic = box.nic_node(k)
            assert graph.nodes[nic]["switch"] == f"rail{k}"
            assert graph[nic][f"rail{k}"]["bandwidth"] == 25e9  # 200 Gbit/s HDR
            # NIC k serves GPU k only.
            assert [v for v in graph.successors(nic) if graph.nodes[v]["kind"] == "gpu"] == [
                box.gpu_node(k)]
    # Non-blocking: each rail's uplinks carry all its NICs.
    for k in range(8):
        down = sum(graph[f"dgx{i}/nic{k}"][f"rail{k}"]["bandwidth"] for i in range(4))
        up = sum(graph[f"rail{k}"][s]["bandwidth"] for s in ("spine0", "spine1"))
        assert up == down == 100e9
    # Same rail: one leaf, no spine. Across rails: through both spines.
    assert c.routes(3, 11) == (("dgx0/gpu3", "dgx0/nic3", "rail3", "dgx1/nic3", "dgx1/gpu3"),)
    across = c.routes(3, 12)
    assert {p[3] for p in across} == {"spine0", "spine1"}
    assert all(p[2] == "rail3" and p[4] == "rail4" for p in across)


def test_leaf_spine_1024_is_two_to_one_oversubscribed():
    c = cluster("leaf_spine_1024")
    graph = c.graph
    leaves = [s for s in c.switches if s.startswith("leaf")]
    spines = [s for s in c.switches if s.startswith("spine")]
    assert len(leaves) == 16 and len(spines) == 4 and len(c.boxes) == 128
    assert graph["node0/gpu0"]["node0/fabric"]["bandwidth"] == 300e9
    assert graph["node77/nic3"]["leaf9"]["bandwidth"] == 25e9
    for leaf in leaves:
        down = sum(d["bandwidth"] for u, _, d in graph.in_edges(leaf, data=True)
                   if graph.nodes[u]["kind"] == "nic")
        up = sum(graph[leaf][s]["bandwidth"] for s in spines)
        assert down == 1600e9 and up == 800e9
        assert down / up == 2
    assert sum(box.nics[0].switch == "leaf3" for box in c.boxes) == 8
    # Same leaf: no spine; across leaves: every spine is an equal-cost choice.
    assert c.routes(0, 8) == (("node0/gpu0", "node0/nic0", "leaf0", "node1/nic0", "node1/gpu0"),)
    assert {p[3] for p in c.routes(0, 1023)} == set(spines)


def test_ddl_three_racks_minsky_hosts():
    c = cluster("ddl_three_racks")
    assert len(c.boxes) == 48 and c.switches == ("tor0", "tor1", "tor2", "core")
    assert [b.name for b in c.boxes[15:17]] == ["r0h15", "r1h0"]
    assert c.boxes[17].nics[0].switch == "tor1" and c.boxes[47].nics[0].switch == "tor2"
    box = c.boxes[0]
    graph = c.graph
    assert graph[box.gpu_node(0)][box.gpu_node(1)]["bandwidth"] == 40e9  # 2 x NVLink 1.0
    assert graph[box.gpu_node(2)][box.gpu_node(3)]["bandwidth"] == 40e9
    # The sockets meet through the X-bus: 38.4 GB/s across the cut {0,1} | {2,3}.
    links = nx.Graph()
    links.add_edges_from((l.a, l.b, {"capacity": l.bandwidth}) for l in box.gpu_links)
    assert nx.minimum_cut_value(links, 0, 3) == pytest.approx(38.4e9)
    cut = sum(l.bandwidth for l in box.gpu_links if (l.a < 2) != (l.b < 2))
    assert cut == pytest.approx(38.4e9)
    assert graph[box.nic_node(0)]["tor0"]["bandwidth"] == 10e9
    for tor in ("tor0", "tor1", "tor2"):
        assert graph[tor]["core"]["bandwidth"] == 160e9  # 16 hosts x 10 GB/s: non-blocking


def test_mn1_pair_differs_only_in_the_network():
    ib, eth = cluster("mn1_infiniband"), cluster("mn1_10gbe")
    for a, b in zip(ib.boxes, eth.boxes, strict=True):
        assert (a.name, a.gpus, a.fabric, a.gpu_links) == (b.name, b.gpus, b.fabric, b.gpu_links)
        assert len(a.nics) == len(b.nics) == 1
    assert ib.boxes[0].fabric.bandwidth == 16e9  # PCIe 3.0 x16
    assert ib.boxes[0].nics[0].bandwidth == 7e9  # FDR 56 Gbit/s
    assert eth.boxes[0].nics[0].bandwidth == 1.25e9  # 10 Gbit/s
    assert ib.graph["mn1-2/nic0"]["ib"]["bandwidth"] == 7e9
    assert eth.graph["mn1-2/nic0"]["eth"]["bandwidth"] == 1.25e9


def test_aws_p2_k80_boards():
    c = cluster("aws_p2_8xlarge")
    graph = c.graph
    assert not c.switches and not c.boxes[0].nics
    for board in range(4):
        a, b = f"p2/gpu{2 * board}", f"p2/gpu{2 * board + 1}"
        assert graph[a][b]["bandwidth"] == 16e9
    assert graph["p2/gpu0"]["p2/fabric"]["bandwidth"] == 8e9
    assert c.routes(0, 1) == (("p2/gpu0", "p2/gpu1"),)  # on the board
    assert c.routes(0, 2) == (("p2/gpu0", "p2/fabric", "p2/gpu2"),)  # across the host tree


def test_ddl_two_switch_narrow_link():
    c = cluster("ddl_two_switch")
    assert c.graph["switch0"]["switch1"]["bandwidth"] == 10e9
    assert c.graph["A/nic0"]["switch0"]["bandwidth"] == 100e9
    assert c.routes(0, 2) == (("A/gpu0", "A/nic0", "switch0", "switch1", "C/nic0", "C/gpu0"),)
