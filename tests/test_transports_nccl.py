"""The NCCL (CuPy) transport: needs CuPy with NCCL and a CUDA GPU, else skipped.

The first test's ranks are threads of this process, one GPU each, with communicators
from ``NcclCommunicator.initAll`` (NCCL groups are per thread, so each thread's
groupStart/groupEnd covers only its own sends and receives); with one GPU that is a
1-rank communicator. The others run ranks as processes (``tests/support/nccl_ranks.py``
and ``topoplan bench --transport nccl`` under mpiexec); with fewer GPUs than ranks
they share them (``--share-gpus``), and NCCL's socket transport carries every message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
try:
    NGPUS = cupy.cuda.runtime.getDeviceCount()
except Exception:  # noqa: BLE001 - no driver, no device
    NGPUS = 0
if NGPUS == 0:
    pytest.skip("no CUDA device", allow_module_level=True)
nccl = pytest.importorskip("cupy.cuda.nccl")
ROOT = Path(__file__).resolve().parents[1]

from tests.support import nccl_ranks  # noqa: E402
from tests.support import schedules as S  # noqa: E402
from topoplan.runtime.executor import Allreduce  # noqa: E402
from topoplan.runtime.transports import NCCL, Local  # noqa: E402


def test_nccl_schedules_over_every_gpu() -> None:
    n = NGPUS
    comms = nccl.NcclCommunicator.initAll(list(range(n)))

    def rank_fn(t: Local):
        with cupy.cuda.Device(t.rank):
            transport = NCCL(comms[t.rank])
            out = []
            for schedule in S.builders(n).values():
                for size in (0, 1, 1001, 1 << 20):
                    x = cupy.arange(size, dtype=cupy.float32) % 7 + t.rank
                    Allreduce(schedule, transport, timeout=30)(x)
                    out.append((size, cupy.asnumpy(x)))
            y = cupy.full(10, t.rank + 1.0, dtype=cupy.float64)
            transport.native_allreduce(y)
            return out, cupy.asnumpy(y)

    for out, y in Local.launch(n, rank_fn, timeout=120):
        for size, x in out:
            assert np.array_equal(x, (np.arange(size) % 7) * n + sum(range(n))), size
        assert np.all(y == n * (n + 1) / 2)


@pytest.mark.parametrize("nranks", [3, 4])
def test_nccl_processes_run_every_schedule(nranks: int) -> None:
    """Real NCCL ranks in processes (sharing the GPUs when there are fewer: NCCL's
    sockets then carry every message): hand-built and planned allreduces, a ring
    reduce-scatter and allgather, two calls in flight, and NCCL's own collectives."""
    for rank, results in enumerate(nccl_ranks.launch(nranks, "schedules_on_cupy")):
        bad = [what for what, ok in results if not ok]
        assert not bad, f"rank {rank}: wrong results: {bad}"
        assert len(results) > 10


@pytest.mark.parametrize("nranks", [4])
def test_nccl_native_steps_over_sub_communicators(nranks: int) -> None:
    """Native steps (IR v3) on NcclCommunicators per group, their ids sent over the
    transport's own communicator: tests/support/native_cases.py on CuPy arrays (and
    CUDA tensors), ranks sharing the GPUs when there are fewer."""
    for rank, results in enumerate(nccl_ranks.launch(nranks, "native_on_cupy")):
        bad = [what for what, ok in results if not ok]
        assert not bad, f"rank {rank}: {bad}"


def test_nccl_replay_is_ordered_against_torch_streams() -> None:
    """See nccl_ranks.torch_streams: CUDA tensors on a side and the default stream,
    64 MiB buffers behind a GPU-side sleep, and a bfloat16 tensor."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    for rank, results in enumerate(nccl_ranks.launch(2, "torch_streams")):
        bad = [what for what, ok in results if not ok]
        assert not bad, f"rank {rank}: wrong sums with torch tensors: {bad}"


def _cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


SHARE = ["--share-gpus"] if NGPUS < 4 else []


def test_bench_cli_over_nccl_against_nccl_allreduce() -> None:
    """topoplan bench --transport nccl: 4 ranks under mpiexec, a planned ring and
    NCCL's own allreduce on the same CuPy buffers, no wrong element in either."""
    pytest.importorskip("mpi4py")
    proc = _cli("bench", "--transport", "nccl", *SHARE, "-n", "4", "--algorithm", "ring",
                "--baseline", "native", "--sizes", "4KiB,1MiB", "--iters", "3", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["transport"] == "nccl" and report["native"] == "ncclAllReduce"
    assert [r["size"] for r in report["rows"]] == [4096, 1 << 20]
    for row in report["rows"]:
        assert row["wrong"] == 0 and row["native_wrong"] == 0, row
        assert row["time_us"] > 0 and row["native_time_us"] > 0


def test_bench_cli_over_nccl_runs_allgather_in_bfloat16() -> None:
    pytest.importorskip("mpi4py")
    pytest.importorskip("torch")
    proc = _cli("bench", "--transport", "nccl", *SHARE, "-n", "4", "--algorithm", "ring",
                "-c", "allgather", "--dtype", "bfloat16", "--baseline", "native",
                "--sizes", "64KiB", "--iters", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])["rows"][0]
    assert row["wrong"] == 0 and row["native_wrong"] == 0, row


def test_nccl_without_enough_gpus_is_refused_with_the_way_out() -> None:
    """More ranks than GPUs without --share-gpus: one line before anything launches,
    naming --share-gpus (NCCL itself would fail with "Duplicate GPU detected")."""
    pytest.importorskip("mpi4py")
    proc = _cli("bench", "--transport", "nccl", "-n", str(NGPUS + 1), "--algorithm", "ring",
                "--sizes", "4KiB", timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("topoplan: error: --transport nccl") and "--share-gpus" in proc.stderr
