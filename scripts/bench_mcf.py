"""Benchmark the mcf planner: plan quality per shipped topology and planning time per size.

    PYTHONPATH=. python scripts/bench_mcf.py [--big] [--size 256MiB]

Quality: the LP's steady-state time vs the cut lower bound, a pipeline estimate
(LP time x (Q + span) / Q + steps x latency), and, once ``topoplan.simulate`` and
the baseline planners exist, the simulated time and the factors over ring and
hierarchical. Planning time: solve (LP/MILP) and materialize (schedule IR v1)
separately, on 8, 64, 1024 (leaf_spine_1024) and, with ``--big``, 8192 generated GPUs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.cluster import load_cluster, loads_cluster  # noqa: E402
from topoplan.planners.mcf import _step_latency, plan_mcf  # noqa: E402


def generated(boxes: int, gpus: int = 8, per_leaf: int = 16, spines: int = 8) -> str:
    """A rail-per-GPU leaf-spine cluster: boxes x gpus GPUs, 25 GB/s NICs, 100 GB/s uplinks."""
    leaves = (boxes + per_leaf - 1) // per_leaf
    nics = ", ".join(f"{{switch: 'leaf{{i//{per_leaf}}}', bandwidth: 25 GB/s, latency: 2 us, "
                     f"gpus: [{j}]}}" for j in range(gpus))
    lines = [f"name: generated-{boxes * gpus}", "switches:",
             f"  - {{name: 'leaf{{i}}', count: {leaves}}}",
             f"  - {{name: 'spine{{i}}', count: {spines}}}", "boxes:",
             f"  - {{name: 'node{{i}}', count: {boxes}, gpus: {gpus}, "
             f"fabric: {{bandwidth: 300 GB/s, latency: 1 us}}, nics: [{nics}]}}", "links:"]
    lines += [f"  - {{a: 'leaf{{i}}', b: spine{s}, count: {leaves}, bandwidth: 100 GB/s, "
              "latency: 1 us}" for s in range(spines)]
    return "\n".join(lines) + "\n"


def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def quality(size: int) -> list[dict]:
    simulate = _optional("topoplan.simulate", "simulate")
    lower_bound = _optional("topoplan.bound", "lower_bound")
    plan = _optional("topoplan.planners", "plan")
    rows = []
    print(f"\nQuality at {size >> 20} MiB")
    head = f"{'topology':22s} {'N':>5s} {'mode':>12s} {'trees':>5s} {'Q':>4s} {'span':>4s} " \
           f"{'LP/bound':>8s} {'est/LP':>7s} {'sim/bound':>9s} {'ring/mcf':>8s} {'hier/mcf':>8s}"
    print(head)
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        cluster = load_cluster(path)
        schedule = plan_mcf(cluster, size=size, check=cluster.nranks <= 64)
        m = schedule.meta
        lp = m["lp_time_s"]
        q, span = m["pipeline"], m["span_steps"]
        est = lp * (q + span) / q + (q + span) * _step_latency(cluster)
        row = {"topology": path.stem, "nranks": cluster.nranks, **m, "est_s": est}
        bound = lower_bound(cluster, size) if lower_bound else None
        sim = simulate(cluster, schedule, size).time_s if simulate else None
        fac = {}
        if simulate and plan:
            for alg in ("ring", "hierarchical"):
                try:
                    other = plan(cluster, algorithm=alg, size=size)
                    fac[alg] = simulate(cluster, other, size).time_s / sim
                except Exception as exc:  # a baseline that does not apply here
                    fac[alg] = float("nan")
                    print(f"  ({alg} on {path.stem}: {exc})")
        row.update(bound_s=bound, sim_s=sim, **{f"{k}_factor": v for k, v in fac.items()})
        rows.append(row)

        def f(x, w):
            return f"{x:{w}.3f}" if isinstance(x, float) else f"{'-':>{w}s}"
        print(f"{path.stem:22s} {cluster.nranks:5d} {m['mode']:>12s} {m['trees']:5d} {q:4d} "
              f"{span:4d} {f(lp / bound if bound else None, 8)} {f(est / lp, 7)} "
              f"{f(sim / bound if sim and bound else None, 9)} {f(fac.get('ring'), 8)} "
              f"{f(fac.get('hierarchical'), 8)}")
    return rows


def planning_time(big: bool, size: int) -> list[dict]:
    cases = [("ddl_two_switch (4)", lambda: load_cluster(ROOT / "topologies/ddl_two_switch.yaml")),
             ("dgx1_v100 (8)", lambda: load_cluster(ROOT / "topologies/dgx1_v100.yaml")),
             ("generated 64", lambda: loads_cluster(generated(8))),
             ("leaf_spine_1024", lambda: load_cluster(ROOT / "topologies/leaf_spine_1024.yaml"))]
    if big:
        cases.append(("generated 8192", lambda: loads_cluster(generated(1024))))
    print(f"\nPlanning time at {size >> 20} MiB (wall seconds on this machine)")
    print(f"{'cluster':22s} {'N':>5s} {'load':>6s} {'solve':>6s} {'mater.':>6s} {'plan':>6s} "
          f"{'verify':>6s} {'ops':>9s} {'chunks':>6s} {'LP/bound':>8s}")
    rows = []
    lower_bound = _optional("topoplan.bound", "lower_bound")
    for name, make in cases:
        t0 = time.perf_counter()
        cluster = make()
        _ = cluster.graph
        load_s = time.perf_counter() - t0
        schedule = plan_mcf(cluster, size=size, check=False)
        m = schedule.meta
        verify_s = float("nan")
        if schedule.nops <= 2_000_000:
            from topoplan.verify import verify
            t1 = time.perf_counter()
            verify(schedule)
            verify_s = time.perf_counter() - t1
        ratio = m["lp_time_s"] / lower_bound(cluster, size) if lower_bound else float("nan")
        print(f"{name:22s} {cluster.nranks:5d} {load_s:6.2f} {m['solve_s']:6.2f} "
              f"{m['materialize_s']:6.2f} {m['plan_s']:6.2f} {verify_s:6.2f} {schedule.nops:9d} "
              f"{schedule.nchunks:6d} {ratio:8.3f}")
        rows.append({"cluster": name, "nranks": cluster.nranks, "load_s": load_s, **m,
                     "verify_s": verify_s, "nops": schedule.nops})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--big", action="store_true", help="include the 8192-GPU cluster")
    parser.add_argument("--only", choices=("quality", "time"))
    args = parser.parse_args(argv)
    from topoplan.units import parse_size
    size = int(parse_size(args.size))
    if args.only != "time":
        quality(size)
    if args.only != "quality":
        planning_time(args.big, size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
