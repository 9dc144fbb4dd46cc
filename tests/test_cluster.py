"""The cluster layer: YAML v1 -> frozen model -> DiGraph -> routes, and every user mistake.

Each error kind has one test that asserts the exact one-line message
(``file:line: key: message``, docs/CLUSTER.md).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import textwrap

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.clusters import SHIPPED, topology_path
from topoplan.cluster import load_cluster, loads_cluster
from topoplan.errors import (ClusterSpecError, PortWarning, TopoplanError, TopoplanWarning,
                             UnitWarning)


def load(text: str):
    return loads_cluster(textwrap.dedent(text), file="c.yaml")


def error(text: str) -> str:
    with pytest.raises(ClusterSpecError) as info:
        load(text)
    message = str(info.value)
    assert "\n" not in message
    return message


def out_bandwidth(graph: nx.DiGraph, node: str) -> float:
    return sum(d["bandwidth"] for _, _, d in graph.out_edges(node, data=True))


# --------------------------------------------------------------------------------------
# Model, ranks and graph
# --------------------------------------------------------------------------------------

TWO_TYPES = """\
    name: mixed
    description: two box types on one switch
    switches: [sw]
    boxes:
      - name: "big{i}"
        count: 2
        gpus: 4
        fabric: {bandwidth: 300 GB/s, latency: 1 us}
        nics:
          - {switch: sw, bandwidth: 100 Gbit/s, latency: 2 us}
      - name: small
        gpus: 2
        gpu_links:
          - {a: 0, b: 1, bandwidth: 25 GB/s, latency: 500 ns}
        nics:
          - {switch: sw, bandwidth: 10 Gbit/s}
    """


def test_ranks_follow_file_order():
    cluster = load(TWO_TYPES)
    assert cluster.name == "mixed"
    assert cluster.nranks == 10
    assert [b.name for b in cluster.boxes] == ["big0", "big1", "small"]
    assert [b.first_rank for b in cluster.boxes] == [0, 4, 8]
    assert [cluster.gpu_node(r) for r in (0, 3, 4, 9)] == [
        "big0/gpu0", "big0/gpu3", "big1/gpu0", "small/gpu1"]
    assert cluster.box_of(5).name == "big1" and cluster.local_index(5) == 1
    assert cluster.box_index(9) == 2
    assert list(cluster.boxes[1].ranks) == [4, 5, 6, 7]
    with pytest.raises(IndexError):
        cluster.gpu_node(10)
    # Boxes stamped from one entry are one box type; the other entry is another.
    assert cluster.boxes[0].template == cluster.boxes[1].template == "big{i}"
    assert cluster.boxes[0].signature() == cluster.boxes[1].signature()
    assert cluster.boxes[0].signature() != cluster.boxes[2].signature()


def test_model_is_frozen():
    cluster = load(TWO_TYPES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.boxes[0].gpus = 3  # type: ignore[misc]


def test_graph_nodes_and_edges():
    cluster = load(TWO_TYPES)
    graph = cluster.graph
    kinds = nx.get_node_attributes(graph, "kind")
    assert sorted(n for n, k in kinds.items() if k == "switch") == ["sw"]
    assert sorted(n for n, k in kinds.items() if k == "fabric") == ["big0/fabric", "big1/fabric"]
    assert sorted(n for n, k in kinds.items() if k == "nic") == ["big0/nic0", "big1/nic0", "small/nic0"]
    assert sum(k == "gpu" for k in kinds.values()) == 10
    assert graph.nodes["big1/gpu2"]["rank"] == 6
    # Bytes/s and seconds on edges; full duplex means both directions.
    assert graph["big0/gpu1"]["big0/fabric"]["bandwidth"] == 300e9
    assert graph["big0/fabric"]["big0/gpu1"]["bandwidth"] == 300e9
    assert graph["big0/gpu1"]["big0/fabric"]["latency"] == pytest.approx(1e-6)
    assert graph["small/gpu0"]["small/gpu1"]["bandwidth"] == 25e9
    assert graph["small/gpu1"]["small/gpu0"]["latency"] == pytest.approx(500e-9)
    assert graph["big0/nic0"]["sw"]["bandwidth"] == 12.5e9
    assert graph["sw"]["big0/nic0"]["latency"] == pytest.approx(2e-6)
    assert graph["big0/gpu3"]["big0/nic0"]["bandwidth"] == 12.5e9
    assert graph["small/nic0"]["sw"]["bandwidth"] == 1.25e9
    assert graph["small/nic0"]["sw"]["latency"] == 0.0  # latency is optional
    assert cluster.injection_bandwidth(cluster.boxes[0]) == 12.5e9
    assert cluster.gpu_bandwidth(0) == 300e9 + 12.5e9


def test_single_box_needs_no_nics_or_switches():
    cluster = load("""\
        name: one
        boxes:
          - {name: solo, gpus: 1}
        """)
    assert cluster.nranks == 1 and cluster.switches == () and cluster.links == ()
    assert cluster.routes(0, 0) == (("solo/gpu0",),)


# --------------------------------------------------------------------------------------
# Templates, count, parallel links and NICs
# --------------------------------------------------------------------------------------

TEMPLATED = """\
    name: templated
    switches:
      - {name: "leaf{i}", count: 4}
      - {name: "spine{i}", count: 2}
      - name: "extra{i+10}"
      - {name: "x{i*3}", count: 2}
    boxes:
      - name: "n{i}"
        count: 8
        gpus: 2
        fabric: {bandwidth: 100 GB/s}
        nics:
          - {switch: "leaf{i//2}", bandwidth: 100 Gbit/s}
          - {switch: "leaf{i%4}", bandwidth: 50 Gbit/s, gpus: [1]}
    links:
      - {a: "leaf{i//2}", b: "spine{i%2}", count: 8, bandwidth: 10 GB/s}
      - {a: leaf0, b: spine0, bandwidth: 5 GB/s}
      - {a: spine1, b: "extra10", count: 3, bandwidth: 1 GB/s}
      - {a: "x{i*3}", b: "spine{i}", count: 2, bandwidth: 1 GB/s}
    """


def test_templates_expand_names():
    cluster = load(TEMPLATED)
    assert cluster.switches == ("leaf0", "leaf1", "leaf2", "leaf3", "spine0", "spine1",
                                "extra10", "x0", "x3")
    assert [b.name for b in cluster.boxes] == [f"n{i}" for i in range(8)]
    # {i//2} and {i%4} pick the NIC's switch per instance.
    assert [b.nics[0].switch for b in cluster.boxes] == [
        "leaf0", "leaf0", "leaf1", "leaf1", "leaf2", "leaf2", "leaf3", "leaf3"]
    assert [b.nics[1].switch for b in cluster.boxes] == [
        "leaf0", "leaf1", "leaf2", "leaf3", "leaf0", "leaf1", "leaf2", "leaf3"]
    assert cluster.boxes[5].nics[1].gpus == (1,) and cluster.boxes[5].nics[0].gpus == (0, 1)


def test_count_on_links_and_parallel_links_add_up():
    cluster = load(TEMPLATED)
    links = {(l.a, l.b): l.bandwidth for l in cluster.links}
    assert links == {
        ("leaf0", "spine0"): 15e9,  # 10 from the count entry + 5 from the extra entry
        ("leaf0", "spine1"): 10e9, ("leaf1", "spine0"): 10e9, ("leaf1", "spine1"): 10e9,
        ("leaf2", "spine0"): 10e9, ("leaf2", "spine1"): 10e9, ("leaf3", "spine0"): 10e9,
        ("leaf3", "spine1"): 10e9,
        ("spine1", "extra10"): 3e9,  # count without {i}: three parallel links
        ("x0", "spine0"): 1e9, ("x3", "spine1"): 1e9,
    }
    graph = cluster.graph
    assert graph["leaf0"]["spine0"]["bandwidth"] == graph["spine0"]["leaf0"]["bandwidth"] == 15e9
    assert graph["extra10"]["spine1"]["bandwidth"] == 3e9


def test_parallel_gpu_links_add_up():
    cluster = load("""\
        name: nvlinks
        boxes:
          - name: box
            gpus: 3
            gpu_links:
              - {a: 0, b: 1, bandwidth: 25 GB/s, count: 2}
              - {a: 1, b: 0, bandwidth: 25 GB/s}
              - {a: 1, b: 2, bandwidth: 20 GB/s, latency: 2 us}
              - {a: 2, b: 1, bandwidth: 20 GB/s, latency: 1 us}
        """)
    links = {(l.a, l.b): (l.bandwidth, l.latency) for l in cluster.boxes[0].gpu_links}
    assert links[(0, 1)] == (75e9, 0.0)
    assert links[(1, 2)][0] == 40e9 and links[(1, 2)][1] == pytest.approx(1e-6)
    assert cluster.graph["box/gpu1"]["box/gpu0"]["bandwidth"] == 75e9
    assert out_bandwidth(cluster.graph, "box/gpu1") == 115e9


def test_nics_add_up():
    cluster = load("""\
        name: dual-rail
        switches: [s0, s1]
        boxes:
          - name: h0
            gpus: 2
            fabric: {bandwidth: 100}
            nics:
              - {switch: s0, bandwidth: 100 Gbit/s}
              - {switch: s0, bandwidth: 100 Gbit/s}
              - {switch: s1, bandwidth: 50 Gbit/s, gpus: [1]}
        links:
          - {a: s0, b: s1, bandwidth: 1 GB/s}
        """)
    box = cluster.boxes[0]
    assert cluster.injection_bandwidth(box) == 31.25e9
    graph = cluster.graph
    # Two NICs into s0 from one box: separate nodes whose bandwidth adds up at the switch.
    into_s0 = sum(graph[f"h0/nic{k}"]["s0"]["bandwidth"] for k in (0, 1))
    assert into_s0 == 25e9
    # From the box to s0: both NICs into s0, plus the third NIC through s1 and its 1 GB/s link.
    flow, _ = nx.maximum_flow(graph, "h0/fabric", "s0", capacity="bandwidth")
    assert flow == pytest.approx(25e9 + 1e9)
    assert out_bandwidth(graph, "h0/gpu1") == 100e9 + 12.5e9 + 12.5e9 + 6.25e9
    assert out_bandwidth(graph, "h0/gpu0") == 100e9 + 12.5e9 + 12.5e9


# --------------------------------------------------------------------------------------
# Routes
# --------------------------------------------------------------------------------------

def test_routes_inside_a_box():
    cluster = load("""\
        name: chain
        boxes:
          - name: b
            gpus: 4
            gpu_links:
              - {a: 0, b: 1, bandwidth: 10}
              - {a: 1, b: 2, bandwidth: 10}
              - {a: 2, b: 3, bandwidth: 10}
              - {a: 3, b: 0, bandwidth: 10}
        """)
    assert cluster.routes(0, 1) == (("b/gpu0", "b/gpu1"),)
    # Two equal NVLink relays 0->1->2 and 0->3->2.
    assert sorted(cluster.routes(0, 2)) == [("b/gpu0", "b/gpu1", "b/gpu2"),
                                           ("b/gpu0", "b/gpu3", "b/gpu2")]
    assert cluster.route_edges(0, 1) == ((("b/gpu0", "b/gpu1"),),)
    fabric = load(TWO_TYPES)
    assert fabric.routes(0, 3) == (("big0/gpu0", "big0/fabric", "big0/gpu3"),)
    assert fabric.routes(8, 9) == (("small/gpu0", "small/gpu1"),)


def test_routes_between_boxes_use_every_nic_and_switch_path():
    cluster = load(TEMPLATED)
    # n0 gpu1 (rank 1) has two NICs (leaf0 twice); n7 gpu1 (rank 15) reaches leaf3 via both.
    routes = cluster.routes(1, 15)
    assert routes, "no route"
    for path in routes:
        assert path[0] == "n0/gpu1" and path[-1] == "n7/gpu1"
        assert all(cluster.graph.has_edge(u, v) for u, v in zip(path, path[1:]))
    middles = {path[2:-2] for path in routes}
    assert ("leaf0", "spine0", "leaf3") in middles and ("leaf0", "spine1", "leaf3") in middles
    assert {path[1] for path in routes} == {"n0/nic0", "n0/nic1"}
    assert len(routes) == len(set(routes))


def test_gpus_without_a_nic_hop_to_one_that_has_it():
    cluster = load("""\
        name: one-nic
        switches: [s]
        boxes:
          - name: "h{i}"
            count: 2
            gpus: 3
            gpu_links:
              - {a: 0, b: 1, bandwidth: 10}
              - {a: 1, b: 2, bandwidth: 10}
            nics:
              - {switch: s, bandwidth: 10, gpus: [0]}
        """)
    assert cluster.routes(2, 5) == (
        ("h0/gpu2", "h0/gpu1", "h0/gpu0", "h0/nic0", "s", "h1/nic0", "h1/gpu0", "h1/gpu1",
         "h1/gpu2"),)


# --------------------------------------------------------------------------------------
# Bare numbers: read in the default unit, never silently
# --------------------------------------------------------------------------------------

def test_every_bare_number_is_warned_about_once_with_how_to_write_it():
    with pytest.warns(UnitWarning) as caught:
        cluster = load("""\
            name: bare
            switches: [s]
            boxes:
              - name: "a{i}"
                count: 3
                gpus: 2
                fabric: {bandwidth: 300 GB/s, latency: 1}
                nics:
                  - {switch: s, bandwidth: 100, gpus: [0]}
                  - {switch: s, bandwidth: "12.5", latency: 0, gpus: [1]}
            """)
    # The default stays (GB/s, us); each key is named once, not once per box of count: 3;
    # 0 is 0 in any unit.
    assert cluster.boxes[0].nics[0].bandwidth == 100e9
    assert cluster.boxes[0].fabric.latency == pytest.approx(1e-6)
    assert [str(w.message) for w in caught] == [
        "c.yaml:7: boxes[0].fabric.latency: bare number 1 read as 1 us; write '1 us' "
        "(or '1 ns', '1 ms' if that is what you meant)",
        "c.yaml:9: boxes[0].nics[0].bandwidth: bare number 100 read as 100 GB/s "
        "(800 Gbit/s); write '100 GB/s' or '100 Gbit/s'",
        "c.yaml:10: boxes[0].nics[1].bandwidth: bare number 12.5 read as 12.5 GB/s "
        "(100 Gbit/s); write '12.5 GB/s' or '12.5 Gbit/s'"]
    first = caught[1].message
    assert (first.file, first.line, first.key) == ("c.yaml", 9, "boxes[0].nics[0].bandwidth")
    assert isinstance(first, TopoplanWarning) and isinstance(first, UserWarning)


@pytest.mark.filterwarnings("error::topoplan.errors.UnitWarning")
def test_quantities_with_units_load_without_a_warning():
    load(TWO_TYPES)
    for path in SHIPPED:
        load_cluster(topology_path(path))


def test_bare_numbers_on_links_and_gpu_links_are_named():
    with pytest.warns(UnitWarning) as caught:
        load("""\
            name: x
            switches: [s0, s1]
            links:
              - {a: s0, b: s1, bandwidth: 5 GB/s, latency: 2}
            boxes:
              - name: a
                gpus: 2
                gpu_links: [{a: 0, b: 1, bandwidth: 25}]
                nics: [{switch: s0, bandwidth: 10 GB/s}]
              - {name: b, gpus: 1, nics: [{switch: s1, bandwidth: 10 GB/s}]}
            """)
    assert [f"{w.message.line}: {w.message.key}" for w in caught] == [
        "8: boxes[0].gpu_links[0].bandwidth", "4: links[0].latency"]


# --------------------------------------------------------------------------------------
# One test per error kind: the exact one-line message
# --------------------------------------------------------------------------------------

def test_error_missing_key():
    assert error("""\
        name: x
        boxes:
          - name: a
        """) == "c.yaml:3: boxes[0].gpus: missing required key"


def test_error_missing_top_level_key():
    assert error("name: x\n") == "c.yaml:1: boxes: missing required key"


def test_error_unknown_key():
    assert error("""\
        name: x
        boxes:
          - {name: a, gpus: 1, gpu_link: 2}
        """) == ("c.yaml:3: boxes[0].gpu_link: unknown key 'gpu_link' (did you mean "
                 "'gpu_links'?); allowed: count, fabric, gpu, gpu_links, gpus, name, nics")


def test_error_wrong_type():
    assert error("""\
        name: x
        boxes:
          - {name: a, gpus: two}
        """) == "c.yaml:3: boxes[0].gpus: expected an integer, got str 'two'"
    assert error("""\
        name: x
        boxes: {name: a}
        """) == "c.yaml:2: boxes: expected a list, got mapping"


def test_error_non_positive_bandwidth():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - name: "a{i}"
            count: 2
            gpus: 1
            nics:
              - {switch: s, bandwidth: -5}
        """) == "c.yaml:8: boxes[0].nics[0].bandwidth: must be > 0, got -5"
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 2
            fabric: {bandwidth: 0 GB/s}
        """) == "c.yaml:5: boxes[0].fabric.bandwidth: must be > 0, got 0 GB/s"


def test_error_infinite_bandwidth():
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 2
            fabric: {bandwidth: .inf}
        """) == "c.yaml:5: boxes[0].fabric.bandwidth: expected a finite bandwidth, got inf"


