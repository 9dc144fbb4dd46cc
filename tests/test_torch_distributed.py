"""Two real ranks (torch multiprocessing, gloo) running the topoplan executor over the Torch
transport: the DDP hooks against DDP's own allreduce, the DistributedOptimizer with and
without fusion, and double buffering against a single-process one-step-stale reference.

One spawn runs every check (torch start-up is the expensive part on a loaded machine);
the ranks save what they saw and the assertions run here, in the parent.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("topoplan.runtime.executor")
pytest.importorskip("topoplan.planners")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

WORLD = 2
STEPS = 4
LOCAL = 6          # samples per rank per step
LR = 0.1

CLUSTER_2 = """
name: two-boxes
switches: [{name: sw}]
boxes:
  - {name: "b{i}", count: 2, gpus: 1, nics: [{switch: sw, bandwidth: 10 GB/s, latency: 5 us}]}
"""


def make_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 16), nn.ReLU(), nn.Linear(16, 10))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(LOCAL, 1, 8, 8, generator=g), torch.randint(0, 10, (LOCAL,), generator=g)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [batch(step, r) for r in range(WORLD)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def grads(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1).clone() for p in model.parameters()])


def _ddp_grads(hook: str | None, cluster) -> list[torch.Tensor]:
    from topoplan.torch import allreduce_hook, fp16_compress_hook, TopoplanHookState

    # A tiny bucket cap gives several buckets of different sizes: several plans, in order.
    ddp = nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=0.004)
    state = None
    if hook is not None:
        state = TopoplanHookState(cluster, algorithm="ring")
        ddp.register_comm_hook(state, {"fp32": allreduce_hook, "fp16": fp16_compress_hook}[hook])
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    out = []
    for step in range(STEPS):
        x, y = batch(step, dist.get_rank())
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        out.append(grads(ddp.module))
        opt.step()
    if state is not None:
        out.append(torch.tensor([len(state.allreduce.chosen), state.allreduce.stats.calls]))
        state.close()
    return out


def _optimizer_run(cluster, *, fusion_threshold: int, double_buffering: bool, fp16: bool,
                   algorithm: str = "ring") -> dict:
    from topoplan.torch import Compression, DistributedOptimizer, PlannedAllreduce
    from topoplan.runtime.transports import Torch

    model = make_model()
    allreduce = PlannedAllreduce(cluster, Torch(None), algorithm=algorithm)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), allreduce,
                               named_parameters=model.named_parameters(),
                               compression=Compression.fp16 if fp16 else Compression.none,
                               fusion_threshold=fusion_threshold, double_buffering=double_buffering)
    trajectory = [flat_params(model)]
    for step in range(STEPS):
        x, y = batch(step, dist.get_rank())
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        trajectory.append(flat_params(model))
    applied_in_loop = opt.applied
    flushed = opt.finalize()
    trajectory.append(flat_params(model))
    opt.close()
    return {"trajectory": trajectory, "groups": len(opt.groups), "calls": allreduce.stats.calls,
            "applied_in_loop": applied_in_loop, "flushed": flushed}


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    from topoplan.cluster import loads_cluster

    cluster = loads_cluster(CLUSTER_2)
    result = {
        "ddp_default": _ddp_grads(None, cluster),
        "ddp_fp32": _ddp_grads("fp32", cluster),
        "ddp_fp16": _ddp_grads("fp16", cluster),
        "nofusion": _optimizer_run(cluster, fusion_threshold=0, double_buffering=False, fp16=False),
        "fusion": _optimizer_run(cluster, fusion_threshold=64 << 20, double_buffering=False,
                                 fp16=False),
        "fusion_small": _optimizer_run(cluster, fusion_threshold=1500, double_buffering=False,
                                       fp16=False, algorithm="rhd"),
        "dbuf": _optimizer_run(cluster, fusion_threshold=64 << 20, double_buffering=True,
                               fp16=False),
        "dbuf_fp16": _optimizer_run(cluster, fusion_threshold=4096, double_buffering=True,
                                    fp16=True, algorithm="tree"),
    }
    torch.save(result, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


from tests.support import forkserver  # noqa: E402
from tests.support.ports import free_port as _free_port  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("torch2")
    mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True,
                       start_method=forkserver.START)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def reference(*, stale: bool) -> list[torch.Tensor]:
    """One process, the global batch: synchronous SGD or the one-step-stale sequence."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trajectory = [flat_params(model)]
    pending = None
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if stale:
            fresh = [p.grad.clone() for p in model.parameters()]
            if pending is not None:          # step 0 applies nothing
                for p, g in zip(model.parameters(), pending):
                    p.grad.copy_(g)
                opt.step()
            pending = fresh
        else:
            opt.step()
        trajectory.append(flat_params(model))
    if stale:                                # finalize(): the last gradients, once
        for p, g in zip(model.parameters(), pending):
            p.grad.copy_(g)
        opt.step()
    trajectory.append(flat_params(model))
    return trajectory


