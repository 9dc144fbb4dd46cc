"""MSCCL round trip on the shipped topologies: plan, export, check, import, simulate.

For every topology, collective, planner and size: plan (``nccl`` profile), export as MSCCL XML
(:func:`topoplan.interop.msccl.export_msccl`, which runs the independent checker
and the executor's limits), write and re-read the XML, import it
(:func:`topoplan.interop.msccl.import_msccl`, verified), and simulate the import
against the original plan on the same cluster. The ratio of the two simulated times is
the round trip's fidelity (1.0000: the same plan came back); the thread block shape is
what the executor would run. A plan too big for the executor's limits is planned again
with the plan-size options (``--max-chunks``) and the row says which were needed. Each
case runs in its own process under ``--timeout``; a case that runs out says so.
``--collectives allgather,reduce_scatter`` (default allreduce) takes each planner that
plans the collective; the others are left out.

    PYTHONPATH=. python scripts/bench_msccl.py [--topologies ddl_two_switch dgx1_v100 ...]
        [--collectives allreduce,allgather,reduce_scatter] [--planners ring tree ...]
        [--sizes 1MiB 256MiB] [--timeout 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from topoplan.units import format_size, parse_size  # noqa: E402

TOPOLOGIES = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
PLANNERS = ["ring", "ring-topo", "tree", "rhd", "hierarchical", "mcf"]
MAX_CHUNKS = [None, 256, 64, 16]   # plan-size options tried in turn when a plan does not fit


def run_case(topology: str, planner: str, size: int, collective: str = "allreduce") -> dict:
    import topoplan
    from topoplan.cluster import load_cluster
    from topoplan.errors import PlannerError, TopoplanError
    from topoplan.interop.msccl import export_msccl, import_msccl, loads_msccl, to_xml

    cluster = load_cluster(ROOT / "topologies" / f"{topology}.yaml")
    row: dict = {"topology": topology, "ranks": cluster.nranks, "planner": planner,
                 "size": size, "collective": collective}
    for cap in MAX_CHUNKS:
        options = {} if cap is None else {"max_chunks": cap}
        try:
            schedule = topoplan.plan(cluster, algorithm=planner, size=size,
                                     collective=collective, **options)
        except TopoplanError as exc:  # this planner cannot shrink that far
            row["error"] = row.get("error", "") + f" [--max-chunks {cap}: {exc}]"
            continue
        row["options"] = "" if cap is None else f"--max-chunks {cap}"
        row["ops"] = schedule.nops
        start = time.perf_counter()
        try:
            result = export_msccl(schedule)  # checked, within the limits
        except PlannerError as exc:
            row["error"] = row.get("error", "") + (f" [--max-chunks {cap}] " if cap else "") \
                + f"export: {exc}"
            continue
        row["export_s"] = time.perf_counter() - start
        row.pop("error", None)
        break
    else:
        return row
    algo = result.algo
    xml = to_xml(algo)
    start = time.perf_counter()
    back = import_msccl(loads_msccl(xml), check=False)  # export has checked it
    row["import_s"] = time.perf_counter() - start
    row["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row.update(xml_mib=len(xml) / 2**20, channels=algo.nchannels, max_tbs=result.max_tbs,
               max_steps=result.max_steps, fused=result.fused,
               unfused="separate send and receive thread blocks" in " ".join(result.notes),
               rounded=any("rounded" in n for n in result.notes),
               steps=(back.nsteps, schedule.nsteps), coll=algo.coll)
    assert back.collective == collective, (back.collective, collective)
    t0 = topoplan.simulate(cluster, schedule, size=size, profile="ideal").time_s
    t1 = topoplan.simulate(cluster, back, size=size, profile="ideal").time_s
    row["ratio"] = t1 / t0
    return row


def _child(queue, args):
    try:
        queue.put(run_case(*args))
    except Exception as exc:  # reported in the table, not raised
        queue.put({"error": f"{type(exc).__name__}: {exc}"})


def run_with_timeout(args: tuple, timeout: float) -> dict:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, args))
    start = time.perf_counter()
    proc.start()
    try:
        row = queue.get(timeout=timeout)
    except Exception:
        proc.kill()
        row = {"error": f"timed out after {timeout:.0f} s"}
    proc.join()
    row.setdefault("topology", args[0])
    row.setdefault("planner", args[1])
    row.setdefault("size", args[2])
    row.setdefault("collective", args[3])
    row["wall_s"] = time.perf_counter() - start
    return row


def _fmt(row: dict) -> list[str]:
    if "ratio" not in row:
        return [row["topology"], str(row.get("ranks", "")), row["collective"], row["planner"],
                format_size(row["size"]), row.get("options", ""), "", "", "", "", "", "",
                "", "", "", f"{row['wall_s']:.0f}", row.get("error", "").strip()[:300]]
    flags = ",".join(f for f, on in (("unfused", row["unfused"]), ("rounded", row["rounded"]))
                     if on)
    return [row["topology"], str(row["ranks"]), row["collective"], row["planner"],
            format_size(row["size"]),
            row["options"], str(row["ops"]),
            f"{row['channels']}x{row['max_tbs']}x{row['max_steps']}", str(row["fused"]),
            f"{row['xml_mib']:.1f}", f"{row['export_s']:.2f}", f"{row['import_s']:.2f}",
            "%d/%d" % tuple(row["steps"]), f"{row['ratio']:.4f}", f"{row['peak_mib']:.0f}",
            f"{row['wall_s']:.0f}", flags]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=TOPOLOGIES)
    parser.add_argument("--collectives", default="allreduce",
                        help="comma-separated: allreduce, allgather, reduce_scatter")
    parser.add_argument("--planners", nargs="+", default=PLANNERS)
    parser.add_argument("--sizes", nargs="+", default=["1MiB", "256MiB"])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--json", action="store_true", help="one JSON row per case")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    from topoplan.ir.collectives import COLLECTIVES
    from topoplan.planners import planners_for

    collectives = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        parser.error(f"--collectives: unknown {', '.join(unknown)}; known: "
                     f"{', '.join(COLLECTIVES)}")
    header = ["topology", "ranks", "collective", "planner", "size", "options", "ops",
              "chan x tbs x steps", "fused", "xml MiB", "export s", "import s",
              "steps imp/plan", "sim imp/plan", "peak MiB", "wall s", "notes"]
    if not args.json:
        print(" | ".join(header), flush=True)
    failures = 0
    for topology in args.topologies:
        for collective in collectives:
            for planner in planners_for(collective, args.planners):
                for size in sizes:
                    row = run_with_timeout((topology, planner, size, collective),
                                           args.timeout)
                    failures += "ratio" not in row
                    print(json.dumps(row) if args.json else " | ".join(_fmt(row)),
                          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
