"""Pipelined multi-level reduce-scatter/allgather for the ``mcf`` planner: the grids.

The construction (BlueConnect's per-level decomposition, SysML'19, with the rings of
every level chosen by an LP and the pipeline depth by a lock-step cost model):

- the ranks are laid out on a grid ``dims = (b_0, ..., b_{L-1})``: in-box levels
  first (the box, or its NVLink islands then the islands), then the boxes under one
  switch, then the switch groups. A rank's coordinate on a level is its position on
  that level's ring;
- reduce-scatter runs level by level, a ring reduce-scatter among the ranks that
  differ in one coordinate only, each on the chunks its earlier levels left it;
  allgather undoes the levels in reverse. Every rank ends with ``N`` final chunks,
  each reduced exactly once along a tree (one root per chunk, as in ForestColl);
- the buffer is split over several *rings* of the first level (Hamiltonian cycles
  of an NVLink mesh, weighted by an LP so that every link carries its share), and
  over ``Q`` pipeline *pieces*; piece ``p`` runs one step after piece ``p - 1``, so
  in-box steps of one piece overlap network steps of the others and every step
  loads the narrow links with the same bytes.

A level behind a switch (the network, or an NVSwitch fabric) may also be cut into
smaller levels: prime ones (recursive halving: ``log2 b`` steps of one message), or
*direct* ones of up to 16 or 4 members (all-to-all in one step, ``b - 1`` messages).
A fourth variant keeps the box whole (one direct step over its fabric) and cuts the
boxes into levels of 4, a short last factor merged into the one before (128 boxes: 4 x 4
x 8). The box's step is what the pipeline's first and last pieces pay alone (its fill),
and the fewer messages a piece, the more pieces fit the op budget: at 8192 GPUs of a
rail fabric under ``ideal``, 10 pieces of 12 steps, 1.045x the bound estimated, against
1.063x with the box cut in two levels too (12 pieces of 16 steps).

On a level with ``b`` ranks on a non-blocking switch a ring reduce-scatter moves
``(b-1)/b`` of its data through each NIC, the least possible, so the total
through a box's NICs is ``2 (B-1)/B`` of the buffer: the cut bound of the boxes.

This module lays the ranks out (:func:`layouts`); :mod:`.rings` chooses the in-box
rings, :mod:`.messages` writes a piece's messages, :mod:`.pricing` and :mod:`.pieces`
price them and size the pipeline, and :mod:`.build` makes the schedule.
"""

from __future__ import annotations

from typing import Sequence

import networkx as nx
import numpy as np

from ...cluster import Cluster
from .layout import RankGrid, switch_groups
from .rings import box_ring_sets

__all__ = ["layouts", "flat_ring_layout"]


