"""Collective planners: one module per algorithm, one signature, and the ``plan`` facade.

Every planner is ``plan_x(cluster, *, size, chunks=None, profile=None, **options) ->
Schedule`` and sets ``meta["algorithm"]``, ``meta["cluster"]`` and ``meta["profile"]``;
a planner that plans more than allreduce takes ``collective=``. :data:`SPECS` declares
each one (:class:`~topoplan.planners.registry.PlannerSpec`: the collectives it plans, the
options it takes); :data:`PLANNERS` maps the names to the functions; :func:`register`
adds one. :func:`plan`, ``auto`` and ``topoplan plan`` go through one pipeline
(:mod:`~topoplan.planners.pipeline`): a validated
:class:`~topoplan.planners.pipeline.PlanRequest`, :func:`run` and :func:`compare`.
:func:`plan` adds ``meta["cluster_fingerprint"]`` (:mod:`topoplan.ir.fingerprint`),
``meta["size_bytes"]`` and ``meta["nccl"]`` (:func:`stamp`). ``profile`` is the
runtime's :class:`~topoplan.analysis.cost.CostProfile` (or a name): planners pick their
pipelining depth, and ``mcf`` its construction, against it.
"""

from __future__ import annotations

import os

from typing import Any

from ..cluster import Cluster
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE
from ..analysis.cost import CostProfile
from ..ir.fingerprint import META_KEY, cluster_fingerprint
from ..ir.schedule import Schedule
from ..errors import InfeasiblePlanError, PlannerError
from ._checks import unknown_options
from ._order import topo_order
from .hierarchical import plan_hierarchical
from .pipeline import Candidate, PlanRequest, compare, nccl_candidate, run
from .registry import (PLANNERS, SPECS, LazyPlanner, PlannerSpec, candidates, collectives_of,
                       options_of, planners_for, register, require_collective, takes)
from .rhd import plan_rhd
from .ring import plan_ring, plan_ring_topo
from .tree import plan_tree

__all__ = ["PLANNERS", "SPECS", "plan", "register", "candidates", "takes", "options_of",
           "PlannerError", "collectives_of", "planners_for", "require_collective",
           "PlannerSpec", "PlanRequest", "Candidate", "compare", "run", "nccl_candidate",
           "stamp",
           "LazyPlanner",
           "plan_ring",
           "plan_ring_topo", "plan_tree", "plan_rhd", "plan_hierarchical", "topo_order"]

