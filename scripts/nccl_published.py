"""Published nccl-tests figures that scripts/bench_nccl_model.py checks the NCCL model against.

Each entry is a curve: one cluster, written as its source describes it (GPU model, NVLink
per GPU from the datasheet, NICs per node and their speed, node count), one or more
(size, published busbw) points, the source, and what the measurement forced (NCCL_ALGO,
NCCL_PROTO, or a tuner plugin's choice) where it says. A single published figure is a
curve of one point. Nothing here sets anything in the model: the figures only check it.

Figures are quoted as the source prints them (nccl-tests' out-of-place busbw, GB/s); a
``(low, high)`` pair is a range the source gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from aws_tuner_regions import p5_allreduce

GiB = 1 << 30
MiB = 1 << 20

__all__ = ["Curve", "Latency", "CURVES", "LATENCY", "box_cluster", "pair_cluster",
           "GiB", "MiB"]


def box_cluster(nodes: int, gpu: str, nvlink: str, nics: list[tuple[str, list[int]]] = (),
                nvls: bool = False, gpus: int = 8, name: str = "c",
                plugin_latency: str | None = None) -> str:
    """Cluster YAML: ``nodes`` boxes of ``gpus`` GPUs on an NVSwitch of ``nvlink`` per GPU,
    NIC k on rail k, the rails joined by a non-blocking spine; every NIC with the network
    plugin's ``plugin_latency`` when given."""
    extra = f", plugin_latency: {plugin_latency}" if plugin_latency else ""
    text = f"name: {name}\n"
    if nics:
        text += (f"switches: [{{name: 'rail{{i}}', count: {len(nics)}}}, spine]\n"
                 f"links: [{{a: 'rail{{i}}', b: spine, count: {len(nics)}, "
                 f"bandwidth: 100 Tbit/s}}]\n")
    fabric = f"{{bandwidth: {nvlink}{', nvls: true' if nvls else ''}}}"
    text += (f"boxes: [{{name: 'n{{i}}', count: {nodes}, gpus: {gpus}, gpu: {gpu}, "
             f"fabric: {fabric}")
    if nics:
        text += ", nics: [" + ", ".join(
            f"{{switch: 'rail{k}', bandwidth: {bw}, gpus: {served}{extra}}}"
            for k, (bw, served) in enumerate(nics)) + "]"
    return text + "}]\n"


def pair_cluster(gpu: str, nvlink: str) -> str:
    """Two GPUs joined by direct NVLinks (an NVLink bridge pair)."""
    return (f"name: pair\nboxes: [{{name: b, gpus: 2, gpu: {gpu}, gpu_links: "
            f"[{{a: 0, b: 1, bandwidth: {nvlink}}}]}}]\n")


Pick = Callable[[int], "tuple[str, str] | None"]


@dataclass(frozen=True)
class Curve:
    """One cluster measured at one or more sizes.

    ``points``: (size in bytes, (low, high) busbw GB/s). ``algo``/``proto``: what the
    measurement forced by NCCL_ALGO/NCCL_PROTO; ``pick``: a tuner plugin's choice per size
    (algorithm, protocol), for measurements that loaded one. ``nccl_version``: the NCCL
    minor the source ran (``"2.27"``), where it says; ``measured_with`` its full version.
    """

    what: str
    cluster: str                       # YAML text
    points: tuple[tuple[int, tuple[float, float]], ...]
    source: str
    algo: str | None = None
    proto: str | None = None
    pick: Pick | None = None
    group: str = "figures"             # the summary line it counts in
    note: str = ""
    nccl_version: str | None = None
    measured_with: str = ""
    collective: str = "allreduce"

    def forced(self, size: int) -> tuple[str | None, str | None]:
        """(NCCL_ALGO, NCCL_PROTO) the measurement ran at ``size`` (None: NCCL's choice)."""
        if self.pick is not None:
            return self.pick(size) or (None, None)
        return self.algo, self.proto


