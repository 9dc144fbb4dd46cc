"""Array kinds behind four operations: numpy arrays, torch tensors and cupy arrays.

The executor (:mod:`topoplan.runtime.executor`) never touches a buffer but through the
operations of its kind (:func:`array_ops`): flatten it (refusing a non-contiguous or
read-only one), name its memory (address and device, for the caches), make scratch
like it, and add or copy views in place. The classes are namespaces of static
methods, one per kind; cupy shares numpy's except where memory and devices differ.
"""

from __future__ import annotations

from typing import Any

from ...errors import TopoplanError

__all__ = ["ArrayOps", "array_ops"]


class _NumpyOps:
    kind = "numpy"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.flags.c_contiguous:
            raise TopoplanError("allreduce needs a contiguous buffer; pass np.ascontiguousarray(x) "
                                "and copy the result back")
        if not buf.flags.writeable:
            raise TopoplanError("allreduce works in place, but the numpy buffer is read-only")
        return buf.reshape(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.__array_interface__["data"][0], "cpu")

    @staticmethod
    def fast_key(buf: Any) -> Any:
        # A numpy array's memory moves only through ndarray.resize, which changes its size.
        return buf.size

    @staticmethod
    def dtype(buf: Any) -> str:
        return str(buf.dtype)

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import numpy as np
        return np.empty(n, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def float32(buf: Any) -> Any:
        import numpy as np
        return np.float32

    @staticmethod
    def add(dst: Any, src: Any) -> None:
        dst += src

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst[...] = src


class _TorchOps:
    kind = "torch"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.is_contiguous():
            raise TopoplanError("allreduce needs a contiguous tensor; pass t.contiguous() and "
                                "copy the result back")
        return buf.view(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.data_ptr(), str(buf.device))

    @staticmethod
    def fast_key(buf: Any) -> Any:
        return (buf.data_ptr(), buf.numel())

    @staticmethod
    def dtype(buf: Any) -> str:
        return str(buf.dtype).removeprefix("torch.")

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import torch
        return torch.empty(n, dtype=like.dtype if dtype is None else dtype, device=like.device)

    @staticmethod
    def float32(buf: Any) -> Any:
        import torch
        return torch.float32

    @staticmethod
    def add(dst: Any, src: Any) -> None:
        dst.add_(src)

    @staticmethod
    def copy(dst: Any, src: Any) -> None:
        dst.copy_(src)


class _CupyOps(_NumpyOps):
    kind = "cupy"

    @staticmethod
    def flat(buf: Any) -> Any:
        if not buf.flags.c_contiguous:
            raise TopoplanError("allreduce needs a contiguous buffer; pass cupy.ascontiguousarray(x)"
                                " and copy the result back")
        return buf.reshape(-1)

    @staticmethod
    def address(buf: Any) -> tuple:
        return (buf.data.ptr, f"cuda:{buf.device.id}")

    @staticmethod
    def fast_key(buf: Any) -> Any:
        return (buf.data.ptr, buf.size)

    @staticmethod
    def empty(n: int, like: Any, dtype: Any = None) -> Any:
        import cupy
        with like.device:
            return cupy.empty(n, dtype=like.dtype if dtype is None else dtype)

    @staticmethod
    def float32(buf: Any) -> Any:
        import cupy
        return cupy.float32


#: The operations of one array kind (the classes above are used as namespaces).
ArrayOps = type[_NumpyOps] | type[_TorchOps]


def array_ops(buf: Any) -> ArrayOps:
    """The operations for ``buf``'s array kind (numpy, torch or cupy).

    Raises
    ------
    TopoplanError
        For anything else, naming the type.
    """
    module = type(buf).__module__.split(".")[0]
    if module == "numpy" and hasattr(buf, "__array_interface__"):
        return _NumpyOps
    if module == "torch" and hasattr(buf, "data_ptr"):
        return _TorchOps
    if module == "cupy":
        return _CupyOps
    raise TopoplanError(f"allreduce buffers are numpy arrays, torch tensors or cupy arrays, got "
                        f"{type(buf).__module__}.{type(buf).__name__}")
