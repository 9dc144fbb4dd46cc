#!/usr/bin/env python
"""auto measured on the job against every candidate it could have run, in one run.

For each setting (4 ranks; MPI and gloo; raw loopback and the emulated testbed of four
clusters) and each size, the ranks run ``PlannedAllreduce(cluster, transport, "auto")``
as a trainer would: its first calls explore (the model's best candidates and the native
collective, timed, agreed over ranks), the later ones run the fastest measured. Then,
in the same processes, rounds time each candidate alone and the online auto side by side
(every rank starts together; the slowest rank's time; median over rounds). Printed per
cell:

- ``online/best``: the online auto's steady-state time over the fastest candidate
  measured in the same run (native included); target <= 1.03;
- ``chosen/best``: the candidate the online auto chose, timed directly, over the fastest
  (the choice's quality without its call path; ``online/best`` over it is the noise);
- ``model/best``: the same for the model's own choice (``TOPOPLAN_AUTO=model``);
- ``vs native``: native's time over the online auto's (above 1: auto is faster);
- ``explore``: the calls exploration took (at most 16) and their time counted in
  steady-state calls of the chosen candidate (planning the candidates, once per size
  class, is not in it; ``plan_and_explore_s`` in the JSON has both);
- ``meas/pred``: the chosen candidate's measured time over its prediction, with the
  calibrated profile on loopback (``TOPOPLAN_CALIBRATE=auto``: the quick calibration
  of this job, cached); target within 15% at 4 ranks on loopback.

The testbed needs root with CAP_NET_ADMIN; without it those rows are skipped with the
reason. Clusters on the testbed are 4-rank cuts (``CUTS``): two_leaf_oversubscribed with
one GPU per host and a 2:1 uplink, unequal_nics with one box of a NIC per GPU and one of
a NIC for two, ddl_two_switch_crossed as shipped, and a 4-GPU NVLink mesh of dgx1_v100.

    PYTHONPATH=. python scripts/bench_online.py [--transports mpi,gloo]
        [--settings loopback,two_leaf_oversubscribed,unequal_nics,ddl_two_switch_crossed,cube]
        [--sizes 64KiB,1MiB,16MiB,64MiB] [--testbed-sizes 64KiB,1MiB,8MiB] [--rounds 9]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from topoplan.units import format_size, parse_size  # noqa: E402

CUTS = {
    "two_leaf_oversubscribed": """
name: two-leaf-oversubscribed-4
switches: [{name: "leaf{i}", count: 2}]
boxes:
  - {name: "h{i}", count: 4, gpus: 1,
     nics: [{switch: "leaf{i//2}", bandwidth: 400 Gbit/s, latency: 1 us}]}
links:
  - {a: leaf0, b: leaf1, bandwidth: 50 GB/s, latency: 0.5 us}
""",
    "unequal_nics": """
name: unequal-nics-4
switches: [{name: ib}]
boxes:
  - name: fast
    gpus: 2
    fabric: {bandwidth: 300 GB/s, latency: 0.5 us}
    nics:
      - {switch: ib, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [0]}
      - {switch: ib, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [1]}
  - name: slow
    gpus: 2
    fabric: {bandwidth: 300 GB/s, latency: 0.5 us}
    nics:
      - {switch: ib, bandwidth: 200 Gbit/s, latency: 1 us, gpus: [0, 1]}
""",
    "cube": """
name: cube-mesh-4
boxes:
  - name: dgx1
    gpus: 4
    gpu_links:
      - {a: 0, b: 1, bandwidth: 25 GB/s, latency: 1 us}
      - {a: 0, b: 2, bandwidth: 25 GB/s, latency: 1 us}
      - {a: 0, b: 3, bandwidth: 25 GB/s, latency: 1 us, count: 2}
      - {a: 1, b: 2, bandwidth: 25 GB/s, latency: 1 us, count: 2}
      - {a: 1, b: 3, bandwidth: 25 GB/s, latency: 1 us}
      - {a: 2, b: 3, bandwidth: 25 GB/s, latency: 1 us, count: 2}
