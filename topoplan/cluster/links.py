"""The cluster's physical links by name, and the cluster with some of them slower.

A link is what a cable or a port is: one NIC (``"B/nic0"``, its PCIe leg from the GPUs it
serves and its port into the switch), one switch-to-switch link (``"leaf0-spine1"``,
parallel links between the same two switches together), one box's in-box fabric
(``"B/fabric"``: an NVSwitch or PCIe switch, every GPU's port), or the direct GPU links
between two GPUs of a box (``"B/gpu0-gpu1"``, NVLink). These are the names ``topo show``
prints (boxes, NICs and switch links), what ``testbed --degrade`` and ``doctor`` take, and
how link health (:mod:`topoplan.runtime.health`) reports a slow link.

Each :class:`Link` knows the directed edges of :attr:`Cluster.graph` it stands for, both
directions; :func:`degraded` is the same cluster with some links' bandwidth multiplied
(both directions, latency kept): the cluster a planner plans around a slow link on.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Mapping

from ..errors import TopoplanError
from .model import Cluster, Fabric, GpuLink, SwitchLink

__all__ = ["Link", "LINK_KINDS", "links", "find_link", "link_of_edge", "degraded",
           "parse_degrade", "Degrade"]

#: What a link is: a NIC, a switch-to-switch link, an in-box fabric, direct GPU links.
LINK_KINDS = ("nic", "switch", "fabric", "nvlink")


@dataclass(frozen=True, slots=True)
class Link:
    """One physical link: its ``name``, ``kind`` (one of :data:`LINK_KINDS`), the
    directed graph edges it stands for, and its modelled bandwidth per direction
    (bytes/s; a fabric's per GPU port)."""

    name: str
    kind: str
    edges: tuple[tuple[str, str], ...]
    bandwidth: float

    def describe(self) -> str:
        """``"NIC B/nic0"``, ``"switch link leaf0-spine1"``, ..."""
        what = {"nic": "NIC", "switch": "switch link", "fabric": "fabric",
                "nvlink": "NVLink"}[self.kind]
        return f"{what} {self.name}"


def _switch_name(a: str, b: str) -> str:
    return f"{a}-{b}"


@lru_cache(maxsize=32)
def _links(cluster: Cluster) -> tuple[Link, ...]:
    found: list[Link] = []
    for box in cluster.boxes:
        if box.fabric is not None:
            edges = []
            for j in range(box.gpus):
                edges += [(box.gpu_node(j), box.fabric_node), (box.fabric_node, box.gpu_node(j))]
            found.append(Link(box.fabric_node, "fabric", tuple(edges), box.fabric.bandwidth))
        pairs: dict[tuple[int, int], float] = {}
        for gl in box.gpu_links:
            key = (min(gl.a, gl.b), max(gl.a, gl.b))
            pairs[key] = pairs.get(key, 0.0) + gl.bandwidth
        for (a, b), bandwidth in pairs.items():
            u, v = box.gpu_node(a), box.gpu_node(b)
            found.append(Link(f"{box.name}/gpu{a}-gpu{b}", "nvlink", ((u, v), (v, u)), bandwidth))
        for k, nic in enumerate(box.nics):
            node = box.nic_node(k)
            edges = [(node, nic.switch), (nic.switch, node)]
            for j in nic.gpus:
                edges += [(box.gpu_node(j), node), (node, box.gpu_node(j))]
            found.append(Link(node, "nic", tuple(edges), nic.bandwidth))
    switch: dict[tuple[str, str], float] = {}
    for sl in cluster.links:
        switch[(sl.a, sl.b)] = switch.get((sl.a, sl.b), 0.0) + sl.bandwidth
    for (u, v), bandwidth in switch.items():
        found.append(Link(_switch_name(u, v), "switch", ((u, v), (v, u)), bandwidth))
    return tuple(found)


def links(cluster: Cluster) -> tuple[Link, ...]:
    """Every physical link of ``cluster``: per box its fabric, GPU links and NICs, then
    the switch links, in file order."""
    return _links(cluster)


@lru_cache(maxsize=32)
def _by_edge(cluster: Cluster) -> dict[tuple[str, str], Link]:
    return {edge: link for link in _links(cluster) for edge in link.edges}


def link_of_edge(cluster: Cluster, edge: tuple[str, str]) -> Link:
    """The link a directed graph edge belongs to.

    Raises
    ------
    KeyError
        ``edge`` is not an edge of the cluster's graph.
    """
    return _by_edge(cluster)[edge]


def find_link(cluster: Cluster, name: str) -> Link:
    """The link called ``name`` (a switch link in either order: ``a-b`` or ``b-a``).

    Raises
    ------
    TopoplanError
        No such link, with the closest names and what names look like.
    """
    text = name.strip()
    for link in _links(cluster):
        if link.name == text:
            return link
        if link.kind == "switch":
            a, b = link.edges[0]
            if text == _switch_name(b, a):
                return link
    names = [link.name for link in _links(cluster)]
    close = difflib.get_close_matches(text, names, n=3)
    hint = (f"did you mean {', '.join(close)}?" if close
            else f"it has {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
    raise TopoplanError(f"{cluster.name} has no link {text!r}: {hint} (links are named as "
                        "'topoplan topo show' prints them: BOX/nicK, BOX/fabric, "
                        "BOX/gpuI-gpuJ, SWITCH-SWITCH)")


def degraded(cluster: Cluster, factors: Mapping[str, float], *, name: str | None = None
             ) -> Cluster:
    """``cluster`` with each named link's bandwidth multiplied by its factor (both
    directions; latencies kept): a NIC's port and PCIe leg, every parallel switch link
    between the two switches, a fabric's every GPU port, every GPU link of the pair.

    Raises
    ------
    TopoplanError
        An unknown link (:func:`find_link`) or a factor that is not positive and finite.
    """
    chosen: dict[str, float] = {}
    for link_name, factor in factors.items():
        link = find_link(cluster, link_name)
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise TopoplanError(f"{link.describe()}: factor {factor!r} must be a positive "
                                "number (0.25: a quarter of its bandwidth)")
        chosen[link.name] = chosen.get(link.name, 1.0) * float(factor)
    if not chosen:
        return cluster
    boxes = []
    for box in cluster.boxes:
        fabric, gpu_links, nics = box.fabric, box.gpu_links, box.nics
        f = chosen.get(box.fabric_node)
        if fabric is not None and f is not None:
            fabric = Fabric(fabric.bandwidth * f, fabric.latency, fabric.nvls, fabric.kind)
        gpu_links = tuple(
            GpuLink(gl.a, gl.b, gl.bandwidth * chosen.get(
                f"{box.name}/gpu{min(gl.a, gl.b)}-gpu{max(gl.a, gl.b)}", 1.0), gl.latency)
            for gl in gpu_links)
        nics = tuple(replace(nic, bandwidth=nic.bandwidth * chosen.get(box.nic_node(k), 1.0))
                     for k, nic in enumerate(nics))
        boxes.append(replace(box, fabric=fabric, gpu_links=gpu_links, nics=nics))
    switch_links = tuple(SwitchLink(sl.a, sl.b, sl.bandwidth * chosen.get(
        _switch_name(sl.a, sl.b), 1.0), sl.latency) for sl in cluster.links)
    label = name or cluster.name + "".join(f" [{k} x{v:g}]" for k, v in chosen.items())
    return replace(cluster, name=label, boxes=tuple(boxes), links=switch_links)


@dataclass(frozen=True, slots=True)
class Degrade:
    """``LINK=FACTOR[@SECONDS]``: a link at ``factor`` of its bandwidth, from ``after``
    seconds on (0: from the start)."""

    link: str
    factor: float
    after: float = 0.0

    def __str__(self) -> str:
        return f"{self.link}={self.factor:g}" + (f"@{self.after:g}" if self.after else "")


_DEGRADE = re.compile(r"^\s*(?P<link>[^=@\s]+)\s*=\s*(?P<factor>[^@\s]+)\s*"
                      r"(?:@\s*(?P<after>\S+?)\s*s?)?\s*$")


def parse_degrade(text: str) -> Degrade:
    """Parse ``LINK=FACTOR[@SECONDS]`` (``B/nic0=0.25``, ``leaf0-spine0=0.5@30``); the
    link is checked against a cluster with :func:`find_link`.

    Raises
    ------
    TopoplanError
        Not of that form, a factor outside (0, 1], or a negative delay.
    """
    match = _DEGRADE.match(text)
    usage = "use LINK=FACTOR[@SECONDS], for example B/nic0=0.25 or leaf0-spine0=0.5@30"
    if match is None:
        raise TopoplanError(f"--degrade {text!r}: {usage}")
    try:
        factor = float(match["factor"])
        after = float(match["after"]) if match["after"] else 0.0
    except ValueError:
        raise TopoplanError(f"--degrade {text!r}: {usage}") from None
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise TopoplanError(f"--degrade {text!r}: the factor must be in (0, 1] "
                            "(0.25: a quarter of the link's bandwidth)")
    if not (math.isfinite(after) and after >= 0):
        raise TopoplanError(f"--degrade {text!r}: the delay must be 0 or more seconds")
    return Degrade(match["link"], factor, after)
