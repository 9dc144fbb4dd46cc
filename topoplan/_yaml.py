"""YAML with line numbers, so every error can name ``file:line: key``.

PyYAML's constructed objects forget where they came from; we compose the node
tree and build dict/list subclasses that remember the line of every key and item.
"""

from __future__ import annotations

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


def _build(loader: yaml.SafeLoader, node: yaml.Node, file: str, error: type[SpecError]) -> Any:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise error(f"keys must be strings, got {key!r}", file=file, line=line)
            if key in mapping:
                raise error(
                    f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                    file=file, line=line)
            mapping[key] = _build(loader, value_node, file, error)
            mapping.key_lines[key] = line
        return mapping
    if isinstance(node, yaml.SequenceNode):
        sequence = LineList()
        sequence.line = node.start_mark.line + 1
        sequence.item_lines = []
        for item in node.value:
            sequence.append(_build(loader, item, file, error))
            sequence.item_lines.append(item.start_mark.line + 1)
        return sequence
    return loader.construct_object(node, deep=True)


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
        return _build(loader, node, file, error)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise error(f"YAML syntax error: {problem}", file=file, line=where) from None
    except yaml.YAMLError as exc:
        raise error(f"YAML error: {exc}", file=file) from None
    finally:
        loader.dispose()
