"""topoplan: topology-aware allreduce planning and execution.

>>> import topoplan
>>> cluster = topoplan.load_cluster("topologies/ddl_two_switch.yaml")
>>> schedule = topoplan.plan(cluster, algorithm="ring", size=256 << 20)
>>> topoplan.verify(schedule)  # doctest: +SKIP

Names load lazily so ``import topoplan`` stays cheap and optional dependencies
(torch, mpi4py, cupy, matplotlib) are touched only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (ClusterSpecError, InfeasiblePlanError, ScheduleError, TopoplanError,
                     TransportError)

# These functions share their module's name: importing the submodule anywhere would
# rebind ``topoplan.verify`` to the module, so they are bound eagerly here.
from .simulate import SimReport, simulate  # noqa: E402
from .verify import verify  # noqa: E402

__version__ = "0.1.0"

_LAZY = {
    "load_cluster": "topoplan.cluster",
    "loads_cluster": "topoplan.cluster",
    "Cluster": "topoplan.cluster",
    "Schedule": "topoplan.schedule",
    "load_schedule": "topoplan.schedule",
    "loads_schedule": "topoplan.schedule",
    "lower_bound": "topoplan.bound",
    "plan": "topoplan.planners",
    "PLANNERS": "topoplan.planners",
    "Allreduce": "topoplan.executor",
    "cluster_fingerprint": "topoplan.fingerprint",
    "check_fingerprint": "topoplan.fingerprint",
}
_SUBMODULES = {"transports", "planners", "viz", "torch", "testbed", "units"}

__all__ = ["TopoplanError", "ClusterSpecError", "ScheduleError", "InfeasiblePlanError",
           "TransportError", "verify", "simulate", "SimReport", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"topoplan.{name}")
    raise AttributeError(f"module 'topoplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
