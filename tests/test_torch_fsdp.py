"""Planned reduce_scatter_tensor / all_gather_into_tensor (topoplan.torch.PlannedCollectives)
on real gloo process groups of 2 and 4 ranks, against torch.distributed's own collectives
and against sums the parent computes itself: 1-D and N-D tensors, dtypes, async work,
FSDP's in-place all-gather, subgroups, the plan cache, every error, a hand-rolled
FSDP-style training loop and PyTorch's FSDP2 (fully_shard) with topoplan's collectives.

One spawn per world size runs every check (torch start-up is the expensive part); the
ranks save what they saw and the assertions run here, in the parent.
"""

from __future__ import annotations

import datetime
import os
import re
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

from tests.support import forkserver  # noqa: E402
from tests.support.clusters import load_topology, switch_cluster  # noqa: E402
from tests.support.ports import free_port as _free_port  # noqa: E402
from topoplan.errors import TopoplanError  # noqa: E402

try:  # FSDP2 with custom collectives (recent PyTorch; 2.13 here)
    from torch.distributed.fsdp import FSDPModule
    HAS_FSDP2 = hasattr(FSDPModule, "set_custom_all_gather")
except ImportError:
    HAS_FSDP2 = False
needs_fsdp2 = pytest.mark.skipif(not HAS_FSDP2, reason="needs FSDP2's set_custom_all_gather")

STEPS = 3
LOCAL = 4          # samples per rank per step
LR = 0.1
# (label, dtype, output shape of the reduce-scatter = input shape of the all-gather)
CASES = [("f32-1d", torch.float32, (7,)), ("f64-nd", torch.float64, (3, 5)),
         ("bf16-1d", torch.bfloat16, (6,)), ("i64-nd", torch.int64, (2, 3, 2)),
         ("f32-big", torch.float32, (4099,))]
ALGORITHMS = ("ring", "rhd", "auto")


def cluster_for(world: int):
    return load_topology("ddl_two_switch") if world == 4 else switch_cluster(world)


