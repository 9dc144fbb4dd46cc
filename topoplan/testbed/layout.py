"""Cluster -> an emulated network: namespaces, shaped veth pairs and routes (pure, no root).

Every rank gets its own network namespace with a dummy interface, ``eth0``, holding its
address from ``10.200.0.0/16``; that range lives only inside the namespaces this module
names, so it can never clash with the host's network. Every other node of the cluster
graph that carries traffic (switch, in-box fabric, NIC) is a namespace of its own that
forwards packets, and every link of the graph (:attr:`Cluster.graph`) is a veth pair
between the namespaces of its two ends, shaped at both ends (each end's egress shapes
one direction) at the YAML bandwidth times ``scale``. Direct GPU links join the GPUs'
own namespaces, which forward for pairs without a link of their own, as the simulator
routes them. A node with exactly two neighbours and the same rate on both sides (a NIC
serving one GPU) is folded into one veth pair: one shaper instead of two in series.

Routes are static and follow :meth:`Cluster.routes` for every ordered pair of ranks:
each namespace on a pair's path gets a route to the destination through the next hop's
interface (no ARP: the next hop's MAC address is a permanent neighbour entry). Where a
namespace's next hop depends on the source or on which of several equal-cost paths a
packet takes, policy rules pick a table per (source, path). A pair with ``k`` equal-cost
paths has its packets spread over them in turn at the source (nftables ``numgen``
writes the path's index into the DSCP bits, and rules match on it at every hop), so
each path carries ``1/k`` of the bytes, as :func:`topoplan.simulate` splits them.
Routing has no loops to fear, so any switch network works (leaf-spine, rails).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..cluster import Box, Cluster
from ..errors import ClusterSpecError

__all__ = ["Veth", "Layout", "PairRoute", "plan_layout", "scale_cluster", "auto_scale",
           "parse_scale", "rank_address", "SUBNET", "MAX_SHAPED_RATE", "AUTO_TARGET_RATE",
           "GATEWAY", "path_tos", "PinnedCluster", "pin_routes", "emulated_cluster", "MULTIPATH"]

SUBNET = "10.200.0.0/16"
#: The next hop of every route: an address no namespace holds, resolved to the peer's
#: MAC address by a permanent neighbour entry on each interface (one per interface).
GATEWAY = "10.201.255.254"
#: Above this (bytes/s) a link is left unshaped: this machine cannot push more through
#: one veth anyway (about 17 Gbit/s in total), and shaping at such rates only adds jitter.
MAX_SHAPED_RATE = 8e9 / 8
#: ``--scale auto`` brings the fastest link between boxes to at most this rate (bytes/s)...
AUTO_TARGET_RATE = 2.5e9 / 8
#: ... and the ranks' ports (every link leaving a GPU) together to at most this
#: (bytes/s). Measured on the 2-core machine this was built on: four 2.5 Gbit/s flows
#: delivered 2.0-2.2 Gbit/s each and starved a shaped 250 Mbit/s flow beside them to
#: 200; at half those rates every flow got its shaped rate.
MACHINE_RATE = 5e9 / 8
#: Latencies below this are left out: veth + routing + TCP already cost tens of us.
MIN_NETEM_LATENCY = 20e-6
MULTIPATH = ("pin", "spray")
#: Routing table of path ``i`` of packets from rank ``r``: TABLE_BASE + r * 16 + i.
TABLE_BASE = 1000
PATHS_PER_SOURCE = 16


@dataclass(frozen=True, slots=True)
class Veth:
    """A veth pair: end ``a`` in namespace ``ns_a``, end ``b`` in ``ns_b``.

    ``rate`` is bytes/s per direction after scaling (``None``: unshaped); ``latency`` is
    the one-way delay a -> b in seconds, added with netem at end ``a`` (0: none), and
    ``latency_back`` the delay b -> a (``None``: the same). ``mac_a``/``mac_b`` are the
    ends' MAC addresses (routes name them as next hops); ``edges`` the cluster graph's
    directed edges the pair stands for, a -> b first, as ``"u>v"`` strings.
    """

    ns_a: str
    name_a: str
    ns_b: str
    name_b: str
    rate: float | None
    latency: float
    what: str  # what the pair stands for, for messages and the state file
    master_a: str | None = None  # bridge of end a (layouts of older versions)
    master_b: str | None = None
    latency_back: float | None = None
    mac_a: str | None = None
    mac_b: str | None = None
    edges: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PairRoute:
    """How packets of ``src -> dst`` cross the testbed: one entry per equal-cost path,
    each the ``(namespace, interface)`` hops that transmit it, first hop first; and the
    rate the model gives the pair alone (bytes/s, ``None`` when a hop is unshaped)."""

    src: int
    dst: int
    paths: tuple[tuple[tuple[str, str], ...], ...]
    rate: float | None


@dataclass(frozen=True)
class Layout:
    """Everything ``testbed up`` creates, in creation order."""

    prefix: str
    scale: float
    cluster: str
    nranks: int
    core: str  # namespace of every bridge in older layouts; "" in routed ones
    rank_ns: tuple[str, ...]
    addresses: tuple[str, ...]  # rank -> IPv4 address on its eth0
    bridges: tuple[tuple[str, str], ...]  # (bridge name in core, what it stands for)
    veths: tuple[Veth, ...]
    notes: tuple[str, ...] = field(default=())
    routers: tuple[tuple[str, str], ...] = ()  # (namespace, graph node it stands for)
    #: ``ip -batch`` lines per namespace: neighbours, routes, rules.
    routing: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: nftables ruleset per rank namespace that spreads packets over equal-cost paths.
    sprays: tuple[tuple[str, str], ...] = ()
    pairs: tuple[PairRoute, ...] = ()
    multipath: str = "pin"  # pairs with several equal-cost paths: "pin" or "spray"

    @property
    def namespaces(self) -> tuple[str, ...]:
        core = (self.core,) if self.core else ()
        return (*core, *(ns for ns, _ in self.routers), *self.rank_ns)

    def route(self, src: int, dst: int) -> PairRoute:
        """The :class:`PairRoute` of ``src -> dst``."""
        for pair in self.pairs:
            if pair.src == src and pair.dst == dst:
                return pair
        raise KeyError(f"no route {src} -> {dst} in this layout")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["namespaces"] = list(self.namespaces)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Layout:
        return cls(prefix=d["prefix"], scale=d["scale"], cluster=d["cluster"], nranks=d["nranks"],
                   core=d.get("core", ""), rank_ns=tuple(d["rank_ns"]),
                   addresses=tuple(d["addresses"]),
                   bridges=tuple(tuple(b) for b in d.get("bridges", ())),  # type: ignore[misc]
                   veths=tuple(Veth(**{**v, "edges": tuple(v.get("edges", ()))})
                               for v in d["veths"]),
                   notes=tuple(d.get("notes", ())),
                   routers=tuple(tuple(r) for r in d.get("routers", ())),  # type: ignore[misc]
                   routing=tuple((ns, tuple(lines)) for ns, lines in d.get("routing", ())),
                   sprays=tuple(tuple(s) for s in d.get("sprays", ())),  # type: ignore[misc]
                   pairs=tuple(PairRoute(p["src"], p["dst"],
                                         tuple(tuple(tuple(h) for h in path)
                                               for path in p["paths"]), p["rate"])
                               for p in d.get("pairs", ())),
                   multipath=d.get("multipath", "pin"))


def new_prefix() -> str:
    """A name prefix no other run uses: this process's pid plus a random tag."""
    return f"tp-{os.getpid()}-{secrets.token_hex(2)}-"


