"""One rank of a testbed run, inside the rank's network namespace.

``python -m topoplan.testbed.worker JOB.json RANK`` (gloo: started by
:mod:`topoplan.testbed.bench` with ``ip netns exec``) or ``python -m
topoplan.testbed.worker JOB.json`` under ``mpiexec`` (MPI: started by the launcher agent
of :mod:`topoplan.testbed.mpi`, the rank from ``COMM_WORLD``). Either way the
transport's sockets go through the shaped network: gloo's with
``GLOO_SOCKET_IFNAME=eth0`` and the TCP store on rank 0's address, Open MPI's with
``btl_tcp_if_include eth0``. For every case of the job it runs a schedule through
:class:`topoplan.runtime.executor.Allreduce`, :class:`~topoplan.runtime.executor.ReduceScatter` or
:class:`~topoplan.runtime.executor.AllGather` (the case's ``collective``) over
:class:`topoplan.runtime.transports.Torch` or :class:`topoplan.runtime.transports.MPI` (or the
transport's own collective for ``native``: all_reduce / reduce_scatter / all_gather, or
only the adds of a reduction for ``reduce``, to calibrate the simulator), checks every
element of the result (:func:`topoplan.runtime.bench.expected_output`), and times each
iteration between two barriers. Rank 0 writes ``result.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from topoplan.runtime.bench import expected_output, pattern


class _Backend:
    """The native collectives of a backend, through its topoplan transport (made once, on
    first use): gloo's reduce_scatter / all_gather, or MPI_Reduce_scatter_block /
    MPI_Allgather (NoNative where the backend has none)."""

    _native: Any = None

    def transport(self) -> Any:
        raise NotImplementedError

    def _transport(self) -> Any:
        if self._native is None:
            self._native = self.transport()
        return self._native

    def native_sharded(self, collective: str, input: Any, output: Any) -> None:
        t = self._transport()
        (t.native_reduce_scatter if collective == "reduce_scatter" else t.native_allgather)(
            input, output)

    def native_name(self, collective: str) -> str:
        return self._transport().native_name_of(collective)


class _Gloo(_Backend):
    """torch.distributed over gloo: the collectives the worker itself needs."""

    name = "gloo"

    def __init__(self, job: dict[str, Any], rank: int) -> None:
        import torch.distributed as dist
        self.dist = dist
        dist.init_process_group(
            "gloo", init_method=f"tcp://{job['master_addr']}:{job['master_port']}",
            rank=rank, world_size=job["nranks"], timeout=timedelta(seconds=job["timeout_s"]))
        self.pg = dist.group.WORLD

    def transport(self) -> Any:
        from topoplan.runtime.transports import Torch
        return Torch(self.pg)

    def native(self, buf: Any) -> None:
        self.dist.all_reduce(buf, group=self.pg)

    def barrier(self) -> None:
        self.dist.barrier(group=self.pg)

    def reduce(self, tensor: Any, op: str) -> None:
        self.dist.all_reduce(tensor, op=getattr(self.dist.ReduceOp, op), group=self.pg)

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.dist.get_world_size(self.pg)
        self.dist.all_gather_object(out, obj, group=self.pg)
        return out

    def close(self) -> None:
        self.dist.barrier()
        self.dist.destroy_process_group()


class _Mpi(_Backend):
    """mpi4py over Open MPI's TCP BTL: the collectives the worker itself needs."""

    name = "mpi"

    def __init__(self) -> None:
        from mpi4py import MPI
        self.mpi = MPI
        self.comm = MPI.COMM_WORLD

    def transport(self) -> Any:
        from topoplan.runtime.transports import MPI
        # blocking natives, as topoplan bench's ranks (commands.common.rank_transport)
        return MPI(self.comm, blocking_natives=True)

    def native(self, buf: Any) -> None:
        self._transport().native_allreduce(buf)

    def barrier(self) -> None:
        self.comm.Barrier()

    def reduce(self, tensor: Any, op: str) -> None:
        mpi_op = {"MAX": self.mpi.MAX, "SUM": self.mpi.SUM}[op]
        self.comm.Allreduce(self.mpi.IN_PLACE, tensor.numpy(), op=mpi_op)

    def gather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def close(self) -> None:
        self.comm.Barrier()


