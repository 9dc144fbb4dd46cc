"""What-if estimate of a data-parallel training iteration on a cluster.

:func:`estimate` prices one iteration: the compute of one GPU (given, or from the cited
table :data:`THROUGHPUTS`), and the allreduce of the gradients, fused into buckets, each
bucket planned (:func:`topoplan.plan`) and simulated (:func:`topoplan.simulate`) on the
cluster under the runtime's cost profile. docs/ESTIMATE.md states the model; in short:

- **after compute** (the default): every bucket's allreduce runs after backward, one
  after another: ``iteration = compute + sum(comm)``.
- **overlap** (Horovod, DDP): backward produces gradients in reverse layer order; a bucket
  starts when its last gradient is ready and the previous bucket's allreduce is done (one
  communication stream); the step ends when compute and the last allreduce are done.
- **double buffering** (ChainerMN): step ``i``'s allreduce runs during step ``i + 1``'s
  whole compute (gradients one step stale): ``iteration = max(compute, sum(comm))``.

``fp16`` puts 2 bytes per parameter on the wire instead of 4; compute is unchanged.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EstimateError
from .models import MODELS, Model, canonical, get_model
from ..units import as_bytes

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..analysis.cost import CostProfile

__all__ = ["Throughput", "THROUGHPUTS", "GPUS", "Bucket", "Estimate", "estimate",
           "compute_time", "gpu_of", "fuse", "one_box", "JSON_KEYS"]

#: The GPUs the estimator knows: a published throughput (:data:`THROUGHPUTS`) or a peak
#: (:data:`PEAKS`) to derive one from.
GPUS = ("K80", "P100", "V100", "A100", "H100", "H200", "B200")

#: The headline numbers of :meth:`Estimate.to_dict` (and :meth:`Estimate.to_json`), its
#: first keys, in order (``topoplan estimate --json``).
JSON_KEYS = ("iteration_s", "compute_s", "comm_s", "exposed_comm_s", "samples_per_s",
             "efficiency")

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


def fuse(model: Model, threshold: int, bytes_per_param: int) -> list[tuple[int, int, int]]:
    """Gradient buckets in the order backward fills them: ``(bytes, tensors, first)``.

    Tensors are taken in reverse layer order and packed into buckets of at most
    ``threshold`` bytes (a larger tensor gets a bucket of its own), as the hooks of
    :class:`topoplan.torch.DistributedOptimizer` and Horovod's tensor fusion do;
    ``threshold == 0``: one bucket per tensor. ``first`` is the forward index of the
    bucket's earliest layer, whose gradient completes it.
    """
    buckets: list[tuple[int, int, int]] = []
    size = count = 0
    first = len(model.tensors)
    for i in range(len(model.tensors) - 1, -1, -1):
        nbytes = model.tensors[i].numel * bytes_per_param
        if nbytes == 0:
            continue
        if count and size + nbytes > threshold:
            buckets.append((size, count, first))
            size = count = 0
        size, count, first = size + nbytes, count + 1, i
    if count:
        buckets.append((size, count, first))
    return buckets


def _ready_times(model: Model, forward_s: float, backward_s: float) -> list[float]:
    """When each tensor's gradient is ready: backward walks the layers in reverse, each
    taking time in proportion to its multiply-accumulates (to its size if none has any)."""
    weights = [t.macs for t in model.tensors]
    if not any(weights):
        weights = [t.numel for t in model.tensors]
    total = float(sum(weights)) or 1.0
    ready = [0.0] * len(weights)
    done = 0.0
    for i in range(len(weights) - 1, -1, -1):
        done += weights[i]
        ready[i] = forward_s + backward_s * done / total
    return ready


@dataclass(frozen=True, slots=True)
class Bucket:
    """One fused allreduce: ``nbytes`` on the wire, ready, started and done (seconds from
    the start of the iteration), and the plan it ran (``algorithm``)."""

    nbytes: int
    tensors: int
    ready_s: float
    start_s: float
    end_s: float
    algorithm: str


@dataclass(frozen=True)
class Estimate:
    """One iteration of data-parallel training on a cluster, estimated.

    ``efficiency`` is the throughput over ``nranks`` times one GPU's (compute alone);
    ``efficiency_box`` over ``nranks / box GPUs`` times one box's, estimated the same way
    on the cluster's first box alone.
    """

    cluster: str
    nranks: int
    model: str
    params: int
    batch_per_gpu: int
    mode: str
    bytes_per_param: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    iteration_s: float
    samples_per_s: float
    efficiency: float
    efficiency_box: float
    box_gpus: int
    buckets: tuple[Bucket, ...] = ()
    compute_source: str = ""
    gpu: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data: the six headline numbers (:data:`JSON_KEYS`), then
        the efficiency against one box, what was estimated, and the buckets (each fused
        allreduce: bytes, tensors, ready, start and end in seconds, its plan)."""
        out: dict[str, Any] = {key: float(getattr(self, key)) for key in JSON_KEYS}
        out.update(efficiency_box=float(self.efficiency_box), box_gpus=self.box_gpus,
                   cluster=self.cluster, nranks=self.nranks, model=self.model,
                   params=self.params, batch_per_gpu=self.batch_per_gpu, mode=self.mode,
                   bytes_per_param=self.bytes_per_param, gpu=self.gpu,
                   compute_source=self.compute_source,
                   buckets=[{"bytes": b.nbytes, "tensors": b.tensors, "ready_s": b.ready_s,
                             "start_s": b.start_s, "end_s": b.end_s,
                             "algorithm": b.algorithm} for b in self.buckets])
        return out

    def to_json(self, indent: int | None = None) -> str:
        """:meth:`to_dict` as JSON text (``topoplan estimate --json``), as
        :meth:`topoplan.ir.schedule.Schedule.to_json` returns text.

        It used to return the dict; for a deprecation period the text still answers the
        dict's lookups (``["iteration_s"]``, ``get``, ``keys``, ``items``, ``values``),
        each with a DeprecationWarning naming :meth:`to_dict`.
        """
        return _JsonText(self.to_dict(), indent)


