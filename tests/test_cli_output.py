"""What the CLI prints reads as a user expects: counts in the singular for one ("1 switch",
never "1 switches"), and lines no wider than the terminal: 80 columns when the output is
not a terminal and $COLUMNS is unset."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.clusters import ROOT
from topoplan.cli import main
from topoplan.units import plural

DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")
ONE_SWITCH = ("name: one-switch\nswitches: [{name: sw}]\nboxes:\n"
              "  - {name: 'h{i}', count: 2, gpus: 1, "
              "nics: [{switch: sw, bandwidth: 100 Gbit/s, latency: 2 us}]}\n")


@pytest.mark.parametrize("count, word, many, text", [
    (1, "switch", None, "1 switch"), (2, "switch", None, "2 switches"),
    (0, "GPU", None, "0 GPUs"), (1, "box", None, "1 box"), (4, "box", None, "4 boxes"),
    (3, "thread block", None, "3 thread blocks"), (2, "leaf", "leaves", "2 leaves")])
def test_plural(count, word, many, text):
    assert plural(count, word, many) == text


def test_one_of_a_kind_is_singular(tmp_path, capsys):
    cluster = tmp_path / "one.yaml"
    cluster.write_text(ONE_SWITCH)
    assert main(["topo", "show", str(cluster)]) == 0
    assert "2 ranks in 2 boxes, 1 switch, 0 switch links\n" in capsys.readouterr().out
    assert main(["topo", "lint", str(cluster)]) == 0
    assert capsys.readouterr().out.endswith("2 ranks in 2 boxes, 1 switch\n")
    plan = tmp_path / "nccl.json"
    assert main(["plan", str(cluster), "-a", "nccl", "--size", "1MiB", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["verify", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks, 1 chunk, 1 step, 0 messages, 2 native steps (1 collective)" in out
    assert main(["topo", "generate", "rail", "--boxes", "1", "--gpus", "1"]) == 0
    assert "# 1 box x 1 GPU, 1 rail of 1 leaf (up to 32 boxes each), 4 spines" in \
        capsys.readouterr().out


# ---- widths ------------------------------------------------------------------------------

def _run(*args: str, columns: int | None) -> subprocess.CompletedProcess:
    """The CLI with stdout a pipe, $COLUMNS as given (unset for None)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=env)


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def test_a_pipe_without_columns_gets_80(tmp_path):
    """plan's table and footnotes (84 and 158 columns wide before) fit 80 columns, and a
    wider $COLUMNS is honoured."""
    narrow = _run("plan", DDL, "--size", "64MiB", columns=None)
    assert narrow.returncode == 0, narrow.stderr
    assert _widest(narrow.stdout) <= 80
    assert "vs nccl: NCCL's time / the row's" in narrow.stdout  # the footnote wraps, whole
    wide = _run("plan", DDL, "--size", "64MiB", columns=200)
    assert _widest(wide.stdout) > 80


def test_bench_rows_fit_the_width():
    pytest.importorskip("mpi4py")
    args = ("bench", "--algorithm", "ring", "-n", "2", "--sizes", "1KiB,64MiB",
            "--baseline", "native", "--iters", "1")
    narrow = _run(*args, columns=80)
    assert narrow.returncode == 0, narrow.stderr
    assert _widest(narrow.stdout) <= 80  # 132 before
    assert "# left out to fit 80 columns: count, type, redop" in narrow.stdout
    header = next(line for line in narrow.stdout.splitlines() if "size(B)" in line)
    assert {"size(B)", "time(us)", "#wrong", "ratio"} <= set(header.split())
    wide = _run(*args, columns=200)
    header = next(line for line in wide.stdout.splitlines() if "size(B)" in line)
    assert header.split()[1:9] == ["size(B)", "count", "type", "redop", "time(us)",
                                   "algbw(GB/s)", "busbw(GB/s)", "#wrong"]
    assert "left out" not in wide.stdout


def test_format_rows_leaves_out_columns_in_order():
    from topoplan.runtime.bench import BenchRow, format_rows

    rows = [BenchRow(size=size, count=size // 4, type="float32", redop="sum", time_us=t,
                     algbw=size / t / 1e3, busbw=size / t / 1e3, wrong=0, iters=1,
                     native_time_us=2 * t, native_algbw=size / t / 2e3,
                     native_busbw=size / t / 2e3, native_wrong=0, predicted_us=t,
                     measured_over_predicted=1.0)
            for size, t in ((1024, 12.5), (1 << 28, 123456.7))]
    full = format_rows(rows, native_name="MPI_Allreduce")
    assert _widest(full) > 150 and "left out" not in full  # nccl-tests' fixed widths
    for width, gone in ((132, "count, type, redop"), (100, "count, type, redop, algbw"),
                        (80, "count, type, redop, algbw, busbw")):
        text = format_rows(rows, native_name="MPI_Allreduce", width=width)
        assert _widest(text) <= width, text
        assert f"# left out to fit {width} columns: {gone} (" in text
        assert "type float32, redop sum on every row" in " ".join(text.replace("\n#", "").split())
