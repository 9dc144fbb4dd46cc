"""Tags of calls in flight: epochs, lanes, and the queue of calls on one transport.

Every message of a call is tagged with its sequence number on its pair of ranks, offset
by the call's *epoch* (calls of one executor take the epochs ``0 .. EPOCHS - 1`` in
turn) and by its *lane* (the k-th call on a transport, of any executor, takes lane
``k % LANES``). Every rank makes the same calls in the same order, so ranks agree on
both without talking. :class:`CallQueue` holds a transport's calls in flight, in start
order, across executors. See :mod:`topoplan.runtime.executor` for why.
"""

from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

from ..transports.base import TAG_LIMIT, Transport

Call = TypeVar("Call")  # a call in flight: topoplan.runtime.executor.handle's handle

__all__ = ["EPOCHS", "LANES", "LANE_WIDTH", "CallQueue", "queue_of", "epochs_for", "fits_a_lane",
           "tag_shift"]

#: Calls take turns through this many tag epochs (see :mod:`topoplan.runtime.executor`). A failed
#: call's late messages are dropped by the start of the next EPOCHS - 1 calls, and the
#: transport keeps a set of per-step requests per epoch (MPI's persistent ones).
EPOCHS = 4
#: Calls of different executors on one tagged, pollable transport run side by side in
#: this many tag lanes: each call, of any executor, takes lane ``k % LANES`` for the k-th
#: call on the transport (every rank makes the same calls in the same order, so they
#: agree), and its tags are offset by ``lane * LANE_WIDTH``. An executor whose tags of
#: all epochs do not fit in a lane (more than LANE_WIDTH / EPOCHS messages on a pair)
#: runs its calls alone.
LANES = 4
LANE_WIDTH = TAG_LIMIT // LANES


def epochs_for(span: int) -> int:
    """The epochs an executor whose calls send at most ``span`` messages on a pair takes
    turns through: :data:`EPOCHS`, or 1 when their tags would not fit (every call then
    uses the same tags, and nothing is drained)."""
    return EPOCHS if span * EPOCHS <= TAG_LIMIT else 1


def fits_a_lane(span: int, epochs: int) -> bool:
    """Whether the tags of every epoch of such an executor fit in one lane, so its calls
    can run side by side with other executors'."""
    return span * epochs <= LANE_WIDTH


def tag_shift(epoch: int, lane: int, span: int) -> int:
    """What the tags of a call in ``epoch`` and ``lane`` are offset by."""
    return epoch * span + lane * LANE_WIDTH


class CallQueue(Generic[Call]):
    """The calls in flight on one transport, in start order, across executors."""

    __slots__ = ("calls", "lock", "made")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.RLock()
        self.made = 0  # calls made on the transport so far, by every executor: lanes

    def lane(self) -> int:
        """The lane of a new call (and count it)."""
        lane = self.made % LANES
        self.made += 1
        return lane


def queue_of(transport: Transport) -> CallQueue[Any]:
    """The transport's queue of calls in flight (made on first use, kept on the transport)."""
    queue = getattr(transport, "_topoplan_calls", None)
    if queue is None:
        queue = CallQueue[Any]()
        transport._topoplan_calls = queue  # type: ignore[attr-defined]
    return queue
