"""``topoplan topo show|lint``: readable output for every shipped topology, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.clusters import ROOT, topology_path
from tests.support.clusters import SHIPPED as SHIPPED_NAMES
from tests.support.tables import read_table, widest_line
from topoplan.cli import main
from topoplan.cluster import load_cluster
from topoplan.units import format_bandwidth

SHIPPED = [topology_path(name) for name in SHIPPED_NAMES]


def run_cli(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=60, env=env)


def test_lint_accepts_every_shipped_topology(capsys):
    assert main(["topo", "lint", *map(str, SHIPPED)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SHIPPED)
    assert all(": ok: " in line for line in lines)
    assert any("leaf-spine-1024, 1024 ranks in 128 boxes, 20 switches" in line for line in lines)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_show_is_readable_in_80_columns(path):
    result = run_cli("topo", "show", str(path), columns=80)
    out = result.stdout
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "Boxes" in out and "bisection" in out and " ranks in " in out
    assert widest_line(out) <= 80 and "…" not in out
    facts = json.loads(run_cli("topo", "show", str(path), "--json").stdout)
    rows = read_table(out)
    assert len(rows) == len(facts["boxes"])
    for row, group in zip(rows, facts["boxes"]):
        assert row["box"] == group["boxes"]
        assert row.get("count", str(group["count"])) == str(group["count"])
        assert row["ranks"] == f"{group['first_rank']}..{group['last_rank']}"
        assert row["GPUs"] == str(group["gpus"])
        for column, key in (("in-box per GPU", "in_box_per_gpu_Bps"),
                            ("injection per box", "injection_Bps")):
            assert row[column] == (format_bandwidth(group[key]) if group[key] else "-")
        assert row["NICs"] == (" + ".join(f"{n['count']} x {format_bandwidth(n['bandwidth_Bps'])}"
                                          for n in group["nics"]) or "-")
    bisection = next(line for line in out.splitlines() if line.startswith("bisection"))
    assert bisection.rstrip().endswith(format_bandwidth(facts["bandwidth"]["bisection_Bps"]))
    cluster = load_cluster(path)
    assert facts["nranks"] == cluster.nranks and len(facts["links"]) == len(cluster.links)


def test_show_stacks_mixed_nics_rather_than_clip_them(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(BARE.replace("bandwidth: 25,", "bandwidth: 200 Gbit/s,"))
    out = run_cli("topo", "show", str(path), columns=60).stdout
    assert widest_line(out) <= 60 and "…" not in out
    lines = out.splitlines()
    at = next(k for k, line in enumerate(lines) if "2 x 12.5 GB/s" in line)
    assert lines[at + 1].strip().endswith("+ 1 x 25 GB/s")


@pytest.mark.parametrize("name, ranks, bisection", [
    ("dgx1_v100", 8, "150 GB/s"),            # links 0-4, 1-5 (x2) and 2-6, 3-7 (x1)
    ("ddl_two_switch", 4, "10 GB/s"),        # the narrow switch0-switch1 link
    ("mn1_10gbe", 32, "2.5 GB/s"),           # two 10 GbE NICs on each side
    ("leaf_spine_1024", 1024, "6.4 TB/s"),   # 8 leaves x 4 x 200 GB/s uplinks
])
def test_show_numbers(name, ranks, bisection, capsys):
    assert main(["topo", "show", str(topology_path(name))]) == 0
    out = capsys.readouterr().out
    assert f"{ranks} ranks in " in out
    row = next(line for line in out.splitlines() if "bisection" in line)
    assert bisection in row


def test_show_lists_box_groups_and_truncates_links(capsys):
    assert main(["topo", "show", "--links", "3", str(topology_path("dgx_a100_x4"))]) == 0
    out = capsys.readouterr().out
    assert "dgx0 .. dgx3" in out and "8 x 25 GB/s" in out and "300 GB/s" in out
    assert "... 13 more" in out


BARE = """\
name: bare
switches: [s]
boxes:
  - name: "a{i}"
    count: 2
    gpus: 4
    fabric: {bandwidth: 300 GB/s}
    nics:
      - {switch: s, bandwidth: 100 Gbit/s, gpus: [0, 1]}
      - {switch: s, bandwidth: 100 Gbit/s, gpus: [2]}
      - {switch: s, bandwidth: 25, gpus: [3]}
