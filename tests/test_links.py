"""The cluster's links by name, and the cluster with some of them slower."""

from __future__ import annotations

import pytest

from topoplan.cluster import load_cluster
from topoplan.cluster.links import degraded, find_link, link_of_edge, links, parse_degrade
from topoplan.errors import TopoplanError

from .support.clusters import TOPOLOGIES


def test_every_graph_edge_belongs_to_one_link():
    for path in sorted(TOPOLOGIES.glob("*.yaml")):
        cluster = load_cluster(path)
        named = links(cluster)
        assert len({link.name for link in named}) == len(named), path
        edges = [edge for link in named for edge in link.edges]
        assert len(edges) == len(set(edges)), path
        assert set(edges) == set(cluster.graph.edges), path
        for edge in cluster.graph.edges:
            assert edge in link_of_edge(cluster, edge).edges


def test_names_follow_topo_show():
    cluster = load_cluster(TOPOLOGIES / "ddl_two_switch.yaml")
    assert [link.name for link in links(cluster)] == [
        "A/nic0", "B/nic0", "C/nic0", "D/nic0", "switch0-switch1"]
    assert find_link(cluster, "switch1-switch0").name == "switch0-switch1"
    with pytest.raises(TopoplanError, match=r"no link 'A/nic1': did you mean A/nic0"):
        find_link(cluster, "A/nic1")


def test_degraded_scales_both_directions_and_nothing_else():
    cluster = load_cluster(TOPOLOGIES / "ddl_two_switch.yaml")
    slow = degraded(cluster, {"switch0-switch1": 0.25, "B/nic0": 0.5})
    for u, v, data in cluster.graph.edges(data=True):
        factor = (0.25 if {u, v} == {"switch0", "switch1"} else
                  0.5 if "B/nic0" in (u, v) else 1.0)
        assert slow.graph[u][v]["bandwidth"] == pytest.approx(data["bandwidth"] * factor)
        assert slow.graph[u][v]["latency"] == data["latency"]
    assert degraded(cluster, {}) is cluster
    with pytest.raises(TopoplanError, match="positive"):
        degraded(cluster, {"A/nic0": 0.0})


def test_degraded_fabric_and_nvlink():
    cube = load_cluster(TOPOLOGIES / "dgx1_v100.yaml")
    link = find_link(cube, "dgx1/gpu0-gpu3")
    slow = degraded(cube, {link.name: 0.5})
    assert slow.graph["dgx1/gpu0"]["dgx1/gpu3"]["bandwidth"] == pytest.approx(link.bandwidth / 2)
    a100 = load_cluster(TOPOLOGIES / "dgx_a100_x4.yaml")
    fabric = next(link for link in links(a100) if link.kind == "fabric")
    slow = degraded(a100, {fabric.name: 0.25})
    u, v = fabric.edges[0]
    assert slow.graph[u][v]["bandwidth"] == pytest.approx(fabric.bandwidth / 4)


@pytest.mark.parametrize("text, link, factor, after", [
    ("A/nic0=0.25", "A/nic0", 0.25, 0.0), ("leaf0-leaf1=0.5@30", "leaf0-leaf1", 0.5, 30.0),
    (" A/nic0 = 1 @ 2.5s", "A/nic0", 1.0, 2.5)])
def test_parse_degrade(text, link, factor, after):
    spec = parse_degrade(text)
    assert (spec.link, spec.factor, spec.after) == (link, factor, after)


@pytest.mark.parametrize("text, match", [
    ("A/nic0", "LINK=FACTOR"), ("A/nic0=0", r"\(0, 1\]"), ("A/nic0=2", r"\(0, 1\]"),
    ("A/nic0=x", "LINK=FACTOR"), ("A/nic0=0.5@-1", "0 or more"), ("A/nic0=nan", r"\(0, 1\]")])
def test_parse_degrade_errors(text, match):
    with pytest.raises(TopoplanError, match=match):
        parse_degrade(text)
