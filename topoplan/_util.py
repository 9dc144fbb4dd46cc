"""The package's small helpers, each a few lines, used across the layers.

- :func:`atomic_write`: the one way topoplan writes a file, where ``>`` would and whole
  or not at all where the target allows it (:class:`Terminated`: its SIGTERM);
- :class:`ObjectCache`: a value computed once per live object, keyed by identity;
- :func:`no_gc`: a function run with the cyclic garbage collector paused;
- :func:`step` and :func:`listening`: what long work is doing now, for whoever shows it;
- :func:`signals_raise`: SIGTERM and SIGHUP end the work the way Ctrl-C does.
"""

from __future__ import annotations

import errno
import functools
import gc
import os
import signal
import stat
import tempfile
import threading
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, Generic, Iterator, ParamSpec, TypeVar

__all__ = ["atomic_write", "open_mode", "Terminated", "ObjectCache", "no_gc", "step", "listening",
           "signals_raise"]

K = TypeVar("K")
V = TypeVar("V")
P = ParamSpec("P")
R = TypeVar("R")


# ----------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------
# Every file topoplan writes for a user (plans, profiles, cluster YAML, MSCCL XML, figures)
# and the files its processes hand each other go through atomic_write. It writes where
# the shell's ``>`` would, with the permissions ``>`` has, and whole or not at all where
# the target allows it: a regular file (or a new path) gets a temporary file in the same
# folder, renamed over it, so a crash, a full disk, a SIGTERM or a Ctrl-C never leaves
# half a file behind. ``mkstemp`` makes that temporary file private (0600); the writer
# gives it the mode ``open(path, "w")`` would have given: an existing file's own mode,
# else 0666 less the umask (0644 under umask 022). What a rename would break is written
# in place instead: a device or FIFO (``-o /dev/null`` stays a device), a file with other
# hard links, a file the user may write in a folder they may not, or one owned by someone
# the writer cannot give the new file to.

#: Bytes per write(2) of a temporary file: between two, a SIGTERM or Ctrl-C can end it.
_CHUNK = 1 << 20


class Terminated(SystemExit):
    """SIGTERM, raised where it lands during :func:`atomic_write` once the temporary
    file is gone: the process then exits with status 143 (128 + SIGTERM), as the signal's
    default action would have ended it, without a traceback; the CLI says
    ``topoplan: terminated``."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextmanager
def _sigterm(at_once: bool) -> Iterator[Callable[[], None]]:
    """Within the block, SIGTERM raises :class:`Terminated` and SIGINT (Ctrl-C)
    :class:`KeyboardInterrupt`: where they land (``at_once``), or where the block calls
    the check it is handed, and at the end of the block at the latest. Checks put the
    exception where the block can clean up after it: a signal landing between creating a
    temporary file and noting its name would leave it behind.

    Only in the main thread (where Python runs signal handlers), and each signal only
    while it has its default action (Python's own for SIGINT): a handler of the
    program's own (or SIG_IGN) is left to decide.
    """
    pending: list[int] = []

    def check() -> None:
        if signal.SIGTERM in pending:
            raise Terminated()
        if pending:
            raise KeyboardInterrupt()

    if threading.current_thread() is not threading.main_thread():
        yield check
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    term, interrupt = previous[signal.SIGTERM], previous[signal.SIGINT]
    ours = ([signal.SIGTERM] if term is signal.SIG_DFL or getattr(term, "unwinds", False)
            else []) + ([signal.SIGINT] if interrupt is signal.default_int_handler else [])
    if not ours:
        yield check
        return

    def handler(signum: int, frame: object) -> None:
        pending.append(signum)
        if at_once:
            check()

    # The CLI's own handler (signals_raise: ``unwinds``) raises wherever the signal
    # lands: this one takes over while the file is written, and gives it back.
    for sig in ours:
        signal.signal(sig, handler)
    try:
        yield check
    finally:
        for sig in ours:
            signal.signal(sig, previous[sig])
        check()  # the signal wins over an error of the block's: the process still ends


def _umask() -> int:
    """The process's umask. Read from /proc where it is (Linux 4.7+): setting it to read it
    would leave other threads a moment with umask 0."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_mode(path: str | os.PathLike) -> int:
    """The permission bits ``open(path, "w")`` leaves ``path`` with: its own if it exists,
    else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _may_write(path: Path) -> bool:
    """Whether this process may open ``path`` for writing, as the kernel decides for the
    shell's ``>``: by the effective user and groups, so root may (it overrides a 0444
    mode, as ``echo x > file`` as root does) and anyone else needs a write bit."""
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK, effective_ids=effective)


def _error(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` naming ``path`` (the user's name for it), not a temporary file's."""
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def _write_fd(fd: int, payload: bytes, check: Callable[[], None]) -> None:
    """All of ``payload`` to ``fd``, a chunk at a time, calling ``check`` after each."""
    view = memoryview(payload)
    while view:
        done = os.write(fd, view[:_CHUNK])
        view = view[done:]
        check()


