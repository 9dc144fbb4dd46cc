"""``topoplan import msccl ALGO.xml``: another tool's algorithm as a topoplan plan."""

from __future__ import annotations

import argparse
import sys

from .common import console


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import", help="read another tool's algorithm (MSCCL XML) as a plan JSON",
        description="Check an MSCCL XML allreduce, reduce-scatter or allgather symbolically "
                    "and turn it into a topoplan "
                    "schedule, so verify, simulate, show and bench work on it "
                    "(docs/INTEROP.md).")
    parser.add_argument("format", choices=["msccl"], help="input format")
    parser.add_argument("algo", help="MSCCL XML algorithm file")
    parser.add_argument("-o", "--output", metavar="PLAN.json",
                        help="write the plan here (default: print it to stdout)")
    parser.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from ..interop.msccl import check_msccl, read_msccl
    from ..interop.msccl_import import import_msccl

    algo = read_msccl(args.algo)
    report = check_msccl(algo)
    schedule = import_msccl(algo, check=False)
    summary = (f"{args.algo}: MSCCL check ok ({', '.join(report.modes)}); "
               f"{schedule.nranks} ranks, {schedule.nchunks} chunks, {schedule.nsteps} steps, "
               f"{schedule.nmessages} messages; verified")
    if args.output:
        schedule.save(args.output)
        console().print(f"wrote {args.output}: {summary}", soft_wrap=True)
    else:
        sys.stdout.write(schedule.to_json() + "\n")
        print(summary, file=sys.stderr)
    return 0
