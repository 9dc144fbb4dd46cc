"""Read an XML file into a tree whose elements know their line, for errors that point.

The XML files topoplan reads (NCCL topology dumps, MSCCL algorithms) are small, flat and
attribute-only, written by C code that never escapes much. :mod:`xml.parsers.expat` (the
standard library's parser) keeps the line of every start tag, which
:mod:`xml.etree.ElementTree` drops; errors then read ``algo.xml:14: gpu[2]/tb[0]/step[3]:
cnt: must be >= 1, got 0``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from xml.parsers import expat

from ..errors import XmlFormatError

__all__ = ["Element", "read_xml", "parse_xml"]


@dataclass(eq=False)
class Element:
    """One XML element: tag, attributes (strings), children in order, and where it is."""

    tag: str
    attrs: dict[str, str]
    line: int
    path: str  # e.g. "algo/gpu[2]/tb[0]/step[3]": the tag and index among same-tag siblings
    file: str
    children: list[Element] = field(default_factory=list)

    def find_all(self, tag: str) -> list[Element]:
        return [c for c in self.children if c.tag == tag]

    def iter(self, tag: str | None = None) -> Iterator[Element]:
        """This element and every descendant, depth first, in file order."""
        if tag is None or self.tag == tag:
            yield self
        for child in self.children:
            yield from child.iter(tag)

    def error(self, message: str, attr: str | None = None) -> XmlFormatError:
        """An error naming this element's file, line, path and (optionally) attribute."""
        key = self.path if attr is None else f"{self.path}: {attr}"
        return XmlFormatError(message, file=self.file, line=self.line, key=key)

    def get(self, attr: str, default: str | None = None) -> str | None:
        return self.attrs.get(attr, default)

    def require(self, attr: str) -> str:
        value = self.attrs.get(attr)
        if value is None:
            have = ", ".join(sorted(self.attrs)) or "none"
            raise self.error(f"missing attribute (it has: {have})", attr)
        return value

    def _raw(self, attr: str, default: object) -> str | None:
        """The attribute's text; None when absent with a default; required otherwise."""
        raw = self.attrs.get(attr)
        if raw is None and default is None:
            return self.require(attr)
        return raw

    def int(self, attr: str, default: int | None = None, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
        """The attribute as an integer (decimal, or hex with 0x), range-checked."""
        raw = self._raw(attr, default)
        if raw is None:
            assert default is not None  # _raw requires the attribute otherwise
            return default
        try:
            value = int(raw.strip(), 0) if raw.strip().lower().startswith("0x") else int(raw)
        except ValueError:
            raise self.error(f"must be an integer, got {raw!r}", attr) from None
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum}, got {value}", attr)
        if maximum is not None and value > maximum:
            raise self.error(f"must be <= {maximum}, got {value}", attr)
        return value

    def float(self, attr: str, default: float | None = None) -> float:
        raw = self._raw(attr, default)
        if raw is None:
            assert default is not None  # _raw requires the attribute otherwise
            return default
        try:
            return float(raw)
        except ValueError:
            raise self.error(f"must be a number, got {raw!r}", attr) from None


def parse_xml(text: str | bytes, file: str = "<string>") -> Element:
    """Parse XML text into an :class:`Element` tree; malformed XML names file and line."""
    parser = expat.ParserCreate()
    stack: list[Element] = []
    counts: list[dict[str, int]] = [{}]
    root: list[Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        index = counts[-1].get(tag, 0)
        counts[-1][tag] = index + 1
        if stack:
            path = f"{stack[-1].path}/{tag}[{index}]"
        else:
            path = tag
        element = Element(tag, dict(attrs), parser.CurrentLineNumber, path, file)
        if stack:
            stack[-1].children.append(element)
        else:
            root.append(element)
        stack.append(element)
        counts.append({})

    def end(tag: str) -> None:
        stack.pop()
        counts.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(text, True)
    except expat.ExpatError as exc:
        raise XmlFormatError(f"not well-formed XML: {expat.ErrorString(exc.code)} "
                             f"(column {exc.offset + 1})", file=file, line=exc.lineno) from None
    if not root:
        raise XmlFormatError("no XML element in the file", file=file)
    return root[0]


def read_xml(path: str | Path) -> Element:
    """Read and parse an XML file; see :func:`parse_xml`."""
    path = Path(path)
    data = path.read_bytes()
    return parse_xml(data, file=str(path))
