"""Every baseline planner through the verifier, plus hand-checked structure.

Clusters are small YAML strings written here (single switch, boxes with a fabric,
NVLink-only boxes, mixed box sizes, two switches, leaf-spine); every planner x
every one of them x 1..17 ranks must verify. Failures name the planner, the
cluster and the rank count.
"""

from __future__ import annotations

import math

import pytest

from tests.support.cluster_shapes import CLUSTERS, cluster, single_switch
from tests.support.clusters import SHIPPED, load_topology
from topoplan.cluster import Cluster, loads_cluster
from topoplan.errors import ScheduleError, TopoplanError
from topoplan.planners import PLANNERS, PlannerError, plan, topo_order
from topoplan.planners.hierarchical import hierarchy
from topoplan.planners.tree import double_btree
from topoplan.ir.schedule import OpKind, Schedule
from topoplan.ir.verify import verify

BASELINES = ("ring", "ring-topo", "tree", "rhd", "hierarchical")
MiB = 1 << 20


def checked(schedule: Schedule, planner: str, where: str) -> Schedule:
    """verify() with the planner and the cluster named in the failure."""
    try:
        verify(schedule)
    except ScheduleError as exc:
        pytest.fail(f"planner {planner} on {where}: {exc}")
    return schedule


# --------------------------------------------------------------------------------------
# Every planner x every cluster kind x 1..17 ranks verifies
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(CLUSTERS))
@pytest.mark.parametrize("planner", BASELINES)
def test_every_planner_verifies_on_1_to_17_ranks(planner: str, kind: str) -> None:
    for n in range(1, 18):
        c = cluster(kind, n)
        assert c.nranks == n
        where = f"{kind} with {n} ranks"
        s = checked(plan(c, planner, size=MiB), planner, where)
        assert s.nranks == n, where
        assert s.meta["algorithm"] == planner, where
        assert s.meta["cluster"] == c.name, where
        if n == 1:
            assert s.nsteps == 0 and s.nops == 0, where


@pytest.mark.parametrize("planner", BASELINES)
@pytest.mark.parametrize("chunks", [2, 3])
def test_pipelined_plans_verify(planner: str, chunks: int) -> None:
    for kind in ("two-switch", "mixed", "nvlink-box"):
        for n in (1, 2, 5, 8, 11):
            c = cluster(kind, n)
            s = checked(plan(c, planner, size=256 * MiB, chunks=chunks), planner,
                        f"{kind} with {n} ranks, chunks={chunks}")
            if n > 1 and planner != "hierarchical":
                assert s.nchunks % chunks == 0


@pytest.mark.parametrize("planner", BASELINES)
def test_shipped_topologies_verify(planner: str) -> None:
    # Only the small shipped files: the 1024-rank one is for scripts/bench_planners.py.
    for name in SHIPPED:
        c = load_topology(name)
        if c.nranks > 256:
            continue
        checked(plan(c, planner, size=MiB), planner, f"{name}.yaml")


# --------------------------------------------------------------------------------------
# Ring
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 7, 16])
def test_ring_structure_by_hand(n: int) -> None:
    c = single_switch(n)
    s = plan(loads_cluster(c), "ring", size=MiB)
    assert s.nchunks == n
    for r in range(n):
        steps = s.steps_of(r)
        assert len(steps) == 2 * (n - 1), f"ring rank {r}: {len(steps)} steps"
        for i, step in enumerate(steps):
            kinds = sorted((op.kind.value, op.peer) for op in step)
            assert kinds == [("recv", (r - 1) % n), ("send", (r + 1) % n)], \
                f"ring rank {r} step {i}: {kinds}"
            recv = next(op for op in step if op.kind is OpKind.RECV)
            assert recv.reduce == (i < n - 1), f"ring rank {r} step {i}"


def _crossings(c: Cluster, ring: list[int], a: str, b: str) -> int:
    """Ring hops whose route uses the switch link a->b."""
    hops = 0
    for i, r in enumerate(ring):
        nxt = ring[(i + 1) % len(ring)]
        path = c.routes(r, nxt)[0]
        hops += any(u == a and v == b for u, v in zip(path, path[1:]))
    return hops


