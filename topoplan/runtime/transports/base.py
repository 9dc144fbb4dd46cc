"""The one small interface every transport implements.

A transport moves bytes between ranks; it knows nothing about schedules. The
executor (:mod:`topoplan.runtime.executor`) hands it, per step, a list of
:class:`Message` objects (sends and receives on buffer views it prepared once
with :meth:`Transport.prepare`), turns each step's list once into a batch with
:meth:`Transport.batch`, starts a batch's messages all at once with
:meth:`Transport.start`, and waits with :meth:`Transport.wait`, which always has a
deadline. Reductions are the executor's job, not the transport's.

Ordering contract: messages between an ordered pair of ranks that carry the same
``tag`` match in the order they were started (MPI's non-overtaking rule), and a
receive matches only a message with its tag. The executor gives every message of a
call its own tag on its pair, shifted by the call's epoch, so that a failed call's
late messages cannot match a later call (:mod:`topoplan.runtime.executor`).

Channels (IR v4): a call whose schedule has several channels posts each channel's steps
on its own, so several of a call's batches are in flight at once; on a pollable
transport the executor tests each and, when none is done, waits in
:meth:`Transport.wait_any` for any of them. Every channel's messages carry tags of
their own, so a tagged transport needs nothing more; an untagged one gets the channels
one after another.

Native steps (IR v3, :class:`topoplan.ir.schedule.Native`) run the transport's own
collective over a group of ranks. The executor first has every rank make the groups of
a schedule with :meth:`Transport.make_groups` (collective over every rank of the
transport, non-members included, in the same order everywhere: MPI's ``Comm.Split``
and torch's ``new_group`` are); the transport keeps one sub-communicator per group,
made once. It then binds each native step of a buffer once with
:meth:`Transport.native` (a :class:`Collective` -> a :class:`NativeWork`), and per call
starts, tests, waits for and finishes it like a step's messages. Collectives carry no
tags: the executor runs the calls that share a group one after another, so every
member issues them in the same order.
"""

from __future__ import annotations

import abc
import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, ContextManager, Sequence

from ...errors import TopoplanError, TransportError

__all__ = ["Transport", "Message", "PeerFailure", "Deadline", "NoNative", "Group", "Collective",
           "NativeWork", "any_moved"]

#: Tags stay below 2**15: MPI promises at least 32767 for MPI_TAG_UB.
TAG_LIMIT = 1 << 15


@dataclass(slots=True)
class Message:
    """One point-to-point transfer of a step.

    Attributes
    ----------
    send : bool
        True for a send, False for a receive.
    wire : object
        What the transport moves, as returned by :meth:`Transport.prepare` for the
        buffer view (a byte view for MPI, a tensor for torch, a pointer for NCCL).
    peer : int
    tag : int
        In ``range(TAG_LIMIT)``.
    """

    send: bool
    wire: Any
    peer: int
    tag: int


class PeerFailure(Exception):
    """Raised by a transport's :meth:`~Transport.wait` when a message failed.

    ``index`` is the position of the failed message in the started list and
    ``reason`` what the transport reported (peer gone, connection reset, ...). The
    executor turns it into a :class:`~topoplan.TransportError` naming the step,
    peer and chunk.
    """

    def __init__(self, index: int, reason: str) -> None:
        self.index, self.reason = index, reason
        super().__init__(f"message {index}: {reason}")


class NoNative(TopoplanError):
    """The transport has no native collective for this call (gloo without
    reduce-scatter, MPI without a bfloat16 sum): benchmarks report the baseline as
    missing instead of failing. Raised on every rank alike, before anything is sent."""


