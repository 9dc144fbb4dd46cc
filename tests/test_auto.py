"""The auto planner: simulate every candidate, keep the fastest."""

from __future__ import annotations

import pytest

from tests.support.clusters import load_topology
from topoplan.errors import InfeasiblePlanError, PlannerError
from topoplan.planners import plan
from topoplan.planners.auto import compare, plan_auto
from topoplan.analysis.sim import simulate
from topoplan.ir.verify import verify

@pytest.fixture(scope="module")
def ddl():
    return load_topology("ddl_two_switch")


def test_compare_sorts_by_simulated_time(ddl):
    rows = compare(ddl, 256 << 20, ["ring", "rhd", "mcf", "hierarchical"])
    times = [report.time_s for _, _, report, _ in rows]
    assert times == sorted(times)
    assert {name for name, *_ in rows} == {"ring", "rhd", "mcf", "hierarchical"}
    for name, schedule, report, plan_s in rows:
        verify(schedule)
        # Simulated under the default profile (nccl), as the planners planned.
        assert report.profile == "nccl"
        assert plan_s >= 0 and report.time_s == \
            simulate(ddl, schedule, 256 << 20, profile="nccl").time_s


def test_compare_plans_and_simulates_under_the_profile(ddl):
    rows = compare(ddl, 1 << 20, ["ring", "tree", "hierarchical"], profile="ideal")
    for name, schedule, report, _ in rows:
        assert report.profile == "ideal" and schedule.meta["profile"] == "ideal", name
        assert report.time_s == simulate(ddl, schedule, 1 << 20, profile="ideal").time_s
    schedule = plan_auto(ddl, size=1 << 20, candidates=["ring", "tree"], profile="ideal")
    assert schedule.meta["profile"] == "ideal"
    for row in schedule.meta["comparison"]:
        assert set(row["breakdown"]) == {"bandwidth", "latency", "overhead", "reduce", "contention"}
        assert row["breakdown"]["overhead"] == 0  # ideal charges no software costs
        assert row["messages"] > 0 and row["steps"] > 0 and row["chunks"] > 0


def test_small_messages_go_to_a_latency_optimal_plan(ddl):
    schedule = plan(ddl, "auto", size=1024)
    assert schedule.meta["algorithm"] == "auto"
    sims = {row["algorithm"]: row["time_s"] for row in schedule.meta["comparison"]}
    chosen = schedule.meta["chosen"]
    # Latency-optimal here: as fast as recursive halving/doubling (2 log2 4 = 4 steps),
    # strictly faster than the 2 (n-1) = 6-step ring.
    assert sims[chosen] <= sims["rhd"] * (1 + 1e-9)
    assert sims[chosen] < sims["ring"]
    assert schedule.nsteps <= 4


def test_large_messages_go_to_a_bandwidth_optimal_plan(ddl):
    schedule = plan_auto(ddl, size=256 << 20)
    report = simulate(ddl, schedule, 256 << 20, profile="ideal")
    assert report.time_s <= 1.01 * report.lower_bound_s
    assert schedule.meta["chosen"] in ("mcf", "hierarchical", "forest")
    verify(schedule)


def test_dgx1_picks_mcf_at_large_size():
    cluster = load_topology("dgx1_v100")
    schedule = plan(cluster, "auto", size=256 << 20)
    assert schedule.meta["chosen"] == "mcf"


def test_unknown_candidate_is_a_clear_error(ddl):
    with pytest.raises(PlannerError, match="unknown planner 'nope'; known: composed, "):
        compare(ddl, 1024, ["nope"])


def test_auto_ranks_candidates_on_the_machine_they_run_on():
    """Plans for a cluster tried out on another machine (a calibrated host) are ranked by
    their time there: on a host of equal ports every bandwidth-optimal plan ties, and
    the fewest steps win under costly steps."""
    from topoplan.cluster import host_cluster
    from topoplan.analysis.cost import CostProfile
    from topoplan.planners.auto import compare, plan_auto
    cluster = load_topology("dgx1_v100")
    host = host_cluster("host", 8, 1e9)
    profile = CostProfile("slow steps", step_overhead=200e-6)
    rows = compare(cluster, 1 << 20, ["ring", "rhd", "mcf"], profile=profile, machine=host)
    assert {r.cluster for _, _, r, _ in rows} == {"host"}
    chosen = plan_auto(cluster, size=1 << 20, candidates=["ring", "rhd", "mcf"],
                       profile=profile, machine=host)
    assert chosen.meta["chosen"] == "rhd" and chosen.meta["machine"] == "host"
    with pytest.raises(InfeasiblePlanError, match="has 4 ranks"):
        compare(cluster, 1 << 20, ["ring"], machine=host_cluster("small", 4, 1e9))
