"""An MSCCL XML algorithm as a topoplan schedule, to verify, simulate, show and bench it.

An allreduce, a reduce-scatter (``coll="reducescatter"``) or an allgather. A topoplan
schedule keeps one value per chunk of one buffer, and runs each rank's ops in
steps. An MSCCL algorithm has thread blocks that run concurrently, ordered by their own
step order and ``depid``/``deps``, over three buffers. The import:

- **checks** the algorithm with :func:`topoplan.interop.msccl.verify_msccl` first, so a
  broken file is reported in MSCCL's terms (GPU, thread block, step);
- **buffers** (:class:`_Where`): reads ``i`` and ``o`` as one buffer, the full buffer
  in the collective's in-place view (an allgather's ``i`` is the rank's shard of ``o``;
  a reduce-scatter's ``o`` the rank's shard of ``i``). Scratch that an ``r`` fills and
  ``re`` steps add into the buffer, each unit once (one ``re`` for the whole message, or
  one per chunk of it, as in msccl-tools' all-pairs allreduce), makes that receive one
  reducing recv; scratch used otherwise (a reduce-scatter's partial sums) holds the chunk
  the messages and reduces that use it tie it to, one per scratch unit. A ``cpy`` between
  two places of the same chunk does nothing in place. Scratch reused for another chunk,
  or a copy that moves data, is refused, saying which step;
- **steps:** gives every receive the earliest step its thread block order and
  dependencies allow (one more than the receives that must land before it; the same as
  an earlier one that only adds into its chunks, from scratch, when it adds too: sums
  commute), and every send the step after the receives it must follow: a send does not hold its thread
  block up (the executor buffers it), a receive does. A fused ``rcs``/``rrs``/``rrcs``
  receives in one step and sends in the next; ``rrs`` keeps its sum in the chunk it
  read;
- **messages:** an MSCCL chunk is a topoplan chunk of ``1/nchunksperloop``; the steps a
  message was split into (count limits, buffer changes) are joined again when both ends
  hold them back to back (consecutive chunks of the full buffer); the result is
  coalesced into chunk ranges (IR v2);
- **channels** (IR v4): an op is on its thread block's ``chan`` (over the file's
  ``topoplanSegments``, the MSCCL channels a plan's channel took in a file topoplan
  exported), and channels whose ops share a chunk are merged, so every chunk belongs
  to one channel: a channelled plan comes back on its channels (and an export's
  instances, each on its own slice of the buffer, as channels of their own), an
  algorithm whose channels share data on one.

The schedule is verified before it is returned; one that does not verify is refused,
naming why.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from ...errors import ScheduleError
from ...ir.passes import coalesce
from ...ir.schedule import Native, Op, OpKind, RankProgram, Schedule, build_schedule, equal_chunks
from .model import Algo, Step, ThreadBlock
from .verify import verify_msccl

__all__ = ["import_msccl"]

_SENDS = {"s", "rcs", "rrs", "rrcs"}
_RECVS = {"r", "rcs", "rrs", "rrc", "rrcs"}
_REDUCES = {"rrs", "rrc", "rrcs"}


@dataclass(eq=False)
class _Unit:
    """One MSCCL step (or a run of steps joined back into one message) on one GPU."""

    gpu: int
    tb: ThreadBlock
    first: Step
    steps: list[Step] = field(default_factory=list)
    preds: list[_Unit] = field(default_factory=list)
    recv_level: int = -1
    send_level: int = -1
    ready: int = 0
    recv_key: tuple[int, int] = (0, 0)   # (channel, index of the message on its FIFO)
    send_key: tuple[int, int] = (0, 0)
    recv_msg: _Message | None = None
    send_msg: _Message | None = None
    hazards: list[_Unit] = field(default_factory=list)  # earlier writers of its chunks
    after: int = 0                       # the step its successors may not precede
    tb_prev: _Unit | None = None         # the unit before it on its thread block
    readers: list[_Unit] = field(default_factory=list)  # on an r into scratch: the re's
    #                                      that add its data into the buffer (folded)
    sources: list[_Unit] = field(default_factory=list)  # on such an re: the r's it reads
    fold_chunk: int = -1                 # on a folded r: the first chunk its data adds into
    src_unit: int = -1                   # the chunk its src names (-1: none)
    dst_unit: int = -1                   # the chunk its dst names (-1: none)

    @property
    def type(self) -> str:
        return self.first.type

    @property
    def cnt(self) -> int:
        return sum(s.cnt for s in self.steps)

    def where(self, algo: Algo) -> str:
        return (f"{algo.file}:{self.first.line}: gpu {self.gpu} tb {self.tb.id} step "
                f"{self.first.s} ({self.type})")


def _refuse(algo: Algo, unit: _Unit, why: str) -> ScheduleError:
    return ScheduleError(f"{unit.where(algo)}: cannot be a topoplan schedule: {why}")


#: The executor's ``coll`` and topoplan's collective (:mod:`topoplan.ir.collectives`).
_COLLECTIVE = {"allreduce": "allreduce", "allgather": "allgather",
               "reducescatter": "reduce_scatter"}


class _Where:
    """The unit of the full buffer (a topoplan chunk) that a buffer unit holds.

    ``i`` and ``o`` are read in the in-place view of the collective: an allreduce's
    ``i[k]`` and ``o[k]`` are unit ``k``; an allgather's ``i[k]`` is unit ``g * sh + k``
    of gpu ``g`` (``sh = nchunksperloop / ngpus``, its shard) and ``o[k]`` unit ``k``; a
    reduce-scatter's ``i[k]`` is unit ``k`` and ``o[k]`` unit ``g * sh + k``. Scratch
    units get theirs from the steps that use them (:func:`_map_scratch`).
    """

    def __init__(self, algo: Algo) -> None:
        self.coll = algo.coll
        self.n = algo.nchunksperloop
        self.sh = self.n // algo.ngpus
        self.scratch: dict[tuple[int, int], int] = {}

    def fixed(self, g: int, buf: str, off: int) -> int:
        """The unit of ``i[off]`` or ``o[off]`` on gpu ``g``."""
        if (self.coll, buf) in (("allgather", "i"), ("reducescatter", "o")):
            return g * self.sh + off
        return off

    def size(self, buf: str) -> int:
        """Units of user buffer ``buf``."""
        if (self.coll, buf) in (("allgather", "i"), ("reducescatter", "o")):
            return self.sh
        return self.n

    def unit(self, g: int, buf: str, off: int) -> int | None:
        """The unit of ``buf[off]`` on gpu ``g``; None for scratch that holds no chunk
        (a receive's data that one ``re`` adds into the buffer)."""
        if buf == "s":
            return self.scratch.get((g, off))
        return self.fixed(g, buf, off)

    def first(self, algo: Algo, unit: _Unit, buf: str, off: int, cnt: int) -> int:
        """The unit of ``buf[off]``, checking that ``buf[off .. off + cnt - 1]`` are
        consecutive units (a topoplan op is a range of chunks)."""
        if buf != "s":
            return self.fixed(unit.gpu, buf, off)
        units = [self.scratch.get((unit.gpu, off + k)) for k in range(cnt)]
        first = units[0]
        if first is None or any(v != first + k for k, v in enumerate(units)):
            raise _refuse(algo, unit, f"s[{off}] x{cnt} does not hold consecutive "
                                      "chunks of the buffer")
        return first


def _joinable(a: Step, b: Step, g: int, where: _Where) -> bool:
    """``b`` continues ``a``'s message: same type, no sync between, the same op of the plan
    (``tp``) when both name one, and what each reads
    (src) or writes (dst) continues ``a``'s: the next unit of the same buffer, or the next
    chunk of the full buffer in another (a message cut where its buffer changes, as at the
    edge of a rank's shard), scratch that one receive and one reduce share excepted."""
    if a.type != b.type or a.type in ("nop", "cpy", "re") or b.depid >= 0 or a.hasdep:
        return False
    if a.plan and b.plan and a.plan != b.plan:
        return False  # two ops of a topoplan plan, that happen to be back to back
    for used, abuf, aoff, bbuf, boff in ((a.type in _SRC_USED, a.srcbuf, a.srcoff,
                                          b.srcbuf, b.srcoff),
                                         (a.type in _DST_USED, a.dstbuf, a.dstoff,
                                          b.dstbuf, b.dstoff)):
        if not used or (abuf == bbuf and boff == aoff + a.cnt):
            continue
        last, first = where.unit(g, abuf, aoff + a.cnt - 1), where.unit(g, bbuf, boff)
        if last is None or first != last + 1:
            return False
    return True


def _units(algo: Algo, where: _Where) -> dict[int, dict[int, list[_Unit]]]:
    """Per GPU, per thread block, its steps as units, joined where both ends allow."""
    # FIFO pairing: the k-th send step of (src, dst, chan) with the k-th recv step.
    fifo_send: dict[tuple[int, int, int], list[tuple[int, int, int]]] = defaultdict(list)
    fifo_recv: dict[tuple[int, int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for i, st in enumerate(tb.steps):
                if st.type in _SENDS:
                    fifo_send[(gpu.id, tb.send, tb.chan)].append((gpu.id, tb.id, i))
                if st.type in _RECVS:
                    fifo_recv[(tb.recv, gpu.id, tb.chan)].append((gpu.id, tb.id, i))
    send_partner: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    recv_partner: dict[tuple[int, int, int], tuple[int, int, int]] = {}
    for key, sends in fifo_send.items():
        for s, r in zip(sends, fifo_recv.get(key, [])):
            send_partner[s], recv_partner[r] = r, s
    tbs = {(g.id, tb.id): tb for g in algo.gpus for tb in g.tbs}

    def local_ok(g: int, t: int, i: int) -> bool:
        steps = tbs[(g, t)].steps
        return i > 0 and _joinable(steps[i - 1], steps[i], g, where)

    # A step joins its predecessor when it can locally and every message it takes part
    # in joins at the other end too; iterate to a fixed point (fused steps link chains).
    join = {(g.id, tb.id, i) for g in algo.gpus for tb in g.tbs
            for i in range(len(tb.steps)) if local_ok(g.id, tb.id, i)}
    changed = True
    while changed:
        changed = False
        for key in list(join):
            g, t, i = key
            ok = True
            for partners in (send_partner, recv_partner):
                partner = partners.get(key)
                if partner is None:
                    continue
                pg, pt, pi = partner
                if partner not in join or partners.get((g, t, i - 1)) != (pg, pt, pi - 1):
                    ok = False
            if not ok:
                join.discard(key)
                changed = True
    out: dict[int, dict[int, list[_Unit]]] = {}
    for gpu in algo.gpus:
        out[gpu.id] = {}
        for tb in gpu.tbs:
            units: list[_Unit] = []
            for i, st in enumerate(tb.steps):
                if (gpu.id, tb.id, i) in join:
                    units[-1].steps.append(st)
                else:
                    units.append(_Unit(gpu.id, tb, st, [st]))
            out[gpu.id][tb.id] = units
    return out


_SRC_USED = {"s", "rrs", "rrc", "rrcs", "cpy", "re"}   # step types that read src
_DST_USED = {"r", "rcs", "rrc", "rrcs", "cpy", "re"}   # step types that write dst
_At = tuple[int, ThreadBlock, Step]                     # a step: its gpu, tb and itself


def _chunked_scratch(algo: Algo) -> set[int]:
    """The gpus whose scratch holds chunks of the buffer (a reduce-scatter's partial sums
    out of place): any use of scratch but an ``r`` into it and an ``re`` out of it."""
    out = set()
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for st in tb.steps:
                t = st.type
                if (st.srcbuf == "s" and t in _SRC_USED and t != "re") or (
                        st.dstbuf == "s" and t in _DST_USED and t != "r"):
                    out.add(gpu.id)
                    break
    return out


def _map_scratch(algo: Algo, where: _Where, gpus: set[int]) -> None:
    """Which chunk each scratch unit of ``gpus`` holds (into ``where.scratch``).

    A message carries one chunk: what its sender sends (``s``, ``rrs``: its src; ``rcs``,
    ``rrcs``: its dst) is what its receiver writes (dst) and adds to (src); a reduce
    (``rrc``, ``rrcs``) or a copy keeps its chunk. Those equalities, from the chunks
    that ``i`` and ``o`` fix, give every scratch unit its chunk; a scratch unit tied to
    no chunk, or to two (scratch reused for another chunk), is refused.
    """
    parent: dict[tuple, tuple] = {}

    def find(x: tuple) -> tuple:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: tuple, b: tuple) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    user: dict[tuple, _Unit] = {}

    def term(at: _At, buf: str, off: int) -> tuple:
        g, tb, st = at
        if buf != "s":
            return ("c", where.fixed(g, buf, off))
        key = ("s", g, off)
        if key not in user:
            user[key] = _Unit(g, tb, st, [st])
        return key

    def sent(at: _At, k: int) -> tuple:
        st = at[2]
        if st.type in ("s", "rrs"):
            return term(at, st.srcbuf, st.srcoff + k)
        return term(at, st.dstbuf, st.dstoff + k)

    def received(at: _At, k: int) -> list[tuple]:
        st = at[2]
        out = []
        if st.type in _DST_USED:
            out.append(term(at, st.dstbuf, st.dstoff + k))
        if st.type in _REDUCES:
            out.append(term(at, st.srcbuf, st.srcoff + k))
        return out

    fifo_send: dict[tuple[int, int, int], list[_At]] = defaultdict(list)
    fifo_recv: dict[tuple[int, int, int], list[_At]] = defaultdict(list)
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for st in tb.steps:
                at = (gpu.id, tb, st)
                if st.type in _SENDS:
                    fifo_send[(gpu.id, tb.send, tb.chan)].append(at)
                if st.type in _RECVS:
                    fifo_recv[(tb.recv, gpu.id, tb.chan)].append(at)
                if st.type in ("cpy", "re", "rrc", "rrcs"):
                    for k in range(st.cnt):
                        union(term(at, st.srcbuf, st.srcoff + k),
                              term(at, st.dstbuf, st.dstoff + k))
    for key, sends in fifo_send.items():
        for s_at, r_at in zip(sends, fifo_recv.get(key, [])):
            for k in range(min(s_at[2].cnt, r_at[2].cnt)):
                v = sent(s_at, k)
                for r in received(r_at, k):
                    union(v, r)
    chunks: dict[tuple, set[int]] = defaultdict(set)
    for x in list(parent):
        if x[0] == "c":
            chunks[find(x)].add(x[1])
    for key, u in sorted(user.items(), key=lambda kv: kv[0]):
        if key[1] not in gpus:
            continue
        found = chunks.get(find(key), set())
        if len(found) != 1:
            why = (f"s[{key[2]}] is tied to no chunk of the buffer (no message or reduce "
                   "links it to i or o)" if not found else
                   f"s[{key[2]}] holds chunks {', '.join(map(str, sorted(found)[:4]))} "
                   "(scratch reused for another chunk; topoplan keeps one place per chunk)")
            raise _refuse(algo, u, why)
        where.scratch[(key[1], key[2])] = next(iter(found))


def _fold_scratch(algo: Algo, tbs: dict[int, list[_Unit]]) -> None:
    """A receive into scratch, and the local reduces (``re``) that add its data into the
    buffer, become one reducing recv.

    The reduces may each take a part of the received data (msccl-tools' all-pairs
    allreduce receives a peer's whole row of chunks in one ``r`` and adds it with one
    ``re`` per chunk, on separate thread blocks), and one reduce may take the data of
    several receives. Every scratch unit a receive fills must be added exactly once, and
    a receive's units into consecutive chunks: the recv is then one message over that
    range, in the first step in which all of its reduces may run (reducing recvs of one
    chunk add in any order, so reduces into one chunk need not be a step apart:
    :func:`_levels`). Scratch written twice (reused), added twice or never, is refused,
    naming the step.
    """
    writer: dict[int, tuple[_Unit, int]] = {}   # scratch unit -> (its r, offset in the r)
    for units in tbs.values():
        for u in units:
            if u.first.dstbuf == "s" and u.type in _DST_USED:
                if u.type != "r":
                    raise _refuse(algo, u, "only plain receives (r) into scratch are supported")
                for k in range(u.cnt):
                    if u.first.dstoff + k in writer:
                        raise _refuse(algo, u, f"scratch s[{u.first.dstoff + k}] is written "
                                               "twice (scratch reused; topoplan keeps one "
                                               "place per received chunk)")
                    writer[u.first.dstoff + k] = (u, k)
    chunk_of: dict[int, int] = {}                # scratch unit -> the chunk it adds into
    for units in tbs.values():
        for u in units:
            reads_scratch = u.first.srcbuf == "s" and u.type in ("s", "rrs", "rrc", "rrcs",
                                                                   "cpy", "re")
            if not reads_scratch:
                continue
            if u.type != "re":
                raise _refuse(algo, u, "data read from scratch is only supported as the "
                                       "source of a local reduce (re)")
            if u.first.dstbuf == "s":
                raise _refuse(algo, u, "a reduce into scratch keeps a value topoplan "
                                       "has no chunk for")
            for k in range(u.cnt):
                off = u.first.srcoff + k
                if off not in writer:
                    raise _refuse(algo, u, f"s[{off}] is added into the buffer but no "
                                           "receive fills it")
                if off in chunk_of:
                    raise _refuse(algo, u, f"s[{off}] is added into the buffer twice "
                                           "(topoplan adds a received chunk once)")
                chunk_of[off] = u.dst_unit + k
                w = writer[off][0]
                if not any(x is w for x in u.sources):
                    u.sources.append(w)
                    w.readers.append(u)
    for off, (w, k) in sorted(writer.items()):
        if off not in chunk_of:
            raise _refuse(algo, w, f"data received into scratch s[{off}] is never reduced "
                                   "into the buffer")
        if k == 0:
            w.fold_chunk = chunk_of[off]
        elif chunk_of[off] != w.fold_chunk + k:
            raise _refuse(algo, w, f"s[{w.first.dstoff}] x{w.cnt} is added into chunks "
                                   f"{w.fold_chunk} and {chunk_of[off]} at offsets 0 and "
                                   f"{k}: not one range of consecutive chunks, which one "
                                   "topoplan recv needs")


@dataclass(eq=False)
class _Message:
    """One MSCCL message; both of its ops get the same topoplan step."""

    level: int = 0           # the recv's step
    send: int = 0            # the send's step (== level when aligned)
    units: list[_Unit] = field(default_factory=list)   # units whose level bound it sets


def _link(algo: Algo, units_of: dict[int, dict[int, list[_Unit]]]) -> None:
    """Local precedence (thread block order, dependencies) and messages (FIFO order)."""
    fifo_send: dict[tuple[int, int, int], list[_Unit]] = defaultdict(list)
    fifo_recv: dict[tuple[int, int, int], list[_Unit]] = defaultdict(list)
    for gpu in algo.gpus:
        tbs = units_of[gpu.id]
        by_step: dict[tuple[int, int], _Unit] = {}
        for tid, units in tbs.items():
            index = 0
            for u in units:
                for _ in u.steps:
                    by_step[(tid, index)] = u
                    index += 1
        for tid, units in tbs.items():
            for k, u in enumerate(units):
                if k:
                    u.preds.append(units[k - 1])
                    u.tb_prev = units[k - 1]
                if u.first.depid >= 0:
                    target = by_step.get((u.first.depid, u.first.deps))
                    if target is not None:
                        u.preds.append(target)
                tb = u.tb
                if u.type in _SENDS:
                    fifo_send[(gpu.id, tb.send, tb.chan)].append(u)
                if u.type in _RECVS:
                    fifo_recv[(tb.recv, gpu.id, tb.chan)].append(u)
        _hazards([u for units in tbs.values() for u in units])
    for key, sends in fifo_send.items():
        for k, (su, ru) in enumerate(zip(sends, fifo_recv[key])):
            m = _Message(units=[su, ru] + ru.readers)
            su.send_msg, ru.recv_msg = m, m
            su.send_key = ru.recv_key = (key[2], k)


def _hazards(units: list[_Unit]) -> None:
    """Per unit, the latest earlier units that write a chunk it reads or writes.

    Units are taken in an order consistent with thread block order and dependencies;
    the checker has shown conflicting accesses are ordered, so the last writer of a
    chunk in that order happens before the unit.
    """
    indeg = {id(u): len(u.preds) for u in units}
    succ: dict[int, list[_Unit]] = defaultdict(list)
    for u in units:
        for p in u.preds:
            succ[id(p)].append(u)
    todo = [u for u in units if not u.preds]
    writer: dict[int, _Unit] = {}
    while todo:
        u = todo.pop()
        st, t = u.first, u.type
        touched: range | None = None
        writes = False
        if t == "s":
            touched = range(u.src_unit, u.src_unit + u.cnt) if u.src_unit >= 0 else None
        elif t in ("r", "rcs") and not u.readers:
            touched, writes = range(u.dst_unit, u.dst_unit + u.cnt), True
        elif t in ("rrc", "rrcs", "rrs"):
            touched, writes = range(u.src_unit, u.src_unit + u.cnt), True
        elif t == "re":
            touched, writes = range(u.dst_unit, u.dst_unit + u.cnt), True
        if touched is not None:
            found = {id(w): w for c in touched if (w := writer.get(c)) is not None}
            u.hazards = list(found.values())
            if writes:
                for c in touched:
                    writer[c] = u
        for v in succ[id(u)]:
            indeg[id(v)] -= 1
            if not indeg[id(v)]:
                todo.append(v)


def _levels(algo: Algo, units_of: dict[int, dict[int, list[_Unit]]], aligned: bool,
            strict: bool, planned: bool = False) -> None:
    """Give every message one step, the earliest both of its ends allow.

    A message's send and recv share a step (so the schedule cannot deadlock: every
    step's messages only wait for peers in the same step). A recv's step is at least
    the steps after the recvs its unit must follow; a send's is at least the steps
    its unit must follow; a fused unit sends the step after it receives. Bounds only
    grow, so a worklist reaches the least fixed point, unless the algorithm relies on
    buffering without bound, which is refused. ``planned``: the levels start at the
    plan's own steps, where a recv may be posted a step before its send (its step waits)
    and reducing recvs of one chunk may share a step (after an ``rrc``, which sends
    nothing, the sums are the same in either order).
    """
    units = [u for tbs in units_of.values() for us in tbs.values() for u in us]
    succs: dict[int, list[_Unit]] = defaultdict(list)
    for u in units:
        for p in {id(p): p for p in u.preds + u.hazards}.values():
            succs[id(p)].append(u)
    limit = 4 * len(units) + 8
    todo = list(reversed(units))
    queued = {id(u) for u in units}
    while todo:
        u = todo.pop()
        queued.discard(id(u))
        # after a predecessor's step, and after the step in which an earlier write of
        # one of its chunks lands (ready = that recv's step + 1); a reducing recv may share
        # the step of an earlier one that only adds (the sums are the same in either order)
        if strict:  # every thread block predecessor done, as on the executor
            base = max((p.ready for p in u.preds), default=0)
        else:
            adds = u.type in _REDUCES or bool(u.sources)
            base = max(max((p.after for p in u.preds), default=0),
                       max((h.after if adds and (h.sources or planned and h.type == "rrc")
                            else h.ready for h in u.hazards), default=0))
        raised: list[_Message] = []

        def bound(m: _Message | None, value: int, send: bool) -> None:
            if m is None:
                return
            before = (m.send, m.level)
            if send:
                m.send = max(m.send, value)
            else:
                m.level = max(m.level, value)
            if not planned:  # a recv is never posted before its send
                m.level = max(m.level, m.send)
            if aligned:
                m.send = m.level
            if (m.send, m.level) != before:
                raised.append(m)

        t = u.type
        if t == "s":
            bound(u.send_msg, base, True)
            after = ready = u.send_msg.send if u.send_msg else base
        elif t == "r" and u.readers:
            bound(u.recv_msg, base, False)
            after = ready = base  # lands in scratch; the reduce that reads it is the recv
        elif t in ("r", "rrc"):
            bound(u.recv_msg, base, False)
            after = u.recv_msg.level if u.recv_msg else base
            ready = after + 1
        elif t in ("rcs", "rrs", "rrcs"):
            bound(u.recv_msg, base, False)
            ready = (u.recv_msg.level if u.recv_msg else base) + 1
            bound(u.send_msg, ready, True)
            after = u.send_msg.send if u.send_msg else ready
        elif t == "re" and u.sources:
            after = base
            for w in u.sources:
                bound(w.recv_msg, base, False)
                if w.recv_msg is not None:
                    after = max(after, w.recv_msg.level)
            ready = after + 1
        else:  # nop, in-place cpy
            after = ready = base
        if ready > limit or any(m.level > limit for m in raised):
            raise _refuse(algo, u, "it relies on buffering messages without bound (a "
                                   "send far ahead of its receive), which a step-by-step "
                                   "schedule cannot express")
        changed = [u] if (ready, after) != (u.ready, u.after) else []
        u.ready, u.after = ready, after
        for m in raised:
            changed.extend(x for x in m.units if x is not u)
        for x in changed:
            for v in (succs[id(x)] if x is u else [x]):
                if id(v) not in queued:
                    queued.add(id(v))
                    todo.append(v)
    for u in units:
        if u.recv_msg is not None:
            u.recv_level = u.recv_msg.level
        if u.send_msg is not None:
            u.send_level = u.send_msg.send


def import_msccl(algo: Algo, *, check: bool = True) -> Schedule:
    """Turn an MSCCL allreduce, reduce-scatter or allgather into a verified topoplan
    :class:`Schedule` of that collective.

    Parameters
    ----------
    algo : Algo
        From :func:`topoplan.interop.msccl.load_msccl`.
    check : bool
        Run the MSCCL checker first (recommended: it names faults in MSCCL's terms).

    Raises
    ------
    ScheduleError
        The algorithm is wrong, or uses something a topoplan schedule cannot express
        (the message names the step and why).
    """
    from ...ir.verify import verify

    if algo.coll not in _COLLECTIVE:
        raise ScheduleError(f"{algo.file}: coll={algo.coll!r}: only "
                            f"{', '.join(_COLLECTIVE)} algorithms can be imported")
    if check:
        verify_msccl(algo)
    elif algo.coll != "allreduce" and algo.nchunksperloop % algo.ngpus:
        raise ScheduleError(f"{algo.file}: coll={algo.coll!r}: nchunksperloop="
                            f"{algo.nchunksperloop} is not a multiple of ngpus={algo.ngpus}")
    where = _Where(algo)
    chunked = _chunked_scratch(algo)
    if chunked:
        _map_scratch(algo, where, chunked)
    units_of = _units(algo, where)
    for gpu in algo.gpus:
        tbs = units_of[gpu.id]
        for units in tbs.values():
            for u in units:
                st, t = u.first, u.type
                if t == "nop":
                    continue
                if t == "re" and (st.srcbuf != "s" or gpu.id in chunked):
                    raise _refuse(algo, u, "a local reduce (re) is supported only from "
                                           "scratch data that one receive filled")
                folded = gpu.id not in chunked
                for piece in u.steps:
                    for buf, off, used in ((piece.srcbuf, piece.srcoff, t in _SRC_USED),
                                           (piece.dstbuf, piece.dstoff, t in _DST_USED)):
                        size = where.size(buf)
                        if used and buf in ("i", "o") and off + piece.cnt > size > 0:
                            raise _refuse(algo, u, f"{buf}[{off}] x{piece.cnt} lies past " + (
                                f"nchunksperloop={where.n}" if size == where.n else
                                f"the {size} chunks of {buf} (nchunksperloop / ngpus)"))
                        if used and not (buf == "s" and folded):
                            where.first(algo, u, buf, off, piece.cnt)  # consecutive chunks
                if t in _SRC_USED and not (st.srcbuf == "s" and folded):
                    u.src_unit = where.first(algo, u, st.srcbuf, st.srcoff, 1)
                if t in _DST_USED and not (st.dstbuf == "s" and folded):
                    u.dst_unit = where.first(algo, u, st.dstbuf, st.dstoff, 1)
                if t == "cpy" and u.src_unit != u.dst_unit:
                    raise _refuse(algo, u, "a local copy that moves data between "
                                           "chunks (topoplan keeps one value per chunk)")
                if t in ("rrc", "rrcs") and u.src_unit != u.dst_unit:
                    raise _refuse(algo, u, f"adds chunk {u.src_unit} into chunk "
                                           f"{u.dst_unit}: a reduce must stay in one chunk")
        if gpu.id not in chunked:
            _fold_scratch(algo, tbs)
    _link(algo, units_of)
    # First every message's two ops in one step (a topoplan step lasts until all its
    # messages are done, so a send posted early would hold its step up), ops of one
    # thread block that touch different chunks sharing a step; then with every thread
    # block op after its predecessor is done; then each send at the earliest step its
    # thread block allows. The first that verifies is the import.
    # A file topoplan exported names each step's plan step (tp_step): when those steps
    # are a fixed point of the same rules, they are tried first, so that an exported plan
    # comes back with its own pipeline rather than everything at its earliest step.
    failure: ScheduleError | None = None
    strategies = [(True, False, False), (True, True, False), (False, False, False),
                  (False, True, False)]
    if _has_plan_steps(units_of):  # a plan's send and recv may be in different steps
        strategies.insert(0, (False, False, True))
    for aligned, strict, planned in strategies:
        expected = _reset(units_of, planned)
        try:
            _levels(algo, units_of, aligned, strict, planned)
        except ScheduleError as exc:
            failure = exc
            continue
        if planned and any((m.level, m.send) != (level, send) for m, level, send in expected):
            continue  # the recorded steps break a rule: they were edited; derive them
        schedule = _schedule(algo, units_of, planned)
        try:
            verify(schedule)
        except ScheduleError as exc:
            failure = ScheduleError(
                f"{algo.file}: the algorithm passes the MSCCL check but its topoplan form "
                f"does not verify ({exc}); it uses an order or a buffer trick a step-by-step "
                "schedule cannot express")
            continue
        if algo.cluster_fingerprint:  # exported by topoplan: the cluster it was planned for
            schedule = schedule.with_meta(cluster_fingerprint=algo.cluster_fingerprint)
        return schedule
    assert failure is not None
    raise failure


def _has_plan_steps(units_of: dict[int, dict[int, list[_Unit]]]) -> bool:
    units = [u for tbs in units_of.values() for us in tbs.values() for u in us]
    return bool(units) and all(u.first.plan for u in units if u.type not in ("nop", "cpy"))


def _reset(units_of: dict[int, dict[int, list[_Unit]]], planned: bool
           ) -> list[tuple[_Message, int, int]]:
    """Clear the levels, or start them at the recorded plan steps (returned per message)."""
    msgs: dict[int, _Message] = {}
    for tbs in units_of.values():
        for units in tbs.values():
            for u in units:
                u.ready = u.after = 0
                for m in (u.recv_msg, u.send_msg):
                    if m is not None:
                        m.level = m.send = 0
                        msgs[id(m)] = m
    if not planned:
        return []
    for tbs in units_of.values():
        for units in tbs.values():
            for u in units:
                if not u.first.plan:
                    continue  # nop, cpy
                step = u.first.plan[0]
                if u.recv_msg is not None and not u.readers:
                    u.recv_msg.level = step
                if u.send_msg is not None:  # a fused step sends the step after it receives
                    u.send_msg.send = step + (u.type != "s")
    return [(m, m.level, m.send) for m in msgs.values()]


def _schedule(algo: Algo, units_of: dict[int, dict[int, list[_Unit]]], planned: bool = False
              ) -> Schedule:
    """The ops at their steps, in an order both ends of every pair agree on (``planned``:
    first in the plan's own order within each step)."""
    nchunks = algo.nchunksperloop
    steps: list[list[list[Op]]] = []
    for gpu in algo.gpus:
        program: dict[int, list[tuple[tuple, Op]]] = defaultdict(list)
        for units in units_of[gpu.id].values():
            for u in units:
                tb = u.tb
                if u.type in _SENDS:
                    chunk = u.src_unit if u.type in ("s", "rrs", "rrcs") else u.dst_unit
                    plan = u.first.plan
                    order = (plan[-1],) if planned and len(plan) > 1 else ()
                    program[u.send_level].append(
                        ((*order, 0, tb.send, *u.send_key),
                         Op(OpKind.SEND, tb.send, chunk, False, u.cnt,
                            tb.chan // algo.segments)))
                if u.type in _RECVS:
                    if u.readers:  # into scratch, added by its re's: one reducing recv
                        chunk, reduce = u.fold_chunk, True
                    else:
                        chunk = u.src_unit if u.type == "rrs" else u.dst_unit
                        reduce = u.type in _REDUCES
                    order = (u.first.plan[1],) if planned and len(u.first.plan) > 1 else ()
                    program[u.recv_level].append(
                        ((*order, 1, tb.recv, *u.recv_key),
                         Op(OpKind.RECV, tb.recv, chunk, reduce, u.cnt,
                            tb.chan // algo.segments)))
        last = max(program, default=-1)
        steps.append([[op for _, op in sorted(program.get(t, []), key=lambda x: x[0])]
                      for t in range(last + 1)])
    schedule = build_schedule(algo.ngpus, equal_chunks(nchunks), steps,
                              collective=_COLLECTIVE[algo.coll],
                              algorithm=f"msccl:{algo.name}", source=algo.file,
                              msccl={"proto": algo.proto, "nchannels": algo.nchannels,
                                     "nchunksperloop": nchunks, "inplace": algo.inplace,
                                     "outofplace": algo.outofplace})
    return _channels(schedule)


def _channels(schedule: Schedule) -> Schedule:
    """``schedule`` (each op on its MSCCL channel, over the file's segments: the plan's
    channel in a file topoplan exported) with IR v4 channels: channels whose ops touch
    a common chunk (at any rank) are one, so that every chunk belongs to one channel;
    they are numbered 0, 1, ... in order of their lowest MSCCL channel. An algorithm
    whose channels share data comes back on one channel."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[int, int] = {}
    for _, _, op in schedule.ops():
        a = find(op.channel)
        for k in range(op.chunk, op.end):
            b = find(owner.setdefault(k, op.channel))
            if a != b:
                parent[max(a, b)] = min(a, b)
                a = min(a, b)
    roots = sorted({find(c) for c in parent})
    number = {root: i for i, root in enumerate(roots)}
    if all(number[find(c)] == c for c in parent):
        return schedule
    def moved(op: Op | Native) -> Op:
        assert isinstance(op, Op)  # an import makes no native ops
        return replace(op, channel=number[find(op.channel)])

    programs = tuple(RankProgram(p.rank, tuple(tuple(moved(op) for op in step)
                                               for step in p.steps)) for p in schedule.ranks)
    return replace(schedule, ranks=programs)
