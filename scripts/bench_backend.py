#!/usr/bin/env python
"""DDP and FSDP2 step time over the ``topoplan`` torch.distributed backend against the gloo
backend, on the emulated testbed, in one run.

    python scripts/bench_backend.py [--settings ddl_two_switch_crossed,two_leaf_oversubscribed]
        [--hidden 1024] [--batch 8] [--warmup 40] [--steps 8] [--rounds 3] [--json out.json]

For each setting (a 4-rank cluster: ``topologies/targets/ddl_two_switch_crossed.yaml``,
and the 4-rank cut of two_leaf_oversubscribed of ``scripts/bench_online.py``'s ``CUTS``)
it brings the testbed up (one network namespace per rank, links shaped to the cluster
at ``--scale auto``, docs/TESTBED.md) and starts one process per rank. Each rank joins
the default process group over gloo and a second group over all ranks with the
``topoplan`` backend (``dist.new_group(backend="topoplan", pg_options=TopoplanOptions(
cluster=...))``), then trains the same model from the same initial weights on the same
data four ways: DDP over gloo, DDP over topoplan, FSDP2 (``fully_shard`` per layer) over
gloo and over topoplan. After ``--warmup`` steps each (topoplan's ``auto`` measures its
candidates on those calls), ``--rounds`` rounds alternate the four, ``--steps`` steps
each, timed from a barrier to the slowest rank's end; the table has the median step
time of each, the ratio gloo / topoplan (> 1: topoplan faster), what ``auto`` chose with
its predicted and measured time, and test accuracy after training.

The model is an MLP (``--hidden`` wide, three layers: 1.3 M parameters, 5.2 MiB of
fp32 gradients at 1024) on a synthetic 10-class problem, with a small batch: its step
is dominated by communication on the testbed's links (at 2048, 18 MiB, a gloo step on
``ddl_two_switch_crossed`` takes seconds: the narrow link runs at 0.25 Gbit/s there). Needs root (network
namespaces); without it each setting is skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = ("ddl_two_switch_crossed", "two_leaf_oversubscribed")
TAG = "TOPOPLAN-BACKEND "
MODES = ("ddp", "fsdp")
BACKENDS = ("gloo", "topoplan")
CLASSES = 10
FEATURES = 256


def cluster_text(setting: str) -> str:
    if setting == "ddl_two_switch_crossed":
        return (ROOT / "topologies" / "targets" / "ddl_two_switch_crossed.yaml").read_text()
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_online import CUTS  # the 4-rank cuts the other testbed benches use
    return CUTS[setting]


# ---- the ranks ------------------------------------------------------------------------
def _data(seed: int, n: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(7))
    x = torch.randn(n, FEATURES, generator=g)
    return x, (x @ teacher).argmax(1)


def _model(hidden: int):
    import torch
    import torch.nn as nn
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def _wrap(mode: str, hidden: int, group):
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(hidden)
    if mode == "ddp":
        return DDP(model, process_group=group)
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from topoplan.torch import TopoplanOptions

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = {"gloo": dist.new_group(backend="gloo"),
              "topoplan": dist.new_group(backend="topoplan", pg_options=TopoplanOptions(
                  cluster=args.cluster, algorithm="auto"))}
    runs = {(m, b): _wrap(m, args.hidden, groups[b]) for m in MODES for b in BACKENDS}
    opts = {k: torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            for k, model in runs.items()}
    step_of = {k: 0 for k in runs}

    def step(key) -> None:
        x, y = _data(100000 * step_of[key] + rank, args.batch)
        step_of[key] += 1
        opts[key].zero_grad()
        F.cross_entropy(runs[key](x), y).backward()
        opts[key].step()

    def timed(key, steps: int) -> float:
        dist.barrier()
        began = time.perf_counter()
        for _ in range(steps):
            step(key)
        took = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return float(took.item()) / steps

    for key in runs:
        timed(key, args.warmup)
    times: dict = {k: [] for k in runs}
    for _ in range(args.rounds):
        for key in runs:
            times[key].append(timed(key, args.steps))
    x, y = _data(999, 2000)
    records = []
    pg = groups["topoplan"]
    for (mode, backend), model in runs.items():
        with torch.no_grad():
            accuracy = float((model(x).argmax(1) == y).float().mean())
        record = {"setting": args.setting, "mode": mode, "backend": backend,
                  "step_ms": [1e3 * t for t in times[(mode, backend)]],
                  "median_ms": 1e3 * statistics.median(times[(mode, backend)]),
                  "accuracy": accuracy, "steps": step_of[(mode, backend)]}
        records.append(record)
    records.append({"setting": args.setting, "chosen": _chosen(pg)
                    + [{"collective": None, "class": None, "chosen": None,
                        "line": f"native collectives started on the caller's thread: "
                                f"{pg.direct_calls}"}]})
    if rank == 0:
        for record in records:
            print(TAG + json.dumps(record), flush=True)
    dist.destroy_process_group()


def _chosen(pg) -> list[dict]:
    """What auto decided on the topoplan group: per collective and size class, the chosen
    candidate's predicted and measured time."""
    out = []
    choices = []
    if pg.allreduce_planned is not None and pg.allreduce_planned.choice is not None:
        choices.append(("allreduce", pg.allreduce_planned.choice))
    if pg.collectives is not None:
        choices += [(key[1], choice) for key, choice in pg.collectives.choices.items()]
    for what, choice in choices:
        health = choice.health
        out.append({"collective": what, "class": None, "chosen": None,
                    "line": f"{what}: {choice.calls} calls, {len(choice.history)} decisions"
                            + (f", {health.fits} link-health fits, "
                               f"{len(health.history)} changes" if health is not None
                               else ", link health off")})
        for k, decision in sorted(choice.decisions.items()):
            record = decision.to_dict()
            out.append({"collective": what, "class": k, "chosen": record.get("chosen"),
                        "line": decision.line(what)})
    return out


