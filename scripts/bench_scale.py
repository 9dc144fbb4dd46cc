"""Benchmark planning at scale: 64 to 8192 GPUs on generated rail-optimised and fat-tree clusters.

    PYTHONPATH=. python scripts/bench_scale.py [--gpus 64,1024,4096,8192] [--size 256MiB]
        [--fabrics rail,fat,fat3] [--max-sim-ops 1000000] [--timeout 900] [--channels 2,4]
    PYTHONPATH=. python scripts/bench_scale.py --gpus 8192 --profiles ideal --no-auto
        --max-sim-ops 0   (mcf alone: plan, verify, estimate; its plan CPU seconds)
    PYTHONPATH=. python scripts/bench_scale.py --cli [--gpus 1024] [--fabrics fat,fat3]

``fat3`` is a three-tier fat tree (:func:`fat_tree3`: 8 boxes a leaf, pods of 4 leaves
with 2 aggregation switches, 4 cores, 2:1 at each tier). Under ``nccl`` each case also
compares what ``auto`` picks with NCCL's own collective (the ``nccl`` row of ``topoplan
plan``: :func:`topoplan.planners.nccl_candidate`), and the plan with the latency-aware
bound (:func:`topoplan.analysis.bound.latency_bound`). ``--cli`` times the command a user
types, ``topoplan plan CLUSTER --algorithm mcf --size SIZE``, start to end (the target:
10 s for 1024 GPUs).

For every fabric (``topoplan.cluster.generate``: ``rail`` = rail_optimized, 8 rails of
32-box leaves, 4 spines, non-blocking; ``fat`` = fat_tree, 8 boxes per leaf, 8 spines,
2:1) and GPU count (boxes of 8 GPUs), one subprocess (so peak memory is the case's own)
plans ``mcf`` under ``ideal`` (links only) and under ``nccl`` (NCCL's latencies and
posting costs), verifies each plan, and simulates it under its profile when it has at
most ``--max-sim-ops`` ops. It prints plan, verify and simulate seconds, the ops, the
planner's estimate and the simulated time over the cut lower bound, and the peak
resident memory. Cases that run past ``--timeout`` seconds say so.

``--channels 2,4`` also plans mcf on each of those channel counts (IR v4, unequal slices
of the default skew: ``topoplan.plan(..., channels=C)``) under each profile, verifies
it, and gives its estimate (the planner's channel model, checked against the simulator
on the 32- and 64-GPU clusters of ``scripts/bench_channels.py``) over the cut and the
latency-aware bounds; it is simulated when it has at most ``--max-sim-ops`` ops. ``auto``
is then compared with NCCL's row a second time, with mcf picking its channels (1, 2 or
4: ``topoplan.plan(..., channels="auto")``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FABRICS = ("rail", "fat", "fat3")


def fat_tree3(boxes: int, gpus: int = 8, *, boxes_per_leaf: int = 8, leaves_per_pod: int = 4,
              aggs_per_pod: int = 2, cores: int = 4, nic: str = "200 Gbit/s",
              nvlink: str = "300 GB/s", oversubscription: float = 2.0) -> str:
    """Cluster YAML of a three-tier fat tree: a box's NICs on one leaf, each leaf up to
    every aggregation switch of its pod, each aggregation switch up to every core, at
    ``oversubscription``:1 at both tiers."""
    from topoplan.units import parse_bandwidth
    leaves = -(-boxes // boxes_per_leaf)
    pods = -(-leaves // leaves_per_pod)
    aggs = pods * aggs_per_pod
    leaf_down = parse_bandwidth(nic) * gpus * boxes_per_leaf
    leaf_up = leaf_down / oversubscription / aggs_per_pod          # per leaf-agg trunk
    agg_down = leaf_up * leaves_per_pod
    agg_up = agg_down / oversubscription / cores                   # per agg-core trunk
    lines = [f"name: fat3-{boxes * gpus}",
             f"# {boxes} boxes x {gpus} GPUs, {leaves} leaves, {pods} pods of "
             f"{leaves_per_pod} leaves and {aggs_per_pod} aggregation switches, {cores} "
             f"cores, {oversubscription:g}:1 per tier",
             "switches:", f"  - {{name: 'leaf{{i}}', count: {leaves}}}",
             f"  - {{name: 'agg{{i}}', count: {aggs}}}", f"  - {{name: 'core{{i}}', count: {cores}}}",
             "boxes:", f"  - name: 'node{{i}}'", f"    count: {boxes}", f"    gpus: {gpus}",
             f"    fabric: {{bandwidth: {nvlink}, latency: 0.5 us}}", "    nics:"]
    lines += [f"      - {{switch: 'leaf{{i//{boxes_per_leaf}}}', bandwidth: {nic}, latency: 1 us, "
              f"gpus: [{g}]}}" for g in range(gpus)]
    lines.append("links:")
    for leaf in range(leaves):
        pod = leaf // leaves_per_pod
        for a in range(aggs_per_pod):
            lines.append(f"  - {{a: leaf{leaf}, b: agg{pod * aggs_per_pod + a}, "
                         f"bandwidth: {leaf_up / 1e9:g} GB/s, latency: 0.5 us}}")
    for agg in range(aggs):
        for c in range(cores):
            lines.append(f"  - {{a: agg{agg}, b: core{c}, bandwidth: {agg_up / 1e9:g} GB/s, "
                         f"latency: 0.5 us}}")
    return "\n".join(lines) + "\n"


def cluster_text(fabric: str, gpus: int) -> str:
    from topoplan.cluster.generate import fat_tree, rail_optimized
    make = {"rail": rail_optimized, "fat": fat_tree, "fat3": fat_tree3}[fabric]
    return make(gpus // 8)
PROFILES = ("ideal", "nccl")


def case(fabric: str, gpus: int, size: int, max_sim_ops: int,
         channels: tuple[int, ...] = (), profiles: tuple[str, ...] = PROFILES,
         auto: bool = True) -> dict:
    """Run one case in this process; a dict of its numbers per profile."""
    import resource
    import warnings

    from topoplan.analysis.bound import latency_bound, lower_bound
    from topoplan.cluster import loads_cluster
    from topoplan.planners import PlanRequest, compare, nccl_candidate
    from topoplan.planners.mcf import plan_mcf
    from topoplan.analysis.sim import simulate
    from topoplan.ir.verify import verify

    cluster = loads_cluster(cluster_text(fabric, gpus))
    bound = lower_bound(cluster, size)
    out: dict = {"fabric": fabric, "gpus": cluster.nranks}
    for profile in profiles:
        row: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t, cpu = time.perf_counter(), time.process_time()
            schedule = plan_mcf(cluster, size=size, check=False, profile=profile)
            row["plan_s"] = time.perf_counter() - t
            row["plan_cpu_s"] = time.process_time() - cpu
        t = time.perf_counter()
        verify(schedule)
        row["verify_s"] = time.perf_counter() - t
        row["ops"] = schedule.nops
        row["construction"] = schedule.meta.get("construction", "")
        row["pieces"] = schedule.meta.get("pieces")
        row["est_lb"] = schedule.meta["estimate_s"] / bound
        if schedule.nops <= max_sim_ops:
            t = time.perf_counter()
            row["sim_lb"] = simulate(cluster, schedule, size, profile=profile).time_s / bound
            row["sim_s"] = time.perf_counter() - t
        latency = latency_bound(cluster, size, profile)
        row["x_latency_bound"] = ((row["sim_lb"] if "sim_lb" in row else row["est_lb"])
                                  * bound / latency)
        del schedule
        for c in channels:
            row[f"ch{c}"] = _on_channels(cluster, size, profile, c, bound, latency,
                                         max_sim_ops)
        out[profile] = row
    # What auto picks under nccl against NCCL's own collective.
    with warnings.catch_warnings():
        if not auto:
            out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            return out
        warnings.simplefilter("ignore")
        request = PlanRequest.make(cluster, size=size, profile="nccl")
        t = time.perf_counter()
        rows = compare(request)
        nccl = nccl_candidate(request)
        out["auto"] = {"choice": rows[0].name, "time_s": rows[0].time_s,
                       "simulated": rows[0].simulated, "nccl_s": nccl.time_s if nccl else None,
                       "nccl": nccl.nccl.label() if nccl and nccl.nccl else "",
                       "compare_s": time.perf_counter() - t}
        if channels:  # auto again, mcf picking its channels (plan(..., channels="auto"))
            from topoplan.planners.channels import SKEW
            request = PlanRequest.make(cluster, size=size, profile="nccl", channels="auto",
                                       channel_skew=SKEW)
            t = time.perf_counter()
            rows = compare(request)
            sched = rows[0].schedule
            out["auto_channels"] = {
                "choice": rows[0].name, "time_s": rows[0].time_s,
                "simulated": rows[0].simulated,
                "channels": sched.nchannels if sched is not None else 1,
                "compare_s": time.perf_counter() - t}
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def _on_channels(cluster, size: int, profile: str, channels: int, bound: float,
                 latency: float, max_sim_ops: int) -> dict:
    """mcf on ``channels`` channels: plan, verify (and simulate, when small enough)."""
    import warnings

    import topoplan
    from topoplan.analysis.sim import simulate
    from topoplan.ir.verify import verify

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        schedule = topoplan.plan(cluster, "mcf", size=size, profile=profile,
                                 channels=channels, check=False)
        out: dict = {"plan_s": time.perf_counter() - t}
    t = time.perf_counter()
    verify(schedule)
    out.update(verify_s=time.perf_counter() - t, ops=schedule.nops,
               construction=schedule.meta.get("construction", ""),
               pieces=schedule.meta.get("pieces"),
               est_lb=schedule.meta["estimate_s"] / bound,
               x_latency_bound=schedule.meta["estimate_s"] / latency)
    if schedule.nops <= max_sim_ops:
        t = time.perf_counter()
        sim = simulate(cluster, schedule, size, profile=profile).time_s
        out.update(sim_lb=sim / bound, sim_s=time.perf_counter() - t,
                   x_latency_bound=sim / latency)
    return out


def _cell(row: dict, key: str, fmt: str, width: int) -> str:
    value = row.get(key)
    return f"{value:{width}{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}s}"


def main(argv: list[str] | None = None) -> int:
    from topoplan.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="64,1024,4096,8192")
    p.add_argument("--size", default="256MiB")
    p.add_argument("--fabrics", default=",".join(FABRICS))
    p.add_argument("--max-sim-ops", type=int, default=1_000_000)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    p.add_argument("--channels", default="",
                   help="also plan mcf on these channel counts (comma-separated)")
    p.add_argument("--profiles", default=",".join(PROFILES),
                   help="plan mcf under these profiles (comma-separated)")
    p.add_argument("--no-auto", action="store_true",
                   help="skip auto's comparison with NCCL's row (minutes at 8192 GPUs)")
    p.add_argument("--cli", action="store_true",
                   help="time `topoplan plan CLUSTER --algorithm mcf` instead")
    p.add_argument("--case", help=argparse.SUPPRESS)  # fabric:gpus, run in a subprocess
    args = p.parse_args(argv)
    size = parse_size(args.size)
    profiles = tuple(x for x in args.profiles.split(",") if x)
    if args.cli:
        return cli_times(args)
    if args.case:
        fabric, gpus = args.case.split(":")
        print(json.dumps(case(fabric, int(gpus), size, args.max_sim_ops,
                              _channel_counts(args.channels), profiles, not args.no_auto)))
        return 0
    print(f"mcf at {args.size} per rank, planned and simulated under each profile; times in "
          "seconds, ratios over the cut lower bound; peak: the case's resident memory")
    print(f"{'':12s}" + "".join(f"| {p:^47s}" for p in profiles))
    print(f"{'fabric':6s} {'GPUs':>5s} " + f"| {'plan_s':>6s} {'verify_s':>8s} {'sim_s':>6s} "
          f"{'ops':>9s} {'est/lb':>6s} {'sim/lb':>6s} " * len(profiles) + f"{'peak_MB':>7s}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for fabric in args.fabrics.split(","):
        for gpus in (int(g) for g in args.gpus.split(",")):
            cmd = [sys.executable, __file__, "--case", f"{fabric}:{gpus}", "--size", args.size,
                   "--max-sim-ops", str(args.max_sim_ops), "--channels", args.channels,
                   "--profiles", args.profiles] + (["--no-auto"] if args.no_auto else [])
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                      timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{fabric:6s} {gpus:5d} did not finish in {args.timeout:.0f} s", flush=True)
                continue
            if done.returncode != 0:
                print(f"{fabric:6s} {gpus:5d} failed: {done.stderr.strip().splitlines()[-1:]}",
                      flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            line = f"{fabric:6s} {row['gpus']:5d} "
            for profile in profiles:
                r = row[profile]
                line += (f"| {_cell(r, 'plan_s', '.1f', 6)} {_cell(r, 'verify_s', '.1f', 8)} "
                         f"{_cell(r, 'sim_s', '.1f', 6)} {r['ops']:9d} "
                         f"{_cell(r, 'est_lb', '.3f', 6)} {_cell(r, 'sim_lb', '.3f', 6)} ")
            print(line + f"{row['peak_mb']:7.0f}", flush=True)
            for profile in profiles:
                print(f"{'':12s}  {profile}: {row[profile]['construction']}, "
                      f"{row[profile]['pieces']} pieces; plan / latency-aware bound "
                      f"{row[profile]['x_latency_bound']:.3f}; plan CPU "
                      f"{row[profile]['plan_cpu_s']:.1f} s", flush=True)
                for c in _channel_counts(args.channels):
                    r = row[profile][f"ch{c}"]
                    how = (f"simulated {r['sim_lb']:.3f}" if "sim_lb" in r
                           else f"estimate {r['est_lb']:.3f}")
                    print(f"{'':12s}  {profile} on {c} channels: {how} of the cut bound, "
                          f"{r['x_latency_bound']:.3f} of the latency-aware bound; "
                          f"{r['pieces']} pieces, {r['ops']} ops, plan {r['plan_s']:.1f} s, "
                          f"verify {r['verify_s']:.1f} s; {r['construction']}", flush=True)
            a = row.get("auto", {"nccl_s": None})
            if a["nccl_s"]:
                print(f"{'':12s}  nccl profile: auto picks {a['choice']} "
                      f"{'' if a['simulated'] else '~'}{a['time_s'] * 1e3:.3f} ms, nccl "
                      f"({a['nccl']}) {a['nccl_s'] * 1e3:.3f} ms: auto {a['nccl_s'] / a['time_s']:.2f}x"
                      f" nccl's speed (compare {a['compare_s']:.1f} s)", flush=True)
            if a["nccl_s"] and "auto_channels" in row:
                b = row["auto_channels"]
                print(f"{'':12s}  nccl profile, mcf picking its channels: auto picks "
                      f"{b['choice']} on {b['channels']} channels "
                      f"{'' if b['simulated'] else '~'}{b['time_s'] * 1e3:.3f} ms: "
                      f"{a['nccl_s'] / b['time_s']:.2f}x nccl's speed (compare "
                      f"{b['compare_s']:.1f} s)", flush=True)
    return 0


def _channel_counts(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip() and int(c) > 1)


def cli_times(args: argparse.Namespace) -> int:
    """Time ``topoplan plan CLUSTER --algorithm mcf --size SIZE`` as typed."""
    import resource
    import tempfile
    print(f"topoplan plan CLUSTER --algorithm mcf --size {args.size}: seconds, start to end, "
          "and the CPU seconds it used (user + system: what a quiet machine would take, "
          "about)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for fabric in args.fabrics.split(","):
            for gpus in (int(g) for g in args.gpus.split(",")):
                path = Path(tmp) / f"{fabric}-{gpus}.yaml"
                path.write_text(cluster_text(fabric, gpus))
                t = time.perf_counter()
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                done = subprocess.run([sys.executable, "-m", "topoplan", "plan", str(path),
                                       "--algorithm", "mcf", "--size", args.size],
                                      capture_output=True, text=True, env=env)
                took = time.perf_counter() - t
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                load = os.getloadavg()[0]
                state = "ok" if done.returncode == 0 else f"failed: {done.stderr.strip()[-200:]}"
                print(f"{fabric:6s} {gpus:5d} GPUs  {took:6.1f} s  cpu {cpu:5.1f} s  "
                      f"(load average {load:.1f}) {state}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
