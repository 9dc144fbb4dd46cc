"""The cluster model: frozen dataclasses for boxes, NICs and links, and the routes data
takes between two ranks.

Build a :class:`Cluster` with :func:`topoplan.cluster.load_cluster` (the YAML spec,
docs/CLUSTER.md) or :func:`host_cluster` (one machine running every rank).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable

import networkx as nx

from .graph import box_link_graph, build_graph

__all__ = ["Fabric", "GpuLink", "Nic", "Box", "SwitchLink", "Cluster", "HostCluster",
           "host_cluster", "MAX_ROUTES", "GPU_MODELS", "FABRIC_KINDS", "PCIE_MAX_BANDWIDTH"]

MAX_ROUTES = 16  # equal-cost paths kept per GPU pair (ECMP / multi-rail spreading)

#: The GPU models a box may name (``boxes[].gpu``), oldest first: what NCCL's
#: per-architecture tables distinguish (Volta, Ampere, Hopper, Blackwell).
GPU_MODELS = ("V100", "A100", "H100", "H200", "B200")

#: What an in-box fabric is: an NVSwitch (NVLink) or a PCIe switch tree.
FABRIC_KINDS = ("nvswitch", "pcie")

#: A fabric of more than this many bytes/s per GPU each way is taken for an NVSwitch
#: when its ``kind`` is not written: a PCIe 5.0 x16 link moves at most 63 GB/s
#: (32 GT/s x 16 lanes, 128b/130b), and every NVSwitch system moves more (DGX-2's V100
#: 150 GB/s; NVIDIA's DGX and HGX datasheets).
PCIE_MAX_BANDWIDTH = 64e9


@dataclass(frozen=True, slots=True)
class Fabric:
    """An in-box switch (NVSwitch, PCIe switch): every GPU attaches at ``bandwidth``.

    ``kind`` is ``"nvswitch"`` or ``"pcie"`` (``None``: inferred, :attr:`is_nvlink`);
    ``nvls`` marks an NVSwitch that reduces and multicasts (NVLink SHARP, NVSwitch
    generation 3 and later: H100, H200, B200 systems).
    """

    bandwidth: float  # bytes/s per GPU, per direction
    latency: float  # seconds
    nvls: bool = False
    kind: str | None = None

    @property
    def is_nvlink(self) -> bool:
        """Whether the fabric is an NVSwitch: ``kind``, else NVLS or a bandwidth above
        :data:`PCIE_MAX_BANDWIDTH`."""
        if self.kind is not None:
            return self.kind == "nvswitch"
        return self.nvls or self.bandwidth > PCIE_MAX_BANDWIDTH


@dataclass(frozen=True, slots=True)
class GpuLink:
    """A direct GPU<->GPU link inside a box (NVLink); ``a``, ``b`` are box-local indexes."""

    a: int
    b: int
    bandwidth: float
    latency: float


@dataclass(frozen=True, slots=True)
class Nic:
    """A network interface: plugs into ``switch``, serves the box-local ``gpus``.

    ``plugin_latency`` (seconds) is what NCCL's network plugin reports for it
    (``ncclNetProperties_t.latency``): NCCL's tuner adds it to every step between nodes
    (docs/CLUSTER.md, docs/NCCL_MODEL.md). It moves no byte and prices no planned
    schedule; only the ``nccl`` row reads it.
    """

    switch: str
    bandwidth: float
    latency: float
    gpus: tuple[int, ...]
    plugin_latency: float = 0.0


@dataclass(frozen=True, slots=True)
class Box:
    """A host with ``gpus`` GPUs, ranks ``first_rank .. first_rank + gpus - 1``.

    ``template`` is the YAML entry's name template; boxes stamped from one entry
    share it, which is what "one box type" means to hierarchical planners. ``gpu`` is
    the GPU model (one of :data:`GPU_MODELS`) or ``None`` when the file does not say.
    """

    name: str
    gpus: int
    first_rank: int
    fabric: Fabric | None = None
    gpu_links: tuple[GpuLink, ...] = ()
    nics: tuple[Nic, ...] = ()
    template: str = ""
    gpu: str | None = None

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.gpus)

    def gpu_node(self, local: int) -> str:
        return f"{self.name}/gpu{local}"

    def nic_node(self, index: int) -> str:
        return f"{self.name}/nic{index}"

    @property
    def fabric_node(self) -> str:
        return f"{self.name}/fabric"

    def in_box_bandwidth(self) -> float:
        """What one GPU can send to the rest of its box: its fabric port plus its direct
        GPU links (NVLink, on-board PCIe switches), the most over the box's GPUs."""
        if self.gpus == 1:
            return 0.0
        fabric = self.fabric.bandwidth if self.fabric is not None else 0.0
        per_gpu = [fabric] * self.gpus
        for link in self.gpu_links:
            per_gpu[link.a] += link.bandwidth
            per_gpu[link.b] += link.bandwidth
        return max(per_gpu)

    def signature(self) -> tuple:
        """What makes two boxes interchangeable for planning (all but name and switches)."""
        return (self.gpus, self.fabric, self.gpu_links,
                tuple((n.bandwidth, n.latency, n.gpus, n.plugin_latency) for n in self.nics),
                self.gpu)


