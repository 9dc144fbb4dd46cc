"""Rail exchanges with in-box fan-out: the ``mcf`` allgather and reduce-scatter of equal
boxes, with the rounds chosen by the lock-step cost model.

GPU ``j`` of every box is on rail ``j``. The boxes are laid out as (group, position):
one group per switch group (when they are equal), or one box a group. An allgather

- sends each GPU's shard straight to its rail peers at its position in the other
  groups, the ``k``-th next group in some round (a *round* is one step and covers a
  run of the ``a - 1`` group offsets, possibly a part of one: shards are cut into
  ``parts`` equal chunks);
- passes what a round brought on, one step later, to the rail peers of its own group;
- hands every piece of a shard a GPU got to all its box mates one step after it got it.

So each shard enters every group once and crosses each rail's NIC ``(B - 1) / B`` of
the buffer, the least possible, and the copies inside groups and boxes overlap the
next rounds. What is left to choose is the rounds: big rounds cut the steps (each
pays a path's latency and the runtime's step costs), small ones shorten the fill and
the drain, where the last in-group step and the last fan-out run alone.
:func:`best_rounds` chooses them by dynamic programming over the lock-step cost of
every step (the links' loads of its three kinds of messages, their latency, the
profile's per-step and per-op costs), typically growing, then shrinking to a quarter
shard at the end. A reduce-scatter runs the allgather backwards (its reducing recvs
may share a chunk in a step).
"""

from __future__ import annotations

import numpy as np

from ...cluster import Cluster
from ...analysis.cost import CostProfile
from .layout import RankGrid, PieceMessages, switch_groups
from .pricing import CostModel, SoftCosts, piece_profile

__all__ = ["rail_layouts", "rail_messages", "rail_message_count", "best_rounds"]

#: Shard cuts the dynamic program tries (1: whole shards only).
PARTS = (1, 4)
#: Round sizes it tries, in shards (and every fraction of one shard).
ROUND_SHARDS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)
#: Above this many ranks only the per-switch-group grid (when there are groups).
BIG = 256


def _layout(cluster: Cluster) -> list[tuple[np.ndarray, str]]:
    """(group, position, rail) rank grids of the equal boxes of ``cluster``: one box a
    group, and one switch group a group when there are several equal ones (above
    :data:`BIG` ranks only that one: pricing a grid costs a pass over its ~2 N messages
    per rank and a route per pair)."""
    boxes = cluster.boxes
    nb = len(boxes)
    if nb < 2 or any(box.signature() != boxes[0].signature() for box in boxes[1:]):
        return []
    g = boxes[0].gpus
    shapes = [[[b] for b in sorted(range(nb), key=lambda b: (
        tuple(n.switch for n in boxes[b].nics), b))]]
    groups = switch_groups(cluster)
    if len(groups) > 1 and len({len(grp) for grp in groups}) == 1 and len(groups[0]) > 1:
        shapes.append(groups)
    out = []
    for shape in shapes:
        first = np.array([[boxes[b].first_rank for b in grp] for grp in shape], dtype=np.int64)
        grid = first[:, :, None] + np.arange(g, dtype=np.int64)[None, None, :]
        a, size = first.shape
        where = f"groups[{a}]x[{size}]" if size > 1 else f"boxes[{a}]"
        out.append((grid, f"rails[{g}] x {where}"))
    if cluster.nranks > BIG and len(out) > 1:
        return out[1:]
    return out


def _rounds_text(rounds: tuple[int, ...], parts: int) -> str:
    def one(u: int) -> str:
        return f"{u // parts}" if u % parts == 0 else f"{u / parts:g}"
    if len(set(rounds[:-1])) <= 1 and parts == 1:
        return f"{rounds[0]} a round"
    return "rounds " + ",".join(one(u) for u in rounds)


