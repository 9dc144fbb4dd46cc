"""Collective planners: one module per algorithm, one signature, and the ``plan`` facade.

Every planner is ``plan_x(cluster, *, size, chunks=None, profile=None, **options) ->
Schedule`` and sets ``meta["algorithm"]``, ``meta["cluster"]`` and ``meta["profile"]``;
a planner that plans more than allreduce takes ``collective=``. :data:`SPECS` declares
each one (:class:`~topoplan.planners.registry.PlannerSpec`: the collectives it plans, the
options it takes); :data:`PLANNERS` maps the names to the functions; :func:`register`
adds one. :func:`plan` and ``topoplan plan`` make one validated request
(:class:`~topoplan.planners.request.PlanRequest`) and go through one pipeline
(:func:`~topoplan.planners.pipeline.execute`: compare, choose, channels and vectored
messages, verify, stamp), so the same request gives the same schedule from both.
Each built-in planner is its public function, which checks its arguments into a
request, and a core on that request (``ring_core``, ...), which the pipeline calls.
``profile`` is the
runtime's :class:`~topoplan.analysis.cost.CostProfile` (or a name): planners pick their
pipelining depth, and ``mcf`` its construction, against it.
"""

from __future__ import annotations

import contextlib
import os

from typing import Any

from ..cluster import Cluster
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE
from ..analysis.cost import CostProfile
from ..ir.schedule import Schedule
from ..errors import PlannerError
from ._order import topo_order
from .hierarchical import plan_hierarchical
from .pipeline import (Bounds, Candidate, PlanRequest, PlanResult, compare, execute,
                       nccl_candidate, run, stamp)
from .registry import (PLANNERS, SPECS, LazyPlanner, PlannerSpec, candidates, collectives_of,
                       options_of, planners_for, register, require_collective, takes)
from .rhd import plan_rhd
from .ring import plan_ring, plan_ring_topo
from .tree import plan_tree

__all__ = ["PLANNERS", "SPECS", "plan", "register", "candidates", "takes", "options_of",
           "PlannerError", "collectives_of", "planners_for", "require_collective",
           "PlannerSpec", "PlanRequest", "PlanResult", "Bounds", "Candidate", "compare", "run",
           "nccl_candidate", "execute", "stamp",
           "LazyPlanner",
           "plan_ring",
           "plan_ring_topo", "plan_tree", "plan_rhd", "plan_hierarchical", "topo_order"]

