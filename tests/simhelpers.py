"""Small schedules and clusters built by hand for the simulator and bound tests.

The real planners live in ``topoplan.planners``; these tests must not depend on them,
so the ring here is written out from its textbook definition (Patarasuk and Yuan, 2009).
"""

from __future__ import annotations

from typing import Sequence

from topoplan.cluster import Cluster, loads_cluster
from topoplan.schedule import Schedule, build_schedule, equal_chunks, recv, send


def ring_schedule(order: Sequence[int], *, name: str = "ring") -> Schedule:
    """Ring allreduce over ``order`` (ring positions -> ranks), one chunk per rank.

    Reduce-scatter: in step k, position p sends chunk (p - k) mod n to p + 1 and reduces
    chunk (p - k - 1) mod n from p - 1. Allgather: n - 1 more steps forwarding the
    finished chunks. 2(n - 1) steps, each moving M/n bytes per rank.
    """
    n = len(order)
    steps: list[list[list]] = [[] for _ in range(n)]
    for p, rank in enumerate(order):
        nxt, prv = order[(p + 1) % n], order[(p - 1) % n]
        for k in range(n - 1):
            steps[rank].append([send(nxt, (p - k) % n), recv(prv, (p - k - 1) % n, reduce=True)])
        for k in range(n - 1):
            steps[rank].append([send(nxt, (p + 1 - k) % n), recv(prv, (p - k) % n)])
    return build_schedule(n, equal_chunks(n), steps, algorithm=name)


def switch_cluster(n: int, bandwidth: str = "10 GB/s", latency: str = "1 us") -> Cluster:
    """``n`` one-GPU boxes on one switch."""
    return loads_cluster(f"""
name: switch-{n}
switches: [sw0]
boxes:
  - {{name: "b{{i}}", count: {n}, gpus: 1,
      nics: [{{switch: sw0, bandwidth: {bandwidth}, latency: {latency}}}]}}
""")
