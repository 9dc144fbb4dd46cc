"""``topoplan export PLAN.json --format msccl``: a plan as an MSCCL XML algorithm;
``topoplan export CLUSTER.yaml --format nccl-tuner``: the rules of NCCL's example tuner
plugin for a cluster, from the NCCL model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ScheduleError
from .._util import atomic_write
from ..ir.parse import load_schedule
from .common import checked_arg, console, json_text, plural, positive_int, size_arg, status


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write a plan in another tool's format (MSCCL XML), or NCCL's tuner "
                       "rules for a cluster",
        description="msccl (default): write a schedule (an allreduce, a reduce-scatter or an "
                    "allgather: topoplan plan --collective) as an MSCCL XML algorithm that "
                    "msccl-executor-nccl and RCCL run (docs/INTEROP.md); the result passes "
                    "topoplan's MSCCL checker and the executor's limits, or nothing is "
                    "written, and the output says which calls the executor picks it for "
                    "(counts that are multiples of nchunksperloop). A plan with native steps "
                    "(nccl, composed) needs --cluster: each native collective becomes the "
                    "rings NCCL runs there, and the export predicts their time against the "
                    "native steps' (refusing one over --max-slowdown). nccl-tuner: write, for a cluster file, the configuration of "
                    "NCCL's example tuner plugin (plugins/tuner/example): per size range the "
                    "algorithm, protocol and channels the NCCL model prices fastest on this "
                    "fabric, with a comment where NCCL's own tuner would pick otherwise "
                    "(docs/NCCL_MODEL.md).")
    parser.add_argument("plan", metavar="PLAN|CLUSTER",
                        help="schedule JSON file (msccl), or cluster YAML file (nccl-tuner)")
    parser.add_argument("--format", choices=["msccl", "nccl-tuner"], default="msccl",
                        help="output format (default msccl)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="write here (default: print to stdout)")
    parser.add_argument("--proto", choices=["Simple", "LL", "LL128"], default="Simple",
                        help="NCCL protocol the executor runs it with (default Simple)")
    parser.add_argument("--channels", type=positive_int, default=1, metavar="K",
                        help="instances of the plan, each on its own channels and slice of "
                             "the buffer (default 1)")
    parser.add_argument("--min-bytes", type=size_arg, default=None, metavar="SIZE",
                        help="smallest message the executor may pick it for (default 0)")
    parser.add_argument("--max-bytes", type=size_arg, default=None, metavar="SIZE",
                        help="largest message (default: no limit)")
    parser.add_argument("--max-steps", type=positive_int, default=64, metavar="N",
                        help="steps per thread block the executor was built for "
                             "(MSCCL_MAX_NUM_STEPS, default 64)")
    parser.add_argument("--no-lower", action="store_true",
                        help="refuse a plan with native collective steps (IR v3) instead of "
                             "lowering them to point-to-point steps, which MSCCL XML holds")
    parser.add_argument("--cluster", metavar="CLUSTER.yaml",
                        help="the plan's cluster; needed for native steps (nccl, composed): "
                             "they become the rings NCCL runs there, with their predicted "
                             "time")
    parser.add_argument("--size", type=size_arg, default=None, metavar="SIZE",
                        help="the message size the export serves and predicts at (default: "
                             "the plan's own)")
    parser.add_argument("--profile", default=None, metavar="NAME|FILE",
                        help="cost profile of the prediction (default: the plan's own)")
    parser.add_argument("--max-slowdown", type=checked_arg(float, lambda x: x >= 1,
                                                           "must be a number >= 1"),
                        default=None, metavar="R",
                        help="refuse native steps whose point-to-point rings simulate more "
                             "than R times slower than themselves (default 3)")
    # The library's GRIDS and MAX_SLOWDOWN (not imported here: --help stays quick).
    parser.add_argument("--grid", choices=("auto", "exact", "pow2"), default="auto",
                        help="the MSCCL chunk grid (nchunksperloop), which the executor "
                             "needs the count to be a multiple of: auto (default) the exact "
                             "grid if it serves the plan's size, else a power-of-two grid, "
                             "the chunks rounded to it; exact; pow2")
    parser.add_argument("--no-fuse", action="store_true",
                        help="keep recv and send as separate steps on separate thread blocks")
    parser.add_argument("--name", help="the algorithm's name (default topoplan-<planner>)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: what was written (and the XML itself "
                             "without -o), its notes")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also say why a layout was not used (the checker's findings)")
    parser.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    if args.format == "nccl-tuner":
        return _nccl_tuner(args)
    from ..interop.msccl import Limits, export_msccl, to_xml
    from ..interop.msccl.export import MAX_SLOWDOWN

    schedule = load_schedule(args.plan)
    cluster = None
    if args.cluster:
        from ..cluster import load_cluster
        cluster = load_cluster(args.cluster)
    try:
        with status(f"exporting {schedule.algorithm} ..."):
            result = export_msccl(schedule, proto=args.proto, channels=args.channels,
                                  min_bytes=args.min_bytes or 0, max_bytes=args.max_bytes or 0,
                                  name=args.name, limits=Limits(max_steps=args.max_steps),
                                  fuse=not args.no_fuse, lower=not args.no_lower,
                                  cluster=cluster, size=args.size, profile=args.profile,
                                  max_slowdown=args.max_slowdown or MAX_SLOWDOWN,
                                  grid=args.grid)
    except ScheduleError as exc:
        raise ScheduleError(f"{args.plan}: {exc}") from None
    algo = result.algo
    text = to_xml(algo)
    if args.json:
        if args.output:
            atomic_write(Path(args.output), text)
        print(json_text({
            "plan": args.plan, "format": args.format, "output": args.output,
            "name": algo.name, "collective": algo.coll, "ngpus": algo.ngpus,
            "nchannels": algo.nchannels, "nchunksperloop": algo.nchunksperloop,
            "serves": result.serves(), "planned_bytes": result.planned_bytes,
            "prediction": result.prediction.to_dict() if result.prediction else None,
            "proto": args.proto, "max_thread_blocks": result.max_tbs,
            "max_steps_per_thread_block": result.max_steps, "fused_steps": result.fused,
            "checked": True, "notes": list(result.notes),
            "details": list(result.details) if args.verbose else [],
            "xml": None if args.output else text}))
        return 0
    # One short line per note; why a layout was not used (a deadlock the checker found,
    # as many lines as thread blocks) only with --verbose.
    hint = " (--verbose says why)" if result.details and not args.verbose else ""
    for i, note in enumerate(result.notes):
        print(f"topoplan: note: {note}{hint if i == len(result.notes) - 1 else ''}",
              file=sys.stderr)
    for detail in result.details if args.verbose else []:
        print(f"topoplan: note: {detail}", file=sys.stderr)
    summary = (f"{algo.name}: {algo.coll} of {plural(algo.ngpus, 'GPU')} on "
               f"{plural(algo.nchannels, 'MSCCL channel')}, nchunksperloop "
               f"{algo.nchunksperloop}, up to {plural(result.max_tbs, 'thread block')} per GPU "
               f"and {plural(result.max_steps, 'step')} per thread block, "
               f"{plural(result.fused, 'fused step')} per instance; passes the MSCCL check "
               "and the executor's limits")
    # msccl_lifecycle.cc: the executor picks it only where the count is a multiple of
    # nchunksperloop; say which calls those are, and the plan's own size's fate.
    lines = [result.serves()]
    if result.prediction is not None:
        lines.append(result.prediction.text())
    if args.output:
        atomic_write(Path(args.output), text)
        out = console()
        out.print(f"wrote {args.output}", soft_wrap=True)
    else:
        sys.stdout.write(text)
        out = console(stderr=True)
    for line in (summary, *lines):
        out.print(line)
    return 0


def _nccl_tuner(args: argparse.Namespace) -> int:
    """``--format nccl-tuner``: the tuner plugin's rules for the cluster file given."""
    from ..cluster import load_cluster
    from ..interop.nccl_tuner import tuner_config, tuner_rules
    from ..analysis.native.nccl import nccl_model

    path = Path(args.plan)
    if path.suffix == ".json":
        raise ScheduleError(f"{args.plan}: --format nccl-tuner takes a cluster file (YAML), "
                            "not a plan: NCCL's tuner chooses among NCCL's own algorithms")
    cluster = load_cluster(path)
    with status(f"pricing NCCL's algorithms on {cluster.name} ..."):
        text = tuner_config(cluster, command=f"topoplan export --format nccl-tuner {args.plan}")
        rules = tuner_rules(cluster)
    model = nccl_model(cluster)
    differ = sum(rule.overrides for rule in rules)
    if args.output:
        atomic_write(Path(args.output), text)
    if args.json:
        print(json_text({
            "cluster": cluster.name, "format": "nccl-tuner", "output": args.output,
            "nnodes": model.nnodes, "nranks": model.nranks, "rules": len(rules),
            "differ_from_nccl": differ,
            "lines": [rule.line(model.nnodes, model.nranks) for rule in rules],
            "text": None if args.output else text}))
        return 0
    summary = (f"{len(rules)} rules for {model.nranks} ranks on {model.nnodes} nodes, "
               f"{differ} where the fabric makes another choice than NCCL's own")
    if args.output:
        console().print(f"wrote {args.output}: {summary}")
    else:
        sys.stdout.write(text)
        print(summary, file=sys.stderr)
    return 0
