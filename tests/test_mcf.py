"""The mcf planner: LP optimum on hand-solved cases, verified schedules, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.support.clusters import SHIPPED, load_topology, topology_text
from topoplan.cluster import loads_cluster
from topoplan.errors import InfeasiblePlanError
from topoplan.analysis.bound import latency_bound, lower_bound, rsag_bound
from topoplan.planners import PLANNERS, plan
from topoplan.planners.mcf import plan_mcf, solve_mcf
from topoplan.analysis.sim import simulate
from topoplan.ir.verify import verify

M = 256 << 20


def _switch(n: int, bw: float = 10.0) -> str:
    return f"""
name: star{n}
switches: [sw]
boxes:
  - {{name: "b{{i}}", count: {n}, gpus: 1, nics: [{{switch: sw, bandwidth: {bw}}}]}}
"""


def test_ddl_two_switch_reaches_the_cut_bound_exactly():
    # Hand-solved: the 10 GB/s switch link is the cut {A,B}|{C,D}; the bound is
    # 2 (M/4) * 2 / 10 GB/s = M / 10 GB/s, and one tree crossing it once meets it.
    cluster = load_topology("ddl_two_switch")
    sol = solve_mcf(cluster)
    assert sol.t * M == pytest.approx(M / 10e9, rel=1e-6)
    assert "switch0->switch1" in sol.bottleneck
    schedule = plan_mcf(cluster, size=M)
    verify(schedule)
    assert schedule.meta["algorithm"] == "mcf"


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_single_switch_matches_the_ring_bound(n):
    # 2 (n-1)/n * M / B on a homogeneous star (Patarasuk and Yuan).
    sol = solve_mcf(loads_cluster(_switch(n)))
    assert sol.t * M == pytest.approx(2 * (n - 1) / n * M / 10e9, rel=1e-6)


def test_dgx1_hybrid_cube_mesh_algbw_is_85_7():
    # Nash-Williams: 600 GB/s of NVLink over 7 = 85.7 GB/s; the LP finds it by MST pricing.
    sol = solve_mcf(load_topology("dgx1_v100"), exact=False)
    assert 1e-9 / sol.t == pytest.approx(600 / 7, rel=1e-6)
    schedule = plan_mcf(load_topology("dgx1_v100"), size=M, chunks=64)
    verify(schedule)


def test_exact_mode_keeps_the_optimum_with_fewer_or_equal_trees():
    cluster = load_topology("dgx1_v100")
    lp = solve_mcf(cluster, exact=False)
    ex = solve_mcf(cluster, exact=True)
    assert ex.t == pytest.approx(lp.t, rel=1e-5)
    assert len(ex.trees) <= len(lp.trees)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_hierarchical_mode_composes_box_and_network_levels():
    text = """
name: rails
switches: [{name: "rail{i}", count: 4}]
boxes:
  - name: "n{i}"
    count: 6
    gpus: 4
    fabric: {bandwidth: 200}
    nics:
      - {switch: rail0, bandwidth: 25, gpus: [0]}
      - {switch: rail1, bandwidth: 25, gpus: [1]}
      - {switch: rail2, bandwidth: 25, gpus: [2]}
      - {switch: rail3, bandwidth: 25, gpus: [3]}
