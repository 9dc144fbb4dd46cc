"""Native steps (IR v3) under real MPI: ``mpiexec -n N python -m tests.mpi_native``, from the
repository root.

Every rank runs tests/support/native_cases.py over :class:`topoplan.runtime.transports.MPI`
(sub-communicators by ``Comm.Split``, non-blocking collectives), again with
``blocking_natives=True`` (MPI's blocking collectives), and then, with ``--kill R``,
a composed allreduce in which rank R exits when its first native step starts. Every rank
prints one line ``TOPOPLAN-RESULT {json}``: its failures, the cases run and what the
killed-member run raised. tests/test_transports_mpi.py reads them.
"""

from __future__ import annotations

import argparse

from tests.support import native_cases as C
from tests.support import native_schedules as N
from tests.support.mpi_job import run_job
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.transports import MPI


def cases(t: MPI, args: argparse.Namespace) -> dict:
    failures, ncases = C.native_cases(t, with_torch=args.torch)
    # Blocking collectives for calls that run to the end: the same results.
    more, count = C.native_cases(MPI(blocking_natives=True))
    failures, ncases = failures + [f"blocking_natives: {f}" for f in more], ncases + count
    # The whole world in rank order is the transport's own communicator: no split.
    Allreduce(N.native_allreduce(t.size), t)
    if t.group_of(tuple(range(t.size))) is not t.comm:
        failures.append(f"rank {t.rank}: the world's group is not the transport's comm")
    return {"failures": failures, "ncases": ncases}


def kill(t: MPI, args: argparse.Namespace) -> dict:
    schedule = (N.composed_allreduce(2, t.size // 2) if t.size % 2 == 0
                else N.scatter_then_gather(t.size))
    # A fresh transport: the cases' groups stay as they were.
    return C.killed_member_run(MPI(), victim=args.kill, timeout=args.timeout, schedule=schedule)


def main() -> None:
    run_job(cases, kill)


if __name__ == "__main__":
    main()
