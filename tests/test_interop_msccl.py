"""Plans exported as MSCCL XML and MSCCL XML imported as plans: allreduce, and
reduce-scatter and allgather with NCCL's buffers.

Every exported algorithm goes through the independent checker
(:func:`topoplan.interop.msccl.verify_msccl`) and the executor's limits; imports must
verify; the CLI writes nothing on error.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import topoplan
from topoplan.cli import main
from topoplan.errors import PlannerError, ScheduleError, XmlFormatError
from topoplan.interop.msccl import (Limits, export_msccl, import_msccl, limit_violations,
                                    loads_msccl, to_xml, verify_msccl)
from topoplan.interop.msccl.export import _unit_grid
from topoplan.ir.passes import coalesce
from topoplan.ir.schedule import Op, OpKind, build_schedule
from topoplan.ir.verify import verify

from .support.clusters import load_topology, switch_cluster
from .support.schedules import (builders, hierarchical_schedule, ring_allgather,
                                ring_reduce_scatter, ring_schedule)

PLANNERS = ["ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf"]
SIZES = [1 << 20, 1 << 28]


def _round_trip(schedule, **options):
    # The exact chunk grid: these tests check that what comes back is the plan itself
    # (the default grid rounds to one that serves the plan's size, test_grid_* below).
    options.setdefault("grid", "exact")
    result = export_msccl(schedule, **options)
    algo = loads_msccl(to_xml(result.algo))
    assert algo.gpus == result.algo.gpus  # the XML holds everything the model does
    assert limit_violations(algo) == []
    report = verify_msccl(algo)
    assert set(report.modes) == {"inplace", "outofplace"}
    return result, algo


def _shape(schedule):
    """Per rank and step, which peers it sends to and receives from."""
    return [[sorted({(op.kind.value, op.peer) for op in step}) for step in program.steps]
            for program in schedule.ranks]


@pytest.mark.parametrize("topology", ["ddl_two_switch", "dgx1_v100"])
@pytest.mark.parametrize("algorithm", PLANNERS)
@pytest.mark.parametrize("size", SIZES, ids=["1MiB", "256MiB"])
def test_every_planner_exports_checked_and_comes_back_the_same(topology, algorithm, size):
    cluster = load_topology(topology)
    schedule = topoplan.plan(cluster, algorithm=algorithm, size=size)
    result, algo = _round_trip(schedule)
    assert algo.ngpus == cluster.nranks and algo.coll == "allreduce"
    assert algo.inplace and algo.outofplace
    assert not any("rounded" in note for note in result.notes)
    back = import_msccl(algo)
    verify(back)
    assert back.nsteps == schedule.nsteps
    assert back.nmessages == schedule.nmessages and _shape(back) == _shape(schedule)
    for profile in ("ideal", "nccl"):
        t0 = topoplan.simulate(cluster, schedule, size=size, profile=profile).time_s
        t1 = topoplan.simulate(cluster, back, size=size, profile=profile).time_s
        assert t1 == pytest.approx(t0, rel=1e-6), profile  # chunk ends: whole elements


def test_rounded_chunk_grid_is_said_and_stays_close():
    cluster = load_topology("aws_p2_8xlarge")
    schedule = topoplan.plan(cluster, algorithm="mcf", size=1 << 28)
    result, algo = _round_trip(schedule, fuse=False)  # fused fails the check here anyway
    note = next(n for n in result.notes if "rounded" in n)
    assert "grid of 4096" in note and "of the buffer changes chunk" in note
    back = import_msccl(algo)
    assert back.nsteps == schedule.nsteps and _shape(back) == _shape(schedule)
    t0 = topoplan.simulate(cluster, schedule, size=1 << 28, profile="ideal").time_s
    t1 = topoplan.simulate(cluster, back, size=1 << 28, profile="ideal").time_s
    assert t1 == pytest.approx(t0, rel=0.01)


def test_unit_grid_rounds_by_largest_remainder():
    chunks = [0.5 - 3e-5, 0.25, 0.25 - 1e-5, 2e-5, 2e-5]
    bounds, note = _unit_grid(chunks)
    units = [b - a for a, b in zip(bounds, bounds[1:])]
    assert bounds[0] == 0 and bounds[-1] == 4096 and min(units) == 1
    assert all(abs(u / 4096 - c) <= 1 / 4096 for u, c in zip(units, chunks))
    assert note is not None and "rounded" in note
    assert _unit_grid([0.25, 0.5, 0.25]) == ([0, 1, 3, 4], None)


def test_plan_steps_are_a_hint_the_import_checks():
    cluster = load_topology("dgx1_v100")
    schedule = topoplan.plan(cluster, algorithm="tree", size=1 << 20)
    xml = to_xml(export_msccl(schedule).algo)
    assert ' tp="' in xml
    # without the hints (an algorithm from another tool) every op goes at its earliest
    # step: still the same algorithm, verified, but not the plan's pipeline
    bare = import_msccl(loads_msccl(re.sub(r' tp="[0-9,]+"', "", xml)))
    verify(bare)
    assert _shape(bare) != _shape(schedule)
    # hints that break a rule (a recv moved before what it waits for) are not trusted
    edited = re.sub(r' tp="([0-9]+),', lambda m: f' tp="{max(0, int(m[1]) - 3)},', xml)
    verify(import_msccl(loads_msccl(edited)))
    with pytest.raises(XmlFormatError, match=r"tp.*'step,op'"):
        loads_msccl(xml.replace(' tp="', ' tp="x', 1))


def test_ring_fuses_into_rrs_rrcs_and_rcs():
    schedule = ring_schedule(list(range(4)))
    result, algo = _round_trip(schedule)
    types = [s.type for tb in algo.gpus[0].tbs for s in tb.steps]
    assert types == ["s", "rrs", "rrs", "rrcs", "rcs", "rcs", "r"]
    assert len(algo.gpus[0].tbs) == 1 and result.fused == 4 * 5


def test_unfused_export_uses_separate_thread_blocks():
    schedule = ring_schedule(list(range(4)))
    algo = export_msccl(schedule, fuse=False).algo
    for gpu in algo.gpus:
        assert all((tb.send < 0) != (tb.recv < 0) for tb in gpu.tbs)
    verify_msccl(algo)
    verify(import_msccl(algo))


def test_channels_stack_instances_on_disjoint_chunks():
    schedule = ring_schedule(list(range(4)))
    algo = export_msccl(schedule, channels=3, proto="LL128").algo
    assert algo.nchannels == 3 and algo.nchunksperloop == 12 and algo.proto == "LL128"
    assert sorted({tb.chan for tb in algo.gpus[0].tbs}) == [0, 1, 2]
    verify_msccl(algo)
    back = import_msccl(algo)
    verify(back)


def test_long_pairs_split_over_channels_to_fit_the_step_limit():
    schedule = ring_schedule(list(range(40)))  # 79 steps on one thread block unsplit
    result = export_msccl(schedule)
    assert result.segments >= 2 and result.max_steps <= 64
    tight = export_msccl(schedule, limits=Limits(max_steps=16))
    assert tight.max_steps <= 16
    assert limit_violations(tight.algo, Limits(max_steps=16)) == []


@pytest.mark.parametrize("nranks, max_steps, max_channels", [(8, 4, 6), (16, 6, 7)])
def test_a_pair_that_needs_every_channel_gets_every_channel(nranks, max_steps, max_channels):
    # The segment search aims under the step limit (boundaries cost steps); it used to
    # jump past the channel count these fit in exactly, and refuse them.
    schedule = ring_schedule(list(range(nranks)))
    limits = Limits(max_steps=max_steps, max_channels=max_channels)
    result = export_msccl(schedule, limits=limits)
    assert result.segments == max_channels and result.max_steps <= max_steps
    assert limit_violations(result.algo, limits) == []
    verify_msccl(result.algo)
    assert import_msccl(result.algo).nsteps == schedule.nsteps


@pytest.mark.parametrize("nranks, max_steps, max_channels", [(16, 4, 8), (64, 8, 16)])
def test_ring_interleaved_over_channels_fills_them_exactly(nranks, max_steps, max_channels):
    # A ring of N ranks forwards 2N - 2 messages per pair in 2N - 1 fused steps: N = 64
    # on 16 channels of 8 steps is the 1024-rank ring on 32 x 64 at 1/16 scale. In
    # consecutive runs every channel boundary costs a fused block one step; message k
    # on channel (k + offset) % C, offsets aligned along the ring, costs none.
    schedule = ring_schedule(list(range(nranks)))
    limits = Limits(max_steps=max_steps, max_channels=max_channels)
    result = export_msccl(schedule, limits=limits)
    assert result.segments == max_channels and result.max_steps == max_steps
    assert result.fused > 0 and any("in turn" in note for note in result.notes)
    assert limit_violations(result.algo, limits) == []
    verify_msccl(result.algo)
    back = import_msccl(loads_msccl(to_xml(result.algo)))
    assert back.nsteps == schedule.nsteps
    assert coalesce(back).ranks == coalesce(schedule).ranks


def test_no_fit_fused_or_unfused_says_both(monkeypatch):
    import topoplan.interop.msccl.export as exporter

    # Unfused, every op is a step: past the parser's node limit the export says so up
    # front (no layout is tried) and, fused, why neither segment order fit.
    schedule = ring_schedule(list(range(7)))
    monkeypatch.setattr(exporter, "MAX_NODES", 30)
    with pytest.raises(PlannerError, match="MAX_NODES") as info:
        export_msccl(schedule, fuse=False)
    assert "XML nodes on gpu" in str(info.value)
    with pytest.raises(PlannerError, match=r"fused, consecutive on 4 channels each: .*"
                       r"interleaved on 4 channels each: .*; separate send and receive "
                       r"thread blocks need at least 33"):
        export_msccl(schedule, limits=Limits(max_steps=4, max_channels=4))


def test_too_big_for_the_limits_names_the_plan_options():
    schedule = ring_schedule(list(range(40)))
    with pytest.raises(PlannerError, match="--max-chunks"):
        export_msccl(schedule, channels=32)


def test_bad_options_are_refused():
    schedule = ring_schedule(list(range(4)))
    with pytest.raises(PlannerError, match="proto"):
        export_msccl(schedule, proto="simple")
    with pytest.raises(PlannerError, match="channels"):
        export_msccl(schedule, channels=0)
    with pytest.raises(PlannerError, match="min/max"):
        export_msccl(schedule, min_bytes=10, max_bytes=5)


def test_min_and_max_bytes_are_written():
    algo = export_msccl(ring_schedule([0, 1]), min_bytes=4096, max_bytes=1 << 20).algo
    text = to_xml(algo)
    assert 'minBytes="4096"' in text and 'maxBytes="1048576"' in text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fuse=st.booleans(), channels=st.integers(1, 2))
def test_property_export_check_import_verify(data, fuse, channels):
    n = data.draw(st.integers(2, 6), label="n")
    kind = data.draw(st.sampled_from(["builder", "ring", "hierarchical"]), label="kind")
    if kind == "ring":
        schedule = ring_schedule(list(data.draw(st.permutations(list(range(n))), label="order")))
    elif kind == "hierarchical" and n % 2 == 0 and n > 2:
        schedule = hierarchical_schedule(n, 2)
    else:
        options = builders(n)
        schedule = options[data.draw(st.sampled_from(sorted(options)), label="builder")]
    if data.draw(st.booleans(), label="coalesce"):
        schedule = coalesce(schedule)
    result = export_msccl(schedule, fuse=fuse, channels=channels)
    algo = loads_msccl(to_xml(result.algo))
    verify_msccl(algo)
    assert limit_violations(algo) == []
    back = import_msccl(algo)
    verify(back)
    assert back.nranks == schedule.nranks
    assert back.nsteps == schedule.nsteps and _shape(back) == _shape(schedule)


def test_import_refuses_what_a_schedule_cannot_hold():
    xml = to_xml(export_msccl(ring_schedule([0, 1])).algo)
    moved = xml.replace('type="s" srcbuf="i" srcoff="0"', 'type="s" srcbuf="s" srcoff="0"', 1)
    moved = moved.replace('s_chunks="0"', 's_chunks="2"')
    algo = loads_msccl(moved)
    with pytest.raises(ScheduleError):
        import_msccl(algo)
    other = loads_msccl(xml.replace('coll="allreduce"', 'coll="broadcast"'))
    with pytest.raises(ScheduleError, match="only allreduce, allgather, reducescatter"):
        import_msccl(other, check=False)
    # relabelled, without the checker: the import's own bounds name the step
    other = loads_msccl(xml.replace('coll="allreduce"', 'coll="allgather"'))
    with pytest.raises(ScheduleError, match=r"<string>:\d+: gpu 0 tb 0 step \d \(\w+\): "
                       r"cannot be a topoplan schedule: i\[1\] x1 lies past the 1 chunks of i"):
        import_msccl(other, check=False)


# ---- the command line -------------------------------------------------------------------

def _plan_file(tmp_path, algorithm="ring", topology="topologies/dgx1_v100.yaml"):
    path = tmp_path / "plan.json"
    assert main(["plan", topology, "--algorithm", algorithm, "--size", "1MiB", "-o",
                 str(path)]) == 0
    return path


def test_cli_export_import_verify_simulate(tmp_path, capsys):
    plan = _plan_file(tmp_path, "mcf")
    xml = tmp_path / "algo.xml"
    assert main(["export", str(plan), "--format", "msccl", "-o", str(xml), "--channels", "2"]) == 0
    assert "passes the MSCCL check" in " ".join(capsys.readouterr().out.split())
    assert xml.read_text().startswith("<algo ")
    back = tmp_path / "back.json"
    assert main(["import", str(xml), "--format", "msccl", "-o", str(back)]) == 0
    assert json.loads(back.read_text())["nranks"] == 8
    assert main(["verify", str(back)]) == 0
    assert main(["simulate", "topologies/dgx1_v100.yaml", str(back), "--size", "1MiB"]) == 0


def test_cli_export_and_import_take_the_format_the_same_way(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    xml = tmp_path / "algo.xml"
    assert main(["export", str(plan), "--format", "msccl", "-o", str(xml)]) == 0
    capsys.readouterr()
    spellings = {"option": ["import", str(xml), "--format", "msccl"],
                 "default": ["import", str(xml)],
                 "first": ["import", "msccl", str(xml)]}  # the first spelling, with a note
    plans = {}
    for name, argv in spellings.items():
        out = tmp_path / f"{name}.json"
        assert main([*argv, "-o", str(out)]) == 0
        err = capsys.readouterr().err
        assert ("is now 'topoplan import FILE --format msccl'" in err) == (name == "first")
        plans[name] = out.read_text()
    assert plans["option"] == plans["default"] == plans["first"]


@pytest.mark.parametrize("argv", [["import", "nccl", "node.xml"],
                                  ["import", "node.xml", "--format", "nccl"]])
def test_cli_import_of_a_topology_points_to_topo_import(argv, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("topoplan: error: 'nccl' is a topology format, not an algorithm: "
                           "did you mean `topoplan topo import nccl node.xml`?")


def test_cli_export_and_import_json(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    capsys.readouterr()
    assert main(["export", str(plan), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["output"] is None and exported["xml"].startswith("<algo ")
    assert (exported["collective"], exported["ngpus"], exported["checked"]) == ("allreduce", 8,
                                                                                True)
    xml = tmp_path / "algo.xml"
    assert main(["export", str(plan), "-o", str(xml), "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["output"] == str(xml) and written["xml"] is None
    assert xml.read_text() == exported["xml"]
    assert main(["import", str(xml), "--json"]) == 0
    imported = json.loads(capsys.readouterr().out)
    assert imported["verified"] and imported["nranks"] == 8
    assert imported["plan"]["nranks"] == 8 and imported["output"] is None
    back = tmp_path / "back.json"
    assert main(["import", str(xml), "--json", "-o", str(back)]) == 0
    assert json.loads(capsys.readouterr().out)["plan"] is None
    assert json.loads(back.read_text()) == imported["plan"]


def test_cli_export_to_stdout(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    capsys.readouterr()
    assert main(["export", str(plan)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("<algo ") and "nchunksperloop" in out.err


def test_cli_errors_name_the_file_and_write_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.xml"
    bad.write_text('<algo name="x" proto="Simple">\n  <gpu id="0">\n</algo>\n')
    out = tmp_path / "out.json"
    assert main(["import", "msccl", str(bad), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "bad.xml:3" in err and "Traceback" not in err
    assert not out.exists()
    plan = _plan_file(tmp_path)
    xml = tmp_path / "algo.xml"
    assert main(["export", str(plan), "--channels", "40", "-o", str(xml)]) == 1
    assert "channels" in capsys.readouterr().err and not xml.exists()


def test_parse_errors_are_xml_format_errors():
    with pytest.raises(XmlFormatError, match=r"algo.xml:1"):
        loads_msccl("<algo", file="algo.xml")


# ---- reduce-scatter and allgather ---------------------------------------------------------

SHARDED = ["allgather", "reduce_scatter"]
MSCCL_NAME = {"allgather": "allgather", "reduce_scatter": "reducescatter"}


def _sharded_round_trip(cluster, schedule, size, **options):
    """Export, check in both modes, import: the plan comes back, with its collective."""
    coll = schedule.collective
    result, algo = _round_trip(schedule, **options)
    n, units = algo.ngpus, algo.nchunksperloop
    assert algo.coll == MSCCL_NAME[coll] and units % n == 0
    shard = units // n
    for gpu in algo.gpus:  # NCCL's buffers: the send buffer of an allgather is one shard,
        # the receive buffer of a reduce-scatter one shard; the other is the full buffer
        assert (gpu.i_chunks, gpu.o_chunks) == ((shard, units) if coll == "allgather"
                                                else (units, shard))
    back = import_msccl(algo)
    assert back.collective == coll and verify(back).collective == coll
    assert back.nsteps == schedule.nsteps and back.nmessages == schedule.nmessages
    assert _shape(back) == _shape(schedule)
    for profile in ("ideal", "nccl"):
        t0 = topoplan.simulate(cluster, schedule, size=size, profile=profile).time_s
        t1 = topoplan.simulate(cluster, back, size=size, profile=profile).time_s
        # An import splits uneven chunks into the file's equal units (256 chunks of three
        # sizes become 4096 units): the same bytes on the same steps, but other event
        # batches at the simulator's 1e-7 resolution.
        assert t1 == pytest.approx(t0, rel=1e-5), profile
    return result, algo, back


@pytest.mark.parametrize("topology", ["ddl_two_switch", "dgx1_v100", "aws_p3_16xlarge_x4"])
@pytest.mark.parametrize("algorithm", ["ring", "ring-topo", "rhd", "mcf"])
@pytest.mark.parametrize("collective", SHARDED)
def test_reduce_scatter_and_allgather_export_checked_and_come_back_the_same(
        topology, algorithm, collective):
    cluster = load_topology(topology)
    for size in SIZES:
        schedule = topoplan.plan(cluster, algorithm=algorithm, size=size,
                                 collective=collective)
        result, _, _ = _sharded_round_trip(cluster, schedule, size)
        assert not any("rounded" in note for note in result.notes)


def test_consecutive_ops_of_the_plan_stay_apart():
    # mcf's allgather on dgx_a100_x4 sends chunk 0 to a peer at step 0 and chunk 1, the
    # next units of i, to the same peer at step 1, back to back on one thread block: the
    # import used to join them into one message at step 0 (1.048 of the plan's time).
    cluster = load_topology("dgx_a100_x4")
    schedule = topoplan.plan(cluster, algorithm="mcf", size=1 << 28, collective="allgather")
    result, algo, back = _sharded_round_trip(cluster, schedule, 1 << 28)
    assert not any("rounded" in note for note in result.notes)
    joined = [(a, b) for g in algo.gpus for tb in g.tbs for a, b in zip(tb.steps, tb.steps[1:])
              if a.type == b.type == "s" and a.plan != b.plan and b.depid < 0 and not a.hasdep
              and a.srcbuf == b.srcbuf and b.srcoff == a.srcoff + a.cnt]
    assert joined  # the case is there, and the round trip above kept them apart


@pytest.mark.parametrize("collective", SHARDED)
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("channels", [1, 3])
def test_sharded_channels_and_unfused_come_back_the_same(collective, fuse, channels):
    cluster = switch_cluster(6)
    schedule = coalesce(topoplan.plan(cluster, algorithm="rhd", size=1 << 20,
                                      collective=collective))
    # rhd on 6 ranks folds ranks 4, 5 in with messages that span several shards: with
    # instances they are cut at each shard (instance c takes slice c of every shard)
    assert any(op.count > 2 for p in schedule.ranks for st in p.steps for op in st)
    if channels == 1:
        _sharded_round_trip(cluster, schedule, 1 << 20, fuse=fuse)
        return
    result, algo = _round_trip(schedule, fuse=fuse, channels=channels)
    assert algo.nchannels == channels * result.segments
    units = algo.nchunksperloop
    shard = units // algo.ngpus
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for x in tb.steps:  # no step crosses the edge of a shard of the full buffer
                if x.type in ("r", "rcs", "rrc", "rrcs") and x.dstbuf == "o" and \
                        collective == "allgather":
                    assert x.dstoff // shard == (x.dstoff + x.cnt - 1) // shard
    back = import_msccl(algo)
    # every instance's messages come back in the plan's own steps
    assert verify(back).collective == collective and back.nsteps == schedule.nsteps
    assert _shape(back) == _shape(schedule)


def test_allgather_reads_its_shard_from_the_input_and_copies_it_to_the_output():
    schedule = ring_allgather([0, 1, 2, 3])
    algo = export_msccl(schedule).algo
    for gpu in algo.gpus:
        g = gpu.id
        steps = [st for tb in gpu.tbs for st in tb.steps]
        # the shard goes out from i (in place: o[g]) before anything arrives
        assert [(st.srcbuf, st.srcoff) for st in steps if st.type == "s"] == [("i", 0)]
        copy = next(tb for tb in gpu.tbs if tb.send == tb.recv == -1)
        assert [(st.type, st.srcbuf, st.srcoff, st.dstbuf, st.dstoff)
                for st in copy.steps] == [("cpy", "i", 0, "o", g)]
        assert copy.steps[0].depid >= 0  # after the send that reads i[0]: in place, o[g]
        received = {st.dstoff for st in steps if st.type in ("r", "rcs")}
        assert received == {0, 1, 2, 3} - {g}
        assert all(st.dstbuf == "o" for st in steps if st.type in ("r", "rcs"))
        assert gpu.s_chunks == 0


def test_reduce_scatter_sums_in_the_output_shard_and_passes_partial_sums_on():
    schedule = ring_reduce_scatter([0, 1, 2, 3])
    algo = export_msccl(schedule).algo
    for gpu in algo.gpus:
        types = [st.type for tb in gpu.tbs for st in tb.steps]
        assert types == ["s", "rrs", "rrs", "rrc"]  # nothing but its shard is stored
        last = gpu.tbs[0].steps[-1]
        assert (last.srcbuf, last.srcoff, last.dstbuf, last.dstoff) == ("i", gpu.id, "o", 0)
        assert gpu.s_chunks == 0
    unfused = export_msccl(schedule, fuse=False).algo
    # separate thread blocks keep each partial sum, in scratch (out of place the input is
    # read-only and the output is one shard): the full buffer less the rank's shard
    for gpu in unfused.gpus:
        writes = {(st.dstbuf, st.dstoff) for tb in gpu.tbs for st in tb.steps
                  if st.type == "rrc"}
        assert {buf for buf, _ in writes} == {"s", "o"} and gpu.s_chunks <= 3
        assert not any(st.dstbuf == "i" for tb in gpu.tbs for st in tb.steps
                       if st.type in ("r", "rrc", "rrcs", "rcs"))
    verify_msccl(unfused)
    assert import_msccl(unfused).nsteps == schedule.nsteps


def _edit(algo, g, t, s, **changes):
    """``algo`` with step ``s`` of tb ``t`` of gpu ``g`` changed."""
    gpu = algo.gpus[g]
    tb = gpu.tbs[t]
    steps = list(tb.steps)
    steps[s] = dataclasses.replace(steps[s], **changes)
    tbs = list(gpu.tbs)
    tbs[t] = dataclasses.replace(tb, steps=tuple(steps))
    gpus = list(algo.gpus)
    gpus[g] = dataclasses.replace(gpu, tbs=tuple(tbs))
    return dataclasses.replace(algo, gpus=tuple(gpus))


def test_wrong_allgather_xml_is_caught_naming_mode_gpu_and_unit():
    xml = to_xml(export_msccl(ring_allgather([0, 1, 2, 3])).algo)
    algo = loads_msccl(xml, file="ag.xml")
    # without the copy, out of place the rank's own shard never reaches o
    lines = xml.splitlines()
    copy_line = next(i for i, line in enumerate(lines) if 'type="cpy"' in line and
                     'dstoff="1"' in line)
    no_copy = "\n".join(lines[:copy_line] + [lines[copy_line].replace(
        'type="cpy"', 'type="nop"').replace('cnt="1"', 'cnt="0"')] + lines[copy_line + 1:])
    with pytest.raises(ScheduleError, match=r"ag\.xml \(out-of-place\): gpu 1 o\[1\] is never "
                                            r"written; expected \{1\} only"):
        verify_msccl(loads_msccl(no_copy + "\n", file="ag.xml"))
    # the copy without its dependency: in place it writes the memory a send reads
    g1 = algo.gpus[1]
    t = next(tb.id for tb in g1.tbs if tb.send == tb.recv == -1)
    racy = _edit(algo, 1, t, 0, depid=-1, deps=-1)
    with pytest.raises(ScheduleError, match=r"\(in-place\): gpu 1: race on o\[1\] \(i is "
                                            r"o\[1\.\.1\] in-place\) between tb \d step 0 "
                                            r"\((s|cpy)\) and tb \d step 0 \((s|cpy)\)"):
        verify_msccl(racy)
    # a received chunk written one unit off
    t = next(tb.id for tb in g1.tbs if tb.recv >= 0)
    k = next(i for i, st in enumerate(g1.tbs[t].steps) if st.type == "r")
    moved = _edit(algo, 1, t, k, dstoff=(g1.tbs[t].steps[k].dstoff + 1) % 4)
    with pytest.raises(ScheduleError, match=r"gpu 1 o\[\d\] (holds chunk \d of \{\d\}; expected "
                                            r"chunk \d of \{\d\} only|is never written; "
                                            r"expected \{\d\} only)"):
        verify_msccl(moved)


def test_wrong_reduce_scatter_xml_is_caught_naming_mode_gpu_and_unit():
    algo = export_msccl(ring_reduce_scatter([0, 1, 2, 3]), fuse=False).algo
    # the final sum put into the input buffer: out of place it is read-only
    g0 = algo.gpus[0]
    t = next(tb.id for tb in g0.tbs if tb.recv >= 0)
    k = len(g0.tbs[t].steps) - 1
    assert g0.tbs[t].steps[k].dstbuf == "o"
    into_input = _edit(algo, 0, t, k, dstbuf="i", dstoff=0)
    with pytest.raises(ScheduleError, match=r"\(out-of-place\): gpu 0 tb \d step \d \(rrc\) "
                                            r"writes i\[0\], the input buffer"):
        verify_msccl(into_input)
    # a partial sum of the wrong chunk
    wrong = _edit(algo, 0, t, 0, srcoff=(g0.tbs[t].steps[0].srcoff + 1) % 4)
    with pytest.raises(ScheduleError, match="a sum of two different chunks"):
        verify_msccl(wrong)
    # the output shard holds one unit: an offset past it is the parser's error, with line
    text = to_xml(algo).replace('dstbuf="o" dstoff="0"', 'dstbuf="o" dstoff="1"', 1)
    with pytest.raises(XmlFormatError, match=r"rs\.xml:\d+: .*dstoff: units 1\.\.1 are outside "
                                             r"buffer o of gpu 0 \(o_chunks=1\)"):
        loads_msccl(text, file="rs.xml")


def test_import_refuses_scratch_reused_for_another_chunk():
    algo = export_msccl(ring_reduce_scatter([0, 1, 2, 3]), fuse=False).algo
    g0 = algo.gpus[0]
    # gpu 0 keeps chunks 2 and 1 in s[1] and s[0]: put both in s[1]
    edited = algo
    for tb in g0.tbs:
        for k, st in enumerate(tb.steps):
            if st.srcbuf == "s" and st.srcoff == 0:
                edited = _edit(edited, 0, tb.id, k, srcoff=1)
            if st.dstbuf == "s" and st.dstoff == 0:
                edited = _edit(edited, 0, tb.id, k, dstoff=1)
    with pytest.raises(ScheduleError, match="race on s"):
        verify_msccl(edited)  # the checker sees the overwrite race first
    with pytest.raises(ScheduleError, match=r"gpu 0 tb \d step \d \(\w+\): cannot be a topoplan "
                                            r"schedule: s\[1\] holds chunks 1, 2"):
        import_msccl(edited, check=False)


def test_sharded_rounded_grid_keeps_shard_boundaries():
    a, b = 0.123456789, 0.2
    bounds, note = _unit_grid([a, 0.5 - a, b, 0.5 - b], nshards=2)
    assert bounds[2] * 2 == bounds[-1] and note is not None and "per shard" in note
    assert all(abs((y - x) / bounds[-1] - c) <= 1 / bounds[-1]
               for x, y, c in zip(bounds, bounds[1:], [a, 0.5 - a, b, 0.5 - b]))
    # end to end: a two-rank allgather of those chunks
    steps = [[[Op(OpKind.SEND, 1, 0, False, 2), Op(OpKind.RECV, 1, 2, False, 2)]],
             [[Op(OpKind.SEND, 0, 2, False, 2), Op(OpKind.RECV, 0, 0, False, 2)]]]
    schedule = build_schedule(2, [a, 0.5 - a, b, 0.5 - b], steps, collective="allgather")
    result, algo = _round_trip(schedule)
    assert any("rounded" in n for n in result.notes)
    assert algo.gpus[0].i_chunks * 2 == algo.nchunksperloop
    assert import_msccl(algo).collective == "allgather"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fuse=st.booleans(), channels=st.integers(1, 3))
def test_property_sharded_export_check_import_verify(data, fuse, channels):
    n = data.draw(st.integers(2, 7), label="n")
    collective = data.draw(st.sampled_from(SHARDED), label="collective")
    kind = data.draw(st.sampled_from(["ring", "ring-topo", "rhd"]), label="planner")
    if kind == "ring":
        order = data.draw(st.permutations(list(range(n))), label="order")
        build = ring_allgather if collective == "allgather" else ring_reduce_scatter
        schedule = build(list(order))
    else:
        schedule = topoplan.plan(switch_cluster(n), algorithm=kind, size=1 << 20,
                                 collective=collective)
    if data.draw(st.booleans(), label="coalesce"):
        schedule = coalesce(schedule)
    result = export_msccl(schedule, fuse=fuse, channels=channels)
    algo = loads_msccl(to_xml(result.algo))
    assert set(verify_msccl(algo).modes) == {"inplace", "outofplace"}
    assert limit_violations(algo) == []
    back = import_msccl(algo)
    assert verify(back).collective == collective
    assert back.nsteps == schedule.nsteps and _shape(back) == _shape(schedule)


def test_cli_exports_and_imports_a_planned_allgather(tmp_path, capsys):
    plan = tmp_path / "ag.json"
    assert main(["plan", "topologies/dgx1_v100.yaml", "--algorithm", "rhd", "--collective",
                 "allgather", "--size", "1MiB", "-o", str(plan)]) == 0
    xml = tmp_path / "ag.xml"
    capsys.readouterr()
    assert main(["export", str(plan), "--format", "msccl", "-o", str(xml)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "allgather of 8 GPUs" in out and "passes the MSCCL check" in out
    assert re.search(r"serves calls whose count per rank is a multiple of 8 \(32B of "
                     r"float32\); the plan's 1MiB \(32768 float32 elements per rank\) is one",
                     out)
    assert 'coll="allgather"' in xml.read_text()
    back = tmp_path / "back.json"
    assert main(["import", str(xml), "-o", str(back)]) == 0
    assert json.loads(back.read_text())["collective"] == "allgather"
    assert main(["verify", str(back)]) == 0
    assert main(["simulate", "topologies/dgx1_v100.yaml", str(back), "--size", "1MiB"]) == 0


def test_cli_reduce_scatter_error_names_the_file(tmp_path, capsys):
    plan = tmp_path / "rs.json"
    assert main(["plan", "topologies/ddl_two_switch.yaml", "--algorithm", "ring",
                 "--collective", "reduce_scatter", "--size", "1MiB", "-o", str(plan)]) == 0
    xml = tmp_path / "rs.xml"
    assert main(["export", str(plan), "-o", str(xml)]) == 0
    capsys.readouterr()
    text = xml.read_text()
    assert 'coll="reducescatter"' in text
    bad = tmp_path / "bad.xml"
    bad.write_text(text.replace('coll="reducescatter"', 'coll="reduce_scatter"'))
    assert main(["import", "msccl", str(bad), "-o", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert "bad.xml:1" in err and "coll" in err and "msccl-tools' name" in err
    assert "reducescatter" in err
    assert not (tmp_path / "x.json").exists()


def test_the_cluster_fingerprint_goes_through_the_xml_and_back(tmp_path):
    """Export writes the plan's cluster fingerprint as an <algo> attribute the executor
    ignores; import puts it back, so the imported plan is still refused elsewhere."""
    from topoplan.ir.fingerprint import META_KEY, check_fingerprint, cluster_fingerprint
    from topoplan.interop.msccl import FINGERPRINT_ATTR

    cluster = load_topology("ddl_two_switch")
    mark = cluster_fingerprint(cluster)
    schedule = topoplan.plan(cluster, algorithm="ring", size=1 << 20).with_meta(
        cluster_fingerprint=mark)
    algo = export_msccl(schedule).algo
    text = to_xml(algo)
    head = text.splitlines()[0]
    assert f' {FINGERPRINT_ATTR}="{mark}"' in head
    assert head.count('="') <= 16  # the executor's parser keeps 16 attributes (MAX_ATTR_COUNT)
    again = loads_msccl(text)
    assert again == algo and again.cluster_fingerprint == mark
    back = import_msccl(again)
    assert back.meta[META_KEY] == mark
    check_fingerprint(back, cluster, plan="back.json", cluster_file="ddl.yaml", force=False)
    other = load_topology("dgx1_v100")
    with pytest.raises(ScheduleError, match="was planned for another cluster"):
        check_fingerprint(back, other, plan="back.json", cluster_file="dgx1.yaml", force=False)
    # A plan without one (older plans, files of other tools): none is invented.
    planned = topoplan.plan(cluster, algorithm="ring", size=1 << 20)
    unmarked = dataclasses.replace(planned, meta={k: v for k, v in planned.meta.items()
                                                  if k != META_KEY})
    bare = export_msccl(unmarked).algo
    assert FINGERPRINT_ATTR not in to_xml(bare)
    assert META_KEY not in import_msccl(loads_msccl(to_xml(bare))).meta


def test_export_says_in_one_line_that_it_fell_back(tmp_path, capsys):
    """mcf on ddl_two_switch: fused thread blocks could deadlock, the export falls back to
    separate send and receive thread blocks. One short line says so; the checker's
    account of the deadlock (a line per thread block) only with --verbose."""
    cluster = "topologies/ddl_two_switch.yaml"
    plan, xml = tmp_path / "mcf.json", tmp_path / "mcf.xml"
    assert main(["plan", cluster, "-a", "mcf", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "-o", str(xml)]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("topoplan: note")]
    assert notes[-1] == (
        "topoplan: note: fused thread blocks would deadlock: one that sends and receives "
        "posts its send first, and its messages of up to 71 MSCCL chunks are over the 2 a "
        "connection buffers under Simple, so each GPU waits for a peer that is sending too; "
        "exported with separate send and receive thread blocks (the same steps and data) "
        "(--verbose says why)")
    assert main(["export", str(plan), "-o", str(xml), "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "tbs cannot move" in err and "(--verbose says why)" not in err
    assert main(["import", "msccl", str(xml), "-o", str(tmp_path / "back.json")]) == 0
    back = json.loads((tmp_path / "back.json").read_text())
    assert back["meta"]["cluster_fingerprint"] == json.loads(plan.read_text())["meta"][
        "cluster_fingerprint"]


@pytest.mark.parametrize("old, new", [
    ("topoplan.interop.msccl_export", "topoplan.interop.msccl.export"),
    ("topoplan.interop.msccl_import", "topoplan.interop.msccl.import_")])
def test_the_old_module_paths_warn_and_are_the_new_modules(old, new, monkeypatch):
    import importlib
    import sys

    import topoplan.interop
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(topoplan.interop, old.rsplit(".", 1)[1], raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)} moved: import "
                                                rf"{re.escape(new)}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and sys.modules[old] is module


def test_the_old_verbs_warn_naming_the_new_and_do_the_same(tmp_path):
    import topoplan.interop.msccl as msccl

    text = to_xml(export_msccl(ring_schedule([0, 1, 2])).algo)
    path = tmp_path / "ring.xml"
    path.write_text(text)
    for old, new, arg in (("read_msccl", "load_msccl", path), ("parse_msccl", "loads_msccl", text)):
        with pytest.warns(DeprecationWarning,
                          match=f"^{old} is deprecated; use topoplan.interop.msccl.{new}$"):
            algo = getattr(msccl, old)(arg)
        assert algo == getattr(msccl, new)(arg)
    with pytest.warns(DeprecationWarning, match="^check_msccl is deprecated; use "
                                                "topoplan.interop.msccl.verify_msccl$"):
        report = msccl.check_msccl(algo, capacity=4)
    assert report == verify_msccl(algo, capacity=4)
    assert msccl.check_msccl.__name__ == "check_msccl"
    assert "verify_msccl" in (msccl.check_msccl.__doc__ or "")


# ---- which calls the executor picks an export for ----------------------------------------

def test_grid_serves_the_plans_own_size():
    """The executor picks an algorithm only for counts that are multiples of
    nchunksperloop: mcf's exact grid on ddl_two_switch (1932 chunks) serves no
    power-of-two buffer, its own 256 MiB included. The default grid rounds to one that
    does, says so, and stays within 1% of the plan; every export says what it serves."""
    cluster = load_topology("ddl_two_switch")
    size = 256 << 20
    schedule = topoplan.plan(cluster, algorithm="mcf", size=size)
    exact = export_msccl(schedule, grid="exact")
    assert exact.algo.nchunksperloop == 1932
    assert exact.serves() == ("serves calls whose element count is a multiple of 1932 "
                              "(7.55KiB of float32); the plan's 256MiB (67108864 float32 "
                              "elements) is NOT one")
    served = export_msccl(schedule)
    assert served.algo.nchunksperloop == 4096
    assert served.serves().endswith("the plan's 256MiB (67108864 float32 elements) is one")
    assert served.notes[0].startswith("the exact grid of 1932 MSCCL chunks would serve no "
                                      "call of the plan's 256MiB (67108864 float32 elements); "
                                      "chunk fractions are not multiples of 1/D")
    xml = to_xml(served.algo)
    assert 'topoplanServes="element counts that are multiples of 4096"' in xml
    assert loads_msccl(xml) == served.algo
    back = import_msccl(loads_msccl(xml))
    t0 = topoplan.simulate(cluster, schedule, size=size, profile="ideal").time_s
    t1 = topoplan.simulate(cluster, back, size=size, profile="ideal").time_s
    assert t1 == pytest.approx(t0, rel=0.01)
    pow2 = export_msccl(topoplan.plan(cluster, algorithm="ring", size=size), grid="pow2")
    assert pow2.algo.nchunksperloop & (pow2.algo.nchunksperloop - 1) == 0


def test_cli_says_what_an_export_serves(tmp_path, capsys):
    plan, xml = tmp_path / "mcf.json", tmp_path / "mcf.xml"
    assert main(["plan", "topologies/ddl_two_switch.yaml", "-a", "mcf", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "-o", str(xml), "--grid", "exact"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {xml}\n")  # the path whole, however long
    assert max(map(len, out.splitlines()[1:])) <= 80
    assert ("serves calls whose element count is a multiple of 1932 (7.55KiB of float32); "
            "the plan's 256MiB (67108864 float32 elements) is NOT one") in " ".join(out.split())
    assert main(["export", str(plan), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nchunksperloop"] == 4096 and data["serves"].endswith("is one")


def test_fused_thread_blocks_say_why_they_deadlock():
    """hierarchical on dgx_a100_x4 sends 4-chunk messages before it receives: over the 2
    chunks a Simple connection buffers, fused thread blocks deadlock and the export
    falls back, saying so; LL128 buffers 8, and there they stay fused."""
    cluster = load_topology("dgx_a100_x4")
    schedule = topoplan.plan(cluster, algorithm="hierarchical", size=1 << 26)
    simple = export_msccl(schedule)
    assert simple.fused == 0
    assert any(note.startswith("fused thread blocks would deadlock: one that sends and "
                               "receives posts its send first, and its messages of up to 4 "
                               "MSCCL chunks are over the 2 a connection buffers under "
                               "Simple (--proto LL128 buffers 8: fused there)")
               for note in simple.notes), simple.notes
    ll128 = export_msccl(schedule, proto="LL128")
    assert ll128.fused > 0 and not any("deadlock" in note for note in ll128.notes)
