"""The package stands in layers (docs/ARCHITECTURE.md), and the old flat paths still import."""

from __future__ import annotations

import importlib
import json
import re
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


#: (old module, name, the module it is in now, its name there): names that left a module
#: for a module of their concept, or were renamed (topoplan/_compat.py, moved_names).
MOVED_NAMES = [
    *[("topoplan.ir.schedule", name, "topoplan.ir.parse", name)
      for name in ("load_schedule", "loads_schedule", "FRACTION_TOLERANCE")],
    *[("topoplan.ir.schedule", name, "topoplan.ir.passes", name)
      for name in ("coalesce", "vectorize", "split_vectored")],
    ("topoplan.ir.schedule", "native", "topoplan.ir.schedule", "native_op"),
    *[("topoplan.planners.channels", name, "topoplan.ir.passes", name)
      for name in ("channelize", "check_channels", "check_skew", "slices", "MAX_CHANNELS")],
    *[("topoplan.analysis.native.nccl", name, "topoplan.analysis.native.clusters", name)
      for name in ("runtime_cluster", "nccl_links", "gpu_model", "group_cluster", "GroupCluster",
                   "DEFAULT_GPU")],
    ("topoplan.ir.matching", "messages", "topoplan.ir.matching", "match_messages"),
    ("topoplan.runtime.calibrate", "fit", "topoplan.runtime.calibrate.fitting", "fit_costs"),
    ("topoplan.runtime.calibrate.fitting", "fit", "topoplan.runtime.calibrate.fitting",
     "fit_costs"),
    ("topoplan.estimate", "Estimate", "topoplan.estimate.result", "IterationEstimate"),
]


@pytest.mark.parametrize("old, name, new, new_name", MOVED_NAMES)
def test_a_name_that_left_its_module_still_imports_from_it_and_warns(old, name, new, new_name):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning,
                      match=rf"^{re.escape(old)}\.{name} is deprecated; use "
                            rf"{re.escape(new)}\.{new_name}$"):
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(new), new_name)
    assert name not in getattr(module, "__all__", ()) and name not in vars(module)


def test_schedule_from_dict_warns_and_parses():
    from topoplan.ir.parse import loads_schedule, schedule_from_dict
    from topoplan.ir.schedule import Schedule
    text = ('{"format": "topoplan-schedule", "version": 1, "nranks": 1, "chunks": [1], '
            '"ranks": [{"rank": 0, "steps": []}]}')
    with pytest.warns(DeprecationWarning, match="^topoplan.ir.schedule.Schedule.from_dict is "
                                                "deprecated; use topoplan.ir.parse.schedule_from_dict$"):
        old = Schedule.from_dict(json.loads(text), "x.json")
    assert old == loads_schedule(text) == schedule_from_dict(json.loads(text))


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


def test_the_root_holds_at_most_eight_modules():
    """The package, its ``__main__``, the CLI, the exceptions, the units, the YAML reader,
    one compat module for old paths (``_compat``) and one of small helpers (``_util``)."""
    modules = sorted(p.name for p in (ROOT / "topoplan").glob("*.py"))
    assert len(modules) <= 8, modules


def test_dir_of_the_package_shows_its_api_only():
    names = dir(topoplan)
    assert not {"Any", "annotations", "importlib", "_sys", "sys"} & set(names)
    assert all(not n.startswith("_") or n == "__version__" for n in names), names
    assert set(topoplan.__all__) <= set(names)
    for name in names:
        getattr(topoplan, name)  # each one resolves


def test_import_topoplan_loads_the_exceptions_only():
    code = ("import sys, topoplan\n"
            "print(sorted(m for m in sys.modules if m.startswith('topoplan')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out.strip() == "['topoplan', 'topoplan._compat', 'topoplan.errors']", out


def test_no_public_names_equal_but_for_case():
    """In every module, the public names (``__all__``, else what the module defines) differ
    by more than case (``Native`` and ``native`` did not: the function is ``native_op``).
    Submodules are not names here: ``topoplan.cluster`` holds ``Cluster``."""
    code = """
import collections, importlib, inspect, pkgutil, warnings
import topoplan
warnings.simplefilter("ignore")
names = {"topoplan": topoplan.__all__}
for info in pkgutil.walk_packages(topoplan.__path__, "topoplan."):
    if info.name.endswith("__main__"):
        continue
    try:
        module = importlib.import_module(info.name)
    except ImportError:  # an optional dependency (torch, cupy, mpi4py) missing
        continue
    names[info.name] = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)
        and getattr(v, "__module__", info.name) == info.name]
for module, public in names.items():
    same = collections.defaultdict(set)
    for name in public:
        same[name.lower()].add(name)
    for found in same.values():
        if len(found) > 1:
            print(module, sorted(found))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout
    assert out == "", out


def test_the_import_graph_has_no_cycle():
    out = subprocess.run([sys.executable, "scripts/import_graph.py"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert " 0 cycles" in out.splitlines()[0], out


def _private_imports_across_packages() -> list[str]:
    """``module imports name from target`` where a private name (``_x``, or a module
    ``_x``) is taken from outside the package that holds it."""
    import ast
    found = []
    for path in sorted((ROOT / "topoplan").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("topoplan"):
                continue
            names = target.split(".")
            for alias in node.names:
                # The package that holds the first private part: a private module's
                # package, or for a private name the package of the module it is in.
                chain = names + [alias.name]
                for i, part in enumerate(chain[1:], 1):
                    if part.startswith("_") and not part.startswith("__"):
                        holder = ".".join(chain[:i])
                        is_pkg = (ROOT / Path(*holder.split(".")) / "__init__.py").exists()
                        owner = holder if is_pkg else holder.rpartition(".")[0]
                        if package != owner and not package.startswith(owner + "."):
                            found.append(f"{module} imports {alias.name} from {target}")
                        break
    return found


def test_no_private_name_crosses_a_package():
    assert _private_imports_across_packages() == []
