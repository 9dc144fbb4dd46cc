"""``topoplan verify PLAN.json``: check that a schedule computes its collective (an allreduce,
a reduce-scatter or an allgather)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import ScheduleError, TopoplanError
from ..ir.parse import load_schedule
from ..ir.schedule import Schedule
from ..ir.verify import VerifyReport, verify
from .common import console, plan_name, plural


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a schedule JSON: exit 0 when it computes its collective "
                       "(allreduce, reduce_scatter or allgather)",
        description="Symbolically execute schedule(s) (the semantics of docs/SCHEDULE.md). Exit 0 "
                    "and print one line per file when correct; otherwise name the first "
                    "violation.")
    parser.add_argument("plan", nargs="+", help="schedule JSON file(s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: every file with ok and what it computes, "
                             "or its error")
    parser.set_defaults(func=cmd_verify)


def verify_plan(schedule: Schedule, path: str) -> VerifyReport:
    """:func:`~topoplan.ir.verify.verify` ``schedule``, read from ``path``: the error names
    the file (``PATH: ring schedule: rank 3 ...``), as every command that refuses a plan
    that does not verify words it."""
    try:
        return verify(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    out = console()
    plans: list[dict[str, Any]] = []
    for path in args.plan:
        try:
            schedule = load_schedule(path)  # format errors already name the file
            report = verify_plan(schedule, path)
        except TopoplanError as exc:
            if not args.json:
                raise
            plans.append({"file": path, "ok": False, "error": str(exc)})
            continue
        plans.append({"file": path, "ok": True, "algorithm": schedule.algorithm,
                      "collective": report.collective, "nranks": report.nranks,
                      "nchunks": report.nchunks, "nsteps": report.nsteps,
                      "nmessages": report.nmessages, "nnative": report.nnative,
                      "ncollectives": report.ncollectives})
        if not args.json:
            # Native steps (IR v3): one per member of each native collective.
            natives = (f", {plural(report.nnative, 'native step')} "
                       f"({plural(report.ncollectives, 'collective')})"
                       if report.nnative else "")
            out.print(f"{path}: ok: {plan_name(schedule)} {report.collective}, "
                      f"{plural(report.nranks, 'rank')}, {plural(report.nchunks, 'chunk')}, "
                      f"{plural(report.nsteps, 'step')}, "
                      f"{plural(report.nmessages, 'message')}{natives}", soft_wrap=True)
    if args.json:
        print(json.dumps({"plans": plans}))
    return 0 if all(p["ok"] for p in plans) else 1
