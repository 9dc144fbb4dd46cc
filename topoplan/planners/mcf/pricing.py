"""The lock-step cost model that prices the ``mcf`` constructions.

A step of a piece lasts as long as its busiest link, plus its worst path latency (and,
under a cost profile, alpha), plus what the runtime pays per step and per op
(:class:`SoftCosts`); piece ``p`` of a pipeline runs ``p`` steps after piece ``p - 1``
(:func:`estimate`). On several channels (IR v4) over unequal slices of the buffer, each
channel runs that pipeline on its slice and the channels share the links
(:func:`channel_time`). :class:`CostModel` holds the links of each rank pair (split over
equal-cost routes), :func:`piece_profile` the links' load in each step of one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ...cluster import Cluster
from ...analysis.cost import CostProfile
from ...errors import InfeasiblePlanError
from .layout import PieceMessages

__all__ = ["CostModel", "SoftCosts", "NO_COSTS", "piece_profile", "estimate", "channel_time"]


class CostModel:
    """Per-pair link incidence (ECMP split) for a lock-step estimate of a schedule."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        graph = cluster.graph
        self.edges = list(graph.edges)
        self.index = {e: i for i, e in enumerate(self.edges)}
        self.cap = np.array([graph.edges[e]["bandwidth"] for e in self.edges])
        self.lat = np.array([graph.edges[e]["latency"] for e in self.edges])
        self.box_of_rank = np.asarray([cluster.box_index(r) for r in range(cluster.nranks)],
                                      dtype=np.int64)
        self._pairs: dict[int, tuple[list[int], list[float], float]] = {}

    def incidence(self, keys: np.ndarray) -> tuple[sp.csr_array, np.ndarray]:
        """(pairs x links) bytes per byte sent, and each pair's worst path latency."""
        n = self.cluster.nranks
        rows, cols, vals, lat = [], [], [], np.zeros(len(keys))
        for i, key in enumerate(keys.tolist()):
            if key not in self._pairs:
                src, dst = divmod(key, n)
                loads, worst = self.cluster.route_loads(src, dst)
                if not loads:
                    raise InfeasiblePlanError(
                        f"no route from rank {src} ({self.cluster.gpu_node(src)}) to rank {dst} "
                        f"({self.cluster.gpu_node(dst)}) in cluster {self.cluster.name!r}; "
                        "connect their boxes or switches")
                index = self.index
                self._pairs[key] = ([index[e] for e in loads], list(loads.values()), worst)
            c, v, w = self._pairs[key]
            rows += [i] * len(c)
            cols += c
            vals += v
            lat[i] = w
        return sp.csr_array((vals, (rows, cols)), shape=(len(keys), len(self.edges))), lat


@dataclass(frozen=True)
class SoftCosts:
    """What a runtime pays per step of one piece beyond its bytes (a cost profile applied
    to a layout): ``ops[s]``, the most ops any rank posts in step ``s``; the profile's
    ``step_overhead``, ``op_overhead`` and ``call_overhead`` (seconds)."""

    ops: np.ndarray
    step: float = 0.0
    op: float = 0.0
    call: float = 0.0

    def total(self, q: int) -> float:
        """Seconds of software cost of ``q`` pieces, piece ``p`` ``p`` steps late: every
        combined step pays the step overhead once and posts the ops of all its pieces
        (serially, at the busiest rank), and the call pays its overhead."""
        nsteps = len(self.ops) + q - 1 if len(self.ops) else 0
        return self.call + nsteps * self.step + q * float(self.ops.sum()) * self.op

    def peak_ops(self, q: int) -> int:
        """The most ops a rank posts in one combined step of ``q`` pieces."""
        if not len(self.ops):
            return 0
        return int(np.convolve(self.ops, np.ones(q, dtype=np.int64)).max())


NO_COSTS = SoftCosts(np.zeros(0, np.int64))


