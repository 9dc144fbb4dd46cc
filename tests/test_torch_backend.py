"""The ``topoplan`` torch.distributed backend (topoplan.torch.backend) on 4 real gloo ranks:
``dist.all_reduce``, ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` over sizes
0 to 16 MiB and fp32/fp16/bf16/int64 against a gloo group of the same ranks; DDP (no
hook), FSDP2 and HSDP (a 2 x 2 mesh) against the same training over gloo; delegated
calls; the init errors (every rank, one message); a planned step whose peer died; and a
job started by ``topoplan launch --transport torch`` (torchrun).

One forked launch runs every check of a kind (torch start-up is the expensive part); the
ranks save what they saw and the assertions run here, in the parent.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("topoplan.runtime.executor")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.support import forkserver  # noqa: E402
from tests.support.clusters import topology_path  # noqa: E402
from tests.support.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORLD = 4
CLUSTER = topology_path("ddl_two_switch")        # 4 ranks, two switches
STEPS = 3
LR = 0.1
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
SIZES = (0, 4, 1000, 1 << 20, 16 << 20)          # bytes of the full buffer


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _data(seed: int, rank: int, n: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, (n,), generator=g)
    return torch.randn(n, generator=g).to(dtype)


def _close(ours: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor,
           magnitude: torch.Tensor) -> bool:
    """Integers: equal to gloo's. Floats: ours and gloo's each within the rounding of
    ``WORLD`` additions of the exact sum (``magnitude``: the sum of the ranks' |x|)."""
    if not ours.is_floating_point():
        return torch.equal(ours, ref)
    bound = WORLD * torch.finfo(ours.dtype).eps * magnitude + 1e-30
    return bool(((ours.double() - exact).abs() <= bound).all()
                and ((ref.double() - exact).abs() <= bound).all())


def _exact(x: torch.Tensor, gloo) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum over ranks in float64, and the sum of magnitudes (over a gloo group)."""
    exact, magnitude = x.double(), x.double().abs()
    dist.all_reduce(exact, group=gloo)
    dist.all_reduce(magnitude, group=gloo)
    return exact, magnitude


# -- what the ranks run ----------------------------------------------------------------------
def _collectives(rank: int, gloo) -> dict:
    out = {}
    for d, dtype in enumerate(DTYPES):
        size = torch.empty((), dtype=dtype).element_size()
        for s, nbytes in enumerate(SIZES):
            n = (nbytes // size) // WORLD * WORLD
            seed = 10 * d + s
            x = _data(seed, rank, n, dtype)
            ours, ref = x.clone(), x.clone()
            dist.all_reduce(ours)
            dist.all_reduce(ref, group=gloo)
            rs, rs_ref = torch.empty(n // WORLD, dtype=dtype), torch.empty(n // WORLD, dtype=dtype)
            dist.reduce_scatter_tensor(rs, x)
            dist.reduce_scatter_tensor(rs_ref, x, group=gloo)
            shard = x[:n // WORLD].clone()
            ag, ag_ref = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.all_gather_into_tensor(ag, shard)
            dist.all_gather_into_tensor(ag_ref, shard, group=gloo)
            exact, magnitude = _exact(x, gloo)
            part = slice(rank * (n // WORLD), (rank + 1) * (n // WORLD))
            out[(dtype, nbytes)] = {
                "allreduce": _close(ours, ref, exact, magnitude),
                "allreduce_digest": _digest(ours),
                "reduce_scatter": _close(rs, rs_ref, exact[part], magnitude[part]),
                "allgather": torch.equal(ag, ag_ref),
                "allgather_digest": _digest(ag), "input_kept": torch.equal(x, _data(seed, rank,
                                                                                   n, dtype))}
    return out


def _more_calls(rank: int, gloo) -> dict:
    """AVG, an async call's future, coalesced calls, a delegated op and dtype."""
    out = {}
    x = _data(7, rank, 1001, torch.float32)
    avg, ref = x.clone(), x.clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    dist.all_reduce(ref, group=gloo)
    out["avg"] = torch.allclose(avg, ref / WORLD, rtol=1e-5, atol=1e-6)
    work = dist.all_reduce(x.clone(), async_op=True)
    out["future"] = torch.allclose(work.get_future().wait()[0], ref, rtol=1e-5, atol=1e-5)
    out["work_done"] = work.is_completed() and work.wait()
    late = x.clone()
    if rank != 0:
        time.sleep(1.0)              # rank 0's call waits for the others
    work = dist.all_reduce(late, async_op=True)
    if rank == 0:
        try:
            work.wait(timeout=datetime.timedelta(seconds=0.1))
            out["short_wait"] = "returned"
        except dist.DistBackendError as exc:
            out["short_wait"] = str(exc)
    out["late"] = work.wait() and torch.allclose(late, ref, rtol=1e-5, atol=1e-5)
    big = torch.full((3,), float(rank))
    dist.all_reduce(big, op=dist.ReduceOp.MAX)                 # delegated op
    out["max"] = big.tolist()
    flags = torch.tensor([rank % 2 == 0, True])
    dist.all_reduce(flags, op=dist.ReduceOp.SUM)                # delegated dtype (bool)
    out["bool"] = flags.tolist()
    tensors = [torch.full((5,), float(rank)), torch.full((3,), 2.0 * rank),
               torch.arange(4.0) * rank]
    dist.all_reduce_coalesced(tensors)
    out["coalesced"] = [t.tolist() for t in tensors]
    outs = [torch.empty(WORLD * 2), torch.empty(WORLD * 3, dtype=torch.int64)]
    ins = [torch.full((2,), float(rank)), torch.full((3,), rank)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    out["ag_coalesced"] = [o.tolist() for o in outs]
    rs_outs = [torch.empty(2), torch.empty(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o in rs_outs:
            dist.reduce_scatter_tensor(o, torch.arange(WORLD * o.numel(), dtype=torch.float32),
                                       op=dist.ReduceOp.AVG)
    cm.wait()
    out["rs_coalesced"] = [o.tolist() for o in rs_outs]
    return out


def _direct(rank: int, gloo) -> dict:
    """A group whose calls ``auto`` runs with gloo's own collectives (the model's choice
    on this cluster: ``mode="model"``): after a call of each has made the plans, they start
    on the caller's thread, with nothing queued to the worker."""
    from topoplan.torch import TopoplanOptions
    pg = dist.new_group(backend="topoplan",
                        pg_options=TopoplanOptions(cluster=CLUSTER, mode="model"))
    ok = []
    for i in range(6):
        x = _data(50 + i, rank, 4000, torch.float32)
        ours, ref = x.clone(), x.clone()
        op = dist.ReduceOp.AVG if i % 2 else dist.ReduceOp.SUM
        work = dist.all_reduce(ours, op=op, group=pg, async_op=True)
        dist.all_reduce(ref, group=gloo)
        got = work.get_future().wait()[0]
        ok.append(torch.equal(got, ours) and torch.allclose(
            ours, ref / WORLD if i % 2 else ref, rtol=1e-5, atol=1e-5))
        rs, rs_ref = torch.empty(1000), torch.empty(1000)
        dist.reduce_scatter_tensor(rs, x, group=pg)
        dist.reduce_scatter_tensor(rs_ref, x, group=gloo)
        ag, ag_ref = torch.empty(16000), torch.empty(16000)
        dist.all_gather_into_tensor(ag, x, group=pg)
        dist.all_gather_into_tensor(ag_ref, x, group=gloo)
        ok.append(torch.equal(rs, rs_ref) and torch.equal(ag, ag_ref))
    return {"ok": ok, "direct": pg.direct_calls,
            "chosen": sorted({d.chosen for c in pg.collectives.choices.values()
                              for d in c.decisions.values()}
                             | {d.chosen for d in pg.allreduce_planned.choice.decisions.values()})}


def _delegated(rank: int) -> dict:
    out = {}
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=2)
    out["broadcast"] = b.tolist()
    send = torch.arange(WORLD, dtype=torch.float32) + 10 * rank
    recv = torch.empty(WORLD)
    dist.all_to_all_single(recv, send)
    out["all_to_all"] = recv.tolist()
    t = torch.full((2,), float(rank))
    if rank % 2 == 0:
        dist.send(t, dst=rank + 1)
    else:
        dist.recv(t, src=rank - 1)
    out["send_recv"] = t.tolist()
    objects: list = [None] * WORLD
    dist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    dist.barrier()
    return out


def make_model() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 12, generator=g), torch.randint(0, 5, (4,), generator=g)


def _train(model: nn.Module, rank: int) -> torch.Tensor:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step, rank)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    return torch.cat([p.detach().reshape(-1) for p in params])


def _training(rank: int, gloo) -> dict:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    pg = dist.group.WORLD
    out = {"ddp": _train(DDP(make_model()), rank),
           "ddp_gloo": _train(DDP(make_model(), process_group=gloo), rank)}
    out["ddp_planned_calls"] = pg.allreduce_planned.stats.calls
    for name, mesh in (("fsdp", init_device_mesh("cpu", (WORLD,))),
                       ("fsdp_gloo", DeviceMesh.from_group(gloo, "cpu"))):
        model = make_model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        out[name] = _train(model, rank)
    out["fsdp_planned"] = {k: v.calls for k, v in pg.collectives.stats.items()}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = make_model()
    fully_shard(model, mesh=mesh)
    out["hsdp"] = _train(model, rank)
    groups = [mesh.get_group("replicate"), mesh.get_group("shard")]
    out["hsdp_groups"] = [(type(g).__name__, getattr(g.cluster, "name", None),
                           g.collectives.stats["reduce_scatter"].calls if g.collectives else 0,
                           g.allreduce_planned.stats.calls if g.allreduce_planned else 0)
                          for g in groups]
    return out


def _worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      TOPOPLAN_CLUSTER=str(CLUSTER))
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)   # *_into_tensor's new names
    import topoplan.torch  # noqa: F401 - registers the backend

    dist.init_process_group("topoplan", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    pg = dist.group.WORLD
    result = {"backend": dist.get_backend(), "type": type(pg).__name__,
              "cluster": pg.cluster.name,
              "collectives": _collectives(rank, gloo), "more": _more_calls(rank, gloo),
              "delegated": _delegated(rank), "direct": _direct(rank, gloo),
              "training": _training(rank, gloo),
              "chosen": dict(pg.allreduce_planned.chosen)}
    torch.save(result, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("backend")
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True,
                       start_method=forkserver.START)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# -- the checks ------------------------------------------------------------------------------
def test_the_backend_is_registered_and_planned_on_the_cluster(ranks):
    for res in ranks:
        assert res["backend"] == "topoplan" and res["type"] == "TopoplanProcessGroup"
        assert res["cluster"] == "ddl-two-switch"


def test_collectives_equal_gloo_and_ranks_are_bit_identical(ranks):
    for key in ranks[0]["collectives"]:
        for r, res in enumerate(ranks):
            got = res["collectives"][key]
            for what in ("allreduce", "reduce_scatter", "allgather", "input_kept"):
                assert got[what], f"rank {r}: {what} of {key} differs from gloo's"
        for what in ("allreduce_digest", "allgather_digest"):
            digests = {res["collectives"][key][what] for res in ranks}
            assert len(digests) == 1, f"{what} of {key}: ranks differ"


def test_wait_honours_its_timeout(ranks):
    assert "did not finish within the 0.1 s wait() was given" in ranks[0]["more"]["short_wait"]
    assert all(res["more"]["late"] for res in ranks)


def test_avg_futures_coalesced_and_delegated_ops(ranks):
    for r, res in enumerate(ranks):
        got = res["more"]
        assert got["avg"] and got["future"] and got["work_done"]
        assert got["max"] == [3.0] * 3
        assert got["bool"] == [True, True]
        assert got["coalesced"] == [[6.0] * 5, [12.0] * 3, [0.0, 6.0, 12.0, 18.0]]
        assert got["ag_coalesced"] == [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0],
                                       [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]]
        assert got["rs_coalesced"] == [[2.0 * r, 2.0 * r + 1], [3.0 * r, 3.0 * r + 1,
                                                                3.0 * r + 2]]
        d = res["delegated"]
        assert d["broadcast"] == [2.0] * 4
        assert d["all_to_all"] == [float(10 * s + r) for s in range(WORLD)]
        assert d["send_recv"] == [float(r - r % 2)] * 2
        assert d["objects"] == [{"rank": s} for s in range(WORLD)]


