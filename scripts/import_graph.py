"""topoplan's import graph: levels, edges and cycles, with packages as rooms.

Every ``import`` and ``from ... import`` in ``topoplan/`` counts, also those inside
function bodies (a cycle hidden in a function is still a cycle a reader must follow).
A *room* is a top-level module (``topoplan/errors.py`` -> ``errors``) or a subpackage
(``topoplan/planners/*`` -> ``planners``). Edges join rooms; cycles are the strongly
connected components of more than one room; levels are the longest chain of imports
below a room (rooms of one cycle share a level).

    python scripts/import_graph.py              # rooms
    python scripts/import_graph.py --modules    # every module a node
    python scripts/import_graph.py --json

:func:`counts` gives the figures of docs/ARCHITECTURE.md's import-graph table
(tests/test_architecture.py compares them with its "now" row).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "topoplan"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _typing_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (for annotations only)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def imports_of(path: Path, name: str, typing: bool = True) -> set[str]:
    """The topoplan modules ``path`` (module ``name``) imports (with ``typing=False``,
    not those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    skip = set() if typing else _typing_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("topoplan"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("topoplan"):
                continue
            found.add(target)
            for alias in node.names:  # "from . import sim" names a module
                found.add(f"{target}.{alias.name}")
    return found


def module_graph(typing: bool = True) -> nx.DiGraph:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in imports_of(path, name, typing):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph.add_edge(name, target)
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "topoplan"
    return parts[1]


def room_graph(modules: nx.DiGraph) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from({room(m) for m in modules})
    for a, b in modules.edges:
        ra, rb = room(a), room(b)
        # The package's front door (topoplan/__init__.py) re-exports lazily: not a room.
        if ra != rb and "topoplan" not in (ra, rb):
            graph.add_edge(ra, rb)
    graph.remove_node("topoplan")
    return graph


def summary(graph: nx.DiGraph) -> dict:
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    dag = nx.condensation(graph)
    level: dict[int, int] = {}
    for node in reversed(list(nx.topological_sort(dag))):
        level[node] = 1 + max((level[s] for s in dag.successors(node)), default=0)
    levels = {n: level[dag.graph["mapping"][n]] for n in graph}
    return {"nodes": graph.number_of_nodes(), "edges": graph.number_of_edges(),
            "levels": max(levels.values(), default=0), "cycles": sorted(cycles),
            "level_of": dict(sorted(levels.items(), key=lambda kv: (kv[1], kv[0])))}


def counts() -> dict[str, int]:
    """The import graph's counts, as docs/ARCHITECTURE.md's table gives them: rooms and
    modules, their edges, levels and cycles (``real``: without the imports under
    ``if TYPE_CHECKING:``)."""
    modules, real = module_graph(), module_graph(typing=False)
    rooms, real_rooms = summary(room_graph(modules)), summary(room_graph(real))
    by_module = summary(modules)
    return {"rooms": rooms["nodes"], "edges": rooms["edges"], "levels": rooms["levels"],
            "cycles": len(rooms["cycles"]), "real cycles": len(real_rooms["cycles"]),
            "modules": by_module["nodes"], "module edges": by_module["edges"],
            "module levels": by_module["levels"], "module cycles": len(by_module["cycles"]),
            "module real cycles": len(summary(real)["cycles"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="every module a node")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    modules = module_graph()
    graph = modules if args.modules else room_graph(modules)
    out = summary(graph)
    real = module_graph(typing=False)
    out["real_cycles"] = summary(real if args.modules else room_graph(real))["cycles"]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    what = "modules" if args.modules else "rooms (top-level modules and subpackages)"
    print(f"{out['nodes']} {what}, {out['edges']} edges, {out['levels']} levels, "
          f"{len(out['cycles'])} cycles, {len(out['real_cycles'])} of them real (imports "
          "under TYPE_CHECKING left out)")
    for cycle in out["cycles"]:
        real = " (real)" if cycle in out["real_cycles"] else ""
        print("  cycle: " + " <-> ".join(cycle) + real)
    by_level: dict[int, list[str]] = {}
    for name, lv in out["level_of"].items():
        by_level.setdefault(lv, []).append(name)
    for lv in sorted(by_level):
        print(f"  level {lv:2}: {', '.join(by_level[lv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
