"""NCCL's own constants, as its tuner and topology search use them.

Every number here is copied from NVIDIA/nccl (``master`` at commit 5067397c, NCCL 2.29;
the values below are also those of 2.28, the version run on this project's H100) and
carries the file and name it comes from. Nothing is fitted to a measurement: the
measurements in docs/NCCL_MODEL.md check the model, they never set it.

Bandwidths are GB/s one way (NCCL's unit; 1 GB/s = 1e9 bytes/s), latencies
microseconds, as in NCCL.
"""

from __future__ import annotations

__all__ = [
    "ALGORITHMS", "PROTOCOLS", "RING", "TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS",
    "NVLS_TREE", "PAT", "LL", "LL128", "SIMPLE", "BASE_LATENCY", "HW_LATENCY",
    "LL_MAX_BW", "PER_CH_MAX_RING_LL128_BW", "PER_CH_MAX_TREE_LL128_BW", "PER_CH_MAX_TREE_BW",
    "PER_CH_MAX_NVLS_TREE_BW", "NVLS_EFFICIENCY", "TREE_CORRECTION", "SPEEDS_INTRA",
    "SPEEDS_INTER", "NVLINK_BW", "NVLINK_SPEC_BW", "COMPCAP", "compcap_index",
    "MAXCHANNELS", "RING_MAX_CHANNELS", "NVLS_MAX_ARITY", "DIRECT_MAX_ARITY",
    "NVLS_CHANNELS", "MAX_NTHREADS", "THREAD_THRESHOLD", "NET_OVERHEAD_US", "PCI_BW",
    "LOC_BW", "ALGORITHM_NAMES", "TUNER_NAMES",
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
