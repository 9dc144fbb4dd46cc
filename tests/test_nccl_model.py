"""The model of NCCL's own collectives (topoplan.analysis.native): its pieces against hand
calculations from NCCL's tuning.cc, its choices, and what it does not see."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from topoplan.analysis.bound import collective_bound
from topoplan.cluster import load_cluster, loads_cluster
from topoplan.analysis.native import nccl_tables as T
from topoplan.analysis.native.clusters import nccl_links
from topoplan.analysis.native.nccl import NcclModel, nccl_model, nccl_time
from topoplan.analysis.native.nccl_search import box_view, nvlink_view, search_nvls, search_ring

GiB = 1 << 30
TOPOLOGIES = sorted(Path(__file__).resolve().parent.parent.glob("topologies/*.yaml"))


def h100(nvls: bool = True, gpu: str = "H100") -> str:
    return (f"name: hgx\nboxes: [{{name: b, gpus: 8, gpu: {gpu}, fabric: "
            f"{{bandwidth: 370.8 GB/s, nvls: {'true' if nvls else 'false'}}}}}]\n")


def rails(nodes: int, nic: str = "400 Gbit/s", nvls: bool = False, gpu: str = "H100",
          fabric: str = "370.8 GB/s") -> str:
    nics = ", ".join(f"{{switch: 'rail{k}', bandwidth: {nic}, gpus: [{k}]}}" for k in range(8))
    return (f"name: rails\nswitches: [{{name: 'rail{{i}}', count: 8}}, spine]\n"
            f"links: [{{a: 'rail{{i}}', b: spine, count: 8, bandwidth: 3.2 Tbit/s}}]\n"
            f"boxes: [{{name: 'n{{i}}', count: {nodes}, gpus: 8, gpu: {gpu}, fabric: "
            f"{{bandwidth: {fabric}, nvls: {'true' if nvls else 'false'}}}, nics: [{nics}]}}]\n")


def pick(model: NcclModel, collective: str, size: int, algorithm: str, protocol: str):
    """The candidate NCCL_ALGO / NCCL_PROTO would force."""
    return next(c for c in model.candidates(collective, size)
                if (c.algorithm, c.protocol) == (algorithm, protocol))


# ---- NCCL's view of NVLink ----------------------------------------------------------
def test_nvlink_view_counts_links_as_nccl_does():
    assert nvlink_view(300.0, 80) == pytest.approx(12 * 20.0)     # A100 datasheet: 12 x 25
    assert nvlink_view(450.0, 90) == pytest.approx(18 * 20.6)     # H100 datasheet: 18 x 25
    assert nvlink_view(370.8, 90) == pytest.approx(370.8)         # already NCCL's (import)
    assert nvlink_view(900.0, 100) == pytest.approx(18 * 40.1)    # B200: 18 x 50
    assert nvlink_view(16.0, 80) == 16.0                          # under one link: not NVLink
    assert nvlink_view(310.0, 80) == pytest.approx(310.0 * 20 / 25)


# ---- the search ---------------------------------------------------------------------
def test_ring_search_on_an_nvswitch_box_by_hand():
    # H100, 370.8 GB/s per GPU: 60 GB/s fits 6 channels (360), and nothing slower does
    # better; 60 >= 25 so the channels are doubled to 12 x 30; 12 x 40 = 480 > 370.8
    # stops pass 2.
    view = box_view(loads_cluster(h100(nvls=False)).boxes[0], 90)
    ring = search_ring(view, inter=False)
    assert (ring.channels, ring.bw_intra, ring.bw_inter) == (12, 30.0, 30.0)
    # A100 (Ampere tables): 12 NCCL links of 20 = 240; 40 x 6 = 240 reaches totalBw,
    # doubled (Ampere: no 50 GB/s exception) to 12 x 20.
    a100 = loads_cluster("name: a\nboxes: [{name: b, gpus: 8, gpu: A100, fabric: "
                         "{bandwidth: 300 GB/s}}]\n")
    ring = search_ring(box_view(a100.boxes[0], 80), inter=False)
    assert (ring.channels, ring.bw_intra) == (12, 20.0)


def test_ring_search_packs_hamiltonian_cycles_on_an_nvlink_mesh():
    # DGX-1 V100 (NCCL's 20 GB/s per link): 2 rings each way over the double links and
    # 2 each way over the single links: 6 x 20 = 120, every link's bandwidth.
    text = Path(TOPOLOGIES[0].parent / "dgx1_v100.yaml").read_text()
    cluster = loads_cluster(text.replace("gpus: 8", "gpus: 8\n    gpu: V100"))
    ring = search_ring(box_view(cluster.boxes[0], 70), inter=False)
    assert (ring.channels, ring.bw_intra) == (6, 20.0)
    links = {frozenset(ab) for ab, _ in box_view(cluster.boxes[0], 70).links}
    for order in ring.orders:
        assert sorted(order) == list(range(8))
        hops = zip(order, order[1:] + order[:1])
        assert all(frozenset(hop) in links for hop in hops), order


def test_nvls_search_by_hand():
    # 8 heads, each GPU's port carries 7 channels once and its own twice: 9 x 40 = 360
    # fits 370.8 (50 does not); pass 2 raises bwInter to the fastest speed, 60.
    view = box_view(loads_cluster(h100()).boxes[0], 90)
    nvls = search_nvls(view, inter=False)
    assert (nvls.channels, nvls.bw_intra, nvls.bw_inter) == (8, 40.0, 60.0)
    assert search_nvls(box_view(loads_cluster(h100(nvls=False)).boxes[0], 90), False).empty


# ---- the tuner and the time --------------------------------------------------------
def test_ring_on_one_nvswitch_box_by_hand():
    model = nccl_model(loads_cluster(h100(nvls=False)))
    ring = pick(model, "allreduce", GiB, "Ring", "Simple")
    # latency: baseLatencies[Ring][Simple] 8.4 + 2(N-1) steps x hwLatencies[NVLINK][Ring]
    # [Simple] 3.4; bandwidth: 12 channels x 30 GB/s, algbw = busBw x N / 2(N-1).
    lat = 8.4 + 14 * 3.4
    algbw = 12 * 30.0 * 8 / 14
    assert ring.tuner_time_s == pytest.approx((lat + GiB / (1000 * algbw)) * 1e-6)
    assert ring.time_s == pytest.approx(ring.tuner_time_s)   # the fabric is not the limit
    assert ring.channels == 24                                # 2 x 12 after connect.cc
    small = pick(model, "allreduce", 1024, "Ring", "LL")
    # LL: 6.6 + 14 x 0.6; busBw min(llMaxBw Hopper 1 node 141, 360 / 2).
    assert small.tuner_time_s == pytest.approx((6.6 + 14 * 0.6 + 1024 / (1000 * 141 * 8 / 14))
                                               * 1e-6)


def test_nvls_on_one_box_by_hand():
    model = nccl_model(loads_cluster(h100()))
    choice = model.choose("allreduce", GiB)
    assert (choice.algorithm, choice.protocol, choice.channels) == ("NVLS", "Simple", 16)
    # busBw = 8 channels x min(40 x 0.85 x 7/8 x 2, 60); latency hwLatencies[NVLINK][NVLS]
    # [Simple] = 25 us alone.
    algbw = 8 * min(40 * 0.85 * 7 / 8 * 2, 60.0) * 8 / 14
    assert choice.time_s == pytest.approx((25.0 + GiB / (1000 * algbw)) * 1e-6)
    # Bytes on the busiest port: every GPU sends its buffer into the switch and its
    # slice's result, (1 + 1/8) x 1 GiB at 370.8 GB/s.
    assert choice.fabric_s == pytest.approx(GiB * 9 / 8 / 370.8e9)


def test_two_node_tree_by_hand():
    cluster = loads_cluster(rails(2))
    model = nccl_model(cluster)
    graph = model.graphs["tree"]
    # A chain between nodes is a path: 7 channels' worth on each port direction, so 8 at
    # 48 fit a 370.8 GB/s port (search.cc:602-604).
    assert (graph.channels, graph.bw_intra, graph.bw_inter) == (8, 48.0, 48.0)
    tree = pick(model, "allreduce", GiB, "Tree", "Simple")
    # 2 nodes use bwIntra: 8 x 48 x 0.92 against perChMaxTreeBw (Hopper, 2 nodes) 41.4 x 8,
    # times 0.85 for the plain TREE pattern (each GPU has its own NIC: tuning.cc:336),
    # halved for the tree; latency 8.4 + 2 ((8 - 1) x 4.0 + log2(2) x 14).
    algbw = min(8 * 48 * 0.92, 8 * 41.4) * 0.85 * 0.5
    lat = 8.4 + 2 * (7 * 4.0 + 1 * 14.0)
    assert tree.tuner_time_s == pytest.approx((lat + GiB / (1000 * algbw)) * 1e-6)
    # On the wire: each node sends and receives its whole buffer once over its 8 NICs
    # (two trees, each half), 1/8 of it per 50 GB/s NIC; inside, a GPU in the middle of a
    # channel's chain sends that channel's data up and back down, a GPU at either end
    # once: the chains start at every GPU in turn, so each GPU's port carries
    # 2 (N - 1) / N of the buffer at 370.8 GB/s.
    assert tree.fabric_s == pytest.approx(max(GiB / 8 / 50e9, 2 * 7 / 8 * GiB / 370.8e9),
                                          rel=1e-6)


def test_small_messages_are_latency_on_h100():
    choice = nccl_time(loads_cluster(h100()), 1024)
    assert 10e-6 <= choice.time_s <= 20e-6
    assert choice.protocol == "LL"


def test_published_single_box_figures_within_15_percent():
    # nccl-tests issue 212 (NVIDIA's answer): ~480 GB/s busbw with NVLS, ~370 as Ring.
    hgx = nccl_model(loads_cluster(h100()))
    assert hgx.choose("allreduce", 8 * GiB).busbw / 1e9 == pytest.approx(480, rel=0.15)
    assert pick(hgx, "allreduce", 8 * GiB, "Ring", "Simple").busbw / 1e9 == pytest.approx(
        370, rel=0.15)
    # DGX A100, 12 NVLinks of 25 GB/s per GPU: 208-230 GB/s (nccl-tests issues 178, 228).
    dgx = nccl_model(loads_cluster("name: a\nboxes: [{name: b, gpus: 8, gpu: A100, fabric: "
                                   "{bandwidth: 300 GB/s}}]\n"))
    busbw = dgx.choose("allreduce", GiB).busbw / 1e9
    assert 208 / 1.15 <= busbw <= 230 * 1.15


def test_reduce_scatter_and_allgather_are_priced():
    model = nccl_model(loads_cluster(rails(4)))
    for collective in ("reduce_scatter", "allgather"):
        choice = model.choose(collective, GiB)
        assert choice.algorithm in ("Ring", "PAT", "NVLS", "CollNetDirect")
        assert choice.time_s > 0 and choice.busbw > 0
    for collective in ("broadcast", "reduce"):  # tuning.cc: rings only
        assert {c.algorithm for c in model.candidates(collective, GiB)} == {"Ring"}
        choice = model.choose(collective, GiB)
        assert choice.busbw == pytest.approx(choice.algbw)  # nccl-tests: busbw = algbw
    with pytest.raises(ValueError, match="unknown collective"):
        model.choose("alltoall", 1024)


# ---- what NCCL does not see ----------------------------------------------------------
def test_rings_follow_rank_order_not_the_fabric():
    base = load_cluster(TOPOLOGIES[0].parent / "ddl_two_switch.yaml")
    text = (TOPOLOGIES[0].parent / "ddl_two_switch.yaml").read_text()
    # Number the hosts across the switches: A, C, B, D.
    boxes = text[text.index("boxes:"):text.index("links:")].splitlines()
    reordered = text.replace("\n".join(boxes), "\n".join([boxes[0], boxes[1], boxes[3],
                                                          boxes[2], boxes[4]]))
    crossed = loads_cluster(reordered)
    assert [b.name for b in crossed.boxes] == ["A", "C", "B", "D"]
    straight = nccl_time(base, GiB)
    zigzag = nccl_time(crossed, GiB)
    assert straight.fabric_bound and zigzag.fabric_bound
    assert straight.bottleneck in ("switch0 -> switch1", "switch1 -> switch0")
    # A ring in rank order crosses the 10 GB/s link once each way; A C B D crosses it
    # twice each way.
    assert zigzag.time_s / straight.time_s == pytest.approx(2.0, rel=0.02)
    assert straight.time_s == pytest.approx(GiB * 1.5 / 10e9, rel=0.01)


def test_oversubscribed_uplinks_slow_nccl_down():
    fast = loads_cluster(rails(4, nic="200 Gbit/s").replace("3.2 Tbit/s", "1.6 Tbit/s"))
    # One leaf for every NIC behind a 100 Gbit/s uplink per leaf: the rings' hops between
    # nodes still go leaf to leaf.
    slow_text = ("name: two-leaves\nswitches: [leaf0, leaf1, spine]\n"
                 "links: [{a: leaf0, b: spine, bandwidth: 100 Gbit/s}, "
                 "{a: leaf1, b: spine, bandwidth: 100 Gbit/s}]\n"
                 "boxes: [{name: 'n{i}', count: 4, gpus: 1, gpu: A100, "
                 "nics: [{switch: 'leaf{i//2}', bandwidth: 200 Gbit/s}]}]\n")
    slow = nccl_time(loads_cluster(slow_text), GiB)
    assert slow.fabric_bound and "spine" in slow.bottleneck
    assert slow.time_s > nccl_model(loads_cluster(slow_text)).choose(
        "allreduce", GiB).tuner_time_s
    assert nccl_time(fast, GiB).time_s > 0


def test_the_slowest_box_sets_every_channel():
    even = ("name: e\nswitches: [s]\nboxes: [{name: 'n{i}', count: 2, gpus: 1, gpu: A100, "
            "nics: [{switch: s, bandwidth: 400 Gbit/s}]}]\n")
    uneven = ("name: u\nswitches: [s]\nboxes: [{name: a, gpus: 1, gpu: A100, nics: "
              "[{switch: s, bandwidth: 400 Gbit/s}]}, {name: b, gpus: 1, gpu: A100, nics: "
              "[{switch: s, bandwidth: 100 Gbit/s}]}]\n")
    model = nccl_model(loads_cluster(uneven))
    # NCCL takes the fewest channels and the slowest speed over the nodes (init.cc).
    assert model.graphs["ring"].bw_inter <= 12.5
    assert nccl_time(loads_cluster(uneven), GiB).time_s > 2 * nccl_time(
        loads_cluster(even), GiB).time_s


def test_sharp_switches_enable_collnet():
    text = ("name: sharp\nswitches: [{name: ib, sharp: true}]\n"
            "boxes: [{name: 'n{i}', count: 4, gpus: 8, gpu: H100, fabric: "
            "{bandwidth: 370.8 GB/s}, nics: [" + ", ".join(
                f"{{switch: ib, bandwidth: 400 Gbit/s, gpus: [{k}]}}" for k in range(8))
            + "]}]\n")
    cluster = loads_cluster(text)
    model = nccl_model(cluster)
    assert model.collnet_support
    names = {c.algorithm for c in model.candidates("allreduce", GiB)}
    assert {"CollNetDirect", "CollNetChain"} <= names
    plain = nccl_model(loads_cluster(text.replace(", sharp: true", "")))
    assert not plain.collnet_support
    assert "CollNetDirect" not in {c.algorithm for c in plain.candidates("allreduce", GiB)}


def test_collnet_runs_simple_only():
    # tuning.cc:338-339 (master 5067397c): "if (a == NCCL_ALGO_COLLNET_DIRECT && p !=
    # NCCL_PROTO_SIMPLE) busBw = 0; // Not used", the same for CollNetChain. Before, the
    # model let CollNetChain/LL win at zero latency: 8 B in 0.0 us, 1 MiB in 9.9 us.
    text = ("name: sharp\nswitches: [{name: ib, sharp: true}]\n"
            "boxes: [{name: 'n{i}', count: 2, gpus: 8, gpu: H100, fabric: "
            "{bandwidth: 370.8 GB/s}, nics: [" + ", ".join(
                f"{{switch: ib, bandwidth: 400 Gbit/s, gpus: [{k}]}}" for k in range(8))
            + "]}]\n")
    model = nccl_model(loads_cluster(text))
    for size in (8, 1 << 20, GiB):
        found = model.candidates("allreduce", size)
        assert {(c.algorithm, c.protocol) for c in found if c.algorithm.startswith("CollNet")} \
            <= {("CollNetDirect", "Simple"), ("CollNetChain", "Simple")}
    assert model.choose("allreduce", 8).time_s > 5e-6
    assert model.choose("allreduce", 1 << 20).time_s > 15e-6


def test_plain_tree_pattern_costs_fifteen_percent():
    # tuning.cc:336: "if (a == NCCL_ALGO_TREE && comm->maxTreePattern ==
    # NCCL_TOPO_PATTERN_TREE) busBw *= .85". On Hopper the search falls back to the plain
    # TREE (search.cc:1214-1217) when the balanced tree's two first GPUs cannot share a NIC
    # (search.cc:614-616): one NIC per GPU. With a NIC per two GPUs, or on Ampere, it
    # keeps the balanced tree.
    own = nccl_model(loads_cluster(rails(4)))
    assert own.max_tree_pattern == "tree"
    shared_nics = ", ".join(f"{{switch: 'rail{k}', bandwidth: 400 Gbit/s, gpus: [{2 * k}, "
                            f"{2 * k + 1}]}}" for k in range(4))
    shared = loads_cluster(rails(4).split("nics: [")[0] + f"nics: [{shared_nics}]}}]\n")
    pair = nccl_model(shared)
    assert pair.max_tree_pattern == "balanced_tree"
    assert nccl_model(loads_cluster(rails(4, gpu="A100", fabric="240 GB/s"))
                      ).max_tree_pattern == "balanced_tree"
    tree = pick(own, "allreduce", GiB, "Tree", "Simple")
    bws, _ = own.tables("allreduce")
    graph = own.graphs["tree"]
    # 4 nodes: bwInter; min(busBw x 0.92, nChannels x perChMaxTreeBw[Hopper][N4] 36.0),
    # x 0.85, x 0.5 (busBw to algbw).
    expected = min(graph.channels * graph.bw_inter * 0.92, graph.channels * 36.0) * 0.85 * 0.5
    assert bws[0][2] == pytest.approx(expected)
    assert tree.algorithm == "Tree"


def test_inter_node_ring_is_a_path_through_the_box():
    # search.cc:602-604 and :1238 (crossNic 2, NCCL_CROSS_NIC's default): between nodes a
    # ring channel enters by one NIC and may leave by another, so it crosses 7 of an H100's
    # 8 ports each way. 8 channels of 48 GB/s need 7 x 48 = 336 <= 370.8 per direction
    # (the model used to charge 8 x 48 = 384 and fall to 45). ncclTopoDupChannels keeps 8
    # (Hopper, < 50 GB/s, > 4 channels: search.cc:1040); connect.cc:460 doubles them to 16
    # and connect.cc:480 does not double again (16 is not < 16).
    model = nccl_model(loads_cluster(rails(2)))
    ring = model.graphs["ring"]
    assert (ring.channels, ring.bw_intra, ring.bw_inter) == (8, 48.0, 48.0)
    assert model.comm_channels == 16
    # In one node a ring is a cycle: every port, both ways, for every channel.
    one = search_ring(box_view(loads_cluster(h100(nvls=False)).boxes[0], 90), inter=False)
    assert one.channels * one.bw_intra <= 370.8


# ---- the bound holds for what the hardware can run --------------------------------------
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_nccl_never_beats_the_bound_on_shipped_topologies(path):
    cluster = load_cluster(path)
    for size in (1 << 10, 1 << 20, 1 << 28):
        for collective in ("allreduce", "reduce_scatter", "allgather"):
            choice = nccl_time(cluster, size, collective)
            assert choice.time_s >= collective_bound(cluster, size, collective) * (1 - 1e-9)


@pytest.mark.parametrize("text", [h100(), rails(2, nvls=True), rails(4, nvls=True)])
def test_nccl_never_beats_the_bound_with_in_switch_reduction(text):
    cluster = loads_cluster(text)
    for choice in nccl_model(cluster).candidates("allreduce", 4 * GiB):
        assert choice.time_s >= collective_bound(cluster, 4 * GiB) * (1 - 1e-9), choice


def test_nccl_links_derate_nvlink_by_the_box_model():
    cluster = loads_cluster(rails(2, fabric="450 GB/s"))
    derated = nccl_links(cluster)
    assert derated.boxes[0].fabric.bandwidth == pytest.approx(370.8e9)
    assert derated.boxes[0].nics == cluster.boxes[0].nics
    already = loads_cluster(h100())
    assert nccl_links(already) is already


def test_one_rank_costs_nothing():
    one = loads_cluster("name: one\nboxes: [{name: b, gpus: 1}]\n")
    assert nccl_time(one, GiB).time_s == 0.0


def test_tables_copy_tuning_cc():
    # Spot checks against NVIDIA/nccl src/graph/tuning.cc (master 5067397c).
    assert T.BASE_LATENCY[T.RING] == (6.6, 14.0, 8.4)
    assert T.HW_LATENCY[T.HW_NET][T.TREE] == (5.0, 8.5, 14.0)
    assert T.HW_LATENCY[T.HW_NVLINK][T.NVLS][T.SIMPLE] == 25.0
    assert T.LL_MAX_BW[2] == (141.0, 45.0, 35.0)
    assert T.NVLS_EFFICIENCY == (0.0, 0.0, 0.85, 0.74)
    assert len(T.TREE_CORRECTION[0]) == 24
    assert math.isclose(T.NVLINK_BW[90], 20.6)


# ---- the example tuner plugin's configuration ------------------------------------------
def _rules(text: str) -> list[list[str]]:
    return [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("name", ["dgx_a100_x4", "ddl_two_switch", "mn1_infiniband"])
def test_tuner_config_follows_the_plugins_format(name):
    from topoplan.interop.nccl_tuner import MAX_BYTES, tuner_config
    cluster = load_cluster(TOPOLOGIES[0].parent / f"{name}.yaml")
    text = tuner_config(cluster)
    rules = _rules(text)
    # plugins/tuner/example/README.md: collective_type,min_bytes,max_bytes,algorithm,
    # protocol,channels,nNodes,nRanks; names as the plugin spells them.
    assert all(len(rule) == 8 for rule in rules)
    model = nccl_model(cluster)
    by_collective: dict[str, list[list[str]]] = {}
    for rule in rules:
        collective, lo, hi, algorithm, protocol, channels, nodes, ranks = rule
        assert collective in ("allreduce", "allgather", "reducescatter")
        assert algorithm in T.TUNER_NAMES and protocol in ("ll", "ll128", "simple")
        assert int(channels) == -1 or 1 <= int(channels) <= T.MAXCHANNELS
        assert (int(nodes), int(ranks)) == (model.nnodes, model.nranks)
        by_collective.setdefault(collective, []).append(rule)
    assert set(by_collective) == {"allreduce", "allgather", "reducescatter"}
    for collective, lines in by_collective.items():
        # Contiguous inclusive ranges from 0 to the plugin's maximum.
        assert int(lines[0][1]) == 0 and int(lines[-1][2]) == MAX_BYTES
        for before, after in zip(lines, lines[1:]):
            assert int(after[1]) == int(before[2]) + 1
            assert int(before[1]) <= int(before[2])


def test_tuner_config_says_where_it_overrides_nccl():
    from topoplan.interop.nccl_tuner import tuner_rules
    # Rank order crosses the slow link twice each way: the model may beat NCCL's pick.
    cluster = load_cluster(TOPOLOGIES[0].parent / "ddl_two_switch.yaml")
    rules = tuner_rules(cluster)
    for rule in rules:
        if rule.overrides:
            assert rule.choice.time_s < rule.nccl.time_s
        lo = max(rule.min_bytes, 1)
        # Every rule is NCCL's own choice or faster on this fabric at its start.
        assert nccl_model(cluster).best(rule.collective, lo).time_s <= nccl_model(
            cluster).choose(rule.collective, lo).time_s * (1 + 1e-9)
    from topoplan.interop.nccl_tuner import tuner_config
    text = tuner_config(cluster)
    overriding = sum(rule.overrides for rule in rules)
    assert text.count("# fabric-aware:") == overriding


def test_the_model_cache_keeps_no_cluster_alive():
    import gc
    import weakref

    from topoplan.analysis.native.clusters import _LINKS
    from topoplan.analysis.native.nccl import _MODELS
    cluster = loads_cluster(rails(2, fabric="450 GB/s"))
    nccl_time(cluster, GiB)
    nccl_links(cluster)
    gone = weakref.ref(cluster)
    # Collected first: a cluster of an earlier test on this worker that only garbage
    # still holds would otherwise leave the caches in the same collection as this one.
    gc.collect()
    before = len(_MODELS), len(_LINKS)
    del cluster
    gc.collect()
    assert gone() is None
    assert (len(_MODELS), len(_LINKS)) == (before[0] - 1, before[1] - 1)


def test_export_nccl_tuner_from_the_cli(tmp_path, capsys):
    import json

    from topoplan.cli import main
    out = tmp_path / "nccl_tuner.conf"
    cluster = str(TOPOLOGIES[0].parent / "ddl_two_switch.yaml")
    assert main(["export", "--format", "nccl-tuner", cluster, "-o", str(out)]) == 0
    assert "rules for 4 ranks on 4 nodes" in capsys.readouterr().out
    text = out.read_text()
    assert _rules(text) and text.startswith("# NCCL example tuner plugin rules")
    assert oct(out.stat().st_mode & 0o777) in ("0o644", "0o664", "0o666")
    assert main(["export", "--format", "nccl-tuner", cluster, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nranks"] == 4 and len(data["lines"]) == data["rules"]
    assert data["lines"] == [",".join(rule) for rule in _rules(text)]
    # A plan is not what NCCL's tuner takes.
    plan = tmp_path / "plan.json"
    assert main(["plan", cluster, "--candidates", "ring", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", "--format", "nccl-tuner", str(plan)]) == 1
    assert "takes a cluster file" in capsys.readouterr().err


# ---- versions -------------------------------------------------------------------------
def test_tables_follow_the_version_asked_for():
    # The default is 2.30 (master 5067397c); each older version differs where its tag
    # says: v2.29.7-1 tuning.cc:198 (Blackwell NVLSTree beyond two nodes 43.8, not 80.0),
    # v2.28.9-1 :179 (Blackwell Ring LL128 two nodes 34.6), v2.27.7-1 :155 (NVLSTree's
    # network latency 14, not 20.9) and no NVLS efficiency.
    assert T.constants().version == T.DEFAULT_VERSION == "2.30"
    assert T.constants("2.30").per_ch_max_nvls_tree_bw[3][2] == 80.0
    assert T.constants("2.29.7").per_ch_max_nvls_tree_bw[3][2] == 43.8
    assert T.constants("v2.28.9-1").per_ch_max_ring_ll128_bw[3][1] == 34.6
    assert T.constants("2.27").hw_latency[T.HW_NET][T.NVLS_TREE][T.SIMPLE] == 14.0
    assert T.constants("2.28").hw_latency[T.HW_NET][T.NVLS_TREE][T.SIMPLE] == 20.9
    with pytest.raises(ValueError, match="2.27, 2.28, 2.29, 2.30"):
        T.constants("2.19")
    text = rails(2, nvls=True)
    new, old = nccl_model(loads_cluster(text)), nccl_model(loads_cluster(text), "2.27")
    assert (new.version, old.version) == ("2.30", "2.27")
    # 2.28 doubled NVLSTree's network bandwidth on two nodes (tuning.cc, "Handle 2 node
    # case of NVLSTree"); 2.27 took min(bwIntra, bwInter).
    assert pick(new, "allreduce", GiB, "NVLSTree", "Simple").tuner_time_s < pick(
        old, "allreduce", GiB, "NVLSTree", "Simple").tuner_time_s


def test_network_plugin_latency_is_paid_on_every_step_between_nodes():
    # tuning.cc:389-391: interLat += graphs[a]->latencyInter, and once more for Simple (the
    # flush). aws-ofi-nccl reports 75 us on p5 (docs/CLUSTER.md): a ring over 4 nodes has
    # 2 (4 - 1) inter-node steps, so LL128 pays 6 x 75 us more and Simple 12 x 75 us more
    # (before the ring's plateau factor, 1.4 on Ampere and later).
    plain = nccl_model(loads_cluster(rails(4)))
    slow = nccl_model(loads_cluster(rails(4).replace("gpus: [", "plugin_latency: 75 us, gpus: [")))
    assert slow.net_latency_us == pytest.approx(75.0)
    _, lat0 = plain.tables("allreduce")
    _, lat1 = slow.tables("allreduce")
    assert lat1[T.RING][T.LL128] - lat0[T.RING][T.LL128] == pytest.approx(6 * 75)
    assert lat1[T.RING][T.SIMPLE] - lat0[T.RING][T.SIMPLE] == pytest.approx(12 * 75)
    # Tree: 2 log2(nodes) inter-node steps.
    assert lat1[T.TREE][T.LL] - lat0[T.TREE][T.LL] == pytest.approx(2 * 2 * 75)
    # One node has no step between nodes.
    one = nccl_model(loads_cluster(h100()))
    assert one.net_latency_us == 0.0
