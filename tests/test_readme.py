"""The README's Python example and training commands run as written (docs that match the code)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def _training_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "scripts/train.py" in b)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_training_commands_run_as_typed():
    """Every training command of the README, from the repository root, as typed: the only
    changes are where the virtualenv is (``.venv/`` is the one running this test) and one
    epoch instead of twelve. ``make train`` runs the second line (``make -n`` shows it), so
    that line runs once, through make; make must not rebuild the virtualenv here."""
    pytest.importorskip("torch")
    pytest.importorskip("mpi4py")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = Path(sys.executable).parent.parent
    commands = _training_commands()
    assert commands == [
        "make train",
        ".venv/bin/topoplan launch -n 4 -- .venv/bin/python scripts/train.py "
        "--fp16-allreduce --double-buffering",
        ".venv/bin/topoplan launch -n 2 --transport torch -- .venv/bin/python scripts/train.py"]
    make = ["make", "--no-print-directory", "-o", f"{venv}/.installed", f"VENV={venv}", "train"]
    shown = subprocess.run([*make, "-n"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == commands[1].replace(".venv/", f"{venv}/")

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # The time in communication is a number in both (overlapped runs used to say nan).
    runs = [([*make, "EPOCHS=1"],
             r"train: 4 ranks mpi/optimizer auto( \([a-z/-]+\))? fp16 dbuf overlap: .*"
             r"communication \d+\.\d\d s \(exposed \d+\.\d\d s\), wall"),
            (shlex.split(commands[2].replace(".venv/", f"{venv}/")) + ["--epochs", "1"],
             r"train: 2 ranks torch/ddp auto( \([a-z/-]+\))? fp32: .*communication \d+\.\d\d s "
             r"\(DDP waits for it inside backward: the exposed part is not measured\), wall")]
    for argv, want in runs:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env=env)
        assert done.returncode == 0, f"{argv}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert re.search(want, done.stdout), f"{argv}:\n{done.stdout[-2000:]}"


def test_readme_shell_commands_need_nothing_on_path():
    """A fresh clone has make and the virtualenv that make builds, nothing else on PATH:
    every shell command of the README starts with make or .venv/bin/."""
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for line in (ln.split("#")[0].strip() for ln in lines):
            if line:
                assert line.startswith(("make ", ".venv/bin/")), line


def test_readme_walkthrough_runs_as_typed(tmp_path):
    """The new user's path, from their own cluster file to a real run: the README's
    my-cluster.yaml, then every command of the two blocks after it, in a fresh folder,
    with the virtualenv running this test."""
    pytest.importorskip("mpi4py")
    text = (ROOT / "README.md").read_text()
    cluster = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
                   if "my-cluster" in b)
    (tmp_path / "my-cluster.yaml").write_text(cluster)
    blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "my-cluster" in b]
    commands = [line.split("#")[0].strip() for b in blocks
                for line in b.replace("\\\n", " ").splitlines() if line.strip()]
    assert [c.split()[1] for c in commands] == ["topo", "topo", "plan", "simulate", "show",
                                                "export", "bench"]
    venv = Path(sys.executable).parent.parent
    env = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1"}
    for command in commands:
        argv = shlex.split(command.replace(".venv/", f"{venv}/"))
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr
        if " bench " not in command:  # bench prints nccl-tests' own wide columns
            assert all(len(line) <= 80 for line in done.stdout.splitlines()), command
    for made in ("plan.json", "my-cluster.png", "nccl_tuner.conf"):
        assert (tmp_path / made).exists(), made


def test_readme_notebook_command_is_installed():
    """The README's command for the notebooks is nbclient's ``jupyter execute`` from the
    virtualenv (the dev extra installs it; ``jupyter nbconvert`` is not installed), over
    the notebooks tests/test_notebooks.py executes (with the same nbclient)."""
    pytest.importorskip("nbclient")
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "notebooks/" in b)
    command = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert command == [".venv/bin/jupyter execute notebooks/*.ipynb"], command
    assert sorted(ROOT.glob("notebooks/*.ipynb")), "no notebooks"
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "jupyter").exists():
        pytest.skip(f"no jupyter command beside {sys.executable}")
    done = subprocess.run([str(bin_dir / "jupyter"), "execute", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--inplace" in done.stdout, done.stderr[-2000:]
