#!/usr/bin/env python
"""A link slows mid-run: link health finds it and ``auto`` re-plans around it, in one run.

On the emulated cluster (root; 4 ranks; MPI and gloo), each rank runs
``PlannedAllreduce(cluster, transport, "auto")`` as a trainer would. After its choice
settled and a warm-up, rank 0 slows one link to ``--factor`` of its rate with real ``tc``
(:func:`topoplan.testbed.degrade.apply_degrades`, as ``topoplan testbed degrade`` does) and the calls go on. Printed per setting, from
one run (the slowest rank's time per call, every call started together; medians):

- ``found``: calls after the fault until link health changed the plan (target <= 20),
  and what it found; ``-`` when the plan running at the fault does not cross the link
  (the old plan is not 15% slower after it: nothing to find);
- ``before`` / ``after``: the steady time before the fault and after re-planning, with
  what ran;
- ``known``: a plan made with the fault known from the start (``auto`` on the cluster
  with that link at the factor, measured the same way), and ``known/after`` (target
  >= 0.9); every plan is rank 0's, broadcast (``share=``);
- ``old`` and ``native``: the plan from before the fault and the transport's own
  allreduce, timed after it (they stay slow);
- ``pred``: the re-planned choice's predicted time with the measured link rate;
- ``check``: the overhead of link health's checks while nothing is wrong: the chosen
  plan's calls through ``auto`` over the same executor called directly (interleaved).

    PYTHONPATH=. python scripts/bench_degrade.py [--transports mpi,gloo]
        [--settings two_leaf_oversubscribed,unequal_nics,cube] [--size 2MiB]
        [--factor 0.25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_online import CUTS, _transport  # noqa: E402

from topoplan.units import format_size, parse_size  # noqa: E402

#: The link slowed on each cluster: the uplink, the one NIC of a box of two GPUs, an
#: NVLink of the mesh (plans can go around it).
LINKS = {"two_leaf_oversubscribed": "leaf0-leaf1", "unequal_nics": "slow/nic0",
         "cube": "dgx1/gpu0-gpu1"}
SETTINGS = tuple(LINKS)
TAG = "TOPOPLAN-DEGRADE "
FOUND_TARGET = 20
KNOWN_TARGET = 0.9


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    from topoplan.cluster import loads_cluster
    from topoplan.cluster.links import degraded
    from topoplan.torch.planned import PlannedAllreduce

    logging.basicConfig(level=os.environ.get("TOPOPLAN_LOG", "WARNING"), format="%(message)s")
    transport = _transport(args.transport)
    rank = transport.rank
    cluster = loads_cluster(Path(args.cluster).read_text(), args.cluster)
    size = parse_size(args.size)
    x = np.zeros(size // 4, dtype=np.float32)
    want = float(sum(range(1, transport.size + 1)))
    wrong = 0

    def timed(fn) -> float:
        transport.barrier()
        began = time.perf_counter()
        fn()
        return transport.allreduce_max(time.perf_counter() - began)

    def settle(planned, extra: int) -> list[tuple[float, str]]:
        """Calls until the choice has settled, then ``extra`` more: (time, what ran)."""
        nonlocal wrong
        out = []
        quiet = 0
        while quiet < extra:
            x[...] = rank + 1
            t = timed(lambda: planned(x))
            wrong += int(np.count_nonzero(x != want))
            out.append((t, planned.chosen.get(size, "?")))
            quiet = 0 if planned.choice.exploring(size) else quiet + 1
            if len(out) > 400:
                break
        return out

    if args.transport == "mpi":
        from mpi4py import MPI

        def share(obj):
            return MPI.COMM_WORLD.bcast(obj, root=0)
    else:
        import torch.distributed as dist

        def share(obj):
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]

    # share: rank 0's plans on every rank (the ranks never plan apart).
    planned = PlannedAllreduce(cluster, transport, algorithm="auto", timeout=120,
                               share=share)
    pricing = planned.pricing
    settle(planned, 12)
    before_name = planned.chosen[size]
    option = next(o for o in planned.choice.options(size) if o.algorithm == before_name)
    # The checks' overhead: auto's call path over the chosen executor called directly.
    x[...] = 0
    via, direct = [], []
    for _ in range(6):
        via.append(timed(lambda: planned(x)))
        direct.append(timed(lambda: option.executor(x)))
    before_s = statistics.median(via)
    health = planned.choice.health
    transport.barrier()
    if rank == 0:
        from topoplan.testbed.degrade import apply_degrades
        apply_degrades(os.environ["TOPOPLAN_DEGRADE_STATE"], {args.link: args.factor})
    transport.barrier()
    fault_at = planned.choice.calls
    after = settle(planned, 12)
    found = next((h for h in health.history), None) if health is not None else None
    found_after = None if found is None else found["call"] - fault_at
    after_s = statistics.median(t for t, _ in after[-8:])
    after_name = after[-1][1]
    after_option = next((o for o in planned.choice.options(size)
                         if o.algorithm == after_name), None)
    x[...] = 0
    old_s = statistics.median(timed(lambda: option.executor(x)) for _ in range(4))
    native_s = statistics.median(timed(lambda: transport.native_allreduce(x))
                                 for _ in range(4))
    slow = {args.link: args.factor}
    known = PlannedAllreduce(degraded(cluster, slow), transport, algorithm="auto",
                             timeout=120, profile=pricing.profile, share=share,
                             machine=None if pricing.machine is None
                             else degraded(pricing.machine, slow))
    known_calls = settle(known, 12)
    known_s = statistics.median(t for t, _ in known_calls[-8:])
    if rank == 0:
        print(TAG + json.dumps({
            "size": size, "link": args.link, "factor": args.factor,
            "before": before_name, "before_s": before_s,
            "check_overhead": statistics.median(via) / statistics.median(direct),
            "found_after_calls": found_after, "found": found,
            "history": health.history if health is not None else [],
            "after": after_name, "after_s": after_s,
            "after_predicted_s": None if after_option is None else after_option.predicted_s,
            "old_s": old_s, "native_s": native_s,
            "known": known_calls[-1][1], "known_s": known_s,
            "calls_after_fault": len(after), "wrong": wrong,
            "profile": pricing.name, "machine": getattr(pricing.machine, "name", None)}),
            flush=True)
    if args.transport == "gloo":
        import torch.distributed as dist
        dist.destroy_process_group()


def run_setting(setting: str, transport: str, size: str, factor: float) -> dict | str:
    from topoplan.cluster import load_cluster
    from topoplan.testbed import Testbed, capable
    from topoplan.testbed.netns import interrupts_raise
    from topoplan.testbed.run import run_command
    reason = capable()
    if reason is not None:
        return f"no testbed here: {reason}"
    with tempfile.TemporaryDirectory(prefix="topoplan-degrade-") as tmp:
        path = Path(tmp, f"{setting}.yaml")
        path.write_text(CUTS[setting])
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--transport",
                transport, "--cluster", str(path), "--size", size, "--factor", str(factor),
                "--link", LINKS[setting]]
        cluster = load_cluster(path)
        log = Path(tmp, "out.txt")
        with interrupts_raise(), Testbed.up(cluster) as bed:
            os.environ["TOPOPLAN_DEGRADE_STATE"] = str(bed.state)
            with open(log, "w") as f:
                saved = os.dup(1)
                os.dup2(f.fileno(), 1)
                try:
                    code = run_command(bed, argv, transport="torch" if transport == "gloo"
                                       else "mpi", timeout=1800)
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
        out = log.read_text()
        if code != 0:
            return f"failed (exit {code}): {out[-1500:]}"
        rows = [json.loads(line.removeprefix(TAG)) for line in out.splitlines()
                if line.startswith(TAG)]
        if not rows:
            return f"no record: {out[-1500:]}"
        rows[0]["log"] = [line for line in out.splitlines() if "link health" in line]
        return rows[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--link", help=argparse.SUPPRESS)
    parser.add_argument("--transport", default="mpi", help=argparse.SUPPRESS)
    parser.add_argument("--transports", default="mpi,gloo")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--size", default="2MiB")
    parser.add_argument("--factor", type=float, default=0.25)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    records, misses, skipped = [], [], []

    def ms(s: float | None) -> str:
        return "-" if s is None else f"{s * 1e3:.1f}"

    print(f"{'setting':<24} {'transport':<9} {'link':<14} {'found':>5} {'before':>16} "
          f"{'after':>22} {'pred':>6} {'known':>16} {'known/after':>11} {'old':>7} "
          f"{'native':>7} {'check':>6}")
    for setting in args.settings.split(","):
        for transport in args.transports.split(","):
            r = run_setting(setting, transport, args.size, args.factor)
            if isinstance(r, str):
                skipped.append(f"{setting} {transport}: {r}")
                print(f"{setting:<24} {transport:<9} skipped: {r.splitlines()[0]}")
                continue
            ratio = r["known_s"] / r["after_s"]
            # The plan running at the fault does not cross the link: nothing to find.
            r["slowed"] = r["old_s"] > 1.15 * r["before_s"]
            print(f"{setting:<24} {transport:<9} {r['link']:<14} "
                  f"{'-' if not r['slowed'] else '?' if r['found_after_calls'] is None else r['found_after_calls']:>5} "
                  f"{ms(r['before_s']) + ' ' + r['before']:>16} "
                  f"{ms(r['after_s']) + ' ' + r['after']:>22} {ms(r['after_predicted_s']):>6} "
                  f"{ms(r['known_s']) + ' ' + r['known']:>16} {ratio:>11.2f} "
                  f"{ms(r['old_s']):>7} {ms(r['native_s']):>7} {r['check_overhead']:>6.3f}")
            for line in r["log"]:
                print("    " + line.strip())
            r.update(setting=setting, transport=transport, known_over_after=ratio)
            records.append(r)
            where = f"{setting} {transport}"
            if r["slowed"] and (r["found_after_calls"] is None
                                or r["found_after_calls"] > FOUND_TARGET):
                misses.append(f"{where}: found after {r['found_after_calls']} calls")
            if ratio < KNOWN_TARGET:
                misses.append(f"{where}: after re-planning {ratio:.2f}x the plan made "
                              "knowing the fault")
            if r["wrong"]:
                misses.append(f"{where}: {r['wrong']} wrong elements")
    print(f"\nsize {format_size(parse_size(args.size))}, links at {args.factor:g} of their "
          "rate; times in ms (the slowest rank, median)")
    if skipped:
        print("\nskipped:\n  " + "\n  ".join(skipped))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    if misses:
        print("\nmissed targets:\n  " + "\n  ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