# ---- the launcher -----------------------------------------------------------------------
def run_setting(setting: str, args: argparse.Namespace) -> list[dict] | str:
    from topoplan.cluster import load_cluster
    from topoplan.testbed import Testbed, capable
    from topoplan.testbed.netns import interrupts_raise
    from topoplan.testbed.run import run_command

    reason = capable()
    if reason is not None:
        return f"no testbed here: {reason}"
    with tempfile.TemporaryDirectory(prefix="topoplan-backend-") as tmp:
        path = Path(tmp, f"{setting}.yaml")
        path.write_text(cluster_text(setting))
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", "--setting", setting,
                "--cluster", str(path), "--hidden", str(args.hidden), "--batch",
                str(args.batch), "--warmup", str(args.warmup), "--steps", str(args.steps),
                "--rounds", str(args.rounds)]
        log = Path(tmp, "out.txt")
        os.environ["OMP_NUM_THREADS"] = "1"
        with interrupts_raise(), Testbed.up(load_cluster(path)) as bed:
            with open(log, "w") as f:
                saved = os.dup(1)
                os.dup2(f.fileno(), 1)
                try:
                    code = run_command(bed, argv, transport="torch", timeout=3600)
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
            scale = getattr(bed, "scale", None)
        out = log.read_text()
        if code != 0:
            return f"failed (exit {code}): {out[-1500:]}"
        records = [json.loads(line.removeprefix(TAG)) for line in out.splitlines()
                   if line.startswith(TAG)]
        for r in records:
            r["scale"] = scale
        return records


def table(records: list[dict]) -> str:
    rows = ["| setting (4 ranks, testbed) | model | gloo ms/step | topoplan ms/step | "
            "gloo / topoplan | accuracy gloo / topoplan |", "|---|---|---:|---:|---:|---:|"]
    by = {(r["setting"], r["mode"], r["backend"]): r for r in records if "mode" in r}
    for setting in dict.fromkeys(r["setting"] for r in records):
        for mode in MODES:
            g, t = by.get((setting, mode, "gloo")), by.get((setting, mode, "topoplan"))
            if g is None or t is None:
                continue
            name = {"ddp": "DDP", "fsdp": "FSDP2"}[mode]
            rows.append(f"| {setting} | {name} | {g['median_ms']:.1f} | {t['median_ms']:.1f} | "
                        f"**{g['median_ms'] / t['median_ms']:.2f}x** | "
                        f"{100 * g['accuracy']:.1f}% / {100 * t['accuracy']:.1f}% |")
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the records here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--setting", default=None, help=argparse.SUPPRESS)
    p.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    records: list[dict] = []
    for setting in args.settings.split(","):
        got = run_setting(setting, args)
        if isinstance(got, str):
            print(f"{setting}: skipped: {got}", file=sys.stderr)
            continue
        records += got
        for r in got:
            if "chosen" in r:
                for c in r["chosen"]:
                    print(f"{setting}: {c['line']}", file=sys.stderr)
    print(table(records))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
