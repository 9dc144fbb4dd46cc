"""Old paths and names that keep working, each with a DeprecationWarning naming the new one.

The one place backward compatibility lives:

- **modules that moved** (:data:`MOVED`): :class:`MovedFinder` sits first on
  ``sys.meta_path``, so importing an old path (``topoplan.schedule``, or a submodule of
  it such as ``topoplan.sim.run``) warns once and yields the module at the new path
  itself; classes, private names and monkeypatching are the same objects through
  either path;
- **names that left a module** (:func:`moved_names`): the module's ``__getattr__``
  finds them in their new module, warning on every use;
- **functions renamed in place** (:func:`renamed`), or gone from a class to a module
  (:func:`moved_function`): the old name calls the new function, warning on every call.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import warnings
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Mapping, Sequence, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["MOVED", "MovedFinder", "moved_names", "renamed", "moved_function"]

#: Old module path -> the module that is there now. At the top: the flat modules of
#: topoplan 0.1; then the modules that moved when a module became a package or a
#: package's part.
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
    "topoplan.interop.msccl_export": "topoplan.interop.msccl.export",
    "topoplan.interop.msccl_import": "topoplan.interop.msccl.import_",
    "topoplan.ir.lower": "topoplan.ir.passes.lower",
    # the package root's small helpers, now one module
    "topoplan._cache": "topoplan._util",
    "topoplan._files": "topoplan._util",
    "topoplan._gc": "topoplan._util",
    "topoplan._progress": "topoplan._util",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``old[.sub]`` for every ``old -> new`` in ``moved`` and loads ``new[.sub]``."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)
        self._specs: dict[str, ModuleSpec | None] = {}

    def new_name(self, name: str) -> str | None:
        for old in sorted(self.moved, key=len, reverse=True):
            if name == old or name.startswith(old + "."):
                return self.moved[old] + name[len(old):]
        return None

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        new = self.new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        new = self.new_name(spec.name)
        assert new is not None
        warnings.warn(f"{spec.name} moved: import {new}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the old path's spec on the module: give it back its own.
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", None)


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the names that left ``module``.

    Parameters
    ----------
    module
        The module's name (``__name__``).
    moved
        Each old name -> where it is now: a module (``"topoplan.ir.passes"``, the same
        name there) or ``"module:new_name"`` for a name that changed too.

    Every use of an old name warns (DeprecationWarning) naming the new place, and gives
    the object itself, so ``from module import old`` keeps working.
    """
    def __getattr__(name: str) -> Any:
        target = moved.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, new = target.partition(":")
        new = new or name
        warnings.warn(f"{module}.{name} is deprecated; use {home}.{new}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(home), new)

    return __getattr__


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


def moved_function(old: str, new: str) -> Callable[..., Any]:
    """The function ``new`` (``"module:name"``) under its old name ``old``, which a class or
    a module lower down holds: every call warns, naming ``new``, and calls it (found when
    first called, so that the old place need not import the new one): in
    :class:`~topoplan.ir.schedule.Schedule`, ``from_dict = staticmethod(moved_function(
    "topoplan.ir.schedule.Schedule.from_dict", "topoplan.ir.parse:schedule_from_dict"))``.
    """
    home, _, name = new.partition(":")

    def alias(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"{old} is deprecated; use {home}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home), name)(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old.rpartition(".")[2]
    alias.__doc__ = f"Deprecated: use :func:`{home}.{name}` (same arguments)."
    return alias
