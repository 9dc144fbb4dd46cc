"""The package type-checks: ``mypy topoplan`` with the [tool.mypy] settings of pyproject.toml."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is not installed (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_mypy_clean() -> None:
    # mypy resolves the config and its cache relative to the working directory: run it
    # from the repository root so pyproject.toml applies and .mypy_cache (ignored) is reused.
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        stdout, stderr, status = api.run(["--config-file", "pyproject.toml", "topoplan"])
    finally:
        os.chdir(here)
    assert status == 0, f"mypy topoplan found problems:\n{stdout}{stderr}"