#: A native op's group: its ranks, in the op's order (part ``i`` belongs to ``group[i]``).
Group = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Collective:
    """One native step of a bound buffer, as the executor hands it to :meth:`Transport.native`.

    Attributes
    ----------
    kind : str
        ``"allreduce"``, ``"reduce_scatter"``, ``"allgather"``, ``"broadcast"`` or
        ``"reduce"`` (:class:`topoplan.ir.schedule.NativeKind` values).
    group : tuple of int
        The members, in the op's order; :meth:`Transport.make_groups` made their
        sub-communicator before.
    index : int
        This rank's place in ``group``.
    view : object
        The op's elements: a 1-D contiguous view of the buffer the call runs on (numpy,
        torch or cupy, the buffer's dtype), as the executor's copies and sums see it.
    parts : tuple of int
        ``len(group) + 1`` offsets into ``view``: part ``i`` (member ``group[i]``'s) is
        ``view[parts[i]:parts[i + 1]]``. Parts may differ in size (the chunks' element
        counts do) and may be empty. ``(0, len(view))`` for unparted kinds.
    root : int or None
        The root's place in ``group`` (broadcast and reduce), else None.
    empty : callable
        ``empty(n)``: a new 1-D array like ``view`` (kind, dtype, device) of ``n``
        elements, for the scratch a transport needs (made once, when binding).
    """

    kind: str
    group: Group
    index: int
    view: Any
    parts: tuple[int, ...]
    root: int | None
    empty: Callable[[int], Any]

    @property
    def size(self) -> int:
        """Elements of the op's range."""
        return self.parts[-1]

    @property
    def counts(self) -> tuple[int, ...]:
        """Elements of each part (one part, the whole range, for unparted kinds)."""
        return tuple(b - a for a, b in zip(self.parts, self.parts[1:]))

    @property
    def equal(self) -> bool:
        """Whether every part has the same number of elements."""
        return len(set(self.counts)) == 1

    def part(self, i: int) -> tuple[int, int]:
        """Offsets ``[start, end)`` in ``view`` of member ``group[i]``'s part."""
        return self.parts[i], self.parts[i + 1]


