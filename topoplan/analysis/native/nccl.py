"""What NCCL itself runs on a cluster, and how long it takes there: the ``nccl`` row.

NCCL chooses, per collective and size, an algorithm (Ring, Tree, NVLS, NVLSTree,
CollNetDirect, CollNetChain, PAT), a protocol (LL, LL128, Simple) and a number of
channels, by pricing every pair with its tuner's model, ``time = latency + bytes /
bandwidth`` (``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``;
``src/enqueue.cc``, ``topoGetAlgoInfo``). :class:`NcclModel` builds the same tables
from the same constants (:mod:`~topoplan.analysis.native.nccl_tables`) on the channels NCCL's
topology search would build on each box (:mod:`~topoplan.analysis.native.nccl_search`), and
picks the same way.

NCCL does not see the network between its nodes (NVIDIA/nccl issues 1933 and 1545):
its nodes are in rank order, each channel uses one NIC, and its tuner prices the
network as the NICs' speed. The model therefore prices NCCL's choice twice:

- **NCCL's own estimate** (:attr:`NcclChoice.tuner_time_s`), what its tuner believes;
- **on the real fabric** (:attr:`NcclChoice.time_s`): the chosen algorithm's traffic
  (every channel's ring through every box in rank order, the double binary tree
  between the nodes, the NVLS heads, SHARP's aggregation tree) is laid on the
  cluster's links, and the busiest link's bytes over its bandwidth bound the time
  from below: ``time = latency + max(bytes / bandwidth, busiest link)``. On a
  non-blocking fabric the two agree; behind an oversubscribed uplink or across a
  spine, the link wins, as it does for NCCL.

**A group of ranks** (a native step of a composed plan, IR v3) is priced as NCCL prices a
communicator of those ranks alone (:func:`nccl_group_time`, on
:func:`~topoplan.analysis.native.clusters.group_cluster`): the group's GPUs, their boxes'
NICs that serve them, the fabric between the boxes; the group's boxes are NCCL's nodes in
the order the group first names them. :meth:`NcclModel.edge_loads` gives the bytes the
chosen algorithm lays on every link (:mod:`~topoplan.analysis.native.loads`), so that the
simulator can share those links with other traffic.

Path latencies and the cost profile's alphas are not used: NCCL's latency terms are
its own (``hwLatencies``). Constants come from NCCL's source and the hardware's
datasheets only; docs/NCCL_MODEL.md compares the predictions with published
nccl-tests figures that set nothing here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable

from ..._compat import moved_names
from ..._util import ObjectCache
from . import clusters, nccl_env, nccl_tables as T
from .loads import LinkLoads, sharp_root
from .nccl_search import BoxView, Graph, box_view, search_collnet_direct, search_nvls, \
    search_ring, search_tree

if TYPE_CHECKING:
    from ...cluster import Cluster
    from .clusters import GroupCluster

__all__ = ["NcclModel", "NcclChoice", "nccl_model", "nccl_time", "nccl_group_time",
           "COLLECTIVES", "ROOTED"]

#: The clusters NCCL moves bytes on (the runtime cluster, a group's sub-cluster) have a
#: module of their own, as have the link loads.
__getattr__ = moved_names(__name__, {
    name: "topoplan.analysis.native.clusters"
    for name in ("runtime_cluster", "nccl_links", "gpu_model", "group_cluster", "GroupCluster",
                 "DEFAULT_GPU")})

#: The collectives the model prices (topoplan's names; NCCL's AllReduce, ReduceScatter,
#: AllGather, Broadcast, Reduce).
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
#: The rooted ones: NCCL runs them as rings only (tuning.cc: ``if ((coll ==
#: ncclFuncBroadcast || coll == ncclFuncReduce) && a != NCCL_ALGO_RING) continue;``).
ROOTED = ("broadcast", "reduce")

_WIRE = (2.0, 128.0 / 120.0, 1.0)  # bytes on the wire per byte of data: LL, LL128, Simple


def _log2i(n: int) -> int:
    """NCCL's log2i: floor(log2(n)), -1 for n < 1."""
    return n.bit_length() - 1 if n >= 1 else -1


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's choice for one collective and size, and its time on the cluster.

    Attributes
    ----------
    collective : str
    size : int
        Bytes of the buffer (an allreduce's, a reduce-scatter's input, an allgather's
        output), as nccl-tests counts them.
    nranks : int
    algorithm, protocol : str
        NCCL's names: ``Ring``, ``Tree``, ``NVLS``, ``NVLSTree``, ``CollNetDirect``,
        ``CollNetChain``, ``PAT``; ``LL``, ``LL128``, ``Simple``.
    channels : int
        Channels (CTAs) NCCL runs it on at this size.
    time_s : float
        The model's prediction on the cluster.
    tuner_time_s : float
        NCCL's own estimate (what its tuner compared).
    latency_s : float
        The latency term of both.
    fabric_s : float
        The busiest link's bytes over its bandwidth; 0 when nothing crosses a link.
    bottleneck : str
        That link, ``"u -> v"`` (empty when none).
    """

    collective: str
    size: int
    nranks: int
    algorithm: str
    protocol: str
    channels: int
    time_s: float
    tuner_time_s: float
    latency_s: float
    fabric_s: float
    bottleneck: str
    #: The NCCL version whose tables priced it, and what it was forced with
    #: (``NCCL_ALGO=ring``; empty when NCCL chose).
    version: str = T.DEFAULT_VERSION
    forced: str = ""

    @property
    def algbw(self) -> float:
        """``size / time_s`` (bytes/s)."""
        return self.size / self.time_s if self.time_s > 0 else math.inf

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth: algbw x 2(n-1)/n (allreduce), (n-1)/n
        (reduce-scatter, allgather) or 1 (broadcast, reduce)."""
        n = self.nranks
        if self.collective in ROOTED:
            return self.algbw
        factor = 2 * (n - 1) / n if self.collective == "allreduce" else (n - 1) / n
        return self.algbw * factor

    @property
    def fabric_bound(self) -> bool:
        """Whether the cluster's links, not NCCL's own speeds, set the time."""
        return self.fabric_s > self.tuner_time_s - self.latency_s + 1e-15

    @property
    def limited_by(self) -> str:
        """What sets the time: ``latency`` (at least half of it), else ``fabric`` (the
        busiest link) or ``nccl`` (NCCL's own speeds)."""
        if self.latency_s >= 0.5 * self.time_s:
            return "latency"
        return "fabric" if self.fabric_bound else "nccl"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``algorithm`` is ``"nccl"``; NCCL's is ``nccl_algorithm``)."""
        return {"algorithm": "nccl", "nccl_algorithm": self.algorithm,
                "protocol": self.protocol, "channels": self.channels,
                "time_s": self.time_s, "tuner_time_s": self.tuner_time_s,
                "algbw_GBps": self.algbw / 1e9, "busbw_GBps": self.busbw / 1e9,
                "fabric_bound": self.fabric_bound, "limited_by": self.limited_by,
                "bottleneck": self.bottleneck, "nccl_version": self.version,
                "nccl_forced": self.forced}

    def label(self) -> str:
        """``NVLS/Simple x16``."""
        return f"{self.algorithm}/{self.protocol} x{self.channels}"


