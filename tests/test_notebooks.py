"""Every notebook in notebooks/ runs top to bottom, so the examples never rot.

The stored notebooks carry their outputs (``scripts/execute_notebooks.py`` writes
them), so a reader sees the results without running anything; these tests re-execute
a copy in memory and never rewrite the stored files.

The kernel is this interpreter: a kernelspec written to a temporary JUPYTER_PATH
points at ``sys.executable``, so it works in a fresh virtualenv with no kernel
installed (``make test``) and never picks up some other Python on the machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "topoplan-tests"
# What each notebook imports from topoplan beyond the core (they land separately).
NEEDS = {"01_plan_a_cluster": ["topoplan.planners", "topoplan.analysis.sim"],
         "02_compare_planners": ["topoplan.planners", "topoplan.analysis.sim"],
         "03_training": ["topoplan.planners", "topoplan.analysis.sim", "topoplan.runtime.executor",
                         "topoplan.runtime.transports", "torch"]}
CELL_TIMEOUT_S = 120  # generous for a loaded 2-core CI machine; each notebook runs in < 30 s


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    """A kernelspec for the running interpreter, with the repository importable."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "topoplan tests", "language": "python", "env": env}))
    return root


def test_notebooks_exist():
    names = {path.name for path in NOTEBOOKS}
    assert {"01_plan_a_cluster.ipynb", "02_compare_planners.ipynb", "03_training.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_saved_executed(path):
    """Stored with its outputs, run top to bottom, and free of this machine's paths."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: run scripts/execute_notebooks.py to store it executed, top to bottom"
    outputs = [out for cell in code for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{path.name}: no picture"
    text = path.read_text()
    assert str(ROOT) not in text and "/tmp/" not in text
    assert nb.metadata.kernelspec.name == "python3"
    assert path.stat().st_size < 2_000_000


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_dir, monkeypatch):
    for module in NEEDS.get(path.stem, []):
        pytest.importorskip(module)
    if not hasattr(sys.modules["topoplan.planners"], "PLANNERS"):
        pytest.skip("topoplan.planners has no PLANNERS registry yet")
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    stored = path.read_bytes()
    nb = nbformat.reads(stored.decode(), as_version=4)  # a copy: the file stays as stored
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError naming the cell and the traceback
    assert path.read_bytes() == stored
    errors = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    # A figure a cell returns is shown as a PNG, once (not again by a pyplot backend).
    pngs = [sum("image/png" in out.get("data", {}) for out in cell.outputs)
            for cell in nb.cells if cell.cell_type == "code"]
    assert sum(pngs) > 0, f"{path.name} shows no picture"
    assert max(pngs) == 1, f"{path.name}: a cell shows {max(pngs)} pictures"


def _root_code(path: Path) -> str:
    """The notebook's code up to ``ROOT = ...``: its imports and how it finds the checkout."""
    nb = json.loads(path.read_text())
    source = "".join(next(cell["source"] for cell in nb["cells"] if cell["cell_type"] == "code"
                          and "ROOT = " in "".join(cell["source"])))
    head, _, _ = source.partition("ROOT = repository_root()\n")
    assert head != source, f"{path.name}: no ROOT = repository_root() line"
    return head + "ROOT = repository_root()\nprint(ROOT)\n"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_copied_out_of_the_checkout_finds_it_or_says_why(path, tmp_path):
    """A notebook copied out of the repository used to die with a bare StopIteration
    looking for the repository root."""
    import shutil
    import subprocess

    code = _root_code(path)
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    # topoplan imported from this checkout: the checkout is found from the package
    found = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(ROOT),
                                           "MPLBACKEND": "Agg"}, timeout=120)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == ROOT
    # topoplan installed without the checkout (a copy of the package alone): a clear error
    site = tmp_path / "site"
    shutil.copytree(ROOT / "topoplan", site / "topoplan",
                    ignore=shutil.ignore_patterns("__pycache__"))
    lost = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(site),
                                          "MPLBACKEND": "Agg"}, timeout=120)
    assert lost.returncode == 1 and "StopIteration" not in lost.stderr
    assert lost.stderr.strip().splitlines()[-1] == (
        f"FileNotFoundError: no topologies/ folder in {elsewhere}, above it, or beside the "
        "topoplan package: open this notebook inside a topoplan checkout (its notebooks/ "
        "folder), or set ROOT = Path('/path/to/topoplan') by hand")
