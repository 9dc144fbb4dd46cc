"""Vectored messages (IR v4) under real MPI: ``mpiexec -n N python -m tests.mpi_vectored``,
from the repository root. Every rank runs tests/support/vectored_cases.py over
:class:`topoplan.runtime.transports.MPI` and prints one ``TOPOPLAN-RESULT {json}`` line
(tests/support/mpi_job.py); tests/test_vectored.py reads them.
"""

from __future__ import annotations

import argparse

from tests.support.mpi_job import run_job
from tests.support.vectored_cases import vectored_cases
from topoplan.runtime.transports import MPI


def cases(t: MPI, args: argparse.Namespace) -> dict:
    failures, ncases = vectored_cases(t, timeout=60.0)
    return {"failures": failures, "ncases": ncases}


def kill(t: MPI, args: argparse.Namespace) -> dict:  # pragma: no cover - no --kill here
    return {}


if __name__ == "__main__":
    run_job(cases, kill)
