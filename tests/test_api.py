"""The Python API agrees with the CLI: one default cost profile, the same refusal of a plan
made for another cluster, and sizes written as the CLI writes them (``"256MiB"``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import topoplan
from tests.support.clusters import ROOT, load_topology, topology_path, topology_text
from topoplan.analysis.bound import collective_bound, latency_bound, lower_bound, rsag_bound
from topoplan.analysis.cost import DEFAULT_PROFILE
from topoplan.errors import EstimateError, PlannerError, ScheduleError
from topoplan.estimate import estimate
from topoplan.estimate.models import uniform_model
from topoplan.planners.auto import compare, plan_auto

DDL = "ddl_two_switch"


def cli_json(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "topoplan", *args, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    return json.loads(done.stdout)


def test_simulate_defaults_to_the_profile_the_cli_uses(tmp_path):
    cluster = load_topology(DDL)
    schedule = topoplan.plan(cluster, "ring", size=1 << 20)
    report = topoplan.simulate(cluster, schedule, 1 << 20)
    assert DEFAULT_PROFILE == "nccl" and report.profile == "nccl"
    path = tmp_path / "ring.json"
    schedule.save(path)
    data = cli_json("simulate", str(topology_path(DDL)), str(path), "--sizes", "1MiB")
    assert data["profile"]["name"] == "nccl"
    assert data["results"][0]["time_s"] == pytest.approx(report.time_s, rel=1e-12)
    ideal = topoplan.simulate(cluster, schedule, 1 << 20, profile="ideal")
    assert ideal.profile == "ideal" and ideal.time_s < report.time_s


def test_alpha_and_reduce_bandwidth_replace_the_profiles_own_as_the_cli_options_do(tmp_path):
    cluster = load_topology(DDL)
    schedule = topoplan.plan(cluster, "ring", size=1 << 20)
    report = topoplan.simulate(cluster, schedule, 1 << 20, alpha=1e-6, reduce_bandwidth=1e12)
    assert report.profile == "nccl*"
    path = tmp_path / "ring.json"
    schedule.save(path)
    data = cli_json("simulate", str(topology_path(DDL)), str(path), "--sizes", "1MiB",
                    "--alpha", "1 us", "--reduce-bandwidth", "1 TB/s")
    assert data["results"][0]["time_s"] == pytest.approx(report.time_s, rel=1e-12)


def test_simulate_refuses_a_plan_for_another_cluster_of_the_same_size():
    cluster = load_topology(DDL)
    # The same 4 GPUs with a wider inter-switch link: another graph, another fingerprint.
    other = topoplan.loads_cluster(topology_text(DDL).replace("10 GB/s", "20 GB/s"),
                                   "other.yaml")
    assert other.nranks == cluster.nranks
    schedule = topoplan.plan(other, "ring", size=1 << 20)
    with pytest.raises(ScheduleError, match=r"^the plan was planned for another cluster "
                                            r"\(.*\); .* or pass force=True to use it anyway$"):
        topoplan.simulate(cluster, schedule, 1 << 20)
    assert topoplan.simulate(cluster, schedule, 1 << 20, force=True).time_s > 0


def test_sizes_are_taken_as_strings_wherever_a_size_is_taken():
    cluster = load_topology(DDL)
    schedule = topoplan.plan(cluster, "ring", size="1MiB")
    assert schedule.meta["size_bytes"] == 1 << 20
    for name in ("ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf"):
        assert topoplan.plan(cluster, name, size="1MiB") == topoplan.plan(cluster, name,
                                                                           size=1 << 20)
    auto = topoplan.plan(cluster, size="1MiB", candidates=["ring", "rhd"])
    assert auto == plan_auto(cluster, size=1 << 20, candidates=["ring", "rhd"])
    assert [row[0] for row in compare(cluster, "1MiB", ["ring", "rhd"])] == \
        [row[0] for row in compare(cluster, 1 << 20, ["ring", "rhd"])]
    assert topoplan.simulate(cluster, schedule, "1MiB").time_s == \
        topoplan.simulate(cluster, schedule, 1 << 20).time_s
    for bound in (lower_bound, rsag_bound, collective_bound, latency_bound):
        assert bound(cluster, "1MiB") == bound(cluster, 1 << 20)
    model = uniform_model(1 << 20)
    a = estimate(cluster, model=model, compute_s=0.1, fusion="1MiB", algorithm="ring")
    b = estimate(cluster, model=model, compute_s=0.1, fusion=1 << 20, algorithm="ring")
    assert a.iteration_s == b.iteration_s and len(a.buckets) == len(b.buckets) > 1


def test_a_bad_size_string_names_the_size():
    cluster = load_topology(DDL)
    with pytest.raises(PlannerError, match=r"^ring: size: unknown unit 'parsecs'"):
        topoplan.plan(cluster, "ring", size="12 parsecs")
    with pytest.raises(PlannerError, match=r"^auto: size: unknown unit"):
        topoplan.plan(cluster, size="12 parsecs")
    with pytest.raises(ValueError, match=r"unknown unit"):
        topoplan.simulate(cluster, topoplan.plan(cluster, "ring"), "12 parsecs")
    with pytest.raises(EstimateError, match=r"^fusion threshold: unknown unit"):
        estimate(cluster, model=uniform_model(1000), compute_s=0.1, fusion="12 parsecs")


def test_plan_and_simulate_take_a_cluster_file_as_the_cli_does(tmp_path):
    from pathlib import Path

    from topoplan.errors import ClusterSpecError

    path = Path(__file__).resolve().parents[1] / "topologies" / "ddl_two_switch.yaml"
    by_path = topoplan.plan(str(path), algorithm="ring", size="1MiB")
    by_cluster = topoplan.plan(topoplan.load_cluster(path), algorithm="ring", size="1MiB")
    assert by_path == by_cluster
    assert topoplan.simulate(path, by_path, "1MiB").time_s == \
        topoplan.simulate(topoplan.load_cluster(path), by_cluster, "1MiB").time_s
    with pytest.raises(ClusterSpecError, match="missing.yaml"):
        topoplan.plan(tmp_path / "missing.yaml", algorithm="ring")
    with pytest.raises(ClusterSpecError, match="expected a Cluster .* got int"):
        topoplan.plan(3, algorithm="ring")
