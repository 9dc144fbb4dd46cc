"""topoplan: topology-aware allreduce planning and execution.

>>> import topoplan
>>> cluster = topoplan.load_cluster("topologies/ddl_two_switch.yaml")
>>> schedule = topoplan.plan(cluster, algorithm="ring", size=256 << 20)
>>> topoplan.verify(schedule)  # doctest: +SKIP

Names load lazily (a module ``__getattr__``): ``import topoplan`` loads the exceptions,
the schedule IR and the light front doors of :func:`verify` and :func:`simulate`, and
nothing else. numpy, scipy, networkx, PyYAML and the optional dependencies (torch,
mpi4py, cupy, matplotlib, highspy) load when a name that needs them is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (ClusterSpecError, InfeasiblePlanError, PlannerError, ProfileError,
                     ScheduleError, SpecError, TopoplanError, TopoplanWarning, TransportError,
                     UnitWarning, XmlFormatError)

# These functions share their module's name: importing the submodule anywhere would
# rebind ``topoplan.verify`` to the module, so they are bound eagerly here. Both modules
# are cheap to import (their engines load on the first call).
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
    "ReduceScatter": "topoplan.executor",
    "AllGather": "topoplan.executor",
    "Handle": "topoplan.executor",
    "AllreduceHandle": "topoplan.executor",
    "CostProfile": "topoplan.cost",
    "get_profile": "topoplan.cost",
    "run_bench": "topoplan.bench",
    "cluster_fingerprint": "topoplan.fingerprint",
    "check_fingerprint": "topoplan.fingerprint",
}
_SUBMODULES = {"bench", "bound", "calibrate", "cluster", "collectives", "cost", "estimate", "executor", "interop",
               "matching", "models", "planners", "schedule", "sim", "testbed", "torch", "transports", "units", "viz"}

__all__ = ["TopoplanError", "SpecError", "ClusterSpecError", "ProfileError", "XmlFormatError",
           "ScheduleError",
           "PlannerError", "InfeasiblePlanError", "TransportError", "TopoplanWarning",
           "UnitWarning", "verify", "simulate",
           "SimReport", *_LAZY]


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