def test_error_negative_latency():
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 2
            gpu_links:
              - {a: 0, b: 1, bandwidth: 10, latency: -1 us}
        """) == "c.yaml:6: boxes[0].gpu_links[0].latency: must be >= 0, got -1 us"


def test_error_unknown_unit():
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 2
            fabric: {bandwidth: 10, latency: 3 hours}
        """) == ("c.yaml:5: boxes[0].fabric.latency: unknown unit 'hours' in '3 hours'; "
                 "use one of ns, us, µs, ms, s")


def test_error_unknown_switch_in_nic():
    assert error("""\
        name: x
        switches: [leaf0]
        boxes:
          - name: "a{i}"
            count: 2
            gpus: 1
            nics:
              - {switch: "leaf{i}", bandwidth: 5}
        """) == ("c.yaml:8: boxes[0].nics[0].switch: unknown switch 'leaf1' "
                 "(did you mean 'leaf0'?) (from 'leaf{i}' with i=1); switches: leaf0")


def test_error_unknown_switch_in_link():
    assert error("""\
        name: x
        switches: [s0, s1]
        boxes:
          - {name: a, gpus: 1}
        links:
          - {a: s0, b: core, bandwidth: 5}
        """) == "c.yaml:6: links[0].b: unknown switch 'core'; links join switches declared under switches"


