"""Plots of one simulated run: a per-rank Gantt chart and link utilisation over time."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from ..cluster import Cluster
from ..ir.schedule import Native, NativeKind, OpKind, Schedule
from ..units import format_bandwidth, format_size, format_time, plural
from ._common import (edge_name, fit_text, fitted_legend, keep_titles_inside, matplotlib,
                      new_figure, renderer, time_unit)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["timeline", "link_utilisation", "native_label", "channel_mark", "channel_rows",
           "MAX_RANKS_SHOWN", "STEP_KINDS"]

MAX_RANKS_SHOWN = 64  # a Gantt chart of more ranks is drawn for an even sample of them


def _send_peers(report: Any, schedule: Schedule | None) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> the peers it sends to, from recorded transfers or the schedule."""
    peers: dict[tuple[int, int], set[int]] = defaultdict(set)
    transfers = getattr(report, "transfers", None)
    if transfers:
        for t in transfers:
            peers[(t.src, t.src_step)].add(t.dst)
    else:
        schedule = schedule if schedule is not None else getattr(report, "schedule", None)
        if schedule is not None:
            for program in schedule.ranks:
                for s, step in enumerate(program.steps):
                    for op in step:
                        if op.kind is OpKind.SEND:
                            peers[(program.rank, s)].add(op.peer)
    return {key: sorted(value) for key, value in peers.items()}


# What a step does, from its ops; the colour of its bar.
STEP_KINDS = {
    "reduce": ("receives and adds (reduce)", "#4c72b0"),
    "both": ("receives, adds some and copies some", "#8172b2"),
    "copy": ("receives finished chunks (copy)", "#55a868"),
    "send": ("only sends", "#c9a227"),
    "native": ("native collective over a group (one box spans its ranks)", "#dd8452"),
    "step": ("step", "#4c72b0"),  # the schedule is unknown
}

_SHORT = {NativeKind.ALLREDUCE: "AR", NativeKind.REDUCE_SCATTER: "RS",
          NativeKind.ALLGATHER: "AG", NativeKind.BROADCAST: "BC", NativeKind.REDUCE: "R"}


def native_label(op: Native, short: bool = False) -> str:
    """A native step's label: ``reduce_scatter 0..7`` (``RS 0..7`` when short), the
    chunk range it covers, and its root for a broadcast or a reduce (``@2``)."""
    chunks = str(op.chunk) if op.count == 1 else f"{op.chunk}..{op.end - 1}"
    root = f" @{op.root}" if op.root is not None else ""
    return f"{_SHORT[op.kind] if short else op.kind.value} {chunks}{root}"


def channel_mark(channels: Any) -> str:
    """The channels (IR v4) of a step's ops as a short mark: ``c1``, ``c0,c2``, ``c0-3``
    (a run of three or more), ``""`` for none."""
    chans = sorted(set(channels))
    parts: list[str] = []
    i = 0
    while i < len(chans):
        j = i
        while j + 1 < len(chans) and chans[j + 1] == chans[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"c{chans[i]}-{chans[j]}")
        else:
            parts.extend(f"c{c}" for c in chans[i:j + 1])
        i = j + 1
    return ",".join(parts)


def channel_rows(schedule: Schedule) -> list[dict[str, Any]]:
    """Per channel (IR v4) of ``schedule``: ``channel``, ``ops``, ``messages``,
    ``chunks`` (that its ops touch), ``share`` (of the buffer, in those chunks) and
    ``steps`` (the most steps of that channel on any rank). One row without channels."""
    n = schedule.nchannels
    ops, messages, steps = [0] * n, [0] * n, [0] * n
    chunks: list[set[int]] = [set() for _ in range(n)]
    for _, _, op in schedule.ops():
        ops[op.channel] += 1
        if not isinstance(op, Native) and op.kind is OpKind.SEND:
            messages[op.channel] += 1
        for a, c in op.ranges if not isinstance(op, Native) else ((op.chunk, op.count),):
            chunks[op.channel].update(range(a, a + c))
    for rank in range(schedule.nranks):
        for c, of_channel in schedule.channel_steps(rank).items():
            steps[c] = max(steps[c], len(of_channel))
    return [{"channel": c, "ops": ops[c], "messages": messages[c], "steps": steps[c],
             "chunks": len(chunks[c]), "share": sum(schedule.chunks[k] for k in chunks[c])}
            for c in range(n)]