@dataclass(frozen=True, slots=True)
class SwitchLink:
    """A full-duplex switch<->switch link; parallel links are summed into one."""

    a: str
    b: str
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Cluster:
    """A cluster: switches, boxes of GPUs, and the links between them.

    Build it with :func:`load_cluster`. ``graph`` is the ``networkx.DiGraph`` the
    planners and the simulator work on; ranks are numbered in file order. ``sharp``
    names the switches that reduce in the network (InfiniBand SHARP).
    """

    name: str
    boxes: tuple[Box, ...]
    switches: tuple[str, ...] = ()
    links: tuple[SwitchLink, ...] = ()
    source: str | None = field(default=None, compare=False)
    sharp: frozenset[str] = frozenset()

    # ---- ranks -------------------------------------------------------------
    @cached_property
    def nranks(self) -> int:
        return sum(box.gpus for box in self.boxes)

    # ---- hardware that reduces ---------------------------------------------
    @cached_property
    def reducing_nodes(self) -> frozenset[str]:
        """Graph nodes that reduce or multicast data themselves: the fabrics with NVLS
        and the SHARP switches. With them, data need not reach a GPU to be summed."""
        nodes = {box.fabric_node for box in self.boxes
                 if box.fabric is not None and box.fabric.nvls}
        return frozenset(nodes | set(self.sharp))

    @cached_property
    def _rank_box(self) -> tuple[int, ...]:
        return tuple(b for b, box in enumerate(self.boxes) for _ in range(box.gpus))

    def box_of(self, rank: int) -> Box:
        """The box holding ``rank``."""
        self._check_rank(rank)
        return self.boxes[self._rank_box[rank]]

    def box_index(self, rank: int) -> int:
        self._check_rank(rank)
        return self._rank_box[rank]

    def local_index(self, rank: int) -> int:
        """The GPU index of ``rank`` inside its box."""
        return rank - self.box_of(rank).first_rank

    def gpu_node(self, rank: int) -> str:
        """The graph node of ``rank``."""
        box = self.box_of(rank)
        return box.gpu_node(rank - box.first_rank)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.nranks:
            raise IndexError(f"rank {rank} out of range(0, {self.nranks})")

    # ---- graph -------------------------------------------------------------
    @cached_property
    def graph(self) -> nx.DiGraph:
        """The topology as a DiGraph with ``bandwidth`` (bytes/s) and ``latency`` (s) on edges."""
        return build_graph(self)

    @cached_property
    def _switch_graph(self) -> nx.Graph:
        graph = nx.Graph()
        graph.add_nodes_from(self.switches)
        graph.add_edges_from((link.a, link.b) for link in self.links)
        return graph

    @cached_property
    def _route_cache(self) -> dict:
        return {}

    def routes(self, src: int, dst: int) -> tuple[tuple[str, ...], ...]:
        """The equal-cost paths data takes from rank ``src`` to rank ``dst``.

        Inside a box: the direct GPU link if there is one, else the fabric, else the
        fewest NVLink hops (relaying through GPUs). Between boxes: out through every
        NIC serving ``src``, across the fewest switch hops, in through every NIC
        serving ``dst`` (GPUs without a NIC first hop to the nearest GPU with one).
        At most ``MAX_ROUTES`` paths, in a deterministic order. Each path is a tuple
        of graph nodes from ``gpu_node(src)`` to ``gpu_node(dst)``.
        """
        key = (src, dst)
        cache = self._route_cache
        if key not in cache:
            cache[key] = self._compute_routes(src, dst)
        return cache[key]

    def route_edges(self, src: int, dst: int) -> tuple[tuple[tuple[str, str], ...], ...]:
        """``routes`` as tuples of directed edges (cached per pair, like the routes)."""
        key = ("edges", src, dst)
        cache = self._route_cache
        found = cache.get(key)
        if found is None:
            found = cache[key] = tuple(tuple(zip(path, path[1:]))
                                       for path in self.routes(src, dst))
        return found

    def route_loads(self, src: int, dst: int) -> tuple[dict[tuple[str, str], float], float]:
        """The share of a message's bytes each directed edge carries from rank ``src`` to
        rank ``dst`` (its bytes split evenly over the :meth:`routes`), and the latency of
        the slowest route (seconds); cached per pair.

        The same numbers as summing over :meth:`route_edges`, without spelling out every
        path: a route between boxes is a NIC leg out, a switch path and a NIC leg in, so
        each leg's edges are counted once per switch path they go with. On a 1024-GPU
        fat tree a planner prices some 30 k pairs of up to 16 routes each.
        """
        key = ("loads", src, dst)
        cache = self._route_cache
        found = cache.get(key)
        if found is not None:
            return found
        box_s, box_d = self.box_of(src), self.box_of(dst)
        if src == dst or box_s is box_d:
            found = cache[key] = self._loads_of_paths(self.route_edges(src, dst))
            return found
        counts: dict[tuple[str, str], int] = {}
        total, worst = 0, 0.0
        outs = self._leg_edges(box_s, src - box_s.first_rank, outbound=True)
        ins = self._leg_edges(box_d, dst - box_d.first_rank, outbound=False)
        for head, head_latency, sw_a in outs:
            for tail, tail_latency, sw_b in ins:
                if total >= MAX_ROUTES:
                    break
                take = min(len(self._switch_paths(sw_a, sw_b)), MAX_ROUTES - total)
                if not take:
                    continue  # no switch path between these two legs
                middle, middle_latency = self._middle_loads(sw_a, sw_b, take)
                for edge in head:
                    counts[edge] = counts.get(edge, 0) + take
                for edge, k in middle.items():
                    counts[edge] = counts.get(edge, 0) + k
                for edge in tail:
                    counts[edge] = counts.get(edge, 0) + take
                worst = max(worst, head_latency + middle_latency + tail_latency)
                total += take
            if total >= MAX_ROUTES:
                break
        found = cache[key] = ({edge: k / total for edge, k in counts.items()}, worst) \
            if total else ({}, 0.0)
        return found

    def _loads_of_paths(self, paths: tuple[tuple[tuple[str, str], ...], ...]
                        ) -> tuple[dict[tuple[str, str], float], float]:
        edges = self.graph.edges
        counts: dict[tuple[str, str], int] = {}
        worst = 0.0
        for path in paths:
            worst = max(worst, sum(edges[e]["latency"] for e in path))
            for edge in path:
                counts[edge] = counts.get(edge, 0) + 1
        return {edge: k / len(paths) for edge, k in counts.items()}, worst

    def _leg_edges(self, box: Box, local: int, outbound: bool
                   ) -> list[tuple[tuple[tuple[str, str], ...], float, str]]:
        """:meth:`_nic_legs` as (edges, latency, switch), the edge to or from the switch
        included; cached per GPU and direction."""
        key = ("legs", box.name, local, outbound)
        cache = self._route_cache
        if key not in cache:
            edges = self.graph.edges
            legs = []
            for path, switch in self._nic_legs(box, local, outbound):
                full = path + (switch,) if outbound else (switch,) + path
                pairs = tuple(zip(full, full[1:]))
                legs.append((pairs, sum(edges[e]["latency"] for e in pairs), switch))
            cache[key] = legs
        return cache[key]

    def _middle_loads(self, a: str, b: str, take: int) -> tuple[dict[tuple[str, str], int], float]:
        """Edge counts of the first ``take`` switch paths from ``a`` to ``b``, and the
        latency of the slowest of them; cached."""
        key = ("mid", a, b, take)
        cache = self._route_cache
        if key not in cache:
            edges = self.graph.edges
            counts: dict[tuple[str, str], int] = {}
            worst = 0.0
            for path in self._switch_paths(a, b)[:take]:
                pairs = tuple(zip(path, path[1:]))
                worst = max(worst, sum(edges[e]["latency"] for e in pairs))
                for edge in pairs:
                    counts[edge] = counts.get(edge, 0) + 1
            cache[key] = (counts, worst)
        return cache[key]

    def _compute_routes(self, src: int, dst: int) -> tuple[tuple[str, ...], ...]:
        if src == dst:
            node = self.gpu_node(src)
            return ((node,),)
        box_s, box_d = self.box_of(src), self.box_of(dst)
        ls, ld = src - box_s.first_rank, dst - box_d.first_rank
        if box_s is box_d:
            return tuple(itertools.islice(self._in_box_paths(box_s, ls, ld), MAX_ROUTES))
        paths: list[tuple[str, ...]] = []
        out_legs = self._nic_legs(box_s, ls, outbound=True)
        in_legs = self._nic_legs(box_d, ld, outbound=False)
        for (head, sw_a), (tail, sw_b) in itertools.product(out_legs, in_legs):
            for middle in self._switch_paths(sw_a, sw_b):
                paths.append(head + middle + tail)
                if len(paths) >= MAX_ROUTES:
                    return tuple(paths)
        return tuple(paths)

    def _in_box_paths(self, box: Box, a: int, b: int) -> Iterable[tuple[str, ...]]:
        if any({link.a, link.b} == {a, b} for link in box.gpu_links):
            yield (box.gpu_node(a), box.gpu_node(b))
            return
        if box.fabric is not None:
            yield (box.gpu_node(a), box.fabric_node, box.gpu_node(b))
            return
        links = box_link_graph(box)
        for path in nx.all_shortest_paths(links, a, b):
            yield tuple(box.gpu_node(j) for j in path)

    def _nic_legs(self, box: Box, local: int, outbound: bool) -> list[tuple[tuple[str, ...], str]]:
        """(path from the GPU to its NIC, switch) pairs, or reversed for inbound."""
        direct = [k for k, nic in enumerate(box.nics) if local in nic.gpus]
        legs: list[tuple[tuple[str, ...], str]] = []
        if direct:
            for k in direct:
                legs.append(((box.gpu_node(local), box.nic_node(k)), box.nics[k].switch))
        else:  # hop inside the box to the nearest GPUs that have a NIC
            candidates = sorted({g for nic in box.nics for g in nic.gpus},
                                key=lambda g: (len(next(iter(self._in_box_paths(box, local, g)))), g))
            if candidates:
                best = len(next(iter(self._in_box_paths(box, local, candidates[0]))))
                for g in candidates:
                    hop = next(iter(self._in_box_paths(box, local, g)))
                    if len(hop) > best:
                        break
                    for k, nic in enumerate(box.nics):
                        if g in nic.gpus:
                            legs.append((hop + (box.nic_node(k),), nic.switch))
        if outbound:
            return legs
        return [(tuple(reversed(path)), switch) for path, switch in legs]

    def _switch_paths(self, a: str, b: str) -> list[tuple[str, ...]]:
        cache = self._route_cache
        key = ("sw", a, b)
        if key not in cache:
            if a == b:
                cache[key] = [(a,)]
            else:
                try:
                    found = itertools.islice(nx.all_shortest_paths(self._switch_graph, a, b),
                                             MAX_ROUTES)
                    cache[key] = [tuple(p) for p in found]
                except nx.NetworkXNoPath:
                    cache[key] = []
        return cache[key]

    def scaled(self, scale: float) -> Cluster:
        """The cluster with every bandwidth multiplied by ``scale`` (latencies kept): the
        cluster the testbed emulates at that scale."""
        def box(b: Box) -> Box:
            fabric = None if b.fabric is None else Fabric(b.fabric.bandwidth * scale,
                                                          b.fabric.latency)
            links = tuple(GpuLink(l.a, l.b, l.bandwidth * scale, l.latency)
                          for l in b.gpu_links)
            nics = tuple(replace(n, bandwidth=n.bandwidth * scale) for n in b.nics)
            return replace(b, fabric=fabric, gpu_links=links, nics=nics)

        return Cluster(name=f"{self.name}@{scale:g}", boxes=tuple(box(b) for b in self.boxes),
                       switches=self.switches,
                       links=tuple(SwitchLink(l.a, l.b, l.bandwidth * scale, l.latency)
                                   for l in self.links),
                       source=self.source)

    # ---- summaries ---------------------------------------------------------
    def injection_bandwidth(self, box: Box) -> float:
        """Bytes/s a box can push into the network (sum of its NICs)."""
        return sum(nic.bandwidth for nic in box.nics)

    def gpu_bandwidth(self, rank: int) -> float:
        """Bytes/s one GPU can push out over all its edges (fabric, NVLink, NICs)."""
        node = self.gpu_node(rank)
        return sum(data["bandwidth"] for _, _, data in self.graph.out_edges(node, data=True))

    def bisection_bandwidth(self) -> float:
        """Max flow (bytes/s) from the first half of the ranks to the second half, in rank
        order; 0 for one rank."""
        n = self.nranks
        if n < 2:
            return 0.0
        graph = self.graph.copy()
        for rank in range(n):
            node = self.gpu_node(rank)
            if rank < n // 2:
                graph.add_edge("__source__", node)
            else:
                graph.add_edge(node, "__sink__")
        value, _ = nx.maximum_flow(graph, "__source__", "__sink__", capacity="bandwidth")
        return float(value)


@dataclass(frozen=True)
class HostCluster(Cluster):
    """One machine running every rank (a CPU transport on one host): a box whose fabric
    gives each rank ``bandwidth`` in and out (one core's copy rate), on ``cores`` cores.

    When more ranks work at once than the machine has cores, they take turns: the
    simulator stretches such stretches of time by ``busy ranks / cores``
    (:func:`topoplan.simulate`, "contention"). Build it with :func:`host_cluster`.
    """

    cores: int | None = None


def host_cluster(name: str, nranks: int, bandwidth: float, cores: int | None = None) -> Cluster:
    """``nranks`` ranks on one machine of ``cores`` cores (``None``: one each), each moving
    at most ``bandwidth`` bytes/s: a :class:`HostCluster`.

    Raises
    ------
    ValueError
        For a rank or core count below 1 or a bandwidth that is not positive.
    """
    if nranks < 1:
        raise ValueError(f"a host needs at least 1 rank, got {nranks}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    if cores is not None and cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores!r}")
    box = Box(name="host", gpus=int(nranks), first_rank=0, fabric=Fabric(float(bandwidth), 0.0))
    return HostCluster(name=name, boxes=(box,), source=f"<host {name}>",
                       cores=None if cores is None else int(cores))

