"""Clusters: the YAML spec (docs/CLUSTER.md) -> a frozen model -> a ``networkx.DiGraph``.

- :mod:`~topoplan.cluster.model`: :class:`Cluster`, its boxes, NICs and links (frozen
  dataclasses), and the routes data takes between two ranks;
- :mod:`~topoplan.cluster.graph`: the topology graph (``Cluster.graph``);
- :mod:`~topoplan.cluster.spec`: :func:`load_cluster` / :func:`loads_cluster`, the YAML
  reader, whose errors name ``file:line: key``, and :func:`flat_cluster`;
- :mod:`~topoplan.cluster.rails`: the rings that follow a cluster's rails.
"""

from __future__ import annotations

from .model import (MAX_ROUTES, Box, Cluster, Fabric, GpuLink, HostCluster, Nic, SwitchLink,
                    host_cluster)
from .spec import MAX_COUNT, as_cluster, flat_cluster, load_cluster, loads_cluster

__all__ = [
    "Fabric", "GpuLink", "Nic", "Box", "SwitchLink", "Cluster", "HostCluster", "host_cluster",
    "load_cluster", "loads_cluster", "as_cluster", "flat_cluster", "MAX_ROUTES", "MAX_COUNT",
]