def piece_profile(model: CostModel, msgs: PieceMessages, fractions: np.ndarray,
                  profile: CostProfile | None = None, vectored: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, SoftCosts]:
    """Seconds each link is busy per byte of buffer in each step of one piece
    (``(nsteps, links)``, for a piece of the whole buffer), each step's latency, and the
    software costs of its steps under ``profile``.

    With a profile, a step's latency adds the worst alpha of its messages (box or
    network class) and every link column adds the seconds the busiest rank spends
    adding what the step's reducing recvs brought (the executor adds after the wait),
    per byte of buffer.

    ``vectored``: a step's messages from one rank to one peer (of one kind, reducing or
    not) are one op, as :func:`topoplan.ir.passes.vectorize` merges them.
    """
    n = model.cluster.nranks
    key = msgs.src * n + msgs.dst
    pairs, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    inc, lat = model.incidence(pairs)
    cum = np.concatenate([[0.0], np.cumsum(fractions)])
    w = cum[msgs.chunk + msgs.count] - cum[msgs.chunk]
    sp_steps = sp.csr_array((w, (msgs.step, inv)), shape=(msgs.nsteps, len(pairs)))
    loads = (sp_steps @ inc).toarray() / model.cap[None, :]
    # Ops per rank and step: a send at src, a recv at dst.
    per_rank = np.zeros((msgs.nsteps, n), dtype=np.int64)
    if vectored:  # one op per (step, rank, peer, reduce) on each side
        kinds = (msgs.step * n + msgs.src) * n + msgs.dst
        pair = np.unique(kinds * 2 + msgs.reduce.astype(np.int64))
        step, rest = np.divmod(pair // 2, n * n)
        src, dst = np.divmod(rest, n)
        np.add.at(per_rank, (step, src), 1)
        np.add.at(per_rank, (step, dst), 1)
    else:
        np.add.at(per_rank, (msgs.step, msgs.src), 1)
        np.add.at(per_rank, (msgs.step, msgs.dst), 1)
    ops = per_rank.max(axis=1) if n else np.zeros(msgs.nsteps, np.int64)
    step_lat = np.zeros(msgs.nsteps)
    if profile is None or profile.is_ideal:
        np.maximum.at(step_lat, msgs.step, lat[inv])
        return loads, step_lat, SoftCosts(ops)
    box = model.box_of_rank
    alpha = np.where(box[msgs.src] == box[msgs.dst], profile.alpha_box, profile.alpha_network)
    np.maximum.at(step_lat, msgs.step, lat[inv] + alpha)
    if profile.reduce_bandwidth is not None:
        red = np.zeros((msgs.nsteps, n))
        np.add.at(red, (msgs.step[msgs.reduce], msgs.dst[msgs.reduce]), w[msgs.reduce])
        loads = loads + (red.max(axis=1) / profile.reduce_bandwidth)[:, None]
    return loads, step_lat, SoftCosts(ops, profile.step_overhead, profile.op_overhead,
                                      profile.call_overhead)


def _window_max(step_lat: np.ndarray, q: int) -> np.ndarray:
    """Latency of each of the ``S + q - 1`` steps: the worst of the pieces in it."""
    s = len(step_lat)
    padded = np.concatenate([np.zeros(q - 1), step_lat, np.zeros(q - 1)])
    if q <= 256:
        return np.lib.stride_tricks.sliding_window_view(padded, q).max(axis=1)[: s + q - 1]
    return np.full(s + q - 1, step_lat.max())


def estimate(loads: np.ndarray, step_lat: np.ndarray, sizes: np.ndarray, size: float,
             soft: SoftCosts = NO_COSTS, shares: tuple[float, ...] | None = None) -> float:
    """Lock-step time of pieces of ``sizes`` (fractions, piece ``p`` ``p`` steps late).

    ``loads[s, e]``: seconds per byte of buffer that link ``e`` is busy in step ``s``
    of a piece carrying the whole buffer. A step lasts as long as its busiest link
    plus its worst path latency (and alpha), plus the software costs ``soft`` (step
    overhead, and posting the ops of every piece in it).

    ``shares``: the plan runs on ``len(shares)`` channels, channel ``c`` on a share
    ``shares[c]`` of every chunk (:func:`topoplan.ir.passes.slices`); each runs
    this lock-step pipeline on its own clock and they share the links
    (:func:`channel_time`). None or one share: one channel, the lock-step time.
    """
    q = len(sizes)
    s, m = loads.shape
    total = np.zeros((s + q - 1, m))
    for p, x in enumerate(sizes.tolist()):
        total[p:p + s] += x * loads
    window = _window_max(step_lat, q)
    if shares is not None and len(shares) > 1:
        nsteps = s + q - 1
        posted = np.convolve(soft.ops, np.ones(q)) if len(soft.ops) else np.zeros(nsteps)
        delay = window + soft.step + posted[:nsteps] * soft.op
        return soft.call + channel_time(total * size, delay, shares)
    return float((total.max(axis=1) * size).sum() + window.sum() + soft.total(q))


def channel_time(work: np.ndarray, delay: np.ndarray, shares: tuple[float, ...] | np.ndarray
                 ) -> float:
    """Seconds for ``len(shares)`` channels to run the same steps, each on its own clock,
    sharing the links: a fluid model of IR v4's independent channels.

    Step ``t`` of channel ``c`` waits ``delay[t]`` (latency, alpha, posting: no link is
    busy), then moves ``shares[c]`` of the step's bytes: ``work[t, e]`` is the seconds
    link ``e`` is busy in step ``t`` when one channel moves all of them. Alone, the
    transfer takes ``shares[c] * max_e work[t, e]`` and loads link ``e`` at
    ``u[t, e] = work[t, e] / max_e work[t, e]`` of its bandwidth. Running together,
    the channels in transfer get speeds ``r_c`` (a fraction of their solo speed) by
    max-min fairness under ``sum_c r_c u[t_c, e] <= 1`` on every link (progressive
    filling: equal speeds until a link is full, those on it freeze): two channels on
    the same kind of step share its links equally, as the event simulator's flows do.
    With one channel, or equal shares (the channels run in phase), this is the lock-step
    time ``sum_t delay[t] + max_e work[t, e]``.

    Only the distinct link columns matter (symmetric links have equal columns). The
    events are ``2 x channels x steps``, each a filling over at most ``channels``
    rounds. Checked against the event simulator on channelled plans (the tests and
    ``scripts/bench_channels.py``).
    """
    shares = np.asarray(shares, dtype=float)
    nsteps = work.shape[0]
    peak = work.max(axis=1) if work.size else np.zeros(nsteps)
    cols = work[:, work.max(axis=0) > 0] if work.size else np.zeros((nsteps, 0))
    if cols.shape[1]:
        _, keep = np.unique(np.round(cols / cols.max(), 9), axis=1, return_index=True)
        cols = cols[:, np.sort(keep)]
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(peak[:, None] > 0, cols / peak[:, None], 0.0)
    nch = len(shares)
    step = np.zeros(nch, dtype=np.int64)        # each channel's step
    moving = np.zeros(nch, dtype=bool)          # in its transfer (else in its delay)
    left = np.array([delay[0] if nsteps else 0.0] * nch)  # seconds of delay, or of
    #                                              solo transfer, left in the phase
    done = np.zeros(nch, dtype=bool) if nsteps else np.ones(nch, dtype=bool)
    now = 0.0
    while not done.all():
        rate = np.ones(nch)
        live = moving & ~done
        if live.sum() > 1:
            rate[live] = _fill(util[step[live]])
        active = ~done
        with np.errstate(divide="ignore"):
            dt = np.where(active, left / rate, np.inf)
        k = int(np.argmin(dt))
        dt_k = float(dt[k])
        now += dt_k
        left[active] -= dt_k * rate[active]
        for c in np.flatnonzero(active & (left <= 1e-12 * max(now, 1e-30))).tolist():
            if not moving[c]:
                moving[c] = True
                left[c] = shares[c] * peak[step[c]]
                if left[c] > 0:
                    continue
            moving[c] = False
            step[c] += 1
            if step[c] == nsteps:
                done[c] = True
            else:
                left[c] = delay[step[c]]
    return now


def _fill(util: np.ndarray) -> np.ndarray:
    """Max-min fair speeds (fractions of solo speed, at most 1) of transfers that load
    the links at ``util`` (transfers x links) alone: progressive filling."""
    k = len(util)
    rate = np.zeros(k)
    free = np.ones(k, dtype=bool)
    used = np.zeros(util.shape[1])
    while free.any():
        demand = util[free].sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            level = np.where(demand > 0, (1.0 - used) / demand, np.inf)
        e = int(np.argmin(level))
        lam = min(float(level[e]), 1.0)
        if lam >= 1.0:
            rate[free] = 1.0
            break
        hit = free & (util[:, e] > 0)
        rate[hit] = lam
        used += (util[hit] * lam).sum(axis=0)
        free &= ~hit
    return rate
