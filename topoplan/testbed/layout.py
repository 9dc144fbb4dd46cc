"""Cluster -> an emulated network: namespaces, bridges, shaped veth pairs (pure, no root).

Every rank gets its own network namespace with one interface, ``eth0``, holding an
address from ``10.200.0.0/16``; that range lives only inside the namespaces this
module names, so it can never clash with the host's network. All bridges live in one
more namespace, ``<prefix>core``: one bridge per switch and, for a box with more than
one GPU, one bridge for its fabric. Links become veth pairs shaped at both ends (each
end's egress qdisc shapes one direction), at the YAML bandwidth times ``scale``:

* single-GPU box: ``rank eth0 <-> core n<b>``, port of the switch bridge, at the NIC rate;
* multi-GPU box: ``rank eth0 <-> core g<r>``, port of the box bridge, at the GPU's in-box
  rate (fabric port, or the sum of its NVLinks), and ``core x<b> <-> core n<b>`` joining
  the box bridge to the switch bridge at the NIC rate;
* switch link ``i``: ``core l<i>a <-> core l<i>b`` between the two switch bridges.

Bridges learn MAC addresses and flood unknown ones, so the bridge graph must be a
tree: a switch network with cycles (leaf-spine with several spines) or a box with NICs
on two switches would loop. Such clusters are refused with the reason; NICs of one box
on one switch are merged into one link of their summed bandwidth.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from ..cluster import Box, Cluster, Fabric, GpuLink, Nic, SwitchLink
from ..errors import ClusterSpecError

__all__ = ["Veth", "Layout", "plan_layout", "scale_cluster", "auto_scale", "parse_scale",
           "rank_address", "SUBNET", "MAX_SHAPED_RATE", "AUTO_TARGET_RATE"]

SUBNET = "10.200.0.0/16"
#: Above this (bytes/s) a link is left unshaped: this machine cannot push more through
#: one veth anyway (about 17 Gbit/s in total), and tbf at such rates only adds jitter.
MAX_SHAPED_RATE = 8e9 / 8
#: ``--scale auto`` brings the fastest link between boxes to at most this rate (bytes/s)...
AUTO_TARGET_RATE = 2.5e9 / 8
#: ... and the ranks' ports (NIC, or in-box link for multi-GPU boxes) together to at
#: most this (bytes/s). Measured on the 2-core machine this was built on: four
#: 2.5 Gbit/s flows delivered 2.0-2.2 Gbit/s each and starved a shaped 250 Mbit/s
#: flow beside them to 200; at half those rates every flow got its shaped rate.
MACHINE_RATE = 5e9 / 8
#: Latencies below this are left out: veth + bridge + TCP already cost tens of us.
MIN_NETEM_LATENCY = 20e-6


@dataclass(frozen=True, slots=True)
class Veth:
    """A veth pair: end ``a`` in namespace ``ns_a`` (enslaved to bridge ``master_a`` if set).

    ``rate`` is bytes/s per direction after scaling (``None``: unshaped); ``latency`` is
    the one-way delay in seconds added with netem at both ends (0: none).
    """

    ns_a: str
    name_a: str
    ns_b: str
    name_b: str
    rate: float | None
    latency: float
    what: str  # what the pair stands for, for messages and the state file
    master_a: str | None = None
    master_b: str | None = None


@dataclass(frozen=True)
class Layout:
    """Everything ``testbed up`` creates, in creation order."""

    prefix: str
    scale: float
    cluster: str
    nranks: int
    core: str  # the namespace holding every bridge
    rank_ns: tuple[str, ...]
    addresses: tuple[str, ...]  # rank -> IPv4 address on its eth0
    bridges: tuple[tuple[str, str], ...]  # (bridge name in core, what it stands for)
    veths: tuple[Veth, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.core, *self.rank_ns)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["namespaces"] = list(self.namespaces)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        return cls(prefix=d["prefix"], scale=d["scale"], cluster=d["cluster"], nranks=d["nranks"],
                   core=d["core"], rank_ns=tuple(d["rank_ns"]), addresses=tuple(d["addresses"]),
                   bridges=tuple(tuple(b) for b in d["bridges"]),  # type: ignore[misc]
                   veths=tuple(Veth(**v) for v in d["veths"]), notes=tuple(d.get("notes", ())))


def new_prefix() -> str:
    """A name prefix no other run uses: this process's pid plus a random tag."""
    return f"tp-{os.getpid()}-{secrets.token_hex(2)}-"


def rank_address(rank: int) -> str:
    """The IPv4 address of ``rank`` inside the emulated network (10.200.0.0/16)."""
    if not 0 <= rank < 250 * 256:
        raise ValueError(f"rank {rank} does not fit in {SUBNET}")
    return f"10.200.{rank // 250}.{rank % 250 + 1}"


