"""Link faults on the testbed (``--degrade LINK=F[@SECONDS]``).

Pure tests (any machine): which veth ends a fault changes, with which ``tc`` lines, and
the degraded model the probe checks against. Real ones (root with CAP_NET_ADMIN): the
HTB classes ``tc`` reports, a pair's measured rate across a degraded link, restoring it,
a delayed fault, and the CLI's errors.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from topoplan.cluster import load_cluster, loads_cluster
from topoplan.cluster.links import degraded
from topoplan.testbed import TestbedError, plan_layout
from topoplan.testbed.degrade import (degraded_layout, find_link, htb_classes, link_table,
                                      reshape_commands, veth_factors)
from topoplan.testbed.netns import WIRE_OVERHEAD

from .support.netns import needs_netns

ROOT = Path(__file__).resolve().parents[1]
DDL = ROOT / "topologies" / "ddl_two_switch.yaml"
SCALE = 1 / 640  # what --scale auto gives ddl_two_switch: the switch link at 125 Mbit/s

TWO_BY_TWO = """
name: tb-2x2
switches: [{name: tor}]
boxes:
  - {name: "n{i}", count: 2, gpus: 2, fabric: {bandwidth: 20 GB/s},
     nics: [{switch: tor, bandwidth: 100 Gbit/s, latency: 50 us}]}
