"""topoplan doctor: synthetic curves from a degraded cluster's nccl row, with noise, are
explained by the fault that made them; a healthy curve by the healthy cluster; the CLI
prints one line for every mistake."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from topoplan.analysis.doctor import DoctorError, diagnose, hypotheses, parse_log
from topoplan.analysis.doctor.hypotheses import interleaved, nic_down, plugin_latency
from topoplan.analysis.native.nccl import nccl_time
from topoplan.cluster import load_cluster
from topoplan.cluster.links import degraded

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "doctor"
H100 = DATA / "h100_2x8.yaml"
TWO_LEAF = ROOT / "topologies" / "targets" / "two_leaf_oversubscribed.yaml"
DGX = ROOT / "topologies" / "targets" / "dgx_h100.yaml"
SIZES = [8 << i for i in range(30)]  # 8 B .. 4 GiB


def curve(cluster, nranks, noise=0.03, seed=0, collective="allreduce"):
    """A CSV of the nccl row of ``cluster`` with ``noise`` (log-normal) on each time."""
    rnd = random.Random(seed)
    rows = ["size,time_us"]
    for size in SIZES:
        t = nccl_time(cluster, size, collective).time_s * math.exp(rnd.gauss(0, noise))
        rows.append(f"{size},{t * 1e6:.4f}")
    return parse_log("\n".join(rows), "synthetic.csv", collective=collective)


@pytest.fixture(scope="module")
def h100():
    return load_cluster(H100)


def test_a_healthy_curve_is_healthy(h100):
    d = diagnose(curve(h100, 16), h100)
    assert d.fits[0].kind == "healthy"
    assert d.verdict.startswith("fits the healthy cluster within noise")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_nic_at_a_quarter_ranks_first(h100, seed):
    d = diagnose(curve(degraded(h100, {"node1/nic3": 0.25}), 16, seed=seed), h100)
    best = d.fits[0]
    assert (best.kind, best.value) == ("nic-slow", 0.25), [f.label for f in d.fits[:4]]
    assert "any one NIC (node0/nic0 shown)" == best.stands_for
    assert d.healthy.rms > 0.1


def test_every_nic_at_half_ranks_first(h100):
    slow = degraded(h100, {f"node{b}/nic{k}": 0.5 for b in range(2) for k in range(8)})
    d = diagnose(curve(slow, 16), h100)
    assert d.fits[0].kind in ("all-nics-slow", "box-nics-slow"), [f.label for f in d.fits[:4]]
    assert d.fits[0].value == 0.5


def test_a_slow_uplink_ranks_first():
    cluster = load_cluster(TWO_LEAF)
    d = diagnose(curve(degraded(cluster, {"leaf0-leaf1": 0.25}), cluster.nranks), cluster)
    assert (d.fits[0].kind, d.fits[0].label) == ("uplink-slow",
                                                  "switch link leaf0-leaf1 at x0.25")
    assert "bandwidth-bound" in d.fits[0].explains


def test_a_plugin_latency_is_fitted():
    cluster = load_cluster(TWO_LEAF)
    d = diagnose(curve(plugin_latency(cluster, 50e-6), cluster.nranks), cluster)
    assert (d.fits[0].kind, d.fits[0].value) == ("plugin-latency", 50e-6)
    assert "latency-bound" in d.fits[0].explains


def test_ranks_across_racks_ranks_first():
    cluster = load_cluster(TWO_LEAF)
    d = diagnose(curve(interleaved(cluster), cluster.nranks), cluster)
    assert d.fits[0].kind == "rank-order", [f.label for f in d.fits[:4]]


def test_a_slow_nvswitch_in_one_box():
    cluster = load_cluster(DGX)
    d = diagnose(curve(degraded(cluster, {"dgx/fabric": 0.5}), 8), cluster)
    assert (d.fits[0].kind, d.fits[0].value) == ("fabric-slow", 0.5)


def test_hypotheses_use_symmetry_and_skip_what_cannot_be(h100):
    found = hypotheses(h100)
    assert len(found) < 20
    kinds = [h.kind for h in found]
    assert kinds[0] == "healthy" and kinds.count("nic-slow") == 1
    assert "rank-order" not in kinds and "uplink-slow" not in kinds   # one switch
    one_nic = load_cluster(TWO_LEAF)
    assert "nic-down" not in [h.kind for h in hypotheses(one_nic)]  # would be unreachable
    down = nic_down(h100, 0, 0)
    assert len(down.boxes[0].nics) == 7 and down.boxes[0].nics[0].gpus == (0, 1)


def test_a_rank_count_that_is_not_the_clusters_is_an_error(h100):
    log = replace(curve(h100, 16), nranks=8)
    with pytest.raises(DoctorError, match="has 8 ranks but cluster 'h100-2x8' has 16 GPUs"):
        diagnose(log, h100)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "topoplan", "doctor", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_text_and_json(tmp_path):
    done = _cli(H100, DATA / "all_reduce_2x8_h100.txt")
    assert done.returncode == 0, done.stderr
    assert "verdict:" in done.stdout and "fit 1:" in done.stdout and "check:" in done.stdout
    done = _cli(H100, DATA / "all_reduce_2x8_h100.txt", "--json", "--top", "2")
    data = json.loads(done.stdout)
    assert data["nranks"] == 16 and len(data["best"]) == 2 and data["all"]
    assert data["measured"][0]["size"] == 8 and "expected" in data["healthy"]


@pytest.mark.parametrize("text, message", [
    ("#  size  count  type redop root time algbw busbw #wrong\n   8  2  float  sum\n",
     "topoplan: error: {log}:2: truncated row"),
    ("nothing here\n", "topoplan: error: {log}: not a log topoplan doctor reads"),
])
def test_cli_errors_are_one_line(tmp_path, text, message):
    log = tmp_path / "x.log"
    log.write_text(text)
    done = _cli(H100, log)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(message.format(log=log)) and done.stderr.count("\n") == 1


def test_cli_rank_mismatch_is_one_line():
    done = _cli(TWO_LEAF, DATA / "all_reduce_2x8_h100.txt")
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "has 16 ranks but cluster 'two-leaf-oversubscribed' has 64 GPUs" in done.stderr


def test_a_testbed_log_with_a_slow_switch_link(tmp_path):
    """The testbed's JSON (cluster, scale, nranks, each algorithm's rows): the ring that ran
    is planned again on the scaled cluster and simulated on each hypothesis."""
    from topoplan.commands.doctor import planned_predictor
    path = ROOT / "topologies" / "targets" / "two_switch_4x2.yaml"
    cluster = load_cluster(path)
    scaled = cluster.scaled(0.01)
    sizes = [1 << k for k in range(12, 26, 2)]
    times = planned_predictor(scaled)(degraded(scaled, {"switch0-switch1": 0.25}), "ring",
                                      "allreduce", sizes)
    rnd = random.Random(0)
    rows = [{"algorithm": "ring", "size": s, "measured_s": t * math.exp(rnd.gauss(0, 0.03)),
             "predicted_s": None} for s, t in zip(sizes, times)]
    rows += [{"algorithm": "native", "size": s, "measured_s": 1.0} for s in sizes]
    log = tmp_path / "testbed.json"
    log.write_text(json.dumps({"cluster": cluster.name, "scale": 0.01, "nranks": 8,
                               "transport": "gloo", "collective": "allreduce",
                               "calibration": None, "rows": rows}))
    data = json.loads(_cli(path, log, "--json").stdout)
    assert data["algorithm"] == "ring" and data["nranks"] == 8
    assert data["best"][0]["label"] == "switch link switch0-switch1 at x0.25"
    assert any("native rows" in note for note in data["notes"])


def test_several_curves_tell_apart_what_one_cannot(tmp_path):
    """On doctor_6 a ring in rank order crosses every NIC and the uplink once each way:
    a slow uplink and a slow NIC make the same ring curve. A second ring that crosses the
    uplink four times tells them apart; the doctor fits every curve of the log at once."""
    from topoplan.commands.doctor import planned_predictor
    path = DATA / "doctor_6.yaml"
    cluster = load_cluster(path)
    predict = planned_predictor(cluster)
    sizes = [1 << 22, 1 << 24]
    slow = degraded(cluster, {"leaf0-leaf1": 0.5})
    rows = [{"algorithm": algorithm, "size": s, "measured_s": t, "predicted_s": None}
            for algorithm in ("ring", "ring:0,3,1,4,2,5")
            for s, t in zip(sizes, predict(slow, algorithm, "allreduce", sizes))]
    log = tmp_path / "testbed.json"
    log.write_text(json.dumps({"cluster": cluster.name, "scale": 1.0, "nranks": 6,
                               "transport": "gloo", "collective": "allreduce",
                               "calibration": None, "rows": rows}))
    one = json.loads(_cli(path, log, "--json", "--algorithm", "ring").stdout)
    best = min(f["rms"] for f in one["all"])
    tied = [f["label"] for f in one["all"] if f["rms"] < best + 1e-6]
    assert "switch link leaf0-leaf1 at x0.5" in tied and "NIC b/nic0 at x0.5" in tied
    both = json.loads(_cli(path, log, "--json").stdout)
    assert both["algorithm"] == "ring + ring:0,3,1,4,2,5"
    assert both["algorithms"] == ["ring", "ring:0,3,1,4,2,5"]
    assert both["best"][0]["label"] == "switch link leaf0-leaf1 at x0.5"
    assert both["best"][1]["score"] > both["best"][0]["score"] + 0.05
    assert [(m["algorithm"], m["size"]) for m in both["measured"]] == \
        [(a, s) for a in ("ring", "ring:0,3,1,4,2,5") for s in sizes]
    assert any("2 curves fitted together" in n for n in both["notes"])
    text = _cli(path, log, "--algorithm", "ring,ring:0,3,1,4,2,5").stdout
    assert "ring:0,3,1,4,2,5" in text and "verdict: best explained by switch link" in text
    missing = _cli(path, log, "--algorithm", "ring,mcf")
    assert missing.returncode == 1 and "has no 'mcf' rows" in missing.stderr