@dataclass(frozen=True)
class _Graphs:
    """The cluster-wide graphs (the minimum over the boxes, as NCCL's ranks agree)."""

    channels: int
    bw_intra: float
    bw_inter: float
    nvlink: bool


class NcclModel:
    """NCCL on ``cluster``: its search, its tuner, its choice, and their time there.

    Parameters
    ----------
    cluster : Cluster
        Ranks in file order are NCCL's ranks; boxes are NCCL's nodes in that order.
        ``boxes[].gpu`` picks the per-architecture tables (default
        :data:`~topoplan.analysis.native.clusters.DEFAULT_GPU`), ``fabric.nvls`` enables
        NVLS and NVLSTree, ``switches[].sharp`` CollNet (SHARP; NCCL needs
        ``NCCL_COLLNET_ENABLE=1`` and the SHARP plugin for it).

    Notes
    -----
    Building the model runs the search once per kind of box; pricing a size is a few
    table look-ups plus, once per algorithm and channel count, a pass over the
    traffic of every channel (cached).
    """

    def __init__(self, cluster: Cluster, version: str | None = None, algo: str | None = None,
                 proto: str | None = None) -> None:
        self.cluster = cluster
        #: The tables of the NCCL version followed (:func:`nccl_tables.constants`).
        self.k = k = T.constants(version)
        self.version = k.version
        #: What the model is forced with, as NCCL_ALGO / NCCL_PROTO (:mod:`.nccl_env`).
        self.settings = nccl_env.NcclSettings(k.version, algo, proto)
        self._algo_mask, self._proto_mask = self.settings.masks()
        self.nranks = cluster.nranks
        self.nnodes = len(cluster.boxes)
        self.ppn = self.nranks / self.nnodes
        models = [clusters.gpu_model(box) for box in cluster.boxes]
        self.assumed_gpu = any(box.gpu is None for box in cluster.boxes)
        caps = [T.COMPCAP[m] for m in models]
        self.min_cc, self.max_cc = min(caps), max(caps)
        inter = self.nnodes > 1
        self._views: list[BoxView] = []
        found: dict[tuple, tuple[BoxView, dict[str, Graph]]] = {}
        self._box_graphs: list[dict[str, Graph]] = []
        # Boxes of one kind carry the same traffic inside: only the first of each kind
        # (its representative) has its in-box loads counted.
        self._representative: list[bool] = []
        for box, model in zip(cluster.boxes, models):
            key = (box.signature(), model)
            self._representative.append(key not in found)
            if key not in found:
                view = box_view(box, T.COMPCAP[model], count=box.gpu is not None)
                ring_graph = search_ring(view, inter, tables=k)
                tree_graph = search_tree(view, inter, ring_graph, tables=k)
                graphs = {"ring": ring_graph, "tree": tree_graph,
                          "nvls": search_nvls(view, inter, tables=k),
                          "collnet_direct": search_collnet_direct(view, tables=k) if inter else
                          Graph("none", 0, 0.0, 0.0, False)}
                found[key] = (view, graphs)
            view, graphs = found[key]
            self._views.append(view)
            self._box_graphs.append(graphs)
        self.graphs = {name: self._combine(name) for name in ("ring", "tree", "nvls",
                                                               "collnet_direct")}
        # init.cc: comm->nChannels = min(tree, ring) channels, doubled by connect.cc
        # (ncclTopoPostset), and doubled again on Hopper+ between nodes above 45 GB/s.
        ring = self.graphs["ring"]
        channels = min(ring.channels, self.graphs["tree"].channels or ring.channels)
        channels = min(T.MAXCHANNELS, 2 * channels)
        if self.min_cc >= 90 and self.nnodes > 1 and ring.bw_intra > 45.0 and channels < 16:
            channels *= 2
        self.comm_channels = max(1, channels)
        self.nvls_support = (self.min_cc >= 90 and self.graphs["nvls"].channels >= 2
                             and all(v.nvls for v in self._views))
        self.collnet_support = inter and sharp_root(cluster) is not None
        # The network plugin's latency (us): ncclNetProperties_t.latency, which the search
        # keeps as graph->latencyInter (search.cc:745) and the tuner adds to every
        # inter-node step, twice for Simple ("the flush extra latency", tuning.cc:389-391).
        # 0 for NCCL's own IB and socket transports; the cluster file's NIC
        # ``plugin_latency`` (docs/CLUSTER.md).
        self.net_latency_us = max((nic.plugin_latency * 1e6
                                   for box in cluster.boxes for nic in box.nics),
                                  default=0.0) if inter else 0.0
        # init.cc:1447: comm->maxTreePattern, the highest tree pattern of any node; the
        # tuner takes 15% off the Tree's bandwidth when it is the plain TREE (tuning.cc:336).
        self.max_tree_pattern = ("tree" if any(g["tree"].pattern == "tree"
                                               for g in self._box_graphs) else "balanced_tree")
        self.nvs = all(v.intra == "nvswitch" for v in self._views)
        # search.cc tries channels that repeat one GPU order first (sameChannels); the
        # model's ring channels do where each box's orders are one cycle (rotations
        # included: on an NVSwitch the start is the model's own choice) and, between
        # nodes, leave by one NIC.
        self.same_channels = all(_one_cycle(g["ring"], inter) for g in self._box_graphs)
        self._tables: dict[str, tuple[list[list[float]], list[list[float]]]] = {}
        self._unit: dict[tuple[str, int, int], tuple[float, str]] = {}
        self._totals: dict[tuple[str, int, int], dict[tuple[str, str], float]] = {}

    # ---- graphs --------------------------------------------------------------
    def _combine(self, name: str) -> _Graphs:
        graphs = [g[name] for g in self._box_graphs]
        if any(g.empty for g in graphs):
            return _Graphs(0, 0.0, 0.0, False)
        return _Graphs(min(g.channels for g in graphs), min(g.bw_intra for g in graphs),
                       min(g.bw_inter for g in graphs), all(g.nvlink for g in graphs))

    # ---- the tuner -------------------------------------------------------------
    def _enabled(self, coll: str, a: int, p: int) -> bool:
        if self._algo_mask is not None and self._algo_mask[coll][a] == nccl_env.OFF:
            return False
        proto = nccl_env.DEFAULT if self._proto_mask is None else self._proto_mask[coll][p]
        if proto == nccl_env.OFF:
            return False
        if coll in ROOTED and a != T.RING:
            return False
        sharded = coll != "allreduce"
        if sharded and a not in (T.PAT, T.RING, T.NVLS, T.COLLNET_DIRECT):
            return False
        if not sharded and a == T.PAT:
            return False
        if a in (T.NVLS, T.NVLS_TREE) and p != T.SIMPLE:
            return False
        if a == T.PAT and (p != T.SIMPLE or self.nnodes != self.nranks or self.min_cc < 60):
            return False
        if a in (T.COLLNET_DIRECT, T.COLLNET_CHAIN) and (p != T.SIMPLE
                                                         or not self.collnet_support):
            # tuning.cc:338-339: CollNet Direct and Chain with LL or LL128: "Not used".
            return False
        if a == T.COLLNET_DIRECT and not self.nvs:
            return False
        if a == T.NVLS_TREE and (self.nnodes == 1 or not self.nvls_support):
            return False
        if a == T.NVLS and (not self.nvls_support or (self.nnodes > 1
                                                      and not self.collnet_support)):
            return False
        if a in (T.COLLNET_DIRECT, T.COLLNET_CHAIN) and self.ppn > T.DIRECT_MAX_ARITY + 1:
            return False
        if p == T.LL128 and proto == nccl_env.DEFAULT:
            # tuning.cc: LL128 only over NVLink inside the boxes (or one GPU each), with
            # one compute capability or Hopper and later.
            intra_ok = all(v.nvlink or v.gpus == 1 for v in self._views)
            if not intra_ok or not (self.min_cc == self.max_cc or self.min_cc >= 90):
                return False
            if self.min_cc < 70:
                return False
        return True

    def _graph_for(self, a: int) -> _Graphs:
        if a in (T.RING, T.PAT):
            return self.graphs["ring"]
        if a in (T.TREE, T.COLLNET_CHAIN):
            return self.graphs["tree"]
        if a in (T.NVLS, T.NVLS_TREE):
            return self.graphs["nvls"]
        return self.graphs["collnet_direct"]

    def tables(self, collective: str) -> tuple[list[list[float]], list[list[float]]]:
        """NCCL's ``bandwidths`` (GB/s, algorithm bandwidth; 0 = not available) and
        ``latencies`` (us) for ``collective``, indexed ``[algorithm][protocol]`` as
        :mod:`~topoplan.analysis.native.nccl_tables` numbers them (``ncclTopoTuneModel``)."""
        if collective in self._tables:
            return self._tables[collective]
        _check_collective(collective)
        n, nodes, ppn = self.nranks, self.nnodes, self.ppn
        cci = T.compcap_index(self.min_cc)
        index2 = nodes - 1 if nodes <= 2 else 2
        index1 = cci if nodes == 1 else 0  # between nodes: Intel CPUs assumed
        ll_max = self.k.ll_max_bw[index1][index2]
        per_tree = self.k.per_ch_max_tree_bw[cci][index2]
        per_ring_ll128 = self.k.per_ch_max_ring_ll128_bw[cci][index2]
        per_tree_ll128 = self.k.per_ch_max_tree_ll128_bw[cci][index2]
        per_nvls_tree = self.k.per_ch_max_nvls_tree_bw[cci][index2]
        allreduce = collective == "allreduce"
        rooted = collective in ROOTED
        # tuning.cc: nsteps = 2 (n - 1) for AllReduce, n - 1 for ReduceScatter and
        # AllGather, n for Broadcast and Reduce.
        nsteps = 2 * (n - 1) if allreduce else n if rooted else n - 1
        bws = [[0.0] * 3 for _ in T.ALGORITHMS]
        lats = [[0.0] * 3 for _ in T.ALGORITHMS]
        for a in T.ALGORITHMS:
            graph = self._graph_for(a)
            if graph.channels == 0:
                continue
            intra_hw = T.HW_NVLINK if graph.nvlink else T.HW_PCI
            for p in T.PROTOCOLS:
                if not self._enabled(collective, a, p):
                    continue
                collnet = a in (T.COLLNET_DIRECT, T.COLLNET_CHAIN)
                bw = graph.bw_intra if nodes <= 2 or collnet else graph.bw_inter
                if a in (T.NVLS, T.NVLS_TREE) and self.k.nvls_bw == "min":
                    # 2.27 (tuning.cc:266-274): no efficiency, no 2-channel minimum.
                    if a == T.NVLS:
                        bw = (min(graph.bw_intra, graph.bw_inter) if allreduce else
                              min(graph.bw_intra * (ppn - 1) / ppn, graph.bw_inter * 0.9))
                    else:
                        bw = min(graph.bw_intra,
                                 graph.bw_inter if nodes <= 2 else graph.bw_inter / 2)
                elif a in (T.NVLS, T.NVLS_TREE):
                    if graph.channels < 2:
                        continue
                    intra_bw = (graph.bw_intra * T.NVLS_EFFICIENCY[cci]
                                * (graph.channels - 1) / graph.channels)
                    intra_bw *= 2.0 if allreduce else (ppn - 1) / ppn
                    inter_bw = graph.bw_inter * (2 if nodes <= 2 and a == T.NVLS_TREE else 1)
                    bw = min(intra_bw, inter_bw, per_nvls_tree if a == T.NVLS_TREE else math.inf)
                bus = graph.channels * bw
                if a == T.RING and p == T.LL:
                    bus = min(ll_max, bus * 0.5)
                if a == T.RING and p == T.LL128:
                    bus = min(bus * 0.92, graph.channels * per_ring_ll128)
                if a == T.TREE and allreduce:
                    bus = min(bus * 0.92, graph.channels * per_tree)
                if a == T.TREE and p == T.LL:
                    bus = min(bus / 3.8, ll_max)
                if a == T.TREE and p == T.LL128:
                    bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0),
                              graph.channels * per_tree_ll128)
                if a == T.TREE and self.max_tree_pattern == "tree":
                    bus *= 0.85  # tuning.cc:336
                if a == T.PAT:
                    bus *= 0.75
                if a == T.COLLNET_DIRECT:
                    if not allreduce:
                        bus = 0.0  # needs the CollNet plugin's iallgather/ireducescatter
                    else:
                        factor = ppn / graph.channels
                        factor -= (factor - 1) / 2
                        bus /= factor
                        if self.min_cc >= 90:
                            bus *= 0.85
                if a == T.NVLS and not allreduce and nodes > 1:
                    bus = 0.0
                if not (a != T.RING and not allreduce):
                    bus *= (n / nsteps) if a in (T.RING, T.NVLS, T.NVLS_TREE) else 0.5
                bws[a][p] = bus
                lat = self.k.base_latency[a][p]
                intra_lat = self.k.hw_latency[intra_hw][a][p]
                inter_lat = (self.k.hw_latency[T.HW_NET][T.TREE][p] if ppn == 1
                             else self.k.hw_latency[T.HW_NET][a][p])
                inter_lat += self.net_latency_us * (2 if p == T.SIMPLE else 1)
                ippn = n // nodes
                if a == T.RING and rooted:
                    # tuning.cc: one step's latency when the channels repeat one order,
                    # else nsteps of them ("some chunk latency"; Simple at Tree's).
                    hw = intra_hw if nodes == 1 else T.HW_NET
                    if self.same_channels:
                        lat += self.k.hw_latency[hw][T.RING][p]
                    else:
                        step_a = T.TREE if p == T.SIMPLE else T.RING
                        lat += nsteps * self.k.hw_latency[hw][step_a][p]
                elif a == T.RING:
                    overhead = 0.0
                    if nodes > 1:
                        overhead = T.NET_OVERHEAD_US * (3 if p == T.SIMPLE else 1)
                    intra_lat = max(intra_lat, overhead)
                    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if allreduce else nodes - 1)
                    lat += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat
                elif a == T.TREE:
                    if allreduce:
                        lat += 2 * ((ippn - 1) * intra_lat + _log2i(nodes) * inter_lat)
                elif a == T.COLLNET_DIRECT:
                    lat += 2 * (min(1, ippn - 1) * intra_lat + (ippn - 1) * 0.4) + inter_lat
                elif a == T.COLLNET_CHAIN:
                    lat += 2 * (ippn - 1) * intra_lat + inter_lat
                elif a == T.NVLS:
                    lat = intra_lat + (inter_lat if nodes > 1 else 0.0)
                elif a == T.NVLS_TREE:
                    lat += intra_lat + 2 * _log2i(nodes) * inter_lat
                elif a == T.PAT and not allreduce:
                    lat += _log2i(nodes) * (inter_lat / 3.5) + n * 2.8
                lats[a][p] = lat
        self._tables[collective] = (bws, lats)
        return bws, lats

    def _tuner_time(self, collective: str, a: int, p: int, nbytes: int) -> float:
        """ncclTopoGetAlgoTime (us), or -1 when the pair is not available."""
        bws, lats = self.tables(collective)
        bw, lat = bws[a][p], lats[a][p]
        if bw == 0:
            return -1.0
        log_size = _log2i(nbytes >> 6)
        allreduce = collective == "allreduce"
        if a == T.TREE and allreduce and 0 <= log_size < 23:
            bw *= T.TREE_CORRECTION[p][log_size]
        if (a == T.NVLS_TREE and allreduce and 0 <= log_size < 24 and self.min_cc >= 100
                and self.k.nvls_tree_correction):
            bw *= T.TREE_CORRECTION[p][log_size]
        if (a == T.RING and p == T.SIMPLE and self.nnodes > 1 and allreduce
                and nbytes / (self.comm_channels * self.nranks) >= 64):
            lat *= 1.9 if self.min_cc < 80 else 1.4  # the ring's plateau effect
        return lat + nbytes / (1000.0 * bw)

    def _channels(self, a: int, p: int, nbytes: int) -> int:
        """enqueue.cc topoGetAlgoInfo: fewer channels for small sizes."""
        if a in (T.NVLS, T.NVLS_TREE):
            # nvls.cc, ncclNvlsTuning: NVLS_NCHANNELS_SM90 / SM100(_NVL).
            one, many = T.NVLS_CHANNELS[100 if self.min_cc >= 100 else 90]
            nc = many if self.nnodes > 1 else one
            return min(nc, self.comm_channels) if a == T.NVLS and self.nnodes > 1 else nc
        nc = self.comm_channels
        if a == T.RING and p == T.SIMPLE:
            ring = self.graphs["ring"]
            nt = 256 if ring.bw_intra * ring.channels <= T.PCI_BW else T.MAX_NTHREADS[p]
        else:
            nt = T.MAX_NTHREADS[p]
        threshold = T.THREAD_THRESHOLD[p] * (self.nranks if a == T.RING and p == T.LL else 1)
        if a == T.COLLNET_DIRECT:
            threshold = 512
        while nbytes < nc * nt * threshold and nc >= 2:
            nc -= 1
        return nc

    # ---- the choice ----------------------------------------------------------
    def _pairs(self, collective: str, size: int) -> list[tuple[float, int, int]]:
        """(NCCL's estimate in us, algorithm, protocol) of every available pair,
        ascending: the order NCCL's tuner ranks them in."""
        out = []
        for a in T.ALGORITHMS:
            for p in T.PROTOCOLS:
                tuner = self._tuner_time(collective, a, p, size)
                if tuner >= 0:
                    out.append((tuner, a, p))
        out.sort()
        return out

    def candidates(self, collective: str, size: int) -> list[NcclChoice]:
        """Every algorithm and protocol NCCL could run, NCCL's estimate ascending, each
        with its time on the cluster."""
        _check_collective(collective)
        size = int(size)
        if self.nranks == 1:
            return [NcclChoice(collective, size, 1, "Ring", "Simple", 1, 0.0, 0.0, 0.0, 0.0, "",
                               self.version, self.settings.forced)]
        return [self._price(collective, a, p, size, t) for t, a, p in self._pairs(collective, size)]

    def choose(self, collective: str, size: int) -> NcclChoice:
        """What NCCL runs for ``collective`` of ``size`` bytes (its tuner's fastest), and
        its time on the cluster."""
        _check_collective(collective)
        size = int(size)
        if self.nranks == 1:
            return self.candidates(collective, size)[0]
        pairs = self._pairs(collective, size)
        if not pairs:
            forced = self.settings.forced
            raise ValueError(f"NCCL has no algorithm for {collective} on {self.cluster.name!r}"
                             + (f" with {forced}" if forced else ""))
        tuner, a, p = pairs[0]
        return self._price(collective, a, p, size, tuner)

    def best(self, collective: str, size: int, margin: float = 0.01) -> NcclChoice:
        """The algorithm and protocol fastest on the real fabric (what NCCL would run if
        told: ``NCCL_ALGO``, ``NCCL_PROTO`` or a tuner plugin): NCCL's own choice
        unless another is faster by more than ``margin`` (relative)."""
        found = self.candidates(collective, size)
        own = found[0]
        fastest = min(found, key=lambda c: (c.time_s, c.tuner_time_s))
        return fastest if fastest.time_s < own.time_s * (1 - margin) else own

    def _price(self, collective: str, a: int, p: int, size: int, tuner_us: float) -> NcclChoice:
        bws, lats = self.tables(collective)
        lat_us = lats[a][p]
        if (a == T.RING and p == T.SIMPLE and self.nnodes > 1 and collective == "allreduce"
                and size / (self.comm_channels * self.nranks) >= 64):
            lat_us *= 1.9 if self.min_cc < 80 else 1.4
        channels = self._channels(a, p, size)
        unit, where = self._fabric_unit(collective, a, channels)
        fabric = size * unit * _WIRE[p]
        tuner = tuner_us * 1e-6
        lat = lat_us * 1e-6
        time = max(tuner, lat + fabric)
        return NcclChoice(collective, size, self.nranks, T.ALGORITHM_NAMES[a],
                          T.PROTOCOL_NAMES[p], channels, time, tuner, lat, fabric, where,
                          self.version, self.settings.forced)

    # ---- the fabric ------------------------------------------------------------
    def _fabric_unit(self, collective: str, a: int, channels: int) -> tuple[float, str]:
        """Seconds per byte of the buffer on the busiest link, and that link."""
        key = (collective, a, channels)
        if key not in self._unit:
            self._unit[key] = self._loads(collective, a, channels, False).busiest()
        return self._unit[key]

    def _loads(self, collective: str, a: int, channels: int, every: bool) -> LinkLoads:
        """The traffic of algorithm ``a`` on ``channels`` channels, per byte of the
        buffer; in-box traffic of every box (``every``) or of one box of each kind (all
        the busiest link needs)."""
        loads = LinkLoads(clusters.nccl_links(self.cluster))
        if a in (T.RING, T.PAT):
            self._ring_loads(loads, collective, channels, a == T.PAT, every)
        elif a in (T.TREE, T.COLLNET_CHAIN):
            self._tree_loads(loads, channels, a == T.COLLNET_CHAIN, every)
        elif a in (T.NVLS, T.NVLS_TREE):
            self._nvls_loads(loads, collective, a == T.NVLS_TREE, every)
        else:
            self._direct_loads(loads, every)
        return loads

    def edge_loads(self, choice: NcclChoice) -> dict[tuple[str, str], float]:
        """Bytes ``choice`` moves over each directed edge of the cluster's graph (on the
        wire: LL doubles them, LL128 adds 1/15), every box's traffic included: what the
        model's fabric term is the busiest of.

        Raises
        ------
        ValueError
            For a choice of an algorithm or protocol the model does not know.
        """
        a = T.ALGORITHM_NAMES.index(choice.algorithm)
        p = T.PROTOCOL_NAMES.index(choice.protocol)
        if self.nranks == 1 or choice.size <= 0:
            return {}
        key = (choice.collective, a, choice.channels)
        totals = self._totals.get(key)
        if totals is None:
            totals = self._totals[key] = self._loads(*key, True).totals()
        scale = choice.size * _WIRE[p]
        return {edge: amount * scale for edge, amount in totals.items() if amount > 0}

    def rings(self) -> list[tuple[int, ...]]:
        """NCCL's ring channels as rings of ranks, each once (a ring that only rotates
        another is the same ring; reversed, it uses the links' other direction): channel
        ``c`` goes through every box in
        file order, through box ``b`` in the order NCCL's search found for it
        (``graph.orders``). What the MSCCL export writes a native allreduce as where the
        cluster has no rails (:mod:`topoplan.interop.msccl.export`)."""
        rings: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        for c in range(self._combine("ring").channels):
            ring = tuple(box.first_rank + j for b, box in enumerate(self.cluster.boxes)
                         for j in self._channel(b, "ring", c)[0])
            start = ring.index(min(ring))
            key = ring[start:] + ring[:start]
            if len(ring) == self.nranks and key not in seen:
                seen.add(key)
                rings.append(ring)
        return rings

    def _channel(self, box: int, pattern: str, c: int) -> tuple[tuple[int, ...], int | None]:
        graph = self._box_graphs[box][pattern]
        k = c % graph.channels
        return graph.orders[k], graph.nics[k]

    def _ring_loads(self, loads: LinkLoads, collective: str, channels: int, pat: bool,
                    every: bool = False) -> None:
        n = self.nranks
        if collective in ROOTED:
            # A pipelined chain from the root: every hop carries the buffer (the hop back
            # into the root, idle in NCCL's ring, is counted too: the model does not
            # place the root).
            per_hop = 1.0 / channels
        else:
            per_hop = (2.0 if collective == "allreduce" else 1.0) * (n - 1) / n / channels
        boxes = self.cluster.boxes
        if pat:
            # PAT (one GPU per node): a recursive-doubling exchange at distances 2^k.
            shard = 1.0 / n
            dist = 1
            while dist < n:
                for r in range(n):
                    loads.route(r, (r + dist) % n, shard * min(dist, n - dist))
                dist *= 2
            return
        for c in range(channels):
            ends = []
            for b, box in enumerate(boxes):
                order, nic = self._channel(b, "ring", c)
                ranks = [box.first_rank + g for g in order]
                if every or self._representative[b]:
                    for x, y in zip(ranks, ranks[1:]):
                        loads.route(x, y, per_hop)
                ends.append((ranks[0], ranks[-1], nic))
            if len(boxes) == 1:
                first, last, _ = ends[0]
                if n > 1:
                    loads.route(last, first, per_hop)
                continue
            for b in range(len(boxes)):
                _, last, nic_out = ends[b]
                first, _, nic_in = ends[(b + 1) % len(boxes)]
                loads.net(b, last, nic_out, (b + 1) % len(boxes), first, nic_in, per_hop)

    def _tree_loads(self, loads: LinkLoads, channels: int, sharp: bool,
                    every: bool = False) -> None:
        boxes = self.cluster.boxes
        nodes = len(boxes)
        # Two trees (NCCL's double binary tree), each with every channel: half the data
        # each, spread over the channels.
        share = 1.0 / (2 * channels)
        trees = _dtree(nodes)
        for c in range(channels):
            heads = []
            for b, box in enumerate(boxes):
                order, nic = self._channel(b, "tree", c)
                ranks = [box.first_rank + g for g in order]
                if every or self._representative[b]:
                    for x, y in zip(ranks, ranks[1:]):  # reduce up the chain, broadcast down
                        loads.route(y, x, 2 * share)
                        loads.route(x, y, 2 * share)
                heads.append((ranks[0], nic))
            if nodes == 1:
                continue
            if sharp:
                for b in range(nodes):
                    loads.sharp(b, heads[b][1], 2 * share)
                continue
            for parents in trees:
                for child, parent in enumerate(parents):
                    if parent < 0:
                        continue
                    (hc, nc), (hp, np_) = heads[child], heads[parent]
                    loads.net(child, hc, nc, parent, hp, np_, share)
                    loads.net(parent, hp, np_, child, hc, nc, share)

    def _nvls_loads(self, loads: LinkLoads, collective: str, tree: bool,
                    every: bool = False) -> None:
        boxes = self.cluster.boxes
        graph_channels = [g["nvls"].channels for g in self._box_graphs]
        for b, box in enumerate(boxes):
            if box.fabric is None or box.gpus < 2 or not (every or self._representative[b]):
                continue
            n = box.gpus
            # multimem.ld_reduce pulls each GPU's data into the switch once and hands the
            # sum of each slice to its owner; multimem.st sends each slice once and the
            # switch writes it to every GPU.
            if collective == "allreduce":
                up, down = 1.0 + 1.0 / n, 1.0 + 1.0 / n
            elif collective == "reduce_scatter":
                up, down = 1.0, 1.0 / n
            else:
                up, down = 1.0 / n, 1.0
            for g in range(n):
                loads.add((box.gpu_node(g), box.fabric_node), up)
                loads.add((box.fabric_node, box.gpu_node(g)), down)
        if not tree or len(boxes) == 1:
            if len(boxes) > 1:  # NVLS with SHARP between the nodes
                for b in range(len(boxes)):
                    for c in range(graph_channels[b]):
                        _, nic = self._channel(b, "nvls", c)
                        loads.sharp(b, nic, 1.0 / graph_channels[b])
            return
        heads_per = min(graph_channels)
        trees = _dtree(len(boxes))
        for c in range(heads_per):
            heads = []
            for b, box in enumerate(boxes):
                order, nic = self._channel(b, "nvls", c)
                heads.append((box.first_rank + order[0], nic))
            for parents in trees:
                for child, parent in enumerate(parents):
                    if parent < 0:
                        continue
                    (hc, nc), (hp, np_) = heads[child], heads[parent]
                    share = 1.0 / (2 * heads_per)
                    loads.net(child, hc, nc, parent, hp, np_, share)
                    loads.net(parent, hp, np_, child, hc, nc, share)

    def _direct_loads(self, loads: LinkLoads, every: bool = False) -> None:
        for b, box in enumerate(self.cluster.boxes):
            graph = self._box_graphs[b]["collnet_direct"]
            heads = [box.first_rank + order[0] for order in graph.orders]
            share = 1.0 / len(heads)
            # A reduce-scatter to the heads and an allgather from them inside the box.
            for r in (box.ranks if every or self._representative[b] else ()):
                for h in heads:
                    if h != r:
                        loads.route(r, h, share / box.gpus)
                        loads.route(h, r, share / box.gpus)
            for nic in graph.nics:
                loads.sharp(b, nic, share)


