"""An NCCL topology file (``NCCL_TOPO_FILE``, ``NCCL_TOPO_DUMP_FILE``) to a cluster YAML file.

NCCL describes one host as a tree: ``<system>`` / ``<cpu>`` (a NUMA node) / ``<pci>``
(bridges, PCIe switches, devices) / ``<gpu>`` (with its ``<nvlink>`` children) and
``<nic>`` / ``<net>``. :func:`import_nccl_topology` reads such a file with the same rules
NCCL's loader uses (``src/graph/topo.cc``, ``ncclTopoGetSystemFromXml`` and the
``ncclTopoAdd*`` functions it calls) and builds a cluster YAML v1 document
(docs/CLUSTER.md): one box per copy of the host, its NVLink fabric or links, and its NICs
with the GPUs each one serves. Cluster files have no PCIe switches or CPUs, so what
they cannot say is approximated, and every approximation is returned as an
assumption: the caller prints them, and :func:`render_cluster_yaml` writes them at the
top of the file. Nothing is guessed silently; a value that is missing and not given by
an option is an error naming the element and the option to pass.

Every constant below is NCCL's, with the file and name it comes from (NVIDIA/nccl,
``src/graph/topo.h`` and ``src/graph/topo.cc``). NCCL counts bandwidth in GB/s, one
direction, as the cluster format does.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from ..errors import ClusterSpecError, TopoplanError, UnitWarning
from ..units import bare_number_note, format_bandwidth, plural
from .xmlfile import Element, read_xml

__all__ = [
    "ImportedCluster", "import_nccl_topology", "render_cluster_yaml", "nvlink_bandwidth",
    "pci_bandwidth", "inter_cpu_bandwidth", "NETWORKS",
]

GB = 1e9

# Per-link NVLink bandwidth (GB/s, one way) by the GPU's compute capability: topo.h,
# SM60_NVLINK_BW .. SM100_NVLINK_BW, chosen by ncclTopoNVLinkBw(cudaCompCap).
SM60_NVLINK_BW = 18.0
SM70_NVLINK_BW = 20.0
SM80_NVLINK_BW = 20.0
SM86_NVLINK_BW = 12.0
SM90_NVLINK_BW = 20.6
SM100_NVLINK_BW = 40.1

# PCIe: per-lane rate in units of 100 Mbit/s by the link_speed string (topo.cc,
# kvDictPciGen, matched by prefix as kvConvertToInt in xml.h does); the link's
# bandwidth is width * rate / 80.0 GB/s (topo.cc, ncclTopoAddPci). An unknown string
# falls back to 60 (8 GT/s), and width 0 ("speed not indicated in /sys") counts as 16.
PCI_GEN_RATES: tuple[tuple[str, int], ...] = (
    ("2.5 GT/s", 15), ("5 GT/s", 30), ("8 GT/s", 60), ("16 GT/s", 120), ("32 GT/s", 240),
    ("2.5 GT/s PCIe", 15), ("5.0 GT/s PCIe", 30), ("8.0 GT/s PCIe", 60),
    ("16.0 GT/s PCIe", 120), ("32.0 GT/s PCIe", 240), ("64.0 GT/s PCIe", 480),
)
PCI_GEN_FALLBACK = 60
PCI_WIDTH_UNKNOWN = 16

# Inter-CPU (SMP interconnect) bandwidth, GB/s: topo.h, chosen by
# ncclTopoGetInterCpuBw (topo.cc) from the <cpu> arch, vendor, familyid and modelid.
LOC_BW = 5000.0          # any other CPU
P9_BW = 32.0             # ppc64
ARM_BW = 6.0             # arm64
BDW_QPI_BW = 6.0         # Intel before Skylake (QPI)
SKL_QPI_BW = 10.0        # Intel family 6, model >= 0x55 (Skylake, UPI)
SRP_QPI_BW = 22.0        # Intel family 6, model >= 0x8F (Sapphire Rapids)
ERP_QPI_BW = 40.0        # Intel family 6, model >= 0xCF (Emerald Rapids)
AMD_BW = 16.0            # AuthenticAMD (Infinity Fabric)
ZPI_BW = 6.0             # Zhaoxin
YONGFENG_ZPI_BW = 9.0    # Zhaoxin family 7, model 0x5B

# GPU-to-GPU traffic through an Intel CPU's root complex costs 6/5 of its PCIe
# bandwidth: topo.h, INTEL_P2P_OVERHEAD, applied on PATH_PHB paths in search.cc
# (followPath).
INTEL_P2P_OVERHEAD = 6 / 5

# PCI class codes, matched by prefix like topo.cc's kvDictPciClass: NVSwitch is
# PCI_NVSWITCH_CLASS (xml.h), "0x068001" is a CPU (an NVLink to the CPU), "0x03" a GPU,
# "0x02" a NIC. An <nvlink> whose tclass is neither a GPU nor a CPU goes to the NVSwitch
# (topo.cc, ncclTopoAddNvLinks).
PCI_NVSWITCH_CLASS = "0x068000"
PCI_CPU_CLASS = "0x068001"
PCI_GPU_CLASS = "0x03"
PCI_NIC_CLASS = "0x02"

# A <net> speed is in Mbit/s; 0 or less (some NICs say -1) counts as 10000 (topo.cc,
# ncclTopoAddNet: net->net.bw = mbps / 8000.0 GB/s).
NET_SPEED_FALLBACK_MBPS = 10000

#: The generated networks for ``--network``; see :func:`import_nccl_topology`.
NETWORKS = ("rail", "single", "none")


def nvlink_bandwidth(sm: int) -> float:
    """Bytes/s of one NVLink of a GPU of compute capability ``sm`` (NCCL's ncclTopoNVLinkBw)."""
    if sm >= 100:
        rate = SM100_NVLINK_BW
    elif sm >= 90:
        rate = SM90_NVLINK_BW
    elif sm == 86:
        rate = SM86_NVLINK_BW
    elif sm >= 80:
        rate = SM80_NVLINK_BW
    elif sm >= 70:
        rate = SM70_NVLINK_BW
    elif sm >= 60:
        rate = SM60_NVLINK_BW
    else:
        rate = SM80_NVLINK_BW  # NCCL's default for anything older
    return rate * GB


def _nvlink_constant(sm: int) -> str:
    for low, name in ((100, "SM100"), (90, "SM90")):
        if sm >= low:
            return f"{name}_NVLINK_BW"
    if sm == 86:
        return "SM86_NVLINK_BW"
    for low, name in ((80, "SM80"), (70, "SM70"), (60, "SM60")):
        if sm >= low:
            return f"{name}_NVLINK_BW"
    return "SM80_NVLINK_BW"


def pci_bandwidth(link_speed: str, link_width: int) -> tuple[float, bool]:
    """Bytes/s of a PCIe link as NCCL computes it, and whether ``link_speed`` was known."""
    rate = None
    for prefix, value in PCI_GEN_RATES:
        if link_speed.startswith(prefix):
            rate = value
            break
    width = link_width or PCI_WIDTH_UNKNOWN
    return width * (rate or PCI_GEN_FALLBACK) / 80.0 * GB, rate is not None


def inter_cpu_bandwidth(cpu: Element) -> tuple[float, str]:
    """Bytes/s NCCL gives the link from this ``<cpu>`` to another CPU, and the constant's name."""
    arch = cpu.require("arch")
    if arch.startswith("ppc64"):
        return P9_BW * GB, "P9_BW"
    if arch.startswith("arm64"):
        return ARM_BW * GB, "ARM_BW"
    if arch.startswith("x86_64"):
        vendor = cpu.require("vendor")
        if vendor.startswith("GenuineIntel"):
            family, model = cpu.int("familyid"), cpu.int("modelid")
            if family == 6 and model >= 0xCF:
                return ERP_QPI_BW * GB, "ERP_QPI_BW"
            if family == 6 and model >= 0x8F:
                return SRP_QPI_BW * GB, "SRP_QPI_BW"
            if family == 6 and model >= 0x55:
                return SKL_QPI_BW * GB, "SKL_QPI_BW"
            return BDW_QPI_BW * GB, "BDW_QPI_BW"
        if vendor.startswith("AuthenticAMD"):
            return AMD_BW * GB, "AMD_BW"
        if vendor.startswith(("CentaurHauls", "  Shanghai  ")):
            if cpu.int("familyid") == 7 and cpu.int("modelid") == 0x5B:
                return YONGFENG_ZPI_BW * GB, "YONGFENG_ZPI_BW"
            return ZPI_BW * GB, "ZPI_BW"
    return LOC_BW * GB, "LOC_BW"


def _is_intel(cpu: Element) -> bool:
    return (cpu.get("arch", "") or "").startswith("x86_64") and \
        (cpu.get("vendor", "") or "").startswith("GenuineIntel")


@dataclass(frozen=True)
class ImportedCluster:
    """A cluster YAML v1 document built from an NCCL topology file.

    ``document`` holds plain dicts, lists, strings and numbers, ready for YAML;
    ``assumptions`` every approximation made, one sentence each; ``comments`` short
    notes the rendered file puts next to the values (keyed ``gpus``, ``fabric``,
    ``gpu_links[k]``, ``nics[k]``, ``links``).
    """

    document: dict[str, Any]
    assumptions: tuple[str, ...]
    source: str
    comments: dict[str, str] = field(default_factory=dict)

    @property
    def nranks(self) -> int:
        box = self.document["boxes"][0]
        return int(box["gpus"]) * int(box.get("count", 1))


@dataclass(frozen=True, eq=False)
class _Gpu:
    pci: Element
    gpu: Element | None  # None in a partial file (a bare <pci class="0x03...">)
    cpu: Element
    busid: str

    @property
    def dev(self) -> int | None:
        return None if self.gpu is None else self.gpu.int("dev", -1)


@dataclass(frozen=True, eq=False)
class _Nic:
    anchor: Element       # the <net>, or the bare <pci> of a partial file
    pci: Element | None   # the <pci> the NIC sits on; None for a <nic> right under <cpu>
    net: Element | None
    cpu: Element
    #: The other ports of the same card (<net> siblings under one <nic>), merged into this
    #: NIC as NCCL merges them (src/transport/net_ib/init.cc:69-70 and :198,
    #: NCCL_IB_MERGE_NICS).
    ports: tuple[Element, ...] = ()

    @property
    def label(self) -> str:
        parts = []
        if self.net is not None and self.net.get("name"):
            parts.append("+".join(str(n.get("name")) for n in (self.net, *self.ports)
                                  if n.get("name")))
        if self.pci is not None and self.pci.get("busid"):
            parts.append(f"PCI {self.pci.get('busid')}")
        return ", ".join(parts) or self.anchor.path


class _Host:
    """The parsed tree of one host: its GPUs, NICs and the parent of every element."""

    def __init__(self, root: Element) -> None:
        self.root = root
        self.parent: dict[Element, Element] = {}
        for element in root.iter():
            for child in element.children:
                self.parent[child] = element
        self.cpus = root.find_all("cpu")

    def ancestors(self, element: Element) -> list[Element]:
        """``element``, its parent, ... up to and including its ``<cpu>``."""
        chain = [element]
        while chain[-1].tag != "cpu":
            chain.append(self.parent[chain[-1]])
        return chain

    def cpu_of(self, element: Element) -> Element:
        return self.ancestors(element)[-1]


def _pci_class(pci: Element) -> str:
    return pci.require("class").strip().lower()


def _busid(pci: Element) -> str:
    return pci.require("busid").strip().lower()


def _busid_key(busid: str) -> tuple[int, str]:
    digits = re.sub(r"[^0-9a-f]", "", busid)
    return (int(digits, 16) if digits else -1, busid)


def import_nccl_topology(path: str | Path, *, nodes: int = 1, network: str = "rail",
                         overlay: str | Path | None = None,
                         nvlink_per_gpu: float | None = None, nic_speed: float | None = None,
                         name: str | None = None) -> ImportedCluster:
    """Build a cluster YAML v1 document from an NCCL topology file of one host.

    Parameters
    ----------
    path
        The NCCL topology XML (as written by ``NCCL_TOPO_DUMP_FILE`` or given to
        ``NCCL_TOPO_FILE``); one host (one ``host_hash``).
    nodes
        How many copies of the host the cluster has (box ``node{i}``, ``count: nodes``).
    network
        ``"rail"``: NIC k of every node on switch ``rail{k}``, the rails joined by one
        switch ``spine`` with a non-blocking link per rail (nodes x that NIC's
        bandwidth); ``"single"``: every NIC on one switch ``spine``; ``"none"``: no NICs
        (one node only). Ignored when ``overlay`` is given.
    overlay
        A YAML file with ``switches`` and ``links`` (cluster v1 syntax) and
        ``nic_switches`` (one switch name per NIC, in the order of the output, or one
        name for all; ``{i}`` is the node index): the network to use instead.
    nvlink_per_gpu
        Bytes/s of NVLink per GPU to an NVSwitch fabric, for files without ``<gpu>``
        elements or to override them; ``0`` says the GPUs have no NVLink (PCIe only).
    nic_speed
        Bytes/s of every NIC, for files without ``<net>`` elements or to override them.
    name
        The cluster's name (default: the file's stem).

    Returns
    -------
    ImportedCluster
        The document, the assumptions made, and comments for :func:`render_cluster_yaml`.
        The document is checked with :func:`topoplan.cluster.loads_cluster` before it
        is returned.

    Raises
    ------
    XmlFormatError
        The file is not XML, not an NCCL topology, or lacks a value no option gives;
        the message names file, line and element (and the option to pass).
    ClusterSpecError
        The overlay is malformed, or the cluster built with it does not load.
    TopoplanError
        The options contradict each other (``network="none"`` with several nodes, no
        NIC in the file for several nodes).

    References
    ----------
    NVIDIA/nccl, ``src/graph/topo.cc`` (``ncclTopoGetSystemFromXml``, ``ncclTopoAddPci``,
    ``ncclTopoAddNvLinks``, ``ncclTopoAddNet``, ``ncclTopoGetInterCpuBw``) and
    ``src/graph/topo.h`` (the bandwidth constants).
    """
    if nodes < 1:
        raise TopoplanError(f"nodes must be >= 1, got {nodes}")
    if network not in NETWORKS:
        raise TopoplanError(f"unknown network {network!r}; use one of {', '.join(NETWORKS)}")
    root = read_xml(path)
    host = _check_system(root)
    notes: list[str] = []
    comments: dict[str, str] = {}

    gpus = _find_gpus(host, notes)
    nics = _find_nics(host, notes)
    _note_ignored(root, notes)
    box: dict[str, Any] = {"name": "node{i}", "count": nodes, "gpus": len(gpus)}
    comments["gpus"] = "; ".join(
        f"GPU {j} = PCI {g.busid}" + (f" (dev {g.dev})" if g.dev is not None and g.dev >= 0
                                       else "") for j, g in enumerate(gpus))

    fabric, gpu_links = _in_box(host, gpus, nvlink_per_gpu, notes, comments)
    model = _gpu_model(gpus, notes)
    if model is not None:
        box["gpu"] = model
    if fabric is not None:
        box["fabric"] = {"bandwidth": _bw(fabric)}
        nvswitch = comments.get("fabric", "").startswith("NVSwitch")
        box["fabric"]["kind"] = "nvswitch" if nvswitch else "pcie"
        if nvswitch and model in NVLS_MODELS:
            # NCCL runs NVLS on NVSwitch systems of sm 90 and later (search.cc:
            # ncclTopoCompute skips the NVLS pattern without an NVSwitch or below sm 90).
            box["fabric"]["nvls"] = True
            notes.append(f"NVLS: an NVSwitch with {model} GPUs (sm 90 and later) reduces "
                         "and multicasts (NVLink SHARP), as NCCL's NVLS algorithm uses it")
    if gpu_links:
        box["gpu_links"] = gpu_links

    nic_entries = [] if network == "none" and overlay is None else \
        _nic_entries(host, gpus, nics, nic_speed, notes, comments)
    document: dict[str, Any] = {
        "name": name or _default_name(Path(path)),
        "version": 1,
        "description": f"imported from the NCCL topology file {Path(path).name}",
    }
    if overlay is not None:
        switches, links, nic_switches = _read_overlay(overlay, len(nic_entries))
        for nic, switch in zip(nic_entries, nic_switches):
            nic["switch"] = switch
        notes.append(f"network: from the overlay {overlay} (switches, links and the switch "
                     "of every NIC), not generated")
    else:
        switches, links = _network(network, nodes, nic_entries, notes, comments)
    if nodes > 1 and not nic_entries:
        if network == "none" and overlay is None:
            raise TopoplanError(f"--network none leaves the nodes without NICs; {nodes} nodes "
                                "need a network: use --network rail or single")
        raise root.error(f"the file lists no NIC, and {nodes} nodes need one each; import "
                         "with --nodes 1, or use a file with <nic>/<net> elements")
    if nic_entries:
        box["nics"] = nic_entries
    if switches:
        document["switches"] = switches
    document["boxes"] = [box]
    if links:
        document["links"] = links

    if nodes > 1:
        notes.append(f"nodes: {nodes} identical copies of this host (node0 .. node{nodes - 1})")
    notes.append("latency: an NCCL topology file gives no link latency, so every latency "
                 "is 0; add latency: keys by hand where it matters")
    imported = ImportedCluster(document, tuple(notes), str(path), comments)
    _check_loads(imported, overlay)
    return imported


#: The GPU model of each compute capability NCCL's tables distinguish (sm 90 is H100 or
#: H200: one architecture, one table).
SM_MODELS = {70: "V100", 80: "A100", 90: "H100", 100: "B200"}
NVLS_MODELS = ("H100", "H200", "B200")


def _gpu_model(gpus: list[_Gpu], notes: list[str]) -> str | None:
    """``boxes[].gpu`` from the GPUs' ``sm`` (None when unknown or mixed, with a note)."""
    sms = {g.gpu.int("sm") for g in gpus if g.gpu is not None and "sm" in g.gpu.attrs}
    if len(sms) != 1 or len(sms) == 1 and any(g.gpu is None for g in gpus):
        if sms:
            notes.append(f"gpu: the GPUs report sm {', '.join(map(str, sorted(sms)))}; no "
                         "single model written (NCCL's Ampere tables apply)")
        return None
    sm = sms.pop()
    model = SM_MODELS.get(sm)
    if model is None:
        notes.append(f"gpu: sm {sm} is none of {', '.join(f'{m} (sm {s})' for s, m in SM_MODELS.items())}; "
                     "no model written (NCCL's Ampere tables apply)")
    elif sm == 90:
        notes.append("gpu: sm 90 is written as H100 (an H200 has the same NCCL tables)")
    return model


def _default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9]+", "-", path.stem).strip("-").lower()
    return stem or "nccl-topology"


