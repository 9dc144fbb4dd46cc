"""Argument errors are one line, ``topoplan <cmd>: error: ...`` (exit status 2), and say
what is wrong with the value: argparse's usage block does not come with them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.clusters import ROOT
from topoplan.cli import main

DDL = str(ROOT / "topologies" / "ddl_two_switch.yaml")


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    return out.err


@pytest.mark.parametrize("argv, line", [
    (["plan", DDL, "--size", "-5MiB"],
     "topoplan plan: error: argument -s/--size: expected a whole number of bytes > 0, "
     "e.g. 256MiB, 64KiB or 4096; got '-5MiB'"),
    (["plan"], "topoplan plan: error: the following arguments are required: cluster; "
               "see topoplan plan --help"),
    (["plan", DDL, "--bogus"], "topoplan plan: error: unrecognized arguments: --bogus; "
                               "see topoplan plan --help"),
    (["topo"], "topoplan topo: error: the following arguments are required: ACTION; "
               "see topoplan topo --help"),
    (["topo", "show", DDL, "--zz"], "topoplan topo show: error: unrecognized arguments: "
                                    "--zz; see topoplan topo show --help"),
    (["plan", DDL, "-c", "foo"], "topoplan plan: error: argument -c/--collective: invalid "
                                 "choice: 'foo' (choose from 'allreduce', 'reduce_scatter', "
                                 "'allgather')"),
])
def test_argument_errors_are_one_line(capsys, argv, line):
    assert _error(capsys, *argv) == line + "\n"


def test_a_negative_value_reaches_its_type(capsys):
    # argparse alone reads '-1us' as an unknown option: "expected one argument".
    err = _error(capsys, "simulate", DDL, "plan.json", "--sizes", "-1KiB:4KiB")
    assert err.count("\n") == 1 and "expected one argument" not in err
    assert err.startswith("topoplan simulate: error: argument --sizes: ")


def test_a_cluster_file_given_for_a_plan_says_so(capsys):
    assert main(["verify", DDL]) == 1
    assert capsys.readouterr().err == (
        f"topoplan: error: {DDL}: looks like a cluster YAML file; a schedule JSON is wanted "
        f"here (topoplan plan {DDL} -o PLAN.json writes one)\n")


def test_a_plan_given_for_a_cluster_says_so(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    assert main(["plan", DDL, "--size", "1MiB", "-a", "ring", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(plan), DDL]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "looks like a schedule JSON (a plan); a cluster YAML file is wanted here" in err


def test_the_command_line_shows_one_line_too():
    done = subprocess.run([sys.executable, "-m", "topoplan", "plan", DDL, "--size", "-5MiB"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("topoplan plan: error: argument -s/--size: expected a whole "
                           "number of bytes > 0, e.g. 256MiB, 64KiB or 4096; got '-5MiB'\n")


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_shows_the_traceback_before_the_line(verbose, tmp_path, monkeypatch):
    monkeypatch.delenv("TOPOPLAN_VERBOSE", raising=False)
    missing = str(tmp_path / "missing.yaml")
    done = subprocess.run([sys.executable, "-m", "topoplan", *(["--verbose"] if verbose else []),
                           "plan", missing, "--size", "1MiB"], capture_output=True, text=True,
                          cwd=ROOT)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1
    assert lines[-1] == f"topoplan: error: {missing}: cannot read cluster file: No such file " \
                        "or directory"
    assert (lines[0] == "Traceback (most recent call last):") is verbose, done.stderr
    if not verbose:
        assert len(lines) == 1, done.stderr
