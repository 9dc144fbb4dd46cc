"""An emulated cluster on one machine: network namespaces, veth pairs, tc and routes.

>>> from topoplan.testbed import Testbed                         # doctest: +SKIP
>>> with Testbed.up(cluster, scale=1 / 320) as bed:              # doctest: +SKIP
...     print(bed.layout.addresses)

``up`` builds the network of :func:`~topoplan.testbed.layout.plan_layout` (each link of
the cluster graph a veth pair with an HTB tree: the link rate, shared max-min fairly
between rank pairs; static routes along the simulator's paths);
:func:`~topoplan.testbed.probe.check_pairs` checks every pair's path and rate against
the model;
:mod:`topoplan.testbed.bench` runs one process per rank inside it (gloo, or Open MPI
through the launcher agent of :mod:`topoplan.testbed.mpi`) and predicts each run with
the simulator, raw and calibrated on the testbed (:mod:`topoplan.testbed.calibrate`).
Needs root (or CAP_NET_ADMIN) and iproute2; :func:`capable` says whether this machine can.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster import Cluster
from .layout import (Layout, auto_scale, emulated_cluster, parse_scale, plan_layout,
                     scale_cluster)
from .netns import (TestbedError, capable, create, destroy, load_state, namespace_exists,
                    netem_available)

__all__ = ["Testbed", "TestbedError", "capable", "max_ranks", "check_fits", "Layout",
           "plan_layout", "scale_cluster", "emulated_cluster", "auto_scale", "parse_scale", "load_state", "destroy"]

#: Memory one rank process needs (Python + torch + gloo buffers), for ``max_ranks``.
RANK_MEMORY = 600 << 20
#: Ranks per CPU core before timings are mostly waiting for a core.
RANKS_PER_CORE = 4


def max_ranks() -> tuple[int, str]:
    """How many rank processes this machine can run, and why that many."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        memory = info.get("MemAvailable", info["MemTotal"])
    except (OSError, KeyError, ValueError):
        memory = 4 << 30
    by_cpu, by_memory = RANKS_PER_CORE * cores, memory // RANK_MEMORY
    limit = max(2, min(by_cpu, by_memory))
    why = (f"{cores} CPU cores x {RANKS_PER_CORE} ranks each = {by_cpu}; "
           f"{memory / 2**30:.1f} GiB free memory / {RANK_MEMORY >> 20} MiB per rank = {by_memory}")
    return limit, why


def check_fits(cluster: Cluster, limit: int | None = None) -> None:
    """Raise :class:`TestbedError` when ``cluster`` has more ranks than this machine can run."""
    auto, why = max_ranks()
    limit = auto if limit is None else limit
    if cluster.nranks > limit:
        raise TestbedError(
            f"cluster {cluster.name!r} has {cluster.nranks} ranks; this machine runs at most "
            f"{limit} ({why}). Emulate a smaller variant (e.g. 2 boxes x 2 GPUs) or raise the "
            "limit with --max-ranks")


@dataclass
class Testbed:
    """A built testbed: its layout and state file. A context manager that tears it down."""

    layout: Layout
    state: Path
    __test__ = False  # not a pytest class, despite the name

    @classmethod
    def up(cls, cluster: Cluster, scale: float | None = None, *, prefix: str | None = None,
           state: Path | None = None, max_ranks: int | None = None,
           multipath: str = "pin") -> Testbed:
        """Build the emulated network of ``cluster``.

        Parameters
        ----------
        cluster : Cluster
        scale : float, optional
            Bandwidth factor (e.g. ``1/320``); by default the one bringing the fastest
            NIC or switch link to 2.5 Gbit/s (:func:`auto_scale`).
        prefix, state : optional
            Namespace name prefix and state file; unique defaults.
        max_ranks : int, optional
            Override the rank limit of :func:`max_ranks`.
        multipath : {"pin", "spray"}
            Pairs with several equal-cost paths: routed over the first (default), or
            their packets spread over all (:func:`~topoplan.testbed.layout.plan_layout`).

        Raises
        ------
        TestbedError
            Too many ranks, no permission, or a failed ``ip``/``tc`` command. Whatever
            was built is removed first, also on KeyboardInterrupt and SIGTERM.
        ClusterSpecError
            A pair of ranks without a route, or with more equal-cost paths than the
            testbed tells apart.
        """
        check_fits(cluster, max_ranks)
        scale = auto_scale(cluster) if scale is None else scale
        layout = plan_layout(cluster, scale, prefix, multipath=multipath)
        if any(v.latency for v in layout.veths) and not netem_available():
            layout = dataclasses.replace(layout, notes=(*layout.notes, (
                "this kernel has no netem (CONFIG_NET_SCH_NETEM): link latencies are not "
                "emulated, only bandwidths")))
        from .degrade import link_table
        return cls(layout, create(layout, state, link_table(cluster)))

    @classmethod
    def attach(cls, state: str | Path) -> Testbed:
        """A testbed built earlier (``topoplan testbed up``), from its state file."""
        layout = load_state(state)
        missing = [ns for ns in layout.namespaces if not namespace_exists(ns)]
        if missing:
            raise TestbedError(f"{state}: testbed is gone (namespaces {missing[:3]} missing); "
                               "run `topoplan testbed down` on it and build it again")
        return cls(layout, Path(state))

    @property
    def degrades(self) -> dict[str, float]:
        """The links degraded now (link name -> factor), from the state file."""
        from .degrade import state_degrades
        return state_degrades(self.state)

    def current_layout(self) -> Layout:
        """The layout at the rates its degraded links have now: what the probe checks."""
        from .degrade import current_layout
        return current_layout(self.layout, self.state)

    def down(self) -> list[str]:
        """Remove everything (processes, namespaces, bridges, veths)."""
        return destroy(self.state)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.down()
