"""``topoplan testbed up|down|probe|bench``: an emulated cluster on this machine.

``up`` builds network namespaces, bridges and tc-shaped veth pairs for a cluster
(bandwidths times ``--scale``) and leaves them up, recorded in a state file; ``down``
removes them; ``probe`` measures shaped links with raw TCP (``--concurrent``: several
flows at once); ``bench`` builds a testbed, runs planned schedules and the transport's
own allreduce in it (gloo or Open MPI), compares with the simulator (raw and calibrated
on the testbed) and tears it down. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cluster import load_cluster
from ..errors import TopoplanError
from ..units import format_size, parse_size
from .common import console, table


def register(subparsers: argparse._SubParsersAction) -> None:
    tb = subparsers.add_parser("testbed", help="emulate a cluster with network namespaces and tc")
    sub = tb.add_subparsers(dest="testbed_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("cluster", help="cluster YAML file")
        p.add_argument("--scale", default="auto",
                       help="bandwidth factor, e.g. 1/320 (default auto: the fastest NIC or "
                            "switch link becomes 2.5 Gbit/s)")
        p.add_argument("--max-ranks", type=int, default=None,
                       help="allow more ranks than this machine's estimate")

    up = sub.add_parser("up", help="build the emulated network and leave it up")
    common(up)
    up.add_argument("--state", type=Path, default=None, help="state file (default /run/topoplan/..)")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="remove testbeds: processes, namespaces, bridges, veths")
    down.add_argument("state", nargs="*", type=Path, help="state files printed by `up`")
    down.add_argument("--all", action="store_true", help="every testbed in the state directory")
    down.set_defaults(func=cmd_down)

    probe = sub.add_parser("probe", help="measure rank-to-rank TCP throughput in a testbed")
    probe.add_argument("state", type=Path, help="state file printed by `up`")
    probe.add_argument("--pairs", default="0-1", help="SRC-DST[,SRC-DST...] (default 0-1)")
    probe.add_argument("--size", default="4MiB", help="bytes per transfer (default 4MiB)")
    probe.add_argument("--concurrent", action="store_true",
                       help="run the pairs at once and report each one's share")
    probe.set_defaults(func=cmd_probe)

    bench = sub.add_parser("bench", help="run planned schedules and native gloo in a testbed")
    common(bench)
    bench.add_argument("--algorithms", default="ring,hierarchical,mcf,native",
                       help="comma list: planner names, ring:0,2,1,3 for an explicit ring "
                            "order, native (default ring,hierarchical,mcf,native)")
    bench.add_argument("--sizes", default="16MiB", help="comma list of sizes (default 16MiB)")
    bench.add_argument("--iters", type=int, default=3, help="timed iterations (default 3)")
    bench.add_argument("--warmup", type=int, default=1, help="untimed iterations (default 1)")
    bench.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    bench.add_argument("--state", type=Path, default=None,
                       help="use a testbed built by `up` instead of building one")
    bench.add_argument("--transport", default="gloo", choices=["gloo", "mpi"],
                       help="gloo (torch.distributed, one process per namespace) or mpi "
                            "(Open MPI, mpiexec with a launcher agent per namespace)")
    bench.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                       help="skip calibrating the simulator's per-message alpha and reduce "
                            "bandwidth on the testbed (no calibrated prediction column)")
    bench.add_argument("--json", action="store_true", help="print JSON records")
    bench.set_defaults(func=cmd_bench)


def _scale(text: str) -> float | None:
    from ..testbed import parse_scale
    return parse_scale(text)


def cmd_up(args: argparse.Namespace) -> int:
    from ..testbed import Testbed, capable
    cluster = load_cluster(args.cluster)
    _require_capable(capable)
    bed = Testbed.up(cluster, _scale(args.scale), state=args.state, max_ranks=args.max_ranks)
    out = console()
    layout = bed.layout
    out.print(f"testbed {layout.prefix}: {cluster.name}, {layout.nranks} ranks, scale "
              f"{layout.scale:.6g}, {len(layout.bridges)} bridges, {len(layout.veths)} veth pairs")
    t = table("veth pair", "rate", "latency", title="shaped links (each direction)")
    for v in layout.veths:
        t.add_row(v.what, "unshaped" if v.rate is None else f"{v.rate * 8 / 1e6:,.0f} Mbit/s",
                  f"{v.latency * 1e6:.0f} us" if v.latency else "-")
    out.print(t)
    for r, (ns, addr) in enumerate(zip(layout.rank_ns, layout.addresses)):
        out.print(f"rank {r}: ip netns exec {ns} ...   (eth0 {addr})")
    for note in layout.notes:
        out.print(f"note: {note}")
    out.print(f"state: {bed.state}\nremove with: topoplan testbed down {bed.state}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from ..testbed import destroy
    from ..testbed.netns import state_dir
    states = list(args.state)
    if args.all:
        states += sorted(state_dir().glob("tp-*.json"))
    if not states:
        raise TopoplanError("name the state file(s) printed by `testbed up`, or pass --all")
    for state in states:
        removed = destroy(state)
        console().print(f"{state}: removed {len(removed)} namespaces")
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from ..testbed import Testbed
    from ..testbed.probe import measure, measure_concurrent
    bed = Testbed.attach(args.state)
    nbytes = parse_size(args.size)
    pairs = []
    for pair in args.pairs.split(","):
        try:
            src, dst = (int(x) for x in pair.split("-"))
        except ValueError:
            raise TopoplanError(f"--pairs: bad pair {pair!r}; write SRC-DST, e.g. 0-2") from None
        for r in (src, dst):
            if not 0 <= r < bed.layout.nranks:
                raise TopoplanError(f"--pairs {pair}: rank {r} out of range(0, {bed.layout.nranks})")
        pairs.append((src, dst))
    if args.concurrent:
        rates = measure_concurrent(bed, pairs, nbytes)
    else:
        rates = [measure(bed, src, dst, nbytes) for src, dst in pairs]
    t = table("pair", "shaped path", "measured", "ratio",
              title=f"TCP {format_size(nbytes)}{', all pairs at once' if args.concurrent else ''}")
    for (src, dst), rate in zip(pairs, rates):
        shaped = path_rate(bed.layout, src, dst)
        t.add_row(f"{src} -> {dst}", "-" if shaped is None else f"{shaped * 8 / 1e6:,.0f} Mbit/s",
                  f"{rate * 8 / 1e6:,.0f} Mbit/s", "-" if shaped is None else f"{rate / shaped:.2f}")
    console().print(t)
    return 0


def path_rate(layout, src: int, dst: int) -> float | None:  # type: ignore[no-untyped-def]
    """The slowest shaped link between two ranks' namespaces (``None``: all unshaped)."""
    import networkx as nx
    graph = nx.Graph()
    for v in layout.veths:
        a = v.master_a or f"ns:{v.ns_a}"
        b = v.master_b or f"ns:{v.ns_b}"
        graph.add_edge(a, b, rate=v.rate)
    path = nx.shortest_path(graph, f"ns:{layout.rank_ns[src]}", f"ns:{layout.rank_ns[dst]}")
    rates = [graph[u][v]["rate"] for u, v in zip(path, path[1:]) if graph[u][v]["rate"]]
    return min(rates) if rates else None


