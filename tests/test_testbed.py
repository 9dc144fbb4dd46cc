"""The emulated cluster: layout rules everywhere, real namespaces where this machine allows.

The namespace tests build a 4-rank two-switch testbed for real (``ip netns``, bridges,
veth, tbf), measure shaping with raw TCP, run a planned allreduce with one gloo
process per namespace, and check that nothing survives ``down``: no namespace, no
process in one of its network namespaces, no new interface in the host's namespace,
after success, after a rank crashes and after ``up`` fails half-way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from topoplan.cluster import loads_cluster
from topoplan.errors import ClusterSpecError, TransportError

from topoplan.testbed import Testbed, TestbedError, check_fits, parse_scale, plan_layout
from topoplan.testbed.layout import scale_cluster

TWO_SWITCH = """
name: tb-two-switch
switches: [{name: sw0}, {name: sw1}]
boxes:
  - {name: A, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: B, gpus: 1, nics: [{switch: sw0, bandwidth: 500 Mbit/s}]}
  - {name: C, gpus: 1, nics: [{switch: sw1, bandwidth: 500 Mbit/s}]}
  - {name: D, gpus: 1, nics: [{switch: sw1, bandwidth: 500 Mbit/s}]}
links:
  - {a: sw0, b: sw1, bandwidth: 125 Mbit/s, latency: 100 us}
"""

TWO_BY_TWO = """
name: tb-2x2
switches: [{name: tor}]
boxes:
  - {name: "n{i}", count: 2, gpus: 2, fabric: {bandwidth: 20 GB/s},
     nics: [{switch: tor, bandwidth: 100 Gbit/s}]}
"""

LEAF_SPINE = """
name: loop
switches: [{name: "leaf{i}", count: 2}, {name: "spine{i}", count: 2}]
boxes:
  - {name: "n{i}", count: 2, gpus: 1, nics: [{switch: "leaf{i}", bandwidth: 10}]}
links:
  - {a: "leaf{i//2}", b: "spine{i%2}", count: 4, bandwidth: 10}
