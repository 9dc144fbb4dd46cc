"""Faults in the emulated cluster: a link at a fraction of its rate, with real ``tc``.

A link of the cluster (:mod:`topoplan.cluster.links`: ``B/nic0``, ``leaf0-leaf1``, ...)
is one or more veth pairs of the testbed (:attr:`Veth.edges` says which graph edges a
pair stands for: its ``a -> b`` edges first, then as many ``b -> a``); each end's HTB tree
shapes one direction. :func:`degrade` rewrites the classes of every end that carries the
link (``tc class change``: the link class and every pair's class, rate and ceiling at
``factor`` times what ``testbed up`` set), one ``tc -batch`` per interface; ``factor=1``
puts the rates back. Queues, filters and latency are left as they were.
"""

from __future__ import annotations

from typing import Any

from ..cluster.links import find_link
from ..errors import TopoplanError
from .layout import Layout
from .netns import _batch, crossing_pairs, shaping_commands

__all__ = ["degrade", "link_ends"]


def link_ends(layout: Layout, cluster: Any, link: str) -> list[tuple[str, str, float]]:
    """The ``(namespace, interface, rate)`` ends of the testbed that shape ``link``.

    Raises
    ------
    TopoplanError
        An unknown link, or one the testbed leaves unshaped (above
        :data:`~topoplan.testbed.layout.MAX_SHAPED_RATE`: it cannot be slowed here).
    """
    found = find_link(cluster, link)
    edges = {f"{u}>{v}" for u, v in found.edges}
    ends = []
    for v in layout.veths:
        half = len(v.edges) // 2
        ab, ba = set(v.edges[:half]), set(v.edges[half:])
        if v.rate is None and (ab | ba) & edges:
            raise TopoplanError(f"{found.describe()} is not shaped on this testbed (above "
                                "what one veth moves): it cannot be slowed here")
        if ab & edges:
            ends.append((v.ns_a, v.name_a, v.rate))
        if ba & edges:
            ends.append((v.ns_b, v.name_b, v.rate))
    if not ends:
        raise TopoplanError(f"{found.describe()} carries no traffic on this testbed")
    return ends


def degrade(layout: Layout, cluster: Any, link: str, factor: float) -> list[tuple[str, str]]:
    """Set ``link`` to ``factor`` of its rate on the live testbed of ``layout`` (the
    cluster it was built from, unscaled); returns the interfaces changed.

    Raises
    ------
    TopoplanError
        A factor outside (0, 1], an unknown or unshaped link, or a failed ``tc``.
    """
    if not 0 < factor <= 1:
        raise TopoplanError(f"degrade {link}: the factor must be in (0, 1], got {factor!r}")
    crossing = crossing_pairs(layout)
    changed = []
    for ns, dev, rate in link_ends(layout, cluster, link):
        lines = [line.replace("class add", "class change", 1)
                 for line in shaping_commands(dev, rate * factor, 0.0, layout.addresses,
                                              pairs=crossing.get((ns, dev), []))
                 if line.startswith("class add")]
        _batch(["tc", "-n", ns, "-batch", "-"], lines, f"slowing {dev} in {ns}")
        changed.append((ns, dev))
    return changed
