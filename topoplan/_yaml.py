"""YAML with line numbers, so every error can name ``file:line: key``.

PyYAML's constructed objects forget where they came from; we compose the node
tree and build dict/list subclasses that remember the line of every key and item.
"""

from __future__ import annotations

import os

from pathlib import Path
from typing import Any

import yaml

from .errors import ClusterSpecError, SpecError


class LineDict(dict):
    """A mapping that knows its own line and the line of each of its keys."""

    line: int
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list):
    """A sequence that knows its own line and the line of each item."""

    line: int
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


#: Nodes one document may build, aliases counted each time they are used: a few lines
#: of nested aliases ("billion laughs") would otherwise take forever to walk.
MAX_NODES = 500_000


class _Budget:
    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_NODES


def _build(loader: yaml.SafeLoader, node: yaml.Node, file: str, error: type[SpecError],
           budget: _Budget) -> Any:
    budget.left -= 1
    if budget.left < 0:
        raise error(f"more than {MAX_NODES} values once aliases are expanded; write the "
                    "values out, or use count", file=file, line=node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = _construct(loader, key_node, file, error)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise error(f"keys must be strings, got {key!r}", file=file, line=line)
            if key in mapping:
                raise error(
                    f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                    file=file, line=line)
            mapping[key] = _build(loader, value_node, file, error, budget)
            mapping.key_lines[key] = line
        return mapping
    if isinstance(node, yaml.SequenceNode):
        sequence = LineList()
        sequence.line = node.start_mark.line + 1
        sequence.item_lines = []
        for item in node.value:
            sequence.append(_build(loader, item, file, error, budget))
            sequence.item_lines.append(item.start_mark.line + 1)
        return sequence
    return _construct(loader, node, file, error)


def _construct(loader: yaml.SafeLoader, node: yaml.Node, file: str,
               error: type[SpecError]) -> Any:
    try:
        return loader.construct_object(node, deep=True)
    except (ValueError, TypeError, OverflowError) as exc:
        # PyYAML's constructors check less than they parse: 2001-13-45 matches the
        # timestamp pattern and then fails in datetime.
        raise error(f"cannot read the value {node.value!r}: {' '.join(str(exc).split())}"
                    if isinstance(node, yaml.ScalarNode) else
                    f"cannot read a value: {' '.join(str(exc).split())}",
                    file=file, line=node.start_mark.line + 1) from None


def load_yaml(text: str, file: str, error: type[SpecError] = ClusterSpecError) -> Any:
    """Parse one YAML document into LineDict/LineList/scalars; syntax errors name the line.

    Errors are raised as ``error`` (a :class:`SpecError` subclass: the kind of file).
    """
    try:
        # The reader checks the characters as it is built: control characters raise here.
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise error(f"not a YAML text: {exc.reason} (character #x{exc.character:04x})",
                    file=file, line=line) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        return _build(loader, node, file, error, _Budget())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = mark.line + 1 if mark is not None else None
        if mark is not None and (exc.problem or "").startswith("found character '\\t'"):
            # PyYAML's "found character '\t' that cannot start any token" is an editor
            # that indents with tabs.
            raise error(f"a tab at column {mark.column + 1}: indent with spaces (YAML allows "
                        "tabs only inside quoted strings)", file=file, line=where) from None
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        raise error(f"YAML syntax error: {problem}", file=file, line=where) from None
    except yaml.YAMLError as exc:
        raise error(f"YAML error: {' '.join(str(exc).split())}", file=file) from None
    except RecursionError:
        raise error("nested too deeply (or an alias that contains itself)", file=file) from None
    finally:
        loader.dispose()


def read_text(path: str | os.PathLike, what: str, error: type[SpecError] = ClusterSpecError) -> str:
    """A YAML input file's text; an unreadable or non-UTF-8 file is ``error`` naming it."""
    file = str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", file=file) from None
    except UnicodeDecodeError:
        raise error("not a text file (UTF-8 expected)", file=file) from None
