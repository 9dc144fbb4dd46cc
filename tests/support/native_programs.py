"""Schedules with native steps (IR v3), built by hand: composed collectives on boxes, and
random programs of native collectives and messages in one global order
(``tests/test_schedule_native.py`` has the smallest, ``two_boxes``)."""

from __future__ import annotations

from hypothesis import strategies as st

from topoplan.ir.schedule import Native, Op, Schedule, build_schedule, native_op, recv, send

__all__ = ["rails", "rooted", "composed_reduce_scatter", "composed_allgather",
           "global_order", "events"]


def rails(nboxes: int, per_box: int, *, part: int = 1, cross: str = "native") -> Schedule:
    """An allreduce on ``nboxes`` equal boxes of ``per_box`` ranks (rank ``b * per_box +
    i`` is GPU ``i`` of box ``b``): a native reduce-scatter in each box (``part`` chunks per
    member), then across the boxes each rail (GPU ``i`` of every box) sums part ``i``,
    by a native allreduce (``cross="native"``) or by a direct exchange of messages
    (``"direct"``: every rail member sends its part to every other and adds theirs, in
    one step), then a native allgather in each box."""
    n, width = nboxes * per_box, per_box * part
    boxes = [list(range(b * per_box, (b + 1) * per_box)) for b in range(nboxes)]
    steps: list[list[list[Op | Native]]] = []
    for r in range(n):
        b, i = divmod(r, per_box)
        rail = [q * per_box + i for q in range(nboxes)]
        program: list[list[Op | Native]] = [[native_op("reduce_scatter", boxes[b], 0, width)]]
        if nboxes > 1:
            if cross == "native":
                program.append([native_op("allreduce", rail, i * part, part)])
            else:
                others = [q for q in rail if q != r]
                program.append([send(q, i * part, part) for q in others]
                               + [recv(q, i * part, True, part) for q in others])
        program.append([native_op("allgather", boxes[b], 0, width)])
        steps.append(program)
    return build_schedule(n, [1 / width] * width, steps, algorithm="composed")


def rooted(boxes: list[list[int]], nchunks: int = 4, *, cross: str = "native") -> Schedule:
    """An allreduce on boxes of any sizes: a native reduce to each box's first rank, the
    box roots sum across (a native allreduce, or with two boxes ``cross="direct"``, one
    exchange of messages), then a native broadcast from each root."""
    n = sum(map(len, boxes))
    roots = [box[0] for box in boxes]
    steps: list[list[list[Op | Native]]] = [[] for _ in range(n)]
    for box in boxes:
        for r in box:
            steps[r].append([native_op("reduce", box, 0, nchunks, root=box[0])])
            if r == box[0] and len(boxes) > 1:
                if cross == "native":
                    steps[r].append([native_op("allreduce", roots, 0, nchunks)])
                else:
                    (peer,) = [q for q in roots if q != r]
                    steps[r].append([send(peer, 0, nchunks), recv(peer, 0, True, nchunks)])
            steps[r].append([native_op("broadcast", box, 0, nchunks, root=box[0])])
    return build_schedule(n, [1 / nchunks] * nchunks, steps, algorithm="composed")


def composed_reduce_scatter(nboxes: int, per_box: int) -> Schedule:
    """A reduce-scatter (one chunk per rank): each rail reduce-scatters the whole buffer
    into per-box parts (member ``q`` of the rail, in box ``q``, gets box ``q``'s shards
    summed over the rail), then each box reduce-scatters its own shards."""
    n = nboxes * per_box
    steps = []
    for r in range(n):
        b, i = divmod(r, per_box)
        rail = [q * per_box + i for q in range(nboxes)]
        box = list(range(b * per_box, (b + 1) * per_box))
        steps.append([[native_op("reduce_scatter", rail, 0, n)],
                      [native_op("reduce_scatter", box, b * per_box, per_box)]])
    return build_schedule(n, [1 / n] * n, steps, collective="reduce_scatter",
                          algorithm="composed")


def composed_allgather(nboxes: int, per_box: int) -> Schedule:
    """An allgather (one chunk per rank): each box gathers its shards, then each rail
    gathers the boxes' parts."""
    n = nboxes * per_box
    steps = []
    for r in range(n):
        b, i = divmod(r, per_box)
        rail = [q * per_box + i for q in range(nboxes)]
        box = list(range(b * per_box, (b + 1) * per_box))
        steps.append([[native_op("allgather", box, b * per_box, per_box)],
                      [native_op("allgather", rail, 0, n)]])
    return build_schedule(n, [1 / n] * n, steps, collective="allgather", algorithm="composed")


def global_order(nranks: int, nchunks: int, items: list, collective: str = "allreduce"
                 ) -> Schedule:
    """Programs that run ``items`` in one global order: a native op (a :class:`Native`)
    takes a step at each member; a message ``(src, dst, chunk, count, reduce)`` a step at
    each end. A schedule in one global order cannot deadlock."""
    steps: list[list[list[Op | Native]]] = [[] for _ in range(nranks)]
    for item in items:
        if isinstance(item, Native):
            for m in item.group:
                steps[m].append([item])
        else:
            src, dst, chunk, count, reduce = item
            steps[src].append([send(dst, chunk, count)])
            steps[dst].append([recv(src, chunk, reduce, count)])
    return build_schedule(nranks, [1 / nchunks] * nchunks, steps, collective=collective,
                          algorithm="random")


@st.composite
def events(draw, nranks: int, nchunks: int, min_group: int = 2) -> object:
    """A native op over a random group (in random order) of at least ``min_group`` ranks
    on a random range, or a message between two ranks."""
    if draw(st.integers(0, 3)) == 0:
        src, dst = draw(st.permutations(range(nranks)))[:2]
        chunk = draw(st.integers(0, nchunks - 1))
        count = draw(st.integers(1, nchunks - chunk))
        return (src, dst, chunk, count, draw(st.booleans()))
    size = draw(st.integers(min(min_group, nranks), nranks))
    group = draw(st.permutations(range(nranks)))[:size]
    kinds = ["allreduce", "broadcast", "reduce"]
    if size <= nchunks:
        kinds += ["reduce_scatter", "allgather"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("reduce_scatter", "allgather"):
        count = size * draw(st.integers(1, nchunks // size))
    else:
        count = draw(st.integers(1, nchunks))
    chunk = draw(st.integers(0, nchunks - count))
    root = draw(st.sampled_from(group)) if kind in ("broadcast", "reduce") else None
    return native_op(kind, group, chunk, count, root)
