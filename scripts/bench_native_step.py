"""What a native step costs: the executor running the transport's own allreduce as a step,
against that allreduce called directly, and a composed schedule of native steps.

    python scripts/bench_native_step.py                  # 4 ranks, 1KiB..16MiB, MPI and gloo
    python scripts/bench_native_step.py --ranks 4 --sizes 1KiB:64MiB:4 --no-torch

One ``mpiexec -n N`` launch measures, per size, interleaved round by round (so the
machine's load hits every method alike), on float32 buffers:

- ``native``: the transport's own allreduce (``MPI_Allreduce``; ``dist.all_reduce``),
- ``step``: ``topoplan.Allreduce`` of the schedule whose only step is a native allreduce
  over every rank (what ``auto`` runs when it picks the native collective); on MPI it
  runs ``MPI_Iallreduce`` polled against the step's deadline, and ``step-b`` is the same
  over ``MPI(blocking_natives=True)`` (``MPI_Allreduce``, no deadline),
- ``composed``: a composed allreduce of native steps only (reduce-scatter in each of two
  boxes, allreduce over each rail, allgather in each box; on 2 ranks a reduce-scatter
  then an allgather over both),
- ``ring``: the planned point-to-point ring, replayed.

It prints each method's time (the slowest rank's mean in the method's fastest block)
and ``step/native``, the cost of
running the native call as a step (target: 1.00 within the noise). Every method is
first checked for exact sums on integer data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _measure(methods, barrier, agree_max, seconds, rounds, max_iters=400):
    """The slowest rank's mean time per call of each method in its fastest block, over
    ``rounds`` blocks of every method in turn (the machine is shared: its load comes and
    goes, and the fastest block is the one it disturbed least)."""
    iters = {}
    for name, fn in methods.items():  # warm-up and block length
        fn()
        barrier()
        t0 = time.perf_counter()
        fn()
        est = agree_max(time.perf_counter() - t0)
        iters[name] = int(min(max_iters, max(1, seconds / rounds / max(est, 1e-7))))
    best = {name: float("inf") for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                fn()
            best[name] = min(best[name], agree_max((time.perf_counter() - t0) / iters[name]))
    return best


def _schedules(n):
    from tests.support import native_schedules as N
    from tests.support import schedules as S
    # Two boxes of n/2; with 2 ranks (boxes of one) a reduce-scatter then an allgather.
    composed = (N.composed_allreduce(2, n // 2) if n % 2 == 0 and n >= 4
                else N.scatter_then_gather(n))
    return {"step": N.native_allreduce(n), "composed": composed, "ring": S.ring(n)}


def _run(transport, native, sizes, seconds, rounds, barrier, agree_max, xp, blocking=None):
    """Rows of one transport: ``native(buffer)`` is its own allreduce, ``xp`` makes
    buffers (numpy or torch); ``blocking``: the transport with blocking native steps."""
    from topoplan.runtime.executor import Allreduce
    n, rank = transport.size, transport.rank
    schedules = _schedules(n)
    runs = {name: Allreduce(s, transport, timeout=300) for name, s in schedules.items()}
    if blocking is not None:
        runs["step-b"] = Allreduce(schedules["step"], blocking, timeout=300)
    rows = []
    for size in sizes:
        count = size // 4
        bufs = {name: xp(count) for name in ("native", *runs)}
        want = None
        ok = True
        for name, buf in bufs.items():
            buf[...] = xp(count, rank)
            (native if name == "native" else runs[name])(buf)
            want = xp(count, "sum") if want is None else want
            ok &= bool((buf == want).all())
            buf[...] = 0
        methods = {"native": lambda: native(bufs["native"])}
        methods.update({name: (lambda r=r, b=bufs[name]: r(b)) for name, r in runs.items()})
        t = _measure(methods, barrier, agree_max, seconds, rounds)
        ok = agree_max(0.0 if ok else 1.0) == 0.0
        rows.append({"size": size, "ok": ok, **{f"{k}_s": v for k, v in t.items()}})
    return rows


def rank_main(args) -> None:
    import numpy as np
    from mpi4py import MPI as mpi

    from topoplan.runtime.transports.mpi import MPI

    comm = mpi.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()

    def np_buf(count, fill=None):
        if fill is None:
            return np.zeros(count, dtype=np.float32)
        base = np.arange(count) % 251
        if fill == "sum":
            return (base * n + sum(range(n))).astype(np.float32)
        return (base + fill).astype(np.float32)

    transport = MPI(comm)
    agree = lambda v: comm.allreduce(v, op=mpi.MAX)  # noqa: E731
    records = [{"transport": "mpi", "native": "MPI_Allreduce", "nranks": n,
                "rows": _run(transport, transport.native_allreduce, args.sizes, args.seconds,
                             args.rounds, comm.Barrier, agree, np_buf,
                             blocking=MPI(comm, blocking_natives=True))}]
    if args.torch:
        import torch
        import torch.distributed as dist

        from topoplan.runtime.transports import connect
        from topoplan.runtime.transports.launch import free_port

        def torch_buf(count, fill=None):
            return torch.from_numpy(np_buf(count, fill))

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        port = comm.bcast(free_port() if rank == 0 else None, root=0)
        gloo = connect("torch", init_method=f"tcp://127.0.0.1:{port}", rank=rank, size=n,
                       timeout=600)
        records.append({"transport": "gloo", "native": "dist.all_reduce", "nranks": n,
                        "rows": _run(gloo, gloo.native_allreduce, args.sizes, args.seconds,
                                     args.rounds, dist.barrier, agree, torch_buf)})
        dist.destroy_process_group()
    if rank == 0:
        print("BENCH-RECORDS " + json.dumps(records), flush=True)


def report(records) -> str:
    from topoplan.units import format_size
    lines = []
    for rec in records:
        lines.append(f"\n## {rec['transport']}, {rec['nranks']} ranks: time per call (us), "
                     f"native = {rec['native']}")
        blocking = "step-b_s" in rec["rows"][0]
        lines.append(f"{'size':>8} {'native':>9} {'step':>9}" + (f" {'step-b':>9}" if blocking
                                                                  else "")
                     + f" {'composed':>9} {'ring':>9} {'step/native':>11}"
                     + (f" {'step-b/native':>13}" if blocking else "")
                     + f" {'composed/native':>15}  ok")
        for r in rec["rows"]:
            us = {k: r[f"{k}_s"] * 1e6 for k in ("native", "step", "step-b", "composed", "ring")
                  if f"{k}_s" in r}
            line = f"{format_size(r['size']):>8} {us['native']:>9.1f} {us['step']:>9.1f}"
            line += f" {us['step-b']:>9.1f}" if blocking else ""
            line += f" {us['composed']:>9.1f} {us['ring']:>9.1f}"
            line += f" {us['step'] / us['native']:>10.2f}x"
            line += f" {us['step-b'] / us['native']:>12.2f}x" if blocking else ""
            line += f" {us['composed'] / us['native']:>14.2f}x  {'yes' if r['ok'] else 'NO'}"
            lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default="1KiB:16MiB:4",
                        help="FIRST:LAST:FACTOR or a comma list (default 1KiB:16MiB:4)")
    parser.add_argument("--seconds", type=float, default=0.6, help="per method and size")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from topoplan.units import parse_size
    if ":" in args.sizes:
        first, last, factor = args.sizes.split(":")
        sizes, s = [], parse_size(first)
        while s <= parse_size(last):
            sizes.append(s)
            s *= int(factor)
    else:
        sizes = [parse_size(x) for x in args.sizes.split(",")]
    args.sizes = sizes
    if args.rank_main:
        rank_main(args)
        return
    from topoplan.runtime.mpirun import mpiexec
    argv = [sys.executable, os.path.abspath(__file__), "--rank-main", "--sizes",
            ",".join(str(s) for s in sizes), "--seconds", str(args.seconds), "--rounds",
            str(args.rounds)] + ([] if args.torch else ["--no-torch"])
    proc = mpiexec(args.ranks, argv, timeout=3600, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("BENCH-RECORDS ")), None)
    if line is None:
        sys.exit(f"bench_native_step: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    print(report(json.loads(line.removeprefix("BENCH-RECORDS "))))


if __name__ == "__main__":
    main()
