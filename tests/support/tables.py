"""Reading back the tables the CLI prints (``topoplan.commands.common``'s style: a header
of one or two lines, a rule of ``─``, rows with two or more spaces between cells)."""

from __future__ import annotations

import re

_CELL = re.compile(r"\S+(?: \S+)*")  # a cell: words with single spaces between them


def read_table(text: str, index: int = 0, header_lines: int = 2) -> list[dict[str, str]]:
    """The rows of the ``index``-th table in ``text``, each a dict keyed by its column's
    header (stacked header lines joined with a space: ``"time (us)"``).

    Cells are placed under headers by the columns they span, so a right-aligned number
    finds its right-aligned header. A row stops the table when it has another number of
    cells than the first row (a note under the table).
    """
    lines = text.splitlines()
    rules = [k for k, line in enumerate(lines) if line.strip() and set(line.strip()) == {"─"}]
    rule = rules[index]
    rows: list[list[re.Match]] = []
    for line in lines[rule + 1:]:
        cells = list(_CELL.finditer(line))
        if rows and len(cells) != len(rows[0]) or not cells:
            break
        rows.append(cells)
    spans = [(min(r[j].start() for r in rows), max(r[j].end() for r in rows))
             for j in range(len(rows[0]))]
    headers = [[] for _ in spans]
    for line in lines[rule - header_lines:rule]:
        for match in _CELL.finditer(line):
            j = next(j for j, (a, b) in enumerate(spans) if match.start() < b and match.end() > a)
            headers[j].append(match.group())
    names = [" ".join(h) for h in headers]
    return [{name: cell.group() for name, cell in zip(names, row)} for row in rows]


def widest_line(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)
