"""auto's measured choice (topoplan.runtime.choice): ranks agree, failures are dropped,
results stay exact, drift re-probes, the off switch, and ``bench --algorithm auto``'s
report; on real MPI processes (tests/mpi_choice.py), gloo ranks and in-process threads.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from topoplan.cluster import load_cluster
from topoplan.errors import TopoplanError
from topoplan.runtime.choice import (NATIVE, MeasuredChoice, Option, auto_mode, class_range,
                                     explore_budget, model_options, priced_elsewhere,
                                     size_class, snapshot, TIE)
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.transports.local import Local

ROOT = Path(__file__).resolve().parents[1]
CROSSED = load_cluster(ROOT / "topologies" / "targets" / "ddl_two_switch_crossed.yaml")


def _records(proc, tag="TOPOPLAN-CHOICE "):
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith(tag):
            record = json.loads(line.removeprefix(tag))
            out[record["rank"]] = record
    return out


def _mpi(case: str, nranks: int = 4):
    from topoplan.runtime.mpirun import mpiexec
    proc = mpiexec(nranks, [sys.executable, str(ROOT / "tests" / "mpi_choice.py"), case],
                   timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = _records(proc)
    assert sorted(records) == list(range(nranks)), proc.stdout + proc.stderr
    return records, proc


# ---- pure --------------------------------------------------------------------------------

def test_size_classes_are_powers_of_two() -> None:
    assert [size_class(n) for n in (1, 2, 3, 4, 5, 1 << 20, (1 << 20) + 1)] == \
        [0, 1, 2, 2, 3, 20, 21]
    assert class_range(20) == "(512KiB, 1MiB]"
    assert explore_budget() == 36 and explore_budget(top=1, probes=2, max_probes=2) == 6


def test_the_off_switch_reads_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("TOPOPLAN_AUTO", raising=False)
    assert auto_mode() == "measured"
    monkeypatch.setenv("TOPOPLAN_AUTO", "model")
    assert auto_mode() == "model" and auto_mode("measured") == "measured"
    monkeypatch.setenv("TOPOPLAN_AUTO", "fastest")
    with pytest.raises(TopoplanError, match="TOPOPLAN_AUTO='fastest': use 'measured'"):
        auto_mode()


def test_model_options_are_verified_plans_and_the_native_collective() -> None:
    options, model_choice = model_options(CROSSED, 1 << 20, profile="mpi", machine=CROSSED)
    names = [o.algorithm for o in options]
    assert NATIVE in names and len(names) == 4 and len(set(names)) == 4
    assert model_choice in names
    predicted = [o.predicted_s for o in options]
    assert predicted == sorted(predicted) and all(p > 0 for p in predicted)
    native = options[names.index(NATIVE)]
    assert native.schedule.nsteps == 1 and native.schedule.nnative == CROSSED.nranks


def test_a_plan_priced_for_another_runtime_is_named() -> None:
    import topoplan
    schedule = topoplan.plan(CROSSED, algorithm="ring", size=1 << 20, profile="nccl")
    assert priced_elsewhere(schedule, "mpi") == (
        "plan priced for nccl, running on mpi: re-plan with --profile mpi or calibrate")
    assert priced_elsewhere(schedule, "torch").startswith("plan priced for nccl, running on gloo")
    assert priced_elsewhere(schedule, "nccl") is None
    mine = topoplan.plan(CROSSED, algorithm="ring", size=1 << 20, profile="mpi")
    assert priced_elsewhere(mine, "mpi") is None


# ---- in-process threads -----------------------------------------------------------------

def _options(n: int):
    return model_options(CROSSED, n, profile="mpi", machine=CROSSED, top=2)


def test_model_mode_runs_the_models_choice_and_times_nothing() -> None:
    def job(t):
        options, model_choice = _options(1 << 16)
        choice = MeasuredChoice(t, lambda n: (options, model_choice),
                                lambda s: Allreduce(s, t), mode="model")
        for _ in range(3):
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            choice.call(1 << 16, x)
            assert (x == 10).all()
        d = next(iter(choice.decisions.values()))
        return d.chosen, d.model_choice, d.reason, d.calls, [o.samples for o in options]

    for chosen, model_choice, reason, calls, samples in Local.launch(4, job):
        assert chosen == model_choice and reason == "model" and calls == 0
        assert samples == [[], [], []]


def test_drift_starts_a_new_exploration_and_a_slow_candidate_is_pruned() -> None:
    """Once chosen, a candidate that turns 3x slower is measured again against the
    others (the drift check), and the decision follows; a candidate over PRUNE x the
    fastest after one round is dropped."""
    def job(t):
        options, model_choice = _options(1 << 16)
        slow = {"after": None}
        by_id = {id(o.schedule): o.algorithm for o in options}

        def executor(schedule):
            run = Allreduce(schedule, t)
            name = by_id[id(schedule)]

            def call(*args):
                # slowdowns relative to the call's own time, so that a loaded machine
                # (CI: 2 cores, two test workers, 4 threads) cannot hide them
                start = time.perf_counter()
                out = run(*args)
                took = time.perf_counter() - start
                if name == options[-1].algorithm:
                    time.sleep(3 * took + 0.03)   # always slow: pruned after round 1
                elif slow["after"] is not None and name == slow["after"]:
                    time.sleep(2 * took + 0.01)   # the chosen one turns 3x slower
                return out
            return call

        choice = MeasuredChoice(t, lambda n: (options, model_choice), executor,
                                snapshot=snapshot, recheck_every=4, sample_every=1)
        for _ in range(48):
            if slow["after"] is None:
                slow["after"] = choice.chosen(1 << 16)   # slow from the first call chosen
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            choice.call(1 << 16, x)
            assert (x == 10).all()
        return [(d.chosen, d.reason, d.calls,
                 [c["note"] for c in d.candidates]) for d in choice.history], slow["after"]

    results = Local.launch(4, job)
    assert all(r == results[0] for r in results)   # every rank saw the same decisions
    history, slowed = results[0]
    assert history[0][1] == "measured" and history[0][2] <= explore_budget(top=2)
    assert any("dropped after one round" in (note or "") for note in history[0][3])
    assert len(history) >= 2 and history[1][1] == "drift"
    assert history[1][0] != slowed


def _clocked(t, costs):
    """A MeasuredChoice over threads whose clock moves by each candidate's cost (seconds
    by algorithm) per call, not by the machine's load: its decisions are exact."""
    options, model_choice = _options(1 << 16)
    now = [0.0]
    by_id = {id(o.schedule): o.algorithm for o in options}

    def executor(schedule):
        run = Allreduce(schedule, t)
        name = by_id[id(schedule)]

        def call(*args):
            out = run(*args)
            now[0] += costs.get(name, 1.0)
            return out
        return call

    choice = MeasuredChoice(t, lambda n: (options, model_choice), executor,
                            snapshot=snapshot, clock=lambda: now[0], recheck_every=4,
                            sample_every=2)
    return choice, [o.algorithm for o in options]


