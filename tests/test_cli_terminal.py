"""Colour, spinners and progress bars only on a terminal (progress bars used to write ANSI
escapes into pipes and log files under mpiexec, where Open MPI gives every rank a
pseudo-terminal whatever mpiexec itself writes to)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.runtime.mpirun import ENV_RANK_MARK, ENV_TERMINAL
from topoplan.commands.common import is_terminal

ROOT = Path(__file__).resolve().parent.parent
DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")
ESC = "\x1b["


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "TERM", ENV_TERMINAL, ENV_RANK_MARK)}
    return {**env, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **extra}


def _in_a_terminal(argv: list[str], env: dict[str, str]) -> str:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; what it wrote."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(argv, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL,
                            env=env, cwd=ROOT)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=300)
    os.close(leader)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


TOPO_SHOW = [sys.executable, "-m", "topoplan", "topo", "show", DDL]


def test_colour_on_a_terminal_none_with_no_color_or_a_dumb_terminal():
    assert ESC in _in_a_terminal(TOPO_SHOW, _env())  # the check below can fail
    assert ESC not in _in_a_terminal(TOPO_SHOW, _env(NO_COLOR="1"))
    assert ESC not in _in_a_terminal(TOPO_SHOW, _env(TERM="dumb"))


def test_a_rank_draws_only_when_its_launcher_is_on_a_terminal(monkeypatch):
    for key in ("NO_COLOR", ENV_TERMINAL, ENV_RANK_MARK, "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                "PMI_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TERM", "xterm")

    class Tty:
        def isatty(self) -> bool:
            return True

    assert is_terminal(Tty()) and not is_terminal(object())
    monkeypatch.setenv(ENV_RANK_MARK, "openmpi5")  # a rank: its pseudo-terminal says nothing
    assert not is_terminal(Tty())
    monkeypatch.setenv(ENV_TERMINAL, "1")
    assert is_terminal(Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not is_terminal(Tty())


@pytest.mark.mpi
def test_a_command_under_mpiexec_writes_no_escapes_into_a_pipe():
    pytest.importorskip("mpi4py")
    launch = [sys.executable, "-m", "topoplan", "launch", "-n", "1", "--", "python", "-m",
              "topoplan", "topo", "show", DDL]
    piped = subprocess.run(launch, capture_output=True, text=True, env=_env(), cwd=ROOT,
                           timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "ddl" in piped.stdout and ESC not in piped.stdout + piped.stderr
    # ... and keeps its colour when the launcher is on a terminal
    assert ESC in _in_a_terminal(launch, _env())


@pytest.mark.mpi
@pytest.mark.slow
def test_the_training_progress_bar_stays_out_of_a_pipe_under_mpiexec():
    pytest.importorskip("mpi4py")
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "-n", "2", "--", "python",
                           "scripts/train.py", "--epochs", "1", "--model", "mlp"],
                          capture_output=True, text=True, env=_env(OMP_NUM_THREADS="1"),
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("train: 2 ranks mpi/optimizer")
    assert ESC not in done.stdout + done.stderr


# ---- long work says what it is doing -------------------------------------------------

def test_a_status_outside_a_terminal_is_quiet_when_quick_and_a_plain_line_when_long(
        monkeypatch, capsys):
    import time

    from topoplan import _util
    from topoplan.commands import common

    monkeypatch.setattr(common, "QUIET_S", 0.3)
    with common.status("quick ..."):
        _util.step("a step")
    with common.status("planning ..."):
        time.sleep(0.6)  # past QUIET_S with no step: the message
        for i in range(12):  # a step every 0.1 s: a line at most every QUIET_S
            _util.step(f"step {i}")
            time.sleep(0.1)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "topoplan: planning ..." and ESC not in err
    assert 2 <= len(lines) <= 5 and all(ln.startswith("topoplan: step ") for ln in lines[1:])
    _util.step("nobody listens")  # outside a status: nothing, no error
    assert capsys.readouterr().err == ""


def test_show_and_plan_say_which_figure_and_which_candidate(monkeypatch, capsys, tmp_path):
    from topoplan.cli import main
    from topoplan.commands import common

    monkeypatch.setattr(common, "QUIET_S", 0.0)  # every step shows, as after a long wait
    assert main(["show", DDL, "-a", "ring", "--size", "1MiB", "--figures", "cluster,sweep",
                 "--sweep-algorithms", "ring,rhd", "--sizes", "1KiB,1MiB",
                 "-o", str(tmp_path / "p.png")]) == 0
    err = capsys.readouterr().err
    assert ESC not in err
    for line in ("topoplan: drawing the cluster figure ...", "topoplan: sweep: ring at 1KiB ...",
                 "topoplan: sweep: rhd at 1MiB ..."):
        assert line in err.splitlines(), err
    assert main(["plan", DDL, "--candidates", "ring,mcf"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "topoplan: ring: planning 4 ranks ..." in err and any(
        ln.startswith("topoplan: mcf: simulating ") for ln in err), err


def test_on_a_terminal_the_status_line_shows_the_step():
    code = ("import time\nfrom topoplan import _util\nfrom topoplan.commands.common import status\n"
            "with status('planning ...'):\n"
            "    _util.step('mcf: planning 256 ranks ...')\n    time.sleep(0.5)\n")
    out = _in_a_terminal([sys.executable, "-c", code], _env())
    assert "planning ... mcf: planning 256 ranks ..." in out and ESC in out
