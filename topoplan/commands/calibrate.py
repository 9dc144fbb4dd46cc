"""``topoplan calibrate``: measure this machine's transport costs and write a cost profile.

Started by a user, the command checks its arguments, then launches itself under
``mpiexec -n N`` (as ``topoplan bench`` does); the ranks run the micro-benchmarks of
:mod:`topoplan.runtime.calibrate` over MPI, torch.distributed (gloo over loopback) or NCCL, and
rank 0 hands the timings back in a file. The command then fits the profile, prints one
row per micro-benchmark (measured, fitted, residual) and the profile, and writes the
YAML file atomically: an error or Ctrl-C leaves no file, or the old one untouched.

Without ``-o`` the profile goes to the cache of profiles measured on the job
(:mod:`topoplan.runtime.calibrate.cache`), keyed by the cluster (``--cluster``), the
transport, the ranks and their hosts: the ranks run
:func:`~topoplan.runtime.calibrate.job_profile`, which measures only when nothing is
cached for the key (or ``--refresh``), and hand the profile back. ``--show`` lists the
cache and ``--clear`` empties it, launching nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import TopoplanError, TransportError
from .common import (MPIEXEC_HELP, SHARE_GPUS_HELP, check_transport, choose_port, json_text,
                     plural, rank_transport, report)

__all__ = ["register"]

TRANSPORTS = ("mpi", "torch", "nccl")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure this machine's transport costs and write a cost profile",
        description="Run micro-benchmarks (a ping-pong, executor runs of small schedules, "
                    "adds, and the transport's own allreduce, reduce-scatter and allgather "
                    "over groups of ranks) on N ranks of this machine, fit a cost profile "
                    "through the simulator and write it as YAML: bench --profile predicts "
                    "runs with it, "
                    "topoplan.plan(..., profile=FILE) and topoplan.simulate(..., profile=FILE) "
                    "plan and price against it. Without -o the profile goes to the cache that "
                    "jobs are priced from (keyed by cluster, transport, ranks and hosts; "
                    "$XDG_CACHE_HOME/topoplan/profiles), and one already cached is reused.")
    p.add_argument("--transport", choices=TRANSPORTS, default=None,
                   help="mpi (Open MPI), torch (torch.distributed over gloo, loopback) or "
                        "nccl (CuPy; one GPU per rank) (default mpi; with --show or --clear, "
                        "the cached profiles of this transport)")
    p.add_argument("-n", "--nranks", type=int, default=None,
                   help="ranks to launch (2 or more; with --show or --clear, the cached "
                        "profiles of this many ranks)")
    p.add_argument("--share-gpus", action="store_true", help=SHARE_GPUS_HELP)
    p.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                   help="the cluster the job runs: its fingerprint keys the cached profile "
                        "(without it the key says 'host'); with --show or --clear, the "
                        "cached profiles of this cluster")
    what = p.add_mutually_exclusive_group()
    what.add_argument("-o", "--output", default=None, metavar="PROFILE.yaml",
                      help="write the profile to this file (without -o it goes to the cache "
                           "of profiles measured on the job, and a cached one is reused)")
    what.add_argument("--show", action="store_true",
                      help="print the cached profiles, one line each (with --cluster, "
                           "--transport or -n: that entry in full), launching nothing")
    what.add_argument("--refresh", action="store_true",
                      help="measure again even when a profile is cached for this key, and "
                           "replace it")
    what.add_argument("--clear", action="store_true",
                      help="remove the cached profiles (with --cluster, --transport or -n: "
                           "those only), launching nothing")
    p.add_argument("--name", default=None,
                   help="the profile's name (default: the output file's name without .yaml; "
                        "in the cache, TRANSPORT-nN)")
    p.add_argument("--quick", action="store_true",
                   help="5 repeats of 10 ms blocks instead of 15 of 40 ms: seconds, noisier")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a step may wait for a peer before failing (default 60)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (the profile and where it went) instead of tables")
    p.add_argument("--mpiexec", metavar="PATH", default=None, help=MPIEXEC_HELP)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)  # ranks -> parent
    p.set_defaults(func=cmd_calibrate, calibrate_parser=p)


#: Options that only a measurement takes (refused with --show and --clear).
_RUN_ONLY = (("quick", "--quick"), ("name", "--name"), ("share_gpus", "--share-gpus"),
             ("mpiexec", "--mpiexec"))


def _check_combinations(args: argparse.Namespace) -> None:
    """What argparse's groups cannot say, said as argparse says it (exit status 2)."""
    parser = args.calibrate_parser
    if args.output and args.cluster:
        parser.error("argument --cluster: not allowed with argument -o/--output (--cluster "
                     "keys the cache; with -o the profile goes to that file alone)")
    if args.show or args.clear:
        what = "--show" if args.show else "--clear"
        for dest, flag in _RUN_ONLY:
            if getattr(args, dest):
                parser.error(f"argument {flag}: not allowed with argument {what} (it "
                             "launches nothing)")


