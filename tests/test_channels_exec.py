"""The executor runs a channelled schedule (IR v4) with its channels at once: on thread
ranks (Local), real MPI processes (mpiexec) and torch.distributed gloo processes.

The cases themselves are in tests/support/channel_cases.py: two rings in opposite
directions, one per channel (allreduce, reduce-scatter, allgather, to the end and in
flight), a native step on channel 0 beside a ring on channel 1, and two schedules that
only end when each rank's channels move on their own.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import channel_cases as C
from tests.support import forkserver
from topoplan.errors import TransportError
from topoplan.ir.schedule import build_schedule, equal_chunks, recv, send
from topoplan.runtime.executor import Allreduce
from topoplan.runtime.executor.compiler import channel_tags, compile_program, pair_span
from topoplan.runtime.transports import Local

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 2.0  # a step's timeout where a run is meant to fail


# -- compiling -------------------------------------------------------------------------
def test_tags_count_per_peer_and_channel_and_channels_never_share_one() -> None:
    schedule = C.two_rings(2)  # both rings run over the pairs 0 -> 1 and 1 -> 0
    # Each ring sends 2 messages a pair: channel 0 tags 0..1, channel 1 tags 2..3.
    assert channel_tags(schedule) == {0: (0, 2), 1: (2, 2)}
    assert pair_span(schedule) == 4
    for rank in range(2):
        program = compile_program(schedule, rank, 1000)
        assert [c for c, _, _ in program.channels] == [0, 1]
        for channel, first, end in program.channels:
            steps = program.steps[first:end]
            assert all(step.channel == channel for step in steps)
            sent = [m.tag for step in steps for m in step.messages if m.send]
            got = [m.tag for step in steps for m in step.messages if not m.send]
            assert sent == got == [2 * channel, 2 * channel + 1]  # in order, per channel
    # Without channels, tags and spans are what they always were.
    from tests.support import schedules as S
    ring = S.ring(4)
    assert channel_tags(ring) == {0: (0, pair_span(ring))}
    assert [c for c, _, _ in compile_program(ring, 1, 1000).channels] == [0]


def test_each_channel_reduces_in_scratch_of_its_own() -> None:
    program = compile_program(C.two_rings(3), 0, 600)  # 6 chunks of about 100 elements
    slots = {}
    for channel, first, end in program.channels:
        slots[channel] = {s for step in program.steps[first:end] for _, s in step.reduces}
    assert slots[0] and slots[1]
    ends0 = max(b for _, b in slots[0])
    assert all(a >= ends0 for a, _ in slots[1])  # channel 1's slots after channel 0's
    assert program.scratch == max(b for _, b in slots[1]) <= 202


# -- thread ranks --------------------------------------------------------------------------
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_every_channel_case_on_thread_ranks(nranks: int) -> None:
    go = threading.Event()

    def rank_fn(t: Local) -> tuple[list[str], int, str]:
        return C.channel_cases(t, let_go=go.set, wait_to_go=lambda: go.wait(30), timeout=10)

    for failures, ncases, mode in Local.launch(nranks, rank_fn, timeout=60):
        assert failures == [], "\n".join(failures)
        assert ncases > 30 and mode == "poll"


class _Untagged(Local):
    """A thread rank that says it pairs messages by post order, as NCCL does (it still
    matches by tag: whatever runs on it is run as on NCCL, and checked as on Local)."""

    tagged = False


def test_an_untagged_transport_runs_channels_one_after_another() -> None:
    """The NCCL way (which cannot run here: no GPU): every rank runs channel 0's whole
    program, then channel 1's. The two rings and the lock-step trap still end with the
    sums; the hand-off, which needs channel 1 to move while channel 0 waits, times out."""
    from topoplan.runtime.transports.local import LocalWorld
    world = LocalWorld(3)
    go = threading.Event()

    def rank_fn(t: _Untagged) -> Any:
        rank = t.rank
        out: dict[str, Any] = {}
        run = Allreduce(C.two_rings(3), t, timeout=10)
        x = C._ints(1001, rank)
        run(x)
        out["mode"] = run._channel_mode
        out["rings"] = bool(np.array_equal(x, C._sum(1001, 3)))
        x = C._ints(100, rank)
        Allreduce(C.lockstep_trap(3), t, timeout=10, verified=True)(x)  # ranks 0 and 1
        out["trap"] = bool(np.array_equal(x, C._sum(100, 2) if rank < 2 else C._ints(100, rank)))
        if rank == 2:
            go.wait(3 * TIMEOUT)
        try:
            Allreduce(C.handoff(3), t, timeout=TIMEOUT, verified=True)(C._ints(100, rank))
            out["handoff"] = None
        except TransportError as exc:
            out["handoff"] = str(exc)
        if rank == 0:
            go.set()  # only now: rank 0 waited in channel 0 for good
        return out

    from topoplan.runtime.transports.launch import run_threads
    results = run_threads(3, rank_fn, lambda rank: _Untagged(world, rank), leave=world.leave,
                          name="untagged")
    for rank, out in enumerate(results):
        assert out["mode"] == "serial" and out["rings"] and out["trap"], (rank, out)
    # Rank 0 waits in channel 0 for rank 2 (let go here only once rank 0 gave up), and
    # rank 1 for rank 0's channel 1 (until it times out or rank 0 has left): both fail,
    # naming the channel they wait in.
    assert "channel 0 step 0: recv of chunk 0 from peer 2 timed out" in results[0]["handoff"]
    assert "channel 1 step 1: recv of chunk 1 from peer 0 " in results[1]["handoff"]


def test_channels_whose_tags_would_wrap_run_one_after_another() -> None:
    """16385 messages a pair on each of two channels: the call's tags (32770) do not fit
    below TAG_LIMIT, so the channels' tags would meet; the channels then run one after
    another (every rank posts all of channel 0's messages first, and messages of one tag
    pair in order), and still sum right."""
    from topoplan.runtime.transports.base import TAG_LIMIT
    k = TAG_LIMIT // 2 + 1
    schedule = build_schedule(
        2, equal_chunks(2),
        [[[send(1, 0, channel=0), recv(1, 1, True, channel=1)] for _ in range(k)],
         [[recv(0, 0, True, channel=0), send(0, 1, channel=1)] for _ in range(k)]])
    assert pair_span(schedule) == 2 * k > TAG_LIMIT

    def rank_fn(t: Local) -> Any:
        run = Allreduce(schedule, t, timeout=30, verified=True)  # adds k times: as it is
        x = np.full(4, t.rank + 1.0)
        run(x)
        return run._channel_mode, x.tolist()

    assert Local.launch(2, rank_fn) == [("serial", [1.0, 1.0, 1.0 + 2 * k, 1.0 + 2 * k]),
                                        ("serial", [2.0 + k, 2.0 + k, 2.0, 2.0])]


def test_a_rank_that_never_comes_times_out_naming_the_channel() -> None:
    def rank_fn(t: Local) -> Any:
        if t.rank == 2:
            t.world.barrier(t.rank, 30)  # comes only after the others gave up
            return None
        try:
            Allreduce(C.two_rings(3), t, timeout=TIMEOUT)(np.ones(300))
        except TransportError as exc:
            t.world.barrier(t.rank, 30)
            return exc
        raise AssertionError("no error")

    errors = Local.launch(3, rank_fn, timeout=60)
    # Rank 0's channel 0 waits for rank 2 at once (ring 0 -> 1 -> 2: its predecessor).
    e0 = errors[0]
    assert str(e0).startswith("rank 0: local two-rings allreduce, channel 0 step 0: recv of "
                              "chunk 2 from peer 2 timed out after 2 s"), str(e0)
    assert (e0.rank, e0.step, e0.peer, e0.chunk, e0.channel) == (0, 0, 2, 2, 0)
    # Rank 1's channel 1 (the ring 2 -> 1 -> 0) waits for rank 2 from its first step;
    # its channel 0 a little later (for rank 0's, stuck): either may be first out.
    e1 = str(errors[1])
    assert e1.startswith("rank 1: local two-rings allreduce, channel "), e1
    assert ("channel 1 step 1: recv of chunk 1 from peer 2" in e1
            or "channel 0 step 1: recv of chunk 2 from peer 0" in e1), e1
    assert errors[1].channel == int(e1.split("channel ")[1][0]), e1


def test_a_peer_that_fails_ends_the_others_at_once_naming_the_channel() -> None:
    results = Local.launch(3, lambda t: C.failed_peer_run(t, victim=1, timeout=30),
                           return_exceptions=True)
    assert isinstance(results[1], RuntimeError)
    for rank in (0, 2):
        out = results[rank]
        assert out["type"] == "TransportError", out
        assert out["elapsed"] < 10, out  # at once, not after the 30 s timeout
        assert f"rank {rank}: local two-rings allreduce, channel " in out["error"], out
        assert f"from peer 1 failed: peer 1 " in out["error"], out


def test_a_failed_call_leaves_the_next_ones_correct() -> None:
    """Rank 2 starts late: ranks 0 and 1 time out in call 0 (one channel waiting, the
    other part way), then rank 2 runs call 0 alone, sending messages nobody waits for,
    and times out too. The calls after it (epochs come round) sum their own inputs, and
    no message is left over: the stale ones were dropped."""
    failed = threading.Barrier(3)

    def rank_fn(t: Local) -> Any:
        run = Allreduce(C.two_rings(3), t, timeout=TIMEOUT)
        if t.rank == 2:
            failed.wait(30)
        outcome = "ok"
        try:
            run(np.ones(300))
        except TransportError:
            outcome = "failed"
        if t.rank != 2:
            failed.wait(30)
        run.timeout = 30
        sums = []
        for call in range(1, 7):
            x = C._ints(300, t.rank, call)
            run(x)
            sums.append(bool(np.array_equal(x, C._sum(300, 3, call))))
        t.barrier()
        left = sum(len(box) for (_, dst), box in t.world.mail.items() if dst == t.rank)
        return outcome, sums, left

    for outcome, sums, left in Local.launch(3, rank_fn, timeout=60):
        assert (outcome, sums, left) == ("failed", [True] * 6, 0)


# -- MPI processes ---------------------------------------------------------------------
def _mpi_results(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("TOPOPLAN-RESULT "):
            record = json.loads(line.removeprefix("TOPOPLAN-RESULT "))
            out[record["rank"]] = record
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("nranks, victim", [(2, None), (3, 1), (4, None)])
def test_every_channel_case_on_mpi_processes(nranks: int, victim: int | None) -> None:
    """tests/mpi_channels.py: the cases, a retry after a timeout (the failed call's
    requests aborted, its late messages dropped), then (with a victim) a rank that exits
    mid-call under ``--with-ft ulfm``: the others raise a TransportError naming a channel."""
    pytest.importorskip("mpi4py")
    from topoplan.runtime.mpirun import find_launcher, mpiexec
    if victim is not None and not find_launcher()[0].fault_tolerant:
        pytest.skip(f"{find_launcher()[0]} cannot keep survivors of a dead rank running")
    argv = [sys.executable, "-m", "tests.mpi_channels", "--timeout", str(TIMEOUT)]
    argv += ["--kill", str(victim)] if victim is not None else []
    proc = mpiexec(nranks, argv, timeout=240, fault_tolerant=victim is not None, cwd=ROOT)
    results = _mpi_results(proc.stdout)
    survivors = [r for r in range(nranks) if r != victim]
    assert sorted(results) == survivors, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    for rank in survivors:
        record = results[rank]
        assert record["failures"] == [], "\n".join(record["failures"])
        assert record["ncases"] > 30 and record["mode"] == "poll", record
        assert record["retry"] == {"outcomes": ["failed"] + [True] * 6, "left_over": False}, (
            rank, record["retry"])
        if victim is None:
            continue
        kill = record["kill"]
        assert kill["type"] == "TransportError" and kill["rank"] == rank, kill
        assert f"rank {rank}: mpi two-rings allreduce, channel " in kill["error"], kill
        assert f"peer {kill['peer']}" in kill["error"], kill
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


# -- torch.distributed gloo --------------------------------------------------------------
def test_every_channel_case_over_gloo_and_a_killed_peer() -> None:
    """Over gloo (not pollable) every channel of a call waits on a thread of its own:
    the cases (the hand-off included: channel 1 moves while channel 0 waits), then a
    rank exits mid-call and the others raise a TransportError naming a channel."""
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from topoplan.runtime.transports import Torch
    nranks, victim = 3, 1
    results = Torch.launch(nranks, C.torch_rank_main, victim, TIMEOUT, backend="gloo",
                           timeout=200, return_exceptions=True, start_method=forkserver.START)
    assert isinstance(results[victim], TransportError)
    assert f"rank {victim} exited with code 9" in str(results[victim])
    for rank in (0, 2):
        record = results[rank]
        assert isinstance(record, dict), f"rank {rank} raised {record!r}"
        assert record["failures"] == [], "\n".join(record["failures"])
        assert record["ncases"] > 30 and record["mode"] == "threads", record
        kill = record["kill"]
        assert kill["type"] == "TransportError" and kill["rank"] == rank, kill
        assert f"rank {rank}: torch/gloo two-rings allreduce, channel " in kill["error"], kill
        assert f"peer {kill['peer']}" in kill["error"], kill
        assert kill["elapsed"] < TIMEOUT + 3.0, kill


def test_channels_keep_a_schedule_that_is_not_channelled_as_it_was() -> None:
    """A schedule without channels compiles to one run of every step, and its errors
    name no channel (their wording is what it always was)."""
    schedule = build_schedule(2, equal_chunks(1), [[[recv(1, 0, True)]], [[send(0, 0)]]])

    def rank_fn(t: Local) -> Any:
        if t.rank == 1:
            t.world.barrier(t.rank, 30)
            return None
        try:
            Allreduce(schedule, t, timeout=0.5, verified=True)(np.ones(4))
        except TransportError as exc:
            t.world.barrier(t.rank, 30)
            return str(exc)

    error = Local.launch(2, rank_fn)[0]
    assert error.startswith("rank 0: local ? allreduce, step 0: recv of chunk 0 from peer 1 "
                            "timed out"), error