"""


# ---- layout: pure, runs everywhere ----------------------------------------------------

def test_layout_two_switch_shapes_each_link_at_scaled_rate():
    cluster = loads_cluster(TWO_SWITCH)
    layout = plan_layout(cluster, 0.5, prefix="tp-test-")
    # A namespace per switch (routers), then one per rank; each one-GPU box's NIC is
    # folded into its rank's link to the switch (one shaper, not two in series).
    assert layout.namespaces == ("tp-test-n0", "tp-test-n1", *(f"tp-test-r{r}" for r in range(4)))
    assert [node for _, node in layout.routers] == ["sw0", "sw1"]
    assert len(set(layout.addresses)) == 4 and all(a.startswith("10.200.") for a in layout.addresses)
    rates = sorted(v.rate * 8 for v in layout.veths)
    assert rates == pytest.approx([62.5e6, 250e6, 250e6, 250e6, 250e6])
    link = next(v for v in layout.veths if "sw0" in v.what and "sw1" in v.what)
    assert link.latency == pytest.approx(100e-6)  # above the netem threshold: emulated
    assert all(v.latency == 0 for v in layout.veths if v is not link)  # default 0 latency
    assert layout.route(0, 2).rate * 8 == pytest.approx(62.5e6)
    assert layout.route(0, 1).rate * 8 == pytest.approx(250e6)
    assert layout.sprays == ()  # one path per pair


def test_layout_multi_gpu_box_routes_through_fabric_and_nic_namespaces():
    cluster = loads_cluster(TWO_BY_TWO)
    layout = plan_layout(cluster, 1 / 40, prefix="tp-t-")
    # Each box's NIC serves both GPUs: a router. A two-GPU fabric and a switch with two
    # NICs on it have two neighbours and one rate: each is folded into one veth pair.
    assert sorted(node for _, node in layout.routers) == ["n0/nic0", "n1/nic0"]
    fabric = [v for v in layout.veths if "gpu1" in v.what and "gpu0" in v.what]
    assert len(fabric) == 2 and all(v.rate == pytest.approx(0.5e9) for v in fabric)
    assert all(len(v.edges) == 4 for v in fabric)  # gpu0>fabric, fabric>gpu1, and back
    nics = [v for v in layout.veths if "nic" in v.what]
    assert len(nics) == 5 and all(v.rate * 8 == pytest.approx(2.5e9) for v in nics)
    edges = [e for v in layout.veths for e in v.edges]
    assert sorted(edges) == sorted(f"{u}>{v}" for u, v in cluster.graph.edges)
    assert [len(p) for p in layout.route(0, 1).paths] == [1]
    assert [len(p) for p in layout.route(0, 3).paths] == [3]  # GPU, NIC, NIC
    assert layout.route(0, 3).rate * 8 == pytest.approx(2.5e9)


def _follow(layout, src: int, dst: int, tos: int) -> list[tuple[str, str]]:
    """Where the layout's own ``ip`` lines send a packet: (namespace, interface) hops.

    A small model of Linux policy routing: rules by preference (``from`` and ``tos``
    selectors, falling through a table without a route), then the main table.
    """
    lines = dict(layout.routing)
    peer = {(v.ns_a, v.name_a): v.ns_b for v in layout.veths}
    peer |= {(v.ns_b, v.name_b): v.ns_a for v in layout.veths}
    saddr, daddr = layout.addresses[src], layout.addresses[dst] + "/32"
    ns, hops = layout.rank_ns[src], []
    while ns != layout.rank_ns[dst]:
        tables: dict[str, dict[str, str]] = {}
        rules = []
        for line in lines[ns]:
            words = line.split()
            if words[0] == "route":
                table = words[words.index("table") + 1] if "table" in words else "main"
                tables.setdefault(table, {})[words[2]] = words[words.index("dev") + 1]
            elif words[0] == "rule":
                pref = int(words[words.index("pref") + 1])
                rtos = int(words[words.index("tos") + 1], 16) if "tos" in words else None
                rules.append((pref, words[words.index("from") + 1], rtos,
                              words[words.index("table") + 1]))
        dev = None
        for _, frm, rtos, table in sorted(rules):
            if frm == saddr + "/32" and (rtos is None or rtos == tos):
                dev = tables.get(table, {}).get(daddr)
                if dev:
                    break
        dev = dev or tables["main"][daddr]
        hops.append((ns, dev))
        ns = peer[(ns, dev)]
        assert len(hops) < 20, hops
    return hops


def test_cube_mesh_every_pair_takes_the_simulators_paths():
    """dgx1_v100: direct NVLinks between GPU namespaces, relays for the pairs without one,
    each equal-cost path marked in the DSCP bits at the source, rates as in the graph."""
    from topoplan.cluster import load_cluster
    from topoplan.testbed.layout import path_tos
    cluster = load_cluster(Path(__file__).resolve().parents[1] / "topologies/dgx1_v100.yaml")
    layout = plan_layout(cluster, 1e-3, prefix="tp-t-", multipath="spray")
    assert layout.routers == ()  # no fabric: the GPUs' own namespaces forward
    assert len(layout.veths) == len(cluster.graph.edges) // 2
    node_ns = {cluster.gpu_node(r): layout.rank_ns[r] for r in range(cluster.nranks)}
    sprays = dict(layout.sprays)
    relayed = 0
    for s in range(cluster.nranks):
        for d in range(cluster.nranks):
            if s == d:
                continue
            routes = cluster.routes(s, d)
            pair = layout.route(s, d)
            assert len(pair.paths) == len(routes)
            for i, route in enumerate(routes):
                hops = _follow(layout, s, d, path_tos(i))
                assert hops == list(pair.paths[i])
                assert [ns for ns, _ in hops] == [node_ns[node] for node in route[:-1]]
            rule = f"ip daddr {layout.addresses[d]} numgen inc mod {len(routes)} vmap"
            assert (rule in sprays.get(layout.rank_ns[s], "")) == (len(routes) > 1)
            relayed += len(routes[0]) > 2
            # The pair's rate alone: its bytes split evenly, the slowest share sets it.
            edges = cluster.route_edges(s, d)
            load: dict = {}
            for path in edges:
                for e in path:
                    load[e] = load.get(e, 0) + 1 / len(edges)
            model = 1e-3 / max(w / cluster.graph.edges[e]["bandwidth"] for e, w in load.items())
            assert pair.rate == pytest.approx(model)
    assert relayed == 24  # the pairs without an NVLink of their own
    # Pinned (the default): the first path only, and the cluster to simulate agrees.
    from topoplan.testbed.layout import emulated_cluster
    pinned = plan_layout(cluster, 1e-3, prefix="tp-t-")
    assert pinned.sprays == () and "routed over the first" in " ".join(pinned.notes)
    emulated = emulated_cluster(cluster, pinned)
    for s in range(cluster.nranks):
        for d in range(cluster.nranks):
            if s != d:
                assert emulated.routes(s, d) == cluster.routes(s, d)[:1]
                assert _follow(pinned, s, d, 0) == list(pinned.route(s, d).paths[0])
                assert pinned.route(s, d).paths == layout.route(s, d).paths[:1]


def test_leaf_spine_is_routed_over_both_spines():
    layout = plan_layout(loads_cluster(LEAF_SPINE), 0.1, prefix="tp-t-", multipath="spray")
    # Each spine links just the two leaves: folded into a veth pair leaf0 - leaf1 each.
    assert [node for _, node in layout.routers] == ["leaf0", "leaf1"]
    paths = layout.route(0, 1).paths
    assert len(paths) == 2 and {p[1][0] for p in paths} == {"tp-t-n0"}
    assert len({p[1][1] for p in paths}) == 2  # leaf0 sends each path out another port
    assert "numgen inc mod 2" in dict(layout.sprays)["tp-t-r0"]


def test_scaled_cluster_scales_bandwidth_keeps_latency():
    cluster = loads_cluster(TWO_SWITCH)
    scaled = scale_cluster(cluster, 0.25)
    assert scaled.links[0].bandwidth == pytest.approx(cluster.links[0].bandwidth / 4)
    assert scaled.links[0].latency == cluster.links[0].latency
    assert scaled.boxes[2].nics[0].bandwidth == pytest.approx(500e6 / 8 / 4)


def test_parse_scale():
    assert parse_scale("1/200") == pytest.approx(0.005)
    assert parse_scale("0.01") == pytest.approx(0.01)
    assert parse_scale("auto") is None
    for bad in ("2", "0", "x", "1/0"):
        with pytest.raises(ClusterSpecError, match="--scale"):
            parse_scale(bad)


def test_shaping_gives_every_rank_pair_its_own_fair_class():
    from topoplan.testbed.netns import WIRE_OVERHEAD, shaping_commands
    addresses = ["10.200.0.1", "10.200.0.2", "10.200.0.3"]
    lines = shaping_commands("l0a", 1e6, 0.0, addresses)
    classes = [l for l in lines if l.startswith("class add") and "parent 1:1 " in l
               and " prio 1" in l]
    filters = [l for l in lines if l.startswith("filter add") and "match ip src" in l]
    assert len(classes) == 7 and len(filters) == 6  # 6 ordered pairs + everything else
    # Pure ACKs have a class of their own, served first.
    small = [l for l in lines if "classid 1:fff0" in l]
    assert len(small) == 1 and " prio 0" in small[0]
    assert any("match ip protocol 6 0xff match u16 0x0000 0xffc0 at 2 flowid 1:fff0" in l
               for l in lines)
    assert "match ip src 10.200.0.2/32 match ip dst 10.200.0.3/32" in " ".join(filters)
    root_rate = int(1e6 * WIRE_OVERHEAD * 8)
    assert f"rate {root_rate}bit ceil {root_rate}bit" in lines[1]
    # Equal guarantees that add up to the link, and each class may borrow all of it.
    assert all(f"ceil {root_rate}bit" in l for l in classes)
    assert len({l.split(" rate ")[1].split()[0] for l in classes}) == 1
    assert sum(1 for l in lines if " bfifo limit " in l) == 8
    with_delay = shaping_commands("l0a", 1e6, 1e-3, addresses, netem=True)
    assert sum(1 for l in with_delay if " netem delay 1000us" in l) == 7
    assert shaping_commands("eth0", None, 1e-3, addresses) == []  # no netem, no rate
    assert shaping_commands("eth0", None, 1e-3, addresses, netem=True) == [
        "qdisc add dev eth0 root handle 1: netem delay 1000us limit 100000"]


def test_auto_scale_keeps_the_machine_within_what_it_moves():
    from topoplan.testbed.layout import AUTO_TARGET_RATE, MACHINE_RATE, auto_scale
    two_switch = loads_cluster(TWO_SWITCH.replace("500 Mbit/s", "100 GB/s"))
    scale = auto_scale(two_switch)
    assert 4 * 100e9 * scale == pytest.approx(MACHINE_RATE)  # four ports together
    two_by_two = loads_cluster(TWO_BY_TWO)  # fabric ports dominate: 4 x 20 GB/s
    assert 4 * 20e9 * auto_scale(two_by_two) == pytest.approx(MACHINE_RATE)
    slow = loads_cluster(TWO_SWITCH)  # already slow: scaled only to the per-link target
    assert auto_scale(slow) == pytest.approx(min(1.0, AUTO_TARGET_RATE / (500e6 / 8),
                                                 MACHINE_RATE / (4 * 500e6 / 8)))


def test_calibration_fit_recovers_alpha_and_reduce_bandwidth():
    from topoplan.testbed.calibrate import calibration_cases, fit, predict
    cluster = scale_cluster(loads_cluster(TWO_SWITCH), 0.5)
    cases = calibration_cases(cluster)
    assert [c[0] for c in cases] == ["cal:reduce", "cal:latency", "cal:ring-pipelined",
                                     "cal:tree-pipelined", "cal:direct"]
    alpha, reduce_bw = 0.7e-3, 3e9
    from topoplan.analysis.sim import simulate
    measured = {"cal:reduce": cases[0][1] / reduce_bw}
    for label, size, _, schedule in cases[1:]:
        # A "testbed" exactly as the simulator with software costs; the latency-bound
        # run pays five times the alpha of the pipelined ones.
        a = alpha * (5 if label == "cal:latency" else 1)
        measured[label] = simulate(cluster, schedule, size=size, alpha=a,
                                   reduce_bandwidth=reduce_bw, profile="ideal").time_s
    cal = fit(cluster, cases, measured)
    assert cal.reduce_bandwidth == pytest.approx(reduce_bw)
    assert cal.alpha_s == pytest.approx(alpha, rel=0.05)
    assert cal.latency_alpha_s == pytest.approx(5 * alpha, rel=0.05)
    assert all(s.steps > 30 for s in cal.samples if s.label not in ("cal:latency", "cal:direct"))
    assert cal.op_overhead_s == pytest.approx(0, abs=alpha * 0.05)  # none in these runs
    schedule = cases[2][3]
    assert predict(cluster, schedule, cases[2][1], cal) == pytest.approx(
        measured["cal:ring-pipelined"], rel=0.01)
    assert predict(cluster, schedule, cases[2][1]) < measured["cal:ring-pipelined"]
    assert cal.note is None
    for s in cal.samples:  # the fit's own record: fitted times and sensitivities
        assert s.fitted_s == pytest.approx(s.measured_s, rel=0.01)
        assert s.alphas > 0 and s.base_s < s.measured_s
    # Runs no slower than the links alone: alpha 0, and the calibration says why.
    quick = {label: (simulate(cluster, schedule, size=size, reduce_bandwidth=reduce_bw,
                              profile="ideal").time_s
                     * 0.98 if schedule is not None else measured[label])
             for label, size, _, schedule in cases}
    zero = fit(cluster, cases, quick)
    assert zero.alpha_s == 0
    assert "no longer than the links and adds alone" in zero.note
    assert zero.to_dict()["note"] == zero.note


def test_mpi_launcher_maps_each_host_to_its_namespace(tmp_path):
    from topoplan.testbed.mpi import mpiexec_command, write_launcher
    layout = plan_layout(loads_cluster(TWO_SWITCH), 1.0, prefix="tp-t-")
    hostfile, agent = write_launcher(layout, tmp_path)
    assert hostfile.read_text().splitlines() == [f"{a} slots=1" for a in layout.addresses]
    text = agent.read_text()
    assert "10.200.0.3|tb-r2) ns=tp-t-r2; name=tb-r2" in text
    assert os.access(agent, os.X_OK)
    # An unknown host is refused, as ssh would fail, with a message.
    proc = subprocess.run([str(agent), "-x", "10.9.9.9", "true"], capture_output=True, text=True)
    assert proc.returncode == 255 and "not a host of this testbed" in proc.stderr
    command, env = mpiexec_command(layout, tmp_path, ["python", "-c", "pass"],
                                   largest_message=32 << 20)
    assert command[:4] == ["ip", "netns", "exec", "tp-t-r0"]
    flags = " ".join(command)
    for flag in ("plm_ssh_agent", "plm_ssh_no_tree_spawn 1", "btl tcp,self",
                 "btl_tcp_if_include eth0", "oob_tcp_if_include eth0", "mpi_yield_when_idle 1",
                 # every message eager: no rendezvous round trip stuck behind bulk data
                 f"btl_tcp_eager_limit {64 << 20}", f"btl_tcp_max_send_size {64 << 20}"):
        assert flag in flags
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    # mpiexec -n N and the flags every Open MPI 5 run gets come from topoplan.runtime.mpirun, once.
    from topoplan.runtime.mpirun import find_launcher, launcher_args
    base, _ = launcher_args(find_launcher()[0], layout.nranks)
    start = command.index(base[0])
    assert command[start:start + len(base)] == base and flags.count("mpi_yield_when_idle") == 1


def _too_big() -> tuple[int, str]:
    """One rank more than this machine runs (any machine: 64 are fine on 16 cores)."""
    from topoplan.testbed import max_ranks
    n = max_ranks()[0] + 1
    return n, f"name: big\nboxes:\n  - {{name: b, gpus: {n}, fabric: {{bandwidth: 10}}}}\n"


def test_refuses_more_ranks_than_the_machine_runs():
    n, text = _too_big()
    big = loads_cluster(text)
    with pytest.raises(TestbedError, match=rf"{n} ranks; this machine runs at most \d+ \(.*CPU"):
        check_fits(big)
    check_fits(big, limit=n)


def test_cli_up_refuses_too_many_ranks(tmp_path):
    """Before anything else, even on a machine that cannot build a testbed at all."""
    n, text = _too_big()
    path = tmp_path / "big.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "topoplan", "testbed", "up", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "topoplan: error:" in proc.stderr and f"{n} ranks" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_bench_refuses_a_collective_it_cannot_run_before_building_anything():
    """Sizes that do not shard and planners that do not plan the collective are refused
    with a clear message, before any namespace is built (no root needed)."""
    cluster = str(Path(__file__).resolve().parents[1] / "topologies" / "ddl_two_switch.yaml")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "topoplan", "testbed", "bench", cluster,
                               "--collective", "allgather", *args],
                              capture_output=True, text=True, timeout=60)

    proc = run("--sizes", "1001")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("topoplan: error: --sizes: size 1001 B: an allgather of 4 "
                                  "ranks cuts the full buffer into 4 equal shards"), proc.stderr
    proc = run("--algorithms", "rhd,hierarchical,native")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "hierarchical plans only allreduce; allgather is planned by" in proc.stderr
    from topoplan.commands.testbed import algorithms_for
    default, left_out = algorithms_for("allgather", None)
    assert "native" in default and "auto" in default and "hierarchical" in left_out


# ---- real namespaces: root with CAP_NET_ADMIN only ------------------------------------

from .support.netns import needs_netns  # noqa: E402


def _host_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def _namespace_inodes(layout) -> set[int]:
    return {os.stat(f"/run/netns/{ns}").st_ino for ns in layout.namespaces}


def _leftovers(layout, inodes: set[int]) -> list[str]:
    """Namespaces still named, or processes still inside one of the testbed's namespaces."""
    left = [ns for ns in layout.namespaces if Path("/run/netns", ns).exists()]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            link = os.readlink(proc / "ns" / "net")
        except OSError:
            continue
        if int(link.split("[")[1].rstrip("]")) in inodes:
            left.append(f"pid {proc.name} in a testbed namespace")
    return left


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TOPOPLAN_TESTBED_STATE", str(tmp_path))
    return tmp_path


