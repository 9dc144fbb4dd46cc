"""Cluster fingerprints: what changes them, and the commands that refuse a plan for
another cluster (with --force to run it anyway)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import topoplan
from topoplan.errors import ScheduleError
from topoplan.ir.fingerprint import META_KEY, check_fingerprint, cluster_fingerprint

ROOT = Path(__file__).resolve().parent.parent
DDL = ROOT / "topologies" / "ddl_two_switch.yaml"

BASE = """
name: base
switches: [sw0, sw1]
boxes:
  - {name: "a{i}", count: 2, gpus: 2, fabric: {bandwidth: 50 GB/s},
     nics: [{switch: sw0, bandwidth: 100 Gbit/s, latency: 2 us}]}
  - {name: "b{i}", count: 2, gpus: 2, fabric: {bandwidth: 50 GB/s},
     nics: [{switch: sw1, bandwidth: 100 Gbit/s, latency: 2 us}]}
links:
  - {a: sw0, b: sw1, bandwidth: 10 GB/s, latency: 1 us}
"""


def fp(text: str) -> str:
    return cluster_fingerprint(topoplan.loads_cluster(text, "x.yaml"))


@pytest.mark.parametrize("old, new", [
    ("name: base", "name: renamed"),
    ('"a{i}"', '"host{i}"'),
    ("sw1", "spine"),
    ("100 Gbit/s", "12.5 GB/s"),
])
def test_names_and_spellings_keep_the_fingerprint(old, new):
    assert fp(BASE.replace(old, new)) == fp(BASE)


@pytest.mark.parametrize("old, new", [
    ("bandwidth: 10 GB/s", "bandwidth: 20 GB/s"),
    ("latency: 1 us", "latency: 3 us"),
    ("fabric: {bandwidth: 50 GB/s},\n     nics: [{switch: sw1",
     "fabric: {bandwidth: 60 GB/s},\n     nics: [{switch: sw1"),
    ('{name: "b{i}", count: 2, gpus: 2', '{name: "b{i}", count: 2, gpus: 3'),
    ("nics: [{switch: sw1", "nics: [{switch: sw0"),  # every box on one switch
])
def test_what_a_plan_depends_on_changes_it(old, new):
    assert BASE.count(old) == 1
    assert fp(BASE.replace(old, new)) != fp(BASE)


def test_rank_order_changes_it():
    # The same boxes with the b boxes listed first: ranks 0..3 move to the other switch.
    lines = BASE.splitlines()
    a, b = lines.index('  - {name: "a{i}", count: 2, gpus: 2, fabric: {bandwidth: 50 GB/s},'), \
        lines.index('  - {name: "b{i}", count: 2, gpus: 2, fabric: {bandwidth: 50 GB/s},')
    swapped = "\n".join(lines[:a] + lines[b:b + 2] + lines[a:a + 2] + lines[b + 2:])
    assert topoplan.loads_cluster(swapped).boxes[0].name == "b0"
    assert fp(swapped) != fp(BASE)


def test_plan_records_it_and_check_refuses_another_cluster():
    cluster = topoplan.loads_cluster(BASE, "base.yaml")
    other = topoplan.loads_cluster(BASE.replace("10 GB/s", "40 GB/s"), "other.yaml")
    schedule = topoplan.plan(cluster, "ring", size=1 << 20)
    assert schedule.meta[META_KEY] == cluster_fingerprint(cluster)
    check_fingerprint(schedule, cluster)
    with pytest.raises(ScheduleError) as info:
        check_fingerprint(schedule, other, plan="plan.json")
    message = str(info.value)
    assert message.startswith("plan.json was planned for another cluster (cluster 'base', "
                              f"fingerprint {cluster_fingerprint(cluster)}) than other.yaml "
                              f"(cluster 'base', fingerprint {cluster_fingerprint(other)})")
    assert "--force" in message and "\n" not in message
    check_fingerprint(schedule, other, force=True)
    old = schedule.with_meta()
    del old.meta[META_KEY]  # a plan from before the key existed
    check_fingerprint(old, other)


# ---- through the CLI -------------------------------------------------------------------
def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A ring plan for ddl_two_switch, and a cluster like it whose narrow link is wider."""
    tmp = tmp_path_factory.mktemp("fp")
    plan = tmp / "ddl.json"
    assert run("plan", str(DDL), "-a", "ring", "--candidates", "ring", "--size", "1MiB",
               "-o", str(plan)).returncode == 0
    other = tmp / "wider.yaml"
    other.write_text(DDL.read_text().replace("bandwidth: 10 GB/s", "bandwidth: 40 GB/s"))
    assert DDL.read_text() != other.read_text()
    old = tmp / "old.json"  # the same plan without the key
    data = json.loads(plan.read_text())
    del data["meta"][META_KEY]
    old.write_text(json.dumps(data))
    return plan, other, old


def test_plan_output_records_the_fingerprint(files):
    plan, _, _ = files
    recorded = topoplan.load_schedule(plan).meta[META_KEY]
    assert recorded == cluster_fingerprint(topoplan.load_cluster(DDL))


@pytest.mark.parametrize("command", [
    ["simulate", "{other}", "{plan}", "--sizes", "1MiB"],
    ["show", "{other}", "{plan}", "-o", "{tmp}/x.png"],
    ["bench", "--plan", "{plan}", "--cluster", "{other}", "--sizes", "1KiB"],
])
def test_commands_refuse_a_plan_for_another_cluster(files, command):
    plan, other, _ = files
    argv = [a.format(plan=plan, other=other, tmp=other.parent) for a in command]
    result = run(*argv)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"topoplan: error: {plan} was planned for another cluster "
                                    "(cluster 'ddl-two-switch', fingerprint sha256:")
    assert f"than {other} (cluster 'ddl-two-switch', fingerprint sha256:" in result.stderr
    assert result.stderr.rstrip().endswith("or pass --force to use it anyway")


def test_force_and_plans_without_a_fingerprint_run(files):
    plan, other, old = files
    forced = run("simulate", str(other), str(plan), "--sizes", "1MiB", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    unmarked = run("simulate", str(other), str(old), "--sizes", "1MiB", "--json")
    assert unmarked.returncode == 0, unmarked.stderr
    assert json.loads(forced.stdout)["results"] == json.loads(unmarked.stdout)["results"]
    same = run("simulate", str(DDL), str(plan), "--sizes", "1MiB", "--json")
    assert same.returncode == 0, same.stderr