def test_error_gpu_index_out_of_range_in_gpu_links():
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 2
            gpu_links:
              - {a: 0, b: 2, bandwidth: 5}
        """) == "c.yaml:6: boxes[0].gpu_links[0].b: GPU index 2 out of range: the box has 2 GPUs (0..1)"


def test_error_gpu_index_out_of_range_in_nic_gpus():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - name: a
            gpus: 2
            fabric: {bandwidth: 5}
            nics:
              - switch: s
                bandwidth: 5
                gpus:
                  - 0
                  - 3
        """) == "c.yaml:12: boxes[0].nics[0].gpus[1]: GPU index 3 out of range: the box has 2 GPUs (0..1)"


def test_error_box_gpus_not_connected():
    assert error("""\
        name: x
        boxes:
          - name: a
            gpus: 4
            gpu_links:
              - {a: 0, b: 1, bandwidth: 5}
              - {a: 2, b: 3, bandwidth: 5}
        """) == ("c.yaml:5: boxes[0]: the 4 GPUs are not connected (groups [[0, 1], [2, 3]]); "
                 "add a fabric or gpu_links joining them")


def test_error_multi_box_cluster_without_nic():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - {name: a, gpus: 1, nics: [{switch: s, bandwidth: 5}]}
          - {name: b, gpus: 1}
        """) == "c.yaml:5: boxes[1].nics: missing: a cluster with more than one box needs NICs in every box"


def test_error_multi_box_cluster_without_nic_path():
    assert error("""\
        name: x
        switches: [s0, s1]
        boxes:
          - {name: a, gpus: 1, nics: [{switch: s0, bandwidth: 5}]}
          - {name: b, gpus: 1, nics: [{switch: s1, bandwidth: 5}]}
        """) == ("c.yaml:5: boxes: no network path between box 'a' (switches ['s0']) and box 'b' "
                 "(switches ['s1']); add links between their switches")


def test_error_duplicate_switch_name():
    assert error("""\
        name: x
        switches:
          - s0
          - s0
        boxes:
          - {name: a, gpus: 1}
        """) == "c.yaml:4: switches[1].name: duplicate switch name 's0' (first on line 3)"
    assert error("""\
        name: x
        switches:
          - {name: s, count: 2}
        boxes:
          - {name: a, gpus: 1}
        """) == ("c.yaml:3: switches[0].name: duplicate switch name 's' (first on line 3); "
                 "add {i} to the name")


def test_error_duplicate_box_name():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - {name: a, gpus: 1, nics: [{switch: s, bandwidth: 5}]}
          - {name: a, gpus: 1, nics: [{switch: s, bandwidth: 5}]}
        """) == "c.yaml:5: boxes[1].name: duplicate box name 'a' (first on line 4)"
    assert error("""\
        name: x
        switches: [a]
        boxes:
          - {name: a, gpus: 1, nics: [{switch: a, bandwidth: 5}]}
        """) == "c.yaml:4: boxes: duplicate name 'a': a switch has it too"


