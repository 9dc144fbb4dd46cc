"""The README's Python example runs as written (docs that match the code)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    example = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    example = example.replace('"topologies/', f'"{ROOT}/topologies/')
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("[6.0, 6.0, 6.0, 6.0]")
    assert (tmp_path / "plan.json").exists()


def test_readme_first_two_commands_are_make_targets():
    text = (ROOT / "README.md").read_text()
    block = re.findall(r"```sh\n(.*?)```", text, re.S)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
