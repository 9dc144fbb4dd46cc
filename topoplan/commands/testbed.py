"""``topoplan testbed up|degrade|down|probe|bench|run``: an emulated cluster on this machine.

``up`` builds network namespaces, tc-shaped veth pairs and static routes for a cluster
(bandwidths times ``--scale``) and leaves them up, recorded in a state file; ``degrade``
slows links of a running one down (``--degrade LINK=F[@SECONDS]`` does it for ``up``,
``bench`` and ``run``); ``down`` removes them; ``probe`` measures paths with raw TCP (``--concurrent``: several flows at
once; ``--all-pairs``: every pair's path and rate, alone and under load, against the
model); ``bench`` builds a testbed, checks it, runs planned schedules of a collective
(``--collective allreduce|reduce_scatter|allgather``) and the transport's own one in it
(gloo or Open MPI), compares with the simulator (raw and calibrated on the testbed) and
tears it down; ``run`` runs any command on every rank inside one (what ``topoplan
launch`` does, over the emulated links: Open MPI or torch.distributed). Needs root (CAP_NET_ADMIN) and iproute2
(and nftables for clusters with equal-cost paths).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from ..cluster import load_cluster
from ..ir.collectives import COLLECTIVES
from ..errors import TopoplanError
from ..units import format_size, parse_size
from .common import console, json_text, plural, table


TOLERANCE_PCT = 10


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
        p.add_argument("--multipath", choices=["pin", "spray"], default="pin",
                       help="pairs with several equal-cost paths: route each over its first "
                            "path, and simulate the same (pin, default), or spread its packets "
                            "over all of them as the simulator splits bytes (spray: TCP then "
                            "reorders, measured 0.6-0.9 of the share under load)")
        p.add_argument("--degrade", action="append", default=[], metavar="LINK=F[@SECONDS]",
                       help="run link LINK (as `topo show` names it: A/nic0, switch0-switch1, "
                            "BOX/fabric, BOX/gpu0-gpu1) at F of its bandwidth, from the start "
                            "or after SECONDS (repeatable)")

    up = sub.add_parser("up", help="build the emulated network and leave it up")
    common(up)
    up.add_argument("--state", type=Path, default=None, help="state file (default /run/topoplan/..)")
    up.set_defaults(func=cmd_up)

    degrade = sub.add_parser(
        "degrade", help="slow links of a running testbed down (or restore them with F=1)")
    degrade.add_argument("state", type=Path, help="state file printed by `up`")
    degrade.add_argument("degrades", nargs="*", metavar="LINK=F[@SECONDS]",
                         help="link at F of its bandwidth (1 restores it), now or after SECONDS; "
                              "none: show the links degraded now")
    degrade.set_defaults(func=cmd_degrade)

    down = sub.add_parser("down", help="remove testbeds: processes, namespaces, bridges, veths")
    down.add_argument("state", nargs="*", type=Path, help="state files printed by `up`")
    down.add_argument("--all", action="store_true", help="every testbed in the state directory")
    down.set_defaults(func=cmd_down)

    probe = sub.add_parser("probe", help="measure rank-to-rank TCP throughput in a testbed "
                                         "against the model")
    probe.add_argument("state", type=Path, help="state file printed by `up`")
    probe.add_argument("--pairs", default="0-1", help="SRC-DST[,SRC-DST...] (default 0-1)")
    probe.add_argument("--size", default="4MiB", help="bytes per transfer (default 4MiB)")
    probe.add_argument("--concurrent", action="store_true",
                       help="run the pairs at once and report each one's share")
    probe.add_argument("--all-pairs", action="store_true",
                       help="check every ordered pair alone (the interfaces its bytes left by, "
                            "read from the kernel's counters, and its rate) and every shift "
                            "pattern at once (rates), against the model; exit 1 on a "
                            f"deviation above {int(TOLERANCE_PCT)}%%")
    probe.add_argument("--seconds", type=float, default=0.4,
                       help="with --all-pairs: each transfer's length at the model's rate")
    probe.add_argument("--retries", type=int, default=2,
                       help="with --all-pairs: measure a pair that came out slow again, up to "
                            "this many times, and keep its fastest rate (default 2; 0: never)")
    probe.add_argument("--json", action="store_true", help="with --all-pairs: JSON report")
    probe.set_defaults(func=cmd_probe)

    bench = sub.add_parser("bench", help="run planned schedules and the transport's own "
                                         "collective in a testbed")
    common(bench)
    bench.add_argument("-c", "--collective", choices=list(COLLECTIVES), default="allreduce",
                       help="what to run: allreduce (default), reduce_scatter or allgather; "
                            "sizes are the full buffer")
    bench.add_argument("--algorithms", default=None,
                       help="comma list: planner names, ring:0,2,1,3 for an explicit ring "
                            "order, native (default ring,hierarchical,mcf,native, without "
                            "the planners that do not plan the collective)")
    bench.add_argument("--sizes", default="16MiB",
                       help="comma list of full-buffer sizes (default 16MiB; a multiple of "
                            "the rank count in float32 elements for reduce_scatter and "
                            "allgather)")
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
    bench.add_argument("--no-probe", dest="probe", action="store_false",
                       help="skip the network check run first (every pair's path and rate "
                            f"against the model; numbers are refused beyond {TOLERANCE_PCT}%%)")
    bench.add_argument("--json", action="store_true", help="print JSON records")
    bench.set_defaults(func=cmd_bench)

    run = sub.add_parser(
        "run", help="run a command on every rank inside a testbed (mpiexec or torchrun-style)",
        usage="topoplan testbed run [-h] CLUSTER [--scale S] [--transport {mpi,torch}] "
              "[--state FILE] [--probe] [--timeout SECONDS] [--degrade LINK=F[@SECONDS]] "
              "-- CMD [ARG ...]",
        description="Build the testbed of CLUSTER (or use --state), run CMD once per rank in "
                    "its namespace and tear the testbed down. mpi: Open MPI over the emulated "
                    "links (btl tcp, one host per rank); torch: RANK, WORLD_SIZE, MASTER_ADDR "
                    "and MASTER_PORT set as torchrun does, for init_process_group('gloo'). "
                    "The exit status is the job's.")
    common(run)
    run.add_argument("--transport", choices=["mpi", "torch"], default="mpi",
                     help="mpi: mpiexec with a launcher agent per namespace (default); torch: "
                          "one process per namespace with torchrun's variables")
    run.add_argument("--state", type=Path, default=None,
                     help="use a testbed built by `up` instead of building one")
    run.add_argument("--probe", action="store_true",
                     help="check every pair's path and rate against the model first and refuse "
                          f"to run beyond {TOLERANCE_PCT}%%")
    run.add_argument("--largest-message", default="4MiB", metavar="SIZE",
                     help="mpi: Open MPI sends messages up to this size eagerly (default 4MiB)")
    run.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                     help="stop the job (every rank) after this long")
    run.add_argument("command", nargs="*", metavar="-- CMD [ARG ...]",
                     help="the command each rank runs")
    run.set_defaults(func=cmd_run)


def _scale(text: str) -> float | None:
    from ..testbed import parse_scale
    return parse_scale(text)


def parse_degrades(texts: list[str], cluster: Any) -> list[Any]:
    """``--degrade`` values -> :class:`~topoplan.cluster.links.Degrade` with the links'
    own names, checked against ``cluster`` (a bad one is an error naming the option)."""
    from ..cluster.links import find_link, parse_degrade
    out = []
    for text in texts:
        degrade = parse_degrade(text)
        try:
            link = find_link(cluster, degrade.link)
        except TopoplanError as exc:
            raise TopoplanError(f"--degrade {text!r}: {exc}") from None
        out.append(dataclasses.replace(degrade, link=link.name))
    return out


def _degrade_now(bed: Any, degrades: list[Any]) -> None:
    """Apply to ``bed`` the degrades that have no delay."""
    from ..testbed.degrade import apply_degrades
    now = [d for d in degrades if not d.after]
    if now:
        apply_degrades(bed.state, now)


def cmd_up(args: argparse.Namespace) -> int:
    from ..testbed import Testbed, capable, check_fits
    from ..testbed.degrade import describe, start_timer
    cluster = load_cluster(args.cluster)
    degrades = parse_degrades(args.degrade, cluster)
    check_fits(cluster, args.max_ranks)  # a cluster too big for here, whatever else is missing
    _require_capable(capable)
    bed = Testbed.up(cluster, _scale(args.scale), state=args.state, max_ranks=args.max_ranks,
                     multipath=args.multipath)
    try:
        _degrade_now(bed, degrades)
        timers = [(d, start_timer(bed.state, d)) for d in degrades if d.after]
    except BaseException:
        bed.down()
        raise
    out = console()
    layout = bed.current_layout()
    out.print(f"testbed {layout.prefix}: {cluster.name}, {plural(layout.nranks, 'rank')}, "
              f"scale {layout.scale:.6g}, {plural(len(layout.routers), 'router namespace')}, "
              f"{plural(len(layout.veths), 'veth pair')}")
    t = table("veth pair", "rate", "latency", title="shaped links (each direction)")
    for v in layout.veths:
        t.add_row(v.what, "unshaped" if v.rate is None else f"{v.rate * 8 / 1e6:,.0f} Mbit/s",
                  f"{v.latency * 1e6:.0f} us" if v.latency else "-")
    out.print(t)
    for r, (ns, addr) in enumerate(zip(layout.rank_ns, layout.addresses)):
        out.print(f"rank {r}: ip netns exec {ns} ...   (eth0 {addr})")
    for note in layout.notes:
        out.print(f"note: {note}")
    if bed.degrades:
        out.print(f"degraded: {describe(bed.degrades)} (rates above are the degraded ones)")
    for d, pid in timers:
        out.print(f"degrade {d.link} x{d.factor:g} in {d.after:g} s (process {pid}; "
                  "`testbed down` stops it)")
    out.print(f"state: {bed.state}\nremove with: topoplan testbed down {bed.state}")
    return 0


def cmd_degrade(args: argparse.Namespace) -> int:
    from ..cluster.links import parse_degrade
    from ..testbed import Testbed
    from ..testbed.degrade import apply_degrades, describe, start_timer
    bed = Testbed.attach(args.state)
    degrades = [parse_degrade(text) for text in args.degrades]
    out = console()
    now = [d for d in degrades if not d.after]
    if now or not degrades:
        factors = apply_degrades(bed.state, now) if now else bed.degrades
        out.print(f"degraded now: {describe(factors)}")
    for d in degrades:
        if d.after:
            pid = start_timer(bed.state, d)
            out.print(f"degrade {d.link} x{d.factor:g} in {d.after:g} s (process {pid}; "
                      "`testbed down` stops it)")
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
    from ..testbed.probe import measure, measure_concurrent, predicted_rates
    bed = Testbed.attach(args.state)
    if args.all_pairs:
        return _probe_all(bed, args)
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
        if src == dst:
            raise TopoplanError(f"--pairs {pair}: a rank does not send to itself")
        pairs.append((src, dst))
    if args.concurrent:
        rates = measure_concurrent(bed, pairs, nbytes)
        models = predicted_rates(bed.layout, pairs)
    else:
        rates = [measure(bed, src, dst, nbytes) for src, dst in pairs]
        models = [bed.layout.route(src, dst).rate for src, dst in pairs]
    t = table("pair", "model", "measured", "ratio",
              title=f"TCP {format_size(nbytes)}{', all pairs at once' if args.concurrent else ''}")
    for (src, dst), rate, model in zip(pairs, rates, models):
        t.add_row(f"{src} -> {dst}", "unshaped" if model is None else f"{model * 8 / 1e6:,.0f} Mbit/s",
                  f"{rate * 8 / 1e6:,.0f} Mbit/s", "-" if model is None else f"{rate / model:.2f}")
    console().print(t)
    return 0


def _probe_all(bed, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    import sys

    from ..testbed.probe import check_pairs
    report = check_pairs(bed, seconds=args.seconds, retries=max(args.retries, 0),
                         progress=None if args.json else
                         (lambda line: print(line, file=sys.stderr, flush=True)))
    if args.json:
        print(json_text(report.to_dict(), indent=1))
        return 0 if report.ok else 1
    out = console()
    alone = [c for c in report.checks if c.pattern is None]
    loaded = [c for c in report.checks if c.pattern is not None]
    t = table("pair", "hops", "model", "measured", "ratio", "path", title=(
        f"{bed.layout.cluster}: every pair alone, {len(alone)} pairs"))
    for c in alone:
        hops = max(len(p) for p in bed.layout.route(c.src, c.dst).paths)
        npaths = len(bed.layout.route(c.src, c.dst).paths)
        t.add_row(f"{c.src} -> {c.dst}", f"{hops}" + (f" x{npaths} paths" if npaths > 1 else ""),
                  _mbit(c.model_rate), _mbit(c.measured_rate),
                  "-" if c.ratio is None else f"{c.ratio:.2f}",
                  "ok" if c.path_ok else "DIFFERS: " + ", ".join(
                      f"{ns.removeprefix(bed.layout.prefix)}/{dev} {want:.2f}->{got:.2f}"
                      for ns, dev, want, got in c.hops if abs(got - want) > 0.01))
    out.print(t)
    if loaded:
        worst: dict[str | None, Any] = {}
        for c in loaded:
            if c.ratio is not None and (c.pattern not in worst or
                                        abs(c.ratio - 1) > abs((worst[c.pattern].ratio or 1) - 1)):
                worst[c.pattern] = c
        t = table("pattern", "pairs", "worst pair", "model", "measured", "ratio",
                  title="every rank sends at once (rank r -> r + k)")
        for pattern in dict.fromkeys(c.pattern for c in loaded):
            group = [c for c in loaded if c.pattern == pattern]
            w = worst.get(pattern)
            t.add_row(str(pattern), str(len(group)), "-" if w is None else f"{w.src} -> {w.dst}",
                      _mbit(w.model_rate if w else None), _mbit(w.measured_rate if w else None),
                      "-" if w is None or w.ratio is None else f"{w.ratio:.2f}")
        out.print(t)
    bad = report.failures
    out.print(f"{len(report.checks)} checks in {report.seconds:.0f} s; worst deviation "
              f"{report.worst:.1%}; " + ("all within the model's tolerance" if not bad else
                                        f"{len(bad)} outside {TOLERANCE_PCT}% (or off path)"))
    return 0 if not bad else 1


def cmd_run(args: argparse.Namespace) -> int:
    import sys

    from ..testbed import capable
    from ..testbed.netns import interrupts_raise
    from ..testbed.run import run_command
    from .launch import program
    argv = program(args.command, args.timeout, "topoplan testbed run CLUSTER")
    largest = parse_size(args.largest_message)
    cluster = load_cluster(args.cluster)
    degrades = parse_degrades(args.degrade, cluster)
    bed, owned = _testbed(args, cluster, capable)
    try:
        with interrupts_raise():
            from ..testbed.degrade import Timers
            _degrade_now(bed, degrades)
            layout = bed.layout
            print(f"topoplan testbed run: {cluster.name}, {plural(layout.nranks, 'rank')} at "
                  "scale "
                  f"1/{1 / layout.scale:.4g}, {args.transport}", file=sys.stderr, flush=True)
            if args.probe:
                from ..testbed.probe import check_pairs
                report = check_pairs(bed)
                print(f"network check: {len(report.checks)} probes, worst deviation "
                      f"{report.worst:.1%}", file=sys.stderr, flush=True)
                if report.failures:
                    from ..testbed import TestbedError
                    raise TestbedError(f"the network check found {len(report.failures)} probes "
                                       f"outside {TOLERANCE_PCT}% of the model (run `topoplan "
                                       "testbed probe --all-pairs` for the table); not running")
            with Timers(bed.state, degrades) as timers:
                status = run_command(bed, argv, transport=args.transport,
                                     timeout=args.timeout, largest_message=largest)
            timers.check()
            return status
    finally:
        if owned:
            bed.down()


def _testbed(args: argparse.Namespace, cluster: Any, capable: Any) -> tuple[Any, bool]:
    """The testbed of ``--state`` (not ours to remove), or a new one of ``cluster``."""
    from ..testbed import Testbed
    if args.state is not None:
        bed = Testbed.attach(args.state)
        if bed.layout.nranks != cluster.nranks:
            raise TopoplanError(f"{args.state}: the testbed has {bed.layout.nranks} ranks, "
                                f"{args.cluster} has {cluster.nranks}")
        return bed, False
    from ..testbed import check_fits
    check_fits(cluster, args.max_ranks)  # a cluster too big for here, whatever else is missing
    _require_capable(capable)
    return Testbed.up(cluster, _scale(args.scale), max_ranks=args.max_ranks,
                      multipath=args.multipath), True


def _mbit(rate: float | None) -> str:
    return "unshaped" if rate is None else f"{rate * 8 / 1e6:,.0f} Mbit/s"


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


DEFAULT_ALGORITHMS = "ring,hierarchical,mcf,native"


def algorithms_for(collective: str, text: str | None) -> tuple[list[str], list[str]]:
    """The algorithms to run and what was left out of the default list: with ``text``
    (``--algorithms``) every name must plan ``collective`` (a clear error names those
    that do); by default the planners of :data:`DEFAULT_ALGORITHMS` that do not plan
    it are left out, and a reduce-scatter or an allgather gets ``auto`` instead."""
    from ..errors import PlannerError
    from ..planners import PLANNERS, planners_for
    capable = set(planners_for(collective))
    if text is not None:
        algorithms = split_algorithms(text)
        for spec in algorithms:
            name = spec.partition(":")[0]
            if name != "native" and name in PLANNERS and name not in capable:
                raise PlannerError(f"--algorithms: {name} plans only allreduce; {collective} "
                                   f"is planned by {', '.join(sorted(capable))}")
        return algorithms, []
    default = split_algorithms(DEFAULT_ALGORITHMS)
    if collective == "allreduce":
        return default, []
    keep = [a for a in default if a == "native" or a in capable]
    if "auto" in capable and "auto" not in keep:
        keep.insert(len(keep) - 1, "auto")
    return keep, [a for a in default if a not in keep]


def _degraded_text(records: Any) -> str:
    """``"switch0-switch1 x0.25, A/nic0 x0.5 at 30 s"`` from :attr:`BenchReport.degrades`."""
    parts = []
    for d in records:
        when = "" if not d["after"] else (
            f" at {d['applied_s']:.1f} s" if d["applied_s"] is not None
            else f" (due at {d['after']:g} s, not reached)")
        parts.append(f"{d['link']} x{d['factor']:g}{when}")
    return ", ".join(parts)


def cmd_bench(args: argparse.Namespace) -> int:
    from ..testbed import capable
    from ..testbed.bench import bench
    from ..testbed.netns import interrupts_raise
    cluster = load_cluster(args.cluster)
    degrades = parse_degrades(args.degrade, cluster)
    algorithms, left_out = algorithms_for(args.collective, args.algorithms)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    from ..testbed.bench import check_case_size
    for size in sizes:
        try:
            check_case_size(size, cluster.nranks, args.collective)
        except TopoplanError as exc:
            raise TopoplanError(f"--sizes: {exc}") from None
    bed, owned = _testbed(args, cluster, capable)
    try:
        with interrupts_raise():  # SIGTERM too: the finally below removes the testbed
            report = bench(bed, cluster, algorithms, sizes, iters=args.iters,
                           warmup=args.warmup, timeout=args.timeout,
                           calibrate=args.calibrate, transport=args.transport,
                           probe=args.probe, collective=args.collective,
                           degrades=degrades)
    finally:
        if owned:
            bed.down()
    rows = report.rows
    if args.json:
        print(json_text({"cluster": cluster.name, "scale": bed.layout.scale,
                         "nranks": cluster.nranks, "left_out": left_out,
                         "degraded": _degraded_text(report.degrades),
                         **report.to_dict()}, indent=1))
        return 1 if any(r.wrong for r in rows) else 0
    cal = report.calibration
    t = table("algorithm", "size", "steps", "measured (ms)", "predicted (ms)", "meas/pred",
              "calibrated (ms)", "meas/cal", "native (ms)", "native/measured", "#wrong",
              title=f"{cluster.name} {args.collective} at scale 1/{1 / bed.layout.scale:.4g}, "
                    f"{args.transport}; native: {report.native_name or '-'}"
                    + (f"; degraded: {_degraded_text(report.degrades)}"
                       if report.degrades else ""))

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
    for note in report.notes:
        out.print(f"note: {note}")
    if report.degrades:
        out.print("note: degraded links: plans and predictions are the cluster file's (they do "
                  "not know of the fault); the network check used the degraded rates")
    if left_out:
        out.print(f"note: left out of the default algorithms: {', '.join(left_out)} (they "
                  f"plan only allreduce)")
    if report.probe is not None:
        out.print(f"network check: {len(report.probe.checks)} probes (every pair alone, every "
                  f"rank at once), worst deviation from the model {report.probe.worst:.1%}")
    if cal is not None:
        lat = "" if cal.latency_alpha_s is None else \
            f" (latency-bound small messages: {cal.latency_alpha_s * 1e3:.2f} ms)"
        red = "-" if cal.reduce_bandwidth is None else f"{cal.reduce_bandwidth / 1e9:.1f} GB/s"
        out.print(f"calibrated: alpha {cal.alpha_s * 1e3:.2f} ms per message{lat}, reduce "
                  f"{red}; load average {report.load[0]:.1f} -> {report.load[1]:.1f}")
        if cal.note:
            out.print(f"note: {cal.note}")
    return 1 if any(r.wrong for r in rows) else 0