def rank_address(rank: int) -> str:
    """The IPv4 address of ``rank`` inside the emulated network (10.200.0.0/16)."""
    if not 0 <= rank < 250 * 256:
        raise ValueError(f"rank {rank} does not fit in {SUBNET}")
    return f"10.200.{rank // 250}.{rank % 250 + 1}"


def path_tos(index: int) -> int:
    """The IP TOS byte that marks equal-cost path ``index`` (its DSCP is ``index``)."""
    return index << 2


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
    ports = [_port_rate(box, j) for box in cluster.boxes for j in range(box.gpus)]
    if not rates:  # one box: scale its fabric instead
        rates = ports
    fastest = max(rates, default=AUTO_TARGET_RATE)
    total = sum(ports) or MACHINE_RATE
    return min(1.0, AUTO_TARGET_RATE / fastest, MACHINE_RATE / total)


def _port_rate(box: Box, local: int) -> float:
    """What one GPU can send into its box (fabric port or NVLinks), else through its NICs."""
    if box.gpus > 1:
        return _gpu_rate(box, local)
    return sum(nic.bandwidth for nic in box.nics)


def _gpu_rate(box: Box, local: int) -> float:
    """What one GPU can send into the rest of its box."""
    if box.fabric is not None:
        return box.fabric.bandwidth
    return sum(l.bandwidth for l in box.gpu_links if local in (l.a, l.b))


