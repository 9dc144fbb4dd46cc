"""``topoplan launch``: real mpiexec jobs, their exit status, the timeout, and the one-line
errors (tests/test_readme.py runs a torch.distributed.run job through it)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", "launch", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.mpi
def test_mpi_ranks_run_this_python_and_the_job_status_comes_back():
    pytest.importorskip("mpi4py")
    # Every rank prints before any exits (the barrier): mpiexec ends the job at the
    # first failed rank, which on a loaded machine could come before a slow rank's line.
    code = ("import os, sys; rank = int(os.environ['OMPI_COMM_WORLD_RANK']); "
            "print('rank', rank, sys.executable, flush=True); "
            "from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
            "sys.exit(3 if rank == 2 else 0)")
    done = launch("-n", "3", "--", "python", "-c", code)
    ranks = sorted(line.split()[1] for line in done.stdout.splitlines() if line.startswith("rank"))
    assert ranks == ["0", "1", "2"], done.stdout + done.stderr
    assert all(line.split()[2] == sys.executable
               for line in done.stdout.splitlines() if line.startswith("rank"))
    assert done.returncode == 3


@pytest.mark.mpi
def test_a_timeout_ends_every_rank():
    pytest.importorskip("mpi4py")
    marker = f"topoplan-launch-{uuid.uuid4().hex}"
    done = launch("-n", "2", "--timeout", "3", "--", "python", "-c",
                  "import time, sys; time.sleep(120)", marker)
    assert done.returncode == 1
    assert done.stderr.strip().endswith("topoplan: error: the job did not finish within 3 s; "
                                        "ended it")
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == "", "ranks left running"


@pytest.mark.parametrize("argv, message", [
    (["-n", "2"], "topoplan: error: say what each rank runs: topoplan launch -n 4 -- python "
                  "scripts/train.py"),
    (["-n", "2", "--"], "topoplan: error: say what each rank runs: topoplan launch -n 4 -- "
                        "python scripts/train.py"),
    (["-n", "0", "--", "true"], "argument -n/--nranks: must be >= 1, got 0"),
])
def test_usage_errors_are_one_line(argv, message):
    done = launch(*argv)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(message)
