"""Faults with real processes: SIGTERM to a front-end ends its whole job, and a rank
killed with SIGKILL is named by every survivor, fast, with nothing left behind.

Each job carries a marker in its environment, which every process it starts inherits
(mpiexec's ranks, torchrun's workers, the testbed's): what is left after the job is
found by that marker in ``/proc/*/environ``, so a test on another pytest-xdist worker is
never mistaken for a leftover. Each job's ``TMPDIR`` is a folder of the test's own, which
must be empty afterwards (the launcher's session files, topoplan's scratch).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from .support.netns import needs_netns

ROOT = Path(__file__).resolve().parent.parent
MARK = "TOPOPLAN_FAULT_TEST"
#: What every survivor must do within this many seconds of the fault: end, having said so.
WITHIN = 10.0
SLEEP = "import time; time.sleep(120)"


def marked(mark: str, rank_var: str | None = None) -> dict[int, str | None]:
    """The live processes whose environment holds ``MARK=mark``: pid -> the value of
    ``rank_var`` in it (None without one)."""
    found: dict[int, str | None] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text()
        except OSError:
            continue
        if f"{MARK}={mark}".encode() not in env:
            continue
        if state[state.rindex(")") + 2:].split()[0] == "Z":
            continue  # a zombie has ended: its parent has only not reaped it yet
        value = None
        if rank_var is not None:
            for item in env:
                if item.startswith(f"{rank_var}=".encode()):
                    value = item.split(b"=", 1)[1].decode()
        found[int(entry.name)] = value
    return found


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone
        return b""


class Job:
    """A ``topoplan`` command started as a user would, with a marker and its own TMPDIR."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                 python: bool = False) -> None:
        self.mark = uuid.uuid4().hex
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, **(env or {}), MARK: self.mark, "TMPDIR": str(self.tmp)}
        argv = [sys.executable, *args] if python else [sys.executable, "-m", "topoplan", *args]
        # SIGINT as at a terminal: a test runner's worker may ignore it, and a program
        # started with it ignored keeps it so (Python installs no Ctrl-C handler then).
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_default_sigint)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_ready(self, count: int, timeout: float = 120.0) -> None:
        """Wait until ``count`` lines ``READY <rank>`` came."""
        deadline = time.monotonic() + timeout
        while sum(line.startswith("READY ") for line in self.lines) < count:
            assert time.monotonic() < deadline and self.proc.poll() is None, (
                self.lines, self.proc.poll())
            time.sleep(0.1)

    def wait_for(self, count: int, rank_var: str | None = None, timeout: float = 120.0,
                 settle: float = 2.0) -> dict[int, str | None]:
        """Wait until ``count`` marked processes with ``rank_var`` set run, then
        ``settle`` seconds more (into the work)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
            found = {p: r for p, r in marked(self.mark, rank_var).items()
                     if rank_var is None or r is not None}
            if len(found) >= count:
                time.sleep(settle)
                return found
            time.sleep(0.1)
        self.proc.kill()
        raise AssertionError(f"{count} processes did not start within {timeout} s")

    def end(self) -> tuple[int, str, float]:
        """The exit status, stderr and seconds it took to end from now (at most WITHIN,
        else the test fails, after killing what is left)."""
        start = time.monotonic()
        try:
            self.proc.wait(timeout=WITHIN + 20)
            self._reader.join(5)
            assert self.proc.stderr is not None
            err = self.proc.stderr.read()
        finally:
            self.proc.kill()
            for pid in marked(self.mark):
                os.kill(pid, signal.SIGKILL)
        return self.proc.returncode, err, time.monotonic() - start

    def nothing_left(self) -> None:
        deadline = time.monotonic() + 3
        while marked(self.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not marked(self.mark), "processes outlived the job"
        assert not list(self.tmp.iterdir()), f"left in TMPDIR: {list(self.tmp.iterdir())}"


BENCH = ["bench", "--cluster", "topologies/ddl_two_switch.yaml", "--algorithm", "ring",
         "--sizes", "16MiB", "--iters", "100000", "--timeout", "60"]


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["bench-mpi", "bench-torch", "launch-mpi", "launch-torch",
                                  "bench-mpi-SIGINT", "launch-torch-SIGHUP"])
def test_sigterm_ends_the_front_end_the_launcher_and_every_rank(case, tmp_path):
    pytest.importorskip("mpi4py")
    command, transport, *sig = case.split("-")
    signum = getattr(signal, sig[0]) if sig else signal.SIGTERM
    if transport == "torch":
        pytest.importorskip("torch")
    if command == "bench":
        job = Job(tmp_path, *BENCH, "--transport", transport)
        job.wait_for(4, "OMPI_COMM_WORLD_RANK")
    else:
        job = Job(tmp_path, "launch", "-n", "2", "--transport", transport, "--",
                  "python", "-c", SLEEP)
        job.wait_for(2, "OMPI_COMM_WORLD_RANK" if transport == "mpi" else "LOCAL_RANK",
                     settle=0.5)
    job.proc.send_signal(signum)
    code, err, took = job.end()
    assert code == 128 + signum, err
    assert err.strip().splitlines()[-1] == {
        signal.SIGTERM: "topoplan: terminated", signal.SIGINT: "topoplan: interrupted",
        signal.SIGHUP: "topoplan: terminated (SIGHUP)"}[signum], err
    assert "Traceback" not in err, err
    assert took < WITHIN, f"took {took:.1f} s"
    job.nothing_left()


@pytest.mark.mpi
def test_two_bench_jobs_at_once_both_run(tmp_path):
    """Each job picks its own port and scratch: neither sees the other."""
    pytest.importorskip("mpi4py")
    args = ["bench", "--cluster", "topologies/ddl_two_switch.yaml", "--algorithm", "ring",
            "--sizes", "1MiB", "--iters", "20"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    jobs = [Job(tmp_path / "a", *args), Job(tmp_path / "b", *args, "--transport", "torch")]
    for job in jobs:
        job.proc.wait(timeout=180)
        job._reader.join(5)
        err = job.proc.stderr.read() if job.proc.stderr else ""
        assert job.proc.returncode == 0, err
        rows = [line.split() for line in job.lines if line.strip() and not line.startswith("#")]
        assert rows and rows[0][-1] == "0", job.lines  # #wrong
        job.nothing_left()


FRONT = ("import sys; from topoplan.commands.common import choose_port; "
         "from topoplan.runtime.mpirun import mpiexec; choose_port(); "
         "sys.exit(mpiexec(4, [sys.executable, '-m', 'tests.support.fault_rank', sys.argv[1]], "
         "fault_tolerant=True, capture=False).returncode)")


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["mpi", "torch"])
def test_every_survivor_of_a_killed_rank_says_so_fast_and_names_it(transport, tmp_path):
    """What bench's ranks do (tests/support/fault_rank.py): rank 1 is killed once every
    rank is in the loop of planned allreduces."""
    pytest.importorskip("mpi4py")
    if transport == "torch":
        pytest.importorskip("torch")
    job = Job(tmp_path, "-c", FRONT, transport, python=True)
    job.wait_ready(4)
    ranks = marked(job.mark, "OMPI_COMM_WORLD_RANK")
    victim = next(pid for pid, rank in ranks.items() if rank == "1")
    os.kill(victim, signal.SIGKILL)
    code, err, took = job.end()
    assert code != 0, err
    assert "Traceback" not in err, err
    assert took < WITHIN, f"took {took:.1f} s:\n{err}"
    lines = [line for line in err.splitlines() if line.startswith("topoplan: error: rank ")]
    said = {int(re.match(r"topoplan: error: rank (\d+):", line).group(1)): line
            for line in lines}
    assert sorted(said) == [0, 2, 3], err
    for rank, line in said.items():
        if transport == "mpi":  # ULFM tells every survivor which rank failed
            assert "rank 1 died" in line, line
        else:  # gloo tells the peer whose connection closed: rank 1, or one that left
            assert "died or left" in line and re.search(r"(from|to) peer \d", line), line
    if transport == "torch":
        assert any(re.search(r"(from|to) peer 1 failed", line) for line in lines), err
    job.nothing_left()


AGREE_PROGRAM = textwrap.dedent("""
    import os, signal, sys
    from topoplan.commands.common import rank_transport
    from topoplan.errors import TransportError
    from topoplan.runtime.transports.mpi import leave_after_failure
    name = sys.argv[1]
    t = rank_transport(name, timeout=60)
    t.barrier()
    if t.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            t.allreduce_max(1.0)
    except TransportError as exc:
        print(f"topoplan: error: {exc}", file=sys.stderr, flush=True)
        if name == "mpi":
            leave_after_failure(1, grace=2)
        sys.exit(1)
