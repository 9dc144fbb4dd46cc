"""``topoplan plan CLUSTER.yaml``: every candidate planner side by side, and the chosen schedule
(an allreduce, or with ``--collective`` a reduce-scatter or an allgather)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..cluster import load_cluster
from ..ir.collectives import COLLECTIVES
from ..errors import InfeasiblePlanError, TopoplanError
from ..ir.fingerprint import cluster_fingerprint
from ..units import format_bandwidth, format_size, format_time
from .common import (Column, add_profile_argument, console, fit_table, json_text,
                     left_out_note, positive_int, size_arg, status)

if TYPE_CHECKING:
    from ..planners import Candidate, PlanRequest


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
                        "native steps (nccl, composed) cannot be cut and are not chosen; "
                        "mcf plans its pipeline for them, and with '--algorithm mcf "
                        "--channels auto' picks 1, 2 or 4")
    p.add_argument("--channel-skew", type=float, default=None, metavar="R",
                   help="each channel's slice is R times the next one's (default 1.2: "
                        "unequal slices end their steps apart, so one channel's latency "
                        "hides behind another's transfer; 1: equal slices, as NCCL)")
    p.add_argument("--vectored", action="store_true",
                   help="merge each step's messages from one rank to one peer into one "
                        "vectored message (IR v4, docs/SCHEDULE.md): fewer ops to post")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=cmd_plan)


def _channels_arg(text: str) -> int | str:
    """argparse type for --channels: a count, or ``auto`` (mcf picks)."""
    return "auto" if text == "auto" else positive_int(text)


def candidate_names(requested: str | None) -> list[str] | None:
    """The planners to compare: those named (checked), or None for auto's defaults."""
    from ..planners import PLANNERS
    if not requested:
        return None
    names = [n.strip() for n in requested.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLANNERS or n == "auto"]
    if unknown:
        known = ", ".join(n for n in PLANNERS if n != "auto")
        raise TopoplanError(f"unknown planner {unknown[0]!r}; known: {known}")
    return names


