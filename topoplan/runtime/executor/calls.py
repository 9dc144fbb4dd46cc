"""The three public collectives: :class:`Allreduce`, :class:`ReduceScatter` and
:class:`AllGather`, each ``Call(schedule, transport)(buffers)`` or ``.start(buffers)``.

They differ only in the collective they run and their call signatures (one buffer in
place, or an input and an output); the engine (:class:`~topoplan.runtime.executor.engine.Executor`)
does the rest, the buffers' layout included, from the schedule's collective.
"""

from __future__ import annotations

from typing import Any

from .engine import Executor
from .handle import Handle

__all__ = ["Allreduce", "ReduceScatter", "AllGather"]


class Allreduce(Executor):
    """Run an allreduce schedule over a transport, in place.

    Parameters
    ----------
    schedule : Schedule
        An allreduce schedule for ``transport.size`` ranks (verified here, see
        ``verified``).
    transport : Transport
        :class:`~topoplan.runtime.transports.MPI`, :class:`~topoplan.runtime.transports.Torch`,
        :class:`~topoplan.runtime.transports.NCCL` or :class:`~topoplan.runtime.transports.Local`.
    timeout : float
        Seconds any one step may wait for its messages. A peer that died or never
        posts its side ends the call with :class:`~topoplan.TransportError` after
        at most this long, on every rank that waits for it.
    accumulate_fp32 : bool
        For float16/bfloat16 buffers: run the schedule on a float32 copy (twice the
        bytes on the wire) and round once at the end, instead of rounding every
        partial sum to the buffer dtype. Ignored for other dtypes.
    verified : bool
        False (the default): verify the schedule before anything is sent
        (:func:`~topoplan.ir.verify.verify_once`), once per schedule in this process:
        another executor of the same schedule object, or of an equal schedule still
        alive (one read again from its file), is not verified again, and neither is a
        schedule :func:`topoplan.plan` or :func:`topoplan.verify` returned. True: the
        caller verified it (or runs a schedule that is no collective on purpose) and
        it runs as it is.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport
        (before anything is sent), or is not an allreduce.
    ScheduleError
        When a native step cannot run (a group naming a rank outside the transport,
        a count that does not split into the group's parts, ...), naming its rank,
        step and group; when the schedule does not compute its collective (unless
        ``verified``), naming the rank, step and chunk as :func:`topoplan.verify`
        does: ``rank 0: Allreduce refuses a schedule that does not compute its
        allreduce: ring schedule: rank 3 ends with chunk 5 holding ...``. Every rank
        refuses it alike.

    Notes
    -----
    A schedule with native steps (IR v3) runs the transport's own collectives over
    sub-communicators of their groups. Building the first executor over a group makes
    its sub-communicator, which is collective over every rank of the transport: every
    rank must build the same executors in the same order (as it must make the same
    calls in the same order).

    A schedule with channels (IR v4) runs its channels at once, each channel's step
    waiting only for that channel's step before it: on MPI and Local in one polling
    loop, on gloo a thread per channel, on NCCL one channel after another (its messages
    pair by post order); see :mod:`topoplan.runtime.executor`.

    Examples
    --------
    >>> from topoplan.runtime.transports import Local
    >>> def rank_fn(t):
    ...     x = np.full(10, t.rank + 1.0)
    ...     Allreduce(schedule, t)(x)
    ...     return x
    >>> Local.launch(4, rank_fn)  # doctest: +SKIP

    Several in flight, overlapping other work (``start`` returns at once)::

        handles = [allreduce.start(bucket) for bucket in buckets]
        ...                       # compute; every start/test/wait moves them all
        for h in handles:
            h.wait()
    """

    collective = "allreduce"

    def start(self, buffer: Any) -> Handle:
        """Start summing ``buffer`` over all ranks, in place; returns at once.

        Every rank must start the same calls in the same order. The buffer must not be
        read or written until the handle's ``wait()`` (or a true ``test()``) says the
        call is done. See the module docstring for how calls in flight progress.

        Raises
        ------
        TopoplanError
            When ``buffer`` already has a call of this executor in flight.
        """
        return self._start(buffer)

    def __call__(self, buffer: Any) -> Any:
        """Sum ``buffer`` over all ranks, in place; returns ``buffer``.

        Parameters
        ----------
        buffer : numpy.ndarray, torch.Tensor or cupy.ndarray
            Contiguous, same element count and dtype on every rank.

        Raises
        ------
        TransportError
            When a step's messages do not complete within ``timeout`` or the
            transport reports a failed peer; names rank, step, peer and chunk.
        """
        return self._call(buffer)

    allreduce = __call__


