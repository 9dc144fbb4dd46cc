#!/usr/bin/env python
"""Planned allreduce schedules, run for real on an emulated cluster, against the simulator.

Needs root with CAP_NET_ADMIN (network namespaces, bridges, veth, htb). For each
topology it builds the testbed (bandwidths scaled down so this machine can carry them),
runs each algorithm with one process per rank inside its namespace (gloo, or Open MPI
with --transport mpi), and prints measured time, the simulator's prediction for the
scaled cluster (raw, and calibrated on the testbed), their ratios and the transport's
native allreduce. Then it checks these targets:

* ddl_two_switch: the best planned schedule >= 1.8x faster than the bad ring order
  A->C->B->D (``ring:0,2,1,3``), and faster than native gloo;
* on every topology: |measured / predicted - 1| <= 15% for ring, hierarchical and mcf at
  the largest size, with the simulator calibrated on the testbed (per-message alpha and
  reduce bandwidth, :mod:`topoplan.testbed.calibrate`); the raw ratio is printed too.

Multi-GPU-per-box topologies run as 2 boxes x 2 GPUs variants of the shipped files
(same per-GPU fabric/NVLink and NIC bandwidths), since this machine runs few ranks.

    sudo PYTHONPATH=. python scripts/bench_testbed.py [--only ddl_two_switch] [--transport mpi]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoplan.cluster import load_cluster, loads_cluster  # noqa: E402
from topoplan.testbed import Testbed, capable, parse_scale  # noqa: E402
from topoplan.testbed.bench import bench  # noqa: E402
from topoplan.testbed.netns import interrupts_raise  # noqa: E402
from topoplan.units import format_size, parse_size  # noqa: E402

# 2 boxes x 2 GPUs cut from mn1_10gbe.yaml: PCIe fabric 16 GB/s, 10 GbE NICs.
MN1_2X2 = """
name: mn1-10gbe-2x2
switches: [{name: eth}]
boxes:
  - {name: "mn1-{i}", count: 2, gpus: 2, fabric: {bandwidth: 16 GB/s, latency: 2 us},
     nics: [{switch: eth, bandwidth: 10 Gbit/s, latency: 10 us}]}
"""

# 2 boxes x 2 GPUs cut from ddl_three_racks.yaml, one box per rack on two of its ToRs:
# two NVLink-1.0 pairs per box, 10 GB/s NICs, ToR <-> core at a quarter of a NIC, so the
# core is the narrow cut (as in a rack of 16 hosts sharing the uplink).
RACKS_2X2 = """
name: ddl-racks-2x2
switches: [{name: "tor{i}", count: 2}, {name: core}]
boxes:
  - name: "r{i}h0"
    count: 2
    gpus: 2
    gpu_links: [{a: 0, b: 1, bandwidth: 20 GB/s, count: 2, latency: 1 us}]
    nics: [{switch: "tor{i}", bandwidth: 10 GB/s, latency: 1.5 us}]
links:
  - {a: "tor{i}", b: core, count: 2, bandwidth: 2.5 GB/s, latency: 0.5 us}
