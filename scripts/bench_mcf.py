"""Benchmark the mcf planner: plan quality per shipped topology and planning time per size.

    PYTHONPATH=. python scripts/bench_mcf.py [--big] [--size 256MiB] [--only quality|time]

Quality (table 1): for every shipped topology, mcf's construction, its lock-step
estimate and its *simulated* time (``topoplan.simulate``) over the cut lower bound,
the best baseline's simulated time over the bound, and the factors ring/mcf and
hierarchical/mcf (simulated times). Schedules over ``--max-sim-ops`` ops are not
simulated (the event simulator's cost grows with ops x events); the table says "-".

Planning time (table 2): wall seconds to plan (solve + materialize) and, separately,
to verify, on 4, 8, 64 (generated), 1024 (leaf_spine_1024) and, with ``--big``, 8192
generated GPUs.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.analysis.bound import lower_bound  # noqa: E402
from topoplan.analysis.cost import DEFAULT_PROFILE  # noqa: E402
from topoplan.cluster import load_cluster, loads_cluster  # noqa: E402
from topoplan.planners import PLANNERS  # noqa: E402
from topoplan.planners.mcf import plan_mcf  # noqa: E402
from topoplan.analysis.sim import simulate  # noqa: E402
from topoplan.ir.verify import verify  # noqa: E402

BASELINES = ("ring", "ring-topo", "tree", "rhd", "hierarchical")
#: Plans are made under the default profile (meta["profile"]); simulate them under it too.
PROFILE = DEFAULT_PROFILE


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


def _f(x: float | None, w: int) -> str:
    return f"{x:{w}.3f}" if isinstance(x, float) else f"{'-':>{w}s}"


def quality(size: int, max_sim_ops: int) -> list[dict]:
    """Table 1: mcf vs the bound and the baselines, simulated."""
    print(f"\nQuality at {size >> 20} MiB (times over the cut lower bound; factors are "
          "simulated baseline time / simulated mcf time)")
    print(f"{'topology':20s} {'N':>5s} {'construction':34s} {'ops':>8s} {'plan_s':>6s} "
          f"{'est/lb':>6s} {'sim/lb':>6s} {'best baseline':>20s} {'ring/mcf':>8s} "
          f"{'hier/mcf':>8s}")
    rows = []
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        cluster = load_cluster(path)
        bound = lower_bound(cluster, size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            schedule = plan_mcf(cluster, size=size, check=False)
        m = schedule.meta
        sim = (simulate(cluster, schedule, size, profile=PROFILE).time_s
               if schedule.nops <= max_sim_ops
               else None)
        base: dict[str, float | None] = {}
        for name in BASELINES:
            try:
                other = PLANNERS[name](cluster, size=size)
            except Exception as exc:  # a baseline that does not apply here
                print(f"  ({name} on {path.stem}: {exc})")
                continue
            base[name] = (simulate(cluster, other, size, profile=PROFILE).time_s
                          if other.nops <= max_sim_ops
                          else None)
        done = {k: v for k, v in base.items() if v is not None}
        best = min(done, key=done.get) if done else None
        ring = base.get("ring")
        hier = base.get("hierarchical")
        row = {"topology": path.stem, "nranks": cluster.nranks, "bound_s": bound,
               "mcf_sim_s": sim, "mcf_est_s": m.get("estimate_s"), "construction":
               m.get("construction"), "nops": schedule.nops, "plan_s": m.get("plan_s"),
               "baselines_s": base}
        rows.append(row)
        best_s = f"{best} {done[best] / bound:.3f}" if best else "-"
        print(f"{path.stem:20s} {cluster.nranks:5d} {str(m.get('construction'))[:34]:34s} "
              f"{schedule.nops:8d} {m.get('plan_s', 0):6.2f} "
              f"{_f(m.get('estimate_s', 0) / bound, 6)} {_f(sim / bound if sim else None, 6)} "
              f"{best_s:>20s} {_f(ring / sim if ring and sim else None, 8)} "
              f"{_f(hier / sim if hier and sim else None, 8)}", flush=True)
    return rows


def planning_time(big: bool, size: int) -> list[dict]:
    """Table 2: planning seconds (solve + materialize) and verify seconds per size."""
    cases = [("ddl_two_switch", lambda: load_cluster(ROOT / "topologies/ddl_two_switch.yaml")),
             ("dgx1_v100", lambda: load_cluster(ROOT / "topologies/dgx1_v100.yaml")),
             ("dgx_a100_x4", lambda: load_cluster(ROOT / "topologies/dgx_a100_x4.yaml")),
             ("generated 64", lambda: loads_cluster(generated(8))),
             ("leaf_spine_1024", lambda: load_cluster(ROOT / "topologies/leaf_spine_1024.yaml"))]
    if big:
        cases.append(("generated 8192", lambda: loads_cluster(generated(1024))))
    print(f"\nPlanning time at {size >> 20} MiB (wall seconds on this machine; plan = solve + "
          "materialize, verify timed separately)")
    print(f"{'cluster':18s} {'N':>5s} {'load':>6s} {'solve':>6s} {'mater.':>6s} {'plan':>6s} "
          f"{'verify':>6s} {'ops':>9s} {'chunks':>7s} {'est/lb':>6s}  construction")
    rows = []
    for name, make in cases:
        t0 = time.perf_counter()
        cluster = make()
        _ = cluster.graph
        load_s = time.perf_counter() - t0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            schedule = plan_mcf(cluster, size=size, check=False)
        m = schedule.meta
        t1 = time.perf_counter()
        verify(schedule)
        verify_s = time.perf_counter() - t1
        ratio = m["estimate_s"] / lower_bound(cluster, size)
        print(f"{name:18s} {cluster.nranks:5d} {load_s:6.2f} {m['solve_s']:6.2f} "
              f"{m['materialize_s']:6.2f} {m['plan_s']:6.2f} {verify_s:6.2f} {schedule.nops:9d} "
              f"{schedule.nchunks:7d} {ratio:6.3f}  {m['construction']}", flush=True)
        rows.append({"cluster": name, "nranks": cluster.nranks, "load_s": load_s,
                     "verify_s": verify_s, "nops": schedule.nops,
                     **{k: v for k, v in m.items() if k != "candidates"}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--big", action="store_true", help="include the 8192-GPU cluster")
    parser.add_argument("--only", choices=("quality", "time"))
    parser.add_argument("--max-sim-ops", type=int, default=1_500_000,
                        help="do not simulate schedules with more ops (default 1.5 M)")
    args = parser.parse_args(argv)
    from topoplan.units import parse_size
    size = int(parse_size(args.size))
    if args.only != "time":
        quality(size, args.max_sim_ops)
    if args.only != "quality":
        planning_time(args.big, size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