def scale_cluster(cluster: Cluster, scale: float) -> Cluster:
    """The cluster with every bandwidth multiplied by ``scale`` (latencies kept):
    :meth:`Cluster.scaled`.

    This is the cluster the testbed emulates, hence the one to simulate for predictions.
    """
    return cluster.scaled(scale)


def _shaped(rate: float, notes: list[str], what: str) -> float | None:
    if rate > MAX_SHAPED_RATE:
        notes.append(f"{what}: {rate * 8 / 1e9:.1f} Gbit/s after scaling is above what this "
                     f"machine can shape ({MAX_SHAPED_RATE * 8 / 1e9:.0f} Gbit/s); left unshaped")
        return None
    return rate


def _latency(latency: float) -> float:
    return latency if latency >= MIN_NETEM_LATENCY else 0.0


@dataclass
class _Wire:
    """An undirected link of the emulated network: graph edges a -> b and b -> a."""

    a: str
    b: str
    ab: list[tuple[str, str]]
    ba: list[tuple[str, str]]
    rate: float
    latency_ab: float
    latency_ba: float

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a


def _wires(cluster: Cluster) -> list[_Wire]:
    """The graph's links, with nodes of two neighbours and one rate folded away."""
    graph = cluster.graph
    wires: list[_Wire] = []
    for u, v, data in graph.edges(data=True):
        if u < v:
            back = graph.edges[v, u]
            wires.append(_Wire(u, v, [(u, v)], [(v, u)], data["bandwidth"], data["latency"],
                               back["latency"]))
    kinds = dict(graph.nodes(data="kind"))
    folded = True
    while folded:
        folded = False
        incident: dict[str, list[int]] = defaultdict(list)
        for i, w in enumerate(wires):
            incident[w.a].append(i)
            incident[w.b].append(i)
        for node, idx in incident.items():
            if kinds.get(node) == "gpu" or len(idx) != 2:
                continue
            w1, w2 = wires[idx[0]], wires[idx[1]]
            x, y = w1.other(node), w2.other(node)
            if x == y or abs(w1.rate - w2.rate) > 1e-9 * max(w1.rate, w2.rate):
                continue
            x_in = w1.ab if w1.a == x else w1.ba  # x -> node
            x_out = w1.ba if w1.a == x else w1.ab  # node -> x
            y_out = w2.ab if w2.a == node else w2.ba  # node -> y
            y_in = w2.ba if w2.a == node else w2.ab  # y -> node
            lat_xn = w1.latency_ab if w1.a == x else w1.latency_ba
            lat_nx = w1.latency_ba if w1.a == x else w1.latency_ab
            lat_ny = w2.latency_ab if w2.a == node else w2.latency_ba
            lat_yn = w2.latency_ba if w2.a == node else w2.latency_ab
            merged = _Wire(x, y, x_in + y_out, y_in + x_out, min(w1.rate, w2.rate),
                           lat_xn + lat_ny, lat_yn + lat_nx)
            wires = [w for i, w in enumerate(wires) if i not in idx] + [merged]
            folded = True
            break
    # A stable order: rank namespaces' links first, by the order of the graph's nodes.
    order = {node: i for i, node in enumerate(graph.nodes)}
    return sorted(wires, key=lambda w: (order[w.a], order[w.b]))


def _mac(wire: int, end: int) -> str:
    return f"02:74:70:{wire >> 8 & 0xff:02x}:{wire & 0xff:02x}:{end:02x}"