@dataclass(frozen=True)
class Latency:
    """The time (us) of a small collective, low .. high."""

    what: str
    cluster: str
    size: int
    published_us: tuple[float, float]
    source: str
    group: str = "latency"
    note: str = ""
    nccl_version: str | None = None
    measured_with: str = ""


def figure(what: str, cluster: str, size: int, published: tuple[float, float], source: str,
           **kw) -> Curve:
    """A single published figure: a curve of one point."""
    return Curve(what, cluster, ((size, published),), source, **kw)


def points(sizes, figures) -> tuple[tuple[int, tuple[float, float]], ...]:
    return tuple((size, (busbw, busbw)) for size, busbw in zip(sizes, figures, strict=True))


# ---------------------------------------------------------------- single figures
H100_NICS_400 = [("400 Gbit/s", [k]) for k in range(8)]
FIGURES = [
    figure("HGX H100, 8 GPUs, NVLS (NCCL's choice)", box_cluster(1, "H100", "450 GB/s", nvls=True),
           8 * GiB, (480, 480), "NVIDIA/nccl-tests#212 (NVIDIA: ~480 GB/s peak busbw, algbw ~275)"),
    figure("HGX H100, 8 GPUs, NCCL_ALGO=Ring", box_cluster(1, "H100", "450 GB/s", nvls=True),
           8 * GiB, (370, 370), "NVIDIA/nccl-tests#212 (NVIDIA: ~370 GB/s with NCCL_ALGO=RING)",
           algo="Ring"),
    figure("DGX A100, 8 GPUs, 12 NVLinks each", box_cluster(1, "A100", "300 GB/s"), 4 * GiB,
           (208, 230), "NVIDIA/nccl-tests#178, #228 (208-230 GB/s)"),
    figure("2 A100 joined by 12 NVLinks (NV12)", pair_cluster("A100", "300 GB/s"), 4 * GiB,
           (208, 208), "NVIDIA/nccl-tests#178 (208 GB/s on the NV12 pair, -t 2)"),
    figure("HPE Apollo 6500, 8 A100 SXM4 80GB", box_cluster(1, "A100", "300 GB/s"), GiB,
           (200, 200), "NVIDIA/nccl-tests#149 (~200 GB/s, NCCL 2.18, -t 8 threads)",
           nccl_version="2.18", measured_with="2.18"),
    figure("8 H800 (8 NVLinks each), NVLS", box_cluster(1, "H100", "200 GB/s", nvls=True),
           8 * GiB, (215, 215), "NVIDIA/nccl#1374 (215 GB/s busbw)",
           note="H800: an H100 with 8 of its 18 NVLinks"),
    figure("3 x DGX A100 40GB, 4 x 200G HDR each", box_cluster(
        3, "A100", "300 GB/s", [("200 Gbit/s", [2 * k, 2 * k + 1]) for k in range(4)]),
        128 * MiB, (96, 96),
        "NVIDIA/nccl-tests#119 (peak ~96 GB/s; NVIDIA: 24 GB/s per 200G NIC)"),
    figure("2 x HGX A100 80GB, 4 x 200G CX-6 each", box_cluster(
        2, "A100", "300 GB/s", [("200 Gbit/s", [2 * k, 2 * k + 1]) for k in range(4)]),
        4 * GiB, (91, 91), "NVIDIA/nccl-tests#100 (91 GB/s at 1-8 GiB)"),
    figure("2 x A100, 8 x 100G RoCE each", box_cluster(
        2, "A100", "300 GB/s", [("100 Gbit/s", [k]) for k in range(8)]),
        4 * GiB, (75, 75),
        "NVIDIA/nccl#495 (600 Gbit/s = 75 GB/s, NCCL 2.7; NVIDIA: 'a bit low')",
        note="NCCL 2.7, before today's two-node tree; NVIDIA called it low",
        nccl_version="2.7", measured_with="2.7"),
    figure("2 x H800, 8 x 100G CX-6 each", box_cluster(
        2, "H100", "200 GB/s", [("100 Gbit/s", [k]) for k in range(8)], nvls=True),
        8 * GiB, (161, 161), "NVIDIA/nccl-tests#153 (161 GB/s with NVLS, NCCL 2.18)",
        nccl_version="2.18", measured_with="2.18"),
    figure("2 x HGX H100, 8 GPU-NIC pairs of 400G", box_cluster(2, "H100", "450 GB/s",
                                                               H100_NICS_400, nvls=True),
           8 * GiB, (470, 470), "NVIDIA/nccl-tests#309 (470 GB/s on 2 nodes)",
           nccl_version="2.26", measured_with="2.26.2"),
    figure("4 x HGX H100, 8 GPU-NIC pairs of 400G", box_cluster(4, "H100", "450 GB/s",
                                                               H100_NICS_400, nvls=True),
           8 * GiB, (366, 366), "NVIDIA/nccl-tests#309 (365.84 GB/s on 4 nodes)",
           nccl_version="2.26", measured_with="2.26.2"),
]

