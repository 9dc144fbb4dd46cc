"""Bad input through the two readers: every outcome is a result or a one-line error.

Hypothesis feeds the cluster reader (YAML) and the schedule reader (JSON) raw bytes and
mutated copies of valid files (the shipped topologies, a planned schedule): a reader
either returns, or raises its own error class, on one line, naming the file (and the
line, for the YAML reader, where the text has one). A few of the inputs go through the
CLI, which must exit 1 with one line on stderr and no traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import topoplan
from topoplan.errors import ClusterSpecError, ScheduleError

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
SMALL = [p for p in TOPOLOGIES if p.stem != "leaf_spine_1024"]  # fast to load many times
FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Errors that cannot point at a line: the file as a whole is wrong.
WHOLE_FILE = ("not a text file", "cannot read", "nested too deeply", "YAML error")


def _check_cluster_error(exc: ClusterSpecError, file: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    assert message.startswith(f"{file}:"), message
    assert exc.file == file
    if not any(reason in message for reason in WHOLE_FILE):
        assert exc.line is not None, message


def _load_cluster_text(text: str, file: str = "fuzz.yaml") -> None:
    try:
        topoplan.loads_cluster(text, file=file)
    except ClusterSpecError as exc:
        _check_cluster_error(exc, file)


# ---- mutations of a text -----------------------------------------------------------------
JUNK = st.sampled_from(["", ":", "- ", "{", "}", "[", "]", "'", '"', "&a", "*a", "!!str", "#",
                        "\t", "\x00", "\x07", "\ufeff", "é", "{i}", "{i//0}", "count: 0",
                        "gpus: -1", "bandwidth: 0", "1e999", "-5", "nan", ".inf", "10" * 40,
                        "2001-13-45", "null", "~", "? [a]", "<<: *a", "---", "...", "\\"])


@st.composite
def mutated(draw, texts: list[str]) -> str:
    """One of ``texts`` with a few edits: deletions, insertions, replaced or swapped lines,
    a number changed, a cut."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "insert", "line", "swap", "number", "truncate"]))
        n = len(text)
        if kind == "delete" and n:
            a = draw(st.integers(0, n - 1))
            text = text[:a] + text[a + draw(st.integers(1, 20)):]
        elif kind == "insert":
            a = draw(st.integers(0, n))
            piece = draw(st.one_of(JUNK, st.text(max_size=8)))
            text = text[:a] + piece + text[a:]
        elif kind in ("line", "swap"):
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            if kind == "line":
                lines[i] = draw(st.one_of(JUNK, st.text(max_size=20)))
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind == "number":
            digits = [i for i, c in enumerate(text) if c.isdigit()]
            if digits:
                a = draw(st.sampled_from(digits))
                text = text[:a] + draw(st.sampled_from(["0", "-1", "99999999", "1e999", "x",
                                                        "0.5", "10" * 30])) + text[a + 1:]
        elif kind == "truncate" and n:
            text = text[:draw(st.integers(0, n - 1))]
    return text


# ---- cluster reader ----------------------------------------------------------------------
@FUZZ
@given(st.binary(max_size=300))
def test_cluster_reader_on_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "bytes.yaml"
    path.write_bytes(data)
    try:
        topoplan.load_cluster(path)
    except ClusterSpecError as exc:
        _check_cluster_error(exc, str(path))


def _without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


CLUSTERS = [p.read_text() for p in SMALL]
CLUSTERS += [_without_comments(text) for text in CLUSTERS]  # edits then land on the content


@FUZZ
@given(mutated(CLUSTERS))
def test_cluster_reader_on_mutated_topologies(text):
    _load_cluster_text(text)


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("ab:-[]{},&*!'\" \n\t0123456789.#|>?")),
               max_size=120))
def test_cluster_reader_on_yaml_punctuation(text):
    _load_cluster_text(text)


@pytest.mark.parametrize("text", [
    "a: " + "[" * 5000,                                           # nesting
    "&a [*a]",                                                    # an alias inside itself
    "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(                    # aliases of aliases
        f"{k}: &{k} [{', '.join([f'*{p}'] * 10)}]\n" for p, k in zip("abcdef", "bcdefg")),
    "name: x\nboxes: [{name: a, gpus: 1, fabric: {bandwidth: 1" + "0" * 400 + "}}]\n",
    "name: x\nwhen: 2001-13-45\n",
    "name: x\x00\nboxes: []\n",
])
def test_cluster_reader_on_hostile_yaml(text):
    with pytest.raises(ClusterSpecError) as info:
        topoplan.loads_cluster(text, file="hostile.yaml")
    _check_cluster_error(info.value, "hostile.yaml")


# ---- schedule reader ---------------------------------------------------------------------
def _valid_schedules() -> list[str]:
    cluster = topoplan.load_cluster(ROOT / "topologies" / "ddl_two_switch.yaml")
    ring = topoplan.plan(cluster, "ring", size=1 << 20)
    hier = topoplan.plan(cluster, "hierarchical", size=1 << 20)  # v2: chunk ranges
    return [ring.to_json(), hier.to_json(indent=1)]


SCHEDULES = _valid_schedules()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.sampled_from([10**400, 1e308, 0.5, -0.0])
    | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6)


def _load_schedule_text(text: str, file: str = "fuzz.json") -> None:
    try:
        schedule = topoplan.loads_schedule(text, file)
    except ScheduleError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{file}:"), message
        return
    try:  # what loads may still be wrong, but the verifier must say so in one line
        topoplan.verify(schedule)
    except ScheduleError as exc:
        assert "\n" not in str(exc), str(exc)