"""
    cluster = loads_cluster(text)
    flat = solve_mcf(cluster, flat_seconds=120)  # converge, whatever the machine's load
    hier = solve_mcf(cluster, flat_max=8)
    assert hier.mode == "hierarchical"
    # Box cut: 2 (M/24) * 20 / 100 GB/s; the collapsed LP loses at most its 3% slack.
    bound = 2 * M / 24 * 20 / 100e9
    assert flat.t * M == pytest.approx(bound, rel=1e-5)
    assert bound <= hier.t * M <= 1.03 * bound * (1 + 1e-6)
    schedule = plan_mcf(cluster, size=M)
    verify(schedule)
    assert schedule.meta["construction"].startswith("grid")


def test_single_gpu_is_an_empty_schedule():
    schedule = plan_mcf(loads_cluster("name: one\nboxes: [{name: a, gpus: 1}]\n"), size=M)
    assert schedule.nranks == 1 and schedule.nops == 0
    verify(schedule)


def test_bad_size_is_a_clear_error():
    from topoplan.errors import PlannerError

    with pytest.raises(PlannerError, match="mcf: size must be a positive number of bytes, got 0"):
        plan_mcf(loads_cluster(_switch(2)), size=0)


def test_a_misspelled_option_names_the_option_and_the_valid_ones():
    from topoplan.errors import PlannerError
    from topoplan.planners import plan

    with pytest.raises(PlannerError, match="planner 'mcf' takes no option 'tim_limit' "
                                           r"\(did you mean 'time_limit'\?\); its options: "
                                           ".*time_limit"):
        plan(loads_cluster(_switch(2)), "mcf", size=M, tim_limit=1.0)
    with pytest.raises(TypeError, match="tim_limit"):  # called directly: Python's own check
        plan_mcf(loads_cluster(_switch(2)), size=M, tim_limit=1.0)


def test_gpu_without_any_route_names_the_cut():
    # GPU 1 of box a has no NIC and no link to a GPU that has one: nothing leaves it.
    text = """
name: cut
switches: [sw]
boxes:
  - name: a
    gpus: 2
    fabric: {bandwidth: 100}
    nics: [{switch: sw, bandwidth: 10, gpus: [0]}]
  - {name: b, gpus: 1, nics: [{switch: sw, bandwidth: 10}]}