def test_calls_of_the_native_collective_start_on_the_callers_thread(ranks):
    for res in ranks:
        direct = res["direct"]
        assert all(direct["ok"]) and direct["chosen"] == ["native"], direct
        # the first call of each collective makes its plans on the worker; the others
        # (5 allreduces, 5 reduce-scatters, 5 all-gathers) start directly
        assert direct["direct"] == 15, direct


def test_ddp_fsdp2_and_hsdp_train_as_over_gloo(ranks):
    initial = torch.cat([p.detach().reshape(-1) for p in make_model().parameters()])
    reference = ranks[0]["training"]["ddp_gloo"]
    assert not torch.allclose(reference, initial, atol=1e-3), "training must move the weights"
    for r, res in enumerate(ranks):
        got = res["training"]
        for name in ("ddp", "fsdp", "fsdp_gloo", "hsdp"):
            assert torch.allclose(got[name], reference, rtol=1e-5, atol=1e-6), (r, name)
        assert got["ddp_planned_calls"] >= STEPS
        assert got["fsdp_planned"]["allgather"] > 0 and got["fsdp_planned"]["reduce_scatter"] > 0
        (rep, rep_cluster, _, rep_allreduces), (shard, shard_cluster, shard_rs, _) = \
            got["hsdp_groups"]
        assert rep == shard == "TopoplanProcessGroup"
        assert shard_cluster == f"ddl-two-switch[{2 * (r // 2)},{2 * (r // 2) + 1}]"
        assert rep_cluster == f"ddl-two-switch[{r % 2},{r % 2 + 2}]"
        assert shard_rs > 0 and rep_allreduces > 0
    for name in ("ddp", "fsdp", "hsdp"):
        assert all(torch.equal(res["training"][name], ranks[0]["training"][name])
                   for res in ranks), f"{name}: ranks differ"


