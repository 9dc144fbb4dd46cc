"""``topoplan estimate CLUSTER --model NAME``: what a cluster and its plans do to training time."""

from __future__ import annotations

import argparse

from ..units import format_size, format_time, parse_count, parse_latency, parse_size
from .common import add_profile_argument, checked_arg, console, plural, positive_int, table


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None


_seconds = checked_arg(lambda text: parse_latency(text if any(c.isalpha() for c in text)
                                                  else f"{text} s"),
                       lambda v: v > 0, "must be > 0 seconds")
_fusion = checked_arg(parse_size, lambda v: v >= 0, "must be >= 0 bytes",
                      " (e.g. 64MiB, or 0 for no fusion)")
_fraction = checked_arg(_number, lambda v: 0 < v <= 1, "must be in (0, 1]")
_count = checked_arg(parse_count, lambda v: v >= 1, "must be >= 1")


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..estimate import GPUS
    from ..estimate.models import MODELS
    p = subparsers.add_parser(
        "estimate", help="estimate training iteration time, throughput and scaling efficiency",
        description="Estimate one data-parallel training iteration on CLUSTER: compute per "
                    "GPU (given, or from a cited table of published throughputs), the "
                    "gradients fused into buckets, each bucket's allreduce planned and "
                    "simulated, with backward overlap or ChainerMN double buffering "
                    "(docs/ESTIMATE.md).")
    p.add_argument("cluster", help="cluster YAML file")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="NAME",
                      help=f"a known network: {', '.join(MODELS)}")
    what.add_argument("--params", type=_count, metavar="N",
                      help="parameter count of another network, e.g. 350M, 1.5B, 7B or 1.5e9 "
                           "(gradients ready at an even pace during backward)")
    p.add_argument("--compute-time", type=_seconds, metavar="T",
                   help="forward + backward + update of one GPU per iteration at the batch, "
                        "e.g. 0.29 or '290 ms' (default: from the published-throughput table)")
    p.add_argument("--batch-per-gpu", type=positive_int, metavar="B",
                   help="samples per GPU per iteration (default: the table entry's)")
    p.add_argument("--gpu", type=str.upper, metavar="GPU",
                   help=f"GPU model for the compute time: {', '.join(GPUS)} (default: the one "
                        "the cluster file names); a published throughput, else one derived "
                        "from the GPU's peak FLOP/s (docs/ESTIMATE.md)")
    p.add_argument("--fp16", action="store_true", help="gradients on the wire in fp16")
    p.add_argument("--double-buffering", action="store_true",
                   help="ChainerMN's: the allreduce of step i overlaps step i+1's compute")
    p.add_argument("--overlap", action="store_true",
                   help="start each bucket's allreduce during backward, once it is full")
    p.add_argument("--fusion", type=_fusion, default=64 << 20, metavar="SIZE",
                   help="fusion bucket size (default 64MiB; 0: one allreduce per tensor)")
    p.add_argument("--backward-fraction", type=_fraction, default=2 / 3, metavar="F",
                   help="share of the compute time that is backward (default 2/3)")
    p.add_argument("-a", "--algorithm", default="auto",
                   help="planner for each bucket (default auto)")
    add_profile_argument(p, "the plans are made for and simulated with")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: iteration_s, compute_s, comm_s, "
                        "exposed_comm_s, samples_per_s, efficiency, then efficiency_box, "
                        "what was estimated and the buckets")
    p.set_defaults(func=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster
    from ..estimate import estimate
    from ..estimate.models import get_model, uniform_model

    cluster = load_cluster(args.cluster)
    model = get_model(args.model) if args.model else uniform_model(args.params)
    result = estimate(cluster, model=model, compute_s=args.compute_time,
                      batch_per_gpu=args.batch_per_gpu, gpu=args.gpu, fp16=args.fp16,
                      overlap=args.overlap, double_buffering=args.double_buffering,
                      fusion=args.fusion, backward_fraction=args.backward_fraction,
                      algorithm=args.algorithm, profile=args.profile)
    if args.json:
        print(result.to_json())
        return 0
    out = console()
    out.print(f"[bold]{result.model}[/bold] ({result.params:,} parameters) on {result.cluster}: "
              f"{plural(result.nranks, 'GPU')}, batch {result.batch_per_gpu} per GPU, "
              "gradients in "
              f"{'fp16' if result.bytes_per_param == 2 else 'fp32'}, {result.mode}")
    out.print(f"compute: {result.compute_source}")
    rows = table("", "value")
    rows.add_row("iteration", format_time(result.iteration_s))
    rows.add_row("compute", format_time(result.compute_s))
    rows.add_row("communication", format_time(result.comm_s))
    rows.add_row("exposed communication", format_time(result.exposed_comm_s))
    rows.add_row("samples/s", f"{result.samples_per_s:,.1f}")
    rows.add_row("efficiency vs 1 GPU", f"{100 * result.efficiency:.1f}%")
    rows.add_row(f"efficiency vs 1 box ({plural(result.box_gpus, 'GPU')})",
                 f"{100 * result.efficiency_box:.1f}%")
    out.print(rows)
    buckets = table("bucket", "bytes", "tensors", "ready", "start", "end", "plan")
    for i, b in enumerate(result.buckets):
        buckets.add_row(str(i), format_size(b.nbytes), str(b.tensors), format_time(b.ready_s),
                        format_time(b.start_s), format_time(b.end_s), b.algorithm)
    if len(result.buckets) <= 20:
        out.print(buckets)
    else:
        out.print(f"{len(result.buckets)} buckets (--json lists them)")
    return 0
