"""Executor correctness under real MPI: run as ``mpiexec -n N python tests/mpi_cases.py``.

One launch runs every case (every test schedule and planner, uneven sizes,
dtypes, array kinds, snapshot semantics, refusal of a wrong rank count) and then,
with ``--kill R``, a final allreduce in which rank R exits mid-run. Every rank
prints one line ``TOPOPLAN-RESULT {json}``: its failures, the number of cases,
and what the killed-peer run raised. tests/test_transports_mpi.py reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                os.path.dirname(os.path.abspath(__file__))]

import cases_common as C  # noqa: E402
from topoplan.transports import MPI  # noqa: E402
from topoplan.transports.mpi import leave_after_failure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", type=int, default=None, help="rank that dies in the last run")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--torch", action="store_true", help="also torch tensor buffers")
    args = parser.parse_args()
    t = MPI()
    record: dict = {"rank": t.rank, "size": t.size}
    try:
        failures, ncases, names = C.run_cases(t, with_torch=args.torch)
    except Exception:  # noqa: BLE001 - reported, the test fails on it
        failures, ncases, names = [traceback.format_exc()], 0, []
    record.update(failures=failures, ncases=ncases, schedules=names)
    if args.kill is not None:
        t.barrier()
        record["kill"] = C.killed_peer_run(t, victim=args.kill, timeout=args.timeout)
    print("TOPOPLAN-RESULT " + json.dumps(record), flush=True)
    if args.kill is not None:
        # The world lost a rank: MPI_Finalize would wait for it forever.
        leave_after_failure(0, grace=args.timeout)


if __name__ == "__main__":
    main()