def _step_channels(schedule: Schedule | None) -> dict[tuple[int, int], str]:
    """(rank, step) -> :func:`channel_mark` of its ops, for a schedule on several
    channels (empty otherwise)."""
    if schedule is None or schedule.nchannels < 2:
        return {}
    return {(program.rank, s): channel_mark(op.channel for op in step)
            for program in schedule.ranks for s, step in enumerate(program.steps) if step}


def _step_kinds(report: Any, schedule: Schedule | None) -> dict[tuple[int, int], str]:
    """(rank, step) -> a key of :data:`STEP_KINDS`; empty without the schedule."""
    schedule = schedule if schedule is not None else getattr(report, "schedule", None)
    kinds: dict[tuple[int, int], str] = {}
    if schedule is None:
        return kinds
    for program in schedule.ranks:
        for s, step in enumerate(program.steps):
            if step and isinstance(step[0], Native):
                kinds[(program.rank, s)] = "native"
                continue
            recvs = [op for op in step if op.kind is OpKind.RECV]
            adds = any(op.reduce for op in recvs)
            copies = any(not op.reduce for op in recvs)
            kinds[(program.rank, s)] = ("both" if adds and copies else "reduce" if adds
                                        else "copy" if copies else "send")
    return kinds


def _step_ticks(first_start: list[float], horizon: float, most: int = 12) -> list[int]:
    """Steps to mark on the top axis: every k-th (k a round number), none crowded."""
    n = len(first_start)
    k = next(k for k in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, n)
             if k > 0 and n / k <= most)
    ticks: list[int] = []
    for s in range(0, n, k):
        if not ticks or first_start[s] - first_start[ticks[-1]] >= horizon / (2.5 * most):
            ticks.append(s)
    return ticks


def _shown_ranks(nranks: int) -> list[int]:
    if nranks <= MAX_RANKS_SHOWN:
        return list(range(nranks))
    return sorted({int(r) for r in np.linspace(0, nranks - 1, MAX_RANKS_SHOWN)})


