"""Native steps (IR v3) inside the trainers, over torch.distributed with gloo, 4 real ranks.

One launch runs, on every rank: the DDP hooks (fp32 and fp16 compression) with a
composed schedule (native reduce-scatter in each box of two, native allreduce over each
rail, native allgather in each box) and with the native allreduce schedule, against
DDP's own allreduce; and the DistributedOptimizer (overlap, double buffering, fp16) with
the composed schedule against the same optimizer over a point-to-point ring. Buckets are
small, so several calls with native steps are in flight at once.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("topoplan.runtime.executor")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import numpy as np  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.support import forkserver  # noqa: E402
from tests.support import native_schedules as N  # noqa: E402
from tests.support import schedules as S  # noqa: E402

WORLD = 4
STEPS = 3


def _model() -> nn.Module:
    gen = torch.Generator().manual_seed(7)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g)


def _ddp_grads(t, schedule, fp16: bool) -> list[np.ndarray]:
    """The gradients of DDP's second step (DDP's first step has one bucket): DDP's own
    allreduce (schedule None) or the hook's."""
    from topoplan.torch import PlannedAllreduce, register_hook

    ddp = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0008)

    def steps() -> None:
        for step in range(2):
            ddp.zero_grad()
            x, y = _batch(step, t.rank)
            F.cross_entropy(ddp(x), y).backward()

    if schedule is None:
        steps()
    else:
        allreduce = PlannedAllreduce(None, t, schedule=schedule, timeout=30)
        with register_hook(ddp, allreduce=allreduce, fp16=fp16):
            steps()
        assert allreduce.stats.calls > 2  # several buckets, so calls in flight
    return [p.grad.numpy().copy() for p in ddp.module.parameters()]


def _optimizer_params(t, schedule, *, fp16: bool, dbuf: bool) -> list[np.ndarray]:
    from topoplan.torch import Compression, DistributedOptimizer, PlannedAllreduce

    model = _model()
    allreduce = PlannedAllreduce(None, t, schedule=schedule, timeout=30)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce,
                               named_parameters=list(model.named_parameters()),
                               fusion_threshold=700, double_buffering=dbuf,
                               compression=Compression.fp16 if fp16 else Compression.none)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = _batch(step, t.rank)
        F.cross_entropy(model(x), y).backward()
        opt.synchronize()
        opt.step()
    opt.finalize()
    opt.close()
    # The composed schedule's executor made its groups (and ran its native steps).
    assert bool(allreduce.executor_for(4 * 16).groups) == bool(schedule.nnative)
    return [p.detach().numpy().copy() for p in model.parameters()]


def _rank(t) -> dict:
    """Every run of one rank; numpy arrays (tensors would go back through shared memory
    that ends with the process)."""
    composed = N.composed_allreduce(2, 2)
    out: dict = {"ddp": _ddp_grads(t, None, False)}
    for name, schedule in (("composed", composed), ("native", N.native_allreduce(WORLD))):
        for fp16 in (False, True):
            out[f"hook {name} fp16={fp16}"] = _ddp_grads(t, schedule, fp16)
    for fp16, dbuf in ((False, False), (True, True), (False, True)):
        for name, schedule in (("composed", composed), ("ring", S.ring(WORLD))):
            out[f"optimizer {name} fp16={fp16} dbuf={dbuf}"] = _optimizer_params(
                t, schedule, fp16=fp16, dbuf=dbuf)
    return out


def _close(a: list, b: list, rtol: float) -> bool:
    return all(np.allclose(x, y, rtol=rtol, atol=rtol * 1e-2) for x, y in zip(a, b))


def test_trainers_run_schedules_with_native_steps_over_gloo() -> None:
    from topoplan.runtime.transports import Torch

    results = Torch.launch(WORLD, _rank, backend="gloo", timeout=300,
                           start_method=forkserver.START)
    for rank, out in enumerate(results):
        ddp = out["ddp"]
        # The native allreduce schedule runs gloo's own allreduce: DDP's numbers exactly.
        assert all(np.array_equal(a, b) for a, b in zip(out["hook native fp16=False"], ddp)), rank
        assert _close(out["hook composed fp16=False"], ddp, 1e-5), rank
        for name in ("composed", "native"):
            assert _close(out[f"hook {name} fp16=True"], ddp, 2e-2), (rank, name)
        for fp16, dbuf in ((False, False), (True, True), (False, True)):
            key = f"fp16={fp16} dbuf={dbuf}"
            assert _close(out[f"optimizer composed {key}"], out[f"optimizer ring {key}"],
                          2e-3 if fp16 else 1e-5), (rank, key)
        # Every rank ends with the same parameters.
        for key in (k for k in out if k.startswith("optimizer")):
            assert all(np.array_equal(a, b) for a, b in zip(out[key], results[0][key])), (rank, key)
