"""A schedule's ops paired into messages, and the words for what can go wrong.

The k-th send from rank ``src`` to rank ``dst`` pairs with the k-th recv at ``dst``
from ``src``, and both name the same chunks (docs/SCHEDULE.md). :func:`verify` and
the simulator both match a schedule here, so they agree on what a message is and
name a fault in the same words: an op that names a bad peer or chunk, a send or recv
left without its partner, a pair that disagrees on the chunks, a deadlock.

Native steps (IR v3) pair up the same way, over their group: the k-th native op over
a group (a set of ranks) at one member is the k-th at every other member, and all of
them must agree on the kind, the group's order, the chunks and the root. Each such
collective is one :class:`NativeCall`; a member left without its partners, or a member
that runs another op, is named with its rank, step and group.

Matching is vectorized (a stable sort of the ops by their ``(src, dst)`` pair) and
cached per schedule object: the simulator runs one schedule at many sizes, and a
plan is often verified and then simulated. Flattening 4 M ops costs seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, is_
from typing import Sequence

import numpy as np

from .._cache import ObjectCache
from ..errors import ScheduleError
from .schedule import Native, OpKind, Schedule, chunk_text

__all__ = ["Messages", "NativeCall", "messages", "deadlock_error", "wait_text",
           "native_wait_text", "group_text"]


@dataclass(frozen=True, slots=True)
class NativeCall:
    """One native collective (IR v3): the k-th native op over its group, matched at
    every member.

    Attributes
    ----------
    op : Native
        The op every member runs (they agree on it).
    steps : tuple of int
        The global step (:class:`Messages` numbering) of each member's op, in group order.
    local : tuple of int
        The same steps within each member's program.
    """

    op: Native
    steps: tuple[int, ...]
    local: tuple[int, ...]

    @property
    def group(self) -> tuple[int, ...]:
        return self.op.group


def group_text(group: Sequence[int]) -> str:
    """A group in messages: ``{0, 1, 2, 3}``, in its order."""
    return "{" + ", ".join(map(str, group)) + "}"


class Messages:
    """A schedule's ops flattened into arrays and matched into messages (size-free).

    Steps are numbered globally (rank after rank): ``step_base[r]`` is rank ``r``'s
    first, ``step_rank[g]`` the rank of step ``g``. Ops are numbered globally in
    program order; ``op_ptr[g]`` is step ``g``'s first. Message ``m`` (sorted by pair,
    then program order) goes from ``t_src[m]`` step ``t_sstep[m]`` (global) to
    ``t_dst[m]`` step ``t_rstep[m]``, carrying chunks ``t_chunk[m] .. + t_count[m] - 1``;
    ``t_sop``/``t_rop`` are its two ops and ``t_reduce`` says whether the recv adds.

    Native ops (IR v3) are not ops of these arrays: ``op_ptr`` and ``ops_per_step``
    count sends and recvs only, and a native step holds none. ``calls`` are the native
    collectives, ordered by the global step of their first member's op, and
    ``step_call[g]`` is the index of the call step ``g`` runs (-1 for other steps),
    ``step_member[g]`` the rank's index in that call's group.

    Raises
    ------
    ScheduleError
        For programs out of rank order, an op naming a bad peer or chunks out of range,
        an unmatched send or recv, or a message whose two ops name different chunks;
        a native op whose group, chunks or root are bad, a member without its partners,
        or members that run different ops as the k-th over one group.
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
        ops = list(chain.from_iterable(steps))
        total = len(ops)
        op_step = np.repeat(np.arange(nglobal, dtype=np.int64), nops)
        self.calls: list[NativeCall] = []
        self.step_call = np.full(nglobal, -1, np.int64)
        self.step_member = np.full(nglobal, -1, np.int64)  # the rank's index in the group
        natives: tuple[np.ndarray, list[Native]] | None = None
        try:
            peer = np.fromiter(map(attrgetter("peer"), ops), np.int64, count=total)
        except AttributeError:  # native ops (IR v3) have no peer: set them apart
            native = np.fromiter(map(is_, map(type, ops), repeat(Native)), bool, count=total)
            natives = op_step[native], [op for op in compress(ops, native)
                                        if isinstance(op, Native)]
            crowded = np.flatnonzero(nops[natives[0]] != 1)
            if len(crowded):
                g = int(natives[0][crowded[0]])
                raise self.error(f"rank {int(self.step_rank[g])} step {self.local(g)}: a native "
                                 f"{natives[1][crowded[0]].text()} stands alone in its step; "
                                 f"this step has {int(nops[g])} ops")
            ops = list(compress(ops, ~native))
            op_step = op_step[~native]
            total = len(ops)
            nops = np.bincount(op_step, minlength=nglobal).astype(np.int64)
            peer = np.fromiter(map(attrgetter("peer"), ops), np.int64, count=total)
        self.ops_per_step = nops  # sends and recvs: a native step has none
        self.op_ptr = np.concatenate([[0], np.cumsum(nops)]).astype(np.int64)
        is_send = np.fromiter(map(is_, map(attrgetter("kind"), ops), repeat(OpKind.SEND)),
                              bool, count=total)
        chunk = np.fromiter(map(attrgetter("chunk"), ops), np.int64, count=total)
        reduce = np.fromiter(map(attrgetter("reduce"), ops), bool, count=total)
        count = np.fromiter(map(attrgetter("count"), ops), np.int64, count=total)
        del ops, steps
        self._check_ops(op_step, peer, chunk, count, schedule.nchunks)
        self._match(_Ops(op_step, peer, chunk, count, reduce), np.flatnonzero(is_send),
                    np.flatnonzero(~is_send))
        if natives is not None:
            self._match_natives(natives[0].tolist(), natives[1], schedule.nchunks)

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

    def _match_natives(self, where: list[int], ops: list[Native], nchunks: int) -> None:
        """Check each native op (``ops``, at global steps ``where``, in program order) and
        pair the k-th over a group at every member into :attr:`calls`."""
        step_rank, step_base = self.step_rank.tolist(), self.step_base.tolist()
        # Per group (as a set), its calls in the order met: the op of the first member
        # met, and each member's global step.
        groups: dict[tuple[int, ...], list[tuple[Native, dict[int, int]]]] = {}
        seen: dict[tuple[tuple[int, ...], int], int] = {}  # ops over a group per member
        checked: set[Native] = set()  # each op once, not once per member
        for g, op in zip(where, ops):
            r = step_rank[g]
            if op not in checked:
                self._check_native(op, r, g - step_base[r], nchunks)
                checked.add(op)
            if r not in op.group:
                raise self.error(f"rank {r} step {g - step_base[r]}: {op.kind.value} over "
                                 f"{group_text(op.group)}: rank {r} runs an op of a group it "
                                 "is not in")
            key = tuple(sorted(op.group))
            k = seen.get((key, r), 0)
            seen[key, r] = k + 1
            calls = groups.setdefault(key, [])
            if k == len(calls):
                calls.append((op, {}))
            ref, at = calls[k]
            if op != ref:
                p = min(at)
                raise self.error(
                    f"rank {r} step {g - step_base[r]} runs {op.text()} as its native op {k} "
                    f"over group {group_text(key)}, but rank {p} step {at[p] - step_base[p]} "
                    f"runs {ref.text()}: every member runs the same op (kind, group order, "
                    "chunks, root)")
            at[r] = g
        found = []
        for key, calls in groups.items():
            for k, (op, at) in enumerate(calls):
                missing = [m for m in key if m not in at]
                if missing:
                    p, q = min(at), missing[0]
                    ran = seen.get((key, q), 0)
                    raise self.error(
                        f"rank {p} step {at[p] - step_base[p]} runs {op.text()} as its native "
                        f"op {k} over group {group_text(key)}, but rank {q} runs only {ran} "
                        f"native op{'' if ran == 1 else 's'} over that group")
                found.append((min(at.values()), op, tuple(at[m] for m in op.group)))
        found.sort(key=lambda item: item[0])
        self.calls = [NativeCall(op, steps, tuple(g - step_base[m] for g, m in
                                                  zip(steps, op.group)))
                      for _, op, steps in found]
        for c, call in enumerate(self.calls):
            self.step_call[list(call.steps)] = c
            self.step_member[list(call.steps)] = np.arange(len(call.steps))

    def _check_native(self, op: Native, rank: int, step: int, nchunks: int) -> None:
        """A native op built in Python may break what the reader checks: say where."""
        where = f"rank {rank} step {step}: {op.kind.value} over {group_text(op.group)}"
        if rank not in op.group:
            raise self.error(f"{where}: rank {rank} runs an op of a group it is not in")
        if not op.group:
            raise self.error(f"{where}: a group names at least one rank")
        bad = [m for m in op.group if not 0 <= m < self.nranks]
        if bad:
            raise self.error(f"{where}: the group names rank {bad[0]}, outside "
                             f"range({self.nranks})")
        if len(set(op.group)) != len(op.group):
            raise self.error(f"{where}: the group names a rank twice")
        if op.chunk < 0 or op.count < 1 or op.end > nchunks:
            raise self.error(f"{where}: {op.chunk_text()} out of range({nchunks})")
        g = len(op.group)
        if op.kind.parted and op.count % g:
            raise self.error(f"{where}: count {op.count} does not cut into {g} equal parts")
        if op.kind.rooted and op.root not in op.group:
            raise self.error(f"{where}: needs a root in its group, got {op.root!r}")
        if not op.kind.rooted and op.root is not None:
            raise self.error(f"{where}: has no root (got root {op.root!r})")

    def native_step(self, g: int) -> tuple[NativeCall, int] | None:
        """The call global step ``g`` runs and the rank's index in its group, or None."""
        c = int(self.step_call[g])
        if c < 0:
            return None
        return self.calls[c], int(self.step_member[g])

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


