"""``topoplan bench``: run a schedule for real and print nccl-tests columns.

Started by a user, the command checks its arguments, builds the schedule, checks it
with :func:`topoplan.verify` (a ``--plan`` file that fails is refused with the
verifier's message), then launches itself under ``mpiexec -n N`` (with the settings of
:mod:`topoplan._mpirun`); each rank replays the schedule over MPI or
torch.distributed (gloo) and rank 0 prints one row per size::

    size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong

``#wrong`` comes from a real check: every size is first reduced from an
integer-valued pattern whose sum is exact in the chosen dtype and compared
element by element. ``--baseline native`` adds the transport's own allreduce
(MPI_Allreduce or dist.all_reduce) on the same buffers, side by side. ``--profile
NAME|FILE`` (a profile written by ``topoplan calibrate``) adds the simulator's prediction
for each size on the machine the profile was measured on, and measured/predicted.
:func:`run_bench` returns the rows as data.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from ..errors import TopoplanError, TransportError
from ..schedule import Schedule
from .common import sizes_arg

__all__ = ["BenchRow", "run_bench", "format_rows", "predict_rows", "register"]

DTYPES = ("float32", "float64", "float16", "bfloat16")
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One size of a benchmark; times are the slowest rank's mean, in microseconds."""

    size: int
    count: int
    type: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int
    iters: int
    native_time_us: float | None = None
    native_algbw: float | None = None
    native_busbw: float | None = None
    native_wrong: int | None = None
    predicted_us: float | None = None
    measured_over_predicted: float | None = None

    @property
    def ratio(self) -> float | None:
        """busbw of the schedule over busbw of the native allreduce."""
        if self.native_busbw is None or not self.native_busbw:
            return None
        return self.busbw / self.native_busbw


def _bus_factor(nranks: int) -> float:
    return 2 * (nranks - 1) / nranks if nranks > 1 else 1.0


def _make_buffer(count: int, dtype: str, use_torch: bool) -> tuple[Any, Callable]:
    """A buffer and a function that fills it with the check pattern."""
    if use_torch or dtype == "bfloat16":
        import torch
        buf = torch.empty(count, dtype=getattr(torch, dtype))

        def fill(rank: int | None) -> None:
            if rank is None:
                buf.zero_()
            else:
                buf.copy_(torch.arange(count) % 5 + rank % 3)

        return buf, fill
    import numpy as np
    arr = np.empty(count, dtype=dtype)

    def fill_np(rank: int | None) -> None:
        arr[...] = 0 if rank is None else np.arange(count) % 5 + rank % 3

    return arr, fill_np


def _sum_over_ranks(transport: Any, count: int, use_torch: bool) -> int:
    """A count summed over ranks with the transport's own allreduce (float64 is exact here)."""
    import numpy as np
    total = np.array([count], dtype=np.float64)
    if use_torch:
        import torch
        tensor = torch.from_numpy(total)
        transport.native_allreduce(tensor)
        return int(tensor[0])
    transport.native_allreduce(total)
    return int(total[0])


def _count_wrong(buf: Any, nranks: int) -> int:
    import numpy as np
    values = buf.float().numpy() if hasattr(buf, "numpy") and hasattr(buf, "float") else buf
    count = values.shape[0]
    expected = (np.arange(count) % 5) * nranks + sum(r % 3 for r in range(nranks))
    return int(np.count_nonzero(np.asarray(values, dtype=np.float64) != expected))


def _time(fn: Callable[[], Any], transport: Any, iters: int) -> float:
    transport.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return transport.allreduce_max((time.perf_counter() - t0) / iters)