def cmd_plan(args: argparse.Namespace) -> int:
    from ..analysis.bound import (best_partition, bottleneck, collective_bound, latency_bound,
                                  rsag_bound)
    from ..planners import PlanRequest, compare, nccl_candidate, require_collective
    from ..ir.passes import check_channels, check_skew
    from ..planners.channels import SKEW, per_channel
    from ..ir.verify import verify

    cluster = load_cluster(args.cluster)
    skew = check_skew(SKEW if args.channel_skew is None else args.channel_skew)
    # mcf asked for by name plans and prices the channels and vectored messages itself
    itself = args.algorithm == "mcf"
    if args.channels == "auto" and not itself:
        raise TopoplanError("--channels auto: mcf picks its channels (--algorithm mcf); "
                            "give the others a count")
    channels = args.channels if args.channels == "auto" else check_channels(args.channels)
    options: dict[str, Any] = {}
    if itself and channels != 1:
        options.update(channels=channels, channel_skew=skew)
    if itself and args.vectored:
        options["vectored"] = True
    # On N channels every chunk and op is N of them: plan to the caps over N.
    divide = 1 if itself else channels
    request = PlanRequest.make(cluster, size=args.size, collective=args.collective,
                               profile=args.profile,
                               max_step_ops=per_channel(args.max_step_ops, divide),
                               max_chunks=per_channel(args.max_chunks, divide), **options)
    costs = request.profile
    names = candidate_names(args.candidates)
    if args.algorithm != "auto":
        named = candidate_names(args.algorithm)
        assert named is not None
        require_collective(args.algorithm, args.collective)
        if names is None:
            # The planner asked for, beside NCCL's row and the bound: comparing every
            # candidate on a big cluster costs minutes (--candidates asks for it).
            names = named
        elif args.algorithm not in names:
            names = named + names
    left_out: dict[str, str] = {}
    with status(f"planning and simulating candidates for {cluster.nranks} ranks ..."):
        try:
            rows = compare(request, names, left_out=left_out)
        except InfeasiblePlanError:
            if args.algorithm in left_out:  # the planner asked for, alone, could not
                raise InfeasiblePlanError(left_out[args.algorithm]) from None
            raise
        nccl = nccl_candidate(request, rows)  # a row of its own when not compared
    if args.algorithm == "auto":
        # compare() sorts fastest first; on channels, the fastest that can be cut
        chosen = next((c for c in rows if channels == 1 or (
            c.schedule is not None and not c.schedule.nnative)), rows[0])
    elif args.algorithm in left_out:
        raise InfeasiblePlanError(left_out[args.algorithm])
    else:
        chosen = next(c for c in rows if c.name == args.algorithm)
    assert chosen.schedule is not None
    if not chosen.schedule.meta.get("verified"):  # mcf verifies what it builds
        with status(f"verifying the {chosen.name} schedule ..."):
            verify(chosen.schedule)
    collective = args.collective
    bound = collective_bound(cluster, args.size, collective)
    rsag = rsag_bound(cluster, args.size)
    # Under a profile that charges latency, the bound a point-to-point plan can meet.
    latency = None if costs.is_ideal else latency_bound(cluster, args.size, costs, collective)

    schedule, predicted = chosen.schedule, chosen.time_s
    one_channel = chosen.schedule.meta.get("estimate_one_channel_s", predicted)
    if itself:  # mcf made them: its estimate (or the simulation) is the channels' time
        channels = schedule.nchannels
    elif channels > 1:
        from ..analysis.sim import simulate
        from ..planners.channels import check_caps_on_channels
        from ..ir.passes import channelize

        with status(f"cutting the {chosen.name} schedule over {channels} channels ..."):
            schedule = check_caps_on_channels(channelize(schedule, channels, skew), channels,
                                              args.max_step_ops, args.max_chunks)
            verify(schedule)
            predicted = simulate(request.where, schedule, args.size,
                                 profile=request.profile).time_s
    unvectored = predicted
    if args.vectored and not itself:
        from ..analysis.sim import simulate
        from ..ir.passes import vectorize

        with status(f"vectorizing the {chosen.name} schedule ..."):
            before = schedule.nops
            schedule = vectorize(schedule)
            if schedule.nops != before:
                verify(schedule)
                predicted = simulate(request.where, schedule, args.size,
                                     profile=request.profile).time_s

    if args.output:
        schedule.with_meta(
            size_bytes=args.size, predicted_time_s=predicted,
            lower_bound_s=bound, profile=costs.name,
            cluster_fingerprint=cluster_fingerprint(cluster),
            **({"nccl": nccl.nccl.to_dict()} if nccl.nccl is not None else {})
        ).save(args.output)

    shown = rows + ([] if nccl in rows else [nccl])
    if args.json:
        print(json_text({
            "cluster": cluster.name, "nranks": cluster.nranks, "size_bytes": args.size,
            "collective": collective,
            "lower_bound_s": bound, "rsag_bound_s": rsag, "latency_bound_s": latency,
            "bound_partition": _partition_json(cluster),
            "chosen": chosen.name, "profile": costs.to_dict(),
            "channels": channels, "channel_skew": skew, "vectored": args.vectored,
            "chosen_time_s": predicted,
            "candidates": [candidate_json(c, request, bound, nccl) for c in shown],
            "left_out": left_out}))
        return 0

    out = console()
    out.print(f"[bold]{cluster.name}[/bold]: {cluster.nranks} ranks, {collective} of "
              f"{format_size(args.size)}; lower bound {format_time(bound)}")
    out.print(f"cost profile {costs.summary()}")
    if latency is not None:
        out.print(f"latency-aware bound under {costs.name}: {format_time(latency)} (a "
                  f"point-to-point plan's bandwidth bound plus the fewest steps it pays, "
                  f"docs/COST_MODEL.md)")
    # One unit for the column: ms once the fastest takes a millisecond, so that 256 MiB
    # reads 27.108, not 27108.37.
    unit = "ms" if min(c.time_s for c in shown) >= 1e-3 else "us"
    t, left_out_columns = fit_table(columns(unit), [
        cells(c, request, bound, nccl, chosen=c is chosen, unit=unit) for c in shown],
        out.width)
    out.print(t)
    for note in (left_out_note(left_out_columns, out.width),
                 "~ estimated by the planner's own cost model: the schedule is too big to "
                 "simulate quickly (topoplan simulate CLUSTER PLAN.json simulates it)" if any(not c.simulated for c in rows) else None):
        if note:
            out.print(note)
    out.print("vs bound: time / lower bound of any schedule (1.00x: none is faster); * chosen")
    if nccl.nccl is not None and costs.native_model == "nccl":
        out.print(f"vs nccl: NCCL's time / the row's (above 1.00x: faster than NCCL); nccl: "
                  f"what NCCL itself runs here, {nccl.nccl.label()} (algorithm/protocol x "
                  f"channels), priced by its own tuner on this fabric (docs/NCCL_MODEL.md)"
                  + ("" if nccl in rows else "; not a candidate here"))
    else:
        out.print("vs nccl: the nccl row's time / the row's (above 1.00x: faster); nccl: "
                  f"the transport's own collective over every rank, priced by {costs.name}")
    out.print("lat+ovh: share of the time on message latency and software overhead")
    for name, reason in left_out.items():
        out.print(f"left out: {reason}" if reason.startswith(f"{name}:")
                  else f"left out: {name}: {reason}")
    if cluster.nranks > 1:
        cut = bottleneck(cluster)
        if collective == "allreduce":
            out.print(f"lower bound: {best_partition(cluster)}")
            out.print(f"RS+AG cut bound (reduce-scatter + allgather schedules): "
                      f"{format_time(rsag)}")
        else:
            out.print(f"lower bound (any {collective}, ForestColl's cut): {format_time(bound)}")
        out.print(f"bottleneck cut: {cut.gpus} GPUs behind {format_bandwidth(cut.bandwidth)} out")
    if channels > 1:
        slicing = f"each on 1/{channels} of every chunk" if skew == 1 else \
            f"slices {skew:g} times the next"
        if itself:
            how = "simulated" if chosen.simulated else "the planner's channel model"
            out.print(f"channels: mcf planned for {channels} channels ({slicing}): "
                      f"{format_time(predicted)} ({how}), against "
                      f"{format_time(one_channel)} for its pipeline on one in lock-step")
        else:
            out.print(f"channels: {chosen.name} on {channels} channels ({slicing}) simulates "
                      f"in {format_time(predicted)}, against {format_time(chosen.time_s)} on "
                      "one")
    if args.vectored and itself:
        out.print(f"vectored: mcf priced and planned one message per peer and step: "
                  f"{schedule.nops} ops")
    if args.vectored and not itself:
        out.print(f"vectored: {chosen.name} in {schedule.nops} ops (one message per peer "
                  f"and step) simulates in {format_time(predicted)}, against "
                  f"{format_time(unvectored)} unvectored")
    out.print(f"chosen: {chosen.name}" + (f" -> {args.output}" if args.output else
                                          " (write it with -o PLAN.json)"), soft_wrap=True)
    return 0


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
    approx = "" if c.simulated else "~"
    ratio = x_bound(c.time_s, bound)
    time = f"{c.time_s * 1e3:.3f}" if unit == "ms" else f"{c.time_s * 1e6:.2f}"
    speedup = c.speedup_over(nccl)
    vs_nccl = "-" if speedup is None else f"{approx}{speedup:.2f}x"
    assert c.schedule is not None
    return [c.name + (" *" if chosen else ""), approx + time,
            _gbps(algbw), _gbps(busbw), "-" if ratio is None else f"{approx}{ratio:.2f}x",
            vs_nccl, str(c.messages), str(c.schedule.nsteps), str(c.schedule.nchunks),
            fixed_share(c), f"{c.plan_s:.3f}"]


