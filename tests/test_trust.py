"""Executors run only schedules that verify: ``Allreduce``, ``ReduceScatter`` and
``AllGather`` built from a schedule verify it once per schedule (cached: another executor
of it, or of an equal schedule read again, does not verify again), unless the caller
says ``verified=True``; ``topoplan simulate`` refuses such a plan as ``topoplan verify``
does, unless ``--force``."""

from __future__ import annotations

import gc
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import topoplan
import topoplan.ir.verify as V
from topoplan.cli import main
from topoplan.cluster import flat_cluster
from topoplan.errors import ScheduleError
from topoplan.ir.parse import load_schedule, loads_schedule
from topoplan.ir.schedule import Op, OpKind, RankProgram, Schedule
from topoplan.runtime.transports import Local
from topoplan.runtime.transports.local import LocalWorld

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "topologies" / "ddl_two_switch.yaml"


def flip_reduce(schedule: Schedule, *, to: bool = False) -> Schedule:
    """``schedule`` with the first recv whose reduce flag is ``not to`` flipped to ``to``:
    it still runs, and sums (or copies) wrong."""
    ranks = list(schedule.ranks)
    for program in schedule.ranks:
        for s, step in enumerate(program.steps):
            for i, op in enumerate(step):
                if isinstance(op, Op) and op.kind is OpKind.RECV and op.reduce is not to:
                    steps = list(program.steps)
                    steps[s] = step[:i] + (replace(op, reduce=to),) + step[i + 1:]
                    ranks[program.rank] = RankProgram(program.rank, tuple(steps))
                    return replace(schedule, ranks=tuple(ranks))
    raise AssertionError("no recv to flip")


def ring(nranks: int, chunks: tuple[float, ...] | None = None, **kwargs: Any) -> Schedule:
    """A ring plan; ``chunks`` lays its chunks out anew (a schedule no other test holds,
    so that the cache of schedules that passed starts empty for it)."""
    schedule = topoplan.plan(flat_cluster(nranks), "ring", size=1 << 20, **kwargs)
    return loads_schedule(schedule.to_json() if chunks is None
                          else replace(schedule, chunks=chunks).to_json())


@pytest.fixture
def verify_calls(monkeypatch):
    """The schedules (their chunks) the verifier runs on, in order."""
    calls: list[tuple[float, ...]] = []
    real = topoplan.verify  # resolved (and kept by the package) before it is patched
    assert real is V.verify

    def counted(schedule):
        calls.append(schedule.chunks)
        return real(schedule)

    monkeypatch.setattr(V, "verify", counted)
    gc.collect()
    return calls


def test_a_flipped_reduce_flag_is_refused_on_every_rank_before_anything_moves():
    bad = flip_reduce(ring(4))

    def rank_fn(t: Local) -> str:
        with pytest.raises(ScheduleError) as info:
            topoplan.Allreduce(bad, t)
        return str(info.value)

    for rank, text in enumerate(Local.launch(4, rank_fn)):
        assert text.startswith(f"rank {rank}: Allreduce refuses a schedule that does not "
                               "compute its allreduce: ring schedule: rank "), text
        assert "expected all of 0..3 once" in text and "topoplan verify" in text

    def trusted(t: Local) -> int:  # what the check keeps out: wrong sums, no error
        x = np.arange(100, dtype=np.float64) + t.rank
        topoplan.Allreduce(bad, t, verified=True)(x)
        return int(np.count_nonzero(x != 4 * np.arange(100) + 6))

    assert sum(Local.launch(4, trusted)) > 0


@pytest.mark.parametrize("collective, to", [("reduce_scatter", False), ("allgather", True)])
def test_reduce_scatter_and_allgather_verify_too(collective, to):
    bad = flip_reduce(ring(4, collective=collective), to=to)
    call = topoplan.ReduceScatter if collective == "reduce_scatter" else topoplan.AllGather
    world = LocalWorld(4)
    with pytest.raises(ScheduleError, match=f"rank 0: {call.__name__} refuses a schedule "
                                            f"that does not compute its {collective}"):
        call(bad, world.transport(0))
    call(bad, world.transport(0), verified=True)  # taken as it is


