#!/usr/bin/env python
"""Data-parallel training of a small CNN on scikit-learn's digits with topoplan allreduce.

Launch with MPI (DistributedOptimizer over the MPI transport) or torch.distributed.run
(DDP with the topoplan comm hook over gloo); ``topoplan launch`` starts either::

    topoplan launch -n 4 -- python scripts/train.py --algorithm ring --fp16-allreduce --double-buffering
    topoplan launch -n 2 --transport torch -- python scripts/train.py --algorithm ring
    python scripts/train.py                       # one process, no communication

The global batch (--batch-size) is split evenly over the ranks, so N ranks take the
same optimisation steps as one rank on the same data (up to float round-off and the
fp16 / double-buffering approximations). The last line reads, e.g.::

    train: 4 ranks mpi/optimizer ring fp16 dbuf: 5234 samples/s, test accuracy 97.50%,
    compute 1.20 s, communication 0.80 s (exposed 0.10 s), wall 2.1 s

"communication" is the wall time with gradients in flight, overlapped with backward or
not; "exposed" the part the training loop waited for (under DDP, which waits inside
backward, that part is not measured and the line says so).

``--json`` prints that line as one JSON object instead (scripts/bench_train.py reads it).
"""

from __future__ import annotations

import argparse
import json
import re
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from topoplan.errors import TopoplanError  # noqa: E402
from topoplan.units import parse_size  # noqa: E402

ALGORITHMS = ("auto", "mcf", "ring", "ring-topo", "tree", "rhd", "hierarchical", "native")


# -- model and data ---------------------------------------------------------------------------
class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, a max-pool and two linear layers for 8x8 digits (~38k params)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DigitsMLP(nn.Module):
    """64 -> 128 -> 64 -> 10 with ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64),
                                 nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DigitsWide(nn.Module):
    """VGG's shape in small: two 64-channel 3x3 convolutions at full resolution (most of
    the compute, few parameters) under a 4096 -> 256 -> 10 classifier (most of the
    ~1.1M parameters). Backward produces the classifier's large gradients first and then
    spends most of its time in the convolutions: communication comparable to compute,
    and room to overlap them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DigitsDeep(nn.Module):
    """``wide`` with four more 64-channel 3x3 convolutions under the classifier: 10.5M
    multiply-adds an image for 1.2M parameters (``wide``: 3.4M), still 15x less compute
    per parameter than ResNet-50 (4.1G for 25.6M). Backward makes the classifier's 4 MiB
    gradient first and then spends three times ``wide``'s compute in the convolutions:
    room to hide that gradient's allreduce even where communication costs CPU time.
    Layers are registered in forward order: the optimizer lays buffers out in reverse."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 64, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(64, 64, 3, padding=1) for _ in range(5))
        self.fc1 = nn.Linear(64 * 8 * 8, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


MODELS = {"cnn": DigitsCNN, "mlp": DigitsMLP, "wide": DigitsWide, "deep": DigitsDeep}


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits()``'s images (N, 8, 8) and targets, read from the file scikit-learn ships.

    The same CSV ``sklearn.datasets.load_digits`` parses, read with numpy: importing
    scikit-learn (and scipy with it) in every rank costs more than training on a busy
    machine. Falls back to ``load_digits()`` where the file is not where expected.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.exists():
        data = np.loadtxt(path, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target.astype(np.int64)


def load_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits as (N, 1, 8, 8) float32 in [0, 1]; a fixed stratified 80/20 split.

    The split takes the first 20% of every class after a seeded shuffle, so every rank
    computes the same split without talking.
    """
    images, target = digits_arrays()
    x = (images / 16.0).astype(np.float32)[:, None]
    order = np.random.RandomState(seed).permutation(len(target))
    test = np.zeros(len(target), dtype=bool)
    for label in range(10):
        members = order[target[order] == label]
        test[members[:int(round(0.2 * len(members)))]] = True
    train_idx, test_idx = order[~test[order]], order[test[order]]
    return (torch.from_numpy(x[train_idx]), torch.from_numpy(target[train_idx]),
            torch.from_numpy(x[test_idx]), torch.from_numpy(target[test_idx]))


