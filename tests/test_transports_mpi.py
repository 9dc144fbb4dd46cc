"""The executor over real MPI processes (mpiexec -n 2, 3, 4).

Each launch runs every case of tests/support/transport_cases.py on every rank, then kills
one rank mid-allreduce and checks that every survivor raised a TransportError
naming itself, the step, the peer and the chunk, within the timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")

from topoplan.runtime.mpirun import (MPI_ENV, Flavour, find_launcher, find_mpiexec,  # noqa: E402
                              mpiexec, mpiexec_command)

ROOT = Path(__file__).resolve().parents[1]  # ranks run ``python -m tests.mpi_cases`` here
TIMEOUT = 2.0  # the executor's step timeout in the killed-peer run

pytestmark = pytest.mark.mpi


def _planner_names() -> list[str]:
    try:
        from topoplan.planners import PLANNERS
    except ImportError:
        return []
    return sorted(PLANNERS)


def _results(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("TOPOPLAN-RESULT "):
            record = json.loads(line.removeprefix("TOPOPLAN-RESULT "))
            out[record["rank"]] = record
    return out


def _survivors(nranks: int, victim: int | None, argv: list[str], *, min_cases: int
               ) -> list[tuple[int, dict]]:
    """Run ``argv`` on ``nranks`` MPI ranks; every rank but ``victim`` reported, ran at
    least ``min_cases`` cases and saw no failure: their ``(rank, record)``."""
    proc = mpiexec(nranks, argv, timeout=240, fault_tolerant=victim is not None, cwd=ROOT)
    results = _results(proc.stdout)
    survivors = [r for r in range(nranks) if r != victim]
    assert sorted(results) == survivors, (
        f"expected results from ranks {survivors}, got {sorted(results)}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}")
    for rank in survivors:
        assert results[rank]["failures"] == [], "\n".join(results[rank]["failures"])
        assert results[rank]["ncases"] > min_cases
    return [(rank, results[rank]) for rank in survivors]


# With 2 ranks no kill: Open MPI 5.0's prterun ends the job when one of two ranks
# dies, even under --with-ft ulfm, so the lone survivor is gone before its timeout.
# The 2-rank killed-peer case runs over torch/gloo and Local instead.
@pytest.mark.parametrize("nranks, victim, with_torch", [(2, None, False), (3, 2, True), (4, 1, False)])
def test_mpi_cases_and_killed_peer(nranks: int, victim: int | None, with_torch: bool,
                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if victim is not None and not find_launcher()[0].fault_tolerant:
        pytest.skip(f"{find_launcher()[0]} cannot keep survivors of a dead rank running "
                    "(Open MPI 5's --with-ft ulfm)")
    argv = [sys.executable, "-m", "tests.mpi_cases", "--timeout", str(TIMEOUT)]
    argv += (["--kill", str(victim)] if victim is not None else [])
    argv += (["--torch"] if with_torch else [])
    from tests.support import transport_cases
    transport_cases.save_planner_schedules(nranks, str(tmp_path))
    monkeypatch.setenv("TOPOPLAN_TEST_PLANS", str(tmp_path))
    for rank, record in _survivors(nranks, victim, argv, min_cases=40):
        for name in _planner_names():
            assert any(s.startswith(f"{name}@") for s in record["schedules"]), (
                f"planner {name} was not run on {nranks} ranks: {record['schedules']}")
        if victim is None:
            continue
        kill = record["kill"]
        assert kill["type"] == "TransportError", kill
        assert kill["rank"] == rank and kill["step"] is not None
        assert kill["peer"] is not None and kill["chunk"] is not None
        assert f"rank {rank}:" in kill["error"] and f"step {kill['step']}" in kill["error"]
        assert f"peer {kill['peer']}" in kill["error"] and f"chunk {kill['chunk']}" in kill["error"]
        # Within the timeout (plus scheduling slack on a loaded 2-core box), never a hang.
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


@pytest.mark.parametrize("nranks, victim, with_torch", [(2, None, True), (3, 2, False),
                                                       (4, 1, False)])
def test_native_steps_and_a_killed_member(nranks: int, victim: int | None, with_torch: bool
                                          ) -> None:
    """tests/mpi_native.py: native steps over Comm.Split sub-communicators (every kind,
    composed allreduce, reduce-scatter and allgather schedules, unequal parts, calls in
    flight, bad groups), then a member exits at its first native step: the others raise
    a TransportError naming their step and group within the timeout."""
    if victim is not None and not find_launcher()[0].fault_tolerant:
        pytest.skip(f"{find_launcher()[0]} cannot keep survivors of a dead rank running")
    argv = [sys.executable, "-m", "tests.mpi_native", "--timeout", str(TIMEOUT)]
    argv += (["--kill", str(victim)] if victim is not None else [])
    argv += (["--torch"] if with_torch else [])
    for rank, record in _survivors(nranks, victim, argv, min_cases=80):
        if victim is None:
            continue
        kill = record["kill"]
        assert kill["type"] == "TransportError", kill
        assert kill["rank"] == rank and kill["step"] is not None, kill
        assert kill["error"].startswith(f"rank {rank} step {kill['step']}: native "), kill
        assert "over {" in kill["error"] and "MPI_I" in kill["error"], kill
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


@pytest.mark.parametrize("nranks", [2, 3])
def test_a_retry_after_a_timeout_sums_its_own_inputs(nranks: int) -> None:
    """tests/mpi_retry.py: the late messages of a failed call neither match the retry
    nor the call four later that reuses its epoch, and are drained (Iprobe finds none)."""
    proc = mpiexec(nranks, [sys.executable, str(ROOT / "tests" / "mpi_retry.py")], timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("TOPOPLAN-RETRY "):
            record = json.loads(line.removeprefix("TOPOPLAN-RETRY "))
            records[record["rank"]] = record
    assert sorted(records) == list(range(nranks)), proc.stdout + proc.stderr
    want = [float(sum(r + 1 + 100 * call for r in range(nranks))) for call in range(1, 6)]
    for rank, record in records.items():
        assert record["outcomes"] == ["failed", *want], (rank, record)
        assert not record["left_over"], rank


def test_mpiexec_command_sets_what_open_mpi_needs() -> None:
    if find_launcher()[0].flavour is not Flavour.OPEN_MPI_5:
        pytest.skip("this machine's launcher is not Open MPI 5 (tests/test_mpirun.py "
                    "checks every kind's command)")
    command, env = mpiexec_command(3, ["python", "x.py"], fault_tolerant=True)
    assert command[0] == find_mpiexec()
    assert command[command.index("-n") + 1] == "3"
    assert "mpi_yield_when_idle" in command and command[-2:] == ["python", "x.py"]
    assert command[command.index("--with-ft") + 1] == "ulfm"
    for key, value in MPI_ENV.items():
        assert env[key] == value
    assert "oversubscribe" in env["PRTE_MCA_rmaps_default_mapping_policy"]


def test_mpiexec_interrupted_leaves_no_rank_behind() -> None:
    """Ctrl-C reaches the launcher's process group only; the ranks run in a session of their
    own, so mpiexec() must end them itself before the KeyboardInterrupt propagates."""
    import os
    import signal
    import time

    marker = f"topoplan-test-interrupt-{os.getpid()}"

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            mpiexec(2, [sys.executable, "-c", "import time; time.sleep(30)", marker], timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(0.2)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert left.strip() == "", f"ranks still running: {left}"


def _bench(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", "bench", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_bench_cli_runs_a_plan_under_mpiexec(tmp_path: Path) -> None:
    from tests.support import schedules as S
    plan = tmp_path / "ring3.json"
    S.ring(3).save(plan)
    proc = _bench("--plan", str(plan), "--sizes", "1KiB,100KiB", "--baseline", "native",
                  "--iters", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["schedule"]["nranks"] == 3 and record["transport"] == "mpi"
    assert record["native"] == "MPI_Allreduce"
    assert [r["size"] for r in record["rows"]] == [1024, 102400]
    for row in record["rows"]:
        assert row["wrong"] == 0 and row["native_wrong"] == 0
        assert row["count"] == row["size"] // 4 and row["type"] == "float32"
        assert row["busbw"] == pytest.approx(row["algbw"] * 4 / 3)
        assert row["time_us"] > 0 and row["native_time_us"] > 0 and row["iters"] == 3
    plan2 = tmp_path / "ring2.json"
    S.ring(2).save(plan2)
    text = _bench("--plan", str(plan2), "--sizes", "4KiB", "--iters", "2", "--dtype", "float16")
    assert text.returncode == 0, text.stderr
    header = next(line for line in text.stdout.splitlines() if "size(B)" in line)
    assert header.split() == ["#", "size(B)", "count", "type", "redop", "time(us)",
                              "algbw(GB/s)", "busbw(GB/s)", "#wrong"]
    assert " float16 " in text.stdout and "Out of bounds values : 0 OK" in text.stdout


def test_bench_cli_refuses_a_rank_count_mismatch(tmp_path: Path) -> None:
    from tests.support import schedules as S
    plan = tmp_path / "ring3.json"
    S.ring(3).save(plan)
    proc = _bench("--plan", str(plan), "-n", "2", "--sizes", "1KiB")
    assert proc.returncode == 1
    assert proc.stderr.startswith("topoplan: error: ") and "Traceback" not in proc.stderr
    assert "3 ranks" in proc.stderr and "2" in proc.stderr


def test_bench_cli_refuses_a_plan_that_does_not_verify(tmp_path: Path) -> None:
    """Rank 0 overwrites chunk 0 instead of adding to it: a wrong sum, but chunk 0 is
    0.1% of the buffer, empty at 1 KiB, where the run's own check would find nothing."""
    from topoplan.ir.schedule import Schedule, recv, send, RankProgram
    from topoplan.ir.parse import load_schedule
    steps = {0: [(send(1, 1), recv(1, 0, reduce=False)), (send(1, 0), recv(1, 1))],
             1: [(send(0, 0), recv(0, 1, reduce=True)), (send(0, 1), recv(0, 0))]}
    broken = Schedule(2, (0.001, 0.999), tuple(RankProgram(r, tuple(steps[r])) for r in (0, 1)),
                      meta={"algorithm": "broken"})
    plan = tmp_path / "broken.json"
    broken.save(plan)
    verdict = subprocess.run([sys.executable, "-m", "topoplan", "verify", str(plan)],
                             capture_output=True, text=True, cwd=ROOT)
    assert verdict.returncode == 1
    proc = _bench("--plan", str(plan), "--sizes", "1KiB")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == (verdict.stderr.rstrip("\n")
                           + "; bench runs only plans that verify\n")
    assert load_schedule(plan).chunk_bounds(256)[0] == (0, 0)