@pytest.mark.parametrize("native_cost, wins", [(1.02, True), (1.05, False)])
def test_the_native_collective_wins_a_tie(native_cost, wins) -> None:
    """Within TIE (3%) of the fastest plan, the native collective is chosen (as fast,
    and the cheapest for the host); 5% slower, the plan is."""
    def job(t):
        names = [o.algorithm for o in _options(1 << 16)[0]]
        plan = next(n for n in names if n != NATIVE)
        choice, _ = _clocked(t, {NATIVE: native_cost, plan: 1.0,
                                 **{n: 2.5 for n in names if n not in (NATIVE, plan)}})
        while choice.exploring(1 << 16):
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            choice.call(1 << 16, x)
            assert (x == 10).all()
        return choice.chosen(1 << 16), plan

    for chosen, plan in Local.launch(4, job):
        assert chosen == (NATIVE if wins else plan)


def test_a_claimed_call_runs_the_native_collective_and_counts_alike() -> None:
    """Once native is chosen, the calls that are neither timed nor checked are claimed
    (the caller runs the library's allreduce itself), on every rank the same calls; the
    timed ones still run through the choice; every result is exact."""
    def job(t):
        names = [o.algorithm for o in _options(1 << 16)[0]]
        choice, _ = _clocked(t, {n: (1.0 if n == NATIVE else 2.5) for n in names})
        claimed = []
        for i in range(40):
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            if choice.claim_native(1 << 16):
                claimed.append(i)
                t.native_allreduce(x)
            else:
                choice.call(1 << 16, x)
            assert (x == 10).all()
        return choice.chosen(1 << 16), claimed, choice.calls

    results = Local.launch(4, job)
    chosen, claimed, calls = results[0]
    assert chosen == NATIVE and calls == 40
    assert all(r == results[0] for r in results)
    # after the first recheck_every (4) timed calls, every second call is timed
    assert len(claimed) >= 8 and all(b - a <= 2 for a, b in zip(claimed, claimed[1:]))


