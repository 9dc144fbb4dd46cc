"""Channels (IR v4) in ``topoplan show``: the per-channel table, the timeline's ``cK``
marks and ``--json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from topoplan.commands.show import channel_table
from topoplan.ir.schedule import build_schedule, recv, send
from topoplan.ir.passes import channelize, slices
from topoplan.viz.schedule_plots import channel_mark, channel_rows

from .support.schedules import ring_schedule

ROOT = Path(__file__).resolve().parents[1]


def test_channel_marks_are_short():
    assert channel_mark([]) == ""
    assert channel_mark([1]) == "c1"
    assert channel_mark([2, 0]) == "c0,c2"
    assert channel_mark([0, 1]) == "c0,c1"
    assert channel_mark([3, 0, 1, 2, 5, 7, 8, 9]) == "c0-3,c5,c7-9"


def test_channel_rows_count_each_channels_ops_data_and_steps():
    # channel 1 runs one step; channel 0 two steps on rank 0, one on rank 1
    schedule = build_schedule(2, [0.5, 0.25, 0.25], [
        [[send(1, 0), recv(1, 0, True), send(1, 1, channel=1), recv(1, 1, True, channel=1)],
         [send(1, 2)]],
        [[send(0, 0), recv(0, 0, True), send(0, 1, channel=1), recv(0, 1, True, channel=1),
          recv(0, 2)]]])
    assert channel_rows(schedule) == [
        {"channel": 0, "ops": 6, "messages": 3, "steps": 2, "chunks": 2, "share": 0.75},
        {"channel": 1, "ops": 4, "messages": 2, "steps": 1, "chunks": 1, "share": 0.25}]


def _lines(table) -> list[str]:
    console = Console(width=200, record=True, file=open(os.devnull, "w"))
    console.print(table)
    return console.export_text().splitlines()


def test_the_channel_table_fits_80_columns_and_is_absent_on_one_channel():
    assert channel_table(ring_schedule([0, 1, 2, 3]), 80) is None
    schedule = channelize(ring_schedule(list(range(8))), 32)
    table, left_out = channel_table(schedule, 80)
    lines = _lines(table)
    assert left_out == [] and max(map(len, lines)) <= 80
    assert lines[0].split() == ["channel", "ops", "msgs", "chunks", "data", "steps"]
    # 8 ranks x 14 steps x (a send and a recv) on each channel
    assert lines[2].split() == ["c0", "224", "112", "8", "3.1%", "14"]
    assert len(lines) == 2 + 32
    narrow, left_out = channel_table(schedule, 30)
    assert left_out and max(map(len, _lines(narrow))) <= 30


def _report(schedule, seconds):
    times = [[(seconds[s], seconds[s + 1]) for s in range(len(p.steps))] for p in schedule.ranks]
    return SimpleNamespace(step_times=times, time_s=seconds[-1], lower_bound_s=seconds[-1] / 2,
                           size=1 << 20, algorithm=schedule.algorithm, cluster="pair")


def test_the_timeline_marks_each_steps_channels():
    pytest.importorskip("matplotlib")
    from topoplan.viz import timeline

    plain = ring_schedule([0, 1])
    for schedule, mark in ((plain, None), (channelize(plain, 4), "c0-3")):
        fig = timeline(_report(schedule, [0.0, 1e-3, 2e-3]), schedule)
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert texts == ["\u21921" + (f" {mark}" if mark else "")] * 2 + \
            ["\u21920" + (f" {mark}" if mark else "")] * 2
        title = fig.axes[0].get_title()
        assert ("channels (cK)" in title) == (mark is not None)
        assert ("; 4 channels (cK)" in title) == (mark is not None)


def test_show_prints_the_channels_in_80_columns_and_in_json(tmp_path):
    pytest.importorskip("matplotlib")
    env = {**os.environ, "COLUMNS": "80"}
    cmd = [sys.executable, "-m", "topoplan", "show", "topologies/ddl_two_switch.yaml", "-a",
           "ring", "--channels", "3", "--size", "1MiB", "--figures", "timeline", "-o",
           str(tmp_path / "p.png")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("3 channels"))
    ours = lines[at:at + 6]  # the heading, the table's header, rule and 3 rows
    assert [line.split()[0] for line in ours[1:]] == ["channel", "─" * 40, "c0", "c1", "c2"]
    assert max(map(len, ours)) <= 80
    proc = subprocess.run(cmd + ["--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    data = json.loads(proc.stdout)
    assert [row["channel"] for row in data["channels"]] == [0, 1, 2]
    # the default slices: each 1.2 times the next (topoplan.planners.channels.SKEW)
    assert [row["share"] for row in data["channels"]] == pytest.approx(slices(3, 1.2))
