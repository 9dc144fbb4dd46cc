"""The NCCL (CuPy) transport: needs CuPy with NCCL and a CUDA GPU, else skipped.

Ranks are threads of this process, one GPU each, with communicators from
``NcclCommunicator.initAll`` (NCCL groups are per thread, so each thread's
groupStart/groupEnd covers only its own sends and receives). With one GPU it
runs a 1-rank communicator: the executor's plumbing and the native allreduce.
"""

from __future__ import annotations

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

from tests.support import schedules as S  # noqa: E402
from topoplan.executor import Allreduce  # noqa: E402
from topoplan.transports import NCCL, Local  # noqa: E402


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


def test_nccl_replay_is_ordered_against_torch_streams() -> None:
    """CUDA torch tensors: the replay must wait for the caller's torch stream and
    the caller's next kernel for the replay, although NCCL runs on its own stream.

    Each rank makes its buffer with a slow kernel chain on torch's current stream
    (a GPU-side sleep, then the fill) and calls the allreduce at once; the sum is
    then checked by a kernel on that same stream. If the transport's stream did
    not wait for torch's, the sends would carry the zeros from before the fill;
    if torch's stream did not wait for the transport's, the check would read
    partial sums. Both a side stream and the default stream are tried, and
    buffers are large (64 MiB) so the kernels take long enough to lose a race.
    """
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or NGPUS < 2:
        pytest.skip("needs two CUDA GPUs visible to torch and CuPy (NCCL ranks need a GPU each)")
    n = NGPUS
    comms = nccl.NcclCommunicator.initAll(list(range(n)))
    count = 1 << 24
    want = n * (n + 1) / 2

    def rank_fn(t: Local) -> list[tuple[str, bool]]:
        torch.cuda.set_device(t.rank)
        with cupy.cuda.Device(t.rank):
            transport = NCCL(comms[t.rank])
            out = []
            for name, schedule in S.builders(n).items():
                run = Allreduce(schedule, transport, timeout=60)
                for label, stream in (("side", torch.cuda.Stream()),
                                      ("default", torch.cuda.default_stream())):
                    with torch.cuda.stream(stream):
                        x = torch.zeros(count, device="cuda")
                        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the caller's stream
                        x.add_(t.rank + 1.0)
                        run(x)
                        out.append((f"{name} on the {label} stream",
                                    bool(torch.all(x == want).item())))
            return out

    for rank, results in enumerate(Local.launch(n, rank_fn, timeout=300)):
        bad = [what for what, ok in results if not ok]
        assert not bad, f"rank {rank}: wrong sums with torch tensors: {bad}"