def messages(schedule: Schedule, *, natives: bool = False) -> Messages:
    """The :class:`Messages` of ``schedule``, computed once per schedule object.

    Parameters
    ----------
    schedule : Schedule
    natives : bool
        Whether the caller handles native steps (IR v3, :attr:`Messages.calls`). A caller
        that does not gets a :class:`ScheduleError` naming the first native step, rather
        than a schedule whose native steps would look empty to it.
    """
    found = _MESSAGES(schedule)
    if found.calls and not natives:
        call = min(found.calls, key=lambda c: c.steps[0])
        g = call.steps[0]
        r = int(found.step_rank[g])
        raise found.error(f"rank {r} step {found.local(g)} runs a native {call.op.text()}, "
                          "which this part of topoplan does not handle yet; "
                          "topoplan.ir.lower.lower_native(schedule) turns native steps into "
                          "point-to-point ones")
    return found


def wait_text(kind: OpKind | str, chunk: int, count: int, peer: int, peer_at: int,
              peer_step: int) -> str:
    """What a blocked op waits for: ``send chunk 0 with rank 1, which is stuck at step 0
    before its matching step 1``."""
    what = kind.value if isinstance(kind, OpKind) else kind
    return (f"{what} {chunk_text(chunk, count)} with rank {peer}, which is stuck at step "
            f"{peer_at} before its matching step {peer_step}")


def native_wait_text(op: Native, member: int, member_at: int, member_step: int) -> str:
    """What a blocked native step waits for: ``run allgather over {0, 1} of chunks 0..3
    with rank 1, which is stuck at step 0 before its step 2 of that op``."""
    return (f"run {op.text()} with rank {member}, which is stuck at step {member_at} before "
            f"its step {member_step} of that op")


def deadlock_error(name: str, nblocked: int, rank: int, step: int,
                   waits: Sequence[str]) -> ScheduleError:
    """The error for ``nblocked`` ranks that cannot finish, told from one of them."""
    return ScheduleError(f"{name}: deadlock: {nblocked} ranks cannot finish; rank {rank} step "
                         f"{step} waits to " + "; ".join(waits[:3]))
