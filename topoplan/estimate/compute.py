"""One GPU's compute time per training iteration: published throughputs, each with its
source (:data:`THROUGHPUTS`), and where none was published, one derived from the GPU's peak
(:func:`derive`)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EstimateError
from .models import canonical, get_model

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["Throughput", "THROUGHPUTS", "GPUS", "PEAKS", "PEAK_SOURCES", "KINDS",
           "TRANSFORMER_UTILIZATION", "derive", "compute_time", "gpu_of"]

#: The GPUs the estimator knows: a published throughput (:data:`THROUGHPUTS`) or a peak
#: (:data:`PEAKS`) to derive one from.
GPUS = ("K80", "P100", "V100", "A100", "H100", "H200", "B200")

_TF_BENCH = ("TensorFlow performance benchmarks, tensorflow.org/performance/benchmarks "
             "(May 2017, tf_cnn_benchmarks, synthetic data, 1 GPU)")
_NV_RN50 = ("NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/"
            "README.md, 'Training performance' (pytorch-21.03 NGC container, 1 GPU); batch "
            "from configs.yml")
_NV_BERT = ("NVIDIA DeepLearningExamples, PyTorch/LanguageModeling/BERT/README.md, "
            "'Pre-training NVIDIA DGX-1 With 32G' (pytorch:19.07 NGC container, 1 GPU, "
            "sequence length 128)")


@dataclass(frozen=True, slots=True)
class Throughput:
    """A published training throughput of one GPU: ``samples_per_s`` at ``batch`` per GPU."""

    samples_per_s: float
    batch: int
    precision: str
    source: str


#: Published single-GPU training throughputs, ``(model, gpu) -> [Throughput, ...]``.
#: Compute time per iteration is ``batch / samples_per_s`` from the entry whose batch is
#: nearest the one asked for, scaled linearly to that batch. No entry was fitted to the
#: tables the estimator is checked against. Empty cells are derived from the GPU's peak
#: where :data:`PEAKS` has it (:func:`derive`: every H100, H200 and B200, GPT-2 1.5B,
#: ResNet-152 on V100/A100, BERT-large on A100); on K80 and P100 they need ``compute_s``.
THROUGHPUTS: dict[tuple[str, str], tuple[Throughput, ...]] = {
    ("resnet50", "K80"): (
        Throughput(51.5, 64, "fp32", _TF_BENCH + ", Amazon EC2 p2.8xlarge"),
        Throughput(49.0, 32, "fp32", _TF_BENCH + ", Amazon EC2 p2.8xlarge, other results")),
    ("resnet50", "P100"): (
        Throughput(219.0, 64, "fp32", _TF_BENCH + ", NVIDIA DGX-1 (P100)"),
        Throughput(195.0, 32, "fp32", _TF_BENCH + ", NVIDIA DGX-1 (P100), other results")),
    ("resnet50", "V100"): (
        Throughput(367.0, 112, "fp32", _NV_RN50 + ", NVIDIA DGX-1 16GB, FP32"),),
    ("resnet50", "A100"): (
        Throughput(938.0, 256, "tf32", _NV_RN50 + ", NVIDIA DGX A100 80GB, TF32"),),
    ("resnet152", "K80"): (
        Throughput(19.7, 32, "fp32", _TF_BENCH + ", Amazon EC2 p2.8xlarge"),),
    ("resnet152", "P100"): (
        Throughput(91.8, 64, "fp32", _TF_BENCH + ", NVIDIA DGX-1 (P100)"),
        Throughput(82.7, 32, "fp32", _TF_BENCH + ", NVIDIA DGX-1 (P100), other results")),
    ("bert-large", "V100"): (
        Throughput(40.32, 32, "fp32", _NV_BERT + ", FP32"),),
}


#: Dense peak FLOP/s of one GPU (SXM module) by the precision it trains in, from the
#: vendor's datasheet; where the datasheet quotes tensor-core figures "with sparsity"
#: (2:4 structured), half of them. ``fp16`` on V100 is its tensor cores' mixed precision.
PEAKS: dict[str, dict[str, float]] = {
    "V100": {"fp32": 15.7e12, "fp16": 125e12},
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
    "H100": {"fp32": 67e12, "tf32": 989e12 / 2, "bf16": 1979e12 / 2},
    "H200": {"fp32": 67e12, "tf32": 989e12 / 2, "bf16": 1979e12 / 2},
    "B200": {"fp32": 75e12, "tf32": 2.2e15 / 2, "bf16": 4.5e15 / 2},
}
#: Where each peak comes from.
PEAK_SOURCES = {
    "V100": "NVIDIA Tesla V100 datasheet, SXM2: 15.7 TFLOPS FP32, 125 tensor",
    "A100": "NVIDIA A100 datasheet, SXM: 19.5 TFLOPS FP32, 156 TF32, 312 BF16 (dense)",
    "H100": "NVIDIA H100 datasheet, SXM: 67 TFLOPS FP32; 989 TF32 and 1,979 BF16 with "
            "sparsity",
    "H200": "NVIDIA H200 datasheet, SXM: 67 TFLOPS FP32; 989 TF32 and 1,979 BF16 with "
            "sparsity",
    "B200": "NVIDIA HGX B200 datasheet, per GPU: 75 TFLOPS FP32; 2.2 PFLOPS TF32 and 4.5 "
            "BF16 with sparsity",
}

#: Model-FLOP utilization of transformer training in 16-bit precision: Narayanan et al.,
#: "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
#: (SC21), table 1: a 1.7B-parameter GPT (the size of GPT-2 1.5B) on 32 A100s ran at
#: 137 TFLOP/s per GPU, 44% of the 312 TFLOP/s peak, counting the forward pass that
#: activation recomputation repeats (96 B s l h^2 FLOPs per iteration where training
#: needs 72): 44% x 3/4 = 33% of peak in the 6 FLOPs per multiply-accumulate and sample
#: that :func:`derive` charges.
TRANSFORMER_UTILIZATION = 0.44 * 72 / 96

#: The network kinds :func:`derive` prices: convolutional networks train in TF32 (FP32
#: where a GPU has no TF32), transformers in mixed 16-bit precision.
KINDS = {"resnet50": "convnet", "resnet152": "convnet", "bert-large": "transformer",
         "gpt2-1.5b": "transformer"}
#: The published entry whose utilization a convnet without its own figure takes, by the
#: precision it trains in: the same network family, measured by NVIDIA.
_CONVNET_REFERENCE = {"tf32": ("resnet50", "A100"), "fp32": ("resnet50", "V100")}
#: Batch per GPU of a derived entry: the network's published batch where the table has
#: one, else the 1.7B GPT's in Narayanan et al. (512 sequences over 32 GPUs).
_DERIVED_BATCH = {"gpt2-1.5b": 16}


def _train_flops(model: str) -> float:
    """FLOPs of one training sample: forward 2 per multiply-accumulate, backward twice the
    forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", 2.1)."""
    return 6.0 * sum(t.macs for t in get_model(model).tensors)


