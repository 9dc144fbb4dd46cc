"""Run under ``mpiexec -n 4``: train digits on 1, 2 and 4 ranks at one global batch size.

Every configuration runs scripts/train.py's ``train()`` with the DistributedOptimizer
over the topoplan executor and the MPI transport: 2 ranks on each half of COMM_WORLD
(fp32 sync on one half, fp16 + double buffering on the other, side by side), then 4
ranks fp32 sync, then 4 ranks fp16 + double buffering. Rank 0 prints one JSON list of
result records; tests/test_torch_train.py compares them with a 1-rank run.

Usage: mpiexec -n 4 python tests/mpi_train_accuracy.py [--epochs 12]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from mpi4py import MPI

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("topoplan_train_script", ROOT / "scripts" / "train.py")
train_script = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = train_script   # dataclasses look their module up there
spec.loader.exec_module(train_script)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=12)
    ours = p.parse_args()
    world = MPI.COMM_WORLD
    if world.size != 4:
        print("run me with mpiexec -n 4", file=sys.stderr)
        return 2
    # Adam at lr 5e-3 with cosine decay for 12 epochs: the decay lets runs with one-step-stale
    # gradients settle (at a constant rate they trail by 1-6 points on this data set).
    common = ["--model", "mlp", "--optimizer", "adam", "--lr", "0.005", "--warmup-epochs", "0",
              "--schedule", "cosine", "--epochs", str(ours.epochs), "--batch-size", "64", "--no-progress"]
    fast = ["--fp16-allreduce", "--double-buffering"]
    half = world.Split(color=world.rank // 2, key=world.rank)
    phases = [
        # one (communicator, algorithm, flags) per rank; the two halves train side by side
        [(half, "ring", []) if world.rank < 2 else (half, "rhd", fast + ["--fusion-threshold", "4KiB"])],
        [(world, "ring", [])],                               # ddl_two_switch.yaml: the DDL ring
        [(world, "hierarchical", fast + ["--fusion-threshold", "8KiB"])],
    ]
    results = []
    for phase in phases:
        comm, algorithm, extra = phase[0]
        args = train_script.build_parser().parse_args(common + ["--algorithm", algorithm] + extra)
        me = train_script.World("mpi", comm.Get_rank(), comm.Get_size(), comm)
        record = train_script.train(args, me)
        mine = record if comm.Get_rank() == 0 else None
        results += [r for r in world.gather(mine, root=0) or [] if r is not None]
    if world.rank == 0:
        print(json.dumps(results), flush=True)
    half.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