def _check_system(root: Element) -> _Host:
    if root.tag != "system":
        raise root.error(f"not an NCCL topology file: the root element is <{root.tag}>, "
                         "NCCL's is <system version=\"1\">")
    version = root.int("version")
    if version != 1:  # NCCL_TOPO_XML_VERSION, xml.h; NCCL refuses any other
        raise root.error(f"version {version} is not supported; NCCL reads version 1 "
                         "(NCCL_TOPO_XML_VERSION)", "version")
    host = _Host(root)
    if not host.cpus:
        raise root.error("no <cpu> element: NCCL's topology puts every device under a "
                         "<cpu> (NUMA node)")
    hashes = {cpu.get("host_hash") for cpu in host.cpus}
    if len(hashes) > 1:
        other = next(cpu for cpu in host.cpus if cpu.get("host_hash") != host.cpus[0].get(
            "host_hash"))
        raise other.error(f"the file describes {len(hashes)} hosts (host_hash values "
                          f"{', '.join(sorted(str(h) for h in hashes))}); import the file "
                          "of one host and use --nodes", "host_hash")
    return host


def _find_gpus(host: _Host, notes: list[str]) -> list[_Gpu]:
    with_gpu: list[_Gpu] = []
    bare: list[_Gpu] = []
    for cpu in host.cpus:
        for pci in cpu.iter("pci"):
            subs = pci.find_all("gpu")
            if len(subs) > 1:
                raise subs[1].error(f"{len(subs)} <gpu> elements under one <pci> (several "
                                    "ranks per GPU, or MLOPart): not supported; one GPU is one "
                                    "rank in a cluster file")
            if subs:
                with_gpu.append(_Gpu(pci, subs[0], cpu, _busid(pci)))
            elif _pci_class(pci).startswith(PCI_GPU_CLASS):
                bare.append(_Gpu(pci, None, cpu, _busid(pci)))
    if with_gpu and bare:
        notes.append(f"ignored {plural(len(bare), 'display-class <pci> element')} without a "
                     "<gpu> "
                     f"child ({', '.join(g.busid for g in bare)}): NCCL did not use them")
        bare = []
    gpus = with_gpu or bare
    if not gpus:
        raise host.root.error("no GPU: neither a <gpu> element nor a <pci> of class 0x03xxxx")
    seen: dict[str, _Gpu] = {}
    for g in gpus:
        if g.busid in seen:
            raise g.pci.error(f"busid {g.busid} repeats (first on line {seen[g.busid].pci.line})",
                              "busid")
        seen[g.busid] = g
    if all(g.dev is not None and g.dev >= 0 for g in gpus):
        gpus.sort(key=lambda g: (g.dev, _busid_key(g.busid)))
        notes.append("GPU order: by the <gpu dev> attribute (the CUDA/NVML device index)")
    else:
        gpus.sort(key=lambda g: _busid_key(g.busid))
        notes.append("GPU order: by PCI bus id (the CUDA device order with "
                     "CUDA_DEVICE_ORDER=PCI_BUS_ID); the file gives no <gpu dev>")
    return gpus