def parse_scale(text: str | float) -> float | None:
    """``"1/200"``, ``"0.005"`` or ``"auto"`` (``None``) -> the bandwidth factor."""
    if isinstance(text, (int, float)):
        value = float(text)
    elif text.strip().lower() == "auto":
        return None
    else:
        try:
            if "/" in text:
                num, den = text.split("/", 1)
                value = float(num) / float(den)
            else:
                value = float(text)
        except (ValueError, ZeroDivisionError):
            raise ClusterSpecError(f"bad --scale {text!r}: use a fraction like 1/200, a number "
                                   "like 0.005, or auto") from None
    if not 0 < value <= 1:
        raise ClusterSpecError(f"bad --scale {text!r}: must be in (0, 1]; real clusters are "
                               "scaled down to fit this machine")
    return value


def _inter_box_rates(cluster: Cluster) -> list[float]:
    rates = [nic.bandwidth for box in cluster.boxes for nic in box.nics]
    rates += [link.bandwidth for link in cluster.links]
    return rates


def auto_scale(cluster: Cluster) -> float:
    """The largest scale at which this machine delivers every shaped rate.

    The fastest NIC or switch link becomes at most ``AUTO_TARGET_RATE`` and all ranks'
    ports together at most ``MACHINE_RATE``: above that, two shared cores cannot move
    the bytes, the fast links run below their rate and take CPU from the slow ones, and
    measured times stop matching any bandwidth model.
    """
    rates = _inter_box_rates(cluster)
    ports = [_port_rate(cluster, box, j) for box in cluster.boxes for j in range(box.gpus)]
    if not rates:  # one box: scale its fabric instead
        rates = ports
    fastest = max(rates, default=AUTO_TARGET_RATE)
    total = sum(ports) or MACHINE_RATE
    return min(1.0, AUTO_TARGET_RATE / fastest, MACHINE_RATE / total)


def _port_rate(cluster: Cluster, box: Box, local: int) -> float:
    """The rate of rank ``box.first_rank + local``'s own port in the testbed."""
    if box.gpus > 1:
        return _gpu_rate(box, local)
    nic = _merged_nic(cluster, box)
    return nic[1] if nic is not None else 0.0


def scale_cluster(cluster: Cluster, scale: float) -> Cluster:
    """The cluster with every bandwidth multiplied by ``scale`` (latencies kept).

    This is the cluster the testbed emulates, hence the one to simulate for predictions.
    """
    def box(b: Box) -> Box:
        fabric = None if b.fabric is None else Fabric(b.fabric.bandwidth * scale, b.fabric.latency)
        links = tuple(GpuLink(l.a, l.b, l.bandwidth * scale, l.latency) for l in b.gpu_links)
        nics = tuple(Nic(n.switch, n.bandwidth * scale, n.latency, n.gpus) for n in b.nics)
        return dataclasses.replace(b, fabric=fabric, gpu_links=links, nics=nics)

    return Cluster(name=f"{cluster.name}@{scale:g}", boxes=tuple(box(b) for b in cluster.boxes),
                   switches=cluster.switches,
                   links=tuple(SwitchLink(l.a, l.b, l.bandwidth * scale, l.latency)
                               for l in cluster.links),
                   source=cluster.source)


def _gpu_rate(box: Box, local: int) -> float:
    """What one GPU can send into the rest of its box."""
    if box.fabric is not None:
        return box.fabric.bandwidth
    return sum(l.bandwidth for l in box.gpu_links if local in (l.a, l.b))


def _shaped(rate: float, notes: list[str], what: str) -> float | None:
    if rate > MAX_SHAPED_RATE:
        notes.append(f"{what}: {rate * 8 / 1e9:.1f} Gbit/s after scaling is above what this "
                     f"machine can shape ({MAX_SHAPED_RATE * 8 / 1e9:.0f} Gbit/s); left unshaped")
        return None
    return rate


def _latency(latency: float) -> float:
    return latency if latency >= MIN_NETEM_LATENCY else 0.0


