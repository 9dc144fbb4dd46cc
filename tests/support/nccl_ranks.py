"""An NCCL job of real processes on this machine, for the GPU tests.

:func:`launch` starts ``nranks`` spawned processes; rank 0 makes NCCL's unique id and
hands it to the others through a queue, each builds its ``NcclCommunicator`` and runs
one of the jobs below with an :class:`~topoplan.runtime.transports.NCCL` transport, and the
parent collects what each job returns. With fewer GPUs than ranks the ranks share
them (:func:`topoplan.runtime.transports.nccl.share_gpu`): NCCL then moves every message over
its socket transport on loopback, so a one-GPU machine still runs real multi-rank
NCCL point-to-point traffic, the executor's stream ordering and the native
collectives. Each job returns a list of ``(what, ok)`` checks.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_module
import time
import traceback
from typing import Any

import numpy as np

from . import schedules as S


def launch(nranks: int, job: str, *, timeout: float = 300.0) -> list[list[tuple[str, bool]]]:
    """Run job ``job`` (a function of this module) on ``nranks`` processes; its results
    by rank. Raises AssertionError with the failing rank's traceback, or on a timeout
    (every process is killed)."""
    ctx = multiprocessing.get_context("spawn")
    uid: Any = ctx.Queue()
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(rank, nranks, job, uid, results), daemon=True)
             for rank in range(nranks)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < nranks:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"NCCL job {job!r} on {nranks} ranks did not finish within "
                                     f"{timeout:g} s; ranks done: {sorted(out)}")
            try:
                rank, ok, payload = results.get(timeout=min(left, 1.0))
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in out]
                if dead:
                    raise AssertionError(f"NCCL rank {dead[0]} of job {job!r} died with exit "
                                         f"status {procs[dead[0]].exitcode}") from None
                continue
            if not ok:
                raise AssertionError(f"NCCL rank {rank} of job {job!r} failed:\n{payload}")
            out[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=10 if len(out) == nranks else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    return [out[r] for r in range(nranks)]


def _rank_main(rank: int, nranks: int, job: str, uid: Any, results: Any) -> None:
    try:
        import cupy
        from topoplan.runtime.transports.nccl import share_gpu
        gpus = cupy.cuda.runtime.getDeviceCount()
        if gpus < nranks:
            share_gpu(rank, loopback=True)
        os.environ.setdefault("NCCL_DEBUG", "WARN")
        from cupy.cuda import nccl

        from topoplan.runtime.transports import NCCL
        cupy.cuda.Device(rank % gpus).use()
        if rank == 0:
            unique = nccl.get_unique_id()
            for _ in range(nranks - 1):
                uid.put(unique)
        else:
            unique = uid.get(timeout=60)
        transport = NCCL(nccl.NcclCommunicator(nranks, unique, rank))
        results.put((rank, True, globals()[job](transport)))
    except BaseException:  # noqa: BLE001 - the parent reports it with the rank
        results.put((rank, False, traceback.format_exc()))


# ---------------------------------------------------------------------------
# Jobs: each runs on every rank and returns [(what, ok), ...]
# ---------------------------------------------------------------------------
def schedules_on_cupy(t: Any) -> list[tuple[str, bool]]:
    """Every hand-built and planned allreduce schedule, a ring reduce-scatter and
    allgather, two calls in flight at once, and NCCL's own collectives, on CuPy arrays."""
    import cupy

    from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter
    n, rank = t.size, t.rank
    out: list[tuple[str, bool]] = []
    plans = S.builders(n) | S.planner_schedules(n)
    for name, schedule in plans.items():
        run = Allreduce(schedule, t, timeout=60)
        for size in (0, 1, 1001, 1 << 20):
            x = cupy.arange(size, dtype=cupy.float32) % 7 + rank
            run(x)
            want = (np.arange(size) % 7) * n + sum(range(n))
            out.append((f"{name} allreduce of {size}", bool(np.array_equal(cupy.asnumpy(x), want))))
    m = 1 << 16
    order = list(range(n))
    full = cupy.arange(n * m, dtype=cupy.float32) % 7 + rank
    shard = cupy.full(m, -1.0, dtype=cupy.float32)
    ReduceScatter(S.ring_reduce_scatter(order), t, timeout=60)(full, shard)
    want = ((np.arange(rank * m, (rank + 1) * m) % 7) * n + sum(range(n)))
    out.append(("ring reduce_scatter", bool(np.array_equal(cupy.asnumpy(shard), want))))
    mine = cupy.full(m, float(rank), dtype=cupy.float32)
    gathered = cupy.full(n * m, -1.0, dtype=cupy.float32)
    AllGather(S.ring_allgather(order), t, timeout=60)(mine, gathered)
    out.append(("ring allgather",
                bool(np.array_equal(cupy.asnumpy(gathered), np.repeat(np.arange(n), m)))))
    # Two calls in flight on distinct buffers, waited for in the other order.
    a, b = (cupy.full(4096, rank + 1.0, dtype=cupy.float32) for _ in range(2))
    first = Allreduce(S.ring(n), t, timeout=60)
    second = Allreduce(S.direct(n), t, timeout=60)
    ha, hb = first.start(a), second.start(b)
    hb.wait()
    ha.wait()
    total = n * (n + 1) / 2
    out.append(("two calls in flight", bool(cupy.all(a == total)) and bool(cupy.all(b == total))))
    y = cupy.full(10, rank + 1.0, dtype=cupy.float64)
    t.native_allreduce(y)
    out.append(("ncclAllReduce", bool(cupy.all(y == total))))
    rs = cupy.zeros(m, dtype=cupy.float32)
    t.native_reduce_scatter(full, rs)
    out.append(("ncclReduceScatter", bool(np.array_equal(cupy.asnumpy(rs), want))))
    ag = cupy.zeros(n * m, dtype=cupy.float32)
    t.native_allgather(mine, ag)
    out.append(("ncclAllGather", bool(np.array_equal(cupy.asnumpy(ag), np.repeat(np.arange(n), m)))))
    out.append(("allreduce_max", t.allreduce_max(float(rank)) == n - 1))
    return out


