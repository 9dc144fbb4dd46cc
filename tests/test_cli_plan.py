"""``topoplan plan`` through the real CLI: table, --json contract, -o, errors."""

import json
import subprocess
import sys

import pytest

import topoplan

DDL = "topologies/ddl_two_switch.yaml"


def run(*args, check=True):
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, check=check)


def test_plan_json_follows_design_md(tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", DDL, "--size", "64MiB", "--json", "-o", str(out))
    data = json.loads(result.stdout)
    assert {"cluster", "nranks", "size_bytes", "lower_bound_s", "chosen", "candidates"} <= set(data)
    assert data["cluster"] == "ddl-two-switch" and data["nranks"] == 4
    assert data["size_bytes"] == 64 << 20
    names = [c["algorithm"] for c in data["candidates"]]
    assert {"ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf"} <= set(names)
    for c in data["candidates"]:
        assert {"algorithm", "time_s", "algbw_GBps", "busbw_GBps"} <= set(c)
        assert c["time_s"] >= data["lower_bound_s"] * (1 - 1e-9)
        assert c["busbw_GBps"] == pytest.approx(c["algbw_GBps"] * 2 * 3 / 4)
    fastest = min(data["candidates"], key=lambda c: c["time_s"])
    assert data["chosen"] == fastest["algorithm"]
    schedule = topoplan.load_schedule(out)
    topoplan.verify(schedule)
    assert schedule.algorithm == data["chosen"]
    assert schedule.meta["size_bytes"] == 64 << 20


def test_plan_table_names_the_bound_and_the_chosen_planner():
    result = run("plan", DDL, "--size", "1MiB", "--algorithm", "ring", "--candidates", "ring,rhd")
    assert "lower bound" in result.stdout
    assert "ring *" in result.stdout
    assert "chosen: ring" in result.stdout
    assert "bottleneck cut: 2 GPUs behind 10 GB/s" in result.stdout


def test_unknown_planner_is_one_line_error():
    result = run("plan", DDL, "--algorithm", "magic", check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("topoplan: error: ") and "magic" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_bad_size_is_a_usage_error():
    result = run("plan", DDL, "--size", "12 parsecs", check=False)
    assert result.returncode == 2 and "unknown unit" in result.stderr


def test_one_gpu_cluster_plans_shows_and_prints_valid_json(tmp_path):
    cluster = tmp_path / "one.yaml"
    cluster.write_text("name: one\nboxes:\n  - {name: solo, gpus: 1}\n")
    data = json.loads(run("plan", str(cluster), "--json").stdout)
    assert data["nranks"] == 1 and data["lower_bound_s"] == 0
    assert all(c["time_s"] == 0 and c["algbw_GBps"] is None for c in data["candidates"])
    table = run("plan", str(cluster)).stdout
    assert "inf" not in table
    result = run("show", str(cluster), "-o", str(tmp_path / "one.png"), check=False)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "one.png").exists()


def test_output_into_a_missing_folder_is_one_line_error(tmp_path):
    target = tmp_path / "missing" / "plan.json"
    result = run("plan", DDL, "--candidates", "ring", "-o", str(target), check=False)
    assert result.returncode == 1
    assert result.stderr == f"topoplan: error: {target}: cannot write schedule: No such file or directory\n"
    assert not (tmp_path / "missing").exists()
