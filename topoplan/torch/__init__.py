"""PyTorch integration: DDP comm hooks and a Horovod-style DistributedOptimizer.

``import topoplan`` does not import torch; ``import topoplan.torch`` does.

- :func:`allreduce_hook` / :func:`fp16_compress_hook` with :class:`TopoplanHookState`:
  ``ddp.register_comm_hook(state, hook)``, PyTorch's exact hook contract;
  :func:`register_hook` (alias ``register``) does both.
- :class:`DistributedOptimizer`: tensor fusion, fp16 allreduce, double buffering.
- :class:`Compression`: ``none`` / ``fp16`` with ``compress(t) -> (t, ctx)``.
- :class:`PlannedAllreduce`: a topoplan schedule per byte size over any transport.
- :class:`PlannedCollectives`: planned ``reduce_scatter_tensor`` / ``all_gather_into_tensor``
  with torch's signatures on a process group (FSDP, ZeRO); :func:`register_fsdp` plugs
  them into FSDP2's ``fully_shard``.
- The ``topoplan`` torch.distributed backend (:mod:`~topoplan.torch.backend`), registered
  on import: ``dist.init_process_group("topoplan")`` plans DDP's, FSDP2's and plain
  ``dist`` collectives with no other change; :class:`TopoplanOptions` are its options.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError("topoplan.torch needs PyTorch: pip install 'topoplan[torch]'") from None

from .backend import TopoplanOptions, TopoplanProcessGroup, TopoplanWork, register_backend
from .compression import Compression, Compressor, FP16Compressor, NoneCompressor
from .hooks import (TopoplanHookState, allreduce_hook, fp16_compress_hook, register,
                    register_hook)
from .optimizer import DistributedOptimizer, broadcast_parameters
from .planned import (AllreduceStats, PlannedAllreduce, mpi_native_allreduce,
                      torch_native_allreduce)
from .sharded import (FSDPAllGather, FSDPReduceScatter, PlannedCollectives, PlannedWork,
                      register_fsdp)

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor", "TopoplanHookState",
           "allreduce_hook", "fp16_compress_hook", "register_hook", "register",
           "DistributedOptimizer", "broadcast_parameters", "AllreduceStats", "PlannedAllreduce",
           "mpi_native_allreduce", "torch_native_allreduce", "PlannedCollectives", "PlannedWork",
           "FSDPAllGather", "FSDPReduceScatter", "register_fsdp", "TopoplanOptions",
           "TopoplanProcessGroup", "TopoplanWork", "register_backend"]

register_backend()