def plan_layout(cluster: Cluster, scale: float, prefix: str | None = None) -> Layout:
    """Lay ``cluster`` out as namespaces, bridges and shaped veth pairs.

    Parameters
    ----------
    cluster : Cluster
    scale : float
        Every bandwidth is multiplied by it (``0 < scale <= 1``).
    prefix : str, optional
        Name prefix of every namespace; a fresh unique one by default.

    Returns
    -------
    Layout

    Raises
    ------
    ClusterSpecError
        When the bridges would form a loop (cyclic switch network, a box with NICs on
        two switches), naming the links involved.
    """
    prefix = prefix or new_prefix()
    core = f"{prefix}core"
    notes: list[str] = []
    bridges: list[tuple[str, str]] = []
    switch_bridge: dict[str, str] = {}
    for s, switch in enumerate(cluster.switches):
        switch_bridge[switch] = f"s{s}"
        bridges.append((f"s{s}", f"switch {switch}"))

    tree = nx.MultiGraph()  # bridges and ranks; must stay a forest (no L2 loops)
    tree.add_nodes_from(switch_bridge.values())
    rank_ns = tuple(f"{prefix}r{r}" for r in range(cluster.nranks))
    veths: list[Veth] = []
    for b, box in enumerate(cluster.boxes):
        nic = _merged_nic(cluster, box)
        if box.gpus == 1:
            r = box.first_rank
            if nic is None:
                continue  # a one-GPU, one-box cluster: nothing to join
            switch, bandwidth, latency = nic
            veths.append(Veth(rank_ns[r], "eth0", core, f"n{b}",
                              _shaped(bandwidth * scale, notes, f"box {box.name} NIC"),
                              _latency(latency), f"box {box.name} NIC -> {switch}",
                              master_b=switch_bridge[switch]))
            tree.add_edge(f"rank{r}", switch_bridge[switch], what=f"box {box.name} NIC")
            continue
        bx = f"bx{b}"
        bridges.append((bx, f"box {box.name} fabric"))
        for j in range(box.gpus):
            r = box.first_rank + j
            rate = _gpu_rate(box, j) * scale
            latency = box.fabric.latency if box.fabric is not None else max(
                (l.latency for l in box.gpu_links if j in (l.a, l.b)), default=0.0)
            veths.append(Veth(rank_ns[r], "eth0", core, f"g{r}",
                              _shaped(rate, notes, f"box {box.name} GPU {j} in-box link"),
                              _latency(latency), f"box {box.name} GPU {j} -> fabric", master_b=bx))
            tree.add_edge(f"rank{r}", bx, what=f"box {box.name} GPU {j}")
        if box.gpu_links and box.fabric is None:
            notes.append(f"box {box.name}: NVLink mesh emulated as a bridge; each GPU gets the "
                         "sum of its NVLinks as one port")
        if nic is not None:
            switch, bandwidth, latency = nic
            veths.append(Veth(core, f"x{b}", core, f"n{b}",
                              _shaped(bandwidth * scale, notes, f"box {box.name} NIC"),
                              _latency(latency), f"box {box.name} NIC -> {switch}",
                              master_a=bx, master_b=switch_bridge[switch]))
            tree.add_edge(bx, switch_bridge[switch], what=f"box {box.name} NIC")
    for i, link in enumerate(cluster.links):
        veths.append(Veth(core, f"l{i}a", core, f"l{i}b",
                          _shaped(link.bandwidth * scale, notes, f"link {link.a}<->{link.b}"),
                          _latency(link.latency), f"link {link.a} <-> {link.b}",
                          master_a=switch_bridge[link.a], master_b=switch_bridge[link.b]))
        tree.add_edge(switch_bridge[link.a], switch_bridge[link.b], what=f"link {link.a}<->{link.b}")
    if not nx.is_forest(nx.Graph(tree)) or tree.number_of_edges() != nx.Graph(tree).number_of_edges():
        cycle = nx.cycle_basis(nx.Graph(tree))
        named = [d["what"] for u, v, d in tree.edges(data=True)
                 if cycle and u in cycle[0] and v in cycle[0]]
        raise ClusterSpecError(
            "the testbed emulates switches as Linux bridges, which need a loop-free network; "
            f"these links form a loop: {', '.join(named) or 'parallel links'}. Emulate a "
            "tree-shaped variant (one spine, one NIC switch per box)", file=cluster.source)
    return Layout(prefix=prefix, scale=scale, cluster=cluster.name, nranks=cluster.nranks,
                  core=core, rank_ns=rank_ns,
                  addresses=tuple(rank_address(r) for r in range(cluster.nranks)),
                  bridges=tuple(bridges), veths=tuple(veths), notes=tuple(notes))


def _merged_nic(cluster: Cluster, box: Box) -> tuple[str, float, float] | None:
    """(switch, bandwidth, latency) of the box's NICs merged into one, or None without NICs."""
    if not box.nics:
        return None
    switches = sorted({nic.switch for nic in box.nics})
    if len(switches) > 1:
        raise ClusterSpecError(
            f"box {box.name} has NICs on switches {switches}; the testbed's Linux bridges "
            "would loop. Emulate a variant with the box's NICs on one switch",
            file=cluster.source)
    return (switches[0], sum(n.bandwidth for n in box.nics), max(n.latency for n in box.nics))