def _dtree(nodes: int) -> list[list[int]]:
    """NCCL's double binary tree over ``nodes`` nodes (src/graph/trees.cc,
    ``ncclGetDtree``): each tree as the parent of every node (-1 at the root)."""
    def btree(rank: int) -> int:
        if rank == 0:
            return -1
        bit = 1
        while bit < nodes and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= nodes:
            up = rank ^ bit
        return up

    first = [btree(r) for r in range(nodes)]
    if nodes % 2 == 1:
        second = []
        for r in range(nodes):
            u = btree((r - 1 + nodes) % nodes)
            second.append(-1 if u == -1 else (u + 1) % nodes)
    else:
        second = []
        for r in range(nodes):
            u = btree(nodes - 1 - r)
            second.append(-1 if u == -1 else nodes - 1 - u)
    return [first, second]


def _one_cycle(graph: Graph, inter: bool) -> bool:
    """Whether every channel of a ring ``graph`` walks the box in one order (one cycle,
    from any start, in one node; one path by one NIC between nodes)."""
    if graph.empty:
        return False
    if inter:
        return len(set(graph.orders)) == 1 and len(set(graph.nics)) == 1
    first = graph.orders[0]
    n = len(first)

    def canonical(order: tuple[int, ...]) -> tuple[int, ...]:
        k = order.index(first[0]) if first[0] in order else 0
        return order[k:] + order[:k]

    return all(len(o) == n and canonical(o) == first for o in graph.orders)