# ---------------------------------------------------------------- AWS p5 curve
#: AWS p5.48xlarge: 8 H100 on NVSwitch, 32 x 100G EFA that aws-ofi-nccl presents as one
#: 400G device per GPU; out-of-place busbw (GB/s) at 32 MiB .. 8 GiB, nccl-tests with
#: NCCL 2.27.7 and AWS's tuner plugin (crazyguitar/aws-gpu-communication-benchmark,
#: data/nccl_all_reduce.csv, commit 4fdb5a4f). The cluster carries the plugin's reported
#: latency (75 us, aws-ofi-nccl src/platform-aws.cpp); each point forces what AWS's tuner
#: picks there (scripts/aws_tuner_regions.py).
P5_SOURCE = ("crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv "
             "(p5.48xlarge, NCCL 2.27.7, AWS tuner plugin)")
P5_CURVE = {
    2: (147.32, 207.00, 305.13, 364.46, 395.99, 435.14, 445.05, 465.81, 477.71),
    4: (95.38, 152.41, 229.48, 273.34, 278.41, 280.30, 347.57, 354.45, 356.99),
    8: (86.74, 103.85, 156.33, 232.09, 272.62, 274.47, 278.15, 351.32, 355.36),
    16: (74.85, 92.39, 129.20, 148.11, 223.80, 269.23, 270.91, 306.15, 356.27),
    32: (66.34, 83.60, 115.78, 137.99, 156.83, 220.08, 269.47, 302.81, 321.10),
}
P5_SIZES = tuple((32 * MiB) << k for k in range(9))


def _p5_pick(nodes: int) -> Pick:
    return lambda size: p5_allreduce(size, 8 * nodes, nodes)


P5 = [Curve(f"AWS p5, {nodes} nodes (AWS tuner)",
            box_cluster(nodes, "H100", "450 GB/s", H100_NICS_400, nvls=True,
                        plugin_latency="75 us", name=f"p5x{nodes}"),
            points(P5_SIZES, figures), P5_SOURCE, pick=_p5_pick(nodes), group="p5 curve",
            nccl_version="2.27", measured_with="2.27.7")
      for nodes, figures in P5_CURVE.items()]

# ---------------------------------------------------------------- GCP A3 Mega, 2 nodes
#: Google Cloud a3-megagpu-8g (8 x H100 80GB HBM3), 2 nodes, 16 ranks, GPUDirect-TCPXO:
#: nccl-tests all_reduce_perf -b 8 -e 8G -f 2 -g 1, out-of-place busbw
#: (lessizzmore/create-a3mega-ztan-fork, file ztan-NCCL-test-result, commit 02dd8f45).
#: The same repository's README shows the NCCL its image ships with the TCPXO plugin
#: (nccl-plugin-gpudirecttcpx-dev v1.0.4): libnccl.so.2.21.5, beside a libnccl-tuner.so and
#: a3plus_tuner_config.textproto. The NICs: eight data NICs a VM, one per GPU
#: (create_instance.sh: eight GVNIC GPU subnets; dstackai/dstack
#: examples/clusters/a3mega/README.md: "1800Gbps maximum network bandwidth", eight extra
#: data NICs), written as 8 x 200G. The TCPXO plugin's latency has no citable value, so
#: the NICs carry none.
A3MEGA_SOURCE = ("lessizzmore/create-a3mega-ztan-fork ztan-NCCL-test-result (a3-megagpu-8g, "
                 "2 nodes, GPUDirect-TCPXO, NCCL 2.21.5)")