""")


@pytest.mark.mpi
@pytest.mark.parametrize("transport", ["mpi", "torch"])
def test_a_rank_that_dies_during_an_agreement_is_reported_without_a_traceback(transport):
    """The agreements (auto's timings, bench's result check) are collectives: a death in
    one is a located line on every survivor, naming the rank where MPI can tell."""
    pytest.importorskip("mpi4py")
    if transport == "torch":
        pytest.importorskip("torch")
    from topoplan.commands.common import choose_port
    from topoplan.runtime.mpirun import mpiexec
    choose_port()
    start = time.monotonic()
    done = mpiexec(4, [sys.executable, "-c", AGREE_PROGRAM, transport], fault_tolerant=True,
                   timeout=60, cwd=ROOT)
    assert time.monotonic() - start < 30
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("topoplan: error:")]
    assert len(lines) == 3, done.stderr
    for line in lines:
        if transport == "mpi":
            assert re.match(r"topoplan: error: rank [023]: mpi allreduce of the slowest time "
                            r"failed: rank 1 died \(MPI_ERR_", line), line
        else:
            assert re.match(r"topoplan: error: rank [023]: torch/gloo agreement \(all_reduce "
                            r"MAX\) failed: .*; torch/gloo cannot tell which rank failed$",
                            line), line


TESTBED = """\
name: tb-fault
switches: [{name: sw0}]
boxes:
  - {name: A, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: B, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
"""


@needs_netns
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("action", ["run", "bench"])
def test_sigterm_to_a_testbed_job_removes_the_testbed_and_its_ranks(action, tmp_path):
    pytest.importorskip("mpi4py" if action == "run" else "torch")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(TESTBED)
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                text=True).stdout.split())
    env = {"TOPOPLAN_TESTBED_STATE": str(tmp_path / "state")}
    if action == "run":
        job = Job(tmp_path, "testbed", "run", str(cluster), "--transport", "mpi", "--",
                  "python", "-c", SLEEP, env=env)
        job.wait_for(2, "OMPI_COMM_WORLD_RANK", settle=0.5)
    else:  # gloo ranks of the testbed's own worker, in the timed loop
        job = Job(tmp_path, "testbed", "bench", str(cluster), "--no-calibrate", "--no-probe",
                  "--sizes", "64MiB", "--iters", "500", "--transport", "gloo", env=env)
        deadline = time.monotonic() + 120
        while len([p for p in marked(job.mark) if b"topoplan.testbed.worker" in
                   _cmdline(p)]) < 2:
            assert time.monotonic() < deadline and job.proc.poll() is None
            time.sleep(0.2)
        time.sleep(2)
    job.proc.send_signal(signal.SIGTERM)
    code, err, took = job.end()
    assert code == 143, err
    assert took < WITHIN, f"took {took:.1f} s"
    job.nothing_left()
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                               text=True).stdout.split())
    mine = [ns for ns in after - before if ns.split("-")[1:2] == [str(job.proc.pid)]]
    assert not mine, mine
    assert not list((tmp_path / "state").glob("*.json"))


@pytest.mark.parametrize("outcome", ["success", "timeout"])
def test_a_torch_launch_leaves_nothing_and_prints_no_traceback(outcome, tmp_path):
    """torchrun keeps its logs in a torchelastic_* folder of TMPDIR, and answers the
    SIGTERM that ends a job past --timeout with a traceback of its own."""
    pytest.importorskip("torch")
    program = "print('ran')" if outcome == "success" else SLEEP
    timeout = [] if outcome == "success" else ["--timeout", "5"]
    job = Job(tmp_path, "launch", "-n", "2", "--transport", "torch", *timeout, "--",
              "python", "-c", program)
    code, err, _ = job.end()
    assert "Traceback" not in err, err
    if outcome == "success":
        assert code == 0, err
        assert job.lines.count("ran\n") == 2, job.lines
    else:
        assert code == 1 and err.strip().splitlines()[-1] == (
            "topoplan: error: the job did not finish within 5 s; ended it"), err
    job.nothing_left()


def test_a_failed_rank_under_a_torch_launch_is_one_line_each(tmp_path):
    """torchrun's own answer to a failed worker is a ChildFailedError traceback, a 30-line
    report and its log: launch says one line per failed rank, the failure first."""
    pytest.importorskip("torch")
    program = ("import os, sys, time; rank = int(os.environ['RANK']); "
               "sys.exit(3) if rank == 1 else time.sleep(60)")
    job = Job(tmp_path, "launch", "-n", "3", "--transport", "torch", "--", "python", "-c",
              program)
    code, err, took = job.end()
    lines = err.strip().splitlines()
    assert code == 1, err
    assert took < WITHIN + 5, f"took {took:.1f} s"
    assert re.fullmatch(r"topoplan: error: rank 1 \(pid \d+\) exited with status 3", lines[0]), err
    assert sorted(re.fullmatch(r"topoplan: error: rank (\d) \(pid \d+\) was stopped after rank 1 "
                               r"failed", line).group(1) for line in lines[1:]) == ["0", "2"], err
    job.nothing_left()


# ---- topoplan plan: Ctrl-C and SIGTERM mid-LP and mid-write -----------------------------
#: In the child: the first call of ``what`` says ``READY <what>`` on stdout, then runs the
#: real call again and again for up to 60 s, so that the signal lands inside it (a linear
#: program: in HiGHS; a write: between two chunks of the temporary file), or (``mkstemp``)
#: makes the temporary file and waits 3 s before its name is returned.
HOLD = """
import sys, time
import scipy.optimize
import topoplan._util as util
import topoplan.planners.mcf.lp as lp
import topoplan.planners.mcf.pieces as pieces
import topoplan.planners.mcf.rings as rings
told = []

def tell(what):
    if not told:
        told.append(what)
        sys.stdout.write(f"READY {what}\\n")
        sys.stdout.flush()

def solve(*args, **kwargs):
    tell("lp")
    end = time.monotonic() + 60
    while True:
        result = scipy.optimize.linprog(*args, **kwargs)
        if time.monotonic() > end:
            return result

real_write = util._write_fd

def write(fd, payload, check):
    tell("write")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.01)
        check()
    real_write(fd, payload, check)