def test_bench_cli_plans_with_an_algorithm() -> None:
    try:
        from topoplan.planners import plan  # noqa: F401
    except ImportError:
        pytest.skip("the planners have not landed")
    proc = _bench("--algorithm", "ring", "-n", "2", "--sizes", "8KiB", "--iters", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["wrong"] == 0


# ---- reduce-scatter and allgather ---------------------------------------------------------

COLLECTIVE_PLANNERS = ("ring", "rhd", "mcf", "auto")


def test_reduce_scatter_and_allgather_on_8_mpi_ranks(tmp_path: Path) -> None:
    """tests/mpi_collectives.py: ring, rhd, mcf and auto plans of both collectives on
    dgx1_v100 (8 GPUs), and mcf's rail exchange in rounds of quarter shards on a small
    leaf-spine, exact against numpy and against MPI_Reduce_scatter_block /
    MPI_Allgather, synchronous and with calls in flight."""
    from tests.support.clusters import leaf_spine_cluster
    from topoplan.cluster import load_cluster
    from topoplan.planners import plan, planners_for
    from topoplan.ir.verify import verify
    cluster = load_cluster(ROOT / "topologies" / "dgx1_v100.yaml")
    assert cluster.nranks == 8
    names = []
    for collective in ("reduce_scatter", "allgather"):
        for algorithm in (a for a in COLLECTIVE_PLANNERS if a in planners_for(collective)):
            schedule = plan(cluster, algorithm, size=1 << 20, collective=collective)
            verify(schedule)
            name = f"{collective}-{algorithm}"
            schedule.save(tmp_path / f"{name}.json")
            names.append(name)
        # two leaves of two 2-GPU nodes, 2:1: mcf's rail exchange cuts shards in quarters
        leaves = leaf_spine_cluster(4, boxes_per_leaf=2, gpus=2, spines=1, uplink=50)
        rails = plan(leaves, "mcf", size=256 << 20, profile="ideal", collective=collective)
        verify(rails)
        assert "rounds 0.75,0.25" in rails.meta["construction"], rails.meta["construction"]
        assert rails.nchunks == 8 * 4 * rails.meta["pieces"]  # quarter shards, per piece
        rails.save(tmp_path / f"{collective}-mcf-rails.json")
        names.append(f"{collective}-mcf-rails")
    proc = mpiexec(8, [sys.executable, "-m", "tests.mpi_collectives", "--plans", str(tmp_path)],
                   timeout=240, cwd=ROOT)
    results = _results(proc.stdout)
    assert sorted(results) == list(range(8)), (
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}")
    for rank, record in results.items():
        assert record["failures"] == [], "\n".join(record["failures"])
        assert sorted(record["plans"]) == sorted(names)
        assert record["ncases"] == len(names) * (2 * 5 + 2) + 2
    assert len(names) >= 6  # ring, rhd and auto at least, for each collective
    assert proc.returncode == 0, proc.stderr


def test_bench_cli_runs_reduce_scatter_and_allgather_against_mpi(tmp_path: Path) -> None:
    """--collective with --algorithm, and a --plan file naming its collective; exact
    results, busbw with (N-1)/N, the native MPI collective in the same run."""
    from topoplan.cluster import flat_cluster
    from topoplan.planners import plan
    plan(flat_cluster(4), "rhd", size=1 << 20, collective="reduce_scatter").save(
        tmp_path / "rs.json")
    runs = {"reduce_scatter": ("--plan", str(tmp_path / "rs.json")),
            "allgather": ("--algorithm", "ring", "-n", "4", "--collective", "allgather")}
    natives = {"reduce_scatter": "MPI_Reduce_scatter_block", "allgather": "MPI_Allgather"}
    for collective, source in runs.items():
        proc = _bench(*source, "--sizes", "1KiB,96KiB", "--baseline", "native", "--iters",
                      "3", "--json")
        assert proc.returncode == 0, proc.stderr
        record = json.loads(proc.stdout)
        assert record["collective"] == collective and record["native"] == natives[collective]
        assert [r["size"] for r in record["rows"]] == [1024, 96 << 10]
        for row in record["rows"]:
            assert row["wrong"] == 0 and row["native_wrong"] == 0, row
            assert row["count"] == row["size"] // 4 // 4  # one rank's shard, as nccl-tests
            assert row["collective"] == collective
            assert row["redop"] == ("none" if collective == "allgather" else "sum")
            assert row["algbw"] == pytest.approx(row["size"] / row["time_us"] / 1e3)
            assert row["busbw"] == pytest.approx(row["algbw"] * 3 / 4)
            assert row["native_busbw"] == pytest.approx(row["native_algbw"] * 3 / 4)
            assert row["ratio"] == pytest.approx(row["algbw"] / row["native_algbw"])


def test_bench_cli_refuses_sizes_that_do_not_shard(tmp_path: Path) -> None:
    proc = _bench("--algorithm", "ring", "-n", "3", "--collective", "allgather",
                  "--sizes", "1KiB")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr == ("topoplan: error: --sizes: size 1024 B: an allgather of 3 ranks cuts "
                           "the full buffer into 3 equal shards, so it must be a multiple of 3 "
                           "float32 elements (12 B); use 1020 or 1032 B\n")
    from tests.support import schedules as S
    plan = tmp_path / "ag.json"
    S.ring_allgather([0, 1]).save(plan)
    proc = _bench("--plan", str(plan), "--collective", "reduce_scatter", "--sizes", "1KiB")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "is an allgather plan but --collective asks for reduce_scatter" in proc.stderr
