"""Every ``--json`` a command prints is JSON, from a real run (``testbed bench --json``
lost the whole run to ``Object of type bool is not JSON serializable``, a numpy
bool of the network probe's report).

The helper all the paths print through (``json_text``) is tested with numpy values and
with a probe report made as the probe makes it; then each command runs for real, the
smallest run it allows, and its stdout must parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from topoplan.commands.common import json_text

from .support.netns import needs_netns

ROOT = Path(__file__).resolve().parent.parent
DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")
TWO = """
name: tb-json
switches: [{name: sw0}, {name: sw1}]
boxes:
  - {name: A, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: B, gpus: 1, nics: [{switch: sw1, bandwidth: 500 Mbit/s}]}
links:
  - {a: sw0, b: sw1, bandwidth: 250 Mbit/s, latency: 100 us}
"""


def test_numpy_values_and_paths_print_as_plain_json():
    value = {"ok": np.bool_(True), "rate": np.float32(1.5), "n": np.int64(3),
             "rows": np.arange(3), "file": Path("a/b.json"), "f64": np.float64(0.25)}
    with pytest.raises(TypeError, match="bool"):
        json.dumps(value)
    assert json.loads(json_text(value)) == {"ok": True, "rate": 1.5, "n": 3, "rows": [0, 1, 2],
                                            "file": "a/b.json", "f64": 0.25}
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        json_text({"x": object()})


def test_a_probe_report_with_the_models_rates_prints():
    """The report as check_pairs builds it: the model's rates come from the max-min solver
    (numpy), so ``ok`` was a numpy bool."""
    from topoplan.cluster import loads_cluster
    from topoplan.testbed.layout import plan_layout
    from topoplan.testbed.probe import PairCheck, ProbeReport, predicted_rates
    layout = plan_layout(loads_cluster(TWO), 1.0, prefix="tp-json-")
    models = predicted_rates(layout, [(0, 1), (1, 0)])
    checks = [PairCheck(0, 1, np.float64(models[0]), models[0] * 0.97, pattern="shift 1"),
              PairCheck(1, 0, np.float64(models[1]), models[1] * 1.5, pattern="shift 1")]
    report = ProbeReport(checks, seconds=1.0)
    with pytest.raises(TypeError, match="bool is not JSON serializable"):
        json.dumps(report.to_dict())
    data = json.loads(json_text(report.to_dict()))
    assert data["ok"] is False and [c["ok"] for c in data["checks"]] == [True, False]
    # and the model's rates the probe gets are plain floats in the first place
    assert all(type(m) is float for m in models)


def _run(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _json(done: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("args, key", [
    (["plan", DDL, "-a", "ring", "--size", "1MiB", "--json"], "nranks"),
    (["estimate", DDL, "--params", "1000000", "--compute-time", "500 ms", "--algorithm", "ring",
      "--profile", "ideal", "--json"], "iteration_s"),
])
def test_plan_and_estimate_json(args, key, tmp_path):
    data = _json(_run(*args, cwd=tmp_path))
    assert key in data


def test_simulate_json(tmp_path):
    assert _run("plan", DDL, "-a", "ring", "-o", "plan.json", cwd=tmp_path).returncode == 0
    data = _json(_run("simulate", DDL, "plan.json", "--sizes", "1MiB", "--json", cwd=tmp_path))
    assert data


@pytest.mark.mpi
def test_bench_json(tmp_path):
    pytest.importorskip("mpi4py")
    data = _json(_run("bench", "--algorithm", "ring", "-n", "2", "--sizes", "4KiB", "--iters",
                      "1", "--json", cwd=tmp_path))
    assert data["rows"][0]["wrong"] == 0


@pytest.mark.mpi
@pytest.mark.slow
def test_calibrate_json(tmp_path):
    pytest.importorskip("mpi4py")
    data = _json(_run("calibrate", "-n", "2", "--quick", "-o", "p.yaml", "--json", cwd=tmp_path))
    assert data["file"] == "p.yaml" and data["profile"]["name"] == "p"


@needs_netns
@pytest.mark.slow
def test_testbed_bench_and_probe_json(tmp_path, monkeypatch):
    """The smallest real testbed runs: two ranks, one small size, the probe on."""
    monkeypatch.setenv("TOPOPLAN_TESTBED_STATE", str(tmp_path / "state"))
    (tmp_path / "two.yaml").write_text(TWO)
    data = _json(_run("testbed", "bench", "two.yaml", "--algorithms", "ring,native", "--sizes",
                      "64KiB", "--iters", "1", "--warmup", "0", "--no-calibrate", "--json",
                      cwd=tmp_path))
    assert data["probe"]["ok"] is True and len(data["rows"]) == 2
    assert all(isinstance(c["ok"], bool) for c in data["probe"]["checks"])

    from topoplan.cluster import loads_cluster
    from topoplan.testbed import Testbed
    with Testbed.up(loads_cluster(TWO), scale=1.0) as bed:
        probe = _run("testbed", "probe", str(bed.state), "--all-pairs", "--seconds", "0.2",
                     "--json", cwd=tmp_path)
    assert "Traceback" not in probe.stderr, probe.stderr
    report = json.loads(probe.stdout)  # exit 1 would only mean a pair off the model
    assert {(c["src"], c["dst"]) for c in report["checks"]} >= {(0, 1), (1, 0)}
