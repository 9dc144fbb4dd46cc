"""The public entry point: :func:`simulate` checks its arguments, then runs the engine.

The engine (numpy, scipy) is imported on the first call, so that importing
:mod:`topoplan` or :mod:`topoplan.analysis.sim` stays cheap.
"""

from __future__ import annotations

import gc
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from ..cost import CostProfile, get_profile
from ...errors import ScheduleError
from ...ir.fingerprint import check_fingerprint
from ...ir.schedule import Schedule
from ...units import parse_size
from .report import SimReport, Yardsticks

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["simulate", "costs_for", "nccl_row"]


def simulate(cluster: Cluster | str | os.PathLike, schedule: Schedule, size: int | str, *,
             profile: CostProfile | str | None = None, dtype_size: int = 4,
             reduce_bandwidth: float | None = None, alpha: float | None = None,
             record: bool = False, progress: Callable[[float, float], None] | None = None,
             resolution: float | None = None, force: bool = False,
             yardsticks: Yardsticks | None = None, nccl_version: str | None = None,
             nccl_algo: str | None = None, nccl_proto: str | None = None) -> SimReport:
    """Predict how long ``schedule`` takes on ``cluster`` for ``size`` bytes per rank.

    Parameters
    ----------
    cluster : Cluster or path
        A :class:`~topoplan.cluster.Cluster`, or the cluster YAML file to load.
    schedule : Schedule
        Must have ``cluster.nranks`` ranks, and be planned for ``cluster`` if it records
        the cluster it was planned for (``meta["cluster_fingerprint"]``, which
        :func:`topoplan.plan` writes). It need not be verified: unmatched messages and
        deadlocks raise :class:`ScheduleError`.
    size : int or str
        Buffer bytes per rank, or a size such as ``"256MiB"``
        (:func:`~topoplan.units.parse_size`); chunks cover ``size // dtype_size``
        elements.
    profile : CostProfile or str, optional
        The runtime's costs (a :class:`~topoplan.analysis.cost.CostProfile`, a shipped name such as
        ``"ideal"`` or a profile YAML path). Default
        :data:`~topoplan.analysis.cost.DEFAULT_PROFILE` (``nccl``), as ``topoplan simulate`` and
        :func:`topoplan.plan`; ``"ideal"`` charges the links alone.
    dtype_size : int
        Bytes per element (4 for fp32).
    reduce_bandwidth : float, optional
        Bytes/s a rank adds at (after each step's messages), in place of the profile's
        (``topoplan simulate --reduce-bandwidth``).
    alpha : float, optional
        Seconds per message, paid before it flows, in place of the profile's for both
        link classes (``topoplan simulate --alpha``).
    record : bool
        Also return every transfer and each link's rate over time.
    progress : callable, optional
        ``progress(fraction_of_steps_done, simulated_time)``, called about once a second
        of wall time on long runs.
    resolution : float, optional
        Events closer than ``resolution`` times the clock are one batch (they happen at
        once). Default: 1e-7, or 1e-5 for schedules of more than 200 000 ops, where
        rounding and posting costs scatter events by nanoseconds and the finer
        resolution costs 10x the time (results move by about the resolution, relative;
        :data:`topoplan.analysis.sim.base.COARSE`). The report says which was used.
    force : bool
        Simulate a schedule planned for another cluster (its recorded fingerprint
        differs), as ``topoplan simulate --force``.
    nccl_version, nccl_algo, nccl_proto : str, optional
        What the ``nccl`` yardstick (``report.nccl``) and native steps priced by the
        NCCL model follow: NCCL's tables of that version and ``NCCL_ALGO`` /
        ``NCCL_PROTO`` in NCCL's syntax (:mod:`topoplan.analysis.native.nccl_env`), as
        ``topoplan simulate --nccl-*``.
    yardsticks : Yardsticks, optional
        The lower bound and NCCL's row for this size and collective on ``cluster``,
        when the caller has them (a plan request computes them once for all its
        candidates); default computed here.

    Returns
    -------
    SimReport
        With ``nccl``, NCCL's own choice and time for the same collective and size on
        the cluster (the yardstick; ``report.speedup_vs_nccl``); every native
        collective the schedule runs (``report.natives``, and ``report.native_time`` on
        the critical path); ``report.notes`` says where a native step was priced as a
        point-to-point ring for want of the profile's price.

    Raises
    ------
    ScheduleError
        If the schedule's rank count differs from the cluster's, it was planned for
        another cluster (unless ``force``), a message or a native op is unmatched
        (a member of its group never runs it, or runs another), or the ranks
        deadlock.
    ProfileError
        For an unknown profile name or a bad profile file.
    ValueError
        For a size that is not a number of bytes >= 0, or a bad ``dtype_size``,
        ``alpha``, ``reduce_bandwidth``, ``resolution``, NCCL version, algorithm or
        protocol.

    Notes
    -----
    Cost: O(ops) to flatten and match messages (cached per schedule object), then one
    vectorized pass per wave of fixed-rate messages (about one per step of a ring) and
    one per lookahead window of link-sharing flows, each O(messages in it). 256 MiB on
    ``topologies/leaf_spine_1024.yaml``: ring ~6 s, hierarchical ~3 s, mcf (475 k ops)
    15 s under ``ideal`` and 60 s under ``nccl`` on a 2-core machine
    (``scripts/bench_simulate.py``, ``scripts/bench_scale.py``).
    """
    from ..native.nccl_env import nccl_settings
    with nccl_settings(nccl_version, nccl_algo, nccl_proto):
        return _simulate(cluster, schedule, size, profile, dtype_size, reduce_bandwidth, alpha,
                         record, progress, resolution, force, yardsticks)


