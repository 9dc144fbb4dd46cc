"""``--help`` of every command: every option says what it does, no docstring markup shows,
and the top-level help names every command a user can type (``topo generate`` too)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from typing import Iterator

import pytest

from tests.support.clusters import ROOT
from topoplan.cli import build_parser
from topoplan.commands.common import plain

MARKUP = re.compile(r"``|:(?:mod|func|class|meth|data|attr|exc|obj|ref|doc):`")


def parsers(parser: argparse.ArgumentParser,
            path: tuple[str, ...] = ("topoplan",)) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the tree, with the words that reach it (``topoplan topo show``)."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


PARSERS = dict(parsers(build_parser()))


def test_the_tree_reaches_every_command():
    assert {"topoplan topo generate", "topoplan topo import", "topoplan import",
            "topoplan export", "topoplan estimate"} <= PARSERS.keys()


@pytest.mark.parametrize("command", PARSERS)
def test_every_option_and_subcommand_has_help(command):
    parser = PARSERS[command]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue  # hidden on purpose (an internal flag, an old spelling)
        if isinstance(action, argparse._SubParsersAction):  # each subcommand says what it is
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub in action.choices:
                assert helps.get(sub), f"{command} {sub} has no help"
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"{command} {name} has no help"


@pytest.mark.parametrize("command", PARSERS)
def test_help_shows_no_docstring_markup(command):
    text = PARSERS[command].format_help()
    assert not MARKUP.search(text), f"{command} --help: {MARKUP.search(text).group()!r}"


def test_plain_strips_roles_and_literals():
    assert plain("``-o x.png`` with :func:`~topoplan.plan` and :mod:`topoplan.runtime.mpirun`, "
                 ":class:`a label <topoplan.X>`") == \
        "-o x.png with plan and topoplan.runtime.mpirun, a label"
    assert plain("``python -m torch.distributed.run\n--nproc-per-node N``") == \
        "python -m torch.distributed.run\n--nproc-per-node N"


def test_top_level_help_lists_topo_generate():
    done = subprocess.run([sys.executable, "-m", "topoplan", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0
    topo = next(line for line in done.stdout.split("\n    topo")[1:2])
    assert "topo generate" in topo and "topo import" in topo and "topo lint" in topo
