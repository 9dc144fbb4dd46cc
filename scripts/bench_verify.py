"""Benchmark verify() on million-op plans against the verifier it replaced.

    PYTHONPATH=. python scripts/bench_verify.py [--quick] [--repeat 3]

Plans mcf under ``ideal`` at 256 MiB (unverified: ``check=False``) on a 1024-GPU fat
tree and an 8192-GPU rail-optimised fabric (``topoplan.cluster.generate``, as in
``scripts/bench_scale.py``) and the allgather on ``topologies/leaf_spine_1024.yaml``,
then times :func:`topoplan.verify.verify` and the old verifier
(``tests/support/verify_reference.py``) on each, from scratch every time (the message
matching is cached per schedule object, so each run gets a fresh copy), best of
``--repeat``. ``--quick`` skips the 8192-GPU plan. Prints the table and returns its rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZE = 256 << 20


def _plans(quick: bool) -> list[tuple[str, Callable]]:
    from topoplan.cluster import load_cluster, loads_cluster
    from topoplan.cluster.generate import fat_tree, rail_optimized
    from topoplan.planners.mcf import plan_mcf

    def mcf(cluster, **kw):
        return lambda: plan_mcf(cluster(), size=SIZE, check=False, profile="ideal", **kw)

    cases = [("fat 1024 allreduce", mcf(lambda: loads_cluster(fat_tree(128)))),
             ("leaf_spine_1024 allgather",
              mcf(lambda: load_cluster(ROOT / "topologies/leaf_spine_1024.yaml"),
                  collective="allgather"))]
    if not quick:
        cases.append(("rail 8192 allreduce", mcf(lambda: loads_cluster(rail_optimized(1024)))))
    return cases


def _best(check: Callable, schedule, repeat: int) -> tuple[float, object]:
    """The fastest of ``repeat`` runs of ``check`` on fresh copies of ``schedule``."""
    best, report = float("inf"), None
    for _ in range(repeat):
        fresh = dataclasses.replace(schedule)  # a new object: no cached matching
        t = time.perf_counter()
        report = check(fresh)
        best = min(best, time.perf_counter() - t)
        del fresh
    return best, report


def main(argv: list[str] | None = None) -> list[dict]:
    from tests.support.verify_reference import verify_reference
    from topoplan.ir.verify import verify

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="skip the 8192-GPU plan")
    p.add_argument("--repeat", type=int, default=3, help="runs of each verifier, best kept")
    args = p.parse_args(argv)
    print(f"verify seconds, best of {args.repeat}; old: the verifier before the fast engine")
    print(f"{'plan':26s} {'ops':>9s} {'new_s':>7s} {'old_s':>7s} {'old/new':>7s}")
    rows = []
    for name, make in _plans(args.quick):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            schedule = make()
        new_s, new = _best(verify, schedule, args.repeat)
        old_s, old = _best(verify_reference, schedule, args.repeat)
        if new != old:
            raise SystemExit(f"{name}: the verifiers disagree: {new} != {old}")
        row = {"plan": name, "ops": schedule.nops, "new_s": new_s, "old_s": old_s,
               "ratio": old_s / new_s}
        rows.append(row)
        print(f"{name:26s} {row['ops']:9d} {new_s:7.2f} {old_s:7.2f} {row['ratio']:7.1f}",
              flush=True)
        del schedule
    return rows


if __name__ == "__main__":
    main()
