"""The ranges a cluster file's quantities and counts may take (docs/CLUSTER.md, "Ranges").

Outside the plausible range a value is a :class:`RangeWarning`; beyond the limits of
topoplan's arithmetic, a located :class:`ClusterSpecError`, at load time, so that no
command sees it. At the limits, planning and simulating stays finite.
"""

from __future__ import annotations

import json
import math
import re
import textwrap

import pytest

from tests.support.clusters import topology_text
from topoplan.cli import main
from topoplan.cluster import loads_cluster
from topoplan.cluster.spec import MAX_RANKS
from topoplan.errors import ClusterSpecError, RangeWarning, TopoplanWarning
from topoplan.units import MAX_SIZE


def edit(name: str, pattern: str, replacement: str) -> str:
    """The shipped topology ``name`` with the first match of ``pattern`` outside its
    comments replaced."""
    lines = topology_text(name).split("\n")
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("#") and re.search(pattern, line):
            lines[i] = re.sub(pattern, replacement, line, count=1)
            return "\n".join(lines)
    raise AssertionError(f"{pattern!r} not in {name}")


def load_error(text: str) -> str:
    with pytest.raises(ClusterSpecError) as info:
        loads_cluster(text, file="c.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def range_warnings(text: str) -> list[str]:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TopoplanWarning)
        loads_cluster(text, file="c.yaml")
    return [str(w.message) for w in caught if isinstance(w.message, RangeWarning)]


# ---- the values that broke plan: each is an error at load time, in lint and plan -------
NIC = r"bandwidth: 100 GB/s"
BROKEN = {
    "nic-1e308": ("ddl_two_switch", NIC, "bandwidth: 1e308 GB/s",
                  "c.yaml:12: boxes[0].nics[0].bandwidth: 1e308 GB/s is out of range: a "
                  "bandwidth must be 1 bit/s to 1000 TB/s"),
    "nic-1e308-bare": ("ddl_two_switch", NIC, "bandwidth: 1e308",
                       "c.yaml:12: boxes[0].nics[0].bandwidth: 1e308 GB/s is out of range"),
    "latency-1e300": ("ddl_two_switch", r"latency: 1 us", "latency: 1e300 us",
                      "c.yaml:12: boxes[0].nics[0].latency: 1e300 us is out of range: a "
                      "latency must be 0 to 1e6 s"),
    "switch-link-1e308": ("ddl_two_switch", r"bandwidth: 10 GB/s", "bandwidth: 1e308 GB/s",
                          "c.yaml:17: links[0].bandwidth: 1e308 GB/s is out of range"),
    "subnormal": ("dgx_a100_x4", r"bandwidth: 300 GB/s", "bandwidth: 1e-310 GB/s",
                  "boxes[0].fabric.bandwidth: 1e-310 GB/s is out of range"),
    "switch-count": ("ddl_two_switch", r"- name: switch1", '- {name: "s{i}", count: 100000}',
                     "c.yaml:10: switches[1].count: 100001 switches in all, more than 8192"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_values_beyond_the_arithmetic_are_located_errors(case):
    name, pattern, replacement, expected = BROKEN[case]
    message = load_error(edit(name, pattern, replacement))
    assert expected in message, message
    if "out of range" in message:  # the range and the plausible range are named
        assert "(plausible: " in message


@pytest.mark.parametrize("command", [["topo", "lint"], ["plan", "--size", "1MiB", "-a", "ring"]])
def test_lint_and_plan_refuse_them_in_one_line(tmp_path, capsys, command):
    for case in sorted(BROKEN):
        name, pattern, replacement, expected = BROKEN[case]
        path = tmp_path / f"{case}.yaml"
        path.write_text(edit(name, pattern, replacement))
        args = command[:1] + ([str(path)] if command[0] == "plan" else command[1:] + [str(path)])
        args += command[1:] if command[0] == "plan" else []
        assert main(args) == 1, case
        err = capsys.readouterr().err
        assert err.startswith(f"topoplan: error: {path}:") and err.count("\n") == 1, err
        assert expected.removeprefix("c.yaml:").split(":", 1)[1].strip() in err, err


# ---- boundaries: just inside, just outside ----------------------------------------------
def one_box(bandwidth: str = "100 GB/s", latency: str = "1 us") -> str:
    return textwrap.dedent(f"""\
        name: x
        boxes:
          - name: a
            gpus: 2
            fabric: {{bandwidth: {bandwidth}, latency: {latency}}}
        """)


@pytest.mark.parametrize("bandwidth, outcome", [
    ("1 bit/s", "warn"), ("0.99 bit/s", "error"), ("0.125 B/s", "warn"),
    ("1000 TB/s", "warn"), ("1001 TB/s", "error"), ("1e6 GB/s", "warn"), ("1.01e6", "error"),
    ("1 Mbit/s", "ok"), ("0.99 Mbit/s", "warn"), ("100 TB/s", "ok"), ("101 TB/s", "warn"),
    ("1e-310 GB/s", "error"), ("1e308 GB/s", "error"), ("5e-324 B/s", "error"),
])
def test_bandwidth_boundaries(bandwidth, outcome):
    text = one_box(bandwidth=bandwidth)
    if outcome == "error":
        message = load_error(text)
        assert message.startswith("c.yaml:5: boxes[0].fabric.bandwidth: ")
        assert "must be 1 bit/s to 1000 TB/s" in message
        assert "(plausible: 1 Mbit/s to 100 TB/s)" in message
        return
    found = range_warnings(text)
    if outcome == "ok":
        assert found == []
    else:
        assert found == [f"c.yaml:5: boxes[0].fabric.bandwidth: {bandwidth}"
                         f"{' GB/s' if ' ' not in bandwidth else ''} is outside the "
                         "plausible range 1 Mbit/s to 100 TB/s; check the unit"]


@pytest.mark.parametrize("latency, outcome", [
    ("0 s", "ok"), ("1 s", "ok"), ("1.01 s", "warn"), ("1e6 s", "warn"), ("1e12 us", "warn"),
    ("1.01e6 s", "error"), ("1e300 us", "error"), ("1e-310 us", "ok"), ("-1 ns", "negative"),
])
def test_latency_boundaries(latency, outcome):
    text = one_box(latency=latency)
    if outcome == "negative":
        assert load_error(text).endswith("must be >= 0, got -1 ns")
    elif outcome == "error":
        message = load_error(text)
        assert message == (f"c.yaml:5: boxes[0].fabric.latency: {latency} is out of range: a "
                           "latency must be 0 to 1e6 s (11.6 days), what topoplan computes "
                           "with (plausible: 0 to 1 s)")
    else:
        found = range_warnings(text)
        assert (found == []) == (outcome == "ok"), found
        if found:
            assert found[0].startswith("c.yaml:5: boxes[0].fabric.latency: ")


def boxes(count: int, gpus: int = 1, switches: int = 1, links: int = 0) -> str:
    link = (f"links:\n  - {{a: sw0, b: \"t{{i}}\", count: {links}, bandwidth: 1 GB/s}}\n"
            if links else "")
    extra = f"  - {{name: \"t{{i}}\", count: {links}}}\n" if links else ""
    return (f"name: x\nswitches:\n  - {{name: \"sw{{i}}\", count: {switches}}}\n{extra}"
            f"boxes:\n  - name: \"n{{i}}\"\n    count: {count}\n    gpus: {gpus}\n"
            f"    fabric: {{bandwidth: 100 GB/s}}\n"
            f"    nics: [{{switch: sw0, bandwidth: 10 GB/s}}]\n{link}")


def test_the_rank_limit_is_checked_before_anything_is_built():
    message = load_error(boxes(count=MAX_RANKS // 4096 + 1, gpus=4096))
    assert message.startswith(f"c.yaml:6: boxes[0].count: {MAX_RANKS + 4096} GPUs in all, "
                              f"more than {MAX_RANKS}")
    assert "TOPOPLAN_MAX_RANKS raises the limit" in message


@pytest.mark.parametrize("what, make", [
    ("GPUs", lambda n: boxes(count=n)),
    ("switches", lambda n: boxes(count=2, switches=n)),
])
def test_count_boundaries(monkeypatch, what, make):
    monkeypatch.setenv("TOPOPLAN_MAX_RANKS", "64")
    limit = {"GPUs": 64, "switches": 16}[what]
    assert range_warnings(make(limit // 4)) == []
    found = range_warnings(make(limit // 4 + 1))
    assert len(found) == 1 and f"{limit // 4 + 1} {what} in all, more than {limit // 4}" \
        in found[0], found
    assert len(range_warnings(make(limit))) == 1
    assert f"{limit + 1} {what} in all, more than {limit}, " in load_error(make(limit + 1))


@pytest.mark.parametrize("nics, outcome", [(32, "ok"), (33, "warn"), (128, "warn"),
                                           (129, "error")])
def test_link_boundaries(monkeypatch, nics, outcome):
    monkeypatch.setenv("TOPOPLAN_MAX_RANKS", "16")  # links: 256, a warning above 64
    text = ("name: x\nswitches: [s]\nboxes:\n  - name: \"n{i}\"\n    count: 2\n    gpus: 1\n"
            "    nics:\n" + "      - {switch: s, bandwidth: 1 GB/s}\n" * nics)
    if outcome == "error":
        assert load_error(text).startswith(f"c.yaml:4: boxes[0]: {2 * nics} links in all, "
                                           "more than 256, ")
        return
    found = [w for w in range_warnings(text) if "links" in w]
    assert (found == []) == (outcome == "ok"), found


def test_a_bad_rank_limit_is_named(monkeypatch):
    monkeypatch.setenv("TOPOPLAN_MAX_RANKS", "lots")
    assert load_error(one_box()) == "TOPOPLAN_MAX_RANKS must be a whole number >= 1, got 'lots'"


def test_sizes_above_the_largest_message_are_refused(capsys):
    from topoplan.errors import PlannerError
    from topoplan.planners import plan
    from topoplan.units import parse_size
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    with pytest.raises(ValueError, match=r"at most 2\*\*60 bytes"):
        parse_size(str(MAX_SIZE * 2))
    with pytest.raises(PlannerError, match=r"at most 2\*\*60 bytes"):
        plan(loads_cluster(one_box()), "ring", size=MAX_SIZE * 2)
    with pytest.raises(SystemExit):
        main(["plan", "topologies/ddl_two_switch.yaml", "--size", "1e300"])
    assert "at most 2**60 (1 EiB)" in capsys.readouterr().err


# ---- at the limits the arithmetic holds --------------------------------------------------
LIMIT_CASES = {
    # (the NICs, the in-box fabric and GPU links, the switch links, their latencies)
    "slowest": ("1 bit/s", "1 bit/s", "1 bit/s", "0 s"),
    "fastest, slowest to start": ("1000 TB/s", "1000 TB/s", "1000 TB/s", "1e6 s"),
    "fast edges, slow core": ("1000 TB/s", "1000 TB/s", "1 bit/s", "1e6 s"),
    "slow edges, fast core": ("1 bit/s", "1000 TB/s", "1000 TB/s", "1 ns"),
}


def at_limits(name: str, nic: str, fabric: str, link: str, latency: str) -> str:
    out = []
    for line in topology_text(name).split("\n"):
        if not line.lstrip().startswith("#"):
            if "switch:" in line:
                bandwidth = nic
            elif re.search(r"\ba: [a-z]", line) and "b: " in line:
                bandwidth = link
            else:
                bandwidth = fabric
            line = re.sub(r"bandwidth: [^,}]*", f"bandwidth: {bandwidth}", line)
            line = re.sub(r"latency: [^,}]*", f"latency: {latency}", line)
        out.append(line)
    return "\n".join(out)


def finite_numbers(value) -> None:
    """Every number in a JSON value is finite (JSON has no nan; json.loads reads NaN)."""
    if isinstance(value, float):
        assert math.isfinite(value), value
    elif isinstance(value, dict):
        for item in value.values():
            finite_numbers(item)
    elif isinstance(value, list):
        for item in value:
            finite_numbers(item)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
@pytest.mark.parametrize("name", ["ddl_two_switch", "dgx1_v100"])
def test_plans_at_the_limits_stay_finite(tmp_path, capsys, name, case):
    path = tmp_path / "limits.yaml"
    path.write_text(at_limits(name, *LIMIT_CASES[case]))
    for size in ("4", str(MAX_SIZE)):  # one float32 (1 byte is none), the largest message
        assert main(["plan", str(path), "--size", size, "--json", "-o",
                     str(tmp_path / "plan.json")]) == 0
        out = capsys.readouterr().out
        assert not re.search(r"nan|inf", out, re.I), out
        result = json.loads(out)
        finite_numbers(result)
        assert all(row["time_s"] is None or row["time_s"] > 0 for row in result["candidates"])
        assert main(["simulate", str(path), str(tmp_path / "plan.json"), "--sizes", size]) == 0
        out = capsys.readouterr().out
        assert not re.search(r"\bnan\b|\binf\b", out, re.I), out


# ---- clusters built in code: the API refuses what the loader would have ---------------
# A Cluster made through the Python API (or one whose graph is edited after loading)
# skips the loader's checks. Such a value made ring, auto and the NCCL row divide by zero,
# overflow, or wait forever (-1 bytes/s in the NCCL row's ring search; a NaN latency in
# the simulator's clock). simulate() and plan() now refuse it, naming the link.
BAD_VALUES = [("bandwidth", math.nan), ("bandwidth", math.inf), ("bandwidth", 0.0),
              ("bandwidth", -1.0), ("bandwidth", 1e-320), ("latency", math.nan),
              ("latency", math.inf), ("latency", -1.0)]


def coded_cluster(field: str, value: float):
    """Two one-GPU boxes on one switch, built in code, box b's NIC ``field`` = ``value``."""
    from topoplan.cluster import Box, Cluster, Nic
    nic = {"bandwidth": 12.5e9, "latency": 1e-6}
    bad = dict(nic, **{field: value})
    return Cluster(name="coded", switches=("sw",), boxes=(
        Box("a", 1, 0, nics=(Nic("sw", gpus=(0,), **nic),)),
        Box("b", 1, 1, nics=(Nic("sw", gpus=(0,), **bad),))))


def edited_cluster(field: str, value: float):
    """ddl_two_switch loaded, then its switch link's graph edge edited."""
    cluster = loads_cluster(topology_text("ddl_two_switch"), file="c.yaml")
    cluster.graph.edges["switch0", "switch1"][field] = value
    return cluster


def refused(call, *link: str) -> str:
    """The error ``call()`` raises, one line, naming every part of ``link``, in seconds."""
    import time
    start = time.monotonic()
    with pytest.raises(ClusterSpecError) as info:
        call()
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message
    for part in link:
        assert part in message, message
    return message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value", BAD_VALUES, ids=lambda x: str(x))
def test_a_cluster_built_in_code_is_refused_by_plan_and_simulate(field, value):
    import topoplan
    from topoplan.analysis.sim.report import Yardsticks
    cluster = coded_cluster(field, value)
    good = coded_cluster(field, 12.5e9 if field == "bandwidth" else 1e-6)
    schedule = topoplan.plan(good, "ring", size=1 << 20, profile="ideal")
    shown = f"{value:g}"
    message = refused(lambda: topoplan.simulate(cluster, schedule, 1 << 20, force=True),
                      "boxes[1].nics[0]." + field, "b/nic0 <-> sw", shown)
    assert message.startswith("simulate: cluster 'coded': "), message
    # yardsticks given: the engine itself is reached only through the same check
    refused(lambda: topoplan.simulate(cluster, schedule, 1 << 20, force=True,
                                      yardsticks=Yardsticks(1 << 20, "allreduce", 1.0, None)),
            "b/nic0 <-> sw")
    for algorithm in ("auto", "ring", "mcf"):
        refused(lambda: topoplan.plan(cluster, algorithm, size=1 << 20),
                "boxes[1].nics[0]." + field, "b/nic0 <-> sw", shown)
    refused(lambda: topoplan.lower_bound(cluster, 1 << 20), "b/nic0 <-> sw", shown)


@pytest.mark.parametrize("size, dtype_size", [(math.nan, 4), (math.inf, 4), (-1, 4),
                                               (1 << 20, math.nan), (1 << 20, 0.5)])
def test_simulate_refuses_a_size_or_element_size_that_is_no_number_of_bytes(size, dtype_size):
    import topoplan
    good = coded_cluster("bandwidth", 12.5e9)
    schedule = topoplan.plan(good, "ring", size=1 << 20, profile="ideal")
    with pytest.raises(ValueError, match="size"):
        topoplan.simulate(good, schedule, size, dtype_size=dtype_size)


@pytest.mark.timeout(30)
def test_the_nccl_rows_ring_search_ends_on_a_negative_nic():
    """It handed out channels while any NIC had some left, counting -1 as some: it never
    ended. Unchecked (the model is internal), it must end all the same."""
    from topoplan.analysis.native.nccl import nccl_time
    assert nccl_time(coded_cluster("bandwidth", -1.0), 1 << 20, "allreduce") is not None


@pytest.mark.timeout(60)
def test_every_planner_called_alone_refuses_it():
    from topoplan.planners import PLANNERS
    cluster = coded_cluster("bandwidth", -1.0)
    for name in sorted(PLANNERS):
        message = refused(lambda: PLANNERS[name](cluster, size=1 << 20),
                          "boxes[1].nics[0].bandwidth", "b/nic0 <-> sw")
        assert message.startswith(f"{name}: cluster 'coded': "), message


def test_a_cluster_built_in_code_with_numpy_numbers_plans():
    import numpy as np

    import topoplan
    from topoplan.cluster import Box, Cluster, Nic
    nic = Nic("sw", bandwidth=np.int64(12_500_000_000), latency=np.float64(1e-6), gpus=(0,))
    cluster = Cluster(name="numpy", switches=("sw",),
                      boxes=(Box("a", 1, 0, nics=(nic,)), Box("b", 1, 1, nics=(nic,))))
    schedule = topoplan.plan(cluster, "ring", size=1 << 20)
    assert topoplan.simulate(cluster, schedule, 1 << 20).time_s > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value", BAD_VALUES, ids=lambda x: str(x))
def test_a_loaded_cluster_whose_graph_was_edited_is_refused(field, value):
    import topoplan
    good = loads_cluster(topology_text("ddl_two_switch"), file="c.yaml")
    schedule = topoplan.plan(good, "ring", size=1 << 20, profile="ideal")
    cluster = edited_cluster(field, value)
    where = f"graph['switch0']['switch1'].{field}"
    refused(lambda: topoplan.simulate(cluster, schedule, 1 << 20), where,
            "switch0 -> switch1")
    refused(lambda: topoplan.plan(cluster, "auto", size=1 << 20), where, "switch0 -> switch1")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field, value", [("bandwidth", math.nan), ("bandwidth", 0.0),
                                          ("latency", math.nan), ("latency", math.inf)],
                         ids=lambda x: str(x))
def test_the_engine_refuses_what_slips_past_the_check(monkeypatch, field, value):
    """Past simulate's check (here switched off), the engine's route table refuses the
    link; a NaN cost stops it with an error, never a spin."""
    import topoplan
    import topoplan.cluster.spec as spec
    from topoplan.analysis.sim.report import Yardsticks
    from topoplan.errors import ProfileError
    good = loads_cluster(topology_text("ddl_two_switch"), file="c.yaml")
    schedule = topoplan.plan(good, "ring", size=1 << 20, profile="ideal")
    yardsticks = Yardsticks(1 << 20, "allreduce", 1.0, None)
    monkeypatch.setattr(spec, "check_cluster", lambda *args, **kwargs: None)
    refused(lambda: topoplan.simulate(edited_cluster(field, value), schedule, 1 << 20,
                                      profile="ideal", yardsticks=yardsticks, force=True),
            f"graph['switch0']['switch1'].{field}", "switch0 -> switch1")
    costs = topoplan.get_profile("nccl").with_costs(name="broken")
    object.__setattr__(costs, "alpha_network", value)  # past CostProfile's own check
    if math.isnan(value) or math.isinf(value):
        with pytest.raises(ProfileError, match="broken: alpha_network"):
            topoplan.simulate(good, schedule, 1 << 20, profile=costs, yardsticks=yardsticks)
