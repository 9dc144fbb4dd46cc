"""``-o`` writes where the shell's ``>`` would (topoplan._util.atomic_write): a device or
FIFO is written, not replaced; a symlink is followed and kept; a read-only file is
refused as ``>`` refuses it; hard links keep sharing the file; a SIGTERM leaves neither
a temporary file nor a truncated one. Each case runs the real command line in a
subprocess, as root and as an unprivileged user (``setpriv`` to nobody)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from topoplan._util import atomic_write

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "topologies" / "ddl_two_switch.yaml"
NOBODY = 65534
GENERATE = ["topo", "generate", "fat-tree", "--boxes", "2", "--gpus", "2"]

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, setpriv)")


def _nobody_reaches_the_checkout() -> bool:
    """Whether nobody can run this Python on this checkout: a clone in a folder only root
    may enter (``mktemp -d`` makes them 0700) cannot be tested as another user."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-c", "import topoplan"], cwd=ROOT,
                          capture_output=True)
    return done.returncode == 0


as_nobody = pytest.mark.skipif(not _nobody_reaches_the_checkout(),
                               reason="needs root, setpriv, and a checkout nobody may read")
USERS = [pytest.param("root", marks=root_only), pytest.param("nobody", marks=as_nobody)]


@pytest.fixture
def place():
    """A folder every user can reach (pytest's own tmp folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="topoplan-writes-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def own(path: Path, user: str) -> None:
    """Hand ``path`` to ``user`` (root keeps it)."""
    if user == "nobody":
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def cli(user: str, *argv: str, home: Path, **kwargs) -> subprocess.Popen:
    """``topoplan ARGV`` as ``user``, its stdout and stderr captured."""
    prefix = ([] if user == "root" else
              ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"])
    env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1",
           "COLUMNS": "100"}
    return subprocess.Popen([*prefix, sys.executable, "-m", "topoplan", *argv], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def run(user: str, *argv: str, home: Path) -> subprocess.CompletedProcess:
    proc = cli(user, *argv, home=home)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def generated() -> str:
    """What ``topo generate`` writes (its stdout without -o)."""
    proc = subprocess.run([sys.executable, "-m", "topoplan", *GENERATE], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return proc.stdout


def leftovers(folder: Path) -> list[str]:
    """Hidden temporary files (``.NAME.XXXXXXXX``) left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("user", USERS)
def test_a_character_device_stays_a_device(place, user):
    """``-o`` to a device node (a null device made here, as /dev/null is) writes into it:
    it was replaced by a regular file, so ``-o /dev/null`` as root replaced /dev/null."""
    device = place / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod is not allowed here")
    device.chmod(0o666)
    before = os.stat(device)
    for argv in (["plan", str(CLUSTER), "-a", "ring", "--size", "1MiB", "-o", str(device)],
                 [*GENERATE, "-o", str(device)]):
        proc = run(user, *argv, home=place)
        assert proc.returncode == 0, proc.stderr
        after = os.stat(device)
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
        assert (after.st_ino, stat.S_IMODE(after.st_mode)) == (before.st_ino, 0o666)
    assert leftovers(place) == []


