"""Old names that keep working: each use warns (DeprecationWarning) and names the new one."""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["renamed", "moved_module"]


def renamed(new: F, old: str, new_name: str) -> F:
    """``new`` under its old name ``old``: every call warns, naming ``new_name``.

    Parameters
    ----------
    new
        The function that does the work now.
    old
        Its old name, as a caller wrote it (``"read_msccl"``).
    new_name
        Where it is now, as the warning says it (``"topoplan.interop.msccl.load_msccl"``).
    """
    @functools.wraps(new)
    def alias(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{old} is deprecated; use {new_name}", DeprecationWarning, stacklevel=2)
        return new(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated: use :func:`{new_name}` (same arguments)."
    return alias  # type: ignore[return-value]


def moved_module(old: str, new: str) -> ModuleType:
    """Make module ``old`` the module ``new``, warning that it moved.

    Called at the top of the module left at the old path: that module then *is* the new
    one in ``sys.modules``, so every name, private names and monkeypatching included,
    works through either path.
    """
    warnings.warn(f"{old} is deprecated; import {new}", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module