@needs_netns
@pytest.mark.slow
def test_testbed_shapes_runs_a_plan_and_leaves_nothing(state_dir):
    from topoplan.testbed.bench import Case, run_cases
    from topoplan.testbed.probe import measure, measure_concurrent
    cluster = loads_cluster(TWO_SWITCH)
    host_before = _host_links()
    bed = Testbed.up(cluster, scale=1.0)
    inodes = _namespace_inodes(bed.layout)
    try:
        assert bed.state.exists()
        # Shaping: same-switch pairs at the NIC rate, cross-switch at the uplink rate.
        for src, dst, shaped in ((0, 1, 500e6 / 8), (3, 0, 125e6 / 8)):
            rate = measure(bed, src, dst, nbytes=int(shaped * 0.5))
            assert 0.8 * shaped <= rate <= 1.2 * shaped, (src, dst, rate * 8 / 1e6)
        # Two flows through the uplink split it evenly (the simulator's max-min
        # sharing), and a flow the other way keeps its full rate beside them.
        shaped = 125e6 / 8
        rates = measure_concurrent(bed, [(0, 2), (1, 3), (3, 0)], nbytes=int(shaped * 0.6))
        for rate, share in zip(rates, (0.5, 0.5, 1.0)):
            assert 0.8 * share * shaped <= rate <= 1.2 * share * shaped, [r * 8e-6 for r in rates]

        cases = [Case("native", 2 << 20, kind="native", warmup=0, iters=1)]
        try:
            import topoplan.runtime.executor  # noqa: F401
            from topoplan import plan, verify
        except ImportError:
            plan = None
        if plan is not None:  # a planned schedule, replayed by the executor over gloo
            schedule = plan(cluster, algorithm="ring", size=2 << 20)
            verify(schedule)
            cases.append(Case("ring", (2 << 20) + 4, schedule=schedule, warmup=0, iters=1))
            # A reduce-scatter and an allgather, planned and gloo's own, checked exactly.
            for collective in ("reduce_scatter", "allgather"):
                schedule = plan(cluster, algorithm="rhd", size=1 << 20, collective=collective)
                verify(schedule)
                cases += [Case(f"rhd-{collective}", 1 << 20, schedule=schedule, warmup=0,
                               iters=1),
                          Case(f"native-{collective}", 1 << 20, kind="native", warmup=0,
                               iters=1, collective=collective)]
        results = run_cases(bed, cases, timeout=120)
        assert [r["label"] for r in results] == [c.label for c in cases]
        assert all(r["wrong"] == 0 for r in results), results
        assert all(r["times_s"][0] > 0 for r in results)
        assert [r["collective"] for r in results] == [
            c.schedule.collective if c.schedule else c.collective for c in cases]

        # A rank that dies: the run stops with the rank named, every process is gone.
        with pytest.raises(TransportError, match="rank 2 exited with status 17"):
            run_cases(bed, cases[:1], timeout=120, crash_rank=2)
        assert not [x for x in _leftovers(bed.layout, inodes) if x.startswith("pid")]
    finally:
        bed.down()
    assert _leftovers(bed.layout, inodes) == []
    assert _host_links() == host_before
    assert not bed.state.exists()
    if plan is None:
        pytest.xfail("topoplan.runtime.executor / planners not available yet: only native gloo ran")


