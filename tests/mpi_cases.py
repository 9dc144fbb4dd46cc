"""Executor correctness under real MPI: ``mpiexec -n N python -m tests.mpi_cases``, from the
repository root.

One launch runs every case (every test schedule and planner, uneven sizes,
dtypes, array kinds, snapshot semantics, refusal of a wrong rank count) and then,
with ``--kill R``, a final allreduce in which rank R exits mid-run. Every rank
prints one line ``TOPOPLAN-RESULT {json}``: its failures, the number of cases,
and what the killed-peer run raised. tests/test_transports_mpi.py reads them.
"""

from __future__ import annotations

import argparse

import numpy as np

from tests.support import schedules as S
from tests.support import transport_cases as C
from tests.support.mpi_job import run_job
from topoplan.runtime.executor import BOUND_CACHE, Allreduce
from topoplan.runtime.transports import MPI, connect


def mpi_cases(t: MPI) -> tuple[list[str], int]:
    """Cases of the MPI transport itself: its polling options and request lifetime."""
    n, rank = t.size, t.rank
    failures = []
    want = np.arange(1001) * n + sum(range(n))
    # Yield at once, never yield, both; every send fresh or none: all give the sum.
    options = ({"spin": 0}, {"poll_yield": False}, {"spin": 0, "poll_yield": False},
               {"inline_max": 1 << 30}, {"inline_max": -1})
    for kwargs in options:
        x = np.arange(1001, dtype=np.float64) + rank
        Allreduce(S.ring(n), MPI(**kwargs), timeout=30)(x)
        if not np.array_equal(x, want):
            failures.append(f"rank {rank}: MPI({kwargs}): wrong sum")
    # Persistent requests belong to a binding: freed when the executor drops it
    # (mpi4py would leak them), alive while it is cached.
    u = MPI()
    made, real_batch = [], u.batch

    def spy(messages):
        batch = real_batch(messages)
        made.append(list(batch.persistent))
        return batch

    u.batch = spy
    run = Allreduce(S.ring(n), u, timeout=30)
    for k in range(BOUND_CACHE + 2):  # distinct sizes: the oldest bindings are evicted
        y = np.full(100 + k, rank + 1.0)
        run(y)
        if not np.all(y == n * (n + 1) / 2):
            failures.append(f"rank {rank}: binding {k}: wrong sum")
    if not made or any(r for r in made[0]):
        failures.append(f"rank {rank}: an evicted binding's persistent requests were not freed")
    if not made or not made[-1] or not all(made[-1]):
        failures.append(f"rank {rank}: a cached binding's persistent requests were freed")
    # The factory and the classmethod build the transport over COMM_WORLD.
    builders = {"connect('mpi', spin=0)": (lambda: connect("mpi", spin=0), 0),
                "MPI.world()": (MPI.world, 64)}
    for name, (build, spin) in builders.items():
        v = build()
        x = np.arange(1001, dtype=np.float64) + rank
        if not isinstance(v, MPI) or (v.rank, v.size, v.spin) != (rank, n, spin):
            failures.append(f"rank {rank}: {name} is {v!r}")
        elif not np.array_equal(Allreduce(S.ring(n), v, timeout=30)(x), want):
            failures.append(f"rank {rank}: {name}: wrong sum")
    return failures, len(options) + BOUND_CACHE + 4 + len(builders)


def cases(t: MPI, args: argparse.Namespace) -> dict:
    failures, ncases, names = C.run_cases(t, with_torch=args.torch)
    more, count = mpi_cases(t)
    return {"failures": failures + more, "ncases": ncases + count, "schedules": names}


def main() -> None:
    run_job(cases, lambda t, args: C.killed_peer_run(t, victim=args.kill, timeout=args.timeout))


if __name__ == "__main__":
    main()
