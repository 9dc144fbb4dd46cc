"""``topoplan plan CLUSTER.yaml``: every candidate planner side by side, and the chosen schedule
(an allreduce, or with ``--collective`` a reduce-scatter or an allgather)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from ..cluster import load_cluster
from ..ir.collectives import COLLECTIVES
from ..units import format_size, format_time
from .common import (Column, add_nccl_arguments, add_profile_argument, console, fit_table,
                     json_text, left_out_note, plural, positive_int, size_arg, status)

if TYPE_CHECKING:
    from ..planners import Candidate, PlanRequest, PlanResult
    from ..planners.certificate import Certificate


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="plan an allreduce for a cluster; compare every candidate",
        description="Plan an allreduce with every candidate planner, simulate each on the "
                    "cluster, print them side by side against the lower bound, and write the "
                    "chosen schedule.")
    p.add_argument("cluster", help="cluster YAML file")
    p.add_argument("-a", "--algorithm", default="auto",
                   help="planner to choose (default auto: the fastest in simulation, of "
                        "every candidate); a planner named here is planned alone, beside "
                        "NCCL's row (add --candidates to compare it with others)")
    p.add_argument("-s", "--size", type=size_arg, default=256 << 20, metavar="SIZE",
                   help="message size, e.g. 1MiB (default 256MiB): the full buffer, an "
                        "allgather's output or a reduce-scatter's input")
    p.add_argument("-c", "--collective", choices=list(COLLECTIVES), default="allreduce",
                   help="what to plan (default allreduce); the candidates are the planners "
                        "that plan it")
    p.add_argument("-o", "--output", metavar="PLAN.json", help="write the chosen schedule here")
    p.add_argument("--candidates", metavar="A,B,...",
                   help="planners to compare (default: all registered)")
    add_profile_argument(p, "the planners plan against and the simulations charge")
    p.add_argument("--max-step-ops", type=positive_int, default=None, metavar="N",
                   help="most ops a rank may post in one step (planners pipeline less to "
                        "fit; those that cannot are left out)")
    p.add_argument("--max-chunks", type=positive_int, default=None, metavar="N",
                   help="most chunks a plan may hold (as --max-step-ops)")
    p.add_argument("--channels", type=_channels_arg, default=1, metavar="N",
                   help="run the chosen plan on N independent channels, each on a slice "
                        "of every chunk (IR v4, docs/SCHEDULE.md; default 1); plans with "
                        "native steps (nccl, composed) cannot be cut and are left out; "
                        "mcf plans its pipeline for them, and with '--channels auto' "
                        "picks 1, 2 or 4 (the others then run on one)")
    p.add_argument("--channel-skew", type=float, default=None, metavar="R",
                   help="each channel's slice is R times the next one's (default 1.2: "
                        "unequal slices end their steps apart, so one channel's latency "
                        "hides behind another's transfer; 1: equal slices, as NCCL)")
    p.add_argument("--vectored", action="store_true",
                   help="merge each step's messages from one rank to one peer into one "
                        "vectored message (IR v4, docs/SCHEDULE.md): fewer ops to post")
    p.add_argument("--max-memory", type=_memory_arg, default=None, metavar="SIZE",
                   help="refuse, before planning, when planning is estimated to hold more "
                        "memory than SIZE (default 4GiB, and never more than the machine "
                        "has available; 0: no bound); a large plan's estimate is printed "
                        "first (README, 'Large clusters')")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    add_nccl_arguments(p)
    p.set_defaults(func=cmd_plan)


def told(choice: Any) -> str:
    """``2.30`` or ``2.30 with NCCL_ALGO=ring``: the version an NCCL choice follows and
    what it was forced with."""
    return choice.version + (f" with {choice.forced}" if choice.forced else "")


def _channels_arg(text: str) -> int | str:
    """argparse type for --channels: a count, or ``auto`` (mcf picks)."""
    return "auto" if text == "auto" else positive_int(text)


def _memory_arg(text: str) -> int:
    """argparse type for --max-memory: a size (``6GiB``), or 0 for no bound."""
    from ..units import parse_size
    if text.strip() == "0":
        return 0
    try:
        value = parse_size(text)
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 6GiB, or 0, got {text!r}")
    return value


def candidate_names(requested: str | None) -> list[str] | None:
    """The planners named by ``--candidates A,B`` (checked by the request), or None."""
    if not requested:
        return None
    return [n.strip() for n in requested.split(",") if n.strip()]


def plan_result(args: argparse.Namespace) -> PlanResult:
    """The pipeline's result for ``topoplan plan``'s arguments: the same request as
    :func:`topoplan.plan` makes of the same arguments."""
    from ..planners import PlanRequest, execute

    options: dict[str, Any] = {"candidates": candidate_names(args.candidates),
                               "channels": args.channels, "vectored": args.vectored}
    if args.channel_skew is not None:
        options["channel_skew"] = args.channel_skew
    request = PlanRequest.make(load_cluster(args.cluster), size=args.size,
                               collective=args.collective, profile=args.profile,
                               max_step_ops=args.max_step_ops, max_chunks=args.max_chunks,
                               algorithm=args.algorithm, **options)
    check_work(request, args)
    nranks = request.cluster.nranks
    with status(f"planning and simulating candidates for {nranks} ranks ..."):
        return execute(request)


def check_work(request: PlanRequest, args: argparse.Namespace) -> None:
    """Before planning: refuse a request estimated to hold more memory than
    ``--max-memory`` (default 4 GiB) or the machine has available, and say the estimate
    of a large one on stderr (:mod:`topoplan.planners.budget`)."""
    import sys

    from ..planners.budget import DEFAULT_MAX_BYTES, check_budget, estimate_work

    estimate = estimate_work(request)
    budget = DEFAULT_MAX_BYTES if args.max_memory is None else args.max_memory
    check_budget(request, estimate, budget, where=args.cluster)
    if estimate.large:
        print(f"topoplan: note: planning {estimate.nranks} ranks will take "
              f"{estimate.text()}, by the estimate (--max-memory bounds it; "
              "docs/RESULTS.md, 'Planning at scale')", file=sys.stderr, flush=True)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..analysis.bound import best_partition, bottleneck

    result = plan_result(args)
    request, bounds = result.request, result.bounds
    cluster, costs, collective = request.cluster, request.profile, request.collective
    schedule, chosen, nccl = result.schedule, result.chosen, result.nccl
    if args.output:
        schedule.save(args.output)
    shown = result.shown
    if args.json:
        print(json_text({
            "cluster": cluster.name, "nranks": cluster.nranks, "size_bytes": request.size,
            "collective": collective,
            "lower_bound_s": bounds.lower_s, "rsag_bound_s": bounds.rsag_s,
            "latency_bound_s": bounds.latency_s,
            "bound_partition": _partition_json(cluster),
            "chosen": chosen.name, "profile": costs.to_dict(),
            "channels": result.channels, "channel_skew": request.channel_skew,
            "vectored": request.vectored,
            "chosen_time_s": result.time_s if math.isfinite(result.time_s) else None,
            "chosen_unpriced": None if math.isfinite(result.time_s) else chosen.unpriced,
            "certificate": _certificate_json(result.certificate),
            "candidates": [candidate_json(c, request, bounds.lower_s, nccl,
                                          result.row_certificate(c)) for c in shown],
            "left_out": dict(result.left_out)}))
        return 0

    bound = bounds.lower_s
    out = console()
    out.print(f"[bold]{cluster.name}[/bold]: {plural(cluster.nranks, 'rank')}, {collective} of "
              f"{format_size(request.size)}; lower bound {format_time(bound)}")
    out.print(f"cost profile {costs.summary()}")
    if bounds.latency_s is not None:
        out.print(f"latency-aware bound under {costs.name}: {format_time(bounds.latency_s)} "
                  f"(a point-to-point plan's bandwidth bound plus the fewest steps it pays, "
                  f"docs/COST_MODEL.md)")
    # One unit for the column: ms once the fastest takes a millisecond, so that 256 MiB
    # reads 27.108, not 27108.37.
    unit = "ms" if min((c.time_s for c in shown if c.unpriced is None), default=0) >= 1e-3 \
        else "us"
    t, left_out_columns = fit_table(columns(unit), [
        cells(c, request, bound, nccl, chosen=c is chosen, unit=unit) for c in shown],
        out.width)
    out.print(t)
    unpriced: dict[str, list[str]] = {}  # reason -> rows, each reason once
    for c in shown:
        if c.unpriced is not None:
            unpriced.setdefault(c.unpriced, []).append(c.name)
    for note in (left_out_note(left_out_columns, out.width),
                 "~ estimated by the planner's own cost model: the schedule is too big to "
                 "simulate quickly (topoplan simulate CLUSTER PLAN.json simulates it)"
                 if any(not c.simulated and c.unpriced is None for c in result.rows)
                 else None,
                 *(f"n/a ({', '.join(names)}): {reason}" for reason, names in unpriced.items())):
        if note:
            out.print(note)
    out.print("vs bound: time / lower bound of any schedule (1.00x: none is faster); * chosen")
    if nccl.nccl is not None and costs.native_model == "nccl":
        out.print(f"vs nccl: NCCL's time / the row's (above 1.00x: faster than NCCL); nccl: "
                  f"what NCCL {told(nccl.nccl)} runs here, {nccl.nccl.label()} "
                  f"(algorithm/protocol x "
                  f"channels), priced by its own tuner on this fabric (docs/NCCL_MODEL.md)"
                  + ("" if nccl in result.rows else "; not a candidate here"))
    elif nccl.nccl is not None and costs.is_ideal:
        out.print(f"vs nccl: the nccl row's time / the row's (above 1.00x: faster); nccl: "
                  f"what NCCL {told(nccl.nccl)} runs here, {nccl.nccl.label()}, paying its "
                  f"links alone "
                  f"as every row does under {costs.name}")
    else:
        out.print("vs nccl: the nccl row's time / the row's (above 1.00x: faster); nccl: "
                  f"the transport's own collective over every rank, priced by {costs.name}")
    out.print("lat+ovh: share of the time on message latency and software overhead")
    for name, reason in result.left_out.items():
        out.print(f"left out: {reason}" if reason.startswith(f"{name}:")
                  else f"left out: {name}: {reason}")
    if cluster.nranks > 1:
        cut = bottleneck(cluster)
        if collective == "allreduce":
            out.print(f"lower bound: {best_partition(cluster)}")
            out.print(f"RS+AG cut bound (reduce-scatter + allgather schedules): "
                      f"{format_time(bounds.rsag_s or 0.0)}" + _rsag_note(result))
        else:
            out.print(f"lower bound (any {collective}, ForestColl's cut): {format_time(bound)}")
        out.print(f"bottleneck cut: {cut} out; {cut.crossing()}")
    channels, notes = result.channels, result.notes
    predicted = result.time_s
    itself_channels, itself_vectors = request.plans_itself(chosen.name)
    if channels > 1:
        skew = request.channel_skew
        slicing = f"each on 1/{channels} of every chunk" if skew == 1 else \
            f"slices {skew:g} times the next"
        one = notes.get("one_channel_s", chosen.time_s)
        if itself_channels:
            how = "simulated" if result.simulated else "the planner's channel model"
            out.print(f"channels: {chosen.name} planned for {plural(channels, 'channel')} "
                      f"({slicing}): "
                      f"{format_time(predicted)} ({how}), against "
                      f"{format_time(one)} for its pipeline on one in lock-step")
        else:
            out.print(f"channels: {chosen.name} on {plural(channels, 'channel')} ({slicing}) "
                      f"simulates "
                      f"in {format_time(predicted)}, against {format_time(one)} on one")
    if request.vectored and itself_vectors:
        out.print(f"vectored: {chosen.name} priced and planned one message per peer and "
                  f"step: {plural(schedule.nops, 'op')}")
    elif request.vectored:
        unvectored = notes.get("unvectored_s")
        out.print(f"vectored: {chosen.name} in {plural(schedule.nops, 'op')} (one message per peer "
                  f"and step)" + ("" if unvectored is None else
                                  f" simulates in {format_time(predicted)}, against "
                                  f"{format_time(unvectored)} unvectored"))
    certificate = result.certificate
    if certificate is not None:
        out.print(f"certificate: {certificate.text(chosen.name)}")
    out.print(f"chosen: {chosen.name}" + (f" -> {args.output}" if args.output else
                                          " (write it with -o PLAN.json)"), soft_wrap=True)
    return 0


def _rsag_note(result: PlanResult) -> str:
    """Which rows beat the RS+AG bound, and why they may: it bounds only a
    reduce-scatter to equal shards on every GPU then an allgather (not native steps that
    reduce in a switch or a box, unequal shards, nor a structure-free flow)."""
    rsag = result.bounds.rsag_s
    if rsag is None:
        return ""
    under = [c.name for c in result.shown if c.time_s < rsag * (1 - 1e-9)]
    if not under:
        return ""
    return (f"; below it: {', '.join(under)} (it bounds a reduce-scatter to equal shards "
            "on every GPU, then an allgather; they are not that)")


def columns(unit: str) -> tuple[Column, ...]:
    """The table's columns (time in ``unit``): the essentials always, the others
    (drop > 0) while they fit."""
    return (Column("algorithm", "left"), Column(f"time\n({unit})"),
            Column("algbw\n(GB/s)", drop=5), Column("busbw\n(GB/s)"), Column("vs\nbound"),
            Column("vs\nnccl"), Column("msgs", drop=2), Column("steps", drop=3),
            Column("chunks", drop=4), Column("lat+\novh", drop=1), Column("plan\n(s)"))


def cells(c: Candidate, request: PlanRequest, bound: float, nccl: Candidate | None, *,
          chosen: bool, unit: str) -> list[str]:
    """The row of the table (:func:`columns`), the time in ``unit`` (us or ms); ``~``:
    estimated, not simulated."""
    algbw, busbw = c.algbw(request.size, request.cluster.nranks, request.collective)
    assert c.schedule is not None
    if c.unpriced is not None:  # no time: the note under the table says why
        return [c.name + (" *" if chosen else ""), "n/a", "-", "-", "-", "-",
                str(c.messages), str(c.schedule.nsteps), str(c.schedule.nchunks), "-",
                f"{c.plan_s:.3f}"]
    approx = "" if c.simulated else "~"
    ratio = x_bound(c.time_s, bound)
    time = f"{c.time_s * 1e3:.3f}" if unit == "ms" else f"{c.time_s * 1e6:.2f}"
    speedup = c.speedup_over(nccl)
    vs_nccl = "-" if speedup is None else f"{approx}{speedup:.2f}x"
    return [c.name + (" *" if chosen else ""), approx + time,
            _gbps(algbw), _gbps(busbw), "-" if ratio is None else f"{approx}{ratio:.2f}x",
            vs_nccl, str(c.messages), str(c.schedule.nsteps), str(c.schedule.nchunks),
            fixed_share(c), f"{c.plan_s:.3f}"]


def candidate_json(c: Candidate, request: PlanRequest, bound: float,
                   nccl: Candidate | None,
                   certificate: Certificate | None = None) -> dict[str, Any]:
    """A row of ``topoplan plan --json``: the usual fields, its ``certificate``
    (:mod:`topoplan.planners.certificate`; null on one GPU), and for NCCL's row
    ``nccl_algorithm``, ``protocol`` and ``channels``. A row with no time
    (:attr:`~topoplan.planners.comparison.Candidate.unpriced`) has ``time_s`` and what
    follows from it null, and ``unpriced`` says why (null on every other row)."""
    algbw, busbw = c.algbw(request.size, request.cluster.nranks, request.collective)
    priced = c.unpriced is None
    row: dict[str, Any] = {
        "algorithm": c.name, "time_s": c.time_s if priced else None,
        "algbw_GBps": _finite(algbw / 1e9) if priced else None,
        "busbw_GBps": _finite(busbw / 1e9) if priced else None,
        "percent_of_bound": _percent(bound, c.time_s) if priced else None,
        "x_bound": x_bound(c.time_s, bound) if priced else None,
        "speedup_vs_nccl": c.speedup_over(nccl), "unpriced": c.unpriced,
        "simulated": c.simulated, "messages": c.messages,
        "steps": c.schedule.nsteps if c.schedule is not None else None,
        "chunks": c.schedule.nchunks if c.schedule is not None else None,
        "ops": c.schedule.nops if c.schedule is not None else None,
        "breakdown": c.breakdown, "plan_s": c.plan_s,
        "certificate": _certificate_json(certificate)}
    if c.nccl is not None:
        row.update({k: v for k, v in c.nccl.to_dict().items() if k not in row})
    return row


def _certificate_json(certificate: Certificate | None) -> dict[str, Any] | None:
    return None if certificate is None else certificate.to_dict()


def fixed_share(c: Candidate) -> str:
    """Latency + overhead as a percentage of the simulated time (``-`` if none)."""
    parts = c.breakdown
    if parts is None or not c.time_s > 0:
        return "-"
    return f"{100 * (parts['latency'] + parts['overhead']) / c.time_s:.0f}%"


def _partition_json(cluster: Any) -> dict[str, Any] | None:
    """The partition that sets the lower bound, for --json (None for one GPU)."""
    from ..analysis.bound import best_partition, bottleneck
    if cluster.nranks < 2:
        return None
    part = best_partition(cluster)
    cut = bottleneck(cluster)
    return {"name": part.name, "groups": len(part.groups), "bandwidth_Bps": part.bandwidth,
            "bottleneck": {"behind": cut.behind, "where": cut.where, "text": str(cut),
                           "crossing": cut.crossing()}}


def _percent(bound: float, time_s: float) -> float:
    return 100.0 * bound / time_s if time_s > 0 else 100.0


def x_bound(time_s: float, bound: float) -> float | None:
    """Time over the lower bound (1.0: as fast as any schedule can be); None without a
    bound (one GPU moves nothing)."""
    return time_s / bound if bound > 0 else None


def _finite(value: float) -> float | None:
    """JSON has no infinity: a 1-rank allreduce moves nothing and has no bandwidth."""
    return value if value != float("inf") else None


def _gbps(bytes_per_s: float) -> str:
    return "-" if bytes_per_s in (0.0, float("inf")) else f"{bytes_per_s / 1e9:.2f}"