def test_after_the_decision_the_first_16_calls_are_timed_then_one_in_64() -> None:
    """A job's calls of a class that chose native can run bare after the first
    FIRST_TIMED (16) calls of the decision, all but one in CLAIM_EVERY (64): a training
    loop stops paying for timing within a few dozen steps."""
    from topoplan.runtime.choice import CLAIM_EVERY, FIRST_TIMED

    def job(t):
        options, model_choice = _options(1 << 16)
        by_id = {id(o.schedule): o.algorithm for o in options}
        now = [0.0]

        def executor(schedule):
            run = Allreduce(schedule, t)

            def call(*args):
                out = run(*args)
                now[0] += 1.0 if by_id[id(schedule)] == NATIVE else 2.5
                return out
            return call

        choice = MeasuredChoice(t, lambda n: (options, model_choice), executor,
                                snapshot=snapshot, clock=lambda: now[0])
        claimed, after = [], 0
        while after < 80:
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            if choice.claim_native(1 << 16):
                claimed.append(choice._classes[size_class(1 << 16)].since)
                t.native_allreduce(x)
            else:
                choice.call(1 << 16, x)
            assert (x == 10).all()
            after += not choice.exploring(1 << 16)
        return choice.chosen(1 << 16), claimed

    results = Local.launch(4, job, timeout=120)
    assert all(r == results[0] for r in results)
    chosen, claimed = results[0]
    assert chosen == NATIVE
    # the calls claimed (run bare) are those after the first 16 that are not the 8th
    assert claimed[0] == FIRST_TIMED + 1
    assert claimed == [k for k in range(FIRST_TIMED + 1, claimed[-1] + 1)
                       if k % CLAIM_EVERY != 0]
    assert len(claimed) >= 50


@pytest.mark.parametrize("alone_cost, measured_again", [(1.0, False), (2.0, True)])
def test_a_check_runs_one_call_alone_before_it_measures_again(alone_cost, measured_again
                                                              ) -> None:
    """After the decision (native), the job's calls take twice as long: compute
    overlapping them, or a busier host. Link health's check then runs the next call
    alone, after a barrier, as the candidates were measured. At its measured time
    alone, the job is slower and not the network: the slower time becomes the
    reference, with no fit and nothing measured again. Slower alone too, the candidates
    are measured again (their steps then fitted together)."""
    from topoplan.analysis.cost import get_profile
    from topoplan.runtime.health import LinkHealth

    def job(t):
        options, model_choice = _options(1 << 16)
        by_id = {id(o.schedule): o.algorithm for o in options}
        now, slow, alone = [0.0], [False], [False]

        def executor(schedule):
            run = Allreduce(schedule, t)

            def call(*args):
                out = run(*args)
                cost = 1.0 if by_id[id(schedule)] == NATIVE else 2.5
                now[0] += cost * (alone_cost if alone[0] else 2.0) if slow[0] else cost
                return out
            return call

        choice = MeasuredChoice(t, lambda n, slow=None: (options, model_choice), executor,
                                snapshot=snapshot, clock=lambda: now[0],
                                health=LinkHealth(CROSSED, get_profile("mpi")))
        attempt = choice._attempt

        def timed_alone(*args):
            alone[0] = True
            try:
                return attempt(*args)
            finally:
                alone[0] = False
        choice._attempt = timed_alone

        def call():          # blocking calls, as an MPI trainer's: every one timed
            x = np.full(1 << 14, 1.0 + t.rank, dtype=np.float32)
            choice.call(1 << 16, x)
            assert (x == 10).all()

        while choice.exploring(1 << 16):
            call()
        for _ in range(24):          # the first checks set the reference
            call()
        decisions = len(choice.history)
        slow[0] = True
        for _ in range(60):
            call()
        state = choice._classes[size_class(1 << 16)]
        return (choice.chosen(1 << 16), len(choice.history) - decisions,
                choice.health.fits, state.health_reference)

    results = Local.launch(4, job, timeout=120)
    assert all(r == results[0] for r in results)
    chosen, again, fits, reference = results[0]
    if measured_again:
        assert again >= 1, results[0]
    else:
        assert (chosen, again, fits) == (NATIVE, 0, 0), results[0]
        assert reference == pytest.approx(2.0), results[0]   # the job's time, rebased


