"""Simulator speed: the event engine of topoplan.simulate against the first engine.

Ring, a two-level hierarchical allreduce (in-box ring reduce-scatter, one ring per
rail across boxes, in-box allgather; ``tests/support/schedules.py``) and the mcf planner's plan
(pipelined multi-level grid, IR v2 ranges; planning time not counted) of 256 MiB on a
leaf-spine fabric of 8-GPU boxes: ``topologies/leaf_spine_1024.yaml`` at 1024 ranks, the
same shape scaled down below. "old" is the engine as first merged (commit cbb8359, loaded
from git history, with its own op flattening); where git is missing, and for the mcf plan
(version 2 schedules, which that engine predates), the in-module reference
(:func:`topoplan.analysis.sim.reference.simulate_reference`) stands in. Both run in the
same process, one after the other; wall and CPU seconds are reported (CPU time is the
fairer figure on a shared machine). The old engine is skipped above ``--old-max`` ranks
(it takes minutes at 1024).

    PYTHONPATH=. python scripts/bench_simulate.py [--ranks 64 256 1024] [--old-max 256]
        [--schedules ring hierarchical mcf]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.clusters import leaf_spine_cluster  # noqa: E402
from tests.support.schedules import hierarchical_schedule, ring_schedule  # noqa: E402
from topoplan import plan  # noqa: E402
from topoplan.cluster import load_cluster  # noqa: E402
from topoplan.analysis.sim.base import EPS_T  # noqa: E402
from topoplan.analysis.sim.reference import simulate_reference as _simulate_reference  # noqa: E402
from topoplan.analysis.sim import simulate  # noqa: E402

OLD_COMMIT = "cbb8359"
SIZE = 256 << 20


def old_simulate():
    """The first engine from git history, or the in-module reference."""
    try:
        text = subprocess.run(["git", "show", f"{OLD_COMMIT}:topoplan/simulate.py"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return _simulate_reference, "in-module reference"
    path = Path(tempfile.mkdtemp()) / "simulate_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("topoplan._simulate_old", path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "topoplan"
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.simulate, f"git {OLD_COMMIT}"


def cluster_for(nranks: int):
    if nranks == 1024:
        return load_cluster(ROOT / "topologies" / "leaf_spine_1024.yaml")
    return leaf_spine_cluster(nranks // 8)


def make_schedule(name: str, cluster, nranks: int):
    if name == "ring":
        return ring_schedule(list(range(nranks)))
    if name == "hierarchical":
        return hierarchical_schedule(nranks, 8)
    return plan(cluster, algorithm="mcf", size=SIZE)


def timed(fn, *args, **kw):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--old-max", type=int, default=256,
                        help="run the old engine up to this many ranks (default 256)")
    parser.add_argument("--schedules", nargs="+", default=["ring", "hierarchical", "mcf"],
                        choices=["ring", "hierarchical", "mcf"])
    args = parser.parse_args(argv)
    old, old_name = old_simulate()
    rows = []
    print(f"256 MiB allreduce on leaf-spine, 8 GPUs per box; old = {old_name}")
    print(f"{'schedule':<13}{'ranks':>6}{'ops':>10}{'sim time':>12}"
          f"{'new wall':>10}{'new cpu':>9}{'(cached)':>9}{'old wall':>10}{'old cpu':>9}"
          f"{'speedup':>9}{'same':>6}")
    for nranks in args.ranks:
        cluster = cluster_for(nranks)
        for name in args.schedules:
            schedule = make_schedule(name, cluster, nranks)
            new, wall, cpu = timed(simulate, cluster, schedule, SIZE)
            # Again, same schedule object: flattened ops come from the cache (sizes sweep).
            _, wall2, _ = timed(simulate, cluster, schedule, SIZE)
            row = {"schedule": name, "ranks": nranks, "ops": schedule.nops,
                   "time_s": new.time_s, "new_wall_s": wall, "new_cpu_s": cpu,
                   "new_cached_wall_s": wall2}
            line = (f"{name:<13}{nranks:>6}{schedule.nops:>10}{new.time_s * 1e3:>10.3f}ms"
                    f"{wall:>9.2f}s{cpu:>8.2f}s{wall2:>8.2f}s")
            if nranks <= args.old_max:
                # A fresh schedule object so that neither engine sees a warm cache.
                fresh = dataclasses.replace(schedule)
                engine = old if schedule.version == 1 else _simulate_reference
                ref, owall, ocpu = timed(engine, cluster, fresh, SIZE)
                # Both engines batch events within EPS_T of their clock, and drift by up
                # to that per batch along a chain of steps (tests/test_simulate.py).
                same = abs(ref.time_s - new.time_s) <= 50 * EPS_T * ref.time_s
                row.update(old_wall_s=owall, old_cpu_s=ocpu, same=same)
                line += f"{owall:>9.2f}s{ocpu:>8.2f}s{ocpu / cpu:>8.1f}x{'yes' if same else 'NO':>6}"
            else:
                line += f"{'-':>10}{'-':>9}{'-':>9}{'-':>6}"
            print(line, flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