def case_input(seed: int, rank: int, shape: tuple, dtype) -> torch.Tensor:
    """Integer-valued data: sums are exact in any order, so results must be equal."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype)


def full_shape(shape: tuple, world: int) -> tuple:
    return (world * shape[0], *shape[1:])


# -- what the ranks run ----------------------------------------------------------------------
def _collective_cases(world: int, rank: int, planned_by: dict) -> dict:
    out = {}
    for a, algorithm in enumerate(ALGORITHMS):
        planned = planned_by[algorithm]
        for c, (label, dtype, shape) in enumerate(CASES):
            seed = 10 * a + c
            full = case_input(seed, rank, full_shape(shape, world), dtype)
            shard = case_input(seed + 500, rank, shape, dtype)
            rs, rs_ref = torch.full(shape, 99, dtype=dtype), torch.empty(shape, dtype=dtype)
            planned.reduce_scatter_tensor(rs, full)
            dist.reduce_scatter_tensor(rs_ref, full.clone())
            ag = torch.full(full_shape(shape, world), 99, dtype=dtype)
            ag_ref = torch.empty(full_shape(shape, world), dtype=dtype)
            planned.all_gather_into_tensor(ag, shard)
            dist.all_gather_into_tensor(ag_ref, shard)
            out[(algorithm, label)] = {"rs": rs, "rs_torch": rs_ref, "ag": ag, "ag_torch": ag_ref,
                                       "input_after": full, "seed": seed}
        # AVG of random floats against torch's own AVG (gloo has it)
        g = torch.Generator().manual_seed(77 + rank)
        full = torch.randn(world * 33, generator=g)
        avg, avg_ref = torch.empty(33), torch.empty(33)
        planned.reduce_scatter_tensor(avg, full, op=dist.ReduceOp.AVG)
        dist.reduce_scatter_tensor(avg_ref, full.clone(), op=dist.ReduceOp.AVG)
        out[(algorithm, "avg")] = {"rs": avg, "rs_torch": avg_ref}
    return out


def _async_and_inplace(world: int, rank: int, planned) -> dict:
    m = 10
    full = case_input(901, rank, (world * m,), torch.float32)
    shard = case_input(902, rank, (m,), torch.float32)
    rs, ag = torch.empty(m), torch.empty(world * m)
    w_ag = planned.all_gather_into_tensor(ag, shard, async_op=True)
    w_rs = planned.reduce_scatter_tensor(rs, full, op=dist.ReduceOp.AVG, async_op=True)
    is_work = isinstance(w_ag, dist.Work) and isinstance(w_rs, dist.Work)
    waited = (w_rs.wait(), w_ag.wait())          # the later call first
    completed = (w_rs.is_completed(), w_ag.is_completed())
    twice = rs.clone()
    w_rs.wait()                                   # a second wait divides nothing again
    # FSDP's in-place all-gather: the input is this rank's shard of the output
    inplace = torch.zeros(world * m)
    inplace[rank * m:(rank + 1) * m] = shard
    planned.all_gather_into_tensor(inplace, inplace[rank * m:(rank + 1) * m])
    sync = planned.all_gather_into_tensor(torch.empty(world * m), shard)
    return {"rs": rs, "ag": ag, "is_work": is_work, "waited": waited, "completed": completed,
            "second_wait_same": torch.equal(twice, rs), "inplace": inplace, "sync_returns": sync}


def _cache(world: int, planned) -> dict:
    before = len(planned._executors)
    for _ in range(3):                            # the same (collective, size, dtype): one plan
        planned.all_gather_into_tensor(torch.empty(world * 64), torch.ones(64))
    after_same = len(planned._executors)
    # same byte size, other dtype: a plan of its own
    planned.all_gather_into_tensor(torch.empty(world * 64, dtype=torch.int32),
                                   torch.ones(64, dtype=torch.int32))
    # same element count as a reduce-scatter: a plan of its own
    planned.reduce_scatter_tensor(torch.empty(64), torch.ones(world * 64))
    return {"before": before, "after_same": after_same, "after": len(planned._executors),
            "chosen": dict(planned.chosen),
            "stats": {k: (v.calls, v.bytes) for k, v in planned.stats.items()}}


def _errors(world: int, rank: int, planned, cluster) -> dict:
    from topoplan.torch import PlannedCollectives

    other = switch_cluster(world + 1)
    f32, R = torch.float32, dist.ReduceOp
    cases = {
        "rs_size": lambda: planned.reduce_scatter_tensor(torch.empty(3),
                                                         torch.empty(world * 3 + 1)),
        "ag_size": lambda: planned.all_gather_into_tensor(torch.empty(world * 3 - 1),
                                                          torch.empty(3)),
        "dtype_mismatch": lambda: planned.reduce_scatter_tensor(
            torch.empty(3, dtype=f32), torch.empty(world * 3, dtype=torch.float64)),
        "rs_bool": lambda: planned.reduce_scatter_tensor(
            torch.empty(3, dtype=torch.bool), torch.empty(world * 3, dtype=torch.bool)),
        "non_contiguous": lambda: planned.reduce_scatter_tensor(
            torch.empty(3, 2), torch.empty(2, world * 3).t()),
        "ag_non_contiguous_out": lambda: planned.all_gather_into_tensor(
            torch.empty(2, world * 3).t(), torch.empty(3, 2)),
        "device_mismatch": lambda: planned.all_gather_into_tensor(
            torch.empty(world * 3, device="meta"), torch.empty(3)),
        "backend_device": lambda: planned.all_gather_into_tensor(
            torch.empty(world * 3, device="meta"), torch.empty(3, device="meta")),
        "op_max": lambda: planned.reduce_scatter_tensor(torch.empty(3), torch.empty(world * 3),
                                                        op=R.MAX),
        "op_premul": lambda: planned.reduce_scatter_tensor(
            torch.empty(3), torch.empty(world * 3), op=dist._make_nccl_premul_sum(0.5)),
        "avg_int": lambda: planned.reduce_scatter_tensor(
            torch.empty(3, dtype=torch.int64), torch.empty(world * 3, dtype=torch.int64),
            op=R.AVG),
        "not_tensor": lambda: planned.all_gather_into_tensor([0.0] * world, torch.empty(1)),
        "cluster_size": lambda: PlannedCollectives(other, algorithm="ring"),
        "bad_planner": lambda: PlannedCollectives(cluster, algorithm="no-such-planner")
        .all_gather_into_tensor(torch.empty(world * 5), torch.empty(5)),
    }
    seen = {}
    for name, call in cases.items():
        try:
            call()
            seen[name] = None
        except TopoplanError as exc:
            seen[name] = (type(exc).__name__, str(exc))
    # nothing was left half-sent: the group still runs collectives in step
    after = torch.empty(world * 2)
    planned.all_gather_into_tensor(after, torch.full((2,), float(rank)))
    return {"errors": seen, "after": after}


def _subgroups(world: int, rank: int, planned_world) -> dict:
    from topoplan.torch import PlannedCollectives

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    planned = PlannedCollectives(switch_cluster(2), algorithm="ring", group=mine)
    full = case_input(1234, rank, (2 * 6,), torch.float32)
    rs, rs_ref = torch.empty(6), torch.empty(6)
    planned.reduce_scatter_tensor(rs, full)
    dist.reduce_scatter_tensor(rs_ref, full.clone(), group=mine)
    shard = torch.full((3,), float(rank))
    ag, ag_ref = torch.empty(6), torch.empty(6)
    planned.all_gather_into_tensor(ag, shard)          # group=None: the constructor's group
    dist.all_gather_into_tensor(ag_ref, shard, group=mine)
    try:
        planned_world.all_gather_into_tensor(torch.empty(6), shard, group=mine)
        wrong = None
    except TopoplanError as exc:
        wrong = str(exc)
    return {"rs": rs, "rs_torch": rs_ref, "ag": ag, "ag_torch": ag_ref, "wrong_cluster": wrong}


def make_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 5))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(LOCAL, 12, generator=g), torch.randint(0, 5, (LOCAL,), generator=g)


def _flat_fsdp(world: int, rank: int, reduce_scatter, all_gather) -> list[torch.Tensor]:
    """FSDP by hand: each rank keeps 1/world of the flat parameters; all-gather them for
    forward, reduce-scatter (AVG) the flat gradients, SGD on the shard."""
    model = make_model()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    m = -(-numel // world)                        # shard size, flat buffer padded to world * m
    flat = torch.zeros(world * m)
    flat[:numel] = torch.cat([p.detach().reshape(-1) for p in params])
    shard = flat[rank * m:(rank + 1) * m].clone()
    seen = []
    for step in range(STEPS):
        full = torch.empty(world * m)
        all_gather(full, shard)
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(full[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        model.zero_grad()
        x, y = batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        grads = torch.zeros(world * m)
        grads[:numel] = torch.cat([p.grad.reshape(-1) for p in params])
        grad_shard = torch.empty(m)
        reduce_scatter(grad_shard, grads, op=dist.ReduceOp.AVG)
        shard -= LR * grad_shard
        seen.append(shard.clone())
    full = torch.empty(world * m)
    all_gather(full, shard)
    seen.append(full[:numel].clone())
    return seen


def _fsdp2(world: int, planned) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from topoplan.torch import register_fsdp

    mesh = init_device_mesh("cpu", (world,))
    runs = {}
    for name in ("torch", "topoplan"):
        model = make_model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        calls = None
        if name == "topoplan":
            got = register_fsdp(model, planned=planned)
            assert got is planned
            calls = {k: v.calls for k, v in planned.stats.items()}
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            x, y = batch(step, dist.get_rank())
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        runs[name] = [p.full_tensor().detach().clone() for p in model.parameters()]
        if calls is not None:
            runs["calls"] = {k: v.calls - calls[k] for k, v in planned.stats.items()}
    runs["chosen"] = dict(planned.chosen)
    try:
        register_fsdp(make_model(), planned=planned)
        runs["not_fsdp"] = None
    except TopoplanError as exc:
        runs["not_fsdp"] = str(exc)
    return runs


def readme_snippet() -> str:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    return next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                if "PlannedCollectives" in b)


def _readme(world: int, rank: int, cluster) -> dict:
    """The README's FSDP example, run as written on an FSDP2 model and flat tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    m = 5
    names = {"model": model, "cluster": cluster, "dist": dist,
             "full_params": torch.empty(world * m), "param_shard": torch.full((m,), rank + 1.0),
             "grad_shard": torch.empty(m), "full_grads": torch.arange(world * m) * (rank + 1.0)}
    exec(readme_snippet(), names)
    model(batch(0, rank)[0]).sum().backward()     # the registered collectives run
    return {"full_params": names["full_params"], "grad_shard": names["grad_shard"],
            "direct_calls": {k: v.calls for k, v in names["collectives"].stats.items()},
            "fsdp_calls": {k: v.calls for k, v in names["planned"].stats.items()}}


