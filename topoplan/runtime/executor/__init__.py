"""Replay a schedule over a transport: ``topoplan.Allreduce(schedule, transport)(buffer)``,
``topoplan.ReduceScatter(schedule, transport)(input, output)`` and
``topoplan.AllGather(schedule, transport)(input, output)``.

A reduce-scatter runs its schedule on a private copy of the full input (the input is
left as it was) and copies the rank's shard out; an allgather runs in place on the
output, the rank's input copied into its shard first (docs/SCHEDULE.md, Collectives).

The executor compiles the calling rank's program once per (element count, dtype,
array kind) into flat step lists: element ranges of each chunk, messages with
their sequence tags, and slots of one reusable scratch arena for the data that
must not land in the user's buffer directly. Binding a buffer then only slices
views (cached per buffer address), and a call runs, per step: copy the few send
snapshots, post every receive and send at once, wait with a deadline, and add the
received partial sums in place. No copy of the user's buffer is made.

Semantics (docs/SCHEDULE.md): a send carries the chunk as it was when
its step started; a ``reduce`` receive adds into the chunk and a plain receive
overwrites it when the step ends. Reduce receives always land in scratch and
are added after the wait, so they never race a send of the same chunk; a plain
receive lands in the chunk itself unless the same step also sends that chunk,
and only then is the chunk copied to a send snapshot first.

Tags: every message of a call is tagged with its sequence number on its pair of ranks,
offset by the call's *epoch*. Calls take the epochs ``0 .. EPOCHS - 1`` in turn (every
rank makes the same calls, so they agree without talking), so a message that a call
which failed left in flight cannot match a receive of the next ``EPOCHS - 1`` calls:
the retry after a timeout, in particular. Before each call the executor drops, with
:meth:`Transport.discard`, the messages a failed call left behind that have arrived since:
a peer is never more than one call ahead of this rank (no allreduce, reduce-scatter or
allgather can finish without every rank's data), so a message still tagged with a failed call's epoch is
stale, never one of the calls still to come.

Calls in flight (:meth:`Allreduce.start`, :class:`Handle`): a started call is
a small state machine (the step it is at, that step's posted messages, its deadline)
that moves whenever anything polls the transport: ``start``, ``handle.test()``,
``handle.wait()`` or :meth:`Allreduce.progress`, for every call in flight on the
transport, in start order. No thread is started; MPI's progress engine runs inside the
``Test`` calls that polling makes (a rank that never polls still makes progress in the
other ranks' calls only as far as MPI's own buffering carries its sends). Several calls
of one executor run side by side on tagged transports when their epochs (so their tags)
differ and they do not share a scratch arena. Calls of different executors run side by
side in tag *lanes*: the k-th call on a transport, of any executor, takes lane
``k % LANES`` and offsets its tags by ``lane * LANE_WIDTH`` (every rank makes the same
calls in the same order, which the calls need anyway, so ranks agree on lanes without
talking); a call waits for earlier ones of its lane, and an executor whose tags do not
fit a lane runs its calls alone. Every call on an untagged transport (NCCL) runs one
after another in start order, since its messages could be confused. On gloo (``Transport.pollable``
False: its point-to-point work completes only inside a wait) calls also run one at a
time, and move only in ``wait()``: a caller that needs them to move while it computes
waits on a thread of its own, as the DDP hook's progress thread does.

Native steps (IR v3, :class:`~topoplan.ir.schedule.Native`): a step that holds one
collective over a group of ranks runs the transport's own collective on a
sub-communicator of the group. Building an executor checks its native ops (naming the
rank, step and group of a bad one) and has the transport make the sub-communicators of
groups it has not made yet (:meth:`Transport.make_groups`: collective over every rank,
in the same order everywhere; calls in flight are finished first). A native step starts
after the step before it ends and ends before the next one starts, polled against the
step's deadline like messages; calls whose schedules share a group never run side by
side (collectives carry no tags: every member must issue them in one order), and a
failed native step leaves its group broken on the transport. A native op whose range
is empty, or whose group is one rank, moves nothing and is skipped on every member.

Channels (IR v4): a rank's program is compiled channel by channel, each channel's
messages tagged in a range of its own (counting per peer and channel) and reducing in a
scratch region of its own, and a call runs its channels at once: on MPI and Local one
loop posts every channel's current step and moves each as its step completes; on gloo
each channel waits on a thread of its own; on NCCL (untagged: messages pair by post
order) the channels run one after another, channel 0's whole program first, as they do
wherever a call's tags would not fit below ``TAG_LIMIT``. A channel's step waits only
for its own previous step. Errors name the channel when a schedule has several
(:mod:`~topoplan.runtime.executor.engine` has the details and the costs).

The package holds one concept per module:

- :mod:`~topoplan.runtime.executor.calls`: the three public collectives, :class:`Allreduce`,
  :class:`ReduceScatter` and :class:`AllGather`;
- :mod:`~topoplan.runtime.executor.engine`: the engine they share (:class:`~.engine.Executor`):
  binding buffers, running calls to the end or in flight, epochs, errors;
- :mod:`~topoplan.runtime.executor.handle`: a call in flight (:class:`Handle`, also
  ``AllreduceHandle``);
- :mod:`~topoplan.runtime.executor.lanes`: tag epochs and lanes, and the queue of calls in flight
  on a transport;
- :mod:`~topoplan.runtime.executor.compiler`: a schedule -> one rank's program -> its steps bound
  to a buffer;
- :mod:`~topoplan.runtime.executor.arrays`: numpy, torch and cupy buffers behind four operations.
"""

from __future__ import annotations

from .arrays import array_ops
from .calls import AllGather, Allreduce, ReduceScatter
from .handle import AllreduceHandle, Handle

# Names topoplan/executor.py had before it became this package (tests import them).
from .arrays import ArrayOps  # noqa: E402,F401
from .compiler import compile_program as _compile  # noqa: E402,F401
from .engine import BOUND_CACHE  # noqa: E402,F401
from .lanes import EPOCHS, LANE_WIDTH, LANES  # noqa: E402,F401

__all__ = ["Allreduce", "ReduceScatter", "AllGather", "Handle", "AllreduceHandle", "array_ops"]