# ---- real MPI processes --------------------------------------------------------------------

@pytest.mark.mpi
def test_every_rank_picks_the_same_though_their_clocks_disagree() -> None:
    records, _ = _mpi("agree")
    assert {r["chosen"] for r in records.values()} == {"native"}
    # alone, ranks 0 and 1 would have kept the other candidate
    assert {records[r]["own_pick"] for r in (0, 1)} == {records[0]["first"]}
    assert len({json.dumps(r["measured"], sort_keys=True) for r in records.values()}) == 1


@pytest.mark.mpi
def test_a_failing_candidate_is_dropped_and_every_result_is_exact() -> None:
    records, proc = _mpi("fail")
    for r in records.values():
        assert r["wrong"] == 0, r
        assert r["chosen"] not in (r["timed_out"], r["broken"]), r
        # a rank whose part of the plan ends within the 10 us deadline (a tree plan's
        # leaves wait little) learns of the timeout from the others
        assert ("timed out" in r["notes"][r["timed_out"]]
                or r["notes"][r["timed_out"]] == "failed on another rank"), r
        assert r["notes"][r["broken"]] in ("failed to build on another rank",
                                           "failed to build: injected: this rank cannot "
                                           "build it"), r
    assert any("timed out" in r["notes"][r["timed_out"]] for r in records.values()), records
    assert "dropped" in proc.stderr


@pytest.mark.mpi
def test_exploring_results_are_bit_identical_across_ranks() -> None:
    records, _ = _mpi("exact")
    for r in records.values():
        assert r["calls"] == 80 and r["mismatched"] == 0, r
        assert r["max_error"] < 1e-4, r
        # each size class decided (40 calls a size: a drift may re-explore one again)
        assert len({d["size_class"] for d in r["decisions"]}) == 2
        assert all(d["exploration_calls"] > 0 for d in r["decisions"])


@pytest.mark.mpi
def test_a_plan_priced_for_nccl_warns_once_on_rank_0_over_mpi() -> None:
    records, _ = _mpi("warn")
    assert records[0]["warnings"] == [
        "plan priced for nccl, running on mpi: re-plan with --profile mpi or calibrate"]
    assert all(records[r]["warnings"] == [] for r in (1, 2, 3))


# ---- the command --------------------------------------------------------------------------