def timeline(report: Any, schedule: Schedule | None = None) -> Figure:
    """A Gantt chart of a simulated schedule: one row per rank, one bar per step.

    Parameters
    ----------
    report
        A :class:`topoplan.simulate.SimReport`; its ``step_times[rank][step]`` gives
        each bar's ``(start, end)`` in seconds.
    schedule
        The simulated schedule, to colour each bar by what the step does (adds what
        it receives, copies it, or only sends) and to label wide bars with the ranks
        they send to (``\u21925``) and, on a schedule of several channels (IR v4), the
        channels of the step's ops (``\u21925 c0-3``, :func:`channel_mark`). A native collective (IR v3) is one box over the
        rows of its group, from its first member's start to its last member's end,
        labelled with its kind and chunks (``reduce_scatter 0..7``, or ``RS 0..7`` where
        that does not fit). Without it (and without ``report.schedule``) the bars are
        one colour.

    Returns
    -------
    matplotlib.figure.Figure
        One axes: time on x (with its unit), rank on y (rank 0 on top), bars coloured
        by kind of step (legend), the lower bound and the predicted time as lines. The
        top axis numbers the steps (a tick where a step first starts on any rank;
        every k-th step when there are many). Gaps between bars are a rank waiting
        for its peers. Beyond :data:`MAX_RANKS_SHOWN` ranks an even sample of rows is
        drawn.
    """
    matplotlib()
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    step_times = report.step_times
    nranks = len(step_times)
    ranks = _shown_ranks(nranks)
    nsteps = max((len(steps) for steps in step_times), default=0)
    end = max((e for steps in step_times for _s, e in steps), default=report.time_s)
    horizon = max(end, report.time_s, report.lower_bound_s, 1e-12)
    unit, scale = time_unit(horizon)
    peers = _send_peers(report, schedule)
    kinds = _step_kinds(report, schedule)
    schedule = schedule if schedule is not None else getattr(report, "schedule", None)
    chan_marks = _step_channels(schedule)

    height = min(12.0, max(3.6, 1.7 + 0.24 * len(ranks)))
    fig = new_figure(11.0, height)
    ax = fig.add_subplot()
    boxes, colours, labels = [], [], []
    used: dict[str, None] = {}  # kinds present, in drawing order
    for row, rank in enumerate(ranks):
        for s, (start, stop) in enumerate(step_times[rank]):
            if kinds.get((rank, s)) == "native":
                continue  # drawn below, one box over the group
            x0, x1 = start / scale, stop / scale
            boxes.append([(x0, row - 0.38), (x1, row - 0.38), (x1, row + 0.38), (x0, row + 0.38)])
            kind = kinds.get((rank, s), "step")
            used[kind] = None
            colours.append(STEP_KINDS[kind][1])
            to = peers.get((rank, s))
            mark = chan_marks.get((rank, s), "")
            if to or mark:
                text = ("\u2192" + (",".join(map(str, to)) if len(to) <= 3 else
                                     f"{len(to)} peers") if to else "")
                text = f"{text} {mark}".strip()
                labels.append(((x0 + x1) / 2, row, text, x1 - x0, colours[-1]))
    bars = PolyCollection(boxes, facecolors=colours, edgecolors="white", linewidths=0.3)
    bars.set_gid("steps")
    ax.add_collection(bars)
    native_labels = _draw_natives(ax, report, schedule, ranks, scale)
    if native_labels:
        used["native"] = None
    ax.set_xlim(0, horizon / scale * 1.02)
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("rank")
    if len(ranks) <= 40:
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    else:
        ticks = list(range(0, len(ranks), max(1, len(ranks) // 16)))
        ax.set_yticks(ticks, [str(ranks[i]) for i in ticks])
    if nsteps:
        first = [min((steps[s][0] for steps in step_times if len(steps) > s), default=0.0)
                 / scale for s in range(nsteps)]
        top = ax.secondary_xaxis("top")
        marks = _step_ticks(first, horizon / scale)
        top.set_xticks([first[s] for s in marks], [str(s) for s in marks], fontsize=8)
        top.set_xlabel(f"step (tick: where it first starts; {plural(nsteps, 'step')})",
                       fontsize=9)
    lines = [ax.axvline(report.lower_bound_s / scale, color="black", ls="--", lw=1.2,
                        label=f"lower bound {format_time(report.lower_bound_s)}"),
             ax.axvline(report.time_s / scale, color="#c44e52", ls="-", lw=1.2,
                        label=f"predicted {format_time(report.time_s)}")]
    handles = [Patch(color=colour, label=label) for k, (label, colour) in STEP_KINDS.items()
               if k in used] + lines
    algorithm = getattr(report, "algorithm", "") or "schedule"
    shown = "" if len(ranks) == nranks else f" (showing {len(ranks)} of {nranks} ranks)"
    ax.set_title(f"{algorithm} on {_cluster_name(report)}, "
                 f"{format_size(report.size)}: each bar is one step{shown}"
                 + ("; labels name the ranks it sends to" if peers else "")
                 + (f"; {plural(schedule.nchannels, 'channel')} (cK)"
                    if chan_marks and schedule is not None else ""), fontsize=10)
    fitted_legend(fig, handles, ncol=len(handles), fontsize=8.5)
    keep_titles_inside(fig)

    # Label bars that are wide enough; measure once the layout fixed the axes size.
    fig.draw_without_rendering()
    rend = renderer(fig)
    px_per_x = ax.transData.transform((1.0, 0.0))[0] - ax.transData.transform((0.0, 0.0))[0]
    px_per_pt = fig.dpi / 72
    to_rgb = matplotlib().colors.to_rgb
    for x, y, text, w, colour in labels:
        room = w * px_per_x - 3
        if room < 0.6 * 5.0 * len(text) * px_per_pt:  # cannot fit even at the smallest size
            continue
        r, g, b = to_rgb(colour)
        ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"
        t = ax.text(x, y, text, ha="center", va="center", fontsize=7, color=ink, clip_on=True)
        t.set_in_layout(False)
        fit_text(t, room, rend, min_size=5.0)
    for nx, ny, texts, width in native_labels:  # the full label, else the short one
        room = width * px_per_x - 3
        for text in texts:
            t = ax.text(nx, ny, text, ha="center", va="center", fontsize=7.5, color="black",
                        clip_on=True, gid="native-label")
            t.set_in_layout(False)
            if fit_text(t, room, rend, min_size=5.0):
                break
            t.remove()
    return fig


def _draw_natives(ax: Any, report: Any, schedule: Schedule | None, ranks: list[int],
                  scale: float) -> list[tuple[float, float, tuple[str, str], float]]:
    """Draw each native collective (IR v3) as one box over the rows of its group, from
    the first member's start to the last member's end (a group whose shown rows are not
    adjacent gets a box per run of rows, joined by a dashed line). Returns the labels
    to place once the layout is fixed: ``(x, y, (label, short label), width)``."""
    from matplotlib.collections import LineCollection, PolyCollection

    schedule = schedule if schedule is not None else getattr(report, "schedule", None)
    if schedule is None:
        return []
    from ..ir.matching import match_messages

    calls = match_messages(schedule, natives=True).calls
    if not calls:
        return []
    step_times = report.step_times
    row_of = {rank: row for row, rank in enumerate(ranks)}
    boxes: list[list[tuple[float, float]]] = []
    joins: list[list[tuple[float, float]]] = []
    labels: list[tuple[float, float, tuple[str, str], float]] = []
    for call in calls:
        times = [step_times[m][s] for m, s in zip(call.group, call.local)
                 if s < len(step_times[m])]
        rows = sorted(row_of[m] for m in call.group if m in row_of)
        if not times or not rows:
            continue
        x0, x1 = min(t[0] for t in times) / scale, max(t[1] for t in times) / scale
        runs: list[list[int]] = []
        for row in rows:
            if runs and row == runs[-1][1] + 1:
                runs[-1][1] = row
            else:
                runs.append([row, row])
        for lo, hi in runs:
            boxes.append([(x0, lo - 0.42), (x1, lo - 0.42), (x1, hi + 0.42), (x0, hi + 0.42)])
        # Joins near the left edge, clear of the label in the middle, and apart from
        # those of other calls at the same time (rails cross each other's rows).
        x = x0 + (0.03 + 0.03 * (len(joins) % 4)) * (x1 - x0)
        for (_, hi), (lo, _) in zip(runs, runs[1:]):
            joins.append([(x, hi + 0.42), (x, lo - 0.42)])
        lo, hi = max(runs, key=lambda run: run[1] - run[0])
        labels.append(((x0 + x1) / 2, (lo + hi) / 2,
                       (native_label(call.op), native_label(call.op, short=True)), x1 - x0))
    colour = STEP_KINDS["native"][1]
    natives = PolyCollection(boxes, facecolors=colour, edgecolors="#8c3d10", linewidths=0.6)
    natives.set_gid("native")
    ax.add_collection(natives)
    if joins:
        lines = LineCollection(joins, colors="#8c3d10", linewidths=0.8, linestyles="dashed")
        lines.set_gid("native-joins")
        ax.add_collection(lines)
    return labels


def _cluster_name(report: Any) -> str:
    cluster = getattr(report, "cluster", "")
    return str(getattr(cluster, "name", cluster))


def link_utilisation(report: Any, k: int = 8, cluster: Cluster | None = None) -> Figure:
    """Utilisation over time of the ``k`` busiest links, one strip per link.

    Parameters
    ----------
    report
        A :class:`topoplan.simulate.SimReport` made with ``record=True``: its
        ``link_timeline[edge]`` holds ``(time, rate)`` steps in seconds and bytes/s.
    k
        How many links, busiest first (by total busy time).
    cluster
        The simulated cluster, for link bandwidths: with it the strips show the rate as
        a percentage of each link's bandwidth; without it (a report only names its
        cluster), in GB/s.

    Returns
    -------
    matplotlib.figure.Figure
        ``k`` strips sharing the time axis; each fills the rate over time and names
        the link, its bandwidth and how much of the run it was busy.

    Raises
    ------
    ValueError
        The report carries no timeline (simulate with ``record=True``), or ``k < 1``.
    """
    matplotlib()
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    link_timeline = getattr(report, "link_timeline", None)
    if not link_timeline and not any(report.link_bytes.values()):
        fig = new_figure(6.0, 2.0)  # e.g. one rank: no link carries anything
        fig.text(0.5, 0.5, "no link carries data in this schedule", ha="center", va="center")
        return fig
    if not link_timeline:
        raise ValueError("link_utilisation needs the per-link timeline: simulate with "
                         "record=True, e.g. topoplan.simulate(cluster, schedule, size, "
                         "record=True)")
    if cluster is None and isinstance(getattr(report, "cluster", None), Cluster):
        cluster = report.cluster
    graph = cluster.graph if cluster is not None else None
    busy = report.link_busy_s
    nbytes = report.link_bytes
    if graph is not None:
        # Busiest = most transfer time at full rate (bytes / bandwidth); seconds busy
        # alone would rank a trickle on a fat link with the bottleneck.
        def rank(e: tuple[str, str]) -> tuple:
            return (-nbytes.get(e, 0.0) / graph.edges[e]["bandwidth"], -busy.get(e, 0.0), e)
    else:  # SimReport.busiest_links' order
        def rank(e: tuple[str, str]) -> tuple:
            return (-busy.get(e, 0.0), -nbytes.get(e, 0.0), e)
    edges = sorted(link_timeline, key=rank)[:k]
    horizon = max(report.time_s, 1e-12)
    unit, scale = time_unit(horizon)
    peak = max((r for e in edges for _t, r in link_timeline[e]), default=0.0)
    fig = new_figure(11.0, min(14.0, 1.3 + 0.75 * len(edges)))
    axes = fig.subplots(len(edges), 1, sharex=True, squeeze=False)[:, 0]
    for ax, edge in zip(axes, edges):
        points = list(link_timeline[edge])
        times = np.array([t for t, _r in points] + [report.time_s]) / scale
        rate = np.array([r for _t, r in points] + [points[-1][1] if points else 0.0])
        if graph is not None:
            bandwidth = graph.edges[edge]["bandwidth"]
            util, top = 100.0 * rate / bandwidth, 100.0
            ax.set_yticks([0, 50, 100], ["0", "50", "100%"], fontsize=7.5)
            what = f"{format_bandwidth(bandwidth)}; "
        else:
            util, top = rate / 1e9, max(peak / 1e9, 1e-9)
            ax.tick_params(axis="y", labelsize=7.5)
            what = ""
        ax.fill_between(times, util, step="post", color="#dd8452", alpha=0.85, lw=0,
                        gid="utilisation")
        ax.step(times, util, where="post", color="#8c3d10", lw=0.5)
        ax.set_ylim(0, top * 1.09)
        ax.set_xlim(0, horizon / scale)
        ax.grid(axis="x", alpha=0.3)
        if graph is not None and report.time_s > 0:
            mean = nbytes.get(edge, 0.0) / bandwidth / report.time_s
            what += f"carried {format_size(nbytes.get(edge, 0.0))}, mean utilisation {mean:.0%}"
        else:
            share = busy.get(edge, 0.0) / report.time_s if report.time_s > 0 else 0.0
            what += f"carried {format_size(nbytes.get(edge, 0.0))}, busy {share:.0%} of the run"
        ax.text(0.005, 0.93, f"{edge_name(edge)}   {what}", transform=ax.transAxes,
                ha="left", va="top", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
    axes[-1].set_xlabel(f"time ({unit})")
    fig.supylabel("utilisation (% of link bandwidth)" if graph is not None else
                  "rate on the link (GB/s)", fontsize=9)
    algorithm = getattr(report, "algorithm", "") or "schedule"
    fig.suptitle(f"The {len(edges)} busiest links: {algorithm} on "
                 f"{_cluster_name(report)}, {format_size(report.size)}",
                 fontsize=10)
    return fig
