"""The MSCCL XML algorithm format: a model, its parser and writer, the executor's limits
and a symbolic checker.

MSCCL algorithms are XML files run by the MSCCL executor (Azure/msccl-executor-nccl, and
RCCL's copy of it). Each module holds one concept:

- :mod:`.model`: the frozen dataclasses (:class:`Algo`, :class:`Gpu`,
  :class:`ThreadBlock`, :class:`Step`) and the format's vocabulary (:data:`STEP_TYPES`,
  :data:`PROTOCOLS`, :data:`COLLECTIVES`);
- :mod:`.parse`: :func:`load_msccl` (a file) and :func:`loads_msccl` (text), refusing
  what the executor's parser refuses, with file, line and element;
- :mod:`.write`: :func:`to_xml`, in the form the executor's parser reads;
- :mod:`.limits`: the executor's compile-time limits (:class:`Limits`) and
  :func:`limit_violations`;
- :mod:`.verify`: :func:`verify_msccl`, which checks symbolically, without a GPU, that the
  steps compute their collective (an allreduce, a reduce-scatter or an allgather);
- :mod:`.export`: :func:`export_msccl`, a topoplan schedule as an MSCCL algorithm
  (``topoplan export --format msccl``);
- :mod:`.import_`: :func:`import_msccl`, an MSCCL algorithm as a topoplan schedule
  (``topoplan import msccl``; the underscore because ``import`` is a keyword).

Every name is importable from this package, as it was from the single module it grew
out of; ``topoplan.interop.msccl_export`` and ``topoplan.interop.msccl_import``, the
exporter's and importer's old paths, still work and warn (DeprecationWarning).

The verbs are the project's: ``load_x(path)`` and ``loads_x(text)`` read a file and text,
as :func:`topoplan.load_cluster`, :func:`topoplan.load_schedule` and
:func:`topoplan.analysis.cost.load_profile` do, and ``verify`` checks that an algorithm computes
its collective, as :func:`topoplan.verify` does for a schedule. The old names
``read_msccl``, ``parse_msccl`` and ``check_msccl`` still work and warn
(DeprecationWarning naming the new one).
"""

from __future__ import annotations

from ..._compat import renamed
from .export import ExportResult, export_msccl
from .import_ import import_msccl
from .limits import MAX_NODES, Limits, limit_violations
from .model import (BUFFERS, COLLECTIVES, FINGERPRINT_ATTR, PROTOCOLS, SEGMENTS_ATTR,
                    STEP_TYPES, Algo, Gpu, Step, ThreadBlock)
from .parse import load_msccl, loads_msccl
from .verify import CHECKED, DEFAULT_CAPACITY, CheckReport, verify_msccl
from .write import to_xml

__all__ = [
    "Step", "ThreadBlock", "Gpu", "Algo", "Limits", "CheckReport",
    "load_msccl", "loads_msccl", "to_xml", "limit_violations", "verify_msccl",
    "STEP_TYPES", "PROTOCOLS", "COLLECTIVES", "CHECKED", "FINGERPRINT_ATTR",
    "SEGMENTS_ATTR",
    "export_msccl", "ExportResult", "import_msccl",
    "read_msccl", "parse_msccl", "check_msccl",  # deprecated
]

read_msccl = renamed(load_msccl, "read_msccl", "topoplan.interop.msccl.load_msccl")
parse_msccl = renamed(loads_msccl, "parse_msccl", "topoplan.interop.msccl.loads_msccl")
check_msccl = renamed(verify_msccl, "check_msccl", "topoplan.interop.msccl.verify_msccl")