def candidate_json(c: Candidate, request: PlanRequest, bound: float,
                   nccl: Candidate | None) -> dict[str, Any]:
    """A row of ``topoplan plan --json``: the usual fields, and for NCCL's row
    ``nccl_algorithm``, ``protocol`` and ``channels``."""
    algbw, busbw = c.algbw(request.size, request.cluster.nranks, request.collective)
    row: dict[str, Any] = {
        "algorithm": c.name, "time_s": c.time_s, "algbw_GBps": _finite(algbw / 1e9),
        "busbw_GBps": _finite(busbw / 1e9), "percent_of_bound": _percent(bound, c.time_s),
        "x_bound": x_bound(c.time_s, bound), "speedup_vs_nccl": c.speedup_over(nccl),
        "simulated": c.simulated, "messages": c.messages,
        "steps": c.schedule.nsteps if c.schedule is not None else None,
        "chunks": c.schedule.nchunks if c.schedule is not None else None,
        "ops": c.schedule.nops if c.schedule is not None else None,
        "breakdown": c.breakdown, "plan_s": c.plan_s}
    if c.nccl is not None:
        row.update({k: v for k, v in c.nccl.to_dict().items() if k not in row})
    return row


def fixed_share(c: Candidate) -> str:
    """Latency + overhead as a percentage of the simulated time (``-`` if none)."""
    parts = c.breakdown
    if parts is None or not c.time_s > 0:
        return "-"
    return f"{100 * (parts['latency'] + parts['overhead']) / c.time_s:.0f}%"


def _partition_json(cluster: Any) -> dict[str, Any] | None:
    """The partition that sets the lower bound, for --json (None for one GPU)."""
    from ..analysis.bound import best_partition
    if cluster.nranks < 2:
        return None
    part = best_partition(cluster)
    return {"name": part.name, "groups": len(part.groups), "bandwidth_Bps": part.bandwidth}


def _percent(bound: float, time_s: float) -> float:
    return 100.0 * bound / time_s if time_s > 0 else 100.0


def x_bound(time_s: float, bound: float) -> float | None:
    """Time over the lower bound (1.0: as fast as any schedule can be); None without a
    bound (one GPU moves nothing)."""
    return time_s / bound if bound > 0 else None


def _default_candidates(collective: str = "allreduce") -> list[str]:
    from ..planners import planners_for
    from ..planners.auto import DEFAULT_CANDIDATES
    return planners_for(collective, DEFAULT_CANDIDATES)


def _finite(value: float) -> float | None:
    """JSON has no infinity: a 1-rank allreduce moves nothing and has no bandwidth."""
    return value if value != float("inf") else None


def _gbps(bytes_per_s: float) -> str:
    return "-" if bytes_per_s in (0.0, float("inf")) else f"{bytes_per_s / 1e9:.2f}"
