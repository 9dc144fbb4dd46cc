"""A schedule's ops paired into messages, and the words for what can go wrong.

The k-th send from rank ``src`` to rank ``dst`` pairs with the k-th recv at ``dst``
from ``src``, and both name the same chunks (docs/SCHEDULE.md). :func:`verify` and
the simulator both match a schedule here, so they agree on what a message is and
name a fault in the same words: an op that names a bad peer or chunk, a send or recv
left without its partner, a pair that disagrees on the chunks, a deadlock.

Matching is vectorized (a stable sort of the ops by their ``(src, dst)`` pair) and
cached per schedule object: the simulator runs one schedule at many sizes, and a
plan is often verified and then simulated. Flattening 4 M ops costs seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_
from typing import Sequence

import numpy as np

from .._cache import ObjectCache
from ..errors import ScheduleError
from .schedule import OpKind, Schedule, chunk_text

__all__ = ["Messages", "messages", "deadlock_error", "wait_text"]


class Messages:
    """A schedule's ops flattened into arrays and matched into messages (size-free).

    Steps are numbered globally (rank after rank): ``step_base[r]`` is rank ``r``'s
    first, ``step_rank[g]`` the rank of step ``g``. Ops are numbered globally in
    program order; ``op_ptr[g]`` is step ``g``'s first. Message ``m`` (sorted by pair,
    then program order) goes from ``t_src[m]`` step ``t_sstep[m]`` (global) to
    ``t_dst[m]`` step ``t_rstep[m]``, carrying chunks ``t_chunk[m] .. + t_count[m] - 1``;
    ``t_sop``/``t_rop`` are its two ops and ``t_reduce`` says whether the recv adds.

    Raises
    ------
    ScheduleError
        For programs out of rank order, an op naming a bad peer or chunks out of range,
        an unmatched send or recv, or a message whose two ops name different chunks.
    """

    def __init__(self, schedule: Schedule) -> None:
        n = schedule.nranks
        self.nranks = n
        self.name = f"{schedule.algorithm} schedule"
        if len(schedule.ranks) != n or any(p.rank != r for r, p in enumerate(schedule.ranks)):
            raise self.error(f"expected programs for ranks 0..{n - 1} in order")
        nsteps = np.fromiter((len(p.steps) for p in schedule.ranks), np.int64, count=n)
        self.step_base = np.concatenate([[0], np.cumsum(nsteps)]).astype(np.int64)
        nglobal = int(self.step_base[-1])
        self.nglobal = nglobal
        self.step_rank = np.repeat(np.arange(n), nsteps)
        self.step_last = np.repeat(self.step_base[1:], nsteps)  # one past the rank's last step
        steps = list(chain.from_iterable(p.steps for p in schedule.ranks))
        nops = np.fromiter(map(len, steps), np.int64, count=nglobal)
        self.ops_per_step = nops
        self.op_ptr = np.concatenate([[0], np.cumsum(nops)]).astype(np.int64)
        ops = list(chain.from_iterable(steps))
        total = len(ops)
        op_step = np.repeat(np.arange(nglobal, dtype=np.int64), nops)
        is_send = np.fromiter(map(is_, map(attrgetter("kind"), ops), repeat(OpKind.SEND)),
                              bool, count=total)
        peer = np.fromiter(map(attrgetter("peer"), ops), np.int64, count=total)
        chunk = np.fromiter(map(attrgetter("chunk"), ops), np.int64, count=total)
        reduce = np.fromiter(map(attrgetter("reduce"), ops), bool, count=total)
        count = np.fromiter(map(attrgetter("count"), ops), np.int64, count=total)
        del ops, steps
        self._check_ops(op_step, peer, chunk, count, schedule.nchunks)
        self._match(_Ops(op_step, peer, chunk, count, reduce), np.flatnonzero(is_send),
                    np.flatnonzero(~is_send))

    def error(self, message: str) -> ScheduleError:
        return ScheduleError(f"{self.name}: {message}")

    def local(self, g: int) -> int:
        """Step ``g``'s index within its rank's program."""
        return int(g - self.step_base[self.step_rank[g]])

    def _check_ops(self, op_step: np.ndarray, peer: np.ndarray, chunk: np.ndarray,
                   count: np.ndarray, nchunks: int) -> None:
        """The first op, in program order, naming a bad peer or chunks out of range."""
        rank = self.step_rank[op_step] if len(op_step) else np.zeros(0, np.int64)
        bad_peer = (peer < 0) | (peer >= self.nranks) | (peer == rank)
        bad_range = (chunk < 0) | (count < 1) | (chunk + count > nchunks)
        bad = np.flatnonzero(bad_peer | bad_range)
        if not len(bad):
            return
        i = int(bad[0])
        g = int(op_step[i])
        where = f"rank {int(rank[i])} step {self.local(g)}"
        if bad_peer[i]:
            raise self.error(f"{where}: bad peer {int(peer[i])}")
        raise self.error(f"{where}: {chunk_text(int(chunk[i]), int(count[i]))} "
                         f"out of range({nchunks})")

    def _match(self, ops: _Ops, sends: np.ndarray, recvs: np.ndarray) -> None:
        """Pair the k-th send src->dst with the k-th recv at dst from src (``sends`` and
        ``recvs``: the program positions of the sends and of the recvs, in order)."""
        n = self.nranks
        s_src, r_dst = self.step_rank[ops.step[sends]], self.step_rank[ops.step[recvs]]
        s_key = s_src * n + ops.peer[sends]
        r_key = ops.peer[recvs] * n + r_dst
        s_order = np.argsort(s_key, kind="stable")  # stable: program order within a pair
        r_order = np.argsort(r_key, kind="stable")
        if len(s_key) != len(r_key) or not np.array_equal(s_key[s_order], r_key[r_order]):
            self._unmatched(ops, sends, recvs, s_key, r_key)
        s_key = s_key[s_order]
        sends, recvs = sends[s_order], recvs[r_order]
        chunk, count = ops.chunk[sends], ops.count[sends]
        bad = np.flatnonzero((chunk != ops.chunk[recvs]) | (count != ops.count[recvs]))
        if len(bad):
            i = int(bad[0])
            k = i - int(np.searchsorted(s_key, s_key[i]))  # the k-th message of its pair
            src, dst = divmod(int(s_key[i]), n)
            s, r = int(sends[i]), int(recvs[i])
            raise self.error(
                f"message {k} from rank {src} to rank {dst}: rank {src} step "
                f"{self.local(ops.step[s])} sends {chunk_text(int(chunk[i]), int(count[i]))}"
                f" but rank {dst} step {self.local(ops.step[r])} receives it as "
                f"{chunk_text(int(ops.chunk[r]), int(ops.count[r]))}")
        self.t_src, self.t_dst = s_src[s_order], ops.peer[sends]
        self.t_sstep, self.t_rstep = ops.step[sends], ops.step[recvs]
        self.t_chunk, self.t_count = chunk, count
        self.t_sop, self.t_rop = sends, recvs  # program position of the send and of the recv
        self.t_reduce = ops.reduce[recvs]

    def _unmatched(self, ops: _Ops, sends: np.ndarray, recvs: np.ndarray, s_key: np.ndarray,
                   r_key: np.ndarray) -> None:
        """Raise for the first pair (by src, then dst) whose sends and recvs differ in number."""
        n = self.nranks
        s_keys, s_counts = np.unique(s_key, return_counts=True)
        r_keys, r_counts = np.unique(r_key, return_counts=True)
        s_map = dict(zip(s_keys.tolist(), s_counts.tolist()))
        r_map = dict(zip(r_keys.tolist(), r_counts.tolist()))
        for key in sorted(set(s_map) | set(r_map)):
            ns, nr = s_map.get(key, 0), r_map.get(key, 0)
            if ns == nr:
                continue
            src, dst = divmod(key, n)
            if ns > nr:
                i = int(sends[np.flatnonzero(s_key == key)[nr]])
                raise self.error(
                    f"unmatched send: rank {src} step {self.local(ops.step[i])} sends "
                    f"{chunk_text(int(ops.chunk[i]), int(ops.count[i]))} to rank {dst}, which "
                    f"receives only {nr} of {ns} messages from rank {src}")
            i = int(recvs[np.flatnonzero(r_key == key)[ns]])
            raise self.error(
                f"unmatched recv: rank {dst} step {self.local(ops.step[i])} waits for "
                f"{chunk_text(int(ops.chunk[i]), int(ops.count[i]))} from rank {src}, which "
                f"sends only {ns} of {nr} messages to rank {dst}")

    def op_messages(self) -> tuple[list[int], list[int]]:
        """Per op (global program order): its message, and the step (within its peer's
        program) that holds the other op of that message."""
        total = int(self.op_ptr[-1])
        ids = np.arange(len(self.t_src), dtype=np.int64)
        message = np.zeros(total, np.int64)
        message[self.t_sop] = ids
        message[self.t_rop] = ids
        base = self.step_base[self.step_rank]
        peer_step = np.zeros(total, np.int64)
        peer_step[self.t_sop] = self.t_rstep - base[self.t_rstep]
        peer_step[self.t_rop] = self.t_sstep - base[self.t_sstep]
        return message.tolist(), peer_step.tolist()


@dataclass(frozen=True, slots=True)
class _Ops:
    """Every op's columns, in global program order."""

    step: np.ndarray  # global step
    peer: np.ndarray
    chunk: np.ndarray
    count: np.ndarray
    reduce: np.ndarray  # bool; False for sends


_MESSAGES: ObjectCache[Schedule, Messages] = ObjectCache(Messages)


def messages(schedule: Schedule) -> Messages:
    """The :class:`Messages` of ``schedule``, computed once per schedule object."""
    return _MESSAGES(schedule)


def wait_text(kind: OpKind | str, chunk: int, count: int, peer: int, peer_at: int,
              peer_step: int) -> str:
    """What a blocked op waits for: ``send chunk 0 with rank 1, which is stuck at step 0
    before its matching step 1``."""
    what = kind.value if isinstance(kind, OpKind) else kind
    return (f"{what} {chunk_text(chunk, count)} with rank {peer}, which is stuck at step "
            f"{peer_at} before its matching step {peer_step}")


def deadlock_error(name: str, nblocked: int, rank: int, step: int,
                   waits: Sequence[str]) -> ScheduleError:
    """The error for ``nblocked`` ranks that cannot finish, told from one of them."""
    return ScheduleError(f"{name}: deadlock: {nblocked} ranks cannot finish; rank {rank} step "
                         f"{step} waits to " + "; ".join(waits[:3]))