""",
}
FILES = {"ddl_two_switch_crossed": ROOT / "topologies" / "targets" /
         "ddl_two_switch_crossed.yaml"}
SETTINGS = ("loopback", "two_leaf_oversubscribed", "unequal_nics", "ddl_two_switch_crossed",
            "cube")
ONLINE_TARGET = 1.03
PREDICTION_TARGET = 0.15
TAG = "TOPOPLAN-ONLINE "


def cluster_text(setting: str) -> str:
    if setting == "loopback":  # 4 one-GPU boxes on one switch, as bench's default
        return "name: loopback-4\nswitches: [{name: s}]\nboxes:\n  - {name: \"b{i}\", " \
               "count: 4, gpus: 1, nics: [{switch: s, bandwidth: 100 Gbit/s}]}\n"
    if setting in FILES:
        return FILES[setting].read_text()
    return CUTS[setting]


# ---- the ranks ------------------------------------------------------------------------

def _transport(kind: str):
    if kind == "mpi":
        from topoplan.runtime.transports import MPI
        return MPI()
    import torch.distributed as dist

    from topoplan.runtime.transports import Torch
    if "RANK" not in os.environ:  # under mpiexec on loopback
        from topoplan.runtime.mpirun import rank_and_size
        rank, size = rank_and_size()
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("TOPOPLAN_ONLINE_PORT", "29533"),
                          GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", init_method="env://")
    return Torch()


def _timed(transport, fn, calls: int) -> float:
    """The median over ``calls`` calls of the slowest rank's time, each call started by
    every rank together (as a training step's calls are timed: one at a time; the
    online auto measures its candidates the same way)."""
    times = []
    for _ in range(calls):
        transport.barrier()
        began = time.perf_counter()
        fn()
        times.append(transport.allreduce_max(time.perf_counter() - began))
    return statistics.median(times)


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    from topoplan.cluster import loads_cluster
    from topoplan.runtime.choice import size_class
    from topoplan.torch.planned import PlannedAllreduce

    transport = _transport(args.transport)
    cluster = loads_cluster(Path(args.cluster).read_text(), args.cluster)
    planned = PlannedAllreduce(cluster, transport, algorithm="auto", timeout=120)
    planned.pricing  # the profile first (a calibration, once): not exploration's time
    want = float(sum(range(1, transport.size + 1)))
    for size in [parse_size(s) for s in args.sizes.split(",")]:
        x = np.zeros(size // 4, dtype=np.float32)
        began = time.perf_counter()
        wrong = 0
        while planned.choice.exploring(size):
            x[...] = transport.rank + 1
            planned(x)
            wrong += int(np.count_nonzero(x != want))
        wall_s = transport.allreduce_max(time.perf_counter() - began)
        decision = planned.choice.decisions[size_class(size)]
        explore_s = decision.seconds  # the exploring calls' own time (slowest rank's)
        options = [o for o in planned.choice.options(size) if o.failed is None]
        for o in options:
            if o.executor is None:
                o.executor = planned._make_executor(o.schedule)
        x[...] = 0  # timed calls sum zeros: repeated sums of the pattern would overflow
        # calls per timing: about 60 ms of the chosen one, 5 to 25
        one = _timed(transport, lambda: planned(x), 3)
        calls = max(5, min(25, int(0.06 / max(one, 1e-6))))
        methods = {"online": lambda: planned(x),
                   **{o.algorithm: (lambda o=o: o.executor(x)) for o in options}}
        times: dict[str, list[float]] = {name: [] for name in methods}
        order = random.Random(size)
        for _ in range(args.rounds):
            names = list(methods)
            order.shuffle(names)  # the same order on every rank: the same seed
            for name in names:
                times[name].append(_timed(transport, methods[name], calls))
        x[...] = transport.rank + 1
        planned(x)
        wrong += int(np.count_nonzero(x != want))
        median = {k: statistics.median(v) for k, v in times.items()}
        if transport.rank == 0:
            print(TAG + json.dumps({
                "size": size, "chosen": decision.chosen, "model_choice": decision.model_choice,
                "median_s": median, "spread": {k: (max(v) - min(v)) / statistics.median(v)
                                               for k, v in times.items()},
                "predicted_s": {o.algorithm: o.predicted_s for o in options},
                "explore_calls": decision.calls, "explore_s": explore_s,
                "plan_and_explore_s": wall_s,
                "candidates": list(decision.candidates), "wrong": wrong,
                "profile": planned.pricing.name, "profile_source": planned.pricing.source,
                "machine": getattr(planned.pricing.machine, "name", None)}), flush=True)
    if args.transport == "gloo":
        import torch.distributed as dist
        dist.destroy_process_group()


# ---- the launcher -----------------------------------------------------------------------

def run_setting(setting: str, transport: str, sizes: str, rounds: int) -> list[dict] | str:
    """The records of one setting, or why it was skipped."""
    with tempfile.TemporaryDirectory(prefix="topoplan-online-") as tmp:
        path = Path(tmp, f"{setting}.yaml")
        path.write_text(cluster_text(setting))
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker",
                "--transport", transport, "--cluster", str(path), "--sizes", sizes,
                "--rounds", str(rounds)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if setting == "loopback":
            from topoplan.runtime.mpirun import mpiexec
            env_backup = dict(os.environ)
            os.environ.update({"TOPOPLAN_CALIBRATE": "auto", "PYTHONPATH": str(ROOT)})
            try:
                proc = mpiexec(4, argv, timeout=1800)
            finally:
                os.environ.clear()
                os.environ.update(env_backup)
            out, err, code = proc.stdout, proc.stderr, proc.returncode
        else:
            from topoplan.cluster import load_cluster
            from topoplan.testbed import Testbed, capable
            from topoplan.testbed.netns import interrupts_raise
            from topoplan.testbed.run import run_command
            reason = capable()
            if reason is not None:
                return f"no testbed here: {reason}"
            cluster = load_cluster(path)
            log = Path(tmp, "out.txt")
            with interrupts_raise(), Testbed.up(cluster) as bed:
                with open(log, "w") as f:
                    saved = os.dup(1)
                    os.dup2(f.fileno(), 1)
                    try:
                        code = run_command(bed, argv, transport="torch" if transport == "gloo"
                                           else "mpi", timeout=1800)
                    finally:
                        os.dup2(saved, 1)
                        os.close(saved)
            out, err = log.read_text(), ""
        if code != 0:
            return f"failed (exit {code}): {(err or out)[-800:]}"
        return [json.loads(line.removeprefix(TAG)) for line in out.splitlines()
                if line.startswith(TAG)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    parser.add_argument("--transport", default="mpi", help=argparse.SUPPRESS)
    parser.add_argument("--transports", default="mpi,gloo")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--sizes", default="64KiB,1MiB,16MiB,64MiB")
    parser.add_argument("--testbed-sizes", default="64KiB,1MiB,8MiB",
                        help="sizes on the testbed, whose links run at ~1/600 of the "
                             "cluster's (a 64MiB allreduce there takes seconds a call)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    records, misses, skipped = [], [], []
    print(f"{'setting':<24} {'transport':<9} {'size':>6} {'chosen':<13} {'model':<13} "
          f"{'fastest':<13} {'online/best':>11} {'chosen/best':>11} {'model/best':>10} "
          f"{'vs native':>9} {'explore':>14} {'meas/pred':>9}")
    for setting in args.settings.split(","):
        for transport in args.transports.split(","):
            started = time.perf_counter()
            sizes = args.sizes if setting == "loopback" else args.testbed_sizes
            result = run_setting(setting, transport, sizes, args.rounds)
            if isinstance(result, str):
                skipped.append(f"{setting} {transport}: {result}")
                print(f"{setting:<24} {transport:<9} skipped: {result.splitlines()[0]}")
                continue
            for r in result:
                med = r["median_s"]
                candidates = {k: v for k, v in med.items() if k != "online"}
                fastest = min(candidates, key=candidates.get)
                best = candidates[fastest]
                online, model = med["online"] / best, candidates[r["model_choice"]] / best \
                    if r["model_choice"] in candidates else None
                native = candidates.get("native")
                vs_native = native / med["online"] if native else None
                pred = r["predicted_s"].get(r["chosen"])
                mp = candidates[r["chosen"]] / pred if pred else None
                steady = med["online"]
                chosen_best = candidates[r["chosen"]] / best
                explore = f"{r['explore_calls']} = {r['explore_s'] / steady:.0f} calls"
                print(f"{setting:<24} {transport:<9} {format_size(r['size']):>6} "
                      f"{r['chosen']:<13} {r['model_choice']:<13} {fastest:<13} "
                      f"{online:>11.3f} {chosen_best:>11.3f} "
                      f"{'-' if model is None else f'{model:.3f}':>10} "
                      f"{'-' if vs_native is None else f'{vs_native:.2f}x':>9} "
                      f"{explore:>14} {'-' if mp is None else f'{mp:.2f}':>9}")
                r.update(setting=setting, transport=transport, fastest=fastest,
                         online_over_best=online, chosen_over_best=chosen_best, model_over_best=model,
                         native_over_online=vs_native, measured_over_predicted=mp,
                         seconds=time.perf_counter() - started)
                records.append(r)
                where = f"{setting} {transport} {format_size(r['size'])}"
                if online > ONLINE_TARGET:
                    misses.append(f"{where}: online auto {online:.3f}x the fastest "
                                  f"({fastest})")
                if r["wrong"]:
                    misses.append(f"{where}: {r['wrong']} wrong elements")
                if setting == "loopback" and mp is not None and \
                        abs(mp - 1) > PREDICTION_TARGET:
                    misses.append(f"{where}: {r['chosen']} measured/predicted {mp:.2f} "
                                  f"({r['profile']}, {r['profile_source']})")
    if records:
        profiles = sorted({f"{r['setting']} {r['transport']}: {r['profile']} "
                           f"({r['profile_source']}) on {r['machine']}" for r in records})
        print("\npriced with:\n  " + "\n  ".join(profiles))
    if skipped:
        print("\nskipped:\n  " + "\n  ".join(skipped))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    if misses:
        print("\nmissed targets:\n  " + "\n  ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
