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
    with pytest.warns(UserWarning, match="one step late"):  # momentum 0.9: the sequence is the point
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   FakeWorld(1), compression=Compression.none,
                                   double_buffering=True)
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


class _SlowHandle:
    """A call in flight that finishes (or fails) when the test says so."""

    def __init__(self, buffer, gate, fail=False):
        self.buffer, self.gate, self.fail = buffer, gate, fail

    def wait(self):
        assert self.gate.wait(10), "the test never opened the gate"
        if self.fail:
            raise RuntimeError("peer 1 died")
        self.buffer.mul_(3)  # "the sum" over a world of three equal ranks
        return self.buffer


class _GatedAllreduce:
    nranks = 1

    def __init__(self):
        import threading
        self.gate, self.fail, self.started = threading.Event(), False, []

    def start(self, buffer):
        self.started.append(buffer)
        return _SlowHandle(buffer, self.gate, self.fail)


def test_hook_returns_a_future_the_handle_completes(tmp_path):
    """The Future contract: the hook starts the allreduce before it returns, the Future
    is pending until the call is done, then holds the averaged bucket (fp16: restored
    to the bucket's dtype); a failed call sets the Future's exception."""
    import torch.distributed as dist
    from topoplan.torch import TopoplanHookState, allreduce_hook, fp16_compress_hook

    class Bucket:
        def __init__(self, tensor):
            self.tensor = tensor

        def buffer(self):
            return self.tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        gated = _GatedAllreduce()
        state = TopoplanHookState(allreduce=gated)
        bucket = Bucket(torch.full((5,), 2.0))
        future = allreduce_hook(state, bucket)
        # What Future.then returns (torch._C.Future, the base of torch.futures.Future): a
        # failure then reaches DDP's C++ reducer as an error, not as an object
        assert isinstance(future, torch._C.Future)
        assert len(gated.started) == 1 and not future.done()
        gated.gate.set()
        assert torch.equal(future.wait(), torch.full((5,), 6.0))  # 2 / 1 rank * 3
        half = fp16_compress_hook(state, Bucket(torch.full((4,), 0.5)))
        assert gated.started[-1].dtype == torch.float16
        assert half.wait().dtype == torch.float32 and torch.equal(half.value(),
                                                                  torch.full((4,), 1.5))
        # Two calls in flight together for 0.2 s: communication 0.2 s, not 0.4.
        gated.gate.clear()
        before_comm, before_hooks = state.comm_seconds, state.hook_seconds
        both = [allreduce_hook(state, Bucket(torch.ones(2))) for _ in range(2)]
        import time
        time.sleep(0.2)
        gated.gate.set()
        [f.wait() for f in both]
        comm, hooks = state.comm_seconds - before_comm, state.hook_seconds - before_hooks
        assert 0.2 <= comm < 0.3 and hooks >= 0.4, (comm, hooks)
        gated.fail = True
        failed = allreduce_hook(state, Bucket(torch.ones(3)))
        with pytest.raises(RuntimeError, match="peer 1 died"):
            failed.wait()
        state.close()
    finally:
        dist.destroy_process_group()


def test_hook_state_is_a_context_manager_that_closes_and_collects(tmp_path):
    """``with register(...) as state:`` replaces ``state.close(); gc.collect()`` by hand:
    leaving the block stops the progress thread and collects the reference
    cycles training left, also when the block raises."""
    import gc
    import weakref

    import torch.distributed as dist
    from topoplan.torch import TopoplanHookState, allreduce_hook

    class Bucket:
        def __init__(self, tensor):
            self.tensor = tensor

        def buffer(self):
            return self.tensor

    class Cycle:
        pass

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    gc.disable()  # only the state's exit may collect the cycle
    try:
        gated = _GatedAllreduce()
        gated.gate.set()
        with TopoplanHookState(allreduce=gated) as state:
            assert allreduce_hook(state, Bucket(torch.ones(2))).wait().sum() == 6
            thread = state._progress.thread
            cycle = Cycle()
            cycle.me = cycle
            left = weakref.ref(cycle)
            del cycle
        assert not thread.is_alive() and left() is None
        with pytest.raises(RuntimeError, match="in the block"):
            with TopoplanHookState(allreduce=gated) as failing:
                allreduce_hook(failing, Bucket(torch.ones(2))).wait()
                raise RuntimeError("in the block")
        assert failing._progress.closed and not failing._progress.thread.is_alive()
    finally:
        gc.enable()
        dist.destroy_process_group()