class _JsonText(str):
    """JSON text that also answers, with a DeprecationWarning, the dict lookups callers of
    :meth:`Estimate.to_json` made when it returned the dict. Everything else (iterating,
    ``len``, ``in``, ``json.dumps``) sees the text it is."""

    _data: dict[str, Any]

    def __new__(cls, data: dict[str, Any], indent: int | None = None) -> _JsonText:
        text = super().__new__(cls, json.dumps(data, indent=indent))
        text._data = data
        return text

    def _dict(self, use: str) -> dict[str, Any]:
        warnings.warn(f"Estimate.to_json() returns JSON text; {use} on it is deprecated: use "
                      "Estimate.to_dict() for the dict", DeprecationWarning, stacklevel=3)
        return self._data

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return self._dict(f"[{key!r}]")[key]
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self._dict(".get()").get(key, default)

    def keys(self) -> Any:
        return self._dict(".keys()").keys()

    def items(self) -> Any:
        return self._dict(".items()").items()

    def values(self) -> Any:
        return self._dict(".values()").values()


def one_box(cluster: Cluster) -> Cluster:
    """The cluster's first box alone (no network): the baseline of ``efficiency_box``."""
    from ..cluster import Cluster as ClusterClass
    box = cluster.boxes[0]
    return ClusterClass(name=f"{cluster.name} (one box)",
                        boxes=(replace(box, first_rank=0, nics=()),))


def estimate(cluster: Cluster, *, model: Model, compute_s: float | None = None,
             batch_per_gpu: int | None = None, gpu: str | None = None, fp16: bool = False,
             overlap: bool = False, double_buffering: bool = False,
             fusion: int | str = 64 << 20, backward_fraction: float = 2 / 3,
             algorithm: str = "auto", profile: CostProfile | str | None = None,
             _cache: dict | None = None) -> Estimate:
    """Estimate one training iteration of ``model`` on every GPU of ``cluster``.

    Parameters
    ----------
    cluster : Cluster
    model : Model
        The network's parameter tensors (:func:`topoplan.estimate.models.get_model`, or
        :func:`~topoplan.estimate.models.uniform_model` for a bare parameter count).
    compute_s : float, optional
        Forward + backward + update of one GPU, seconds per iteration at
        ``batch_per_gpu``. Default: from :data:`THROUGHPUTS` for ``gpu``.
    batch_per_gpu : int, optional
        Samples per GPU per iteration. Default: the table entry's batch, else 1 (then
        ``samples_per_s`` counts iterations).
    gpu : str, optional
        One of :data:`GPUS`; default :func:`gpu_of` (the cluster file's).
    fp16 : bool
        Gradients on the wire in 2 bytes per parameter (compute unchanged).
    overlap : bool
        Start each bucket's allreduce during backward, as soon as it is full.
    double_buffering : bool
        ChainerMN's: step i's allreduce overlaps step i+1's whole compute.
    fusion : int or str
        Bucket size in bytes (Horovod's 64 MiB), or a size such as ``"64MiB"``; 0: one
        allreduce per tensor.
    backward_fraction : float
        Share of ``compute_s`` that is backward (default 2/3: backward costs about
        twice the forward).
    algorithm : str
        Planner for each bucket (:func:`topoplan.plan`); default ``auto``.
    profile : CostProfile or str, optional
        The runtime's costs for planning and simulating (default ``nccl``).

    Returns
    -------
    Estimate

    Raises
    ------
    EstimateError
        For a non-positive time, batch or fusion size, a fraction outside (0, 1], or no
        compute time (no ``compute_s`` and no table entry for the model and GPU).
    PlannerError, InfeasiblePlanError, ProfileError
        From planning a bucket.

    Notes
    -----
    One plan and one simulation per distinct bucket size (cached). ResNet-50 in 64 MiB
    buckets on 32 GPUs: two sizes, a few seconds with ``auto``.
    """
    from ..analysis.cost import get_profile

    costs = get_profile(profile)
    if not 0 < backward_fraction <= 1:
        raise EstimateError(f"backward fraction must be in (0, 1], got {backward_fraction}")
    try:
        fusion = int(as_bytes(fusion))
    except ValueError as exc:
        raise EstimateError(f"fusion threshold: {exc}") from None
    if fusion < 0:
        raise EstimateError(f"fusion threshold must be >= 0 bytes, got {fusion}")
    if batch_per_gpu is not None and batch_per_gpu < 1:
        raise EstimateError(f"batch per GPU must be >= 1, got {batch_per_gpu}")
    source = "given"
    gpu_name = _gpu_name(gpu) if gpu else gpu_of(cluster)
    if compute_s is None:
        if gpu_name is None:
            raise EstimateError(
                f"no compute time: cluster {cluster.name!r} names no GPU model; give "
                f"--gpu ({', '.join(GPUS)}) or --compute-time SECONDS")
        if model.name not in MODELS:
            raise EstimateError(f"no published throughput for {model.name}: give "
                                "--compute-time SECONDS per iteration")
        compute_s, batch_per_gpu, entry = compute_time(model.name, gpu_name, batch_per_gpu)
        source = f"{entry.samples_per_s:g} {model.sample}s/s at batch {entry.batch} " \
                 f"({entry.precision}): {entry.source}"
    if not (isinstance(compute_s, (int, float)) and math.isfinite(compute_s) and compute_s > 0):
        raise EstimateError(f"compute time must be > 0 seconds, got {compute_s!r}")
    batch = batch_per_gpu or 1
    cache: dict[Any, tuple[float, str]] = {} if _cache is None else _cache
    kwargs: dict[str, Any] = dict(model=model, compute_s=float(compute_s), batch=batch,
                                  fp16=fp16, overlap=overlap, double_buffering=double_buffering,
                                  fusion=fusion, backward_fraction=backward_fraction,
                                  algorithm=algorithm, costs=costs, cache=cache)
    whole = _iteration(cluster, **kwargs)
    box = cluster.boxes[0]
    if len(cluster.boxes) == 1:
        box_rate = whole.samples_per_s
    else:
        box_rate = _iteration(one_box(cluster), **kwargs).samples_per_s
    one_gpu = batch / float(compute_s)
    return replace(
        whole, efficiency=whole.samples_per_s / (cluster.nranks * one_gpu),
        efficiency_box=whole.samples_per_s / (cluster.nranks / box.gpus * box_rate),
        box_gpus=box.gpus, compute_source=source, gpu=gpu_name)