def _find_nics(host: _Host, notes: list[str]) -> list[_Nic]:
    nics: list[_Nic] = []
    bare: list[_Nic] = []
    for cpu in host.cpus:
        for element in cpu.iter():
            if element.tag == "nic":
                parent = host.parent[element]
                pci = parent if parent.tag == "pci" else None
                nets = [net for net in element.find_all("net")
                        # NCCL skips a <net> without dev (ncclTopoAddNic) and a GIN/RMA-only
                        # device (net="0"), not a network device for it
                        if "dev" in net.attrs and net.int("net", 1) != 0]
                if nets:
                    # The ports of one card are one device to NCCL (net_ib/init.cc:69: "Merge
                    # multi-port NICs into the same PCI device", NCCL_IB_MERGE_NICS=1).
                    nics.append(_Nic(nets[0], pci, nets[0], cpu, tuple(nets[1:])))
                    if len(nets) > 1:
                        notes.append(f"{len(nets)} ports of one card "
                                     f"({', '.join(str(n.get('name', n.path)) for n in nets)}) "
                                     "merged into one NIC of their summed speed, as NCCL "
                                     "does (NCCL_IB_MERGE_NICS=1)")
            elif element.tag == "pci" and not element.find_all("nic") and \
                    _pci_class(element).startswith(PCI_NIC_CLASS):
                bare.append(_Nic(element, element, None, cpu))
    if nics and bare:
        notes.append(f"ignored {plural(len(bare), 'network-class <pci> element')} without a "
                     "<nic> "
                     f"child ({', '.join(_busid(n.anchor) for n in bare)}): NCCL did not use "
                     "them")
        bare = []
    return nics or bare


