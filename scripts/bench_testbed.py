#!/usr/bin/env python
"""Planned allreduce, reduce-scatter and allgather schedules, run for real on an emulated
cluster, against the simulator.

Needs root with CAP_NET_ADMIN (network namespaces, veth, htb, routes). For each topology
it builds the testbed (bandwidths scaled down so this machine can carry them), checks
every pair's path and rate against the model (the quick probe of ``testbed bench``),
runs each algorithm with one process per rank inside its namespace (gloo, or Open MPI
with --transport mpi; both with --transport gloo,mpi), and prints measured time, the
simulator's prediction for the emulated cluster (raw, and with the software costs
calibrated on the testbed in the same launch), their ratios and the transport's native
collective. ``--collective allreduce,reduce_scatter,allgather`` runs each collective
(default allreduce) with the planners that plan it. Then it checks the targets:

* ddl_two_switch: the best planned schedule faster than the bad ring order A->C->B->D
  (``ring:0,2,1,3``, every hop across the narrow link) by >= 1.8x for an allreduce
  (hierarchical, mcf, auto) and >= 1.5x for an allgather or a reduce-scatter (auto,
  mcf, rhd, ring-topo);
* every cell (topology, transport, collective, algorithm, size): measured / calibrated
  prediction within 0.85 .. 1.15.

Multi-GPU-per-box clusters run as 2 boxes x 2 GPUs cuts of the shipped files (same per-GPU
fabric and NIC bandwidths), since this machine runs few ranks; dgx1_v100 runs whole.

    sudo PYTHONPATH=. python scripts/bench_testbed.py [--only dgx1_v100] [--transport gloo,mpi]
        [--collective allreduce,allgather] [--sizes 4MiB,32MiB] [--json out.json]
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

# 2 boxes x 2 GPUs cut from dgx_a100_x4.yaml, rail-optimised: NVSwitch fabric, one
# 200 Gbit/s NIC per GPU on its own rail, every rail on both spines.
A100_2X2 = """
name: dgx-a100-2x2
switches: [{name: "rail{i}", count: 2}, {name: "spine{i}", count: 2}]
boxes:
  - name: "dgx{i}"
    count: 2
    gpus: 2
    fabric: {bandwidth: 300 GB/s, latency: 0.5 us}
    nics:
      - {switch: rail0, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [0]}
      - {switch: rail1, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [1]}
links:
  - {a: "rail{i//2}", b: "spine{i%2}", count: 4, bandwidth: 400 Gbit/s, latency: 0.3 us}
"""

PLANNERS = ["ring", "tree", "rhd", "hierarchical", "mcf", "auto"]
CELLS = [*PLANNERS[:1], "ring-topo", *PLANNERS[1:]]  # the fidelity table's columns
#: The planned schedules a target compares with the bad ring, per collective.
PLANNED = {"allreduce": ("hierarchical", "mcf", "auto"),
           "reduce_scatter": ("auto", "mcf", "rhd", "ring-topo"),
           "allgather": ("auto", "mcf", "rhd", "ring-topo")}
SPEEDUP = {"allreduce": 1.8, "reduce_scatter": 1.5, "allgather": 1.5}
def _cut(name: str) -> str:
    """A 4-rank cut of scripts/bench_online.py (the one the other testbed benches use)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_online import CUTS
    return CUTS[name]