@needs_netns
@pytest.mark.mpi
@pytest.mark.slow
def test_mpi_across_namespaces_runs_a_plan_and_leaves_nothing(state_dir):
    """mpiexec in rank 0's namespace, daemons started by the agent in the others."""
    pytest.importorskip("mpi4py")
    from topoplan import plan, verify
    from topoplan.testbed.bench import Case, run_cases
    from topoplan.testbed.mpi import write_launcher
    cluster = loads_cluster(TWO_SWITCH)
    host_before = _host_links()
    bed = Testbed.up(cluster, scale=1.0)
    inodes = _namespace_inodes(bed.layout)
    try:
        # The agent runs a command in the host's namespace under its own hostname.
        _, agent = write_launcher(bed.layout, state_dir)
        out = subprocess.run([str(agent), "10.200.0.3", "hostname; ip -o -4 addr show dev eth0"],
                             capture_output=True, text=True, timeout=30).stdout
        assert out.startswith("tb-r2\n") and "10.200.0.3/" in out, out
        size = (1 << 20) + 4
        schedule = plan(cluster, algorithm="ring", size=size)
        verify(schedule)
        ag = plan(cluster, algorithm="ring", size=1 << 20, collective="allgather")
        results = run_cases(bed, [Case("native", size, kind="native", warmup=0, iters=1),
                                  Case("ring", size, schedule=schedule, warmup=0, iters=1),
                                  Case("ring-ag", 1 << 20, schedule=ag, warmup=0, iters=1),
                                  Case("native-rs", 1 << 20, kind="native", warmup=0, iters=1,
                                       collective="reduce_scatter")],
                            timeout=120, transport="mpi")
        assert [r["wrong"] for r in results] == [0, 0, 0, 0]
        assert results[3]["native_name"] == "MPI_Reduce_scatter_block"
        # 1 MiB around a ring whose slowest hop is 125 Mbit/s: at least the bytes' time;
        # the allgather half of it.
        assert results[1]["times_s"][0] >= 2 * 3 / 4 * size / (125e6 / 8) * 0.9
        assert results[2]["times_s"][0] >= 3 / 4 * (1 << 20) / (125e6 / 8) * 0.9
        with pytest.raises(TransportError, match="rank 2 exited with status 17"):
            run_cases(bed, [Case("native", 4096, kind="native", warmup=0, iters=1)],
                      timeout=120, crash_rank=2, transport="mpi")
        assert not [x for x in _leftovers(bed.layout, inodes) if x.startswith("pid")]
    finally:
        bed.down()
    assert _leftovers(bed.layout, inodes) == []
    assert _host_links() == host_before


