"""The executor over torch.distributed (gloo) in real processes.

One launch of 3 processes runs every case of tests/support/transport_cases.py, then one
rank exits mid-allreduce and the others must raise TransportError in time.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tests.support import forkserver, transport_cases  # noqa: E402
from topoplan.errors import TopoplanError, TransportError  # noqa: E402
from topoplan.runtime.transports import Torch  # noqa: E402

TIMEOUT = 3.0

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def _planner_names() -> list[str]:
    try:
        from topoplan.planners import PLANNERS
    except ImportError:
        return []
    return sorted(PLANNERS)


def test_gloo_cases_and_killed_peer(tmp_path, monkeypatch) -> None:
    nranks, victim = 3, 1
    transport_cases.save_planner_schedules(nranks, str(tmp_path))
    monkeypatch.setenv("TOPOPLAN_TEST_PLANS", str(tmp_path))
    results = Torch.launch(nranks, transport_cases.torch_rank_main, victim, TIMEOUT,
                           backend="gloo", timeout=200, return_exceptions=True,
                           start_method=forkserver.START)
    assert isinstance(results[victim], TransportError)
    assert f"rank {victim} exited with code 9" in str(results[victim])
    for rank in (0, 2):
        record = results[rank]
        assert isinstance(record, dict), f"rank {rank} raised {record!r}"
        assert record["transport"] == "torch/gloo"
        assert record["failures"] == [], "\n".join(record["failures"])
        assert record["ncases"] > 40
        for name in _planner_names():
            assert any(s.startswith(f"{name}@") for s in record["schedules"])
        kill = record["kill"]
        assert kill["type"] == "TransportError", kill
        assert kill["rank"] == rank and None not in (kill["step"], kill["peer"], kill["chunk"])
        assert f"peer {kill['peer']}" in kill["error"] and f"chunk {kill['chunk']}" in kill["error"]
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


def test_gloo_native_steps_and_a_killed_member() -> None:
    """tests/support/native_cases.py over gloo process groups made with new_group (every
    kind, composed schedules, unequal parts through the padded paths, fp16 and bfloat16
    tensors, calls in flight), then a member exits at its first native step."""
    from tests.support import native_cases

    nranks, victim = 4, 3
    results = Torch.launch(nranks, native_cases.torch_rank_main, victim, TIMEOUT,
                           backend="gloo", timeout=240, return_exceptions=True,
                           start_method=forkserver.START)
    assert isinstance(results[victim], TransportError)
    for rank in range(victim):
        record = results[rank]
        assert isinstance(record, dict), f"rank {rank} raised {record!r}"
        assert record["failures"] == [], "\n".join(record["failures"])
        assert record["ncases"] > 100
        kill = record["kill"]
        assert kill["type"] == "TransportError" and kill["rank"] == rank, kill
        assert kill["error"].startswith(f"rank {rank} step 0: native reduce_scatter over "
                                        "{0, 1, 2, 3}"), kill
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


def _old_gloo_rank(t: Torch) -> list[str]:
    """Native steps as an older PyTorch runs them: new_group without sort_ranks (so a
    group out of rank order is sorted, and parts go through the padded copies), a gloo
    without reduce-scatter (all_reduce of a copy) and without all_gather_into_tensor
    (the list form). Returns the failures."""
    import numpy as np

    from tests.support import native_schedules as N
    from topoplan.runtime.executor import AllGather, Allreduce, ReduceScatter

    real_new_group = dist.new_group

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False):
        return real_new_group(ranks, timeout, backend, pg_options, use_local_synchronization)

    def unsupported(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support this collective")

    names = ("new_group", "reduce_scatter_single", "reduce_scatter_tensor", "all_gather_single",
             "all_gather_into_tensor")
    saved = {name: getattr(dist, name, None) for name in names}
    dist.new_group = new_group
    for name in names[1:]:
        if saved[name] is not None:
            setattr(dist, name, unsupported)
    failures = []
    n, rank = t.size, t.rank
    try:
        reversed_order = list(reversed(range(n)))
        for schedule in (N.scatter_then_gather(n, order=reversed_order),
                         N.scatter_then_gather(n, order=reversed_order, chunks=(0.2, 0.5, 0.3))):
            x = np.arange(1003.0) + rank
            Allreduce(schedule, t, timeout=30)(x)
            if not np.array_equal(x, np.arange(1003.0) * n + sum(range(n))):
                failures.append(f"rank {rank}: {schedule.algorithm}: wrong sum")
        groups = t._groups()
        sorted_group = groups[tuple(reversed_order)]
        if sorted_group.in_order:
            failures.append("the emulated old new_group kept the group's order")
        x = np.arange(3.0 * n) + rank
        out = np.zeros(3)
        ReduceScatter(N.native_reduce_scatter(n), t, timeout=30)(x, out)
        want = (np.arange(3.0 * n) * n + sum(range(n)))[3 * rank:3 * rank + 3]
        if not np.array_equal(out, want):
            failures.append(f"rank {rank}: reduce-scatter without reduce_scatter: {out}")
        gathered = np.zeros(3 * n)
        AllGather(N.native_allgather(n), t, timeout=30)(np.full(3, float(rank)), gathered)
        if not np.array_equal(gathered, np.repeat(np.arange(float(n)), 3)):
            failures.append(f"rank {rank}: allgather without all_gather_into_tensor: {gathered}")
        if not (t._lacks.get("reduce_scatter") or saved["reduce_scatter_tensor"] is None):
            failures.append("the missing reduce-scatter went unnoticed")
    finally:
        for name, fn in saved.items():
            if fn is not None:
                setattr(dist, name, fn)
    return failures


def test_gloo_native_steps_as_an_older_pytorch_runs_them() -> None:
    assert Torch.launch(3, _old_gloo_rank, backend="gloo", timeout=200,
                        start_method=forkserver.START) == [[], [], []]


def test_torch_transport_needs_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with pytest.raises(TopoplanError, match="init_process_group"):
        Torch()


def test_bench_cli_over_gloo(tmp_path) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("mpi4py")  # bench launches its ranks with mpiexec
    from tests.support import schedules as S
    plan = tmp_path / "ring2.json"
    S.ring(2).save(plan)
    proc = subprocess.run([sys.executable, "-m", "topoplan", "bench", "--plan", str(plan),
                           "--transport", "torch", "--baseline", "native", "--sizes", "1KiB,64KiB",
                           "--iters", "2", "--dtype", "bfloat16", "--json"],
                          capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["transport"] == "torch/gloo" and record["native"] == "dist.all_reduce"
    for row in record["rows"]:
        assert row["type"] == "bfloat16" and row["wrong"] == 0 and row["native_wrong"] == 0


def _rsag_rank(t: Torch) -> dict:
    """run_bench of a reduce-scatter and an allgather against gloo's own, then with
    reduce_scatter as an older gloo has it: unsupported, reported, not fatal."""
    from topoplan.runtime.bench import run_bench
    from topoplan.cluster import flat_cluster
    from topoplan.planners import plan
    out: dict = {}
    for collective in ("reduce_scatter", "allgather"):
        schedule = plan(flat_cluster(t.size), "ring", size=1 << 20, collective=collective)
        out[collective] = (run_bench(schedule, t, [1200, 48000], baseline=True, iters=2,
                                     use_torch=True), t.native_name_of(collective))
    name = t.native_name_of("reduce_scatter").removeprefix("dist.")

    def unsupported(*args, **kwargs):
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter")

    real = getattr(dist, name)
    setattr(dist, name, unsupported)
    try:
        schedule = plan(flat_cluster(t.size), "rhd", size=1 << 20, collective="reduce_scatter")
        out["old-gloo"] = (run_bench(schedule, t, [1200], baseline=True, iters=1), None)
    finally:
        setattr(dist, name, real)
    return out


def test_reduce_scatter_and_allgather_bench_against_gloo() -> None:
    # Torch.launch's default start method (spawn: fresh interpreters, as users get).
    results = Torch.launch(2, _rsag_rank, backend="gloo", timeout=200)
    assert results[0] == results[1]
    for collective in ("reduce_scatter", "allgather"):
        rows, native = results[0][collective]
        assert native in {"reduce_scatter": ("dist.reduce_scatter_single",
                                             "dist.reduce_scatter_tensor"),
                          "allgather": ("dist.all_gather_single",
                                        "dist.all_gather_into_tensor")}[collective]
        for row in rows:
            assert row.collective == collective and row.wrong == 0, row
            if row.native_note is None:
                assert row.native_wrong == 0 and row.ratio > 0
            else:  # a PyTorch whose gloo has no reduce-scatter: said, not crashed
                assert collective == "reduce_scatter" and "reduce_scatter" in row.native_note
    (row,), _ = results[0]["old-gloo"]
    assert row.wrong == 0 and row.native_time_us is None
    assert row.native_note.endswith("on gloo: ProcessGroupGloo does not support reduce_scatter")