def test_ddl_two_switch_ring_topo_is_abcd() -> None:
    c = load_topology("ddl_two_switch")
    ring = plan(c, "ring-topo", size=256 * MiB).meta["ring"]
    names = "".join(c.box_of(r).name for r in ring)
    good = {"ABCD"[i:] + "ABCD"[:i] for i in range(4)}
    good |= {g[::-1] for g in good}
    assert names in good, f"ring-topo on ddl_two_switch gave {names}, not a rotation of ABCD"
    # ... which crosses the narrow link once per direction; A->C->B->D crosses it twice.
    assert _crossings(c, ring, "switch0", "switch1") == 1
    assert _crossings(c, [0, 2, 1, 3], "switch0", "switch1") == 2
    bad = plan(c, "ring", size=MiB, order=[0, 2, 1, 3])
    checked(bad, "ring", "ddl_two_switch with order A C B D")
    assert bad.meta["ring"] == [0, 2, 1, 3]


@pytest.mark.parametrize("n", [4, 6, 9, 14])
def test_ring_topo_crosses_the_narrow_cut_once_per_direction(n: int) -> None:
    c = cluster("two-switch", n)
    topo = plan(c, "ring-topo", size=MiB).meta["ring"]
    assert _crossings(c, topo, "s0", "s1") == 1
    assert _crossings(c, topo, "s1", "s0") == 1
    if n >= 8:  # rank order zig-zags between the switches at every box
        assert _crossings(c, list(range(n)), "s0", "s1") == n // 4


def test_ring_topo_uses_widest_nvlinks_in_a_dgx1_like_box() -> None:
    links = [(0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2),
             (2, 3, 2), (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2),
             (5, 7, 1), (6, 7, 2)]
    yaml = "name: cube\nboxes:\n  - {name: dgx, gpus: 8, gpu_links: [" + ", ".join(
        f"{{a: {a}, b: {b}, bandwidth: 25 GB/s, count: {k}}}" for a, b, k in links) + "]}\n"
    c = loads_cluster(yaml)
    ring = plan(c, "ring-topo", size=MiB).meta["ring"]
    width = {(a, b): k for a, b, k in links} | {(b, a): k for a, b, k in links}
    hops = [(ring[i], ring[(i + 1) % 8]) for i in range(8)]
    assert all(width.get(h) == 2 for h in hops), f"ring {ring} uses a single NVLink: {hops}"


def _rail_cluster(boxes: int, gpus: int) -> Cluster:
    from topoplan.cluster.generate import rail_optimized
    return loads_cluster(rail_optimized(boxes, gpus), f"<rail {boxes} x {gpus}>")


def _box_hops(c: Cluster, ring: list[int]) -> list[tuple[int, int]]:
    """(local GPU left, local GPU entered) of every hop between boxes of ``ring``."""
    local = [r - c.box_of(r).first_rank for r in ring]
    return [(local[i], local[(i + 1) % len(ring)]) for i in range(len(ring))
            if c.box_of(ring[i]) is not c.box_of(ring[(i + 1) % len(ring)])]


def test_ring_topo_follows_the_rails_of_a_4_x_8_h100_rail_cluster() -> None:
    """GPU j of every box on rail j, spines above: ring crosses between boxes as gpu7 ->
    rail 7 -> spine -> rail 0 -> gpu0, on two of a box's eight NICs; ring-topo runs a
    ring per rail (as NCCL's channels), each crossing between boxes on its own rail."""
    from topoplan.analysis.sim import simulate

    c = _rail_cluster(4, 8)
    size = 64 * MiB
    ring = plan(c, "ring", size=size)
    topo = checked(plan(c, "ring-topo", size=size), "ring-topo", "rail 4 x 8")
    assert topo.meta["order"] == "rails" and len(topo.meta["rings"]) == 8
    for each in topo.meta["rings"]:
        assert sorted(each) == list(range(32))
        assert all(a == b for a, b in _box_hops(c, each)), _box_hops(c, each)
    # Every NIC carries one ring's hop each way between boxes.
    assert sorted(a for each in topo.meta["rings"] for a, _ in _box_hops(c, each)) == \
        sorted(list(range(8)) * 4)
    assert _box_hops(c, ring.meta["ring"]) == [(7, 0)] * 4
    x_ring = simulate(c, ring, size).efficiency ** -1
    x_topo = simulate(c, topo, size).efficiency ** -1
    # Measured: ring 12.5x the bound, ring-topo 4.1x (equal to ring before the rails).
    assert x_ring > 12 and x_topo < 4.5, (x_ring, x_topo)


