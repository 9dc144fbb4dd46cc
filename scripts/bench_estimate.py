"""`topoplan estimate` against published training tables, on the shipped clusters.

    .venv/bin/python scripts/bench_estimate.py [--profile nccl] [--json]

Each row sets up the published run as its source describes it (framework behaviour,
batch, options) and takes the compute time from topoplan.estimate.THROUGHPUTS (published
single-GPU throughputs, none fitted to these tables):

- ChainerMN on MN-1 (Suzuki, "New ChainerMN functions for improved performance in cloud
  environments and performance testing results on AWS", Preferred Networks blog,
  2018-05-25): ResNet-50 on 32 P100, 90 epochs of ImageNet-1k (1,281,167 images), batch
  64 per GPU to epoch 30 and 128 after; training hours 6.96 (InfiniBand FDR), 21.3
  (10 GbE), 7.71 (10 GbE, double buffering, fp16 allreduce). ChainerMN's pure_nccl
  communicator packs every gradient into one buffer and allreduces it after backward.
- ChainerMN on 4 x p3.16xlarge (same post): 96% scaling efficiency at 32 GPUs against 8,
  with the two new functions (double buffering, fp16), batch 64 per GPU.
- MXNet on a p2.8xlarge (BEEVA Labs, "Accelerating the training of deep neural networks
  with MxNet on AWS P3 instances", 2017): fine-tuning ResNet-152 (96%) and ResNet-50
  (94%) at 8 K80 against 1, batch 32 per GPU, kvstore 'device': MXNet pushes each
  parameter's gradient as backward produces it (no fusion, overlapped with backward).

Prints published and estimated side by side, with the ratio (for times) or the
difference in points (for efficiencies), and returns the rows as data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.cluster import load_cluster  # noqa: E402
from topoplan.estimate import estimate  # noqa: E402
from topoplan.estimate.models import get_model  # noqa: E402

IMAGENET = 1_281_167
#: ChainerMN's 90-epoch schedule: (epochs, batch per GPU).
CHAINERMN_PHASES = ((30, 64), (60, 128))
ALL = 1 << 40  # a fusion threshold above any model: one packed buffer (ChainerMN)


def _cluster(name: str):
    return load_cluster(ROOT / "topologies" / f"{name}.yaml")


def training_hours(cluster, profile: str, cache: dict, **options) -> float:
    """ChainerMN's 90-epoch ResNet-50 run on ``cluster``, in hours."""
    seconds = 0.0
    for epochs, batch in CHAINERMN_PHASES:
        e = estimate(cluster, model=get_model("resnet50"), batch_per_gpu=batch, fusion=ALL,
                     profile=profile, _cache=cache, **options)
        iterations = epochs * IMAGENET / (cluster.nranks * batch)
        seconds += iterations * e.iteration_s
    return seconds / 3600


def run(profile: str = "nccl") -> list[dict]:
    rows: list[dict] = []
    cache: dict = {}
    ib, eth = _cluster("mn1_infiniband"), _cluster("mn1_10gbe")
    t_ib = training_hours(ib, profile, cache)
    t_eth = training_hours(eth, profile, cache)
    t_new = training_hours(eth, profile, cache, fp16=True, double_buffering=True)
    for case, pub, est in (("hours, InfiniBand FDR", 6.96, t_ib), ("hours, 10 GbE", 21.3, t_eth),
                           ("hours, 10 GbE + DB + fp16", 7.71, t_new)):
        rows.append({"source": "ChainerMN, MN-1, ResNet-50, 32 P100", "case": case,
                     "kind": "info", "published": pub, "estimated": est})
    rows.append({"source": "ChainerMN, MN-1, ResNet-50, 32 P100",
                 "case": "time 10 GbE / InfiniBand", "kind": "ratio", "published": 21.3 / 6.96,
                 "estimated": t_eth / t_ib, "target": "within 15%"})
    rows.append({"source": "ChainerMN, MN-1, ResNet-50, 32 P100",
                 "case": "time (10 GbE + DB + fp16) / InfiniBand", "kind": "ratio",
                 "published": 7.71 / 6.96, "estimated": t_new / t_ib, "target": "within 15%"})
    p3 = estimate(_cluster("aws_p3_16xlarge_x4"), model=get_model("resnet50"), batch_per_gpu=64,
                  fp16=True, double_buffering=True, fusion=ALL, profile=profile, _cache=cache)
    rows.append({"source": "ChainerMN, 4 x p3.16xlarge, ResNet-50, DB + fp16",
                 "case": "efficiency 32 GPUs vs 8", "kind": "efficiency", "published": 0.96,
                 "estimated": p3.efficiency_box, "target": "within 5 points"})
    p2 = _cluster("aws_p2_8xlarge")
    for model, published in (("resnet152", 0.96), ("resnet50", 0.94)):
        e = estimate(p2, model=get_model(model), batch_per_gpu=32, overlap=True, fusion=0,
                     profile=profile, _cache=cache)
        rows.append({"source": f"MXNet, p2.8xlarge, {model}, per-tensor, overlapped",
                     "case": "efficiency 8 K80 vs 1", "kind": "efficiency",
                     "published": published, "estimated": e.efficiency,
                     "target": "within 5 points"})
        after = estimate(p2, model=get_model(model), batch_per_gpu=32, fusion=0,
                         profile=profile, _cache=cache)
        rows.append({"source": f"MXNet, p2.8xlarge, {model}, per-tensor, after backward",
                     "case": "efficiency 8 K80 vs 1 (no overlap)", "kind": "info",
                     "published": published, "estimated": after.efficiency})
    for row in rows:
        if row["kind"] == "ratio":
            row["difference"] = row["estimated"] / row["published"] - 1
            row["ok"] = abs(row["difference"]) <= 0.15
        elif row["kind"] == "efficiency":
            row["difference"] = 100 * (row["estimated"] - row["published"])
            row["ok"] = abs(row["difference"]) <= 5
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="nccl", help="cost profile (default nccl)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    start = time.perf_counter()
    rows = run(args.profile)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'source':<48} {'case':<40} {'published':>9} {'estimated':>9} {'difference':>11} "
          f"{'target':>16}")
    for r in rows:
        if r["kind"] == "efficiency" or "efficiency" in r["case"]:
            pub, est = f"{100 * r['published']:.0f}%", f"{100 * r['estimated']:.1f}%"
            diff = f"{r['difference']:+.1f} pt" if "difference" in r else ""
        else:
            pub, est = f"{r['published']:.3g}", f"{r['estimated']:.3g}"
            diff = f"{100 * r['difference']:+.0f}%" if "difference" in r else ""
        target = f"{r['target']}: {'yes' if r['ok'] else 'NO'}" if "target" in r else ""
        print(f"{r['source']:<48} {r['case']:<40} {pub:>9} {est:>9} {diff:>11} {target:>16}")
    print(f"({time.perf_counter() - start:.0f} s, profile {args.profile})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
