"""The baseline planners under cost profiles: pipelining depth, plan-size caps, and auto
choosing between them by the runtime's costs.

Simulated times are checked against alpha-beta formulas worked out by hand (the model of
docs/COST_MODEL.md: a step of ``k`` ops costs ``sigma + k o + alpha + path latency`` before
its bytes flow, a reducing step then adds what it received at ``R``).
"""

from __future__ import annotations

import pytest
from tests.support.clusters import switch_cluster

from topoplan.cluster import Cluster, loads_cluster
from topoplan.analysis.cost import CostProfile
from topoplan.errors import InfeasiblePlanError
from topoplan.planners import PlannerError, plan
from topoplan.analysis.sim import simulate
from topoplan.ir.verify import verify

US = 1e-6
#: A runtime with every cost switched on (the one of tests/test_cost.py).
PROFILE = CostProfile("test", alpha_box=2 * US, alpha_network=5 * US, op_overhead=1 * US,
                      step_overhead=3 * US, call_overhead=10 * US, reduce_bandwidth=4e9)
#: A runtime whose steps are dear (a CPU transport): 90 us before a step's bytes flow.
SLOW = CostProfile("slow", alpha_box=40 * US, alpha_network=60 * US, op_overhead=5 * US,
                   step_overhead=20 * US, call_overhead=50 * US, reduce_bandwidth=20e9)
BASELINES = ("ring", "ring-topo", "tree", "rhd", "hierarchical")
BANDWIDTH, LATENCY = 10e9, 2e-6  # switch_cluster: 10 GB/s NICs, 1 us a link, 2 us a path
MiB = 1 << 20


def boxes_cluster(boxes: int = 4, gpus: int = 4) -> Cluster:
    """Boxes with an NVSwitch-like fabric under one switch (two levels for hierarchical)."""
    return loads_cluster(f"""
name: boxes-{boxes}x{gpus}
switches: [sw]
boxes:
  - {{name: "b{{i}}", count: {boxes}, gpus: {gpus}, fabric: {{bandwidth: 200 GB/s, latency: 1 us}},
     nics: [{{switch: sw, bandwidth: 100 Gbit/s, latency: 2 us}}]}}
""")


def step(ops: int, p: CostProfile = PROFILE) -> float:
    """Seconds a lone step of ``ops`` ops costs before its bytes flow on a switch cluster."""
    return p.message_cost(network=True, ops=ops) + LATENCY


def rhd_time(n: int, size: float, p: CostProfile = PROFILE) -> float:
    """Recursive halving-doubling on ``n`` one-GPU boxes of one switch, by hand.

    ``P`` survivors (the largest power of two <= n) take ``2 log2 P`` steps of 2 ops (a
    send and a receive with the partner), moving ``(P-1)/P`` of the buffer each way and
    adding it once; with ``n > P`` the extra ranks fold their whole buffer in first and
    get the result back last, 2 more steps of one op each that move (and add) ``M``.
    """
    big = 1 << (n.bit_length() - 1)
    levels = big.bit_length() - 1
    share = (big - 1) / big
    t = p.call_overhead + 2 * levels * step(2, p) + 2 * share * size / BANDWIDTH
    t += share * size / p.reduce_bandwidth
    if n > big:
        t += 2 * step(1, p) + 2 * size / BANDWIDTH + size / p.reduce_bandwidth
    return t


def ring_time(n: int, size: float, p: CostProfile = PROFILE) -> float:
    """The ring by hand (as in tests/test_cost.py): 2(n-1) steps of 2 ops moving M/n."""
    return (p.call_overhead + 2 * (n - 1) * (step(2, p) + size / n / BANDWIDTH)
            + (n - 1) * size / n / p.reduce_bandwidth)


# ---- (a) hand-computed alpha-beta cases -------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8, 6])
def test_rhd_matches_the_alpha_beta_formula(n: int) -> None:
    cluster = switch_cluster(n)
    size = 4 * 3 * 2 ** 16  # equal chunks for p = 2, 4, 8 (and close for n = 6)
    schedule = plan(cluster, "rhd", size=size, profile=PROFILE)
    assert schedule.meta["profile"] == "test" and schedule.meta["slices"] == 1
    report = simulate(cluster, schedule, size, profile=PROFILE)
    assert report.time_s == pytest.approx(rhd_time(n, size), rel=1e-6)
    big = 1 << (n.bit_length() - 1)
    assert report.breakdown["overhead"] == pytest.approx(
        PROFILE.call_overhead + 2 * (big.bit_length() - 1) * (3 + 2) * US
        + (2 * (3 + 1) * US if n > big else 0), rel=1e-9)


