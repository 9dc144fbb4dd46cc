"""Figures of topoplan.viz: the expected axes, labels and artists, and no overlapping text."""

from __future__ import annotations

import json

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from topoplan.cluster import loads_cluster  # noqa: E402
from topoplan.viz import draw_cluster, link_utilisation, size_sweep, timeline  # noqa: E402
from topoplan.viz.topology import MAX_PER_ROW  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# 4 DGX-A100-like boxes of 8 GPUs: NVSwitch fabric, 4 NICs each, two leaves and a spine.
FOUR_BOXES = """
name: four-boxes
switches:
  - {name: "leaf{i}", count: 2}
  - name: spine
boxes:
  - name: "dgx{i}"
    count: 4
    gpus: 8
    fabric: {bandwidth: 300 GB/s, latency: 1 us}
    nics:
      - {switch: "leaf{i//2}", bandwidth: 200 Gbit/s, gpus: [0, 1]}
      - {switch: "leaf{i//2}", bandwidth: 200 Gbit/s, gpus: [2, 3]}
      - {switch: "leaf{i//2}", bandwidth: 200 Gbit/s, gpus: [4, 5]}
      - {switch: "leaf{i//2}", bandwidth: 200 Gbit/s, gpus: [6, 7]}
links:
  - {a: "leaf{i}", b: spine, count: 2, bandwidth: 400 Gbit/s}
"""

# 32 one-GPU boxes with long names: the hard case for box labels.
THIRTY_TWO_SINGLES = """
name: thirty-two-singles
switches:
  - {name: "tor{i}", count: 4}
  - name: core
boxes:
  - name: "worker{i}"
    count: 32
    gpus: 1
    nics: [{switch: "tor{i//8}", bandwidth: 25 Gbit/s}]
links:
  - {a: "tor{i}", b: core, count: 4, bandwidth: 100 Gbit/s}
"""

# One box, NVLink mesh only (DGX-1 hybrid cube mesh): arcs between GPUs of one row.
NVLINK_BOX = """
name: nvlink-box
boxes:
  - name: dgx1
    gpus: 8
    gpu_links:
""" + "".join(f"      - {{a: {a}, b: {b}, bandwidth: 25 GB/s}}\n" for a, b in [
    (0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 5), (2, 3), (2, 6), (3, 7), (4, 5),
    (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)])

LEAF_SPINE_1024 = """
name: leaf-spine-1024
switches:
  - {name: "leaf{i}", count: 16}
  - {name: "spine{i}", count: 4}
boxes:
  - name: "node{i}"
    count: 128
    gpus: 8
    fabric: {bandwidth: 300 GB/s, latency: 1 us}
    nics: [{switch: "leaf{i//8}", bandwidth: 200 Gbit/s}]
links:
  - {a: "leaf{i//4}", b: "spine{i%4}", count: 64, bandwidth: 400 Gbit/s}
"""


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def drawn_texts(fig: Figure) -> list:
    """(string, window bbox) of every non-empty text that a draw of ``fig`` renders."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    seen: dict[int, Text] = {}
    original = Text.draw

    def spy(self, rend):  # only artists their parents actually draw come through here
        if self.get_visible() and self.get_text().strip():
            seen[id(self)] = self
        return original(self, rend)

    Text.draw = spy
    try:
        fig.canvas.draw()
    finally:
        Text.draw = original
    return [(t.get_text(), t.get_window_extent(renderer)) for t in seen.values()]


def overlaps(fig: Figure, tolerance: float = 0.5) -> list[tuple[str, str]]:
    texts = drawn_texts(fig)
    bad = []
    for (ta, a), (tb, b) in itertools.combinations(texts, 2):
        if (min(a.x1, b.x1) - max(a.x0, b.x0) > tolerance
                and min(a.y1, b.y1) - max(a.y0, b.y0) > tolerance):
            bad.append((ta, tb))
    return bad


def cropped(fig: Figure, tolerance: float = 0.5) -> list[str]:
    """The drawn texts whose box reaches past the figure's edges (cut off when saved)."""
    box = fig.bbox
    return [text for text, ext in drawn_texts(fig)
            if ext.x0 < box.x0 - tolerance or ext.x1 > box.x1 + tolerance
            or ext.y0 < box.y0 - tolerance or ext.y1 > box.y1 + tolerance]


