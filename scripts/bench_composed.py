#!/usr/bin/env python3
"""Composing with NCCL: ``auto`` among ``nccl``, the planned schedules and ``composed``,
against NCCL's own collective, on every shipped topology and the target clusters of
topologies/targets/.

For each cluster and size, under the ``nccl`` cost profile (one run, every number a
prediction of the same models): what NCCL runs (the ``nccl`` row: algorithm/protocol x
channels, docs/NCCL_MODEL.md) and its time, the best point-to-point plan, the
``composed`` plan (native steps inside the boxes, a planned exchange across them), what
``auto`` picks among all of them, and NCCL's time over auto's (above 1.00: faster than
NCCL). ``nccl / bound`` says how much room the fabric leaves: NCCL's time over the
lower bound of any schedule.

Then the targets, checked and printed (the script exits 1 if one fails):

- never slower: auto's choice is at least as fast as ``nccl`` at every size everywhere;
- at 256 MiB, at least 1.3x on boxes with unequal NICs or GPU counts on one switch
  (``unequal_nics``, ``unequal_gpus``), 1.1x on an oversubscribed two-leaf cluster with
  one NIC per host (``two_leaf_oversubscribed``), 1.5x on ``ddl_two_switch`` with the
  ranks numbered across the switches (``ddl_two_switch_crossed``);
- one NVSwitch box (``dgx_h100``): auto picks ``nccl`` or a composed plan at most its
  time, at every size.

    python scripts/bench_composed.py                       # 1 KiB .. 1 GiB, x4 steps
    python scripts/bench_composed.py --sizes 1MiB,256MiB --max-ranks 256
    python scripts/bench_composed.py --topologies unequal_nics,dgx_h100 --json rows.json

``main()`` returns the rows (one dict per cluster and size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoplan.analysis.bound import collective_bound  # noqa: E402
from topoplan.cluster import load_cluster  # noqa: E402
from topoplan.planners import PlanRequest, compare, nccl_candidate  # noqa: E402
from topoplan.units import format_size, parse_size  # noqa: E402

TOPOLOGIES = ROOT / "topologies"
#: Sizes by default: 1 KiB to 1 GiB in steps of 4.
SIZES = tuple(1 << k for k in range(10, 31, 2))
#: Planners that are not point-to-point plans.
NATIVE = ("nccl", "composed")
#: (cluster, at least this speedup over nccl at 256 MiB): the targets of composing with NCCL.
TARGETS = (("unequal_nics", 1.3), ("unequal_gpus", 1.3), ("two_leaf_oversubscribed", 1.1),
           ("ddl_two_switch_crossed", 1.5))
#: The single NVSwitch box.
ONE_BOX = "dgx_h100"


def paths(names: str | None) -> list[Path]:
    """Every shipped topology and every target cluster, or those ``names`` lists."""
    found = sorted(TOPOLOGIES.glob("*.yaml")) + sorted((TOPOLOGIES / "targets").glob("*.yaml"))
    if not names:
        return found
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    by_name = {p.stem: p for p in found}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise SystemExit(f"bench_composed: unknown topology {unknown[0]!r}; known: "
                         f"{', '.join(by_name)}")
    return [by_name[n] for n in wanted]


def bench(clusters: list[Path], sizes: list[int], collective: str = "allreduce",
          max_ranks: int | None = None) -> list[dict[str, Any]]:
    """One row per (cluster, size): nccl, the best plan, composed, auto's choice."""
    rows: list[dict[str, Any]] = []
    for path in clusters:
        cluster = load_cluster(path)
        if max_ranks is not None and cluster.nranks > max_ranks:
            print(f"# skipping {path.stem}: {cluster.nranks} ranks > --max-ranks {max_ranks}",
                  file=sys.stderr)
            continue
        for size in sizes:
            t0 = time.perf_counter()
            request = PlanRequest.make(cluster, size=size, collective=collective,
                                       profile="nccl")
            candidates = compare(request)
            nccl = nccl_candidate(request, candidates)
            auto = candidates[0]
            planned = [c for c in candidates if c.name not in NATIVE]
            best = min(planned, key=lambda c: c.time_s) if planned else None
            composed = next((c for c in candidates if c.name == "composed"), None)
            meta = composed.schedule.meta if composed and composed.schedule else {}
            row = {
                "topology": path.stem, "ranks": cluster.nranks, "boxes": len(cluster.boxes),
                "size": size, "collective": collective,
                "nccl": nccl.nccl.label() if nccl.nccl is not None else "native",
                "nccl_s": nccl.time_s,
                "bound_s": collective_bound(cluster, size, collective),
                "planned": best.name if best else None,
                "planned_s": best.time_s if best else None,
                "composed_s": composed.time_s if composed else None,
                "composed": (f"{meta.get('variant')}/{meta.get('cross')}"
                             if meta.get("cross") else meta.get("variant")),
                "auto": auto.name, "auto_s": auto.time_s,
                "speedup": nccl.time_s / auto.time_s if auto.time_s > 0 else 1.0,
                "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(line(row), flush=True)
    return rows


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


HEADER = (f"{'topology':24} {'ranks':>5} {'size':>7}  {'NCCL runs':20} {'nccl':>10} "
          f"{'/bound':>6}  {'best planned':>23}  {'composed':>25}  {'auto':9} {'NCCL/auto':>9}")


def line(r: dict[str, Any]) -> str:
    bound = f"{r['nccl_s'] / r['bound_s']:.2f}" if r["bound_s"] > 0 else "-"
    planned = f"{r['planned'] or '-'} {_t(r['planned_s'])}"
    composed = f"{r['composed'] or '-'} {_t(r['composed_s'])}"
    return (f"{r['topology']:24} {r['ranks']:>5} {format_size(r['size']):>7}  "
            f"{r['nccl']:20} {_t(r['nccl_s']):>10} {bound:>6}  {planned:>23}  "
            f"{composed:>25}  {r['auto']:9} {r['speedup']:8.2f}x")


def check_targets(rows: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """The targets over ``rows``: (what, met, the numbers)."""
    out: list[tuple[str, bool, str]] = []
    worst = min(rows, key=lambda r: r["speedup"]) if rows else None
    if worst is not None:
        out.append(("never slower than nccl (every topology, every size)",
                    worst["speedup"] >= 1.0 - 1e-9,
                    f"lowest NCCL/auto {worst['speedup']:.4f}x ({worst['topology']}, "
                    f"{format_size(worst['size'])}, auto picks {worst['auto']})"))
    at = {(r["topology"], r["size"]): r for r in rows}
    for name, want in TARGETS:
        r = at.get((name, 256 << 20))
        if r is None:
            continue
        out.append((f"{name} at 256MiB: NCCL/auto >= {want:.1f}x", r["speedup"] >= want,
                    f"{r['speedup']:.2f}x (auto picks {r['auto']}, {_t(r['auto_s'])} "
                    f"against {_t(r['nccl_s'])})"))
    box = [r for r in rows if r["topology"] == ONE_BOX]
    if box:
        bad = [r for r in box if r["auto"] not in NATIVE and not r["auto_s"] < r["nccl_s"]
               or r["auto_s"] > r["nccl_s"] * (1 + 1e-9)]
        picks = sorted({r["auto"] for r in box})
        out.append((f"{ONE_BOX}: auto picks nccl or composed at most nccl's time",
                    not bad, f"picks {', '.join(picks)} over {len(box)} sizes"
                    + (f"; not at {', '.join(format_size(r['size']) for r in bad)}"
                       if bad else "")))
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(format_size(s) for s in SIZES),
                        help="comma-separated sizes (default 1KiB to 1GiB in steps of 4)")
    parser.add_argument("--topologies", default=None,
                        help="comma-separated names (default: every shipped topology and "
                             "every target cluster)")
    parser.add_argument("--collective", default="allreduce",
                        choices=("allreduce", "reduce_scatter", "allgather"),
                        help="what to plan (default allreduce; the targets are allreduce's)")
    parser.add_argument("--max-ranks", type=int, default=None,
                        help="skip clusters with more ranks (default: none skipped)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    print("auto among nccl, the planned schedules and composed, under the nccl profile; "
          "NCCL/auto above 1.00x: faster than NCCL")
    print(HEADER)
    rows = bench(paths(args.topologies), sizes, args.collective, args.max_ranks)
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.0f} s; /bound: NCCL's time over "
          "the lower bound of any schedule")
    failed = False
    if args.collective == "allreduce":
        print("\ntargets:")
        for what, met, numbers in check_targets(rows):
            failed |= not met
            print(f"  {'met   ' if met else 'FAILED'} {what}: {numbers}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if failed:
        raise SystemExit(1)
    return rows


if __name__ == "__main__":
    main()
