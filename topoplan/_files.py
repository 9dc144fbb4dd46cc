"""The one way topoplan writes a file: whole or not at all, with the mode ``open()`` gives.

Every file topoplan writes for a user (plans, profiles, cluster YAML, MSCCL XML, figures)
and the files its processes hand each other go through :func:`atomic_write`. The text is
written to a temporary file in the same folder and renamed over the target, so a crash or
a full disk never leaves half a file behind. ``mkstemp`` makes that temporary file
private (0600); the writer gives it the mode ``open(path, "w")`` would have given:
an existing file's own mode, else 0666 less the umask (0644 under umask 022).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "open_mode"]


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
    """Write ``data`` (text or bytes) to ``path`` whole or not at all.

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