# -- init errors: one message on every rank --------------------------------------------------
def _init_worker(rank: int, port: int, outdir: str, small: str) -> None:
    os.environ.pop("TOPOPLAN_CLUSTER", None)
    torch.set_num_threads(1)
    import topoplan.torch  # noqa: F401 - registers the backend
    from topoplan.torch import TopoplanOptions

    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0,
                          timeout=datetime.timedelta(seconds=30))
    attempts = {"missing": None, "wrong_size": small, "no_file": "/nonexistent/cluster.yaml",
                "rank2_missing": None if rank == 2 else str(CLUSTER), "good": str(CLUSTER)}
    seen = {}
    for name, path in attempts.items():
        if path is None:
            os.environ.pop("TOPOPLAN_CLUSTER", None)
        else:
            os.environ["TOPOPLAN_CLUSTER"] = path
        try:
            dist.init_process_group("topoplan", store=dist.PrefixStore(name, store), rank=rank,
                                    world_size=WORLD, timeout=datetime.timedelta(seconds=30))
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            seen[name] = (type(exc).__name__, str(exc))
            continue
        t = torch.ones(3)
        dist.all_reduce(t)
        seen[name] = t.tolist()
        dist.destroy_process_group()
    os.environ.pop("TOPOPLAN_CLUSTER", None)
    try:   # the cluster as an option, and a wrong option
        dist.init_process_group("topoplan", store=dist.PrefixStore("options", store), rank=rank,
                                world_size=WORLD, pg_options=TopoplanOptions(cluster=CLUSTER))
        seen["options"] = dist.group.WORLD.cluster.name
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001
        seen["options"] = (type(exc).__name__, str(exc))
    torch.save(seen, Path(outdir) / f"rank{rank}.pt")


