"""Execute notebooks/*.ipynb in place, so the stored copies show their outputs.

Run after changing a notebook or a figure it shows::

    python scripts/execute_notebooks.py            # every notebook
    python scripts/execute_notebooks.py notebooks/01_plan_a_cluster.ipynb

Each notebook runs with ``notebooks/`` as its working directory and on this
interpreter (a kernelspec written to a temporary JUPYTER_PATH), and is saved with
the kernel name it had, no per-cell timings, and no absolute path of this checkout
in its outputs (the repository root reads as ``<repo>``): the stored files stay the
same whoever runs this, apart from what the code computes. tests/test_notebooks.py
re-executes every notebook from a copy and checks the stored ones are executed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "topoplan-notebooks"
CELL_TIMEOUT_S = 300


def neutral(text: str) -> str:
    """``text`` with this checkout's absolute path written as ``<repo>``."""
    return text.replace(str(ROOT), "<repo>")


def _scrub(value: object) -> object:
    if isinstance(value, str):
        return neutral(value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


def execute(path: Path, jupyter_path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    kernelspec = nb.metadata.get("kernelspec")
    os.environ["JUPYTER_PATH"] = str(jupyter_path)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                     record_timing=False,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [nbformat.from_dict(_scrub(out)) for out in cell.outputs]
    if kernelspec is not None:
        nb.metadata["kernelspec"] = kernelspec
    nb.metadata.get("language_info", {}).pop("version", None)
    nbformat.validate(nb)
    nbformat.write(nb, path)


def kernelspec_dir(root: Path) -> Path:
    """A kernelspec for this interpreter under ``root``, with the repository importable."""
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "topoplan notebooks", "language": "python", "env": env}))
    return root


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        jupyter_path = kernelspec_dir(Path(tmp))
        for path in paths:
            print(f"executing {path.relative_to(ROOT)}", flush=True)
            execute(path, jupyter_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
