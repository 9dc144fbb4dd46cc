"""Helpers shared by the CLI commands: console output and tables, argument types, and
what the commands that run ranks under mpiexec share (bench, calibrate, launch: their
help texts, :func:`check_transport` before launching, :func:`rank_transport` in a rank).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import warnings
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from ..errors import TopoplanError
from ..units import plural  # noqa: F401 - the commands' counts: "1 switch", "2 switches"


def is_terminal(stream: Any = None) -> bool:
    """Whether to draw colour, spinners and progress bars on ``stream`` (default stdout).

    A terminal, unless ``NO_COLOR`` is set or ``TERM`` is ``dumb``. In an MPI rank, only
    when the launching topoplan's own output is a terminal (``TOPOPLAN_TERMINAL=1``, set
    by :mod:`topoplan.runtime.mpirun`): Open MPI gives each rank a pseudo-terminal even when
    mpiexec writes into a pipe or a log file, so the rank's ``isatty()`` says nothing.
    """
    import os
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    from ..runtime.mpirun import ENV_TERMINAL, inside_mpi
    if inside_mpi():
        return os.environ.get(ENV_TERMINAL) == "1"
    try:
        return bool((stream or sys.stdout).isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class ArgumentParser(argparse.ArgumentParser):
    """The CLI's argparse parser (its subcommands' too).

    - An argument error is one line on stderr, ``topoplan <cmd>: error: <message>``,
      exit status 2; where the usage would help (an argument missing, unknown or without
      its value) the line ends with where to read it (``see topoplan plan --help``),
      instead of argparse's usage block above the error.
    - A value that starts with ``-`` and a digit (``--size -5MiB``, ``--alpha -1us``) is a
      value, so that its type says what is wrong with it (argparse takes only plain
      negative numbers as values, and anything else for an unknown option).
    """

    #: The starts of argparse's messages about the command line's shape, not a value.
    _SHAPE = ("the following arguments are required", "unrecognized arguments",
              "expected one argument", "expected at least one argument", "ambiguous option")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "_parser"):  # the innermost subcommand's parser
            namespace._parser = self
        return namespace, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's, except that arguments no parser took are the error of the
        subcommand they were given to (``topoplan plan: error: unrecognized ...``)."""
        namespace, extras = self.parse_known_args(args, namespace)
        parser = vars(namespace).pop("_parser", self)
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def error(self, message: str) -> Any:  # argparse's signature: NoReturn
        hint = f"; see {self.prog} --help" if message.startswith(self._SHAPE) else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


#: The width of output that goes to no terminal (a pipe, a file, a CI log) without $COLUMNS.
PIPE_WIDTH = 80


def output_width(stream: Any = None) -> int | None:
    """The columns ``stream`` (default stdout) may take: $COLUMNS when set; a terminal's
    own width (``None``: rich asks the terminal); else :data:`PIPE_WIDTH`. In an MPI
    rank, whose stdout may be a pseudo-terminal of its own, $COLUMNS (which the launching
    command passes on from its terminal, :func:`topoplan.runtime.mpirun.launch_command`)
    or 80."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    from ..runtime.mpirun import inside_mpi
    try:
        terminal = (stream or sys.stdout).isatty() and not inside_mpi()
    except (AttributeError, ValueError):  # no isatty, or closed
        terminal = False
    return None if terminal else PIPE_WIDTH


def console(*, stderr: bool = False) -> Console:
    """Standard output (or error), :func:`output_width` columns wide: tables fit it
    (:func:`fit_table`) and longer lines wrap at spaces."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(width=output_width(stream), highlight=False, stderr=stderr,
                   force_terminal=is_terminal(stream))


#: Sphinx roles (``:func:`~topoplan.plan```) and inline literals (````x````) in docstrings.
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc|obj|ref|doc):"
                   r"`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``", re.S)