_READ = {"system", "cpu", "pci", "gpu", "nvlink", "nic", "net"}
_IGNORED = {"c2c": "GPU-CPU C2C links (a cluster file has no CPU)",
            "pcilink": "PCI links between bridges (the PCIe tree alone is used)"}


def _note_ignored(root: Element, notes: list[str]) -> None:
    counts: dict[str, int] = {}
    for element in root.iter():
        if element.tag not in _READ:
            counts[element.tag] = counts.get(element.tag, 0) + 1
    for tag, count in sorted(counts.items()):
        what = _IGNORED.get(tag, "not an element NCCL's loader reads")
        notes.append(f"ignored {count} <{tag}> element{'s' if count > 1 else ''}: {what}")


def _link_bandwidth(pci: Element, notes: list[str]) -> float:
    """Bytes/s of the PCIe link from ``pci`` up to its parent (NCCL's ncclTopoAddPci)."""
    width = pci.int("link_width", minimum=0)
    speed = pci.require("link_speed")
    bandwidth, known = pci_bandwidth(speed, width)
    if not known:
        note = (f"PCIe link_speed {speed!r} is not in NCCL's kvDictPciGen; counted as "
                f"8 GT/s per lane like NCCL ({pci.path}, line {pci.line})")
        if note not in notes:
            notes.append(note)
    return bandwidth