def test_hook_matches_ddp_default_allreduce(ranks):
    for r in ranks:
        assert len(r["ddp_fp32"]) == STEPS + 1
        for step, (ours, theirs) in enumerate(zip(r["ddp_fp32"], r["ddp_default"])):
            assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-7), f"step {step}"
        plans, calls = r["ddp_fp32"][-1].tolist()
        assert plans >= 2, "the tiny bucket cap should give buckets of several sizes"
        assert calls >= STEPS   # at least one bucket a step (DDP rebuilds buckets after step 0)
    # and the grads really are averaged: the ranks' local grads differ, the reduced ones agree
    assert torch.equal(ranks[0]["ddp_fp32"][0], ranks[1]["ddp_fp32"][0])


def test_fp16_hook_close_to_fp32(ranks):
    for r in ranks:
        for step in range(STEPS):
            ours, theirs = r["ddp_fp16"][step], r["ddp_default"][step]
            scale = theirs.abs().max()
            assert torch.allclose(ours, theirs, rtol=2e-3, atol=2e-3 * scale), f"step {step}"
            assert not torch.equal(ours, theirs), "fp16 on the wire must round something"


def test_fusion_gives_the_same_parameters(ranks):
    for r in ranks:
        assert r["nofusion"]["groups"] == 6 and r["fusion"]["groups"] == 1
        assert 1 < r["fusion_small"]["groups"] < 6
        # one call a buffer a step, and (overlapped, several buffers) one more after the
        # first step: the ranks' check that backward made the gradients in the same order
        assert r["fusion"]["calls"] == STEPS and r["nofusion"]["calls"] == 6 * STEPS + 1
        for a, b, c in zip(r["nofusion"]["trajectory"], r["fusion"]["trajectory"],
                           r["fusion_small"]["trajectory"]):
            # two ranks: each element is a/2 + b/2 once, whatever the buffer layout
            assert torch.equal(a, b) and torch.equal(a, c)
    sync = reference(stale=False)
    for ours, ref in zip(ranks[0]["fusion"]["trajectory"], sync):
        assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-6)


def test_double_buffering_is_the_one_step_stale_sequence(ranks):
    stale, sync = reference(stale=True), reference(stale=False)
    for r in ranks:
        run = r["dbuf"]
        assert run["applied_in_loop"] == STEPS - 1 and run["flushed"]
        assert torch.equal(run["trajectory"][0], run["trajectory"][1]), "step 0 applies nothing"
        for step, (ours, ref) in enumerate(zip(run["trajectory"], stale)):
            assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-6), f"after step {step}"
        # the test can fail: the stale sequence is not the synchronous one
        assert not torch.allclose(run["trajectory"][2], sync[2], rtol=1e-4, atol=1e-5)
    assert torch.equal(ranks[0]["dbuf"]["trajectory"][-1], ranks[1]["dbuf"]["trajectory"][-1])


def test_double_buffering_with_fp16_stays_close(ranks):
    stale = reference(stale=True)
    for r in ranks:
        run = r["dbuf_fp16"]
        assert run["groups"] > 1
        for step, (ours, ref) in enumerate(zip(run["trajectory"], stale)):
            assert torch.allclose(ours, ref, rtol=1e-3, atol=1e-4), f"after step {step}"
