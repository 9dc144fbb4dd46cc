"""Run any command on every rank of a testbed: ``topoplan testbed run CLUSTER -- CMD``.

What ``topoplan launch`` does on this machine's loopback, this does across the testbed's
namespaces, so that every byte between ranks crosses the shaped links and waits on the
emulated wire, not on a CPU copy:

- ``mpi``: Open MPI's ``mpiexec`` in rank 0's namespace with the launcher agent of
  :mod:`topoplan.testbed.mpi` (one "host" per namespace, ``btl tcp``); the ranks see
  ``OMPI_COMM_WORLD_RANK`` and friends as under any ``mpiexec``.
- ``torch``: one process per rank, ``ip netns exec`` into its namespace, with the
  variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``/``MASTER_PORT`` on rank 0's emulated address) and
  ``GLOO_SOCKET_IFNAME=eth0``, so ``dist.init_process_group("gloo")`` joins over the
  emulated network.

The ranks' output goes to this process's stdout and stderr. If one rank fails the others
are stopped; a run that overruns ``timeout`` is stopped; either way every process left in
the testbed's namespaces is killed before returning.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import TopoplanError, TransportError
from .bench import MASTER_PORT, _repo_root
from ..runtime.calibrate import TESTBED_SCALE_ENV
from .netns import kill_namespace_processes

__all__ = ["run_command", "TRANSPORTS", "DEFAULT_LARGEST_MESSAGE"]

TRANSPORTS = ("mpi", "torch")
#: Messages up to this size are sent eagerly by Open MPI's TCP transport (no rendezvous
#: round trip that waits behind bulk data on the emulated links; see
#: :data:`topoplan.testbed.mpi.MIN_EAGER_LIMIT`).
DEFAULT_LARGEST_MESSAGE = 4 << 20


def rank_environment(layout: Any, rank: int) -> dict[str, str]:
    """What ``torchrun`` would set for ``rank`` of ``layout``'s job (one process per box)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(layout.nranks), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
            "MASTER_ADDR": layout.addresses[0], "MASTER_PORT": str(MASTER_PORT),
            "GLOO_SOCKET_IFNAME": "eth0"}


def run_command(bed: Any, argv: Sequence[str], *, transport: str = "mpi",
                timeout: float | None = None,
                largest_message: int = DEFAULT_LARGEST_MESSAGE) -> int:
    """Run ``argv`` once per rank inside ``bed`` and return the job's exit status.

    Parameters
    ----------
    bed : Testbed
    argv : sequence of str
        The program every rank runs.
    transport : {"mpi", "torch"}
        How the ranks are started and find each other (module docstring).
    timeout : float, optional
        Seconds for the whole job; it is stopped after that.
    largest_message : int
        ``mpi``: messages up to this many bytes go eagerly.

    Raises
    ------
    TransportError
        The job ran past ``timeout`` (every rank was stopped).
    """
    if transport not in TRANSPORTS:
        raise TopoplanError(f"transport {transport!r}: a testbed runs {', '.join(TRANSPORTS)}")
    if not argv:
        raise TopoplanError("say what each rank runs: topoplan testbed run CLUSTER -- python "
                            "scripts/train.py")
    layout = bed.layout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [_repo_root(), os.environ.get("PYTHONPATH")])),
        # The ranks' planned collectives price on the cluster emulated at this scale.
        TESTBED_SCALE_ENV: repr(layout.scale)}
    deadline = None if timeout is None else time.monotonic() + timeout
    procs: list[subprocess.Popen] = []
    # The folder holds the launcher's files and is the ranks' TMPDIR (Open MPI's session
    # files): it goes when they have gone, however the run ends.
    with tempfile.TemporaryDirectory(prefix="topoplan-testbed-run-") as tmp:
        try:
            if transport == "mpi":
                from .mpi import mpiexec_command
                command, mpi_env = mpiexec_command(layout, Path(tmp), list(argv), largest_message)
                procs.append(subprocess.Popen(command, env={**mpi_env, **env, "TMPDIR": tmp},
                                              start_new_session=True))
            else:
                for r, ns in enumerate(layout.rank_ns):
                    procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *argv],
                                                  env={**env, **rank_environment(layout, r),
                                                       "TMPDIR": tmp},
                                                  start_new_session=True))
            return _wait(procs, deadline, timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for ns in layout.rank_ns:
                kill_namespace_processes(ns)


def _wait(procs: list[subprocess.Popen], deadline: float | None, timeout: float | None) -> int:
    """The first failing rank's status (the others are stopped), else 0."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r = failed[0]
            if len(procs) > 1 and any(c is None for c in codes):
                print(f"topoplan testbed run: rank {r} exited with status {codes[r]}; stopping "
                      "the other ranks", file=sys.stderr, flush=True)
            code = int(codes[r])  # type: ignore[arg-type]
            return 128 - code if code < 0 else code  # killed by signal -code: as a shell says
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            stuck = [r for r, c in enumerate(codes) if c is None]
            who = "mpiexec" if len(procs) == 1 else f"ranks {stuck}"
            raise TransportError(f"{who} still running after {timeout:g} s; stopped the job")
        time.sleep(0.05)
