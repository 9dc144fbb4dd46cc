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
import json
import traceback

from tests.support import native_cases as C
from tests.support import native_schedules as N
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.transports import MPI
from topoplan.runtime.transports.mpi import leave_after_failure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", type=int, default=None, help="rank that dies in the last run")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--torch", action="store_true", help="also torch tensor buffers")
    args = parser.parse_args()
    t = MPI()
    record: dict = {"rank": t.rank, "size": t.size}
    try:
        failures, ncases = C.native_cases(t, with_torch=args.torch)
        # Blocking collectives for calls that run to the end: the same results.
        more, count = C.native_cases(MPI(blocking_natives=True))
        failures, ncases = failures + [f"blocking_natives: {f}" for f in more], ncases + count
        # The whole world in rank order is the transport's own communicator: no split.
        Allreduce(N.native_allreduce(t.size), t)
        if t.group_of(tuple(range(t.size))) is not t.comm:
            failures.append(f"rank {t.rank}: the world's group is not the transport's comm")
    except Exception:  # noqa: BLE001 - reported, the test fails on it
        failures, ncases = [traceback.format_exc()], 0
    record.update(failures=failures, ncases=ncases)
    if args.kill is not None:
        t.barrier()
        schedule = (N.composed_allreduce(2, t.size // 2) if t.size % 2 == 0
                    else N.scatter_then_gather(t.size))
        # A fresh transport: the cases' groups stay as they were.
        record["kill"] = C.killed_member_run(MPI(), victim=args.kill, timeout=args.timeout,
                                             schedule=schedule)
    print("TOPOPLAN-RESULT " + json.dumps(record), flush=True)
    if args.kill is not None:
        # The world lost a rank: MPI_Finalize would wait for it forever.
        leave_after_failure(0, grace=args.timeout)


if __name__ == "__main__":
    main()