def _write_in_place(target: Path, payload: bytes, *, regular: bool) -> None:
    """Open ``target`` and write ``payload`` into it, as ``>`` does: truncated first for
    a regular file, whose write a SIGTERM or Ctrl-C then waits for; a device or FIFO is
    written as it is, and a signal ends the write at once (a FIFO's open waits for a reader, as the
    shell's does, and a pipe's write may wait for ever)."""
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_TRUNC if regular else 0)
    with _sigterm(at_once=not regular):
        fd = os.open(target, flags)
        try:
            _write_fd(fd, payload, lambda: None)
        finally:
            os.close(fd)


def _replace(target: Path, payload: bytes, old: os.stat_result | None) -> bool:
    """Write ``payload`` to a temporary file beside ``target`` and rename it over; False
    (nothing written, nothing left) when the new file could not take ``old``'s owner and
    group, or the folder refuses a new file while ``old`` exists: then write in place."""
    mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
    tmp: str | None = None
    with _sigterm(at_once=False) as check:
        try:
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            except PermissionError:
                if old is not None:
                    return False
                raise
            try:
                _write_fd(fd, payload, check)
            finally:
                os.close(fd)
            if old is not None and (old.st_uid != os.geteuid() or old.st_gid != os.getegid()):
                try:
                    os.chown(tmp, old.st_uid, old.st_gid)
                except PermissionError:
                    os.unlink(tmp)
                    return False
            os.chmod(tmp, mode)
            check()
            os.replace(tmp, target)
            tmp = None
        except BaseException:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
    return True


def atomic_write(path: str | os.PathLike, data: str | bytes, *, encoding: str = "utf-8") -> None:
    """Write ``data`` (text or bytes) to ``path`` where the shell's ``>`` would, with its
    permissions and the mode ``open(path, "w")`` gives, whole or not at all where the
    target allows it.

    - A new path, or a regular file with no other hard link that this process may write:
      written to a hidden temporary file in the same folder (``.NAME.XXXXXXXX``), given the
      file's mode, owner and group, and renamed over it: readers see the old file or the
      new one, never a part. A file owned by someone else that only root could hand back
      to them, or whose folder refuses new files, is written in place instead.
    - A symbolic link: followed to its target, which these rules then write (a regular
      target is replaced, the link stays a link; a dangling link's target is created).
    - A device, FIFO or socket: opened and written, never replaced (``-o /dev/null``
      writes nothing anywhere; a FIFO's open waits for a reader, as the shell's does).
    - A regular file with other hard links: truncated and written in place, so every
      link sees the new text. What is lost is atomicity: a crash or a full disk part
      way leaves a part of the new text (a SIGTERM or Ctrl-C waits for the write to
      end).
    - A file this process may not write: refused, as ``>`` refuses it. Whether it may
      is the kernel's ``access(W_OK)`` answer for the effective user: root may write a
      0444 file (as ``echo x > file`` as root does), anyone else gets EACCES.

    A SIGTERM during the write (in the main thread, while SIGTERM has its default
    action) removes the temporary file, then ends the process with status 143
    (:class:`Terminated`); a Ctrl-C (while SIGINT has Python's handler) removes it, then
    raises :class:`KeyboardInterrupt`. Both wait until the temporary file's name is
    known, or the end of a chunk. Extended attributes and ACLs of a replaced file are
    not copied to the new one.

    Raises
    ------
    OSError
        As ``open()`` would (missing folder, no permission: ``PermissionError``, a
        folder: ``IsADirectoryError``, full disk), naming ``path``, with nothing left
        behind: neither the temporary file nor, where it was replaced, a partial file.
    """
    payload = data.encode(encoding) if isinstance(data, str) else data
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        try:
            old: os.stat_result | None = os.stat(target)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if old is not None and not stat.S_ISREG(old.st_mode):
            _write_in_place(target, payload, regular=False)
            return
        if old is not None and not _may_write(target):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        if old is not None and old.st_nlink > 1:
            _write_in_place(target, payload, regular=True)
            return
        if not _replace(target, payload, old):
            _write_in_place(target, payload, regular=True)
    except OSError as exc:
        raise _error(exc, path) from None