def _require_capable(capable) -> None:  # type: ignore[no-untyped-def]
    reason = capable()
    if reason is not None:
        from ..testbed import TestbedError
        raise TestbedError(f"this machine cannot build a testbed: {reason} (run as root with "
                           "CAP_NET_ADMIN and iproute2)")


def split_algorithms(text: str) -> list[str]:
    """``"ring,ring:0,2,1,3,mcf"`` -> ``["ring", "ring:0,2,1,3", "mcf"]``."""
    out: list[str] = []
    for token in (t.strip() for t in text.split(",")):
        if token.isdigit() and out and ":" in out[-1]:
            out[-1] += f",{token}"  # a rank of the explicit ring order before it
        elif token:
            out.append(token)
    if not out:
        raise TopoplanError("--algorithms: name at least one algorithm")
    return out


def cmd_bench(args: argparse.Namespace) -> int:
    from ..testbed import Testbed, capable
    from ..testbed.bench import bench
    from ..testbed.netns import interrupts_raise
    cluster = load_cluster(args.cluster)
    algorithms = split_algorithms(args.algorithms)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.state is not None:
        bed = Testbed.attach(args.state)
        owned = False
    else:
        _require_capable(capable)
        bed = Testbed.up(cluster, _scale(args.scale), max_ranks=args.max_ranks)
        owned = True
    try:
        with interrupts_raise():  # SIGTERM too: the finally below removes the testbed
            report = bench(bed, cluster, algorithms, sizes, iters=args.iters,
                           warmup=args.warmup, timeout=args.timeout,
                           calibrate=args.calibrate, transport=args.transport)
    finally:
        if owned:
            bed.down()
    rows = report.rows
    if args.json:
        print(json.dumps({"cluster": cluster.name, "scale": bed.layout.scale,
                          "nranks": cluster.nranks, **report.to_dict()}, indent=1))
        return 1 if any(r.wrong for r in rows) else 0
    cal = report.calibration
    t = table("algorithm", "size", "steps", "measured (ms)", "predicted (ms)", "meas/pred",
              "calibrated (ms)", "meas/cal", "native (ms)", "native/measured", "#wrong",
              title=f"{cluster.name} at scale 1/{1 / bed.layout.scale:.4g}, {args.transport}")

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.0f}"

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        t.add_row(r.algorithm, format_size(r.size), "-" if r.steps is None else str(r.steps),
                  ms(r.measured_s), ms(r.predicted_s), ratio(r.ratio), ms(r.calibrated_s),
                  ratio(r.calibrated_ratio), ms(r.native_s), ratio(r.speedup_vs_native),
                  str(r.wrong))
    out = console()
    out.print(t)
    if cal is not None:
        lat = "" if cal.latency_alpha_s is None else \
            f" (latency-bound small messages: {cal.latency_alpha_s * 1e3:.2f} ms)"
        red = "-" if cal.reduce_bandwidth is None else f"{cal.reduce_bandwidth / 1e9:.1f} GB/s"
        out.print(f"calibrated: alpha {cal.alpha_s * 1e3:.2f} ms per message{lat}, reduce "
                  f"{red}; load average {report.load[0]:.1f} -> {report.load[1]:.1f}")
        if cal.note:
            out.print(f"note: {cal.note}")
    return 1 if any(r.wrong for r in rows) else 0