@pytest.mark.parametrize("user", USERS)
def test_a_fifo_is_written_to_its_reader(place, user):
    fifo = place / "pipe"
    os.mkfifo(fifo, 0o666)
    fifo.chmod(0o666)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = run(user, *GENERATE, "-o", str(fifo), home=place)
    reader.join(timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert got == [generated().encode()]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(place) == []


@pytest.mark.parametrize("user", USERS)
def test_a_symlink_is_followed_and_kept(place, user):
    """The link's target is replaced (atomically: it is a regular file); the link stays a
    link, and a dangling link's target is created, as ``>`` creates it."""
    folder = place / "plans"
    folder.mkdir()
    target = folder / "target.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    link = place / "link.yaml"
    link.symlink_to(target)
    dangling = place / "dangling.yaml"
    dangling.symlink_to(folder / "new.yaml")
    for path in (folder, target, link, dangling):
        own(path, user)
    for path in (link, dangling):
        proc = run(user, *GENERATE, "-o", str(path), home=place)
        assert proc.returncode == 0, proc.stderr
        assert path.is_symlink()
    assert target.read_text() == generated() == (folder / "new.yaml").read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert leftovers(place) == leftovers(folder) == []


@pytest.mark.parametrize("user", USERS)
def test_a_read_only_file_is_refused_as_the_shell_refuses_it(place, user):
    """0444: the shell's ``>`` says "Permission denied" to a user, and writes as root
    (root overrides permissions): topoplan does the same, as access(W_OK) answers."""
    path = place / "plan.json"
    path.write_text("old\n")
    path.chmod(0o444)
    own(path, user)
    shell = subprocess.run(
        (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
         if user == "nobody" else []) + ["sh", "-c", f"echo x >> '{path}'"],
        capture_output=True, text=True)
    proc = run(user, "plan", str(CLUSTER), "-a", "ring", "--size", "1MiB", "-o", str(path),
               home=place)
    if user == "root":
        assert shell.returncode == 0 and proc.returncode == 0, proc.stderr
        assert path.read_text().startswith("{") and stat.S_IMODE(path.stat().st_mode) == 0o444
    else:
        assert shell.returncode != 0 and "Permission denied" in shell.stderr
        assert proc.returncode == 1
        assert proc.stderr.splitlines()[-1:] == [f"topoplan: error: {path}: cannot write "
                                                 "schedule: Permission denied"], proc.stderr
        assert "Traceback" not in proc.stderr
        assert path.read_text() == "old\n"
        proc = run(user, *GENERATE, "-o", str(path), home=place)
        assert (proc.returncode, proc.stderr) == (
            1, f"topoplan: error: {path}: Permission denied\n")
    assert leftovers(place) == []


@pytest.mark.parametrize("user", USERS)
def test_hard_links_keep_sharing_the_file(place, user):
    first = place / "a.yaml"
    first.write_text("old\n")
    second = place / "b.yaml"
    os.link(first, second)
    own(first, user)
    if user == "nobody":
        place.chmod(0o777)
    proc = run(user, *GENERATE, "-o", str(second), home=place)
    assert proc.returncode == 0, proc.stderr
    assert first.read_text() == second.read_text() == generated()
    assert os.stat(first).st_ino == os.stat(second).st_ino and os.stat(first).st_nlink == 2
    assert leftovers(place) == []


@as_nobody
def test_the_owner_and_a_read_only_folder_are_respected(place):
    """Root writing a user's file leaves it the user's (the shell's ``>`` keeps the
    inode); a user's writable file in a folder they may not write is written in place."""
    mine = place / "mine.yaml"
    mine.write_text("old\n")
    own(mine, "nobody")
    proc = run("root", *GENERATE, "-o", str(mine), home=place)
    assert proc.returncode == 0, proc.stderr
    assert (mine.stat().st_uid, mine.stat().st_gid) == (NOBODY, NOBODY)
    assert mine.read_text() == generated()
    mine.write_text("old\n")
    proc = run("nobody", *GENERATE, "-o", str(mine), home=place)  # place is root's, 0755
    assert proc.returncode == 0, proc.stderr
    assert mine.read_text() == generated() and leftovers(place) == []
    proc = run("nobody", *GENERATE, "-o", str(place / "new.yaml"), home=place)
    assert (proc.returncode, proc.stderr) == (
        1, f"topoplan: error: {place / 'new.yaml'}: Permission denied\n")


def test_a_sigterm_during_a_cli_write_leaves_no_temporary_file(tmp_path):
    """The write is held at its first chunk (patched in the child) until SIGTERM comes:
    the temporary file goes, the old plan stays, ``topoplan: terminated``, exit 143."""
    path = tmp_path / "plan.json"
    path.write_text("old\n")
    script = (
        "import sys, time\n"
        "import topoplan._util as u\n"
        "real = u._write_fd\n"
        "def held(fd, payload, check):\n"
        "    sys.stderr.write('writing\\n'); sys.stderr.flush()\n"
        "    end = time.monotonic() + 60\n"
        "    while time.monotonic() < end:\n"
        "        time.sleep(0.01); check()\n"
        "    real(fd, payload, check)\n"
        "u._write_fd = held\n"
        "from topoplan.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", script, "plan", str(CLUSTER), "-a", "ring",
                             "--size", "1MiB", "-o", str(path)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line == "writing\n", line + proc.stderr.read()
    assert len(leftovers(tmp_path)) == 1  # the temporary file, being written
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM, err
    assert err == "topoplan: terminated\n"
    assert path.read_text() == "old\n" and leftovers(tmp_path) == []


def test_a_sigterm_during_a_large_write_leaves_the_old_file_or_the_new_one(tmp_path):
    """A real 96 MiB write through the API, SIGTERM sent as soon as its temporary file
    shows: the process exits 143, no temporary file is left, and the file is the old one
    or the whole new one (here always the old: the signal lands within the write)."""
    size = 96 << 20
    path = tmp_path / "big.bin"
    script = ("import sys\nfrom topoplan._util import atomic_write\n"
              f"atomic_write(sys.argv[1], b'x' * {size})\n")
    cut = 0
    for _ in range(3):
        path.write_bytes(b"old")
        proc = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=ROOT)
        end = time.monotonic() + 60
        while not leftovers(tmp_path) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.0005)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert leftovers(tmp_path) == []
        if code == 0:  # finished before the signal came
            assert path.stat().st_size == size
            continue
        assert code in (128 + signal.SIGTERM, -signal.SIGTERM)
        assert path.read_bytes() == b"old" or path.stat().st_size == size
        cut += code == 128 + signal.SIGTERM
    assert cut, "no SIGTERM landed within the write in 3 tries"


def test_a_write_from_another_thread_leaves_signals_alone(tmp_path):
    """Python runs signal handlers in the main thread only: another thread's write
    touches no handler (and writes as usual)."""
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=atomic_write, args=(tmp_path / "t.txt", "text"))
    thread.start()
    thread.join()
    assert (tmp_path / "t.txt").read_text() == "text"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_folder_and_a_missing_folder_are_named(tmp_path):
    with pytest.raises(IsADirectoryError) as exc:
        atomic_write(tmp_path, "x")
    assert exc.value.filename == str(tmp_path)
    with pytest.raises(FileNotFoundError) as missing:
        atomic_write(tmp_path / "no" / "plan.json", "x")
    assert missing.value.filename == str(tmp_path / "no" / "plan.json")
    assert list(tmp_path.iterdir()) == []
