"""The package's small helpers, each a few lines, used across the layers.

- :func:`atomic_write`: the one way topoplan writes a file, whole or not at all;
- :class:`ObjectCache`: a value computed once per live object, keyed by identity;
- :func:`no_gc`: a function run with the cyclic garbage collector paused;
- :func:`step` and :func:`listening`: what long work is doing now, for whoever shows it;
- :func:`signals_raise`: SIGTERM and SIGHUP end the work the way Ctrl-C does.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import stat
import tempfile
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Callable, Generic, Iterator, ParamSpec, TypeVar

__all__ = ["atomic_write", "open_mode", "ObjectCache", "no_gc", "step", "listening",
           "signals_raise"]

K = TypeVar("K")
V = TypeVar("V")
P = ParamSpec("P")
R = TypeVar("R")


# ----------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------
# Every file topoplan writes for a user (plans, profiles, cluster YAML, MSCCL XML, figures)
# and the files its processes hand each other go through atomic_write. The text is written
# to a temporary file in the same folder and renamed over the target, so a crash or a full
# disk never leaves half a file behind. ``mkstemp`` makes that temporary file private
# (0600); the writer gives it the mode ``open(path, "w")`` would have given: an existing
# file's own mode, else 0666 less the umask (0644 under umask 022).

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


def atomic_write(path: str | os.PathLike, data: str | bytes, *, encoding: str = "utf-8") -> None:
    """Write ``data`` (text or bytes) to ``path`` whole or not at all, with the mode
    ``open(path, "w")`` gives.

    Raises
    ------
    OSError
        As ``open()`` would (missing folder, no permission, full disk), with nothing
        left behind: neither the temporary file nor a partial ``path``.
    """
    path = Path(path)
    mode = open_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode(encoding) if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
