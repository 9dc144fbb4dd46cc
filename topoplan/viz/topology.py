"""The cluster drawn by level, every link coloured by the data a schedule puts on it.

Switches sit on top (the tiers found by distance from the switches NICs plug into),
boxes below them as grey groups with their NICs, in-box fabric and GPUs, GPUs at the
bottom labelled with their rank. A box whose direct GPU links skip over GPUs of the row
(a DGX-1's NVLink hybrid cube mesh) puts its GPUs on a ring, links as straight chords. Beyond :data:`DETAIL_MAX_GPUS` GPUs a box becomes
one node, and beyond :data:`MAX_PER_ROW` nodes in a row neighbours merge into bundles
(``node0..node7``), so a 1024-GPU cluster still reads as a picture, not as ink.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..cluster import Box, Cluster
from ..units import format_bandwidth, format_size, format_time, plural
from ._common import (byte_unit, edge_name, fit_text, fitted_legend, keep_titles_inside,
                      matplotlib, new_figure, renderer)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["draw_cluster", "COLOR_BY", "DETAIL_MAX_GPUS", "DETAIL_MAX_BOXES", "MAX_PER_ROW"]

DETAIL_MAX_GPUS = 64  # beyond this, boxes are drawn as one node each
DETAIL_MAX_BOXES = 32
MAX_PER_ROW = 32  # beyond this, neighbouring boxes (or switches of one tier) are bundled

_GPU_COLOR = "#4c72b0"
_NIC_COLOR = "#55a868"
_FABRIC_COLOR = "#8172b2"
_SWITCH_COLOR = "#dd8452"
_BOX_FILL = "#f2f2f2"
_CUT_COLOR = "#1f9bd7"
_IDLE_COLOR = "#c8c8c8"


@dataclass
class _Node:
    key: str
    kind: str  # gpu | nic | fabric | switch | box (a box or bundle drawn as one node)
    x: float
    y: float
    label: str = ""
    on_ring: bool = False  # a GPU of a box drawn as a ring: its direct links are chords


@dataclass
class _Layout:
    detail: bool
    nodes: dict[str, _Node] = field(default_factory=dict)
    of: dict[str, str] = field(default_factory=dict)  # graph node -> drawn node
    groups: list[tuple[str, float, float, float, float]] = field(default_factory=list)
    pitch: float = 1.0  # x distance between neighbouring switches of the widest tier
    xmin: float = 0.0
    xmax: float = 0.0
    ymin: float = 0.0
    ymax: float = 0.0
    label_y: float = 0.0  # where box names hang (detail view)
    widths: dict[str, float] = field(default_factory=dict)  # label room per node, in x units


def _on_a_ring(box: Box) -> bool:
    """Whether the box's GPUs go on a ring: direct links that skip over GPUs of the row.

    In a row such links must bend around the GPUs between their ends, and a mesh of
    them (a DGX-1's hybrid cube mesh) becomes a tangle of arcs; on a ring every link
    is a straight chord that passes through no GPU.
    """
    return box.gpus >= 4 and any(abs(link.a - link.b) > 1 for link in box.gpu_links)


def _ring_positions(n: int, cx: float, rx: float, ry: float) -> list[tuple[float, float]]:
    """GPU positions on an ellipse centred at (cx, 0), GPU 0 at the top left.

    With an even count the first half runs left to right along the top and the second
    half along the bottom, GPU ``j + n/2`` right below GPU ``j``: the two quads of a
    hybrid cube mesh face each other, and the links between them are vertical.
    """
    if n % 2 == 0:
        half = n // 2
        top = [math.pi - (i + 0.5) * math.pi / half for i in range(half)]
        angles = top + [-a for a in top]
    else:
        angles = [math.pi - (i + 0.5) * 2 * math.pi / n for i in range(n)]
    return [(cx + rx * math.cos(a), ry * math.sin(a)) for a in angles]


def _detail_layout(cluster: Cluster) -> _Layout:
    lay = _Layout(detail=True)
    has_fabric = any(box.fabric is not None for box in cluster.boxes)
    has_nics = any(box.nics for box in cluster.boxes)
    rings = [_on_a_ring(box) for box in cluster.boxes]
    # A ring's top GPUs sit at y = 0 with the other boxes' rows; it hangs below.
    ring_ry = max((0.27 * (box.gpus - 1) for box, ring in zip(cluster.boxes, rings) if ring),
                  default=0.0)
    lift = 0.85 * ring_ry  # centre below the row: top GPUs near y = 0
    y_fabric, y_nic = 0.9, (1.8 if has_fabric else 1.1)
    arc = max((_arc_height(abs(link.a - link.b)) / 2
               for box, ring in zip(cluster.boxes, rings) if not ring
               for link in box.gpu_links), default=0.0)
    bottom = min(-0.55 - arc, -lift - ring_ry - 0.55) if ring_ry else -0.55 - arc
    top = (y_nic if has_nics else y_fabric if has_fabric else 0.0) + 0.5
    x = 0.0
    for box, ring in zip(cluster.boxes, rings):
        xs = [x + j for j in range(box.gpus)]
        if ring:
            rx = 0.5 * (box.gpus - 1)
            spots = [(gx, gy - lift) for gx, gy in
                     _ring_positions(box.gpus, float(np.mean(xs)), rx, ring_ry)]
        else:
            spots = [(gx, 0.0) for gx in xs]
        for j, (gx, gy) in enumerate(spots):
            key = box.gpu_node(j)
            lay.nodes[key] = _Node(key, "gpu", gx, gy, str(box.first_rank + j), on_ring=ring)
        if box.fabric is not None:
            lay.nodes[box.fabric_node] = _Node(box.fabric_node, "fabric", float(np.mean(xs)),
                                               y_fabric)
        for k, nx_ in enumerate(_nic_xs(box, [gx for gx, _gy in spots])):
            key = box.nic_node(k)
            lay.nodes[key] = _Node(key, "nic", nx_, y_nic)
        lay.groups.append((box.name, xs[0] - 0.45, xs[-1] + 0.45, bottom, top))
        x = xs[-1] + 1.6
    for key in lay.nodes:
        lay.of[key] = key
    lay.xmin, lay.xmax = -0.6, x - 1.0
    lay.ymin, lay.label_y = bottom - 0.75, bottom - 0.12
    return lay


def _nic_xs(box: Box, xs: list[float]) -> list[float]:
    """NICs above the GPUs they serve; spread evenly when that would stack them."""
    want = [float(np.mean([xs[g] for g in nic.gpus])) for nic in box.nics]
    if len({round(w, 3) for w in want}) == len(want):
        return want
    if len(want) == 1:
        return want
    lo, hi = min(xs), max(xs)  # a ring's GPUs are not in x order
    return list(np.linspace(lo - 0.3, hi + 0.3, len(want))) if len(xs) == 1 else \
        list(np.linspace(lo, hi, len(want)))


def _bundles(items: list, limit: int) -> list[list]:
    """Split ``items`` into at most ``limit`` contiguous runs of near-equal length."""
    if len(items) <= limit:
        return [[item] for item in items]
    return [list(part) for part in np.array_split(np.array(items, dtype=object), limit)]


def _span(first: str, last: str) -> str:
    # "node0..node7" reads as "node0..7" when the names share a prefix.
    common = 0
    while common < min(len(first), len(last)) and first[common] == last[common]:
        common += 1
    while common and first[common - 1].isdigit():
        common -= 1
    return f"{first}..{last[common:]}" if common else f"{first}..{last}"


def _box_layout(cluster: Cluster) -> _Layout:
    lay = _Layout(detail=False)
    # Runs of consecutive interchangeable boxes: (template, switches, signature) -> members.
    runs: list[tuple[tuple, list[int]]] = []
    for b, box in enumerate(cluster.boxes):
        run_key = (box.template, frozenset(nic.switch for nic in box.nics), box.signature())
        if runs and runs[-1][0] == run_key:
            runs[-1][1].append(b)
        else:
            runs.append((run_key, [b]))
    units: list[list[int]] = [members for _key, members in runs]
    if len(units) > MAX_PER_ROW:
        units = [sum(part, []) for part in _bundles(units, MAX_PER_ROW)]
    for i, members in enumerate(units):
        boxes = [cluster.boxes[b] for b in members]
        gpus = sum(box.gpus for box in boxes)
        if len(boxes) == 1:
            label, key = f"{boxes[0].name}\n{plural(gpus, 'GPU')}", boxes[0].name
        else:
            per = {box.gpus for box in boxes}
            count = (f"{len(boxes)}\u00d7{plural(per.pop(), 'GPU')}" if len(per) == 1
                     else plural(gpus, "GPU"))
            label, key = f"{_span(boxes[0].name, boxes[-1].name)}\n{count}", \
                f"{boxes[0].name}..{boxes[-1].name}"
        lay.nodes[key] = _Node(key, "box", float(i), 0.0, label)
        lay.widths[key] = 0.92
        for box in boxes:
            for j in range(box.gpus):
                lay.of[box.gpu_node(j)] = key
            for k in range(len(box.nics)):
                lay.of[box.nic_node(k)] = key
            if box.fabric is not None:
                lay.of[box.fabric_node] = key
    lay.xmin, lay.xmax = -0.6, len(units) - 0.4
    lay.ymin = lay.label_y = -0.8
    return lay


def _place_switches(cluster: Cluster, lay: _Layout) -> None:
    """Tiers by hop distance from the switches NICs plug into; ordered by barycentre."""
    import networkx as nx

    graph = cluster.graph
    switches = list(cluster.switches)
    if not switches:
        lay.ymax = max(node.y for node in lay.nodes.values()) + 0.9
        return
    sw_graph = nx.Graph()
    sw_graph.add_nodes_from(switches)
    sw_graph.add_edges_from((link.a, link.b) for link in cluster.links)
    leaves = {nic.switch for box in cluster.boxes for nic in box.nics}
    tier: dict[str, int] = {sw: 0 for sw in switches}
    if leaves:
        dist = nx.multi_source_dijkstra_path_length(sw_graph, leaves)
        tier.update({sw: int(d) for sw, d in dist.items()})
    base = max([g[4] for g in lay.groups] + [node.y + 0.4 for node in lay.nodes.values()])
    width = lay.xmax - lay.xmin
    pitch = width
    for t in range(max(tier.values()) + 1):
        row = [sw for sw in switches if tier[sw] == t]
        if not row:
            continue

        def barycentre(sw: str) -> float:
            xs = [lay.nodes[lay.of[n]].x for n in graph.predecessors(sw) if n in lay.of]
            return float(np.mean(xs)) if xs else math.inf

        row.sort(key=lambda sw: (barycentre(sw), switches.index(sw)))
        y = base + 1.3 + 1.4 * t
        parts = _bundles(row, MAX_PER_ROW)
        step = width / len(parts)
        pitch = min(pitch, step)
        for i, part in enumerate(parts):
            if len(part) == 1:
                key, label = part[0], part[0]
            else:
                key = f"{part[0]}..{part[-1]}"
                label = f"{_span(part[0], part[-1])}\n{len(part)} switches"
            lay.nodes[key] = _Node(key, "switch", lay.xmin + (i + 0.5) * step, y, label)
            lay.widths[key] = step * 0.9
            for sw in part:
                lay.of[sw] = key
        lay.ymax = y + 0.7
    lay.pitch = pitch


def _arc_height(dx: float) -> float:
    return 0.35 + 0.16 * dx


def _edge_points(a: _Node, b: _Node) -> np.ndarray:
    if abs(a.y - b.y) > 1e-9 or (a.on_ring and b.on_ring):
        return np.array([[a.x, a.y], [b.x, b.y]])
    # Same row: a quadratic arc, below the GPUs and above the switches, so it does not
    # run through the nodes between its ends.
    sign = -1.0 if a.kind in ("gpu", "box") else 1.0
    h = _arc_height(abs(a.x - b.x)) * sign
    t = np.linspace(0.0, 1.0, 16)[:, None]
    p0, p2 = np.array([a.x, a.y]), np.array([b.x, b.y])
    p1 = (p0 + p2) / 2 + np.array([0.0, h])
    return (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t**2 * p2


def _bottleneck_edges(cluster: Cluster) -> tuple[Any, set[tuple[str, str]]]:
    try:
        from ..analysis.bound import bottleneck
    except ImportError:
        return None, set()
    cut = bottleneck(cluster)
    inside = cut.nodes  # graph node names (GPU nodes included), never bare ranks
    edges = {(u, v) for u, v in cluster.graph.edges if u in inside and v not in inside}
    return cut, edges


COLOR_BY = ("bytes", "utilisation")


def draw_cluster(cluster: Cluster, report: Any = None, *, color_by: str = "bytes",
                 title: str | None = None, show_cut: bool = True) -> Figure:
    """Draw ``cluster`` by level, each link coloured and sized by the data on it.

    Parameters
    ----------
    cluster
        The cluster to draw.
    report
        A :class:`topoplan.simulate.SimReport`. Each link is coloured and widened by
        the bytes the simulated schedule put on it (the busier of its two directions;
        for bundled links, the busiest link of the bundle); links it left idle are
        thin and grey. Without a report, links are coloured by their bandwidth.
    color_by
        ``"bytes"`` (default) or ``"utilisation"``: the link's bytes over its
        bandwidth, as a percentage of the predicted time. Utilisation puts fat NVLink
        or NVSwitch ports carrying a lot and thin NICs carrying a little on one
        scale: the link nearest 100% is the one that sets the time.
    title
        Replaces the default title (cluster name, algorithm, size, predicted time).
    show_cut
        Mark the links of the RS+AG bottleneck cut (:func:`topoplan.analysis.bound.bottleneck`)
        with a blue halo.

    Returns
    -------
    matplotlib.figure.Figure
        One axes with the drawing and a colorbar with units.

    Raises
    ------
    ValueError
        ``color_by`` is not one of :data:`COLOR_BY`.

    Notes
    -----
    Up to :data:`DETAIL_MAX_GPUS` GPUs (and :data:`DETAIL_MAX_BOXES` boxes) every GPU,
    NIC and in-box fabric is drawn; beyond that a box is one node and neighbouring
    boxes with the same NIC switches bundle into one node, at most
    :data:`MAX_PER_ROW` per row. Labels that cannot fit their room shrink, and
    disappear rather than overlap.
    """
    if color_by not in COLOR_BY:
        raise ValueError(f"color_by must be one of {COLOR_BY}, got {color_by!r}")
    mpl = matplotlib()
    from matplotlib.collections import LineCollection
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyBboxPatch

    detail = cluster.nranks <= DETAIL_MAX_GPUS and len(cluster.boxes) <= DETAIL_MAX_BOXES
    lay = _detail_layout(cluster) if detail else _box_layout(cluster)
    _place_switches(cluster, lay)
    xspan, yspan = lay.xmax - lay.xmin, lay.ymax - lay.ymin
    slot_in = 0.32 if detail else 1.0
    width = min(26.0, max(8.0, 1.8 + xspan * slot_in))
    height = min(10.0, max(4.8, 1.9 + yspan * 0.62))
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_xlim(lay.xmin, lay.xmax)
    ax.set_ylim(lay.ymin, lay.ymax)

    # ---- links: one value per drawn (undirected) link ------------------------------
    link_bytes: Mapping = (getattr(report, "link_bytes", None) or {}) if report is not None else {}
    graph = cluster.graph
    value: dict[tuple[str, str], float] = defaultdict(float)
    bundle_bw: dict[tuple[str, str], float] = defaultdict(float)
    for u, v, data in graph.edges(data=True):
        a, b = lay.of[u], lay.of[v]
        if a == b:
            continue
        key = (a, b) if a <= b else (b, a)
        if report is None:
            amount = data["bandwidth"]
        elif color_by == "utilisation":
            amount = (100.0 * float(link_bytes.get((u, v), 0.0)) / data["bandwidth"]
                      / max(report.time_s, 1e-300))
        else:
            amount = float(link_bytes.get((u, v), 0.0))
        value[key] = max(value[key], amount)
        bundle_bw[key] = max(bundle_bw[key], data["bandwidth"])
    keys = sorted(value)
    vmax = max(value.values(), default=0.0)
    if report is not None and color_by == "utilisation":
        vmax = max(vmax, 100.0)  # an absolute scale: 100% is a saturated link
    what = "busiest link of a bundle" if not lay.detail else "busier direction"
    if report is not None and color_by == "utilisation":
        unit, scale = "%", 1.0
        cbar_label = f"link utilisation over the run, {what} (% of bandwidth)"
    elif report is not None:
        unit, scale = byte_unit(vmax)
        cbar_label = f"data carried per link, {what} ({unit})"
    else:
        unit, scale = "GB/s", 1e9
        cbar_label = "link bandwidth per direction (GB/s)"
    base = mpl.colormaps["YlOrRd"]
    cmap = ListedColormap(base(np.linspace(0.28, 1.0, 256)))
    norm = Normalize(0.0, max(vmax / scale, 1e-12))
    used = [k for k in keys if value[k] > 0]
    idle = [k for k in keys if value[k] <= 0]
    segments = [_edge_points(lay.nodes[a], lay.nodes[b]) for a, b in used]
    widths = [1.0 + 4.0 * value[k] / vmax for k in used] if vmax > 0 else []
    links = LineCollection(segments, cmap=cmap, norm=norm, linewidths=widths, zorder=2,
                           capstyle="round")
    links.set_array(np.array([value[k] / scale for k in used]))
    links.set_gid("links")
    ax.add_collection(links)
    if idle:
        idle_lc = LineCollection([_edge_points(lay.nodes[a], lay.nodes[b]) for a, b in idle],
                                 colors=_IDLE_COLOR, linewidths=0.8, linestyles=(0, (3, 2)),
                                 zorder=1)
        idle_lc.set_gid("idle-links")
        ax.add_collection(idle_lc)
    cbar = fig.colorbar(links, ax=ax, fraction=0.025, pad=0.01, shrink=0.85)
    cbar.set_label(cbar_label)

    handles = []
    cut, cut_edges = _bottleneck_edges(cluster) if show_cut else (None, set())
    cut_keys = sorted({tuple(sorted((lay.of[u], lay.of[v]))) for u, v in cut_edges
                       if lay.of[u] != lay.of[v]})
    if cut is not None and cut_keys:  # cut_keys non-empty implies a cut
        halo_w = [8.0 + (4.0 * value[k] / vmax if vmax > 0 and k in value else 0) for k in cut_keys]
        halo = LineCollection([_edge_points(lay.nodes[a], lay.nodes[b]) for a, b in cut_keys],
                              colors=_CUT_COLOR, alpha=0.35, linewidths=halo_w, zorder=1.5,
                              capstyle="round")
        halo.set_gid("bottleneck")
        ax.add_collection(halo)
        handles.append(Line2D([], [], color=_CUT_COLOR, alpha=0.5, lw=7,
                              label=f"bottleneck cut: {cut}"))

    # ---- boxes, nodes ----------------------------------------------------------------
    for name, x0, x1, y0, y1 in lay.groups:
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.2",
                                    facecolor=_BOX_FILL, edgecolor="#9a9a9a", lw=0.8, zorder=0))
    ax_w_px = ax.get_position().width * width * fig.dpi  # before layout; refined below
    slot_pt = ax_w_px / xspan * 72 / fig.dpi
    gpu_d = max(5.0, min(17.0, slot_pt * 0.8))
    by_kind: dict[str, list[_Node]] = defaultdict(list)
    for node in lay.nodes.values():
        by_kind[node.kind].append(node)
    if by_kind["gpu"]:
        ax.scatter([n.x for n in by_kind["gpu"]], [n.y for n in by_kind["gpu"]], s=gpu_d**2,
                   marker="o", color=_GPU_COLOR, edgecolor="white", lw=0.6, zorder=4, gid="gpus")
        handles.append(Line2D([], [], ls="", marker="o", ms=8, color=_GPU_COLOR,
                              label="GPU (rank)"))
    if by_kind["nic"]:
        ax.scatter([n.x for n in by_kind["nic"]], [n.y for n in by_kind["nic"]],
                   s=(gpu_d * 0.6) ** 2, marker="s", color=_NIC_COLOR, zorder=4, gid="nics")
        handles.append(Line2D([], [], ls="", marker="s", ms=6, color=_NIC_COLOR, label="NIC"))
    if by_kind["fabric"]:
        ax.scatter([n.x for n in by_kind["fabric"]], [n.y for n in by_kind["fabric"]],
                   s=(gpu_d * 0.8) ** 2, marker="D", color=_FABRIC_COLOR, zorder=4, gid="fabrics")
        handles.append(Line2D([], [], ls="", marker="D", ms=6, color=_FABRIC_COLOR,
                              label="in-box fabric (NVSwitch / PCIe switch)"))
    if by_kind["switch"]:
        handles.append(Line2D([], [], ls="", marker="s", ms=9, color=_SWITCH_COLOR,
                              label="network switch"))
    if by_kind["box"]:
        handles.append(Line2D([], [], ls="", marker="s", ms=9, color=_GPU_COLOR,
                              label="box (or bundle of boxes)"))
    if idle:
        handles.append(Line2D([], [], color=_IDLE_COLOR, lw=1, ls=(0, (3, 2)),
                              label="link left idle" if report is not None else "link"))

    texts: list[tuple[Any, float]] = []  # (text, room in x units)
    for node in by_kind["gpu"]:
        t = ax.text(node.x, node.y, node.label, ha="center", va="center", color="white",
                    fontsize=min(8.0, gpu_d * 0.5), fontweight="bold", zorder=5)
        texts.append((t, 0.8))
    plates = []  # switch and box nodes: a plate sized to its label, drawn after fitting
    for node in by_kind["switch"] + by_kind["box"]:
        t = ax.text(node.x, node.y, node.label, ha="center", va="center", fontsize=8.5,
                    color="white" if node.kind == "box" else "black", zorder=5,
                    linespacing=1.1)
        room = lay.widths.get(node.key, 0.9) - 0.12
        texts.append((t, room))
        plates.append((node, t, room))
    box_labels = []
    for name, x0, x1, y0, _y1 in lay.groups:
        t = ax.text((x0 + x1) / 2, lay.label_y, name, ha="center", va="top", fontsize=8.5,
                    color="#333333", zorder=5)
        box_labels.append(t)
        texts.append((t, x1 - x0))

    # ---- titles and legend -----------------------------------------------------------
    if title is None:
        boxes = len(cluster.boxes)
        title = f"{cluster.name}: {plural(cluster.nranks, 'GPU')} in {plural(boxes, 'box')}"
        if report is not None:
            eff = report.lower_bound_s / report.time_s if report.time_s > 0 else 0.0
            title += (f" \u2014 {report.algorithm}, {format_size(report.size)}: "
                      f"{format_time(report.time_s)} predicted, lower bound "
                      f"{format_time(report.lower_bound_s)} ({eff:.0%})")
    fig.suptitle(title, fontsize=11)
    loads = {e: b / graph.edges[e]["bandwidth"] for e, b in link_bytes.items()
             if b > 0 and graph.has_edge(*e)}
    if loads and report.time_s > 0:
        # "Most loaded" by transfer time at full rate (bytes / bandwidth): the link
        # that would cap the run; seconds busy alone ranks a trickle like a torrent.
        top = max(loads, key=lambda e: (loads[e], e))
        ax.set_title(f"most loaded link {edge_name(top)}: {format_size(link_bytes[top])} at "
                     f"{format_bandwidth(graph.edges[top]['bandwidth'])} = "
                     f"{format_time(loads[top])}, {loads[top] / report.time_s:.0%} of the run",
                     fontsize=9, color="#444444")
    fitted_legend(fig, handles, ncol=6, fontsize=8.5)
    keep_titles_inside(fig)

    # Fit labels to their room once the layout has fixed the axes' size; the labels
    # stay out of the layout so shrinking them cannot move the axes again.
    for t, _room in texts:
        t.set_in_layout(False)
    fig.draw_without_rendering()
    rend = renderer(fig)
    px_per_x = ax.transData.transform((1.0, 0.0))[0] - ax.transData.transform((0.0, 0.0))[0]
    for t, room in texts:
        fit_text(t, room * px_per_x, rend)
    # One size per row of like labels (ranks, box names, each tier of switches): a
    # row of mixed sizes reads as mixed importance.
    rows: dict[tuple, list] = defaultdict(list)
    for t, _room in texts:
        rows[(t.get_color(), round(t.get_position()[1], 6))].append(t)
    for row in rows.values():
        shown = [t.get_fontsize() for t in row if t.get_visible()]
        if shown:
            for t in row:
                if t.get_visible():
                    t.set_fontsize(min(shown))
    if box_labels and min(float(t.get_fontsize()) if t.get_visible() else 0.0
                           for t in box_labels) < 6.5:
        # Narrow boxes (one GPU each): hang their names vertically below them and let
        # the layout make room, rather than shrink them into specks.
        for t in box_labels:
            t.set(visible=True, rotation=90, fontsize=7.5, in_layout=True)
        fig.draw_without_rendering()
        rend = renderer(fig)
    _draw_plates(ax, plates, rend)
    return fig


def _draw_plates(ax: Any, plates: list, rend: Any) -> None:
    """Rounded plates behind switch and box labels, as wide as the fitted label."""
    from matplotlib.patches import FancyBboxPatch

    inv = ax.transData.inverted()
    for node, t, room in plates:
        if t.get_visible():
            ext = t.get_window_extent(rend)
            (x0, y0), (x1, y1) = inv.transform([[ext.x0, ext.y0], [ext.x1, ext.y1]])
            w, h = (x1 - x0) + 0.18, (y1 - y0) * 1.5
        else:  # no room even for the smallest label: the plate alone marks the node
            w = room
            h = abs(inv.transform([[0, 0], [0, 14]])[1][1] - inv.transform([[0, 0], [0, 0]])[0][1])
        color = _SWITCH_COLOR if node.kind == "switch" else _GPU_COLOR
        ax.add_patch(FancyBboxPatch((node.x - w / 2, node.y - h / 2), w, h,
                                    boxstyle="round,pad=0,rounding_size=0.06", fc=color,
                                    ec="none", zorder=4, gid=f"{node.kind}-plate"))
