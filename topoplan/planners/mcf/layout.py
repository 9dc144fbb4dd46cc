"""What the grid and rail constructions of ``mcf`` are made of: a :class:`RankGrid` of the
ranks, the :class:`PieceMessages` of one pipeline piece on it, and the switch groups both
lay the boxes out by.

:mod:`.grids` and :mod:`.rails` make layouts, :mod:`.messages` and :mod:`.rails` their
messages; :mod:`.pricing` and :mod:`.pieces` price them and size the pipeline, and
:mod:`.build` turns them into schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cluster import Cluster

__all__ = ["RankGrid", "PieceMessages", "switch_groups"]


@dataclass(frozen=True)
class RankGrid:
    """A grid of the ranks and the first-level rings.

    Attributes
    ----------
    name : str
        Short description for ``meta`` (``"box[8]x2 rings > rail[4]"``).
    dims : tuple of int
        Level sizes, first level first; their product is the rank count.
    grids : tuple of ndarray
        One rank grid (shape ``dims``) per ring of the first level.
    weights : ndarray
        Share of the buffer each ring carries (sums to 1).
    direct : tuple of bool
        Per level: a direct (all-to-all) exchange in one step instead of a ring of
        ``b - 1`` steps (empty: every level a ring). Only for levels whose members
        share a switch or fabric, where both move the least bytes possible.
    """

    name: str
    dims: tuple[int, ...]
    grids: tuple[np.ndarray, ...]
    weights: np.ndarray
    direct: tuple[bool, ...] = ()
    #: A sharded-only construction (:mod:`.rails`): ``dims`` are (groups, boxes a
    #: group, GPUs a box), ``grids[0]`` is that grid of ranks and the chunks are
    #: numbered along it, ``parts`` a shard; not a grid of levels.
    rails: bool = False
    #: Rail layouts: units (``1 / parts`` of a shard) of group offsets sent each round.
    rounds: tuple[int, ...] = ()
    parts: int = 1

    def is_direct(self, d: int) -> bool:
        return bool(self.direct) and self.direct[d]


@dataclass(frozen=True)
class PieceMessages:
    """Every message of one piece of every ring: step, src, dst, first chunk (piece-local),
    chunk count, reduce.

    Chunks are ``ring * N + final index``; ``nsteps`` steps per piece.
    """

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    chunk: np.ndarray
    count: np.ndarray
    reduce: np.ndarray
    nsteps: int
    nchunks: int


def switch_groups(cluster: Cluster) -> list[list[int]]:
    """Boxes grouped by the set of switches their NICs plug into, in box order."""
    groups: dict[tuple, list[int]] = {}
    for b, box in enumerate(cluster.boxes):
        key = tuple(sorted({nic.switch for nic in box.nics}))
        groups.setdefault(key, []).append(b)
    return list(groups.values())