A3MEGA_SIZES = tuple(MiB << k for k in range(14))          # 1 MiB .. 8 GiB
A3MEGA_BUSBW = (9.68, 15.48, 21.57, 27.50, 32.18, 59.36, 99.74, 152.32, 213.19, 263.69,
                297.86, 318.40, 330.58, 338.82)
A3MEGA = [Curve("GCP A3 Mega, 2 nodes (TCPXO)",
                box_cluster(2, "H100", "450 GB/s", [("200 Gbit/s", [k]) for k in range(8)],
                            nvls=True, name="a3mega"),
                points(A3MEGA_SIZES, A3MEGA_BUSBW), A3MEGA_SOURCE, group="GCP A3 Mega",
                note="8 x 200G: the machine's 1800 Gbps read as 8 data NICs and the host NIC; "
                     "TCPXO plugin latency and Google's tuner plugin not modelled",
                nccl_version="2.21", measured_with="2.21.5")]

# ---------------------------------------------------------------- Nebius, 2 nodes
#: Nebius H100 cluster with InfiniBand, 2 nodes x 8 H100, dstack's nccl-tests task
#: (all_reduce_perf -b 8 -e 8G -f 2 -g 1), out-of-place busbw (dstackai/dstack
#: examples/clusters/nebius/README.md, "NCCL tests", commit 107fefef). The source names
#: InfiniBand but neither the NIC count nor the speed, nor the NCCL version: the NICs
#: below (8 x 400G NDR, one per GPU, as the H100 InfiniBand rows above) are an assumption.
NEBIUS_SOURCE = ("dstackai/dstack examples/clusters/nebius/README.md (2 x 8 H100, "
                 "InfiniBand; NICs and NCCL version not stated)")
NEBIUS_BUSBW = (22.58, 39.69, 71.40, 101.82, 149.56, 229.43, 266.35, 331.31, 385.49, 423.06,
                446.21, 458.80, 462.61, 467.54)
NEBIUS = [Curve("Nebius H100 IB, 2 nodes", box_cluster(2, "H100", "450 GB/s", H100_NICS_400,
                                                       nvls=True, name="nebius"),
                points(A3MEGA_SIZES, NEBIUS_BUSBW), NEBIUS_SOURCE,
                group="Nebius (NICs assumed)",
                note="NICs not stated by the source: written as 8 x 400G (assumed)")]

CURVES: list[Curve] = FIGURES + P5 + A3MEGA + NEBIUS

# ---------------------------------------------------------------- latency
LATENCY = [
    Latency("HGX H100, 8 GPUs, 1 KiB", box_cluster(1, "H100", "450 GB/s", nvls=True), 1024,
            (10.0, 20.0), "the order H100 boxes show at 1 KiB (10-20 us); a target range, no "
                          "single published run"),
    Latency("2 x A100 nodes, 1 GPU each, 8 B", box_cluster(2, "A100", "300 GB/s",
                                                           [("200 Gbit/s", [0])], gpus=1), 8,
            (19.0, 20.0), "NVIDIA/nccl-tests#150 (8 B between two IB nodes: 19-20 us)"),
    Latency("GCP A3 Mega, 2 nodes (TCPXO), 16 B", A3MEGA[0].cluster, 16, (123.2, 123.2),
            A3MEGA_SOURCE + " (16 B: 123.2 us)", note=A3MEGA[0].note,
            nccl_version="2.21", measured_with="2.21.5"),
    Latency("Nebius H100 IB, 2 nodes, 16 B", NEBIUS[0].cluster, 16, (29.92, 29.92),
            NEBIUS_SOURCE + " (16 B: 29.92 us)", note=NEBIUS[0].note),
]