def torch_streams(t: Any) -> list[tuple[str, bool]]:
    """CUDA torch tensors: the replay must wait for the caller's torch stream, and the
    caller's next kernel for the replay, although NCCL runs on its own stream.

    Each rank makes its buffer with a slow kernel chain on torch's current stream (a
    GPU-side sleep, then the fill) and calls the allreduce at once; the sum is then
    checked by a kernel on that same stream. If the transport's stream did not wait
    for torch's, the sends would carry the zeros from before the fill; if torch's
    stream did not wait for the transport's, the check would read partial sums. Both
    a side stream and the default stream are tried; buffers are 64 MiB so the kernels
    take long enough to lose a race. A bfloat16 tensor (which CuPy lacks) goes too.
    """
    import torch

    from topoplan.runtime.executor import Allreduce
    n, rank = t.size, t.rank
    torch.cuda.set_device(t.device)
    count = 1 << 24
    want = n * (n + 1) / 2
    out: list[tuple[str, bool]] = []
    for name, schedule in S.builders(n).items():
        run = Allreduce(schedule, t, timeout=120)
        for label, stream in (("side", torch.cuda.Stream()),
                              ("default", torch.cuda.default_stream())):
            with torch.cuda.stream(stream):
                x = torch.zeros(count, device="cuda")
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the caller's stream
                x.add_(rank + 1.0)
                run(x)
                ok = bool(torch.all(x == want).item())
            out.append((f"{name} on the {label} stream", ok))
        # Small integers (bfloat16 holds integers exactly only up to 256).
        z = (torch.arange(1000, device="cuda") % 7 + rank).to(torch.bfloat16)
        run(z)
        expected = (torch.arange(1000, device="cuda") % 7) * n + sum(range(n))
        out.append((f"{name} bfloat16", bool(torch.equal(z.float(), expected.float()))))
    return out


def native_on_cupy(t: Any) -> list[tuple[str, bool]]:
    """Native steps (IR v3) over NCCL sub-communicators: tests/support/native_cases.py on
    CuPy arrays, and on CUDA torch tensors (float16, bfloat16) when torch sees the GPU;
    then the whole world's group is the transport's own communicator."""
    import cupy

    from . import native_cases
    from . import native_schedules as N
    from topoplan.runtime.executor import Allreduce
    try:
        import torch
        with_torch = torch.cuda.is_available()
        if with_torch:
            torch.cuda.set_device(t.device)
    except ImportError:
        with_torch = False
    failures, count = native_cases.native_cases(t, with_torch=with_torch, device=cupy.asarray,
                                                host=cupy.asnumpy, torch_device="cuda")
    out = [(failure, False) for failure in failures] + [("native cases ran", count > 50)]
    Allreduce(N.native_allreduce(t.size), t, timeout=60)
    out.append(("the world's group is the transport's communicator",
                t.group_of(tuple(range(t.size))) is t.comm))
    return out