@pytest.mark.parametrize("boxes, gpus", [(2, 2), (3, 2), (3, 4), (5, 4), (9, 8)])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_rail_rings_verify_on_every_shape(boxes: int, gpus: int, collective: str) -> None:
    c = _rail_cluster(boxes, gpus)
    s = checked(plan(c, "ring-topo", size=MiB, collective=collective), "ring-topo",
                f"rail {boxes} x {gpus}, {collective}")
    assert len(s.meta["rings"]) == gpus and s.nchunks == boxes * gpus * gpus
    crossing = [h for each in s.meta["rings"] for h in _box_hops(c, each) if h[0] != h[1]]
    # Only 2 GPUs and an odd number of boxes leave no shifts that close every ring on
    # its rail: there the closing hop changes rails.
    assert len(crossing) == (gpus if gpus == 2 and boxes % 2 else 0)
    two = checked(plan(c, "ring-topo", size=MiB, collective=collective, chunks=2),
                  "ring-topo", f"rail {boxes} x {gpus}, {collective}, chunks=2")
    assert two.nchunks == 2 * s.nchunks


def test_rail_rings_fit_the_caps() -> None:
    c = _rail_cluster(4, 8)
    fewer = checked(plan(c, "ring-topo", size=MiB, max_step_ops=6), "ring-topo", "caps")
    assert len(fewer.meta["rings"]) == 3 and fewer.max_step_ops <= 6
    one = checked(plan(c, "ring-topo", size=MiB, max_chunks=40), "ring-topo", "caps")
    assert one.meta["order"] == "topo" and "rings" not in one.meta and one.nchunks == 32


def test_topo_order_groups_boxes_under_their_leaf() -> None:
    c = cluster("leaf-spine", 12)
    order = topo_order(c)
    leaves = [c.box_of(r).nics[0].switch for r in order]
    # Each leaf's boxes are contiguous in the ring order.
    changes = sum(1 for i in range(1, len(leaves)) if leaves[i] != leaves[i - 1])
    assert changes == 2, leaves


# --------------------------------------------------------------------------------------
# Tree
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(2, 40))
def test_double_binary_tree_is_two_complementary_trees(n: int) -> None:
    first, second = double_btree(n)
    for name, parent in (("first", first), ("second", second)):
        assert parent.count(-1) == 1, f"{name} tree of {n}: {parent.count(-1)} roots"
        for v in range(n):  # every node reaches the root: no cycles
            seen, u = set(), v
            while parent[u] != -1:
                assert u not in seen, f"{name} tree of {n}: cycle through {u}"
                seen.add(u)
                u = parent[u]
        kids = [sum(1 for p in parent if p == v) for v in range(n)]
        assert max(kids) <= 2, f"{name} tree of {n}: a node with {max(kids)} children"
    interior = [{p for p in tree if p >= 0} for tree in (first, second)]
    both = interior[0] & interior[1]
    # NCCL's property: a rank is interior in at most one tree (one exception when n is odd).
    assert len(both) <= (n % 2), f"n={n}: ranks {sorted(both)} are interior in both trees"


