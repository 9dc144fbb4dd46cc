"""Native steps (IR v3) in ``topoplan show``: the timeline's boxes and the text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import native_programs as N
from tests.test_schedule_native import two_boxes
from topoplan.commands.show import native_lines
from topoplan.errors import ScheduleError

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


# ---- the text of topoplan show -------------------------------------------------------

def test_native_lines_name_each_collective_with_its_group_and_chunks():
    assert native_lines(two_boxes()) == [
        "step 0: reduce_scatter {0,1} chunks 0..3", "step 0: reduce_scatter {2,3} chunks 0..3",
        "step 2: allgather {0,1} chunks 0..3", "step 2: allgather {2,3} chunks 0..3"]


def test_native_lines_of_rooted_ops_steps_apart_and_many_of_them():
    lines = native_lines(N.rooted([[0, 1, 2], [3, 4]]))
    assert lines[:2] == ["step 0: reduce {0,1,2} chunks 0..3 root 0",
                         "step 0: reduce {3,4} chunks 0..3 root 3"]
    # the roots' allreduce is their step 1; the others broadcast at their step 1, the
    # roots at step 2
    assert "step 1: allreduce {0,3} chunks 0..3" in lines
    assert "steps 1..2: broadcast {0,1,2} chunks 0..3 root 0" in lines
    many = native_lines(N.rails(16, 1), most=4)
    assert len(many) == 5 and many[-1] == "... and 29 more"
    assert native_lines(N.rails(1, 16))[0] == (
        "step 0: reduce_scatter {0,1,2,...,15} (16 ranks) chunks 0..15")


def test_no_lines_without_native_steps():
    from topoplan.ir.schedule import build_schedule, recv, send

    assert native_lines(build_schedule(2, [1.0], [[[send(1, 0), recv(1, 0, True)]],
                                                  [[send(0, 0), recv(0, 0, True)]]])) == []


# ---- the timeline --------------------------------------------------------------------

def _report(schedule, seconds: list[float]) -> SimpleNamespace:
    """What :func:`topoplan.viz.timeline` reads of a simulation: step ``s`` of every rank
    runs from ``seconds[s]`` to ``seconds[s + 1]``."""
    times = [[(seconds[s], seconds[s + 1]) for s in range(len(p.steps))] for p in schedule.ranks]
    return SimpleNamespace(step_times=times, time_s=seconds[-1], lower_bound_s=seconds[-1] / 2,
                           size=1 << 20, algorithm=schedule.algorithm, cluster="boxes")


def test_the_timeline_draws_one_box_over_each_native_collective():
    pytest.importorskip("matplotlib")
    from tests.test_viz import collection, cropped, overlaps
    from topoplan.viz import timeline
    from topoplan.viz.schedule_plots import STEP_KINDS

    schedule = two_boxes()
    fig = timeline(_report(schedule, [0.0, 1e-3, 3e-3, 4e-3]), schedule)
    boxes = collection(fig, "native")
    assert len(boxes.get_paths()) == 4  # two collectives in each box, one box each
    first = boxes.get_paths()[0].vertices
    # rows 0 and 1 (ranks 0 and 1), from the first start to the last end (in ms)
    assert first[:, 0].min() == pytest.approx(0.0) and first[:, 0].max() == pytest.approx(1.0)
    assert first[:, 1].min() == pytest.approx(-0.42) and first[:, 1].max() == pytest.approx(1.42)
    assert len(collection(fig, "steps").get_paths()) == 4  # the messages' steps alone
    labels = [t.get_text() for t in fig.axes[0].texts
              if t.get_gid() == "native-label" and t.get_visible()]
    assert labels == ["reduce_scatter 0..3", "allgather 0..3"] * 2
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert STEP_KINDS["native"][0] in legend
    assert overlaps(fig) == [] and cropped(fig) == []


def test_a_group_of_rows_apart_gets_a_box_per_run_joined():
    pytest.importorskip("matplotlib")
    from tests.test_viz import collection
    from topoplan.viz import timeline

    schedule = N.rails(2, 2)  # rails {0, 2} and {1, 3}: rows apart
    fig = timeline(_report(schedule, [0.0, 1e-3, 2e-3, 3e-3]), schedule)
    # 2 box reduce-scatters, 2 rail allreduces of 2 runs each, 2 box allgathers
    assert len(collection(fig, "native").get_paths()) == 2 + 2 * 2 + 2
    assert len(collection(fig, "native-joins").get_segments()) == 2


def test_a_narrow_box_gets_the_short_label():
    pytest.importorskip("matplotlib")
    from topoplan.viz import timeline

    schedule = two_boxes()
    fig = timeline(_report(schedule, [0.0, 0.15e-3, 3.85e-3, 4e-3]), schedule)
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "native-label"]
    assert labels == ["RS 0..3", "AG 0..3"] * 2


def test_topoplan_show_lists_and_draws_native_steps(tmp_path):
    """Through the command, once the simulator prices native steps."""
    pytest.importorskip("matplotlib")
    from topoplan.analysis.sim import simulate
    from topoplan.cluster import loads_cluster
    from tests.support.clusters import flat_cluster_yaml

    cluster_file = tmp_path / "boxes.yaml"
    cluster_file.write_text(flat_cluster_yaml(4, 2))
    try:
        simulate(loads_cluster(cluster_file.read_text()), two_boxes(), 1 << 20)
    except ScheduleError as exc:
        if "native" not in str(exc):
            raise
        pytest.skip(f"the simulator does not price native steps here: {exc}")
    plan = tmp_path / "composed.json"
    two_boxes().save(plan)
    out = tmp_path / "pic.png"
    done = _cli("show", str(cluster_file), str(plan), "--figures", "timeline", "-o", str(out),
                "--size", "1MiB")
    assert done.returncode == 0, done.stderr
    assert "  step 0: reduce_scatter {0,1} chunks 0..3" in done.stdout
    assert out.stat().st_size > 0  # one figure: the file -o names