@needs_netns
@pytest.mark.parametrize("failure", [TestbedError("boom"), KeyboardInterrupt()])
def test_up_removes_what_it_built_when_it_fails(state_dir, monkeypatch, failure):
    from topoplan.testbed import netns
    cluster = loads_cluster(TWO_SWITCH)
    real, calls = netns._make_veth, []

    def flaky(veth, *args):
        calls.append(veth)
        if len(calls) == 3:  # namespaces and two veth pairs exist by now
            raise failure
        real(veth, *args)

    monkeypatch.setattr(netns, "_make_veth", flaky)
    layout = plan_layout(cluster, 1.0)
    host_before = _host_links()
    with pytest.raises(type(failure)):
        netns.create(layout)
    assert len(calls) == 3
    assert [ns for ns in layout.namespaces if Path("/run/netns", ns).exists()] == []
    assert list(state_dir.iterdir()) == []
    assert _host_links() == host_before


@needs_netns
def test_cli_up_then_down(state_dir, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(TWO_SWITCH)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    up = subprocess.run([sys.executable, "-m", "topoplan", "testbed", "up", str(path),
                         "--scale", "1/2"], capture_output=True, text=True, env=env)
    assert up.returncode == 0, up.stderr
    assert "62 Mbit/s" in up.stdout or "62.5" in up.stdout or "63 Mbit/s" in up.stdout
    states = list(state_dir.glob("tp-*.json"))
    assert len(states) == 1
    from topoplan.testbed import load_state
    layout = load_state(states[0])
    assert all(Path("/run/netns", ns).exists() for ns in layout.namespaces)
    down = subprocess.run([sys.executable, "-m", "topoplan", "testbed", "down", str(states[0])],
                          capture_output=True, text=True, env=env)
    assert down.returncode == 0, down.stderr
    assert not any(Path("/run/netns", ns).exists() for ns in layout.namespaces)
    assert not states[0].exists()


DIRECT_RING = """
name: nvlink-ring
boxes:
  - name: box
    gpus: 4
    gpu_links:
      - {a: 0, b: 1, bandwidth: 400 Mbit/s}
      - {a: 1, b: 2, bandwidth: 400 Mbit/s}
      - {a: 2, b: 3, bandwidth: 200 Mbit/s}
      - {a: 3, b: 0, bandwidth: 400 Mbit/s}
"""


@needs_netns
@pytest.mark.slow
def test_direct_link_mesh_probe_matches_the_model(state_dir):
    """Four GPUs on a ring of direct links: opposite GPUs relay through a neighbour (the
    GPU namespaces forward), every pair's bytes leave by the model's interfaces at the
    model's rate, alone and with every rank sending at once."""
    from topoplan.testbed.probe import check_pairs
    cluster = loads_cluster(DIRECT_RING)
    host_before = _host_links()
    bed = Testbed.up(cluster, scale=1.0)
    inodes = _namespace_inodes(bed.layout)
    try:
        assert len(bed.layout.route(0, 2).paths[0]) == 2  # relayed by rank 1 or 3
        report = check_pairs(bed, seconds=0.3, shifts=[1, 2, 3])
        assert len(report.checks) == 12 + 12
        assert report.ok, [(c.src, c.dst, c.pattern, c.ratio, c.hops) for c in report.failures]
        relayed = next(c for c in report.checks if (c.src, c.dst) == (0, 2) and not c.pattern)
        assert [round(h[2], 2) for h in relayed.hops] == [1.0, 1.0]  # two hops, all bytes
        # The slow link 2-3 is the model's rate for 2 -> 3 alone.
        slow = next(c for c in report.checks if (c.src, c.dst) == (2, 3) and not c.pattern)
        assert slow.model_rate * 8 == pytest.approx(200e6)
    finally:
        bed.down()
    assert _leftovers(bed.layout, inodes) == []
    assert _host_links() == host_before
    assert list(state_dir.iterdir()) == []


@needs_netns
@pytest.mark.slow
def test_bench_refuses_a_network_off_the_model(state_dir):
    """A link slowed behind the model's back: the quick probe that bench runs first
    names the pairs and no numbers are reported."""
    from topoplan.testbed.bench import bench, check_network
    cluster = loads_cluster(TWO_SWITCH)
    with Testbed.up(cluster, scale=1.0) as bed:
        assert check_network(bed).ok
        link = next(v for v in bed.layout.veths if "sw0" in v.what and "sw1" in v.what)
        subprocess.run(["tc", "-n", link.ns_a, "class", "change", "dev", link.name_a, "parent",
                        "1:", "classid", "1:1", "htb", "rate", "60mbit", "ceil", "60mbit"],
                       check=True)
        with pytest.raises(TestbedError, match=r"does not behave as the model.*0 -> 2"):
            bench(bed, cluster, ["ring"], [1 << 20], calibrate=False)
        # Measuring again cannot hide a link that really is slower than the model.
        from topoplan.testbed.probe import check_pairs
        slowed = check_pairs(bed, [(0, 2)], seconds=0.2, shifts=[], retries=1)
        assert not slowed.ok and slowed.checks[0].attempts == 2
        assert slowed.checks[0].ratio == pytest.approx(60 / 125, rel=0.1)
