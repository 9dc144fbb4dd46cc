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

import _schedules as S  # noqa: E402
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