"""
    schedule = plan_mcf(loads_cluster(text), size=M)  # routes hop to GPU 0: fine
    verify(schedule)


@st.composite
def _random_cluster(draw):
    nsw = draw(st.integers(1, 3))
    lines = ["name: rnd", "switches:"] + [f"  - s{k}" for k in range(nsw)]
    lines.append("boxes:")
    nboxes = draw(st.integers(1, 4))
    for b in range(nboxes):
        g = draw(st.integers(1, 4))
        fab = draw(st.sampled_from([None, 50, 300]))
        box = f"  - name: b{b}\n    gpus: {g}\n"
        if g > 1 and (fab or draw(st.booleans())):
            box += f"    fabric: {{bandwidth: {fab or 100}}}\n"
        elif g > 1:
            links = ", ".join(f"{{a: {j}, b: {j + 1}, bandwidth: 40}}" for j in range(g - 1))
            box += f"    gpu_links: [{links}]\n"
        nics = []
        for k in range(draw(st.integers(1, 2))):
            sw = draw(st.integers(0, nsw - 1))
            bw = draw(st.sampled_from([5, 12.5, 25]))
            served = sorted(set(draw(st.lists(st.integers(0, g - 1), min_size=1, max_size=g))))
            nics.append(f"{{switch: s{sw}, bandwidth: {bw}, gpus: {served}}}")
        box += f"    nics: [{', '.join(nics)}]\n"
        lines.append(box.rstrip("\n"))
    if nsw > 1:
        lines.append("links:")
        for k in range(1, nsw):  # a chain of switches, maybe oversubscribed
            bw = draw(st.sampled_from([2, 10, 100]))
            lines.append(f"  - {{a: s{k - 1}, b: s{k}, bandwidth: {bw}}}")
    return "\n".join(lines) + "\n"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_cluster())
def test_random_clusters_verify_and_respect_the_cut_bound(text):
    cluster = loads_cluster(text)
    sol = solve_mcf(cluster)
    # The LP is a valid plan, so it can never beat the cut bound; check the cut of
    # every single GPU (its out- and in-bandwidth).
    n = cluster.nranks
    if n > 1:
        for r in range(n):
            node = cluster.gpu_node(r)
            out_bw = sum(d["bandwidth"] for _, _, d in cluster.graph.out_edges(node, data=True))
            # one GPU must receive every other contribution once: (n-1)/n M in (at least)
            assert sol.t * M >= (n - 1) / n * M / out_bw * (1 - 1e-6)
    schedule = plan_mcf(cluster, size=M)
    verify(schedule)
    assert np.isclose(sum(schedule.chunks), 1.0)
    if 1 < n <= 8:
        size = 64 << 20
        schedule = plan_mcf(cluster, size=size)
        got = simulate(cluster, schedule, size, profile="ideal")
        if schedule.meta["construction"].startswith("grid"):  # reduce-scatter + allgather
            assert got.time_s >= got.lower_bound_s * (1 - 1e-9)
        else:
            # Reduce + broadcast trees are not RS + AG: across a cut holding most GPUs
            # they send M (one partial sum) where RS + AG sends 2 (M/N) |S|. Any
            # allreduce still moves M across every cut: at least half the RS + AG bound.
            assert got.time_s >= 0.5 * got.lower_bound_s * (1 - 1e-9)
        ring = simulate(cluster, plan(cluster, "ring", size=size), size, profile="ideal")
        assert got.time_s <= ring.time_s * (1 + 1e-9)


# --------------------------------------------------------------------------------------
# The planner as shipped: simulated against the bound and the baselines
# --------------------------------------------------------------------------------------

SMALL = [name for name in SHIPPED
         if name not in ("leaf_spine_1024", "ddl_three_racks")]  # big: in the bench


@pytest.mark.parametrize("name", SMALL)
def test_shipped_topologies_verify_and_never_beat_the_bound(name):
    cluster = load_topology(name)
    schedule = plan_mcf(cluster, size=M, max_ops=60_000)  # check=True: verified inside
    assert schedule.meta["algorithm"] == "mcf"
    assert schedule.meta["construction"] in schedule.meta["candidates"]
    if schedule.nops <= 60_000:
        got = simulate(cluster, schedule, M, profile="ideal")
        assert got.time_s >= got.lower_bound_s * (1 - 1e-9)


@pytest.mark.parametrize("name,within", [("ddl_two_switch", 1.01), ("dgx1_v100", 1.01),
                                         ("aws_p2_8xlarge", 1.03)])
def test_hand_solved_cases_reach_the_bound_in_simulation(name, within):
    # ddl_two_switch: the 10 GB/s link, M / 10 GB/s; crossing it once per shard needs the
    # switch-level reduce-scatter first. dgx1_v100: 7 GPUs behind 150 GB/s, met by
    # LP-weighted Hamiltonian rings (3 disjoint cycles both ways reach it exactly).
    # aws_p2_8xlarge: board pairs then the 8 GB/s PCIe fabric among the 4 boards.
    # mcf reduce-scatters then allgathers, so the bound it reaches is the RS+AG one (on
    # aws_p2_8xlarge 1.29x the allreduce bound, which every schedule respects).
    cluster = load_topology(name)
    size = 1 << 30
    got = simulate(cluster, plan_mcf(cluster, size=size), size, profile="ideal")
    assert got.lower_bound_s <= got.time_s <= within * rsag_bound(cluster, size)


def test_ddl_two_switch_bound_by_hand():
    cluster = load_topology("ddl_two_switch")
    assert lower_bound(cluster, M) == pytest.approx(M / 10e9, rel=1e-9)
    got = simulate(cluster, plan_mcf(cluster, size=M), M, profile="ideal")
    assert got.time_s == pytest.approx(M / 10e9, rel=0.01)


def test_dgx1_rings_carry_85_7_GBps():
    from topoplan.planners.mcf.rings import box_rings
    cluster = load_topology("dgx1_v100")
    rings, w = box_rings(cluster, cluster.boxes[0])
    # Ring allreduce time at unit bandwidth: each ring link carries its share; the LP
    # value is 600/7 GB/s of algorithm bandwidth when every NVLink is saturated.
    schedule = plan_mcf(cluster, size=1 << 30)
    got = simulate(cluster, schedule, 1 << 30, profile="ideal")
    assert (1 << 30) / got.time_s / 1e9 == pytest.approx(600 / 7, rel=0.01)
    assert len(rings) >= 6 and w.sum() == pytest.approx(1.0)


def test_mcf_is_registered_and_never_slower_than_ring_on_rails():
    text = """
