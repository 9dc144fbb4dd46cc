"""Schedule IR v1: JSON round trip and validation of files written by others."""

import json

import pytest

from topoplan import ScheduleError, load_schedule, loads_schedule
from topoplan.ir.schedule import (OpKind, build_schedule, chunk_bounds, equal_chunks, recv, send)


def ring(n):
    steps = [[] for _ in range(n)]
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        for s in range(n - 1):
            steps[r].append([send(nxt, (r - s) % n), recv(prv, (r - s - 1) % n, True)])
        for s in range(n - 1):
            steps[r].append([send(nxt, (r + 1 - s) % n), recv(prv, (r - s) % n)])
    return build_schedule(n, equal_chunks(n), steps, algorithm="ring", cluster="test")


def test_round_trip_through_file(tmp_path):
    schedule = ring(5)
    path = tmp_path / "plan.json"
    schedule.save(path)
    again = load_schedule(path)
    assert again == schedule
    assert again.meta == {"algorithm": "ring", "cluster": "test"}
    data = json.loads(path.read_text())
    assert data["format"] == "topoplan-schedule" and data["version"] == 1
    assert data["ranks"][0]["steps"][0] == [
        {"op": "send", "peer": 1, "chunk": 0},
        {"op": "recv", "peer": 4, "chunk": 4, "reduce": True}]


def test_ranges_round_trip_as_version_2(tmp_path):
    from tests.support import schedules as S
    schedule = S.halving_ranges(8)
    assert schedule.version == 2
    path = tmp_path / "plan.json"
    schedule.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 2
    assert data["ranks"][0]["steps"][0] == [
        {"op": "send", "peer": 4, "chunk": 4, "count": 4},
        {"op": "recv", "peer": 4, "chunk": 0, "count": 4, "reduce": True}]
    assert load_schedule(path) == schedule


def test_several_reducing_recvs_need_version_2():
    from tests.support import schedules as S
    data = S.all_to_all(3).to_dict()
    assert data["version"] == 2
    assert loads_schedule(json.dumps(data)) == S.all_to_all(3)
    data["version"] = 1
    with pytest.raises(ScheduleError, match=r"ranks\[0\].steps\[0\]: two recvs into chunk 0 in "
                                            r"one step \(several reducing recvs need version 2\)"):
        loads_schedule(json.dumps(data), "plan.json")


def test_design_md_example_parses():
    text = json.dumps({
        "format": "topoplan-schedule", "version": 1, "collective": "allreduce", "nranks": 2,
        "chunks": [0.5, 0.5],
        "ranks": [
            {"rank": 0, "steps": [[{"op": "send", "peer": 1, "chunk": 0},
                                   {"op": "recv", "peer": 1, "chunk": 1, "reduce": True}],
                                  [{"op": "send", "peer": 1, "chunk": 1},
                                   {"op": "recv", "peer": 1, "chunk": 0}]]},
            {"rank": 1, "steps": [[{"op": "send", "peer": 0, "chunk": 1},
                                   {"op": "recv", "peer": 0, "chunk": 0, "reduce": True}],
                                  [{"op": "send", "peer": 0, "chunk": 0},
                                   {"op": "recv", "peer": 0, "chunk": 1}]]}],
        "meta": {"algorithm": "ring"}, "extra_key_ignored": 1})
    schedule = loads_schedule(text)
    assert schedule.nranks == 2 and schedule.nsteps == 2
    assert schedule.ranks[0].steps[1][1].kind is OpKind.RECV
    assert schedule.ranks[0].steps[1][1].reduce is False  # "reduce" defaults to false


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text("old")
    schedule = ring(3)
    monkeypatch.setattr(type(schedule), "to_json", lambda self, indent=None: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        schedule.save(path)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def _mutate(fn):
    data = ring(3).to_dict()
    fn(data)
    return json.dumps(data)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["ranks"][1]["steps"][0][0].update(op="sned"),
     "plan.json: ranks[1].steps[0][0]: unknown op 'sned'; expected 'send', 'recv' or a native collective ('allreduce', 'reduce_scatter', 'allgather', 'broadcast', 'reduce')"),
    (lambda d: d["ranks"][2]["steps"][3][1].update(chunk=7),
     "plan.json: ranks[2].steps[3][1]: chunk 7 out of range(3)"),
    (lambda d: d["ranks"][0]["steps"][0][0].update(peer=3),
     "plan.json: ranks[0].steps[0][0]: peer 3 out of range(3)"),
    (lambda d: d["ranks"][0]["steps"][0][0].update(peer=0),
     "plan.json: ranks[0].steps[0][0]: rank 0 names itself as peer"),
    (lambda d: d.update(chunks=[0.5, 0.25, 0.2]),
     "plan.json: chunks: fractions must sum to 1, got 0.95"),
    (lambda d: d.update(chunks=[0.5, 0.75, -0.25]),
     "plan.json: chunks[2]: fractions must be positive numbers, got -0.25"),
    (lambda d: d.update(version=5),
     "plan.json: version: this topoplan reads versions 1 to 4, got 5"),
    (lambda d: d["ranks"][0]["steps"][0][0].update(channel=1),
     'plan.json: ranks[0].steps[0][0]: channel needs "version": 4'),
    (lambda d: (d.update(version=4), d["ranks"][0]["steps"][0][0].update(channel=-1)),
     "plan.json: ranks[0].steps[0][0]: channel must be an integer >= 0, got -1"),
    (lambda d: d["ranks"][0]["steps"][0][0].update(count=2),
     'plan.json: ranks[0].steps[0][0]: count (a chunk range) needs "version": 2'),
    (lambda d: (d.update(version=2), d["ranks"][0]["steps"][0][0].update(count=0)),
     "plan.json: ranks[0].steps[0][0]: count must be an integer >= 1, got 0"),
    (lambda d: (d.update(version=2), d["ranks"][0]["steps"][0][0].update(chunk=1, count=4)),
     "plan.json: ranks[0].steps[0][0]: chunks 1..4 run past the last chunk 2"),
    (lambda d: d.update(format="msccl"),
     "plan.json: format: expected 'topoplan-schedule', got 'msccl'"),
    (lambda d: d.update(nranks=4),
     "plan.json: ranks: expected a list of 4 rank programs, got 3"),
    (lambda d: d["ranks"][0]["steps"][0][1].update(reduce="yes"),
     "plan.json: ranks[0].steps[0][1]: reduce must be true or false, got 'yes'"),
    (lambda d: d["ranks"][0]["steps"][0].append({"op": "recv", "peer": 1, "chunk": 2}),
     "plan.json: ranks[0].steps[0]: two recvs into chunk 2 in one step"),
])
def test_bad_files_are_rejected_with_the_place_named(mutate, message):
    with pytest.raises(ScheduleError) as info:
        loads_schedule(_mutate(mutate), "plan.json")
    assert str(info.value) == message


