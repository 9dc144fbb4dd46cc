"""Record, or compare against a record, what the planners make on every shipped topology.

For each topology in ``topologies/``, planner, size and cost profile: the schedule's op
count, a digest of its ops and chunks, its deterministic ``meta`` (wall-clock timings
left out) and the simulated time under that profile. A refactoring that must not change
behaviour records before and compares after::

    PYTHONPATH=. python scripts/plan_snapshot.py --save /tmp/before.json
    ... refactor ...
    PYTHONPATH=. python scripts/plan_snapshot.py --check /tmp/before.json

``--check`` exits 1 naming every case that differs. On ``leaf_spine_1024`` only the
planners meant for that scale run (``mcf``, ``hierarchical``; ``--all`` runs the flat
ones too, minutes each).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLANNERS = ("ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf")
LARGE = ("mcf", "hierarchical")
SIZES = (1 << 20, 256 << 20)
PROFILES = ("ideal", "nccl")
#: meta keys that hold wall-clock seconds (they differ from run to run).
WALL_CLOCK = {"solve_s", "materialize_s", "verify_s", "plan_s", "trees_s"}


def digest(schedule: Any) -> str:
    """sha256 of the schedule's collective, chunks and every rank's ops, in order."""
    h = hashlib.sha256()
    h.update(f"{schedule.collective} {schedule.nranks} {list(schedule.chunks)!r}".encode())
    for program in schedule.ranks:
        h.update(f"|{program.rank}".encode())
        for step in program.steps:
            h.update(b";")
            h.update(repr([(op.kind.value, op.peer, op.chunk, op.reduce, op.count)
                           for op in step]).encode())
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """``value`` as JSON data (numpy scalars and tuples become numbers and lists)."""
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item")
                                 else str(o)))


def case(cluster: Any, algorithm: str, size: int, profile: str) -> dict[str, Any]:
    import topoplan

    t0 = time.perf_counter()
    schedule = topoplan.plan(cluster, algorithm, size=size, profile=profile)
    report = topoplan.simulate(cluster, schedule, size, profile=profile)
    meta = {k: v for k, v in schedule.meta.items() if k not in WALL_CLOCK}
    return {"ops": schedule.nops, "time_s": float(report.time_s), "digest": digest(schedule),
            "meta": _plain(meta), "wall_s": round(time.perf_counter() - t0, 2)}


def run(only: list[str] | None, every: bool) -> dict[str, Any]:
    from topoplan.cluster import load_cluster

    out: dict[str, Any] = {}
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        if only and path.stem not in only:
            continue
        cluster = load_cluster(path)
        planners = PLANNERS if every or cluster.nranks <= 256 else LARGE
        for algorithm in planners:
            for size in SIZES:
                for profile in PROFILES:
                    key = f"{path.stem} {algorithm} {size} {profile}"
                    try:
                        out[key] = case(cluster, algorithm, size, profile)
                    except Exception as exc:  # an error is a result too: record it
                        out[key] = {"error": f"{type(exc).__name__}: {exc}"}
                    row = out[key]
                    print(f"{key}: " + (row["error"] if "error" in row else
                                        f"{row['ops']} ops, {row['time_s']:.9g} s "
                                        f"({row['wall_s']} s)"), flush=True)
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The differences, one line each (wall time left out)."""
    diffs = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            diffs.append(f"{key}: only {'after' if a is None else 'before'}")
            continue
        for field in sorted((set(a) | set(b)) - {"wall_s"}):
            if a.get(field) != b.get(field):
                diffs.append(f"{key}: {field} {a.get(field)!r} -> {b.get(field)!r}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", metavar="JSON", help="record the cases into this file")
    group.add_argument("--check", metavar="JSON", help="compare the cases with this record")
    parser.add_argument("--only", nargs="*", metavar="TOPOLOGY", help="these topologies only")
    parser.add_argument("--all", action="store_true",
                        help="flat planners on leaf_spine_1024 too (slow)")
    args = parser.parse_args(argv)
    rows = run(args.only, args.all)
    if args.save:
        Path(args.save).write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        print(f"{len(rows)} cases saved to {args.save}")
        return 0
    before = json.loads(Path(args.check).read_text())
    if args.only:
        before = {k: v for k, v in before.items() if k.split()[0] in args.only}
    diffs = compare(before, rows)
    for line in diffs:
        print(line)
    print(f"{len(rows)} cases, {len(diffs)} differences from {args.check}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
