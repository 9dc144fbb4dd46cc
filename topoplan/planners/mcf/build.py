"""Schedules of ``q`` pipeline pieces of a layout's messages, piece ``p`` ``p`` steps
late: chunks numbered piece by piece (:func:`build`), or, for a reduce-scatter or an
allgather, so that each rank's own chunks make its shard (:func:`build_sharded`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...ir.schedule import Schedule
from .._lockstep import no_gc, schedule_from_arrays
from .layout import RankGrid, PieceMessages
from .messages import chunk_fractions, owners

__all__ = ["build", "build_sharded", "pieces_schedule"]


@no_gc
def build(nranks: int, msgs: PieceMessages, fractions: np.ndarray, q: int, **meta: Any) -> Schedule:
    """Materialize ``q`` pieces of ``msgs`` (piece ``p`` shifted by ``p`` steps)."""
    return pieces_schedule(nranks, msgs, q, lambda p, c: c + p * msgs.nchunks, fractions, **meta)


@no_gc
def build_sharded(nranks: int, msgs: PieceMessages, layout: RankGrid, sizes: np.ndarray,
                  collective: str, **meta: Any) -> Schedule:
    """Materialize ``len(sizes)`` pieces of :func:`.messages.shard_messages` as a ``collective``
    schedule whose chunks are grouped into shards in rank order (docs/SCHEDULE.md).

    Piece ``p`` runs ``p`` steps after piece ``p - 1``. Rank ``o``'s shard is its own
    chunks of every piece (:func:`.messages.owners`: ``K`` a piece, one per ring or per part of a
    rail shard), ordered by (piece, index): chunk ``o * Q K + p K + i``. A message's
    chunk range stays one range (its chunks are consecutive parts of one owner's).
    """
    q = len(sizes)
    own, sub, k = owners(layout)
    per_piece = msgs.nchunks
    old = chunk_fractions(layout, np.asarray(sizes, dtype=float))
    p_all = np.arange(q, dtype=np.int64)
    new_id = own[None, :] * (q * k) + p_all[:, None] * k + sub[None, :]
    fractions = np.empty(q * per_piece)
    fractions[new_id.ravel()] = old
    return pieces_schedule(nranks, msgs, q, lambda p, c: new_id[p, c], fractions,
                        collective=collective, **meta)


def pieces_schedule(nranks: int, msgs: PieceMessages, q: int,
                 chunk_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 fractions: np.ndarray, **meta: Any) -> Schedule:
    """``q`` pieces of ``msgs``, piece ``p`` ``p`` steps late; ``chunk_of(p, c)``
    numbers piece ``p``'s piece-local chunk ``c`` in the schedule."""
    m = len(msgs.step)
    p = np.repeat(np.arange(q, dtype=np.int64), m)
    step = np.tile(msgs.step, q) + p
    src = np.tile(msgs.src, q)
    dst = np.tile(msgs.dst, q)
    chunk = chunk_of(p, np.tile(msgs.chunk, q))
    count = np.tile(msgs.count, q)
    red = np.tile(msgs.reduce, q)
    # Each message twice: the send at src (code 0), the recv at dst (code 1 or 2).
    rk = np.concatenate([src, dst])
    st = np.concatenate([step, step])
    pe = np.concatenate([dst, src])
    ck = np.concatenate([chunk, chunk])
    cn = np.concatenate([count, count])
    cd = np.concatenate([np.zeros(len(step), np.int64), 1 + red.astype(np.int64)])
    del step, src, dst, chunk, count, red, p
    return schedule_from_arrays(nranks, rk, st, pe, ck, cd, fractions.tolist(), count=cn, **meta)
