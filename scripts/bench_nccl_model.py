"""The NCCL model (topoplan.analysis.native.nccl) against published nccl-tests figures.

Every row is a published measurement: a cluster as its source describes it (GPU model,
NVLink per GPU from the datasheet, NICs), the collective, the size, what NCCL was told
(NCCL_ALGO, or its own choice) and the bus bandwidth nccl-tests printed. The model is
built from NCCL's source and the datasheets only; none of these figures set anything
in it. A row is within target when the prediction is within 15% of the published
figure (or inside a published range).

    python scripts/bench_nccl_model.py            # the table
    python scripts/bench_nccl_model.py --json     # the rows as JSON
    python scripts/bench_nccl_model.py --only p5   # the rows whose name holds "p5"

Besides single figures it carries a published curve: AWS p5.48xlarge, 2 to 32 nodes,
32 MiB to 8 GiB (45 points), measured with AWS's tuner plugin loaded, whose choice
(``scripts/aws_tuner_regions.py``, its region table) the rows force as NCCL_ALGO and
NCCL_PROTO would; the cluster carries the plugin's reported latency (75 us,
aws-ofi-nccl ``src/platform-aws.cpp``). Targets: figures of 1 MiB and more within 15%
of the published busbw, latency rows within 1.5x.

docs/NCCL_MODEL.md holds the table this prints, with the sources.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topoplan.cluster import loads_cluster  # noqa: E402
from topoplan.analysis.native.nccl import nccl_model  # noqa: E402
from aws_tuner_regions import p5_allreduce  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


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


@dataclass(frozen=True)
class Row:
    what: str
    cluster: str          # YAML text
    size: int
    published: tuple[float, float]   # busbw GB/s, low .. high
    source: str
    algo: str | None = None          # NCCL_ALGO the measurement forced
    note: str = ""
    collective: str = "allreduce"
    proto: str | None = None         # NCCL_PROTO the measurement forced
    group: str = "figures"           # the summary line it counts in
    measured_with: str = ""          # the NCCL version the source ran, where it says

    def predict(self) -> tuple[float, str, str, float]:
        """The model's busbw (GB/s) and the label of what it runs; the label and busbw of
        what NCCL alone would run."""
        model = nccl_model(_cluster(self.cluster, self.what))
        own = model.choose(self.collective, self.size)
        if self.algo is None:
            choice = own
        else:
            choice = min((c for c in model.candidates(self.collective, self.size)
                          if c.algorithm == self.algo
                          and (self.proto is None or c.protocol == self.proto)),
                         key=lambda c: c.tuner_time_s)
        return choice.busbw / 1e9, choice.label(), own.label(), own.busbw / 1e9


_CLUSTERS: dict[str, object] = {}


def _cluster(text: str, name: str):
    """The cluster of ``text``, read once (the curve's points share it)."""
    if text not in _CLUSTERS:
        _CLUSTERS[text] = loads_cluster(text, name)
    return _CLUSTERS[text]


H100_NICS_400 = [("400 Gbit/s", [k]) for k in range(8)]
ROWS = [
    Row("HGX H100, 8 GPUs, NVLS (NCCL's choice)", box_cluster(1, "H100", "450 GB/s", nvls=True),
        8 * GiB, (480, 480), "NVIDIA/nccl-tests#212 (NVIDIA: ~480 GB/s peak busbw, algbw ~275)"),
    Row("HGX H100, 8 GPUs, NCCL_ALGO=Ring", box_cluster(1, "H100", "450 GB/s", nvls=True),
        8 * GiB, (370, 370), "NVIDIA/nccl-tests#212 (NVIDIA: ~370 GB/s with NCCL_ALGO=RING)",
        algo="Ring"),
    Row("DGX A100, 8 GPUs, 12 NVLinks each", box_cluster(1, "A100", "300 GB/s"), 4 * GiB,
        (208, 230), "NVIDIA/nccl-tests#178, #228 (208-230 GB/s)"),
    Row("2 A100 joined by 12 NVLinks (NV12)", pair_cluster("A100", "300 GB/s"), 4 * GiB,
        (208, 208), "NVIDIA/nccl-tests#178 (208 GB/s on the NV12 pair, -t 2)"),
    Row("HPE Apollo 6500, 8 A100 SXM4 80GB", box_cluster(1, "A100", "300 GB/s"), GiB,
        (200, 200), "NVIDIA/nccl-tests#149 (~200 GB/s, NCCL 2.18, -t 8 threads)"),
    Row("8 H800 (8 NVLinks each), NVLS", box_cluster(1, "H100", "200 GB/s", nvls=True),
        8 * GiB, (215, 215), "NVIDIA/nccl#1374 (215 GB/s busbw)",
        note="H800: an H100 with 8 of its 18 NVLinks"),
    Row("3 x DGX A100 40GB, 4 x 200G HDR each", box_cluster(
        3, "A100", "300 GB/s", [("200 Gbit/s", [2 * k, 2 * k + 1]) for k in range(4)]),
        128 * MiB, (96, 96), "NVIDIA/nccl-tests#119 (peak ~96 GB/s; NVIDIA: 24 GB/s per 200G NIC)"),
    Row("2 x HGX A100 80GB, 4 x 200G CX-6 each", box_cluster(
        2, "A100", "300 GB/s", [("200 Gbit/s", [2 * k, 2 * k + 1]) for k in range(4)]),
        4 * GiB, (91, 91), "NVIDIA/nccl-tests#100 (91 GB/s at 1-8 GiB)"),
    Row("2 x A100, 8 x 100G RoCE each", box_cluster(
        2, "A100", "300 GB/s", [("100 Gbit/s", [k]) for k in range(8)]),
        4 * GiB, (75, 75), "NVIDIA/nccl#495 (600 Gbit/s = 75 GB/s, NCCL 2.7; NVIDIA: 'a bit low')",
        note="NCCL 2.7, before today's two-node tree; NVIDIA called it low"),
    Row("2 x H800, 8 x 100G CX-6 each", box_cluster(
        2, "H100", "200 GB/s", [("100 Gbit/s", [k]) for k in range(8)], nvls=True),
        8 * GiB, (161, 161), "NVIDIA/nccl-tests#153 (161 GB/s with NVLS, NCCL 2.18)"),
    Row("2 x HGX H100, 8 GPU-NIC pairs of 400G", box_cluster(2, "H100", "450 GB/s",
                                                            H100_NICS_400, nvls=True),
        8 * GiB, (470, 470), "NVIDIA/nccl-tests#309 (470 GB/s on 2 nodes)"),
    Row("4 x HGX H100, 8 GPU-NIC pairs of 400G", box_cluster(4, "H100", "450 GB/s",
                                                            H100_NICS_400, nvls=True),
        8 * GiB, (366, 366), "NVIDIA/nccl-tests#309 (365.84 GB/s on 4 nodes)"),
]

#: AWS p5.48xlarge: 8 H100 on NVSwitch, 32 x 100G EFA that aws-ofi-nccl presents as one
#: 400G device per GPU; out-of-place busbw (GB/s) at 32 MiB .. 8 GiB, nccl-tests with
#: NCCL 2.27.7 and AWS's tuner plugin (crazyguitar/aws-gpu-communication-benchmark,
#: data/nccl_all_reduce.csv, commit 4fdb5a4f).
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


def p5_rows() -> list[Row]:
    """The p5 curve, each point priced as what AWS's tuner ran there."""
    rows = []
    for nodes, figures in P5_CURVE.items():
        text = box_cluster(nodes, "H100", "450 GB/s", H100_NICS_400, nvls=True,
                           plugin_latency="75 us", name=f"p5x{nodes}")
        for size, busbw in zip(P5_SIZES, figures):
            picked = p5_allreduce(size, 8 * nodes, nodes)
            algo, proto = picked if picked is not None else (None, None)
            rows.append(Row(f"AWS p5, {nodes} nodes (AWS tuner)", text, size, (busbw, busbw),
                            P5_SOURCE, algo=algo, proto=proto, group="p5 curve",
                            measured_with="2.27.7"))
    return rows


#: Latency rows: time (us) of a small allreduce, low .. high.
LATENCY = [
    ("HGX H100, 8 GPUs, 1 KiB", box_cluster(1, "H100", "450 GB/s", nvls=True), 1024,
     (10.0, 20.0), "the order H100 boxes show at 1 KiB (10-20 us); a target range, no "
                   "single published run"),
    ("2 x A100 nodes, 1 GPU each, 8 B", box_cluster(2, "A100", "300 GB/s",
                                                    [("200 Gbit/s", [0])], gpus=1), 8,
     (19.0, 20.0), "NVIDIA/nccl-tests#150 (8 B between two IB nodes: 19-20 us)"),
]


def within(value: float, low: float, high: float, tolerance: float = 0.15) -> bool:
    return low * (1 - tolerance) <= value <= high * (1 + tolerance)


def ratio_to(value: float, low: float, high: float) -> float:
    """``value`` over the published figure, or over the nearer end of a range."""
    return value / (low if value < low else high if value > high else value)


def size_text(size: int) -> str:
    return (f"{size >> 30}G" if size >= GiB else f"{size >> 20}M" if size >= MiB
            else f"{size >> 10}K" if size >= 1024 else f"{size}B")


def measure(only: str | None = None) -> list[dict]:
    """Every row: the model's figure, the published one, their ratio, what it runs."""
    out = []
    for row in ROWS + p5_rows():
        if only and only.lower() not in row.what.lower():
            continue
        busbw, label, own, own_busbw = row.predict()
        low, high = row.published
        ratio = ratio_to(busbw, low, high)
        forced = " ".join(f"{k}={v}" for k, v in (("NCCL_ALGO", row.algo),
                                                  ("NCCL_PROTO", row.proto)) if v)
        out.append({"what": row.what, "group": row.group, "size": row.size,
                    "forced": forced or None, "nccl": label, "nccl_alone": own,
                    "nccl_alone_busbw_GBps": round(own_busbw, 1),
                    "nccl_alone_within_15pct": within(own_busbw, low, high),
                    "predicted_busbw_GBps": round(busbw, 1),
                    "published_busbw_GBps": [low, high], "ratio": round(ratio, 3),
                    "within_15pct": within(busbw, low, high),
                    "within_target": row.size < MiB or within(busbw, low, high),
                    "source": row.source, "measured_with": row.measured_with,
                    "note": row.note})
    for what, text, size, (low, high), source in LATENCY:
        if only and only.lower() not in what.lower():
            continue
        choice = nccl_model(_cluster(text, what)).choose("allreduce", size)
        us = choice.time_s * 1e6
        ratio = ratio_to(us, low, high)
        out.append({"what": what, "group": "latency", "size": size, "forced": None,
                    "nccl": choice.label(), "nccl_alone": choice.label(),
                    "predicted_us": round(us, 1), "published_us": [low, high],
                    "ratio": round(ratio, 3), "within_15pct": within(us, low, high),
                    "within_target": 1 / 1.5 <= ratio <= 1.5, "source": source,
                    "measured_with": "", "note": ""})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--only", metavar="TEXT",
                        help="only the rows whose measurement holds TEXT (any case)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = measure(args.only)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("NCCL model against published nccl-tests figures (busbw GB/s; latency rows in us)")
    print(f"{'measurement':36} {'size':>5} {'model runs':26} {'model':>7} {'published':>9} "
          f"{'ratio':>6}")
    for r in rows:
        pred = r.get("predicted_busbw_GBps", r.get("predicted_us"))
        pub = r.get("published_busbw_GBps", r.get("published_us"))
        pub_text = f"{pub[0]:g}" if pub[0] == pub[1] else f"{pub[0]:g}-{pub[1]:g}"
        mark = "" if r["within_target"] else "  (miss)"
        label = r["nccl"] + (" forced" if r["forced"] else "")
        print(f"{r['what'][:36]:36} {size_text(r['size']):>5} {label[:26]:26} {pred:7.1f} "
              f"{pub_text:>9} {r['ratio']:6.2f}{mark}")
    for group in dict.fromkeys(r["group"] for r in rows):
        members = [r for r in rows if r["group"] == group]
        hits = sum(r["within_target"] for r in members)
        target = "within 1.5x" if group == "latency" else "within 15%"
        forced = [r for r in members if r["forced"] and "nccl_alone_within_15pct" in r]
        alone_hits = sum(r["nccl_alone_within_15pct"] for r in forced)
        alone = (f"; priced as NCCL alone would choose, {alone_hits} of {len(forced)}"
                 if forced and len(forced) == len(members) else "")
        print(f"{group}: {hits} of {len(members)} {target}{alone}")
    print(f"ratio: the model over the published figure (or over the nearer end of a range); "
          f"'forced': what the measurement ran by NCCL_ALGO/NCCL_PROTO or a tuner plugin; "
          f"{time.perf_counter() - t0:.1f} s")
    for source in dict.fromkeys((r["what"], r["source"], r["note"]) for r in rows):
        what, text, note = source
        print(f"  - {what}: {text}" + (f"; {note}" if note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