name: rails
switches: [{name: "rail{i}", count: 4}, spine]
links:
  - {a: "rail{i}", b: spine, count: 4, bandwidth: 100}
boxes:
  - name: "n{i}"
    count: 4
    gpus: 4
    fabric: {bandwidth: 200}
    nics:
      - {switch: rail0, bandwidth: 25, gpus: [0]}
      - {switch: rail1, bandwidth: 25, gpus: [1]}
      - {switch: rail2, bandwidth: 25, gpus: [2]}
      - {switch: rail3, bandwidth: 25, gpus: [3]}
"""
    cluster = loads_cluster(text)
    assert "mcf" in PLANNERS
    mine = simulate(cluster, plan(cluster, "mcf", size=M), M, profile="ideal")
    ring = simulate(cluster, plan(cluster, "ring", size=M), M, profile="ideal")
    assert mine.time_s <= ring.time_s
    assert mine.time_s <= 1.10 * mine.lower_bound_s


def test_disconnected_cluster_names_the_cut():
    import dataclasses
    text = """
name: split
switches: [sw0, sw1]
boxes:
  - {name: a, gpus: 1, nics: [{switch: sw0, bandwidth: 10}]}
  - {name: b, gpus: 1, nics: [{switch: sw1, bandwidth: 10}]}
links:
  - {a: sw0, b: sw1, bandwidth: 10}
"""
    cluster = loads_cluster(text)
    cut = dataclasses.replace(cluster, links=())  # the loader refuses this; build it by hand
    with pytest.raises(InfeasiblePlanError, match="disconnected.*a/gpu0|disconnected.*b/gpu0"):
        plan_mcf(cut, size=M)


def test_solver_time_limit_returns_a_plan_and_says_so():
    # A 2-box cluster of unequal boxes goes to the tree LP; a tiny time limit stops
    # column generation early: the plan still verifies and meta + a warning say so.
    text = """
name: uneven
switches: [sw]
boxes:
  - {name: a, gpus: 3, fabric: {bandwidth: 50}, nics: [{switch: sw, bandwidth: 10}]}
  - {name: b, gpus: 4, fabric: {bandwidth: 80}, nics: [{switch: sw, bandwidth: 12.5}]}
  - name: c
    gpus: 5
    gpu_links: [{a: 0, b: 1, bandwidth: 40}, {a: 1, b: 2, bandwidth: 40},
                {a: 2, b: 3, bandwidth: 40}, {a: 3, b: 4, bandwidth: 40}]
    nics: [{switch: sw, bandwidth: 25, gpus: [0, 4]}]
"""
    cluster = loads_cluster(text)
    with pytest.warns(RuntimeWarning, match="best plan found"):
        schedule = plan_mcf(cluster, size=M, time_limit=1e-9)
    verify(schedule)
    assert schedule.meta["time_limit_hit"] is True


def test_direct_levels_take_one_step_each_and_add_every_partial_sum_at_once():
    from topoplan.planners.mcf.build import build
    from topoplan.planners.mcf.grids import layouts
    from topoplan.planners.mcf.messages import chunk_fractions, messages
    cluster = loads_cluster("""
name: nvswitch-2x4
switches: [sw]
boxes:
  - name: "n{i}"
    count: 3
    gpus: 4
    fabric: {bandwidth: 300 GB/s, latency: 1 us}
    nics:
      - {switch: sw, bandwidth: 25 GB/s, gpus: [0]}
      - {switch: sw, bandwidth: 25 GB/s, gpus: [1]}
      - {switch: sw, bandwidth: 25 GB/s, gpus: [2]}
      - {switch: sw, bandwidth: 25 GB/s, gpus: [3]}