@st.composite
def mutated_schedule(draw) -> str:
    """A valid schedule's JSON with one value somewhere replaced, removed or added."""
    data = json.loads(draw(st.sampled_from(SCHEDULES)))
    node, parents = data, []
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        parents.append((node, key))
        node = node[key]
    if parents:
        parent, key = parents[-1]
        action = draw(st.sampled_from(["replace", "remove"]))
        if action == "remove":
            del parent[key]
        else:
            parent[key] = draw(JSON_VALUES)
    else:
        data[draw(st.text(max_size=6))] = draw(JSON_VALUES)
    return json.dumps(data)


@st.composite
def mutated_ops(draw) -> str:
    """A valid schedule's JSON with its ops edited: a field changed, an op dropped, copied or
    moved to another step, a step dropped, the rank count or the chunks changed."""
    data = json.loads(draw(st.sampled_from(SCHEDULES)))
    for _ in range(draw(st.integers(1, 3))):
        program = draw(st.sampled_from(data["ranks"]))
        steps = program["steps"]
        kind = draw(st.sampled_from(["field", "drop", "copy", "move", "step", "nranks",
                                     "chunks"]))
        if kind == "nranks":
            data["nranks"] = draw(st.integers(0, 6))
        elif kind == "chunks":
            data["chunks"] = draw(st.sampled_from(
                [[1.0], [0.5, 0.5], [0.25] * 4, [0.5, 0.25, 0.25, 0.0], [2, -1]]))
        elif kind == "step" and steps:
            del steps[draw(st.integers(0, len(steps) - 1))]
        elif steps and any(steps):
            s = draw(st.sampled_from([i for i, step in enumerate(steps) if step]))
            j = draw(st.integers(0, len(steps[s]) - 1))
            op = steps[s][j]
            if kind == "field":
                op[draw(st.sampled_from(["op", "peer", "chunk", "reduce", "count"]))] = draw(
                    st.one_of(st.integers(-1, 9), st.sampled_from(["send", "recv", True, None])))
            elif kind == "drop":
                del steps[s][j]
            elif kind == "copy":
                steps[s].append(dict(op))
            else:
                steps[draw(st.integers(0, len(steps) - 1))].append(steps[s].pop(j))
    return json.dumps(data)


@FUZZ
@given(mutated_ops())
def test_schedule_reader_and_verifier_on_edited_ops(text):
    _load_schedule_text(text)


@FUZZ
@given(st.binary(max_size=300))
def test_schedule_reader_on_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "bytes.json"
    path.write_bytes(data)
    try:
        topoplan.load_schedule(path)
    except ScheduleError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}:"), message


@FUZZ
@given(mutated_schedule())
def test_schedule_reader_on_mutated_values(text):
    _load_schedule_text(text)


@FUZZ
@given(mutated(SCHEDULES))
def test_schedule_reader_on_mutated_text(text):
    _load_schedule_text(text)


# ---- through the CLI ---------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topoplan", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("name, content", [
    ("control.yaml", b"name: x\x07\nboxes: []\n"),
    ("deep.yaml", b"a: " + b"[" * 5000),
    ("binary.yaml", b"\xff\xfe\x00name"),
    ("cut.yaml", (ROOT / "topologies" / "dgx1_v100.yaml").read_bytes()[:700]),
])
def test_topo_lint_bad_files_fail_in_one_line(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    result = _cli("topo", "lint", str(path))
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith(f"topoplan: error: {path}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize("name, content", [
    ("cut.json", SCHEDULES[0][:300].encode()),
    ("binary.json", b"\xff\xfe{}"),
    ("deep.json", b"[" * 100000),
    ("huge.json", SCHEDULES[0].replace('"chunks": [', '"chunks": [1' + "0" * 400 + ", ", 1)
     .encode()),
    ("empty.json", b""),
])
def test_verify_bad_files_fail_in_one_line(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    result = _cli("verify", str(path))
    assert result.returncode == 1, result.stdout
    assert result.stderr.startswith(f"topoplan: error: {path}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


def test_verify_names_a_truncated_file_in_whole_sentences(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(SCHEDULES[0][:300])
    result = _cli("verify", str(path))
    message = result.stderr.strip()
    assert message.endswith("the text ends before its brackets close: a truncated file?")
    assert " at column " in message and not message.split(";")[0].endswith(" at")


def test_a_key_with_a_line_break_in_it_stays_one_line():
    # found by the fuzzer: a key may hold a line break (U+0085 is one to YAML; a quoted
    # key may hold any)
    text = ('name: x\nswitches: [s]\nboxes:\n  - name: a\n    gpus: 1\n    nics:\n'
            '      - switch: s\n        "latency:0\\n25 us\\x85": 1\n')
    with pytest.raises(ClusterSpecError) as info:
        topoplan.loads_cluster(text, file="fuzz.yaml")
    message = str(info.value)
    assert "\n" not in message and "\x85" not in message
    assert message.startswith("fuzz.yaml:")
    _check_cluster_error(info.value, "fuzz.yaml")


@pytest.mark.parametrize("op", [{"op": "send"}, ["send"]])
def test_an_op_that_is_not_a_name_is_a_located_error(op):
    # found by scripts/fuzz_inputs.py: an op of a list or an object was looked up as a
    # name (TypeError: unhashable type)
    data = json.loads(SCHEDULES[0])
    data["ranks"][1]["steps"][0][0]["op"] = op
    with pytest.raises(ScheduleError,
                       match=r"^fuzz\.json: ranks\[1\]\.steps\[0\]\[0\]: unknown op "):
        topoplan.loads_schedule(json.dumps(data), "fuzz.json")
