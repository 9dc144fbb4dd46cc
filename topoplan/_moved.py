"""Old module paths that keep working after a module moved to its layer's package.

:class:`MovedFinder` sits first on ``sys.meta_path``: importing ``topoplan.schedule``
(or ``topoplan.sim.run``, any submodule) warns once (DeprecationWarning, naming the new
path) and yields the module at the new path itself, so classes, private names and
monkeypatching are the same objects through either path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Mapping, Sequence

__all__ = ["MovedFinder"]


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