# ----------------------------------------------------------------------------------
# Caches and the garbage collector
# ----------------------------------------------------------------------------------
class ObjectCache(Generic[K, V]):
    """``compute(obj)``, computed once per live object and keyed by identity.

    An entry goes away with its object (``weakref.finalize``), so the cache never keeps
    an object alive; values must not refer back to their object. It suits objects that
    are slow to hash (a schedule of millions of ops, a frozen cluster of a thousand
    boxes): the simulator's flattened schedules and the bound's bottleneck cuts.
    """

    def __init__(self, compute: Callable[[K], V]) -> None:
        self._compute = compute
        self._values: dict[int, V] = {}

    def __call__(self, obj: K) -> V:
        key = id(obj)
        try:
            return self._values[key]
        except KeyError:
            pass
        value = self._compute(obj)
        self._values[key] = value
        weakref.finalize(obj, self._values.pop, key, None)
        return value

    def __len__(self) -> int:
        return len(self._values)


def no_gc(function: Callable[P, R]) -> Callable[P, R]:
    """Run ``function`` with the cyclic garbage collector paused.

    A plan allocates millions of small acyclic objects (Ops, tuples); CPython's
    collector would rescan them over and over while they are built (measured: about
    half the time of a planner at 192 ranks, 40% of :func:`topoplan.ir.passes.vectorize`
    on 1024). Nothing built under it forms cycles.
    """
    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():
            return function(*args, **kwargs)
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            gc.enable()
    return wrapper


# ----------------------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------------------
# Long loops (auto's candidates, a size sweep) call step() with a few words per step; it
# costs nothing unless a caller listens (listening()), as the CLI's status line does
# (topoplan.commands.common.status). The library itself never prints.

_SINK: ContextVar[Callable[[str], None] | None] = ContextVar("topoplan_progress", default=None)


def step(text: str) -> None:
    """Say what the work does now, e.g. ``"mcf: planning 256 ranks"``: handed to the
    :func:`listening` sink around it, if any."""
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


# ----------------------------------------------------------------------------------
# Signals
# ----------------------------------------------------------------------------------
# kill, timeout and batch schedulers send SIGTERM; a closed terminal sends SIGHUP. Python's
# default for both is to die at once, skipping every finally: a launcher started in a
# session of its own (mpiexec, torchrun) and its ranks would run on, and scratch folders
# and testbed namespaces would stay. Raised as an exception instead, they unwind like
# Ctrl-C.

@contextmanager
def signals_raise() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise :class:`~topoplan.errors.Terminated` (a
    :class:`KeyboardInterrupt`) in the main thread; outside it, the handlers before.
    Elsewhere than the main thread it changes nothing."""
    from .errors import Terminated

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    handler.unwinds = True  # type: ignore[attr-defined] # atomic_write's _sigterm takes over
    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
