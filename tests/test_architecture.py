"""docs/ARCHITECTURE.md's import-graph table says what the code is: its "now" row holds
the counts that ``scripts/import_graph.py`` computes, so moving a module or adding an
import that changes them means updating the row in the same change."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _import_graph():
    return load_script("import_graph")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def documented() -> dict[str, int]:
    """The "now" row of the import-graph table, by column: ``cycles (real)`` = ``2 (0)``
    gives ``cycles`` 2 and ``real cycles`` 0."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    now = [i for i, line in enumerate(lines) if re.match(r"\|\s*now\s*\|", line)]
    assert len(now) == 1, (f"{DOC.name}: 'The import graph' needs one table row starting "
                           f"'| now |' (found {len(now)})")
    start = now[0]
    while start > 0 and lines[start - 1].startswith("|"):
        start -= 1
    header, row = _cells(lines[start]), _cells(lines[now[0]])
    assert len(header) == len(row), f"{DOC.name}: the 'now' row has {len(row)} cells, " \
                                    f"its header {len(header)}"
    found: dict[str, int] = {}
    for column, cell in zip(header[1:], row[1:]):
        name = column.removesuffix(" (real)")
        if name != column:  # "N (M)": N in all, M of them real
            match = re.fullmatch(r"(\d+)\s*\((\d+)\)", cell)
            assert match, f"{DOC.name}: column {column!r} of the 'now' row reads {cell!r}, " \
                          "expected 'N (M)'"
            found[name] = int(match.group(1))
            found[name.replace("cycles", "real cycles")] = int(match.group(2))
        else:
            assert cell.isdigit(), f"{DOC.name}: column {column!r} of the 'now' row reads " \
                                   f"{cell!r}, expected a number"
            found[name] = int(cell)
    return found


def test_the_import_graph_counts_in_the_architecture_page_are_current():
    actual = _import_graph().counts()
    doc = documented()
    unknown = sorted(set(doc) - set(actual))
    assert not unknown, f"{DOC.name}: the import-graph table has columns that " \
                        f"scripts/import_graph.py does not count: {unknown}"
    stale = [f"{name} {actual[name]} (it says {doc[name]})" for name in doc
             if doc[name] != actual[name]]
    assert not stale, (f"{DOC.name}, 'The import graph': the 'now' row should read "
                       + ", ".join(stale) + " (PYTHONPATH=. python scripts/import_graph.py "
                       "prints the rooms, --modules the modules)")