""")
    layout = next(g for g in layouts(cluster) if g.name.endswith("(direct)"))
    assert layout.dims == (4, 3) and layout.direct == (True, True)
    msgs = messages(layout)
    assert msgs.nsteps == 4  # one step per level and phase (rings: 2 * (3 + 2))
    for step, b, stride in ((0, 4, 3), (1, 3, 1)):  # reduce-scatter: in box, then across
        at = msgs.step == step
        for r in range(12):
            mine = at & (msgs.src == r)
            assert len(set(msgs.dst[mine].tolist())) == b - 1
            assert set(msgs.count[mine].tolist()) == {stride}
    schedule = build(12, msgs, chunk_fractions(layout, np.ones(1)), 1, algorithm="mcf")
    assert schedule.version == 2  # a rank adds 3 partial sums of its segment in one step
    verify(schedule)
    report = simulate(cluster, schedule, M, profile="ideal")
    assert report.time_s >= report.lower_bound_s * (1 - 1e-9)
    # Planned for real: the direct grid is near the bound with pipelining.
    planned = plan_mcf(cluster, size=M)
    assert simulate(cluster, planned, M, profile="ideal").time_s <= 1.05 * report.lower_bound_s


# ---- under a cost profile ---------------------------------------------------------------
def test_dgx1_ring_sets_fewest_rings_at_the_optimum():
    from topoplan.planners.mcf.rings import box_ring_sets
    cluster = load_topology("dgx1_v100")
    sets = box_ring_sets(cluster, cluster.boxes[0])
    # One directed ring uses 1/6 of the NVLinks' capacity per direction: 3x slower;
    # one cycle both ways 1.5x; two cycles both ways (the single and the double
    # NVLinks) reach the 13-ring LP optimum.
    assert [len(rings) for rings, _, _ in sets] == [1, 2, 4]
    assert [round(s, 6) for _, _, s in sets] == [3.0, 1.5, 1.0]
    for _, shares, _ in sets:
        assert shares.sum() == pytest.approx(1.0)


def test_dgx1_plan_is_compact_and_near_the_bound_under_nccl():
    from topoplan.analysis.cost import get_profile
    cluster = load_topology("dgx1_v100")
    nccl = get_profile("nccl")
    schedule = plan_mcf(cluster, size=M, profile=nccl)
    verify(schedule)
    assert schedule.nmessages <= 2000  # NCCL's rings are of this order
    got = simulate(cluster, schedule, M, profile=nccl)
    assert got.time_s <= 1.10 * latency_bound(cluster, M, nccl)
    assert schedule.meta["profile"] == "nccl"
    assert schedule.meta["estimate_s"] == pytest.approx(got.time_s, rel=0.02)


def test_cube_mesh_without_latency_is_not_cut_into_hundreds_of_pieces():
    """A held-out cube mesh (NVLinks with no latency): a single-level ring
    gains nothing but rounding from pipeline pieces; it took 128 pieces and 186 k
    messages, and ran 5x slower than a ring."""
    text = topology_text("dgx1_v100").replace(", latency: 1 us", "")
    cluster = loads_cluster(text)
    for profile in ("ideal", "nccl"):
        schedule = plan_mcf(cluster, size=M, profile=profile)
        assert schedule.nmessages <= 2000, profile
        assert schedule.meta.get("pieces", 1) == 1


def test_dearer_ops_give_fewer_rings_and_pieces():
    from topoplan.analysis.cost import CostProfile
    cluster = load_topology("dgx_a100_x4")
    cheap = CostProfile("cheap", alpha_box=1e-6, alpha_network=2e-6, op_overhead=0.1e-6)
    dear = cheap.with_costs(name="dear", op_overhead=20e-6, step_overhead=50e-6)
    a = plan_mcf(cluster, size=64 << 20, profile=cheap)
    b = plan_mcf(cluster, size=64 << 20, profile=dear)
    assert b.nmessages < a.nmessages and b.nsteps <= a.nsteps
    # Each is the better plan under its own profile.
    assert simulate(cluster, a, 64 << 20, profile=cheap).time_s <= \
        1.02 * simulate(cluster, b, 64 << 20, profile=cheap).time_s
    assert simulate(cluster, b, 64 << 20, profile=dear).time_s <= \
        1.02 * simulate(cluster, a, 64 << 20, profile=dear).time_s


@pytest.mark.parametrize("topology", ["dgx_a100_x4", "aws_p2_8xlarge", "ddl_three_racks"])
def test_plan_size_caps_always_hold(topology):
    cluster = load_topology(topology)
    free = plan_mcf(cluster, size=M, profile="ideal")
    step_cap = max(2, free.max_step_ops // 2)
    chunk_cap = max(cluster.nranks, free.nchunks // 4)
    capped = plan_mcf(cluster, size=M, profile="ideal", max_step_ops=step_cap,
                      max_chunks=chunk_cap)
    verify(capped)
    assert capped.max_step_ops <= step_cap and capped.nchunks <= chunk_cap
    with pytest.raises(InfeasiblePlanError, match="max_chunks=1"):
        plan_mcf(cluster, size=M, max_chunks=1)


def test_bad_caps_are_refused():
    from topoplan.planners import PlannerError
    cluster = loads_cluster(_switch(4))
    with pytest.raises(PlannerError, match="max_step_ops must be an integer >= 1"):
        plan_mcf(cluster, size=M, max_step_ops=0)


def test_an_op_budget_between_powers_of_two_is_used():
    """When the budget stops the doubling of pieces while it still gains, the most pieces
    that fit are priced too: a budget for 12 pieces gives 12, never fewer than 8 and never
    over the budget, and its estimate beats the 8-piece one."""
    from topoplan.cluster.generate import rail_optimized
    from topoplan.planners.mcf.grids import layouts
    from topoplan.planners.mcf.messages import chunk_fractions, message_count, messages
    from topoplan.planners.mcf.pieces import choose_pieces
    from topoplan.planners.mcf.pricing import CostModel, piece_profile
    cluster = loads_cluster(rail_optimized(16))  # 128 GPUs
    model = CostModel(cluster)
    layout = next(lay for lay in layouts(cluster) if "halving" in lay.name)
    msgs = messages(layout)
    loads, lat, soft = piece_profile(model, msgs, chunk_fractions(layout, np.ones(1)))
    per = 2 * message_count(layout)
    size = 256 * M
    sizes8, est8 = choose_pieces(loads, lat, size, per, 8 * per)
    sizes12, est12 = choose_pieces(loads, lat, size, per, 12 * per + per // 2)
    assert (len(sizes8), len(sizes12)) == (8, 12)
    assert est12 < est8
    assert choose_pieces(loads, lat, size, per, 12 * per, max_q=10)[0].size == 10


def test_the_simulator_has_the_last_word_where_fair_sharing_misleads_the_estimate():
    """On two_leaf_oversubscribed the lock-step model prices the direct grid at 1.003x
    the bound, but its NICs carry local messages and messages throttled by the 2:1
    trunk in one step, and fair sharing runs it at 1.075x. The simulator checks the best
    estimates within its op budget and picks a plan at the bound."""
    cluster = load_topology("targets/two_leaf_oversubscribed")
    size = 256 << 20
    schedule = plan_mcf(cluster, size=size, profile="ideal")
    simulated = schedule.meta["simulated_s"]
    assert len(simulated) >= 3 and schedule.meta["construction"] in simulated
    direct = "grid box[8]x1 > switch[4]>groups[2] (direct)"
    assert simulated[direct] > 1.05 * lower_bound(cluster, size)
    time = simulate(cluster, schedule, size, profile="ideal").time_s
    assert time == pytest.approx(simulated[schedule.meta["construction"]])
    assert time <= 1.01 * lower_bound(cluster, size)
