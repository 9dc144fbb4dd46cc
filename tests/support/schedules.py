"""Small hand-built schedules for the executor, transport, verifier and simulator tests.

Planners live in topoplan.planners; these builders stay independent of them so the
executor, the verifier and the simulator are tested even where a planner is wrong, and
they cover shapes the planners do not emit (empty steps, many messages to one peer in a
step, a step that sends a chunk while overwriting it). The rings are written out from
their textbook definition (Patarasuk and Yuan, 2009).
"""

from __future__ import annotations

from typing import Sequence

from topoplan.ir.schedule import Schedule, build_schedule, equal_chunks, recv, send

from .clusters import flat_cluster_yaml


def ring(n: int) -> Schedule:
    """Reduce-scatter then allgather around 0 -> 1 -> ... -> n-1 -> 0, n chunks."""
    steps: list[list[list]] = [[] for _ in range(n)]
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):  # reduce-scatter: after it rank r owns chunk (r + 1) % n
            steps[r].append([send(nxt, (r - s) % n), recv(prv, (r - s - 1) % n, reduce=True)])
        for s in range(n - 1):  # allgather
            steps[r].append([send(nxt, (r + 1 - s) % n), recv(prv, (r - s) % n)])
    return build_schedule(n, equal_chunks(n), steps, algorithm="test-ring")


def direct(n: int) -> Schedule:
    """Direct reduce-scatter then direct allgather, 2n chunks of uneven size.

    Rank r owns chunks r and n + r. In reduce-scatter step k it sends both chunks
    of rank (r + k) % n to it and reduces its own from rank (r - k) % n; the
    allgather mirrors it with overwrites. Two messages per pair per step exercise
    in-order matching; uneven fractions exercise the rounding of chunk boundaries.
    """
    nchunks = 2 * n
    weights = [k % 3 + 1 for k in range(nchunks)]
    chunks = tuple(w / sum(weights) for w in weights)
    steps: list[list[list]] = [[] for _ in range(n)]
    for r in range(n):
        for k in range(1, n):
            to, frm = (r + k) % n, (r - k) % n
            steps[r].append([send(to, to), send(to, n + to),
                             recv(frm, r, reduce=True), recv(frm, n + r, reduce=True)])
        for k in range(1, n):
            to, frm = (r + k) % n, (r - k) % n
            steps[r].append([send(to, r), send(to, n + r), recv(frm, frm), recv(frm, n + frm)])
    return build_schedule(n, chunks, steps, algorithm="test-direct")


def reduce_bcast(n: int) -> Schedule:
    """Binomial-free chain: everyone sends to rank 0 in turn, rank 0 broadcasts.

    Ranks other than 0 idle in empty steps; rank 0 sends and receives the same
    chunk in a step only with reduce, and overwrite recvs never conflict.
    """
    steps: list[list[list]] = [[] for _ in range(n)]
    for p in range(1, n):
        steps[0].append([recv(p, 0, reduce=True)])
        for r in range(1, n):
            steps[r].append([send(0, 0)] if r == p else [])
    steps[0].append([send(p, 0) for p in range(1, n)])
    for r in range(1, n):
        steps[r].append([recv(0, 0)])
    return build_schedule(n, (1.0,), steps, algorithm="test-reduce-bcast")


def swap(n: int = 2) -> Schedule:
    """NOT an allreduce: one step where each rank sends chunk 0 to its right neighbour
    and overwrites chunk 0 with its left neighbour's. Afterwards rank r holds rank
    r-1's input only if sends snapshot the chunk at step start."""
    steps = [[[send((r + 1) % n, 0), recv((r - 1) % n, 0)]] for r in range(n)]
    return build_schedule(n, (1.0,), steps, algorithm="test-swap")


def butterfly(n: int) -> Schedule:
    """Recursive doubling on one chunk (n a power of two): send and reduce the same
    chunk in every step; the add must wait until the send is done."""
    steps: list[list[list]] = [[] for _ in range(n)]
    d = 1
    while d < n:
        for r in range(n):
            steps[r].append([send(r ^ d, 0), recv(r ^ d, 0, reduce=True)])
        d *= 2
    return build_schedule(n, (1.0,), steps, algorithm="test-butterfly")


def halving_ranges(n: int) -> Schedule:
    """Recursive halving/doubling (n a power of two) written with chunk ranges (IR v2):
    one op per step carries half, a quarter, ... of the buffer's n chunks."""
    steps: list[list[list]] = [[] for _ in range(n)]
    lo, hi = [0] * n, [n] * n  # the chunk range each rank still reduces
    d = n // 2
    while d >= 1:
        for r in range(n):
            mid = (lo[r] + hi[r]) // 2
            keep, give = ((lo[r], mid), (mid, hi[r])) if r & d == 0 else ((mid, hi[r]), (lo[r], mid))
            steps[r].append([send(r ^ d, give[0], count=give[1] - give[0]),
                             recv(r ^ d, keep[0], reduce=True, count=keep[1] - keep[0])])
            lo[r], hi[r] = keep
        d //= 2
    d = 1
    while d < n:
        for r in range(n):
            width = hi[r] - lo[r]
            other = lo[r] + width if r & d == 0 else lo[r] - width
            steps[r].append([send(r ^ d, lo[r], count=width), recv(r ^ d, other, count=width)])
            lo[r], hi[r] = min(lo[r], other), max(hi[r], other + width)
        d *= 2
    return build_schedule(n, equal_chunks(n), steps, algorithm="test-halving-ranges")