def test_error_bad_template():
    assert error("""\
        name: x
        switches:
          - {name: "s{j}", count: 2}
        boxes:
          - {name: a, gpus: 1}
        """) == ("c.yaml:3: switches[0].name: bad template {j} in 's{j}'; "
                 "use {i}, {i//K}, {i%K}, {i+K}, {i-K} or {i*K}")
    assert error("""\
        name: x
        switches: [s0]
        boxes:
          - {name: "a{i", gpus: 1}
        """) == "c.yaml:4: boxes[0].name: bad template 'a{i': unbalanced braces"
    assert error("""\
        name: x
        switches: [s0]
        links:
          - {a: s0, b: "s{i//0}", bandwidth: 1}
        boxes:
          - {name: a, gpus: 1}
        """) == "c.yaml:4: links[0].b: bad template {i//0} in 's{i//0}': division by zero"


def test_error_yaml_syntax():
    assert error("""\
        name: x
        boxes:
          - name: a
           gpus: 1
        """) == "c.yaml:4: YAML syntax error: expected <block end>, but found '<block mapping start>'"


@pytest.mark.parametrize("text, where", [
    ("name: x\nboxes:\n\t- {name: a, gpus: 1}\n", "c.yaml:3: a tab at column 1"),
    ("name: x\nboxes:\n  - name: a\n  \tgpus: 1\n", "c.yaml:4: a tab at column 3"),
    ("name:\tx\nboxes: [{name: a, gpus: 1}]\n", "c.yaml:1: a tab at column 6"),
])
def test_error_tab_says_indent_with_spaces(text, where):
    assert error(text) == (f"{where}: indent with spaces (YAML allows tabs only inside "
                           "quoted strings)")


