"""The CLI's command modules import no cycle: what two commands share lives in
topoplan/commands/common.py (bench and calibrate used to import each other)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

COMMANDS = Path(__file__).resolve().parents[1] / "topoplan" / "commands"


def _imports(path: Path) -> set[str]:
    """The sibling command modules ``path`` imports, also inside function bodies."""
    names = {p.stem for p in COMMANDS.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found & names


def test_command_modules_import_no_cycle():
    graph = nx.DiGraph()
    for path in COMMANDS.glob("*.py"):
        graph.add_node(path.stem)
        graph.add_edges_from((path.stem, target) for target in _imports(path))
    assert ("calibrate", "common") in graph.edges and ("bench", "common") in graph.edges
    assert list(nx.simple_cycles(graph)) == []