def _check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; the NCCL model prices "
                         f"{', '.join(COLLECTIVES)}")


def _model_state(cluster: Cluster, settings: nccl_env.NcclSettings,
                 states: dict[tuple, dict[str, Any]]) -> dict[str, Any]:
    """What a model computes of ``cluster``, without the cluster itself (a cached value
    must not keep its cluster alive); its price caches are shared by every model made
    from it. A forced model is NCCL's own of the same version with the forcing's masks:
    the search and the loads (``_unit``, ``_totals``, per algorithm and channel count)
    are shared with it, the tables (``_tables``: what is enabled, LL128 listed or not)
    are its own."""
    if settings.algo is None and settings.proto is None:
        state = dict(NcclModel(cluster, settings.version).__dict__)
        del state["cluster"]
        return state
    own = (settings.version, None, None)
    if own not in states:
        states[own] = _model_state(cluster, nccl_env.NcclSettings(settings.version), states)
    state = dict(states[own])
    state["settings"] = settings
    state["_algo_mask"], state["_proto_mask"] = settings.masks()
    state["_tables"] = {}
    return state


_MODELS: ObjectCache[Cluster, dict[tuple, dict[str, Any]]] = ObjectCache(lambda cluster: {})


def nccl_model(cluster: Cluster, version: str | None = None, algo: str | None = None,
               proto: str | None = None) -> NcclModel:
    """The :class:`NcclModel` of ``cluster`` for NCCL ``version``, forced with ``algo`` and
    ``proto`` as NCCL_ALGO / NCCL_PROTO would (each ``None``: the enclosing
    :func:`~topoplan.analysis.native.nccl_env.nccl_settings`, else NCCL's default
    :data:`~topoplan.analysis.native.nccl_tables.DEFAULT_VERSION` and its own choice). Its
    search and tables run once per cluster object and settings, and prices computed on
    one model serve the next.

    Raises
    ------
    ValueError
        For an unknown version, algorithm, protocol or function name.
    """
    settings = nccl_env.resolved(version, algo, proto)
    settings = replace(settings, version=T.constants(settings.version).version)
    states = _MODELS(cluster)
    key = (settings.version, settings.algo, settings.proto)
    if key not in states:
        states[key] = _model_state(cluster, settings, states)
    model = NcclModel.__new__(NcclModel)
    model.__dict__.update(states[key])
    model.cluster = cluster
    return model


