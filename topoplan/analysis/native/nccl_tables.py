"""NCCL's own constants, as its tuner and topology search use them.

Every number here is copied from NVIDIA/nccl and carries the file and name it comes
from. The module-level tables are those of NCCL 2.30 (``master`` at commit 5067397c,
``makefiles/version.mk``: 2.30.7), the version the model follows by default
(:data:`DEFAULT_VERSION`); :func:`constants` gives the tables of each version in
:data:`VERSIONS` where they differ (the tags ``v2.27.7-1``, ``v2.28.9-1``, ``v2.29.7-1``,
``v2.30.7-1``). Nothing is fitted to a measurement: the measurements in
docs/NCCL_MODEL.md check the model, they never set it.

Bandwidths are GB/s one way (NCCL's unit; 1 GB/s = 1e9 bytes/s), latencies
microseconds, as in NCCL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = [
    "ALGORITHMS", "PROTOCOLS", "RING", "TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS",
    "NVLS_TREE", "PAT", "LL", "LL128", "SIMPLE", "BASE_LATENCY", "HW_LATENCY",
    "LL_MAX_BW", "PER_CH_MAX_RING_LL128_BW", "PER_CH_MAX_TREE_LL128_BW", "PER_CH_MAX_TREE_BW",
    "PER_CH_MAX_NVLS_TREE_BW", "NVLS_EFFICIENCY", "TREE_CORRECTION", "SPEEDS_INTRA",
    "SPEEDS_INTER", "NVLINK_BW", "NVLINK_SPEC_BW", "COMPCAP", "compcap_index",
    "MAXCHANNELS", "RING_MAX_CHANNELS", "NVLS_MAX_ARITY", "DIRECT_MAX_ARITY",
    "NVLS_CHANNELS", "MAX_NTHREADS", "THREAD_THRESHOLD", "NET_OVERHEAD_US", "PCI_BW",
    "LOC_BW", "ALGORITHM_NAMES", "TUNER_NAMES", "VERSIONS", "DEFAULT_VERSION",
    "VersionTables", "constants",
]

# Algorithm and protocol indexes, in NCCL's order (src/include/device.h:
# NCCL_ALGO_TREE 0 .. NCCL_ALGO_PAT 6; NCCL_PROTO_LL 0, LL128 1, SIMPLE 2).
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
ALGORITHMS = (TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT)
LL, LL128, SIMPLE = range(3)
PROTOCOLS = (LL, LL128, SIMPLE)

#: NCCL's names (``ncclAlgoStr``, ``ncclProtoStr`` in src/enqueue.cc / device.h), as
#: NCCL_DEBUG=INFO prints them and NCCL_ALGO / NCCL_PROTO take them.
ALGORITHM_NAMES = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
PROTOCOL_NAMES = ("LL", "LL128", "Simple")

#: The spelling of plugins/tuner/example's configuration file (README: "tree, ring,
#: collnet_direct, collnet_chain, nvls, nvls_tree, pat" and "ll, ll128, simple").
TUNER_NAMES = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
TUNER_PROTOCOLS = ("ll", "ll128", "simple")

# tuning.cc, ncclTunerConstantsDefaults.baseLatencies [algorithm][protocol] (us): the
# launch and setup of one collective.
BASE_LATENCY = (
    (6.8, 14.0, 8.4),   # Tree
    (6.6, 14.0, 8.4),   # Ring
    (0.0, 0.0, 0.0),    # CollNetDirect
    (0.0, 0.0, 0.0),    # CollNetChain
    (0.0, 0.0, 0.0),    # NVLS
    (0.0, 0.0, 0.0),    # NVLSTree
    (8.0, 8.0, 8.0),    # PAT
)

# tuning.cc, ncclTunerConstantsDefaults.hwLatencies [hw][algorithm][protocol] (us): the
# cost of one step over NVLink, PCIe or the network.
HW_NVLINK, HW_PCI, HW_NET = range(3)
HW_LATENCY = (
    ((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0.0, 0.0, 3.7), (0.0, 0.0, 2.8),
     (0.0, 0.0, 25.0), (0.0, 0.0, 25.0), (0.0, 0.0, 4.0)),          # NVLINK
    ((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0.0, 0.0, 3.7), (0.0, 0.0, 2.8),
     (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 4.0)),            # PCI
    ((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0.0, 0.0, 31.0), (0.0, 0.0, 30.0),
     (0.0, 0.0, 18.0), (0.0, 0.0, 20.9), (0.0, 0.0, 14.0)),          # NET
)

# tuning.cc, llMaxBws [index1][index2] (GB/s): index1 is the compute capability on one
# node (Volta, Ampere, Hopper, Blackwell) and the CPU vendor between nodes (0 Intel,
# 1 AMD); index2 is 1 node, 2 nodes, more.
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0),
             (282.0, 90.0, 70.0))
# tuning.cc, perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws,
# perChMaxNVLSTreeBws [compcap index][index2] (GB/s per channel).
PER_CH_MAX_RING_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7),
                            (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                            (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0),
                      (70.0, 42.8, 24.0))
PER_CH_MAX_NVLS_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5),
                           (0.0, 96.0, 80.0))
# tuning.cc, nvlsEfficiency [compcap index].
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)

# tuning.cc, treeCorrectionFactor [protocol][log2(bytes / 64)], powers of two from 64 B
# to 256 MiB: NCCL's own correction of its tree model at medium sizes.
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
     1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9,
     .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8,
     .9, .9, .9),
)

# search.cc, speedArrayIntra / speedArrayInter and their sm90 and sm100 versions
# (GB/s per channel, fastest first): the per-channel speeds the topology search tries.
SPEEDS_INTRA = {
    70: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    100: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    70: (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0,
         2.4, 1.2, 0.24, 0.12),
    90: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
         1.2, 0.24, 0.12),
    100: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0,
          12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}

#: The compute capability of each GPU model (NVIDIA's CUDA GPUs list).
COMPCAP = {"V100": 70, "A100": 80, "H100": 90, "H200": 90, "B200": 100}

# src/graph/topo.h, SM70_NVLINK_BW .. SM100_NVLINK_BW: what NCCL counts per NVLink
# link, one way (GB/s), by compute capability.
NVLINK_BW = {70: 20.0, 80: 20.0, 90: 20.6, 100: 40.1}
#: The specification's rate of one NVLink link, one way (GB/s): NVLink 2 (V100) and 3
#: (A100) 25, NVLink 4 (H100, H200) 25 (18 links, 900 GB/s both ways), NVLink 5 (B200)
#: 50 (18 links, 1.8 TB/s both ways); NVIDIA's V100, A100, H100 and B200 datasheets.
NVLINK_SPEC_BW = {70: 25.0, 80: 25.0, 90: 25.0, 100: 50.0}

# topo.h: LOC_BW (a GPU to itself) and PCI_BW (PCIe Gen3 x16, the threshold below
# which a ring runs 256 threads).
LOC_BW = 5000.0
PCI_BW = 12.0

# src/include/device.h: MAXCHANNELS; init.cc gives the ring search MAXCHANNELS / 2.
MAXCHANNELS = 64
RING_MAX_CHANNELS = MAXCHANNELS // 2
NVLS_MAX_ARITY = 32          # device.h, NCCL_MAX_NVLS_ARITY
DIRECT_MAX_ARITY = 7         # device.h, NCCL_MAX_DIRECT_ARITY
# src/transport/nvls.cc: NVLS_NCHANNELS_SM90 16; SM100 32 between nodes, 24 in one.
NVLS_CHANNELS = {90: (16, 16), 100: (24, 32)}

# device.h: NCCL_LL_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640,
# NCCL_SIMPLE_MAX_NTHREADS 512; comm.h: NCCL_LL_THREAD_THRESHOLD 8,
# NCCL_LL128_THREAD_THRESHOLD 8, NCCL_SIMPLE_THREAD_THRESHOLD 64 (bytes per thread
# before enqueue.cc adds a channel).
MAX_NTHREADS = (512, 640, 512)
THREAD_THRESHOLD = (8, 8, 64)

# tuning.cc, getNetOverhead: the network post overhead (us) on Intel x86 (1.0; AMD 2.0),
# times 3 for Simple.
NET_OVERHEAD_US = 1.0


def compcap_index(compcap: int) -> int:
    """tuning.cc's compCapIndex: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell."""
    return 3 if compcap >= 100 else 2 if compcap >= 90 else 1 if compcap >= 80 else 0


