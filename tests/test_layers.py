"""The package stands in layers (docs/ARCHITECTURE.md), and the old flat paths still import."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import topoplan
from topoplan import MOVED

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_path_is_the_module_at_the_new_one(old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new          # its own spec, not the alias's


def test_an_old_path_warns_with_the_new_one():
    code = ("import warnings; warnings.simplefilter('error')\n"
            "try:\n    import topoplan.cost\nexcept DeprecationWarning as w:\n    print(w)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert "topoplan.cost moved: import topoplan.analysis.cost" in out


def test_submodules_of_an_old_package_path_import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from topoplan.sim.run import simulate as old
        from topoplan.transports.base import NoNative as old_base
    from topoplan.analysis.sim.run import simulate
    from topoplan.runtime.transports.base import NoNative
    assert old is simulate and old_base is NoNative


def test_verify_and_simulate_stay_functions_after_their_old_paths_import():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import topoplan.simulate  # noqa: F401
        import topoplan.verify  # noqa: F401
        from topoplan.verify import verify
    assert callable(topoplan.verify) and topoplan.verify is verify
    assert callable(topoplan.simulate) and not isinstance(topoplan.simulate, type(topoplan))


def test_the_root_holds_layers_not_flat_modules():
    public = sorted(p.name for p in (ROOT / "topoplan").iterdir()
                    if not p.name.startswith(("_", ".")) and p.name != "py.typed")
    assert public == ["analysis", "cli.py", "cluster", "commands", "errors.py", "estimate",
                      "interop", "ir", "planners", "runtime", "testbed", "torch", "units.py",
                      "viz"]


def test_the_import_graph_has_no_cycle():
    out = subprocess.run([sys.executable, "scripts/import_graph.py"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert " 0 cycles" in out.splitlines()[0], out
