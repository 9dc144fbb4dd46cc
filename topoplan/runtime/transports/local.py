"""``Local``: ranks as threads of one process, sharing mailboxes.

For tests, notebooks and debugging schedules without launching processes. Sends
copy their data eagerly (like an MPI eager send), so a send completes at once
and the sender may overwrite its chunk afterwards; receives complete when the
matching message arrives. A rank whose function returned or raised counts as
gone: a receive that waits on it fails at once instead of waiting out the timeout.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Sequence

from ...errors import TopoplanError, TransportError
from .base import Deadline, Message, PeerFailure, Transport

__all__ = ["Local", "LocalWorld"]


def _snapshot(view: Any) -> Any:
    return view.clone() if hasattr(view, "clone") else view.copy()


def _take(box: deque | None, tag: int) -> Any:
    """Remove and return the payload of the first message in ``box`` with ``tag``, or None."""
    if box:
        for k, (t, data) in enumerate(box):
            if t == tag:
                del box[k]
                return data
    return None


class LocalWorld:
    """The shared state of ``nranks`` thread ranks: mailboxes, barrier, reductions."""

    def __init__(self, nranks: int) -> None:
        if nranks < 1:
            raise TopoplanError(f"a local world needs at least 1 rank, got {nranks}")
        self.nranks = nranks
        self.cond = threading.Condition()
        self.mail: dict[tuple[int, int], deque] = {}
        self.gone: dict[int, str] = {}
        self.slots: list[Any] = [None] * nranks
        self._barrier = threading.Barrier(nranks)

    def transport(self, rank: int, timeout: float = 60.0) -> Local:
        return Local(self, rank, timeout=timeout)

    def leave(self, rank: int, why: str, *, failed: bool) -> None:
        with self.cond:
            self.gone[rank] = why
            self.cond.notify_all()
        if failed:
            # Only a failure breaks the barrier: a rank that finished normally has
            # passed every barrier, and aborting would race ranks still waking from one.
            self._barrier.abort()

    def barrier(self, rank: int, timeout: float) -> None:
        try:
            self._barrier.wait(timeout)
        except threading.BrokenBarrierError:
            raise TransportError(f"rank {rank}: local barrier broken: a rank left "
                                 f"({self._gone_text()}) or timed out", rank=rank) from None

    def _gone_text(self) -> str:
        return ", ".join(f"rank {r} {why}" for r, why in sorted(self.gone.items())) or "none gone"


class Local(Transport):
    """One rank of a :class:`LocalWorld` (threads in one process).

    Parameters
    ----------
    world : LocalWorld
    rank : int
    timeout : float
        Seconds the barrier-based helpers (:meth:`barrier`, :meth:`native_allreduce`)
        wait; the executor passes its own timeout to :meth:`wait`.

    Examples
    --------
    >>> results = Local.launch(4, lambda t: t.allreduce_max(t.rank))
    >>> results
    [3.0, 3.0, 3.0, 3.0]
    """

    name = "local"
    native_name = "local sum"
    native_names = {"allreduce": "local sum", "reduce_scatter": "local sum, shard",
                    "allgather": "local gather"}

    def __init__(self, world: LocalWorld, rank: int, *, timeout: float = 60.0) -> None:
        if not 0 <= rank < world.nranks:
            raise TopoplanError(f"rank {rank} out of range({world.nranks})")
        self.world, self.rank, self.size, self.timeout = world, rank, world.nranks, timeout

    # -- p2p ---------------------------------------------------------------------
    def start(self, messages: Sequence[Message]) -> list[tuple[int, Message]]:
        world = self.world
        outgoing = [(m.peer, m.tag, _snapshot(m.wire)) for m in messages if m.send]
        if outgoing:
            with world.cond:
                for peer, tag, data in outgoing:
                    world.mail.setdefault((self.rank, peer), deque()).append((tag, data))
                world.cond.notify_all()
        return [(i, m) for i, m in enumerate(messages) if not m.send]

    def wait(self, handle: list[tuple[int, Message]], timeout: float) -> list[int]:
        world, deadline = self.world, Deadline(timeout)
        pending = handle
        while pending:
            ready: list[tuple[Message, Any]] = []  # (recv, payload array)
            waiting: list[tuple[int, Message]] = []
            with world.cond:
                for i, m in pending:
                    # As MPI matches: the first message from the peer with the tag.
                    data = _take(world.mail.get((m.peer, self.rank)), m.tag)
                    if data is not None:
                        ready.append((m, data))
                    else:
                        waiting.append((i, m))
                if waiting and not ready:
                    for i, m in waiting:
                        if m.peer in world.gone:
                            raise PeerFailure(i, f"peer {m.peer} {world.gone[m.peer]} "
                                                 "without sending")
                    left = deadline.left()
                    if left <= 0:
                        return [i for i, _ in waiting]
                    world.cond.wait(left)
            for m, data in ready:  # copy outside the lock: other ranks keep going
                if m.wire.shape != data.shape:
                    raise TransportError(f"rank {self.rank}: message from rank {m.peer} has "
                                         f"{data.shape[0]} elements, expected {m.wire.shape[0]}",
                                         rank=self.rank, peer=m.peer)
                m.wire[...] = data
            pending = waiting
        return []

    def test(self, handle: list[tuple[int, Message]]) -> bool:
        # Look without taking: wait() takes the messages (sends completed at start).
        world = self.world
        with world.cond:
            for _, m in handle:
                box = world.mail.get((m.peer, self.rank))
                if not (box and any(t == m.tag for t, _ in box)) and m.peer not in world.gone:
                    return False
        return True

    def discard(self, peer: int, tag: int, timeout: float) -> bool:
        with self.world.cond:
            return _take(self.world.mail.get((peer, self.rank)), tag) is not None

    # -- collectives -----------------------------------------------------------------
    def barrier(self) -> None:
        self.world.barrier(self.rank, self.timeout)

    def native_allreduce(self, buffer: Any) -> None:
        """Sum in rank order through shared memory: the same bits on every rank."""
        world = self.world
        world.slots[self.rank] = _snapshot(buffer)
        self.barrier()
        total = _snapshot(world.slots[0])
        for other in world.slots[1:]:
            total += other
        self.barrier()
        buffer[...] = total

    def native_reduce_scatter(self, input: Any, output: Any) -> None:
        """The rank's shard of the sum in rank order (as :meth:`native_allreduce`)."""
        total = _snapshot(input.reshape(-1))
        self.native_allreduce(total)
        m = output.reshape(-1).shape[0]
        output.reshape(-1)[...] = total[self.rank * m:(self.rank + 1) * m]

    def native_allgather(self, input: Any, output: Any) -> None:
        """Every rank's input, in rank order, through shared memory."""
        world = self.world
        world.slots[self.rank] = _snapshot(input.reshape(-1))
        self.barrier()
        flat, m = output.reshape(-1), input.reshape(-1).shape[0]
        for r, part in enumerate(world.slots):
            flat[r * m:(r + 1) * m] = part
        self.barrier()

    def allreduce_max(self, value: float) -> float:
        world = self.world
        world.slots[self.rank] = float(value)
        self.barrier()
        result = max(world.slots)
        self.barrier()
        return result

    # -- launching ---------------------------------------------------------------------
    @staticmethod
    def launch(nranks: int, fn: Callable[[Local], Any], *, timeout: float = 60.0,
               return_exceptions: bool = False) -> list[Any]:
        """Run ``fn(transport)`` on ``nranks`` threads and return the per-rank results
        (:func:`topoplan.runtime.transports.launch.run_threads` over a new :class:`LocalWorld`).

        Parameters
        ----------
        nranks : int
        fn : callable
            Called with each rank's :class:`Local` transport.
        timeout : float
            Seconds for the barrier helpers, and how long to wait for all threads
            after the first one ends with an error.
        return_exceptions : bool
            Put each rank's exception in its result slot instead of raising.

        Raises
        ------
        Exception
            The first rank's exception (lowest rank), unless ``return_exceptions``.
        """
        from .launch import run_threads
        world = LocalWorld(nranks)
        return run_threads(nranks, fn, lambda rank: world.transport(rank, timeout),
                           leave=world.leave, name="topoplan-local",
                           return_exceptions=return_exceptions)