def _run_case(case: dict[str, Any], rank: int, nranks: int, comm: Any, torch: Any) -> dict[str, Any]:
    collective = case.get("collective", "allreduce")
    n = max(1, case["size"] // 4)
    m = n // nranks  # a shard's elements (reduce-scatter, allgather: n is a multiple)
    sharded = collective != "allreduce" and case["kind"] != "reduce"
    # An allgather's input is the rank's shard: the pattern at its elements.
    start = rank * m if sharded and collective == "allgather" else 0
    size_in = m if sharded and collective == "allgather" else n
    initial = pattern(torch.arange(start, start + size_in), rank).to(torch.float32)
    expected = torch.from_numpy(expected_output(collective if sharded else "allreduce", n,
                                                nranks, rank)).to(torch.float32)
    output = torch.empty(expected.shape[0], dtype=torch.float32) if sharded else None
    marks: list[float] = []
    unavailable: str | None = None
    if case["kind"] == "reduce":
        # What the executor does after a reducing recv: chunk += scratch. All ranks at
        # once, as in a schedule's step, so they compete for the cores as they would.
        other = torch.ones(n, dtype=torch.float32)
        expected = initial + 1

        def op(buf: Any) -> None:
            buf.add_(other)
    elif case["kind"] == "native" and sharded:
        def op(buf: Any) -> None:
            comm.native_sharded(collective, buf, output)
    elif case["kind"] == "native":
        op = comm.native
    else:
        from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter
        from topoplan.ir.parse import load_schedule
        transport = comm.transport()
        executors: dict[str, Any] = {"allreduce": Allreduce, "reduce_scatter": ReduceScatter,
                                     "allgather": AllGather}
        run = executors[collective](load_schedule(case["schedule"]), transport)
        if case.get("trace"):
            # When each data-moving step's messages completed, last iteration only.
            wait = transport.wait

            def traced_wait(handle: Any, timeout: float) -> list[int]:
                pending = wait(handle, timeout)
                marks.append(time.perf_counter())
                return pending
            transport.wait = traced_wait  # type: ignore[method-assign]

        def op(buf: Any) -> None:
            marks.clear()
            if output is None:
                run(buf)
            else:
                run(buf, output)
    buf = initial.clone()
    times, wrong, started = [], 0, 0.0
    for it in range(case["warmup"] + case["iters"]):
        buf.copy_(initial)
        if output is not None:
            output.fill_(-1)  # no result holds -1: an element left unwritten is wrong
        comm.barrier()
        start = started = time.perf_counter()
        try:
            op(buf)
        except Exception as exc:  # noqa: BLE001 - only the transport's "has none" is kept
            from topoplan.runtime.transports.base import NoNative
            if not isinstance(exc, NoNative):
                raise
            unavailable = str(exc)  # every rank alike, before anything was sent
            break
        elapsed = time.perf_counter() - start
        result = buf if output is None else output
        wrong = max(wrong, int((result != expected).sum()))
        if it >= case["warmup"]:
            times.append(elapsed)
    if unavailable is not None:
        return {"label": case["label"], "size": case["size"], "times_s": [], "wrong": 0,
                "elements": n, "collective": collective, "unavailable": unavailable}
    # The collective took as long as its slowest rank; count wrong elements over all ranks.
    stats = torch.tensor(times + [float(wrong)], dtype=torch.float64)
    slowest = stats.clone()
    comm.reduce(slowest, "MAX")
    comm.reduce(stats, "SUM")
    out = {"label": case["label"], "size": case["size"], "times_s": slowest[:-1].tolist(),
           "wrong": int(stats[-1]), "elements": n, "collective": collective}
    if case["kind"] == "native" and sharded:
        out["native_name"] = comm.native_name(collective)
    if case.get("trace") and case["kind"] == "schedule":
        # Barrier-aligned starts: offsets from each rank's own start are comparable.
        out["trace"] = comm.gather([t - started for t in marks])
    return out


def _eth0_address() -> str | None:
    proc = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "eth0"],
                          capture_output=True, text=True)
    fields = proc.stdout.split()
    return fields[fields.index("inet") + 1].split("/")[0] if "inet" in fields else None


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    nranks = job["nranks"]
    transport = job.get("transport", "gloo")
    if transport == "mpi":
        comm: Any = _Mpi()
        rank = comm.comm.Get_rank()
        # mpiexec prints every rank's output mixed; a log per rank names the one that failed.
        log = open(Path(job["dir"], f"rank{rank}.log"), "w")  # noqa: SIM115 - lives as long as the process
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        # The plan is for this topology only if MPI rank r runs in rank r's namespace.
        address = _eth0_address()
        if address != job["addresses"][rank]:
            print(f"MPI rank {rank} runs on {address}, not on its namespace's "
                  f"{job['addresses'][rank]}: mpiexec mapped ranks to hosts out of order",
                  file=sys.stderr, flush=True)
            return 3
    else:
        rank = int(argv[1])
    if job.get("crash_rank") == rank:  # fault injection for the cleanup tests
        os._exit(17)
    import torch
    torch.set_num_threads(1)  # few cores for all ranks: threads would only fight
    if transport != "mpi":
        comm = _Gloo(job, rank)
    results = [_run_case(case, rank, nranks, comm, torch) for case in job["cases"]]
    if rank == 0:
        out = Path(job["dir"], "result.json")
        from .._util import atomic_write
        atomic_write(out, json.dumps(results))
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
