"""Run allreduce, reduce-scatter and allgather schedules for real inside a testbed and
compare with the simulator.

:func:`run_cases` starts one ``topoplan.testbed.worker`` per rank inside its namespace
and waits for all of them; if one dies or the run overruns, the others are killed and
a :class:`~topoplan.errors.TransportError` names the rank. :func:`bench` plans each
algorithm for the collective on the *scaled* cluster (the one the testbed emulates),
verifies and simulates it, runs it and the transport's native collective, and returns
one row per (algorithm, size).

Three modules are named bench: this one (runs inside the emulated testbed, behind
``topoplan testbed bench``); :mod:`topoplan.runtime.bench`, the library that replays a schedule
over a transport on the ranks it is given and prints nccl-tests rows; and
:mod:`topoplan.commands.bench`, the ``topoplan bench`` command in front of that library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..runtime.bench import load_average
from ..cluster import Cluster
from ..cluster.links import degraded
from ..errors import ScheduleError, TopoplanError, TransportError
from ..ir.schedule import Schedule
from .calibrate import Calibration
from .netns import kill_namespace_processes

__all__ = ["Case", "BenchRow", "BenchReport", "run_cases", "bench", "plan_algorithm",
           "check_case_size"]

MASTER_PORT = 29500  # inside rank 0's own namespace: no other process can hold it


@dataclass(frozen=True)
class Case:
    """One thing to run: a schedule (``kind="schedule"``) or the transport's own
    ``collective`` (``kind="native"``). ``size`` is the full buffer (a reduce-scatter's
    input, an allgather's output); a schedule's collective is its own."""

    label: str
    size: int  # bytes (float32 elements x 4)
    kind: str = "schedule"
    schedule: Schedule | None = None
    warmup: int = 1
    iters: int = 3
    trace: bool = False  # record when each step ended on each rank (last iteration)
    collective: str = "allreduce"  # for kind="native"; a schedule's is its own


@dataclass(frozen=True)
class BenchRow:
    """A measured case next to the simulator's predictions and the native allreduce.

    ``predicted_s`` is the simulator with bandwidths only (no software costs);
    ``calibrated_s`` adds the testbed's calibrated per-message ``alpha`` and reduce
    bandwidth (:mod:`topoplan.testbed.calibrate`). Ratios are measured / predicted.
    """

    algorithm: str
    size: int
    measured_s: float
    predicted_s: float | None
    ratio: float | None
    native_s: float | None
    speedup_vs_native: float | None
    wrong: int
    times_s: tuple[float, ...]
    calibrated_s: float | None = None
    calibrated_ratio: float | None = None
    steps: int | None = None  # the schedule's steps (longest rank)
    collective: str = "allreduce"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchReport:
    """Rows of :func:`bench`, the calibration they were predicted with, and the load."""

    rows: list[BenchRow]
    calibration: Calibration | None
    transport: str
    load: tuple[float, float]  # 1-minute load average before and after
    probe: Any = None  # the ProbeReport of the network check run first, if any
    collective: str = "allreduce"
    native_name: str | None = None  # the transport's own collective, as run
    notes: tuple[str, ...] = ()  # what was not run, and why (a missing native collective)
    #: The links degraded during the run: ``link``, ``factor``, ``after`` (the delay asked
    #: for, seconds after the network check) and ``applied_s`` (when it was applied; 0:
    #: before the network check, ``None``: the run ended first).
    degrades: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"transport": self.transport, "load": list(self.load),
                "collective": self.collective, "native_name": self.native_name,
                "notes": list(self.notes), "degrades": [dict(d) for d in self.degrades],
                "calibration": None if self.calibration is None else self.calibration.to_dict(),
                "probe": None if self.probe is None else self.probe.to_dict(),
                "rows": [r.to_dict() for r in self.rows]}


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


TRANSPORTS = ("gloo", "mpi")


def run_cases(bed: Any, cases: Sequence[Case], *, timeout: float = 300.0,
              crash_rank: int | None = None, transport: str = "gloo") -> list[dict[str, Any]]:
    """Run ``cases`` with one process per rank inside ``bed``'s namespaces.

    Parameters
    ----------
    bed : Testbed
    cases : sequence of Case
    timeout : float
        Seconds for the whole run.
    crash_rank : int, optional
        Make this rank exit with status 17 at start (fault injection, for tests).
    transport : {"gloo", "mpi"}
        ``gloo``: torch.distributed, one ``ip netns exec`` per rank. ``mpi``: Open MPI,
        ``mpiexec`` in rank 0's namespace with a launcher agent per namespace
        (:mod:`topoplan.testbed.mpi`).

    Returns
    -------
    list of dict
        Per case: ``label``, ``size``, ``collective``, ``times_s`` (per iteration,
        slowest rank), ``wrong`` (elements differing from the exact result, over all
        ranks); a native case the transport has no collective for has ``times_s`` empty
        and ``unavailable`` saying why; a native reduce-scatter or allgather has
        ``native_name``.

    Raises
    ------
    TransportError
        A rank exited with an error or the run took longer than ``timeout`` s; every
        rank process is gone when it is raised.
    """
    if transport not in TRANSPORTS:
        raise TopoplanError(f"transport {transport!r}: the testbed runs {', '.join(TRANSPORTS)}")
    layout = bed.layout
    with tempfile.TemporaryDirectory(prefix="topoplan-testbed-") as tmp:
        job_cases = []
        for i, case in enumerate(cases):
            entry = {"label": case.label, "size": case.size, "kind": case.kind,
                     "warmup": case.warmup, "iters": case.iters, "trace": case.trace,
                     "collective": case.collective}
            if case.kind == "schedule":
                if case.schedule is None:
                    raise ScheduleError(f"case {case.label!r} has no schedule")
                entry["collective"] = case.schedule.collective
                check_case_size(case.size, layout.nranks, case.schedule.collective)
                path = Path(tmp, f"case{i}.json")
                case.schedule.save(path)
                entry["schedule"] = str(path)
            job_cases.append(entry)
        job = {"nranks": layout.nranks, "master_addr": layout.addresses[0],
               "master_port": MASTER_PORT, "timeout_s": max(30.0, timeout), "dir": tmp,
               "cases": job_cases, "crash_rank": crash_rank, "transport": transport,
               "addresses": list(layout.addresses)}
        job_path = Path(tmp, "job.json")
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [_repo_root(),
                                                           os.environ.get("PYTHONPATH")]))}
        worker = [sys.executable, "-m", "topoplan.testbed.worker", str(job_path)]
        procs: list[subprocess.Popen] = []
        logs = [Path(tmp, f"rank{r}.log") for r in range(layout.nranks)]
        try:
            if transport == "mpi":
                from .mpi import mpiexec_command
                command, mpi_env = mpiexec_command(layout, Path(tmp), worker,
                                                   max((c.size for c in cases), default=0))
                launcher_log = Path(tmp, "mpiexec.log")
                with open(launcher_log, "w") as log:
                    # Its own session: a timeout kills mpiexec and everything it started.
                    procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                  env={**mpi_env, **env, "TMPDIR": tmp},
                                                  start_new_session=True))
                _wait_mpi(procs[0], launcher_log, logs, timeout)
            else:
                for r, ns in enumerate(layout.rank_ns):
                    with open(logs[r], "w") as log:
                        procs.append(subprocess.Popen(
                            ["ip", "netns", "exec", ns, *worker, str(r)],
                            stdout=log, stderr=subprocess.STDOUT, env={**env, "TMPDIR": tmp}))
                _wait(procs, logs, timeout)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        if transport == "mpi":
                            os.killpg(proc.pid, signal.SIGKILL)
                        else:
                            proc.kill()
                proc.wait()
            for ns in layout.rank_ns:  # anything the workers started and left behind
                kill_namespace_processes(ns)
        return json.loads(Path(tmp, "result.json").read_text())


def _wait_mpi(proc: subprocess.Popen, launcher_log: Path, logs: list[Path],
              timeout: float) -> None:
    """Wait for ``mpiexec``; on failure name the rank it reports (or the first log)."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TransportError(f"mpiexec still running after {timeout:g} s; stopped it. Its last "
                             f"output:\n{_tail(launcher_log)}") from None
    if code == 0:
        return
    text = launcher_log.read_text(errors="replace") if launcher_log.exists() else ""
    # PRRTE: "Process name: [prterun-host-123@1,2]" then "Exit code: 17".
    found = re.search(r"Process name:\s*\[[^\]]*?,(\d+)\]", text)
    status = re.search(r"Exit code:\s*(-?\d+)", text)
    if found:
        r = int(found.group(1))
        raise TransportError(
            f"rank {r} exited with status {status.group(1) if status else '?'}; mpiexec stopped "
            f"the other ranks. Its last output:\n{_tail(logs[r]) if logs[r].exists() else ''}"
            f"\nmpiexec:\n{_tail(launcher_log)}", rank=r)
    raise TransportError(f"mpiexec exited with status {code}. Its last output:\n"
                         f"{_tail(launcher_log)}")


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r = failed[0]
            raise TransportError(f"rank {r} exited with status {codes[r]}; the other ranks were "
                                 f"stopped. Its last output:\n{_tail(logs[r])}", rank=r)
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            stuck = [r for r, c in enumerate(codes) if c is None]
            raise TransportError(f"ranks {stuck} still running after {timeout:g} s; stopped them. "
                                 f"Rank {stuck[0]}'s last output:\n{_tail(logs[stuck[0]])}",
                                 rank=stuck[0])
        time.sleep(0.05)