# ---- (b) caps ---------------------------------------------------------------------------
@pytest.mark.parametrize("planner", BASELINES)
def test_every_baseline_keeps_within_the_caps(planner: str) -> None:
    cluster = boxes_cluster()  # 16 ranks: rings, rhd and hierarchical need 16 chunks
    for caps in ({"max_step_ops": 4}, {"max_chunks": 16}, {"max_step_ops": 3, "max_chunks": 16}):
        schedule = plan(cluster, planner, size=256 * MiB, profile="ideal", **caps)
        verify(schedule)
        assert schedule.max_step_ops <= caps.get("max_step_ops", 1 << 30), (planner, caps)
        assert schedule.nchunks <= caps.get("max_chunks", 1 << 30), (planner, caps)


@pytest.mark.parametrize("planner", ["tree", "hierarchical"])
def test_pipelined_baselines_lower_their_depth_to_fit(planner: str) -> None:
    cluster = boxes_cluster()
    size = 256 * MiB
    free = plan(cluster, planner, size=size, profile="ideal")
    assert free.meta["pipeline"] > 2
    per_part = free.nchunks // free.meta["pipeline"]
    capped = plan(cluster, planner, size=size, profile="ideal", max_chunks=2 * per_part)
    assert capped.meta["pipeline"] == 2 and capped.nchunks == 2 * per_part
    verify(capped)
    one = plan(cluster, planner, size=size, profile="ideal", chunks=1)
    ops = plan(cluster, planner, size=size, profile="ideal", max_step_ops=one.max_step_ops)
    assert ops.max_step_ops <= one.max_step_ops < free.max_step_ops
    assert 1 <= ops.meta["pipeline"] < free.meta["pipeline"]


@pytest.mark.parametrize("planner", BASELINES)
def test_caps_no_plan_can_meet_are_infeasible_and_name_the_cap(planner: str) -> None:
    cluster = boxes_cluster()
    with pytest.raises(InfeasiblePlanError, match=f"{planner}: .*over max_step_ops=1;"):
        plan(cluster, planner, size=MiB, max_step_ops=1)
    if planner != "tree":  # the tree's smallest plan has 2 chunks
        with pytest.raises(InfeasiblePlanError, match="over max_chunks=2;"):
            plan(cluster, planner, size=MiB, max_chunks=2)
    with pytest.raises(InfeasiblePlanError, match="chunks=3 gives .*over max_chunks=5;.*fewer"):
        plan(cluster, planner, size=MiB, chunks=3, max_chunks=5)
    with pytest.raises(PlannerError, match="max_step_ops must be an integer >= 1"):
        plan(cluster, planner, size=MiB, max_step_ops=0)


# ---- (d) depth under a costly runtime -----------------------------------------------------
@pytest.mark.parametrize("planner, size", [("tree", 16 * MiB), ("hierarchical", 256 * MiB)])
def test_costly_steps_mean_fewer_chunks(planner: str, size: int) -> None:
    cluster = boxes_cluster()
    ideal = plan(cluster, planner, size=size, profile="ideal")
    slow = plan(cluster, planner, size=size, profile=SLOW)
    assert (ideal.meta["profile"], slow.meta["profile"]) == ("ideal", "slow")
    assert 1 <= slow.meta["pipeline"] < ideal.meta["pipeline"]
    # ... and the fewer chunks are faster on that runtime.
    assert simulate(cluster, slow, size, profile=SLOW).time_s < \
        simulate(cluster, ideal, size, profile=SLOW).time_s


def test_ring_and_rhd_do_not_slice_under_any_profile() -> None:
    cluster = boxes_cluster()
    for profile in ("ideal", "nccl", SLOW):
        for planner, key in (("ring", "slices"), ("ring-topo", "slices"), ("rhd", "slices")):
            assert plan(cluster, planner, size=1 << 30, profile=profile).meta[key] == 1


