"""A schedule's ops paired into messages, and the words for what can go wrong.

The k-th send from rank ``src`` to rank ``dst`` pairs with the k-th recv at ``dst``
from ``src``, and both name the same chunks (docs/SCHEDULE.md); with channels (IR v4),
the k-th on channel ``c`` with the k-th on channel ``c``, and each (rank, channel) is a
sequence of steps of its own (:class:`Messages`). :func:`verify` and
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

from .._compat import moved_names
from .._util import ObjectCache
from ..errors import ScheduleError
from .schedule import Native, OpKind, Schedule, _flat_more, chunk_text, ranges_text

__all__ = ["Messages", "NativeCall", "match_messages", "deadlock_error", "wait_text",
           "native_wait_text", "group_text"]

#: ``messages`` was renamed: it clashed with the class :class:`Messages` but for case.
__getattr__ = moved_names(__name__, {"messages": "topoplan.ir.matching:match_messages"})


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

    Steps are numbered globally, one per step of each *sequence*: a sequence is a rank's
    program on one channel (IR v4), whose steps run in order, each waiting only for the
    one before it. Without channels a rank is one sequence and its global steps are its
    program's steps. With channels, a program step whose ops are on two channels is two
    global steps, one in each channel's sequence (a step without ops is channel 0's).
    Global steps run rank by rank, and within a rank sequence by sequence (by channel),
    each in program order: ``step_base[r]`` is rank ``r``'s first, ``step_rank[g]`` the
    rank of step ``g``, ``step_channel[g]`` its channel, ``step_first[g]`` and
    ``step_last[g]`` the first and one past the last step of its sequence (so ``g - 1``
    comes before ``g`` exactly when ``g > step_first[g]``), ``step_local[g]`` its index
    in the rank's program as written in the file (:meth:`local`), ``step_seq[g]`` its
    sequence. Sequence ``q`` is ``seq_base[q] .. seq_base[q + 1] - 1``, of rank
    ``seq_rank[q]`` on channel ``seq_channel[q]``; ``prog_base[r] + s`` numbers program
    steps, and ``prog_first`` gives each one's first global step (:meth:`global_step`).

    Ops are numbered globally in the order of the global steps (program order within
    one); ``op_ptr[g]`` is step ``g``'s first. Message ``m`` (sorted by pair and
    channel, then program order) goes from ``t_src[m]`` step ``t_sstep[m]`` (global) to
    ``t_dst[m]`` step ``t_rstep[m]``, carrying chunks ``t_chunk[m] .. + t_count[m] - 1``;
    ``t_sop``/``t_rop`` are its two ops and ``t_reduce`` says whether the recv adds.

    Vectored messages (IR v4): ``t_chunk`` and ``t_count`` are a message's first range;
    ``t_more`` maps each message with several ranges to the ranges after its first
    (empty for a schedule without them, :attr:`vectored` False). A consumer that reads
    only ``t_chunk``/``t_count`` must ask for vectored schedules (:func:`match_messages`).
    :meth:`split` cuts them into one message per range (the verifier runs those).

    Native ops (IR v3) are not ops of these arrays: ``op_ptr`` and ``ops_per_step``
    count sends and recvs only, and a native step holds none. ``calls`` are the native
    collectives, ordered by the global step of their first member's op, and
    ``step_call[g]`` is the index of the call step ``g`` runs (-1 for other steps),
    ``step_member[g]`` the rank's index in that call's group.

    Raises
    ------
    ScheduleError
        For programs out of rank order, an op naming a bad peer or chunks out of range,
        an unmatched send or recv, a message whose two ops name different chunks or
        (IR v4) are on different channels;
        a native op whose group, chunks or root are bad, a member without its partners,
        or members that run different ops as the k-th over one group.
    """

    def __init__(self, schedule: Schedule) -> None:
        n = schedule.nranks
        self.nranks = n
        self.name = f"{schedule.algorithm} schedule"
        if len(schedule.ranks) != n or any(p.rank != r for r, p in enumerate(schedule.ranks)):
            raise self.error(f"expected programs for ranks 0..{n - 1} in order")
        nprog = np.fromiter((len(p.steps) for p in schedule.ranks), np.int64, count=n)
        self.prog_base = np.concatenate([[0], np.cumsum(nprog)]).astype(np.int64)
        nsteps_prog = int(self.prog_base[-1])
        steps = list(chain.from_iterable(p.steps for p in schedule.ranks))
        nops_prog = np.fromiter(map(len, steps), np.int64, count=nsteps_prog)
        ops = list(chain.from_iterable(steps))
        del steps
        total = len(ops)
        prog_rank = np.repeat(np.arange(n), nprog)
        op_prog = np.repeat(np.arange(nsteps_prog, dtype=np.int64), nops_prog)
        # Channels (IR v4): native ops have a channel too (always 0).
        channelled = any(map(attrgetter("channel"), ops))
        if not channelled:
            # One sequence per rank: global steps are the program's steps, rank by rank.
            self.nchannels = 1
            self.step_base = self.prog_base
            self.nglobal = nglobal = nsteps_prog
            self.step_rank = prog_rank
            self.seq_base, self.seq_rank = self.prog_base, np.arange(n)
            self.seq_channel = np.zeros(n, np.int64)
            self.step_seq = prog_rank
            self.step_first = np.repeat(self.prog_base[:-1], nprog)
            self.step_last = np.repeat(self.prog_base[1:], nprog)  # one past the rank's last
            self.step_channel = np.zeros(nglobal, np.int64)
            self.step_local = np.arange(nglobal, dtype=np.int64) - self.step_first
            self.prog_first = np.arange(nglobal, dtype=np.int64)
            op_step = op_prog
            nops = nops_prog
        else:
            op_step, ops = self._sequences(ops, op_prog, prog_rank, nops_prog)
            nglobal = self.nglobal
            nops = np.bincount(op_step, minlength=nglobal).astype(np.int64)
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
            # A native op stands alone in its step, channels or not.
            at = natives[0]
            held = nops_prog[self.prog_base[self.step_rank[at]] + self.step_local[at]]
            crowded = np.flatnonzero(held != 1)
            if len(crowded):
                g = int(at[crowded[0]])
                raise self.error(f"rank {int(self.step_rank[g])} step {self.local(g)}: a native "
                                 f"{natives[1][crowded[0]].text()} stands alone in its step; "
                                 f"this step has {int(held[crowded[0]])} ops")
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
        self.vectored = any(map(attrgetter("more"), ops))  # IR v4; no list when not
        if self.vectored:  # each op's further ranges, interned: 0 for none
            ids: dict[tuple, int] = {(): 0}
            more = np.fromiter((ids.setdefault(m, len(ids)) for m in map(attrgetter("more"), ops)),
                               np.int64, count=total)
            self._more_of: list[tuple] = list(ids)
        else:
            more, self._more_of = np.zeros(total, np.int64), [()]
        self._more_flat = _flat_more(self._more_of)  # the same, as arrays
        del ops
        self._check_ops(op_step, peer, chunk, count, schedule.nchunks, more)
        self._match(_Ops(op_step, peer, chunk, count, reduce, more), np.flatnonzero(is_send),
                    np.flatnonzero(~is_send))
        if natives is not None:
            self._match_natives(natives[0].tolist(), natives[1], schedule.nchunks)

    def _sequences(self, ops: list, op_prog: np.ndarray, prog_rank: np.ndarray,
                   nops_prog: np.ndarray) -> tuple[np.ndarray, list]:
        """Number the global steps of a schedule with channels: one per (rank, channel,
        program step that has an op of that channel), ordered by rank, then channel, then
        step (a step without ops is channel 0's). Returns each op's global step and the
        ops in that order (program order within a global step)."""
        n = self.nranks
        total, nsteps_prog = len(ops), len(nops_prog)
        op_chan = np.fromiter(map(attrgetter("channel"), ops), np.int64, count=total)
        empty = np.flatnonzero(nops_prog == 0)
        nchan = int(op_chan.max()) + 1 if total else 1
        self.nchannels = nchan
        # Every (rank, channel, program step) with an op, and every empty step.
        at = np.concatenate([op_prog, empty])
        chan = np.concatenate([op_chan, np.zeros(len(empty), np.int64)])
        key = (prog_rank[at] * nchan + chan) * nsteps_prog + at
        ukey, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.reshape(-1)
        nglobal = self.nglobal = len(ukey)
        prog, seq_key = ukey % nsteps_prog, ukey // nsteps_prog
        self.step_rank = prog_rank[prog]
        self.step_channel = seq_key % nchan
        self.step_base = np.searchsorted(self.step_rank, np.arange(n + 1)).astype(np.int64)
        self.step_local = prog - self.prog_base[self.step_rank]
        first = np.ones(nglobal, bool)
        first[1:] = seq_key[1:] != seq_key[:-1]
        seq_start = np.flatnonzero(first)
        self.seq_base = np.append(seq_start, nglobal).astype(np.int64)
        self.seq_rank = self.step_rank[seq_start]
        self.seq_channel = self.step_channel[seq_start]
        nseq_steps = np.diff(self.seq_base)
        self.step_seq = np.repeat(np.arange(len(seq_start)), nseq_steps)
        self.step_first = np.repeat(seq_start, nseq_steps).astype(np.int64)
        self.step_last = np.repeat(self.seq_base[1:], nseq_steps)
        # Each program step's first global step (its lowest channel's part).
        self.prog_first = np.full(nsteps_prog, nglobal, np.int64)
        np.minimum.at(self.prog_first, prog, np.arange(nglobal, dtype=np.int64))
        op_step = inverse[:total]
        order = np.argsort(op_step, kind="stable")  # program order within a global step
        return op_step[order], [ops[i] for i in order.tolist()]

    def error(self, message: str) -> ScheduleError:
        return ScheduleError(f"{self.name}: {message}")

    def local(self, g: int) -> int:
        """Step ``g``'s index within its rank's program (as written in the file)."""
        return int(self.step_local[g])

    def global_step(self, rank: int, step: int) -> int:
        """The first global step of ``rank``'s program step ``step`` (the part of its
        lowest channel; a native step's only one)."""
        return int(self.prog_first[self.prog_base[rank] + step])

    def _text(self, ops: _Ops, i: int) -> str:
        """Op ``i``'s chunks in messages, every range of a vectored op."""
        first = (int(ops.chunk[i]), int(ops.count[i]))
        return ranges_text((first,) + self._more_of[int(ops.more[i])])

    def _check_ops(self, op_step: np.ndarray, peer: np.ndarray, chunk: np.ndarray,
                   count: np.ndarray, nchunks: int, more: np.ndarray) -> None:
        """The first op, in program order, naming a bad peer or chunks out of range (or,
        vectored, ranges that overlap or are out of order)."""
        rank = self.step_rank[op_step] if len(op_step) else np.zeros(0, np.int64)
        bad_peer = (peer < 0) | (peer >= self.nranks) | (peer == rank)
        bad_range = (chunk < 0) | (count < 1) | (chunk + count > nchunks)
        if self.vectored:
            bad_more, next_start = _bad_more(*self._more_flat, nchunks)
            bad_range |= bad_more[more] | (chunk + count > next_start[more])
        bad = np.flatnonzero(bad_peer | bad_range)
        if not len(bad):
            return
        i = int(bad[0])
        g = int(op_step[i])
        where = f"rank {int(rank[i])} step {self.local(g)}"
        if bad_peer[i]:
            raise self.error(f"{where}: bad peer {int(peer[i])}")
        first = (int(chunk[i]), int(count[i]))
        text = ranges_text((first,) + self._more_of[int(more[i])])
        if self._more_of[int(more[i])]:
            raise self.error(f"{where}: {text}: ranges out of range({nchunks}), overlapping or "
                             "out of order (a vectored op's ranges are disjoint, in increasing "
                             "chunk order)")
        raise self.error(f"{where}: {text} out of range({nchunks})")

    def _match(self, ops: _Ops, sends: np.ndarray, recvs: np.ndarray) -> None:
        """Pair the k-th send src->dst with the k-th recv at dst from src, on the same
        channel (``sends`` and ``recvs``: the positions of the sends and of the recvs, in
        order: program order within each channel's sequence)."""
        n, nchan = self.nranks, self.nchannels
        s_src, r_dst = self.step_rank[ops.step[sends]], self.step_rank[ops.step[recvs]]
        s_key = s_src * n + ops.peer[sends]
        r_key = ops.peer[recvs] * n + r_dst
        if nchan > 1:  # (src, dst, channel)
            s_key = s_key * nchan + self.step_channel[ops.step[sends]]
            r_key = r_key * nchan + self.step_channel[ops.step[recvs]]
        s_order = np.argsort(s_key, kind="stable")  # stable: program order within a pair
        r_order = np.argsort(r_key, kind="stable")
        if len(s_key) != len(r_key) or not np.array_equal(s_key[s_order], r_key[r_order]):
            self._unmatched(ops, sends, recvs, s_key, r_key)
        s_key = s_key[s_order]
        sends, recvs = sends[s_order], recvs[r_order]
        chunk, count = ops.chunk[sends], ops.count[sends]
        bad = np.flatnonzero((chunk != ops.chunk[recvs]) | (count != ops.count[recvs])
                             | (ops.more[sends] != ops.more[recvs]))
        if len(bad):
            i = int(bad[0])
            k = i - int(np.searchsorted(s_key, s_key[i]))  # the k-th message of its pair
            src, dst = divmod(int(s_key[i]) // nchan, n)
            on = "" if nchan == 1 else f" on channel {int(s_key[i]) % nchan}"
            s, r = int(sends[i]), int(recvs[i])
            raise self.error(
                f"message {k} from rank {src} to rank {dst}{on}: rank {src} step "
                f"{self.local(ops.step[s])} sends {self._text(ops, s)}"
                f" but rank {dst} step {self.local(ops.step[r])} receives it as "
                f"{self._text(ops, r)}")
        self.t_src, self.t_dst = s_src[s_order], ops.peer[sends]
        self.t_sstep, self.t_rstep = ops.step[sends], ops.step[recvs]
        self.t_chunk, self.t_count = chunk, count
        self.t_sop, self.t_rop = sends, recvs  # position of the send and of the recv
        self.t_reduce = ops.reduce[recvs]
        self.t_more: dict[int, tuple[tuple[int, int], ...]] = {}
        self._t_more = ops.more[sends]  # each message's ranges after its first, interned
        if self.vectored:
            self.t_more = {m: self._more_of[k] for m, k in
                           enumerate(self._t_more.tolist()) if k}

    def _unmatched(self, ops: _Ops, sends: np.ndarray, recvs: np.ndarray, s_key: np.ndarray,
                   r_key: np.ndarray) -> None:
        """Raise for the first pair (by src, then dst, then channel) whose sends and recvs
        differ in number; where the odd op has a partner on another channel, name both
        channels."""
        n, nchan = self.nranks, self.nchannels
        s_keys, s_counts = np.unique(s_key, return_counts=True)
        r_keys, r_counts = np.unique(r_key, return_counts=True)
        s_map = dict(zip(s_keys.tolist(), s_counts.tolist()))
        r_map = dict(zip(r_keys.tolist(), r_counts.tolist()))
        for key in sorted(set(s_map) | set(r_map)):
            ns, nr = s_map.get(key, 0), r_map.get(key, 0)
            if ns == nr:
                continue
            (src, dst), c = divmod(key // nchan, n), key % nchan
            if nchan > 1:
                self._cross_channel(ops, sends, recvs, s_key, r_key, s_map, r_map, key // nchan)
            on = "" if nchan == 1 else f" on channel {c}"
            if ns > nr:
                i = int(sends[np.flatnonzero(s_key == key)[nr]])
                raise self.error(
                    f"unmatched send: rank {src} step {self.local(ops.step[i])} sends "
                    f"{self._text(ops, i)} to rank {dst}{on}, "
                    f"which receives only {nr} of {ns} messages from rank {src}{on}")
            i = int(recvs[np.flatnonzero(r_key == key)[ns]])
            raise self.error(
                f"unmatched recv: rank {dst} step {self.local(ops.step[i])} waits for "
                f"{self._text(ops, i)} from rank {src}{on}, "
                f"which sends only {ns} of {nr} messages to rank {dst}{on}")

    def _cross_channel(self, ops: _Ops, sends: np.ndarray, recvs: np.ndarray,
                       s_key: np.ndarray, r_key: np.ndarray, s_map: dict, r_map: dict,
                       pair: int) -> None:
        """Raise when the sends and recvs of ``pair`` (``src * n + dst``) do not match
        because some are on the wrong channel: an op left without a partner on its
        channel and an op of the other side, on another channel, naming the same chunks
        (else the first op left over on each side), named with both channels."""
        n, nchan = self.nranks, self.nchannels
        src, dst = divmod(pair, n)
        keys = range(pair * nchan, pair * nchan + nchan)
        left_s = [sends[np.flatnonzero(s_key == k)[r_map.get(k, 0):]] for k in keys]
        left_r = [recvs[np.flatnonzero(r_key == k)[s_map.get(k, 0):]] for k in keys]
        all_s = sends[(s_key >= keys[0]) & (s_key < keys[-1] + 1)]
        all_r = recvs[(r_key >= keys[0]) & (r_key < keys[-1] + 1)]
        found = None
        for mine, theirs, is_send in ((np.concatenate(left_s), all_r, True),
                                      (np.concatenate(left_r), all_s, False)):
            for i in mine.tolist():
                c = self.step_channel[ops.step[i]]
                same = theirs[(ops.chunk[theirs] == ops.chunk[i])
                              & (ops.count[theirs] == ops.count[i])
                              & (ops.more[theirs] == ops.more[i])
                              & (self.step_channel[ops.step[theirs]] != c)]
                if len(same):
                    found = (i, int(same[0])) if is_send else (int(same[0]), i)
                    break
            if found is not None:
                break
        if found is None:
            spare_s, spare_r = np.concatenate(left_s), np.concatenate(left_r)
            if not (len(spare_s) and len(spare_r)):
                return
            found = int(spare_s[0]), int(spare_r[0])
        s, r = found
        cs, cr = (int(self.step_channel[ops.step[x]]) for x in (s, r))
        raise self.error(
            f"message from rank {src} to rank {dst} on two channels: rank {src} step "
            f"{self.local(ops.step[s])} sends {self._text(ops, s)}"
            f" on channel {cs} but rank {dst} step {self.local(ops.step[r])} receives "
            f"{self._text(ops, r)} from rank {src} on channel "
            f"{cr}: a message's send and recv are on one channel")

    def _match_natives(self, where: list[int], ops: list[Native], nchunks: int) -> None:
        """Check each native op (``ops``, at global steps ``where``, in program order) and
        pair the k-th over a group at every member into :attr:`calls`.

        O(native ops + the groups' sizes): what depends on a group alone (its checks,
        its members as a set, its sorted key) is worked out once per group object, which
        the members of one op share (16384 members of one op over 16384 ranks would
        otherwise be 268 M membership tests)."""
        step_rank, step_local = self.step_rank.tolist(), self.step_local.tolist()
        # Per group (as a set), its calls in the order met: the op of the first member
        # met, and each member's global step.
        groups: dict[frozenset[int], list[tuple[Native, dict[int, int]]]] = {}
        seen: dict[tuple[frozenset[int], int], int] = {}  # ops over a group per member
        known: dict[int, tuple[tuple[int, ...], frozenset[int]]] = {}  # id(group) -> it
        keys: dict[frozenset[int], tuple[int, ...]] = {}  # each group's ranks, sorted
        checked: set[int] = set()  # id of each op checked (an op once, not per member)
        for g, op in zip(where, ops):
            r = step_rank[g]
            found = known.get(id(op.group))
            if found is None:
                self._check_group(op, r, step_local[g])
                members = frozenset(op.group)
                found = known[id(op.group)] = (op.group, members)
                keys.setdefault(members, tuple(sorted(members)))
            members = found[1]
            if id(op) not in checked:
                self._check_native(op, r, step_local[g], nchunks)
                checked.add(id(op))
            if r not in members:
                raise self.error(f"rank {r} step {step_local[g]}: {op.kind.value} over "
                                 f"{group_text(op.group)}: rank {r} runs an op of a group it "
                                 "is not in")
            k = seen.get((members, r), 0)
            seen[members, r] = k + 1
            calls = groups.setdefault(members, [])
            if k == len(calls):
                calls.append((op, {}))
            ref, at = calls[k]
            if op is not ref and op != ref:
                p = min(at)
                raise self.error(
                    f"rank {r} step {step_local[g]} runs {op.text()} as its native op {k} "
                    f"over group {group_text(keys[members])}, but rank {p} step "
                    f"{step_local[at[p]]} runs {ref.text()}: every member runs the same op "
                    "(kind, group order, chunks, root)")
            at[r] = g
        found_calls = []
        for members, calls in groups.items():
            key = keys[members]
            for k, (op, at) in enumerate(calls):
                missing = [m for m in key if m not in at]
                if missing:
                    p, q = min(at), missing[0]
                    ran = seen.get((members, q), 0)
                    raise self.error(
                        f"rank {p} step {step_local[at[p]]} runs {op.text()} as its native "
                        f"op {k} over group {group_text(key)}, but rank {q} runs only {ran} "
                        f"native op{'' if ran == 1 else 's'} over that group")
                found_calls.append((min(at.values()), op, tuple(at[m] for m in op.group)))
        found_calls.sort(key=lambda item: item[0])
        self.calls = [NativeCall(op, steps, tuple(step_local[g] for g in steps))
                      for _, op, steps in found_calls]
        for c, call in enumerate(self.calls):
            self.step_call[list(call.steps)] = c
            self.step_member[list(call.steps)] = np.arange(len(call.steps))

    def _check_group(self, op: Native, rank: int, step: int) -> None:
        """What the reader checks of a native op's group, for one built in Python: say
        where (once per group object; membership is checked per member by the caller)."""
        if not op.group:
            raise self.error(f"rank {rank} step {step}: {op.kind.value} over {{}}: a group "
                             "names at least one rank")
        bad = [m for m in op.group if not 0 <= m < self.nranks]
        where = f"rank {rank} step {step}: {op.kind.value} over {group_text(op.group)}"
        if bad:
            raise self.error(f"{where}: the group names rank {bad[0]}, outside "
                             f"range({self.nranks})")
        if len(set(op.group)) != len(op.group):
            raise self.error(f"{where}: the group names a rank twice")

    def _check_native(self, op: Native, rank: int, step: int, nchunks: int) -> None:
        """A native op built in Python may break what the reader checks: say where."""
        def where() -> str:  # the group's text only for an error: it may be long
            return f"rank {rank} step {step}: {op.kind.value} over {group_text(op.group)}"
        if op.chunk < 0 or op.count < 1 or op.end > nchunks:
            raise self.error(f"{where()}: {op.chunk_text()} out of range({nchunks})")
        g = len(op.group)
        if op.kind.parted and op.count % g:
            raise self.error(f"{where()}: count {op.count} does not cut into {g} equal parts")
        if op.kind.rooted and op.root not in op.group:
            raise self.error(f"{where()}: needs a root in its group, got {op.root!r}")
        if not op.kind.rooted and op.root is not None:
            raise self.error(f"{where()}: has no root (got root {op.root!r})")

    def native_step(self, g: int) -> tuple[NativeCall, int] | None:
        """The call global step ``g`` runs and the rank's index in its group, or None."""
        c = int(self.step_call[g])
        if c < 0:
            return None
        return self.calls[c], int(self.step_member[g])

    def split(self) -> Messages:
        """These messages with each vectored one (IR v4) cut into one message per range,
        in its place: the :class:`Messages` of
        :func:`~topoplan.ir.passes.split_vectored` of the schedule, built from these
        arrays rather than from a schedule of millions of new ops (``self`` when nothing
        is vectored).

        A vectored op becomes as many consecutive ops as it has ranges, in range order,
        and its message as many consecutive messages of its pair; both ops of a message
        name the same ranges (:meth:`_match` checked it), so the k-th piece of a send
        pairs with the k-th piece of its recv, as matching the split schedule pairs them.
        Steps, sequences and native calls stay as they are; op and message numbers move.
        """
        if not self.vectored:
            return self
        nmore, flat = self._more_flat
        ids = self._t_more
        pieces = 1 + nmore[ids]  # per message: its ranges
        first = np.repeat(_offsets(pieces)[:-1], pieces)
        nth = np.arange(int(pieces.sum()), dtype=np.int64) - first  # a piece's range index
        rest = np.flatnonzero(nth)
        message = np.repeat(np.arange(len(ids), dtype=np.int64), pieces)
        chunk, count = self.t_chunk[message], self.t_count[message]
        at = _offsets(nmore)[ids[message[rest]]] + nth[rest] - 1
        chunk[rest], count[rest] = flat[at, 0], flat[at, 1]
        # Ops: each message's two ops become one per range; every op is in a message.
        op_pieces = np.ones(int(self.op_ptr[-1]), np.int64)
        op_pieces[self.t_sop] = pieces
        op_pieces[self.t_rop] = pieces
        op_at = _offsets(op_pieces)  # where each op's pieces start, and the end
        out = object.__new__(Messages)
        out.__dict__.update(vars(self))
        out.op_ptr = op_at[self.op_ptr]
        out.ops_per_step = np.diff(out.op_ptr)
        out.t_src, out.t_dst = self.t_src[message], self.t_dst[message]
        out.t_sstep, out.t_rstep = self.t_sstep[message], self.t_rstep[message]
        out.t_chunk, out.t_count = chunk, count
        out.t_sop = op_at[self.t_sop][message] + nth
        out.t_rop = op_at[self.t_rop][message] + nth
        out.t_reduce = self.t_reduce[message]
        out.vectored, out._more_of, out.t_more = False, [()], {}
        out._more_flat = _flat_more(out._more_of)
        out._t_more = np.zeros(len(message), np.int64)
        return out

    def op_messages(self) -> tuple[list[int], list[int]]:
        """Per op (in the order of :attr:`op_ptr`: program order without channels): its
        message, and the step (within its peer's program) that holds the other op of that
        message."""
        total = int(self.op_ptr[-1])
        ids = np.arange(len(self.t_src), dtype=np.int64)
        message = np.zeros(total, np.int64)
        message[self.t_sop] = ids
        message[self.t_rop] = ids
        peer_step = np.zeros(total, np.int64)
        peer_step[self.t_sop] = self.step_local[self.t_rstep]
        peer_step[self.t_rop] = self.step_local[self.t_sstep]
        return message.tolist(), peer_step.tolist()


def _bad_more(nmore: np.ndarray, flat: np.ndarray,
              nchunks: int) -> tuple[np.ndarray, np.ndarray]:
    """For ops' distinct ``more`` ranges (IR v4; :func:`~topoplan.ir.schedule._flat_more`
    of them): whether each breaks the rules (a range out of the chunks, a count below 1,
    a range that starts before the end of the one before it) and where its first range
    starts (``nchunks`` for none), which the op's first range may not run past. On arrays:
    a vectored plan has a million such ranges."""
    a, c = flat[:, 0], flat[:, 1]
    has = nmore > 0
    head = _offsets(nmore)[:-1][has]  # each one's first range
    end = np.zeros(len(a), np.int64)  # the end of the range before (0 for a first)
    end[1:] = a[:-1] + c[:-1]
    end[head] = 0
    bad = (a < end) | (c < 1) | (a + c > nchunks)
    owner = np.repeat(np.arange(len(nmore)), nmore)
    next_start = np.full(len(nmore), nchunks, np.int64)
    next_start[has] = a[head]
    return np.bincount(owner[bad], minlength=len(nmore)) > 0, next_start


def _offsets(counts: np.ndarray) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]``: where each group of ``counts`` starts, and the end."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Ops:
    """Every op's columns, in global program order."""

    step: np.ndarray  # global step
    peer: np.ndarray
    chunk: np.ndarray
    count: np.ndarray
    reduce: np.ndarray  # bool; False for sends
    more: np.ndarray    # index into Messages._more_of of the ranges after the first (0: none)


_MESSAGES: ObjectCache[Schedule, Messages] = ObjectCache(Messages)


def match_messages(schedule: Schedule, *, natives: bool = False,
                   vectored: bool = False) -> Messages:
    """The :class:`Messages` of ``schedule``, computed once per schedule object.

    Parameters
    ----------
    schedule : Schedule
    natives : bool
        Whether the caller handles native steps (IR v3, :attr:`Messages.calls`). A caller
        that does not gets a :class:`ScheduleError` naming the first native step, rather
        than a schedule whose native steps would look empty to it.
    vectored : bool
        Whether the caller handles vectored messages (IR v4, :attr:`Messages.t_more`).
        A caller that does not gets a :class:`ScheduleError` naming the first vectored
        op, rather than reading only its first range.
    """
    found = _MESSAGES(schedule)
    if found.t_more and not vectored:
        m = min(found.t_more, key=lambda m: int(found.t_sstep[m]))
        g = int(found.t_sstep[m])
        first = (int(found.t_chunk[m]), int(found.t_count[m]))
        raise found.error(
            f"rank {int(found.step_rank[g])} step {found.local(g)} sends "
            f"{ranges_text((first,) + found.t_more[m])} to rank {int(found.t_dst[m])} as one "
            "vectored message (IR v4), which this part of topoplan does not handle yet")
    if found.calls and not natives:
        call = min(found.calls, key=lambda c: c.steps[0])
        g = call.steps[0]
        r = int(found.step_rank[g])
        raise found.error(f"rank {r} step {found.local(g)} runs a native {call.op.text()}, "
                          "which this part of topoplan does not handle yet; "
                          "topoplan.ir.passes.lower_native(schedule) turns native steps into "
                          "point-to-point ones")
    return found


def wait_text(kind: OpKind | str, chunk: int, count: int, peer: int, peer_at: int,
              peer_step: int, channel: int | None = None,
              more: Sequence[tuple[int, int]] = ()) -> str:
    """What a blocked op waits for: ``send chunk 0 with rank 1, which is stuck at step 0
    before its matching step 1`` (``... with rank 1 on channel 2, ...`` when a channel is
    given: the peer's sequence on that channel is stuck; ``more``: a vectored op's
    further ranges)."""
    what = kind.value if isinstance(kind, OpKind) else kind
    on = "" if channel is None else f" on channel {channel}"
    text = ranges_text(((chunk, count), *more))
    return (f"{what} {text} with rank {peer}{on}, which is stuck at step "
            f"{peer_at} before its matching step {peer_step}")


def native_wait_text(op: Native, member: int, member_at: int, member_step: int) -> str:
    """What a blocked native step waits for: ``run allgather over {0, 1} of chunks 0..3
    with rank 1, which is stuck at step 0 before its step 2 of that op``."""
    return (f"run {op.text()} with rank {member}, which is stuck at step {member_at} before "
            f"its step {member_step} of that op")


def deadlock_error(name: str, nblocked: int, rank: int, step: int,
                   waits: Sequence[str], channel: int | None = None) -> ScheduleError:
    """The error for ``nblocked`` ranks that cannot finish, told from one of them (from
    its sequence on ``channel``, when the schedule has several channels)."""
    on = "" if channel is None else f" on channel {channel}"
    return ScheduleError(f"{name}: deadlock: {nblocked} ranks cannot finish; rank {rank} step "
                         f"{step}{on} waits to " + "; ".join(waits[:3]))
