"""topoplan: topology-aware allreduce planning and execution.

>>> import topoplan
>>> cluster = topoplan.load_cluster("topologies/ddl_two_switch.yaml")
>>> schedule = topoplan.plan(cluster, algorithm="ring", size=256 << 20)
>>> topoplan.verify(schedule)  # doctest: +SKIP

Names load lazily (a module ``__getattr__``): ``import topoplan`` loads the exceptions
and nothing else; :func:`verify`, :func:`simulate`, the schedule IR and the rest load when
first used. numpy, scipy, networkx, PyYAML and the optional dependencies (torch,
mpi4py, cupy, matplotlib, highspy) load when a name that needs them is first used.
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
import typing as _typing

from ._compat import MOVED, MovedFinder as _MovedFinder
from .errors import (ClusterSpecError, InfeasiblePlanError, PlannerError, ProfileError,
                     RangeWarning, ScheduleError, SpecError, TopoplanError, TopoplanWarning,
                     TransportError, UnitWarning, XmlFormatError)

__version__ = "0.1.0"

_LAZY = {
    "verify": "topoplan.ir.verify",
    "simulate": "topoplan.analysis.sim",
    "SimReport": "topoplan.analysis.sim",
    "load_cluster": "topoplan.cluster",
    "loads_cluster": "topoplan.cluster",
    "Cluster": "topoplan.cluster",
    "Schedule": "topoplan.ir.schedule",
    "load_schedule": "topoplan.ir.parse",
    "loads_schedule": "topoplan.ir.parse",
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
# The packages a reader meets by layer (docs/ARCHITECTURE.md); the old paths of moved
# modules (MOVED, topoplan/_compat.py) still import, with a warning.
_SUBMODULES = {"analysis", "cluster", "estimate", "interop", "ir", "planners", "runtime", "testbed",
               "torch", "units", "viz"}
_sys.meta_path.insert(0, _MovedFinder(MOVED))

__all__ = ["TopoplanError", "SpecError", "ClusterSpecError", "ProfileError", "XmlFormatError",
           "ScheduleError",
           "PlannerError", "InfeasiblePlanError", "TransportError", "TopoplanWarning",
           "UnitWarning", "RangeWarning", *_LAZY]


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"topoplan.{name}")
    if f"topoplan.{name}" in MOVED:
        return _importlib.import_module(MOVED[f"topoplan.{name}"])
    raise AttributeError(f"module 'topoplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API: ``__all__``, the layers' packages, ``MOVED`` and ``__version__``."""
    return sorted({*__all__, *_SUBMODULES, "MOVED", "__version__"})


class _Package(_types.ModuleType):
    """The package's module type: :func:`verify` and :func:`simulate` share their name
    with an old module path (``topoplan.verify``, ``topoplan.simulate``: MOVED), and
    importing that path would bind the module where the function is; the function stays."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("verify", "simulate") and isinstance(value, _types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