def test_a_missing_or_wrong_cluster_is_one_clear_error_on_every_rank(tmp_path):
    small = tmp_path / "two.yaml"
    small.write_text(textwrap.dedent("""\
        name: two
        switches: [sw]
        boxes:
          - {name: "b{i}", count: 2, gpus: 1, nics: [{switch: sw, bandwidth: 1 GB/s, latency: 1 us}]}
        """))
    mp.start_processes(_init_worker, args=(free_port(), str(tmp_path), str(small)), nprocs=WORLD,
                       join=True, start_method=forkserver.START)
    seen = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    expect = {"missing": "the topoplan backend needs a cluster: set TOPOPLAN_CLUSTER",
              "wrong_size": "TOPOPLAN_CLUSTER: cluster 'two' has 2 ranks but the job has 4",
              "no_file": "TOPOPLAN_CLUSTER=/nonexistent/cluster.yaml: no such cluster file",
              "rank2_missing": "rank 2: the topoplan backend needs a cluster: set "
                               "TOPOPLAN_CLUSTER"}
    for name, text in expect.items():
        messages = {s[name] for s in seen}
        assert len(messages) == 1, f"{name}: ranks differ: {messages}"
        kind, message = messages.pop()
        assert kind == "TopoplanError" and text in message, (name, message)
        assert len(message.splitlines()) == 1
    for s in seen:
        assert s["good"] == [4.0] * 3
        assert s["options"] == "ddl-two-switch"