def run_bench(schedule: Schedule, transport: Any, sizes: Sequence[int], *,
              dtype: str = "float32", baseline: bool = False, iters: int | None = None,
              warmup: int = 1, seconds_per_size: float = 0.3, max_iters: int = 200,
              timeout: float = 60.0, use_torch: bool = False) -> list[BenchRow]:
    """Replay ``schedule`` over ``transport`` for every size; collective (all ranks call it).

    Parameters
    ----------
    schedule : Schedule
    transport : Transport
    sizes : sequence of int
        Message sizes in bytes (rounded down to whole elements).
    dtype : str
        One of float32, float64, float16, bfloat16 (bfloat16 uses torch tensors).
    baseline : bool
        Also time the transport's own allreduce on the same buffer.
    iters : int, optional
        Timed iterations per size; by default as many as fit ``seconds_per_size``
        (at least 2, at most ``max_iters``), judged from the warm-up.
    warmup : int
        Untimed runs per size, after the correctness check.
    timeout : float
        The executor's per-step timeout.
    use_torch : bool
        Use torch tensors as buffers (the torch transport's native form).

    Returns
    -------
    list of BenchRow
        The same rows on every rank. ``wrong`` is the number of wrong elements summed
        over all ranks (as nccl-tests counts them); timings are the slowest rank's.
    """
    from ..executor import Allreduce

    if dtype not in DTYPES:
        raise TopoplanError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    run = Allreduce(schedule, transport, timeout=timeout)
    n, rank = transport.size, transport.rank
    rows = []
    for size in sizes:
        count = size // _ITEMSIZE[dtype]
        buf, fill = _make_buffer(count, dtype, use_torch)
        nbytes = count * _ITEMSIZE[dtype]
        methods = [("schedule", lambda b=buf: run(b))]
        if baseline:
            methods.append(("native", lambda b=buf: transport.native_allreduce(b)))
        measured = {}
        for name, fn in methods:
            fill(rank)
            fn()
            wrong = _sum_over_ranks(transport, _count_wrong(buf, n), use_torch)
            # Timed runs reduce zeros: repeated sums of the pattern would overflow
            # (it grows n-fold per run), and 0 + 0 costs what any normal add costs.
            fill(None)
            for _ in range(max(0, warmup - 1)):
                fn()
            if iters is None:
                estimate = _time(fn, transport, 1)
                k = int(min(max_iters, max(2, math.ceil(seconds_per_size / max(estimate, 1e-7)))))
            else:
                k = iters
            seconds = _time(fn, transport, k)
            measured[name] = (seconds, wrong, k)
        seconds, wrong, k = measured["schedule"]
        algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        row: dict[str, Any] = dict(size=nbytes, count=count, type=dtype, redop="sum", time_us=seconds * 1e6,
                   algbw=algbw, busbw=algbw * _bus_factor(n), wrong=wrong, iters=k)
        if baseline:
            s2, w2, _ = measured["native"]
            a2 = nbytes / s2 / 1e9 if s2 > 0 else 0.0
            row.update(native_time_us=s2 * 1e6, native_algbw=a2, native_busbw=a2 * _bus_factor(n),
                       native_wrong=w2)
        rows.append(BenchRow(**row))
    return rows


def predict_rows(rows: Sequence[BenchRow], schedule: Schedule, profile: Any,
                 nranks: int) -> list[BenchRow]:
    """The rows with the simulator's time for each size on the machine ``profile`` was
    calibrated on (:meth:`~topoplan.cost.CostProfile.host_cluster` of ``nranks``), and
    measured over predicted.

    Raises
    ------
    ProfileError
        When the profile has no host bandwidth (it was not measured on a machine).
    """
    from dataclasses import replace

    from ..cost import get_profile
    from ..simulate import simulate
    profile = get_profile(profile)
    host = profile.host_cluster(nranks)
    out = []
    for r in rows:
        predicted = simulate(host, schedule, r.size, profile=profile,
                             dtype_size=_ITEMSIZE[r.type]).time_s
        out.append(replace(r, predicted_us=predicted * 1e6,
                           measured_over_predicted=r.time_us / (predicted * 1e6)
                           if predicted > 0 else None))
    return out


def format_rows(rows: Sequence[BenchRow], *, native_name: str | None = None) -> str:
    """The rows as nccl-tests text columns (plus the native baseline and ratio, if run,
    and the predicted time and measured/predicted, if predicted)."""
    head = (f"{'size(B)':>12} {'count':>11} {'type':>8} {'redop':>5} {'time(us)':>10} "
            f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")
    native = any(r.native_time_us is not None for r in rows)
    predicted = any(r.predicted_us is not None for r in rows)
    if native:
        head += f"   {'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6} {'ratio':>6}"
    if predicted:
        head += f"   {'pred(us)':>10} {'meas/pred':>9}"
    lines = []
    if native:
        lines.append(f"#{'':>61}schedule   {'':>18}{native_name or 'native'}")
    lines.append("#" + head[1:])
    for r in rows:
        line = (f"{r.size:>12} {r.count:>11} {r.type:>8} {r.redop:>5} {r.time_us:>10.1f} "
                f"{r.algbw:>11.3f} {r.busbw:>11.3f} {r.wrong:>6}")
        if native:
            line += (f"   {r.native_time_us:>10.1f} {r.native_algbw:>11.3f} "
                     f"{r.native_busbw:>11.3f} {r.native_wrong:>6} {r.ratio or 0:>5.2f}x")
        if predicted:
            pred = "-" if r.predicted_us is None else f"{r.predicted_us:.1f}"
            ratio = ("-" if r.measured_over_predicted is None
                     else f"{r.measured_over_predicted:.2f}")
            line += f"   {pred:>10} {ratio:>9}"
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="run a schedule over MPI or torch.distributed and print nccl-tests columns",
        description="Replay a schedule for real (launching itself under mpiexec) and print "
                    "size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong per size.")
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
    p.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1KiB:64MiB"),
                   help="message sizes, e.g. 1KiB:256MiB (powers of 2), 1K:1G:4, 8,64,1M "
                        "(default 1KiB:64MiB)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--transport", choices=("mpi", "torch"), default="mpi")
    p.add_argument("--baseline", choices=("none", "native"), default="none",
                   help="native: also time MPI_Allreduce / dist.all_reduce side by side")
    p.add_argument("--iters", type=int, default=None,
                   help="timed runs per size (default: as many as fit ~0.3 s)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a step may wait for a peer before failing (default 60)")
    p.add_argument("--profile", metavar="NAME|FILE",
                   help="also print the time the simulator predicts with this calibrated cost "
                        "profile (topoplan calibrate writes one) and measured/predicted")
    p.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    # The launcher verified the plan already; its ranks need not do it again.
    p.add_argument("--verified", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)