def plan_layout(cluster: Cluster, scale: float, prefix: str | None = None,
                multipath: str = "pin") -> Layout:
    """Lay ``cluster`` out as namespaces, shaped veth pairs and static routes.

    Parameters
    ----------
    cluster : Cluster
    scale : float
        Every bandwidth is multiplied by it (``0 < scale <= 1``).
    prefix : str, optional
        Name prefix of every namespace; a fresh unique one by default.
    multipath : {"pin", "spray"}
        Pairs with several equal-cost paths: ``pin`` routes each over its first path
        (:func:`pin_routes` gives the cluster to simulate for it); ``spray`` gives their
        packets to every path in turn, as the simulator splits their bytes. Measured
        here, TCP over sprayed paths reorders badly once the paths' queues differ
        (thousands of spurious retransmissions, flows at 0.6-0.9 of their share under
        load), so ``pin`` is the default.

    Returns
    -------
    Layout

    Raises
    ------
    ClusterSpecError
        When some pair of ranks has no route, or more equal-cost paths than the DSCP
        marks can tell apart.
    """
    if multipath not in MULTIPATH:
        raise ValueError(f"multipath must be one of {MULTIPATH}, got {multipath!r}")
    prefix = prefix or new_prefix()
    notes: list[str] = []
    graph = cluster.graph
    several = 0
    n = cluster.nranks
    rank_ns = tuple(f"{prefix}r{r}" for r in range(n))
    addresses = tuple(rank_address(r) for r in range(n))
    wires = _wires(cluster)
    used = {w.a for w in wires} | {w.b for w in wires}
    ns_of: dict[str, str] = {cluster.gpu_node(r): rank_ns[r] for r in range(n)}
    routers: list[tuple[str, str]] = []
    for node in graph.nodes:
        if node not in ns_of and node in used:
            ns_of[node] = f"{prefix}n{len(routers)}"
            routers.append((ns_of[node], node))

    veths: list[Veth] = []
    # (namespace, interface) that transmits each directed graph edge, and the end's MAC.
    tx: dict[tuple[str, str], tuple[str, str]] = {}
    peer_mac: dict[tuple[str, str], str] = {}
    for i, w in enumerate(wires):
        ns_a, ns_b, name_a, name_b = ns_of[w.a], ns_of[w.b], f"a{i}", f"b{i}"
        what = " - ".join(_describe(graph, node) for node in (w.a, w.b))
        rate = _shaped(w.rate * scale, notes, what)
        veths.append(Veth(ns_a, name_a, ns_b, name_b, rate, _latency(w.latency_ab), what,
                          latency_back=_latency(w.latency_ba), mac_a=_mac(i, 0), mac_b=_mac(i, 1),
                          edges=tuple(f"{u}>{v}" for u, v in (*w.ab, *w.ba))))
        for e in w.ab:
            tx[e] = (ns_a, name_a)
        for e in w.ba:
            tx[e] = (ns_b, name_b)
        peer_mac[(ns_a, name_a)] = _mac(i, 1)
        peer_mac[(ns_b, name_b)] = _mac(i, 0)

    # Next hops: namespace -> destination -> {(source, path index): interface}.
    hops: dict[str, dict[int, dict[tuple[int, int], str]]] = defaultdict(lambda: defaultdict(dict))
    pairs: list[PairRoute] = []
    sprays: dict[int, list[tuple[int, int]]] = defaultdict(list)  # src -> [(dst, k)]
    rate_of = {(v.ns_a, v.name_a): v.rate for v in veths} | {(v.ns_b, v.name_b): v.rate
                                                              for v in veths}
    for s in range(n):
        for d in range(n):
            if s == d:
                continue
            paths = cluster.route_edges(s, d)
            if not paths:
                raise ClusterSpecError(f"no route from rank {s} to rank {d} in cluster "
                                       f"{cluster.name!r}", file=cluster.source)
            if len(paths) > PATHS_PER_SOURCE:
                raise ClusterSpecError(
                    f"ranks {s} -> {d} have {len(paths)} equal-cost paths; the testbed tells "
                    f"at most {PATHS_PER_SOURCE} apart", file=cluster.source)
            if len(paths) > 1:
                several += 1
                if multipath == "pin":
                    paths = paths[:1]
                else:
                    sprays[s].append((d, len(paths)))
            wire_paths = []
            for i, path in enumerate(paths):
                ends: list[tuple[str, str]] = []
                for e in path:
                    end = tx[e]
                    if not ends or ends[-1] != end:
                        ends.append(end)
                for ns, dev in ends:
                    hops[ns][d][(s, i)] = dev
                wire_paths.append(tuple(ends))
            pairs.append(PairRoute(s, d, tuple(wire_paths), _pair_rate(wire_paths, rate_of)))

    routing: list[tuple[str, tuple[str, ...]]] = []
    for ns in (*(ns for ns, _ in routers), *rank_ns):
        if ns not in hops:
            continue
        lines = [f"neighbour replace {GATEWAY} lladdr {peer_mac[key]} dev {key[1]} "
                 "nud permanent" for key in sorted(peer_mac) if key[0] == ns]
        own = rank_ns.index(ns) if ns in rank_ns else None
        src = f" src {addresses[own]}" if own is not None else ""
        tables: set[tuple[int, int]] = set()
        for d, by in sorted(hops[ns].items()):
            nexts = set(by.values())
            if len(nexts) == 1:  # the same next hop for every source and path
                lines.append(f"route replace {addresses[d]}/32 via {GATEWAY} dev "
                             f"{nexts.pop()} onlink{src}")
                continue
            # Main table: the first path of this namespace's own traffic, or any.
            default = by.get((own, 0), next(iter(by.values()))) if own is not None else None
            if default is not None:
                lines.append(f"route replace {addresses[d]}/32 via {GATEWAY} dev {default} "
                             f"onlink{src}")
            for (s, i), dev in sorted(by.items()):
                table = TABLE_BASE + s * PATHS_PER_SOURCE + i
                tables.add((s, i))
                lines.append(f"route replace {addresses[d]}/32 via {GATEWAY} dev {dev} onlink"
                             f"{src if s == own else ''} table {table}")
        for s, i in sorted(tables):
            table = TABLE_BASE + s * PATHS_PER_SOURCE + i
            # Marked paths first: the rule of path 0 (any TOS) would take them all.
            tos = f" tos 0x{path_tos(i):02x}" if i else ""
            lines.append(f"rule add from {addresses[s]}/32{tos} table {table} "
                         f"pref {100 if i else 200}")
        routing.append((ns, tuple(lines)))

    spray_rules = [(rank_ns[s], _spray_ruleset([(addresses[d], k) for d, k in targets]))
                   for s, targets in sorted(sprays.items())]
    if several and multipath == "spray":
        notes.append(f"{several} ordered pairs have several equal-cost paths; their packets "
                     "take them in turn (nftables), as the simulator splits their bytes")
    elif several:
        notes.append(f"{several} ordered pairs have several equal-cost paths; each is routed "
                     "over the first, and predictions simulate the same routes "
                     "(--multipath spray spreads them, at a cost in TCP reordering)")
    return Layout(prefix=prefix, scale=scale, cluster=cluster.name, nranks=n, core="",
                  rank_ns=rank_ns, addresses=addresses, bridges=(), veths=tuple(veths),
                  notes=tuple(notes), routers=tuple(routers), routing=tuple(routing),
                  sprays=tuple(spray_rules), pairs=tuple(pairs), multipath=multipath)


