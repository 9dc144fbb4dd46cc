"""Pipeline sizing for the ``mcf`` grids: how many pieces, and how big.

:func:`piece_sizes` sets the sizes of ``q`` pieces by an LP that keeps the narrow links
busy in every step; :func:`choose_pieces` picks ``q`` (doubling while the lock-step
estimate of :mod:`.pricing` gains) within the op budget and the caps.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .pricing import NO_COSTS, SoftCosts, estimate

__all__ = ["MIN_GAIN", "piece_sizes", "choose_pieces"]


#: The least relative gain for which choose_pieces doubles the pipeline depth.
MIN_GAIN = 2e-3


def _link_classes(loads: np.ndarray) -> np.ndarray:
    """The distinct link columns of ``loads`` that carry anything (symmetric links
    have equal columns; one constraint each is enough)."""
    cols = loads[:, loads.max(axis=0) > 0]
    if cols.shape[1] == 0:
        return np.zeros((loads.shape[0], 1))
    scale = cols.max()
    _, keep = np.unique(np.round(cols / scale, 9), axis=1, return_index=True)
    return cols[:, np.sort(keep)]


def piece_sizes(loads: np.ndarray, step_lat: np.ndarray, q: int, size: float,
                soft: SoftCosts = NO_COSTS, shares: tuple[float, ...] | None = None
                ) -> tuple[np.ndarray, float]:
    """Piece sizes that minimize the lock-step time (an LP), and that time.

    ``min sum_s T_s  s.t.  T_s >= sum_p x_p loads[s - p, e]  (every step s, link e),
    sum_p x_p = 1, x_p >= 1e-3 / q``. Equal pieces leave the narrow links idle while
    the first piece crosses the box and after the last one left it; small first and
    last pieces shorten that fill. One constraint per distinct link column. The
    software costs do not depend on the sizes: they are added to the time. The time
    returned is the estimate on the channels of ``shares`` (:func:`.pricing.estimate`).
    """
    if q == 1:
        ones = np.ones(1)
        return ones, estimate(loads, step_lat, ones, size, soft, shares)
    cols = _link_classes(loads)
    s, m = cols.shape
    nt = s + q - 1
    # variables: x (q), T (nt)
    rows, cidx, vals = [], [], []
    r = 0
    for t in range(nt):
        ps = [p for p in range(q) if 0 <= t - p < s]
        for e in range(m):
            coeffs = [(p, cols[t - p, e]) for p in ps if cols[t - p, e] > 0]
            if not coeffs:
                continue
            for p, v in coeffs:
                rows.append(r)
                cidx.append(p)
                vals.append(v)
            rows.append(r)
            cidx.append(q + t)
            vals.append(-1.0)
            r += 1
    scale = 1.0 / cols.max()
    a_ub = sp.csr_array((np.array(vals) * np.where(np.array(cidx) < q, scale, 1.0),
                         (rows, cidx)), shape=(r, q + nt))
    c = np.concatenate([np.zeros(q), np.ones(nt)])
    a_eq = np.concatenate([np.ones(q), np.zeros(nt)])[None, :]
    bounds = [(1e-3 / q, None)] * q + [(0, None)] * nt
    res = linprog(c, A_ub=a_ub, b_ub=np.zeros(r), A_eq=a_eq, b_eq=[1.0], bounds=bounds,
                  method="highs")
    if res.status != 0:
        x = np.full(q, 1.0 / q)
    else:
        x = np.maximum(res.x[:q], 1e-3 / q)
        x /= x.sum()
    return x, estimate(loads, step_lat, x, size, soft, shares)


def choose_pieces(loads: np.ndarray, step_lat: np.ndarray, size: float, ops_per_piece: int,
                  max_ops: int, max_q: int = 256, soft: SoftCosts = NO_COSTS,
                  max_step_ops: int | None = None, chunks_per_piece: int = 1,
                  max_chunks: int | None = None, shares: tuple[float, ...] | None = None
                  ) -> tuple[np.ndarray, float]:
    """Piece sizes (their count ``Q`` within the op budget and the caps) of least
    lock-step time: ``Q`` doubles until the estimate stops gaining; when the budget
    stops the doubling first, the most pieces that fit are tried too.

    Every piece adds a step of fill and its ops to post, so under a cost profile the
    best ``Q`` falls as messages get smaller or dearer. A deeper pipeline must gain at
    least :data:`MIN_GAIN` of the time: without software costs (the ``ideal`` profile)
    a single-level ring gains only rounding from pieces, which made 8-GPU plans of
    128 pieces and 186 k messages. ``max_step_ops`` caps the ops a
    rank posts in one step, ``max_chunks`` the chunks (``chunks_per_piece * Q``).
    ``shares``: price the plan on channels (:func:`.pricing.estimate`).
    """
    def fits(q: int) -> bool:
        return (q <= max_q and q * ops_per_piece <= max_ops
                and (max_chunks is None or q * chunks_per_piece <= max_chunks)
                and (max_step_ops is None or soft.peak_ops(q) <= max_step_ops))

    best = piece_sizes(loads, step_lat, 1, size, soft, shares)
    q = 2
    while fits(q):
        cand = piece_sizes(loads, step_lat, q, size, soft, shares)
        if cand[1] < best[1] * (1 - MIN_GAIN):
            best = cand
        elif cand[1] > best[1] * 1.01:
            return best
        q *= 2
    # Doubling ran out of budget while it still gained: the most pieces that fit.
    most = min(max_q, max_ops // max(ops_per_piece, 1))
    if max_chunks is not None:
        most = min(most, max_chunks // max(chunks_per_piece, 1))
    while most > q // 2 and not fits(most):
        most -= 1
    if most > q // 2 and len(best[0]) == q // 2:
        cand = piece_sizes(loads, step_lat, most, size, soft, shares)
        if cand[1] < best[1] * (1 - MIN_GAIN):
            best = cand
    return best
