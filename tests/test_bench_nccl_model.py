"""scripts/bench_nccl_model.py: every row cites its source, the p5 curve is whole, and the
AWS tuner's regions pick what the published curve shows it ran."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.support.clusters import ROOT

SCRIPTS = ROOT / "scripts"


def load(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_rows_cite_sources_and_ratios_are_model_over_published(capsys):
    bench = load("bench_nccl_model")
    assert bench.main(["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["source"] for r in rows)
    p5 = [r for r in rows if r["group"] == "p5 curve"]
    assert len(p5) == 45 and {r["size"] for r in p5} == {(32 << 20) << k for k in range(9)}
    for r in rows:
        model = r.get("predicted_busbw_GBps", r.get("predicted_us"))
        low, high = r.get("published_busbw_GBps", r.get("published_us"))
        nearer = low if model < low else high if model > high else model
        assert r["ratio"] == pytest.approx(model / nearer, abs=2e-3)
    # Every p5 point is priced as what AWS's tuner ran, and says what NCCL alone would run.
    assert all(r["forced"] and r["nccl_alone"] and r["measured_with"] == "2.27.7" for r in p5)
    assert bench.main(["--only", "p5, 4 nodes", "--json"]) == 0
    only = json.loads(capsys.readouterr().out)
    assert len(only) == 9 and all("4 nodes" in r["what"] for r in only)


def test_the_table_prints_each_group_summary(capsys):
    bench = load("bench_nccl_model")
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert "p5 curve: " in out and " of 45 within 15%" in out
    assert "latency: 2 of 2 within 1.5x" in out


def test_aws_regions_pick_what_the_published_p5_curve_shows():
    # The published curve's plateaus and jumps are the tuner's regions: Ring/LL128 holds
    # ~280 GB/s from 512 MiB on 4 nodes until Ring/Simple takes over at 2 GiB; on 8 nodes
    # LL128 lasts to 2 GiB; two nodes run NVLSTree above 30 MiB (over 400 GB/s, more than
    # a ring over 8 x 400G can).
    regions = load("aws_tuner_regions")
    pick = regions.p5_allreduce
    assert pick(1 << 30, 32, 4) == ("Ring", "LL128")
    assert pick(2 << 30, 32, 4) == ("Ring", "Simple")
    assert pick(2 << 30, 64, 8) == ("Ring", "LL128")
    assert pick(4 << 30, 64, 8) == ("Ring", "Simple")
    assert pick(8 << 30, 16, 2) == ("NVLSTree", "Simple")
    assert pick(32 << 20, 256, 32) == ("Tree", "LL128")
    assert pick(1 << 30, 16, 16) is None          # one GPU a node: not these regions
    # extend_region: a vertical edge extends to the far corner's y.
    assert regions._extend((402653184, 2048), (402653184, 4096),
                           (regions.TUNER_MAX_SIZE, regions.TUNER_MAX_RANKS)) == pytest.approx(
        (402653184, regions.TUNER_MAX_RANKS))
