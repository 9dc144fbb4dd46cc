"""``topoplan estimate``: the iteration model by hand, the networks' sizes, the CLI contract."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from topoplan.cli import main
from topoplan.cluster import load_cluster, loads_cluster
from topoplan.errors import EstimateError, TopoplanError
from topoplan.estimate import JSON_KEYS, compute_time, estimate, fuse, gpu_of
from topoplan.estimate.models import get_model, uniform_model

ROOT = Path(__file__).resolve().parent.parent

FOUR = """
name: four
switches: [{name: sw}]
boxes:
  - {name: "b{i}", count: 4, gpus: 1, nics: [{switch: sw, bandwidth: 1 GB/s, latency: 5 us}]}
"""


@pytest.fixture(scope="module")
def four():
    return loads_cluster(FOUR)


def test_one_bucket_ring_after_compute_is_compute_plus_the_ring_by_hand(four):
    params, compute = 1_000_000, 0.5
    result = estimate(four, model=uniform_model(params), compute_s=compute, algorithm="ring",
                      profile="ideal")
    # By hand (docs/COST_MODEL.md, ideal profile): 2 (N - 1) ring steps, each moving
    # M / N bytes over one NIC link of B and paying the path latency GPU->NIC->switch->NIC->GPU.
    n, nbytes = 4, 4 * params
    bandwidth = 1e9                       # the NIC's 1 GB/s (the GPU->NIC hop is as fast)
    latency = 5e-6 + 5e-6                 # two NIC hops of 5 us
    ring = 2 * (n - 1) * (latency + nbytes / (n * bandwidth))
    assert ring == pytest.approx(6.06e-3)
    assert len(result.buckets) == 1 and result.buckets[0].algorithm == "ring"
    assert result.comm_s == pytest.approx(ring, rel=1e-9)
    assert result.iteration_s == pytest.approx(compute + ring, rel=1e-9)
    assert result.exposed_comm_s == pytest.approx(ring, rel=1e-9)
    assert result.samples_per_s == pytest.approx(n / (compute + ring))
    assert result.efficiency == pytest.approx(compute / (compute + ring))


def test_overlap_double_buffering_and_fp16_by_hand(four):
    model, compute = uniform_model(1_000_000), 0.5
    ring = lambda nbytes: 6 * (10e-6 + nbytes / 4e9)  # noqa: E731  the ring above
    fp16 = estimate(four, model=model, compute_s=compute, algorithm="ring", profile="ideal",
                    fp16=True)
    assert fp16.comm_s == pytest.approx(ring(2_000_000))
    # Double buffering: the allreduce hides behind the next step's compute.
    db = estimate(four, model=model, compute_s=compute, algorithm="ring", profile="ideal",
                  double_buffering=True)
    assert (db.iteration_s, db.exposed_comm_s) == (compute, 0.0)
    slow = estimate(four, model=model, compute_s=1e-3, algorithm="ring", profile="ideal",
                    double_buffering=True)
    assert slow.iteration_s == pytest.approx(ring(4_000_000))
    # Overlap, 100 tensors of 40 kB in 1 MB buckets: 4 buckets, the last one ready when
    # backward ends, so only the last bucket's ring is exposed.
    ov = estimate(four, model=model, compute_s=compute, algorithm="ring", profile="ideal",
                  overlap=True, fusion=1_000_000)
    assert [b.nbytes for b in ov.buckets] == [1_000_000] * 4
    assert ov.buckets[-1].ready_s == pytest.approx(compute)
    assert ov.exposed_comm_s == pytest.approx(ring(1_000_000))


def test_the_four_networks_have_their_published_parameter_counts():
    assert get_model("ResNet-50").params == 25_557_032
    assert get_model("resnet152").params == 60_192_808
    assert 334_000_000 <= get_model("bert-large").params <= 340_000_000
    assert get_model("gpt2-1.5b").params == pytest.approx(1.558e9, rel=1e-3)
    # ResNet-50: about 4.1 G multiply-accumulates per 224x224 image.
    assert sum(t.macs for t in get_model("resnet50").tensors) == pytest.approx(4.1e9, rel=0.02)


def test_fusion_packs_in_backward_order():
    model = get_model("resnet50")
    buckets = fuse(model, 64 << 20, 4)
    assert sum(b for b, _, _ in buckets) == 4 * model.params
    assert all(b <= 64 << 20 for b, _, _ in buckets)
    assert buckets[-1][2] == 0  # the last bucket closes with the first layer
    assert len(fuse(model, 0, 4)) == len(model.tensors)


@pytest.mark.parametrize("topology", ["mn1_10gbe", "aws_p2_8xlarge"])
def test_overlap_is_never_slower_than_after_compute(topology):
    cluster = load_cluster(ROOT / "topologies" / f"{topology}.yaml")
    cache: dict = {}
    model = get_model("resnet50")
    for compute in (0.01, 0.1, 0.3):
        kwargs = dict(model=model, compute_s=compute, algorithm="ring", fusion=16 << 20,
                      _cache=cache)
        after = estimate(cluster, **kwargs)
        over = estimate(cluster, overlap=True, **kwargs)
        assert over.iteration_s <= after.iteration_s + 1e-12
        assert over.comm_s == pytest.approx(after.comm_s)
        assert 0 <= over.exposed_comm_s <= after.exposed_comm_s + 1e-12


def test_compute_time_comes_from_the_cited_table_and_the_cluster_file():
    assert gpu_of(load_cluster(ROOT / "topologies" / "mn1_infiniband.yaml")) == "P100"
    assert gpu_of(load_cluster(ROOT / "topologies" / "aws_p2_8xlarge.yaml")) == "K80"
    assert gpu_of(loads_cluster(FOUR)) is None
    seconds, batch, entry = compute_time("resnet50", "P100")
    assert (batch, seconds) == (64, pytest.approx(64 / 219))
    assert "tensorflow.org" in entry.source
    seconds, batch, entry = compute_time("resnet50", "k80", 32)
    assert seconds == pytest.approx(32 / 49.0)  # the batch-32 measurement
    with pytest.raises(EstimateError, match="no peak to derive one from.*--compute-time"):
        compute_time("gpt2-1.5b", "K80")


def _train_flops(name: str) -> float:
    return 6.0 * sum(t.macs for t in get_model(name).tensors)


def test_a_pair_without_a_published_figure_is_derived_from_the_peak():
    # A published figure wins: A100 ResNet-50 is NVIDIA's 938 images/s.
    assert compute_time("resnet50", "A100")[2].samples_per_s == 938.0
    # Convnets take the utilization of the published ResNet-50 at their precision.
    _, batch, h100 = compute_time("resnet50", "H100")
    assert (h100.precision, batch) == ("tf32", 256)
    assert h100.samples_per_s == pytest.approx(938.0 * (989e12 / 2) / 156e12)
    assert h100.source.startswith("derived, not measured: 494.5 TFLOP/s (H100 dense TF32")
    assert "NVIDIA H100 datasheet" in h100.source
    v100 = compute_time("resnet152", "V100")[2]
    assert v100.samples_per_s == pytest.approx(367.0 * _train_flops("resnet50")
                                               / _train_flops("resnet152"))
    # Transformers: 33% of the dense 16-bit peak (Megatron-LM's 44% without recomputation).
    for gpu, peak in (("V100", 125e12), ("A100", 312e12), ("H100", 989.5e12),
                      ("H200", 989.5e12), ("B200", 2.25e15)):
        gpt2 = compute_time("gpt2-1.5b", gpu)[2]
        assert gpt2.samples_per_s == pytest.approx(peak * 0.33 / _train_flops("gpt2-1.5b"))
        assert "Narayanan et al. 2021" in gpt2.source
    assert compute_time("bert-large", "V100")[2].samples_per_s == 40.32  # published
    assert compute_time("bert-large", "H100")[2].precision == "bf16"


def test_the_derived_table_in_the_docs_is_what_the_code_derives():
    text = (ROOT / "docs" / "ESTIMATE.md").read_text()
    block = text.split("What it gives")[1].split("\n\n")[1]
    rows = [line.split("|")[1:-1] for line in block.splitlines()[2:]]
    gpus = [("V100",), ("A100",), ("H100", "H200"), ("B200",)]
    for model, *cells in rows:
        for cell, names in zip(cells, gpus):
            shown = float(cell.split("(")[0].replace(",", ""))
            for gpu in names:
                rate = compute_time(model.strip(), gpu)[2].samples_per_s
                assert shown == pytest.approx(rate, rel=5e-3, abs=0.05), (model, gpu)


@pytest.mark.parametrize("gpu", ["H100", "H200", "B200"])
def test_cli_estimates_resnet50_on_the_newest_gpus(tmp_path, capsys, gpu):
    path = tmp_path / "four.yaml"
    path.write_text(f"# four boxes of one {gpu}\n" + FOUR)
    assert gpu_of(load_cluster(path)) == gpu
    assert main(["estimate", str(path), "--gpu", gpu, "--model", "resnet50", "--algorithm",
                 "ring", "--profile", "ideal"]) == 0
    out = capsys.readouterr().out
    assert "derived, not measured" in out and f"{gpu} dense TF32 peak" in out
    assert main(["estimate", str(path), "--model", "gpt2-1.5b", "--algorithm", "ring",
                 "--json"]) == 0  # the GPU from the file's comment
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == gpu and data["compute_s"] > 0


@pytest.mark.parametrize("text, params", [("1.5e9", 1_500_000_000), ("1.5B", 1_500_000_000),
                                          ("350M", 350_000_000), ("7B", 7_000_000_000),
                                          ("64k", 64_000), ("1000000", 1_000_000)])
def test_params_take_counts_as_people_write_them(tmp_path, capsys, text, params):
    path = tmp_path / "four.yaml"
    path.write_text(FOUR)
    assert main(["estimate", str(path), "--params", text, "--compute-time", "1",
                 "--algorithm", "ring", "--profile", "ideal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == params
    assert uniform_model(text).params == params


def test_json_leads_with_the_six_numbers_then_the_buckets_and_the_box(tmp_path, capsys):
    path = tmp_path / "four.yaml"
    path.write_text(FOUR)
    assert main(["estimate", str(path), "--params", "1000000", "--compute-time", "500 ms",
                 "--algorithm", "ring", "--profile", "ideal", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert tuple(out)[:len(JSON_KEYS)] == JSON_KEYS
    assert out["iteration_s"] == pytest.approx(0.5 + 6.06e-3)
    assert all(isinstance(out[k], float) and math.isfinite(out[k]) for k in JSON_KEYS)
    assert 0 < out["efficiency_box"] <= 1 and out["box_gpus"] == 1
    assert (out["nranks"], out["params"], out["bytes_per_param"]) == (4, 1000000, 4)
    (bucket,) = out["buckets"]  # 4 MB of gradients: one 64 MiB bucket
    assert (bucket["bytes"], bucket["algorithm"]) == (4000000, "ring")
    assert bucket["ready_s"] <= bucket["start_s"] < bucket["end_s"]
    assert out["comm_s"] == pytest.approx(bucket["end_s"] - bucket["start_s"])
    assert main(["estimate", str(path), "--params", "1000000", "--compute-time", "0.5",
                 "--overlap", "--fp16"]) == 0
    assert "efficiency vs 1 GPU" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--model", "resnet-51", "--compute-time", "1"], "unknown model 'resnet-51'"),
    (["--model", "resnet50"], "names no GPU model; give --gpu"),
    (["--model", "resnet50", "--gpu", "TPU"], "unknown GPU 'TPU'"),
    (["--model", "gpt2-1.5b", "--gpu", "K80"], "no published throughput for gpt2-1.5b on K80"),
    (["--params", "1000", "--gpu", "V100"], "no published throughput for 1,000 params"),
    (["--params", "1000", "--compute-time", "1", "--algorithm", "nope"], "unknown planner 'nope'"),
])
def test_bad_input_is_one_line_error(tmp_path, capsys, argv, message):
    path = tmp_path / "four.yaml"
    path.write_text(FOUR)
    assert main(["estimate", str(path), *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("topoplan: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["--params", "0", "--compute-time", "1"],
                                  ["--params", "1.5X", "--compute-time", "1"],
                                  ["--params", "1.23456789012B", "--compute-time", "1"],
                                  ["--params", "10", "--compute-time", "-1"],
                                  ["--params", "10", "--compute-time", "1", "--fusion", "x"],
                                  ["--params", "10", "--compute-time", "1",
                                   "--backward-fraction", "1.5"]])
def test_bad_numbers_are_usage_errors(tmp_path, capsys, argv):
    path = tmp_path / "four.yaml"
    path.write_text(FOUR)
    with pytest.raises(SystemExit) as exc:
        main(["estimate", str(path), *argv])
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_library_errors_are_topoplan_errors(four):
    model = uniform_model(10)
    for kwargs in (dict(compute_s=0.0), dict(compute_s=1.0, batch_per_gpu=0),
                   dict(compute_s=1.0, fusion=-1), dict(compute_s=1.0, backward_fraction=0)):
        with pytest.raises(TopoplanError):
            estimate(four, model=model, **kwargs)
    with pytest.raises(EstimateError):
        uniform_model(0)


def test_to_json_is_text_and_to_dict_the_data_with_a_deprecation_path():
    cluster = loads_cluster(FOUR)
    result = estimate(cluster, model=uniform_model(1000), compute_s=0.1, algorithm="ring",
                      profile="ideal")
    data = result.to_dict()
    text = result.to_json()
    assert isinstance(data, dict) and isinstance(text, str)
    assert json.loads(text) == data and json.loads(result.to_json(indent=1)) == data
    assert tuple(data)[:len(JSON_KEYS)] == JSON_KEYS
    # It returned the dict: its lookups still answer, each warning and naming to_dict().
    with pytest.warns(DeprecationWarning, match=r"use IterationEstimate\.to_dict\(\)"):
        assert text["iteration_s"] == data["iteration_s"]
    with pytest.warns(DeprecationWarning, match=r"\.get\(\).*to_dict"):
        assert text.get("nranks") == 4
    with pytest.warns(DeprecationWarning, match="to_dict"):
        assert dict(text.items()) == data and list(text.keys()) == list(data)
    assert text[0] == "{"  # the text's own indexing is untouched