def rail_layouts(cluster: Cluster, model: CostModel | None = None,
                 profile: CostProfile | None = None, size: float = 256 << 20,
                 vectored: bool = False) -> list[RankGrid]:
    """The rail layouts of ``cluster`` (empty for one box, or boxes that differ): for
    each grid, rounds of ``m`` groups for ``m`` in 1, 4, 16, all, and with a cost
    ``model`` the rounds :func:`best_rounds` picks for a ``size``-byte buffer (its
    messages to one peer in a step one op each when ``vectored``)."""
    out = []
    for grid, where in _layout(cluster):
        a, size_, g = grid.shape
        options = []
        for m in sorted({min(m, a - 1) for m in (1, 4, 16, a - 1)}):
            rounds = tuple([m] * ((a - 1) // m) + ([(a - 1) % m] if (a - 1) % m else []))
            options.append((rounds, 1))
        if model is not None:
            best = best_rounds(model, grid, size, profile, vectored)
            if best not in options:
                options.append(best)
        for rounds, parts in options:
            out.append(RankGrid(f"{where} ({_rounds_text(rounds, parts)}) + fan-out", grid.shape,
                              (grid,), np.ones(1), rails=True, rounds=rounds, parts=parts))
    return out


def _runs(start: int, units: int, parts: int) -> list[tuple[int, int, int]]:
    """The (group offset k, first part, parts) runs of units ``[start, start + units)``;
    unit ``u`` is part ``u % parts`` of the shard for offset ``1 + u // parts``."""
    out = []
    u, end = start, start + units
    while u < end:
        k, lo = divmod(u, parts)
        n = min(parts - lo, end - u)
        out.append((k + 1, lo, n))
        u += n
    return out


def _plan(layout: RankGrid) -> tuple[list[list[tuple[int, int, int]]], int]:
    """Each round's runs, and the total number of runs."""
    bounds = np.concatenate([[0], np.cumsum(layout.rounds)]).astype(int).tolist()
    runs = [_runs(b, e - b, layout.parts) for b, e in zip(bounds, bounds[1:])]
    return runs, sum(len(r) for r in runs)


def rail_message_count(layout: RankGrid) -> int:
    """``len(rail_messages(layout, ...).step)`` without building them: per rank one
    message per run crossing groups, ``size - 1`` per run held before the in-group step
    (its own shard and each cross run), ``g - 1`` per run held at all."""
    a, size, g = layout.dims
    _, nruns = _plan(layout)
    held = 1 + nruns + (size - 1) * (1 + nruns)
    return a * size * g * (nruns + (size - 1) * (1 + nruns) + (g - 1) * held)


def rail_messages(layout: RankGrid, collective: str) -> PieceMessages:
    """One piece of a rail allgather (or, reversed, its reduce-scatter).

    Chunk ``((x * s + p) * g + j) * parts + i`` is part ``i`` of the shard of GPU ``j``
    of the box at position ``p`` of group ``x`` (``s`` boxes a group); a message
    carries a run of one shard's parts.
    """
    a, size, g = layout.dims
    parts = layout.parts
    grid = layout.grids[0]
    x, p, j = (v.ravel() for v in np.indices((a, size, g)))
    n = a * size * g
    src_rank = grid[x, p, j]
    pos = (x * size + p) * g + j  # a rank's flat position = its own shard
    steps, srcs, dsts, chunks, counts = [], [], [], [], []

    def send(step: int, dst: np.ndarray, chunk: np.ndarray, count: int) -> None:
        steps.append(np.full(n, step))
        srcs.append(src_rank)
        dsts.append(dst)
        chunks.append(chunk)
        counts.append(np.full(n, count))

    runs, _ = _plan(layout)
    # (arrival step, first chunk, parts) of every run a rank holds before the in-group
    # step: its own shard at -1, then what each round brought.
    held = [(-1, pos * parts, parts)]
    for t, round_runs in enumerate(runs):
        for k, lo, cnt in round_runs:
            send(t, grid[(x + k) % a, p, j], pos * parts + lo, cnt)
            held.append((t, ((((x - k) % a) * size + p) * g + j) * parts + lo, cnt))
    fan = list(held)
    for t, c, cnt in held:  # on to the group, one step after arriving
        for l in range(1, size):
            send(t + 1, grid[x, (p + l) % size, j], c, cnt)
            # what rank (x, p, j) gets: the run its group peer at p - l held
            fan.append((t + 1, c[((x * size + (p - l) % size) * g + j)], cnt))
    for t, c, cnt in fan:  # to every box mate, one step after arriving
        for o in range(1, g):
            send(t + 1, grid[x, p, (j + o) % g], c, cnt)
    step, src, dst, chk, cnt_ = (np.concatenate(v).astype(np.int64)
                                 for v in (steps, srcs, dsts, chunks, counts))
    nsteps = int(step.max()) + 1
    if collective == "reduce_scatter":
        return PieceMessages(nsteps - 1 - step, dst, src, chk, cnt_, np.ones(len(step), bool),
                        nsteps, n * parts)
    return PieceMessages(step, src, dst, chk, cnt_, np.zeros(len(step), bool), nsteps, n * parts)


# --------------------------------------------------------------------------------------
# Choosing the rounds
# --------------------------------------------------------------------------------------

def _unit_costs(model: CostModel, grid: np.ndarray, profile: CostProfile | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float,
                           SoftCosts]:
    """Per kind of message, the links' seconds per byte of buffer when every rank sends
    one such message of the whole buffer: crossing ``k`` groups (``(a - 1, links)``),
    one to every in-group peer, one to every box mate; their latencies; the soft costs."""
    a, size, g = grid.shape
    x, p, j = (v.ravel() for v in np.indices((a, size, g)))
    n = a * size * g

    def kind(dsts: list[np.ndarray]) -> tuple[np.ndarray, float, SoftCosts]:
        dst = np.concatenate(dsts)
        m = len(dst)
        msgs = PieceMessages(np.zeros(m, np.int64), np.tile(grid[x, p, j], len(dsts)), dst,
                        np.zeros(m, np.int64), np.ones(m, np.int64), np.zeros(m, bool), 1, 1)
        loads, lat, soft = piece_profile(model, msgs, np.ones(1), profile)
        return loads[0], float(lat[0]), soft

    zero = np.zeros(len(model.edges))
    cross = [kind([grid[(x + k) % a, p, j]]) for k in range(1, a)]
    group = kind([grid[x, (p + l) % size, j] for l in range(1, size)]) if size > 1 else \
        (zero, 0.0, None)
    box = kind([grid[x, p, (j + o) % g] for o in range(1, g)]) if g > 1 else (zero, 0.0, None)
    return (np.array([c[0] for c in cross]), np.array([c[1] for c in cross]), group[0],
            box[0], group[1], box[1], cross[0][2])


def best_rounds(model: CostModel, grid: np.ndarray, size: float,
                profile: CostProfile | None = None, vectored: bool = False
                ) -> tuple[tuple[int, ...], int]:
    """The rounds (in units of ``1 / parts`` shard) and ``parts`` of least lock-step
    time for a ``size``-byte allgather on the rail ``grid`` (group, position, rail).

    A step's time is its busiest link (the cross-group runs of its round, the previous
    round's in-group copies, the fan-out of what arrived the step before: their link
    loads, priced once per kind from the cost model), plus its worst latency, plus the
    profile's step overhead and op overhead times the ops a rank posts in it. A dynamic
    program over (units sent, the last two rounds) finds the best sequence, all the
    states of one ``units sent`` at once; the finer ``parts`` wins only if its time is
    lower. ``vectored``: the runs a step sends to one peer are one op (the in-group
    copies and the fan-out post one op per peer, :func:`topoplan.ir.passes.vectorize`).
    """
    a, s, g = grid.shape
    n = a * s * g
    cross, cross_lat, group, box, group_lat, box_lat, soft = _unit_costs(model, grid, profile)
    cols = np.vstack([cross, group[None, :], box[None, :]])
    cols = cols[:, cols.max(axis=0) > 0]
    if cols.shape[1]:  # equal link columns (symmetric links) once
        _, keep = np.unique(np.round(cols / cols.max(), 9), axis=1, return_index=True)
        cols = cols[:, np.sort(keep)]
    else:
        cols = np.zeros((len(cols), 1))
    cross, group, box = cols[:-2], cols[-2], cols[-1]
    step_cost = soft.step if soft is not None else 0.0
    op_cost = soft.op if soft is not None else 0.0
    best: tuple[float, tuple[int, ...], int] | None = None
    for parts in PARTS:
        unit = size / (n * parts)
        total = parts * (a - 1)
        cum = np.vstack([np.zeros((1, cols.shape[1])),
                         np.cumsum(np.repeat(cross, parts, axis=0) * unit, axis=0)])
        unit_lat = np.repeat(cross_lat, parts)
        choices = np.array(sorted({c for c in range(1, parts)} |
                                  {parts * c for c in ROUND_SHARDS if c <= a - 1}))
        values = np.concatenate([[0], choices])  # a previous round's units (0: none)
        where = {int(v): i for i, v in enumerate(values)}
        m_idx = np.array([where[int(m)] for m in choices])
        gl = (group + box) * unit  # a previous round: in-group copies and its fan-out
        bl = (s - 1) * box * unit  # the round before: the fan-out of its in-group copies
        prev1 = values[:, None] * gl[None, :]  # (values, links)
        prev2 = values[:, None] * bl[None, :]
        on1 = (values > 0)[:, None, None]
        on2 = (values > 0)[None, :, None]

        def nruns(start: np.ndarray, units: np.ndarray) -> np.ndarray:
            start, units = np.broadcast_arrays(start, units)
            r = (start + units - 1) // parts - start // parts + 1
            return np.where(units == 0, 0, np.where(start < 0, 1, r))

        def costs(done: int, ms: np.ndarray, xload: np.ndarray, xlat: np.ndarray
                  ) -> np.ndarray:
            """Seconds of the step sending rounds of ``ms`` units from ``done`` on,
            for every (m1, m2): shape (values, values, len(ms))."""
            load = (xload[None, None, :, :] + prev1[:, None, None, :]
                    + prev2[None, :, None, :]).max(axis=3)
            lat = np.maximum(xlat[None, None, :],
                             np.maximum(np.where(on1, group_lat if s > 1 else 0.0, 0.0),
                                        np.where(on1 | on2, box_lat if g > 1 else 0.0, 0.0)))
            v1 = values[:, None, None]
            v2 = values[None, :, None]
            r0 = nruns(np.full(len(ms), done), ms)[None, None, :]
            r1 = nruns(done - v1, v1)
            r2 = nruns(done - v1 - v2, v2)
            if vectored:
                ops = 2 * (r0 + (s - 1) * (r1 > 0) + (g - 1) * ((r1 + (s - 1) * r2) > 0))
            else:
                ops = 2 * (r0 + (s - 1) * r1 + (g - 1) * (r1 + (s - 1) * r2))
            return load + lat + step_cost + op_cost * ops

        nv = len(values)
        rest = np.full((total + 1, nv, nv), np.inf)
        pick = np.zeros((total + 1, nv, nv), dtype=np.int64)
        # the last in-group step, then the last fan-out
        end = costs(total, np.zeros(1, np.int64), np.zeros((1, cols.shape[1])), np.zeros(1))
        last = costs(total, np.zeros(1, np.int64), np.zeros((1, cols.shape[1])), np.zeros(1))
        rest[total] = end[:, :, 0] + last[0, :, 0][:, None]  # its m2 is this m1
        for done in range(total - 1, -1, -1):
            ok = choices <= total - done
            ms = choices[ok]
            xload = cum[done + ms] - cum[done]
            xlat = np.array([unit_lat[done:done + m].max() for m in ms.tolist()])
            here = costs(done, ms, xload, xlat)
            # then rest[done + m, m, m1]: (len(ms), values) -> (values, 1, len(ms))
            after = rest[done + ms, m_idx[ok], :].T[:, None, :]
            tot = here + after
            j = tot.argmin(axis=2)
            rest[done] = np.take_along_axis(tot, j[:, :, None], axis=2)[:, :, 0]
            pick[done] = np.flatnonzero(ok)[j]
        seq: list[int] = []
        done, i1, i2 = 0, where[parts], 0
        t = float(rest[0, i1, i2])
        while done < total:
            m = int(choices[pick[done, i1, i2]])
            seq.append(m)
            done, i1, i2 = done + m, where[m], i1
        if best is None or t < best[0] * (1 - 1e-3):
            best = (t, tuple(seq), parts)
    assert best is not None
    _, rounds, parts = best
    if parts > 1 and all(u % parts == 0 for u in rounds):
        return tuple(u // parts for u in rounds), 1
    return rounds, parts
