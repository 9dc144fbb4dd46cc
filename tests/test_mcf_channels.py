"""mcf on channels and with vectored messages (IR v4): the channel model of the pricing
against hand-worked cases and the event simulator, and the planner that plans its
pipeline for the channels it runs on and the ops it posts."""

from __future__ import annotations

import numpy as np
import pytest

import topoplan
from tests.support.clusters import load_topology
from topoplan.analysis.bound import latency_bound
from topoplan.analysis.sim import simulate
from topoplan.errors import PlannerError
from topoplan.ir.verify import verify
from topoplan.ir.passes import slices
from topoplan.planners.mcf import plan_mcf
from topoplan.planners.mcf.pricing import channel_time


def test_one_channel_and_equal_slices_are_the_lock_step_time():
    rng = np.random.default_rng(0)
    work = rng.random((7, 5)) * 1e-3
    delay = rng.random(7) * 1e-4
    lock_step = float(delay.sum() + work.max(axis=1).sum())
    assert channel_time(work, delay, (1.0,)) == pytest.approx(lock_step, rel=1e-12)
    # equal slices run in phase: each moves 1/C at 1/C of the speed
    assert channel_time(work, delay, slices(4)) == pytest.approx(lock_step, rel=1e-12)


def test_two_channels_on_one_link_by_hand():
    # One step: 1 ms of latency, then 10 ms of bytes on one link. Shares 2/3 and 1/3:
    # both wait 1 ms, share the link (5 ms each until the small one's 10/3 ms of bytes
    # are through at half speed: 1 + 20/3 ms), then the big one has 20/3 - 10/3 = 10/3
    # ms of bytes left alone: ends at 1 + 20/3 + 10/3 = 11 ms, the link never idle.
    work = np.array([[10e-3]])
    delay = np.array([1e-3])
    assert channel_time(work, delay, (2 / 3, 1 / 3)) == pytest.approx(11e-3, rel=1e-12)
    # Two such steps: the small channel's second latency hides behind the big one's
    # bytes, so only the first latency and the big one's second are exposed:
    # small: [0,1] wait, [1, 1+20/3] shared, [1+20/3, 2+20/3] wait, then alone with the
    # big one's leftover ... the link is busy from 1 ms on except while both wait.
    work2 = np.array([[10e-3], [10e-3]])
    delay2 = np.array([1e-3, 1e-3])
    t = channel_time(work2, delay2, (2 / 3, 1 / 3))
    lock_step = 2 * (1e-3 + 10e-3)
    assert 21e-3 * (1 - 1e-12) <= t < lock_step  # never below one latency plus all bytes


def test_channels_on_disjoint_links_do_not_share():
    # Step 0 loads link 0, step 1 link 1; shares 0.9 / 0.1, no latency. Both start on
    # link 0 at half speed: the small one's 1 ms is through at 2 ms; it then moves its
    # step 1 (1 ms) on link 1 at full speed, beside the big one on link 0, which has
    # 8 ms left alone (ends at 10 ms) and then 9 ms on link 1: 19 ms, against 20 ms
    # in lock-step.
    work = np.array([[10e-3, 0.0], [0.0, 10e-3]])
    delay = np.zeros(2)
    assert channel_time(work, delay, (1.0,)) == pytest.approx(20e-3, rel=1e-12)
    assert channel_time(work, delay, (0.9, 0.1)) == pytest.approx(19e-3, rel=1e-12)


@pytest.mark.parametrize("topology,size", [("dgx_a100_x4", 16 << 20),
                                           ("mn1_infiniband", 1 << 20)])
def test_the_channel_model_agrees_with_the_simulator(topology, size):
    """mcf on 2 and 4 channels under nccl: the planner's channel estimate is within 3%
    of the event simulation of the channelled plan (measured: within 2.2% on
    dgx_a100_x4, fat64, rail64 and mn1_infiniband, docs/RESULTS.md), and the plan is
    no slower than one channel."""
    cluster = load_topology(topology)
    one = simulate(cluster, plan_mcf(cluster, size=size), size).time_s
    for channels in (2, 4):
        schedule = plan_mcf(cluster, size=size, channels=channels)
        assert schedule.nchannels == channels
        simulated = simulate(cluster, schedule, size).time_s
        assert schedule.meta["estimate_s"] == pytest.approx(simulated, rel=0.03)
        assert simulated <= one * 1.001


def test_channels_meet_the_latency_aware_target_where_one_channel_does_not():
    """The #33 target on dgx_a100_x4 at 256 MiB under nccl: one lock-step channel is
    1.16x the latency-aware bound, four channels are under 1.10x (simulated), and the
    planner's channel model says so within 3%."""
    cluster = load_topology("dgx_a100_x4")
    size = 256 << 20
    bound = latency_bound(cluster, size, profile="nccl")
    one = simulate(cluster, plan_mcf(cluster, size=size), size).time_s
    schedule = plan_mcf(cluster, size=size, channels=4)
    four = simulate(cluster, schedule, size).time_s
    assert one / bound > 1.15
    assert four / bound < 1.10
    assert schedule.meta["estimate_s"] == pytest.approx(four, rel=0.03)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_sharded_collectives_on_channels_verify_and_gain(collective):
    cluster = load_topology("dgx_a100_x4")
    size = 256 << 20
    one = plan_mcf(cluster, size=size, collective=collective)
    two = plan_mcf(cluster, size=size, collective=collective, channels=2)
    verify(two)
    assert two.collective == collective and two.nchannels == 2
    assert two.meta["estimate_s"] < one.meta["estimate_s"]
    assert simulate(cluster, two, size).time_s == pytest.approx(two.meta["estimate_s"],
                                                                 rel=0.03)


