"""The baseline planners under cost profiles: pipelining depth, plan-size caps, and auto
choosing between them by the runtime's costs.

Simulated times are checked against alpha-beta formulas worked out by hand (the model of
docs/COST_MODEL.md: a step of ``k`` ops costs ``sigma + k o + alpha + path latency`` before
its bytes flow, a reducing step then adds what it received at ``R``).
"""

from __future__ import annotations

import pytest
from simhelpers import switch_cluster

from topoplan.cluster import Cluster, loads_cluster
from topoplan.cost import CostProfile
from topoplan.errors import InfeasiblePlanError
from topoplan.planners import PlannerError, plan
from topoplan.simulate import simulate
from topoplan.verify import verify

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
