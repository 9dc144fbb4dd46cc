"""The messages of one pipeline piece on a grid layout (:mod:`.grids`).

Final chunks are numbered in mixed radix, first level most significant, so the
segment a rank hands on at level ``d`` is one run of consecutive chunks: one op
(a chunk range, IR v2) per ring step. Ops: ``4 sum_d (b_d - 1)`` per rank per
piece and ring (116 at 1024 ranks as 8 x 16 x 8; one chunk per op would take
about ``4 N``).

A reduce-scatter or an allgather takes one half of them, one message per final chunk
(:func:`shard_messages`); a rail layout's come from :mod:`.rails`. :func:`owners` and
:func:`chunk_fractions` say where each chunk ends and what share of the buffer it is.
"""

from __future__ import annotations

import numpy as np

from .layout import RankGrid, PieceMessages
from .rails import rail_message_count, rail_messages

__all__ = ["messages", "message_count", "shard_messages", "shard_message_count", "owners",
           "chunk_fractions"]


def message_count(layout: RankGrid) -> int:
    """``len(messages(layout).step)``, without building them."""
    n = int(np.prod(layout.dims)) if layout.dims else 1
    return 2 * n * sum(b - 1 for b in layout.dims) * len(layout.grids)


def messages(layout: RankGrid) -> PieceMessages:
    """The reduce-scatter and allgather messages of one pipeline piece."""
    dims = layout.dims
    nd = len(dims)
    n = int(np.prod(dims)) if nd else 1
    strides = [int(np.prod(dims[d + 1:])) for d in range(nd)]
    coords = np.indices(dims).reshape(nd, -1) if nd else np.zeros((0, 1), np.int64)
    nsteps_of = [1 if layout.is_direct(d) else dims[d] - 1 for d in range(nd)]
    rs_base, t0 = [], 0
    for d in range(nd):
        rs_base.append(t0)
        t0 += nsteps_of[d]
    ag_base = {}
    for d in reversed(range(nd)):
        ag_base[d] = t0
        t0 += nsteps_of[d]
    nsteps = t0
    parts: list[tuple[np.ndarray, ...]] = []
    for r, grid in enumerate(layout.grids):
        ranks = grid.reshape(-1)
        for d in range(nd):
            b = dims[d]
            fixed = np.zeros(n, dtype=np.int64)
            for e in range(d):
                fixed += coords[e] * strides[e]
            t = np.arange(b - 1, dtype=np.int64)
            c = coords[d][:, None]
            direct = layout.is_direct(d)
            # Peer coordinate of each of the b - 1 messages of a rank: the next on the
            # ring, or (direct) every other member once, all in one step.
            peer = (c + 1 + t[None, :]) % b if direct else np.broadcast_to((c + 1) % b, (n, b - 1))
            dst = ranks[(peer - c) * strides[d] + np.arange(n)[:, None]]
            for phase in (0, 1):  # reduce-scatter, allgather
                # Rank c ends the reduce-scatter owning segment c (ring and direct alike).
                if direct:
                    seg = peer if phase == 0 else np.broadcast_to(c, (n, b - 1))
                    step = np.zeros_like(t)
                else:
                    seg = (c - t[None, :] - 1 + phase) % b
                    step = t
                base = rs_base[d] if phase == 0 else ag_base[d]
                # shape (n, b-1): the segment is chunks fixed + seg * stride + [0, stride)
                first = fixed[:, None] + seg * strides[d]
                shape = first.shape
                parts.append((np.broadcast_to((base + step)[None, :], shape).ravel(),
                              np.broadcast_to(ranks[:, None], shape).ravel(),
                              dst.ravel(),
                              (first + r * n).ravel(),
                              np.full(first.size, strides[d], dtype=np.int64),
                              np.full(first.size, phase == 0)))
    if not parts:
        z = np.zeros(0, dtype=np.int64)
        return PieceMessages(z, z, z, z, z, np.zeros(0, bool), 0, n * len(layout.grids))
    cat = [np.concatenate(x) for x in zip(*parts)]
    return PieceMessages(cat[0], cat[1], cat[2], cat[3], cat[4], cat[5], nsteps, n * len(layout.grids))


def shard_message_count(layout: RankGrid) -> int:
    """``len(shard_messages(layout, ...).step)``, without building them: one message per
    final chunk a segment holds, ``R N sum_d (b_d - 1) stride_d`` (one phase)."""
    if layout.rails:
        return rail_message_count(layout)
    dims = layout.dims
    n = int(np.prod(dims)) if dims else 1
    strides = [int(np.prod(dims[d + 1:])) for d in range(len(dims))]
    return n * sum((b - 1) * s for b, s in zip(dims, strides)) * len(layout.grids)


def shard_messages(layout: RankGrid, collective: str) -> PieceMessages:
    """One piece of a reduce-scatter (the grid's first half) or an allgather (its second
    half), one message per final chunk (count 1), steps from 0.

    Chunks stay piece-local (``ring * N + final``, as in :func:`messages`) so that
    :func:`chunk_fractions` prices them; :func:`.build.build_sharded` renumbers them by owner.
    A segment a rank hands on is a run of final chunks, but the final chunks of one
    owner (its shard) are the same final index in every ring and piece: a run of finals
    is a run of owners only by accident, so each becomes its own op.
    """
    if layout.rails:
        return rail_messages(layout, collective)
    full = messages(layout)
    keep = full.reduce if collective == "reduce_scatter" else ~full.reduce
    half = full.nsteps // 2
    count = full.count[keep]
    reps = lambda a: np.repeat(a[keep], count)  # noqa: E731
    offset = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count,
                                                                      count)
    step = reps(full.step) - (0 if collective == "reduce_scatter" else half)
    return PieceMessages(step, reps(full.src), reps(full.dst), reps(full.chunk) + offset,
                    np.ones(len(step), dtype=np.int64), reps(full.reduce), half, full.nchunks)


def owners(layout: RankGrid) -> tuple[np.ndarray, np.ndarray, int]:
    """The rank that owns each piece-local chunk after the reduce-scatter, the chunk's
    index among that rank's chunks of the piece, and how many it owns per piece.

    A grid's chunk ``ring * N + k`` (final index ``k`` of ring ``r``) ends at
    ``grids[r].flat[k]``, ``R`` chunks a rank; a rail layout's chunk
    ``position * parts + i`` at ``grids[0].flat[position]``, ``parts`` a rank.
    """
    if layout.rails:
        flat = layout.grids[0].reshape(-1).astype(np.int64)
        c = np.arange(flat.size * layout.parts, dtype=np.int64)
        return flat[c // layout.parts], c % layout.parts, layout.parts
    own = np.concatenate([g.reshape(-1) for g in layout.grids]).astype(np.int64)
    n = int(layout.grids[0].size)
    return own, np.arange(own.size, dtype=np.int64) // n, len(layout.grids)


def chunk_fractions(layout: RankGrid, sizes: np.ndarray) -> np.ndarray:
    """Fraction of each chunk: pieces (of ``sizes``) x rings x final index (a rail
    layout: pieces x positions x parts, all equal)."""
    n = int(layout.grids[0].size)
    if layout.rails:
        per = np.full(n * layout.parts, 1.0 / (n * layout.parts))
    else:
        per = np.repeat(layout.weights / n, n)
    fr = (np.asarray(sizes)[:, None] * per[None, :]).ravel()
    fr[-1] = 1.0 - fr[:-1].sum()
    return fr