def flat_cluster(nranks: int) -> Any:
    """``nranks`` one-GPU boxes on one switch: the cluster ``--algorithm`` uses by default."""
    from ..cluster import loads_cluster
    nics = "\n    nics: [{switch: sw0, bandwidth: 100 Gbit/s, latency: 2 us}]" if nranks > 1 else ""
    return loads_cluster(f"name: flat-{nranks}\nswitches: [{{name: sw0}}]\nboxes:\n"
                         f"  - name: \"node{{i}}\"\n    count: {nranks}\n    gpus: 1{nics}\n",
                         f"<flat cluster of {nranks} ranks>")


def _schedule(args: argparse.Namespace) -> Schedule:
    from ..schedule import load_schedule
    if args.plan:
        schedule = load_schedule(args.plan)
        if args.cluster:
            from ..cluster import load_cluster
            from ..fingerprint import check_fingerprint
            cluster = load_cluster(args.cluster)
            if schedule.nranks != cluster.nranks and not args.force:
                raise TopoplanError(f"{args.plan} has {schedule.nranks} ranks but "
                                    f"{args.cluster} has {cluster.nranks} GPUs; plan it for "
                                    f"this cluster: topoplan plan {args.cluster} -o PLAN.json")
            check_fingerprint(schedule, cluster, plan=args.plan, cluster_file=args.cluster,
                              force=args.force)
        return schedule
    algorithm = args.algorithm or "ring"
    if args.cluster:
        from ..cluster import load_cluster
        cluster = load_cluster(args.cluster)
    else:
        if args.nranks is None:
            raise TopoplanError("say how many ranks: -n N, or give --cluster or --plan")
        cluster = flat_cluster(args.nranks)
    try:
        from ..planners import plan
    except ImportError:
        raise TopoplanError("the planners are not installed in this topoplan; pass --plan "
                            "PLAN.json") from None
    size = max(args.sizes) if args.sizes else 1 << 20
    options: dict[str, Any] = {}
    if args.profile:
        # Plan against the runtime that runs it; auto ranks its candidates by their time
        # on the machine the profile measured (this one), where the run happens.
        from ..cost import get_profile
        profile = get_profile(args.profile)
        options["profile"] = profile
        if algorithm == "auto" and profile.host_bandwidth is not None:
            options["machine"] = profile.host_cluster(cluster.nranks)
    return plan(cluster, algorithm=algorithm, size=size, **options)