def test_tab_in_a_profile_says_indent_with_spaces():
    from topoplan.analysis.cost import loads_profile
    from topoplan.errors import ProfileError
    with pytest.raises(ProfileError, match=r"^p.yaml:3: a tab at column 1: indent with spaces"):
        loads_profile("name: x\nalpha:\n\tbox: 1 us\n", "p.yaml")


def test_error_duplicate_yaml_key():
    assert error("""\
        name: x
        name: y
        boxes: [{name: a, gpus: 1}]
        """) == "c.yaml:2: duplicate key 'name' (first on line 1)"


def test_error_not_a_mapping():
    assert error("- a\n- b\n") == "c.yaml:1: a cluster file is a mapping with name and boxes, got list"


def test_error_count_too_large_does_not_hang():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - {name: "a{i}", gpus: 1, count: 100000000, nics: [{switch: s, bandwidth: 1}]}
        """) == "c.yaml:4: boxes[0].count: must be <= 100000, got 100000000"


def test_error_gpus_too_large_does_not_exhaust_memory():
    assert error("""\
        name: x
        switches: [s]
        boxes:
          - {name: "a", gpus: 1000000000, nics: [{switch: s, bandwidth: 1}]}
        """) == "c.yaml:4: boxes[0].gpus: must be <= 4096, got 1000000000"


def test_error_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# only a comment\n")
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(path)
    assert str(info.value) == f"{path}:1: empty file; a cluster file is a mapping with name and boxes"


def test_error_unreadable_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(missing)
    assert str(info.value) == f"{missing}: cannot read cluster file: No such file or directory"
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot read cluster file: Is a directory"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(binary)
    assert str(info.value) == f"{binary}: not a text file (UTF-8 expected)"


def test_errors_are_topoplan_errors_with_fields():
    with pytest.raises(TopoplanError) as info:
        load("name: x\nboxes:\n  - {name: a, gpus: 0}\n")
    exc = info.value
    assert (exc.file, exc.line, exc.key, exc.reason) == ("c.yaml", 3, "boxes[0].gpus", "must be >= 1, got 0")


# --------------------------------------------------------------------------------------
# Property: random clusters, written as YAML, load into a consistent graph
# --------------------------------------------------------------------------------------

BANDWIDTHS = [("100 Gbit/s", 12.5e9), ("25 GB/s", 25e9), ("800 MB/s", 8e8), (50, 50e9),
              ("10 Gbps", 1.25e9), ("200 Gb/s", 25e9), ("1.5 TB/s", 1.5e12), ("400 Mbit/s", 5e7)]
LATENCIES = ["1 us", "500 ns", 2, "0.01 ms", "0 s"]


@st.composite
def cluster_specs(draw):
    """A random cluster as plain data plus the bandwidths it should produce."""
    nsw = draw(st.integers(1, 5))
    bw = st.sampled_from(BANDWIDTHS)
    # A random tree over the switches (so every box is reachable), maybe doubled links.
    links = []
    for k in range(1, nsw):
        parent = draw(st.integers(0, k - 1))
        for _ in range(draw(st.integers(1, 2))):
            links.append((f"sw{parent}", f"sw{k}", draw(bw)))
    entries = []
    for e in range(draw(st.integers(1, 3))):
        count = draw(st.integers(1, 3))
        gpus = draw(st.integers(1, 6))
        wiring = draw(st.sampled_from(["fabric", "ring", "both"])) if gpus > 1 else "none"
        fabric = draw(bw) if wiring in ("fabric", "both") else None
        ring = []
        if wiring in ("ring", "both"):
            ring = [(j, (j + 1) % gpus, draw(bw)) for j in range(gpus)]
        nics = []
        for _ in range(draw(st.integers(1, 3))):
            served = draw(st.none() | st.lists(st.integers(0, gpus - 1), min_size=1, unique=True))
            # Either a fixed switch or one picked by template from the instance index.
            switch = draw(st.sampled_from([f"sw{draw(st.integers(0, nsw - 1))}",
                                           f"sw{{i%{nsw}}}"]))
            nics.append((switch, draw(bw), draw(st.sampled_from(LATENCIES)), served))
        entries.append(dict(name=f"e{e}_{{i}}", count=count, gpus=gpus, fabric=fabric, ring=ring,
                            nics=nics))
    return nsw, links, entries


def spec_to_yaml(nsw, links, entries) -> str:
    def q(value):  # YAML scalar for a bandwidth/latency
        return str(value) if isinstance(value, (int, float)) else f'"{value}"'

    lines = ["name: random", "switches:", f'  - {{name: "sw{{i}}", count: {nsw}}}', "boxes:"]
    for entry in entries:
        lines += [f'  - name: "{entry["name"]}"', f"    count: {entry['count']}",
                  f"    gpus: {entry['gpus']}"]
        if entry["fabric"] is not None:
            lines.append(f"    fabric: {{bandwidth: {q(entry['fabric'][0])}, latency: 1 us}}")
        if entry["ring"]:
            lines.append("    gpu_links:")
            lines += [f"      - {{a: {a}, b: {b}, bandwidth: {q(w[0])}}}" for a, b, w in entry["ring"]]
        lines.append("    nics:")
        for switch, w, latency, served in entry["nics"]:
            item = f'      - {{switch: "{switch}", bandwidth: {q(w[0])}, latency: {q(latency)}'
            lines.append(item + (f", gpus: {served}}}" if served is not None else "}"))
    if links:
        lines.append("links:")
        lines += [f"  - {{a: {a}, b: {b}, bandwidth: {q(w[0])}}}" for a, b, w in links]
    return "\n".join(lines) + "\n"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_specs())
def test_random_clusters_load_into_a_consistent_graph(spec):
    nsw, links, entries = spec
    text = spec_to_yaml(nsw, links, entries)
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        cluster = load_cluster(path)
    finally:
        os.unlink(path)
    graph = cluster.graph

    # Ranks and node kinds.
    nranks = sum(e["count"] * e["gpus"] for e in entries)
    assert cluster.nranks == nranks
    kinds = nx.get_node_attributes(graph, "kind")
    count = lambda kind: sum(k == kind for k in kinds.values())  # noqa: E731
    assert count("gpu") == nranks
    assert count("switch") == nsw
    assert count("nic") == sum(e["count"] * len(e["nics"]) for e in entries)
    assert count("fabric") == sum(e["count"] for e in entries if e["fabric"] is not None)
    assert len(kinds) == graph.number_of_nodes()
    assert [graph.nodes[cluster.gpu_node(r)]["rank"] for r in range(nranks)] == list(range(nranks))

    # Every GPU's outgoing bandwidth is its fabric port + its ring links + the NICs serving it.
    expected_gpu: dict[str, float] = {}
    expected_switch = {f"sw{k}": 0.0 for k in range(nsw)}
    for a, b, w in links:
        expected_switch[a] += w[1]
        expected_switch[b] += w[1]
    box_iter = iter(cluster.boxes)
    for entry in entries:
        for i in range(entry["count"]):
            box = next(box_iter)
            assert box.name == entry["name"].replace("{i}", str(i))
            for j in range(entry["gpus"]):
                total = entry["fabric"][1] if entry["fabric"] is not None else 0.0
                total += sum(w[1] for a, b, w in entry["ring"] if j in (a, b))
                total += sum(w[1] for _, w, _, served in entry["nics"]
                             if served is None or j in served)
                expected_gpu[box.gpu_node(j)] = total
            for switch, w, _, _ in entry["nics"]:
                expected_switch[switch.replace(f"{{i%{nsw}}}", str(i % nsw))] += w[1]
    for node, total in expected_gpu.items():
        assert out_bandwidth(graph, node) == pytest.approx(total, rel=1e-9), node
    for node, total in expected_switch.items():
        assert out_bandwidth(graph, node) == pytest.approx(total, rel=1e-9), node
    # Full duplex: every edge has its reverse with the same bandwidth.
    for u, v, data in graph.edges(data=True):
        assert graph[v][u]["bandwidth"] == data["bandwidth"]
        assert data["bandwidth"] > 0 and data["latency"] >= 0

    # Every GPU pair is routable, along graph edges, from the right node to the right node.
    for src in range(nranks):
        for dst in range(nranks):
            routes = cluster.routes(src, dst)
            assert routes, (src, dst)
            for path in routes:
                assert path[0] == cluster.gpu_node(src) and path[-1] == cluster.gpu_node(dst)
                assert all(graph.has_edge(u, v) for u, v in zip(path, path[1:]))


def _loads_by_paths(cluster, src: int, dst: int) -> tuple[dict, float]:
    """route_loads spelled out: every route's edges, each route 1 / (routes) of the bytes."""
    paths = cluster.route_edges(src, dst)
    loads: dict = {}
    for path in paths:
        for edge in path:
            loads[edge] = loads.get(edge, 0.0) + 1.0 / len(paths)
    worst = max(sum(cluster.graph.edges[e]["latency"] for e in path) for path in paths)
    return loads, worst


