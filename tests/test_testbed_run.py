"""``topoplan testbed run CLUSTER -- CMD``: any program on every rank, over the emulated links.

The namespace tests need root (CAP_NET_ADMIN) and iproute2 and skip without them; each
builds its own testbed of three one-GPU boxes, two switches and a 125 Mbit/s uplink, and
checks that the bytes of a real MPI or gloo send crossed the shaped uplink (they take at
least its time) and that nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from topoplan.cli import build_parser, _parse

CLUSTER = """\
name: tb-run
switches: [{name: sw0}, {name: sw1}]
boxes:
  - {name: A, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: B, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: C, gpus: 1, nics: [{switch: sw1, bandwidth: 500 Mbit/s}]}
links:
  - {a: sw0, b: sw1, bandwidth: 125 Mbit/s}
"""
UPLINK = 125e6 / 8  # bytes/s
NBYTES = 1 << 20


def test_everything_after_the_double_dash_is_the_program():
    parser = build_parser()
    args = _parse(parser, ["testbed", "run", "c.yaml", "--transport", "torch", "--timeout", "9",
                           "--", "python", "-c", "print(1)", "--transport", "x"])
    assert args.cluster == "c.yaml" and args.transport == "torch" and args.timeout == 9
    assert args.command == ["python", "-c", "print(1)", "--transport", "x"]
    args = _parse(parser, ["launch", "-n", "2", "--", "python", "-c", "0"])
    assert args.nranks == 2 and args.command == ["python", "-c", "0"]
    args = _parse(parser, ["launch", "-n", "2", "python", "x.py"])
    assert args.command == ["python", "x.py"]


def _topoplan(*args: str, timeout: float = 180, env: dict | None = None):
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_a_run_without_a_program_is_a_clear_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    proc = _topoplan("testbed", "run", str(path), timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("topoplan: error: say what each rank runs"), proc.stderr


# ---- real namespaces -----------------------------------------------------------------

from .support.netns import needs_netns  # noqa: E402


@pytest.fixture
def setup(tmp_path):
    """The cluster file and an environment whose testbed state goes to ``tmp_path``."""
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    state = tmp_path / "state"
    env = {**os.environ, "TOPOPLAN_TESTBED_STATE": str(state)}
    return path, env, state, _namespaces()


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _alive(namespace: str) -> bool:
    """Whether the process that named ``namespace`` (``tp-<pid>-<tag>-...``, the testbed's
    own prefix) still runs: another testbed, such as a test on another pytest-xdist
    worker, builds its namespaces beside this test's."""
    parts = namespace.split("-")
    return len(parts) > 2 and parts[1].isdigit() and Path("/proc", parts[1]).exists()


def _nothing_left(state: Path, before: set[str]) -> None:
    """No state file, and no namespace that was not there before the run but of a
    testbed still running (this test's run has ended: its namespaces must be gone)."""
    assert not list(state.glob("*.json")), list(state.iterdir())
    left = {ns for ns in _namespaces() - before if not _alive(ns)}
    assert not left, left


MPI_PROGRAM = textwrap.dedent(f"""
    import socket, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    buf = np.ones({NBYTES} // 4, np.float32)
    comm.Barrier()
    start = time.perf_counter()
    if comm.rank == 0:
        comm.Send(buf, dest=2)
    elif comm.rank == 2:
        comm.Recv(buf, source=0)
    comm.Barrier()
    took = time.perf_counter() - start
    names = comm.gather(socket.gethostname())
    if comm.rank == 0:
        print("HOSTS", ",".join(names), "SECONDS", took, flush=True)
""")


@needs_netns
@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_program_runs_one_rank_per_namespace_over_the_shaped_links(setup):
    pytest.importorskip("mpi4py")
    path, env, state, before = setup
    proc = _topoplan("testbed", "run", str(path), "--scale", "1", "--timeout", "120", "--",
                     "python", "-c", MPI_PROGRAM, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("HOSTS"))
    _, hosts, _, seconds = line.split()
    assert hosts == "tb-r0,tb-r1,tb-r2"
    # Rank 0 -> rank 2 crosses the 125 Mbit/s uplink: at least the bytes' time there.
    assert float(seconds) >= 0.9 * NBYTES / UPLINK, seconds
    assert "3 ranks at scale 1/1, mpi" in proc.stderr
    _nothing_left(state, before)


TORCH_PROGRAM = textwrap.dedent(f"""
    import gc, os, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert int(os.environ["RANK"]) == rank and dist.get_world_size() == 3
    t = torch.ones({NBYTES} // 4)
    dist.barrier()
    start = time.perf_counter()
    if rank == 0:
        dist.send(t, 2)
    elif rank == 2:
        dist.recv(t, 0)
    dist.barrier()
    took = time.perf_counter() - start
    s = torch.tensor([float(rank)])
    dist.all_reduce(s)
    if rank == 0:
        print("SUM", int(s.item()), "SECONDS", took, flush=True)
    gc.collect()
    dist.destroy_process_group()
""")


@needs_netns
@pytest.mark.slow
def test_torch_program_joins_over_gloo_on_the_emulated_network(setup):
    pytest.importorskip("torch")
    path, env, state, before = setup
    proc = _topoplan("testbed", "run", str(path), "--scale", "1", "--transport", "torch",
                     "--timeout", "120", "--", "python", "-c", TORCH_PROGRAM, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SUM"))
    _, total, _, seconds = line.split()
    assert int(total) == 0 + 1 + 2
    assert float(seconds) >= 0.9 * NBYTES / UPLINK, seconds
    _nothing_left(state, before)


@needs_netns
@pytest.mark.slow
def test_a_failing_rank_stops_the_job_with_its_status(setup):
    path, env, state, before = setup
    program = ("import os, sys, time\n"
               "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(120)")
    start = time.monotonic()
    proc = _topoplan("testbed", "run", str(path), "--scale", "1", "--transport", "torch",
                     "--", "python", "-c", program, env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "rank 1 exited with status 3; stopping the other ranks" in proc.stderr
    assert time.monotonic() - start < 60
    _nothing_left(state, before)


@needs_netns
@pytest.mark.mpi
@pytest.mark.slow
def test_a_job_past_its_timeout_is_stopped_with_a_clear_error(setup):
    pytest.importorskip("mpi4py")
    path, env, state, before = setup
    proc = _topoplan("testbed", "run", str(path), "--scale", "1", "--timeout", "4", "--",
                     "sleep", "120", env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "topoplan: error: mpiexec still running after 4 s; stopped the job" in proc.stderr
    _nothing_left(state, before)