def texts_of(fig: Figure) -> set[str]:
    return {text for text, _bbox in drawn_texts(fig)}


def colorbar_label(fig: Figure) -> str:
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(labels) == 1, [ax.get_label() for ax in fig.axes]
    return labels[0]


def collection(fig: Figure, gid: str):
    found = [c for c in fig.axes[0].collections if c.get_gid() == gid]
    return found[0] if found else None


def need_planners():
    """The planners package, or a skip while it has not landed (mcf alone is not it)."""
    planners = pytest.importorskip("topoplan.planners")
    if not hasattr(planners, "PLANNERS"):
        pytest.skip("topoplan.planners has no PLANNERS registry yet")
    return planners


def ring_schedule(n: int):
    """A textbook ring allreduce (reduce-scatter then allgather), built by hand so these
    tests need the simulator but no planner."""
    from topoplan.ir.schedule import build_schedule, equal_chunks, recv, send

    steps = []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        mine = [[send(nxt, (r - s) % n), recv(prv, (r - s - 1) % n, reduce=True)]
                for s in range(n - 1)]
        mine += [[send(nxt, (r + 1 - s) % n), recv(prv, (r - s) % n)] for s in range(n - 1)]
        steps.append(mine)
    return build_schedule(n, equal_chunks(n), steps, algorithm="ring")


def simulated(cluster, size=64 << 20, record=True):
    simulate = pytest.importorskip("topoplan.analysis.sim").simulate
    from topoplan.ir.verify import verify

    schedule = ring_schedule(cluster.nranks)
    verify(schedule)
    return schedule, simulate(cluster, schedule, size, record=record, profile="ideal")


# --------------------------------------------------------------------------------------
# draw_cluster
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [FOUR_BOXES, THIRTY_TWO_SINGLES])
def test_cluster_32_gpus_every_rank_labelled_no_overlap(text):
    cluster = loads_cluster(text)
    fig = draw_cluster(cluster)
    assert isinstance(fig, Figure)
    shown = texts_of(fig)
    assert {str(r) for r in range(32)} <= shown, "every GPU shows its rank"
    assert {box.name for box in cluster.boxes} <= shown, "every box shows its name"
    assert set(cluster.switches) <= shown
    assert "bandwidth" in colorbar_label(fig) and "GB/s" in colorbar_label(fig)
    assert overlaps(fig) == []


def test_cluster_draws_every_link_once_by_level():
    cluster = loads_cluster(FOUR_BOXES)
    fig = draw_cluster(cluster)
    links = collection(fig, "links")
    undirected = {frozenset(e) for e in cluster.graph.edges}
    assert len(links.get_paths()) == len(undirected)
    # Colour by bandwidth without a report: the NVSwitch ports are the fastest links.
    assert max(links.get_array()) == pytest.approx(300.0)
    gpus = fig.axes[0].collections[[c.get_gid() for c in fig.axes[0].collections].index("gpus")]
    nics = fig.axes[0].collections[[c.get_gid() for c in fig.axes[0].collections].index("nics")]
    assert len(gpus.get_offsets()) == 32 and len(nics.get_offsets()) == 16
    # Levels: GPUs below NICs below switches.
    gpu_y = {y for _x, y in gpus.get_offsets()}
    nic_y = {y for _x, y in nics.get_offsets()}
    plates = [p for p in fig.axes[0].patches if p.get_gid() == "switch-plate"]
    assert len(plates) == 3
    assert max(gpu_y) < min(nic_y) < min(p.get_y() for p in plates)


