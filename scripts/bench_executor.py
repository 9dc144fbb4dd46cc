"""Executor efficiency: a replayed ring against native allreduce and a hand-written ring.

    python scripts/bench_executor.py                 # 4 and 8 ranks, 1KiB..256MiB, float32
    python scripts/bench_executor.py --ranks 4 --sizes 1KiB:1MiB:4 --no-torch

One invocation launches ``mpiexec -n N`` per rank count. Each launch measures,
per size and interleaved round by round (so machine load hits all alike):

- ``replay``: topoplan's ring schedule through ``topoplan.Allreduce`` over MPI,
- ``native``: ``MPI_Allreduce``,
- ``hand``: a minimal mpi4py ring (Isend/Irecv/Waitall, numpy adds; no generality),

then the same for gloo: the replayed ring over ``topoplan.runtime.transports.Torch``
against ``dist.all_reduce``. It prints busbw per method (the slowest rank's mean
over the interleaved rounds), the ratios replay/native and replay/hand, the time
per step of the replay and of the hand ring (call time / steps: at small sizes,
the per-step overhead of each) and their difference. Targets: replay >=
native at 64 MiB and above, replay >= 0.9 x hand at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def ring_schedule(n: int):
    """The ring planner's schedule when it exists, else the test suite's ring."""
    try:
        from topoplan.cluster import flat_cluster
        from topoplan.planners import plan
        return plan(flat_cluster(n), algorithm="ring", size=256 << 20)
    except ImportError:
        from tests.support import schedules
        return schedules.ring(n)


def hand_ring(comm, mpi, buf, scratch):
    """A minimal ring allreduce with mpi4py: what a person would write by hand."""
    n, r = comm.Get_size(), comm.Get_rank()
    count = buf.shape[0]
    bounds = [(k * count // n, (k + 1) * count // n) for k in range(n)]
    chunks = [buf[a:b] for a, b in bounds]
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send, get = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        tmp = scratch[:get.shape[0]]
        mpi.Request.Waitall([comm.Irecv(tmp, left, 7), comm.Isend(send, right, 7)])
        get += tmp
    for s in range(n - 1):
        send, get = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        mpi.Request.Waitall([comm.Irecv(get, left, 7), comm.Isend(send, right, 7)])


def _measure(methods, barrier, agree_max, seconds, rounds, max_iters=200):
    """The slowest rank's mean time per call, per method.

    The machine is shared and its load moves, so the methods take turns in short
    blocks (``rounds`` x methods x ~``seconds / rounds``) and each method's time
    is the total over its blocks: load swings hit every method alike.
    """
    iters = {}
    for name, fn in methods.items():  # warm-up and block length
        fn()
        barrier()
        t0 = time.perf_counter()
        fn()
        est = agree_max(time.perf_counter() - t0)
        iters[name] = int(min(max_iters, max(1, seconds / rounds / max(est, 1e-7))))
    total = {name: 0.0 for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            k = iters[name]
            barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            total[name] += time.perf_counter() - t0
    return {name: agree_max(total[name] / (iters[name] * rounds)) for name in methods}


def rank_main(args) -> None:
    import numpy as np
    from mpi4py import MPI as mpi

    from topoplan.runtime.bench import expected_sum, pattern
    from topoplan.runtime.executor import Allreduce
    from topoplan.runtime.transports.mpi import MPI

    comm = mpi.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    schedule = ring_schedule(n)
    transport = MPI(comm)
    replay = Allreduce(schedule, transport, timeout=300)
    hand_comm = comm.Dup()
    records = []
    steps = schedule.nsteps
    for size in args.sizes:
        count = size // 4
        bufs = {k: np.zeros(count, dtype=np.float32) for k in ("replay", "native", "hand")}
        scratch = np.empty(count // n + 1, dtype=np.float32)
        # One correctness pass each: the three must agree exactly on integer data.
        for k, b in bufs.items():
            b[...] = pattern(np.arange(count), rank)
        replay(bufs["replay"])
        comm.Allreduce(mpi.IN_PLACE, bufs["native"], op=mpi.SUM)
        hand_ring(hand_comm, mpi, bufs["hand"], scratch)
        ok = all(np.array_equal(b, expected_sum(np.arange(count), n)) for b in bufs.values())
        for b in bufs.values():
            b[...] = 0
        methods = {
            "replay": lambda: replay(bufs["replay"]),
            "native": lambda: comm.Allreduce(mpi.IN_PLACE, bufs["native"], op=mpi.SUM),
            "hand": lambda: hand_ring(hand_comm, mpi, bufs["hand"], scratch),
        }
        t = _measure(methods, comm.Barrier, lambda v: comm.allreduce(v, op=mpi.MAX),
                     args.seconds, args.rounds)
        all_ok = comm.allreduce(ok, op=mpi.LAND)
        if rank == 0:
            records.append({"transport": "mpi", "nranks": n, "size": size, "steps": steps,
                            "ok": bool(all_ok), **{f"{k}_s": v for k, v in t.items()}})
    if args.torch:
        records += torch_part(args, comm, mpi, n, rank, schedule)
    if rank == 0:
        print("BENCH-RECORDS " + json.dumps(records), flush=True)


def torch_part(args, comm, mpi, n, rank, schedule):
    import torch
    import torch.distributed as dist

    from topoplan.runtime.bench import expected_sum, pattern
    from topoplan.runtime.executor import Allreduce
    from topoplan.runtime.transports import connect
    from topoplan.runtime.transports.launch import free_port

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = comm.bcast(free_port() if rank == 0 else None, root=0)
    transport = connect("torch", init_method=f"tcp://127.0.0.1:{port}", rank=rank, size=n,
                        timeout=600)
    replay = Allreduce(schedule, transport, timeout=300)
    out = []
    for size in args.sizes:
        count = size // 4
        # Integer arange first: a float32 arange is inexact above 2**24 elements.
        a = pattern(torch.arange(count), rank).to(torch.float32)
        b = a.clone()
        replay(a)
        dist.all_reduce(b)
        want = expected_sum(torch.arange(count), n)
        ok = bool(torch.equal(a, want.float()) and torch.equal(b, want.float()))
        a.zero_()
        b.zero_()
        t = _measure({"replay": lambda: replay(a), "native": lambda: dist.all_reduce(b)},
                     dist.barrier, lambda v: comm.allreduce(v, op=mpi.MAX), args.seconds,
                     args.rounds)
        ok = comm.allreduce(ok, op=mpi.LAND)
        if rank == 0:
            out.append({"transport": "gloo", "nranks": n, "size": size,
                        "steps": schedule.nsteps, "ok": bool(ok),
                        **{f"{k}_s": v for k, v in t.items()}})
    dist.destroy_process_group()
    return out


def report(records) -> str:
    from topoplan.units import format_size
    from topoplan.ir.collectives import bus_factor
    lines = []
    for transport in ("mpi", "gloo"):
        for n in sorted({r["nranks"] for r in records if r["transport"] == transport}):
            rows = [r for r in records if r["transport"] == transport and r["nranks"] == n]
            factor = bus_factor(n)
            native = "MPI_Allreduce" if transport == "mpi" else "dist.all_reduce"
            head = f"{'size':>8} {'replay':>9} {'native':>9}"
            head += f" {'hand':>9}" if transport == "mpi" else ""
            head += f" {'rep/nat':>8}" + (f" {'rep/hand':>8}" if transport == "mpi" else "")
            head += f" {'us/step':>8}" + (f" {'hand us/st':>10} {'ovh us/step':>11}"
                                          if transport == "mpi" else "")
            head += "  ok"
            lines.append(f"\n## {transport}, {n} ranks: busbw GB/s (native = {native})")
            lines.append(head)
            for r in rows:
                bw = {k: r["size"] / r[f"{k}_s"] / 1e9 * factor
                      for k in ("replay", "native", "hand") if f"{k}_s" in r}
                line = f"{format_size(r['size']):>8} {bw['replay']:>9.3f} {bw['native']:>9.3f}"
                if "hand" in bw:
                    line += f" {bw['hand']:>9.3f}"
                line += f" {bw['replay'] / bw['native']:>7.2f}x"
                if "hand" in bw:
                    line += f" {bw['replay'] / bw['hand']:>7.2f}x"
                line += f" {r['replay_s'] / r['steps'] * 1e6:>8.1f}"
                if "hand_s" in r:
                    line += f" {r['hand_s'] / r['steps'] * 1e6:>10.1f}"
                    line += f" {(r['replay_s'] - r['hand_s']) / r['steps'] * 1e6:>11.1f}"
                line += f"  {'yes' if r['ok'] else 'NO'}"
                lines.append(line)
    return "\n".join(lines)


def main() -> int:
    from topoplan.commands.common import sizes_arg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="4,8", help="rank counts, e.g. 4,8")
    parser.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1KiB:256MiB:4"))
    parser.add_argument("--seconds", type=float, default=0.6,
                        help="time per method and size, split over the rounds")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-torch", dest="torch", action="store_false")
    parser.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="FILE", help="also write the records here")
    args = parser.parse_args()
    if args.rank_mode:
        rank_main(args)
        return 0
    from topoplan.runtime.mpirun import mpiexec

    records = []
    load = os.getloadavg()
    started = time.time()
    for n in (int(x) for x in args.ranks.split(",")):
        argv = [sys.executable, os.path.abspath(__file__), "--rank-mode",
                "--sizes", ",".join(map(str, args.sizes)), "--seconds", str(args.seconds),
                "--rounds", str(args.rounds)] + ([] if args.torch else ["--no-torch"])
        proc = mpiexec(n, argv, timeout=3600, fault_tolerant=True)
        found = [line for line in proc.stdout.splitlines() if line.startswith("BENCH-RECORDS ")]
        if proc.returncode or not found:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        records += json.loads(found[-1].removeprefix("BENCH-RECORDS "))
    print(f"# bench_executor: {os.cpu_count()} CPUs, load average before "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after {os.getloadavg()[0]:.2f}; "
          f"{time.time() - started:.0f} s; float32; {args.rounds} interleaved rounds per size")
    print(report(records))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
