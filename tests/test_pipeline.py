"""One request, one pipeline: ``topoplan plan -o`` and :func:`topoplan.plan` make the same
request and the same schedule; a request plans every row once and computes every bound
once (issue "One request, one pipeline")."""

from __future__ import annotations

import cProfile
import pstats
from pathlib import Path

import pytest

import topoplan
from tests.support.clusters import ROOT
from topoplan import cli
from topoplan.analysis.bound import collective_bound, latency_bound, rsag_bound
from topoplan.errors import PlannerError
from topoplan.planners import PlanRequest, execute, plan

SHIPPED = sorted(str(p.relative_to(ROOT / "topologies")).removesuffix(".yaml")
                 for p in (ROOT / "topologies").rglob("*.yaml"))
#: On the largest clusters, a smaller comparison (the same one from both sides) keeps
#: the test short: every candidate there plans and simulates for seconds.
CANDIDATES = {"leaf_spine_1024": ["hierarchical", "nccl"],
              "ddl_three_racks": ["mcf", "hierarchical", "nccl"]}
#: What the file and the API must agree on.
KEYS = ("algorithm", "chosen", "lower_bound_s", "rsag_bound_s", "latency_bound_s",
        "size_bytes", "profile", "cluster_fingerprint", "predicted_time_s", "nccl")


def _cli_plan(tmp_path: Path, *args: str) -> topoplan.Schedule:
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *args, "-o", str(out)]) == 0
    return topoplan.load_schedule(out)


@pytest.mark.parametrize("name", SHIPPED)
def test_the_file_and_plan_agree_on_every_shipped_topology(name, tmp_path, capsys):
    path = str(ROOT / "topologies" / f"{name}.yaml")
    candidates = CANDIDATES.get(name)
    extra = ["--candidates", ",".join(candidates)] if candidates else []
    written = _cli_plan(tmp_path, path, "--size", "1MiB", *extra)
    planned = plan(path, size="1MiB", candidates=candidates)
    for key in KEYS:
        assert written.meta.get(key) == planned.meta.get(key), key
    assert written.meta["algorithm"] == "auto"
    assert written.meta["lower_bound_s"] > 0 and written.meta["predicted_time_s"] > 0
    assert [row["algorithm"] for row in written.meta["comparison"]] == \
        [row["algorithm"] for row in planned.meta["comparison"]]
    assert written.ranks == planned.ranks and written.chunks == planned.chunks
    table = capsys.readouterr().out
    assert f"chosen: {written.meta['chosen']} ->" in table


def test_a_named_planner_on_channels_and_vectored_gives_the_same_file(tmp_path, capsys):
    path = str(ROOT / "topologies" / "dgx_a100_x4.yaml")
    written = _cli_plan(tmp_path, path, "-a", "ring", "--size", "4MiB", "--channels", "2",
                        "--vectored", "--max-chunks", "128")
    planned = plan(path, "ring", size="4MiB", channels=2, vectored=True, max_chunks=128)
    for key in KEYS:
        assert written.meta.get(key) == planned.meta.get(key), key
    assert written.nchannels == planned.nchannels == 2
    assert written.ranks == planned.ranks
    topoplan.verify(planned)
    out = capsys.readouterr().out
    assert "ring on 2 channels" in out and "vectored: ring in" in out


def test_auto_on_channels_leaves_out_the_native_planners_and_says_why():
    result = execute(PlanRequest.make(ROOT / "topologies" / "dgx_a100_x4.yaml",
                                      size="16MiB", algorithm="auto", channels=2))
    assert {row.name for row in result.rows}.isdisjoint({"nccl", "composed"})
    assert "cannot be cut over 2 channels" in result.left_out["composed"]
    assert result.schedule.nchannels == 2 and result.nccl.name == "nccl"
    assert result.schedule.meta["left_out"]["nccl"] == result.left_out["nccl"]
    with pytest.raises(PlannerError, match="nccl: its plans hold native steps"):
        plan(ROOT / "topologies" / "dgx_a100_x4.yaml", "nccl", size="16MiB", channels=2)


def _calls(stats: pstats.Stats, function) -> int:
    code = function.__code__
    return sum(calls for (file, line, name), (_, calls, *_rest) in stats.stats.items()
               if name == code.co_name and line == code.co_firstlineno
               and file == code.co_filename)


def test_a_profiled_plan_compares_once_and_computes_each_bound_once(capsys):
    from topoplan.planners import comparison as compare_module

    profile = cProfile.Profile()
    profile.enable()
    assert cli.main(["plan", str(ROOT / "topologies" / "ddl_two_switch.yaml")]) == 0
    profile.disable()
    stats = pstats.Stats(profile)
    assert _calls(stats, compare_module.compare) == 1
    # every candidate once, composed's cross-box plan (one GPU a box) from the same rows
    assert _calls(stats, compare_module.run) == 9
    assert _calls(stats, rsag_bound) == 1
    assert _calls(stats, latency_bound) == 1
    # the request's lower bound, and the bandwidth term inside the latency-aware bound
    assert _calls(stats, collective_bound) == 2
    assert "chosen: forest" in capsys.readouterr().out


def test_one_mistake_one_error(tmp_path, capsys):
    path = ROOT / "topologies" / "ddl_two_switch.yaml"
    for call in (lambda: plan(path, "rign"), lambda: plan(path, candidates=["rign"]),
                 lambda: plan(path, "composed", inner=["rign"])):
        with pytest.raises(PlannerError, match="unknown planner 'rign' \\(did you mean 'ring'"):
            call()
    assert cli.main(["plan", str(path), "-a", "rign"]) == 1
    assert "known: auto, composed" in capsys.readouterr().err
    assert cli.main(["plan", str(path), "--candidates", "ring,rign"]) == 1
    err = capsys.readouterr().err
    assert "unknown planner 'rign'" in err and "auto" not in err.split("known:")[1]


def test_rows_below_the_rsag_bound_are_told_apart(capsys):
    # unequal boxes: composed, mcf and others beat the RS+AG cut bound, which assumes
    # equal shards on every GPU; the table says so where it prints the bound
    assert cli.main(["plan", str(ROOT / "topologies" / "targets" / "unequal_gpus.yaml"),
                     "--candidates", "composed,ring"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "RS+AG cut bound (reduce-scatter + allgather schedules): 17.9 ms; below it: " \
           "composed (it bounds a reduce-scatter to equal shards" in out
    assert cli.main(["plan", str(ROOT / "topologies" / "ddl_two_switch.yaml")]) == 0
    assert "below it" not in capsys.readouterr().out  # nothing beats it there


def test_under_ideal_the_nccl_row_is_nccls_algorithm_on_the_links_alone(capsys):
    path = str(ROOT / "topologies" / "dgx_a100_x4.yaml")
    result = execute(PlanRequest.make(path, size="64MiB", profile="ideal", algorithm="auto",
                                      candidates=["mcf", "ring", "nccl"]))
    rows = {row.name: row for row in result.rows}
    # what NCCL runs (its rings over every NIC), not a flat ring in rank order
    assert rows["nccl"].time_s < rows["ring"].time_s / 5
    assert result.bounds.lower_s < rows["mcf"].time_s < rows["nccl"].time_s
    assert rows["mcf"].speedup_over(result.nccl) < 2
    assert cli.main(["plan", path, "-s", "64MiB", "--profile", "ideal",
                     "--candidates", "mcf,nccl"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"what NCCL 2.30 runs here, {result.nccl.nccl.label()}, paying its links alone" \
        in out