# -- a planned step whose peer died ----------------------------------------------------------
def _dying_worker(rank: int, port: int, outdir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from topoplan.torch import TopoplanOptions

    dist.init_process_group("topoplan", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=30),
                            pg_options=TopoplanOptions(cluster=CLUSTER, algorithm="ring",
                                                       timeout=3))
    t = torch.ones(1 << 16)
    dist.all_reduce(t)                                  # connected and planned
    dist.barrier()
    if rank == 3:
        os._exit(0)                                     # gone, as a crashed rank is
    try:
        dist.all_reduce(t)
        seen = None
    except Exception as exc:  # noqa: BLE001 - what the test looks at
        seen = (type(exc).__name__, isinstance(exc, dist.DistBackendError), str(exc))
    torch.save(seen, Path(outdir) / f"rank{rank}.pt")
    os._exit(0)                                         # the group is broken: no teardown


def test_a_failed_planned_step_is_a_dist_backend_error_naming_rank_step_and_peer(tmp_path):
    mp.start_processes(_dying_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD,
                       join=True, start_method=forkserver.START)
    for r in range(WORLD - 1):
        seen = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert seen is not None, f"rank {r}: the call after a peer died did not fail"
        kind, is_backend_error, message = seen
        assert is_backend_error, (r, kind, message)
        assert f"rank {r}" in message and "step" in message and "peer" in message, message


# -- under torchrun, started by topoplan launch ----------------------------------------------
TORCHRUN_JOB = """
import torch
import torch.distributed as dist
import topoplan.torch  # noqa: F401

dist.init_process_group("topoplan")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4)).sum().backward()
t = torch.full((5,), float(dist.get_rank() + 1))
dist.all_reduce(t)
pg = dist.group.WORLD
print(f"rank {dist.get_rank()}/{dist.get_world_size()} {dist.get_backend()} "
      f"{pg.cluster.name} sum {t.tolist()} planned {pg.allreduce_planned.stats.calls}")
dist.destroy_process_group()
"""


def test_a_job_under_torchrun_changes_two_lines(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(TORCHRUN_JOB)
    cluster = tmp_path / "two.yaml"
    cluster.write_text(textwrap.dedent("""\
        name: two
        switches: [sw]
        boxes:
          - {name: "b{i}", count: 2, gpus: 1, nics: [{switch: sw, bandwidth: 1 GB/s, latency: 1 us}]}
        """))
    env = {**os.environ, "TOPOPLAN_CLUSTER": str(cluster), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-m", "topoplan", "launch", "-n", "2", "--transport",
                           "torch", "--timeout", "120", "--", "python", str(job)],
                          env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        # torch 2.13's own exit: a rank that ran DDP over gloo sometimes aborts after its
        # last line, at interpreter exit (std::terminate on a joinable thread). Reproduced
        # with no topoplan in the job at all (init_process_group("gloo"), DDP, one
        # backward, destroy_process_group: 4 of 20 runs on this 2-core machine under load;
        # 0 of 20 without DDP). Anything else is this test's failure.
        assert "terminate called without an active exception" in done.stderr, \
            done.stderr[-3000:]
        assert "was killed by SIGABRT" in done.stderr, done.stderr[-3000:]
    for rank in range(2):
        assert (f"rank {rank}/2 topoplan two sum [3.0, 3.0, 3.0, 3.0, 3.0] planned"
                in done.stdout), done.stdout