def nccl_time(cluster: Cluster, size: int, collective: str = "allreduce", *,
              version: str | None = None, algo: str | None = None,
              proto: str | None = None) -> NcclChoice:
    """NCCL's choice for ``collective`` of ``size`` bytes on ``cluster`` and its time
    there (:meth:`NcclModel.choose`; ``version``, ``algo``, ``proto`` as for
    :func:`nccl_model`)."""
    return nccl_model(cluster, version, algo, proto).choose(collective, size)


def sizes_of(low: int, high: int) -> Iterable[int]:
    """Powers of two from ``low`` to ``high`` bytes."""
    size = low
    while size <= high:
        yield size
        size *= 2


def nccl_group_time(cluster: Cluster, group: Iterable[int], collective: str,
                    size: int, *, version: str | None = None, algo: str | None = None,
                    proto: str | None = None) -> tuple[NcclChoice, NcclModel, GroupCluster]:
    """What NCCL runs for ``collective`` of ``size`` bytes on a communicator of the ranks
    in ``group`` alone, its time there, the model that chose it (for
    :meth:`NcclModel.edge_loads`) and the sub-cluster
    (:func:`~topoplan.analysis.native.clusters.group_cluster`). ``version``, ``algo``,
    ``proto`` as for :func:`nccl_model`. Over every rank in rank order it is
    :func:`nccl_time` exactly.

    Raises
    ------
    ValueError
        For a bad group (:func:`~topoplan.analysis.native.clusters.group_cluster`), an
        unknown collective, or a group on
        which NCCL has no algorithm.
    """
    sub = clusters.group_cluster(cluster, group)
    model = nccl_model(sub.cluster, version, algo, proto)
    return model.choose(collective, int(size)), model, sub
