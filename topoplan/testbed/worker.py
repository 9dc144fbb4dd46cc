"""One rank of a testbed run: ``python -m topoplan.testbed.worker JOB.json RANK``.

Started by :mod:`topoplan.testbed.bench` inside the rank's namespace (``ip netns exec``),
so gloo's sockets (``GLOO_SOCKET_IFNAME=eth0``) and the TCP store on rank 0's address
both go through the shaped network. For every case of the job it runs a schedule
through :class:`topoplan.executor.Allreduce` over :class:`topoplan.transports.Torch`
(or gloo's own ``all_reduce`` for ``native``, or only the adds of a reduction for
``reduce``, to calibrate the simulator), checks every element of the result, and
times each iteration between two barriers. Rank 0 writes ``result.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def _expected(n: int, nranks: int, torch: Any) -> Any:
    # Rank r contributes (r + 1) + (i % 13): small integers, so float32 sums are exact
    # and any lost, doubled or misplaced piece shows up as a wrong element.
    pattern = torch.arange(n, dtype=torch.float32) % 13
    return pattern * nranks + nranks * (nranks + 1) / 2


def _run_case(case: dict[str, Any], rank: int, nranks: int, pg: Any, torch: Any,
              dist: Any) -> dict[str, Any]:
    n = max(1, case["size"] // 4)
    initial = (torch.arange(n, dtype=torch.float32) % 13) + (rank + 1)
    expected = _expected(n, nranks, torch)
    if case["kind"] == "reduce":
        # What the executor does after a reducing recv: chunk += scratch. All ranks at
        # once, as in a schedule's step, so they compete for the cores as they would.
        other = torch.ones(n, dtype=torch.float32)
        expected = initial + 1

        def op(buf: Any) -> None:
            buf.add_(other)
    elif case["kind"] == "native":
        def op(buf: Any) -> None:
            dist.all_reduce(buf, group=pg)
    else:
        from topoplan.executor import Allreduce
        from topoplan.schedule import load_schedule
        from topoplan.transports import Torch
        allreduce = Allreduce(load_schedule(case["schedule"]), Torch(pg))

        def op(buf: Any) -> None:
            allreduce(buf)
    buf = initial.clone()
    times, wrong = [], 0
    for it in range(case["warmup"] + case["iters"]):
        buf.copy_(initial)
        dist.barrier(group=pg)
        start = time.perf_counter()
        op(buf)
        elapsed = time.perf_counter() - start
        wrong = max(wrong, int((buf != expected).sum()))
        if it >= case["warmup"]:
            times.append(elapsed)
    # The collective took as long as its slowest rank; count wrong elements over all ranks.
    stats = torch.tensor(times + [float(wrong)], dtype=torch.float64)
    slowest = stats.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=pg)
    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=pg)
    return {"label": case["label"], "size": case["size"], "times_s": slowest[:-1].tolist(),
            "wrong": int(stats[-1]), "elements": n}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    rank = int(argv[1])
    nranks = job["nranks"]
    if job.get("crash_rank") == rank:  # fault injection for the cleanup tests
        os._exit(17)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # few cores for all ranks: threads would only fight
    dist.init_process_group("gloo", init_method=f"tcp://{job['master_addr']}:{job['master_port']}",
                            rank=rank, world_size=nranks,
                            timeout=timedelta(seconds=job["timeout_s"]))
    pg = dist.group.WORLD
    results = [_run_case(case, rank, nranks, pg, torch, dist) for case in job["cases"]]
    if rank == 0:
        out = Path(job["dir"], "result.json")
        out.with_suffix(".tmp").write_text(json.dumps(results))
        os.replace(out.with_suffix(".tmp"), out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
