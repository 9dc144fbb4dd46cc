#!/usr/bin/env python
"""Planned all_gather_into_tensor / reduce_scatter_tensor against torch.distributed's own,
over gloo, in one run.

    python scripts/bench_fsdp.py [--ranks 4] [--sizes 64KiB,1MiB,16MiB] [--iters 10]
                                 [--algorithms ring,auto] [--cluster topologies/ddl_two_switch.yaml]

Starts ``--ranks`` processes with a gloo process group (``torch.multiprocessing``,
spawn). For each full-buffer size (float32; the allgather's output, the reduce-scatter's
input) every rank runs, ``--iters`` times after one warm-up, torch's collective and
:class:`topoplan.torch.PlannedCollectives`' for each algorithm, alternating so that a
loaded machine slows them alike. An iteration is timed from a barrier to the last rank's
finish (the maximum over ranks); the table has the median, the bus bandwidth
(``(N - 1) / N * size / time``, nccl-tests' factor for these collectives) and the ratio of
torch's time to the planned one (> 1: the planned one is faster). The planned results are
checked against torch's before timing. ``--json`` prints the records instead.

The cluster (default: ``topologies/ddl_two_switch.yaml`` for 4 ranks, else a flat
switch) is what the planner plans for; over gloo on one machine every rank shares the
host, so these times measure the executor's overhead and gloo's transfers, not the
topology.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor")


def _cluster(args: argparse.Namespace):
    from topoplan.cluster import flat_cluster, load_cluster

    if args.cluster:
        return load_cluster(args.cluster)
    default = ROOT / "topologies" / "ddl_two_switch.yaml"
    return load_cluster(default) if args.ranks == 4 else flat_cluster(args.ranks)


def _worker(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist

    from topoplan.torch import PlannedCollectives

    torch.set_num_threads(1)
    world = args.ranks
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    cluster = _cluster(args)
    planned = {a: PlannedCollectives(cluster, algorithm=a, timeout=120) for a in args.algorithms}
    runners = {"torch": {"all_gather_into_tensor": dist.all_gather_into_tensor,
                         "reduce_scatter_tensor": dist.reduce_scatter_tensor}}
    for a, p in planned.items():
        runners[a] = {"all_gather_into_tensor": p.all_gather_into_tensor,
                      "reduce_scatter_tensor": p.reduce_scatter_tensor}
    clock = torch.zeros(1, dtype=torch.float64)
    records = []
    for size in args.sizes:
        full = size // 4 // world * world                   # float32 elements, whole shards
        m = full // world
        g = torch.Generator().manual_seed(rank)
        bufs = {"all_gather_into_tensor": (torch.empty(full), torch.randn(m, generator=g)),
                "reduce_scatter_tensor": (torch.empty(m), torch.randn(full, generator=g))}
        for coll in COLLECTIVES:
            out_t, in_t = bufs[coll]
            reference = torch.empty_like(out_t)
            runners["torch"][coll](reference, in_t)
            for name in planned:                              # check, and warm up (plans)
                out_t.fill_(float("nan"))
                runners[name][coll](out_t, in_t)
                if not torch.allclose(out_t, reference, rtol=1e-5, atol=1e-5):
                    raise SystemExit(f"rank {rank}: planned {name} {coll} of {size} bytes "
                                     "differs from torch's")
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.iters):
                for name, run in runners.items():
                    dist.barrier()
                    start = time.perf_counter()
                    run[coll](out_t, in_t)
                    clock[0] = time.perf_counter() - start
                    dist.all_reduce(clock, op=dist.ReduceOp.MAX)
                    times[name].append(float(clock[0]))
            if rank == 0:
                base = statistics.median(times["torch"])
                for name, ts in times.items():
                    med = statistics.median(ts)
                    records.append({
                        "collective": coll, "bytes": full * 4, "impl": name,
                        "chosen": sorted({v for (c, _, _), v in planned[name].chosen.items()
                                          if c == ("allgather" if coll.startswith("all_gather")
                                                   else "reduce_scatter")})
                        if name in planned else [],
                        "median_s": med, "min_s": min(ts),
                        "busbw_GBps": (world - 1) / world * full * 4 / med / 1e9,
                        "torch_over_this": base / med})
    if rank == 0:
        Path(out, "records.json").write_text(json.dumps(records))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from topoplan.units import format_size, parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="64KiB,1MiB,16MiB",
                        help="full-buffer sizes, comma-separated (default: %(default)s)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--algorithms", default="ring,auto",
                        help="planners to run, comma-separated (default: %(default)s)")
    parser.add_argument("--cluster", help="cluster YAML with --ranks ranks")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    args = parser.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    cluster = _cluster(args)
    if cluster.nranks != args.ranks:
        parser.error(f"cluster {cluster.name!r} has {cluster.nranks} ranks, not {args.ranks}")

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as out:
        mp.start_processes(_worker, args=(args, port, out), nprocs=args.ranks, join=True,
                           start_method="spawn")
        records = json.loads(Path(out, "records.json").read_text())
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    print(f"{args.ranks} gloo ranks, cluster {cluster.name}, float32, median of {args.iters} "
          f"(barrier to the last rank's finish); torch/this > 1: faster than torch")
    print(f"{'collective':<24}{'size':>9}  {'impl':<16}{'median':>10}{'busbw':>11}"
          f"{'torch/this':>12}")
    for r in records:
        impl = r["impl"] + (f" ({'/'.join(r['chosen'])})" if r["chosen"] and
                            r["chosen"] != [r["impl"]] else "")
        print(f"{r['collective']:<24}{format_size(r['bytes']):>9}  {impl:<16}"
              f"{r['median_s'] * 1e3:>8.2f}ms{r['busbw_GBps']:>7.2f}GB/s"
              f"{r['torch_over_this']:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