"""


def _ddl():
    cluster = load_cluster(DDL)
    return cluster, plan_layout(cluster, SCALE, prefix="tp-t-"), link_table(cluster)


def _veth(layout, what):
    return next(v for v in layout.veths if v.what == what)


# ---- pure: runs everywhere -----------------------------------------------------------

def test_a_switch_link_fault_changes_both_ends_of_its_veth_only():
    cluster, layout, table = _ddl()
    link = _veth(layout, "switch switch0 - switch switch1")
    assert veth_factors(layout, table, {"switch0-switch1": 0.25}) == [0.25, 1, 1, 1, 1]
    commands = reshape_commands(layout, table, {}, {"switch0-switch1": 0.25})
    assert sorted(commands) == sorted([link.ns_a, link.ns_b])
    wire = int(link.rate * 0.25 * WIRE_OVERHEAD * 8)
    for ns, dev in ((link.ns_a, link.name_a), (link.ns_b, link.name_b)):
        lines = commands[ns]
        assert all(line.startswith(f"class change dev {dev} ") for line in lines)
        assert lines[0].startswith(f"class change dev {dev} parent 1: classid 1:1 htb "
                                   f"rate {wire}bit ceil {wire}bit")
        # The ACK class and one class per rank pair crossing it (4 of 12) plus the default.
        assert len(lines) == 1 + 1 + 4 + 1
        assert all(f"ceil {wire}bit" in line for line in lines)
    # Restoring gives the lines that built it, as class changes.
    back = reshape_commands(layout, table, {"switch0-switch1": 0.25}, {})
    wire = int(link.rate * WIRE_OVERHEAD * 8)
    assert back[link.ns_a][0].startswith(f"class change dev {link.name_a} parent 1: classid "
                                         f"1:1 htb rate {wire}bit ceil {wire}bit")
    assert reshape_commands(layout, table, {"switch0-switch1": 0.25},
                            {"switch0-switch1": 0.25}) == {}


def test_a_nic_fault_and_the_model_the_probe_checks():
    cluster, layout, table = _ddl()
    commands = reshape_commands(layout, table, {}, {"A/nic0": 0.5, "switch0-switch1": 0.25})
    nic = _veth(layout, "rank 0 (A/gpu0) - switch switch0")
    assert {nic.ns_a, nic.ns_b} <= set(commands)  # rank 0's namespace and switch0's
    assert not any(f" dev {v.name_a} " in line for v in layout.veths[2:]
                   for lines in commands.values() for line in lines)
    factors = {"A/nic0": 0.5, "switch0-switch1": 0.25}
    slow = degraded_layout(layout, table, factors)
    # Rate for rate what the degraded cluster, scaled alike, gives each veth's edges.
    want = degraded(cluster, factors).scaled(SCALE).graph
    for v in slow.veths:
        edges = [tuple(e.split(">")) for e in v.edges]
        assert v.rate == pytest.approx(min(want.edges[e]["bandwidth"] for e in edges))
    assert slow.route(0, 2).rate == pytest.approx(layout.route(0, 2).rate * 0.25)
    assert slow.route(0, 1).rate == pytest.approx(layout.route(0, 1).rate * 0.5)
    assert slow.route(1, 3).rate == pytest.approx(layout.route(1, 3).rate * 0.25)
    assert slow.route(3, 2).rate == layout.route(3, 2).rate
    assert degraded_layout(layout, table, {}) is layout


def test_folded_and_unshaped_links():
    """A two-GPU box's NIC serves both GPUs: its fault slows both PCIe legs and the port
    (folded with the other NIC through the switch). At scale 1 the 100 Gbit/s NICs are
    unshaped: a fault shapes them, or is refused where it would stay unshapeable."""
    cluster = loads_cluster(TWO_BY_TWO)
    table = link_table(cluster)
    layout = plan_layout(cluster, 1 / 40, prefix="tp-t-")
    factors = veth_factors(layout, table, {"n0/nic0": 0.5})
    touched = [v.what for v, f in zip(layout.veths, factors) if f == 0.5]
    assert len(touched) == 3 and all("n0/nic0" in w for w in touched)

    layout = plan_layout(cluster, 1.0, prefix="tp-u-")
    nic = next(v for v in layout.veths if "n0/nic0" in v.what and "n1/nic0" in v.what)
    assert nic.rate is None
    with pytest.raises(TestbedError, match=r"n0/nic0 at x0.5 is 50.0 Gbit/s .* above what "
                                           r"this machine shapes .* at most 0.08"):
        reshape_commands(layout, table, {}, {"n0/nic0": 0.5})
    on = reshape_commands(layout, table, {}, {"n0/nic0": 0.05}, netem=True)
    lines = [line for line in on[nic.ns_a] if f" dev {nic.name_a} " in line]
    # netem (2 x 50 us through the switch) was its root qdisc: replaced by an HTB tree
    # with netem under each class
    assert lines[:2] == [f"qdisc del dev {nic.name_a} root",
                         f"qdisc add dev {nic.name_a} root handle 1: htb default 2"]
    assert any("netem delay 100us" in line for line in lines)
    assert degraded_layout(layout, table, {"n0/nic0": 0.05}).route(0, 2).rate == \
        pytest.approx(12.5e9 * 0.05)
    off = reshape_commands(layout, table, {"n0/nic0": 0.05}, {}, netem=True)
    assert [line for line in off[nic.ns_a] if f" dev {nic.name_a} " in line] == [
        f"qdisc del dev {nic.name_a} root",
        f"qdisc add dev {nic.name_a} root handle 1: netem delay 100us limit 100000"]


def test_link_names_resolve_from_the_state_table():
    _, _, table = _ddl()
    assert find_link(table, "switch1-switch0").name == "switch0-switch1"
    with pytest.raises(TestbedError, match="no link 'A/nic1': did you mean A/nic0"):
        find_link(table, "A/nic1", "ddl-two-switch")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "topoplan", "testbed", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("command", ["up", "bench", "run"])
@pytest.mark.parametrize("value, message", [
    ("switch0-swich1=0.5", "--degrade 'switch0-swich1=0.5': ddl-two-switch has no link "
                           "'switch0-swich1': did you mean switch0-switch1"),
    ("A/nic0=1.5", "--degrade 'A/nic0=1.5': the factor must be in (0, 1]"),
    ("A/nic0", "--degrade 'A/nic0': use LINK=FACTOR[@SECONDS]"),
])
def test_cli_refuses_a_bad_degrade_in_one_line_before_building(command, value, message):
    tail = ["--", "true"] if command == "run" else []
    proc = _cli(command, str(DDL), "--degrade", value, *tail)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"topoplan: error: {message}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# ---- real namespaces: root with CAP_NET_ADMIN only --------------------------------------

@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOPLAN_TESTBED_STATE", str(tmp_path))
    return tmp_path


def _link_classes(bed, what):
    v = _veth(bed.layout, what)
    return [htb_classes(v.ns_a, v.name_a), htb_classes(v.ns_b, v.name_b)]


@needs_netns
def test_degrade_a_live_testbed_measure_and_restore(state_dir):
    """ddl_two_switch at 1/640: the switch link (125 Mbit/s) at 0.25 and A's NIC at 0.5;
    pairs across them measure that fraction of their healthy rate, and factor 1 gives
    the healthy rates back."""
    from topoplan.testbed import Testbed
    from topoplan.testbed.degrade import apply_degrades
    from topoplan.testbed.probe import check_pairs, measure
    cluster = load_cluster(DDL)
    with Testbed.up(cluster, SCALE) as bed:
        healthy = _link_classes(bed, "switch switch0 - switch switch1")
        cross, nic = bed.layout.route(0, 2).rate, bed.layout.route(0, 1).rate

        def rate(src, dst, model):  # about 0.4 s at the model's rate
            return measure(bed, src, dst, nbytes=int(model * 0.4))

        before = {(0, 2): rate(0, 2, cross), (0, 1): rate(0, 1, nic)}
        factors = apply_degrades(bed.state, ["switch0-switch1=0.25", "A/nic0=0.5"])
        assert factors == bed.degrades == {"switch0-switch1": 0.25, "A/nic0": 0.5}
        for now, was in zip(_link_classes(bed, "switch switch0 - switch switch1"), healthy):
            assert now["1:1"] == pytest.approx((was["1:1"][0] / 4, was["1:1"][1] / 4), rel=0.01)
            assert now["1:2"][1] == pytest.approx(was["1:2"][1] / 4, rel=0.01)  # children's ceil
        after = {(0, 2): rate(0, 2, cross * 0.25), (0, 1): rate(0, 1, nic * 0.5)}
        ratios = {pair: after[pair] / before[pair] for pair in before}
        print(f"\nmeasured Mbit/s healthy -> degraded: "
              + ", ".join(f"{s}->{d}: {before[s, d] * 8e-6:.1f} -> {after[s, d] * 8e-6:.1f}"
                          for s, d in before))
        assert ratios[(0, 2)] == pytest.approx(0.25, rel=0.15), ratios
        assert ratios[(0, 1)] == pytest.approx(0.5, rel=0.15), ratios
        # The probe checks against the degraded model, so a degraded testbed passes.
        report = check_pairs(bed, [(2, 0), (1, 0)], seconds=0.2, shifts=[])
        assert report.ok, [(c.src, c.dst, c.ratio) for c in report.checks]
        assert apply_degrades(bed.state, {"switch0-switch1": 1, "A/nic0": 1.0}) == {}
        assert _link_classes(bed, "switch switch0 - switch switch1") == healthy
        again = rate(0, 2, cross)
        assert again / before[(0, 2)] == pytest.approx(1, rel=0.15)


@needs_netns
def test_cli_delayed_degrade_changes_the_rate_later_and_dies_with_the_testbed(state_dir):
    state = state_dir / "tb.json"
    up = _cli("up", str(DDL), "--state", str(state), "--degrade", "switch1-switch0=0.5@1.5",
              "--degrade", "A/nic0=0.5@60")
    assert up.returncode == 0, up.stderr
    assert "degrade switch0-switch1 x0.5 in 1.5 s" in up.stdout
    from topoplan.testbed import Testbed
    bed = Testbed.attach(state)
    try:
        pids = [t["pid"] for t in json.loads(state.read_text())["timers"]]
        healthy = _link_classes(bed, "switch switch0 - switch switch1")[0]["1:1"][0]
        bad = _cli("degrade", str(state), "switch0-swich1=0.5")
        assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1
        assert "topoplan: error: ddl-two-switch has no link 'switch0-swich1': did you mean " \
               "switch0-switch1?" in bad.stderr
        bad = _cli("degrade", str(state), "A/nic0=0")
        assert bad.returncode == 1 and "the factor must be in (0, 1]" in bad.stderr
        deadline = time.monotonic() + 10
        while bed.degrades == {} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert bed.degrades == {"switch0-switch1": 0.5}
        now = _link_classes(bed, "switch switch0 - switch switch1")[0]["1:1"][0]
        assert now == pytest.approx(healthy / 2, rel=0.01)
        shown = _cli("degrade", str(state))
        assert "degraded now: switch0-switch1 x0.5" in shown.stdout
        assert Path(f"/proc/{pids[1]}").exists()  # still waiting for its 60 s
    finally:
        down = _cli("down", str(state))
    assert down.returncode == 0, down.stderr
    time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() and "Z" not in
                   Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[:1]
                   for pid in pids)


@needs_netns
@pytest.mark.slow
def test_cli_bench_checks_the_degraded_network_and_plans_on_the_file(state_dir):
    """A switch link at 0.25 from the start: the network check passes (it checks the
    degraded rates), the ring is planned and predicted on the healthy file, so it
    measures about 4x its prediction, with the calibrated software costs too (they are
    fitted on the degraded network: they must not absorb the fault); a NIC fault
    seconds after the check is applied by the front-end's timer during the runs; the
    JSON says both."""
    proc = _cli("bench", str(DDL), "--degrade", "switch0-switch1=0.25", "--degrade",
                "A/nic0=0.5@0.5", "--algorithms", "ring", "--sizes", "1MiB", "--iters", "1",
                "--warmup", "0", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["probe"]["ok"]
    assert report["degrades"][0] == {"link": "switch0-switch1", "factor": 0.25, "after": 0.0,
                                     "applied_s": 0.0}
    nic = report["degrades"][1]
    assert (nic["link"], nic["factor"], nic["after"]) == ("A/nic0", 0.5, 0.5)
    assert nic["applied_s"] == pytest.approx(0.5, abs=0.5)
    assert re.fullmatch(r"switch0-switch1 x0.25, A/nic0 x0.5 at \d+\.\d s", report["degraded"])
    ring = report["rows"][0]
    assert ring["wrong"] == 0 and 3 < ring["ratio"] < 5, ring
    assert 2.5 < ring["calibrated_ratio"] < 5, (ring, report["calibration"])


@needs_netns
def test_an_unshaped_link_is_shaped_while_degraded(state_dir):
    """At scale 1 the 2x2 cluster's 100 Gbit/s NICs are unshaped: at 0.05 the NIC gets an
    HTB tree at 5 Gbit/s (on the wire), at 1 it is unshaped again."""
    from topoplan.testbed import Testbed
    from topoplan.testbed.degrade import apply_degrades
    with Testbed.up(loads_cluster(TWO_BY_TWO), 1.0) as bed:
        what = "nic n0/nic0 - nic n1/nic0"
        assert _veth(bed.layout, what).rate is None and _link_classes(bed, what) == [{}, {}]
        with pytest.raises(TestbedError, match="at most 0.08"):
            apply_degrades(bed.state, ["n0/nic0=0.5"])
        apply_degrades(bed.state, ["n0/nic0=0.05"])
        for classes in _link_classes(bed, what):
            assert classes["1:1"][0] == pytest.approx(5e9 * WIRE_OVERHEAD, rel=0.01)
        assert bed.current_layout().route(0, 2).rate == pytest.approx(12.5e9 * 0.05)
        apply_degrades(bed.state, ["n0/nic0=1"])
        assert _link_classes(bed, what) == [{}, {}] and bed.degrades == {}
