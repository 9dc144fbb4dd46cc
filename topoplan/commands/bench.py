"""``topoplan bench``: run a schedule for real and print nccl-tests columns.

Started by a user, the command checks its arguments, builds the schedule, checks it
with :func:`topoplan.verify` (a ``--plan`` file that fails is refused with the
verifier's message), then launches itself under ``mpiexec -n N`` (with the settings of
:mod:`topoplan.runtime.mpirun`); each rank replays the schedule over MPI or
torch.distributed (gloo) with :func:`topoplan.runtime.bench.run_bench` and rank 0 prints one
row per size::

    size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong

The columns take the width of the terminal ($COLUMNS; 80 in a pipe), and those that do
not fit are left out, with a line naming them (:func:`topoplan.runtime.bench.format_rows`).
The collective is the plan's (``--plan``), or ``--collective allreduce|reduce_scatter|
allgather`` for ``--algorithm``; sizes are the full buffer (nccl-tests' convention),
busbw has the collective's factor. ``--baseline native`` adds the transport's own
collective (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather; dist.all_reduce,
reduce_scatter_tensor, all_gather_into_tensor) on the same buffers, side by side.
``--profile NAME|FILE`` (a profile written by ``topoplan calibrate``) adds the
simulator's prediction for each size on the machine the profile was measured on, and
measured/predicted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import asdict
from typing import Any

from ..runtime.bench import (DTYPES, ITEMSIZE, check_sizes, format_rows, predict_rows, run_bench,
                     with_article)
from ..ir.collectives import COLLECTIVES, get_collective
from ..errors import TopoplanError, TransportError
from ..ir.schedule import Schedule
from .common import (MPIEXEC_HELP, SHARE_GPUS_HELP, check_transport, choose_port, json_text,
                     output_width, plan_name, plural, rank_transport, report, sizes_arg)

__all__ = ["register"]

DEFAULT_SIZES = "1KiB:64MiB"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="run a schedule over MPI or torch.distributed and print nccl-tests columns",
        description="Replay a schedule for real (launching itself under mpiexec) and print "
                    "size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong per size. "
                    "Columns take the terminal's width ($COLUMNS; 80 in a pipe): where they do "
                    "not fit, count, type and redop, then algbw, then busbw are left out, and "
                    "a line says so; --json has them all.")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--plan", metavar="PLAN.json", help="schedule file to run")
    source.add_argument("--algorithm", metavar="ALG",
                        help="plan with this algorithm (ring, tree, rhd, ...) on --cluster")
    p.add_argument("--cluster", metavar="CLUSTER.yaml",
                   help="cluster for --algorithm (default: N one-GPU boxes on one switch); "
                        "with --plan, the cluster the plan must have been made for")
    p.add_argument("--force", action="store_true",
                   help="run a --plan made for another cluster than --cluster (its recorded "
                        "cluster fingerprint differs)")
    p.add_argument("-n", "--nranks", type=int, default=None,
                   help="processes to launch (default: the schedule's rank count)")
    p.add_argument("-c", "--collective", choices=list(COLLECTIVES), default=None,
                   help="what to run: allreduce (default), reduce_scatter or allgather; "
                        "with --plan, the plan's collective (must match if given)")
    p.add_argument("--sizes", type=sizes_arg, default=None,
                   help="full-buffer sizes (a reduce-scatter's input, an allgather's output; "
                        "for those a multiple of N elements), e.g. 1KiB:256MiB (powers of 2), "
                        f"1K:1G:4, 8,64,1M (default {DEFAULT_SIZES}, rounded down to multiples "
                        "of N elements for reduce_scatter and allgather, as nccl-tests does)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="element type of the buffers (default float32)")
    p.add_argument("--transport", choices=("mpi", "torch", "nccl"), default="mpi",
                   help="mpi (Open MPI), torch (torch.distributed over gloo, loopback) or nccl "
                        "(CuPy arrays on the GPUs; one GPU per rank) (default mpi)")
    p.add_argument("--share-gpus", action="store_true", help=SHARE_GPUS_HELP)
    p.add_argument("--baseline", choices=("none", "native"), default="none",
                   help="native: also time the transport's own collective side by side "
                        "(MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather, or "
                        "dist.all_reduce / reduce_scatter_tensor / all_gather_into_tensor)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed runs per size (default: as many as fit ~0.3 s)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs per size before the timed ones (default 1)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a step may wait for a peer before failing (default 60)")
    p.add_argument("--profile", metavar="NAME|FILE",
                   help="also print the time the simulator predicts with this calibrated cost "
                        "profile (topoplan calibrate writes one) and measured/predicted")
    p.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    p.add_argument("--mpiexec", metavar="PATH", default=None, help=MPIEXEC_HELP)
    # The launcher verified the plan already; its ranks need not do it again.
    p.add_argument("--verified", action="store_true", help=argparse.SUPPRESS)
    # --algorithm auto: the candidates of each size, planned by the launcher.
    p.add_argument("--choices", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)


def _schedule(args: argparse.Namespace) -> Schedule:
    from ..ir.parse import load_schedule
    if args.plan:
        schedule = load_schedule(args.plan)
        if args.collective is not None and args.collective != schedule.collective:
            raise TopoplanError(f"{args.plan} is {with_article(schedule.collective)} plan but "
                                f"--collective asks for {args.collective}; plan one with "
                                f"topoplan plan CLUSTER --collective {args.collective} "
                                "-o PLAN.json")
        if args.cluster:
            from ..cluster import load_cluster
            from ..ir.fingerprint import check_fingerprint
            cluster = load_cluster(args.cluster)
            if schedule.nranks != cluster.nranks and not args.force:
                raise TopoplanError(f"{args.plan} has {schedule.nranks} ranks but "
                                    f"{args.cluster} has {cluster.nranks} GPUs; plan it for "
                                    f"this cluster: topoplan plan {args.cluster} -o PLAN.json")
            check_fingerprint(schedule, cluster, plan=args.plan, cluster_file=args.cluster,
                              force=args.force)
        return schedule
    algorithm = args.algorithm or "ring"
    cluster = _cluster(args)
    try:
        from ..planners import plan
    except ImportError:
        raise TopoplanError("the planners are not installed in this topoplan; pass --plan "
                            "PLAN.json") from None
    size = max(args.sizes) if args.sizes else 64 << 20
    pricing = _pricing(args, cluster)
    return plan(cluster, algorithm=algorithm, size=size,
                collective=args.collective or "allreduce", profile=pricing.profile,
                machine=pricing.machine)


def _cluster(args: argparse.Namespace) -> Any:
    if args.cluster:
        from ..cluster import load_cluster
        return load_cluster(args.cluster)
    if args.nranks is None:
        raise TopoplanError("say how many ranks: -n N, or give --cluster or --plan")
    from ..cluster import flat_cluster
    return flat_cluster(args.nranks)


def _pricing(args: argparse.Namespace, cluster: Any) -> Any:
    """The price of the plans this bench runs: ``--profile``, else the transport's own
    (the calibration cached for this cluster, transport and host, else the shipped
    profile of the transport), on this host when the profile was measured on one (the
    ranks run here)."""
    from ..runtime.calibrate import launcher_profile
    from ..runtime.calibrate import Pricing
    if args.profile:
        from ..analysis.cost import get_profile
        profile, source = get_profile(args.profile), "--profile"
    else:
        profile, source = launcher_profile(args.transport, cluster)
    machine = (profile.host_cluster(cluster.nranks) if profile.host_bandwidth is not None
               else None)
    return Pricing(profile, machine, source)


def _choices(args: argparse.Namespace, cluster: Any) -> dict[int, tuple[list[Any], str]]:
    """``--algorithm auto``: the model's candidates for every size, made here once (the
    ranks explore them)."""
    from ..runtime.choice import model_options
    pricing = _pricing(args, cluster)
    return {size: model_options(cluster, size, args.collective or "allreduce",
                                profile=pricing.profile, machine=pricing.machine)
            for size in args.sizes}


def _dump_choices(choices: dict[int, tuple[list[Any], str]], path: str) -> None:
    """The candidates as the ranks read them back (:func:`_load_choices`)."""
    import json
    data = {size: {"model_choice": model_choice,
                   "options": [{"algorithm": o.algorithm, "predicted_s": o.predicted_s,
                                "schedule": o.schedule.to_json()} for o in options]}
            for size, (options, model_choice) in choices.items()}
    with open(path, "w") as f:
        json.dump(data, f)


def _sizes(args: argparse.Namespace, nranks: int, collective: str) -> None:
    """``--sizes`` (default :data:`DEFAULT_SIZES`), checked for ``collective``."""
    if args.sizes is None:
        args.sizes = _default_sizes(nranks, collective, args.dtype)
    try:
        check_sizes(args.sizes, nranks, collective, args.dtype)
    except TopoplanError as exc:
        raise TopoplanError(f"--sizes: {exc}") from None


def _load_choices(path: str) -> dict[int, tuple[list[Any], str]]:
    import json

    from ..ir.parse import loads_schedule
    from ..runtime.choice import Option
    with open(path) as f:
        data = json.load(f)
    return {int(size): ([Option(o["algorithm"], loads_schedule(o["schedule"]), o["predicted_s"])
                         for o in entry["options"]], entry["model_choice"])
            for size, entry in data.items()}


def _forward_argv(args: argparse.Namespace, plan_path: str,
                  choices_path: str | None = None) -> list[str]:
    """The rank command line: always from a plan file, so ranks never re-plan."""
    argv = [sys.executable, "-m", "topoplan", "bench", "--plan", plan_path, "--verified",
            "--sizes", ",".join(str(s) for s in args.sizes), "--dtype", args.dtype,
            "--transport", args.transport, "--baseline", args.baseline,
            "--warmup", str(args.warmup), "--timeout", str(args.timeout)]
    if args.share_gpus:
        argv.append("--share-gpus")
    if args.iters is not None:
        argv += ["--iters", str(args.iters)]
    if args.profile:
        argv += ["--profile", args.profile]
    if args.json:
        argv.append("--json")
    if choices_path is not None:
        argv += ["--choices", choices_path]
    return argv


def _default_sizes(nranks: int, collective: str, dtype: str) -> list[int]:
    """:data:`DEFAULT_SIZES`, for a reduce-scatter or an allgather rounded down to
    multiples of ``nranks`` elements (nccl-tests' rounding), none below one element each."""
    sizes = sizes_arg(DEFAULT_SIZES)
    if not get_collective(collective).sharded:
        return sizes
    step = nranks * ITEMSIZE[dtype]
    return sorted({max(step, s // step * step) for s in sizes})


def cmd_bench(args: argparse.Namespace) -> int:
    from ..runtime.mpirun import inside_mpi
    if args.sizes is not None and any(s <= 0 for s in args.sizes):
        raise TopoplanError("sizes must be > 0 bytes")
    if inside_mpi():
        return _run_rank(args)
    import tempfile

    from ..runtime.mpirun import mpiexec
    if args.profile:
        _check_profile(args)
    choices = None
    if args.algorithm == "auto":
        # Every size's candidates, planned once; the plan file is the model's choice at
        # the largest (the ranks take its collective and rank count).
        from ..runtime.choice import auto_mode, explore_budget
        mode = auto_mode()
        cluster = _cluster(args)
        _sizes(args, cluster.nranks, args.collective or "allreduce")
        choices = _choices(args, cluster)
        options, model_choice = choices[max(args.sizes)]
        schedule = next(o.schedule for o in options if o.algorithm == model_choice)
    else:
        schedule = _schedule(args)
    _verify(schedule, args.plan or f"the {schedule.algorithm} plan")
    nranks = args.nranks if args.nranks is not None else schedule.nranks
    if nranks != schedule.nranks:
        raise TopoplanError(f"the {schedule.algorithm} schedule is for {schedule.nranks} ranks "
                            f"but -n asks for {nranks}")
    _sizes(args, nranks, schedule.collective)
    check_transport(args.transport, nranks, share_gpus=args.share_gpus)
    if args.plan:
        _warn_priced_elsewhere(schedule, args.transport)
    if choices is not None:
        if not args.json:
            how = ("the model's choice, nothing measured (TOPOPLAN_AUTO=model)"
                   if mode == "model" else
                   f"each size times the model's best candidates and the native collective "
                   f"(at most {explore_budget()} calls, each checked) and runs the fastest")
            print(f"# auto: {how}", flush=True)
    with tempfile.TemporaryDirectory(prefix="topoplan-bench-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        schedule.save(plan_path)
        choices_path = None
        if choices is not None:
            choices_path = os.path.join(tmp, "choices.json")
            _dump_choices(choices, choices_path)
        choose_port()
        proc = mpiexec(nranks, _forward_argv(args, plan_path, choices_path), capture=False,
                       fault_tolerant=True, launcher=args.mpiexec)
    if proc.returncode < 0:  # the launcher itself was killed; its ranks were ended
        raise TopoplanError(f"mpiexec was ended by {signal.Signals(-proc.returncode).name}; "
                            "its ranks were stopped")
    return proc.returncode


def _warn_priced_elsewhere(schedule: Schedule, transport: str) -> None:
    """One line when a plan file was priced for another runtime than the one it runs on."""
    from ..runtime.transports.families import priced_elsewhere
    text = priced_elsewhere(schedule, transport)
    if text:
        print(f"topoplan: warning: {text}", file=sys.stderr, flush=True)


def _verify(schedule: Schedule, path: str) -> None:
    """Refuse a plan file that does not compute its collective, with the verifier's
    message (a wrong plan can still come out right on the check pattern of a small size)."""
    from ..errors import ScheduleError
    from ..ir.verify import verify
    try:
        verify(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}; bench runs only plans that verify") from None


def _check_profile(args: argparse.Namespace) -> None:
    """Fail before launching when ``--profile`` cannot predict runs on this machine; pass
    the ranks a file path they can open from anywhere."""
    from ..analysis.cost import get_profile
    from ..errors import ProfileError
    profile = get_profile(args.profile)
    if profile.host_bandwidth is None:
        raise ProfileError(f"cannot predict runs on this machine with it: it has no host "
                           f"bandwidth (it describes a cluster's runtime, not a machine it was "
                           f"measured on); calibrate one with topoplan calibrate --transport "
                           f"{args.transport} -n N -o PROFILE.yaml", key=f"--profile {args.profile}")
    if os.path.exists(args.profile):
        args.profile = os.path.abspath(args.profile)


def _json_row(row: Any) -> dict[str, Any]:
    """A row of ``--json``: the nccl-tests columns, the ratio, and for ``auto`` what it
    chose, with every candidate (the native collective as ``"native"``)."""
    out = asdict(row) | {"ratio": row.ratio}
    if row.candidates is None:
        for key in ("chosen", "model_choice", "candidates", "exploration_calls"):
            out.pop(key)
    else:
        out["candidates"] = list(row.candidates)
        out["contradicted"] = row.contradicted
    return out


def _run_rank(args: argparse.Namespace) -> int:
    import warnings

    from ..errors import TopoplanWarning
    from ..ir.parse import load_schedule
    if args.verified:  # the launcher said it once already (_warn_priced_elsewhere)
        warnings.filterwarnings("ignore", message="plan priced for ", category=TopoplanWarning)
    if not args.plan:
        raise TopoplanError("inside mpiexec, bench runs a --plan file (started by topoplan bench)")
    schedule = load_schedule(args.plan)
    if not args.verified:  # started by hand under mpiexec: each rank checks the plan
        _verify(schedule, args.plan)
    if args.collective is not None and args.collective != schedule.collective:
        raise TopoplanError(f"{args.plan} is {with_article(schedule.collective)} plan but "
                            f"--collective asks for {args.collective}")
    if args.sizes is None:
        from ..runtime.mpirun import rank_and_size
        job = rank_and_size()
        args.sizes = _default_sizes(job[1] if job else schedule.nranks, schedule.collective,
                                    args.dtype)
    transport = rank_transport(args.transport, timeout=args.timeout, share_gpus=args.share_gpus)
    try:
        choices = _load_choices(args.choices) if args.choices else None
        rows = run_bench(schedule, transport, args.sizes, dtype=args.dtype,
                         baseline=args.baseline == "native", iters=args.iters,
                         warmup=args.warmup, timeout=args.timeout,
                         use_torch=args.transport == "torch", choices=choices,
                         verified=True)  # by the launcher, or just above
    except TransportError as exc:
        report(exc)
        if args.transport == "mpi":
            from ..runtime.transports.mpi import LEAVE_GRACE, leave_after_failure
            leave_after_failure(1, grace=min(args.timeout, LEAVE_GRACE))
        return 1
    if transport.rank == 0 and args.profile and not args.choices:
        rows = predict_rows(rows, schedule, args.profile, transport.size)
    native_name = transport.native_name_of(schedule.collective)
    if transport.rank == 0:
        if args.json:
            print(json_text({
                "schedule": {"algorithm": schedule.algorithm, "nranks": schedule.nranks,
                             "nchunks": schedule.nchunks, "nsteps": schedule.nsteps,
                             "cluster": schedule.meta.get("cluster"),
                             "collective": schedule.collective,
                             "chosen": schedule.meta.get("chosen")
                             if not args.choices else None},
                "collective": schedule.collective,
                "transport": transport.name, "native": native_name,
                "rows": [_json_row(r) for r in rows]}))
        else:
            if args.choices:
                print(f"# topoplan bench: auto {schedule.collective}, "
                      f"{plural(schedule.nranks, 'rank')}, over {transport.name}; per size, "
                      "the candidate chosen and its prediction")
            else:
                print(f"# topoplan bench: {plan_name(schedule)} {schedule.collective} "
                      f"schedule, {plural(schedule.nranks, 'rank')}, "
                      f"{plural(schedule.nsteps, 'step')}, "
                      f"{plural(schedule.nchunks, 'chunk')}, over {transport.name}")
            print(format_rows(rows, native_name=native_name, width=output_width() or 80))
            wrong = sum(r.wrong + (r.native_wrong or 0) for r in rows)
            print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
        sys.stdout.flush()
    if args.transport == "torch":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 1 if any(r.wrong for r in rows) else 0