def _check_args(args: argparse.Namespace) -> tuple[int, Path | None, str | None]:
    """The ranks, the output file (None: the cache) and the profile's name (None: the
    cache's default)."""
    if args.nranks is None:
        raise TopoplanError("say how many ranks to calibrate with: -n N (2 or more)")
    if args.nranks < 2:
        raise TopoplanError(f"-n {args.nranks}: calibration needs 2 or more ranks (a ping-pong "
                            "between ranks 0 and 1)")
    if not args.timeout > 0:
        raise TopoplanError(f"--timeout {args.timeout:g}: must be > 0 seconds")
    output = None
    if args.output:
        output = Path(args.output)
        if output.suffix not in (".yaml", ".yml"):
            raise TopoplanError(f"-o {args.output}: name the profile file .yaml or .yml "
                                "(profiles are read by that suffix)")
        folder = output.parent if str(output.parent) else Path(".")
        if not folder.is_dir():
            raise TopoplanError(f"-o {args.output}: folder {str(folder)!r} does not exist")
        if not os.access(folder, os.W_OK):
            raise TopoplanError(f"-o {args.output}: folder {str(folder)!r} is not writable")
        if output.is_dir():
            raise TopoplanError(f"-o {args.output}: is a folder; name a .yaml file")
    name = args.name if args.name is not None else (output.stem if output else None)
    if name is not None and (not name.strip() or any(c in name for c in "\n\r\t")):
        raise TopoplanError(f"--name {name!r}: give a non-empty name on one line")
    return args.nranks, output, name.strip() if name is not None else None


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..runtime.mpirun import inside_mpi
    if args.result and inside_mpi():
        return _run_rank(args)
    _check_combinations(args)
    if args.show:
        return _show(args)
    if args.clear:
        return _clear(args)
    if inside_mpi():
        return _run_rank(args)  # says who starts the ranks
    args.transport = args.transport or "mpi"
    nranks, output, name = _check_args(args)
    if args.cluster is not None:
        from ..cluster import load_cluster
        load_cluster(args.cluster)  # a bad file fails here, not on every rank
    check_transport(args.transport, nranks, share_gpus=args.share_gpus)
    import tempfile

    from ..runtime.mpirun import launch_command, mpiexec
    launch_command(nranks, [], launcher=args.mpiexec)  # fail before the run: no launcher
    with tempfile.TemporaryDirectory(prefix="topoplan-calibrate-") as tmp:
        result = Path(tmp, "samples.json")
        argv = [sys.executable, "-m", "topoplan", "calibrate", "--transport", args.transport,
                "-n", str(nranks), "--timeout", str(args.timeout), "--result", str(result)]
        if output is not None:
            argv += ["-o", str(output)]
        elif args.refresh:
            argv.append("--refresh")
        if args.cluster is not None:
            argv += ["--cluster", os.path.abspath(args.cluster)]
        if name is not None:
            argv += ["--name", name]
        if args.quick:
            argv.append("--quick")
        if args.share_gpus:
            argv.append("--share-gpus")
        choose_port()
        _progress(f"launching {plural(nranks, 'rank')} over {args.transport}"
                  f"{' (quick)' if args.quick else ''}"
                  f"{'' if output is not None else ': the cached profile, or a measurement'}")
        _warn_if_busy()
        proc = mpiexec(nranks, argv, capture=False, fault_tolerant=True,
                       launcher=args.mpiexec)
        if proc.returncode != 0 or not result.exists():
            raise TopoplanError(f"the calibration run failed (mpiexec exit status "
                                f"{proc.returncode}); the ranks' errors are above")
        data = json.loads(result.read_text())
    if output is None:
        return _report_cached(args, data)
    assert name is not None  # -o names the profile after the file
    profile = _fit(data, nranks, name, args.quick)
    header = _header(profile, args, nranks, output, name)
    profile.save(output, header=header)
    if args.json:
        print(json_text({"file": str(output), "profile": profile.to_dict()}))
    else:
        _print(profile, f"wrote {output}")
    return 0


