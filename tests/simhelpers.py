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


def hierarchical_schedule(nranks: int, gpus_per_box: int, *,
                          name: str = "hierarchical") -> Schedule:
    """Two-level BlueConnect-style allreduce: in-box ring reduce-scatter, a ring allreduce
    across boxes among the GPUs with the same local index (one ring per rail), in-box
    ring allgather.

    Chunk ``l * B + b`` (``B`` boxes) is piece ``l`` (owned by local GPU ``l`` after the
    in-box phase), sub-piece ``b`` (owned by box ``b`` after the cross-box reduce-scatter),
    so an in-box op set moves ``B`` chunks to one peer: ``Theta(n^2 / g)`` ops in all,
    like the real hierarchical planners.
    """
    g = gpus_per_box
    nboxes = nranks // g
    if nboxes * g != nranks:
        raise ValueError(f"{nranks} ranks are not whole boxes of {g}")
    steps: list[list[list]] = [[] for _ in range(nranks)]

    def piece(l: int) -> range:
        return range(l * nboxes, (l + 1) * nboxes)

    for box in range(nboxes):
        ranks = [box * g + l for l in range(g)]
        for p, rank in enumerate(ranks):
            nxt, prv = ranks[(p + 1) % g], ranks[(p - 1) % g]
            for k in range(g - 1):  # in-box reduce-scatter: ends owning piece p
                sp, rp = (p - k - 1) % g, (p - k - 2) % g
                steps[rank].append([send(nxt, c) for c in piece(sp)]
                                   + [recv(prv, c, reduce=True) for c in piece(rp)])
    for l in range(g):  # one ring per rail over the boxes, on piece l
        rail = [b * g + l for b in range(nboxes)]
        for p, rank in enumerate(rail):
            nxt, prv = rail[(p + 1) % nboxes], rail[(p - 1) % nboxes]
            base = l * nboxes
            for k in range(nboxes - 1):
                steps[rank].append([send(nxt, base + (p - k) % nboxes),
                                    recv(prv, base + (p - k - 1) % nboxes, reduce=True)])
            for k in range(nboxes - 1):
                steps[rank].append([send(nxt, base + (p + 1 - k) % nboxes),
                                    recv(prv, base + (p - k) % nboxes)])
    for box in range(nboxes):
        ranks = [box * g + l for l in range(g)]
        for p, rank in enumerate(ranks):
            nxt, prv = ranks[(p + 1) % g], ranks[(p - 1) % g]
            for k in range(g - 1):  # in-box allgather of the finished pieces
                sp, rp = (p - k) % g, (p - k - 1) % g
                steps[rank].append([send(nxt, c) for c in piece(sp)]
                                   + [recv(prv, c) for c in piece(rp)])
    return build_schedule(nranks, equal_chunks(nranks), steps, algorithm=name)


def leaf_spine_cluster(nboxes: int, *, boxes_per_leaf: int = 8, spines: int = 4,
                       gpus: int = 8) -> Cluster:
    """``topologies/leaf_spine_1024.yaml`` scaled to ``nboxes`` boxes (same box, NICs,
    2:1 oversubscribed leaves; at least two leaves)."""
    per_leaf = min(boxes_per_leaf, max(1, nboxes // 2))
    leaves = -(-nboxes // per_leaf)
    nics = "\n".join(
        f'      - {{switch: "leaf{{i//{per_leaf}}}", bandwidth: 200 Gbit/s, latency: 1 us, '
        f'gpus: [{j}]}}' for j in range(gpus))
    return loads_cluster(f"""
name: leaf-spine-{nboxes * gpus}
switches:
  - {{name: "leaf{{i}}", count: {leaves}}}
  - {{name: "spine{{i}}", count: {spines}}}
boxes:
  - name: "node{{i}}"
    count: {nboxes}
    gpus: {gpus}
    fabric: {{bandwidth: 300 GB/s, latency: 0.5 us}}
    nics:
{nics}
links:
  - {{a: "leaf{{i//{spines}}}", b: "spine{{i%{spines}}}", count: {leaves * spines},
     bandwidth: {25 * per_leaf} GB/s, latency: 0.5 us}}
""")


# One DGX-1 V100: the hybrid cube mesh of its nvidia-smi topology matrix.
DGX1 = """
name: dgx1
boxes:
  - name: dgx
    gpus: 8
    gpu_links:
      # hybrid cube mesh, 6 NVLinks x 25 GB/s per GPU; 50 GB/s = a double link
      - {a: 0, b: 1, bandwidth: 25}
      - {a: 0, b: 2, bandwidth: 25}
      - {a: 0, b: 3, bandwidth: 50}
      - {a: 0, b: 4, bandwidth: 50}
      - {a: 1, b: 2, bandwidth: 50}
      - {a: 1, b: 3, bandwidth: 25}
      - {a: 1, b: 5, bandwidth: 50}
      - {a: 2, b: 3, bandwidth: 50}
      - {a: 2, b: 6, bandwidth: 25}
      - {a: 3, b: 7, bandwidth: 25}
      - {a: 4, b: 5, bandwidth: 25}
      - {a: 4, b: 6, bandwidth: 25}
      - {a: 4, b: 7, bandwidth: 50}
      - {a: 5, b: 6, bandwidth: 50}
      - {a: 5, b: 7, bandwidth: 25}
      - {a: 6, b: 7, bandwidth: 50}
"""