@dataclass(frozen=True)
class PinnedCluster(Cluster):
    """A cluster whose pairs of ranks take only the first of their equal-cost paths:
    what a testbed built with ``multipath="pin"`` does, hence what to simulate for it."""

    def _compute_routes(self, src: int, dst: int) -> tuple[tuple[str, ...], ...]:
        return Cluster._compute_routes(self, src, dst)[:1]


def pin_routes(cluster: Cluster) -> Cluster:
    """``cluster`` with every pair pinned to its first equal-cost path (:class:`PinnedCluster`)."""
    return PinnedCluster(name=cluster.name, boxes=cluster.boxes, switches=cluster.switches,
                         links=cluster.links, source=cluster.source)


def emulated_cluster(cluster: Cluster, layout: Layout) -> Cluster:
    """The cluster a testbed of ``layout`` emulates: scaled, and pinned if its routes are."""
    scaled = scale_cluster(cluster, layout.scale)
    return pin_routes(scaled) if layout.multipath == "pin" else scaled


def _spray_ruleset(targets: list[tuple[str, int]]) -> str:
    """nftables rules that give each packet to ``address`` path ``i`` of ``k`` in turn.

    One ``numgen`` counter per destination picks the path; chain ``p<i>`` writes ``i`` into
    the DSCP bits, and the route hook routes the packet again on the new TOS.
    """
    paths = max(k for _, k in targets)
    chains = "".join(f"  chain p{i} {{\n    ip dscp set {i}\n  }}\n" for i in range(1, paths))
    rules = "".join(
        f"    ip daddr {address} numgen inc mod {k} vmap {{ 0 : accept, "
        + ", ".join(f"{i} : jump p{i}" for i in range(1, k)) + " }\n"
        for address, k in targets)
    return ("table ip topoplan {\n" + chains + "  chain spread {\n"
            "    type route hook output priority mangle; policy accept;\n" + rules + "  }\n}\n")


def _pair_rate(paths: list[tuple[tuple[str, str], ...]],
               rate_of: dict[tuple[str, str], float | None]) -> float | None:
    """Bytes/s of a pair alone, its bytes split evenly over its paths (the simulator's
    model): the interface with the most bytes per unit of rate sets the pace."""
    share: dict[tuple[str, str], float] = defaultdict(float)
    for path in paths:
        for hop in path:
            share[hop] += 1 / len(paths)
    worst = 0.0
    for hop, s in share.items():
        rate = rate_of[hop]
        if rate is None:
            continue
        worst = max(worst, s / rate)
    return 1 / worst if worst else None


def _describe(graph: Any, node: str) -> str:
    data = graph.nodes[node]
    if data.get("kind") == "gpu":
        return f"rank {data['rank']} ({node})"
    return f"{data.get('kind', 'node')} {node}"