def plain(text: str) -> str:
    """``text`` without reStructuredText markup, for ``--help`` (descriptions come from
    docstrings): ````x```` -> ``x``, ``:func:`~a.b``` -> ``b``, ``:mod:`a.b``` -> ``a.b``."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if m.group(0).count("~")
                     else m.group(1), text)
    return _LITERAL.sub(r"\1", text)


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Strip docstring markup (:func:`plain`) from ``parser``'s description, epilog and
    option help, and from every subcommand's, all the way down."""
    for attr in ("description", "epilog", "usage"):
        value = getattr(parser, attr)
        if isinstance(value, str):
            setattr(parser, attr, plain(value))
    for action in parser._actions:
        if isinstance(action.help, str) and action.help != argparse.SUPPRESS:
            action.help = plain(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if isinstance(choice.help, str):
                    choice.help = plain(choice.help)
            for sub in action.choices.values():
                plain_help(sub)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for the CLI: a topoplan warning is one line on stderr,
    ``topoplan: warning: <message>``; any other keeps Python's format."""
    from ..errors import TopoplanWarning
    out = sys.stderr if file is None else file
    if issubclass(category, TopoplanWarning):
        print(f"topoplan: warning: {message}", file=out)
    else:
        out.write(warnings.formatwarning(message, category, filename, lineno, line))


def _table(title: str | None) -> Table:
    """One style for every table: a rule under the header, two spaces between columns,
    no borders (they cost three columns of an 80-column terminal per column)."""
    return Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
                 show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))


def table(*columns: str, title: str | None = None) -> Table:
    """A table whose first column is a left-aligned label and the others right-aligned
    values; a cell too long for the terminal folds onto a second line, never ``…``."""
    t = _table(title)
    for i, column in enumerate(columns):
        t.add_column(column, justify="left" if i == 0 else "right", no_wrap=i == 0,
                     overflow="fold")
    return t


@dataclass(frozen=True)
class Column:
    """A column of :func:`fit_table`.

    ``header`` may stack on lines (``"time\n(us)"``: the unit under the name). ``drop``:
    0 for a column always shown; columns with higher values are left out first when the
    table is too wide. ``stack``: a separator at which cells may break onto lines before
    any column is left out (``" + "``). ``wrap``: prose that may wrap at spaces (labels),
    never numbers.
    """

    header: str
    justify: Literal["left", "right"] = "right"
    drop: int = 0
    stack: str | None = None
    wrap: bool = False


def fit_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, *,
              title: str | None = None) -> tuple[Table, list[str]]:
    """A table of ``rows`` (cells as text) no wider than ``width`` where that can be done.

    Every number is printed whole: rather than clip a cell, cells break at their
    column's ``stack`` separator, then secondary columns are left out, the highest
    ``drop`` first. Returns the table and the headers of the columns left out (for a
    note; ``--json`` has them all).
    """
    stacked: set[int] = set()

    def cells(i: int) -> list[str]:
        texts = [columns[i].header] + [row[i] for row in rows]
        sep = columns[i].stack
        if i in stacked and sep:
            texts = [text.replace(sep, "\n" + sep.lstrip()) for text in texts]
        return texts

    def need(shown: list[int]) -> int:
        total = 2 * (len(shown) - 1)
        for i in shown:
            lines = [line for text in cells(i) for line in text.split("\n")]
            parts = [word for line in lines for word in line.split()] if columns[i].wrap else lines
            total += max((cell_len(part) for part in parts), default=0)
        return total

    shown = list(range(len(columns)))
    for i in shown:
        if need(shown) <= width:
            break
        if columns[i].stack:
            stacked.add(i)
    for i in sorted((i for i in shown if columns[i].drop), key=lambda i: (-columns[i].drop, -i)):
        if need(shown) <= width:
            break
        shown.remove(i)
    t = _table(title)
    for i in shown:
        t.add_column(columns[i].header, justify=columns[i].justify, overflow="fold",
                     no_wrap=not columns[i].wrap)
    texts = {i: cells(i)[1:] for i in shown}
    for r in range(len(rows)):
        t.add_row(*(texts[i][r] for i in shown))
    left_out = [" ".join(columns[i].header.split()) for i in range(len(columns)) if i not in shown]
    return t, left_out


def left_out_note(left_out: list[str], width: int) -> str | None:
    """The line under a :func:`fit_table` that left columns out (``None`` if none)."""
    if not left_out:
        return None
    return (f"{', '.join(left_out)}: left out to fit {width} columns (a wider terminal or "
            "--json shows them)")


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
    if exc is not None and "at most" in str(exc):
        return f"expected a whole number of bytes > 0, at most 2**60 (1 EiB); got {text!r}"
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
    from ..analysis.cost import DEFAULT_PROFILE, profile_names
    parser.add_argument("--profile", default=DEFAULT_PROFILE, metavar="NAME|FILE",
                        help=f"cost profile of the runtime {what}: "
                             f"{', '.join(profile_names())} or a profile YAML file "
                             f"(default {DEFAULT_PROFILE})")


