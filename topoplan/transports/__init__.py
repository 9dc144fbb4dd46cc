"""Point-to-point transports the executor replays schedules over.

Each lives in its own module and imports its heavy dependency only when used:

- :class:`MPI` (mpi4py; ``pip install 'topoplan[mpi]'``),
- :class:`Torch` (torch.distributed p2p: gloo on CPU, nccl on GPU),
- :class:`NCCL` (CuPy's NcclCommunicator; CUDA only),
- :class:`Local` (threads in one process, for tests and notebooks).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Deadline, Message, NoNative, PeerFailure, Transport

__all__ = ["Transport", "Message", "PeerFailure", "Deadline", "NoNative", "MPI", "Torch", "NCCL",
           "Local"]

_LAZY = {"MPI": "mpi", "Torch": "torch", "NCCL": "nccl", "Local": "local"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
