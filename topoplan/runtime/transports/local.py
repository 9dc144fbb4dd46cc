"""``Local``: ranks as threads of one process, sharing mailboxes.

For tests, notebooks and debugging schedules without launching processes. Sends
copy their data eagerly (like an MPI eager send), so a send completes at once
and the sender may overwrite its chunk afterwards; receives complete when the
matching message arrives. A rank whose function returned or raised counts as
gone: a receive that waits on it fails at once instead of waiting out the timeout.

Native steps meet at a rendezvous per group (:class:`_Rendezvous`, shared by the world):
the k-th collective over a group is its round k; each member deposits a snapshot of its
range when its step starts, the last to arrive computes every member's result (sums in
group order, so every member gets the same bits), and each member copies its own out
when it waits. A member that is gone before it deposits fails the others at once, and
a member that gives up on a round (a timeout) breaks the group for every member, as on
MPI and torch: later native steps over it fail at once.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Sequence

from ...errors import TopoplanError, TransportError
from .base import (Collective, Deadline, Group, Message, NativeWork, PeerFailure, Transport,
                   any_moved)

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
        self.groups: dict[Group, _Rendezvous] = {}  # native steps' meeting places

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


class _Round:
    """One collective over a group: the members' deposits, then their results."""

    __slots__ = ("deposits", "results", "problem", "taken")

    def __init__(self) -> None:
        self.deposits: dict[int, tuple[tuple, Any]] = {}  # index -> (signature, snapshot)
        self.results: list[Any] | None = None            # by index, once all deposited
        self.problem: str | None = None                   # the members disagree
        self.taken = 0


class _Rendezvous:
    """Where a group's members meet for their collectives, round after round."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.rounds: dict[int, _Round] = {}
        self.broken: str | None = None  # a member gave up on a round: why


def _compute(op: Collective, deposits: dict[int, tuple[tuple, Any]]) -> list[Any]:
    """Every member's new range (or None: unchanged) from the members' snapshots."""
    g = len(op.group)
    data = [deposits[i][1] for i in range(g)]
    kind = op.kind
    if kind == "broadcast":
        root = op.root if op.root is not None else 0
        return [None if i == root else data[root] for i in range(g)]
    if kind == "allgather":
        whole = _snapshot(data[0])
        for j in range(1, g):
            a, b = op.part(j)
            whole[a:b] = data[j][a:b]
        return [whole] * g
    total = _snapshot(data[0])  # the sum in group order: the same bits everywhere
    for other in data[1:]:
        total += other
    if kind == "reduce":
        return [total if i == op.root else None for i in range(g)]
    if kind == "reduce_scatter":
        return [total[op.part(i)[0]:op.part(i)[1]] for i in range(g)]
    return [total] * g  # allreduce


class _LocalNative(NativeWork):
    """A native step of a :class:`Local` rank: its turn at the group's rendezvous."""

    def __init__(self, transport: Local, op: Collective) -> None:
        self.t, self.op = transport, op
        self.place = transport.world.groups[op.group]
        self.call = f"local {op.kind}"
        # What every member must agree on: kind, elements of each part, root.
        self.signature = (op.kind, op.counts, op.root)
        self.round: _Round | None = None
        self.key = 0  # the round's number

    def start(self) -> None:
        t, op = self.t, self.op
        if self.place.broken is not None:
            raise PeerFailure(0, f"the group is broken: {self.place.broken}")
        counter = t._rounds.get(op.group, 0)
        t._rounds[op.group] = counter + 1
        self.key = counter
        snapshot = _snapshot(op.view)
        world = t.world
        with world.cond:
            rnd = self.place.rounds.get(counter)
            if rnd is None:
                rnd = self.place.rounds[counter] = _Round()
            rnd.deposits[op.index] = (self.signature, snapshot)
            if len(rnd.deposits) == len(op.group):
                signatures = {i: sig for i, (sig, _) in rnd.deposits.items()}
                if len(set(signatures.values())) > 1:
                    rnd.problem = "the members disagree: " + "; ".join(
                        f"rank {op.group[i]} runs {sig[0]} of parts {list(sig[1])}"
                        + (f" root {op.group[sig[2]]}" if sig[2] is not None else "")
                        for i, sig in sorted(signatures.items()))
                    rnd.results = []
                else:
                    rnd.results = _compute(op, rnd.deposits)
                world.cond.notify_all()
        self.round = rnd

    def _check(self) -> bool:
        """Under the world's lock: whether the round is computed; raises when it never
        will be."""
        rnd = self.round
        assert rnd is not None
        if rnd.problem is not None:
            raise PeerFailure(0, rnd.problem)
        if rnd.results is not None:
            return True
        if self.place.broken is not None:
            raise PeerFailure(0, f"the group is broken: {self.place.broken}")
        gone = self.t.world.gone
        for i, member in enumerate(self.op.group):
            if i not in rnd.deposits and member in gone:
                raise PeerFailure(0, f"member {member} {gone[member]} without joining")
        return False

    def test(self) -> bool:
        with self.t.world.cond:
            return self._check()

    def wait(self, timeout: float) -> bool:
        world, deadline = self.t.world, Deadline(timeout)
        with world.cond:
            while not self._check():
                left = deadline.left()
                if left <= 0:
                    return False
                world.cond.wait(left)
        return True

    def finish(self) -> None:
        rnd, op = self.round, self.op
        assert rnd is not None and rnd.results is not None
        result = rnd.results[op.index]
        if result is not None:
            if op.kind == "reduce_scatter":
                a, b = op.part(op.index)
                op.view[a:b] = result
            else:
                op.view[...] = result
        with self.t.world.cond:
            rnd.taken += 1
            if rnd.taken == len(op.group):
                del self.place.rounds[self.key]
        self.round = None

    def abort(self) -> None:
        # As on MPI and torch, a collective given up on leaves its group broken, for
        # every member: the rounds could no longer be told apart.
        with self.t.world.cond:
            if self.place.broken is None:
                self.place.broken = f"rank {self.t.rank}'s {self.call} failed or timed out"
            self.t.world.cond.notify_all()
        self.round = None


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
        self._rounds: dict[Group, int] = {}  # collectives this rank started, per group

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

    def wait_any(self, tests: Sequence[Callable[[], bool]], timeout: float) -> bool:
        # Asleep on the world's condition: every send, native deposit and rank leaving
        # notifies it, and every test looks under the same (reentrant) lock.
        world, deadline = self.world, Deadline(timeout)
        with world.cond:
            while True:
                if any_moved(tests):
                    return True
                left = deadline.left()
                if left <= 0:
                    return False
                world.cond.wait(left)

    def discard(self, peer: int, tag: int, timeout: float) -> bool:
        with self.world.cond:
            return _take(self.world.mail.get((peer, self.rank)), tag) is not None

    # -- native steps ------------------------------------------------------------------
    def _new_group(self, group: Group) -> Any:
        # Members and non-members alike: the world's rendezvous of the group.
        with self.world.cond:
            return self.world.groups.setdefault(group, _Rendezvous(group))

    def _world_group(self) -> Any:
        return self._new_group(tuple(range(self.size)))

    def native(self, op: Collective) -> NativeWork:
        return _LocalNative(self, op)

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

    def allreduce_max_many(self, values: Sequence[float]) -> list[float]:
        world = self.world
        world.slots[self.rank] = [float(v) for v in values]
        self.barrier()
        result = [max(column) for column in zip(*world.slots)]
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
