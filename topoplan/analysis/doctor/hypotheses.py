"""The faults ``topoplan doctor`` tries: each a cluster changed the way the fault would
change it, with the parameter it fits on a small grid.

One box stands for every box of its kind (:meth:`~topoplan.cluster.model.Box.signature`):
a collective over every rank meets each box alike, so a NIC at half speed in box 0 and
the same NIC in box 5 give one curve (the output says "any one NIC (A/nic0 shown)").
One switch link stands for every link of its bandwidth and latency likewise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ...cluster.links import degraded, links
from ...cluster.model import Box, Cluster

__all__ = ["Hypothesis", "KINDS", "hypotheses", "NO_GDR_CAPS", "NO_GDR_LATENCY",
           "PLUGIN_LATENCIES", "FACTORS"]

#: The slow-down factors a bandwidth fault is fitted over.
FACTORS = (0.5, 0.25)
#: Without GPUDirect RDMA, NCCL's network transport stages every message in host memory
#: (``src/transport/net.cc``: the buffers are host memory when ``useGdr`` is 0, and the
#: GPU's proxy copies them), so each byte crosses the GPU's PCIe link and the host's
#: memory and root complex twice. A PCIe Gen4 x16 link moves about 25 GB/s each way
#: (16 GT/s x 16 lanes, 128b/130b, less protocol overhead), Gen5 about twice that, and a
#: host's shared root complex and memory hold the staged rate below that: NVIDIA's
#: GPUDirect RDMA pages and nccl-tests issues report roughly half of the NIC's rate or
#: less without it. Assumed: the NIC's bandwidth capped at one of these (bytes/s),
#: fitted ...
NO_GDR_CAPS = (10e9, 20e9)
#: ... plus this much more latency per network step (seconds): a copy through host
#: memory and the proxy's extra hand-off; an order of magnitude, not a measured value.
NO_GDR_LATENCY = 4e-6
#: The network plugin latencies fitted (seconds): what ``ncclNetProperties_t.latency``
#: adds to each network step (docs/CLUSTER.md, ``plugin_latency``).
PLUGIN_LATENCIES = (5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6)

#: Per kind: what it means, and what to check on the machine.
KINDS: dict[str, tuple[str, str]] = {
    "healthy": ("the cluster as its file describes it", ""),
    "nic-down": ("a NIC down: its GPUs go out through the box's other NICs",
                 "ibstat / ibv_devinfo on every host (State: Active, Physical state: LinkUp "
                 "on every port); NCCL_DEBUG=INFO lists the NET/IB devices NCCL uses"),
    "nic-slow": ("one NIC slower than its rate (a port trained down, a cable, a PCIe link "
                 "at lower width)",
                 "ibstat 'Rate:' or ethtool IFACE 'Speed:' against the NIC's rating; "
                 "lspci -vv 'LnkSta' (width x16, speed) of the NIC; port error counters "
                 "(perfquery, ethtool -S)"),
    "box-nics-slow": ("every NIC of one box slower (its PCIe switch, its BIOS, its "
                      "firmware)", "ibstat / ethtool on that host against the others; "
                      "lspci -vv LnkSta; nvidia-smi topo -m for the GPU-NIC paths"),
    "all-nics-slow": ("every NIC slower: a NIC type or a network running below the rate "
                      "the cluster file says",
                      "ibstat 'Rate:' (e.g. 200 against 400), the switch's port speed, "
                      "the cluster file's NIC bandwidth"),
    "fabric-slow": ("a box's NVLink or NVSwitch slower (links down, a degraded NVSwitch)",
                    "nvidia-smi nvlink -s (each link's speed; inactive links), "
                    "nvidia-smi topo -m, nvidia-smi -q (NVLink and fabric manager state), "
                    "dcgmi diag"),
    "no-gdr": ("no GPUDirect RDMA: GPU<->NIC traffic bounced through host memory (each NIC "
               "capped at a PCIe/host-memory rate, more latency per network step)",
               "NCCL_DEBUG=INFO: 'NET/IB ... [GDRDMA]' on each channel's line means "
               "GPUDirect is in use, its absence means not; lsmod | grep -e nvidia_peermem "
               "-e nv_peer_mem; NCCL_NET_GDR_LEVEL; nvidia-smi topo -m (NIC and GPU under "
               "one PCIe switch: PIX/PXB)"),
    "rank-order": ("ranks ordered across racks: rings cross the slow links between "
                   "switches more often than the file's order needs",
                   "the hostfile / SLURM node order against the racks; NCCL_DEBUG=INFO "
                   "'Channel 00/..' ring lines; NCCL_TOPO_DUMP_FILE; NCCL_DEBUG_SUBSYS=GRAPH"),
    "uplink-slow": ("a link between switches slower or oversubscribed (fewer uplinks up, "
                    "other jobs on it)",
                    "the switch's port counters on that link (rate, errors, discards, "
                    "congestion / ECN marks); the uplinks up against the cabling plan"),
    "all-uplinks-slow": ("every link between switches slower: the network more "
                         "oversubscribed than the file says",
                         "the switch's uplink count and speed; counters of every uplink "
                         "while the job runs"),
    "slow-box": ("one box slower in everything (NICs, NVLink): throttled, its PCIe at "
                 "lower width, another job on it",
                 "nvidia-smi -q -d PERFORMANCE,CLOCK (throttle reasons) on each host; "
                 "running one box at a time (nccl-tests -g 8 on each)"),
    "plugin-latency": ("a latency floor from the network plugin (what NCCL adds to every "
                       "network step)",
                       "NCCL_DEBUG=INFO 'NET/Plugin' lines (which plugin, its version); "
                       "NCCL_NET_PLUGIN; the small sizes' time against ib_write_lat / "
                       "ib_send_lat between two hosts"),
}


@dataclass(frozen=True)
class Hypothesis:
    """One fault to try: ``kind`` (a key of :data:`KINDS`), where (``target``: a link's
    name, a box, ``"every NIC"``), the grid its ``parameter`` is fitted over (``values``;
    ``(None,)`` without one), and ``build(value) -> Cluster``, the cluster with that
    fault. ``stands_for`` says which like links or boxes it stands for (symmetry)."""

    kind: str
    target: str
    parameter: str | None
    values: tuple[float | None, ...]
    build: Callable[[Any], Cluster]
    stands_for: str = ""

    @property
    def free_parameters(self) -> int:
        """What the fit chose: the fault and where (1), and its parameter (1 more; a NIC
        down counts as the last value of a NIC's slow-down, 0)."""
        if self.kind == "healthy":
            return 0
        return 1 + (self.kind == "nic-down" or
                    (self.parameter is not None and len(self.values) > 1))

    def label(self, value: float | None) -> str:
        """``NIC A/nic0 at x0.25``, ``plugin latency +50 us``."""
        v = value
        what = {
            "healthy": "healthy",
            "nic-down": f"NIC {self.target} down",
            "nic-slow": f"NIC {self.target} at x{v:g}" if v is not None else "",
            "box-nics-slow": f"every NIC of box {self.target} at x{v:g}" if v else "",
            "all-nics-slow": f"every NIC at x{v:g}" if v else "",
            "fabric-slow": f"NVLink/NVSwitch of box {self.target} at x{v:g}" if v else "",
            "no-gdr": (f"no GPUDirect RDMA: NICs capped at {v / 1e9:g} GB/s, "
                       f"+{NO_GDR_LATENCY * 1e6:g} us a network step") if v else "",
            "rank-order": f"ranks ordered across racks ({self.target})",
            "uplink-slow": f"switch link {self.target} at x{v:g}" if v else "",
            "all-uplinks-slow": f"every switch link at x{v:g}" if v else "",
            "slow-box": f"box {self.target} at x{v:g} in every link" if v else "",
            "plugin-latency": f"network plugin latency +{v * 1e6:g} us" if v else "",
        }[self.kind]
        return what


def _kinds_of_boxes(cluster: Cluster) -> list[tuple[int, int]]:
    """(index of the first box of each kind, boxes of that kind)."""
    first: dict[tuple, int] = {}
    count: dict[tuple, int] = {}
    for i, box in enumerate(cluster.boxes):
        key = box.signature()
        first.setdefault(key, i)
        count[key] = count.get(key, 0) + 1
    return [(i, count[key]) for key, i in first.items()]


def _with_box(cluster: Cluster, index: int, box: Box) -> Cluster:
    boxes = list(cluster.boxes)
    boxes[index] = box
    return replace(cluster, boxes=tuple(boxes))


def nic_down(cluster: Cluster, index: int, k: int) -> Cluster:
    """``cluster`` without NIC ``k`` of box ``index``: its GPUs join the next NIC of the
    box (the one after it, wrapping), as NCCL then reaches them through that NIC."""
    box = cluster.boxes[index]
    nics = list(box.nics)
    gone = nics.pop(k)
    heir = k % len(nics)
    nics[heir] = replace(nics[heir], gpus=tuple(sorted(set(nics[heir].gpus) | set(gone.gpus))))
    return _with_box(cluster, index, replace(box, nics=tuple(nics)))


def _nics_of(cluster: Cluster, change: Callable) -> Cluster:
    boxes = tuple(replace(box, nics=tuple(change(nic) for nic in box.nics))
                  for box in cluster.boxes)
    return replace(cluster, boxes=boxes)


def no_gdr(cluster: Cluster, cap: float) -> Cluster:
    """Every NIC capped at ``cap`` bytes/s with :data:`NO_GDR_LATENCY` more on each
    network step (the planned schedules' NIC latency and the ``nccl`` row's plugin
    latency)."""
    return _nics_of(cluster, lambda nic: replace(
        nic, bandwidth=min(nic.bandwidth, cap), latency=nic.latency + NO_GDR_LATENCY,
        plugin_latency=nic.plugin_latency + NO_GDR_LATENCY))


def plugin_latency(cluster: Cluster, extra: float) -> Cluster:
    """Every NIC with ``extra`` seconds more plugin latency (the ``nccl`` row) and path
    latency (what a planned schedule's simulation reads)."""
    return _nics_of(cluster, lambda nic: replace(
        nic, latency=nic.latency + extra, plugin_latency=nic.plugin_latency + extra))


def racks_of(cluster: Cluster) -> list[list[int]]:
    """The boxes grouped by the switches their NICs plug into (a rack: one leaf), in
    file order."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, box in enumerate(cluster.boxes):
        groups.setdefault(tuple(sorted({nic.switch for nic in box.nics})), []).append(i)
    return list(groups.values())


def interleaved(cluster: Cluster) -> Cluster | None:
    """The boxes reordered to take turns between the racks (rack 0's first, rack 1's
    first, ..., rack 0's second, ...), ranks renumbered box by box: NCCL's rings and
    trees, which follow rank order, then cross between racks at every box. ``None``
    when every box sits in one rack."""
    racks = racks_of(cluster)
    if len(racks) < 2:
        return None
    order: list[int] = []
    for j in range(max(len(r) for r in racks)):
        order += [r[j] for r in racks if j < len(r)]
    boxes, first = [], 0
    for i in order:
        boxes.append(replace(cluster.boxes[i], first_rank=first))
        first += cluster.boxes[i].gpus
    return replace(cluster, boxes=tuple(boxes), name=f"{cluster.name} [ranks across racks]")


def _box_links(cluster: Cluster, box: Box) -> list[str]:
    prefix = box.name + "/"
    return [link.name for link in links(cluster) if link.name.startswith(prefix)]


def _slowed(cluster: Cluster, names: tuple[str, ...]) -> Callable[[Any], Cluster]:
    """``build(factor)``: ``cluster`` with the links ``names`` at ``factor``."""
    def build(factor: Any) -> Cluster:
        return degraded(cluster, {n: factor for n in names})
    return build


def _built(make: Callable[..., Cluster], *args: Any) -> Callable[[Any], Cluster]:
    """``build(_)``: ``make(*args)``, for a hypothesis without a parameter."""
    def build(_: Any) -> Cluster:
        return make(*args)
    return build


def hypotheses(cluster: Cluster) -> list[Hypothesis]:
    """The faults to try on ``cluster``, healthy first (about 10 to 25: one box of
    each kind, one switch link of each bandwidth and latency).

    Notes
    -----
    A NIC down is tried only in a box with more than one NIC (a box's only NIC down
    leaves it unreachable: the collective would not run). Ranks across racks is tried
    only where boxes sit under more than one switch. Each fault is fitted over a grid of
    2 to 6 values (:data:`FACTORS`, :data:`NO_GDR_CAPS`, :data:`PLUGIN_LATENCIES`).
    """
    found = [Hypothesis("healthy", "", None, (None,), lambda _: cluster)]
    kinds = _kinds_of_boxes(cluster)
    any_nics = any(box.nics for box in cluster.boxes)
    for index, count in kinds:
        box = cluster.boxes[index]
        others = (f"any one of {count} boxes like it ({box.name} shown)" if count > 1
                  else "")
        if box.nics:
            name = box.nic_node(0)
            nic_note = (f"any one NIC ({name} shown)" if count * len(box.nics) > 1 else "")
            found.append(Hypothesis("nic-slow", name, "factor", FACTORS,
                                    _slowed(cluster, (name,)), nic_note))
            if len(box.nics) > 1:
                found.append(Hypothesis("nic-down", name, None, (None,),
                                        _built(nic_down, cluster, index, 0), nic_note))
            if len(box.nics) > 1:
                names = [box.nic_node(k) for k in range(len(box.nics))]
                found.append(Hypothesis(
                    "box-nics-slow", box.name, "factor", FACTORS,
                    _slowed(cluster, tuple(names)), others))
        in_box = [n for n in _box_links(cluster, box)
                  if n.endswith("/fabric") or "/gpu" in n]
        if box.gpus > 1 and in_box:
            found.append(Hypothesis("fabric-slow", box.name, "factor", FACTORS,
                                    _slowed(cluster, tuple(in_box)), others))
        if len(cluster.boxes) > 1:
            every = tuple(_box_links(cluster, box))
            found.append(Hypothesis("slow-box", box.name, "factor", FACTORS,
                                    _slowed(cluster, every),
                                    others))
    if any_nics and len(cluster.boxes) > 1:
        all_nics = tuple(link.name for link in links(cluster) if link.kind == "nic")
        if len(all_nics) > 1:
            found.append(Hypothesis("all-nics-slow", "every NIC", "factor", FACTORS,
                                    lambda f: degraded(cluster, {n: f for n in all_nics})))
        found.append(Hypothesis("no-gdr", "every NIC", "cap", NO_GDR_CAPS,
                                lambda cap: no_gdr(cluster, cap)))
        found.append(Hypothesis("plugin-latency", "every NIC", "latency", PLUGIN_LATENCIES,
                                lambda extra: plugin_latency(cluster, extra)))
        across = interleaved(cluster)
        if across is not None:
            racks = racks_of(cluster)
            found.append(Hypothesis("rank-order", f"{len(racks)} racks taken in turn",
                                    None, (None,), lambda _: across,
                                    "boxes reordered rack by rack in turn: the nccl model "
                                    "follows rank order box by box, not GPU by GPU"))
    switch = [link for link in links(cluster) if link.kind == "switch"]
    seen: dict[float, list[str]] = {}
    for link in switch:
        seen.setdefault(link.bandwidth, []).append(link.name)
    for names in seen.values():
        note = f"any one of {len(names)} like it ({names[0]} shown)" if len(names) > 1 else ""
        found.append(Hypothesis("uplink-slow", names[0], "factor", FACTORS,
                                _slowed(cluster, (names[0],)), note))
    if len(switch) > 1:
        every_uplink = tuple(link.name for link in switch)
        found.append(Hypothesis("all-uplinks-slow", "every switch link", "factor", FACTORS,
                                lambda f: degraded(cluster, {n: f for n in every_uplink})))
    return found