def plan(cluster: Cluster | str | os.PathLike, algorithm: str = "auto", *,
         size: int | str = 256 << 20,
         profile: CostProfile | str | None = None, collective: str = DEFAULT_COLLECTIVE,
         max_step_ops: int | None = None, max_chunks: int | None = None,
         nccl_version: str | None = None, nccl_algo: str | None = None,
         nccl_proto: str | None = None, **options: Any) -> Schedule:
    """Plan ``collective`` (an allreduce) of ``size`` bytes on ``cluster`` with the named
    algorithm.

    Parameters
    ----------
    cluster : Cluster or path
        A :class:`~topoplan.cluster.Cluster`, or the cluster YAML file to load.
    algorithm : str
        A key of :data:`PLANNERS` (``ring``, ``ring-topo``, ``tree``, ``rhd``,
        ``hierarchical``, ``mcf``, and whatever else is registered), or ``auto``, which
        simulates the candidates and returns the fastest (:mod:`topoplan.planners.auto`).
    size : int or str
        Message size in bytes, or a size such as ``"256MiB"``
        (:func:`~topoplan.units.parse_size`, as ``topoplan plan --size``).
    profile : CostProfile or str, optional
        The runtime's costs (:mod:`topoplan.analysis.cost`), a shipped profile's name or a YAML
        path. Default :data:`topoplan.analysis.cost.DEFAULT_PROFILE` (``nccl``).
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan (:mod:`topoplan.ir.collectives`); ``size`` is the full buffer (an
        allgather's output, a reduce-scatter's input).
    max_step_ops, max_chunks : int, optional
        Plan-size caps (planners pipeline less to fit, or raise
        :class:`InfeasiblePlanError`).
    channels : int or "auto", optional
        Run the plan on this many independent channels (IR v4,
        :func:`topoplan.ir.passes.channelize`, applied after planning; default 1:
        the plan as planned). ``max_chunks`` and ``max_step_ops`` hold for the result:
        the planner plans to them divided by ``channels``. ``mcf`` and ``forest`` plan and
        price their pipeline for the channels (the estimate is the channels' time), and
        with ``"auto"`` pick 1, 2 or 4 by that estimate; the others are cut after
        planning.
    channel_skew : float, optional
        The ratio of one channel's slice of the data to the next one's (default
        :data:`topoplan.planners.channels.SKEW`, 1.2; 1 cuts equal slices, as NCCL does,
        which gain nothing: see :func:`~topoplan.ir.passes.channelize`).
    vectored : bool, optional
        Merge each step's messages from one rank to one peer into one vectored message
        (IR v4, :func:`topoplan.ir.passes.vectorize`, applied after planning and after
        ``channels``; default False): the same data in fewer ops, which pays under a
        profile with a per-op posting cost (``nccl``). Plans with native steps are
        vectorized in their point-to-point steps only.
    candidates : sequence of str, optional
        The planners to compare: with ``auto``, these instead of every candidate; with
        a named planner, these beside it (its plan is returned).
    machine : Cluster, optional
        Where the plan will run when not on ``cluster`` (a calibrated profile's host):
        the candidates are priced there.
    max_sim_ops, max_plan_ranks : int, optional
        Plans of more ops are ranked by their planner's estimate, not simulated
        (default 250 000); above ``max_plan_ranks`` ranks (default 256) ``auto``
        compares only the planners that scale.
    nccl_version, nccl_algo, nccl_proto : str, optional
        What the ``nccl`` row (``meta["nccl"]``, and the ``nccl`` candidate's native
        price) follows: NCCL's tables of that version, and ``NCCL_ALGO`` / ``NCCL_PROTO``
        in NCCL's own syntax (``"ring;allreduce:tree"``, ``"^ll,ll128"``;
        :mod:`topoplan.analysis.native.nccl_env`), as ``topoplan plan --nccl-*``.
    **options
        Passed to the planners that take them (``chunks``, ``order``, ...).

    Returns
    -------
    Schedule
        Verified (the pipeline, :func:`~topoplan.planners.pipeline.execute`), with in its
        meta: ``cluster_fingerprint`` (:func:`~topoplan.ir.fingerprint.cluster_fingerprint`),
        ``size_bytes`` (the size it was planned for), ``profile``, ``chosen`` (the
        planner; ``algorithm`` is ``"auto"`` when ``auto`` chose, with the planner's own
        meta as ``chosen_algorithm_meta``), ``predicted_time_s`` (simulated, or the
        planner's estimate when too big to simulate; None without either),
        ``lower_bound_s`` (and ``rsag_bound_s`` for an allreduce, ``latency_bound_s``
        under a profile with latencies), ``certificate`` (the bound the plan is
        measured against, its gap and whether the optimum is known:
        :mod:`topoplan.planners.certificate`), ``comparison`` (every row compared, fastest
        first), ``left_out`` (candidates that gave no plan, and why) and ``nccl``: what
        NCCL itself runs for the same collective and size on the cluster and its time
        there (:meth:`topoplan.analysis.native.nccl.NcclChoice.to_dict`; ``algorithm``
        is ``"nccl"``, NCCL's own is ``nccl_algorithm``, with ``protocol`` and
        ``channels``). ``topoplan plan -o`` writes the same schedule.

    Raises
    ------
    PlannerError
        Unknown algorithm (the message lists the known ones), an option the planner does
        not take (the message lists those it takes), a size that is not a positive
        number of bytes, a collective the planner does not plan (the message lists
        the planners that do), or ``channels`` out of range or with a plan of native
        steps (``nccl``, ``composed``; ``auto`` with ``channels`` leaves them out).
    InfeasiblePlanError
        No candidate (or not the named planner) could plan within the caps, or the plan
        on ``channels`` channels breaks ``max_chunks`` or ``max_step_ops``.
    """
    with _nccl_told(nccl_version, nccl_algo, nccl_proto):
        request = PlanRequest.make(cluster, size=size, collective=collective, profile=profile,
                                   max_step_ops=max_step_ops, max_chunks=max_chunks,
                                   algorithm=algorithm, **options)
        return execute(request).schedule


def _nccl_told(version: str | None, algo: str | None,
               proto: str | None) -> contextlib.AbstractContextManager[Any]:
    """:func:`~topoplan.analysis.native.nccl_env.nccl_settings` for the API's
    ``nccl_*`` arguments; a bad one is a :class:`PlannerError`."""
    from ..analysis.native.nccl_env import nccl_settings
    try:
        return nccl_settings(version, algo, proto)
    except ValueError as exc:
        raise PlannerError(str(exc)) from None
