"""Cost profiles: what a runtime pays besides moving bytes, for the simulator and planners.

A link model alone says how long bytes take. A runtime also pays for every message it
sends, every op it posts and every step it runs, and for adding what it receives. A
:class:`CostProfile` holds those costs; :func:`topoplan.simulate` charges them and every
planner plans against them, so a plan is as good as its time on the runtime that runs it.

The model (docs/COST_MODEL.md has the full statement and a worked ring):

- a rank runs its steps in order; a step with ops pays ``step_overhead`` before it posts
  anything (the executor's bookkeeping, a kernel launch), then posts its ops one after
  another, receives first (the executor's order), ``op_overhead`` each;
- a message flows once its send and its receive are both posted, after ``alpha`` of its
  link class (``box``: both ranks in one box; ``network``: different boxes) plus the
  latency of its path; links are then shared max-min fairly;
- a step ends when its last op is posted and all its messages are done, then adds what
  its reducing receives brought, one after another, at ``reduce_bandwidth``;
- a call pays ``call_overhead`` once (launch, entering the library).

Messages of zero bytes are not sent (the executor skips them): they cost nothing.

Shipped profiles (``topoplan/analysis/cost/profiles/*.yaml``, each citing its sources):
``ideal`` (links only, the model before profiles), ``nccl`` (NCCL point-to-point, from
NCCL's own tuning tables and published measurements; the default of :func:`topoplan.plan`,
:func:`topoplan.simulate` and the CLI), ``mpi`` and ``gloo`` (this project's executor over
Open MPI and torch.distributed/gloo, measured by ``topoplan calibrate``).

- :mod:`~topoplan.analysis.cost.profile`: :class:`CostProfile` and :class:`NativeCost`,
  checked when made, and their YAML form;
- :mod:`~topoplan.analysis.cost.read`: :func:`get_profile`, :func:`load_profile`,
  :func:`loads_profile`, the shipped profiles (``profiles/*.yaml``).
"""

from __future__ import annotations

from .profile import (DEFAULT_PROFILE, IDEAL, NATIVE_KINDS, NATIVE_MODELS, NVLINK_MODELS,
                      CostProfile, NativeCost, native_bus_factor)
from .read import get_profile, load_profile, loads_profile, profile_names

__all__ = ["CostProfile", "NativeCost", "load_profile", "loads_profile", "get_profile",
           "profile_names", "DEFAULT_PROFILE", "IDEAL", "NATIVE_KINDS", "NATIVE_MODELS",
           "NVLINK_MODELS", "native_bus_factor"]