def _tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def check_case_size(size: int, nranks: int, collective: str) -> None:
    """A reduce-scatter's or an allgather's float32 buffer must cut into equal shards."""
    if size % 4 or (size // 4) % nranks:
        from ..ir.collectives import get_collective
        if get_collective(collective).sharded:
            from ..runtime.bench import check_sizes
            check_sizes([size], nranks, collective, "float32")


def plan_algorithm(cluster: Cluster, spec: str, size: int, profile: Any = None,
                   collective: str = "allreduce") -> Schedule:
    """Plan ``collective`` with ``spec``: a planner name, or ``ring:ORDER`` with ORDER like
    ``0,2,1,3``, priced with ``profile`` (a :class:`~topoplan.analysis.cost.CostProfile`; the
    planners' default when ``None``)."""
    try:
        from ..planners import plan
    except ImportError:
        raise TopoplanError(f"algorithm {spec!r}: topoplan.planners is not available in this "
                            "build; only 'native' can run") from None
    name, _, arg = spec.partition(":")
    kwargs: dict[str, Any] = {}
    if arg:
        if name != "ring":
            raise TopoplanError(f"algorithm {spec!r}: only ring takes an order (ring:0,2,1,3)")
        try:
            kwargs["order"] = [int(x) for x in arg.split(",")]
        except ValueError:
            raise TopoplanError(f"algorithm {spec!r}: the ring order is rank numbers separated "
                                "by commas, e.g. ring:0,2,1,3") from None
    if profile is not None:
        kwargs["profile"] = profile
    return plan(cluster, algorithm=name, size=size, collective=collective, **kwargs)


def bench(bed: Any, cluster: Cluster, algorithms: Sequence[str], sizes: Sequence[int], *,
          iters: int = 3, warmup: int = 1, timeout: float = 600.0,
          calibrate: bool = True, transport: str = "gloo", probe: bool = True,
          progress: Any = None, collective: str = "allreduce",
          degrades: Sequence[Any] = ()) -> BenchReport:
    """Plan, verify, simulate and run each algorithm at each size.

    ``collective`` is what runs: ``allreduce``, ``reduce_scatter`` or ``allgather``
    (sizes are the full buffer, a multiple of the rank count in float32 elements).
    ``native`` is the transport's own collective (gloo's all_reduce / reduce_scatter /
    all_gather, or ``MPI_Allreduce`` / ``MPI_Reduce_scatter_block`` /
    ``MPI_Allgather``); one the transport lacks is left out with a note
    (:attr:`BenchReport.notes`), its rows' native columns empty.

    ``cluster`` is the real cluster; plans and predictions use it scaled by the
    testbed's scale (and with its pairs pinned to one path each, unless the testbed
    sprays them), which is what the namespaces emulate. With ``calibrate``, a launch of
    its own first runs :func:`~topoplan.testbed.calibrate.calibration_cases`; the plans
    are then priced with the fitted software costs (the planners' ``profile``: pipeline
    depth, and ``auto``'s choice), and every row also gets the prediction with them. With ``probe``,
    a quick :func:`~topoplan.testbed.probe.check_pairs` (every pair alone, one shift
    pattern) runs before anything else, and a network off the model by more than
    :data:`~topoplan.testbed.probe.TOLERANCE` raises :class:`TestbedError` instead of
    reporting numbers measured on it.

    ``degrades`` (:class:`~topoplan.cluster.links.Degrade`) slow links of the testbed
    down (:mod:`~topoplan.testbed.degrade`): those without a delay before the network
    check, which then checks against the degraded rates; the others that many seconds
    after it, from a timer in this process. The calibration is fitted on the cluster
    with the faults of the start (its software costs do not absorb them). Plans and
    predictions stay the cluster's as given (a plan that does not know of the fault); :attr:`BenchReport.degrades` says
    what was applied, and when.

    Raises
    ------
    TestbedError
        The probe found a pair whose path or rate is not the model's, or a degrade could
        not be applied.
    """
    from ..ir.collectives import get_collective
    from .degrade import Timers, apply_degrades, state_degrades
    from .layout import emulated_cluster
    get_collective(collective)
    for size in sizes:
        check_case_size(size, bed.layout.nranks, collective)
    scaled = emulated_cluster(cluster, bed.layout)
    load_before = load_average()
    if any(not d.after for d in degrades):
        apply_degrades(bed.state, [d for d in degrades if not d.after])
    faults = state_degrades(bed.state)
    report = check_network(bed, progress=progress) if probe else None
    with Timers(bed.state, degrades) as timers:
        rows, calibration, results_notes, native_name = _bench_runs(
            bed, scaled, algorithms, sizes, iters=iters, warmup=warmup, timeout=timeout,
            calibrate=calibrate, transport=transport, collective=collective, faults=faults)
    timers.check()
    applied = dict(timers.applied)
    record = tuple({"link": link, "factor": factor, "after": 0.0, "applied_s": 0.0}
                   for link, factor in faults.items())
    record += tuple({"link": d.link, "factor": d.factor, "after": d.after,
                     "applied_s": applied.get(d)} for d in timers.degrades)
    return BenchReport(rows, calibration, transport, (load_before, load_average()), report,
                       collective, native_name, results_notes, record)


def _bench_runs(bed: Any, scaled: Cluster, algorithms: Sequence[str], sizes: Sequence[int], *,
                iters: int, warmup: int, timeout: float, calibrate: bool, transport: str,
                collective: str, faults: Mapping[str, float] | None = None
                ) -> tuple[list[BenchRow], Calibration | None, tuple[str, ...], str | None]:
    """Calibrate, plan, run: :func:`bench` after its network check. ``faults`` (link ->
    factor) are the degrades in place from the start: the calibration runs are planned
    and fitted on the cluster with them, so that the software costs it finds do not absorb a slow
    link (the plans and predictions stay the healthy cluster's)."""
    from ..ir.verify import verify
    from .calibrate import calibration_cases, fit, predict
    calibration = None
    if calibrate:
        # A launch of its own first: the plans are then priced with what it measured.
        actual = degraded(scaled, faults) if faults else scaled
        cal_cases = calibration_cases(actual)
        results = run_cases(bed, [Case(label, size, kind=kind, schedule=schedule, warmup=2,
                                       iters=5) for label, size, kind, schedule in cal_cases],
                            timeout=timeout, transport=transport)
        bad = [r for r in results if r["wrong"]]
        if bad:  # calibration runs are checked like every other run
            raise TransportError(f"calibration run {bad[0]['label']} computed "
                                 f"{bad[0]['wrong']} wrong elements")
        times = {r["label"]: statistics.median(r["times_s"]) for r in results}
        calibration = fit(actual, cal_cases, times)
    profile = None if calibration is None else calibration.planning_profile
    cases: list[Case] = []
    schedules: dict[tuple[str, int], Schedule] = {}
    for size in sizes:
        cases.append(Case("native", size, kind="native", warmup=warmup, iters=iters,
                          collective=collective))
        for spec in algorithms:
            if spec == "native":
                continue
            schedule = plan_algorithm(scaled, spec, size, profile, collective)
            verify(schedule)
            schedules[(spec, size)] = schedule
            cases.append(Case(spec, size, schedule=schedule, warmup=warmup, iters=iters))
    if any(c.kind == "schedule" for c in cases):
        try:
            import topoplan.runtime.executor  # noqa: F401
            import topoplan.runtime.transports  # noqa: F401
        except ImportError as exc:
            raise TopoplanError(f"cannot run schedules: {exc}; only 'native' can run") from None
    results = run_cases(bed, cases, timeout=timeout, transport=transport)
    notes = tuple(dict.fromkeys(f"native {collective} not run: {r['unavailable']}"
                                for r in results if r.get("unavailable")))
    native_name = next((r["native_name"] for r in results if r.get("native_name")), None)
    if native_name is None and collective == "allreduce":
        native_name = "MPI_Allreduce" if transport == "mpi" else "dist.all_reduce"
    results = [r for r in results if r["times_s"]]
    median = {(r["label"], r["size"]): statistics.median(r["times_s"]) for r in results}
    native = {size: t for (label, size), t in median.items() if label == "native"}
    rows = []
    for r in results:
        label, size = r["label"], r["size"]
        if label == "native" and "native" not in algorithms:
            continue
        measured = median[(label, size)]
        planned = schedules.get((label, size))
        pred = cal = None
        steps = None
        if planned is not None:
            pred = predict(scaled, planned, size)
            cal = predict(scaled, planned, size, calibration) if calibration else None
            steps = max(len(planned.steps_of(q)) for q in range(planned.nranks))
        nat = native.get(size)
        rows.append(BenchRow(label, size, measured, pred, measured / pred if pred else None,
                             nat, nat / measured if nat else None, r["wrong"],
                             tuple(r["times_s"]), cal, measured / cal if cal else None, steps,
                             collective))
    return rows, calibration, notes, native_name


#: The quick network check of :func:`bench`: seconds per transfer at the model's rate,
#: and the concurrent pattern (every rank r sends to r + 1).
QUICK_SECONDS = 0.15
QUICK_SHIFTS = (1,)


def check_network(bed: Any, progress: Any = None) -> Any:
    """The quick probe :func:`bench` runs first; raises TestbedError on a deviation."""
    from .netns import TestbedError
    from .probe import TOLERANCE, check_pairs
    report = check_pairs(bed, seconds=QUICK_SECONDS, shifts=QUICK_SHIFTS, progress=progress)
    bad = report.failures
    if bad:
        worst = sorted(bad, key=lambda c: -abs((c.ratio or 1) - 1))[:5]
        lines = "; ".join(
            f"{c.src} -> {c.dst}{' (' + c.pattern + ')' if c.pattern else ''}: "
            + ("path differs" if not c.path_ok else
               f"{c.measured_rate * 8 / 1e6:,.0f} Mbit/s for {(c.model_rate or 0) * 8 / 1e6:,.0f}")
            for c in worst)
        raise TestbedError(
            f"the testbed does not behave as the model ({len(bad)} of {len(report.checks)} "
            f"checks off by more than {TOLERANCE:.0%}: {lines}); no numbers reported. "
            "`topoplan testbed probe STATE --all-pairs` shows every pair; a busy machine "
            "is the usual cause (--no-probe to run anyway)")
    return report
