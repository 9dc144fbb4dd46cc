#!/usr/bin/env python
"""Overlap with a model that registers its layers out of forward order: packed after
backward, overlapped in the first layout (reverse parameter order), and overlapped with
the layout DistributedOptimizer makes after the first step from backward's real order.

    topoplan testbed run topologies/ddl_two_switch.yaml --scale 1/240 -- \\
        .venv/bin/python scripts/bench_relayout.py [--steps 12] [--repeat 3]   # as root
    topoplan launch -n 4 -- .venv/bin/python scripts/bench_relayout.py         # loopback

Every rank runs the three modes in turn, ``--repeat`` times, on the ``deep`` model of
scripts/train.py with its classifier registered first (so reverse parameter order puts
the convolutions' buffer ahead of the classifier's, which backward fills first), Adam,
1 MiB buffers, ``--batch`` samples a rank; rank 0 prints ms per step (the first two
steps of each run not counted) and each mode's ratio to packed, median over the runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent


def load_train():
    spec = importlib.util.spec_from_file_location("topoplan_train_script", ROOT / "scripts" / "train.py")
    train = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = train
    spec.loader.exec_module(train)
    return train


class HeadFirst(nn.Module):
    """scripts/train.py's ``deep`` with the classifier registered before the convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc2 = nn.Linear(256, 10)
        self.fc1 = nn.Linear(64 * 8 * 8, 256)
        self.conv1 = nn.Conv2d(1, 64, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(64, 64, 3, padding=1) for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODES = ("packed after backward", "overlapped, first layout", "overlapped, laid out again")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch", type=int, default=256, help="samples a rank per step")
    p.add_argument("--cluster", default=str(ROOT / "topologies" / "ddl_two_switch.yaml"))
    args = p.parse_args()
    from topoplan.torch import DistributedOptimizer

    train = load_train()
    world = train.detect_world("mpi")
    torch.set_num_threads(1)
    cluster = train.pick_cluster(args.cluster, world.size)
    x, y, _, _ = train.load_data()
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    first: dict[str, str] = {}
    for _ in range(args.repeat):
        for mode in MODES:
            torch.manual_seed(0)
            model = HeadFirst()
            opt = DistributedOptimizer(
                torch.optim.Adam(model.parameters(), lr=0.005),
                train.make_allreduce(world, cluster, "auto", 60),
                named_parameters=model.named_parameters(), fusion_threshold=1 << 20,
                overlap=mode != MODES[0])
            if mode == MODES[1]:
                opt._overlap.made = None  # keep the first layout
            steps = []
            gen = torch.Generator().manual_seed(world.rank)
            for _step in range(args.steps):
                world.barrier()
                t0 = time.perf_counter()
                idx = torch.randperm(len(x), generator=gen)[:args.batch]
                opt.zero_grad()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()
                steps.append(time.perf_counter() - t0)
            opt.close()
            times[mode].append(statistics.mean(steps[2:]) * 1e3)
            first[mode] = opt.groups[0].names[0]
    if world.rank == 0:
        base = times[MODES[0]]
        print(f"{'mode':<28} {'first buffer starts with':<26} {'ms/step (runs)':<22} vs packed")
        for mode in MODES:
            ratio = statistics.median(b / t for b, t in zip(base, times[mode]))
            runs = " ".join(f"{t:.0f}" for t in times[mode])
            print(f"{mode:<28} {first[mode]:<26} {runs:<22} {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