"""


def test_lint_reports_bare_numbers_instead_of_ok(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(BARE)
    result = run_cli("topo", "lint", str(path))
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        f"{path}: 1 warning: bare, 8 ranks in 2 boxes, 1 switch"]
    assert result.stderr.splitlines() == [
        f"topoplan: warning: {path}:11: boxes[0].nics[2].bandwidth: bare number 25 read as "
        "25 GB/s (200 Gbit/s); write '25 GB/s' or '25 Gbit/s'"]
    assert run_cli("topo", "lint", "--strict", str(path)).returncode == 1
    assert run_cli("topo", "lint", "--strict", str(topology_path("mn1_10gbe"))).returncode == 0


def test_lint_json_reports_every_file_with_its_warnings_or_its_error(tmp_path):
    good, bare, bad = (tmp_path / f"{n}.yaml" for n in ("good", "bare", "bad"))
    good.write_text(topology_path("mn1_10gbe").read_text())
    bare.write_text(BARE)
    bad.write_text("name: x\nboxes: []\n")
    result = run_cli("topo", "lint", "--json", str(good), str(bare), str(bad))
    assert result.returncode == 1
    files = json.loads(result.stdout)["files"]
    assert [(f["file"], f["ok"]) for f in files] == [(str(good), True), (str(bare), True),
                                                      (str(bad), False)]
    assert files[0]["warnings"] == [] and files[0]["nranks"] == 32
    assert files[1]["warnings"] == [
        f"{bare}:11: boxes[0].nics[2].bandwidth: bare number 25 read as 25 GB/s (200 Gbit/s); "
        "write '25 GB/s' or '25 Gbit/s'"]
    assert files[2]["error"] == f"{bad}:2: boxes: must list at least one box"
    assert json.loads(run_cli("topo", "lint", "--json", str(good)).stdout)["files"][0]["ok"]


def test_every_command_reading_a_cluster_warns_once_per_bare_number(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(BARE)
    result = run_cli("plan", str(path), "-a", "ring", "--candidates", "ring", "-s", "1MiB")
    assert result.returncode == 0
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [
        f"topoplan: warning: {path}:11: boxes[0].nics[2].bandwidth: bare number 25 read as "
        "25 GB/s (200 Gbit/s); write '25 GB/s' or '25 Gbit/s'"]


def test_show_writes_mixed_nics_as_counts_per_speed(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text(BARE.replace("bandwidth: 25,", "bandwidth: 200 Gbit/s,"))
    assert main(["topo", "show", str(path)]) == 0
    assert "2 x 12.5 GB/s + 1 x 25 GB/s" in capsys.readouterr().out


def test_lint_bad_file_prints_one_error_line_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nswitches: [s]\nboxes:\n  - name: 'a{i}'\n    count: 2\n    gpus: 1\n"
                   "    nics:\n      - {switch: s, bandwidth: -5}\n")
    result = run_cli("topo", "lint", str(bad))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"topoplan: error: {bad}:8: boxes[0].nics[0].bandwidth: must be > 0, got -5"]


def test_lint_missing_and_empty_files(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    result = run_cli("topo", "lint", str(empty))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"topoplan: error: {empty}:1: empty file; a cluster file is a mapping with name and boxes"]
    missing = tmp_path / "missing.yaml"
    assert main(["topo", "show", str(missing)]) == 1


def test_show_error_goes_to_stderr(tmp_path, capsys):
    bad = tmp_path / "syntax.yaml"
    bad.write_text("name: x\nboxes:\n  - {name: a, gpus: 1\n")
    assert main(["topo", "show", str(bad)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"topoplan: error: {bad}:4: YAML syntax error")
    assert len(captured.err.splitlines()) == 1


def test_show_one_gpu_cluster_prints_no_infinite_cut(tmp_path, capsys):
    path = tmp_path / "one.yaml"
    path.write_text("name: one\nboxes:\n  - {name: solo, gpus: 1}\n")
    assert main(["topo", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "inf" not in out
    assert "none: one GPU, nothing to move" in out and "- (one GPU)" in out


def test_show_names_the_box_behind_the_cut(capsys):
    """The cut that binds on unequal_gpus is the 20 GPUs outside a 4-GPU box: a user reads
    the box as behind it, not the 20."""
    assert main(["topo", "show", str(ROOT / "topologies" / "targets" / "unequal_gpus.yaml"),
                 "--json"]) == 0
    cut = json.loads(capsys.readouterr().out)["bandwidth"]["bottleneck"]
    assert (cut["gpus"], cut["behind"], cut["where"]) == (20, 4, "box small0")
    assert cut["text"] == "4 GPUs (box small0) behind 25 GB/s"
    assert main(["topo", "show", str(ROOT / "topologies" / "targets" / "unequal_gpus.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("RS+AG bottleneck cut 4 GPUs (box small0) behind 25 GB/s: the other 20 GPUs' "
            "shards cross it at 1.25 GB/s each") in out


PORTS = """name: ports
switches: [{name: 'rail{i}', count: 4}, spine]
links: [{a: 'rail{i}', b: spine, count: 4, bandwidth: 1.6 Tbit/s}]
boxes:
  - name: 'n{i}'
    count: 2
    gpus: 2
    gpu: H100
    fabric: {bandwidth: 450 GB/s}
    nics:
      - {switch: rail0, bandwidth: 200 Gbit/s, gpus: [0]}
      - {switch: rail1, bandwidth: 200 Gbit/s, gpus: [0]}
      - {switch: rail2, bandwidth: 200 Gbit/s, gpus: [1]}
      - {switch: rail3, bandwidth: 200 Gbit/s, gpus: [1]}
"""


def test_lint_flags_the_ports_of_one_card_written_as_nics(tmp_path):
    # Four 200G NICs for two GPUs, two per GPU: most likely two dual-port cards, which
    # NCCL merges (NCCL_IB_MERGE_NICS=1): the nccl row would see 2 x 400G, not 4 x 200G.
    path = tmp_path / "ports.yaml"
    path.write_text(PORTS)
    result = run_cli("topo", "lint", str(path))
    assert result.returncode == 0
    assert result.stdout.splitlines() == [f"{path}: 1 warning: ports, 4 ranks in 2 boxes, "
                                          "5 switches"]
    assert result.stderr.splitlines() == [
        f"topoplan: warning: {path}:10: boxes[0].nics: 4 NICs for 2 GPUs: nics[0] and nics[1] "
        "serve the same GPUs [0] (switches rail0, rail1); if they are the ports of one card, "
        "NCCL merges them (NCCL_IB_MERGE_NICS=1; aws-ofi-nccl groups a GPU's EFA devices): "
        "write them as one NIC of 400 Gbit/s"]
    assert run_cli("topo", "lint", "--strict", str(path)).returncode == 1
    merged = PORTS.replace("      - {switch: rail1, bandwidth: 200 Gbit/s, gpus: [0]}\n", "") \
        .replace("      - {switch: rail3, bandwidth: 200 Gbit/s, gpus: [1]}\n", "") \
        .replace("200 Gbit/s", "400 Gbit/s")
    path.write_text(merged)
    assert run_cli("topo", "lint", "--strict", str(path)).returncode == 0