"""

TOPOLOGIES = {
    # name: (cluster loader, size, algorithms); the scale is the testbed's auto scale
    # (every shaped rate within what this machine moves: 1/640, 1/102.4, 1/256).
    "ddl_two_switch": (lambda: load_cluster(ROOT / "topologies" / "ddl_two_switch.yaml"),
                       "64MiB", ["ring", "ring:0,2,1,3", "hierarchical", "mcf", "native"]),
    "mn1_10gbe_2x2": (lambda: loads_cluster(MN1_2X2, "mn1_10gbe_2x2"), "32MiB",
                      ["ring", "hierarchical", "mcf", "native"]),
    "ddl_racks_2x2": (lambda: loads_cluster(RACKS_2X2, "ddl_racks_2x2"), "32MiB",
                      ["ring", "hierarchical", "mcf", "native"]),
}
CHECKED = ("ring", "hierarchical", "mcf")  # the simulator-accuracy target
TOLERANCE = 0.15


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(TOPOLOGIES))
    parser.add_argument("--sizes", default=None,
                        help="comma list (default per topology: 64MiB, 32MiB, 32MiB)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--scale", default="auto", help="override the auto scale, e.g. 1/320")
    parser.add_argument("--transport", default="gloo", choices=["gloo", "mpi"])
    parser.add_argument("--algorithms", default=None, help="override the per-topology list "
                        "(separated by ;)")
    parser.add_argument("--json", type=Path, default=None, help="write records here")
    args = parser.parse_args()
    reason = capable()
    if reason is not None:
        print(f"bench_testbed: cannot build a testbed here: {reason}", file=sys.stderr)
        return 2
    records, failures = [], []
    for name in args.only or list(TOPOLOGIES):
        load, default_size, algorithms = TOPOLOGIES[name]
        if args.algorithms:
            algorithms = args.algorithms.split(";")
        sizes = [parse_size(s) for s in (args.sizes or default_size).split(",")]
        cluster = load()
        started = time.perf_counter()
        with interrupts_raise(), Testbed.up(cluster, parse_scale(args.scale)) as bed:
            scale = bed.layout.scale
            report = bench(bed, cluster, algorithms, sizes, iters=args.iters,
                           transport=args.transport)
        rows, cal = report.rows, report.calibration
        print(f"\n## {name}: {cluster.nranks} ranks, scale 1/{1 / scale:.4g}, {args.transport} "
              f"({time.perf_counter() - started:.0f} s, load average {report.load[0]:.1f} -> "
              f"{report.load[1]:.1f})")
        if cal is not None:
            lat = "-" if cal.latency_alpha_s is None else f"{cal.latency_alpha_s * 1e3:.2f}"
            red = "-" if cal.reduce_bandwidth is None else f"{cal.reduce_bandwidth / 1e9:.1f}"
            print(f"calibrated on the testbed: alpha {cal.alpha_s * 1e3:.2f} ms/message "
                  f"(latency-bound: {lat} ms), reduce {red} GB/s")
        print(f"{'algorithm':<14} {'size':>7} {'steps':>5} {'measured':>9} {'predicted':>9} "
              f"{'meas/pred':>9} {'calibrated':>10} {'meas/cal':>8} {'native':>7} "
              f"{'nat/meas':>8} {'#wrong':>6}   (ms)")
        for r in rows:
            print(f"{r.algorithm:<14} {format_size(r.size):>7} "
                  f"{'-' if r.steps is None else r.steps:>5} {_ms(r.measured_s):>9} "
                  f"{_ms(r.predicted_s):>9} {_ratio(r.ratio):>9} {_ms(r.calibrated_s):>10} "
                  f"{_ratio(r.calibrated_ratio):>8} {_ms(r.native_s):>7} "
                  f"{_ratio(r.speedup_vs_native):>8} {r.wrong:>6}")
            records.append({"topology": name, "scale": scale, "transport": args.transport,
                            "load": list(report.load),
                            "calibration": None if cal is None else cal.to_dict(), **r.to_dict()})
            if r.wrong:
                failures.append(f"{name} {r.algorithm}: {r.wrong} wrong elements")
        largest = max(sizes)
        for r in rows:
            if r.size == largest and r.algorithm in CHECKED and r.ratio is not None:
                cal_ratio = r.calibrated_ratio if r.calibrated_ratio is not None else r.ratio
                ok = abs(cal_ratio - 1) <= TOLERANCE
                print(f"  target {name} {r.algorithm}: measured/predicted {r.ratio:.2f} raw, "
                      f"{cal_ratio:.2f} calibrated: {'within' if ok else 'OUTSIDE'} 15%")
                if not ok:
                    failures.append(f"{name} {r.algorithm}: measured/calibrated {cal_ratio:.2f}")
        if name == "ddl_two_switch":
            by = {r.algorithm: r for r in rows if r.size == largest}
            planned = [by[a] for a in ("hierarchical", "mcf") if a in by]
            if "ring:0,2,1,3" in by and planned:
                best = min(planned, key=lambda r: r.measured_s)
                speedup = by["ring:0,2,1,3"].measured_s / best.measured_s
                beats_native = best.native_s is not None and best.measured_s < best.native_s
                print(f"  target: best planned ({best.algorithm}) {speedup:.2f}x faster than the "
                      f"bad ring A->C->B->D (>= 1.8: {'yes' if speedup >= 1.8 else 'NO'}); "
                      f"{_ratio(best.speedup_vs_native)}x native "
                      f"({'faster' if beats_native else 'NOT faster'})")
                if speedup < 1.8:
                    failures.append(f"ddl_two_switch: planned only {speedup:.2f}x the bad ring")
                if not beats_native:
                    failures.append("ddl_two_switch: planned not faster than native")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    if failures:
        print("\nmissed targets:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