def shifted_swap(n: int = 2) -> Schedule:
    """NOT an allreduce: in one step rank r sends chunks 0..2 to its right neighbour and
    overwrites chunks 1..3 (of 4) with its left neighbour's chunks 0..2: ranges that
    overlap partly, so the send must go out of a snapshot taken at step start."""
    steps = [[[send((r + 1) % n, 0, count=3), recv((r - 1) % n, 1, count=3)]] for r in range(n)]
    return build_schedule(n, equal_chunks(4), steps, algorithm="test-shifted-swap")


def all_to_all(n: int) -> Schedule:
    """Direct reduce-scatter and allgather in one step each (IR v2): rank r sends chunk p
    to every rank p and adds the n - 1 partial sums of chunk r in the same step, then
    sends chunk r to everyone. Uneven chunks; several reducing recvs of one chunk."""
    weights = [k % 4 + 1 for k in range(n)]
    chunks = tuple(w / sum(weights) for w in weights)
    steps: list[list[list]] = [[] for _ in range(n)]
    for r in range(n):
        others = [p for p in range(n) if p != r]
        steps[r].append([send(p, p) for p in others] + [recv(p, r, reduce=True) for p in others])
        steps[r].append([send(p, r) for p in others] + [recv(p, p) for p in others])
    return build_schedule(n, chunks, steps, algorithm="test-all-to-all")


def builders(n: int) -> dict[str, Schedule]:
    """Every correct test schedule for ``n`` ranks."""
    out = {"test-ring": ring(n), "test-direct": direct(n), "test-reduce-bcast": reduce_bcast(n),
           "test-all-to-all": all_to_all(n)}
    if n & (n - 1) == 0 and n > 1:
        out["test-butterfly"] = butterfly(n)
        out["test-halving-ranges"] = halving_ranges(n)
    return out


def planner_schedules(n: int, size: int = 1 << 20) -> dict[str, Schedule]:
    """Every planner in topoplan.planners.PLANNERS on small clusters of ``n`` ranks.

    Empty when the planners are not there yet. A planner that cannot serve a
    shape (InfeasiblePlanError) is left out of that shape only.
    """
    try:
        from topoplan.planners import PLANNERS, plan
    except ImportError:
        return {}
    from topoplan.cluster import loads_cluster
    from topoplan.errors import InfeasiblePlanError

    shapes = [1] + ([2] if n % 2 == 0 and n > 2 else [])
    out: dict[str, Schedule] = {}
    for g in shapes:
        cluster = loads_cluster(flat_cluster_yaml(n, g))
        for name in sorted(PLANNERS):
            try:
                out[f"{name}@{n // g}x{g}"] = plan(cluster, algorithm=name, size=size)
            except InfeasiblePlanError:
                continue
    return out


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


def ring_reduce_scatter(order: Sequence[int], *, name: str = "ring") -> Schedule:
    """Ring reduce-scatter over ``order`` (ring positions -> ranks), one chunk per shard.

    In step k, position p sends chunk ``order[(p - k - 1) mod n]`` to p + 1 and reduces
    chunk ``order[(p - k - 2) mod n]`` from p - 1, so after n - 1 steps rank ``order[p]``
    holds its own shard, ``order[p]``, summed over every rank.
    """
    n = len(order)
    steps: list[list[list]] = [[] for _ in range(n)]
    for p, rank in enumerate(order):
        nxt, prv = order[(p + 1) % n], order[(p - 1) % n]
        for k in range(n - 1):
            steps[rank].append([send(nxt, order[(p - k - 1) % n]),
                                recv(prv, order[(p - k - 2) % n], reduce=True)])
    return build_schedule(n, equal_chunks(n), steps, collective="reduce_scatter",
                          algorithm=name)


def ring_allgather(order: Sequence[int], *, name: str = "ring") -> Schedule:
    """Ring allgather over ``order``, one chunk per shard: in step k, position p forwards
    chunk ``order[(p - k) mod n]`` (its own shard first) to p + 1."""
    n = len(order)
    steps: list[list[list]] = [[] for _ in range(n)]
    for p, rank in enumerate(order):
        nxt, prv = order[(p + 1) % n], order[(p - 1) % n]
        for k in range(n - 1):
            steps[rank].append([send(nxt, order[(p - k) % n]), recv(prv, order[(p - k - 1) % n])])
    return build_schedule(n, equal_chunks(n), steps, collective="allgather", algorithm=name)


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
