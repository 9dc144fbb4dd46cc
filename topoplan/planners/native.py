"""The ``nccl`` plan: the transport's own collective over every rank, as one native step.

The whole collective is one native op (IR v3, docs/SCHEDULE.md) over all the ranks: an
``allreduce`` over one chunk, or a ``reduce_scatter`` / ``allgather`` over one chunk per
shard. The executor hands it to the transport's library (NCCL on GPUs, MPI or gloo on
CPUs) and the simulator prices it as that library runs it (under the ``nccl`` profile,
the NCCL model's own row, :mod:`topoplan.analysis.native.nccl`). So the yardstick that
``auto`` is measured against is also one of its candidates: ``auto`` picks it where no
plan beats it, and is then never slower than the native collective wherever the model
is right.
"""

from __future__ import annotations

from ..cluster import Cluster
from ..ir.collectives import DEFAULT as DEFAULT_COLLECTIVE
from ..ir.schedule import RankProgram, Schedule, equal_chunks, native_op
from ._lockstep import empty_schedule
from .request import PlanRequest

__all__ = ["plan_native", "native_core", "native_schedule"]


def native_schedule(nranks: int, collective: str, **meta: object) -> Schedule:
    """``collective`` over ranks ``0 .. nranks - 1`` as one native op each: one chunk for
    an allreduce, one per shard for a reduce-scatter or an allgather."""
    group = tuple(range(nranks))
    nchunks = 1 if collective == "allreduce" else nranks
    op = native_op(collective, group, 0, nchunks)
    programs = tuple(RankProgram(r, ((op,),)) for r in group)
    return Schedule(nranks=nranks, chunks=equal_chunks(nchunks), ranks=programs,
                    collective=collective, meta=dict(meta))


def plan_native(cluster: Cluster, *, size: int,
                collective: str = DEFAULT_COLLECTIVE) -> Schedule:
    """Plan ``collective`` as the transport's own collective over every rank.

    Parameters
    ----------
    cluster : Cluster
    size : int
        Message size in bytes (checked; the plan does not depend on it: the library
        picks its algorithm, protocol and channels per size itself).
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan.

    Returns
    -------
    Schedule
        One step per rank holding one native op over ``range(nranks)``
        (``meta["algorithm"] == "nccl"``); no steps on one rank.

    Raises
    ------
    PlannerError
        For a bad ``size`` or collective.
    """
    return native_core(PlanRequest.make(cluster, size=size, collective=collective,
                                        who="nccl"))


def native_core(request: PlanRequest) -> Schedule:
    """:func:`plan_native` on a validated request."""
    cluster, collective = request.cluster, request.collective
    meta = {"algorithm": "nccl", "cluster": cluster.name,
            "note": "the transport's own collective over every rank (NCCL on GPUs)"}
    if cluster.nranks == 1:
        return empty_schedule(cluster, "nccl", collective=collective, note=meta["note"])
    return native_schedule(cluster.nranks, collective, **meta)
