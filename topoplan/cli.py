"""The ``topoplan`` command line.

Each command lives in ``topoplan/commands/<name>.py`` with ``register(subparsers)``;
the parser it adds sets ``func(args) -> int``. A mistake in the arguments is one line,
``topoplan <cmd>: error: ...``, exit status 2 (:class:`~topoplan.commands.common.ArgumentParser`).
Errors a user can cause
(:class:`TopoplanError`) print ``topoplan: error: ...`` and exit 1, without a traceback;
warnings (:class:`TopoplanWarning`) print ``topoplan: warning: ...``, one line each.
Ctrl-C prints ``topoplan: interrupted`` (exit 130); a SIGTERM that lands while a file is
written (``-o``) removes the temporary file and prints ``topoplan: terminated`` (exit
143); elsewhere SIGTERM keeps its default action (a rank under mpiexec must not run
``MPI_Finalize`` on its way out).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

from ._util import Terminated
from .errors import TopoplanError, TopoplanWarning

COMMANDS = ("topo", "plan", "verify", "simulate", "bench", "calibrate", "show", "launch",
            "testbed", "export", "import", "estimate", "doctor")
#: Commands whose module name differs from the command (``import`` is a keyword).
_MODULES = {"import": "imports"}


def _traceback(show: bool) -> None:
    """Under ``--verbose``, the traceback of the error being handled, before its line."""
    if show:
        import traceback
        traceback.print_exc(file=sys.stderr)


#: What a command says when a signal ends it.
_TERMINATED = {signal.SIGTERM: "topoplan: terminated", signal.SIGHUP: "topoplan: terminated (SIGHUP)"}


def build_parser() -> argparse.ArgumentParser:
    from .commands.common import ArgumentParser, plain_help
    parser = ArgumentParser(
        prog="topoplan",
        description="Topology-aware allreduce: plan, verify, simulate and run schedules.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"topoplan {__version__}")
    parser.add_argument("--verbose", action="store_true", dest="show_tracebacks",
                        help="with an error, also print its traceback, on every rank, and "
                             "let launchers print their own reports (also "
                             "TOPOPLAN_VERBOSE=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module_name = f"topoplan.commands.{_MODULES.get(name, name)}"
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # not built yet
            raise
        module.register(subparsers)
    plain_help(parser)  # descriptions taken from docstrings keep no ``markup``
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for the commands that run a program (``launch``, ``testbed run``:
    a ``command`` list), everything after the first ``--`` is that program, whatever
    options and positionals come before it (argparse alone would hand ``testbed run
    CLUSTER --transport torch -- CMD`` the option as part of CMD)."""
    if "--" in argv:
        cut = argv.index("--")
        head = parser.parse_args(argv[:cut])
        if isinstance(getattr(head, "command", None), list) and not head.command:
            head.command = argv[cut + 1:]
            return head
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        from .commands.common import show_warning
        with warnings.catch_warnings():
            # Each warning once per command (a file read twice warns once), one line each.
            warnings.simplefilter("default", TopoplanWarning)
            warnings.showwarning = show_warning
            return _main(argv)
    except KeyboardInterrupt:  # while the commands load, before _main's own handler
        print("topoplan: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = _parse(parser, sys.argv[1:] if argv is None else list(argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from contextlib import nullcontext

    from ._util import signals_raise
    from .commands.common import ENV_VERBOSE, nccl_settings_of, verbose
    if getattr(args, "show_tracebacks", False):
        os.environ[ENV_VERBOSE] = "1"  # for the ranks and launchers it starts too
    from .runtime.mpirun import inside_mpi
    # SIGTERM/SIGHUP unwind like Ctrl-C: launchers and their ranks end, scratch goes. Not
    # in an MPI rank: one that unwound would run MPI_Finalize, which waits for dead peers;
    # the signal's own default ends it at once.
    unwind = nullcontext() if inside_mpi() else signals_raise()
    try:
        with unwind, nccl_settings_of(args):
            return int(args.func(args) or 0)
    except TopoplanError as exc:
        _traceback(verbose())
        print(f"topoplan: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # files the user named: missing folders, permissions, full disks
        if exc.filename is None:
            raise
        _traceback(verbose())
        print(f"topoplan: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM/SIGHUP (signals_raise)
        _traceback(verbose())
        signum = getattr(exc, "signum", signal.SIGINT)
        print("topoplan: interrupted" if signum == signal.SIGINT else _TERMINATED[signum],
              file=sys.stderr)
        return 128 + signum
    except Terminated:  # SIGTERM during a write (atomic_write), its temporary file removed
        print(_TERMINATED[signal.SIGTERM], file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        return 0