TOPOLOGIES = {
    # name: (cluster loader, algorithms); the scale is the testbed's auto scale (every
    # shaped rate within what this machine moves).
    "ddl_two_switch": (lambda: load_cluster(ROOT / "topologies" / "ddl_two_switch.yaml"),
                       [*PLANNERS, "ring:0,2,1,3", "native"]),
    "dgx1_v100": (lambda: load_cluster(ROOT / "topologies" / "dgx1_v100.yaml"),
                  [*PLANNERS, "native"]),
    "mn1_10gbe_2x2": (lambda: loads_cluster(MN1_2X2, "mn1_10gbe_2x2"), [*PLANNERS, "native"]),
    "dgx_a100_2x2": (lambda: loads_cluster(A100_2X2, "dgx_a100_2x2"), [*PLANNERS, "native"]),
    "ddl_racks_2x2": (lambda: loads_cluster(RACKS_2X2, "ddl_racks_2x2"), [*PLANNERS, "native"]),
    # two_leaf_oversubscribed's 4-rank cut (scripts/bench_online.py): a host per GPU, two a
    # leaf, the trunk at half of what a leaf's hosts send (2:1, as shipped)
    "two_leaf_oversubscribed": (lambda: loads_cluster(_cut("two_leaf_oversubscribed"),
                                                      "two_leaf_oversubscribed_4"),
                                [*PLANNERS, "native"]),
}
DEFAULT = ("ddl_two_switch", "dgx1_v100", "mn1_10gbe_2x2", "dgx_a100_2x2")
TOLERANCE = 0.15


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(TOPOLOGIES))
    parser.add_argument("--sizes", default="4MiB,32MiB", help="comma list (default 4MiB,32MiB)")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--scale", default="auto", help="override the auto scale, e.g. 1/320")
    parser.add_argument("--transport", default="gloo,mpi",
                        help="comma list of gloo, mpi (default both)")
    parser.add_argument("--collective", default="allreduce",
                        help="comma list of allreduce, reduce_scatter, allgather (default "
                             "allreduce); each runs the planners of the list that plan it")
    parser.add_argument("--algorithms", default=None, help="override the per-topology list "
                        "(separated by ;)")
    parser.add_argument("--json", type=Path, default=None, help="write records here")
    args = parser.parse_args()
    reason = capable()
    if reason is not None:
        print(f"bench_testbed: cannot build a testbed here: {reason}", file=sys.stderr)
        return 2
    transports = [t.strip() for t in args.transport.split(",") if t.strip()]
    collectives = [c.strip() for c in args.collective.split(",") if c.strip()]
    for c in collectives:
        if c not in PLANNED:
            parser.error(f"--collective: unknown {c!r}; use {', '.join(PLANNED)}")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    records: list[dict] = []
    failures: list[str] = []
    for name in args.only or list(DEFAULT):
        load, default_algorithms = TOPOLOGIES[name]
        cluster = load()
        for collective in collectives:
            algorithms = (args.algorithms.split(";") if args.algorithms
                          else _capable(default_algorithms, collective))
            for transport in transports:
                started = time.perf_counter()
                with interrupts_raise(), Testbed.up(cluster, parse_scale(args.scale)) as bed:
                    scale = bed.layout.scale
                    report = bench(bed, cluster, algorithms, sizes, iters=args.iters,
                                   transport=transport, collective=collective)
                _report(name, cluster, transport, scale, report,
                        time.perf_counter() - started, records, failures)
    _summary(records, failures)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    if failures:
        print("\nmissed targets:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def _capable(algorithms: list[str], collective: str) -> list[str]:
    """The algorithms of the list that plan ``collective`` (native and ring orders too);
    a reduce-scatter or an allgather also runs ring-topo (the topology-aware ring)."""
    from topoplan.planners import planners_for
    ok = set(planners_for(collective))
    if collective != "allreduce" and "ring-topo" not in algorithms:
        algorithms = [*algorithms[:1], "ring-topo", *algorithms[1:]]
    return [a for a in algorithms if a == "native" or a.partition(":")[0] in ok]


def _report(name: str, cluster, transport: str, scale: float, report, seconds: float,  # type: ignore[no-untyped-def]
            records: list[dict], failures: list[str]) -> None:
    rows, cal = report.rows, report.calibration
    collective = report.collective
    print(f"\n## {name} {collective}: {cluster.nranks} ranks, scale 1/{1 / scale:.4g}, "
          f"{transport}, native {report.native_name or '-'} ({seconds:.0f} s, load average "
          f"{report.load[0]:.1f} -> {report.load[1]:.1f})")
    for note in report.notes:
        print(f"note: {note}")
    if report.probe is not None:
        print(f"network check: {len(report.probe.checks)} probes, worst deviation from the "
              f"model {report.probe.worst:.1%}")
    if cal is not None:
        lat = "-" if cal.latency_alpha_s is None else f"{cal.latency_alpha_s * 1e3:.2f}"
        red = "-" if cal.reduce_bandwidth is None else f"{cal.reduce_bandwidth / 1e9:.1f}"
        print(f"calibrated on the testbed: alpha {cal.alpha_s * 1e3:.3f} ms/message "
              f"(latency-bound: {lat} ms), reduce {red} GB/s"
              + (f"; {cal.note}" if cal.note else ""))
    print(f"{'algorithm':<14} {'size':>7} {'steps':>5} {'measured':>9} {'predicted':>9} "
          f"{'meas/pred':>9} {'calibrated':>10} {'meas/cal':>8} {'native':>7} "
          f"{'nat/meas':>8} {'#wrong':>6}   (ms)")
    for r in rows:
        print(f"{r.algorithm:<14} {format_size(r.size):>7} "
              f"{'-' if r.steps is None else r.steps:>5} {_ms(r.measured_s):>9} "
              f"{_ms(r.predicted_s):>9} {_ratio(r.ratio):>9} {_ms(r.calibrated_s):>10} "
              f"{_ratio(r.calibrated_ratio):>8} {_ms(r.native_s):>7} "
              f"{_ratio(r.speedup_vs_native):>8} {r.wrong:>6}")
        records.append({"topology": name, "scale": scale, "transport": transport,
                        "native_name": report.native_name,
                        "load": list(report.load), "probe_worst": (
                            None if report.probe is None else report.probe.worst),
                        "calibration": None if cal is None else cal.to_dict(), **r.to_dict()})
        what = f"{name} {collective} {transport} {r.algorithm}"
        if r.wrong:
            failures.append(f"{what}: {r.wrong} wrong elements")
        ratio = r.calibrated_ratio if r.calibrated_ratio is not None else r.ratio
        if ratio is not None and abs(ratio - 1) > TOLERANCE:
            failures.append(f"{what} {format_size(r.size)}: measured/predicted {ratio:.2f}")
    if name == "ddl_two_switch":
        target = SPEEDUP[collective]
        for size in sorted({r.size for r in rows}):
            by = {r.algorithm: r for r in rows if r.size == size}
            planned = [by[a] for a in PLANNED[collective] if a in by]
            if "ring:0,2,1,3" not in by or not planned:
                continue
            bad = by["ring:0,2,1,3"]
            best = min(planned, key=lambda r: r.measured_s)
            speedup = bad.measured_s / best.measured_s
            auto = (f"; auto {bad.measured_s / by['auto'].measured_s:.2f}x"
                    if "auto" in by else "")
            predicted = (f", predicted {bad.predicted_s / best.predicted_s:.2f}x"
                         if bad.predicted_s and best.predicted_s else "")
            print(f"  target {format_size(size)}: best planned {collective} ({best.algorithm}) "
                  f"{speedup:.2f}x faster than the bad ring A->C->B->D{predicted} (>= {target}: "
                  f"{'yes' if speedup >= target else 'NO'}){auto}; "
                  f"{_ratio(best.speedup_vs_native)}x native")
            if speedup < target and size == max(r.size for r in rows):
                failures.append(f"ddl_two_switch {collective} {transport}: planned only "
                                f"{speedup:.2f}x the bad ring")


def _summary(records: list[dict], failures: list[str]) -> None:
    """The fidelity table: measured / calibrated prediction per cell."""
    if not records:
        return
    cells = [r for r in records if r["algorithm"] in CELLS]
    sizes = sorted({r["size"] for r in cells})
    names = [a for a in CELLS if any(r["algorithm"] == a for r in cells)]
    print("\n## fidelity: measured / predicted (calibrated on the testbed); raw in brackets")
    header = " ".join(f"{a + ' ' + format_size(s):>19}" for a in names for s in sizes)
    print(f"{'topology':<15} {'collective':<14} {'transport':<9} {header}")
    keys = dict.fromkeys((r["topology"], r["collective"], r["transport"]) for r in cells)
    for topo, collective, transport in keys:
        row = {(r["algorithm"], r["size"]): r for r in cells
               if (r["topology"], r["collective"], r["transport"]) == (topo, collective,
                                                                        transport)}
        out = []
        for a in names:
            for s in sizes:
                r = row.get((a, s))
                out.append(f"{'-':>19}" if r is None else
                           f"{_ratio(r['calibrated_ratio'] or r['ratio']):>12} "
                           f"({_ratio(r['ratio'])})")
        print(f"{topo:<15} {collective:<14} {transport:<9} {' '.join(out)}")
    ratios = [r["calibrated_ratio"] or r["ratio"] for r in cells
              if (r["calibrated_ratio"] or r["ratio"]) is not None]
    inside = sum(abs(x - 1) <= TOLERANCE for x in ratios)
    print(f"{inside} of {len(ratios)} cells within {1 - TOLERANCE:.2f} .. {1 + TOLERANCE:.2f}; "
          f"range {min(ratios):.2f} .. {max(ratios):.2f}")


if __name__ == "__main__":
    sys.exit(main())
