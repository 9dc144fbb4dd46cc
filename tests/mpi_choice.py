"""auto's measured choice under real MPI: ``mpiexec -n 4 python tests/mpi_choice.py CASE``.

Cases (each rank prints ``TOPOPLAN-CHOICE {json}``):

- ``agree``: the candidates' timings are made rank-dependent on purpose (an injected
  sleep: ``native`` is slow on ranks 0 and 1, the model's first plan on ranks 2 and 3,
  by more), so that each rank's own clock would pick differently; every rank must pick
  the same, the one whose slowest rank is fastest.
- ``fail``: one candidate times out for real (a step timeout of 10 us on 4 MiB) and one
  fails to build on rank 2 only; both are dropped with a note, every result is exact.
- ``exact``: PlannedAllreduce(auto) on random floats: every rank's result of every call
  (exploring ones included) is bit-identical across ranks, and each is the sum.
- ``warn``: an Allreduce of a plan priced under the ``nccl`` profile over MPI warns once,
  on rank 0, naming both.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings

sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import numpy as np  # noqa: E402
from mpi4py import MPI as mpi  # noqa: E402

from topoplan.cluster import load_cluster  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.runtime.choice import MeasuredChoice, model_options, snapshot  # noqa: E402
from topoplan.runtime.executor import Allreduce  # noqa: E402
from topoplan.runtime.transports import MPI  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = load_cluster(os.path.join(ROOT, "topologies", "targets", "ddl_two_switch_crossed.yaml"))


def emit(record: dict) -> None:
    print("TOPOPLAN-CHOICE " + json.dumps(record), flush=True)


def options_for(t: MPI, nbytes: int) -> tuple[list, str]:
    host = CLUSTER  # priced on the cluster: the choice only needs candidates
    return model_options(host, nbytes, profile="mpi", machine=host, top=2)


def agree(t: MPI) -> None:
    nbytes = 1 << 16
    options, model_choice = options_for(t, nbytes)
    first = next(o.algorithm for o in options if o.algorithm != "native")
    # rank-dependent delays: alone, ranks 0-1 would pick `first`, ranks 2-3 `native`;
    # the slowest rank of `native` (8 ms) beats the slowest of `first` (20 ms).
    delay = {"native": 0.008 if t.rank < 2 else 0.0, first: 0.020 if t.rank >= 2 else 0.0}

    options = [o for o in options if o.algorithm in (first, "native")]
    name_of = {id(o.schedule): o.algorithm for o in options}

    def executor(schedule):
        run = Allreduce(schedule, t)
        pause = delay[name_of[id(schedule)]]

        def call(*args):  # the rank's own clock runs on after its part of the call
            out = run(*args)
            time.sleep(pause)
            return out
        return call

    choice = MeasuredChoice(t, lambda n: (options, model_choice), executor,
                            snapshot=snapshot, mode="measured")
    for _ in range(12):
        x = np.full(nbytes // 4, float(t.rank + 1), dtype=np.float32)
        choice.call(nbytes, x)
        assert (x == sum(range(1, t.size + 1))).all()
    d = next(iter(choice.decisions.values()))
    emit({"rank": t.rank, "chosen": d.chosen, "first": first,
          "own_pick": first if t.rank < 2 else "native",
          "measured": {c["algorithm"]: c["measured_us"] for c in d.candidates}})


def fail(t: MPI) -> None:
    nbytes = 4 << 20
    options, model_choice = options_for(t, nbytes)
    names = [o.algorithm for o in options]
    timed_out, broken = names[0], names[1]

    name_of = {id(o.schedule): o.algorithm for o in options}

    def executor(schedule):
        name = name_of[id(schedule)]
        if name == broken and t.rank == 2:
            raise TopoplanError("injected: this rank cannot build it")
        return Allreduce(schedule, t, timeout=1e-5 if name == timed_out else 60.0)

    choice = MeasuredChoice(t, lambda n: (options, model_choice), executor,
                            snapshot=snapshot, mode="measured")
    wrong = 0
    want = float(sum(range(1, t.size + 1)))
    for call in range(20):
        x = np.full(nbytes // 4, float(t.rank + 1), dtype=np.float32)
        choice.call(nbytes, x)
        wrong += int(np.count_nonzero(x != want))
    d = next(iter(choice.decisions.values()))
    emit({"rank": t.rank, "wrong": wrong, "chosen": d.chosen, "timed_out": timed_out,
          "broken": broken, "notes": {c["algorithm"]: c["note"] for c in d.candidates}})


def exact(t: MPI) -> None:
    from topoplan.torch.planned import PlannedAllreduce
    planned = PlannedAllreduce(CLUSTER, t, profile="mpi", machine=CLUSTER)
    comm = mpi.COMM_WORLD
    mismatched, off, calls = 0, 0.0, 0
    for nbytes in (1 << 14, 1 << 20):
        for call in range(40):  # past explore_budget() (36): racing close ones may need it
            rng = np.random.default_rng(1000 * call + t.rank)
            x = rng.standard_normal(nbytes // 4).astype(np.float32)
            total = comm.allreduce(x.astype(np.float64))
            planned(x)
            digests = comm.allgather(hashlib.sha1(x.tobytes()).hexdigest())
            mismatched += len(set(digests)) > 1
            off = max(off, float(np.max(np.abs(x - total))))
            calls += 1
    emit({"rank": t.rank, "mismatched": mismatched, "calls": calls, "max_error": off,
          "decisions": [d.to_dict() for d in planned.choice.history]})


def warn(t: MPI) -> None:
    import topoplan
    schedule = topoplan.plan(CLUSTER, algorithm="ring", size=1 << 20, profile="nccl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Allreduce(schedule, t)(np.ones(1000, dtype=np.float32))
    emit({"rank": t.rank, "warnings": [str(w.message) for w in caught]})


if __name__ == "__main__":
    transport = MPI()
    {"agree": agree, "fail": fail, "exact": exact, "warn": warn}[sys.argv[1]](transport)