def test_tree_on_boxes_is_nccl_shaped() -> None:
    """Several boxes: trees over boxes, chains inside; only box heads talk across boxes."""
    c = cluster("fabric4", 16)
    s = checked(plan(c, "tree", size=MiB), "tree", "fabric4 16")
    assert s.meta["shape"] == "box trees + in-box chains"
    heads = {box.first_rank for box in c.boxes} | {box.first_rank + box.gpus - 1
                                                   for box in c.boxes}
    for rank, step, op in s.ops():
        if c.box_index(op.peer) != c.box_index(rank):
            assert rank in heads and op.peer in heads, \
                f"tree rank {rank} step {step} talks across boxes to {op.peer}"
        else:
            assert abs(c.local_index(op.peer) - c.local_index(rank)) == 1, \
                f"tree rank {rank} step {step}: in-box peer {op.peer} is not a chain neighbour"
    flat = checked(plan(c, "tree", size=MiB, order="rank"), "tree", "fabric4 16, rank order")
    assert flat.meta["shape"] == "rank trees"


def test_tree_pipeline_grows_with_size() -> None:
    c = cluster("two-switch", 16)
    small = plan(c, "tree", size=1 << 10).meta["pipeline"]
    big = plan(c, "tree", size=1 << 30).meta["pipeline"]
    assert 1 <= small < big
    s = checked(plan(c, "tree", size=MiB, chunks=5), "tree", "two-switch 16, chunks=5")
    assert s.nchunks == 10


# --------------------------------------------------------------------------------------
# Recursive halving-doubling
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_rhd_power_of_two_takes_log2_steps_per_phase(n: int) -> None:
    s = plan(cluster("single-switch", n), "rhd", size=MiB, order="rank")
    levels = int(math.log2(n))
    for r in range(n):
        steps = s.steps_of(r)
        assert len(steps) == 2 * levels, f"rhd rank {r}: {len(steps)} steps"
        for i, step in enumerate(steps):
            peers = {op.peer for op in step}
            distance = 1 << (i if i < levels else 2 * levels - 1 - i)
            assert peers == {r ^ distance}, f"rhd rank {r} step {i}: peers {peers}"
            sent = sum(op.count for op in step if op.kind is OpKind.SEND)
            # Halving sends n/2, n/4, ... chunks; doubling sends 1, 2, ... back.
            expect = n >> (i + 1) if i < levels else 1 << (i - levels)
            assert sent == expect, f"rhd rank {r} step {i}: sent {sent} chunks"


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_rhd_folds_extra_ranks(n: int) -> None:
    s = checked(plan(cluster("single-switch", n), "rhd", size=MiB), "rhd", f"{n} ranks")
    p = 1 << (n.bit_length() - 1)
    assert s.meta["power_of_two"] == p
    assert len(s.meta["folded"]) == n - p
    for extra, partner in s.meta["folded"]:
        steps = s.steps_of(extra)
        assert len(steps) == 2 and {op.peer for st in steps for op in st} == {partner}


# --------------------------------------------------------------------------------------
# Hierarchical
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [8, 12, 16])
def test_hierarchical_first_and_last_phase_stay_in_the_box(n: int) -> None:
    c = cluster("fabric4", n)
    s = plan(c, "hierarchical", size=MiB)
    g = 4
    for r in range(n):
        steps = s.steps_of(r)
        box = c.box_index(r)
        for i in list(range(g - 1)) + list(range(len(steps) - (g - 1), len(steps))):
            peers = {op.peer for op in steps[i]}
            assert all(c.box_index(p) == box for p in peers), \
                f"hierarchical rank {r} step {i} talks to {peers} outside box {box}"
        cross = {op.peer for st in steps for op in st if c.box_index(op.peer) != box}
        assert all(c.local_index(p) == c.local_index(r) for p in cross), \
            f"hierarchical rank {r} (local {c.local_index(r)}) talks across boxes to {cross}"
    assert [lvl["level"] for lvl in s.meta["levels"]] == ["box", "switch"]


