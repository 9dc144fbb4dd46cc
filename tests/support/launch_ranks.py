"""Rank functions for tests/test_transports_launch.py: module-level, so that spawned
processes can unpickle them, and light to import."""

from __future__ import annotations

import os


def connect(rank: int, nranks: int) -> tuple[int, int]:
    """A stand-in transport: the rank and the job's size."""
    return rank, nranks


def close() -> None:
    """Mark that the rank closed (the parent reads the marker files)."""
    folder = os.environ.get("TOPOPLAN_TEST_CLOSED")
    if folder:
        with open(os.path.join(folder, str(os.getpid())), "w"):
            pass


def report(transport: tuple[int, int], tag: str) -> tuple[int, int, str]:
    return (*transport, tag)


def fail_on(transport: tuple[int, int], bad: int, die: int) -> int:
    """Rank ``bad`` raises, rank ``die`` exits without a word; the others return their rank."""
    rank, _ = transport
    if rank == bad:
        raise ValueError(f"rank {rank} refuses")
    if rank == die:
        os._exit(7)
    return rank


def torch_by_factory(init_method: str, rank: int, nranks: int):
    """Join a gloo group through :func:`topoplan.runtime.transports.connect`."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from topoplan.runtime.transports import connect
    return connect("torch", init_method=init_method, rank=rank, size=nranks, timeout=60)


def torch_report(transport) -> tuple[int, int, str, float]:
    return transport.rank, transport.size, transport.name, transport.allreduce_max(transport.rank)


def torch_close() -> None:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
