"""``topoplan import ALGO.xml [--format msccl]``: another tool's algorithm as a topoplan plan.

The format is an option, as ``topoplan export --format``; ``topoplan import msccl ALGO.xml``
(the first spelling) still works, with a note.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import TopoplanError
from .common import console, plural

#: The formats ``import`` reads (``export --format`` writes the same).
FORMATS = ("msccl",)
#: Formats of other commands, for a "did you mean" (topology files, not algorithms).
_ELSEWHERE = {"nccl": "topoplan topo import nccl"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import", help="read another tool's algorithm (MSCCL XML) as a plan JSON",
        description="Check an MSCCL XML allreduce, reduce-scatter or allgather symbolically "
                    "and turn it into a topoplan schedule, so verify, simulate, show and bench "
                    "work on it (docs/INTEROP.md). An NCCL topology file is a cluster, not "
                    "an algorithm: topoplan topo import nccl reads it.")
    parser.add_argument("algo", metavar="ALGO.xml", help="the algorithm file")
    # The first spelling, `import msccl ALGO.xml`: the format, then the file.
    parser.add_argument("old_algo", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("--format", default=None, metavar="{msccl}",
                        help="the input's format (default msccl, the only one)")
    parser.add_argument("-o", "--output", metavar="PLAN.json",
                        help="write the plan here (default: print it to stdout)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: the check's result (and the plan itself "
                             "without -o)")
    parser.set_defaults(func=cmd_import)


def _format(args: argparse.Namespace) -> tuple[str, str]:
    """(format, file) from ``--format F FILE``, ``FILE`` or the first ``F FILE``."""
    fmt, path = args.format, args.algo
    if args.old_algo is not None:
        if fmt is not None:
            raise TopoplanError(f"two formats: {args.algo!r} and --format {fmt}; write "
                                f"topoplan import --format {fmt} {args.old_algo}")
        fmt, path = args.algo, args.old_algo
        if fmt in FORMATS:
            print(f"topoplan: note: 'topoplan import {fmt} FILE' is now 'topoplan import "
                  f"FILE --format {fmt}' (as export --format); the old spelling still works",
                  file=sys.stderr)
    fmt = fmt or FORMATS[0]
    if fmt in _ELSEWHERE:
        raise TopoplanError(f"{fmt!r} is a topology format, not an algorithm: did you mean "
                            f"`{_ELSEWHERE[fmt]} {path}`?")
    if fmt not in FORMATS:
        raise TopoplanError(f"unknown format {fmt!r}; topoplan import reads "
                            f"{', '.join(FORMATS)} (cluster files: topoplan topo import)")
    return fmt, path


def cmd_import(args: argparse.Namespace) -> int:
    from ..interop.msccl import import_msccl, load_msccl, verify_msccl

    fmt, path = _format(args)
    algo = load_msccl(path)
    report = verify_msccl(algo)
    schedule = import_msccl(algo, check=False)
    if args.json:
        if args.output:
            schedule.save(args.output)
        print(json.dumps({
            "input": path, "format": fmt, "output": args.output, "modes": list(report.modes),
            "collective": schedule.collective, "nranks": schedule.nranks,
            "nchunks": schedule.nchunks, "nsteps": schedule.nsteps,
            "nmessages": schedule.nmessages, "verified": True,
            "plan": None if args.output else json.loads(schedule.to_json())}))
        return 0
    summary = (f"{path}: MSCCL check ok ({', '.join(report.modes)}); "
               f"{plural(schedule.nranks, 'rank')}, {plural(schedule.nchunks, 'chunk')}, "
               f"{plural(schedule.nsteps, 'step')}, {plural(schedule.nmessages, 'message')}; "
               "verified")
    if args.output:
        schedule.save(args.output)
        out = console()
        out.print(f"wrote {args.output}", soft_wrap=True)  # a path whole, however long
    else:
        sys.stdout.write(schedule.to_json() + "\n")
        out = console(stderr=True)
    out.print(summary)
    return 0