# ---------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------
def _report_cached(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """What the ranks' :func:`job_profile` gave: a profile measured now and cached, or
    the one cached before, reused."""
    from ..analysis.cost import loads_profile
    profile = loads_profile(data["profile"], data.get("file") or "<the ranks' profile>")
    source, measured = data["source"], data["source"].startswith("calibrated now")
    if args.json:
        print(json_text({"file": data.get("file"), "source": source, "reused": not measured,
                         "profile": profile.to_dict()}))
        return 0
    if measured:
        cached = data.get("file") is not None
        _print(profile, f"cached in {data['file']}: jobs with this key reuse it (--show lists "
                        "the cache)" if cached else source)
        return 0
    from .common import console
    out = console()
    out.print(profile.summary(), soft_wrap=True)
    out.print(f"reusing the cached profile {data.get('file')} (measured "
              f"{profile.calibration.get('date', '-')}); --refresh measures again, "
              "--show prints it in full", soft_wrap=True)
    return 0


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    """--cluster, --transport and -n as :func:`cached_profiles` takes them."""
    return {"cluster": args.cluster, "transport": args.transport, "nranks": args.nranks}


def _entry_dict(entry: Any) -> dict[str, Any]:
    key, profile = entry.key, entry.profile
    return {"file": str(entry.path),
            "cluster": key.fingerprint if key else None,
            "transport": key.transport if key else None,
            "ranks": key.nranks if key else None,
            "hosts": list(key.host_names) if key else None,
            "date": entry.date if profile else None,
            "summary": profile.summary() if profile else None,
            "problem": entry.problem}


def _entry_line(entry: Any) -> str:
    if entry.key is None or entry.profile is None:
        return f"{entry.path.name}  unusable: it {entry.problem}"
    key = entry.key
    hosts = ",".join(key.host_names) or key.hosts
    return (f"{entry.path.name}  {key.transport}  {plural(key.nranks, 'rank')}  {hosts}  "
            f"{entry.date}  {entry.profile.summary()}")


def _make_hint(args: argparse.Namespace) -> str:
    parts = ["topoplan calibrate", "--transport", args.transport or "mpi", "-n",
             str(args.nranks or "N")]
    if args.cluster:
        parts += ["--cluster", args.cluster]
    return " ".join(parts + ["--quick"])


def _show(args: argparse.Namespace) -> int:
    from ..runtime.calibrate import cache_root, cached_profiles
    filters = _filters(args)
    filtered = any(v is not None for v in filters.values())
    entries = cached_profiles(**filters)
    root = cache_root()
    one = entries[0] if filtered and len(entries) == 1 and entries[0].profile else None
    if args.json:
        out: dict[str, Any] = {"cache": str(root), "profiles": [_entry_dict(e) for e in entries]}
        if one is not None:
            out["profile"] = one.profile.to_dict()  # type: ignore[union-attr]
        print(json_text(out))
        return 0
    from .common import console
    con = console()
    if not entries:
        what = "for these options" if filtered else "yet"
        con.print(f"no cached profile {what} in {root}; make one with: {_make_hint(args)}",
                  soft_wrap=True)
        return 0
    if one is not None:
        assert one.key is not None and one.profile is not None
        con.print(f"{one.path}: {one.key.describe()}", soft_wrap=True)
        if one.profile.calibration.get("samples"):
            _print(one.profile, f"cached in {one.path}")
        else:
            con.print(one.profile.summary(), soft_wrap=True)
        return 0
    con.print(f"cached profiles in {root}:", soft_wrap=True)
    for entry in entries:
        con.print(_entry_line(entry), soft_wrap=True, markup=False, highlight=False)
    return 0


def _clear(args: argparse.Namespace) -> int:
    from ..runtime.calibrate import cache_root, cached_profiles
    filters = _filters(args)
    removed = []
    for entry in cached_profiles(**filters):
        entry.path.unlink(missing_ok=True)
        removed.append(str(entry.path))
    if args.json:
        print(json_text({"cache": str(cache_root()), "removed": removed}))
        return 0
    for path in removed:
        print(f"removed {path}")
    if not removed:
        what = " for these options" if any(v is not None for v in filters.values()) else ""
        print(f"no cached profile to remove{what} in {cache_root()}")
    return 0


def _progress(text: str) -> None:
    print(f"calibrate: {text}", file=sys.stderr, flush=True)


def _warn_if_busy() -> None:
    """Say so when other work already keeps the CPUs busy: the timings will carry it."""
    from ..runtime.calibrate import load_average
    load, cpus = load_average(), os.cpu_count() or 1
    if load > 0.5 * cpus:
        _progress(f"warning: 1-minute load average {load:.2f} on {cpus} CPUs before the run: "
                  "other work shares the machine and the timings will carry it (the load "
                  "is recorded in the profile)")


def _fit(data: dict[str, Any], nranks: int, name: str, quick: bool) -> Any:
    from ..runtime.calibrate import Sample, calibration_cases, fit_profile, native_cases
    cases = {c.label: c for c in calibration_cases(nranks) + native_cases(nranks)}

    def read(entries: list[dict[str, Any]]) -> list[Any]:
        out = []
        for entry in entries:
            case = cases.get(entry["label"])
            if case is None:
                raise TopoplanError(f"the ranks measured a case this topoplan does not know: "
                                    f"{entry['label']!r}; run the ranks from the same install")
            out.append(Sample(case, entry["measured_s"], tuple(entry["repeats_s"]),
                              entry["calls"]))
        return out

    samples = read(data["samples"])
    natives = read(data.get("native_samples", []))
    _progress("fitting through the simulator")
    context = {"load_average": data["load_average"], "repeats": data["repeats"],
               "quick": quick}
    return fit_profile(samples, name=name, nranks=nranks, transport=data["transport"],
                       context=context, cores=data.get("cores"),
                       small_max=data.get("small_max"), native_samples=natives,
                       native_skipped=data.get("native_skipped", []))


def _header(profile: Any, args: argparse.Namespace, nranks: int, output: Path,
            name: str) -> str:
    import textwrap
    record = profile.calibration
    quick = " --quick" if args.quick else ""
    load = record.get("load_average") or ()
    cpus = record.get("cpus")
    lines = [
        f"Cost profile of topoplan's executor over {record.get('transport')}, {nranks} ranks "
        f"on one host, measured on {record.get('host')} ({cpus} CPUs), {record.get('date')}, "
        f"1-minute load average {' -> '.join(str(x) for x in load)}, with:",
        f"    topoplan calibrate --transport {args.transport} -n {nranks} --name {name}{quick} "
        f"-o {output}",
        "Run the same command to measure your machine (other work on it shows in the "
        f"numbers); `topoplan bench --profile {output}` then prints the predicted time "
        "beside the measured one.",
        f"alpha and step_overhead: {record.get('rule')}.",
    ]
    native = record.get("native")
    if native is not None and profile.native_costs:
        lines.append(f"native: the transport's own {', '.join(k for k, _ in profile.native_costs)}"
                     f"; {native.get('rule')}; rms residual {native.get('rms_residual_pct')}%.")
    elif native is not None:
        lines.append(f"native: not measured ({'; '.join(native.get('skipped') or ())}): native "
                     "steps are priced as point-to-point rings on these costs.")
    if profile.host_cores is not None:
        lines.append(f"{nranks} ranks on {profile.host_cores} cores: the costs are a rank's "
                     "with a core to itself (the adds measured all at once, scaled by ranks "
                     "per core); the simulator stretches the time more ranks than cores "
                     "work at once (host.cores).")
    return "\n".join("\n".join(textwrap.wrap(line, 88, subsequent_indent="  ",
                                             break_on_hyphens=False))
                     if not line.startswith("    ") else line for line in lines)


def _print(profile: Any, last: str) -> None:
    """The fit's tables and the profile, then ``last`` (where the profile went)."""
    from ..units import format_bandwidth, format_time
    from .common import console, table
    record = profile.calibration
    out = console()
    t = table("case", "what", "measured", "fitted", "residual", "spread",
              title=f"{profile.name}: {record.get('transport')}, {record.get('ranks')} ranks, "
                    f"median of {record.get('repeats')} repeats")
    t.columns[1].justify = "left"
    for row in record["samples"]:
        fitted = row.get("fitted_us")
        residual = row.get("residual_pct")
        t.add_row(row["case"], row["what"], format_time(row["measured_us"] * 1e-6),
                  "-" if fitted is None else format_time(fitted * 1e-6),
                  "-" if residual is None else f"{residual:+.1f}%",
                  f"{row['spread_pct']:.0f}%")
    out.print(t)
    per_step = record["per_step_cost_us"] * 1e-6
    latency = record["pingpong_latency_us"] * 1e-6
    per_message = record["pingpong_per_message_us"] * 1e-6
    out.print(f"per-step cost {format_time(per_step)} (fitted on the executor runs); ping-pong: "
              f"one-way latency {format_time(latency)} + {format_time(per_message)} per message "
              f"posted")
    if profile.small_max is not None:
        out.print(f"split: alpha of messages up to {profile.small_max} B = the transport's "
                  f"latency = {format_time(profile.small_alpha_box)}, step_overhead = per-step "
                  f"cost - alpha = {format_time(profile.step_overhead)}; larger messages: "
                  f"alpha {format_time(profile.alpha_box)}")
    else:
        out.print(f"split: alpha = the transport's latency = {format_time(profile.alpha_box)}, "
                  f"step_overhead = per-step cost - alpha = {format_time(profile.step_overhead)}")
    for note in record.get("clamped", ()):
        out.print(f"clamped: {note}")
    if record.get("unidentified"):
        out.print(f"not identified (no run depends on them): {', '.join(record['unidentified'])}")
    native = record.get("native")
    if native is not None and native.get("samples"):
        t = table("case", "what", "measured", "fitted", "residual", "spread",
                  title="the transport's own collectives over groups of ranks")
        t.columns[1].justify = "left"
        for row in native["samples"]:
            t.add_row(row["case"], row["what"], format_time(row["measured_us"] * 1e-6),
                      format_time(row["fitted_us"] * 1e-6), f"{row['residual_pct']:+.1f}%",
                      f"{row['spread_pct']:.0f}%")
        out.print(t)
        for kind, cost in profile.native_costs:
            out.print(f"native {kind}: alpha {format_time(cost.alpha)} + "
                      f"{format_time(cost.alpha_per_rank)} per rank past the first, bus "
                      f"bandwidth {format_bandwidth(cost.bandwidth)}")
        out.print(f"native rms residual {native.get('rms_residual_pct')}%")
    for note in (native or {}).get("skipped") or ():
        out.print(note)
    host = "-" if profile.host_bandwidth is None else format_bandwidth(profile.host_bandwidth)
    cores = "" if profile.host_cores is None else f" on {profile.host_cores} cores"
    out.print(f"{profile.summary()}; host {host} per rank{cores}")
    load = record.get("load_average") or ()
    out.print(f"rms residual {record.get('rms_residual_pct')}% over the executor runs; 1-minute "
              f"load average {' -> '.join(str(x) for x in load)}")
    out.print(last, soft_wrap=True)


# ---------------------------------------------------------------------------
# Inside mpiexec
# ---------------------------------------------------------------------------
def _run_rank(args: argparse.Namespace) -> int:
    """One rank: measure and hand the samples to the launching command (``-o``), or run
    :func:`~topoplan.runtime.calibrate.job_profile` and hand it the profile (the cache)."""
    from ..runtime.calibrate import host_cores, job_profile, measure_all, small_limit, \
        transport_info
    if not args.result:
        raise TopoplanError("inside mpiexec, calibrate is started by topoplan calibrate itself")
    transport = rank_transport(args.transport, timeout=args.timeout, share_gpus=args.share_gpus)
    try:
        if args.output:
            measured = measure_all(transport, quick=args.quick, timeout=args.timeout,
                                   progress=_progress)
        else:
            profile, source = job_profile(
                transport, args.cluster, calibrate_missing=True, refresh=args.refresh,
                quick=args.quick, progress=_progress, name=args.name, timeout=args.timeout,
                environment=False)
    except TransportError as exc:
        report(exc)
        if args.transport == "mpi":
            from ..runtime.transports.mpi import LEAVE_GRACE, leave_after_failure
            leave_after_failure(1, grace=min(args.timeout, LEAVE_GRACE))
        return 1
    if transport.rank == 0:
        if args.output:
            data: dict[str, Any] = {
                "transport": transport_info(transport), "nranks": transport.size,
                "cores": host_cores(transport), "small_max": small_limit(transport),
                "load_average": list(measured.load_average), "repeats": measured.repeats,
                "samples": [_sample_dict(s) for s in measured.samples],
                "native_samples": [_sample_dict(s) for s in measured.native_samples],
                "native_skipped": list(measured.native_skipped)}
        else:
            from ..runtime.calibrate import CacheKey
            record = profile.calibration.get("cache")
            cached = record is not None and not source.startswith("calibrated now (not cached")
            data = {"source": source, "profile": profile.dumps(),
                    "file": str(CacheKey.from_dict(record).path)
                    if cached and record is not None else None}
        from .._util import atomic_write
        atomic_write(args.result, json_text(data))
    if args.transport == "torch":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


def _sample_dict(sample: Any) -> dict[str, Any]:
    return {"label": sample.label, "measured_s": sample.measured_s,
            "repeats_s": list(sample.repeats_s), "calls": sample.calls}