def test_cluster_nvlink_mesh_is_drawn_as_straight_chords_of_a_ring():
    import numpy as np

    from topoplan.cluster import load_cluster

    cluster = load_cluster(ROOT / "topologies" / "dgx1_v100.yaml")  # hybrid cube mesh
    fig = draw_cluster(cluster)
    links = collection(fig, "links")
    assert len(links.get_paths()) == 16
    assert all(len(path.vertices) == 2 for path in links.get_paths()), "straight lines"
    gpus = collection(fig, "gpus").get_offsets()
    # No chord runs through a GPU other than its two ends.
    for path in links.get_paths():
        a, b = path.vertices
        for g in gpus:
            if np.allclose(g, a) or np.allclose(g, b):
                continue
            t = np.clip(np.dot(g - a, b - a) / np.dot(b - a, b - a), 0, 1)
            assert np.linalg.norm(a + t * (b - a) - g) > 0.2, (a, b, g)
    # The quads face each other: GPU j + 4 right below GPU j, so their links are vertical.
    for j in range(4):
        assert gpus[j][0] == pytest.approx(gpus[j + 4][0]) and gpus[j][1] > gpus[j + 4][1]
    # Double links (two NVLinks, 50 GB/s) are thicker than single ones.
    widths = sorted(set(np.round(links.get_linewidths(), 6)))
    assert len(widths) == 2 and widths[1] > widths[0]
    assert overlaps(fig) == [] and cropped(fig) == []


def test_cluster_links_between_row_neighbours_stay_in_the_row():
    # Links only between neighbours (a chain, or aws_p2_8xlarge's pairs) need no ring.
    chain = "".join(f"      - {{a: {j}, b: {j + 1}, bandwidth: 25 GB/s}}\n" for j in range(7))
    cluster = loads_cluster(NVLINK_BOX.split("    gpu_links:")[0] + "    gpu_links:\n" + chain)
    fig = draw_cluster(cluster)
    assert {y for _x, y in collection(fig, "gpus").get_offsets()} == {0.0}


def test_cluster_1024_gpus_is_bundled_and_readable():
    cluster = loads_cluster(LEAF_SPINE_1024)
    fig = draw_cluster(cluster)
    boxes = [p for p in fig.axes[0].patches if p.get_gid() == "box-plate"]
    assert 1 < len(boxes) <= MAX_PER_ROW
    shown = texts_of(fig)
    assert "node0..7\n8\u00d78 GPUs" in shown
    assert {f"leaf{i}" for i in range(16)} <= shown
    assert overlaps(fig) == []
    assert fig.get_size_inches()[0] <= 26


def test_cluster_with_report_colours_links_by_bytes_and_marks_the_cut():
    cluster = loads_cluster(FOUR_BOXES)
    _schedule, report = simulated(cluster, record=False)
    fig = draw_cluster(cluster, report)
    label = colorbar_label(fig)
    assert "data carried" in label and "iB" in label
    links = collection(fig, "links")
    top = max(report.link_bytes.values())
    unit = label[label.rindex("(") + 1:label.rindex(")")]
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    assert max(links.get_array()) == pytest.approx(top / scale, rel=1e-9)
    title = fig._suptitle.get_text()
    assert "ring" in title and "predicted" in title and "lower bound" in title
    pytest.importorskip("topoplan.analysis.bound")
    assert collection(fig, "bottleneck") is not None
    assert any("bottleneck cut" in t.get_text() for t in fig.legends[0].get_texts())
    assert overlaps(fig) == []


# --------------------------------------------------------------------------------------
# timeline, link utilisation, size sweep
# --------------------------------------------------------------------------------------

def test_timeline_one_bar_per_step_labelled_with_peers():
    cluster = loads_cluster(FOUR_BOXES)
    schedule, report = simulated(cluster)
    fig = timeline(report, schedule)
    ax = fig.axes[0]
    bars = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_gid() == "steps"]
    assert len(bars) == 1
    assert len(bars[0].get_paths()) == sum(len(steps) for steps in report.step_times)
    assert ax.get_xlabel().startswith("time (") and ax.get_ylabel() == "rank"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("lower bound") for t in legend)
    assert any(t.startswith("predicted") for t in legend)
    # Coloured by what each step does: a ring reduces for n-1 steps, then copies.
    assert "receives and adds (reduce)" in legend and "receives finished chunks (copy)" in legend
    assert overlaps(fig) == []