def test_distributed_optimizer_is_a_context_manager():
    from topoplan.cluster import loads_cluster
    from topoplan.torch import PlannedAllreduce
    from topoplan.runtime.transports import Local

    def rank_fn(t):
        model, batches = model_and_data()
        allreduce = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="ring")
        with DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce,
                                  double_buffering=True) as opt:
            for x, y in batches[:2]:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            opt.finalize()
        progress = opt._overlap.progress
        return opt._overlap.hooks, progress.closed, progress.thread

    for hooks, closed, thread in Local.launch(2, rank_fn, timeout=60):
        assert hooks == [] and closed and (thread is None or not thread.is_alive())


# ---- overlap: buffers started from the gradient hooks during backward ---------------------

PAIR = ("name: pair\nswitches: [{name: s}]\nboxes:\n"
        "  - {name: 'n{i}', count: 2, gpus: 1, nics: [{switch: s, bandwidth: 1}]}\n")


def _overlap_run(t, overlap: bool, fp16: bool, dbuf: bool, grads=None):
    """Three steps on a small MLP over the planned ring (Local threads); the gradients
    after each synchronize(), the final parameters, the buffers' layout, and each step's
    local gradients (after backward, before any exchange). Weights and data come from
    explicit generators: the threads share torch's global one.

    With ``grads`` (another run's local gradients), backward is skipped and each step
    exchanges those: the math of backward itself is not bitwise reproducible from one
    run to the next (MKL's GEMMs take paths by the alignment of their operands unless
    MKL_CBWR pins them; with one intra-op thread, two runs of this model differ in the
    last bit), so the modes are compared on the same local gradients."""
    from topoplan.cluster import loads_cluster
    from topoplan.torch import PlannedAllreduce

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    named = list(model.named_parameters())
    allreduce = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="ring")
    # The packed run gets the overlapped run's layout (reverse order) by its names.
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce,
                               named_parameters=named if overlap else named[::-1],
                               fusion_threshold=600, overlap=overlap, double_buffering=dbuf,
                               compression=Compression.fp16 if fp16 else Compression.none)
    seen, local = [], []
    for step in range(3):
        opt.zero_grad()
        if grads is None:
            g = torch.Generator().manual_seed(10 * step + t.rank)
            x, y = torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g)
            F.cross_entropy(model(x), y).backward()
        else:
            for p, given in zip(model.parameters(), grads[step]):
                p.grad = None if given is None else given.clone()
        local.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.synchronize()
        seen.append([None if p.grad is None else p.grad.clone() for p in model.parameters()])
        opt.step()
    opt.finalize()
    opt.close()
    seen.append([p.detach().clone() for p in model.parameters()])
    return seen, [len(group.params) for group in opt.groups], local


@pytest.mark.parametrize("fp16, dbuf", [(False, False), (True, False), (False, True),
                                        (True, True)])
@pytest.mark.parametrize("threads", [1, None])
def test_overlapped_gradients_are_bitwise_those_of_packing_after_backward(fp16, dbuf, threads):
    """Buffers started from the gradient hooks during backward, and the same buffers
    packed after backward from the same local gradients, give bitwise the same averaged
    gradients and parameters; also with one intra-op thread (as scripts/train.py runs),
    where backward itself is not bitwise reproducible between runs."""
    from topoplan.runtime.transports import Local

    def rank_fn(t):
        overlapped, layout, local = _overlap_run(t, True, fp16, dbuf)
        packed, packed_layout, _ = _overlap_run(t, False, fp16, dbuf, grads=local)
        return overlapped, layout, packed, packed_layout, local

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        results = Local.launch(2, rank_fn, timeout=60)
    finally:
        torch.set_num_threads(before)
    for overlapped, layout, packed, packed_layout, local in results:
        assert layout == packed_layout == [3, 1, 1, 1]  # the last layers' buffer first
        assert all(g is not None for step in local for g in step)
        for a, b in zip(overlapped, packed):
            assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b))
    # the ranks' local gradients differ (their data do), the averages do not (with
    # double buffering the first step has none yet: p.grad keeps the local gradient)
    assert not torch.equal(results[0][4][0][0], results[1][4][0][0])
    for a, b in zip(results[0][0][1 if dbuf else 0:], results[1][0][1 if dbuf else 0:]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_wrapper_is_an_instance_of_the_wrapped_optimizer_class():
    model = nn.Linear(4, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    opt = DistributedOptimizer(sgd, FakeWorld(2), compression=Compression.none)
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, DistributedOptimizer)
    assert type(opt).__name__ == "DistributedSGD" and not opt.overlap  # no start()
    adam = DistributedOptimizer(torch.optim.Adam(model.parameters()), FakeWorld(2))
    assert isinstance(adam, torch.optim.Adam) and not isinstance(adam, torch.optim.SGD)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    scheduler.step()
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.05)  # the inner optimizer's groups
    assert opt.defaults is sgd.defaults