class _Sharded(Executor):
    """A reduce-scatter or an allgather: an input and an output of different sizes."""

    def start(self, input: Any, output: Any) -> Handle:
        """Start the collective from ``input`` into ``output``; returns at once.

        As :meth:`Allreduce.start`; neither buffer may be touched until the handle is
        done, and its ``wait()`` returns ``output``.
        """
        return self._start(input, output)

    def __call__(self, input: Any, output: Any) -> Any:
        """Run the collective from ``input`` into ``output``; returns ``output``.

        Parameters
        ----------
        input : numpy.ndarray, torch.Tensor or cupy.ndarray
            Contiguous, the same element count and dtype on every rank: ``size``
            elements for a reduce-scatter, ``size / nranks`` (this rank's shard) for an
            allgather.
        output : same kind and dtype
            ``size / nranks`` elements for a reduce-scatter (this rank's shard of the
            sum), ``size`` for an allgather (every shard, in rank order).

        Raises
        ------
        TopoplanError
            For buffers of the wrong sizes, kinds or dtypes.
        TransportError
            As for :class:`Allreduce`.
        """
        return self._call(input, output)


class ReduceScatter(_Sharded):
    """Run a reduce-scatter schedule over a transport: ``ReduceScatter(schedule, t)(input, output)``.

    Every rank passes an input of ``size`` elements; rank ``r``'s output (``size /
    nranks`` elements) receives shard ``r`` (elements ``r * size / nranks`` up to
    ``(r + 1) * size / nranks``) of the sum of every rank's input, as
    ``MPI_Reduce_scatter_block`` and torch's ``reduce_scatter_tensor``. The schedule runs on
    a private copy of the input, so the input is left as it was.

    Parameters
    ----------
    schedule : Schedule
        A ``reduce_scatter`` schedule (``topoplan.plan(..., collective=
        "reduce_scatter")``) for ``transport.size`` ranks.
    transport : Transport
        As for :class:`Allreduce`.
    timeout : float
        As for :class:`Allreduce`.
    accumulate_fp32 : bool
        For float16/bfloat16 buffers: sum in a float32 copy and round once into the
        output.
    verified : bool
        As for :class:`Allreduce`.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport, or is
        not a reduce-scatter.
    ScheduleError
        As for :class:`Allreduce`: a native step that cannot run, or a schedule that
        does not compute a reduce-scatter (unless ``verified``).
    """

    collective = "reduce_scatter"

    reduce_scatter = _Sharded.__call__


class AllGather(_Sharded):
    """Run an allgather schedule over a transport: ``AllGather(schedule, t)(input, output)``.

    Rank ``r`` passes an input of ``size / nranks`` elements, its shard; every rank's
    output (``size`` elements) receives every rank's shard in rank order, as
    ``MPI_Allgather`` and torch's ``all_gather_into_tensor``. The schedule runs in place
    on the output, the input copied into shard ``r`` first (the input may be that very
    shard of the output).

    Parameters
    ----------
    schedule : Schedule
        An ``allgather`` schedule (``topoplan.plan(..., collective="allgather")``)
        for ``transport.size`` ranks.
    transport : Transport
        As for :class:`Allreduce`.
    timeout : float
        As for :class:`Allreduce`.
    accumulate_fp32 : bool
        Ignored: an allgather adds nothing.
    verified : bool
        As for :class:`Allreduce`.

    Raises
    ------
    TopoplanError
        When the schedule is for a different number of ranks than the transport, or is
        not an allgather.
    ScheduleError
        As for :class:`Allreduce`: a native step that cannot run, or a schedule that
        does not compute an allgather (unless ``verified``).
    """

    collective = "allgather"

    allgather = _Sharded.__call__
