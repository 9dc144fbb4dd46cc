"""``topoplan doctor CLUSTER LOG``: explain a measured collective curve (nccl-tests
output, ``topoplan bench --json``, ``topoplan testbed bench --json``, a CSV) by ranking
fault hypotheses on the cluster (docs/DOCTOR.md)."""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from ..cluster import Cluster, load_cluster
from ..errors import TopoplanError
from .common import Column, add_nccl_arguments, console, fit_table, json_text, \
    left_out_note, output_width, positive_int


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor", help="explain a measured collective curve (nccl-tests, bench --json, CSV): "
                       "which fault on the cluster fits it best",
        description="Read a benchmark log, price the collective that ran on the cluster as "
                    "its file describes it and with each fault tried (a NIC down or slow, a "
                    "box's NVLink slow, no GPUDirect RDMA, ranks across racks, a slow "
                    "uplink, a slow box, a network plugin's latency), and rank the faults by "
                    "how well they explain the whole curve. nccl-tests logs are priced with "
                    "the nccl row (docs/NCCL_MODEL.md); a topoplan bench log with the plan "
                    "that ran, planned again and simulated. docs/DOCTOR.md says what each "
                    "fault means and what to check.")
    parser.add_argument("cluster", help="cluster YAML file of the machine that ran the log")
    parser.add_argument("log", help="the benchmark log: nccl-tests output, topoplan bench "
                                    "--json, topoplan testbed bench --json, or a CSV with "
                                    "size and busbw (GB/s) columns")
    parser.add_argument("--collective",
                        choices=["allreduce", "reduce_scatter", "allgather", "broadcast",
                                 "reduce"],
                        help="what ran, over what the log says (nccl-tests output names it "
                             "only when its command line is in the log)")
    parser.add_argument("--nranks", type=positive_int,
                        help="the rank count, over what the log says (it must be the "
                             "cluster's)")
    parser.add_argument("--place", choices=["best", "in", "out"], default="best",
                        help="nccl-tests' in-place or out-of-place columns, or per size the "
                             "faster (default best)")
    parser.add_argument("--algorithm", metavar="NAME",
                        help="which curves of a log with several (topoplan bench and testbed "
                             "logs: a planner's name, ring:0,2,1,3, nccl; commas for several); "
                             "default all that can be priced, fitted together")
    parser.add_argument("--scale", type=float, metavar="S",
                        help="testbed logs: the testbed's scale (printed by testbed up; new "
                             "logs carry it)")
    parser.add_argument("--top", type=positive_int, default=3,
                        help="how many of the best fits to show (default 3)")
    parser.add_argument("--json", action="store_true",
                        help="print every fit, the measured and the expected curves as JSON")
    add_nccl_arguments(parser)
    parser.set_defaults(func=cmd_doctor)


def planned_predictor(healthy: Cluster, profile: Any = None, plan_profile: Any = None) -> Any:
    """A :data:`~topoplan.analysis.doctor.fit.Predictor` for planned schedules: each
    algorithm planned once per size on the ``healthy`` cluster (as it ran: with
    ``plan_profile``, default ``profile``), then simulated with ``profile`` on each
    hypothesis's cluster (the same schedule on the changed links)."""
    plan_profile = profile if plan_profile is None else plan_profile
    from ..analysis.sim import simulate
    from ..analysis.sim.report import Yardsticks
    from ..testbed.bench import plan_algorithm

    plans: dict[tuple[str, str, int], Any] = {}

    def predict(cluster: Cluster, algorithm: str, collective: str,
                sizes: Sequence[int]) -> list[float]:
        out = []
        for size in sizes:
            key = (algorithm, collective, size)
            if key not in plans:
                plans[key] = plan_algorithm(healthy, algorithm, size, plan_profile, collective)
            report = simulate(cluster, plans[key], size, profile=profile, force=True,
                              yardsticks=Yardsticks(size, collective, 0.0, None))
            out.append(report.time_s)
        return out
    return predict


