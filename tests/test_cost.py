"""Cost profiles: the YAML form, the shipped profiles, and the simulator charging them.

The simulated times are checked against alpha-beta formulas worked out by hand (the
model of docs/COST_MODEL.md), and the array engine against the reference engine on
random schedules with every cost switched on.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.clusters import switch_cluster
from tests.support.schedules import ring_schedule

import topoplan.analysis.cost
from topoplan.cluster import loads_cluster
from topoplan.analysis.cost import (DEFAULT_PROFILE, IDEAL, CostProfile, get_profile, load_profile,
                           loads_profile, profile_names)
from topoplan.errors import ProfileError, UnitWarning
from topoplan.ir.schedule import build_schedule, equal_chunks, recv, send
from topoplan.analysis.sim.reference import simulate_reference as _simulate_reference
from topoplan.analysis.sim import simulate

US = 1e-6
PROFILE = CostProfile("test", alpha_box=2 * US, alpha_network=5 * US, op_overhead=1 * US,
                      step_overhead=3 * US, call_overhead=10 * US, reduce_bandwidth=4e9)


# ---- the YAML form ------------------------------------------------------------------
@pytest.mark.filterwarnings("error::topoplan.errors.UnitWarning")
def test_shipped_profiles_write_their_units():
    for name in profile_names():
        load_profile(Path(topoplan.analysis.cost.__file__).with_name("profiles") / f"{name}.yaml")


def test_shipped_profiles_load_and_name_their_sources():
    names = profile_names()
    assert {"ideal", "nccl", "mpi", "gloo"} <= set(names)
    assert DEFAULT_PROFILE == "nccl"
    for name in names:
        profile = get_profile(name)
        assert profile.name == name
        if name != "ideal":
            assert profile.sources, f"{name}.yaml must say where its numbers come from"
            assert not profile.is_ideal
    assert get_profile("ideal").is_ideal and get_profile("ideal") == IDEAL
    nccl = get_profile("nccl")
    assert nccl.alpha_box == pytest.approx(3.4e-6) and nccl.alpha_network == pytest.approx(14e-6)
    # Measured on a machine by topoplan calibrate: they predict runs on it, and say how.
    for name in ("mpi", "gloo"):
        profile = get_profile(name)
        assert profile.host_bandwidth and profile.host_ranks == 8
        record = profile.calibration
        assert record["tool"] == "topoplan calibrate" and record["samples"]
        assert all(abs(r["residual_pct"]) < 60 for r in record["samples"]
                   if r["residual_pct"] is not None)
        assert profile.host_cluster().nranks == 8


def test_small_messages_pay_their_own_alpha():
    """MPI's eager sends, NCCL's LL: messages up to small_max bytes pay the small alpha."""
    profile = loads_profile("name: two-protocols\nalpha: 20 us\n"
                            "small_messages: {max_bytes: 4 KiB, alpha: 2 us}\n")
    assert profile.small_max == 4096 and profile.small_alpha_box == pytest.approx(2e-6)
    assert loads_profile(profile.dumps()) == profile
    cluster = switch_cluster(4, bandwidth="1000 GB/s", latency="0 us")
    schedule = ring_schedule([0, 1, 2, 3])
    small = simulate(cluster, schedule, 4 * 4096, profile=profile)  # 4 KiB messages
    large = simulate(cluster, schedule, 4 * 4100, profile=profile)  # just above
    assert small.breakdown["latency"] == pytest.approx(6 * 2e-6, rel=1e-9)
    assert large.breakdown["latency"] == pytest.approx(6 * 20e-6, rel=1e-9)
    with pytest.raises(ProfileError, match="small_messages.max_bytes"):
        loads_profile("name: x\nsmall_messages: {max_bytes: lots, alpha: 1 us}\n", "f.yaml")


def test_profile_round_trips_through_yaml(tmp_path):
    path = tmp_path / "p.yaml"
    PROFILE.save(path)
    assert load_profile(path) == PROFILE
    same = PROFILE.with_costs(alpha_box=5 * US)
    assert loads_profile(same.dumps()) == same
    assert "alpha: 5 us" in same.dumps()  # one alpha for both classes is written as one
    assert get_profile(str(path)) == PROFILE


def test_profile_units_and_bare_numbers():
    with pytest.warns(UnitWarning) as caught:
        p = loads_profile("name: x\nalpha: {box: 500 ns, network: 0.02 ms}\nop_overhead: 2\n"
                          "step_overhead: 1 us\ncall_overhead: 0\nreduce_bandwidth: 80 Gbit/s\n"
                          "host: {bandwidth: 1.5, ranks: 4}\n", "p.yaml")
    # Every bare number but 0 (0 in any unit) is named, with what it was read as.
    assert [str(w.message) for w in caught] == [
        "p.yaml:3: op_overhead: bare number 2 read as 2 us; write '2 us' "
        "(or '2 ns', '2 ms' if that is what you meant)",
        "p.yaml:7: host.bandwidth: bare number 1.5 read as 1.5 GB/s (12 Gbit/s); "
        "write '1.5 GB/s' or '1.5 Gbit/s'"]
    assert p.alpha_box == pytest.approx(0.5e-6) and p.alpha_network == pytest.approx(20e-6)
    assert p.op_overhead == pytest.approx(2e-6)  # bare numbers are microseconds
    assert p.reduce_bandwidth == pytest.approx(10e9)
    assert p.host_bandwidth == pytest.approx(1.5e9) and p.host_ranks == 4
    assert loads_profile("name: y\nreduce_bandwidth: none\n").reduce_bandwidth is None


@pytest.mark.parametrize("text, where", [
    ("name: x\nop_overhead: -1 us\n", "f.yaml:2: op_overhead: must be >= 0"),
    ("name: x\nalpha: {box: 1 us}\n", "f.yaml:2: alpha.network: missing"),
    ("name: x\nalpha: {box: 1 us, network: 2 us, rack: 3 us}\n", "f.yaml:2: alpha.rack: unknown"),
    ("name: x\nstep_overhed: 1 us\n", "f.yaml:2: step_overhed: unknown key"),
    ("name: x\nreduce_bandwidth: 0 GB/s\n", "f.yaml:2: reduce_bandwidth: must be > 0"),
    ("name: x\ncall_overhead: fast\n", "f.yaml:2: call_overhead: not a latency"),
    ("alpha: 1 us\n", "f.yaml:1: name: missing required key"),
    ("name: x\nhost: {ranks: 3}\n", "f.yaml:2: host.bandwidth: missing"),
    ("- a\n- b\n", "f.yaml:1: a cost profile is a mapping"),
    ("name: x\nalpha: [1\n", "f.yaml:3: YAML syntax error"),
    ("name: x\x07\n", "f.yaml:1: not a YAML text"),
])
def test_bad_profiles_name_file_line_and_key(text, where):
    with pytest.raises(ProfileError) as info:
        loads_profile(text, "f.yaml")
    assert str(info.value).startswith(where)


def test_unknown_profile_name_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ProfileError, match="unknown cost profile 'ncll'.*nccl"):
        get_profile("ncll")
    with pytest.raises(ProfileError, match="cannot read cost profile"):
        get_profile(str(tmp_path / "missing.yaml"))


def test_host_cluster_is_one_box_of_the_calibrated_ranks():
    profile = PROFILE.with_costs(host_bandwidth=2e9, host_ranks=8)
    host = profile.host_cluster()
    assert host.nranks == 8 and len(host.boxes) == 1
    assert host.gpu_bandwidth(0) == pytest.approx(2e9)
    with pytest.raises(ProfileError, match="no host bandwidth"):
        get_profile("nccl").host_cluster()


# ---- the simulator under a profile ----------------------------------------------------
def ring_time(n: int, size: int, bandwidth: float, latency: float, p: CostProfile) -> float:
    """A ring by hand: every step posts a recv and a send (2 ops), pays alpha and the path
    latency and moves size/n bytes; the n - 1 reduce-scatter steps then add size/n bytes."""
    step = p.step_overhead + 2 * p.op_overhead + p.alpha_network + latency + size / n / bandwidth
    adds = (n - 1) * size / n / p.reduce_bandwidth
    return p.call_overhead + 2 * (n - 1) * step + adds


@pytest.mark.parametrize("n", [2, 4, 7])
def test_ring_matches_the_alpha_beta_formula(n):
    size = 4 * n * (1 << 16)  # equal chunks (up to rounding 1/7 in floating point)
    cluster = switch_cluster(n, bandwidth="10 GB/s", latency="1 us")  # 2 us a path
    schedule = ring_schedule(list(range(n)))
    report = simulate(cluster, schedule, size, profile=PROFILE)
    expected = ring_time(n, size, 10e9, 2e-6, PROFILE)
    assert report.time_s == pytest.approx(expected, rel=1e-4)
    parts = report.breakdown
    assert parts["bandwidth"] == pytest.approx(2 * (n - 1) * size / n / 10e9, rel=1e-4)
    assert parts["latency"] == pytest.approx(2 * (n - 1) * (5e-6 + 2e-6), rel=1e-9)
    assert parts["overhead"] == pytest.approx(10e-6 + 2 * (n - 1) * (3e-6 + 2e-6), rel=1e-9)
    assert parts["reduce"] == pytest.approx((n - 1) * size / n / 4e9, rel=1e-4)
    assert sum(parts.values()) == pytest.approx(report.time_s, rel=1e-12)
    assert report.profile == "test" and report.messages == 2 * (n - 1) * n


def test_ideal_profile_is_the_links_alone_and_nccl_the_default():
    cluster = switch_cluster(4, latency="0 us")
    schedule = ring_schedule([0, 1, 2, 3])
    ideal = simulate(cluster, schedule, 1 << 16, profile="ideal")
    assert ideal.time_s == pytest.approx(6 * (1 << 14) / 10e9)
    assert ideal.breakdown["bandwidth"] == pytest.approx(ideal.time_s)
    # No profile named: the runtime's, as topoplan plan / simulate and topoplan.plan do.
    default = simulate(cluster, schedule, 1 << 16)
    assert default.profile == DEFAULT_PROFILE == "nccl"
    assert default.time_s == simulate(cluster, schedule, 1 << 16, profile="nccl").time_s
    assert default.time_s > ideal.time_s


def test_alpha_per_link_class():
    """Two boxes of two GPUs: in-box messages pay alpha.box, the others alpha.network."""
    cluster = loads_cluster("""
