"""The NCCL model (topoplan.analysis.native.nccl) against published nccl-tests figures.

Every row is a published measurement: a cluster as its source describes it (GPU model,
NVLink per GPU from the datasheet, NICs), the collective, the size, what NCCL was told
(NCCL_ALGO, or its own choice) and the bus bandwidth nccl-tests printed. The model is
built from NCCL's source and the datasheets only; none of these figures set anything
in it. A row is within target when the prediction is within 15% of the published
figure (or inside a published range).

    python scripts/bench_nccl_model.py            # the table
    python scripts/bench_nccl_model.py --json     # the rows as JSON

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

GiB = 1 << 30
MiB = 1 << 20


def box_cluster(nodes: int, gpu: str, nvlink: str, nics: list[tuple[str, list[int]]] = (),
                nvls: bool = False, gpus: int = 8, name: str = "c") -> str:
    """Cluster YAML: ``nodes`` boxes of ``gpus`` GPUs on an NVSwitch of ``nvlink`` per GPU,
    NIC k on rail k, the rails joined by a non-blocking spine."""
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
            f"{{switch: 'rail{k}', bandwidth: {bw}, gpus: {served}}}"
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

    def predict(self) -> tuple[float, str]:
        model = nccl_model(loads_cluster(self.cluster, self.what))
        if self.algo is None:
            choice = model.choose(self.collective, self.size)
        else:
            choice = min((c for c in model.candidates(self.collective, self.size)
                          if c.algorithm == self.algo), key=lambda c: c.tuner_time_s)
        return choice.busbw / 1e9, choice.label()


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = []
    t0 = time.perf_counter()
    for row in ROWS:
        busbw, label = row.predict()
        low, high = row.published
        ratio = busbw / (low if busbw < low else high if busbw > high else busbw)
        rows.append({"what": row.what, "size": row.size, "forced": row.algo,
                     "nccl": label, "predicted_busbw_GBps": round(busbw, 1),
                     "published_busbw_GBps": [low, high], "ratio": round(ratio, 3),
                     "within_15pct": within(busbw, low, high), "source": row.source,
                     "note": row.note})
    for what, text, size, (low, high), source in LATENCY:
        choice = nccl_model(loads_cluster(text, what)).choose("allreduce", size)
        us = choice.time_s * 1e6
        ratio = us / (low if us < low else high if us > high else us)
        rows.append({"what": what, "size": size, "forced": None, "nccl": choice.label(),
                     "predicted_us": round(us, 1), "published_us": [low, high],
                     "ratio": round(ratio, 3), "within_15pct": within(us, low, high),
                     "source": source, "note": ""})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("NCCL model against published nccl-tests figures (busbw GB/s; latency rows in us)")
    print(f"{'measurement':44} {'size':>6} {'model: NCCL runs':18} {'model':>7} "
          f"{'published':>9} {'ratio':>6}")
    for r in rows:
        size = (f"{r['size'] >> 30}G" if r["size"] >= GiB else f"{r['size'] >> 20}M"
                if r["size"] >= MiB else f"{r['size']}B")
        pred = r.get("predicted_busbw_GBps", r.get("predicted_us"))
        pub = r.get("published_busbw_GBps", r.get("published_us"))
        pub_text = f"{pub[0]:g}" if pub[0] == pub[1] else f"{pub[0]:g}-{pub[1]:g}"
        mark = "" if r["within_15pct"] else "  (miss)"
        label = r["nccl"] + (" forced" if r["forced"] else "")
        print(f"{r['what'][:44]:44} {size:>6} {label[:18]:18} {pred:7.1f} {pub_text:>9} "
              f"{r['ratio']:6.2f}{mark}")
    hits = sum(r["within_15pct"] for r in rows)
    print(f"{hits} of {len(rows)} within 15% (ratio: model over the published figure, or over "
          f"the nearer end of a range); {time.perf_counter() - t0:.1f} s")
    for r in rows:
        print(f"  - {r['what']}: {r['source']}" + (f"; {r['note']}" if r["note"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
