"""Fixtures shared by the tests. Shared helpers (hand-built schedules and clusters, the
shipped topologies by name) live in :mod:`tests.support`."""

from __future__ import annotations

from typing import Callable

import pytest

from topoplan.cluster import Cluster

from .support.clusters import load_topology


@pytest.fixture(scope="session")
def topology() -> Callable[[str], Cluster]:
    """Load a shipped topology by name: ``topology("ddl_two_switch")`` (once per session;
    clusters are frozen, so tests can share them)."""
    return load_topology
