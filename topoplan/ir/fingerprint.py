"""A fingerprint of a cluster's graph, so a plan knows which cluster it was made for.

Planning records it as ``meta["cluster_fingerprint"]``; :func:`topoplan.simulate` and
the CLI's ``simulate``, ``show`` and ``bench`` refuse a plan whose fingerprint is not the
cluster's (``force=True``, ``--force`` run it anyway). A plan without one (written
before the key existed) is taken as it is.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from .._util import ObjectCache
from ..errors import ScheduleError

if TYPE_CHECKING:
    from ..cluster import Cluster
    from .schedule import Schedule

__all__ = ["META_KEY", "cluster_fingerprint", "check_fingerprint"]

#: The schedule meta key that holds the fingerprint.
META_KEY = "cluster_fingerprint"


def cluster_fingerprint(cluster: Cluster) -> str:
    """``"sha256:"`` and 16 hex digits of what a plan depends on in ``cluster``.

    The hash covers the graph: every node's kind and place, every directed edge with
    its bandwidth and latency, and which rank sits on which GPU. Nodes are named by
    position, not by the names in the file (GPUs by rank, NICs and fabrics by box index,
    switches by their order), so renaming the cluster, a box or a switch, moving the
    file, or writing ``100 Gbit/s`` as ``12.5 GB/s`` keeps the fingerprint; changing a
    bandwidth, a latency, a link or the rank order changes it.

    Parameters
    ----------
    cluster : Cluster

    Returns
    -------
    str
        Such as ``"sha256:3f0c9a1e5b7d2c44"``.
    """
    graph = cluster.graph
    switch_index = {name: i for i, name in enumerate(cluster.switches)}
    box_index = {box.name: b for b, box in enumerate(cluster.boxes)}

    def label(node: str) -> str:
        data = graph.nodes[node]
        kind = data.get("kind")
        if kind == "gpu":
            return f"rank{data['rank']}"
        if kind == "switch":
            return f"switch{switch_index[node]}"
        box, _, part = node.rpartition("/")
        return f"box{box_index[box]}/{part}"

    lines = sorted(f"node {label(node)} {data.get('kind')}" for node, data in graph.nodes(data=True))
    lines += sorted(f"edge {label(u)} {label(v)} {float(data['bandwidth'])!r} "
                    f"{float(data['latency'])!r}" for u, v, data in graph.edges(data=True))
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return f"sha256:{digest[:16]}"


def check_fingerprint(schedule: Schedule, cluster: Cluster, *, plan: str = "the plan",
                      cluster_file: str | None = None, force: bool = False,
                      force_hint: str = "pass --force") -> None:
    """Refuse ``schedule`` on ``cluster`` when it was planned for another cluster.

    Parameters
    ----------
    schedule : Schedule
    cluster : Cluster
    plan : str
        How to name the plan in the message (its file).
    cluster_file : str, optional
        How to name the cluster in the message (default: its source).
    force : bool
        Accept the mismatch (nothing is checked).
    force_hint : str
        How the caller accepts it, for the message (the CLI's ``pass --force``, the
        API's ``pass force=True``).

    Raises
    ------
    ScheduleError
        When the plan's ``meta["cluster_fingerprint"]`` differs from the cluster's,
        naming both clusters and both fingerprints. Plans without the key pass.
    """
    recorded = schedule.meta.get(META_KEY)
    if force or recorded is None:
        return
    actual = _fingerprint_of(cluster)
    if recorded == actual:
        return
    where = cluster_file or cluster.source or "the cluster"
    made_for = schedule.meta.get("cluster")
    made_for = f"cluster {made_for!r}, " if isinstance(made_for, str) else ""
    raise ScheduleError(
        f"{plan} was planned for another cluster ({made_for}fingerprint {recorded}) than "
        f"{where} (cluster {cluster.name!r}, fingerprint {actual}); plan it for this "
        f"cluster (topoplan plan {where} -o PLAN.json), or {force_hint} to use it anyway")


#: Each cluster's fingerprint, once per cluster object: simulate checks it on every call.
_fingerprint_of: ObjectCache[Cluster, str] = ObjectCache(cluster_fingerprint)
