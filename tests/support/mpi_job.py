"""The frame of an MPI test program (tests/mpi_cases.py, tests/mpi_native.py): options,
the cases, an optional killed-rank run, one ``TOPOPLAN-RESULT {json}`` line per rank.
"""

from __future__ import annotations

import argparse
import json
import traceback
from typing import Any, Callable

from topoplan.runtime.transports import MPI
from topoplan.runtime.transports.mpi import leave_after_failure


def run_job(cases: Callable[[MPI, argparse.Namespace], dict[str, Any]],
            kill: Callable[[MPI, argparse.Namespace], dict[str, Any]]) -> None:
    """Run ``cases(transport, args)`` (a dict with ``failures`` and ``ncases``; an
    exception is one failure), then with ``--kill R`` ``kill(transport, args)`` (what
    the killed-rank run raised), and print this rank's record."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill", type=int, default=None, help="rank that dies in the last run")
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--torch", action="store_true", help="also torch tensor buffers")
    args = parser.parse_args()
    t = MPI()
    record: dict[str, Any] = {"rank": t.rank, "size": t.size}
    try:
        record.update(cases(t, args))
    except Exception:  # noqa: BLE001 - reported, the test fails on it
        record.update(failures=[traceback.format_exc()], ncases=0)
    if args.kill is not None:
        t.barrier()
        record["kill"] = kill(t, args)
    print("TOPOPLAN-RESULT " + json.dumps(record), flush=True)
    if args.kill is not None:
        # The world lost a rank: MPI_Finalize would wait for it forever.
        leave_after_failure(0, grace=args.timeout)