def add_nccl_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nccl-version``, ``--nccl-algo``, ``--nccl-proto``: what the ``nccl`` row follows
    and is forced with (:mod:`topoplan.analysis.native.nccl_env`); checked as parsed."""
    from ..analysis.native import nccl_tables

    group = parser.add_argument_group("the nccl row (docs/NCCL_MODEL.md)")
    group.add_argument("--nccl-version", type=_nccl_setting("version"), metavar="X.Y",
                       help=f"the NCCL version whose tables price it: "
                            f"{', '.join(nccl_tables.VERSIONS)} "
                            f"(default {nccl_tables.DEFAULT_VERSION})")
    group.add_argument("--nccl-algo", type=_nccl_setting("algo"), metavar="LIST",
                       help="as NCCL_ALGO, e.g. 'ring' or 'ring;allreduce:tree' or '^nvls'")
    group.add_argument("--nccl-proto", type=_nccl_setting("proto"), metavar="LIST",
                       help="as NCCL_PROTO, e.g. 'simple' or '^ll,ll128'")


def _nccl_setting(name: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        from ..analysis.native.nccl_env import NcclSettings
        try:
            NcclSettings(**{name: text})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    check.__name__ = f"nccl-{name}"
    return check


def nccl_settings_of(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """The :func:`~topoplan.analysis.native.nccl_env.nccl_settings` a command's
    ``--nccl-*`` arguments ask for (nothing to set without them)."""
    from ..analysis.native.nccl_env import nccl_settings
    return nccl_settings(**{key: getattr(args, f"nccl_{key}", None)
                            for key in ("version", "algo", "proto")})


#: Seconds of work before a status shows in a pipe or a log: quick commands stay quiet.
QUIET_S = 2.0


@contextmanager
def status(message: str) -> Iterator[None]:
    """Show on stderr what the work inside the block is doing, with each step it reports
    (:func:`topoplan._util.step`). On a terminal (:func:`is_terminal`): a spinner
    line, rewritten at each step and gone at the end. Elsewhere (a pipe, a log): nothing
    for :data:`QUIET_S` seconds, then a plain line ``topoplan: ...`` saying what it is
    doing, and one more for a step at most every :data:`QUIET_S` seconds."""
    import threading
    import time

    from .._util import listening
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


def plan_name(schedule: Any) -> str:
    """How output names a plan: its planner, or ``auto (mcf)`` for one ``auto`` chose."""
    chosen = schedule.meta.get("chosen")
    algorithm = schedule.algorithm
    return f"{algorithm} ({chosen})" if chosen and chosen != algorithm else algorithm


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


# ---------------------------------------------------------------------------
# Ranks under mpiexec (bench, calibrate, launch)
# ---------------------------------------------------------------------------
#: The help of ``--share-gpus`` (calibrate and bench).
SHARE_GPUS_HELP = ("with --transport nccl: let several ranks use one GPU, for testing on a "
                   "machine with fewer GPUs than ranks; NCCL then treats each rank as a host "
                   "of its own and moves every message over its socket transport (loopback)")

#: The help of ``--mpiexec`` (bench, calibrate, launch).
MPIEXEC_HELP = ("the MPI launcher that starts the ranks: an mpiexec, mpirun or srun, as a path "
                "or a name on PATH (default: $TOPOPLAN_MPIEXEC, else the one that fits "
                "mpi4py's MPI library: the mpiexec next to this Python, one on PATH, or srun "
                "in a Slurm allocation)")

#: The variable through which the launching command tells its torch ranks their port.
ENV_PORT = "TOPOPLAN_BENCH_PORT"


def choose_port() -> None:
    """Pick the loopback port the ranks' torch.distributed group will meet at, for the
    ranks the launching command is about to start (they read :data:`ENV_PORT`)."""
    from ..runtime.transports.launch import free_port
    os.environ[ENV_PORT] = str(free_port())


def check_transport(transport: str, nranks: int, *, share_gpus: bool = False) -> None:
    """Fail before launching anything when the transport cannot run ``nranks`` here."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise TopoplanError(f"--transport {transport}: the ranks are launched with mpiexec, which "
                            "needs mpi4py: pip install 'topoplan[mpi]'") from None
    if share_gpus and transport != "nccl":
        raise TopoplanError(f"--share-gpus is for --transport nccl, not {transport}")
    if transport == "torch":
        try:
            import torch.distributed as dist
        except ImportError:
            raise TopoplanError("--transport torch needs PyTorch: pip install "
                                "'topoplan[torch]'") from None
        if not dist.is_available():
            raise TopoplanError("--transport torch: this PyTorch has no torch.distributed")
    elif transport == "nccl":
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError:
            raise TopoplanError("--transport nccl needs CuPy with NCCL and CUDA GPUs: pip "
                                "install 'topoplan[gpu]'") from None
        if not getattr(nccl, "available", True):
            raise TopoplanError("--transport nccl: this CuPy was built without NCCL")
        try:
            gpus = cupy.cuda.runtime.getDeviceCount()
        except Exception:  # noqa: BLE001 - no driver, no device: CuPy raises its own kinds
            gpus = 0
        if gpus == 0:
            raise TopoplanError("--transport nccl: this machine has no CUDA GPU")
        if gpus < nranks and not share_gpus:
            raise TopoplanError(f"--transport nccl -n {nranks}: needs one GPU per rank, this "
                                f"machine has {gpus} (for testing, --share-gpus lets ranks "
                                f"share them over NCCL's sockets)")


