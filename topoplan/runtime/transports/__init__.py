"""Point-to-point transports the executor replays schedules over.

Each lives in its own module and imports its heavy dependency only when used:

- :class:`MPI` (mpi4py; ``pip install 'topoplan[mpi]'``),
- :class:`Torch` (torch.distributed p2p: gloo on CPU, nccl on GPU),
- :class:`NCCL` (CuPy's NcclCommunicator; CUDA only),
- :class:`Local` (threads in one process, for tests and notebooks).

:func:`connect` builds any of them by name (``connect("mpi")``, ``connect("torch",
init_method=..., rank=..., size=...)``, ...; :mod:`~topoplan.runtime.transports.factory`), and
:mod:`~topoplan.runtime.transports.launch` runs a function on N ranks of this machine, as threads
(:meth:`Local.launch`) or processes (:meth:`Torch.launch`).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Deadline, Message, NoNative, PeerFailure, Transport
from .factory import connect

__all__ = ["Transport", "Message", "PeerFailure", "Deadline", "NoNative", "MPI", "Torch", "NCCL",
           "Local", "connect"]

_LAZY = {"MPI": "mpi", "Torch": "torch", "NCCL": "nccl", "Local": "local"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
