"""All-pairs allreduces that keep a peer's data in scratch, imported: a receive into
scratch added into the buffer by several local reduces (``re``), one per chunk, on
separate thread blocks, as msccl-tools' all-pairs allreduce does. Hand-built algorithms
in that shape, broken variants of them that the import refuses naming the step, and
msccl-tools' own files for 8 and 2 x 8 GPUs: imported, verified, simulated, exported and
imported again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import topoplan
from topoplan.analysis.bound import lower_bound
from topoplan.cli import main
from topoplan.cluster import loads_cluster
from topoplan.errors import ScheduleError
from topoplan.interop.msccl import (Algo, Gpu, ThreadBlock, export_msccl, import_msccl,
                                    load_msccl, loads_msccl, to_xml, verify_msccl)
from topoplan.ir.verify import verify

from .support.clusters import flat_cluster_yaml
from tests.support.msccl_algos import algo, allpairs, numbered, replace_step, roundtrip, step

DATA = Path(__file__).parent / "data" / "msccl"


def rows(n: int, split: int = 0) -> Algo:
    """msccl-tools' all-pairs allreduce in small: ``n * n`` chunks; gpu ``g`` owns row
    ``g`` (chunks ``g * n .. g * n + n - 1``). Thread block ``t`` of peer ``p`` sends row
    ``p`` to ``p`` and receives ``p``'s copy of row ``g`` into ``s[t * n]`` in one step;
    reduce thread block ``k`` adds chunk ``k`` of every received row into ``i[g * n + k]``
    (one ``re`` per peer, after nops that wait for the receives); then the peer thread
    blocks send the summed row to every peer and receive theirs. In place only, LL (a row
    of up to 8 chunks fits the FIFO, as upstream's does).

    ``split``: rows go as two messages, the first ``split`` chunks and the rest, and one
    reduce thread block adds chunks ``split - 1`` and ``split`` with one ``re`` that
    reads both messages' data.
    """
    parts = [(0, split), (split, n - split)] if split else [(0, n)]
    rdone = 2 * len(parts) - 1  # the step of a peer tb's last receive
    # the chunks of the row each reduce tb adds
    groups = [[k] for k in range(n)]
    if split:
        groups[split - 1:split + 1] = [[split - 1, split]]
    gpus = []
    for g in range(n):
        peers = [p for p in range(n) if p != g]
        red = len(peers)  # the first reduce tb
        last_re = (n - 2) + (n - 1) - 1  # the step of a reduce tb's last re
        tbs = []
        for t, p in enumerate(peers):
            raw = [step(0, "s", "i", p * n + a, "s", t, cnt=c) for a, c in parts]
            raw += [step(0, "r", "i", -1, "s", t * n + a, cnt=c, hasdep=True)
                    for a, c in parts]
            raw += [step(0, "nop", "i", -1, "o", -1, cnt=0, depid=red + j, deps=last_re)
                    for j in range(len(groups) - 1)]
            raw += [step(0, "s", "i", g * n, "i", g * n, cnt=n, depid=red + len(groups) - 1,
                         deps=last_re),
                    step(0, "r", "i", -1, "i", p * n, cnt=n)]
            tbs.append(ThreadBlock(t, p, p, 0, numbered(raw)))
        for j, ks in enumerate(groups):
            raw = [step(0, "nop", "i", -1, "o", -1, cnt=0, depid=t, deps=rdone)
                   for t in range(n - 2)]
            for t in range(n - 1):
                first = t == 0
                raw.append(step(0, "re", "s", t * n + ks[0], "i", g * n + ks[0], cnt=len(ks),
                                depid=n - 2 if first else -1, deps=rdone if first else -1,
                                hasdep=t == n - 2))
            tbs.append(ThreadBlock(red + j, -1, -1, 0, numbered(raw)))
        gpus.append(Gpu(g, n * n, 0, (n - 1) * n, tuple(tbs)))
    return algo(gpus, nchunks=n * n, proto="LL", outofplace=False, name="rows")


def _rows_ops(schedule) -> list[list[set[tuple]]]:
    return [[{(op.kind.value, op.peer, op.chunk, op.count, op.reduce) for op in st}
             for st in program.steps] for program in schedule.ranks]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_a_received_row_added_chunk_by_chunk_is_one_reducing_recv(n: int) -> None:
    a = roundtrip(rows(n))
    assert verify_msccl(a).modes == ("inplace",)
    schedule = import_msccl(a)
    verify(schedule)
    assert schedule.nsteps == 2  # all-pairs: one exchange to sum the rows, one to share
    for g, steps in enumerate(_rows_ops(schedule)):
        peers = [p for p in range(n) if p != g]
        assert steps[0] == ({("send", p, p * n, n, False) for p in peers}
                            | {("recv", p, g * n, n, True) for p in peers})
        assert steps[1] == ({("send", p, g * n, n, False) for p in peers}
                            | {("recv", p, p * n, n, False) for p in peers})


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_reduces_into_one_chunk_from_scratch_share_a_step(n: int) -> None:
    # one reduce tb adds every peer's scratch chunk into o[g], in order; those adds
    # commute, so they need not be a step apart (they were, and every peer's send had to
    # wait for its turn: the import deadlocked from 3 ranks on)
    schedule = import_msccl(allpairs(n))
    verify(schedule)
    assert schedule.nsteps == 2


def _edit(a: Algo, g: int, tb: int, k: int, **changes: object) -> Algo:
    return replace_step(a, g, tb, k, **changes)


def _refused(a: Algo, checker: str, why: str) -> None:
    """The checker refuses ``a`` (``checker``); unchecked, the import names the step."""
    with pytest.raises(ScheduleError, match=checker):
        verify_msccl(a)
    with pytest.raises(ScheduleError, match=why):
        import_msccl(a, check=False)


def test_scratch_added_twice_never_or_across_chunks_is_refused() -> None:
    n = 4
    red = n - 1
    # gpu 0's reduce tb 1 adds s[0] (chunk 0 of the row from gpu 1) where s[1] belongs
    _refused(_edit(rows(n), 0, red + 1, n - 2, srcoff=0), "sum of two different chunks",
             r"gpu 0 tb 4 step 2 \(re\): cannot be a topoplan schedule: s\[0\] is added "
             r"into the buffer twice")
    # ... and s[1] into chunk 0: the received row no longer lands on consecutive chunks
    swapped = _edit(_edit(rows(n), 0, red, n - 2, srcoff=1), 0, red + 1, n - 2, srcoff=0)
    _refused(swapped, "sum of two different chunks",
             r"gpu 0 tb 0 step 1 \(r\): cannot be a topoplan schedule: s\[0\] x4 is added "
             r"into chunks 1 and 0 at offsets 0 and 1: not one range of consecutive chunks")
    # gpu 0's reduce tb 3 never adds the last row's chunk 3
    dropped = _edit(rows(n), 0, red + 3, 2 * n - 4, type="nop", srcoff=-1, dstoff=-1, cnt=0)
    _refused(dropped, r"gpu 1 i\[3\] holds|deadlock",
             r"gpu 0 tb 2 step 1 \(r\): cannot be a topoplan schedule: data received into "
             r"scratch s\[11\] is never reduced into the buffer")
    # gpu 0 receives the rows of gpus 1 and 2 into the same scratch
    reused = _edit(rows(n), 0, 1, 1, dstoff=0)
    _refused(reused, r"race on s\[0\]|counted twice|holds",
             r"gpu 0 tb 1 step 1 \(r\): cannot be a topoplan schedule: scratch s\[0\] is "
             r"written twice")


@pytest.mark.parametrize("n, split", [(3, 1), (4, 2), (5, 3)])
def test_a_reduce_that_reads_two_receives_waits_for_both(n: int, split: int) -> None:
    a = roundtrip(rows(n, split))
    assert verify_msccl(a).modes == ("inplace",)
    schedule = import_msccl(a)
    verify(schedule)
    assert schedule.nsteps == 2
    for g, steps in enumerate(_rows_ops(schedule)):
        peers = [p for p in range(n) if p != g]
        assert {op for op in steps[0] if op[0] == "recv"} == (
            {("recv", p, g * n, split, True) for p in peers}
            | {("recv", p, g * n + split, n - split, True) for p in peers})


# ---- msccl-tools' own files ---------------------------------------------------------------
# tests/data/msccl/allreduce_a100_*allpairs*.xml: written by msccl-tools' generators (see
# tests/data/README.md). 64 chunks: gpu g of a box of 8 owns row g % 8 (8 chunks), sums it
# from its 7 box peers (one message each, into scratch, added by 8 thread blocks, one per
# chunk), with 2 x 8 swaps the row's sum with gpu g + 8 (mod 16), then shares it.

UPSTREAM = {"allreduce_a100_allpairs_8.xml": 8,
            "allreduce_a100_multinode_allpairs_2x8.xml": 16}


def _upstream(name: str):
    return import_msccl(load_msccl(DATA / name))


@pytest.mark.parametrize("name", UPSTREAM)
def test_msccl_tools_allpairs_imports_as_its_exchanges(name: str) -> None:
    ranks = UPSTREAM[name]
    a = load_msccl(DATA / name)
    assert (a.ngpus, a.nchunksperloop, a.proto, a.inplace) == (ranks, 64, "LL", True)
    assert verify_msccl(a).modes == ("inplace",)
    schedule = import_msccl(a)
    verify(schedule)
    assert schedule.collective == "allreduce" and schedule.nranks == ranks
    assert schedule.nsteps == (2 if ranks == 8 else 3)
    for g, steps in enumerate(_rows_ops(schedule)):
        peers = [p for p in range(g // 8 * 8, g // 8 * 8 + 8) if p != g]
        row = g % 8 * 8
        assert steps[0] == ({("send", p, p % 8 * 8, 8, False) for p in peers}
                            | {("recv", p, row, 8, True) for p in peers})
        if ranks == 16:
            other = (g + 8) % 16
            assert steps[1] == {("send", other, row, 8, False), ("recv", other, row, 8, True)}
        assert steps[-1] == ({("send", p, row, 8, False) for p in peers}
                             | {("recv", p, p % 8 * 8, 8, False) for p in peers})


@pytest.mark.parametrize("name", UPSTREAM)
def test_msccl_tools_allpairs_simulates_near_the_bound(name: str) -> None:
    ranks = UPSTREAM[name]
    schedule = _upstream(name)
    cluster = loads_cluster(flat_cluster_yaml(ranks, 8))  # boxes of 8 on one crossbar
    small, large = 1 << 20, 1 << 28
    t = {(size, profile): topoplan.simulate(cluster, schedule, size, profile=profile).time_s
         for size in (small, large) for profile in ("ideal", "nccl")}
    for (size, _), time_s in t.items():
        assert time_s >= lower_bound(cluster, size) * (1 - 1e-9)
    if ranks == 8:  # every rank sends and receives 2 x 7/8 of the buffer: the bound
        assert t[(large, "ideal")] <= 1.01 * lower_bound(cluster, large)
    # two or three steps against a ring's 2 (n - 1): ahead where latency counts
    ring = topoplan.plan(cluster, algorithm="ring", size=small)
    assert t[(small, "nccl")] < 0.5 * topoplan.simulate(cluster, ring, small,
                                                       profile="nccl").time_s


@pytest.mark.parametrize("name", UPSTREAM)
def test_msccl_tools_allpairs_exports_and_comes_back_the_same(name: str) -> None:
    schedule = _upstream(name)
    result = export_msccl(schedule, proto="LL")  # the file's protocol
    algo = loads_msccl(to_xml(result.algo))
    assert verify_msccl(algo).modes == ("inplace", "outofplace")
    back = import_msccl(algo)
    assert _rows_ops(back) == _rows_ops(schedule)
    cluster = loads_cluster(flat_cluster_yaml(schedule.nranks, 8))
    for profile in ("ideal", "nccl"):
        assert topoplan.simulate(cluster, back, 1 << 24, profile=profile).time_s == (
            pytest.approx(topoplan.simulate(cluster, schedule, 1 << 24,
                                            profile=profile).time_s, rel=1e-6))


def test_cli_imports_and_simulates_msccl_tools_allpairs(tmp_path, capsys) -> None:
    plan = tmp_path / "allpairs.json"
    cluster = tmp_path / "box8.yaml"
    cluster.write_text(flat_cluster_yaml(8, 8))
    assert main(["import", "msccl", str(DATA / "allreduce_a100_allpairs_8.xml"), "-o",
                 str(plan)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal
    assert "MSCCL check ok (inplace); 8 ranks, 64 chunks, 2 steps, 112 messages" in said
    assert main(["verify", str(plan)]) == 0
    assert main(["simulate", str(cluster), str(plan), "--size", "1MiB"]) == 0
    assert "msccl:allreduce_pairs on flat-1x8" in capsys.readouterr().out
