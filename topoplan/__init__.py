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
import sys as _sys
from typing import Any

from ._moved import MovedFinder as _MovedFinder

from .errors import (ClusterSpecError, InfeasiblePlanError, PlannerError, ProfileError,
                     ScheduleError, SpecError, TopoplanError, TopoplanWarning, TransportError,
                     UnitWarning, XmlFormatError)

# These functions share their module's name: importing the submodule anywhere would
# rebind ``topoplan.verify`` to the module, so they are bound eagerly here. Both modules
# are cheap to import (their engines load on the first call).
from .analysis.sim import SimReport, simulate  # noqa: E402
from .ir.verify import verify  # noqa: E402

__version__ = "0.1.0"

_LAZY = {
    "load_cluster": "topoplan.cluster",
    "loads_cluster": "topoplan.cluster",
    "Cluster": "topoplan.cluster",
    "Schedule": "topoplan.ir.schedule",
    "load_schedule": "topoplan.ir.schedule",
    "loads_schedule": "topoplan.ir.schedule",
    "lower_bound": "topoplan.analysis.bound",
    "plan": "topoplan.planners",
    "PLANNERS": "topoplan.planners",
    "Allreduce": "topoplan.runtime.executor",
    "ReduceScatter": "topoplan.runtime.executor",
    "AllGather": "topoplan.runtime.executor",
    "Handle": "topoplan.runtime.executor",
    "AllreduceHandle": "topoplan.runtime.executor",
    "CostProfile": "topoplan.analysis.cost",
    "get_profile": "topoplan.analysis.cost",
    "run_bench": "topoplan.runtime.bench",
    "cluster_fingerprint": "topoplan.ir.fingerprint",
    "check_fingerprint": "topoplan.ir.fingerprint",
}
# The packages a reader meets by layer (docs/ARCHITECTURE.md); the names at the left of
# MOVED are the paths of topoplan 0.1's flat modules, still importable (with a warning).
_SUBMODULES = {"analysis", "cluster", "estimate", "interop", "ir", "planners", "runtime", "testbed",
               "torch", "units", "viz"}
MOVED = {
    "topoplan.schedule": "topoplan.ir.schedule",
    "topoplan.collectives": "topoplan.ir.collectives",
    "topoplan.matching": "topoplan.ir.matching",
    "topoplan.fingerprint": "topoplan.ir.fingerprint",
    "topoplan.verify": "topoplan.ir.verify",
    "topoplan.bound": "topoplan.analysis.bound",
    "topoplan.cost": "topoplan.analysis.cost",
    "topoplan.sim": "topoplan.analysis.sim",
    "topoplan.simulate": "topoplan.analysis.sim",
    "topoplan.native": "topoplan.analysis.native",
    "topoplan.models": "topoplan.estimate.models",
    "topoplan.executor": "topoplan.runtime.executor",
    "topoplan.transports": "topoplan.runtime.transports",
    "topoplan.bench": "topoplan.runtime.bench",
    "topoplan.calibrate": "topoplan.runtime.calibrate",
    "topoplan._mpirun": "topoplan.runtime.mpirun",
}
_sys.meta_path.insert(0, _MovedFinder(MOVED))
# ``topoplan.verify`` and ``topoplan.simulate`` are functions: their old module paths are
# bound now, so that importing them never rebinds the attribute to a module.
_sys.modules.setdefault("topoplan.verify", _sys.modules["topoplan.ir.verify"])
_sys.modules.setdefault("topoplan.simulate", _sys.modules["topoplan.analysis.sim"])

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
    if f"topoplan.{name}" in MOVED:
        return importlib.import_module(MOVED[f"topoplan.{name}"])
    raise AttributeError(f"module 'topoplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)