class NativeWork(abc.ABC):
    """A native step bound to its buffer (:meth:`Transport.native`): started, polled,
    waited for and finished once per call, again and again.

    The executor calls :meth:`start` when the step begins (values are read then), then
    :meth:`test` or :meth:`wait` until it is done (or :meth:`run` for both), then
    :meth:`finish` (values are written by then), or :meth:`abort` after a failure. ``call`` names what the
    transport runs, for messages (``"MPI_Ireduce_scatter_block"``).
    """

    call: str = "?"

    @abc.abstractmethod
    def start(self) -> None:
        """Post the collective (non-blocking).

        Raises
        ------
        PeerFailure
            When it cannot be posted (a sub-communicator broken by an earlier failure).
        """

    @abc.abstractmethod
    def test(self) -> bool:
        """Whether the posted collective is done; never blocks.

        Raises
        ------
        PeerFailure
            When it failed.
        """

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; whether it is done.

        Raises
        ------
        PeerFailure
            When it failed (a member died, the members disagree).
        """

    def run(self, timeout: float) -> bool:
        """Start and wait for it (the executor's calls that run to the end, with nothing
        else in flight); whether it is done. A transport may run its blocking
        collective here instead (MPI's ``blocking_natives``)."""
        self.start()
        return self.wait(timeout)

    def finish(self) -> None:
        """After it is done: copy results from scratch into the view, where needed."""

    def abort(self) -> None:
        """Give up after a failure or a timeout (best effort). A collective cannot be
        cancelled: the transport marks the group's sub-communicator broken, and later
        native steps over it fail at once."""


class Deadline:
    """A point in time (``time.monotonic``) with helpers for polling loops."""

    __slots__ = ("at",)

    def __init__(self, timeout: float) -> None:
        self.at = time.monotonic() + timeout

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.at



def any_moved(tests: Sequence[Callable[[], bool]]) -> bool:
    """Whether one of ``tests`` is done, or failed (a :class:`PeerFailure` is news for the
    caller's wait too: it moves on to the step that raises it)."""
    for test in tests:
        try:
            if test():
                return True
        except PeerFailure:
            return True
    return False

class Transport(abc.ABC):
    """A communicator that moves buffer views between ranks.

    Subclasses set ``name`` (``"mpi"``, ``"torch"``, ``"nccl"``, ``"local"``),
    ``native_name`` (the baseline allreduce's name), ``native_names`` (the baseline
    of each collective they have natively) and the ``rank``/``size`` attributes.
    """

    name: str = "?"
    native_name: str = "?"
    #: The transport's own collective for each collective name it runs natively
    #: (``native_reduce_scatter`` / ``native_allgather``); ``native_name`` for allreduce.
    native_names: ClassVar[dict[str, str]] = {}
    rank: int
    size: int
    #: Messages match by tag (MPI, gloo, local). A transport that matches by posting
    #: order alone (NCCL) sets False, and the executor then runs one call at a time.
    tagged: bool = True
    #: :meth:`test` tells a finished step from a running one without blocking. False
    #: where messages only complete inside :meth:`wait` (gloo's point-to-point work):
    #: the executor then runs calls in flight one at a time and moves them in ``wait``.
    pollable: bool = True

    # -- the hot path ---------------------------------------------------------
    def prepare(self, view: Any) -> Any:
        """Turn a 1-D contiguous buffer view into what :meth:`start` moves.

        Called once per view when the executor binds a buffer, never per step.
        The default passes the view through.
        """
        return view

    def batch(self, messages: Sequence[Message]) -> Any:
        """Turn one step's messages into what :meth:`start` posts, once.

        The executor calls it the first time a step of a bound buffer runs and
        passes the result to :meth:`start` on every later call: the views are
        fixed after binding, so a transport can set up per-step state here once
        (MPI builds persistent requests) instead of on every step. The default
        passes the list through.
        """
        return messages

    @abc.abstractmethod
    def start(self, batch: Any) -> Any:
        """Post every message of a step at once and return a handle for :meth:`wait`.

        ``batch`` is what :meth:`batch` returned for the step (by default its list
        of :class:`Message`). Receives and sends of one step are posted together,
        so a step that both sends to and receives from the same peer cannot
        deadlock.
        """

    @abc.abstractmethod
    def wait(self, handle: Any, timeout: float) -> list[int]:
        """Wait up to ``timeout`` seconds for the messages of ``handle``.

        Returns
        -------
        list of int
            Indices (into the started list) of messages still incomplete when the
            time ran out; empty when everything finished.

        Raises
        ------
        PeerFailure
            When the transport saw a message fail (peer died, connection reset).
        """

    def test(self, handle: Any) -> bool:
        """Whether :meth:`wait` on ``handle`` would return at once: every message is
        done, or one failed. Never blocks, and may be called again and again (the
        executor polls it for calls in flight, :meth:`topoplan.Allreduce.start`).

        The default asks :meth:`wait` with no time, which suits transports whose wait
        can be repeated; one that takes messages out as they arrive overrides it.
        """
        return not self.wait(handle, 0.0)

    def wait_any(self, tests: Sequence[Callable[[], bool]], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until one of ``tests`` says True (or raises
        :class:`PeerFailure`, which the caller's own test then reports); whether one did.

        The executor calls it when none of a call's channels (IR v4) moved: each test is
        :meth:`test` on a channel's posted step, or a native step's ``test``. The
        default polls them, and after a few rounds sleeps between rounds, backing off to
        1 ms (as the executor's calls in flight do), so a rank never spins on a core its
        peers need. A transport that can sleep until something arrives overrides it.
        """
        deadline = time.monotonic() + timeout
        rounds = 0
        while True:
            if any_moved(tests):
                return True
            if time.monotonic() >= deadline:
                return False
            rounds += 1
            self.pause(rounds)

    def pause(self, rounds: int) -> None:
        """Between rounds of :meth:`wait_any` that found nothing (``rounds`` so far):
        give the CPU away. The default keeps polling for 64 rounds, then sleeps 10 us a
        round more, up to 1 ms."""
        if rounds > 64:
            time.sleep(min(1e-3, 1e-5 * rounds))

    def abort(self, handle: Any) -> None:
        """Give up on the messages of ``handle`` after a failure (best effort).

        The step's batch must stay usable: a caller may retry the allreduce.
        """

    def discard(self, peer: int, tag: int, timeout: float) -> bool:
        """Receive and drop one message from ``peer`` with ``tag`` if it has arrived.

        The executor calls it for the messages a failed call may have left in flight.
        Returns False when none has arrived, or when the transport cannot look (the
        default; a late message then waits until its tag comes round again).
        """
        return False

    # -- native steps (IR v3) ----------------------------------------------------
    def make_groups(self, groups: Sequence[Group]) -> None:
        """Make the sub-communicators of ``groups`` that are not made yet (cached on the
        transport for every later executor).

        Collective over every rank of the transport, members or not: every rank must
        call it with the same groups in the same order (the executor lists a
        schedule's groups by first appearance, on every rank alike), with no call in
        flight on the transport. The whole world in rank order is the transport's own
        communicator (:meth:`_world_group`), not a copy.

        Raises
        ------
        NoNative
            The transport runs no native collectives (the default).
        """
        made = self._groups()
        for group in groups:
            if group not in made:
                made[group] = (self._world_group() if group == tuple(range(self.size))
                               else self._new_group(group))

    def has_group(self, group: Group) -> bool:
        """Whether :meth:`make_groups` made ``group``'s sub-communicator already."""
        return group in self._groups()

    def group_of(self, group: Group) -> Any:
        """The sub-communicator of ``group`` (:meth:`make_groups` made it; None where
        this rank is not a member)."""
        return self._groups()[group]

    def _groups(self) -> dict[Group, Any]:
        made = self.__dict__.get("_native_groups")
        if made is None:
            made = self.__dict__["_native_groups"] = {}
        return made

    def _world_group(self) -> Any:
        """The sub-communicator of every rank in rank order (the transport's own)."""
        return self._new_group(tuple(range(self.size)))

    def _new_group(self, group: Group) -> Any:
        """A new sub-communicator of ``group`` (None where this rank is not a member);
        called on every rank in the same order."""
        raise NoNative(f"the {self.name} transport runs no native collectives; lower the "
                       "schedule's native steps to point-to-point")

    def native(self, op: Collective) -> NativeWork:
        """Bind a native step (once per bound buffer): what the executor starts, tests,
        waits for and finishes on every call.

        Raises
        ------
        NoNative
            The transport runs no native collectives (the default).
        """
        raise NoNative(f"the {self.name} transport runs no native collectives; lower the "
                       "schedule's native steps to point-to-point")

    def compute_context(self) -> ContextManager[Any]:
        """Context the executor runs a whole call in: its copies and reductions
        happen inside it (for NCCL, on the transport's CUDA stream)."""
        return contextlib.nullcontext()

    # -- small collectives used by benchmarks and checks ---------------------
    @abc.abstractmethod
    def native_allreduce(self, buffer: Any) -> None:
        """Sum ``buffer`` over all ranks in place with the transport's own allreduce."""

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        """Rank ``r``'s ``output`` (``1/size`` of ``input``'s elements) becomes shard ``r``
        of the sum of every rank's ``input``, with the transport's own reduce-scatter
        (``MPI_Reduce_scatter_block``'s layout).

        Raises
        ------
        NoNative
            The transport has none (the default).
        """
        raise NoNative(f"the {self.name} transport has no native reduce-scatter")

    def native_allgather(self, input: Any, output: Any) -> None:
        """``output`` (``size`` times ``input``'s elements) becomes every rank's ``input``
        in rank order, with the transport's own allgather (``MPI_Allgather``'s layout).

        Raises
        ------
        NoNative
            The transport has none (the default).
        """
        raise NoNative(f"the {self.name} transport has no native allgather")

    def native_name_of(self, collective: str) -> str:
        """The name of the transport's own ``collective`` (for tables)."""
        if collective == "allreduce":
            return self.native_name
        return self.native_names.get(collective, f"native {collective}")

    @abc.abstractmethod
    def allreduce_max(self, value: float) -> float:
        """The maximum of ``value`` over all ranks (a float; used for timings)."""

    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        """The maximum over all ranks of each of ``values`` (every rank passes as many),
        in one small collective where the transport has one (the default: one
        :meth:`allreduce_max` each). Max is exact, so every rank gets the same floats:
        the measured choice agrees on its statistics with it."""
        return [self.allreduce_max(v) for v in values]

    @abc.abstractmethod
    def barrier(self) -> None:
        """Wait until every rank has called it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def wire_error(rank: int, message: str) -> TransportError:
    """A TransportError for a failure that no single op can be blamed for."""
    return TransportError(f"rank {rank}: {message}", rank=rank)