def test_auto_leaves_out_candidates_that_cannot_meet_the_caps() -> None:
    cluster = boxes_cluster()  # 16 ranks: ring, rhd and hierarchical need 16 chunks at least
    schedule = plan(cluster, "auto", size=MiB, profile=PROFILE, max_chunks=8,
                    candidates=["ring", "rhd", "hierarchical", "tree"])
    assert schedule.meta["chosen"] == "tree" and schedule.nchunks <= 8
    assert [row["algorithm"] for row in schedule.meta["comparison"]] == ["tree"]
    assert set(schedule.meta["left_out"]) == {"ring", "rhd", "hierarchical"}
    assert "max_chunks=8" in schedule.meta["left_out"]["rhd"]
    with pytest.raises(InfeasiblePlanError, match="no candidate produced a plan.*max_step_ops=1"):
        plan(cluster, "auto", size=MiB, max_step_ops=1, candidates=["ring", "tree"])


def test_auto_checks_the_caps_of_planners_that_do_not_take_them() -> None:
    from topoplan.planners import PLANNERS, register
    from topoplan.planners.ring import plan_ring

    def plan_sliced(cluster, *, size, chunks=None):
        return plan_ring(cluster, size=size, chunks=4, algorithm="sliced")

    register("sliced", plan_sliced)
    try:
        cluster = switch_cluster(4)
        schedule = plan(cluster, "auto", size=MiB, candidates=["sliced", "ring"], max_chunks=8)
        assert schedule.meta["chosen"] == "ring"
        assert schedule.meta["left_out"]["sliced"].startswith(
            "sliced: its plan has 16 chunks, over max_chunks=8")
    finally:
        del PLANNERS["sliced"]


# ---- (c) auto switches plans where the alpha-beta model says ------------------------------
def test_auto_switches_from_rhd_to_ring_at_the_predicted_size() -> None:
    """Six one-GPU boxes on a switch: rhd folds two ranks in (2 one-op steps moving M
    each way) and runs 4 steps among 4; the ring runs 10 steps moving M/6 each. rhd saves
    ``6 step(2) - 2 step(1)`` of per-step costs and pays
    ``(3.5 - 10/6) M / B + (1.75 - 5/6) M / R`` more in bytes, so the ring wins above
    ``M* = saving / (extra per byte)`` (about 118 KiB under the test profile)."""
    n = 6
    cluster = switch_cluster(n)
    saving = 6 * step(2) - 2 * step(1)
    per_byte = (3.5 - 10 / 6) / BANDWIDTH + (1.75 - 5 / 6) / PROFILE.reduce_bandwidth
    crossover = saving / per_byte
    assert rhd_time(n, crossover) == pytest.approx(ring_time(n, crossover), rel=1e-12)
    for size, winner in ((crossover / 4, "rhd"), (4 * crossover, "ring")):
        size = int(size) // 48 * 48
        schedule = plan(cluster, "auto", size=size, profile=PROFILE, candidates=["ring", "rhd"])
        assert schedule.meta["chosen"] == winner, (size, schedule.meta["comparison"])
        times = {row["algorithm"]: row["time_s"] for row in schedule.meta["comparison"]}
        # (sixths of the buffer are cut at whole elements from float sums: a few bytes off)
        assert times["rhd"] == pytest.approx(rhd_time(n, size), rel=1e-4)
        assert times["ring"] == pytest.approx(ring_time(n, size), rel=1e-4)
    # Without software costs rhd's 4 fewer steps save only path latency, so the ring takes
    # over at a quarter of the size or so: between the two crossovers the profile decides.
    ideal_crossover = 4 * LATENCY / ((3.5 - 10 / 6) / BANDWIDTH)
    size = int(2 * ideal_crossover) // 48 * 48
    assert size < crossover
    picks = {p if isinstance(p, str) else p.name:
             plan(cluster, "auto", size=size, profile=p, candidates=["ring", "rhd"]).meta["chosen"]
             for p in ("ideal", PROFILE)}
    assert picks == {"ideal": "ring", "test": "rhd"}
