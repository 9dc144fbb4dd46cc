"""Large planning is bounded and says so: ``topoplan plan`` estimates its time and memory
before it starts, prints a large estimate, refuses one over ``--max-memory`` (or what the
machine has) without planning or writing anything, leaves out the rows that would have no
time without building them, and writes a native choice in a small file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings

import pytest

import topoplan.planners.budget as budget
import topoplan.planners.pipeline as pipeline
from topoplan.cli import main
from topoplan.cluster import loads_cluster
from topoplan.cluster.generate import fat_tree, rail_optimized
from topoplan.errors import BudgetError
from topoplan.planners import PlanRequest, execute
from topoplan.planners.comparison import run as run_planner
from topoplan.planners.registry import SPECS

DDL = "topologies/ddl_two_switch.yaml"


def generated(tmp_path, boxes: int, gpus: int = 8) -> str:
    path = tmp_path / f"rail{boxes * gpus}.yaml"
    path.write_text(rail_optimized(boxes, gpus))
    return str(path)


# ---- the estimate, and the refusal before any work ------------------------------------------
def test_an_estimate_over_the_budget_is_refused_before_planning_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    cluster = generated(tmp_path, 256)  # 2048 GPUs: a minute to plan, refused at once
    out = tmp_path / "plan.json"

    def no_planning(request):
        raise AssertionError("planned despite the refusal")
    monkeypatch.setattr(pipeline, "execute", no_planning)
    monkeypatch.setattr("topoplan.planners.execute", no_planning)
    assert main(["plan", cluster, "--size", "1MiB", "--max-memory", "64MiB",
                 "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # one located line
    assert re.fullmatch(
        rf"topoplan: error: {re.escape(cluster)}: planning 2048 ranks would take about "
        r"\S+ (s|min) and [\d.]+ (GiB|MiB) of memory \((mcf|composed) .*\), over the 64 MiB budget "
        r"\(--max-memory\); to go on: --max-memory \d+GiB \(or 0: no bound\).*\n", err), err
    assert list(tmp_path.iterdir()) == [tmp_path / "rail2048.yaml"]  # no plan, no temp file


def test_the_refusal_names_cheaper_candidates_that_fit(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 16384 GPUs: past the plausible range
        cluster = loads_cluster(rail_optimized(2048, 8))
    request = PlanRequest.make(cluster, size="1MiB", algorithm="auto")
    estimate = budget.estimate_work(request)
    assert [p.name for p in estimate.parts] == ["mcf", "nccl", "composed"]
    assert estimate.left_out == ("hierarchical",)
    nccl = budget.estimate_work(PlanRequest.make(cluster, size="1MiB", algorithm="nccl"))
    with pytest.raises(BudgetError, match=r"fewer candidates: -a nccl \("):
        budget.check_budget(request, estimate, int(nccl.bytes * 1.1), where="c.yaml")
    budget.check_budget(request, estimate, 0, where="c.yaml")  # 0: no bound


def test_the_estimate_grows_with_the_ranks_and_the_candidates():
    def work(boxes: int, **kwargs) -> budget.WorkEstimate:
        cluster = loads_cluster(fat_tree(boxes, 8))
        return budget.estimate_work(PlanRequest.make(cluster, **{"size": "1MiB", **kwargs}))
    small, big = work(128, algorithm="mcf"), work(512, algorithm="mcf")
    assert big.seconds > small.seconds and big.bytes > small.bytes
    large = work(512, algorithm="mcf", size="256MiB")  # mcf fills its op budget
    assert large.bytes > big.bytes + 4096 * 1000 * budget.MCF_OP_BYTES / 2
    auto = work(512, algorithm="auto")
    assert auto.bytes > big.bytes
    alone = work(512, algorithm="nccl")
    assert [p.name for p in alone.parts] == ["nccl"] and alone.bytes < auto.bytes / 2
    # a flat ring over 4096 ranks: 67 M ops, priced by its op count
    ring = work(512, algorithm="ring")
    assert ring.bytes > 2 * budget.DEFAULT_MAX_BYTES


def test_the_estimate_knows_mcfs_op_budget():
    from topoplan.planners.mcf import planner as mcf
    for n in (8, 400, 401, 1024, 8192, 16384):
        assert budget.mcf_ops_budget(n) == max(mcf.SOFT_OPS, min(mcf.OPS_PER_RANK * n,
                                                                 mcf.MAX_OPS))
        for channels in (1, 2, 4):
            assert budget.mcf_ops_budget(n, channels) == mcf.default_ops(n, channels)
    # above 400 ranks each channel has 1000 ops a rank, up to MAX_OPS in all
    assert mcf.default_ops(1024, 4) == 4 * mcf.default_ops(1024) == 4_096_000
    assert mcf.default_ops(8192, 4) == mcf.default_ops(8192) == mcf.MAX_OPS
    assert mcf.default_ops(64, 4) == mcf.default_ops(64) == mcf.SOFT_OPS


def test_a_large_estimate_is_noted_on_stderr_before_the_plan(monkeypatch, capsys):
    monkeypatch.setattr(budget, "NOTE_SECONDS", 0.0)  # a shipped topology counts as large
    assert main(["plan", DDL, "--size", "1MiB", "--candidates", "ring"]) == 0
    captured = capsys.readouterr()
    assert re.match(r"topoplan: note: planning 4 ranks will take about \S+ s and [\d.]+ "
                    r"(MiB|GiB) of memory", captured.err), captured.err
    assert "chosen:" in captured.out


def test_a_small_plan_says_nothing_and_keeps_the_default_budget(capsys):
    assert main(["plan", DDL, "--size", "1MiB", "--candidates", "ring,rhd"]) == 0
    assert "note" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["-1GiB", "lots"])
def test_a_bad_budget_is_a_usage_error(text):
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", DDL, "--max-memory", text],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--max-memory" in done.stderr


# ---- rows that would have no time are not built ----------------------------------------------
@pytest.mark.parametrize("name", [n for n, s in SPECS.items() if s.min_ops is not None])
@pytest.mark.parametrize("boxes, gpus", [(3, 1), (5, 4), (16, 2)])
@pytest.mark.parametrize("size", ["4KiB", "64MiB"])
def test_min_ops_is_a_lower_bound_of_the_plan(name, boxes, gpus, size):
    cluster = loads_cluster(rail_optimized(boxes, gpus, boxes_per_leaf=4, spines=2))
    for collective in SPECS[name].collectives:
        request = PlanRequest.make(cluster, size=size, collective=collective,
                                   profile="nccl")
        fewest = SPECS[name].min_ops(request)
        nops = run_planner(request, name).nops
        assert 0 < fewest <= nops, (name, collective, fewest, nops)


def test_a_large_cluster_leaves_out_rows_without_time_unbuilt(monkeypatch):
    cluster = loads_cluster(rail_optimized(40, 8))  # 320 ranks: above max_plan_ranks

    def unbuilt(*args, **kwargs):
        raise AssertionError("hierarchical was planned")
    monkeypatch.setattr(SPECS["hierarchical"].core, "_resolved", unbuilt)
    request = PlanRequest.make(cluster, size="1MiB", algorithm="auto", max_sim_ops=1000,
                               candidates=["hierarchical", "nccl"])
    result = execute(request)
    assert [c.name for c in result.rows] == ["nccl"]
    assert re.match(r"hierarchical: its plan would hold at least [\d,]+ ops, over the 1,000 "
                    r"the simulator takes here, .*-a hierarchical", result.left_out["hierarchical"])


# ---- a native choice is a small file ------------------------------------------------------
def test_the_file_of_a_native_choice_is_small(tmp_path):
    cluster = generated(tmp_path, 64)  # 512 ranks, one native op over all of them
    out = tmp_path / "plan.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["plan", cluster, "--size", "1MiB", "-a", "nccl", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ranks"][300]["steps"] == [[{"op": "allreduce", "group": "0..511",
                                             "chunk": 0}]]
    # 512 ranks of one short line each and the meta; as lists it was 512 x 512 ranks
    assert out.stat().st_size < 64 << 10
    assert main(["verify", str(out)]) == 0