def test_timeline_of_many_steps_numbers_them_on_top_and_colours_the_phases():
    from topoplan.viz.schedule_plots import STEP_KINDS

    cluster = loads_cluster(THIRTY_TWO_SINGLES)
    schedule, report = simulated(cluster, size=1 << 20)  # 62 steps
    fig = timeline(report, schedule)
    ax = fig.axes[0]
    (top,) = [child for child in ax.child_axes]
    steps = [int(t.get_text()) for t in top.get_xticklabels()]
    assert 3 <= len(steps) <= 12 and steps[0] == 0 and steps == sorted(steps)
    assert "step" in top.get_xlabel()
    bars = collection(fig, "steps")
    colours = {tuple(c) for c in bars.get_facecolors()}
    assert len(colours) == 2  # reduce-scatter, then allgather
    assert STEP_KINDS["reduce"][0] in [t.get_text() for t in fig.legends[0].get_texts()]
    assert overlaps(fig) == [] and cropped(fig) == []


def test_link_utilisation_strips_for_the_busiest_links():
    cluster = loads_cluster(FOUR_BOXES)
    _schedule, report = simulated(cluster)
    fig = link_utilisation(report, k=5, cluster=cluster)
    strips = [ax for ax in fig.axes if ax.collections]
    assert len(strips) == 5
    assert strips[-1].get_xlabel().startswith("time (")
    assert "utilisation" in fig._supylabel.get_text()
    names = [t.get_text() for ax in strips for t in ax.texts]
    shown = [tuple(name.split("   ")[0].split(" \u2192 ")) for name in names]
    assert shown == [edge for edge, _busy, _bytes in report.busiest_links(5)]
    assert overlaps(fig) == []


def test_link_utilisation_needs_a_recorded_report():
    cluster = loads_cluster(FOUR_BOXES)
    _schedule, report = simulated(cluster, record=False)
    with pytest.raises(ValueError, match="record=True"):
        link_utilisation(report)


def test_size_sweep_lines_per_planner_and_lower_bound():
    planners = need_planners()
    pytest.importorskip("topoplan.analysis.bound")
    cluster = loads_cluster(FOUR_BOXES)
    algorithms = [a for a in ("ring", "tree") if a in planners.PLANNERS]
    fig = size_sweep(cluster, algorithms=algorithms, sizes=[1 << 12, 1 << 20, 1 << 26])
    ax_alg, ax_bus = fig.axes
    for ax in (ax_alg, ax_bus):
        assert ax.get_xscale() == "log" and ax.get_xlabel() == "message size"
        assert "GB/s" in ax.get_ylabel()
        labels = [line.get_label() for line in ax.get_lines()]
        names = [label.split(" (same as")[0] for label in labels]
        assert names == [*algorithms, "lower bound (best possible)"]
    # No schedule beats the bound.
    bound = ax_alg.get_lines()[-1].get_ydata()
    for line in ax_alg.get_lines()[:-1]:
        assert all(y <= b * (1 + 1e-9) for y, b in zip(line.get_ydata(), bound))
    assert overlaps(fig) == []


def test_size_sweep_plans_and_simulates_under_the_profile():
    need_planners()
    from topoplan.viz.sweep import sweep_rows
    cluster = loads_cluster(FOUR_BOXES)
    times = {}
    for profile in ("ideal", "nccl"):
        rows, failed = sweep_rows(cluster, ["ring"], [1 << 20], profile=profile)
        assert not failed and len(rows) == 1
        times[profile] = rows[0]["time_s"]
    assert times["ideal"] < times["nccl"]
    fig = size_sweep(cluster, algorithms=["ring"], sizes=[1 << 20], profile="ideal")
    assert "cost profile ideal" in fig.texts[0].get_text()