def _forward_argv(args: argparse.Namespace, plan_path: str) -> list[str]:
    """The rank command line: always from a plan file, so ranks never re-plan."""
    argv = [sys.executable, "-m", "topoplan", "bench", "--plan", plan_path, "--verified",
            "--sizes", ",".join(str(s) for s in args.sizes), "--dtype", args.dtype,
            "--transport", args.transport, "--baseline", args.baseline,
            "--warmup", str(args.warmup), "--timeout", str(args.timeout)]
    if args.iters is not None:
        argv += ["--iters", str(args.iters)]
    if args.profile:
        argv += ["--profile", args.profile]
    if args.json:
        argv.append("--json")
    return argv


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cmd_bench(args: argparse.Namespace) -> int:
    from .._mpirun import inside_mpi
    if any(s <= 0 for s in args.sizes):
        raise TopoplanError("sizes must be > 0 bytes")
    if inside_mpi():
        return _run_rank(args)
    import tempfile

    from .._mpirun import mpiexec
    if args.profile:
        _check_profile(args)
    schedule = _schedule(args)
    _verify(schedule, args.plan or f"the {schedule.algorithm} plan")
    nranks = args.nranks if args.nranks is not None else schedule.nranks
    if nranks != schedule.nranks:
        raise TopoplanError(f"the {schedule.algorithm} schedule is for {schedule.nranks} ranks "
                            f"but -n asks for {nranks}")
    if args.transport == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise TopoplanError("--transport mpi needs mpi4py: pip install 'topoplan[mpi]'") from None
    with tempfile.TemporaryDirectory(prefix="topoplan-bench-") as tmp:
        plan_path = os.path.join(tmp, "plan.json")
        schedule.save(plan_path)
        os.environ["TOPOPLAN_BENCH_PORT"] = str(_free_port())
        proc = mpiexec(nranks, _forward_argv(args, plan_path), capture=False,
                       fault_tolerant=True)
    return proc.returncode


def _verify(schedule: Schedule, path: str) -> None:
    """Refuse a plan file that does not compute an allreduce, with the verifier's message
    (a wrong plan can still come out right on the check pattern of a small size)."""
    from ..errors import ScheduleError
    from ..verify import verify
    try:
        verify(schedule)
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}; bench runs only plans that verify") from None


def _check_profile(args: argparse.Namespace) -> None:
    """Fail before launching when ``--profile`` cannot predict runs on this machine; pass
    the ranks a file path they can open from anywhere."""
    from ..cost import get_profile
    from ..errors import ProfileError
    profile = get_profile(args.profile)
    if profile.host_bandwidth is None:
        raise ProfileError(f"cannot predict runs on this machine with it: it has no host "
                           f"bandwidth (it describes a cluster's runtime, not a machine it was "
                           f"measured on); calibrate one with topoplan calibrate --transport "
                           f"{args.transport} -n N -o PROFILE.yaml", key=f"--profile {args.profile}")
    if os.path.exists(args.profile):
        args.profile = os.path.abspath(args.profile)


def _transport(args: argparse.Namespace) -> Any:
    if args.transport == "mpi":
        from ..transports.mpi import MPI
        return MPI()
    import datetime

    try:
        import torch.distributed as dist
    except ImportError:
        raise TopoplanError("--transport torch needs PyTorch: pip install 'topoplan[torch]'") from None
    from ..transports.torch import Torch
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    port = os.environ.get("TOPOPLAN_BENCH_PORT", "29517")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=args.timeout))
    return Torch()


def _run_rank(args: argparse.Namespace) -> int:
    from ..schedule import load_schedule
    if not args.plan:
        raise TopoplanError("inside mpiexec, bench runs a --plan file (started by topoplan bench)")
    schedule = load_schedule(args.plan)
    if not args.verified:  # started by hand under mpiexec: each rank checks the plan
        _verify(schedule, args.plan)
    transport = _transport(args)
    try:
        rows = run_bench(schedule, transport, args.sizes, dtype=args.dtype,
                         baseline=args.baseline == "native", iters=args.iters,
                         warmup=args.warmup, timeout=args.timeout,
                         use_torch=args.transport == "torch")
    except TransportError as exc:
        print(f"topoplan: error: {exc}", file=sys.stderr, flush=True)
        if args.transport == "mpi":
            from ..transports.mpi import leave_after_failure
            leave_after_failure(1, grace=args.timeout)
        return 1
    if transport.rank == 0 and args.profile:
        rows = predict_rows(rows, schedule, args.profile, transport.size)
    if transport.rank == 0:
        if args.json:
            print(json.dumps({
                "schedule": {"algorithm": schedule.algorithm, "nranks": schedule.nranks,
                             "nchunks": schedule.nchunks, "nsteps": schedule.nsteps,
                             "cluster": schedule.meta.get("cluster")},
                "transport": transport.name, "native": transport.native_name,
                "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}))
        else:
            print(f"# topoplan bench: {schedule.algorithm} schedule, {schedule.nranks} ranks, "
                  f"{schedule.nsteps} steps, {schedule.nchunks} chunks, over {transport.name}")
            print(format_rows(rows, native_name=transport.native_name))
            wrong = sum(r.wrong + (r.native_wrong or 0) for r in rows)
            print(f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}")
        sys.stdout.flush()
    if args.transport == "torch":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 1 if any(r.wrong for r in rows) else 0