def _simulate(cluster: Cluster | str | os.PathLike, schedule: Schedule, size: int | str,
              profile: CostProfile | str | None, dtype_size: int,
              reduce_bandwidth: float | None, alpha: float | None, record: bool,
              progress: Callable[[float, float], None] | None, resolution: float | None,
              force: bool, yardsticks: Yardsticks | None) -> SimReport:
    from ...cluster import as_cluster  # networkx and yaml load with the first simulation
    cluster = as_cluster(cluster, "simulate")
    if schedule.nranks != cluster.nranks:
        raise ScheduleError(
            f"the schedule has {schedule.nranks} ranks but cluster {cluster.name!r} has "
            f"{cluster.nranks} GPUs; plan it for this cluster")
    check_fingerprint(schedule, cluster, force=force, force_hint="pass force=True")
    if not 1 <= dtype_size <= 1 << 20 or int(dtype_size) != dtype_size:  # NaN too
        raise ValueError(f"dtype_size must be a whole number of bytes >= 1, got {dtype_size}")
    size = parse_size(size)
    costs = costs_for(profile, alpha, reduce_bandwidth)
    from .base import COARSE, COARSE_OPS, EPS_T

    from ..native.clusters import runtime_cluster
    links = runtime_cluster(cluster, costs)

    if resolution is None:
        resolution = COARSE if schedule.nops > COARSE_OPS else EPS_T
    elif not 0 < resolution < 1e-2:
        raise ValueError(f"resolution must be in (0, 0.01), got {resolution}")
    # The cyclic GC would rescan the schedule's millions of ops each time the report's
    # millions of (start, end) tuples trigger a collection (seconds at 1024 ranks); the
    # engine makes no reference cycles.
    from .engine import Engine

    effective = (int(size) // dtype_size) * dtype_size
    if yardsticks is None or yardsticks.size != effective \
            or yardsticks.collective != schedule.collective:
        from ..bound import collective_bound
        # The bound holds for any schedule on the cluster as it is, not as NCCL counts it.
        yardsticks = Yardsticks(effective, schedule.collective,
                                collective_bound(cluster, effective, schedule.collective),
                                nccl_row(cluster, effective, schedule.collective))
    collecting = gc.isenabled()
    gc.disable()
    try:
        engine = Engine(links, schedule, int(size), dtype_size, costs, record, progress,
                        base=cluster, bound=yardsticks.lower_bound_s)
        engine.eps = float(resolution)
        engine.run()
        report = engine.report()
    finally:
        if collecting:
            gc.enable()
    choice = yardsticks.nccl
    return replace(report, nccl=choice) if choice is not None else report


def nccl_row(cluster: Cluster, size: int, collective: str) -> Any:
    """What NCCL runs for ``collective`` of ``size`` bytes on ``cluster`` and its time
    there (:func:`topoplan.analysis.native.nccl.nccl_time`), or ``None`` on a
    :class:`~topoplan.cluster.HostCluster` (a machine a profile was calibrated on)."""
    from ...cluster import HostCluster
    if isinstance(cluster, HostCluster):
        return None
    from ..native.nccl import nccl_time
    from ..native.nccl_env import current
    try:
        return nccl_time(cluster, size, collective)
    except ValueError as exc:
        forced = current().forced
        if not forced:
            raise
        from ...errors import PlannerError
        raise PlannerError(f"the nccl row: {exc}; NCCL itself stops there ('No "
                           f"algorithm/protocol available ... {forced}')") from None


def costs_for(profile: CostProfile | str | None, alpha: float | None,
              reduce_bandwidth: float | None) -> CostProfile:
    """The profile to simulate with: ``profile`` (default
    :data:`~topoplan.analysis.cost.DEFAULT_PROFILE`), with ``alpha`` and ``reduce_bandwidth`` in
    place of its own where given (its name then ends in ``*``)."""
    costs = get_profile(profile)
    changes: dict[str, float] = {}
    if alpha is not None:
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0 seconds, got {alpha}")
        changes.update(alpha_box=float(alpha), alpha_network=float(alpha))
    if reduce_bandwidth is not None:
        if not reduce_bandwidth > 0:
            raise ValueError(f"reduce_bandwidth must be > 0 bytes/s, got {reduce_bandwidth}")
        changes["reduce_bandwidth"] = float(reduce_bandwidth)
    return costs.with_costs(**changes) if changes else costs