def _worker(rank: int, world: int, port: int, outdir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    from topoplan.torch import PlannedCollectives

    cluster = cluster_for(world)
    planned_by = {a: PlannedCollectives(cluster, algorithm=a, timeout=20) for a in ALGORITHMS}
    ring = planned_by["ring"]
    native_rs = dist.reduce_scatter_tensor
    native_ag = dist.all_gather_into_tensor
    result = {
        "cases": _collective_cases(world, rank, planned_by),
        "async": _async_and_inplace(world, rank, planned_by["rhd"]),
        "cache": _cache(world, PlannedCollectives(cluster, algorithm="ring")),
        "errors": _errors(world, rank, ring, cluster),
        "subgroups": _subgroups(world, rank, ring) if world == 4 else None,
        "flat_planned": _flat_fsdp(world, rank, ring.reduce_scatter_tensor,
                                   ring.all_gather_into_tensor),
        "flat_torch": _flat_fsdp(world, rank, native_rs, native_ag),
        "fsdp2": _fsdp2(world, PlannedCollectives(cluster, algorithm="auto"))
        if HAS_FSDP2 else None,
        "readme": _readme(world, rank, cluster) if HAS_FSDP2 else None,
    }
    torch.save(result, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def ranks(request, tmp_path_factory) -> tuple[int, list[dict]]:
    world = request.param
    out = tmp_path_factory.mktemp(f"fsdp{world}")
    mp.start_processes(_worker, args=(world, _free_port(), str(out)), nprocs=world, join=True,
                       start_method=forkserver.START)
    return world, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


# -- the checks ------------------------------------------------------------------------------
def test_matches_torch_and_the_exact_sums(ranks):
    world, results = ranks
    for a, algorithm in enumerate(ALGORITHMS):
        for c, (label, dtype, shape) in enumerate(CASES):
            seed = 10 * a + c
            inputs = [case_input(seed, r, full_shape(shape, world), dtype) for r in range(world)]
            total = torch.stack([t.to(torch.float64) for t in inputs]).sum(0).to(dtype)
            shards = torch.cat([case_input(seed + 500, r, shape, dtype) for r in range(world)])
            for r, res in enumerate(results):
                got = res["cases"][(algorithm, label)]
                what = f"{algorithm} {label} rank {r}"
                assert got["rs"].shape == shape and got["rs"].dtype == dtype, what
                assert torch.equal(got["rs"], total[r * shape[0]:(r + 1) * shape[0]]), what
                assert torch.equal(got["rs"], got["rs_torch"]), what
                assert torch.equal(got["input_after"], inputs[r]), f"{what}: input changed"
                assert torch.equal(got["ag"], shards), what
                assert torch.equal(got["ag"], got["ag_torch"]), what


def test_avg_matches_torch(ranks):
    world, results = ranks
    for algorithm in ALGORITHMS:
        for r, res in enumerate(results):
            got = res["cases"][(algorithm, "avg")]
            if world == 2:   # a + b in either order, then / 2: bitwise torch's
                assert torch.equal(got["rs"], got["rs_torch"]), (algorithm, r)
            assert torch.allclose(got["rs"], got["rs_torch"], rtol=1e-6, atol=1e-6), (algorithm, r)
            assert not torch.allclose(got["rs"] * world, got["rs_torch"]), "AVG must divide"


def test_async_work_and_inplace_allgather(ranks):
    world, results = ranks
    m = 10
    total = torch.stack([case_input(901, r, (world * m,), torch.float32)
                         for r in range(world)]).sum(0)
    shards = torch.cat([case_input(902, r, (m,), torch.float32) for r in range(world)])
    for r, res in enumerate(results):
        got = res["async"]
        assert got["is_work"] and got["waited"] == (True, True)
        assert got["completed"] == (True, True) and got["second_wait_same"]
        assert torch.equal(got["rs"], total[r * m:(r + 1) * m] / world)
        assert torch.equal(got["ag"], shards)
        assert torch.equal(got["inplace"], shards)
        assert got["sync_returns"] is None


def test_plans_are_cached_per_collective_size_and_dtype(ranks):
    world, results = ranks
    for res in results:
        got = res["cache"]
        assert (got["before"], got["after_same"], got["after"]) == (0, 1, 3)
        assert set(got["chosen"]) == {("allgather", world * 256, "float32"),
                                      ("allgather", world * 256, "int32"),
                                      ("reduce_scatter", world * 256, "float32")}
        assert set(got["chosen"].values()) == {"ring"}
        assert got["stats"] == {"allgather": (4, 4 * world * 256),
                                "reduce_scatter": (1, world * 256)}
    if not HAS_FSDP2:
        return
    # what auto picked (in the FSDP2 run) is a planner's name, not "auto", and the same on
    # every rank
    picked = [r["fsdp2"]["chosen"] for r in results]
    assert picked[0] and all(p == picked[0] for p in picked)
    assert not {"auto", ""} & set(picked[0].values()), picked[0]


def test_errors_are_clear_and_leave_the_group_in_step(ranks):
    world, results = ranks
    expect = {
        "rs_size": f"reduce_scatter_tensor: the input must have world size ({world}) x the "
                   f"output's 3 = {world * 3} elements, got {world * 3 + 1}",
        "ag_size": f"all_gather_into_tensor: the output_tensor must have world size ({world}) "
                   f"x the input_tensor's 3 = {world * 3} elements, got {world * 3 - 1}",
        "dtype_mismatch": "reduce_scatter_tensor: input is torch.float64 but output is "
                          "torch.float32",
        "rs_bool": "reduce_scatter_tensor: dtype torch.bool is not supported",
        "non_contiguous": "reduce_scatter_tensor: input is not contiguous",
        "ag_non_contiguous_out": "all_gather_into_tensor: output_tensor is not contiguous",
        "device_mismatch": "all_gather_into_tensor: input_tensor is on cpu but output_tensor "
                           "on meta",
        "backend_device": "all_gather_into_tensor: the process group's backend (gloo) moves "
                          "cpu tensors, got meta ones",
        "op_max": "got op MAX",
        "op_premul": "got op PREMUL_SUM",
        "avg_int": "reduce_scatter_tensor: AVG needs a floating-point dtype",
        "not_tensor": "all_gather_into_tensor: output_tensor must be a torch.Tensor, got list",
        "cluster_size": f"has {world + 1} ranks but the process group has {world}",
        "bad_planner": "no-such-planner",
    }
    for r, res in enumerate(results):
        errors = res["errors"]["errors"]
        assert set(errors) == set(expect)
        for name, text in expect.items():
            assert errors[name] is not None, f"rank {r}: {name} raised nothing"
            kind, message = errors[name]
            assert text in message, f"rank {r}: {name}: {message}"
            assert "Traceback" not in message and len(message.splitlines()) == 1, message
        # rank 0 planned and failed; the others got its error instead of waiting for a plan
        kind, message = errors["bad_planner"]
        assert kind == ("PlannerError" if r == 0 else "TopoplanError"), (r, kind)
        if r:
            assert "planning" in message and "failed on rank 0" in message
        assert torch.equal(res["errors"]["after"],
                           torch.arange(world, dtype=torch.float32).repeat_interleave(2))


def test_subgroups_map_group_ranks_to_the_cluster(ranks):
    world, results = ranks
    if world != 4:
        pytest.skip("subgroups need 4 ranks")
    for r, res in enumerate(results):
        got = res["subgroups"]
        assert torch.equal(got["rs"], got["rs_torch"]) and torch.equal(got["ag"], got["ag_torch"])
        pair = 2 * (r // 2)
        assert torch.equal(got["ag"], torch.tensor([pair] * 3 + [pair + 1] * 3,
                                                   dtype=torch.float32))
        assert "has 4 ranks but the process group has 2" in got["wrong_cluster"]


def reference_flat(world: int) -> torch.Tensor:
    """One process, the global batch, plain SGD: the flat parameters after STEPS steps."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        xs, ys = zip(*(batch(step, r) for r in range(world)))
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_flat_parameter_fsdp_matches_torch_collectives_and_plain_sgd(ranks):
    world, results = ranks
    final = reference_flat(world)
    initial = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    for r, res in enumerate(results):
        ours, theirs = res["flat_planned"], res["flat_torch"]
        assert len(ours) == STEPS + 1
        for step, (a, b) in enumerate(zip(ours, theirs)):
            if world == 2:
                assert torch.equal(a, b), f"rank {r} step {step}"
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), f"rank {r} step {step}"
        assert torch.allclose(ours[-1], final, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(ours[-1], initial, atol=1e-3), "training must move the weights"
    assert all(torch.equal(res["flat_planned"][-1], results[0]["flat_planned"][-1])
               for res in results)


@needs_fsdp2
def test_fsdp2_with_planned_collectives_matches_fsdp2(ranks):
    world, results = ranks
    final = reference_flat(world)
    for r, res in enumerate(results):
        got = res["fsdp2"]
        assert got["calls"]["allgather"] >= STEPS and got["calls"]["reduce_scatter"] >= STEPS
        ours = torch.cat([p.reshape(-1) for p in got["topoplan"]])
        theirs = torch.cat([p.reshape(-1) for p in got["torch"]])
        if world == 2:
            assert torch.equal(ours, theirs), f"rank {r}"
        assert torch.allclose(ours, theirs, rtol=1e-6, atol=1e-7), f"rank {r}"
        assert torch.allclose(ours, final, rtol=1e-5, atol=1e-6), f"rank {r}"
        assert "no FSDP2 module in Sequential" in got["not_fsdp"]


@needs_fsdp2
def test_the_readme_example_runs_as_written(ranks):
    world, results = ranks
    m = 5
    for r, res in enumerate(results):
        got = res["readme"]
        assert torch.equal(got["full_params"],
                           torch.arange(1.0, world + 1).repeat_interleave(m))
        mean = torch.arange(world * m) * sum(range(1, world + 1)) / world
        assert torch.allclose(got["grad_shard"], mean[r * m:(r + 1) * m])
        assert got["direct_calls"] == {"allgather": 2, "reduce_scatter": 1}
        # register_fsdp's collectives ran in forward and backward
        assert got["fsdp_calls"]["allgather"] > 0 and got["fsdp_calls"]["reduce_scatter"] > 0


def test_needs_an_initialised_process_group():
    from topoplan.torch import PlannedCollectives

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(TopoplanError, match="init_process_group"):
        PlannedCollectives(switch_cluster(2))


def test_exported_from_topoplan_torch():
    import topoplan.torch as tt

    for name in ("PlannedCollectives", "PlannedWork", "register_fsdp", "FSDPAllGather",
                 "FSDPReduceScatter"):
        assert name in tt.__all__ and hasattr(tt, name)