def _pcie_path(host: _Host, a: Element, b: Element, notes: list[str]) -> tuple[float, str]:
    """Bottleneck bytes/s of the PCIe path between two devices, and how it goes."""
    up_a, up_b = host.ancestors(a), host.ancestors(b)
    common = next((e for e in up_a if e in set(up_b)), None)
    if common is not None:
        links = up_a[:up_a.index(common)] + up_b[:up_b.index(common)]
        bandwidth = min(_link_bandwidth(e, notes) for e in links)
        if common.tag == "cpu":
            if _is_intel(common):
                return bandwidth / INTEL_P2P_OVERHEAD, "through an Intel CPU (INTEL_P2P_OVERHEAD)"
            return bandwidth, "through the CPU"
        return bandwidth, "through a PCIe switch"
    links = up_a[:-1] + up_b[:-1]
    cpu_a, cpu_b = up_a[-1], up_b[-1]
    (bw_a, name_a), (bw_b, name_b) = inter_cpu_bandwidth(cpu_a), inter_cpu_bandwidth(cpu_b)
    bandwidth = min([bw_a, bw_b] + [_link_bandwidth(e, notes) for e in links])
    names = name_a if name_a == name_b else f"{name_a}/{name_b}"
    return bandwidth, f"across CPUs ({names} = {format_bandwidth(min(bw_a, bw_b))})"


