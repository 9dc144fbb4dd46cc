"""The project's own scripts (``scripts/*.py``) imported as modules, for the tests that
call their functions."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support.clusters import ROOT


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``topoplan_script_<name>`` (registered in
    ``sys.modules``, so that its dataclasses and pickles resolve)."""
    spec = importlib.util.spec_from_file_location(f"topoplan_script_{name}",
                                                  ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
