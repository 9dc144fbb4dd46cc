"""``topoplan verify PLAN.json``: check that a schedule computes its collective (an allreduce,
a reduce-scatter or an allgather)."""

from __future__ import annotations

import argparse

from ..errors import ScheduleError
from ..schedule import load_schedule
from ..verify import verify
from .common import console


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check a schedule JSON: exit 0 when it computes its collective "
                       "(allreduce, reduce_scatter or allgather)",
        description="Symbolically execute schedule(s) (the semantics of docs/SCHEDULE.md). Exit 0 "
                    "and print one line per file when correct; otherwise name the first "
                    "violation.")
    parser.add_argument("plan", nargs="+", help="schedule JSON file(s)")
    parser.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    out = console()
    for path in args.plan:
        schedule = load_schedule(path)  # format errors already name the file
        try:
            report = verify(schedule)
        except ScheduleError as exc:
            raise ScheduleError(f"{path}: {exc}") from None
        out.print(f"{path}: ok: {schedule.algorithm} {report.collective}, {report.nranks} ranks, "
                  f"{report.nchunks} chunks, {report.nsteps} steps, {report.nmessages} messages",
                  soft_wrap=True)
    return 0
