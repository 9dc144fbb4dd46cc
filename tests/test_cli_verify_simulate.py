"""``topoplan verify`` and ``topoplan simulate`` through ``python -m topoplan``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import topoplan as topoplan_api
from tests.support.schedules import ring_schedule
from tests.support.tables import read_table, widest_line

ROOT = Path(__file__).resolve().parents[1]
DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")


def topoplan(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env=env)


def test_verify_accepts_a_ring(tmp_path):
    plan = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(plan)
    done = topoplan("verify", str(plan))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"{plan}: ok: ring allreduce, 4 ranks, 4 chunks, 6 steps, "
                                   "24 messages")


def test_verify_json_reports_every_plan(tmp_path):
    good, bad = tmp_path / "ring.json", tmp_path / "bad.json"
    ring_schedule([0, 1, 2, 3]).save(good)
    bad.write_text("{}")
    done = topoplan("verify", "--json", str(good))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"plans": [
        {"file": str(good), "ok": True, "algorithm": "ring", "collective": "allreduce",
         "nranks": 4, "nchunks": 4, "nsteps": 6, "nmessages": 24, "nnative": 0,
         "ncollectives": 0}]}
    done = topoplan("verify", "--json", str(good), str(bad))
    assert done.returncode == 1
    plans = json.loads(done.stdout)["plans"]
    assert [p["ok"] for p in plans] == [True, False] and str(bad) in plans[1]["error"]


def _ring_dict() -> dict:
    return json.loads(ring_schedule([0, 1, 2]).to_json())


def _unknown_op(d):
    d["ranks"][1]["steps"][2][0]["op"] = "sned"


def _chunk_range(d):
    d["ranks"][0]["steps"][0][0]["chunk"] = 7


def _fractions(d):
    d["chunks"] = [0.25, 0.25, 0.25]


def _unmatched(d):
    d["ranks"][2]["steps"][3].pop(1)  # rank 2 never receives its last chunk from rank 1


def _deadlock(d):
    # Every rank receives before it sends in the first step: a cycle of waits.
    for rank in d["ranks"]:
        send_op, recv_op = rank["steps"][0]
        rank["steps"][0:1] = [[recv_op], [send_op]]


def _double_count(d):
    # Rank 1's first allgather recv adds instead of overwriting: rank 0's part twice.
    d["ranks"][1]["steps"][2][1]["reduce"] = True


BROKEN = {
    "unknown op": (_unknown_op, "ranks[1].steps[2][0]: unknown op 'sned'; expected 'send', 'recv' or a native collective"),
    "chunk out of range": (_chunk_range, "ranks[0].steps[0][0]: chunk 7 out of range(3)"),
    "fractions": (_fractions, "chunks: fractions must sum to 1, got 0.75"),
    "unmatched": (_unmatched, "unmatched send: rank 1 step 3 sends chunk"),
    "deadlock": (_deadlock, "deadlock: 3 ranks cannot finish; rank 0 step 0 waits to recv"),
    "double count": (_double_count, "would be counted twice"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_verify_rejects_broken_plans(case, tmp_path):
    mutate, message = BROKEN[case]
    data = _ring_dict()
    mutate(data)
    plan = tmp_path / "broken.json"
    plan.write_text(json.dumps(data))
    done = topoplan("verify", str(plan))
    assert done.returncode == 1
    assert done.stderr.startswith(f"topoplan: error: {plan}: "), done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_simulate_prints_one_row_per_size(tmp_path):
    plan = tmp_path / "bad-order.json"
    ring_schedule([0, 2, 1, 3], name="ring-bad").save(plan)
    done = topoplan("simulate", DDL, str(plan), "--sizes", "1KiB:1MiB:32", "--profile", "ideal")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "lower bound: 2 groups (switch level 1), 20 GB/s out of them in all" in out
    assert "RS+AG cut bound (reduce-scatter + allgather schedules): 1 x the lower bound" in out
    assert "bottleneck cut: 2 GPUs (boxes C, D) behind 10 GB/s\n" in out
    assert "cost profile ideal: alpha 0 us" in out
    rows = read_table(out)
    assert [row["size (B)"] for row in rows] == ["1024", "32768", "1048576"]
    # 1 MiB: 6 steps x (2 x 256 KiB / 10 GB/s + 3 us) = 332.57 us; bound 104.86 us.
    data = json.loads(topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--profile",
                               "ideal", "--json").stdout)
    vs_nccl = f"{data['results'][0]['speedup_vs_nccl']:.2f}x"
    assert rows[-1] == {"size (B)": "1048576", "count": "262144", "time (us)": "332.57",
                        "algbw (GB/s)": "3.15", "busbw (GB/s)": "4.73", "bound (us)": "104.86",
                        "vs bound": "3.17x", "vs nccl": vs_nccl}
    # NCCL's own, per size, in the last table: what it runs and what sets its time.
    nccl = read_table(out, 2)
    assert [row["size (B)"] for row in nccl] == ["1024", "32768", "1048576"]
    choice = data["results"][0]["nccl"]
    assert nccl[-1]["algorithm"] == choice["nccl_algorithm"]
    assert nccl[-1]["protocol"] == choice["protocol"]
    assert float(nccl[-1]["nccl (us)"]) == pytest.approx(choice["time_s"] * 1e6, abs=0.005)
    parts = read_table(out, 1)
    assert parts[-1] == {"size (B)": "1048576", "bandwidth (us)": "314.57",
                         "latency (us)": "18.00", "overhead (us)": "0.00", "reduce (us)": "0.00"}


@pytest.mark.parametrize("plan_size, sizes", [("1MiB", "1KiB:1GiB:32"), ("64MiB", "64MiB")])
def test_simulate_tables_fit_80_columns_and_print_the_json_numbers(tmp_path, plan_size, sizes):
    plan = tmp_path / "plan.json"
    made = topoplan("plan", DDL, "--size", plan_size, "--candidates", "ring,tree", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    out = topoplan("simulate", DDL, str(plan), "--sizes", sizes, columns=80).stdout
    assert widest_line(out) <= 80 and "…" not in out
    data = json.loads(topoplan("simulate", DDL, str(plan), "--sizes", sizes, "--json").stdout)
    rows, parts = read_table(out), read_table(out, 1)
    assert len(rows) == len(parts) == len(data["results"])
    for row, part, r in zip(rows, parts, data["results"]):
        assert int(row["size (B)"].rstrip("*")) == r["size_bytes"]
        assert int(row.get("count", r["count"])) == r["count"]  # the first column to go
        assert float(row["lat bound (us)"]) == pytest.approx(r["latency_bound_s"] * 1e6,
                                                             abs=0.005)
        assert r["latency_bound_s"] >= r["lower_bound_s"]
        for column, value in (("time (us)", r["time_s"] * 1e6), ("bound (us)",
                              r["lower_bound_s"] * 1e6), ("algbw (GB/s)", r["algbw_GBps"]),
                              ("busbw (GB/s)", r["busbw_GBps"])):
            assert float(row[column]) == pytest.approx(value, abs=0.005), column
        assert row["vs bound"] == f"{r['x_bound']:.2f}x"
        assert r["x_bound"] == pytest.approx(r["time_s"] / r["lower_bound_s"])
        for name, seconds in r["breakdown"].items():
            if f"{name} (us)" in part:
                assert float(part[f"{name} (us)"]) == pytest.approx(seconds * 1e6, abs=0.005)


def test_simulate_says_the_size_the_plan_was_made_for_and_marks_the_others(tmp_path):
    plan = tmp_path / "plan.json"
    made = topoplan("plan", DDL, "--size", "1MiB", "--candidates", "rhd", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    out = topoplan("simulate", DDL, str(plan), "--sizes", "1KiB:32MiB:32").stdout
    assert "planned for 1MiB (1048576 B); * marks other sizes" in out
    assert [row["size (B)"] for row in read_table(out)] == ["1024*", "32768*", "1048576",
                                                            "33554432*"]
    data = json.loads(topoplan("simulate", DDL, str(plan), "--sizes", "1KiB,1MiB",
                               "--json").stdout)
    assert data["planned_size_bytes"] == 1 << 20
    assert [r["at_planned_size"] for r in data["results"]] == [False, True]
    # The plan's own size alone: nothing to mark; a plan without the key: said, unmarked.
    assert "planned for this size, 1MiB" in topoplan("simulate", DDL, str(plan), "--sizes",
                                                     "1MiB").stdout
    bare = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(bare)
    out = topoplan("simulate", DDL, str(bare), "--sizes", "1KiB,1MiB").stdout
    assert "the plan records no size it was made for" in out
    assert [row["size (B)"] for row in read_table(out)] == ["1024", "1048576"]
    data = json.loads(topoplan("simulate", DDL, str(bare), "--sizes", "1MiB", "--json").stdout)
    assert data["planned_size_bytes"] is None and data["results"][0]["at_planned_size"] is None


def test_the_api_records_the_size_a_plan_was_made_for(topology):
    schedule = topoplan_api.plan(topology("ddl_two_switch"), "ring", size=4 << 20)
    assert schedule.meta["size_bytes"] == 4 << 20


def test_simulate_json(tmp_path):
    plan = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(plan)
    done = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB,4MiB", "--json",
                    "--alpha", "1 us", "--reduce-bandwidth", "1 TB/s")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["cluster"], data["algorithm"], data["nranks"]) == ("ddl-two-switch", "ring", 4)
    assert data["bottleneck"]["gpus"] == 2
    assert data["bound_partition"] == {"name": "switch level 1", "groups": 2,
                                       "bandwidth_Bps": 20e9}
    assert [r["size_bytes"] for r in data["results"]] == [1 << 20, 4 << 20]
    for r in data["results"]:
        assert r["time_s"] >= r["lower_bound_s"]
        assert r["rsag_bound_s"] == pytest.approx(r["lower_bound_s"])  # balanced cut
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1.5)


def test_simulate_resolution_option(tmp_path):
    plan = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(plan)
    fine, coarse = (json.loads(topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--json",
                                        *extra).stdout)
                    for extra in ([], ["--resolution", "1e-5"]))
    assert (fine["resolution"], coarse["resolution"]) == (1e-7, 1e-5)
    assert coarse["results"][0]["time_s"] == pytest.approx(fine["results"][0]["time_s"],
                                                          rel=1e-4)
    shown = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--resolution", "1e-5")
    assert "time resolution 1e-05 of the clock" in shown.stdout
    bad = topoplan("simulate", DDL, str(plan), "--resolution", "0")
    assert bad.returncode == 2 and "--resolution: must be in (0, 0.01)" in bad.stderr


def test_simulate_json_splits_the_time_under_the_profile(tmp_path):
    """The good ring on DDL: 6 steps of 2 ops over the network, 256 KiB each at 10 GB/s
    (1 MiB), 3 us of path latency a step; 3 reduce-scatter steps add 256 KiB each."""
    plan = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(plan)
    done = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["profile"]["name"] == "nccl"  # the default
    (result,) = data["results"]
    parts = result["breakdown"]
    assert set(parts) == {"bandwidth", "latency", "overhead", "reduce", "contention"}
    assert sum(parts.values()) == pytest.approx(result["time_s"], rel=1e-9)
    from topoplan.analysis.cost import get_profile
    nccl = get_profile("nccl")
    assert parts["bandwidth"] == pytest.approx(6 * (1 << 18) / 10e9, rel=1e-6)
    assert parts["latency"] == pytest.approx(6 * (nccl.alpha_network + 3e-6), rel=1e-6)
    assert parts["overhead"] == pytest.approx(
        nccl.call_overhead + 6 * (nccl.step_overhead + 2 * nccl.op_overhead), rel=1e-6)
    red = 0.0 if nccl.reduce_bandwidth is None else 3 * (1 << 18) / nccl.reduce_bandwidth
    assert parts["reduce"] == pytest.approx(red, rel=1e-6, abs=1e-15)
    assert result["messages"] == 24
    # --alpha overrides the profile's alpha (both classes); the name says it was changed.
    done = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--json", "--profile",
                    "ideal", "--alpha", "1 us")
    data = json.loads(done.stdout)
    assert data["profile"]["name"] == "ideal*" and data["profile"]["alpha"] == "1 us"
    parts = data["results"][0]["breakdown"]
    assert parts["latency"] == pytest.approx(6 * (1e-6 + 3e-6), rel=1e-6)
    assert parts["overhead"] == parts["reduce"] == 0


def test_simulate_refuses_a_plan_for_another_cluster(tmp_path):
    plan = tmp_path / "three.json"
    ring_schedule([0, 1, 2]).save(plan)
    done = topoplan("simulate", DDL, str(plan))
    assert done.returncode == 1
    assert done.stderr.startswith(f"topoplan: error: {plan} has 3 ranks but {DDL} "
                                  "(cluster 'ddl-two-switch') has 4 GPUs")


def test_simulate_force_runs_a_plan_made_for_another_cluster(tmp_path):
    plan = tmp_path / "wide.json"
    wide = tmp_path / "wide.yaml"
    wide.write_text(Path(DDL).read_text().replace("10 GB/s", "20 GB/s"))
    made = topoplan("plan", str(wide), "--size", "1MiB", "--candidates", "ring", "-o", str(plan))
    assert made.returncode == 0, made.stderr
    refused = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB")
    assert refused.returncode == 1 and "pass --force to use it anyway" in refused.stderr
    forced = topoplan("simulate", DDL, str(plan), "--sizes", "1MiB", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["results"][0]["time_s"] > 0


def test_simulate_bad_size_range_is_a_usage_error(tmp_path):
    plan = tmp_path / "ring.json"
    ring_schedule([0, 1, 2, 3]).save(plan)
    done = topoplan("simulate", DDL, str(plan), "--sizes", "1GiB:1KiB")
    assert done.returncode == 2
    assert "not a size range" in done.stderr and "Traceback" not in done.stderr