def _in_box(host: _Host, gpus: list[_Gpu], nvlink_per_gpu: float | None, notes: list[str],
            comments: dict[str, str]) -> tuple[float | None, list[dict[str, Any]]]:
    """The box's fabric bandwidth (or None) and its direct GPU links."""
    n = len(gpus)
    if nvlink_per_gpu is not None and nvlink_per_gpu > 0:
        if any(g.gpu is not None and g.gpu.find_all("nvlink") for g in gpus):
            notes.append("NVLink: --nvlink-per-gpu overrides the file's <nvlink> elements")
        notes.append(f"NVLink: every GPU on an NVSwitch fabric of "
                     f"{format_bandwidth(nvlink_per_gpu)} per GPU each way (--nvlink-per-gpu)")
        comments["fabric"] = "NVSwitch, from --nvlink-per-gpu"
        return nvlink_per_gpu, []
    if nvlink_per_gpu is None:
        for g in sorted(gpus, key=lambda g: g.pci.line):
            if g.gpu is None:
                raise g.pci.error(
                    "a GPU without a <gpu> child: its NVLinks are unknown; pass "
                    "--nvlink-per-gpu BW (GPUs on an NVSwitch, bandwidth per GPU each way, "
                    "e.g. 240GB/s for A100: 12 x 20 GB/s) or --nvlink-per-gpu none (PCIe only)")
    index = {g.busid: j for j, g in enumerate(gpus)}
    to_switch = [0] * n
    direct: dict[tuple[int, int], float] = {}
    direct_count: dict[tuple[int, int], int] = {}
    direct_sm: dict[tuple[int, int], int] = {}
    if nvlink_per_gpu is None:
        for j, g in enumerate(gpus):
            assert g.gpu is not None  # checked above
            for link in g.gpu.find_all("nvlink"):
                count = link.int("count", minimum=0)
                if count == 0:
                    continue  # NCCL would add a link of bandwidth 0
                tclass = link.require("tclass").strip().lower()
                if tclass.startswith(PCI_CPU_CLASS):
                    notes.append(f"NVLink to the CPU ignored (GPU {j}, {link.path}, line "
                                 f"{link.line}): a cluster file has no CPU")
                    continue
                sm = g.gpu.int("sm")
                if tclass.startswith(PCI_GPU_CLASS):
                    target = link.require("target").strip().lower()
                    if target not in index:
                        raise link.error(f"target {target} is not a GPU of this file", "target")
                    k = index[target]
                    direct[(j, k)] = direct.get((j, k), 0.0) + count * nvlink_bandwidth(sm)
                    direct_count[(j, k)] = direct_count.get((j, k), 0) + count
                    direct_sm[(j, k)] = sm
                else:
                    to_switch[j] += count
    elif nvlink_per_gpu == 0:
        notes.append("NVLink: none (--nvlink-per-gpu none); the GPUs talk over PCIe")

    fabric: float | None = None
    on_switch = [j for j in range(n) if to_switch[j]]
    if on_switch:
        if len(on_switch) < n:
            j = next(j for j in range(n) if not to_switch[j])
            raise gpus[j].pci.error(
                f"GPU {j} has no NVLink to the NVSwitch while {len(on_switch)} other GPUs "
                "have; a cluster file's fabric joins every GPU of the box; repair the file, "
                "or pass --nvlink-per-gpu BW")
        per_gpu = []
        for j in range(n):
            gpu = gpus[j].gpu
            assert gpu is not None
            sm = gpu.int("sm")
            per_gpu.append((to_switch[j] * nvlink_bandwidth(sm), to_switch[j], sm))
        fabric = min(b for b, _, _ in per_gpu)
        _, links, sm = min(per_gpu)
        comments["fabric"] = (f"NVSwitch: {links} NVLinks x "
                              f"{format_bandwidth(nvlink_bandwidth(sm))} "
                              f"(NCCL {_nvlink_constant(sm)}, sm {sm})")
        if len({b for b, _, _ in per_gpu}) > 1:
            notes.append("NVSwitch fabric: the GPUs have different NVLink bandwidth to the "
                         f"switches ({', '.join(format_bandwidth(b) for b, _, _ in per_gpu)}); "
                         f"the fabric uses the smallest, {format_bandwidth(fabric)}")
        notes.append("NVSwitch fabric: non-blocking, every GPU sends at its NVLink bandwidth "
                     "to any other GPU at once (the switches themselves are not modelled)")

    gpu_links: list[dict[str, Any]] = []
    for (j, k), forward in sorted(direct.items()):
        if j > k and (k, j) in direct:
            continue
        backward = direct.get((k, j))
        count = direct_count[(j, k)]
        bandwidth = forward
        if backward is None:
            notes.append(f"NVLink GPU {j} - GPU {k}: listed only on GPU {j}'s side; taken as "
                         "full duplex")
        elif backward != forward:
            bandwidth = min(forward, backward)
            count = min(count, direct_count[(k, j)])
            notes.append(f"NVLink GPU {j} - GPU {k}: the two sides list "
                         f"{direct_count[(j, k)]} and {direct_count[(k, j)]} links; the "
                         "smaller is used both ways")
        a, b = min(j, k), max(j, k)
        sm = direct_sm[(j, k)]
        comments[f"gpu_links[{len(gpu_links)}]"] = (
            f"{count} NVLink{'s' if count > 1 else ''} x {format_bandwidth(bandwidth / count)} "
            f"(NCCL {_nvlink_constant(sm)}, sm {sm})")
        gpu_links.append({"a": a, "b": b, "bandwidth": _bw(bandwidth / count),
                          **({"count": count} if count > 1 else {})})

    if fabric is None and n > 1:
        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from((link["a"], link["b"]) for link in gpu_links)
        linked = {(link["a"], link["b"]) for link in gpu_links}
        if not nx.is_connected(graph):
            fabric = _pcie_fabric(host, gpus, linked, notes, comments)
        elif len(linked) < n * (n - 1) // 2:
            notes.append("NVLink: GPU pairs without a direct NVLink relay through other GPUs "
                         "over NVLink (the cluster format's rule for a box without a fabric); "
                         "their PCIe path is left out")
    return fabric, gpu_links


def _pcie_fabric(host: _Host, gpus: list[_Gpu], linked: set[tuple[int, int]],
                 notes: list[str], comments: dict[str, str]) -> float:
    worst: tuple[float, int, int, str] | None = None
    for j in range(len(gpus)):
        for k in range(j + 1, len(gpus)):
            if (j, k) in linked:
                continue
            bandwidth, how = _pcie_path(host, gpus[j].pci, gpus[k].pci, notes)
            if worst is None or bandwidth < worst[0]:
                worst = (bandwidth, j, k, how)
    assert worst is not None  # called only when some pair has no direct link
    bandwidth, j, k, how = worst
    comments["fabric"] = f"PCIe: bottleneck of GPU {j} - GPU {k}, {how}"
    what = "the GPU pairs without NVLink" if linked else "the GPUs"
    notes.append(f"PCIe: {what} talk through a fabric of {format_bandwidth(bandwidth)} per GPU, "
                 f"the slowest GPU-to-GPU PCIe path (GPU {j} - GPU {k}, {how}); the "
                 "sharing of PCIe switch uplinks and CPU links by several GPUs is not "
                 "modelled")
    return bandwidth


