"""Channelled schedules (IR v4) under real MPI: ``mpiexec -n N python -m tests.mpi_channels``,
from the repository root.

Every rank runs tests/support/channel_cases.py over :class:`topoplan.runtime.transports.MPI`
(the hand-off between ranks 1 and 2 goes over COMM_WORLD, which the transport's
duplicate never sees), then a retry after a timeout (the last rank starts late: every other rank times out
in call 0, part way through its channels, and tells it so on COMM_WORLD; the late rank
then runs call 0 alone and times out too; calls 1..6 must each sum their own inputs,
and no message may be left over), then, with ``--kill R``, a two-ring allreduce in which rank R
exits when it starts its third step. Every rank prints one line ``TOPOPLAN-RESULT
{json}``: its failures, the cases run, how the executor ran the channels, and what the
killed-peer run raised. tests/test_channels_exec.py reads them.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI as mpi

from tests.support import channel_cases as C
from tests.support.mpi_job import run_job
from topoplan.errors import TransportError
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.transports import MPI

HANDOFF_TAG, RETRY_TAG = 11, 12


def cases(t: MPI, args: argparse.Namespace) -> dict:
    world = mpi.COMM_WORLD
    failures, ncases, mode = C.channel_cases(
        t, let_go=lambda: world.send(None, dest=2, tag=HANDOFF_TAG),
        wait_to_go=lambda: world.recv(source=1, tag=HANDOFF_TAG), timeout=30.0)
    return {"failures": failures, "ncases": ncases, "mode": mode, "retry": retry(t)}


def retry(t: MPI) -> dict:
    """The retry after a timeout (see the module docstring): what each call did."""
    world, n, rank, late = mpi.COMM_WORLD, t.size, t.rank, t.size - 1
    run = Allreduce(C.two_rings(n), t, timeout=0.5)
    if rank == late:
        for other in range(late):
            world.recv(source=other, tag=RETRY_TAG)
    outcomes: list = []
    try:
        run(np.ones(1000))
        outcomes.append("ok")
    except TransportError:
        outcomes.append("failed")
    if rank != late:
        world.send(None, dest=late, tag=RETRY_TAG)
    run.timeout = 60
    for call in range(1, 7):
        x = C._ints(1000, rank, call)
        run(x)
        outcomes.append(bool(np.array_equal(x, C._sum(1000, n, call))))
    t.barrier()
    return {"outcomes": outcomes, "left_over": bool(t.comm.Iprobe(mpi.ANY_SOURCE, mpi.ANY_TAG))}


def kill(t: MPI, args: argparse.Namespace) -> dict:
    return C.failed_peer_run(MPI(), victim=args.kill, timeout=args.timeout)


def main() -> None:
    run_job(cases, kill)


if __name__ == "__main__":
    main()