name: two-boxes
switches: [sw]
boxes:
  - {name: "b{i}", count: 2, gpus: 2, fabric: {bandwidth: 100 GB/s, latency: 0 us},
     nics: [{switch: sw, bandwidth: 100 GB/s, latency: 0 us}]}
""")
    box = ring_schedule([0, 1, 2, 3])  # hops 0-1 and 2-3 inside a box, 1-2 and 3-0 across
    profile = CostProfile("classes", alpha_box=1 * US, alpha_network=50 * US)
    report = simulate(cluster, box, 64, profile=profile)
    # Every ring step has a network hop, which sets its pace.
    assert report.time_s == pytest.approx(6 * 50e-6, rel=1e-3)
    inside = build_schedule(4, equal_chunks(2), [
        [[send(1, 0), recv(1, 1, reduce=True)], [send(1, 1), recv(1, 0)]],
        [[send(0, 1), recv(0, 0, reduce=True)], [send(0, 0), recv(0, 1)]],
        [[send(3, 0), recv(3, 1, reduce=True)], [send(3, 1), recv(3, 0)]],
        [[send(2, 1), recv(2, 0, reduce=True)], [send(2, 0), recv(2, 1)]]])
    only_box = simulate(cluster, inside, 64, profile=profile)
    assert only_box.time_s == pytest.approx(2 * 1e-6, rel=1e-2)


def test_posting_is_serial_receives_first():
    """Rank 0 sends k messages in one step to k peers: the i-th send is posted after the
    step overhead and i + 1 ops (the k receives of the others are posted at once)."""
    k = 5
    cluster = switch_cluster(k + 1, bandwidth="1000 GB/s", latency="0 us")
    steps = [[[send(p, 0) for p in range(1, k + 1)]]] + [[[recv(0, 0)]] for _ in range(k)]
    schedule = build_schedule(k + 1, [1.0], steps)
    profile = CostProfile("post", op_overhead=1 * US, step_overhead=2 * US, alpha_box=0.0,
                          alpha_network=4 * US)
    report = simulate(cluster, schedule, 4, profile=profile, record=True)
    starts = sorted(t.start_s for t in report.transfers)
    assert starts == pytest.approx([2e-6 + (i + 1) * 1e-6 for i in range(k)])
    assert report.time_s == pytest.approx(2e-6 + k * 1e-6 + 4e-6, rel=1e-6)
    # With receives to post too, sends come after them.
    steps[0][0] = [recv(1, 0)] + steps[0][0][1:] + [send(1, 0)]
    steps[1][0] = [send(0, 0), recv(0, 0)]
    both = build_schedule(k + 1, [1.0], steps)
    timed = simulate(cluster, both, 4, profile=profile, record=True)
    first = next(t for t in timed.transfers if t.src == 0 and t.dst == 1)
    # Rank 0 posts its recv, then sends to 2..k, then to 1: the last of k + 1 ops.
    assert first.start_s == pytest.approx(2e-6 + (k + 1) * 1e-6)


def test_empty_messages_cost_nothing():
    cluster = switch_cluster(4)
    schedule = ring_schedule([0, 1, 2, 3])
    report = simulate(cluster, schedule, 0, profile=PROFILE)
    assert report.time_s == pytest.approx(PROFILE.call_overhead) and report.messages == 0


def test_alpha_and_reduce_bandwidth_replace_the_profiles_own():
    cluster, schedule = switch_cluster(2), ring_schedule([0, 1])
    mixed = simulate(cluster, schedule, 64, profile=PROFILE, alpha=1e-6, reduce_bandwidth=2e9)
    same = PROFILE.with_costs(alpha_box=1e-6, alpha_network=1e-6, reduce_bandwidth=2e9)
    assert mixed.profile == "test*"
    assert mixed.time_s == simulate(cluster, schedule, 64, profile=same).time_s
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        simulate(cluster, schedule, 64, alpha=-1e-6)
    with pytest.raises(ProfileError, match="unknown cost profile"):
        simulate(cluster, schedule, 64, profile="nope")


def _random_schedule(data: st.DataObject, n: int):
    """A lock-step schedule: every step pairs ranks in a random matching and moves a
    random range of chunks each way (some reducing), several messages per pair."""
    nchunks = data.draw(st.integers(1, 6))
    steps: list[list[list]] = [[] for _ in range(n)]
    for _ in range(data.draw(st.integers(1, 5))):
        perm = data.draw(st.permutations(range(n)))
        for i in range(0, n - 1, 2):
            a, b = perm[i], perm[i + 1]
            ops_a, ops_b = [], []
            for _ in range(data.draw(st.integers(1, 3))):
                c = data.draw(st.integers(0, nchunks - 1))
                count = data.draw(st.integers(1, nchunks - c))
                red = data.draw(st.booleans())
                ops_a.append(send(b, c, count))
                ops_b.append(recv(a, c, reduce=red, count=count))
                if data.draw(st.booleans()):
                    ops_b.append(send(a, c, count))
                    ops_a.append(recv(b, c, reduce=False, count=count))
            # Interleave a's sends and recvs at random, each kind in its order (the k-th
            # send of a pair matches the k-th recv).
            sends = [op for op in ops_a if op.kind.value == "send"]
            recvs = [op for op in ops_a if op.kind.value != "send"]
            kinds = data.draw(st.permutations([0] * len(sends) + [1] * len(recvs)))
            its = (iter(sends), iter(recvs))
            steps[a].append([next(its[k]) for k in kinds])
            steps[b].append(ops_b)
    weights = data.draw(st.lists(st.integers(1, 5), min_size=nchunks, max_size=nchunks))
    return build_schedule(n, [w / sum(weights) for w in weights], steps, algorithm="random")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_engines_agree_under_every_cost(data):
    n = data.draw(st.integers(2, 6))
    gpus = data.draw(st.sampled_from([1, 2]))
    cluster = loads_cluster(f"""