def test_overlap_needs_start_and_one_backward_per_step():
    from topoplan import TopoplanError
    from topoplan.cluster import loads_cluster
    from topoplan.torch import PlannedAllreduce
    from topoplan.runtime.transports import Local

    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="start"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1), FakeWorld(1),
                             overlap=True)

    def rank_fn(t):
        model = nn.Linear(4, 2)
        allreduce = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="ring")
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1), allreduce)
        model(torch.ones(1, 4)).sum().backward()
        try:
            model(torch.ones(1, 4)).sum().backward()
        except TopoplanError as exc:
            error = str(exc)
        opt.step()
        return error

    for error in Local.launch(2, rank_fn, timeout=30):
        assert "changed after its buffer's allreduce started" in error and "overlap=False" in error


def test_planned_allreduce_records_what_auto_picked():
    """``chosen`` names what auto runs for each size (a known planner or the transport's
    own collective, the same on both ranks), not "auto": "exploring" while it measures."""
    from topoplan.cluster import loads_cluster
    from topoplan.planners import PLANNERS
    from topoplan.torch import PlannedAllreduce
    from topoplan.runtime.transports import Local

    def rank_fn(t):
        planned = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="auto")
        x = torch.full((1000,), float(t.rank + 1))
        planned(x)
        first = dict(planned.chosen)
        while planned.choice.exploring(4000):
            x = torch.full((1000,), float(t.rank + 1))
            planned(x)
        return float(x[0]), first, dict(planned.chosen)

    results = Local.launch(2, rank_fn, timeout=60)
    assert [value for value, _, _ in results] == [3.0, 3.0]
    assert results[0][1] == {4000: "exploring"}
    assert results[0][2] == results[1][2] and set(results[0][2]) == {4000}
    assert results[0][2][4000] in set(PLANNERS) - {"auto"} | {"native"}


class _HeadFirst(nn.Module):
    """Registers its head before its body: reverse parameter order is not backward's."""

    def __init__(self, swap: bool = False) -> None:
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.body = nn.Linear(8, 16)
        self.side = nn.Linear(8, 4)
        self.swap = swap

    def forward(self, x):
        if self.swap:  # the side branch first: backward reaches it last
            side = self.side(x)
            return self.head(torch.relu(self.body(x))) + side
        main = self.head(torch.relu(self.body(x)))
        return main + self.side(x)


def _relayout_run(t, swap_on_rank1: bool):
    """Four overlapped steps of _HeadFirst over the planned ring, one buffer a parameter;
    the buffers' names after each step, the order backward made the gradients, and the
    final parameters (same on every rank?)."""
    from topoplan.cluster import loads_cluster
    from topoplan.torch import PlannedAllreduce

    model = _HeadFirst(swap=swap_on_rank1 and t.rank == 1)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    made = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda _p, name=name: made.append(name))
    allreduce = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="ring")
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce,
                               named_parameters=model.named_parameters(), fusion_threshold=0,
                               compression=Compression.none)
    layouts = []
    for step in range(4):
        g = torch.Generator().manual_seed(10 * step + t.rank)
        opt.zero_grad()
        made.clear()
        F.cross_entropy(model(torch.randn(5, 8, generator=g)),
                        torch.randint(0, 4, (5,), generator=g)).backward()
        opt.step()
        layouts.append([g.names[0] for g in opt.groups])
    opt.close()
    return layouts, list(made), torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_buffers_are_laid_out_again_in_the_order_backward_made_the_gradients():
    """A model that registers its layers out of forward order: after the first step the
    buffers follow backward's order (as DDP rebuilds its buckets), on every rank alike,
    and training goes on to the same parameters on every rank."""
    from topoplan.runtime.transports import Local

    results = Local.launch(2, lambda t: _relayout_run(t, False), timeout=60)
    for layouts, made, _ in results:
        reverse = ["side.bias", "side.weight", "body.bias", "body.weight", "head.bias",
                   "head.weight"]
        assert layouts[0] == made and layouts[0] != reverse  # relaid after step 1
        assert made.index("head.weight") < made.index("body.weight")
        assert layouts[1:] == [layouts[0]] * 3
    assert torch.equal(results[0][2], results[1][2])


