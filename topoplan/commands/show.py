"""``topoplan show CLUSTER.yaml [PLAN.json] --size 256MiB -o picture.png``: draw a plan.

Writes one image file per figure and prints each file's name. ``-o picture.png`` names
the cluster drawing (one figure asked for with ``--figures`` is written there, whichever
it is); the others take a suffix before the extension: ``picture-timeline.png`` (per-rank Gantt
chart), ``picture-links.png`` (utilisation of the busiest links over time) and, with
``--figures all`` (or a list naming ``sweep``), ``picture-sweep.png`` (algbw/busbw
against size for every planner). The extension picks the format (png, svg, pdf).
Plans are made for, and simulated under, the runtime's cost profile (``--profile``,
default nccl).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..cluster import load_cluster
from ..analysis.cost import get_profile
from ..errors import ScheduleError, TopoplanError
from ..units import format_size, format_time
from .common import (Column, add_profile_argument, console, fit_table, left_out_note, plural,
                     positive_int, size_arg, sizes_arg, status)

FIGURES = ("cluster", "timeline", "links", "sweep")
# The sweep plans and simulates every planner at every size: seconds on a small cluster,
# but minutes on 32+ GPUs with mcf, so it is asked for, not drawn by default.
DEFAULT_FIGURES = ("cluster", "timeline", "links")


def _figures(text: str) -> list[str]:
    if text.strip() == "all":
        return list(FIGURES)
    names = [part.strip() for part in text.split(",") if part.strip()]
    bad = [n for n in names if n not in FIGURES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown figure(s) {bad or [text]}; choose from {','.join(FIGURES)} or all")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    show = subparsers.add_parser(
        "show", help="draw the cluster, a plan's timeline and link load, and a size sweep",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("cluster", help="cluster YAML file")
    show.add_argument("plan", nargs="?", help="schedule JSON (default: plan one with --algorithm)")
    show.add_argument("--algorithm", "-a", default=None,
                      help="planner used when no PLAN.json is given (default: the planner's default)")
    show.add_argument("--size", type=size_arg, default=256 << 20, metavar="SIZE",
                      help="allreduce message size, e.g. 256MiB (default 256MiB)")
    show.add_argument("--sizes", type=sizes_arg, default=None, metavar="RANGE",
                      help="sizes of the sweep, e.g. 1KiB:1GiB:4 (default 1KiB:1GiB:16)")
    show.add_argument("-o", "--output", default=None, metavar="PICTURE",
                      help="file of the cluster drawing; the other figures get -timeline, -links, "
                           "-sweep suffixes (default: CLUSTER file name with .png)")
    show.add_argument("--figures", type=_figures, default=list(DEFAULT_FIGURES), metavar="LIST",
                      help=f"comma-separated subset of {','.join(FIGURES)}, or all (default: "
                           f"{','.join(DEFAULT_FIGURES)}; the sweep plans and simulates every "
                           "planner at every size)")
    show.add_argument("--sweep-algorithms", type=lambda t: [a.strip() for a in t.split(",")],
                      default=None, metavar="LIST",
                      help="planners in the sweep (default: all but auto)")
    show.add_argument("--channels", type=positive_int, default=1, metavar="N",
                      help="plan on N independent channels (as topoplan plan --channels) "
                           "when no PLAN.json is given (default 1)")
    add_profile_argument(show, "the plans are made for and simulated under")
    show.add_argument("--color-by", choices=("bytes", "utilisation"), default="bytes",
                      help="colour the cluster's links by bytes carried or by utilisation "
                           "(bytes / bandwidth / predicted time); default bytes")
    show.add_argument("--top", type=int, default=8, metavar="K",
                      help="busiest links in the utilisation figure (default 8)")
    show.add_argument("--dpi", type=int, default=110, help="resolution of raster images (default 110)")
    show.add_argument("--force", action="store_true",
                      help="draw a PLAN.json made for another cluster (its recorded cluster "
                           "fingerprint differs)")
    show.add_argument("--json", action="store_true",
                      help="print one JSON object: the prediction and the files written")
    show.set_defaults(func=cmd_show)


def _set_text(group: tuple[int, ...], most: int = 8) -> str:
    """``{0,1,2,3}``; a long group as ``{0,8,16,...,1016} (128 ranks)``."""
    if len(group) <= most:
        return "{" + ",".join(map(str, group)) + "}"
    return "{" + ",".join(map(str, group[:3])) + f",...,{group[-1]}}} ({len(group)} ranks)"


def native_lines(schedule: Any, most: int = 12) -> list[str]:
    """The native collectives (IR v3) of ``schedule``, one line each, by step, such as
    ``step 0: reduce_scatter {0,1,2,3} chunks 0..7`` (the members' step, or ``steps
    2..5`` where they differ); past ``most`` lines, how many more."""
    from ..ir.matching import match_messages

    calls = sorted(match_messages(schedule, natives=True).calls,
                   key=lambda call: (min(call.local), call.steps[0]))
    lines = []
    for call in calls[:most]:
        op = call.op
        first, last = min(call.local), max(call.local)
        at = f"step {first}" if first == last else f"steps {first}..{last}"
        root = f" root {op.root}" if op.root is not None else ""
        lines.append(f"{at}: {op.kind.value} {_set_text(op.group)} {op.chunk_text()}{root}")
    if len(calls) > most:
        lines.append(f"... and {len(calls) - most} more")
    return lines


def channel_table(schedule: Any, width: int) -> tuple[Any, list[str]] | None:
    """A schedule's channels (IR v4), one row each: ops, messages, chunks, the share of
    the buffer and the most steps of the channel on a rank, as :func:`fit_table` fits
    them in ``width`` (with the headers left out); None for a schedule on one channel."""
    from ..viz.schedule_plots import channel_rows

    if schedule is None or schedule.nchannels < 2:
        return None
    rows = [[f"c{r['channel']}", str(r["ops"]), str(r["messages"]), str(r["chunks"]),
             f"{100 * r['share']:.1f}%", str(r["steps"])] for r in channel_rows(schedule)]
    return fit_table((Column("channel", "left"), Column("ops"), Column("msgs", drop=2),
                      Column("chunks", drop=1), Column("data"), Column("steps")), rows, width)


def output_paths(output: str | Path, figures: list[str], *,
                 named: bool = False) -> dict[str, Path]:
    """``picture.png`` -> {"cluster": picture.png, "timeline": picture-timeline.png, ...}.

    ``named``: the user named the file (``-o``); one figure is then written there, as
    asked, whichever it is (``--figures timeline -o t.png`` writes ``t.png``)."""
    output = Path(output)
    suffix = output.suffix or ".png"
    stem = output.with_suffix("") if output.suffix else output
    if named and len(figures) == 1:
        return {figures[0]: Path(f"{stem}{suffix}")}
    paths = {}
    for name in figures:
        paths[name] = Path(f"{stem}{suffix}") if name == "cluster" else Path(f"{stem}-{name}{suffix}")
    return paths


def cmd_show(args: argparse.Namespace) -> int:
    from .. import viz

    cluster = load_cluster(args.cluster)
    costs = get_profile(args.profile)
    out = console()
    output = args.output or f"{Path(args.cluster).stem}.png"
    paths = output_paths(output, args.figures, named=args.output is not None)
    if not paths["cluster" if "cluster" in paths else next(iter(paths))].parent.exists():
        raise TopoplanError(f"-o {output}: folder {Path(output).parent} does not exist")

    needs_report = any(name in paths for name in ("cluster", "timeline", "links"))
    summary: dict[str, Any] = {}
    report = None
    schedule = None
    if needs_report:
        doing = (f"simulating {args.plan}" if args.plan else
                 f"planning ({args.algorithm or 'auto'}) and simulating")
        with status(f"{doing} at {format_size(args.size)} ..."):
            if args.plan:
                from ..ir.parse import load_schedule

                schedule = load_schedule(args.plan)
                if schedule.nranks != cluster.nranks:
                    raise ScheduleError(f"{args.plan}: the schedule has {schedule.nranks} "
                                        f"ranks but {args.cluster} has {cluster.nranks}; plan "
                                        "it for this cluster")
                from ..ir.fingerprint import check_fingerprint
                check_fingerprint(schedule, cluster, plan=args.plan, cluster_file=args.cluster,
                                  force=args.force)
            else:
                try:
                    from ..planners import plan
                except ImportError as exc:  # a partial installation: say what is missing
                    raise TopoplanError(f"planning needs topoplan.planners ({exc}); pass a "
                                        "PLAN.json or --figures sweep-free") from None

                kwargs = {"size": args.size, "profile": costs}
                if args.channels != 1:
                    kwargs["channels"] = args.channels
                if args.algorithm:
                    kwargs["algorithm"] = args.algorithm
                schedule = plan(cluster, **kwargs)
            from ..analysis.sim import simulate

            report = simulate(cluster, schedule, args.size, profile=costs, record=True,
                              force=args.force)
            from ..analysis.bound import rsag_bound
        summary = {"algorithm": report.algorithm, "size_bytes": args.size,
                   "profile": costs.name, "time_s": report.time_s,
                   "lower_bound_s": report.lower_bound_s,
                   "x_bound": (report.time_s / report.lower_bound_s
                               if report.lower_bound_s > 0 else None),
                   "rsag_bound_s": rsag_bound(cluster, args.size)}
        summary["native_steps"] = native_lines(schedule, most=10 ** 9)
        assert schedule is not None  # planned or read above
        if schedule.nchannels > 1:
            from ..viz.schedule_plots import channel_rows
            summary["channels"] = channel_rows(schedule)
    if needs_report and not args.json:
        assert report is not None
        out.print(f"{cluster.name}: {report.algorithm or 'schedule'} at {format_size(args.size)}: "
                  f"{format_time(report.time_s)} predicted under cost profile {costs.name}")
        if report.lower_bound_s > 0:
            out.print(f"lower bound {format_time(report.lower_bound_s)} (the plan takes "
                      f"{report.time_s / report.lower_bound_s:.2f}x it); RS+AG cut bound "
                      f"{format_time(summary['rsag_bound_s'])}")
        table = channel_table(schedule, min(out.width, 80))
        if table is not None and schedule is not None:
            out.print(f"{plural(schedule.nchannels, 'channel')}, each a pipeline on its own data "
                      "(timeline marks: cK):")
            out.print(table[0])
            note = left_out_note(table[1], out.width)
            if note:
                out.print(note)
        lines = native_lines(schedule)
        if lines:
            out.print("native collective steps (drawn as one box over their group):",
                      soft_wrap=True)
            for line in lines:
                out.print(f"  {line}", soft_wrap=True)

    for name, path in paths.items():
        with status(f"drawing the {name} figure ..."):
            if name == "cluster":
                fig = viz.draw_cluster(cluster, report, color_by=args.color_by)
            elif name == "timeline":
                fig = viz.timeline(report, schedule)
            elif name == "links":
                fig = viz.link_utilisation(report, k=args.top, cluster=cluster)
            else:
                sizes = args.sizes or list(viz.sweep.DEFAULT_SIZES)
                try:
                    fig = viz.size_sweep(cluster, algorithms=args.sweep_algorithms, sizes=sizes,
                                         profile=costs)
                except ImportError as exc:
                    raise TopoplanError(f"the sweep needs topoplan.planners ({exc})") from None
                except ValueError as exc:  # an unknown planner name
                    raise TopoplanError(str(exc)) from None
            try:
                _save(fig, path, args.dpi)
            except (OSError, ValueError) as exc:  # unwritable path, unknown image format
                raise TopoplanError(f"cannot write {path}: {exc}") from None
        if not args.json:
            out.print(f"wrote {path}  ({name})", soft_wrap=True)
    if args.output and len(paths) > 1 and not args.json:
        # One file was named and several written: say where the others' names come from.
        others = ", ".join(f"-{name}" for name in paths if name != "cluster")
        out.print(f"{plural(len(paths), 'file')} from -o {args.output}: "
                  + ("the cluster drawing there, the other figures with " if "cluster" in paths
                     else "the figures with ")
                  + f"{others} before the extension; --figures {next(iter(paths))} writes "
                    f"{args.output} alone")
    if args.json:
        print(json.dumps({"cluster": cluster.name, "plan": args.plan, **summary,
                          "figures": {name: str(path) for name, path in paths.items()}}))
    return 0


def _save(fig: Any, path: str | Path, dpi: float) -> None:
    """Draw ``fig`` in memory in the format of ``path``'s extension, then write it whole
    (:func:`topoplan._util.atomic_write`): a failed drawing leaves no partial picture."""
    import io

    from .._util import atomic_write
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".").lower() or None, dpi=dpi)
    atomic_write(path, buffer.getvalue())
