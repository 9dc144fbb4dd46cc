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

- :mod:`~topoplan.estimate.iteration`: :func:`estimate`, the iteration's model;
- :mod:`~topoplan.estimate.compute`: one GPU's compute time (:data:`THROUGHPUTS`, :func:`derive`);
- :mod:`~topoplan.estimate.buckets`: the gradient buckets (:func:`fuse`, the trainer's own
  rule: :func:`topoplan.runtime.fusion.fusion_buckets`) and when each gradient is ready;
- :mod:`~topoplan.estimate.result`: :class:`IterationEstimate` and :class:`Bucket`;
- :mod:`~topoplan.estimate.models`: the networks' parameter tensors.
"""

from __future__ import annotations

from .._compat import moved_names
# Every name the package had when it was one module (the tables and the models too).
from .buckets import fuse
from .compute import (GPUS, KINDS, PEAK_SOURCES, PEAKS, THROUGHPUTS, TRANSFORMER_UTILIZATION,
                      Throughput, compute_time, derive, gpu_of)
from .iteration import estimate, one_box
from .models import MODELS, Model, canonical, get_model
from .result import JSON_KEYS, Bucket, IterationEstimate

__all__ = ["Throughput", "THROUGHPUTS", "GPUS", "Bucket", "IterationEstimate", "estimate",
           "compute_time", "gpu_of", "fuse", "one_box", "JSON_KEYS"]

#: The class ``Estimate`` was renamed: it clashed with the function :func:`estimate` but
#: for case.
__getattr__ = moved_names(__name__, {"Estimate": "topoplan.estimate.result:IterationEstimate"})
