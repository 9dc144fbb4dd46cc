"""Gradient compression for the wire, with Horovod's contract.

``compress(t) -> (t, ctx)`` and ``decompress(t, ctx) -> t``, as in
``horovod/torch/compression.py``. :attr:`Compression.fp16` halves the bytes an
allreduce moves (ChainerMN's ``allreduce_grad_dtype='float16'``); the caller
scales before compressing so the fp16 sum cannot overflow (see
:class:`topoplan.torch.DistributedOptimizer`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface: compress a tensor for the wire and restore it afterwards."""

    #: dtype on the wire for floating tensors; None keeps the tensor's own dtype.
    wire_dtype: torch.dtype | None = None

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return ``(tensor_for_the_wire, ctx)``; ``ctx`` is what decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Undo :meth:`compress` given its ``ctx``."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Cast floating tensors to float16 for the wire and back to their dtype after.

    Non-floating tensors pass through unchanged. Values beyond float16's range
    (65504) become inf: scale first (divide by the world size, as the optimizer
    and the fp16 DDP hook do) so that the reduced sum stays in range.
    """

    wire_dtype = torch.float16

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        dtype = tensor.dtype
        if tensor.is_floating_point() and dtype != torch.float16:
            return tensor.to(torch.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class Compression:
    """The compressors, by name: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def by_name(name: str) -> type[Compressor]:
        """``"none"`` or ``"fp16"`` to the compressor class (for command lines)."""
        try:
            return {"none": NoneCompressor, "fp16": FP16Compressor}[name]
        except KeyError:
            raise ValueError(f"unknown compression {name!r}; expected 'none' or 'fp16'") from None
