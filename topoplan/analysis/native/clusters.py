"""The clusters a native library moves bytes on: NVLink at the rate NCCL counts for it
(:func:`nccl_links`), the cluster a cost profile's runtime runs on (:func:`runtime_cluster`:
every planner plans on it and the simulator runs on it), and the sub-cluster a
communicator of a group of ranks sees (:func:`group_cluster`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from ..._util import ObjectCache
from . import nccl_tables as T

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["runtime_cluster", "nccl_links", "gpu_model", "group_cluster", "GroupCluster",
           "DEFAULT_GPU"]

#: The GPU model assumed for boxes whose file names none: NCCL's Ampere tables (an
#: NVLS fabric implies Hopper).
DEFAULT_GPU = "A100"


def gpu_model(box: Any) -> str:
    """The GPU model NCCL's tables are chosen by for ``box``: its ``gpu``, else H100
    for an NVLS fabric, else :data:`DEFAULT_GPU`."""
    if box.gpu is not None:
        return str(box.gpu)
    return "H100" if box.fabric is not None and box.fabric.nvls else DEFAULT_GPU


def nccl_links(cluster: Cluster) -> Cluster:
    """``cluster`` with its NVLink links and NVSwitch ports at what NCCL counts for them
    (:func:`~topoplan.analysis.native.nccl_search.nvlink_view`, by each box's GPU model; a box
    whose file names no ``gpu`` keeps its bandwidths as written): the cluster a
    schedule run by NCCL moves its bytes on (the ``nccl`` profile's ``nvlink: nccl``).
    The same object when nothing changes; a host (a calibrated profile's machine) is
    never changed. Computed once per cluster object."""
    from ...cluster import HostCluster

    if isinstance(cluster, HostCluster):
        return cluster
    counted = _LINKS(cluster)
    return cluster if counted is None else counted


def _count_links(cluster: Cluster) -> Cluster | None:
    """The re-counted cluster, or None when no bandwidth changes (a cached value must
    not refer back to its cluster)."""
    from dataclasses import replace

    from .nccl_search import nvlink_view

    boxes = []
    changed = False
    for box in cluster.boxes:
        if box.gpu is None:  # the file does not say which NVLink: taken as written
            boxes.append(box)
            continue
        cc = T.COMPCAP[gpu_model(box)]
        fabric = box.fabric

        def view(bandwidth: float) -> float:
            counted = nvlink_view(bandwidth / 1e9, cc) * 1e9
            return bandwidth if math.isclose(counted, bandwidth, rel_tol=1e-9) else counted

        if fabric is not None and fabric.is_nvlink and view(fabric.bandwidth) != fabric.bandwidth:
            fabric = replace(fabric, bandwidth=view(fabric.bandwidth))
        links = tuple(l if view(l.bandwidth) == l.bandwidth else replace(l, bandwidth=view(l.bandwidth))
                      for l in box.gpu_links)
        if fabric is not box.fabric or links != box.gpu_links:
            changed = True
            box = replace(box, fabric=fabric, gpu_links=links)
        boxes.append(box)
    return replace(cluster, boxes=tuple(boxes)) if changed else None


_LINKS: ObjectCache[Cluster, Cluster | None] = ObjectCache(_count_links)


def runtime_cluster(cluster: Cluster, profile: Any) -> Cluster:
    """The cluster as ``profile``'s runtime moves bytes on it: :func:`nccl_links` for a
    profile with ``nvlink: nccl``, else ``cluster`` itself. Planners plan on it and the
    simulator runs on it; bounds for any schedule stay on ``cluster``."""
    return nccl_links(cluster) if getattr(profile, "nvlink", None) == "nccl" else cluster


# ----------------------------------------------------------------------------------
# A group of ranks: a communicator of its own
# ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupCluster:
    """The cluster NCCL sees when a communicator holds only ``group``'s ranks.

    Attributes
    ----------
    cluster : Cluster
        The group's GPUs (boxes in the order the group first names them, GPUs of a box
        in their order there), the boxes' NICs that serve them (all the box's NICs,
        serving every kept GPU, when none does: NCCL then reaches them across the
        host), every switch and switch link, SHARP.
    nodes : mapping
        Each graph node of ``cluster`` that is named otherwise in the original cluster
        (its GPUs and NICs renumbered) to the node it is there.
    ranks : tuple of int
        The original rank of each rank of ``cluster``.
    """

    cluster: Cluster
    nodes: dict[str, str]
    ranks: tuple[int, ...]

    def edge(self, edge: tuple[str, str]) -> tuple[str, str]:
        """An edge of ``cluster`` as the edge of the original cluster it is."""
        return self.nodes.get(edge[0], edge[0]), self.nodes.get(edge[1], edge[1])


def group_cluster(cluster: Cluster, group: Iterable[int]) -> GroupCluster:
    """The sub-cluster of the ranks in ``group`` (:class:`GroupCluster`), computed once
    per cluster object and group. The whole cluster in rank order is ``cluster`` itself.

    Raises
    ------
    ValueError
        For an empty group, a rank outside the cluster or a rank named twice.
    """
    members = tuple(int(r) for r in group)
    if not members:
        raise ValueError("a group needs at least one rank")
    if len(set(members)) != len(members):
        raise ValueError(f"group {list(members)} names a rank twice")
    bad = [r for r in members if not 0 <= r < cluster.nranks]
    if bad:
        raise ValueError(f"group names rank {bad[0]}, outside range({cluster.nranks})")
    if members == tuple(range(cluster.nranks)):
        return GroupCluster(cluster, {}, members)  # the communicator of every rank
    groups = _GROUPS(cluster)
    found = groups.get(members)
    if found is None:
        found = groups[members] = _group_cluster(cluster, members)
    return found


def _group_cluster(cluster: Cluster, members: tuple[int, ...]) -> GroupCluster:
    from dataclasses import replace

    from ...cluster.model import GpuLink, Nic

    order: list[int] = []  # box indexes, in the order the group first names them
    kept: dict[int, list[int]] = {}
    for r in members:
        b = cluster.box_index(r)
        if b not in kept:
            order.append(b)
            kept[b] = []
        kept[b].append(cluster.local_index(r))
    boxes = []
    nodes: dict[str, str] = {}
    ranks: list[int] = []
    first = 0
    for b in order:
        box = cluster.boxes[b]
        local = sorted(kept[b])
        index = {g: j for j, g in enumerate(local)}
        links = tuple(GpuLink(index[l.a], index[l.b], l.bandwidth, l.latency)
                      for l in box.gpu_links if l.a in index and l.b in index)
        served = [k for k, nic in enumerate(box.nics) if any(g in index for g in nic.gpus)]
        if served:
            nics = tuple(replace(box.nics[k], gpus=tuple(index[g] for g in box.nics[k].gpus
                                                         if g in index)) for k in served)
        else:
            served = list(range(len(box.nics)))
            nics = tuple(replace(nic, gpus=tuple(range(len(local)))) for nic in box.nics)
        sub = replace(box, gpus=len(local), first_rank=first, gpu_links=links, nics=nics)
        for j, g in enumerate(local):
            nodes[sub.gpu_node(j)] = box.gpu_node(g)
            ranks.append(box.first_rank + g)
        for j, k in enumerate(served):
            nodes[sub.nic_node(j)] = box.nic_node(k)
        boxes.append(sub)
        first += len(local)
    name = f"{cluster.name}[{','.join(map(str, members))}]"
    sub_cluster = replace(cluster, name=name, boxes=tuple(boxes), source=None)
    return GroupCluster(sub_cluster, nodes, tuple(ranks))


_GROUPS: ObjectCache[Cluster, dict[tuple[int, ...], GroupCluster]] = ObjectCache(lambda c: {})
