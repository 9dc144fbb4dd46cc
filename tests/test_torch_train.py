"""scripts/train.py end to end: 2 and 4 MPI ranks (topoplan executor, MPI transport,
DistributedOptimizer) reach the 1-rank test accuracy at the same global batch size,
with fp32 sync and with fp16 + double buffering; and the command line's own output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

pytest.importorskip("torch")
pytest.importorskip("sklearn")

ROOT = Path(__file__).resolve().parent.parent


def load_train_script():
    return load_script("train")


def mpiexec() -> str | None:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


@pytest.mark.mpi
@pytest.mark.slow
def test_two_and_four_ranks_match_one_rank_accuracy():
    pytest.importorskip("mpi4py")
    pytest.importorskip("topoplan.runtime.executor")
    pytest.importorskip("topoplan.runtime.transports")
    launcher = mpiexec()
    if launcher is None:
        pytest.skip("mpiexec not found")
    cmd = [launcher, "-n", "4", "--oversubscribe", sys.executable,
           str(ROOT / "tests" / "mpi_train_accuracy.py")]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=ROOT)
    # The 1-rank reference trains here while the MPI job starts up.
    train = load_train_script()
    args = train.build_parser().parse_args(
        ["--model", "mlp", "--optimizer", "adam", "--lr", "0.005", "--warmup-epochs", "0",
         "--schedule", "cosine", "--epochs", "12", "--batch-size", "64", "--no-progress"])
    one = train.train(args, train.World("single"))
    try:
        out, err = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        job.kill()
        out, err = job.communicate()
        pytest.fail(f"mpiexec timed out\n{err[-3000:]}")
    assert job.returncode == 0, err[-3000:]
    runs = json.loads(out.strip().splitlines()[-1])
    seen = {(r["ranks"], r["fp16"], r["double_buffering"]) for r in runs}
    assert seen == {(2, False, False), (2, True, True), (4, False, False), (4, True, True)}
    assert one["test_accuracy"] > 90
    for r in runs:
        label = f"{r['ranks']} ranks {r['algorithm']} fp16={r['fp16']} dbuf={r['double_buffering']}"
        assert r["launcher"] == "mpi" and r["mode"] == "optimizer"
        assert r["chosen"] == [r["algorithm"]], label          # the planner we asked for ran
        assert r["allreduce_calls"] >= r["steps"], label
        assert r["params_consistent"], f"{label}: ranks ended with different models"
        # the time in communication, overlapped or not (it was nan when overlapped)
        assert 0 < r["comm_s"] < r["wall_s"] and 0 <= r["comm_exposed_s"] <= r["wall_s"], label
        assert abs(r["test_accuracy"] - one["test_accuracy"]) <= 1.0, (
            f"{label}: {r['test_accuracy']:.2f}% vs 1 rank {one['test_accuracy']:.2f}%")
        if not r["fp16"]:   # fp32 sync is 1-rank SGD up to summation order
            assert abs(r["param_checksum"] - one["param_checksum"]) < 1e-2 * abs(one["param_checksum"])


def test_cli_prints_the_summary_line(capsys):
    train = load_train_script()
    assert train.main(["--epochs", "1", "--model", "mlp", "--no-progress", "--double-buffering",
                       "--fp16-allreduce"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"train: 1 rank single/optimizer auto(?: \([a-z/-]+\))? fp16 dbuf(?: overlap)?: \d+ samples/s, test accuracy "
                        r"[\d.]+%, compute [\d.]+ s, communication [\d.]+ s \(exposed [\d.]+ s\), "
                        r"wall [\d.]+ s", line), line


def test_cli_errors_are_one_line(capsys):
    train = load_train_script()
    assert train.main(["--cluster", str(ROOT / "topologies" / "ddl_two_switch.yaml"),
                       "--epochs", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("train: error: cluster 'ddl-two-switch' has 4 ranks but the job has 1; "
                           "launch 4 processes or pick another --cluster")
    assert train.main(["--batch-size", "10", "--launcher", "single", "--mode", "ddp",
                       "--no-progress"]) == 1
    assert "needs torchrun" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["cnn", "mlp", "wide", "deep"])
def test_models_make_gradients_in_reverse_registration_order(name):
    """DistributedOptimizer lays overlap buffers out in reverse parameter order and starts
    them in that order: each model's backward must make its gradients in that order, or
    an early buffer waits for a late one (a model registering its layers out of forward
    order would lose the overlap)."""
    import torch

    train = load_train_script()
    model = train.MODELS[name]()
    named = list(model.named_parameters())
    made = []
    for pname, p in named:
        p.register_post_accumulate_grad_hook(lambda _p, pname=pname: made.append(pname))
    out = model(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 10)
    out.sum().backward()
    order = [pname for pname, _ in named][::-1]
    # weight and bias of one layer come from one backward node, in either order
    layer = [pname.rsplit(".", 1)[0] for pname in made]
    assert layer == [pname.rsplit(".", 1)[0] for pname in order], made