def _precision(model: str, gpu: str) -> str:
    if KINDS[model] == "transformer":
        return "fp16" if "fp16" in PEAKS[gpu] else "bf16"
    return "tf32" if "tf32" in PEAKS[gpu] else "fp32"


def derive(model: str, gpu: str) -> Throughput | None:
    """A throughput for ``model`` on ``gpu`` from the GPU's peak and a stated utilization,
    where no published figure exists: ``peak x utilization / (6 x MACs per sample)``.

    The peak is the datasheet's dense figure (:data:`PEAKS`) for the precision the
    network trains in; the utilization is :data:`TRANSFORMER_UTILIZATION` for
    transformers, and for convnets that of NVIDIA's published ResNet-50 figure at the
    same precision (A100 for TF32, V100 for FP32) on its own GPU's peak. ``None`` for a
    GPU without a peak here (K80, P100: give the compute time).
    """
    model, gpu = canonical(model), _gpu_name(gpu)
    if gpu not in PEAKS or model not in KINDS:
        return None
    precision = _precision(model, gpu)
    peak = PEAKS[gpu][precision]
    if KINDS[model] == "transformer":
        utilization = TRANSFORMER_UTILIZATION
        why = ("Narayanan et al. 2021, Megatron-LM, table 1: GPT 1.7B on A100 at 44% of "
               "peak counting recomputation, x 3/4")
        batch = _DERIVED_BATCH.get(model) or next(
            entries[0].batch for (name, _), entries in THROUGHPUTS.items() if name == model)
    else:
        ref_model, ref_gpu = _CONVNET_REFERENCE[precision]
        ref = THROUGHPUTS[ref_model, ref_gpu][0]
        utilization = ref.samples_per_s * _train_flops(ref_model) / PEAKS[ref_gpu][precision]
        why = (f"that of the published {ref_model} {ref_gpu} entry, {ref.samples_per_s:g} "
               "images/s" + ("" if ref_gpu == gpu else
                             "; convnets are bound by memory more than by FLOPs, so this "
                             f"may flatter the {gpu}"))
        batch = ref.batch
    flops = _train_flops(model)
    return Throughput(
        peak * utilization / flops, batch, precision,
        f"derived, not measured: {peak / 1e12:g} TFLOP/s ({gpu} dense {precision.upper()} "
        f"peak; {PEAK_SOURCES[gpu]}) x {utilization:.1%} utilization ({why}) / "
        f"{flops / 1e9:.4g} GFLOP per {get_model(model).sample} (6 x MACs)")