def test_ranks_that_saw_different_orders_keep_their_layout():
    """Rank 1 computes its two branches the other way round, so its backward makes the
    gradients in another order: the ranks find out with one allreduce and both keep the
    layout they share, and still train to the same parameters."""
    from topoplan.runtime.transports import Local

    results = Local.launch(2, lambda t: _relayout_run(t, True), timeout=60)
    (layouts0, made0, params0), (layouts1, made1, params1) = results
    assert made0 != made1
    assert layouts0 == layouts1 and layouts0[0] == [
        "side.bias", "side.weight", "body.bias", "body.weight", "head.bias", "head.weight"]
    assert torch.equal(params0, params1)


@pytest.mark.parametrize("overlap, dbuf", [(False, False), (False, True), (True, False),
                                           (True, True)])
def test_the_time_in_communication_is_measured_in_every_mode(overlap, dbuf):
    """With overlap (the default over PlannedAllreduce) the training script printed
    'communication nan s'. comm_seconds is the wall time with an allreduce in
    flight, wait_seconds the part step() waited for, in every mode."""
    import math
    import time

    from topoplan.cluster import loads_cluster
    from topoplan.torch import PlannedAllreduce
    from topoplan.runtime.transports import Local

    def rank_fn(t):
        model, batches = model_and_data()
        allreduce = PlannedAllreduce(loads_cluster(PAIR), t, algorithm="ring")
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), allreduce,
                                   fusion_threshold=256, overlap=overlap, double_buffering=dbuf)
        began = time.perf_counter()
        for x, y in batches:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        opt.finalize()
        opt.close()
        return opt.comm_seconds, opt.wait_seconds, time.perf_counter() - began, len(opt.groups)

    for comm, wait, wall, buffers in Local.launch(2, rank_fn, timeout=60):
        assert buffers > 1
        assert math.isfinite(comm) and 0 < comm <= wall, (comm, wall)
        assert 0 <= wait <= wall
        if not overlap and not dbuf:  # the blocking calls are all it waits for
            assert comm <= wait


def test_the_time_counters_are_attributes_a_user_can_reset():
    """comm_seconds and wait_seconds live in the optimizer's CommTime, which its parts add
    to; setting them (say, between epochs) still works."""
    model, batches = model_and_data()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), FakeWorld(2))
    for x, y in batches[:2]:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        assert opt.comm_seconds > 0 and opt.wait_seconds > 0
        opt.comm_seconds = opt.wait_seconds = 0.0
        assert (opt.comm_seconds, opt.wait_seconds) == (0.0, 0.0)
        assert (opt._time.comm_seconds, opt._time.wait_seconds) == (0.0, 0.0)


def test_double_buffering_warns_about_high_momentum():
    """Double buffering applies gradients one step late; with momentum >= 0.9 SGD on the
    digits CNN loses accuracy or diverges where synchronous training converges."""
    import warnings

    model = nn.Linear(4, 2)
    with pytest.warns(UserWarning, match=r"one step late, and momentum 0\.9 .*lower the "
                                         r"learning rate or the momentum") as caught:
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                             FakeWorld(2), double_buffering=True)
    assert caught[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for momentum, dbuf in ((0.5, True), (0.9, False), (0.0, True)):
            DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
                                 FakeWorld(2), double_buffering=dbuf)
        DistributedOptimizer(torch.optim.Adam(model.parameters()), FakeWorld(2),
                             double_buffering=True)  # no momentum key: betas are its own
