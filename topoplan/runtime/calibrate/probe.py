"""What a calibration asks of the host and the transport: the library's version, the
small-message limit, the cores the ranks may run on, and the load."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["transport_info", "small_limit", "host_cores", "load_average"]


def transport_info(transport: Any) -> str:
    """The transport and its library, in words (``"mpi (Open MPI v5.0.5)"``)."""
    name = getattr(transport, "name", type(transport).__name__)
    try:
        if name == "mpi":
            from mpi4py import MPI as mpi
            return f"mpi ({mpi.Get_library_version().splitlines()[0].split(',')[0].strip()})"
        if name.startswith("torch"):
            import torch
            return f"{name} (torch {torch.__version__})"
        if name == "nccl":
            from cupy.cuda import nccl
            v = nccl.get_version()
            return f"nccl (NCCL {v // 10000}.{v // 100 % 100}.{v % 100}, CuPy)"
    except Exception:  # noqa: BLE001 - a version string is a nicety
        pass
    return name


def small_limit(transport: Any) -> int | None:
    """The transport's small-message limit in bytes: Open MPI's shared-memory eager limit
    (``btl_sm_eager_limit``, from ``ompi_info``; 4096 when it cannot be read) for MPI;
    None for the others (gloo sends every message the same way)."""
    if getattr(transport, "name", "") != "mpi":
        return None
    import shutil
    import subprocess
    import sys as _sys
    from pathlib import Path
    tool = Path(_sys.executable).with_name("ompi_info")
    found = str(tool) if tool.exists() else shutil.which("ompi_info")
    if found:
        try:
            out = subprocess.run([found, "--param", "btl", "sm", "--level", "9", "--parsable"],
                                 capture_output=True, text=True, timeout=30).stdout
            for line in out.splitlines():
                if line.startswith("mca:btl:sm:param:btl_sm_eager_limit:value:"):
                    return int(line.rsplit(":", 1)[1])
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return 4096


def host_cores(transport: Any) -> int | None:
    """The cores this process may run on, for a transport of processes on one host
    (MPI, torch.distributed); None for threads of one process (:class:`Local`), whose
    waits are not work and whose work shares one interpreter."""
    if getattr(transport, "name", "") == "local":
        return None
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")
