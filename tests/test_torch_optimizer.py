"""Single-process tests of topoplan.torch: compression, fusion layout, the double-buffered
step sequence, fp16 scaling, argument errors and the lazy import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from topoplan.torch import Compression, DistributedOptimizer  # noqa: E402
from topoplan.torch.planned import AllreduceStats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class FakeWorld:
    """Allreduce over ``nranks`` identical ranks: the sum is ``nranks`` times the buffer.

    Stands in for the transport only where the arithmetic is the point (scaling,
    layout); the real transports run in test_torch_distributed.py and under mpiexec.
    """

    def __init__(self, nranks: int) -> None:
        self.nranks = nranks
        self.stats = AllreduceStats()
        self.seen: list[tuple[torch.dtype, int]] = []

    def __call__(self, buffer: torch.Tensor) -> torch.Tensor:
        self.seen.append((buffer.dtype, buffer.numel()))
        buffer.mul_(self.nranks)
        return buffer


def model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g))
               for _ in range(5)]
    return model, batches


def params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def test_import_topoplan_does_not_import_torch():
    code = ("import sys, topoplan, topoplan.cluster; "
            "assert 'torch' not in sys.modules and 'topoplan.torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_compression_contract():
    t = torch.linspace(-3, 3, 11, dtype=torch.float32)
    wire, ctx = Compression.fp16.compress(t)
    assert wire.dtype == torch.float16 and ctx == torch.float32
    back = Compression.fp16.decompress(wire, ctx)
    assert back.dtype == torch.float32 and torch.allclose(back, t, atol=2e-3)
    same, ctx = Compression.none.compress(t)
    assert same is t and Compression.none.decompress(same, ctx) is t
    ints = torch.arange(4)
    wire, ctx = Compression.fp16.compress(ints)
    assert wire is ints and Compression.fp16.decompress(wire, ctx).dtype == torch.int64
    assert Compression.by_name("fp16") is Compression.fp16
    with pytest.raises(ValueError, match="unknown compression 'bf8'"):
        Compression.by_name("bf8")


def test_fusion_layout_respects_the_threshold():
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))   # 512, 64, 256, 16 bytes
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = lambda t: [[n * 4 for n in g.numels] for g in  # noqa: E731
                       DistributedOptimizer(opt, FakeWorld(2), fusion_threshold=t).groups]
    assert sizes(64 << 20) == [[512, 64, 256, 16]]
    assert sizes(0) == [[512], [64], [256], [16]]
    assert sizes(400) == [[512], [64, 256, 16]]           # too big for a buffer: alone
    assert sizes(300) == [[512], [64], [256, 16]]
    assert sizes(576) == [[512, 64], [256, 16]]
    mixed = nn.Linear(2, 2)
    mixed.bias.data = mixed.bias.data.double()
    groups = DistributedOptimizer(torch.optim.SGD(mixed.parameters(), lr=1), FakeWorld(2)).groups
    assert [g.dtype for g in groups] == [torch.float32, torch.float64]


def test_synchronous_step_averages_and_fusion_does_not_change_it():
    results = []
    for threshold in (0, 400, 64 << 20):
        model, batches = model_and_data()
        world = FakeWorld(3)
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), world,
                                   named_parameters=model.named_parameters(),
                                   compression=Compression.none, fusion_threshold=threshold)
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        results.append((params(model), len(world.seen)))
    # identical ranks: the mean is the local gradient, so this is plain SGD
    model, batches = model_and_data()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        sgd.zero_grad()
        F.cross_entropy(model(x), y).backward()
        sgd.step()
    for got, _ in results:
        assert torch.allclose(got, params(model), rtol=1e-6, atol=1e-7)
    assert [calls for _, calls in results] == [4 * 5, 2 * 5, 1 * 5]


def test_double_buffering_sequence_single_process():
    model, batches = model_and_data()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               FakeWorld(1), compression=Compression.none, double_buffering=True)
    seen = [params(model)]
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seen.append(params(model))
    assert opt.finalize() is True and opt.finalize() is False
    seen.append(params(model))
    opt.close()
    # reference: w_{t+1} = update(w_t, g_{t-1}), nothing at step 0, g_{T-1} at finalize
    ref_model, _ = model_and_data()
    sgd = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    ref, pending = [params(ref_model)], None
    for x, y in batches:
        sgd.zero_grad()
        F.cross_entropy(ref_model(x), y).backward()
        fresh = [p.grad.clone() for p in ref_model.parameters()]
        if pending is not None:
            for p, g in zip(ref_model.parameters(), pending):
                p.grad.copy_(g)
            sgd.step()
        pending = fresh
        ref.append(params(ref_model))
    for p, g in zip(ref_model.parameters(), pending):
        p.grad.copy_(g)
    sgd.step()
    ref.append(params(ref_model))
    assert torch.equal(seen[0], seen[1])
    for step, (a, b) in enumerate(zip(seen, ref)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), f"after step {step}"
    assert opt.applied == len(batches)


def test_synchronize_then_step_and_finalize_noop_without_double_buffering():
    model, (batch, *_) = model_and_data()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), FakeWorld(2))
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    assert opt.synchronize() is True
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)   # the Horovod pattern
    before = params(model)
    opt.step()
    assert (params(model) - before).norm() <= 0.1 * 1e-3 * 1.01
    assert opt.finalize() is False and opt.applied == 1


def test_fp16_prescaling_keeps_large_gradients_finite():
    """A gradient of 4e4 summed over 4 ranks is 1.6e5 > fp16's 65504; the mean is not."""
    p = nn.Parameter(torch.zeros(3))
    opt = DistributedOptimizer(torch.optim.SGD([p], lr=1.0), FakeWorld(4),
                               compression=Compression.fp16)
    p.grad = torch.tensor([4e4, -4e4, 1.0])
    opt.synchronize()
    assert p.grad.dtype == torch.float32
    assert torch.isfinite(p.grad).all()
    assert torch.allclose(p.grad, torch.tensor([4e4, -4e4, 1.0]), rtol=1e-3)
    assert opt.allreduce.seen == [(torch.float16, 3)]


def test_argument_errors_name_the_problem():
    model = nn.Linear(2, 2)
    other = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1)
    with pytest.raises(ValueError, match="named parameter 'other.weight' is not in the optimizer"):
        DistributedOptimizer(opt, FakeWorld(2), named_parameters=[("other.weight", other.weight)])
    with pytest.raises(ValueError, match="listed twice"):
        DistributedOptimizer(opt, FakeWorld(2), named_parameters=[("a", model.weight),
                                                                  ("b", model.weight)])
    with pytest.raises(ValueError, match="world_size="):
        DistributedOptimizer(opt, lambda buffer: buffer)
    with pytest.raises(ValueError, match="fusion_threshold"):
        DistributedOptimizer(opt, FakeWorld(2), fusion_threshold=-1)


def test_hook_state_rejects_a_cluster_of_the_wrong_size(tmp_path):
    import torch.distributed as dist
    from topoplan import TopoplanError
    from topoplan.cluster import loads_cluster
    from topoplan.torch import TopoplanHookState

    with pytest.raises(TopoplanError, match="init_process_group"):
        TopoplanHookState(None)
    cluster = loads_cluster("name: pair\nswitches: [{name: s}]\nboxes:\n"
                            "  - {name: 'n{i}', count: 2, gpus: 1, nics: [{switch: s, bandwidth: 1}]}\n")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(TopoplanError, match="cluster 'pair' has 2 ranks but the process group has 1"):
            TopoplanHookState(cluster, algorithm="ring")
    finally:
        dist.destroy_process_group()
