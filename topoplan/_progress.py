"""What long work is doing now, for whoever shows it.

Long loops (auto's candidates, a size sweep) call :func:`step` with a few words per
step; it costs nothing unless a caller listens (:func:`listening`), as the CLI's status
line does (``topoplan.commands.common.status``). The library itself never prints.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

__all__ = ["step", "listening"]

_SINK: ContextVar[Callable[[str], None] | None] = ContextVar("topoplan_progress", default=None)


def step(text: str) -> None:
    """Say what the work does now, e.g. ``"mcf: planning 256 ranks"``."""
    sink = _SINK.get()
    if sink is not None:
        sink(text)


@contextmanager
def listening(sink: Callable[[str], None]) -> Iterator[None]:
    """Hand every :func:`step` inside the block to ``sink``."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
