"""What the CLI prints reads as a user expects: counts in the singular for one ("1 switch",
never "1 switches"), and lines no wider than the terminal: 80 columns when the output is
not a terminal and $COLUMNS is unset."""

from __future__ import annotations

import pytest

from topoplan.cli import main
from topoplan.units import plural

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
