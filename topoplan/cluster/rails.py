"""Rails: on a cluster whose boxes have a NIC per GPU (GPU ``j``'s NIC is rail ``j``), the
rings that cross between boxes on one rail each, as NCCL's ring channels do (one per
NIC). The ``ring-topo`` planner runs them (:func:`topoplan.planners.ring.plan_ring`), and
the MSCCL export writes a native allreduce as them
(:func:`topoplan.interop.msccl.export_msccl`)."""

from __future__ import annotations

from typing import Sequence

from .model import Box, Cluster

__all__ = ["rail_rings", "MAX_RING_OPS"]

#: Most point-to-point ops a plan over rail rings may hold: each ring adds a single ring's
#: ``4 n (n - 1)`` ops, so at 1024 ranks two rings (8.4 M) and not eight (34 M: minutes
#: and gigabytes). ``ring-topo`` and the MSCCL export run fewer rings past it.
MAX_RING_OPS = 9_000_000


def rail_rings(cluster: Cluster, boxes: Sequence[Box] | None = None) -> list[list[int]]:
    """One ring per rail, each crossing between boxes on its rail; ``[]`` without rails.

    A cluster has rails here when it has two boxes or more, all of ``g >= 2`` GPUs on an
    NVSwitch-like fabric (any two GPUs of a box one hop apart) and every GPU with a NIC
    of its own: GPU ``j``'s NIC is rail ``j`` (a rail-optimized fabric, or a fat tree
    whose boxes have a NIC per GPU). There a ring through the boxes one after the other
    leaves every box from its last GPU and enters the next at its first: every hop
    between boxes goes ``gpu7 -> rail 7 -> spine -> rail 0 -> gpu0``, and all of them
    use two of the box's ``g`` NICs.

    Ring ``k`` enters the first box of ``boxes`` (default: file order) at GPU ``k``.
    Inside a box it enters at GPU ``e``, visits every GPU and leaves at GPU ``e + d`` (mod ``g``,
    ``d != 0``), and enters the next box at GPU ``e + d`` too: the hop between them stays
    on rail ``e + d``. The shifts ``d`` of the boxes add up to a multiple of ``g`` (``+1``
    each, the last taking the rest), so the ring closes on its own rail too; where no
    such shifts exist (``g = 2`` with an odd number of boxes) the closing hop changes
    rails. All rings have the same shifts and start on different GPUs, so at every box
    boundary the ``g`` rings cross on ``g`` different rails: the NICs share the traffic,
    as NCCL's channels do (one ring per NIC). A box's path goes down from ``e``
    (``e, e - 1, ...``), leaving out ``e + d`` until the end.

    Returns
    -------
    list of list of int
        ``g`` rings, each a permutation of the ranks.
    """
    if len(cluster.boxes) < 2:
        return []
    g = cluster.boxes[0].gpus
    if g < 2:
        return []
    for box in cluster.boxes:
        own = sorted(nic.gpus[0] for nic in box.nics if len(nic.gpus) == 1)
        if box.gpus != g or box.fabric is None or box.gpu_links or own != list(range(g)):
            return []
    sequence = list(cluster.boxes if boxes is None else boxes)
    nb = len(sequence)
    shifts = [1] * nb
    shifts[-1] = (1 - nb) % g
    if shifts[-1] == 0 and nb >= 2 and g >= 3:  # nb = 1 mod g: one box shifts by 2
        shifts[-2], shifts[-1] = 2, (-nb) % g
    if shifts[-1] == 0:  # g = 2, nb odd: the closing hop changes rails
        shifts[-1] = 1
    rings = []
    for k in range(g):
        ring, e = [], k
        for box, d in zip(sequence, shifts):
            out = (e + d) % g
            path = [e] + [(e - i) % g for i in range(1, g) if (e - i) % g != out] + [out]
            ring += [box.first_rank + j for j in path]
            e = out
        rings.append(ring)
    return rings