def _testbed_cluster(cluster: Cluster, log: Any, scale: float | None
                     ) -> tuple[Cluster, Any, Any, list[str]]:
    """The cluster a testbed log ran on (scaled), its calibrated costs, and the profile
    its plans were made with (``testbed bench`` plans with the calibration's
    ``planning_profile``: the pipeline depth that ran)."""
    scale = scale or log.scale
    if scale is None:
        raise TopoplanError(f"{log.path}: a testbed log without its scale; give --scale S "
                            "(testbed up prints it)")
    notes = [f"testbed at scale {scale:g}: the cluster's bandwidths x{scale:g}"]
    profile = plan_profile = None
    if log.calibration:
        from ..testbed.calibrate import Calibration
        fields = {k: log.calibration[k] for k in ("alpha_s", "reduce_bandwidth", "load",
                                                  "latency_alpha_s", "op_overhead_s")
                  if k in log.calibration}
        try:
            calibration = Calibration(**fields)
            profile, plan_profile = calibration.profile, calibration.planning_profile
            notes.append("priced with the log's calibrated software costs")
        except TypeError:
            notes.append("the log's calibration is incomplete: priced without it")
    return cluster.scaled(scale), profile, plan_profile, notes


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..analysis.doctor import diagnose, read_log
    from ..analysis.native.nccl_env import current
    from ..analysis.native.nccl_tables import DEFAULT_VERSION
    cluster = load_cluster(args.cluster)
    log = read_log(args.log, place=args.place, collective=args.collective)
    extra: list[str] = []
    profile = plan_profile = None
    if log.format == "testbed-bench":
        if log.cluster and log.cluster != cluster.name:
            extra.append(f"the log ran on {log.cluster!r}, the cluster file is "
                         f"{cluster.name!r}")
        cluster, profile, plan_profile, notes = _testbed_cluster(cluster, log, args.scale)
        extra += notes
    predict = planned_predictor(cluster, profile, plan_profile)
    diagnosis = diagnose(log, cluster, algorithm=args.algorithm, predict=predict,
                         nranks=args.nranks)
    settings = current()
    curves = list(dict.fromkeys(p.algorithm for p in diagnosis.points))
    planned = [name for name in curves if name != "nccl"]
    model = " and ".join(
        ([f"the nccl row (NCCL {settings.version or DEFAULT_VERSION}"
          + (f", NCCL_ALGO={settings.algo}" if settings.algo else "")
          + (f", NCCL_PROTO={settings.proto}" if settings.proto else "") + ")"]
         if "nccl" in curves else [])
        + ([f"{', '.join(planned)} planned on the cluster and simulated"] if planned else []))
    if args.json:
        print(json_text({"log": log.path, "format": log.format, "cluster": cluster.name,
                         "model": model, **diagnosis.to_dict(args.top),
                         "notes": extra + list(diagnosis.notes)}, indent=1))
        return 0
    _print(diagnosis, log, cluster, model, extra, args.top)
    return 0


def _gbps(value: float) -> str:
    gb = value / 1e9
    return f"{gb:.1f}" if gb >= 10 else f"{gb:.2f}" if gb >= 0.01 else f"{gb:.2g}"


def _size(size: int) -> str:
    from ..units import format_size
    return format_size(size)


def _print(d: Any, log: Any, cluster: Cluster, model: str, extra: list[str], top: int) -> None:
    out = console()
    out.print(f"{log.path}: {log.format}, {d.collective}, {d.nranks} ranks, "
              f"{len(d.points)} points; on {cluster.name}, priced with {model}", soft_wrap=True, markup=False)
    for note in extra + list(d.notes):
        out.print(f"note: {note}", markup=False)
    out.print(f"\nverdict: {d.verdict}\n", markup=False)
    best = list(d.fits[:top])
    width = output_width() or 100
    several = len({p.algorithm for p in d.points}) > 1
    columns = [Column("algorithm")] if several else []
    columns += [Column("size", "right"), Column("measured\nbusbw"), Column("healthy\nbusbw"),
               Column("measured/\nhealthy", drop=1)]
    columns += [Column(f"fit {i + 1}\nbusbw", drop=2 + i) for i in range(len(best))]
    rows = []
    for i, p in enumerate(d.points):
        healthy = d.busbw(p.size, d.healthy.expected_s[i])
        rows.append(([p.algorithm] if several else [])
                    + [_size(p.size), _gbps(p.busbw or 0), _gbps(healthy),
                     f"{(p.busbw or 0) / healthy:.2f}" if healthy else "-"]
                    + [_gbps(d.busbw(p.size, f.expected_s[i])) for f in best])
    table, left = fit_table(columns, rows, width, title="bus bandwidth (GB/s) per size")
    out.print(table)
    if (note := left_out_note(left, width)):
        out.print(note)
    out.print("")
    for i, f in enumerate(best, 1):
        where = f" [{f.stands_for}]" if f.stands_for else ""
        out.print(f"fit {i}: {f.label}{where}: score {f.score:.3f} (RMS {f.rms:.1%} off)",
                  soft_wrap=True, markup=False)
        out.print(f"  explains: {f.explains}", soft_wrap=True, markup=False)
        if f.check:
            out.print(f"  check: {f.check}", soft_wrap=True, markup=False)
    rest = ", ".join(f"{f.label} {f.score:.3f}" for f in d.fits[top:top + 6])
    if rest:
        out.print(f"next: {rest}", soft_wrap=True, markup=False)