def _nic_entries(host: _Host, gpus: list[_Gpu], nics: list[_Nic], nic_speed: float | None,
                 notes: list[str], comments: dict[str, str]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    capped: dict[tuple[float, float, str], list[int]] = {}
    gpu_of = {g.pci: j for j, g in enumerate(gpus)}
    for k, nic in enumerate(nics):
        if nic.net is None:
            if nic_speed is None:
                raise nic.anchor.error(
                    "a NIC without a <nic>/<net> child: its speed is unknown; pass "
                    "--nic-speed BW (e.g. 200Gbit/s)")
            bandwidth, origin = nic_speed, "--nic-speed"
        elif nic_speed is not None:
            bandwidth, origin = nic_speed, "--nic-speed"
            if "speed" in nic.net.attrs:
                notes.append(f"NIC {k} ({nic.label}): --nic-speed overrides the file's "
                             f"speed={nic.net.get('speed')} Mbps")
        else:
            mbps = sum(max(net.int("speed", 0), 0) for net in (nic.net, *nic.ports))
            if mbps <= 0:
                notes.append(f"NIC {k} ({nic.label}): speed missing or <= 0; "
                             f"{NET_SPEED_FALLBACK_MBPS} Mbps like NCCL (ncclTopoAddNet)")
                mbps = NET_SPEED_FALLBACK_MBPS
            bandwidth, origin = mbps / 8000.0 * GB, f"speed {mbps} Mbps"

        served, how = _served_gpus(host, nic, gpu_of)
        if how:
            notes.append(f"NIC {k} ({nic.label}): {how}")
        if nic.pci is not None:
            cap, path = min(_pcie_path(host, gpus[j].pci, nic.pci, notes) for j in served)
            if cap < bandwidth:
                capped.setdefault((bandwidth, cap, path), []).append(k)
                bandwidth = cap
        comments[f"nics[{k}]"] = f"{nic.label}, {origin}"
        entry: dict[str, Any] = {"switch": "", "bandwidth": _bw(bandwidth)}
        if len(served) < len(gpus):
            entry["gpus"] = served
        latency = _plugin_latency_us(nic, k, notes)
        if latency > 0:
            entry["plugin_latency"] = f"{latency:g} us"
        entries.append(entry)
    for (bandwidth, cap, path), which in capped.items():
        notes.append(f"NIC{'s' if len(which) > 1 else ''} {', '.join(map(str, which))}: "
                     f"{format_bandwidth(bandwidth)} capped to {format_bandwidth(cap)}, the "
                     f"PCIe path between the NIC and its GPU(s) ({path}), as NCCL would")
    if entries:
        notes.append("NICs: each NIC serves the GPUs that share its nearest PCIe switch "
                     "(else the GPUs of its CPU); a GPU reaches its NIC at the NIC's bandwidth")
    return entries


def _plugin_latency_us(nic: _Nic, k: int, notes: list[str]) -> float:
    """The latency the network plugin reported for a NIC, in microseconds: the ``<net
    latency>`` NCCL writes from ``ncclNetProperties_t.latency`` (src/graph/topo.cc,
    ``ncclTopoPopulateNics``) and reads back as the NET node's latency (``ncclTopoAddNet``;
    absent is 0). The largest of a merged card's ports; a negative value is left out."""
    if nic.net is None:
        return 0.0
    values = [net.float("latency") for net in (nic.net, *nic.ports) if "latency" in net.attrs]
    latency = max(values, default=0.0)
    if latency < 0:
        notes.append(f"NIC {k} ({nic.label}): latency={latency:g} us is negative; "
                     "plugin_latency left out (0)")
        return 0.0
    if latency > 0:
        notes.append(f"NIC {k} ({nic.label}): plugin_latency {latency:g} us, the latency "
                     "its network plugin reports (<net latency>)")
    return latency


def _served_gpus(host: _Host, nic: _Nic, gpu_of: dict[Element, int]) -> tuple[list[int], str]:
    """The GPUs a NIC serves (box-local indexes), and a note when not by a PCIe switch."""
    if nic.pci is not None:
        node = host.parent[nic.pci]
        while node.tag != "cpu":
            below = sorted(gpu_of[e] for e in node.iter("pci") if e in gpu_of)
            if below:
                return below, ""
            node = host.parent[node]
    numa = nic.cpu.get("numaid", "?")
    on_cpu = sorted(gpu_of[e] for e in nic.cpu.iter("pci") if e in gpu_of)
    if on_cpu:
        return on_cpu, (f"shares no PCIe switch with a GPU; serves the GPUs of its CPU "
                        f"(NUMA node {numa}): {on_cpu}")
    return sorted(gpu_of.values()), (f"its CPU (NUMA node {numa}) has no GPU; serves every "
                                     "GPU of the box")


def _network(network: str, nodes: int, nics: list[dict[str, Any]], notes: list[str],
             comments: dict[str, str]) -> tuple[list[Any], list[dict[str, Any]]]:
    if not nics:
        return [], []
    if network == "single":
        for nic in nics:
            nic["switch"] = "spine"
        notes.append("network (--network single): every NIC of every node on one "
                     "non-blocking switch 'spine'")
        return ["spine"], []
    for k, nic in enumerate(nics):
        nic["switch"] = f"rail{k}"
    bandwidths = [nodes * _parse_bw(nic["bandwidth"]) for nic in nics]
    links: list[dict[str, Any]]
    if len(set(bandwidths)) == 1:
        links = [{"a": "rail{i}", "b": "spine", "count": len(nics),
                  "bandwidth": _bw(bandwidths[0])}]
    else:
        links = [{"a": f"rail{k}", "b": "spine", "bandwidth": _bw(b)}
                 for k, b in enumerate(bandwidths)]
    comments["links"] = (f"each rail to the spine: {plural(nodes, 'node')} x its NIC bandwidth "
                         "(non-blocking); change it with the node count")
    notes.append("network (--network rail): NIC k of every node on switch rail{k}; the "
                 "rails joined by one switch 'spine', each rail-spine link as fast as all "
                 "the NICs on that rail (non-blocking)")
    return [{"name": "rail{i}", "count": len(nics)}, "spine"], links


def _read_overlay(path: str | Path, nnics: int) -> tuple[list[Any], list[Any], list[str]]:
    from .._yaml import LineDict, LineList, load_yaml, read_text

    file = str(path)
    text = read_text(path, "the overlay")
    doc = load_yaml(text, file)
    if not isinstance(doc, LineDict):
        raise ClusterSpecError("an overlay is a mapping with switches, links and "
                               "nic_switches", file=file, line=getattr(doc, "line", 1))
    allowed = ("switches", "links", "nic_switches")
    for key in doc:
        if key not in allowed:
            raise ClusterSpecError(f"unknown key {key!r}; allowed: {', '.join(allowed)}",
                                   file=file, line=doc.line_of(key), key=key)
    if "nic_switches" not in doc:
        raise ClusterSpecError("missing: the switch of each NIC (a list with one name per "
                               "NIC, or one name for all)", file=file, line=doc.line,
                               key="nic_switches")
    raw = doc["nic_switches"]
    names = [raw] * nnics if isinstance(raw, str) else raw
    if not isinstance(names, LineList) and not isinstance(raw, str):
        raise ClusterSpecError("expected a list of switch names or one name",
                               file=file, line=doc.line_of("nic_switches"), key="nic_switches")
    if len(names) != nnics or not all(isinstance(s, str) for s in names):
        raise ClusterSpecError(f"expected {nnics} switch names (one per NIC of the file), got "
                               f"{raw!r}", file=file, line=doc.line_of("nic_switches"),
                               key="nic_switches")
    for key in ("switches", "links"):
        if key in doc and not isinstance(doc[key], LineList):
            raise ClusterSpecError("expected a list", file=file, line=doc.line_of(key), key=key)
    links = _plain(doc.get("links", []))
    for n, link in enumerate(doc.get("links", [])):
        for key in ("bandwidth", "latency") if isinstance(link, LineDict) else ():
            # Warned about here, naming the overlay's line; the cluster file written
            # gets the unit, so its reader has nothing left to warn about.
            note = bare_number_note(link.get(key), key)
            if note is not None:
                warnings.warn(UnitWarning(note, file=file, line=link.line_of(key),
                                          key=f"links[{n}].{key}"), stacklevel=3)
                links[n][key] = f"{float(link[key]):g} {'GB/s' if key == 'bandwidth' else 'us'}"
    return _plain(doc.get("switches", [])), links, list(names)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _bw(bytes_per_s: float) -> str:
    return f"{bytes_per_s / GB:.6g} GB/s"


def _parse_bw(text: str) -> float:
    return float(text.split()[0]) * GB


def _check_loads(imported: ImportedCluster, overlay: str | Path | None) -> None:
    from ..cluster import loads_cluster

    where = f"<cluster built from {Path(imported.source).name}>"
    try:
        loads_cluster(render_cluster_yaml(imported), where)
    except ClusterSpecError as exc:
        if overlay is not None:
            raise ClusterSpecError(f"the cluster built with the overlay does not load: {exc}",
                                   file=str(overlay)) from None
        raise


# ---------------------------------------------------------------------------- rendering

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*(?: [A-Za-z0-9_./-]+)*$")


def _scalar(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return yaml.safe_dump(value).splitlines()[0]
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    text = str(value)
    if _PLAIN.match(text) and yaml.safe_load(text) == text:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _flow(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _scalar(value)


def _comment(text: str, width: int = 92) -> list[str]:
    """``text`` as ``# `` lines of at most ``width`` characters."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width - 2:
            lines.append("# " + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append("# " + line)
    return lines


def render_cluster_yaml(imported: ImportedCluster, command: str | None = None) -> str:
    """The document as a cluster YAML v1 text, with the source and assumptions on top.

    ``command`` (the command line that made it) goes into the header when given.
    """
    doc, notes = imported.document, imported.comments
    out = _comment(f"Cluster YAML v1 (docs/CLUSTER.md), imported from the NCCL topology file "
                   f"{Path(imported.source).name}" + (f" by `{command}`" if command else "")
                   + ".")
    if imported.assumptions:
        out.append("# Assumptions and simplifications:")
        for note in imported.assumptions:
            first, *rest = _comment(note, 90)
            out.append("# - " + first[2:])
            out.extend("#   " + line[2:] for line in rest)
    for key in ("name", "version", "description"):
        out.append(f"{key}: {_scalar(doc[key])}")
    if doc.get("switches"):
        out.append("switches:")
        out.extend(f"  - {_flow(s)}" for s in doc["switches"])
    out.append("boxes:")
    for box in doc["boxes"]:
        out.append(f"  - name: {_scalar(box['name'])}")
        out.append(f"    count: {box['count']}")
        if notes.get("gpus"):
            items = notes["gpus"].split("; ")
            for start in range(0, len(items), 3):
                out.append("    # " + "; ".join(items[start:start + 3]))
        out.append(f"    gpus: {box['gpus']}")
        if "gpu" in box:
            out.append(f"    gpu: {box['gpu']}")
        if "fabric" in box:
            out.append(f"    fabric: {_flow(box['fabric'])}" + _trailing(notes.get("fabric")))
        for key in ("gpu_links", "nics"):
            if box.get(key):
                out.append(f"    {key}:")
                out.extend(f"      - {_flow(item)}" + _trailing(notes.get(f"{key}[{k}]"))
                           for k, item in enumerate(box[key]))
    if doc.get("links"):
        out.append("links:")
        if notes.get("links"):
            out.extend("  " + line for line in _comment(notes["links"], 90))
        out.extend(f"  - {_flow(link)}" for link in doc["links"])
    return "\n".join(out) + "\n"


def _trailing(comment: str | None) -> str:
    return f"  # {comment}" if comment else ""
