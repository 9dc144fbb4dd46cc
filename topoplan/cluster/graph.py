"""The topology graph of a cluster: a ``networkx.DiGraph`` the planners, the bound and
the simulator work on.

Nodes are strings: ``"<box>/gpu<j>"`` (kind ``gpu``, with its ``rank``, ``box`` and
``local`` index), ``"<box>/nic<k>"`` (kind ``nic``), ``"<box>/fabric"`` (kind ``fabric``)
and the switch names (kind ``switch``). Every edge carries ``bandwidth`` (bytes/s),
``latency`` (s) and ``kind`` (``fabric``, ``nvlink``, ``pcie``, ``nic``, ``switch``);
a full-duplex link is two directed edges, and parallel links add up their bandwidth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from .model import Box, Cluster

__all__ = ["build_graph", "box_link_graph"]


def box_link_graph(box: Box) -> nx.Graph:
    """The box's GPUs (box-local indexes) joined by its direct GPU links."""
    graph = nx.Graph()
    graph.add_nodes_from(range(box.gpus))
    graph.add_edges_from((link.a, link.b) for link in box.gpu_links)
    return graph


def _add_duplex(graph: nx.DiGraph, u: str, v: str, bandwidth: float, latency: float,
                kind: str, latency_back: float | None = None) -> None:
    for a, b, lat in ((u, v, latency), (v, u, latency if latency_back is None else latency_back)):
        if graph.has_edge(a, b):  # parallel links add up
            graph[a][b]["bandwidth"] += bandwidth
        else:
            graph.add_edge(a, b, bandwidth=bandwidth, latency=lat, kind=kind)


def build_graph(cluster: Cluster) -> nx.DiGraph:
    """The topology of ``cluster`` (its ``graph``)."""
    graph = nx.DiGraph(name=cluster.name)
    for switch in cluster.switches:
        graph.add_node(switch, kind="switch")
    for b, box in enumerate(cluster.boxes):
        for j in range(box.gpus):
            graph.add_node(box.gpu_node(j), kind="gpu", rank=box.first_rank + j, box=b, local=j)
        if box.fabric is not None:
            graph.add_node(box.fabric_node, kind="fabric", box=b)
            for j in range(box.gpus):
                # The latency is paid once per GPU->fabric->GPU crossing.
                _add_duplex(graph, box.gpu_node(j), box.fabric_node, box.fabric.bandwidth,
                            box.fabric.latency, "fabric", latency_back=0.0)
        for link in box.gpu_links:
            _add_duplex(graph, box.gpu_node(link.a), box.gpu_node(link.b), link.bandwidth,
                        link.latency, "nvlink")
        for k, nic in enumerate(box.nics):
            node = box.nic_node(k)
            graph.add_node(node, kind="nic", box=b, switch=nic.switch)
            for j in nic.gpus:
                _add_duplex(graph, box.gpu_node(j), node, nic.bandwidth, 0.0, "pcie")
            _add_duplex(graph, node, nic.switch, nic.bandwidth, nic.latency, "nic")
    for switch_link in cluster.links:
        _add_duplex(graph, switch_link.a, switch_link.b, switch_link.bandwidth,
                    switch_link.latency, "switch")
    return graph