name: random
switches: [sw]
boxes:
  - {{name: "b{{i}}", count: {n // gpus if n % gpus == 0 else n}, gpus: {gpus if n % gpus == 0 else 1},
      fabric: {{bandwidth: 30 GB/s, latency: 1 us}},
      nics: [{{switch: sw, bandwidth: 10 GB/s, latency: 2 us}}]}}
""")
    schedule = _random_schedule(data, n)
    profile = CostProfile(
        "random", alpha_box=data.draw(st.sampled_from([0.0, 1e-6])),
        alpha_network=data.draw(st.sampled_from([0.0, 4e-6])),
        op_overhead=data.draw(st.sampled_from([0.0, 5e-7, 3e-6])),
        step_overhead=data.draw(st.sampled_from([0.0, 2e-6])),
        call_overhead=data.draw(st.sampled_from([0.0, 7e-6])),
        reduce_bandwidth=data.draw(st.sampled_from([None, 5e9])),
        small_max=data.draw(st.sampled_from([None, 100, 4096])),
        small_alpha_box=0.2e-6, small_alpha_network=0.5e-6)
    size = data.draw(st.sampled_from([0, 64, 4096, 1 << 20]))
    fast = simulate(cluster, schedule, size, profile=profile, record=True)
    slow = _simulate_reference(cluster, schedule, size, profile=profile, record=True)
    assert fast.time_s == pytest.approx(slow.time_s, rel=1e-9, abs=1e-15)
    assert [t.start_s for t in fast.transfers] == pytest.approx(
        [t.start_s for t in slow.transfers], rel=1e-9, abs=1e-15)
    assert sum(fast.breakdown.values()) == pytest.approx(fast.time_s, rel=1e-9, abs=1e-15)
    assert sum(slow.breakdown.values()) == pytest.approx(slow.time_s, rel=1e-9, abs=1e-15)
    assert all(v >= -1e-15 for v in fast.breakdown.values())


def test_save_writes_a_comment_header_and_loads_back(tmp_path):
    path = tmp_path / "p.yaml"
    PROFILE.save(path, header="How it was made:\n  topoplan calibrate ...\n")
    text = path.read_text()
    assert text.startswith("# How it was made:\n#   topoplan calibrate ...\nname: test\n")
    assert load_profile(path) == PROFILE
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # as open() makes it, not 0600


# ---- a host with fewer cores than ranks ---------------------------------------------------
def test_ranks_working_at_once_take_turns_on_the_cores():
    """A ring of 4 ranks whose steps are all posting (10 us each, at the same time on every
    rank): on 2 cores two ranks wait for a core while two post, so every step takes twice
    as long; on 4 cores nothing waits."""
    from topoplan.cluster import host_cluster
    profile = CostProfile("posting", step_overhead=10e-6)
    schedule = ring_schedule([0, 1, 2, 3])
    alone = simulate(host_cluster("h", 4, 1e12, cores=4), schedule, 64, profile=profile)
    shared = simulate(host_cluster("h", 4, 1e12, cores=2), schedule, 64, profile=profile)
    assert alone.time_s == pytest.approx(6 * 10e-6, rel=1e-5)
    assert alone.breakdown["contention"] == 0.0
    assert shared.time_s == pytest.approx(2 * 6 * 10e-6, rel=1e-3)
    assert shared.breakdown["contention"] == pytest.approx(6 * 10e-6, rel=1e-3)
    assert sum(shared.breakdown.values()) == pytest.approx(shared.time_s, rel=1e-9)
    # The step times are on the stretched clock too.
    assert max(end for steps in shared.step_times for _, end in steps) == \
        pytest.approx(shared.time_s)
    ref = _simulate_reference(host_cluster("h", 4, 1e12, cores=2), schedule, 64,
                              profile=profile)
    assert ref.time_s == pytest.approx(shared.time_s, rel=1e-9)


def test_one_pair_at_a_time_does_not_contend():
    """A chain (reduce up 0 -> 1 -> 2 -> 3, broadcast back): one message at a time, so at
    most two ranks work at once, which 2 cores serve; only the start, where every rank
    posts its first step (a receive, for most), waits for a core."""
    from topoplan.runtime.calibrate import _chain
    from topoplan.cluster import host_cluster
    profile = CostProfile("posting", step_overhead=10e-6, reduce_bandwidth=1e9)
    schedule = _chain(4, "chain")
    on_two = simulate(host_cluster("h", 4, 1e9, cores=2), schedule, 1 << 20, profile=profile)
    on_four = simulate(host_cluster("h", 4, 1e9, cores=4), schedule, 1 << 20, profile=profile)
    assert on_two.time_s == pytest.approx(on_four.time_s + 10e-6, rel=1e-9)
    assert on_two.breakdown["contention"] == pytest.approx(10e-6, rel=1e-6)


def test_profile_host_knows_its_cores():
    profile = loads_profile("name: h\nhost: {bandwidth: 3 GB/s, cores: 2, ranks: 8}\n")
    host = profile.host_cluster()
    assert host.nranks == 8 and host.cores == 2 and profile.host_cores == 2
    assert loads_profile(profile.dumps()) == profile
    with pytest.raises(ProfileError, match="host.cores: expected an integer >= 1"):
        loads_profile("name: h\nhost: {bandwidth: 3 GB/s, cores: 0}\n", "f.yaml")
