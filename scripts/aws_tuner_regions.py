"""What AWS's tuner plugin picks for an allreduce on p5/p5e: the measured p5 runs' NCCL_ALGO.

aws-ofi-nccl ships a tuner plugin that overrides NCCL's own choice on AWS instances: for a
collective of ``nBytes`` on ``nRanks`` it walks a list of regions, polygons in the
(log2 bytes, log2 ranks) plane, and the first that holds the point (inside or on an edge)
names the algorithm and protocol (aws/aws-ofi-nccl ``src/tuner/nccl_ofi_regions.cpp``,
``region_init_internal_p5_p5e``, the ``nRanks == 8 * nNodes`` AllReduce regions;
``is_inside_region`` and ``extend_region`` in the same file; ``TUNER_MAX_SIZE`` 100 GiB and
``TUNER_MAX_RANKS`` 1024 x 1024 in ``include/tuner/nccl_ofi_tuner_region.h``). The
vertices below are copied from that file; nothing here is fitted. The published p5 curve
(``scripts/bench_nccl_model.py``) was measured with this plugin loaded, so its rows price
the algorithm and protocol these regions name.

    python scripts/aws_tuner_regions.py        # the pick at the p5 curve's points
"""

from __future__ import annotations

import math

__all__ = ["p5_allreduce", "TUNER_MAX_SIZE", "TUNER_MAX_RANKS"]

TUNER_MAX_SIZE = 100.0 * 1024 * 1024 * 1024
TUNER_MAX_RANKS = 1024.0 * 1024
_EPS = 1e-10

Point = tuple[float, float]


def _log2(point: Point) -> Point:
    x, y = point
    return (math.log2(x) if x > 0 else 0.0, math.log2(y) if y > 0 else 0.0)


def _extend(a: Point, b: Point, z: Point) -> Point:
    """``extend_region``: the point of the line through ``a`` and ``b`` (in log2 space)
    farthest along it with ``z``'s x or y, back in linear space."""
    (ax, ay), (bx, by), (zx, zy) = _log2(a), _log2(b), _log2(z)
    if ax == bx:
        out = (ax, zy)
    elif ay == by:
        out = (zx, ay)
    else:
        m = (ay - by) / (ax - bx)
        c = by - m * bx
        projected = m * zx + c
        out = (zx, projected) if projected < zy else ((zy - c) / m, zy)
    return (2.0 ** out[0], 2.0 ** out[1])


_MAX = (TUNER_MAX_SIZE, TUNER_MAX_RANKS)
_TREE_LL128 = _extend((402653184, 2048), (402653184, 4096), _MAX)
_NVLSTREE_1 = _extend((8053063680, 160), (9663676416, 192), _MAX)
_NVLSTREE_2 = _extend((402653184, 2048), (402653184, 4096), _MAX)
_RING_SIMPLE = _extend((8053063680, 160), (9663676416, 192), _MAX)

#: (NCCL algorithm, protocol, vertices (bytes, ranks)), in the file's order.
P5_ALLREDUCE_8PPN: tuple[tuple[str, str, tuple[Point, ...]], ...] = (
    ("Tree", "LL128", ((0, 16), (31457280, 16), (37748736, 32), (117440512, 64),
                       (301989888, 128), (301989888, 256), (335544320, 512), (536870912, 1024),
                       (402653184, 2048), (402653184, 4096), _TREE_LL128, (0, _TREE_LL128[1]))),
    ("NVLSTree", "Simple", ((31457281, 16), (TUNER_MAX_SIZE, 16), (31457281, 16))),
    ("Ring", "LL128", ((31457280, 17), (1073741824, 17), (2147483648, 64), (2147483648, 128),
                       (1342177280, 160), (2147483648, 256), (1074790400, 256), (444596224, 160),
                       (301989888, 128), (117440512, 64), (37748736, 32))),
    ("NVLSTree", "Simple", ((2147483648, 128), (6442450944, 128), (8053063680, 160),
                            (9663676416, 192), _NVLSTREE_1, _NVLSTREE_2, (402653184, 4096),
                            (402653184, 2048), (536870912, 1024), (335544320, 512),
                            (301989888, 256), (310378496, 160), (444596224, 160),
                            (1074790400, 256), (2684354560, 256), (2147483648, 224),
                            (1342177280, 160))),
    ("Ring", "Simple", ((1073741824, 17), (_RING_SIMPLE[0], 17), _RING_SIMPLE,
                        (9663676416, 192), (8053063680, 160), (2684354560, 64),
                        (1610612736, 32))),
)


def _edge_distance(p: Point, a: Point, b: Point) -> float:
    (px, py), (ax, ay), (bx, by) = p, a, b
    dx, dy = bx - ax, by - ay
    if dx == 0 and dy == 0:
        return math.hypot(px - ax, py - ay)
    t = ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)
    if t < 0 or t > 1:
        return math.inf
    return math.hypot(px - (ax + t * dx), py - (ay + t * dy))


def inside(point: Point, vertices: tuple[Point, ...]) -> int:
    """``is_inside_region``: 1 inside, 0 on an edge, -1 outside (log2 space)."""
    p = _log2(point)
    vs = [_log2(v) for v in vertices]
    for i, v in enumerate(vs):
        if _edge_distance(p, v, vs[(i + 1) % len(vs)]) < _EPS:
            return 0
    crossing = False
    for i, (x1, y1) in enumerate(vs):
        x2, y2 = vs[(i + 1) % len(vs)]
        if (y1 > p[1]) != (y2 > p[1]) and p[0] < x1 + (p[1] - y1) * (x2 - x1) / (y2 - y1):
            crossing = not crossing
    return 1 if crossing else -1


def p5_allreduce(size: int, nranks: int, nnodes: int) -> tuple[str, str] | None:
    """The (algorithm, protocol) AWS's tuner picks for an allreduce of ``size`` bytes on
    p5/p5e, or ``None`` where it leaves the choice to NCCL (not 8 ranks a node)."""
    if nranks != 8 * nnodes or size > TUNER_MAX_SIZE or nranks > TUNER_MAX_RANKS:
        return None
    for algorithm, protocol, vertices in P5_ALLREDUCE_8PPN:
        if inside((float(size), float(nranks)), vertices) >= 0:
            return algorithm, protocol
    return None


if __name__ == "__main__":
    for nodes in (2, 4, 8, 16, 32):
        picks = [p5_allreduce((32 << 20) << k, 8 * nodes, nodes) for k in range(9)]
        print(f"{nodes:3d} nodes: " + ", ".join(f"{a}/{p}" for a, p in picks))