def test_missing_matplotlib_names_the_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["matplotlib"] = None
        import topoplan
        from topoplan.cluster import load_cluster
        cluster = load_cluster("topologies/ddl_two_switch.yaml")
        try:
            topoplan.viz.draw_cluster(cluster)
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert "pip install 'topoplan[viz]'" in out


def test_overlap_check_can_fail():
    from topoplan.viz._common import new_figure

    fig = new_figure(4, 3)
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, "hello")
    ax.text(0.52, 0.5, "world")
    ax.text(0.1, 0.1, "apart")
    assert overlaps(fig) == [("hello", "world")]


# --------------------------------------------------------------------------------------
# topoplan show
# --------------------------------------------------------------------------------------

def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_show_output_names():
    from topoplan.commands.show import output_paths

    paths = output_paths("out/pic.svg", ["cluster", "timeline", "links", "sweep"])
    assert {k: str(v) for k, v in paths.items()} == {
        "cluster": "out/pic.svg", "timeline": "out/pic-timeline.svg",
        "links": "out/pic-links.svg", "sweep": "out/pic-sweep.svg"}
    assert str(output_paths("pic", ["timeline"])["timeline"]) == "pic-timeline.png"


def test_show_json_has_the_prediction_and_the_files(tmp_path):
    need_planners()
    out = tmp_path / "ddl.png"
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", "--algorithm", "ring",
                   "--size", "1MiB", "--figures", "cluster,timeline", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["figures"] == {"cluster": str(out), "timeline": str(tmp_path / "ddl-timeline.png")}
    assert (data["algorithm"], data["size_bytes"], data["profile"]) == ("ring", 1 << 20, "nccl")
    assert data["x_bound"] == pytest.approx(data["time_s"] / data["lower_bound_s"])
    assert out.exists() and (tmp_path / "ddl-timeline.png").exists()


def test_show_writes_every_figure(tmp_path):
    need_planners()
    pytest.importorskip("topoplan.analysis.sim")
    out = tmp_path / "ddl.png"
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", "--algorithm", "ring",
                   "--size", "64MiB", "--figures", "all", "--sizes", "4KiB,1MiB,64MiB",
                   "--sweep-algorithms", "ring,hierarchical", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "predicted" in proc.stdout and "lower bound" in proc.stdout
    for suffix in ("", "-timeline", "-links", "-sweep"):
        path = tmp_path / f"ddl{suffix}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        assert str(path) in proc.stdout


