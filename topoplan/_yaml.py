"""YAML with line numbers, so every error can name ``file:line: key``.

PyYAML's constructed objects forget where they came from; we compose the node
tree and build dict/list subclasses that remember the line of every key and item.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import ClusterSpecError


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


def _build(loader: yaml.SafeLoader, node: yaml.Node, file: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ClusterSpecError(f"keys must be strings, got {key!r}", file=file, line=line)
            if key in mapping:
                raise ClusterSpecError(
                    f"duplicate key {key!r} (first on line {mapping.key_lines[key]})",
                    file=file, line=line)
            mapping[key] = _build(loader, value_node, file)
            mapping.key_lines[key] = line
        return mapping
    if isinstance(node, yaml.SequenceNode):
        sequence = LineList()
        sequence.line = node.start_mark.line + 1
        sequence.item_lines = []
        for item in node.value:
            sequence.append(_build(loader, item, file))
            sequence.item_lines.append(item.start_mark.line + 1)
        return sequence
    return loader.construct_object(node, deep=True)


def load_yaml(text: str, file: str) -> Any:
    """Parse one YAML document into LineDict/LineList/scalars; syntax errors name the line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        return _build(loader, node, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ClusterSpecError(f"YAML syntax error: {problem}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ClusterSpecError(f"YAML error: {exc}", file=file) from None
    finally:
        loader.dispose()