def test_hierarchical_three_levels_on_leaf_spine_boxes() -> None:
    yaml = ("name: ls\nswitches:\n  - {name: 'leaf{i}', count: 2}\n  - {name: spine}\n"
            "boxes:\n  - {name: 'n{i}', count: 6, gpus: 2, fabric: {bandwidth: 100 GB/s},\n"
            "     nics: [{switch: 'leaf{i//3}', bandwidth: 100 Gbit/s}]}\n"
            "links:\n  - {a: 'leaf{i}', b: spine, count: 2, bandwidth: 50 GB/s}\n")
    c = loads_cluster(yaml)
    s = checked(plan(c, "hierarchical", size=MiB, chunks=1), "hierarchical", "leaf-spine boxes")
    assert [(lvl["level"], lvl["sizes"]) for lvl in s.meta["levels"]] == \
        [("box", [2]), ("switch", [3]), ("switch^2", [2])]
    assert s.nchunks == 12  # 2 x 3 x 2 pieces
    # Bigger messages pipeline: parts multiply the chunks and still verify.
    big = checked(plan(c, "hierarchical", size=1 << 30), "hierarchical", "leaf-spine 1 GiB")
    assert big.meta["pipeline"] > 1 and big.nchunks == 12 * big.meta["pipeline"]
    tree, depth, _ = hierarchy(c)
    assert depth == 3 and tree[0][0] == [0, 1]


def test_hierarchical_mixed_boxes_says_how_it_coped() -> None:
    c = cluster("mixed", 12)  # boxes of 3, 1, 2, ...
    s = checked(plan(c, "hierarchical", size=MiB), "hierarchical", "mixed 12")
    box = s.meta["levels"][0]
    assert box["sizes"] == [1, 2, 3] and box["pieces"] == 6 and "note" in box


# --------------------------------------------------------------------------------------
# Facade and errors
# --------------------------------------------------------------------------------------

def test_unknown_algorithm_names_the_known_ones() -> None:
    c = cluster("single-switch", 4)
    with pytest.raises(PlannerError, match=r"unknown planner 'rign' \(did you mean 'ring'\?\); "
                                           r"known: auto, .*ring-topo"):
        plan(c, "rign")
    assert issubclass(PlannerError, TopoplanError)


@pytest.mark.parametrize("bad, message", [
    ({"chunks": 0}, "chunks"),
    ({"size": -1}, "size must be a positive"),
    ({"order": [0, 1, 1, 3]}, "each of the 4 ranks once"),
    ({"order": "random"}, "order must be"),
    ({"colour": "red"}, "takes no option 'colour'"),
])
def test_bad_options_are_planner_errors(bad: dict, message: str) -> None:
    c = cluster("single-switch", 4)
    kwargs = {"size": MiB, **bad}
    with pytest.raises(PlannerError, match=message):
        plan(c, "ring", **kwargs)


@pytest.mark.parametrize("size", [0, -5, float("nan"), "0 KiB", True])
def test_every_planner_checks_the_size_the_same_way(size: object) -> None:
    c = cluster("single-switch", 4)
    for name, planner in PLANNERS.items():
        for call in (lambda: plan(c, name, size=size), lambda: planner(c, size=size)):
            with pytest.raises(PlannerError,
                               match=f"^{name}: size must be a positive number of bytes, got "):
                call()


def test_every_planner_reads_a_size_string_as_the_cli_does() -> None:
    c = cluster("single-switch", 4)
    for name, planner in PLANNERS.items():
        assert planner(c, size="1MiB") == planner(c, size=MiB), name
        for call in (lambda: plan(c, name, size="12 parsecs"),
                     lambda: planner(c, size="12 parsecs")):
            with pytest.raises(PlannerError, match=f"^{name}: size: unknown unit 'parsecs'"):
                call()


def test_auto_refuses_an_option_no_candidate_takes() -> None:
    c = cluster("single-switch", 4)
    with pytest.raises(PlannerError, match="planner 'auto' takes no option 'ordr' "
                                           r"\(did you mean 'order'\?\)"):
        plan(c, "auto", size=MiB, ordr="topo")


def test_planner_error_is_exported() -> None:
    import topoplan
    import topoplan.errors
    import topoplan.planners

    assert topoplan.PlannerError is topoplan.errors.PlannerError is topoplan.planners.PlannerError
    assert issubclass(topoplan.PlannerError, (topoplan.TopoplanError, ValueError))