@pytest.mark.parametrize("name", SHIPPED)
def test_route_loads_are_the_routes_summed(name: str) -> None:
    from topoplan.cluster import load_cluster

    cluster = load_cluster(topology_path(name))
    n = cluster.nranks
    pairs = {(s, d) for s in range(0, n, max(1, n // 24)) for d in range(0, n, max(1, n // 24))}
    pairs |= {(0, n - 1), (n - 1, 0), (1 % n, 0)}
    for src, dst in sorted(pairs):
        if src == dst:
            continue
        want, worst = _loads_by_paths(cluster, src, dst)
        got, got_worst = cluster.route_loads(src, dst)
        assert got.keys() == want.keys(), (name, src, dst)
        for edge, share in want.items():
            assert got[edge] == pytest.approx(share, rel=1e-12), (name, src, dst, edge)
        assert got_worst == pytest.approx(worst, rel=1e-12), (name, src, dst)
        assert sum(v for (a, _), v in got.items() if a == cluster.gpu_node(src)) == \
            pytest.approx(1.0)  # every byte leaves the source once


def test_route_loads_of_generated_fabrics_with_many_paths() -> None:
    """Fat trees and rail clusters whose pairs have more switch paths than MAX_ROUTES
    (the routes are cut there, in order), and NIC-less GPUs that hop to a NIC first."""
    from topoplan.cluster import loads_cluster
    from topoplan.cluster.generate import fat_tree, rail_optimized
    from topoplan.cluster.model import MAX_ROUTES

    # Two NICs per GPU on two leaves, four spines: 2 x 2 legs x up to 4 spine paths, cut at
    # MAX_ROUTES in order; GPU 2 has no NIC and hops to the others' first.
    spines = "".join(f"  - {{name: s{k}}}\n" for k in range(4))
    uplinks = "".join(f"  - {{a: l{i}, b: s{k}, bandwidth: 50 GB/s, latency: {1 + k} us}}\n"
                      for i in range(4) for k in range(4))
    wide = (f"name: wide\nswitches:\n{spines}" + "".join(f"  - {{name: l{i}}}\n"
                                                             for i in range(4))
            + f"links:\n{uplinks}boxes:\n"
            + "".join(f"  - name: b{b}\n    gpus: 3\n    fabric: {{bandwidth: 300 GB/s, "
                      f"latency: 0.5 us}}\n    nics:\n"
                      f"      - {{switch: l{2 * (b // 2)}, bandwidth: 25 GB/s, gpus: [0, 1]}}\n"
                      f"      - {{switch: l{2 * (b // 2) + 1}, bandwidth: 25 GB/s, gpus: [0, 1]}}\n"
                      for b in range(4)))
    for text in (fat_tree(64, name="fat"), rail_optimized(64, name="rail"), wide):
        cluster = loads_cluster(text, "generated")
        n = cluster.nranks
        for src, dst in [(0, n - 1), (3, n // 2 + 5), (n - 9, 7), (8, 10), (1, 2), (2, n - 2),
                         (n - 1, 2)]:
            want, worst = _loads_by_paths(cluster, src, dst)
            got, got_worst = cluster.route_loads(src, dst)
            assert got.keys() == want.keys()
            assert all(got[e] == pytest.approx(v, rel=1e-12) for e, v in want.items())
            assert got_worst == pytest.approx(worst, rel=1e-12)
    assert len(cluster.routes(0, cluster.nranks - 1)) == MAX_ROUTES  # the cut is exercised
    assert len(cluster._switch_paths("l0", "l2")) == 4


def test_nic_plugin_latency_is_read_with_units_and_checked():
    # The latency NCCL's network plugin reports (ncclNetProperties_t.latency), which its
    # tuner adds to every step between nodes: optional, a time, >= 0.
    text = """\
        name: x
        switches: [s]
        boxes:
          - name: "a{i}"
            count: 2
            gpus: 1
            nics:
              - {switch: s, bandwidth: 400 Gbit/s, plugin_latency: 75 us}
        """
    cluster = loads_cluster(textwrap.dedent(text), "c.yaml")
    assert cluster.boxes[0].nics[0].plugin_latency == pytest.approx(75e-6)
    assert cluster.boxes[0].nics[0].latency == 0.0
    plain = loads_cluster(textwrap.dedent(text.replace(", plugin_latency: 75 us", "")), "c.yaml")
    assert plain.boxes[0].nics[0].plugin_latency == 0.0
    # Boxes that differ only in it are not one kind (the nccl row prices them apart).
    assert plain.boxes[0].signature() != cluster.boxes[0].signature()
    assert error(text.replace("75 us", "-1 us")) == \
        "c.yaml:8: boxes[0].nics[0].plugin_latency: must be >= 0, got -1 us"
    assert error(text.replace("75 us", "75 Gbit/s")).startswith(
        "c.yaml:8: boxes[0].nics[0].plugin_latency: unknown unit 'Gbit/s'")
    assert load(text.replace("75 us", "0.035 ms")).boxes[0].nics[0].plugin_latency == \
        pytest.approx(35e-6)
    # A bare number is microseconds, as for latency, with the same warning.
    with pytest.warns(UnitWarning) as caught:
        bare = loads_cluster(textwrap.dedent(text.replace("75 us", "75")), "c.yaml")
    assert bare.boxes[0].nics[0].plugin_latency == pytest.approx(75e-6)
    assert [str(w.message) for w in caught] == [
        "c.yaml:8: boxes[0].nics[0].plugin_latency: bare number 75 read as 75 us; write "
        "'75 us' (or '75 ns', '75 ms' if that is what you meant)"]


def hgx(nics: str) -> str:
    """Two 8-GPU boxes on rails ``rail0 .. rail15``, with the NIC entries given."""
    return textwrap.dedent(f"""\
        name: hgx
        switches: [{{name: 'rail{{i}}', count: 16}}, spine]
        links: [{{a: 'rail{{i}}', b: spine, count: 16, bandwidth: 1.6 Tbit/s}}]
        boxes:
          - name: 'n{{i}}'
            count: 2
            gpus: 8
            fabric: {{bandwidth: 450 GB/s}}
            nics: [{nics}]
        """)


def port_warnings(text: str) -> list[str]:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loads_cluster(text, "c.yaml")
    return [str(w.message) for w in caught if issubclass(w.category, PortWarning)]


def test_the_ports_of_one_card_written_as_nics_are_flagged_once_per_box_kind():
    # 16 x 200G for 8 GPUs, two per GPU: most likely eight dual-port cards, which NCCL
    # merges into eight 400G devices (NCCL_IB_MERGE_NICS=1).
    ports = ", ".join(f"{{switch: 'rail{2 * g + p}', bandwidth: 200 Gbit/s, gpus: [{g}]}}"
                      for g in range(8) for p in range(2))
    assert port_warnings(hgx(ports)) == [
        "c.yaml:9: boxes[0].nics: 16 NICs for 8 GPUs: nics[0] and nics[1] serve the same "
        "GPUs [0] (switches rail0, rail1); if they are the ports of one card, NCCL merges them "
        "(NCCL_IB_MERGE_NICS=1; aws-ofi-nccl groups a GPU's EFA devices): write them as one "
        "NIC of 400 Gbit/s"]
    # Both ports on one switch (each GPU's pair on rail g) are flagged too.
    one_switch = ", ".join(f"{{switch: 'rail{g}', bandwidth: 200 Gbit/s, gpus: [{g}]}}"
                           for g in range(8) for _ in range(2))
    assert port_warnings(hgx(one_switch)) == [
        "c.yaml:9: boxes[0].nics: 16 NICs for 8 GPUs: nics[0] and nics[1] serve the same "
        "GPUs [0] on switch rail0; if they are the ports of one card, NCCL merges them "
        "(NCCL_IB_MERGE_NICS=1; aws-ofi-nccl groups a GPU's EFA devices): write them as one "
        "NIC of 400 Gbit/s"]


def test_one_nic_per_gpu_and_nics_shared_by_gpus_are_not_flagged():
    # As NCCL sees an HGX H100: one 400G NIC per GPU.
    cards = ", ".join(f"{{switch: 'rail{g}', bandwidth: 400 Gbit/s, gpus: [{g}]}}"
                      for g in range(8))
    assert port_warnings(hgx(cards)) == []
    # No more NICs than GPUs: two NICs serving every GPU are not ports by this rule.
    assert port_warnings(hgx("{switch: rail0, bandwidth: 400 Gbit/s}, "
                             "{switch: rail1, bandwidth: 400 Gbit/s}")) == []
    # More NICs than GPUs, but no two serve the same GPUs.
    mixed = cards + ", " + "{switch: rail8, bandwidth: 400 Gbit/s}"
    assert port_warnings(hgx(mixed)) == []