def test_show_writes_one_figure_where_told_and_says_what_it_wrote(tmp_path, capsys):
    """``-o t.png`` with one figure writes t.png (not t-timeline.png); with several, each
    file is printed and a line says where the names beside -o come from."""
    need_planners()
    from topoplan.cli import main

    one = tmp_path / "t.png"
    assert main(["show", str(ROOT / "topologies" / "ddl_two_switch.yaml"), "-a", "ring", "--size", "1MiB",
                 "--figures", "timeline", "-o", str(one)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]
    assert f"wrote {one}  (timeline)" in capsys.readouterr().out
    several = tmp_path / "x.png"
    assert main(["show", str(ROOT / "topologies" / "ddl_two_switch.yaml"), "-a", "ring", "--size", "1MiB",
                 "--figures", "cluster,links", "-o", str(several)]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.png", "x-links.png", "x.png"]
    assert f"wrote {several}  (cluster)" in out and f"wrote {tmp_path / 'x-links.png'}" in out
    assert (f"2 files from -o {several}: the cluster drawing there, the other figures with "
            f"-links before the extension; --figures cluster writes {several} alone"
            ) in " ".join(out.split())


def test_show_draws_a_saved_plan(tmp_path):
    pytest.importorskip("topoplan.analysis.sim")
    ring_schedule(4).save(tmp_path / "plan.json")  # ddl_two_switch has 4 ranks
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", str(tmp_path / "plan.json"),
                   "--figures", "cluster,timeline", "-o", str(tmp_path / "p.svg"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "p.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "p-timeline.svg").exists() and not (tmp_path / "p-sweep.svg").exists()


def test_show_user_errors_are_one_line(tmp_path):
    from topoplan.ir.schedule import build_schedule, recv, send

    two = build_schedule(2, [1.0], [[[send(1, 0), recv(1, 0, reduce=True)]],
                                    [[send(0, 0), recv(0, 0, reduce=True)]]])
    two.save(tmp_path / "two.json")
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", str(tmp_path / "two.json"),
                   "-o", str(tmp_path / "x.png"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("topoplan: error:") and "2 ranks" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", "-o", str(tmp_path / "no/x.png"))
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    proc = run_cli("show", "topologies/ddl_two_switch.yaml", "--figures", "cluster,pie")
    assert proc.returncode == 2 and "pie" in proc.stderr


def test_cluster_coloured_by_utilisation():
    cluster = loads_cluster(FOUR_BOXES)
    _schedule, report = simulated(cluster, record=False)
    fig = draw_cluster(cluster, report, color_by="utilisation")
    assert "% of bandwidth" in colorbar_label(fig)
    links = collection(fig, "links")
    top = max(100 * b / cluster.graph.edges[e]["bandwidth"] / report.time_s
              for e, b in report.link_bytes.items())
    assert max(links.get_array()) == pytest.approx(top)
    assert links.norm.vmax == pytest.approx(max(100.0, top))
    with pytest.raises(ValueError, match="color_by"):
        draw_cluster(cluster, report, color_by="colour")


@pytest.mark.parametrize("path", sorted((ROOT / "topologies").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_topology_draws_without_overlap(path):
    from topoplan.cluster import load_cluster

    cluster = load_cluster(path)
    fig = draw_cluster(cluster)
    assert overlaps(fig) == []
    shown = texts_of(fig)
    if cluster.nranks <= 64:
        assert {str(r) for r in range(cluster.nranks)} <= shown


SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_topology_keeps_its_texts_inside_the_figure(path):
    """Title, subtitle, legend and labels of the cluster picture, with a simulated run
    (the longest title), lie inside the figure: nothing is cut off when saved."""
    from topoplan.cluster import load_cluster

    planners = need_planners()
    simulate = pytest.importorskip("topoplan.analysis.sim").simulate
    cluster = load_cluster(path)
    report = None
    if cluster.nranks <= 256:  # planning the 1024-GPU cluster takes longer than the check
        size = 256 << 20
        schedule = planners.plan(cluster, algorithm="hierarchical", size=size)
        report = simulate(cluster, schedule, size, profile="ideal")
    fig = draw_cluster(cluster, report)
    assert cropped(fig) == []
    assert overlaps(fig) == []


def test_a_title_wider_than_the_figure_is_wrapped_not_cut():
    cluster = loads_cluster(NVLINK_BOX)
    title = "a title far wider than this figure " * 6
    fig = draw_cluster(cluster, title=title.strip())
    assert cropped(fig) == []
    assert fig._suptitle.get_text().count("\n") >= 1


def test_timeline_keeps_its_texts_inside_the_figure():
    cluster = loads_cluster(FOUR_BOXES)
    schedule, report = simulated(cluster)
    fig = timeline(report, schedule)
    assert cropped(fig) == []


def test_cropping_check_can_fail():
    from topoplan.viz._common import new_figure

    fig = new_figure(3, 2)
    fig.text(0.98, 0.5, "runs off the right edge")
    fig.text(0.5, 0.5, "inside")
    assert cropped(fig) == ["runs off the right edge"]


def test_timeline_samples_ranks_beyond_the_limit():
    from topoplan.viz.schedule_plots import MAX_RANKS_SHOWN, _shown_ranks

    assert _shown_ranks(8) == list(range(8))
    ranks = _shown_ranks(1024)
    assert len(ranks) == MAX_RANKS_SHOWN and ranks[0] == 0 and ranks[-1] == 1023
