"""The estimate itself: one training iteration of a model on every GPU of a cluster, its
buckets' allreduces planned and simulated (:func:`estimate`; the model: docs/ESTIMATE.md)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import EstimateError
from ..units import as_bytes
from .buckets import fuse, ready_times
from .compute import GPUS, _gpu_name, compute_time, gpu_of
from .models import MODELS, Model
from .result import Bucket, IterationEstimate

if TYPE_CHECKING:
    from ..analysis.cost import CostProfile
    from ..cluster import Cluster

__all__ = ["estimate", "one_box"]


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
             _cache: dict | None = None) -> IterationEstimate:
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
    IterationEstimate

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
               algorithm: str, costs: CostProfile, cache: dict) -> IterationEstimate:
    bytes_per_param = 2 if fp16 else 4
    backward = compute_s * backward_fraction
    ready = ready_times(model, compute_s - backward, backward)
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
    return IterationEstimate(cluster=cluster.name, nranks=cluster.nranks, model=model.name,
                             params=model.params, batch_per_gpu=batch, mode=mode,
                             bytes_per_param=bytes_per_param, compute_s=compute_s, comm_s=comm,
                             exposed_comm_s=iteration - compute_s, iteration_s=iteration,
                             samples_per_s=samples, efficiency=math.nan,
                             efficiency_box=math.nan, box_gpus=cluster.boxes[0].gpus,
                             buckets=tuple(buckets))
