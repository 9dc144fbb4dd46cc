"""The channels NCCL's topology search builds on one box, as NCCL's view of that box.

NCCL searches, on every node, for ``nChannels`` channels of one pattern (a ring, a
tree's chain, the NVLS heads), each moving ``bw`` GB/s over every link it crosses,
trying per-channel speeds from a fixed array (``speedArrayIntra`` / ``speedArrayInter``)
fastest first (``src/graph/search.cc``, ``ncclTopoCompute``). Every rank then takes the
smallest channel count and speeds of all nodes (``src/init.cc``, the ``graphInfo``
exchange), and the tuner prices algorithms from them (``tuning.cc``).

This module redoes that search on topoplan's model of a box (:class:`BoxView`): the
same speed arrays, the same first pass (fastest speed first, then slower while the
bandwidth found could still improve by half), the same channel duplication
(``ncclTopoDupChannels``) and second pass (raise the speed while the channels still
fit). Where NCCL follows PCIe paths through CPUs and switches, a box here has a
fabric (NVSwitch or PCIe switch, each GPU attached at its bandwidth), direct NVLinks,
and NICs that serve listed GPUs; a channel fits when every link it crosses has the
speed left (NVSwitch: every GPU's port; NVLink mesh: the Hamiltonian cycle or path it
takes; a NIC: its bandwidth). Search timeouts, CPU types and PCIe trees are not
modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from . import nccl_tables as T

__all__ = ["BoxView", "Graph", "box_view", "search_ring", "search_tree", "tree_pattern",
           "search_nvls",
           "search_collnet_direct", "nvlink_view"]

_EPS = 1e-9


def nvlink_view(bandwidth: float, compcap: int) -> float:
    """What NCCL counts for an NVLink connection of ``bandwidth`` GB/s one way.

    NCCL counts ``links x SMxx_NVLINK_BW`` (topo.h), below the specification's rate per
    link (``nccl_tables.NVLINK_SPEC_BW``). A bandwidth that is a whole number of
    specification links (A100: 12 x 25 = 300 GB/s) is that many of NCCL's links
    (12 x 20 = 240); one that is already a whole number of NCCL's links (H100: 18 x
    20.6 = 370.8, as ``topo import nccl`` writes it) is kept; less than one link is
    kept (not NVLink: a PCIe board switch, say); anything else is scaled by NCCL's rate
    over the specification's.
    """
    spec, nccl = T.NVLINK_SPEC_BW[compcap], T.NVLINK_BW[compcap]
    if bandwidth < 0.99 * min(spec, nccl):
        return bandwidth
    for rate, out in ((spec, nccl), (nccl, nccl)):
        links = bandwidth / rate
        if links >= 0.99 and abs(links - round(links)) < 1e-3 * max(1.0, links):
            return round(links) * out
    return bandwidth * nccl / spec


@dataclass(frozen=True)
class BoxView:
    """A box as NCCL's search sees it (GB/s, one way).

    Attributes
    ----------
    gpus : int
    compcap : int
        The compute capability its tables are chosen by.
    intra : {"nvswitch", "pcie", "nvlink", "none"}
        An NVSwitch fabric, a PCIe fabric, a mesh of direct NVLinks, or one GPU.
    intra_bw : float
        Each GPU's port into the fabric (NVSwitch or PCIe), NCCL's count.
    links : mapping
        ``(a, b) -> GB/s`` of each direct NVLink pair (``a < b``), NCCL's count.
    nics : tuple of (float, tuple of int)
        Each NIC's bandwidth and the box-local GPUs it serves.
    nvls : bool
        The NVSwitch reduces and multicasts (NVLink SHARP).
    """

    gpus: int
    compcap: int
    intra: str
    intra_bw: float
    links: tuple[tuple[tuple[int, int], float], ...] = ()
    nics: tuple[tuple[float, tuple[int, ...]], ...] = ()
    nvls: bool = False

    @property
    def nvlink(self) -> bool:
        """Whether GPUs talk over NVLink (NCCL's ``PATH_NVL``: NVLink latencies, LL128)."""
        return self.intra in ("nvswitch", "nvlink")

    def total_bw(self) -> float:
        """search.cc getTotalBw: the most NVLink (or PCIe) bandwidth of one GPU."""
        if self.intra in ("nvswitch", "pcie"):
            return self.intra_bw
        if self.intra == "nvlink":
            per = [0.0] * self.gpus
            for (a, b), bw in self.links:
                per[a] += bw
                per[b] += bw
            return max(per)
        return max((bw for bw, _ in self.nics), default=T.LOC_BW)

    def max_bw(self, inter: bool) -> float:
        """search.cc getMaxBw: the fastest path from a GPU to a NIC (between nodes) or to
        another GPU (in one)."""
        if inter:
            return max((bw for bw, _ in self.nics), default=0.0)
        if self.gpus == 1:
            return T.LOC_BW
        if self.intra == "nvlink":
            return max(bw for _, bw in self.links)
        return self.intra_bw


def box_view(box: object, compcap: int, count: bool = True) -> BoxView:
    """The NCCL view of a :class:`topoplan.cluster.Box` (duck-typed: ``gpus``,
    ``fabric``, ``gpu_links``, ``nics``) with GPUs of compute capability ``compcap``;
    NVLink counted as NCCL counts it (:func:`nvlink_view`) when ``count``, else as
    written."""
    gpus = box.gpus  # type: ignore[attr-defined]
    fabric = box.fabric  # type: ignore[attr-defined]
    nics = tuple((nic.bandwidth / 1e9, tuple(nic.gpus)) for nic in box.nics)  # type: ignore[attr-defined]

    def nvlink(bandwidth: float) -> float:
        return nvlink_view(bandwidth, compcap) if count else bandwidth

    links = tuple(((min(l.a, l.b), max(l.a, l.b)), nvlink(l.bandwidth / 1e9))
                  for l in box.gpu_links)  # type: ignore[attr-defined]
    if gpus == 1:
        return BoxView(gpus, compcap, "none", 0.0, (), nics, False)
    if fabric is not None and fabric.is_nvlink:
        return BoxView(gpus, compcap, "nvswitch", nvlink(fabric.bandwidth / 1e9),
                       (), nics, bool(fabric.nvls))
    if links and _mesh_connected(gpus, [ab for ab, _ in links]):
        return BoxView(gpus, compcap, "nvlink", 0.0, links, nics, False)
    bw = fabric.bandwidth / 1e9 if fabric is not None else 0.0
    return BoxView(gpus, compcap, "pcie", bw, (), nics, False)


def _mesh_connected(n: int, pairs: Sequence[tuple[int, int]]) -> bool:
    seen, todo = {0}, [0]
    adj: dict[int, list[int]] = {}
    for a, b in pairs:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    while todo:
        for w in adj.get(todo.pop(), []):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return len(seen) == n


@dataclass(frozen=True)
class Graph:
    """A search's result on one box: NCCL's ``ncclTopoGraph`` in brief.

    ``orders[c]`` is channel ``c``'s walk through the box's GPUs (box-local indexes:
    a ring's order, a tree's chain, or an NVLS channel's head first) and ``nics[c]``
    the NIC it enters and leaves by (``None`` in a one-node search).
    """

    pattern: str
    channels: int
    bw_intra: float
    bw_inter: float
    nvlink: bool
    orders: tuple[tuple[int, ...], ...] = ()
    nics: tuple[int | None, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def empty(self) -> bool:
        return self.channels == 0


_NONE = Graph("none", 0, 0.0, 0.0, False)


_DEFAULT = T.constants()


def _speeds(compcap: int, inter: bool,
            tables: T.VersionTables = _DEFAULT) -> tuple[float, ...]:
    table = tables.speeds_inter if inter else tables.speeds_intra
    return table[100] if compcap >= 100 else table[90] if compcap >= 90 else table[70]


def _nic_plan(view: BoxView, speed: float, want: int) -> list[int]:
    """The NIC of each of up to ``want`` channels at ``speed``: round-robin over the NICs
    (search.cc, ``nets[(nChannels + i) % netCount]``), each carrying channels while its
    bandwidth lasts."""
    left = [int(math.floor(bw / speed + _EPS)) for bw, _ in view.nics]
    out: list[int] = []
    k = 0
    while len(out) < want and any(n > 0 for n in left):  # (a NIC below 0 B/s: none)
        if left[k % len(left)] > 0:
            left[k % len(left)] -= 1
            out.append(k % len(left))
        k += 1
    return out


def _start_gpu(view: BoxView, nic: int | None, nth: int) -> int:
    """The GPU a channel enters by: one that ``nic`` serves (the ``nth`` such channel
    takes the next one), GPU 0 without a NIC."""
    if nic is None:
        return nth % view.gpus
    served = view.nics[nic][1]
    return served[nth % len(served)]


def _fabric_fit(view: BoxView, speed: float, starts: Sequence[int] = (),
                path: bool = False) -> int:
    """Channels a fabric carries at ``speed``.

    In one node a channel is a cycle: it crosses each GPU's port both ways. Between nodes
    it is a path (``start``, ``start + 1``, ..., ``start - 1``): it enters by a NIC at its
    first GPU and leaves by a NIC at its last, so the first GPU's port carries nothing
    into it and the last's nothing out (search.cc:602-604, the ring's ``crossNic == 2``:
    a channel may leave by another NIC than it entered; :1238, tried when the rail-aligned
    ring falls short; NCCL_CROSS_NIC defaults to 2). NCCL charges each direction of a link
    on its own (``ncclTopoFollowPath``): with 8 GPUs and 8 channels each starting at its
    own GPU, a port carries 7 channels each way, not 8.
    """
    if view.gpus == 1:
        return T.MAXCHANNELS
    per_port = int(math.floor(view.intra_bw / speed + _EPS))
    if not path:
        return per_port
    out = [0] * view.gpus
    into = [0] * view.gpus
    fit = 0
    for k, start in enumerate(starts):
        last = (start - 1) % view.gpus
        for g in range(view.gpus):
            out[g] += g != last
            into[g] += g != start
        if max(max(out), max(into)) > per_port:
            break
        fit = k + 1
    return fit


def _mesh_walks(view: BoxView, speed: float, starts: Sequence[int], cycle: bool,
                budget: int = 20000) -> list[tuple[int, ...]]:
    """Hamiltonian cycles (one node) or paths (between nodes) through the NVLink mesh,
    one per start, each taking ``speed`` from every link it uses in its direction,
    greedily in order; stops at the first start for which none fits."""
    left: dict[tuple[int, int], float] = {}
    full: dict[tuple[int, int], float] = {}
    adj: dict[int, list[int]] = {g: [] for g in range(view.gpus)}
    for (a, b), bw in view.links:
        left[(a, b)] = left[(b, a)] = full[(a, b)] = full[(b, a)] = bw
        adj[a].append(b)
        adj[b].append(a)
    walks: list[tuple[int, ...]] = []
    for start in starts:
        path = [start]
        used = {start}
        steps = [0]

        def extend() -> bool:
            steps[0] += 1
            if steps[0] > budget:
                return False
            here = path[-1]
            if len(path) == view.gpus:
                return not cycle or left.get((here, start), 0.0) >= speed - _EPS
            # The link with the most left first, the wider of two equal ones (a double
            # NVLink before a single one), so that later channels still find a way.
            for nxt in sorted(adj[here], key=lambda w: (-left[(here, w)], -full[(here, w)], w)):
                if nxt in used or left[(here, nxt)] < speed - _EPS:
                    continue
                path.append(nxt)
                used.add(nxt)
                if extend():
                    return True
                path.pop()
                used.discard(nxt)
            return False

        if not extend():
            break
        hops = list(zip(path, path[1:])) + ([(path[-1], start)] if cycle else [])
        for hop in hops:
            left[hop] -= speed
        walks.append(tuple(path))
    return walks


def _ring_channels(view: BoxView, s_intra: float, s_inter: float, inter: bool,
                   limit: int) -> tuple[list[tuple[int, ...]], list[int | None]]:
    """The channels that fit at these speeds (at most ``limit``): their GPU orders and
    NICs."""
    nics: list[int | None]
    if inter:
        nics = list(_nic_plan(view, s_inter, limit))
    else:
        nics = [None] * limit
    per_nic: dict[int | None, int] = {}
    starts = []
    for nic in nics:
        starts.append(_start_gpu(view, nic, per_nic.get(nic, 0)))
        per_nic[nic] = per_nic.get(nic, 0) + 1
    if view.intra == "nvlink":
        orders = _mesh_walks(view, s_intra, starts, cycle=not inter)
    else:
        fit = min(len(starts), _fabric_fit(view, s_intra, starts, path=inter))
        orders = [tuple((start + j) % view.gpus for j in range(view.gpus))
                  for start in starts[:fit]]
    return orders, nics[:len(orders)]


def search_ring(view: BoxView, inter: bool, pattern: str = "ring",
                channels: int | None = None, tables: T.VersionTables = _DEFAULT) -> Graph:
    """NCCL's ring (or, with ``channels``, tree chain) search on one box.

    Pass 1 tries speeds fastest first from the first that the box can carry (at most
    the fastest path, ``maxBw``; at most ``totalBw`` over the channels wanted), keeps
    the most bandwidth (channels x speed), stops when it reaches ``totalBw`` or the
    most channels, and otherwise goes to slower speeds while they stay above 0.49 of
    the best speed. The channels are then duplicated (``ncclTopoDupChannels``: above
    25 GB/s a channel, into two at half the speed, except on Hopper and later below
    50 GB/s with more than 4 channels), and pass 2 raises the speed while as many
    channels fit (rings), or raises a tree's speed inside the box up to twice the
    network's.
    """
    speeds = _speeds(view.compcap, inter, tables)
    tree = channels is not None
    max_ch: int = channels if channels is not None else T.RING_MAX_CHANNELS
    min_ch: int = channels if channels is not None else 1
    max_bw, total_bw = view.max_bw(inter), view.total_bw()
    total_for_start = total_bw * (view.gpus / (view.gpus - 1) if tree and view.gpus > 1 else 1)
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw + _EPS
                                   or speeds[i] * min_ch > total_for_start + _EPS):
        i += 1
    best: tuple[int, float, list, list] | None = None
    while True:
        s = speeds[i]
        orders, nics = _ring_channels(view, s, s, inter, max_ch)
        n = len(orders)
        if n >= min_ch and (best is None or n * s > best[0] * best[1] + _EPS):
            best = (n, s, orders, nics)
        if best is not None and (best[0] * best[1] >= total_bw - _EPS or best[0] == max_ch):
            break
        if i + 1 < len(speeds) and (best is None or speeds[i + 1] / best[1] > 0.49):
            i += 1
            continue
        break
    if best is None:
        # search.cc: "Could not find a path ... falling back to simple order", 0.1 GB/s.
        orders = [tuple(range(view.gpus))]
        nics_fb: list[int | None] = [0 if inter and view.nics else None]
        return Graph(pattern, 1, 0.1, 0.1, view.nvlink, tuple(orders), tuple(nics_fb),
                     ("no channel fits: NCCL's fallback order at 0.1 GB/s",))
    n, s, orders, nics = best
    s_intra = s_inter = s
    if not (s < 25.0 - _EPS or (view.compcap > 80 and s < 50.0 - _EPS and n > 4)):
        dup = min(2 * n, max_ch)
        factor = math.ceil(dup / n)
        orders = [orders[c % n] for c in range(dup)]
        nics = [nics[c % n] for c in range(dup)]
        n, s_intra, s_inter = dup, s / factor, s / factor
    # Pass 2.
    j = 0
    while j < len(speeds) and speeds[j] > s_inter + _EPS:
        j += 1
    if not tree:
        while j > 0:
            faster = speeds[j - 1]
            more, _ = _ring_channels(view, faster, faster, inter, n)
            if len(more) < n:
                break
            s_intra = s_inter = faster
            j -= 1
            orders, nics = _ring_channels(view, faster, faster, inter, n)
    else:
        while j > 0 and s_intra < 2 * s_inter - _EPS:
            faster = speeds[j - 1]
            if faster <= s_intra + _EPS:
                j -= 1
                continue
            more, _ = _ring_channels(view, faster, s_inter, inter, n)
            if len(more) < n:
                break
            s_intra = faster
            j -= 1
    return Graph(pattern, n, s_intra, s_inter, view.nvlink, tuple(orders), tuple(nics))


def tree_pattern(view: BoxView, inter: bool) -> str:
    """The pattern NCCL's tree search ends on: ``"balanced_tree"`` or ``"tree"``.

    The search starts with ``NCCL_TOPO_PATTERN_BALANCED_TREE``, whose first two GPUs of a
    chain both reach the network by one NIC (search.cc:614-616: at ``step != 0`` the NIC
    must be ``graph->inter[nChannels * 2 + 1]``; :657-661 count half the bandwidth on each
    of the two). On Hopper and later, when that fails the search tries the plain
    ``NCCL_TOPO_PATTERN_TREE`` ("Try a simpler tree", search.cc:1214-1217), before it
    widens the path types (PXN) or slows down. Between nodes it fails where no NIC serves
    two GPUs: each GPU has its own NIC.
    """
    if not inter or view.compcap < 90 or not view.nics:
        return "balanced_tree"
    return "balanced_tree" if any(len(served) >= 2 for _, served in view.nics) else "tree"


def search_tree(view: BoxView, inter: bool, ring: Graph,
                tables: T.VersionTables = _DEFAULT) -> Graph:
    """The tree search: as many channels as the ring (``treeGraph->minChannels =
    maxChannels = ringGraph->nChannels``, init.cc:1184-1185), each a chain through the
    box; the graph's ``pattern`` is :func:`tree_pattern`'s."""
    if ring.empty:
        return _NONE
    return search_ring(view, inter, pattern=tree_pattern(view, inter), channels=ring.channels,
                       tables=tables)


def search_nvls(view: BoxView, inter: bool, tables: T.VersionTables = _DEFAULT) -> Graph:
    """The NVLS search (``NCCL_TOPO_PATTERN_NVLS``, Hopper and later with NVLink SHARP).

    A channel has a head GPU; it moves ``bw`` between the switch and every GPU each
    way, twice for its head (``ncclTopoSearchTryNvls``). In one node the heads are all
    the GPUs (``minChannels = maxChannels = ngpus``); between nodes they are the GPUs
    of the NICs, one per NIC, and a head's NIC carries ``bwInter``. NVLS channels are
    not duplicated; pass 2 raises ``bwInter`` up to twice ``bwIntra`` while the NICs
    carry it (in one node, always).
    """
    if not view.nvls or view.compcap < 90 or view.intra != "nvswitch" or view.gpus < 2:
        return _NONE
    speeds = _speeds(view.compcap, inter, tables)
    max_ch = min(T.NVLS_MAX_ARITY, view.gpus)
    if inter:
        heads: list[tuple[int, int]] = []
        for k, (_, served) in enumerate(view.nics):
            for g in served:
                if g not in [h for h, _ in heads]:
                    heads.append((g, k))
                    break
        max_ch = min(max_ch, len(heads))
        min_ch = 1
    else:
        heads = [(g, -1) for g in range(view.gpus)]
        min_ch = max_ch
    if max_ch == 0:
        return _NONE
    max_bw = view.max_bw(inter)
    total = view.total_bw() * view.gpus / (view.gpus - 1)
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > max_bw + _EPS or speeds[i] * min_ch > total + _EPS):
        i += 1

    def fit(s_intra: float, s_inter: float) -> int:
        # k channels load every GPU's port k * s and a head's (k + 1) * s.
        k = min(max_ch, int(math.floor(view.intra_bw / s_intra + _EPS)) - 1)
        if inter:
            k = min(k, sum(1 for _, nic in heads[:max_ch]
                           if view.nics[nic][0] >= s_inter - _EPS))
        return max(k, 0)

    best: tuple[int, float] | None = None
    while True:
        s = speeds[i]
        n = fit(s, s)
        if n >= min_ch and (best is None or n > best[0] or n * s > best[0] * best[1] + _EPS):
            best = (n, s)
        if best is not None and best[0] == max_ch:
            break
        if i + 1 < len(speeds) and (best is None or speeds[i + 1] / best[1] > 0.49):
            i += 1
            continue
        break
    if best is None:
        return _NONE
    n, s = best
    s_inter = s
    j = speeds.index(s)
    while j > 0 and s_inter < 2 * s - _EPS:
        faster = speeds[j - 1]
        if fit(s, faster) < n:
            break
        s_inter = faster
        j -= 1
    used = heads[:n]
    orders = tuple((g,) + tuple(x for x in range(view.gpus) if x != g) for g, _ in used)
    nics = tuple(None if k < 0 else k for _, k in used)
    return Graph("nvls", n, s, s_inter, True, orders, nics)


def search_collnet_direct(view: BoxView, tables: T.VersionTables = _DEFAULT) -> Graph:
    """CollNet Direct's heads: one GPU per NIC (at most ``NCCL_MAX_DIRECT_ARITY + 1``),
    each channel at the fastest network speed its NIC carries."""
    if not view.nics:
        return _NONE
    speeds = _speeds(view.compcap, True, tables)
    heads: list[tuple[int, int]] = []
    for k, (_, served) in enumerate(view.nics):
        for g in served:
            if g not in [h for h, _ in heads]:
                heads.append((g, k))
                break
    heads = heads[:min(T.DIRECT_MAX_ARITY + 1, view.gpus)]
    slowest = min(view.nics[k][0] for _, k in heads)
    s = next((x for x in speeds if x <= slowest + _EPS), speeds[-1])
    orders = tuple((g,) + tuple(x for x in range(view.gpus) if x != g) for g, _ in heads)
    return Graph("collnet_direct", len(heads), s, s, view.nvlink, orders,
                 tuple(k for _, k in heads))