# ---- versions ------------------------------------------------------------------------

#: The NCCL versions whose tables the model knows (major.minor; the patch releases of one
#: minor share them). Where two differ, the difference is below with its tag and line.
VERSIONS = ("2.27", "2.28", "2.29", "2.30")
#: The version the model follows unless told (docs/NCCL_MODEL.md names it).
DEFAULT_VERSION = "2.30"


@dataclass(frozen=True)
class VersionTables:
    """The tables of one NCCL version (same layout as the module-level ones).

    ``nvls_bw`` is how the tuner turns the NVLS graph into a per-channel bandwidth:
    ``"efficiency"`` (2.28 and later: ``nvlsEfficiency``, the 2x of AllReduce and the
    NVLSTree cap ``perChMaxNVLSTreeBws``) or ``"min"`` (2.27, tuning.cc lines 266-274:
    ``min(bwIntra, bwInter)``, NVLSTree ``min(bwIntra, bwInter / 2)`` beyond two nodes).
    ``nvls_tree_correction`` says whether the tree correction factors apply to NVLSTree on
    Blackwell (2.29 and later, tuning.cc ``ncclTopoGetAlgoTime``).
    """

    version: str
    base_latency: tuple
    hw_latency: tuple
    ll_max_bw: tuple
    per_ch_max_ring_ll128_bw: tuple
    per_ch_max_tree_ll128_bw: tuple
    per_ch_max_tree_bw: tuple
    per_ch_max_nvls_tree_bw: tuple
    speeds_intra: dict
    speeds_inter: dict
    nvls_bw: str = "efficiency"
    nvls_tree_correction: bool = True


