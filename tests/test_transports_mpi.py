"""The executor over real MPI processes (mpiexec -n 2, 3, 4).

Each launch runs every case of tests/cases_common.py on every rank, then kills
one rank mid-allreduce and checks that every survivor raised a TransportError
naming itself, the step, the peer and the chunk, within the timeout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")

from topoplan._mpirun import MPI_ENV, find_mpiexec, mpiexec, mpiexec_command  # noqa: E402

HERE = Path(__file__).parent
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


# With 2 ranks no kill: Open MPI 5.0's prterun ends the job when one of two ranks
# dies, even under --with-ft ulfm, so the lone survivor is gone before its timeout.
# The 2-rank killed-peer case runs over torch/gloo and Local instead.
@pytest.mark.parametrize("nranks, victim, with_torch", [(2, None, False), (3, 2, True), (4, 1, False)])
def test_mpi_cases_and_killed_peer(nranks: int, victim: int | None, with_torch: bool) -> None:
    argv = [sys.executable, str(HERE / "mpi_cases.py"), "--timeout", str(TIMEOUT)]
    argv += (["--kill", str(victim)] if victim is not None else [])
    argv += (["--torch"] if with_torch else [])
    proc = mpiexec(nranks, argv, timeout=240, fault_tolerant=victim is not None)
    results = _results(proc.stdout)
    survivors = [r for r in range(nranks) if r != victim]
    assert sorted(results) == survivors, (
        f"expected results from ranks {survivors}, got {sorted(results)}\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}")
    for rank in survivors:
        record = results[rank]
        assert record["failures"] == [], "\n".join(record["failures"])
        assert record["ncases"] > 40
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


def test_mpiexec_command_sets_what_open_mpi_needs() -> None:
    command, env = mpiexec_command(3, ["python", "x.py"], fault_tolerant=True)
    assert command[0] == find_mpiexec()
    assert command[command.index("-n") + 1] == "3"
    assert "mpi_yield_when_idle" in command and command[-2:] == ["python", "x.py"]
    assert command[command.index("--with-ft") + 1] == "ulfm"
    for key, value in MPI_ENV.items():
        assert env[key] == value
    assert "oversubscribe" in env["PRTE_MCA_rmaps_default_mapping_policy"]
