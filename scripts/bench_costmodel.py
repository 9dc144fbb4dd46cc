"""The cost model against reality: predicted vs measured, and auto's choices.

Two parts, both print tables and (``--json``) records:

``mpi``: real runs. Every planner (ring, tree, rhd, hierarchical, mcf, auto) plans each
topology under a calibrated profile (default ``mpi``, measured on this machine by
``topoplan calibrate``) at every size (auto ranks its candidates by their predicted time
on this machine, where they run: ``plan_auto(machine=profile.host_cluster())``); one ``mpiexec`` per topology replays all plans
through ``topoplan.Allreduce`` over Open MPI, interleaved round by round with
``MPI_Allreduce`` (machine load hits all alike), after an exact check of every result.
Each topology is launched ``--repeat`` times (3), round robin, and the median reported
with its spread (slowest / fastest pass): this machine's speed moves by tens of percent
from minute to minute. The prediction is ``topoplan.simulate`` of the same schedule on the
machine that ran it
(``profile.host_cluster``: one box of the calibrated ranks, each moving
``host.bandwidth``) with the same profile. Columns: messages, steps, measured,
predicted, measured/predicted, and measured over the fastest of ring, tree, rhd and
hierarchical in the same run (auto's row is the target: <= 1/0.9).

``sim``: the simulator under a profile (default ``nccl``) on every shipped topology up
to ``--max-ranks``: auto against the best baseline from 1 KiB to 1 GiB, and at 256 MiB
mcf against the bandwidth bound (under ``ideal``) and the latency-aware bound (under
the profile), with every plan's message and step counts.

    python scripts/bench_costmodel.py mpi                      # dgx1_v100, aws_p2_8xlarge, a100_2x4
    python scripts/bench_costmodel.py mpi --topologies dgx1_v100 --sizes 1MiB,16MiB
    python scripts/bench_costmodel.py sim --max-ranks 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import statistics
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BASELINES = ("ring", "tree", "rhd", "hierarchical")
PLANNERS = BASELINES + ("mcf", "auto")

# 2 boxes x 4 GPUs cut from dgx_a100_x4.yaml (rail-optimised: a NIC per GPU, one leaf
# switch per rail), so that it runs on 8 ranks like the other two.
A100_2X4 = """
name: dgx-a100-2x4
switches:
  - {name: "rail{i}", count: 4}
  - {name: "spine{i}", count: 2}
boxes:
  - name: "dgx{i}"
    count: 2
    gpus: 4
    fabric: {bandwidth: 300 GB/s, latency: 0.5 us}
    nics:
      - {switch: rail0, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [0]}
      - {switch: rail1, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [1]}
      - {switch: rail2, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [2]}
      - {switch: rail3, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [3]}
links:
  - {a: "rail{i//2}", b: "spine{i%2}", count: 8, bandwidth: 400 Gbit/s, latency: 0.3 us}
