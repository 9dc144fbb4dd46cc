"""Reduce-scatter and allgather planners (ring, ring-topo, rhd): every plan verifies, none
beats the ForestColl bound, and planners that plan only allreduce say which ones do."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import topoplan
from tests.support.clusters import SHIPPED, leaf_spine_cluster, load_topology, switch_cluster
from tests.support.cluster_shapes import brute_force_ratio, cluster, small_clusters, uneven_clusters
from topoplan.analysis.bound import collective_bound, rsag_bound, shard_bound
from topoplan.errors import PlannerError, ScheduleError
from topoplan.planners import collectives_of, plan, planners_for, PLANNERS
from topoplan.analysis.sim import simulate
from topoplan.ir.collectives import bus_factor
from topoplan.ir.verify import verify

SHARDED = ("reduce_scatter", "allgather")
BASELINES = ("ring", "ring-topo", "rhd")
MiB = 1 << 20


def checked(schedule, planner: str, where: str):
    try:
        report = verify(schedule)
    except ScheduleError as exc:
        pytest.fail(f"planner {planner} on {where}: {exc}")
    assert report.collective == schedule.collective
    return schedule


@pytest.mark.parametrize("collective", SHARDED)
@pytest.mark.parametrize("planner", BASELINES)
def test_every_baseline_verifies_on_1_to_17_ranks(planner, collective):
    for kind in ("two-switch", "mixed", "nvlink-box"):
        for n in range(1, 18):
            c = cluster(kind, n)
            s = checked(plan(c, planner, size=MiB, collective=collective), planner,
                        f"{kind} with {n} ranks, {collective}")
            assert s.collective == collective and s.meta["algorithm"] == planner
            assert s.nchunks % n == 0 or n == 1


@pytest.mark.parametrize("collective", SHARDED)
@pytest.mark.parametrize("planner", BASELINES)
@pytest.mark.parametrize("chunks", [2, 3])
def test_pipelined_plans_verify(planner, collective, chunks):
    for n in (2, 5, 8, 11):
        c = cluster("two-switch", n)
        s = checked(plan(c, planner, size=256 * MiB, chunks=chunks, collective=collective),
                    planner, f"two-switch with {n} ranks, {collective}, chunks={chunks}")
        assert s.nchunks == n * chunks


@pytest.mark.parametrize("collective", SHARDED)
@pytest.mark.parametrize("planner", BASELINES)
def test_shipped_topologies_verify_and_respect_the_bound(planner, collective):
    for name in SHIPPED:
        c = load_topology(name)
        if c.nranks > 64:
            continue
        s = checked(plan(c, planner, size=MiB, collective=collective), planner,
                    f"{name}.yaml, {collective}")
        report = simulate(c, s, 64 * MiB, profile="ideal")
        assert report.lower_bound_s == shard_bound(c, 64 * MiB)
        assert report.time_s >= report.lower_bound_s * (1 - 1e-9), f"{planner} on {name}"


@settings(max_examples=15, deadline=None)
@given(uneven_clusters(), st.sampled_from(BASELINES), st.sampled_from(SHARDED),
       st.integers(1, 3))
def test_random_clusters_plans_verify_and_respect_the_bound(c, planner, collective, chunks):
    s = plan(c, planner, size=16 * MiB, collective=collective, chunks=chunks, profile="ideal")
    verify(s)
    report = simulate(c, s, 16 * MiB, profile="ideal")
    assert report.time_s >= report.lower_bound_s * (1 - 1e-9)
    assert report.busbw == pytest.approx(report.algbw * bus_factor(c.nranks, collective))


def test_allreduce_is_still_the_default():
    for kind in ("two-switch", "mixed"):
        c = cluster(kind, 7)
        for planner in BASELINES:
            s = plan(c, planner, size=MiB)
            assert s.collective == "allreduce"
            assert s == plan(c, planner, size=MiB, collective="allreduce")


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allgather_on_one_switch_matches_the_hand_computed_time(n):
    """(n-1) steps of (path latency + (M/n) / B), against the bound (n-1)/n * M / B."""
    c = cluster("single-switch", n)
    size = 64 * MiB
    path = c.routes(0, 1)[0]
    latency = sum(c.graph[u][v]["latency"] for u, v in zip(path, path[1:]))
    bandwidth = 100e9 / 8
    for collective in SHARDED:
        report = simulate(c, plan(c, "ring", size=size, collective=collective), size=size,
                          profile="ideal")
        assert report.time_s == pytest.approx((n - 1) * (latency + size / n / bandwidth),
                                              rel=1e-9)
        assert report.lower_bound_s == pytest.approx((n - 1) / n * size / bandwidth, rel=1e-9)
        assert report.busbw == pytest.approx(report.algbw * (n - 1) / n)


@settings(max_examples=20, deadline=None)
@given(small_clusters())
def test_shard_bound_is_forestcolls_allgather_bound(c):
    """ForestColl's allgather bound, max over node sets S holding a GPU and missing one of
    |GPUs outside S| / B_in(S), is the brute-force ratio of test_bound over the complements
    T of S (B_in(S) = B_out(T)): max over T of |T ∩ GPUs| / B_out(T)."""
    size = 12 * MiB
    expected = size / c.nranks * brute_force_ratio(c)
    assert shard_bound(c, size) == pytest.approx(expected, rel=1e-9)
    assert rsag_bound(c, size) == pytest.approx(2 * expected, rel=1e-9)
    for collective in SHARDED:
        assert collective_bound(c, size, collective) == shard_bound(c, size)


def test_one_gpu_has_nothing_to_move():
    c = switch_cluster(1)
    assert shard_bound(c, MiB) == 0.0
    for planner in BASELINES:
        for collective in SHARDED:
            s = plan(c, planner, size=MiB, collective=collective)
            assert (s.nops, s.collective) == (0, collective)
            verify(s)


@pytest.mark.parametrize("planner", ["tree", "hierarchical"])
def test_allreduce_only_planners_name_the_ones_that_plan_the_collective(planner):
    c = cluster("single-switch", 4)
    with pytest.raises(PlannerError, match=f"planner '{planner}' plans only allreduce; "
                                           "allgather is planned by ring, ring-topo, rhd, mcf, "
                                           "forest, nccl, composed, auto"):
        plan(c, planner, size=MiB, collective="allgather")


def test_unknown_collective_is_a_planner_error():
    c = cluster("single-switch", 4)
    with pytest.raises(PlannerError, match="unknown collective 'alltoall'; known: allreduce, "
                                           "reduce_scatter, allgather"):
        plan(c, "ring", size=MiB, collective="alltoall")
    # the planner called directly checks its arguments the same way, in one place
    with pytest.raises(PlannerError, match="unknown collective 'alltoall'; known: allreduce, "
                                           "reduce_scatter, allgather"):
        PLANNERS["ring"](c, size=MiB, collective="alltoall")


def test_registry_says_who_plans_what():
    assert planners_for("allreduce") == list(PLANNERS)
    assert planners_for("reduce_scatter") == ["ring", "ring-topo", "rhd", "mcf", "forest",
                                              "nccl", "composed", "auto"]
    assert collectives_of(PLANNERS["tree"]) == ("allreduce",)


@pytest.mark.parametrize("collective", SHARDED)
def test_auto_compares_the_planners_of_the_collective(collective):
    c = cluster("two-switch", 6)
    s = plan(c, "auto", size=MiB, collective=collective)
    verify(s)
    assert s.collective == collective
    assert {row["algorithm"] for row in s.meta["comparison"]} == {"mcf", "ring", "ring-topo",
                                                                  "rhd", "nccl", "composed",
                                                                  "forest"}
    with pytest.raises(PlannerError, match="planner 'tree' plans only allreduce"):
        plan(c, "auto", size=MiB, collective=collective, candidates=["ring", "tree"])


def _cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, check=check)


def test_cli_plans_an_allgather(tmp_path):
    out = tmp_path / "ag.json"
    result = _cli("plan", "topologies/ddl_two_switch.yaml", "--size", "64MiB", "--collective",
                  "allgather", "--json", "-o", str(out))
    data = json.loads(result.stdout)
    assert data["collective"] == "allgather"
    assert {c["algorithm"] for c in data["candidates"]} == {"ring", "ring-topo", "rhd", "mcf",
                                                            "forest", "nccl", "composed"}
    c = load_topology("ddl_two_switch")
    assert data["lower_bound_s"] == pytest.approx(shard_bound(c, 64 * MiB))
    for row in data["candidates"]:
        assert row["time_s"] >= data["lower_bound_s"] * (1 - 1e-9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 3 / 4)
    schedule = topoplan.load_schedule(out)
    assert schedule.collective == "allgather" and schedule.meta["chosen"] == data["chosen"]
    assert schedule.algorithm == "auto"
    done = _cli("verify", str(out))
    assert f"ok: auto ({data['chosen']}) allgather, 4 ranks" in done.stdout


def test_cli_table_and_errors_for_the_collectives():
    result = _cli("plan", "topologies/ddl_two_switch.yaml", "--size", "1MiB", "--collective",
                  "reduce_scatter", "-a", "ring")
    assert "4 ranks, reduce_scatter of 1MiB" in result.stdout
    assert "lower bound (any reduce_scatter, ForestColl's cut" in result.stdout
    assert "chosen: ring" in result.stdout
    bad = _cli("plan", "topologies/ddl_two_switch.yaml", "--collective", "allgather", "-a",
               "tree", check=False)
    assert bad.returncode == 1
    assert bad.stderr.strip() == ("topoplan: error: planner 'tree' plans only allreduce; "
                                  "allgather is planned by ring, ring-topo, rhd, mcf, "
                                  "forest, nccl, composed, auto")


# (bench runs every collective: tests/test_transports_mpi.py; so does the MSCCL export:
# tests/test_interop_msccl.py)
def test_msccl_export_writes_the_plans_collective(tmp_path):
    plan_path = tmp_path / "ag.json"
    plan(load_topology("ddl_two_switch"), "ring", size=MiB,
         collective="allgather").save(plan_path)
    xml = tmp_path / "x.xml"
    done = _cli("export", str(plan_path), "--format", "msccl", "-o", str(xml), check=False)
    assert done.returncode == 0, done.stderr
    assert 'coll="allgather"' in xml.read_text()


# --------------------------------------------------------------------------------------
# mcf: the grid's halves
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", SHARDED)
def test_mcf_verifies_on_1_to_17_ranks(collective):
    for kind in ("two-switch", "mixed", "nvlink-box"):
        for n in range(1, 18):
            c = cluster(kind, n)
            s = checked(plan(c, "mcf", size=64 * MiB, collective=collective), "mcf",
                        f"{kind} with {n} ranks, {collective}")
            assert s.collective == collective and s.meta["algorithm"] == "mcf"


#: Shipped topologies up to 192 ranks, planned for the bandwidth model of the bound (the
#: ``ideal`` profile): measured 1.00 to 1.03 (dgx_a100_x4); leaf_spine_1024 1.033 (benchmark).
QUALITY = 1.05


@pytest.mark.parametrize("collective", SHARDED)
def test_mcf_is_within_5_percent_of_the_shard_bound_at_256_mib(collective):
    size = 256 * MiB
    for name in SHIPPED:
        c = load_topology(name)
        if c.nranks > 256:
            continue
        s = plan(c, "mcf", size=size, collective=collective, profile="ideal")
        report = simulate(c, s, size, profile="ideal")
        assert report.lower_bound_s == shard_bound(c, size)
        ratio = report.time_s / report.lower_bound_s
        assert 1 - 1e-9 <= ratio <= QUALITY, f"mcf {collective} on {name}: {ratio:.3f}x bound"


def test_mcf_reduce_scatter_and_allgather_mirror_each_other():
    """The same grid run forwards (allgather) and backwards (reduce-scatter): equal ops,
    steps and chunks; the reduce-scatter's recvs reduce, the allgather's overwrite."""
    c = load_topology("dgx1_v100")
    rs = plan(c, "mcf", size=256 * MiB, collective="reduce_scatter")
    ag = plan(c, "mcf", size=256 * MiB, collective="allgather")
    assert rs.meta["construction"] == ag.meta["construction"]
    assert (rs.nops, rs.nchunks) == (ag.nops, ag.nchunks)
    assert [len(p.steps) for p in rs.ranks] == [len(p.steps) for p in ag.ranks]
    recvs = [op for s in (rs, ag) for p in s.ranks for step in p.steps for op in step
             if op.kind.name == "RECV"]
    assert {op.reduce for op in recvs[:len(recvs) // 2]} == {True}
    assert {op.reduce for op in recvs[len(recvs) // 2:]} == {False}


def test_mcf_shards_are_each_ranks_own_chunks():
    """Shard r is the chunks rank r ends owning: 1/N of the buffer each, in rank order."""
    c = load_topology("ndv2_x2")
    s = plan(c, "mcf", size=256 * MiB, collective="allgather")
    n = c.nranks
    per = s.nchunks // n
    assert per * n == s.nchunks
    for r in range(n):
        assert sum(s.chunks[r * per:(r + 1) * per]) == pytest.approx(1 / n, rel=1e-9)
    # At the first step each rank sends only chunks of its own shard (it holds nothing else).
    for prog in s.ranks:
        first = [op for op in prog.steps[0] if op.kind.name == "SEND"]
        assert first and all(op.chunk // per == prog.rank for op in first)


@settings(max_examples=15, deadline=None)
@given(uneven_clusters(), st.sampled_from(SHARDED))
def test_random_clusters_mcf_verifies_and_is_never_behind_the_ring(c, collective):
    size = 16 * MiB
    s = plan(c, "mcf", size=size, collective=collective, profile="ideal")
    verify(s)
    mcf = simulate(c, s, size, profile="ideal").time_s
    ring = simulate(c, plan(c, "ring", size=size, collective=collective), size,
                    profile="ideal")
    assert ring.lower_bound_s * (1 - 1e-9) <= mcf <= ring.time_s * 1.02


# --------------------------------------------------------------------------------------
# mcf: rail exchanges, rounds chosen by the cost model
# --------------------------------------------------------------------------------------

def small_leaf_spine():
    """Four leaves of two 2-GPU nodes (a NIC per GPU) under one spine, 4:1 oversubscribed."""
    return leaf_spine_cluster(8, boxes_per_leaf=2, gpus=2, spines=1, uplink=25)


def _rail_grid(c):
    from topoplan.planners.mcf import rails as R
    grids = R._layout(c)
    return next(grid for grid, where in grids if "groups" in where)


@pytest.mark.parametrize("rounds,parts", [((3,), 1), ((1, 1, 1), 1), ((1, 2), 1),
                                          ((1, 3, 4, 2, 1, 1), 4), ((12,), 4),
                                          ((2, 1, 1, 4, 3, 1), 4), ((1,) * 6, 2)])
@pytest.mark.parametrize("collective", SHARDED)
def test_rail_rounds_verify_for_any_cut_of_the_shards(rounds, parts, collective):
    """Whatever the rounds and however finely the shards are cut, a rail exchange moves
    every part of every shard to every rank (or reduces it at its owner) exactly once,
    its message count is the formula's, and rank r's shard is its own chunks."""
    import numpy as np
    from topoplan.planners.mcf.build import build_sharded
    from topoplan.planners.mcf.layout import RankGrid
    from topoplan.planners.mcf.messages import shard_message_count, shard_messages
    from topoplan.planners.mcf.rails import rail_message_count
    c = small_leaf_spine()
    grid = _rail_grid(c)
    layout = RankGrid("rails", grid.shape, (grid,), np.ones(1), rails=True, rounds=rounds,
                    parts=parts)
    msgs = shard_messages(layout, collective)
    assert len(msgs.step) == rail_message_count(layout) == shard_message_count(layout)
    s = build_sharded(c.nranks, msgs, layout, np.ones(1), collective)
    checked(s, "mcf rails", f"rounds {rounds} of 1/{parts} shards, {collective}")
    assert s.nchunks == c.nranks * parts
    # the first step's sends: only parts of the sender's own shard (allgather)
    if collective == "allgather":
        for prog in s.ranks:
            assert all(op.chunk // parts == prog.rank for op in prog.steps[0]
                       if op.kind.name == "SEND")


@pytest.mark.parametrize("profile", ["ideal", "nccl"])
def test_best_rounds_are_what_the_cost_model_prices_best(profile):
    """The rounds the dynamic program picks price (by the planner's lock-step estimate of
    the messages themselves) at most as high as every fixed round size, and on this
    symmetric fabric its own sum is that estimate."""
    import numpy as np
    from topoplan.analysis.cost import get_profile
    from topoplan.planners.mcf.messages import chunk_fractions, shard_messages
    from topoplan.planners.mcf.pricing import CostModel, estimate, piece_profile
    from topoplan.planners.mcf.rails import rail_layouts
    c = small_leaf_spine()
    costs = get_profile(profile)
    model = CostModel(c)
    size = 256 * MiB

    def priced(layout):
        msgs = shard_messages(layout, "allgather")
        loads, lat, soft = piece_profile(model, msgs, chunk_fractions(layout, np.ones(1)),
                                         costs)
        return estimate(loads, lat, np.ones(1), size, soft)

    layouts = [lay for lay in rail_layouts(c, model, costs, size) if lay.dims[1] > 1]
    fixed = [priced(lay) for lay in layouts if "a round" in lay.name]
    chosen = layouts[-1]
    assert len(fixed) == len(layouts) - 1 >= 2, [lay.name for lay in layouts]
    assert priced(chosen) <= min(fixed) * (1 + 1e-9)
    if profile == "ideal":  # it cuts the last rounds finer than whole shards
        assert chosen.parts > 1 and chosen.rounds[-1] < chosen.parts, chosen.name