def test_a_schedule_is_verified_once_and_an_equal_one_read_again_not_at_all(verify_calls):
    layout = (0.1, 0.2, 0.3, 0.4)
    good = ring(4, layout)
    bad = flip_reduce(ring(4, (0.4, 0.3, 0.2, 0.1)))
    world = LocalWorld(4)
    verify_calls.clear()  # planning's
    topoplan.Allreduce(good, world.transport(0))
    assert verify_calls == [layout]
    for r in range(4):  # every rank's executor, and another per buffer size: no more
        topoplan.Allreduce(good, world.transport(r))
    again = load_schedule_text(good.to_json())  # another object, equal: not verified
    assert again is not good and again == good
    topoplan.Allreduce(again, world.transport(1))
    assert verify_calls == [layout]

    results = Local.launch(4, lambda t: topoplan.Allreduce(good, t)(np.full(10, t.rank + 1.0)))
    assert all(np.array_equal(x, np.full(10, 10.0)) for x in results)
    assert verify_calls == [layout]

    # A schedule that fails is not remembered: it fails again, verified again.
    for _ in range(2):
        with pytest.raises(ScheduleError):
            topoplan.Allreduce(bad, world.transport(0))
    assert verify_calls[1:] == [(0.4, 0.3, 0.2, 0.1)] * 2


def load_schedule_text(text: str) -> Schedule:
    return loads_schedule(text)


def test_threads_building_executors_of_one_schedule_at_once_verify_it_once(verify_calls):
    layout = (0.25, 0.25, 0.125, 0.375)
    good = ring(4, layout)
    verify_calls.clear()  # planning's
    Local.launch(4, lambda t: topoplan.Allreduce(good, t)(np.ones(8)))
    assert verify_calls == [layout]


def test_what_planning_or_verify_returned_is_not_verified_again(verify_calls):
    world = LocalWorld(3)
    planned = topoplan.plan(flat_cluster(3), "ring", size=1 << 20)
    checked, unchecked = ring(3, (0.5, 0.25, 0.25)), ring(3, (0.5, 0.125, 0.375))
    verify_calls.clear()  # planning's
    topoplan.Allreduce(planned, world.transport(0))
    V.verify(checked)  # topoplan.verify, counted
    topoplan.Allreduce(checked, world.transport(0))
    assert verify_calls == [(0.5, 0.25, 0.25)]  # verify's, not the executor's
    topoplan.Allreduce(unchecked, world.transport(0), verified=True)
    assert verify_calls == [(0.5, 0.25, 0.25)]


def test_meta_saying_verified_is_not_trusted():
    bad = flip_reduce(ring(2, (0.75, 0.25)))
    bad = bad.with_meta(verified=True)
    with pytest.raises(ScheduleError, match="refuses a schedule"):
        topoplan.Allreduce(bad, LocalWorld(2).transport(0))


@pytest.mark.mpi
def test_real_mpi_ranks_refuse_a_flipped_plan_and_verify_a_good_one_once(tmp_path):
    pytest.importorskip("mpi4py")
    from topoplan.runtime.mpirun import mpiexec
    good = ring(3)
    good.save(tmp_path / "good.json")
    flip_reduce(good).save(tmp_path / "flipped.json")
    proc = mpiexec(3, [sys.executable, "-m", "tests.mpi_trust", "--plans", str(tmp_path)],
                   timeout=180, cwd=ROOT)
    records = {}
    for line in proc.stdout.splitlines():
        if line.startswith("TOPOPLAN-RESULT "):
            record = json.loads(line.removeprefix("TOPOPLAN-RESULT "))
            records[record["rank"]] = record
    assert sorted(records) == [0, 1, 2], f"{proc.stdout}\n{proc.stderr[-3000:]}"
    for rank, record in records.items():
        assert "error" not in record, record["error"]
        assert record["refused"].startswith(
            f"rank {rank}: Allreduce refuses a schedule that does not compute its allreduce: "
            "ring schedule: rank "), record["refused"]
        assert record["good"] == [True, True]
        assert record["wrong_when_trusted"] > 0
        # the flipped plan (refused: not remembered) and the good one, once for two executors
        assert record["verify_calls"] == ["ring", "ring"], record["verify_calls"]
    assert proc.returncode == 0, proc.stderr


def test_simulate_refuses_a_plan_that_does_not_verify_as_verify_does(tmp_path, capsys):
    path = tmp_path / "flipped.json"
    flip_reduce(topoplan.plan(topoplan.load_cluster(CLUSTER), "ring", size=1 << 20)).save(path)
    assert main(["verify", str(path)]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"topoplan: error: {path}: ring schedule: rank ")
    assert main(["simulate", str(CLUSTER), str(path), "--sizes", "1MiB"]) == 1
    out = capsys.readouterr()
    assert out.err.strip() == f"{said}; pass --force to simulate it anyway"
    assert out.out == ""
    assert main(["simulate", str(CLUSTER), str(path), "--sizes", "1MiB", "--json",
                 "--force"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert len(rows) == 1 and rows[0]["time_s"] > 0