def plan(cluster: Cluster | str | os.PathLike, algorithm: str = "auto", *,
         size: int | str = 256 << 20,
         profile: CostProfile | str | None = None, collective: str = DEFAULT_COLLECTIVE,
         max_step_ops: int | None = None, max_chunks: int | None = None,
         **options: Any) -> Schedule:
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
        :func:`topoplan.planners.channels.channelize`, applied after planning; default 1:
        the plan as planned). ``max_chunks`` and ``max_step_ops`` hold for the result:
        the planner plans to them divided by ``channels``. ``mcf`` plans and prices its
        pipeline for the channels (its estimate is the channels' time), and with
        ``"auto"`` picks 1, 2 or 4 by that estimate; the others are cut after planning.
    channel_skew : float, optional
        The ratio of one channel's slice of the data to the next one's (default
        :data:`topoplan.planners.channels.SKEW`, 1.2; 1 cuts equal slices, as NCCL does,
        which gain nothing: see :func:`~topoplan.planners.channels.channelize`).
    vectored : bool, optional
        Merge each step's messages from one rank to one peer into one vectored message
        (IR v4, :func:`topoplan.ir.schedule.vectorize`, applied after planning and after
        ``channels``; default False): the same data in fewer ops, which pays under a
        profile with a per-op posting cost (``nccl``). Plans with native steps are
        vectorized in their point-to-point steps only.
    **options
        Passed to the planner (``chunks``, ``order``, ...; ``auto``: ``candidates``,
        ``machine``).

    Returns
    -------
    Schedule
        With ``meta["cluster_fingerprint"]``, the cluster's
        :func:`~topoplan.ir.fingerprint.cluster_fingerprint`, ``meta["size_bytes"]``, the size
        it was planned for, and ``meta["nccl"]``: what NCCL itself runs for the same
        collective and size on the cluster and its time there
        (:meth:`topoplan.analysis.native.nccl.NcclChoice.to_dict`; ``algorithm`` is ``"nccl"``,
        NCCL's own is ``nccl_algorithm``, with ``protocol`` and ``channels``).

    Raises
    ------
    PlannerError
        Unknown algorithm (the message lists the known ones), an option the planner does
        not take (the message lists those it takes), a size that is not a positive
        number of bytes, a collective the planner does not plan (the message lists
        the planners that do), or ``channels`` out of range or with a plan of native
        steps (``nccl``, ``composed``; ``auto`` with ``channels`` leaves them out).
    InfeasiblePlanError
        The plan on ``channels`` channels breaks ``max_chunks`` or ``max_step_ops``.
    """
    if algorithm not in SPECS:
        raise PlannerError(f"unknown algorithm {algorithm!r}; known: {', '.join(sorted(SPECS))}")
    machine = options.pop("machine", None)
    channels = options.pop("channels", 1)
    vectored = options.pop("vectored", False)
    if not isinstance(vectored, bool):
        raise PlannerError(f"vectored: must be True or False, got {vectored!r}")
    from ..ir.passes import check_channels, check_skew
    from .channels import SKEW, per_channel
    skew = options.pop("channel_skew", SKEW)
    if channels == "auto":
        named = options.get("candidates") if algorithm == "auto" else [algorithm]
        if named is not None and not any(
                "channels" in SPECS[n].options for n in named if n in SPECS):
            raise PlannerError(f"channels='auto': only mcf picks its channels, not "
                               f"{', '.join(map(str, named))}; give a count")
        check_skew(skew)
    elif channels != 1:  # checked before planning: a bad value fails fast
        check_channels(channels)
        check_skew(skew)
    # A planner that takes ``channels`` (mcf) plans and prices them itself; for the
    # others every chunk is C chunks and every op C ops once cut: the planner plans to
    # the caps over C (checked again on the result).
    # (``auto`` with channels="auto": mcf picks its channels, the others run on one)
    itself = channels != 1 and ("channels" in SPECS[algorithm].options
                                or channels == "auto")
    if itself:
        options.update(channels=channels, channel_skew=skew)
    # ... and likewise vectored messages, which it prices (fewer ops to post)
    vectors = vectored and "vectored" in SPECS[algorithm].options
    if vectors:
        options["vectored"] = True
    divide = 1 if itself else channels
    request = PlanRequest.make(cluster, size=size, collective=collective, profile=profile,
                               max_step_ops=per_channel(max_step_ops, divide),
                               max_chunks=per_channel(max_chunks, divide),
                               machine=machine, who=algorithm, **options)
    if algorithm == "auto":
        from .auto import choose
        limits = {k: v for k, v in request.options.items()
                  if k in ("candidates", "max_sim_ops", "max_plan_ranks")}
        if channels != 1 and not itself and limits.get("candidates") is None:
            # native steps cannot be cut over channels: compare the others
            from .channels import NATIVE_PLANNERS
            from .pipeline import default_names
            more = {"max_plan_ranks": limits["max_plan_ranks"]} if "max_plan_ranks" in limits else {}
            limits["candidates"] = [n for n in default_names(request, **more)
                                    if n not in NATIVE_PLANNERS]
    try:
        if algorithm == "auto":
            schedule = choose(request, **limits)
        else:
            if machine is not None:
                raise unknown_options(algorithm, ["machine"], list(SPECS[algorithm].options))
            schedule = run(request, algorithm)
    except InfeasiblePlanError as exc:
        if channels == 1 or (max_chunks is None and max_step_ops is None):
            raise
        raise InfeasiblePlanError(f"{exc} (on {channels} channels the caps per channel are "
                                  f"max_chunks={per_channel(max_chunks, channels)}, max_step_ops="
                                  f"{per_channel(max_step_ops, channels)})") from None
    if channels != 1 and not itself:
        from .channels import check_caps_on_channels
        from ..ir.passes import channelize
        schedule = check_caps_on_channels(channelize(schedule, channels, skew), channels,
                                          max_step_ops, max_chunks)
    if vectored and not vectors:
        from ..ir.passes import vectorize
        schedule = vectorize(schedule)
    return stamp(request, schedule)


def stamp(request: PlanRequest, schedule: Schedule) -> Schedule:
    """``schedule`` with what :func:`plan` records: the cluster's fingerprint, the size it
    was made for, the profile and the ``nccl`` row."""
    # The size it was made for: simulate marks the sizes it runs that are not this one.
    extra: dict[str, Any] = {META_KEY: cluster_fingerprint(request.cluster),
                             "size_bytes": request.size}
    if "profile" not in schedule.meta:
        extra["profile"] = request.profile.name
    from ..analysis.sim.run import nccl_row
    choice = nccl_row(request.where, request.size, request.collective)
    if choice is not None:
        extra["nccl"] = choice.to_dict()
    return schedule.with_meta(**extra)