def test_registry_is_open() -> None:
    from topoplan.planners import register
    from topoplan.planners.ring import plan_ring

    def plan_mine(cluster, *, size, chunks=None):
        return plan_ring(cluster, size=size, chunks=chunks, algorithm="mine")

    register("mine", plan_mine)
    try:
        s = plan(cluster("single-switch", 3), "mine", size=MiB)
        assert s.algorithm == "mine"
    finally:
        del PLANNERS["mine"]


# --------------------------------------------------------------------------------------
# Against the simulator and the lower bound
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["single-switch", "two-switch", "fabric4", "nvlink-box"])
def test_simulated_time_is_never_below_the_lower_bound(kind: str) -> None:
    """No planner beats the allreduce bound (valid for every schedule; uneven clusters
    in tests/test_bound.py). The RS+AG cut bound is for reduce-scatter + allgather only:
    see test_pre_reducing_planners_beat_the_rs_ag_bound_on_an_uneven_cut."""
    from topoplan.analysis.sim import simulate
    for n in (2, 4, 8, 12):
        c = cluster(kind, n)
        for planner in BASELINES:
            for size in (64 << 10, 64 * MiB):
                report = simulate(c, plan(c, planner, size=size), size=size, profile="ideal")
                assert report.time_s >= report.lower_bound_s * (1 - 1e-9), \
                    f"{planner} on {kind} with {n} ranks, {size} B: simulated " \
                    f"{report.time_s} s < lower bound {report.lower_bound_s} s"


def test_pre_reducing_planners_beat_the_rs_ag_bound_on_an_uneven_cut() -> None:
    """2 GPUs | 1 GPU over a 10 GB/s link: the RS+AG bound charges 2 * (2/3) M across
    it; reduce + broadcast needs only M each way, which is the allreduce bound."""
    from topoplan.analysis.bound import rsag_bound
    from topoplan.analysis.sim import simulate
    c = cluster("two-switch", 3)
    size = 64 * MiB
    for planner in ("tree", "rhd"):
        report = simulate(c, plan(c, planner, size=size), size=size, profile="ideal")
        assert report.lower_bound_s == pytest.approx(size / 10e9, rel=1e-12)
        assert report.lower_bound_s <= report.time_s < rsag_bound(c, size), planner


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_on_one_switch_matches_the_hand_computed_time(n: int) -> None:
    """2(n-1) steps of (path latency + (M/n) / B): Patarasuk and Yuan's bound plus latency."""
    from topoplan.analysis.sim import simulate
    c = cluster("single-switch", n)
    size = 64 * MiB
    report = simulate(c, plan(c, "ring", size=size), size=size, profile="ideal")
    path = c.routes(0, 1)[0]
    latency = sum(c.graph[u][v]["latency"] for u, v in zip(path, path[1:]))
    bandwidth = 100e9 / 8
    expected = 2 * (n - 1) * (latency + size / n / bandwidth)
    assert report.time_s == pytest.approx(expected, rel=1e-9)
    assert report.lower_bound_s == pytest.approx(2 * (n - 1) / n * size / bandwidth, rel=1e-9)


def test_ddl_good_ring_order_beats_the_bad_one_by_two() -> None:
    """DDL's example: A->B->C->D sends M/4 per step over the 10 GB/s link once per
    direction; A->C->B->D twice, so its 6 steps take twice as long."""
    from topoplan.analysis.sim import simulate
    c = load_topology("ddl_two_switch")
    size = 256 * MiB
    good = simulate(c, plan(c, "ring-topo", size=size), size=size, profile="ideal")
    bad = simulate(c, plan(c, "ring", size=size, order=[0, 2, 1, 3]), size=size, profile="ideal")
    narrow = 10e9
    assert good.time_s == pytest.approx(6 * (size / 4) / narrow, rel=2e-3)
    assert bad.time_s == pytest.approx(6 * 2 * (size / 4) / narrow, rel=2e-3)
    assert good.time_s / good.lower_bound_s == pytest.approx(1.5, rel=2e-3)