def test_not_json(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"format": \n oops')
    with pytest.raises(ScheduleError, match=r"plan.json:2: not valid JSON"):
        load_schedule(path)


@pytest.mark.parametrize("text, message", [
    ('{"format": "topoplan-schedule", "nranks', "plan.json:1: not valid JSON: unterminated "
     "string starting at column 33; the text ends before its brackets close: a truncated file?"),
    ('{"format": "topoplan-schedule", "ranks": [tru', "plan.json:1: not valid JSON: expecting "
     "value at column 43; the text ends before its brackets close: a truncated file?"),
    ('{"a": 1,}', "plan.json:1: not valid JSON: expecting property name enclosed in double "
     "quotes at column 9"),
    (" \n", "plan.json: empty file; a schedule is a JSON object (topoplan plan CLUSTER.yaml -o "
     "PLAN.json writes one)"),
    ("[" * 100000, "plan.json: not a schedule: JSON nested too deeply"),
])
def test_broken_json_is_named_in_whole_sentences(text, message):
    with pytest.raises(ScheduleError) as info:
        loads_schedule(text, "plan.json")
    assert str(info.value) == message


def test_fractions_too_big_for_a_float(tmp_path):
    with pytest.raises(ScheduleError, match="chunks: fractions must sum to 1, got inf"):
        loads_schedule(_mutate(lambda d: d.update(chunks=[10**400])), "plan.json")


def test_not_utf8(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b'{"format":\n "\xff"}')
    with pytest.raises(ScheduleError) as info:
        load_schedule(path)
    assert str(info.value) == f"{path}:2: not a text file (UTF-8 expected, byte 0xff)"


def test_missing_file(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read schedule: No such file"):
        load_schedule(tmp_path / "nope.json")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 100, 1001])
def test_chunk_bounds_cover_the_buffer(n):
    for chunks in (equal_chunks(3), equal_chunks(8), (0.1, 0.2, 0.3, 0.4), (1.0,)):
        bounds = chunk_bounds(chunks, n)
        assert len(bounds) == len(chunks)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a <= b for a, b in bounds)
        assert all(bounds[k][1] == bounds[k + 1][0] for k in range(len(bounds) - 1))


def test_chunk_bounds_follow_the_floor_rule():
    assert chunk_bounds((0.25, 0.25, 0.5), 10) == [(0, 2), (2, 5), (5, 10)]
    assert chunk_bounds(equal_chunks(4), 2) == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_channels_round_trip_as_version_4_and_split_per_rank():
    from topoplan.ir.schedule import build_schedule, recv, send
    steps = [[[send(1, 0), send(1, 1, channel=1)], [recv(1, 0, True, channel=0)]],
             [[recv(0, 0, True), recv(0, 1, True, channel=1)], [send(0, 0)]]]
    s = build_schedule(2, [0.5, 0.5], steps, algorithm="test")
    assert s.version == 4 and s.nchannels == 2
    back = loads_schedule(s.to_json(), "x.json")
    assert back == s and back.version == 4
    assert [op.channel for op in back.ranks[0].steps[0]] == [0, 1]
    split = back.channel_steps(0)
    assert list(split) == [0, 1]
    assert [s for s, _ in split[0]] == [0, 1] and [s for s, _ in split[1]] == [0]
    assert split[1][0][1] == (send(1, 1, channel=1),)
    plain = build_schedule(2, [1.0], [[[send(1, 0)]], [[recv(0, 0)]]], algorithm="t")
    assert plain.version == 1 and plain.nchannels == 1 and "channel" not in plain.to_json()