"""

def load_topology(name: str) -> Any:
    from topoplan.cluster import load_cluster, loads_cluster
    if name == "a100_2x4":
        return loads_cluster(A100_2X4, "a100_2x4 (cut of dgx_a100_x4)")
    path = name if name.endswith(".yaml") else os.path.join(ROOT, "topologies", f"{name}.yaml")
    return load_cluster(path)


# --------------------------------------------------------------------------------------
# mpi: real runs
# --------------------------------------------------------------------------------------
def _measure(methods: dict, barrier: Any, agree_max: Any, seconds: float, rounds: int,
             max_iters: int = 100) -> dict[str, float]:
    """The median over interleaved rounds of the slowest rank's mean time per call, per
    method. Each round runs every method for a block of calls (at least 2, the first
    untimed: it lines the ranks up after the barrier); the order rotates per round."""
    import time as _t
    iters = {}
    for name, fn in methods.items():
        fn()
        barrier()
        t0 = _t.perf_counter()
        fn()
        est = agree_max(_t.perf_counter() - t0)
        iters[name] = int(min(max_iters, max(2, seconds / rounds / max(est, 1e-7))))
    names = list(methods)
    blocks: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            fn = methods[name]
            barrier()
            fn()
            t0 = _t.perf_counter()
            for _ in range(iters[name]):
                fn()
            blocks[name].append(agree_max((_t.perf_counter() - t0) / iters[name]))
    return {name: statistics.median(blocks[name]) for name in names}


def rank_main(manifest_path: str) -> None:
    import numpy as np
    from mpi4py import MPI as mpi

    from topoplan.runtime.executor import Allreduce
    from topoplan.ir.parse import load_schedule
    from topoplan.runtime.transports.mpi import MPI

    with open(manifest_path) as f:
        manifest = json.load(f)
    comm = mpi.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    transport = MPI(comm)
    out = []
    for size_entry in manifest["sizes"]:
        size = size_entry["size"]
        count = size // 4
        runs = {p["planner"]: Allreduce(load_schedule(p["path"]), transport, timeout=600)
                for p in size_entry["plans"] if not p.get("same_as")}
        bufs = {name: np.zeros(count, dtype=np.float32) for name in [*runs, "native"]}
        want = (np.arange(count) % 7).astype(np.float32) * n + sum(range(n))
        wrong = {}
        for name, buf in bufs.items():
            buf[...] = np.arange(count) % 7 + rank
            if name == "native":
                comm.Allreduce(mpi.IN_PLACE, buf, op=mpi.SUM)
            else:
                runs[name](buf)
            wrong[name] = int(comm.allreduce(int(np.count_nonzero(buf != want)), op=mpi.SUM))
            buf[...] = 0
        methods = {name: (lambda r=runs[name], b=bufs[name]: r(b)) for name in runs}
        methods["native"] = lambda b=bufs["native"]: comm.Allreduce(mpi.IN_PLACE, b, op=mpi.SUM)
        t = _measure(methods, comm.Barrier, lambda v: comm.allreduce(v, op=mpi.MAX),
                     manifest["seconds"], manifest["rounds"])
        for p in size_entry["plans"]:  # a plan equal to another one is measured once
            if p.get("same_as"):
                t[p["planner"]], wrong[p["planner"]] = t[p["same_as"]], wrong[p["same_as"]]
        if rank == 0:
            out.append({"size": size, "time_s": t, "wrong": wrong})
    if rank == 0:
        print("BENCH-RECORDS " + json.dumps(out), flush=True)


def run_mpi(args: argparse.Namespace) -> list[dict]:
    from topoplan.runtime.mpirun import mpiexec
    from topoplan.analysis.cost import get_profile
    from topoplan.planners import plan
    from topoplan.analysis.sim import simulate
    from topoplan.ir.verify import verify

    profile = get_profile(args.profile)
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-costmodel-") as tmp:
        # Plan and predict everything first: a planning error costs no measurement.
        jobs = []
        for topo in args.topologies:
            cluster = load_topology(topo)
            n = cluster.nranks
            host = profile.host_cluster(n)
            sizes, meta = [], {}
            for size in args.sizes:
                plans = []
                for name in args.planners:
                    t0 = time.perf_counter()
                    # auto ranks its candidates by their time where they run: this host.
                    extra = {"machine": host} if name == "auto" else {}
                    schedule = plan(cluster, name, size=size, profile=profile, **extra)
                    plan_s = time.perf_counter() - t0
                    verify(schedule)
                    path = os.path.join(tmp, f"{topo}-{name}-{size}.json")
                    schedule.save(path)
                    same = next((p["planner"] for p in plans if p["schedule"] == schedule), None)
                    plans.append({"planner": name, "path": path, "schedule": schedule,
                                  "same_as": same})
                    pred = simulate(host, schedule, size, profile=profile, force=True)
                    meta[(size, name)] = {
                        "messages": schedule.nmessages, "steps": schedule.nsteps,
                        "chunks": schedule.nchunks, "plan_s": plan_s,
                        "chosen": schedule.meta.get("chosen", name),
                        "construction": schedule.meta.get("construction"),
                        "predicted_s": pred.time_s,
                        "breakdown": dict(pred.breakdown)}
                sizes.append({"size": size, "plans": [
                    {k: v for k, v in p.items() if k != "schedule"} for p in plans]})
            manifest = os.path.join(tmp, f"{topo}-manifest.json")
            with open(manifest, "w") as f:
                json.dump({"sizes": sizes, "seconds": args.seconds, "rounds": args.rounds}, f)
            jobs.append((topo, n, manifest, meta))
        # Every topology's launch ``repeat`` times, round robin: this machine's speed moves
        # by tens of percent over minutes, and a launch sees one such moment.
        measured: dict[str, list[dict]] = {}
        for rep in range(args.repeat):
            for topo, n, manifest, _ in jobs:
                print(f"# {topo}: {n} ranks, {len(args.planners)} plans x {len(args.sizes)} "
                      f"sizes under mpiexec (pass {rep + 1}/{args.repeat}) ...", file=sys.stderr,
                      flush=True)
                proc = mpiexec(n, [sys.executable, os.path.abspath(__file__), "rank", manifest],
                               timeout=3600, fault_tolerant=True)
                found = [line for line in proc.stdout.splitlines()
                         if line.startswith("BENCH-RECORDS ")]
                if proc.returncode or not found:
                    print(f"# {topo}: the MPI run failed (exit {proc.returncode}); left out",
                          file=sys.stderr)
                    print(proc.stdout[-4000:], proc.stderr[-4000:], file=sys.stderr)
                    continue
                measured.setdefault(topo, []).append(
                    {rec["size"]: rec for rec in json.loads(
                        found[-1].removeprefix("BENCH-RECORDS "))})
        for topo, n, _, meta in jobs:
            passes = measured.get(topo, [])
            if not passes:
                continue
            for size in args.sizes:
                recs = [p[size] for p in passes if size in p]
                times = {name: [r["time_s"][name] for r in recs]
                         for name in [*args.planners, "native"]}
                median = {name: statistics.median(v) for name, v in times.items()}
                spread = {name: max(v) / min(v) for name, v in times.items()}
                wrong = {name: max(r["wrong"][name] for r in recs)
                         for name in [*args.planners, "native"]}
                best = min(median[b] for b in BASELINES if b in median)
                for name in args.planners:
                    m = meta[(size, name)]
                    records.append({"topology": topo, "nranks": n, "size": size,
                                    "planner": name, **m, "measured_s": median[name],
                                    "passes_s": times[name], "spread": spread[name],
                                    "ratio": median[name] / m["predicted_s"],
                                    "vs_best_baseline": median[name] / best,
                                    "wrong": wrong[name]})
                records.append({"topology": topo, "nranks": n, "size": size,
                                "planner": "MPI_Allreduce", "measured_s": median["native"],
                                "passes_s": times["native"], "spread": spread["native"],
                                "vs_best_baseline": median["native"] / best,
                                "wrong": wrong["native"]})
    return records


def report_mpi(records: list[dict], profile: Any) -> str:
    from topoplan.units import format_size
    lines = [f"# profile {profile.summary()}",
             f"# host: {profile.host_ranks} ranks at {profile.host_bandwidth / 1e9:.3g} GB/s each"]
    for topo in dict.fromkeys(r["topology"] for r in records):
        lines.append(f"\n## {topo}")
        lines.append(f"{'size':>7} {'planner':<14} {'msgs':>6} {'steps':>5} {'measured':>10} "
                     f"{'predicted':>10} {'meas/pred':>9} {'/best base':>10} {'spread':>6}  ok")
        for r in (x for x in records if x["topology"] == topo):
            name = r["planner"]
            if name == "auto":
                name = f"auto:{r['chosen']}"
            pred = r.get("predicted_s")
            lines.append(
                f"{format_size(r['size']):>7} {name:<14} {r.get('messages', ''):>6} "
                f"{r.get('steps', ''):>5} {r['measured_s'] * 1e3:>8.2f}ms "
                + (f"{pred * 1e3:>8.2f}ms {r['ratio']:>9.2f}" if pred else f"{'':>10} {'':>9}")
                + f" {r['vs_best_baseline']:>9.2f}x {r.get('spread', 1.0):>6.2f}"
                f"  {'yes' if r['wrong'] == 0 else 'NO'}")
    ratios = [r["ratio"] for r in records if "ratio" in r and r["size"] >= 1 << 20]
    autos = [r["vs_best_baseline"] for r in records if r["planner"] == "auto"]
    if ratios:
        lines.append(f"\nmeasured/predicted at 1 MiB and up: {min(ratios):.2f} .. "
                     f"{max(ratios):.2f} (target 0.75 .. 1.33)")
    if autos:
        lines.append(f"auto over the fastest baseline: worst {max(autos):.2f}x "
                     f"(target <= {1 / 0.9:.2f}x, i.e. at least 0.9x as fast)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# sim: the simulator under a profile
# --------------------------------------------------------------------------------------
def run_sim(args: argparse.Namespace) -> list[dict]:
    from topoplan.analysis.bound import latency_bound, lower_bound
    from topoplan.analysis.cost import get_profile
    from topoplan.planners.auto import compare
    from topoplan.analysis.sim import simulate
    from topoplan.units import parse_size_range

    profile = get_profile(args.profile)
    names = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, "topologies"))
                   if f.endswith(".yaml"))
    records = []
    for topo in names:
        cluster = load_topology(topo)
        if cluster.nranks > args.max_ranks:
            continue
        for size in parse_size_range(args.sim_sizes):
            t0 = time.perf_counter()
            rows = compare(cluster, size, profile=profile)
            secs = time.perf_counter() - t0
            times = {name: (r.time_s if r is not None else s.meta.get("estimate_s"))
                     for name, s, r, _ in rows}
            sizes = {name: (s.nmessages, s.nsteps) for name, s, _, _ in rows}
            best_base = min(t for name, t in times.items() if name != "mcf")
            auto_name = rows[0][0]
            records.append({"topology": topo, "nranks": cluster.nranks, "size": size,
                            "auto": auto_name, "auto_s": times[auto_name],
                            "best_baseline_s": best_base,
                            "auto_vs_best": times[auto_name] / best_base,
                            "mcf_s": times.get("mcf"), "plans": sizes, "seconds": secs})
        if args.quality:
            size = 256 << 20
            from topoplan.planners import plan
            row = {"topology": topo, "nranks": cluster.nranks, "size": size, "quality": True}
            for prof in ("ideal", profile.name):
                schedule = plan(cluster, "mcf", size=size, profile=prof)
                sim = (simulate(cluster, schedule, size, profile=prof).time_s
                       if schedule.nops <= args.max_sim_ops else schedule.meta["estimate_s"])
                bound = lower_bound(cluster, size) if prof == "ideal" else \
                    latency_bound(cluster, size, prof)
                row[prof] = {"time_s": sim, "bound_s": bound, "ratio": sim / bound,
                             "messages": schedule.nmessages, "steps": schedule.nsteps,
                             "construction": schedule.meta.get("construction"),
                             "simulated": schedule.nops <= args.max_sim_ops}
            records.append(row)
        print(f"# {topo} done", file=sys.stderr, flush=True)
    return records


def report_sim(records: list[dict], profile: Any) -> str:
    from topoplan.units import format_size
    lines = [f"# simulated under {profile.summary()}"]
    sweep = [r for r in records if not r.get("quality")]
    worst: dict[str, dict] = {}
    for r in sweep:
        w = worst.get(r["topology"])
        if w is None or r["auto_vs_best"] > w["auto_vs_best"]:
            worst[r["topology"]] = r
    lines.append("\n## auto against the best baseline, every size (1.00 = as fast)")
    lines.append(f"{'topology':<20} {'ranks':>5} {'worst auto/best':>15} {'at':>8} "
                 f"{'auto picks (by size)'}")
    for topo, w in worst.items():
        picks = " ".join(f"{format_size(r['size'])}:{r['auto']}" for r in sweep
                         if r["topology"] == topo)
        lines.append(f"{topo:<20} {w['nranks']:>5} {w['auto_vs_best']:>15.3f} "
                     f"{format_size(w['size']):>8} {picks}")
    quality = [r for r in records if r.get("quality")]
    if quality:
        name = profile.name
        lines.append(f"\n## mcf at 256 MiB: simulated / bound (ideal: bandwidth bound; {name}: "
                     "latency-aware bound)")
        lines.append(f"{'topology':<20} {'ranks':>5} {'ideal':>7} {name:>7} {'msgs':>8} "
                     f"{'steps':>5}  construction ({name})")
        for r in quality:
            a, b = r["ideal"], r[name]
            mark = "" if b["simulated"] else " (estimate)"
            lines.append(f"{r['topology']:<20} {r['nranks']:>5} {a['ratio']:>7.3f} "
                         f"{b['ratio']:>7.3f} {b['messages']:>8} {b['steps']:>5}  "
                         f"{b['construction']}{mark}")
    return "\n".join(lines)


def main() -> int:
    from topoplan.commands.common import sizes_arg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    m = sub.add_parser("mpi", help="real runs over Open MPI, measured vs predicted")
    m.add_argument("--topologies", type=lambda t: t.split(","),
                   default=["dgx1_v100", "aws_p2_8xlarge", "a100_2x4"])
    m.add_argument("--sizes", type=sizes_arg, default=sizes_arg("64KiB,1MiB,16MiB,64MiB"))
    m.add_argument("--planners", type=lambda t: t.split(","), default=list(PLANNERS))
    m.add_argument("--profile", default="mpi", help="calibrated profile (default mpi)")
    m.add_argument("--seconds", type=float, default=2.0,
                   help="time per method and size, split over the rounds")
    m.add_argument("--rounds", type=int, default=7)
    m.add_argument("--repeat", type=int, default=3,
                   help="launches per topology, round robin; the median is reported and "
                        "'spread' is the slowest over the fastest of them (default 3)")
    m.add_argument("--json", metavar="FILE")
    s = sub.add_parser("sim", help="simulated: auto vs baselines, mcf quality, plan sizes")
    s.add_argument("--profile", default="nccl")
    s.add_argument("--sim-sizes", default="1KiB:1GiB:4")
    s.add_argument("--max-ranks", type=int, default=192)
    s.add_argument("--max-sim-ops", type=int, default=2_000_000)
    s.add_argument("--no-quality", dest="quality", action="store_false")
    s.add_argument("--json", metavar="FILE")
    r = sub.add_parser("rank", help=argparse.SUPPRESS)
    r.add_argument("manifest")
    args = parser.parse_args()
    if args.part == "rank":
        rank_main(args.manifest)
        return 0
    from topoplan.analysis.cost import get_profile
    profile = get_profile(args.profile)
    load = os.getloadavg()
    started = time.time()
    records = run_mpi(args) if args.part == "mpi" else run_sim(args)
    print(f"# bench_costmodel {args.part}: {os.cpu_count()} CPUs, load average before "
          f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}; {time.time() - started:.0f} s")
    print(report_mpi(records, profile) if args.part == "mpi" else report_sim(records, profile))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