# -- launch -----------------------------------------------------------------------------------
@dataclass
class World:
    """Who we are and how we talk: ``launcher`` is ``mpi``, ``torch`` or ``single``."""

    launcher: str
    rank: int = 0
    size: int = 1
    comm: Any = None          # mpi4py communicator under mpiexec
    extra: dict = field(default_factory=dict)

    def barrier(self) -> None:
        if self.launcher == "mpi":
            self.comm.Barrier()
        elif self.launcher == "torch":
            import torch.distributed as dist

            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank."""
        if self.launcher == "mpi":
            return self.comm.allgather(obj)
        if self.launcher == "torch":
            import torch.distributed as dist

            out: list[Any] = [None] * self.size
            dist.all_gather_object(out, obj)
            return out
        return [obj]


def detect_world(launcher: str = "auto") -> World:
    """Join the job this process was started in (mpiexec, torchrun or none)."""
    env = os.environ
    if launcher == "auto":
        if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env or "PMIX_RANK" in env:
            launcher = "mpi"
        elif "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env):
            launcher = "torch"
        else:
            launcher = "single"
    if launcher == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        return World("mpi", comm.Get_rank(), comm.Get_size(), comm)
    if launcher == "torch":
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return World("torch", dist.get_rank(), dist.get_world_size())
    return World("single")


def single_switch_yaml(nranks: int) -> str:
    """A cluster of ``nranks`` one-GPU boxes on one switch (25 GB/s NICs)."""
    return (f"name: single-switch-{nranks}\nswitches:\n  - name: sw0\nboxes:\n"
            f"  - {{name: \"node{{i}}\", count: {nranks}, gpus: 1,\n"
            f"     nics: [{{switch: sw0, bandwidth: 25 GB/s, latency: 2 us}}]}}\n")


def pick_cluster(path: str | None, nranks: int) -> Any:
    """``--cluster`` if given, else topologies/ddl_two_switch.yaml for 4 ranks, else one switch.

    Raises
    ------
    TopoplanError
        If the cluster's rank count is not the job's.
    """
    from topoplan.cluster import load_cluster, loads_cluster

    if path:
        cluster = load_cluster(path)
    elif nranks == 4 and (ROOT / "topologies" / "ddl_two_switch.yaml").exists():
        cluster = load_cluster(ROOT / "topologies" / "ddl_two_switch.yaml")
    elif nranks == 1:
        return None
    else:
        cluster = loads_cluster(single_switch_yaml(nranks), file=f"<single-switch-{nranks}>")
    if cluster.nranks != nranks:
        raise TopoplanError(f"cluster {cluster.name!r} has {cluster.nranks} ranks but the job has "
                            f"{nranks}; launch {cluster.nranks} processes or pick another --cluster")
    return cluster


class _Identity:
    """Allreduce over one rank: nothing to do."""

    nranks = 1
    algorithm = "none"
    chosen: dict = {}

    def __init__(self) -> None:
        from topoplan.torch.planned import AllreduceStats

        self.stats = AllreduceStats()

    def __call__(self, buffer: Any) -> Any:
        return buffer


def make_allreduce(world: World, cluster: Any, algorithm: str, timeout: float) -> Any:
    """The allreduce callable for the optimizer path: planned over MPI/Torch, or native."""
    from topoplan.torch.planned import (PlannedAllreduce, mpi_native_allreduce,
                                        torch_native_allreduce)

    if world.size == 1:
        return _Identity()
    if world.launcher == "mpi":
        if algorithm == "native":
            return mpi_native_allreduce(world.comm)
        from topoplan.runtime.transports import MPI as MPITransport

        return PlannedAllreduce(cluster, MPITransport(world.comm), algorithm=algorithm,
                                share=lambda obj: world.comm.bcast(obj, root=0), timeout=timeout)
    if algorithm == "native":
        return torch_native_allreduce()
    import torch.distributed as dist
    from topoplan.runtime.transports import Torch

    def share(obj: Any) -> Any:
        holder = [obj]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    return PlannedAllreduce(cluster, Torch(None), algorithm=algorithm, share=share, timeout=timeout)


# -- training ---------------------------------------------------------------------------------
def train(args: argparse.Namespace, world: World, progress: bool = False) -> dict[str, Any]:
    """Train, evaluate, and return the result record (the same on every rank but timings)."""
    from topoplan.torch import (Compression, DistributedOptimizer, broadcast_parameters,
                                register_hook)

    if args.batch_size % world.size:
        raise TopoplanError(f"--batch-size {args.batch_size} is not divisible by {world.size} ranks")
    torch.manual_seed(args.seed)
    # conv1 has one input channel; DDP warns about the stride of that size-1 dim (harmless).
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    torch.set_num_threads(max(1, args.threads))
    x_train, y_train, x_test, y_test = load_data()
    model: nn.Module = MODELS[args.model]()
    local = args.batch_size // world.size
    steps_per_epoch = len(x_train) // args.batch_size
    cluster = pick_cluster(args.cluster, world.size)
    mode = args.mode
    if mode == "auto":
        mode = "ddp" if world.launcher == "torch" and not args.double_buffering else "optimizer"
    if mode == "ddp" and world.launcher != "torch":
        raise TopoplanError("--mode ddp needs torchrun (torch.distributed); use --mode optimizer")
    if mode == "ddp" and args.double_buffering:
        raise TopoplanError("--double-buffering needs --mode optimizer (DDP has no stale updates)")
    if args.optimizer == "adam":
        inner: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    state = None
    if mode == "ddp":
        ddp = nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=max(args.fusion_threshold, 1) / 2**20)
        if args.algorithm == "native":
            from topoplan.torch.planned import torch_native_allreduce

            state = register_hook(ddp, fp16=args.fp16_allreduce,
                                  allreduce=torch_native_allreduce())
        else:
            state = register_hook(ddp, cluster, algorithm=args.algorithm,
                                  fp16=args.fp16_allreduce, timeout=args.timeout)
        net: nn.Module = ddp
        optimizer: Any = inner
        allreduce = state.allreduce
    else:
        allreduce = make_allreduce(world, cluster, args.algorithm, args.timeout)
        broadcast_parameters(model.parameters(), allreduce, world.rank)
        optimizer = DistributedOptimizer(
            inner, allreduce, named_parameters=model.named_parameters(),
            compression=Compression.fp16 if args.fp16_allreduce else Compression.none,
            fusion_threshold=args.fusion_threshold, double_buffering=args.double_buffering,
            overlap=False if args.no_overlap or args.algorithm == "native" else None,
            poll_interval=args.poll_interval)
        net = model
    world.barrier()

    bar = None
    if progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        from rich.console import Console
        bar = Progress(TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(),
                       MofNCompleteColumn(), TextColumn("loss {task.fields[loss]:.3f}"),
                       TimeRemainingColumn(), transient=False,
                       console=Console(force_terminal=True))  # main() asked is_terminal
        task = bar.add_task("train", total=args.epochs * steps_per_epoch, epoch=0, loss=float("nan"))
        bar.start()
    total_steps = args.epochs * steps_per_epoch
    compute = 0.0
    start = time.perf_counter()
    first_step_end = None  # the first step plans each buffer's allreduce: steady state after it
    try:
        for epoch in range(args.epochs):
            order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(
                args.seed * 1000 + epoch))
            for step in range(steps_per_epoch):
                t0 = time.perf_counter()
                for group in inner.param_groups:
                    group["lr"] = learning_rate(args, epoch * steps_per_epoch + step, total_steps)
                idx = order[step * args.batch_size:(step + 1) * args.batch_size]
                idx = idx[world.rank * local:(world.rank + 1) * local]
                optimizer.zero_grad()
                loss = F.cross_entropy(net(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                compute += time.perf_counter() - t0
                if first_step_end is None:
                    first_step_end = time.perf_counter()
                if bar is not None:
                    bar.update(task, advance=1, epoch=epoch, loss=float(loss.detach()))
        if isinstance(optimizer, DistributedOptimizer):
            t0 = time.perf_counter()
            optimizer.finalize()
            compute += time.perf_counter() - t0
    finally:
        if bar is not None:
            bar.stop()
    wall = time.perf_counter() - start
    exposed: float | None
    if isinstance(optimizer, DistributedOptimizer):
        exposed = optimizer.wait_seconds
        compute -= exposed
        optimizer.close()
        comm = optimizer.comm_seconds
    else:
        assert state is not None  # mode ddp
        state.close()
        # DDP waits for its hooks' Futures inside backward: the time in communication is
        # known, the part backward waited for is not (compute_s includes it).
        exposed = None
        comm = state.comm_seconds
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean()) * 100
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    # Ranks must hold the same model: compare checksums (a cheap consistency check).
    sums = world.gather(float(params.double().sum()))
    samples = args.epochs * steps_per_epoch * args.batch_size
    stats = getattr(allreduce, "stats", None)
    overlap = bool(getattr(optimizer, "overlap", False))
    return {
        "ranks": world.size, "launcher": world.launcher, "mode": mode, "model": args.model,
        "algorithm": args.algorithm,
        "chosen": sorted(set(getattr(allreduce, "chosen", {}).values())),
        "cluster": getattr(cluster, "name", None),
        "fp16": bool(args.fp16_allreduce), "double_buffering": bool(args.double_buffering),
        "overlap": overlap,
        "fusion_threshold": args.fusion_threshold, "epochs": args.epochs,
        "batch_size": args.batch_size, "steps": args.epochs * steps_per_epoch,
        "samples_per_s": samples / wall, "test_accuracy": accuracy, "wall_s": wall,
        # after the first step (which plans every buffer's allreduce): steady-state training
        "first_step_s": (first_step_end or start) - start,
        "steady_samples_per_s": (
            (samples - args.batch_size) / (start + wall - first_step_end)
            if first_step_end is not None and total_steps > 1 else samples / wall),
        # comm_s: wall time with gradients in flight (overlapped or not); comm_exposed_s:
        # the part the training loop waited for (None under DDP: not measurable)
        "compute_s": compute, "comm_s": comm, "comm_exposed_s": exposed,
        "allreduce_calls": stats.calls if stats is not None else 0,
        "params_consistent": max(sums) - min(sums) <= 1e-6 * max(1.0, abs(sums[0])),
        "param_checksum": sums[0],
    }


def learning_rate(args: argparse.Namespace, step: int, total_steps: int) -> float:
    """Linear warm-up over --warmup-epochs (Goyal et al. 2017, as ChainerMN's runs use),
    then constant or cosine decay to zero (--schedule). Decay lets the last epochs
    settle, which is what makes runs with stale gradients comparable at the end."""
    steps_per_epoch = total_steps / max(args.epochs, 1)
    warmup = int(args.warmup_epochs * steps_per_epoch)
    if step < warmup:
        return args.lr * (step + 1) / warmup
    if args.schedule == "cosine":
        progress = (step - warmup) / max(1, total_steps - warmup)
        return args.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    return args.lr


def summary_line(r: dict[str, Any]) -> str:
    what = f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''} {r['launcher']}/{r['mode']} {r['algorithm']}"
    if r["chosen"] and r["chosen"] != [r["algorithm"]]:
        what += f" ({'/'.join(r['chosen'])})"
    what += " fp16" if r["fp16"] else " fp32"
    if r["double_buffering"]:
        what += " dbuf"
    if r.get("overlap"):
        what += " overlap"
    if r["comm_exposed_s"] is None:
        exposed = " (DDP waits for it inside backward: the exposed part is not measured)"
    else:
        exposed = f" (exposed {r['comm_exposed_s']:.2f} s)"
    return (f"train: {what}: {r['samples_per_s']:.0f} samples/s, test accuracy "
            f"{r['test_accuracy']:.2f}%, compute {r['compute_s']:.2f} s, communication "
            f"{r['comm_s']:.2f} s{exposed}, wall {r['wall_s']:.2f} s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", help="cluster YAML (default: ddl_two_switch.yaml for 4 ranks, "
                   "else a single-switch cluster of the job's size)")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS,
                   help="planner for every fused buffer / DDP bucket; 'native' = the "
                   "transport's own allreduce (baseline). Default: auto")
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 on the wire")
    p.add_argument("--double-buffering", action="store_true",
                   help="overlap allreduce with the next step, apply gradients one step late")
    p.add_argument("--no-overlap", action="store_true",
                   help="optimizer mode: pack and allreduce every buffer after backward "
                        "(default: start each buffer's allreduce from the gradient hooks)")
    p.add_argument("--poll-interval", type=float, default=1e-3, metavar="SECONDS",
                   help="optimizer mode with overlap: seconds between the progress thread's "
                        "polls of the buffers in flight (default 0.001; 0: hooks alone poll)")
    p.add_argument("--fusion-threshold", type=parse_size, default=64 << 20,
                   help="bytes per fused buffer / DDP bucket, e.g. 64MiB; 0 = no fusion")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split over ranks)")
    p.add_argument("--lr", type=float, default=0.005)
    # For --optimizer sgd. With one-step-stale gradients (--double-buffering) keep it low:
    # at 0.9 this data set trains much slower (54% vs 98% after 10 epochs at lr 0.05).
    p.add_argument("--momentum", type=float, default=0.5)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="adam")
    p.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                   help="learning rate after the warm-up")
    p.add_argument("--warmup-epochs", type=float, default=0.0,
                   help="linear learning-rate warm-up; stale gradients need it at high lr")
    p.add_argument("--model", choices=sorted(MODELS), default="cnn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--mode", choices=("auto", "ddp", "optimizer"), default="auto",
                   help="ddp: DDP + comm hook (torch.distributed.run); optimizer: "
                   "DistributedOptimizer. auto: ddp under torch.distributed.run unless "
                   "--double-buffering")
    p.add_argument("--launcher", choices=("auto", "mpi", "torch", "single"), default="auto")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per transfer")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        world = detect_world(args.launcher)
        # A bar only on a terminal: not into pipes and logs (not in MPI ranks, which
        # Open MPI gives a pseudo-terminal, unless topoplan launched them from one).
        from topoplan.commands.common import is_terminal
        result = train(args, world, progress=world.rank == 0 and not args.no_progress
                       and not args.json and is_terminal(sys.stdout))
    except TopoplanError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        # DDP hands a failed hook call back wrapped ("Got the following error when
        # running the callback: TransportError: rank 2: ... step 3 ... peer 1 ...", then
        # a stack): its located line is what to say, unless topoplan --verbose asked for
        # everything.
        from topoplan.commands.common import verbose
        found = re.search(r"(?:TransportError|TopoplanError|DistBackendError): (.+)", str(exc))
        if found is None or verbose():
            raise
        print(f"train: error: {found.group(1).strip()}", file=sys.stderr)
        return 1
    if world.rank == 0:
        print(json.dumps(result) if args.json else summary_line(result), flush=True)
    if world.launcher == "torch":
        import gc

        import torch.distributed as dist

        # Free what training left in reference cycles while the process group is alive.
        # Otherwise it is torn down during interpreter finalization, and gloo aborts the
        # process ("terminate called without an active exception": 2 of 8 runs in a
        # fresh clone without this line, 0 of 24 with it).
        gc.collect()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