@contextmanager
def _joining_within(timeout: float, what: str) -> Iterator[None]:
    """End this rank with a located line if the block (joining the job) outlasts
    ``timeout`` s: a rank that died before joining leaves the others waiting in
    ``MPI_Init`` for ever, where no error reaches them. ``MPI_Init`` holds Python's
    lock, so no Python thread of this process could act: a shell says so, and
    :mod:`faulthandler`'s thread (which needs no lock) ends the rank with status 1 a
    moment later, so the launcher sees a failed rank."""
    import faulthandler
    import shlex
    import subprocess

    from ..runtime.mpirun import rank_and_size
    rank = (rank_and_size() or ("?", 0))[0]
    line = (f"topoplan: error: rank {rank}: {what} did not finish within {timeout:g} s: a rank "
            "died or hangs before it joined the job (its own output, or the launcher's, says "
            "which)")
    # A session of its own, ended whole: a sleep left behind would hold this rank's
    # stderr open, and the launcher waits for every copy of it to close.
    watchdog = subprocess.Popen(["sh", "-c", f"sleep {timeout:g} && echo {shlex.quote(line)} >&2"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True)
    with open(os.devnull, "w") as sink:
        faulthandler.dump_traceback_later(timeout + 0.5, exit=True, file=sink)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(watchdog.pid, signal.SIGKILL)
            watchdog.wait()


#: Set (to 1) by ``topoplan --verbose``, for the command and every process it starts.
ENV_VERBOSE = "TOPOPLAN_VERBOSE"


def verbose() -> bool:
    """Whether errors also show their traceback, and launchers their own reports
    (``topoplan --verbose``, or ``TOPOPLAN_VERBOSE=1``)."""
    return os.environ.get(ENV_VERBOSE, "") not in ("", "0")


def report(exc: BaseException) -> None:
    """A rank's error, as the command line shows one: ``topoplan: error: ...``, one line,
    and its traceback before it under ``--verbose``."""
    if verbose():
        import traceback
        traceback.print_exception(exc, file=sys.stderr)
    print(f"topoplan: error: {exc}", file=sys.stderr, flush=True)


def rank_transport(transport: str, *, timeout: float, share_gpus: bool = False) -> Any:
    """This rank's transport (:func:`topoplan.runtime.transports.connect`), in a job that bench or
    calibrate launched under mpiexec: MPI and NCCL over ``COMM_WORLD``; torch.distributed
    over gloo, the ranks meeting on loopback at the port the launching command chose
    (:func:`choose_port`), with ``timeout`` seconds for the process group.

    MPI runs a call's native steps with its blocking collectives (``blocking_natives``):
    a plan whose one step is ``MPI_Allreduce`` then costs what ``MPI_Allreduce`` costs
    (Open MPI's non-blocking ones took twice as long on the testbed: 136 against 67 ms
    at 4 MiB on two_leaf_oversubscribed's cut). Such a step has no deadline of its own;
    the job has one (``--timeout``), and a member that dies ends it with an error
    (ULFM)."""
    from ..runtime.transports import connect
    if transport == "mpi":
        with _joining_within(timeout, "MPI_Init"):
            return connect("mpi", blocking_natives=True)
    if transport == "nccl":
        return connect("nccl", share_gpus=share_gpus)
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        raise TopoplanError("--transport torch needs PyTorch: pip install "
                            "'topoplan[torch]'") from None
    from ..runtime.mpirun import rank_and_size
    rank, size = rank_and_size() or (0, 1)
    port = os.environ.get(ENV_PORT, "29517")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return connect("torch", init_method=f"tcp://127.0.0.1:{port}", rank=rank, size=size,
                   backend="gloo", timeout=timeout)