def test_the_channels_share_the_op_budget_and_caps():
    cluster = load_topology("dgx_a100_x4")
    size = 16 << 20
    schedule = plan_mcf(cluster, size=size, channels=4, max_chunks=160, max_ops=20_000)
    assert schedule.nchunks <= 160
    assert schedule.nops <= 20_000
    with pytest.raises(PlannerError, match="channels: must be an integer"):
        plan_mcf(cluster, size=size, channels=0)


def test_plan_passes_channels_to_mcf_and_cuts_the_others():
    cluster = load_topology("dgx_a100_x4")
    size = 16 << 20
    mcf = topoplan.plan(cluster, "mcf", size=size, channels=2)
    assert mcf.nchannels == 2 and "estimate_one_channel_s" in mcf.meta
    ring = topoplan.plan(cluster, "ring", size=size, channels=2)
    assert ring.nchannels == 2 and "estimate_one_channel_s" not in ring.meta


def test_vectored_mcf_prices_one_op_per_peer_and_step():
    """A reduce-scatter's fan-out posts one op per box mate and step once vectored:
    mcf priced so is cheaper than priced shard by shard, its estimate is the simulated
    time (within 3%), and the plan verifies."""
    cluster = load_topology("dgx_a100_x4")
    size = 256 << 20
    plain = plan_mcf(cluster, size=size, collective="reduce_scatter")
    vectored = plan_mcf(cluster, size=size, collective="reduce_scatter", vectored=True)
    verify(vectored)
    assert vectored.meta["vectored"] is True
    assert any(op.more for _, _, op in vectored.ops())
    assert vectored.nops < plain.nops
    assert vectored.meta["estimate_s"] < plain.meta["estimate_s"]
    simulated = simulate(cluster, vectored, size).time_s
    assert vectored.meta["estimate_s"] == pytest.approx(simulated, rel=0.03)
    # plan() hands vectored to mcf (which prices it) and vectorizes the others itself
    assert topoplan.plan(cluster, "mcf", size=size, collective="reduce_scatter",
                         vectored=True).meta.get("vectored") is True
    ring = topoplan.plan(cluster, "ring", size=size, collective="reduce_scatter",
                         vectored=True)
    assert "vectored" not in ring.meta
    with pytest.raises(PlannerError, match="vectored must be True or False"):
        plan_mcf(cluster, size=size, vectored="yes")


def test_mcf_picks_its_channels_by_its_estimate():
    cluster = load_topology("dgx_a100_x4")
    size = 16 << 20
    schedule = plan_mcf(cluster, size=size, channels="auto")
    options = schedule.meta["channel_candidates"]
    assert set(options) == {"1", "2", "4"}
    simulated = schedule.meta.get("simulated_s")
    if simulated:  # the event simulator had the last word among the best estimates
        label = f"{schedule.meta['construction']} on {schedule.meta['channels']} channels"
        assert simulated[label] == min(simulated.values())
        assert set(simulated) <= set(schedule.meta["candidates"])
    else:
        assert schedule.meta["estimate_s"] == pytest.approx(min(options.values()))
    # under nccl the step latency is worth hiding here: more than one channel wins
    assert schedule.nchannels == schedule.meta["channels"] > 1
    with pytest.raises(PlannerError,
                       match="ring cannot pick its channels \\(only forest and mcf do\\)"):
        topoplan.plan(cluster, "ring", size=size, channels="auto")
    with pytest.raises(PlannerError, match="ring, rhd cannot pick their channels"):
        topoplan.plan(cluster, "auto", size=size, channels="auto", candidates=["ring", "rhd"])
    # auto compares mcf on the channels it picks with the others on one
    chosen = topoplan.plan(cluster, "auto", size=size, channels="auto",
                           candidates=["ring", "mcf"])
    assert chosen.nchannels > 1 and chosen.meta["channel_candidates"]


def test_cli_plans_mcf_for_its_channels(capsys):
    from tests.support.clusters import topology_path
    from topoplan.cli import main

    path = str(topology_path("dgx_a100_x4"))
    assert main(["plan", path, "-a", "mcf", "-s", "16MiB", "--channels", "auto"]) == 0
    out = capsys.readouterr().out
    assert "mcf planned for 4 channels" in out or "mcf planned for 2 channels" in out
    assert main(["plan", path, "-a", "ring", "-s", "16MiB", "--channels", "auto"]) == 1
    assert "channels='auto': ring cannot pick its channels (only forest and mcf do)" in \
        capsys.readouterr().err