def _with_net(hw: tuple, algorithm: int, row: tuple) -> tuple:
    net = list(hw[HW_NET])
    net[algorithm] = row
    return (hw[HW_NVLINK], hw[HW_PCI], tuple(net))


def _with_row(table: tuple, index: int, row: tuple) -> tuple:
    return tuple(row if k == index else r for k, r in enumerate(table))


_V230 = VersionTables("2.30", BASE_LATENCY, HW_LATENCY, LL_MAX_BW, PER_CH_MAX_RING_LL128_BW,
                      PER_CH_MAX_TREE_LL128_BW, PER_CH_MAX_TREE_BW, PER_CH_MAX_NVLS_TREE_BW,
                      SPEEDS_INTRA, SPEEDS_INTER)
# v2.29.7-1: tuning.cc:198 Blackwell perChMaxNVLSTreeBws {0.0, 96.0, 43.8}; search.cc:988
# sm100SpeedArrayInter without 86.0.
_V229 = replace(
    _V230, version="2.29",
    per_ch_max_nvls_tree_bw=_with_row(PER_CH_MAX_NVLS_TREE_BW, 3, (0.0, 96.0, 43.8)),
    speeds_inter={**SPEEDS_INTER, 100: tuple(x for x in SPEEDS_INTER[100] if x != 86.0)})
# v2.28.9-1: tuning.cc:179 Blackwell perChMaxRingLL128Bws {2*36.7, 34.6, 2*36.7}; no
# NVLSTree correction on Blackwell (ncclTopoGetAlgoTime has only the Tree's).
_V228 = replace(
    _V229, version="2.28",
    per_ch_max_ring_ll128_bw=_with_row(PER_CH_MAX_RING_LL128_BW, 3, (2 * 36.7, 34.6, 2 * 36.7)),
    nvls_tree_correction=False)
# v2.27.7-1: tuning.cc:155 hwLat NET NVLSTree {0, 0, 14}; :134-136 and :143-156 baseLat and
# hwLat list six algorithms, so PAT's row is zero; :176-188 Blackwell tables twice
# Hopper's; no perChMaxNVLSTreeBws, no nvlsEfficiency (:266-274); search.cc:962-963 the
# sm100 speed arrays without 45.0 (intra) and 86.0, 80.0 (inter).
_NO_PAT = (0.0, 0.0, 0.0)
_V227 = replace(
    _V228, version="2.27",
    base_latency=_with_row(BASE_LATENCY, PAT, _NO_PAT),
    hw_latency=tuple(_with_row(hw, PAT, _NO_PAT)
                     for hw in _with_net(HW_LATENCY, NVLS_TREE, (0.0, 0.0, 14.0))),
    per_ch_max_ring_ll128_bw=_with_row(PER_CH_MAX_RING_LL128_BW, 3, (2 * 36.7,) * 3),
    per_ch_max_tree_ll128_bw=_with_row(PER_CH_MAX_TREE_LL128_BW, 3, (2 * 36.7, 2 * 36.7, 2 * 29.0)),
    per_ch_max_tree_bw=_with_row(PER_CH_MAX_TREE_BW, 3, (2 * 38.7, 2 * 41.4, 2 * 36.0)),
    per_ch_max_nvls_tree_bw=tuple((math.inf,) * 3 for _ in range(4)),
    speeds_intra={**SPEEDS_INTRA, 100: tuple(x for x in SPEEDS_INTRA[100] if x != 45.0)},
    speeds_inter={**SPEEDS_INTER, 100: tuple(x for x in SPEEDS_INTER[100]
                                             if x not in (86.0, 80.0))},
    nvls_bw="min")
_BY_VERSION = {k.version: k for k in (_V227, _V228, _V229, _V230)}


def constants(version: str | None = None) -> VersionTables:
    """The tables of NCCL ``version`` (``"2.28"``, ``"2.28.9"``; ``None``: the default).

    Raises
    ------
    ValueError
        For a version the model does not know, naming the ones it does.
    """
    if version is None:
        return _BY_VERSION[DEFAULT_VERSION]
    text = str(version).strip().lstrip("v")
    minor = ".".join(text.split("-")[0].split(".")[:2])
    if minor not in _BY_VERSION:
        raise ValueError(f"unknown NCCL version {version!r}; the model knows "
                         f"{', '.join(VERSIONS)} (a patch release such as 2.28.9 is its "
                         f"minor's)")
    return _BY_VERSION[minor]