def _allreduce_s(cluster: Cluster, nbytes: int, dtype_size: int, algorithm: str,
                 costs: CostProfile, cache: dict) -> tuple[float, str]:
    """Planned and simulated time of one allreduce of ``nbytes`` (cached per cluster)."""
    from ..ir.fingerprint import cluster_fingerprint
    from ..planners import plan
    from ..analysis.sim import simulate

    key = (cluster_fingerprint(cluster), nbytes, dtype_size, algorithm, costs)
    if key not in cache:
        schedule = plan(cluster, algorithm, size=nbytes, profile=costs)
        report = simulate(cluster, schedule, nbytes, profile=costs, dtype_size=dtype_size)
        chosen = str(schedule.meta.get("chosen", schedule.algorithm))
        cache[key] = (report.time_s, chosen)
    return cache[key]


def _iteration(cluster: Cluster, *, model: Model, compute_s: float, batch: int, fp16: bool,
               overlap: bool, double_buffering: bool, fusion: int, backward_fraction: float,
               algorithm: str, costs: CostProfile, cache: dict) -> Estimate:
    bytes_per_param = 2 if fp16 else 4
    backward = compute_s * backward_fraction
    ready = _ready_times(model, compute_s - backward, backward)
    buckets: list[Bucket] = []
    free = 0.0 if overlap and not double_buffering else compute_s
    for nbytes, count, first in fuse(model, fusion, bytes_per_param):
        if cluster.nranks > 1:
            seconds, chosen = _allreduce_s(cluster, nbytes, bytes_per_param, algorithm,
                                           costs, cache)
        else:
            seconds, chosen = 0.0, "-"
        start = max(free, ready[first]) if overlap and not double_buffering else free
        buckets.append(Bucket(nbytes, count, ready[first], start, start + seconds, chosen))
        free = start + seconds
    comm = sum(b.end_s - b.start_s for b in buckets)
    if double_buffering:
        mode = "double buffering"
        iteration = max(compute_s, comm)
    else:
        mode = "overlap" if overlap else "after compute"
        iteration = max(compute_s, free)
    samples = cluster.nranks * batch / iteration
    return Estimate(cluster=cluster.name, nranks=cluster.nranks, model=model.name,
                    params=model.params, batch_per_gpu=batch, mode=mode,
                    bytes_per_param=bytes_per_param, compute_s=compute_s, comm_s=comm,
                    exposed_comm_s=iteration - compute_s, iteration_s=iteration,
                    samples_per_s=samples, efficiency=math.nan, efficiency_box=math.nan,
                    box_gpus=cluster.boxes[0].gpus, buckets=tuple(buckets))
