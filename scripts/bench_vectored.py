"""Vectored messages (IR v4): ops per rank and simulated time over the bound, with and
without :func:`topoplan.ir.passes.vectorize`, of a planner's reduce-scatter and
allgather (``mcf`` by default) on the shipped topologies named.

``python scripts/bench_vectored.py topologies/leaf_spine_1024.yaml topologies/dgx_a100_x4.yaml``
(``--profile nccl --size 256MiB`` by default). The bound is ForestColl's shard bound
(:func:`topoplan.analysis.bound.collective_bound`), as in docs/RESULTS.md "mcf for
reduce-scatter and allgather". The third column (``planned``) is the plan made for
vectored messages (``topoplan.plan(..., vectored=True)``: mcf prices one op per peer
and step and picks its rounds and pipeline for that), against the bound too.
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="+")
    parser.add_argument("--algorithm", default="mcf")
    parser.add_argument("--profile", default="nccl")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--collectives", default="reduce_scatter,allgather")
    args = parser.parse_args(argv)

    import topoplan
    from topoplan.analysis.bound import collective_bound
    from topoplan.ir.passes import vectorize
    from topoplan.units import parse_size

    size = parse_size(args.size)
    print("topology collective ranks | ops/rank plain -> vectored -> planned | sim/bound "
          "plain -> vectored -> planned | plan s, vectorize s, verify s, plan vectored s",
          flush=True)
    for path in args.topologies:
        cluster = topoplan.load_cluster(path)
        for collective in args.collectives.split(","):
            t0 = time.perf_counter()
            plain = topoplan.plan(cluster, args.algorithm, size=size, profile=args.profile,
                                  collective=collective)
            t1 = time.perf_counter()
            vec = vectorize(plain)
            t2 = time.perf_counter()
            topoplan.verify(vec)
            t3 = time.perf_counter()
            planned = topoplan.plan(cluster, args.algorithm, size=size, profile=args.profile,
                                    collective=collective, vectored=True)
            t4 = time.perf_counter()
            bound = collective_bound(cluster, size, collective)
            times = [topoplan.simulate(cluster, s, size, profile=args.profile).time_s
                     for s in (plain, vec, planned)]
            n = cluster.nranks
            print(f"{cluster.name} {collective} {n} | {plain.nops / n:.0f} -> {vec.nops / n:.0f}"
                  f" -> {planned.nops / n:.0f} | {times[0] / bound:.3f} -> "
                  f"{times[1] / bound:.3f} -> {times[2] / bound:.3f} | {t1 - t0:.1f}, "
                  f"{t2 - t1:.1f}, {t3 - t2:.1f}, {t4 - t3:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
