"""Fixtures shared by the tests, and how pytest-xdist spreads them over workers. Shared
helpers (hand-built schedules and clusters, the shipped topologies by name) live in
:mod:`tests.support`."""

from __future__ import annotations

import multiprocessing
import os
from typing import Callable

import pytest

from topoplan.cluster import Cluster

from .support import forkserver
from .support.clusters import load_topology

# Torch ranks fork from a server that imported torch once (tests/support/forkserver.py).
# Nothing is imported here: the server starts, and imports, at the first such launch.
multiprocessing.set_forkserver_preload(forkserver.PRELOAD)

# Open MPI's libfabric BTL (ofi) spends a second of every MPI_Init (each rank of every
# mpiexec job, each process that imports mpi4py.MPI alone) looking for a fabric, and
# declines where there is none (here: `--mca btl_base_verbose 100`); the ranks of one
# machine talk over shared memory anyway. The processes the tests start leave it out. A
# setting of your own is kept; a job's own ``--mca btl`` (the testbed's) wins over it.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")


@pytest.fixture(scope="session")
def topology() -> Callable[[str], Cluster]:
    """Load a shipped topology by name: ``topology("ddl_two_switch")`` (once per session;
    clusters are frozen, so tests can share them)."""
    return load_topology


#: Test modules whose tests all read one expensive module-scoped fixture (ranks started
#: once for the module, 3-25 s each): under pytest-xdist a module split over two workers
#: would start them on both. ``xdist_group`` marks would say this, but ``--dist loadgroup``
#: ignores them on pytest 9.2 (pytest-xdist issue #1386), hence the scheduler below.
ONE_WORKER = frozenset({"test_torch_fsdp.py", "test_torch_distributed.py",
                        "test_torch_backend.py"})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` (``make test``): xdist's default ``load`` distribution, test by
    test, except that each module of :data:`ONE_WORKER` goes to one worker whole (and
    first: xdist hands out its biggest units first). Another ``--dist`` is left as asked."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.rsplit("/", 1)[-1] in ONE_WORKER else nodeid

    return OneWorkerModules(config, log)


#: Modules with tests of 5 s or more (``make test`` prints the slowest), about longest
#: first. Under pytest-xdist their tests are handed out first, so that the run ends on
#: short tests: a long one left for last would keep one worker busy while the others idle.
LONG_FIRST = ("test_readme.py", "test_types.py", "test_torch_train.py", "test_cli_terminal.py",
              "test_testbed.py", "test_transports_mpi.py", "test_transports_torch.py",
              "test_torch_native.py", "test_mcf.py", "test_composed.py", "test_notebooks.py",
              "test_calibrate.py", "test_testbed_run.py", "test_channels_exec.py",
              "test_cli_json.py", "test_interop_msccl.py", "test_vectored.py")


def pytest_collection_modifyitems(config, items):
    """On a pytest-xdist worker (all of them collect, and must agree), the tests of
    :data:`LONG_FIRST` first, in that order; each module's tests and the others keep the
    order they were collected in. A run without workers keeps the collected order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))
