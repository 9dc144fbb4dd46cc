"""Helpers shared by the CLI commands: console output and tables."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table


def console() -> Console:
    # Wide enough that tables do not wrap when piped into a file or CI log.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def table(*columns: str, title: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, column in enumerate(columns):
        t.add_column(column, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def size_arg(text: str) -> int:
    """argparse type for sizes such as 256MiB."""
    import argparse

    from ..units import parse_size
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def sizes_arg(text: str) -> list[int]:
    """argparse type for size ranges such as 1KiB:1GiB."""
    import argparse

    from ..units import parse_size_range
    try:
        return parse_size_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def status(message: str):
    """A spinner on stderr for long work (silent when stderr is not a terminal)."""
    from rich.console import Console
    return Console(stderr=True).status(message)
