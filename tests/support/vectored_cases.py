"""Vectored-message schedules (IR v4) and the cases every transport runs on them.

:func:`vectored_cases` runs, on one rank's transport, a hand-built vectored allreduce
(every rank owns two chunks far apart, each exchange one vectored message per peer:
reducing recvs, then overwriting ones) and the vectorized recursive-halving
reduce-scatter and allgather of :mod:`topoplan.planners.rhd`, also cut over two
channels first (each channel's steps run apart: polled, or on threads over gloo), on
small integers whose sums are exact, and returns the failures. tests/test_vectored.py
runs it on Local threads, MPI processes (tests/mpi_vectored.py) and gloo processes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.support.clusters import flat_cluster_yaml
from topoplan.ir.passes import vectorize
from topoplan.ir.schedule import Schedule, build_schedule, equal_chunks, vrecv, vsend


def owned(rank: int, n: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s chunks in :func:`vectored_allreduce`: ``rank`` and ``n + rank``."""
    return [(rank, 1), (n + rank, 1)]


def vectored_allreduce(n: int) -> Schedule:
    """A direct allreduce over ``2 n`` chunks in which every exchange is one vectored
    message per peer: step 0 sends each peer its two chunks (reducing there), step 1
    sends each peer this rank's two summed chunks (overwriting there)."""
    steps: list[list[list[Any]]] = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        steps.append([
            [vsend(p, owned(p, n)) for p in peers] + [vrecv(p, owned(r, n), True) for p in peers],
            [vsend(p, owned(r, n)) for p in peers] + [vrecv(p, owned(p, n)) for p in peers],
        ])
    return build_schedule(n, equal_chunks(2 * n), steps, algorithm="vectored-direct")


def rhd_plan(n: int, collective: str) -> Schedule:
    """The rhd planner's ``collective`` on a flat cluster of ``n`` ranks (one a box)."""
    from topoplan.cluster import loads_cluster
    from topoplan.planners import plan

    return plan(loads_cluster(flat_cluster_yaml(n, 1)), algorithm="rhd", size=1 << 20,
                collective=collective)


def rhd_channels(n: int, collective: str, channels: int = 2) -> Schedule:
    """:func:`rhd_plan` cut over ``channels`` channels, then vectorized (IR v4)."""
    from topoplan.ir.passes import channelize

    return vectorize(channelize(rhd_plan(n, collective), channels))


def ints(size: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small integers as float64: every order of additions gives the exact sum."""
    return ((np.arange(size) * 7 + 13 * rank + salt) % 23 - 5).astype(np.float64)


def vectored_cases(t: Any, timeout: float = 60.0) -> tuple[list[str], int]:
    """Every vectored case on transport ``t``: (failures, cases run). Run it on 4 ranks
    (or another power of two): rhd has no shards to merge below 4."""
    from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter

    n, rank = t.size, t.rank
    failures: list[str] = []
    ncases = 0
    allreduce = vectored_allreduce(n)
    rs, ag = vectorize(rhd_plan(n, "reduce_scatter")), vectorize(rhd_plan(n, "allgather"))
    rs2, ag2 = rhd_channels(n, "reduce_scatter"), rhd_channels(n, "allgather")
    for name, s in (("allreduce", allreduce), ("reduce_scatter", rs), ("allgather", ag),
                    ("reduce_scatter on channels", rs2), ("allgather on channels", ag2)):
        if n >= 4 and not any(op.more for _, _, op in s.ops()):  # rhd halves from 4 ranks
            failures.append(f"{name}: no vectored op to run")
    run = Allreduce(allreduce, t, timeout=timeout)
    for size in (0, 1, 2 * n - 1, 2 * n, 1001):
        x = ints(size, rank, size)
        run(x)
        ncases += 1
        want = sum(ints(size, r, size) for r in range(n))
        if not np.array_equal(x, want):
            failures.append(f"vectored allreduce of {size}: {x[:8]} != {want[:8]}")
    # A call in flight (the handle's own stepping).
    x = ints(1001, rank, 5)
    run.start(x).wait()
    ncases += 1
    if not np.array_equal(x, sum(ints(1001, r, 5) for r in range(n))):
        failures.append(f"vectored allreduce started and waited: {x[:8]}")
    for how, (a, b) in (("", (rs, ag)), (" on channels", (rs2, ag2))):
        run_rs, run_ag = ReduceScatter(a, t, timeout=timeout), AllGather(b, t, timeout=timeout)
        for m in (0, 1, 3, 250):  # elements per shard
            x = ints(n * m, rank, m)
            y = np.full(m, np.nan)
            run_rs(x, y)
            want = sum(ints(n * m, r, m) for r in range(n))[rank * m:(rank + 1) * m]
            ncases += 1
            if not np.array_equal(y, want):
                failures.append(f"vectored reduce_scatter{how} of {m} a shard: {y[:8]} != "
                                f"{want[:8]}")
            z = np.full(n * m, np.nan)
            run_ag(ints(m, rank, m), z)
            want = np.concatenate([ints(m, r, m) for r in range(n)])
            ncases += 1
            if not np.array_equal(z, want):
                failures.append(f"vectored allgather{how} of {m} a shard: {z[:8]} != "
                                f"{want[:8]}")
    return failures, ncases


def torch_rank_main(t: Any) -> dict:
    """A gloo rank's record (a module-level function: Torch.launch pickles it)."""
    failures, ncases = vectored_cases(t)
    return {"failures": failures, "ncases": ncases}