def compute_time(model: str, gpu: str, batch: int | None = None) -> tuple[float, int, Throughput]:
    """Seconds of compute per iteration of one ``gpu`` at ``batch``, from :data:`THROUGHPUTS`,
    or where it has no figure for the pair, derived from the GPU's peak (:func:`derive`).

    Returns ``(seconds, batch, entry)``; ``batch=None`` takes the entry's own batch.

    Raises
    ------
    EstimateError
        For an unknown model or GPU, or a pair with no published figure and no peak to
        derive one from.
    """
    key = (canonical(model), _gpu_name(gpu))
    entries = THROUGHPUTS.get(key)
    if not entries:
        derived = derive(*key)
        if derived is not None:
            entries = (derived,)
    if not entries:
        have = sorted(g for m, g in THROUGHPUTS if m == key[0])
        raise EstimateError(
            f"no published throughput for {key[0]} on {key[1]} in the table (it has "
            f"{', '.join(have) or 'none'}) and no peak to derive one from (it has "
            f"{', '.join(PEAKS)}); give --compute-time SECONDS per iteration")
    if batch is None:
        entry = entries[0]
        return entry.batch / entry.samples_per_s, entry.batch, entry
    entry = min(entries, key=lambda e: (abs(math.log(batch / e.batch)), -e.batch))
    return batch / entry.samples_per_s, batch, entry


def _gpu_name(gpu: str) -> str:
    name = gpu.strip().upper().removeprefix("TESLA ").removeprefix("NVIDIA ")
    if name not in GPUS:
        raise EstimateError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    return name


def gpu_of(cluster: Cluster) -> str | None:
    """The GPU model the cluster's YAML file names (in its comments), if it names one.

    Cluster files have no GPU key; the shipped ones say in their comments what they
    model (``8 Tesla P100``). One model named, once or more: that one. None or several:
    ``None`` (pass ``gpu=``).
    """
    if not cluster.source:
        return None
    try:
        text = Path(cluster.source).read_text(encoding="utf-8")
    except OSError:
        return None
    found = {m.upper() for m in re.findall(r"\b(K80|P100|V100|A100|H100|H200|B200)\b", text,
                                           re.I)}
    return found.pop() if len(found) == 1 else None
