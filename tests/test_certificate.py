"""Every plan's certificate (topoplan.planners.certificate): the bound it is measured
against, its gap, whether the optimum is known, in ``plan --json``, the table, the
schedule's meta, and ``verify --cluster``, which recomputes it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import topoplan
from topoplan.analysis.bound import latency_bound, lower_bound, rsag_bound, shard_bound
from topoplan.analysis.cost import get_profile
from topoplan.cluster import load_cluster
from topoplan.errors import ScheduleError
from topoplan.planners.certificate import (LOWER, RSAG, SHARD, Certificate, certify, check,
                                           latency_name)
from topoplan.planners.request import Bounds

ROOT = Path(__file__).resolve().parents[1]
DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")          # lower == RS+AG: known
UNEQUAL = str(ROOT / "topologies" / "targets" / "unequal_nics.yaml")  # bracketed
MiB = 1 << 20


def topoplan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def plan_json(*args: str) -> dict:
    done = topoplan_cli("plan", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def rows(out: dict) -> dict[str, dict]:
    return {row["algorithm"]: row for row in out["candidates"]}


FIELDS = {"bound", "bound_s", "time_s", "gap", "optimum", "bracket_s", "rsag_structured",
          "native_steps"}


def check_consistent(cert: dict, time_s: float) -> None:
    """A certificate's fields agree with one another and with the row's time."""
    assert set(cert) == FIELDS
    assert cert["time_s"] == pytest.approx(time_s, rel=1e-12)
    assert cert["gap"] == pytest.approx(time_s / cert["bound_s"], rel=1e-12)
    assert cert["gap"] >= 1 - 1e-9, cert  # the bound holds for the plan it measures
    low, high = cert["bracket_s"]
    assert low <= high * (1 + 1e-9)
    assert cert["optimum"] == ("known" if math.isclose(low, high, rel_tol=1e-9)
                               else "bracketed")


# -- which bound applies ------------------------------------------------------------------

def test_where_the_bounds_coincide_the_optimum_is_known_and_every_row_says_so():
    cluster = load_cluster(DDL)
    size = 4 * MiB
    lower, rsag = lower_bound(cluster, size), rsag_bound(cluster, size)
    assert rsag == pytest.approx(lower, rel=1e-9)
    out = plan_json(DDL, "-s", "4MiB", "--profile", "ideal", "--candidates", "ring,rhd,mcf")
    for name, row in rows(out).items():
        cert = row["certificate"]
        check_consistent(cert, row["time_s"])
        # under ideal no latency is charged: the bandwidth bound, which every plan obeys
        assert cert["bound"] == RSAG and cert["optimum"] == "known", name
        assert cert["bound_s"] == pytest.approx(rsag, rel=1e-12)
        assert cert["bracket_s"] == pytest.approx([lower, rsag], rel=1e-12)
        assert cert["native_steps"] is (name == "nccl")
        assert cert["rsag_structured"] is (name == "ring")
    assert out["certificate"] == rows(out)[out["chosen"]]["certificate"]


def test_where_the_bounds_differ_the_optimum_is_bracketed_and_rings_meet_the_rsag_bound():
    cluster = load_cluster(UNEQUAL)
    size = 16 * MiB
    lower, rsag = lower_bound(cluster, size), rsag_bound(cluster, size)
    assert lower < rsag * 0.9
    out = plan_json(UNEQUAL, "-s", "16MiB", "--profile", "ideal", "--candidates", "ring,rhd")
    by_name = rows(out)
    assert set(by_name) == {"ring", "rhd", "nccl"}
    for name, row in by_name.items():
        cert = row["certificate"]
        check_consistent(cert, row["time_s"])
        assert cert["optimum"] == "bracketed"
        assert cert["bracket_s"] == pytest.approx([lower, rsag], rel=1e-12)
    # a ring reduce-scatters then allgathers: the RS+AG cut bound holds for it
    assert by_name["ring"]["certificate"]["bound"] == RSAG
    assert by_name["ring"]["certificate"]["bound_s"] == pytest.approx(rsag, rel=1e-12)
    assert by_name["ring"]["certificate"]["rsag_structured"] is True
    # rhd and NCCL are not declared so: only the bound every allreduce obeys
    for name in ("rhd", "nccl"):
        assert by_name[name]["certificate"]["bound"] == LOWER
        assert by_name[name]["certificate"]["bound_s"] == pytest.approx(lower, rel=1e-12)
        assert by_name[name]["certificate"]["rsag_structured"] is False


def test_under_a_latency_profile_point_to_point_plans_meet_the_latency_aware_bound():
    cluster = load_cluster(DDL)
    size = 1 * MiB
    out = plan_json(DDL, "-s", "1MiB", "--candidates", "ring,rhd")  # profile nccl
    latency = latency_bound(cluster, size, "nccl")
    assert out["latency_bound_s"] == pytest.approx(latency, rel=1e-12)
    assert latency > rsag_bound(cluster, size)
    by_name = rows(out)
    for name in ("ring", "rhd"):
        cert = by_name[name]["certificate"]
        check_consistent(cert, by_name[name]["time_s"])
        assert cert["bound"] == latency_name("nccl") == "latency-aware bound (profile nccl)"
        assert cert["bound_s"] == pytest.approx(latency, rel=1e-12)
        assert cert["optimum"] == "known"
    # NCCL's native step is priced by NCCL's own model: the bandwidth bound alone
    native = by_name["nccl"]["certificate"]
    assert native["native_steps"] is True and native["bound"] == RSAG


def test_a_sharded_collective_meets_its_own_reachable_cut_bound():
    cluster = load_cluster(DDL)
    out = plan_json(DDL, "-s", "4MiB", "-c", "allgather", "--profile", "ideal",
                    "--candidates", "ring,rhd")
    bound = shard_bound(cluster, 4 * MiB)
    for row in out["candidates"]:
        cert = row["certificate"]
        check_consistent(cert, row["time_s"])
        assert (cert["bound"], cert["optimum"], cert["rsag_structured"]) == \
            (SHARD, "known", None)
        assert cert["bound_s"] == pytest.approx(bound, rel=1e-12)


def test_certify_takes_the_largest_bound_that_applies():
    nccl = get_profile("nccl")
    bounds = Bounds(1.0, 2.0, 1.5)
    ring = certify(bounds, collective="allreduce", planner="ring", time_s=3.0, native=False,
                   channels=1, profile=nccl)
    assert ring == Certificate(RSAG, 2.0, 3.0, 1.5, "bracketed", (1.0, 2.0), True, False)
    mcf = certify(bounds, collective="allreduce", planner="mcf", time_s=3.0, native=False,
                  channels=1, profile=nccl)
    assert (mcf.bound, mcf.bound_s, mcf.rsag_structured) == (latency_name("nccl"), 1.5,
                                                             False)
    # on several channels one channel's latency can hide behind another's transfer
    split = certify(bounds, collective="allreduce", planner="mcf", time_s=3.0, native=False,
                    channels=2, profile=nccl)
    assert (split.bound, split.bound_s) == (LOWER, 1.0)
    unpriced = certify(bounds, collective="allreduce", planner="mcf", time_s=math.nan,
                       native=False, channels=1, profile=nccl)
    assert unpriced.gap is None and unpriced.time_s is None
    assert certify(Bounds(0.0), collective="allreduce", planner="ring", time_s=0.0,
                   native=False, channels=1, profile=nccl) is None


# -- the table, the file, verify ----------------------------------------------------------

def test_the_table_says_the_chosen_plans_certificate():
    done = topoplan_cli("plan", DDL, "-s", "4MiB", "--profile", "ideal", "-a", "rhd")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # the console wraps at its width
    assert "certificate: rhd at 1." in text
    assert "x the RS+AG cut bound of " in text
    assert "(= allreduce lower bound: optimum known)" in text
    done = topoplan_cli("plan", UNEQUAL, "-s", "16MiB", "--profile", "ideal", "-a", "ring")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "certificate: ring at " in text and "x the RS+AG cut bound of" in text
    assert "(an RS+AG plan); optimum bracketed in [" in text


@pytest.fixture(scope="module")
def planned(tmp_path_factory) -> tuple[Path, dict]:
    """A plan written by ``topoplan plan -o`` (mcf on the two-switch cluster, nccl
    profile), and the ``--json`` that printed it."""
    path = tmp_path_factory.mktemp("certificate") / "plan.json"
    out = plan_json(DDL, "-s", "4MiB", "--candidates", "ring,mcf", "-o", str(path))
    return path, out


def test_the_written_plan_carries_the_chosen_certificate(planned):
    path, out = planned
    meta = json.loads(path.read_text())["meta"]
    assert meta["certificate"] == out["certificate"]
    check_consistent(meta["certificate"], meta["predicted_time_s"])
    api = topoplan.plan(DDL, size="4MiB", candidates=["ring", "mcf"])
    assert api.meta["certificate"] == meta["certificate"]


def test_verify_recomputes_a_genuine_certificate(planned):
    path, out = planned
    done = topoplan_cli("verify", str(path), "--cluster", DDL)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith(f"{path}: certificate holds: mcf at ")
    done = topoplan_cli("verify", "--json", str(path), "--cluster", DDL)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["plans"]
    assert report["ok"] and report["certificate_recorded"]
    assert report["certificate"]["bound"] == out["certificate"]["bound"]
    assert report["certificate"]["gap"] == pytest.approx(out["certificate"]["gap"],
                                                         rel=1e-9)


@pytest.mark.parametrize("key, value, said", [
    ("gap", 1.0, "gap 1.0000x to the latency-aware bound (profile nccl); simulated, the "
                 "plan is at 1."),
    ("bound", LOWER, "it names the bound 'allreduce lower bound'; the plan is measured "
                     "against the latency-aware bound (profile nccl)"),
    ("bound_s", 1e-3, "bound_s 0.001; the latency-aware bound (profile nccl) is"),
    ("optimum", "bracketed", "optimum 'bracketed'; recomputed 'known'"),
])
def test_verify_refuses_a_tampered_certificate(planned, tmp_path, key, value, said):
    path, _ = planned
    data = json.loads(path.read_text())
    data["meta"]["certificate"][key] = value
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    done = topoplan_cli("verify", str(tampered), "--cluster", DDL)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"topoplan: error: {tampered}: the recorded certificate does "
                           "not hold: ")
    assert said in line


def test_a_plan_below_the_bound_it_claims_is_refused():
    """Simulated below its bound, a plan shows that the bound does not apply to it: the
    claim is false even when every recorded number matches."""
    below = Certificate(RSAG, 2.0, 1.8, 0.9, "bracketed", (1.0, 2.0), True, False)
    with pytest.raises(ScheduleError, match=r"^plan.json: the recorded certificate does "
                       r"not hold: simulated, the plan runs at 0.9000x the RS\+AG cut "
                       r"bound: below it, so that bound does not apply to it$"):
        check(below.to_dict(), below, where="plan.json")
    fine = Certificate(RSAG, 2.0, 2.2, 1.1, "bracketed", (1.0, 2.0), True, False)
    check(fine.to_dict(), fine, where="plan.json")
    with pytest.raises(ScheduleError, match="bracket_s"):
        check({**fine.to_dict(), "bracket_s": [1.0, 3.0]}, fine, where="plan.json")
    with pytest.raises(ScheduleError, match="expected an object"):
        check("1.1x", fine, where="plan.json")
    with pytest.raises(ScheduleError, match=r"time_s 2.0; simulated, the plan takes 2.2"):
        check({**fine.to_dict(), "time_s": 2.0}, fine, where="plan.json")
    with pytest.raises(ScheduleError, match=r"rsag_structured False; the plan's is True"):
        check({**fine.to_dict(), "rsag_structured": False}, fine, where="plan.json")
    # recorded with no time (too big to simulate, no estimate): no gap was claimed
    check({**fine.to_dict(), "time_s": None, "gap": None}, fine, where="plan.json")


def test_the_chosen_certificate_is_of_the_plan_as_it_runs():
    """On two channels a plan can hide one channel's step latency behind the other's
    transfer: the latency-aware bound does not measure it, while its row, compared on
    one channel, is measured against it."""
    out = plan_json(DDL, "-s", "1MiB", "-a", "rhd", "--channels", "2")
    assert out["channels"] == 2
    assert rows(out)["rhd"]["certificate"]["bound"] == latency_name("nccl")
    chosen = out["certificate"]
    check_consistent(chosen, out["chosen_time_s"])
    assert (chosen["bound"], chosen["optimum"]) == (RSAG, "known")


def test_verify_json_reports_a_false_certificate_as_not_ok(planned, tmp_path):
    path, _ = planned
    data = json.loads(path.read_text())
    data["meta"]["certificate"]["gap"] *= 0.5
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    done = topoplan_cli("verify", "--json", str(path), str(tampered), "--cluster", DDL)
    assert done.returncode == 1 and not done.stderr
    genuine, false = json.loads(done.stdout)["plans"]
    assert genuine["ok"] and not false["ok"]
    assert false["error"].startswith(f"{tampered}: the recorded certificate does not hold: "
                                     "gap ")


def test_verify_names_what_it_cannot_recompute(tmp_path):
    plan = tmp_path / "bare.json"
    ring = topoplan.plan(DDL, "ring", size="1MiB")
    ring.with_meta(size_bytes=None).save(plan)
    done = topoplan_cli("verify", str(plan), "--cluster", DDL)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{plan}: its meta has no size_bytes" in done.stderr
    ring.with_meta(machine="elsewhere").save(plan)
    done = topoplan_cli("verify", str(plan), "--cluster", DDL)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{plan}: it was priced on the machine 'elsewhere'" in done.stderr
    ring.save(plan)
    done = topoplan_cli("verify", str(plan), "--cluster",
                        str(ROOT / "topologies" / "targets" / "two_switch_4x2.yaml"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{plan} has 4 ranks but cluster 'two-switch-4x2' has 8 GPUs" in done.stderr
