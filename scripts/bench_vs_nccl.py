"""topoplan's plans against NCCL's own collective, on every shipped topology.

For each cluster and size: what NCCL runs there and its time (the NCCL model,
docs/NCCL_MODEL.md: NCCL's tuner on the channels its search builds, with rings and trees
laid on the real fabric in rank order), and what ``auto`` plans and its simulated time
under the ``nccl`` cost profile (a plan run inside NCCL, as MSCCL runs it). The ratio is
NCCL's time over the plan's: above 1, the plan is faster. Both are priced by models in
one run; a real NCCL on these fabrics is not available here.

    python scripts/bench_vs_nccl.py                       # every shipped topology <= 192 ranks
    python scripts/bench_vs_nccl.py --sizes 1MiB,256MiB --max-ranks 1024 --json
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
from topoplan.planners import PlanRequest, compare, nccl_candidate  # noqa: E402
from topoplan.units import format_size, parse_size  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MiB,64MiB,256MiB",
                        help="comma-separated sizes (default 1MiB,64MiB,256MiB)")
    parser.add_argument("--max-ranks", type=int, default=192,
                        help="skip topologies with more ranks (default 192)")
    parser.add_argument("--profile", default="nccl", help="cost profile for the plans")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = []
    t0 = time.perf_counter()
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        cluster = load_cluster(path)
        if cluster.nranks > args.max_ranks:
            continue
        for size in sizes:
            request = PlanRequest.make(cluster, size=size, profile=args.profile)
            rows_ = compare(request)
            best = rows_[0]  # nccl itself where no plan beats it (1.00x)
            nccl = nccl_candidate(request, rows_)
            assert nccl.nccl is not None
            rows.append({"topology": path.stem, "ranks": cluster.nranks, "size": size,
                         "nccl": nccl.nccl.label(), "nccl_s": nccl.time_s,
                         "nccl_limited_by": nccl.nccl.limited_by,
                         "auto": best.name, "auto_s": best.time_s,
                         "speedup": nccl.time_s / best.time_s})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"auto (profile {args.profile}) against NCCL's own collective (model); ratio = "
          "NCCL / auto")
    print(f"{'topology':20} {'ranks':>5} {'size':>7}  {'NCCL runs':22} {'NCCL':>10}  "
          f"{'auto':13} {'auto':>10} {'ratio':>6}")
    for r in rows:
        def t(s: float) -> str:
            return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"
        print(f"{r['topology']:20} {r['ranks']:>5} {format_size(r['size']):>7}  "
              f"{r['nccl'] + ' (' + r['nccl_limited_by'] + ')':22} {t(r['nccl_s']):>10}  "
              f"{r['auto']:13} {t(r['auto_s']):>10} {r['speedup']:5.2f}x")
    print(f"{len(rows)} rows in {time.perf_counter() - t0:.0f} s; (latency/fabric/nccl): what "
          "sets NCCL's time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
