"""``topoplan plan`` through the real CLI: table, --json contract, -o, errors."""

import json
import os
import subprocess
import sys

import pytest

import topoplan
from tests.support.tables import read_table, widest_line
from topoplan.analysis.cost import CostProfile

DDL = "topologies/ddl_two_switch.yaml"


def run(*args, check=True, columns=None):
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, check=check, env=env)


def planned(data: dict) -> list[dict]:
    """The candidates a planner made (every row but NCCL's own)."""
    return [c for c in data["candidates"] if c["algorithm"] != "nccl"]


def test_plan_json_follows_design_md(tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", DDL, "--size", "64MiB", "--json", "-o", str(out))
    data = json.loads(result.stdout)
    assert {"cluster", "nranks", "size_bytes", "lower_bound_s", "chosen", "candidates"} <= set(data)
    assert data["cluster"] == "ddl-two-switch" and data["nranks"] == 4
    assert data["size_bytes"] == 64 << 20
    names = [c["algorithm"] for c in data["candidates"]]
    assert {"ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf", "nccl"} <= set(names)
    for c in data["candidates"]:
        assert {"algorithm", "time_s", "algbw_GBps", "busbw_GBps", "speedup_vs_nccl"} <= set(c)
        assert c["time_s"] >= data["lower_bound_s"] * (1 - 1e-9)
        assert c["busbw_GBps"] == pytest.approx(c["algbw_GBps"] * 2 * 3 / 4)
    # NCCL's own collective: a row of its own with what NCCL runs.
    nccl = next(c for c in data["candidates"] if c["algorithm"] == "nccl")
    assert {"nccl_algorithm", "protocol", "channels"} <= set(nccl)
    assert nccl["speedup_vs_nccl"] == pytest.approx(1.0)
    fastest = min(planned(data), key=lambda c: c["time_s"])
    assert data["chosen"] == fastest["algorithm"]
    schedule = topoplan.load_schedule(out)
    topoplan.verify(schedule)
    assert schedule.algorithm == "auto" and schedule.meta["chosen"] == data["chosen"]
    assert schedule.meta["size_bytes"] == 64 << 20


def test_plan_table_names_the_bound_and_the_chosen_planner():
    result = run("plan", DDL, "--size", "1MiB", "--algorithm", "ring", "--candidates", "ring,rhd")
    assert "lower bound" in result.stdout
    assert "ring *" in result.stdout
    assert "chosen: ring" in result.stdout
    assert "bottleneck cut: 2 GPUs (boxes C, D) behind 10 GB/s out" in result.stdout


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


# ---- cost profiles and caps ----------------------------------------------------------------
def plan_json(*args):
    return json.loads(run("plan", DDL, "--size", "1MiB", "--candidates", "ring,rhd,tree",
                          "--json", *args).stdout)


def test_plan_profiles_by_name_and_file(tmp_path):
    path = tmp_path / "slow.yaml"
    CostProfile("slow", alpha_box=50e-6, alpha_network=50e-6, op_overhead=5e-6,
                step_overhead=20e-6, sources="a test").save(path)
    runs = {name: plan_json("--profile", name) for name in ("ideal", "nccl", str(path))}
    assert plan_json()["profile"]["name"] == "nccl"  # the default
    times = {}
    for spec, data in runs.items():
        name = data["profile"]["name"]
        assert name == {"ideal": "ideal", "nccl": "nccl"}.get(spec, "slow")
        for c in planned(data):
            parts = c["breakdown"]
            assert set(parts) == {"bandwidth", "latency", "overhead", "reduce", "contention"}
            assert sum(parts.values()) == pytest.approx(c["time_s"], rel=1e-9)
            assert c["messages"] > 0 and c["steps"] > 0 and c["chunks"] > 0
            if name == "ideal":
                assert parts["overhead"] == 0 and parts["reduce"] == 0
            times[name, c["algorithm"]] = c["time_s"]
    for algorithm in ("ring", "rhd", "tree"):
        assert times["ideal", algorithm] < times["nccl", algorithm] < times["slow", algorithm]
    table = run("plan", DDL, "--size", "1MiB", "--candidates", "ring,rhd", "--profile",
                str(path)).stdout
    assert "cost profile slow: alpha 50 us, op 5 us, step 20 us, call 0 us, reduce free" in table
    for column in ("msgs", "steps", "chunks", "lat+"):
        assert column in table


@pytest.mark.parametrize("cluster, size, candidates", [
    (DDL, "1MiB", "mcf,hierarchical,ring,ring-topo,tree,rhd"),
    ("topologies/dgx_a100_x4.yaml", "256MiB", "hierarchical,ring,rhd"),
])
def test_plan_table_fits_80_columns_and_prints_the_json_numbers(cluster, size, candidates):
    args = ("plan", cluster, "--size", size, "--candidates", candidates)
    out = run(*args, columns=80).stdout
    assert widest_line(out) <= 80 and "…" not in out
    data = json.loads(run(*args, "--json").stdout)
    rows = {row["algorithm"].removesuffix(" *"): row for row in read_table(out)}
    assert rows.keys() == {c["algorithm"] for c in data["candidates"]}
    assert rows[data["chosen"]]["algorithm"].endswith(" *")
    for c in data["candidates"]:
        row = rows[c["algorithm"]]
        if "time (ms)" in row:  # ms once the fastest takes a millisecond
            assert float(row["time (ms)"]) == pytest.approx(c["time_s"] * 1e3, abs=0.0005)
        else:
            assert float(row["time (us)"]) == pytest.approx(c["time_s"] * 1e6, abs=0.005)
        assert float(row["busbw (GB/s)"]) == pytest.approx(c["busbw_GBps"], abs=0.005)
        # vs bound is time / bound: the x the plan is slower than any schedule can be
        assert row["vs bound"] == f"{c['time_s'] / data['lower_bound_s']:.2f}x"
        assert c["x_bound"] == pytest.approx(c["time_s"] / data["lower_bound_s"])
        # NCCL's own collective is a row like the others (one native step), 1.00x itself.
        assert float(row["plan (s)"]) >= 0
        if c["algorithm"] == "nccl":
            assert row["vs nccl"] == "1.00x"
        for column, key in (("msgs", "messages"), ("steps", "steps"), ("chunks", "chunks")):
            if column in row:
                assert (row[column] == "-" and c[key] is None) or int(row[column]) == c[key]
    assert "vs bound: time / lower bound" in out


def test_plan_table_leaves_secondary_columns_out_when_narrow():
    out = run("plan", DDL, "--size", "1MiB", "--candidates", "ring,rhd", columns=60).stdout
    assert widest_line(out) <= 60 and "…" not in out
    row = read_table(out)[0]
    assert {"algorithm", "time (us)", "busbw (GB/s)", "vs bound", "plan (s)"} <= row.keys()
    assert "algbw (GB/s)" not in row
    assert "algbw (GB/s)" in out.replace("\n", " ") and "left out to fit 60 columns" in out


@pytest.mark.parametrize("profile, message", [
    ("ncll", "topoplan: error: unknown cost profile 'ncll': name one of gloo, ideal, mpi, nccl"),
    ("BAD", "topoplan: error: BAD:2: op_overhead: must be >= 0, got '-1 us'"),
    ("SYNTAX", "topoplan: error: SYNTAX:3: YAML syntax error"),
], ids=["unknown", "bad-value", "bad-syntax"])
def test_bad_profiles_are_one_line_errors(tmp_path, profile, message):
    bad, syntax = tmp_path / "bad.yaml", tmp_path / "syntax.yaml"
    bad.write_text("name: bad\nop_overhead: -1 us\n")
    syntax.write_text("name: x\nalpha: [1\n")
    profile = {"BAD": str(bad), "SYNTAX": str(syntax)}.get(profile, profile)
    message = message.replace("BAD", str(bad)).replace("SYNTAX", str(syntax))
    commands = [("plan", DDL)]
    if profile == str(bad):  # every command reads the profile the same way
        plan = tmp_path / "ring.json"
        run("plan", DDL, "--candidates", "ring", "-o", str(plan))
        commands += [("simulate", DDL, str(plan)), ("show", DDL, "-o", str(tmp_path / "x.png"))]
    for command in commands:
        result = run(*command, "--profile", profile, check=False)
        assert result.returncode == 1, (command, result.stderr)
        assert result.stderr.startswith(message), (command, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_plan_caps_leave_candidates_out():
    data = plan_json("--max-chunks", "3")
    assert [c["algorithm"] for c in planned(data)] == ["tree"]
    assert planned(data)[0]["chunks"] <= 3
    assert set(data["left_out"]) == {"ring", "rhd"}
    table = run("plan", DDL, "--candidates", "ring,tree", "--max-step-ops", "4").stdout
    assert "tree" in table and "\nleft out:" not in table
    result = run("plan", DDL, "-a", "ring", "--max-chunks", "3", check=False)
    assert result.returncode == 1
    assert result.stderr == ("topoplan: error: ring: the smallest plan has 4 chunks, over "
                             "max_chunks=3; raise the cap or pick another planner\n")


@pytest.mark.parametrize("argv", [["--size", "garbage"], ["--size", "0"], ["--size=-5MiB"], ["--size", "-5MiB"],
                                  ["--size", "1.5"]])
def test_every_bad_size_gets_one_message_naming_the_option(argv):
    result = run("plan", DDL, *argv, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = result.stderr.splitlines()[-1]
    assert message == ("topoplan plan: error: argument -s/--size: expected a whole number of "
                       f"bytes > 0, e.g. 256MiB, 64KiB or 4096; got {argv[-1].split('=')[-1]!r}")


def test_zero_in_a_size_range_names_the_option():
    result = run("simulate", DDL, "plan.json", "--sizes", "0,4", check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "topoplan simulate: error: argument --sizes: sizes must be > 0 bytes, got '0,4'; "
        "e.g. 1KiB:64MiB or 4096,1MiB")


def test_json_output_stays_json_when_the_solver_talks(tmp_path):
    """On 6 + 3 GPUs mcf's ring MILP runs HiGHS' MIP solver, which prints a line of its own
    with C's printf; stdout must still be exactly one JSON object."""
    cluster = tmp_path / "het9.yaml"
    cluster.write_text("name: het9\nswitches: [sw0]\nboxes:\n"
                       "  - {name: big, gpus: 6, fabric: {bandwidth: 100 GB/s},\n"
                       "     nics: [{switch: sw0, bandwidth: 50 Gbit/s, latency: 2 us}]}\n"
                       "  - {name: small, gpus: 3, fabric: {bandwidth: 100 GB/s},\n"
                       "     nics: [{switch: sw0, bandwidth: 50 Gbit/s, latency: 2 us}]}\n")
    result = run("plan", str(cluster), "--json", "--candidates", "mcf")
    data = json.loads(result.stdout)
    assert data["chosen"] == "mcf"
    assert data["lower_bound_s"] == pytest.approx((256 << 20) / 6.25e9)
    assert data["candidates"][0]["percent_of_bound"] <= 100


def test_plan_shows_the_latency_aware_bound_under_a_profile_with_latency():
    cluster = "topologies/dgx_a100_x4.yaml"
    out = json.loads(run("plan", cluster, "--size", "1MiB", "--algorithm", "rhd",
                         "--json").stdout)
    assert out["lower_bound_s"] < out["latency_bound_s"] <= min(
        c["time_s"] for c in out["candidates"] if c["algorithm"] != "nccl")
    text = run("plan", cluster, "--size", "1MiB", "--algorithm", "rhd", columns=200).stdout
    assert "latency-aware bound under nccl:" in text
    ideal = json.loads(run("plan", cluster, "--size", "1MiB", "--algorithm", "rhd",
                           "--profile", "ideal", "--json").stdout)
    assert ideal["latency_bound_s"] is None