def layouts(cluster: Cluster) -> list[RankGrid]:
    """The grids worth trying on ``cluster`` (empty when its boxes differ).

    In-box: the LP rings over the whole box, or (a box with a fabric whose NVLinks
    form equal islands, e.g. the K80 boards of a p2.8xlarge) islands then the
    fabric. Across boxes: one level per switch group then the groups (when the
    groups are equal), or one level of all boxes.
    """
    boxes = cluster.boxes
    sig = boxes[0].signature()
    if any(box.signature() != sig for box in boxes[1:]):
        return []
    box = boxes[0]
    g, nb = box.gpus, len(boxes)
    first = np.array([b.first_rank for b in boxes], dtype=np.int64)

    # Cross-box level options: lists of box-index grids (shape = cross dims).
    cross: list[tuple[str, tuple[int, ...], np.ndarray]] = []
    if nb > 1:
        groups = switch_groups(cluster)
        sizes = {len(grp) for grp in groups}
        if len(groups) > 1 and len(sizes) == 1 and sizes != {1}:
            grid = np.array(groups, dtype=np.int64).T  # (boxes per group, groups)
            cross.append((f"switch[{grid.shape[0]}]>groups[{grid.shape[1]}]", grid.shape, grid))
        cross.append((f"boxes[{nb}]", (nb,), np.arange(nb, dtype=np.int64)))
    else:
        cross.append(("", (), np.zeros((), dtype=np.int64)))

    # In-box options: (name, dims, list of local-index grids, weights).
    inbox: list[tuple[str, tuple[int, ...], list[np.ndarray], np.ndarray]] = []
    if g == 1:
        inbox.append(("", (), [np.zeros((), dtype=np.int64)], np.ones(1)))
    else:
        # One option per ring count up to the fewest rings at the LP optimum: more
        # rings load more links but post more ops (the cost profile decides).
        for rings, w, _ in box_ring_sets(cluster, box):
            inbox.append((f"box[{g}]x{len(rings)}", (g,),
                          [np.array(r, dtype=np.int64) for r in rings], w))
        if box.fabric is not None and box.gpu_links:
            islands = nx.Graph()
            islands.add_nodes_from(range(g))
            islands.add_edges_from((l.a, l.b) for l in box.gpu_links)
            comps = [sorted(c) for c in nx.connected_components(islands)]
            comps.sort()
            k = len(comps[0])
            if 1 < k < g and all(len(c) == k for c in comps):
                grid = np.array(comps, dtype=np.int64).T  # (island size, islands)
                inbox.append((f"island[{k}]>fabric[{len(comps)}]", grid.shape, [grid], np.ones(1)))

    out = []
    for iname, idims, igrids, w in inbox:
        # Levels that go through a switch (fabric or network) may be factored into
        # prime levels: recursive halving (log2 b steps instead of b - 1, the same
        # bytes on a non-blocking switch); NVLink rings may not.
        switched = [len(igrids) == 1 and (box.fabric is not None and not box.gpu_links
                                          or iname.startswith("island"))] * len(idims)
        if iname.startswith("island"):
            switched = [False, True]
        for cname, cdims, cgrid in cross:
            dims = tuple(d for d in idims + cdims)
            grids = []
            for lg in igrids:
                # rank = first[box] + local: outer sum over the two grids.
                r = first[cgrid].reshape((1,) * len(idims) + cgrid.shape) + \
                    lg.reshape(lg.shape + (1,) * len(cdims))
                grids.append(r)
            flags = switched + [True] * len(cdims)
            keep = tuple(i for i, d in enumerate(dims) if d > 1)
            flags = [flags[i] for i in keep]
            in_box = [i < len(idims) for i in keep]
            dims = tuple(dims[i] for i in keep)
            grids = [gr.reshape(dims) for gr in grids]
            name = " > ".join(s for s in (iname, cname) if s) or "single"
            weights = np.asarray(w, dtype=np.float64)
            out.append(RankGrid(name, dims, tuple(grids), weights))
            fdims, fgrids, fflags = _factored(dims, grids, flags)
            if fdims != dims:
                out.append(RankGrid(name + " (halving)", fdims, tuple(fgrids), weights))
            if any(d > 2 for d, f in zip(dims, flags) if f):
                # Direct levels: one step (latency) per level instead of b - 1 or log2 b,
                # at most 16 members a level (b - 1 messages in flight per rank).
                # Radix 4 across the boxes with the box whole (one step, g - 1 messages):
                # the box's step is the pipeline's fill, and fewer messages a piece
                # leave the op budget room for more pieces (8192 GPUs under ``ideal``:
                # 11 pieces, 1.040x estimated, against 1.063x with the box cut too).
                seen = {(fdims, tuple(fflags))}
                mixed = [16 if b else 4 for b in in_box]
                for label, radix, merge in (("direct", 16, False), ("direct radix 4", 4, False),
                                            ("direct, radix 4 across boxes", mixed, True)):
                    rdims, rgrids, rflags = _factored(dims, grids, flags, radix, merge)
                    if (rdims, tuple(rflags)) not in seen:
                        seen.add((rdims, tuple(rflags)))
                        out.append(RankGrid(f"{name} ({label})", rdims, tuple(rgrids),
                                            weights, tuple(rflags)))
    return out


def _prime_factors(b: int) -> list[int]:
    out, p = [], 2
    while p * p <= b:
        while b % p == 0:
            out.append(p)
            b //= p
        p += 1
    if b > 1:
        out.append(b)
    return out


def _radix_factors(b: int, radix: int, merge_tail: bool = False) -> list[int]:
    """``b`` as a product of factors, each a product of primes up to ``radix`` when it
    can be (16 -> [4, 4], 8 -> [4, 2], 12 -> [4, 3], 7 -> [7]). ``merge_tail``: a last
    factor that fits twice the radix with the one before it joins it (128 at radix 4:
    [4, 4, 8], one level fewer than [4, 4, 4, 2])."""
    out: list[int] = []
    for p in _prime_factors(b):
        if out and out[-1] * p <= radix:
            out[-1] *= p
        else:
            out.append(p)
    if merge_tail and len(out) > 1 and out[-1] < radix and out[-2] * out[-1] <= 2 * radix:
        out[-2:] = [out[-2] * out[-1]]
    return out


def _factored(dims: tuple[int, ...], grids: list[np.ndarray], flags: list[bool],
              radix: int | Sequence[int] | None = None, merge_tail: bool = False
              ) -> tuple[tuple[int, ...], list[np.ndarray], list[bool]]:
    """Split every switched level into its prime factors (or factors up to ``radix``,
    one for all levels or one per level, :func:`_radix_factors`), nearest members
    first; the new levels' switched flags."""
    radices = [radix] * len(dims) if radix is None or isinstance(radix, int) else list(radix)
    new_dims: list[int] = []
    new_flags: list[bool] = []
    axes_shape: list[int] = []
    perm: list[int] = []
    for d, b in enumerate(dims):
        r = radices[d]
        f = ([b] if not flags[d] else
             _prime_factors(b) if r is None else _radix_factors(b, r, merge_tail))
        start = len(axes_shape)
        axes_shape += f
        # C order: the last factor has stride 1 (nearest members); run it first.
        perm += list(range(start + len(f) - 1, start - 1, -1))
        new_dims += f[::-1]
        new_flags += [flags[d]] * len(f)
    out = [g.reshape(axes_shape).transpose(perm) for g in grids]
    return tuple(new_dims), [np.ascontiguousarray(g) for g in out], new_flags


def flat_ring_layout(order: list[int], name: str = "ring") -> RankGrid:
    """One level: a ring over all ranks in ``order``."""
    return RankGrid(name, (len(order),), (np.asarray(order, dtype=np.int64),), np.ones(1))