def _bench(*args: str, env: dict | None = None):
    import subprocess
    return subprocess.run([sys.executable, "-m", "topoplan", "bench", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.mpi
def test_bench_auto_reports_every_candidate_measured_and_predicted() -> None:
    proc = _bench("--algorithm", "auto", "--cluster",
                  str(ROOT / "topologies" / "targets" / "ddl_two_switch_crossed.yaml"),
                  "--sizes", "64KiB,1MiB", "--iters", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["size"] for r in rows] == [65536, 1048576]
    for row in rows:
        assert row["wrong"] == 0
        names = [c["algorithm"] for c in row["candidates"]]
        assert "native" in names and row["chosen"] in names
        assert 0 < row["exploration_calls"] <= explore_budget()
        for c in row["candidates"]:
            assert c["predicted_us"] > 0 and set(c) >= {"measured_us", "spread", "note"}
        measured = {c["algorithm"]: c["measured_us"] for c in row["candidates"]
                    if c["measured_us"] is not None and c["note"] is None}
        # the fastest, or the native collective within TIE of it (as good, cheaper)
        fastest = min(measured, key=measured.get)
        assert row["chosen"] == fastest or (
            row["chosen"] == NATIVE and measured[NATIVE] <= (1 + TIE) * measured[fastest]), row
        assert row["contradicted"] == (row["chosen"] != row["model_choice"])
        assert row["predicted_us"] == next(c["predicted_us"] for c in row["candidates"]
                                           if c["algorithm"] == row["chosen"])


@pytest.mark.mpi
def test_bench_auto_off_switch_and_table() -> None:
    cluster = str(ROOT / "topologies" / "targets" / "ddl_two_switch_crossed.yaml")
    proc = _bench("--algorithm", "auto", "--cluster", cluster, "--sizes", "64KiB",
                  "--iters", "2", "--json", env={"TOPOPLAN_AUTO": "model"})
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)["rows"]
    assert row["chosen"] == row["model_choice"] and row["exploration_calls"] == 0
    assert all(c["measured_us"] is None for c in row["candidates"])
    proc = _bench("--algorithm", "auto", "--cluster", cluster, "--sizes", "64KiB,256KiB",
                  "--iters", "2", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    head = [line for line in proc.stdout.splitlines() if line.startswith("#  ")
            or "chosen" in line]
    assert any("chosen" in line and "pred(us)" in line for line in head), proc.stdout
    assert "# auto: each size times the model's best candidates" in proc.stdout
    for line in proc.stdout.splitlines():
        if line.startswith("# * "):
            assert "the run contradicted the model: it chose" in line


# ---- gloo processes ----------------------------------------------------------------------

# past explore_budget() (36): a class racing close candidates on a loaded machine still
# decides
CALLS = 40


def _gloo_sharded(t) -> dict:
    """PlannedCollectives(auto) over gloo: reduce-scatters and allgathers (blocking and
    async) of random floats through exploration; every output exact, the decisions
    agreed."""
    import hashlib

    import torch
    import torch.distributed as dist

    from topoplan.torch import PlannedCollectives
    world, rank = t.size, t.rank
    planned = PlannedCollectives(CROSSED, algorithm="auto", profile="gloo")
    mismatched, wrong = 0, 0
    for call in range(CALLS):
        g = torch.Generator().manual_seed(call)
        full = [torch.randn(world * 2048, generator=g) for _ in range(world)]  # every rank's
        out = torch.empty(2048)
        work = planned.reduce_scatter_tensor(out, full[rank].clone(), async_op=call % 2 == 1)
        if work is not None:
            work.wait()
        want = sum(full).view(world, -1)[rank]
        wrong += int((out - want).abs().max() > 1e-4)
        gathered = torch.empty(world * 2048)
        planned.all_gather_into_tensor(gathered, out)
        digests = [None] * world
        dist.all_gather_object(digests, hashlib.sha1(gathered.numpy().tobytes()).hexdigest())
        mismatched += len(set(digests)) > 1
    return {"wrong": wrong, "mismatched": mismatched, "chosen": dict(planned.chosen),
            "decisions": {c: [d.chosen for d in choice.history]
                          for (_, c, _), choice in planned.choices.items()}}


def test_sharded_collectives_measure_over_gloo() -> None:
    from tests.support import forkserver
    from topoplan.runtime.transports import Torch
    results = Torch.launch(4, _gloo_sharded, backend="gloo", timeout=240,
                           start_method=forkserver.START)
    assert all(r == results[0] for r in results)
    r = results[0]
    assert r["wrong"] == 0 and r["mismatched"] == 0, r
    assert set(r["decisions"]) == {"reduce_scatter", "allgather"}
    assert all(len(v) >= 1 for v in r["decisions"].values()), r
    assert all(v != "exploring" for v in r["chosen"].values()), r


@pytest.mark.mpi
def test_bench_says_once_when_a_plan_file_was_priced_for_another_runtime(tmp_path) -> None:
    import subprocess
    plan = tmp_path / "plan.json"
    subprocess.run([sys.executable, "-m", "topoplan", "plan",
                    str(ROOT / "topologies" / "ddl_two_switch.yaml"), "-a", "ring", "-s", "1MiB",
                    "-o", str(plan)], check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    proc = _bench("--plan", str(plan), "--sizes", "4KiB", "--iters", "1")
    assert proc.returncode == 0, proc.stderr
    line = ("topoplan: warning: plan priced for nccl, running on mpi: re-plan with --profile "
            "mpi or calibrate")
    assert proc.stderr.count(line) == 1, proc.stderr
