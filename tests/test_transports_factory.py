"""topoplan.runtime.transports.connect: one factory for every transport, with clear refusals.
MPI through it runs in tests/mpi_cases.py (under mpiexec); NCCL needs a GPU
(tests/test_transports_nccl.py runs the CLI, which builds its ranks' transports here)."""

from __future__ import annotations

from functools import partial

import pytest

from tests.support import forkserver, launch_ranks
from topoplan.errors import TopoplanError
from topoplan.runtime.transports import Local, connect
from topoplan.runtime.transports.factory import KINDS
from topoplan.runtime.transports.launch import free_port, run_processes
from topoplan.runtime.transports.local import LocalWorld


def test_kinds_are_the_four_transports():
    assert KINDS == ("mpi", "nccl", "torch", "local")


@pytest.mark.parametrize("kind", ["gloo", "MPI", "", None])
def test_an_unknown_kind_names_the_known_ones(kind):
    with pytest.raises(TopoplanError, match=r"unknown transport .*; expected one of 'mpi', "
                                            r"'nccl', 'torch', 'local'"):
        connect(kind)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind, option, takes", [
    ("mpi", "tag", "comm, dup, poll_yield, spin, inline_max, blocking_natives"),
    ("nccl", "comm", "mpi_comm, device, share_gpus"),
    ("torch", "world_size", "group, init_method, rank, size, backend, timeout"),
    ("local", "size", "world, rank, timeout")])
def test_an_unknown_option_names_those_the_kind_takes(kind, option, takes):
    # Refused before the kind's library is needed: no mpi4py, CuPy or process group here.
    with pytest.raises(TopoplanError, match=rf"^connect\('{kind}'\): unknown option {option}; "
                                            rf"{kind} takes {takes}$"):
        connect(kind, **{option: 1})


def test_local_ranks_of_one_world():
    world = LocalWorld(2)
    t = connect("local", world=world, rank=1, timeout=5.0)
    assert isinstance(t, Local) and (t.rank, t.size, t.timeout) == (1, 2, 5.0)
    with pytest.raises(TopoplanError, match=r"connect\('local', world=...\): give rank too"):
        connect("local", world=world)


def test_torch_takes_a_group_or_joins_one_not_both():
    with pytest.raises(TopoplanError, match="give group .* or init_method .*, not both"):
        connect("torch", group=None, init_method="tcp://127.0.0.1:1")
    with pytest.raises(TopoplanError, match=r"connect\('torch', init_method=..., rank=...\): "
                                            "give size too"):
        connect("torch", init_method="tcp://127.0.0.1:1", rank=0)


def test_torch_ranks_join_a_group_through_the_factory():
    pytest.importorskip("torch.distributed")
    init = f"tcp://127.0.0.1:{free_port()}"
    out = run_processes(2, launch_ranks.torch_report, (),
                        partial(launch_ranks.torch_by_factory, init),
                        close=launch_ranks.torch_close, timeout=120,
                        start_method=forkserver.START)
    assert out == [(0, 2, "torch/gloo", 1.0), (1, 2, "torch/gloo", 1.0)]