real_mkstemp = util.tempfile.mkstemp

def mkstemp(*args, **kwargs):
    made = real_mkstemp(*args, **kwargs)
    tell("mkstemp")  # made, its name not yet noted: where a signal used to leave it
    time.sleep(3)
    return made

if sys.argv[1] == "lp":
    lp.linprog = pieces.linprog = rings.linprog = solve
elif sys.argv[1] == "mkstemp":
    util.tempfile.mkstemp = mkstemp
else:
    util._write_fd = write
from topoplan.cli import main
sys.exit(main(sys.argv[2:]))
"""
BIG = str(ROOT / "topologies" / "leaf_spine_1024.yaml")
SAYS = {signal.SIGINT: (130, "topoplan: interrupted"),
        signal.SIGTERM: (143, "topoplan: terminated")}


def _plan_ends_cleanly(job: Job, out: Path, sig: int) -> None:
    """``job`` (a ``plan -o out``) ends with the signal's status and line, fast, with no
    traceback, no ``out`` or temporary file beside it, and no process left."""
    job.proc.send_signal(sig)
    code, err, took = job.end()
    status, line = SAYS[sig]
    assert (code, err.strip().splitlines()[-1:]) == (status, [line]), err
    assert "Traceback" not in err, err
    assert took < WITHIN, f"took {took:.1f} s"
    assert sorted(p.name for p in out.parent.iterdir()) == [], "left beside -o"
    assert list(job.tmp.iterdir()) == []
    job.nothing_left()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", ["lp", "write"])
def test_a_signal_to_plan_mid_lp_or_mid_write_ends_it_in_one_line(where, sig, tmp_path):
    """mcf on leaf_spine_1024 (1024 GPUs), the signal inside a linear program or inside
    the ``-o`` write (24 MB): ``topoplan: interrupted`` (130) or ``topoplan: terminated``
    (143), and nothing left behind."""
    out = tmp_path / "out" / "plan.json"
    out.parent.mkdir()
    job = Job(tmp_path, "-c", HOLD, where, "plan", BIG, "-a", "mcf", "--size", "256MiB",
              "-o", str(out), python=True)
    job.wait_ready(1, timeout=60)
    _plan_ends_cleanly(job, out, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_plan_at_any_time_ends_it_in_one_line(sig, tmp_path):
    """Unheld, the signal two seconds in lands where it lands (loading, estimating,
    planning, in the solver): the same one line and status, nothing left."""
    out = tmp_path / "out" / "plan.json"
    out.parent.mkdir()
    job = Job(tmp_path, "plan", BIG, "-a", "mcf", "--size", "256MiB", "-o", str(out))
    time.sleep(2.0)
    if job.proc.poll() is not None:  # a machine fast enough to plan it in 2 s
        assert job.proc.returncode == 0 and out.stat().st_size > 0
        return
    _plan_ends_cleanly(job, out, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_as_the_temporary_file_is_made_leaves_none(sig, tmp_path):
    """The temporary file exists before ``atomic_write`` knows its name: a Ctrl-C there
    left it behind. Both signals now wait for the name (SIGTERM already did)."""
    out = tmp_path / "out" / "plan.json"
    out.parent.mkdir()
    job = Job(tmp_path, "-c", HOLD, "mkstemp", "plan", str(ROOT / "topologies" /
              "ddl_two_switch.yaml"), "-a", "ring", "--size", "1MiB", "-o", str(out),
              python=True)
    job.wait_ready(1, timeout=60)
    _plan_ends_cleanly(job, out, sig)
