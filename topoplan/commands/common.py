"""Helpers shared by the CLI commands: console output and tables."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.table import Table


def is_terminal(stream: Any = None) -> bool:
    """Whether to draw colour, spinners and progress bars on ``stream`` (default stdout).

    A terminal, unless ``NO_COLOR`` is set or ``TERM`` is ``dumb``. In an MPI rank, only
    when the launching topoplan's own output is a terminal (``TOPOPLAN_TERMINAL=1``, set
    by :mod:`topoplan._mpirun`): Open MPI gives each rank a pseudo-terminal even when
    mpiexec writes into a pipe or a log file, so the rank's ``isatty()`` says nothing.
    """
    import os
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    from .._mpirun import ENV_TERMINAL, inside_mpi
    if inside_mpi():
        return os.environ.get(ENV_TERMINAL) == "1"
    try:
        return bool((stream or sys.stdout).isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def console() -> Console:
    # Wide enough that tables do not wrap when piped into a file or CI log.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False,
                   force_terminal=is_terminal(sys.stdout))


def table(*columns: str, title: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, column in enumerate(columns):
        t.add_column(column, justify="left" if i == 0 else "right", no_wrap=i == 0)
    return t


def checked_arg(parse: Callable[[str], Any], ok: Callable[[Any], bool], rule: str,
                hint: str = "") -> Callable[[str], Any]:
    """An argparse type: ``parse(text)``, whose ValueError is the message, then
    ``ok(value)`` or "``rule``, got 'text'"; ``hint`` follows a parse error."""
    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}{hint}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value
    return convert


#: What the size options' messages show as an example.
SIZE_EXAMPLE = "e.g. 256MiB, 64KiB or 4096"


def size_arg(text: str) -> int:
    """argparse type for a message size such as 256MiB: a whole number of bytes > 0.

    Every mistake gets one message; argparse puts the option's name in front of it
    (``argument -s/--size: ...``).
    """
    from ..units import parse_size
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(_size_reason(text, exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(_size_reason(text, None))
    return value


def sizes_arg(text: str) -> list[int]:
    """argparse type for size ranges such as 1KiB:1GiB (every size > 0 bytes)."""
    from ..units import parse_size_range
    try:
        sizes = parse_size_range(text)
    except ValueError as exc:
        message = str(exc)
        if not message.startswith("not a size range"):
            message += "; a range reads MIN:MAX, MIN:MAX:FACTOR or A,B,C, e.g. 1KiB:64MiB"
        raise argparse.ArgumentTypeError(message) from None
    if any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be > 0 bytes, got {text!r}; "
                                         "e.g. 1KiB:64MiB or 4096,1MiB")
    return sizes


def _size_reason(text: str, exc: ValueError | None) -> str:
    if exc is not None and str(exc).startswith("unknown unit"):
        return f"{exc} ({SIZE_EXAMPLE})"
    return f"expected a whole number of bytes > 0, {SIZE_EXAMPLE}; got {text!r}"


def positive_int(text: str) -> int:
    """argparse type for counts such as --max-chunks 64."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_profile_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--profile NAME|FILE``: the runtime's cost profile (default: DEFAULT_PROFILE)."""
    from ..cost import DEFAULT_PROFILE, profile_names
    parser.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME|FILE",
                        help=f"cost profile of the runtime {what}: "
                             f"{', '.join(profile_names())} or a profile YAML file "
                             f"(default {DEFAULT_PROFILE})")


#: Seconds of work before a status shows in a pipe or a log: quick commands stay quiet.
QUIET_S = 2.0


@contextmanager
def status(message: str) -> Iterator[None]:
    """Show on stderr what the work inside the block is doing, with each step it reports
    (:func:`topoplan._progress.step`). On a terminal (:func:`is_terminal`): a spinner
    line, rewritten at each step and gone at the end. Elsewhere (a pipe, a log): nothing
    for :data:`QUIET_S` seconds, then a plain line ``topoplan: ...`` saying what it is
    doing, and one more for a step at most every :data:`QUIET_S` seconds."""
    import threading
    import time

    from .._progress import listening
    if is_terminal(sys.stderr):
        with Console(stderr=True, force_terminal=True).status(message) as line:
            with listening(lambda text: line.update(f"{message} {text}")):
                yield
        return
    lock = threading.Lock()
    now = [message]  # the message, then the last step
    last = [time.perf_counter()]  # when the last line was shown (or the work began)
    shown = [False]

    def show() -> None:
        with lock:
            shown[0] = True
            last[0] = time.perf_counter()
            print(f"topoplan: {now[0]}", file=sys.stderr, flush=True)

    def on_step(text: str) -> None:
        now[0] = text
        if time.perf_counter() - last[0] >= QUIET_S:
            show()

    timer = threading.Timer(QUIET_S, lambda: None if shown[0] else show())
    timer.daemon = True
    timer.start()
    try:
        with listening(on_step):
            yield
    finally:
        timer.cancel()


def json_text(obj: Any, *, indent: int | None = None) -> str:
    """``json.dumps`` for every ``--json`` a command prints: numpy scalars and arrays (a
    measurement's ``numpy.bool_`` or ``float32``) become plain numbers, bools and lists,
    paths strings and enums their values, so that no report is lost at the last step."""
    import json
    return json.dumps(obj, indent=indent, default=_plain)


def _plain(value: Any) -> Any:
    import os
    from enum import Enum
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
