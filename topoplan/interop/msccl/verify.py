"""A symbolic checker of MSCCL algorithms: do the steps compute their collective?

:func:`verify_msccl` checks an allreduce, a reduce-scatter or an allgather
(:data:`CHECKED`) without running a GPU. It interprets the step types over contribution
sets (which ranks' inputs a buffer unit holds), with FIFO connections of bounded capacity
between thread blocks, dependency flags as the kernel sets them
(``src/device/msccl_kernel.cu``), and a vector-clock race detector over each gpu's thread
blocks. It is written from the executor's sources, independently of topoplan's exporter,
so that it can be the exporter's test oracle.

References
----------
- Azure/msccl-executor-nccl: ``src/device/msccl_kernel.cu`` (how steps, dependencies and
  flags run), ``src/misc/msccl/msccl_parser.cc`` (``coll`` and its ``sizeMultiplier``),
  ``src/misc/msccl/msccl_setup.cc`` (the kernel's count: the caller's count times
  ``sizeMultiplier``), ``src/misc/msccl/msccl_lifecycle.cc`` (when a call is in place,
  and which counts an algorithm is picked for).
- microsoft/msccl-tools: ``msccl/language/collectives.py`` (``AllGather``,
  ``ReduceScatter``: buffers in place and out of place, and their postconditions).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import ScheduleError
from .model import BUFFERS, STEP_TYPES, Algo, Step, ThreadBlock

__all__ = ["verify_msccl", "CheckReport", "CHECKED", "DEFAULT_CAPACITY"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`verify_msccl` checked.

    ``modes`` are the buffer modes run (``"inplace"``, ``"outofplace"``); ``steps`` and
    ``messages`` count the steps executed and messages delivered per mode; ``capacity``
    is the connection capacity used (units); ``max_fifo_depth`` is the largest number of
    units queued on one connection (messages handed over by rendezvous not counted).
    """

    modes: tuple[str, ...]
    steps: int
    messages: int
    max_fifo_depth: int
    capacity: int


#: Units a connection buffers before a send blocks, by protocol: the connection has
#: NCCL_STEPS=8 slots; Simple moves a chunk in MSCCL_CHUNKSTEPS=4 of them, LL and LL128
#: in one (``chunkSize`` in ``msccl_kernel.cu``).
DEFAULT_CAPACITY = {"Simple": 2, "LL": 8, "LL128": 8}

_WAIT, _RECV, _SEND = 0, 1, 2


def _ranks_text(mask: int) -> str:
    members = [r for r in range(mask.bit_length()) if mask >> r & 1]
    if len(members) > 12:
        return "{" + ",".join(map(str, members[:10])) + f",... ({len(members)} ranks)" + "}"
    return "{" + ",".join(map(str, members)) + "}"


@dataclass(frozen=True, slots=True)
class _Shape:
    """One gpu's user buffers for a collective, in MSCCL chunks (units).

    ``i_units``/``o_units``: the sizes of NCCL's send and receive buffers; ``alias``:
    in place, which of the two is a view of the other and where, ``(view, (storage,
    offset))``; ``initial``: ``(buf, first unit, [(chunk, ranks)...])`` runs that hold
    data before the first step; ``final``: per unit of ``o``, the chunk of the full
    buffer it must hold and the ranks summed in it.
    """

    i_units: int
    o_units: int
    alias: tuple[str, tuple[str, int]]
    initial: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...]
    final: tuple[tuple[int, int], ...]


#: The buffers of each collective checked, as NCCL lays them out (count: elements per
#: rank as the caller passes it). ``nchunksperloop`` cuts the full buffer (``count`` for
#: an allreduce, ``ngpus * count`` for an allgather or a reduce-scatter: the executor's
#: ``sizeMultiplier``, ``msccl_parser.cc``/``msccl_setup.cc``). In place
#: (``mscclInternalSchedulerSelectAlgo``, ``msccl_lifecycle.cc``): an allreduce's
#: buffers are one; an allgather's send buffer is the receive buffer at ``rank * count``;
#: a reduce-scatter's receive buffer is the send buffer at ``rank * count``.
CHECKED = ("allreduce", "allgather", "reducescatter")


def _shapes(algo: Algo) -> list[_Shape]:
    """Per gpu, its buffers under ``algo.coll`` (one of :data:`CHECKED`)."""
    n, ngpus = algo.nchunksperloop, algo.ngpus
    full = (1 << ngpus) - 1
    out = []
    for g in range(ngpus):
        if algo.coll == "allreduce":
            out.append(_Shape(n, n, ("o", ("i", 0)),
                              (("i", 0, tuple((k, 1 << g) for k in range(n))),),
                              tuple((k, full) for k in range(n))))
            continue
        sh = n // ngpus
        mine = tuple((g * sh + k, 1 << g) for k in range(sh))
        if algo.coll == "allgather":
            out.append(_Shape(sh, n, ("i", ("o", g * sh)), (("i", 0, mine),),
                              tuple((u, 1 << (u // sh)) for u in range(n))))
        else:  # reducescatter
            out.append(_Shape(n, sh, ("o", ("i", g * sh)),
                              (("i", 0, tuple((u, 1 << g) for u in range(n))),),
                              tuple((g * sh + k, full) for k in range(sh))))
    return out


class _Race(Exception):
    pass


class _Run:
    """One symbolic run of an allreduce in one buffer mode (event-driven)."""

    def __init__(self, algo: Algo, inplace: bool, capacity: int) -> None:
        self.algo, self.inplace, self.capacity = algo, inplace, capacity
        self.mode = "in-place" if inplace else "out-of-place"
        self.where = f"{algo.file} ({self.mode})"
        self.shapes = _shapes(algo)
        # a unit's value: (chunk index << ngpus) | the ranks it sums, None when empty;
        # the chunk index (of the full buffer) catches sums of different chunks, which
        # rank sets alone miss
        self.shift = algo.ngpus
        self.full = (1 << algo.ngpus) - 1
        # storage per gpu: name -> list of values (None: empty); in place, one user buffer
        # is a view of the other: view[g][buf] = (storage name, offset)
        self.store: list[dict[str, list[int | None]]] = []
        self.view: list[dict[str, tuple[str, int]]] = []
        # race state per gpu and storage name: last writer (tb, epoch, step), readers
        self.lw: list[dict[str, list[tuple[int, int, Step] | None]]] = []
        self.rd: list[dict[str, list[dict[int, tuple[int, Step]]]]] = []
        for gpu in algo.gpus:
            shape = self.shapes[gpu.id]
            bufs: dict[str, list[int | None]] = {
                "i": [None] * shape.i_units, "o": [None] * shape.o_units,
                "s": [None] * gpu.s_chunks}
            view = {b: (b, 0) for b in BUFFERS}
            if inplace:
                alias, (target, base) = shape.alias
                view[alias] = (target, base)
                del bufs[alias]
            for buf, first, values in shape.initial:
                sto, base = view[buf]
                bufs[sto][base + first:base + first + len(values)] = [
                    u << self.shift | r for u, r in values]
            self.store.append(bufs)
            self.view.append(view)
            self.lw.append({b: [None] * len(v) for b, v in bufs.items()})
            self.rd.append({b: [{} for _ in v] for b, v in bufs.items()})
        # thread blocks, globally numbered
        self.tbs: list[tuple[int, ThreadBlock]] = []
        self.base: list[int] = []
        for gpu in algo.gpus:
            self.base.append(len(self.tbs))
            self.tbs.extend((gpu.id, tb) for tb in gpu.tbs)
        ntb = len(self.tbs)
        self.pc = [0] * ntb
        self.phase = [_WAIT] * ntb
        self.flag = [-1] * ntb
        self.vc = [[0] * len(algo.gpus[g].tbs) for g, _ in self.tbs]
        self.waiters: list[list[int]] = [[] for _ in range(ntb)]
        self.carry: list[tuple[int | None, ...] | None] = [None] * ntb  # value to send
        self._compile()
        self.value_error: str | None = None
        self.steps = 0
        self.messages = 0
        self.max_depth = 0

    # -- preparation

    def _compile(self) -> None:
        """Resolve dependencies (which signal satisfies each wait) and connections."""
        self.waits: list[list[tuple[int, int, int | None] | None]] = []
        self.needed: set[tuple[int, int]] = set()
        for g, tb in self.tbs:
            gpu = self.algo.gpus[g]
            last_real = max((k for k, st in enumerate(tb.steps) if st.type != "nop"),
                            default=-1)
            row: list[tuple[int, int, int | None] | None] = []
            for k, st in enumerate(tb.steps):
                if st.depid < 0 or k > last_real:  # trailing nops: the executor drops them
                    row.append(None)
                    continue
                target = gpu.tbs[st.depid]
                j = next((m for m in range(st.deps, len(target.steps))
                          if target.steps[m].hasdep and target.steps[m].type != "nop"), None)
                d = self.base[g] + st.depid
                row.append((d, st.deps, j))
                if j is not None:
                    self.needed.add((d, j))
            self.waits.append(row)
        self.snap: dict[tuple[int, int], list[int]] = {}
        # connections: (sender gpu, receiver gpu, channel) -> one sending, one receiving tb
        senders: dict[tuple[int, int, int], int] = {}
        receivers: dict[tuple[int, int, int], int] = {}
        for t, (g, tb) in enumerate(self.tbs):
            if tb.send >= 0:
                senders[(g, tb.send, tb.chan)] = t
            if tb.recv >= 0:
                receivers[(tb.recv, g, tb.chan)] = t
        self.out_fifo = [-1] * len(self.tbs)
        self.in_fifo = [-1] * len(self.tbs)
        self.fifo_sender: list[int] = []
        self.fifo_receiver: list[int] = []
        # a message: its values, the sending tb and step
        self.fifo: list[deque[tuple[tuple[int | None, ...], int, Step]]] = []
        self.fifo_units: list[int] = []
        for key, s in senders.items():
            r = receivers.get(key)
            g, tb = self.tbs[s]
            if r is None:
                if any(STEP_TYPES[st.type].send for st in tb.steps):
                    raise ScheduleError(
                        f"{self.algo.file}: gpu {g} tb {tb.id} sends to gpu {key[1]} on "
                        f"channel {key[2]}, but no tb of gpu {key[1]} has recv={g} on "
                        f"channel {key[2]}")
                continue
            self.out_fifo[s] = self.in_fifo[r] = len(self.fifo)
            self.fifo_sender.append(s)
            self.fifo_receiver.append(r)
            self.fifo.append(deque())
            self.fifo_units.append(0)
        for key, r in receivers.items():
            g, tb = self.tbs[r]
            if self.in_fifo[r] < 0 and any(STEP_TYPES[st.type].recv for st in tb.steps):
                raise ScheduleError(
                    f"{self.algo.file}: gpu {g} tb {tb.id} receives from gpu {key[0]} on "
                    f"channel {key[2]}, but no tb of gpu {key[0]} has send={g} on channel "
                    f"{key[2]}")

    # -- naming

    def _at(self, t: int, st: Step | None = None) -> str:
        g, tb = self.tbs[t]
        text = f"gpu {g} tb {tb.id}"
        if st is not None:
            text += f" step {st.s} ({st.type})"
        return text

    def _value_error(self, message: str) -> None:
        if self.value_error is None:
            self.value_error = message

    # -- buffer access with race detection

    def _access(self, t: int, st: Step, buf: str, off: int, cnt: int, write: bool) -> None:
        g, tb = self.tbs[t]
        me = tb.id
        vc = self.vc[t]
        epoch = st.s + 1
        sto, base = self.view[g][buf]
        lws = self.lw[g][sto]
        rds = self.rd[g][sto]
        for k in range(base + off, base + off + cnt):
            lw = lws[k]
            if lw is not None and lw[0] != me and vc[lw[0]] < lw[1]:
                self._race(g, sto, k, lw[0], lw[2], me, st)
            if write:
                for other, (ep, ost) in rds[k].items():
                    if other != me and vc[other] < ep:
                        self._race(g, sto, k, other, ost, me, st)
                lws[k] = (me, epoch, st)
                rds[k] = {}
            else:
                rds[k][me] = (epoch, st)

    def _race(self, g: int, sto: str, k: int, t1: int, s1: Step, t2: int, s2: Step) -> None:
        alias = ""
        if self.inplace and sto in ("i", "o"):
            shape = self.shapes[g]
            view, (_, base) = shape.alias
            size = shape.i_units if view == "i" else shape.o_units
            alias = (" (o is i in-place)" if self.algo.coll == "allreduce" else
                     f" ({view} is {sto}[{base}..{base + size - 1}] in-place)")
        raise ScheduleError(
            f"{self.where}: gpu {g}: race on {sto}[{k}]{alias} between tb {t1} step "
            f"{s1.s} ({s1.type}) and tb {t2} step {s2.s} ({s2.type}): neither waits for "
            f"the other; give the later one a dependency (depid/deps) on the earlier, "
            f"whose step needs hasdep=1")

    def _read(self, t: int, st: Step, buf: str, off: int, cnt: int) -> tuple[int | None, ...]:
        g = self.tbs[t][0]
        self._access(t, st, buf, off, cnt, write=False)
        sto, base = self.view[g][buf]
        values = tuple(self.store[g][sto][base + off:base + off + cnt])
        for k, v in enumerate(values):
            if v is None:
                self._value_error(f"{self.where}: {self._at(t, st)} reads {buf}[{off + k}], "
                                  "which holds nothing yet (written by no earlier step)")
                break
        return values

    def _write(self, t: int, st: Step, values: tuple[int | None, ...]) -> None:
        g, tb = self.tbs[t]
        if st.dstbuf == "i" and not self.inplace:
            raise ScheduleError(
                f"{self.where}: {self._at(t, st)} writes i[{st.dstoff}], the input buffer; "
                "out of place, NCCL's send buffer is read-only (write o or s, or declare "
                "outofplace=0)")
        self._access(t, st, st.dstbuf, st.dstoff, st.cnt, write=True)
        sto, base = self.view[g][st.dstbuf]
        self.store[g][sto][base + st.dstoff:base + st.dstoff + st.cnt] = values

    def _text(self, v: int) -> str:
        return f"chunk {v >> self.shift} of {_ranks_text(v & self.full)}"

    def _add(self, t: int, st: Step, src: tuple[int | None, ...],
             other: tuple[int | None, ...],
             other_name: Callable[[int], str]) -> tuple[int | None, ...]:
        """src + other, unit by unit; ``other_name(k)`` names the other operand's unit."""
        out: list[int | None] = []
        for k, (x, y) in enumerate(zip(src, other)):
            if x is None or y is None:
                out.append(None)
                continue
            if x >> self.shift != y >> self.shift or x & y & self.full:
                # the message only for a fault: naming rank sets costs more than adding
                what = f"{self._at(t, st)} adds {st.srcbuf}[{st.srcoff + k}] " \
                       f"({self._text(x)}) to {other_name(k)} ({self._text(y)})"
                self._value_error(f"{self.where}: {what}: a sum of two different chunks"
                                  if x >> self.shift != y >> self.shift else
                                  f"{self.where}: {what}: "
                                  f"{_ranks_text(x & y & self.full)} would be counted twice")
            out.append(x | y)
        return tuple(out)

    # -- execution

    def _wake(self, t: int) -> None:
        if not self.queued[t] and self.pc[t] < len(self.tbs[t][1].steps):
            self.queued[t] = True
            self.ready.append(t)

    def _signal(self, t: int, st: Step) -> None:
        self.flag[t] = st.s
        if (t, st.s) in self.needed:
            self.snap[(t, st.s)] = list(self.vc[t])
        waiters = self.waiters[t]
        if waiters:
            self.waiters[t] = []
            for w in waiters:
                self._wake(w)

    def _sends(self, t: int) -> bool:
        steps = self.tbs[t][1].steps
        return self.pc[t] < len(steps) and STEP_TYPES[steps[self.pc[t]].type].send

    def _advance(self, t: int) -> None:
        g, tb = self.tbs[t]
        steps = tb.steps
        vc = self.vc[t]
        while self.pc[t] < len(steps):
            st = steps[self.pc[t]]
            kind = STEP_TYPES[st.type]
            if self.phase[t] == _WAIT:
                wait = self.waits[t][st.s]
                if wait is not None:
                    d, deps, j = wait
                    if self.flag[d] < deps:
                        self.waiters[d].append(t)
                        return
                    assert j is not None  # the flag reached deps, so step j signalled
                    snap = self.snap[(d, j)]
                    for k, v in enumerate(snap):
                        if v > vc[k]:
                            vc[k] = v
                vc[tb.id] = st.s + 1
                self.phase[t] = _RECV if kind.recv else _SEND
                if kind.recv:
                    self.carry[t] = None
            if self.phase[t] == _RECV:
                f = self.in_fifo[t]
                q = self.fifo[f]
                if not q:
                    s = self.fifo_sender[f]
                    if self.phase[s] == _SEND and self._sends(s):
                        self._wake(s)  # a blocked send may hand its message over directly
                    return
                values, sender, sst = q.popleft()
                self.fifo_units[f] -= sst.cnt
                self._wake(self.fifo_sender[f])
                if sst.cnt != st.cnt:
                    raise ScheduleError(
                        f"{self.where}: {self._at(t, st)} receives cnt={st.cnt}, but the "
                        f"message it takes, from {self._at(sender, sst)}, has cnt={sst.cnt}; "
                        "a recv must take exactly the message its peer sent")
                self.messages += 1
                if kind.reduce:
                    src = self._read(t, st, st.srcbuf, st.srcoff, st.cnt)
                    values = self._add(t, st, src, values,
                                       lambda k: f"unit {k} received from "
                                       f"{self._at(sender, sst)}" if st.cnt > 1 else
                                       f"the data received from {self._at(sender, sst)}")
                if kind.dst:
                    self._write(t, st, values)
                self.carry[t] = values
                self.phase[t] = _SEND
            # _SEND: the send half of the step, or the local step
            if kind.send:
                f = self.out_fifo[t]
                r = self.fifo_receiver[f]
                room = self.fifo_units[f] + st.cnt <= self.capacity
                meet = not self.fifo[f] and self.phase[r] == _RECV
                if not (room or meet):
                    return
                carried = self.carry[t]
                if carried is None:
                    carried = self._read(t, st, st.srcbuf, st.srcoff, st.cnt)
                self.fifo[f].append((carried, t, st))
                self.fifo_units[f] += st.cnt
                if room and self.fifo_units[f] > self.max_depth:
                    self.max_depth = self.fifo_units[f]
                self._wake(r)
            elif st.type == "cpy":
                self._write(t, st, self._read(t, st, st.srcbuf, st.srcoff, st.cnt))
            elif st.type == "re":
                src = self._read(t, st, st.srcbuf, st.srcoff, st.cnt)
                dst = self._read(t, st, st.dstbuf, st.dstoff, st.cnt)
                self._write(t, st, self._add(t, st, src, dst,
                                             lambda k: f"{st.dstbuf}[{st.dstoff + k}]"))
            self.carry[t] = None
            self.steps += 1
            if st.hasdep and st.type != "nop":
                self._signal(t, st)
            self.pc[t] += 1
            self.phase[t] = _WAIT

    def run(self) -> None:
        self.queued = [True] * len(self.tbs)
        self.ready: deque[int] = deque(range(len(self.tbs)))
        while self.ready:
            t = self.ready.popleft()
            self.queued[t] = False
            self._advance(t)
        if self.value_error is not None:
            raise ScheduleError(self.value_error)
        blocked = [t for t in range(len(self.tbs)) if self.pc[t] < len(self.tbs[t][1].steps)]
        if blocked:
            lines = [self._blocked_text(t) for t in blocked[:5]]
            more = f"\n  ... and {len(blocked) - 5} more" if len(blocked) > 5 else ""
            raise ScheduleError(f"{self.where}: deadlock: {len(blocked)} tbs cannot move:\n  "
                                + "\n  ".join(lines) + more)
        for f, q in enumerate(self.fifo):
            if q:
                s, r = self.fifo_sender[f], self.fifo_receiver[f]
                raise ScheduleError(
                    f"{self.where}: {len(q)} messages from {self._at(s)} to {self._at(r)} "
                    "are never received; give the receiver a recv step for each")
        self._check_output()

    def _blocked_text(self, t: int) -> str:
        g, tb = self.tbs[t]
        st = tb.steps[self.pc[t]]
        head = (f"gpu {g} tb {tb.id} (send {tb.send}, recv {tb.recv}, chan {tb.chan}) "
                f"step {st.s} {st.type}: waits for ")
        phase = self.phase[t]
        if phase == _WAIT:
            wait = self.waits[t][st.s]
            assert wait is not None
            d, deps, j = wait
            target = self.tbs[d][1]
            dst = target.steps[deps]
            text = f"tb {target.id} step {deps} ({dst.type})"
            if j is None:
                why = ("is a nop, and nops never signal" if dst.type == "nop"
                       else "has hasdep=0, so it never signals")
                return (head + text + f"; that step {why}, and no later step of tb "
                        f"{target.id} has hasdep=1")
            return head + text + f"; tb {target.id} is {self._progress(d)}"
        if phase == _RECV:
            f = self.in_fifo[t]
            s = self.fifo_sender[f]
            return (head + f"a message from gpu {tb.recv} on channel {tb.chan}; gpu "
                    f"{tb.recv} tb {self.tbs[s][1].id} is {self._progress(s)}")
        f = self.out_fifo[t]
        r = self.fifo_receiver[f]
        return (head + f"buffer space toward gpu {tb.send} on channel {tb.chan} "
                f"({self.fifo_units[f]} of {self.capacity} units queued, the message is "
                f"{st.cnt}); gpu {tb.send} tb {self.tbs[r][1].id} is {self._progress(r)}")

    def _progress(self, t: int) -> str:
        tb = self.tbs[t][1]
        if self.pc[t] >= len(tb.steps):
            return "finished"
        st = tb.steps[self.pc[t]]
        state = ("waiting for its dependency", "receiving", "sending")[self.phase[t]]
        if self.phase[t] == _SEND and not STEP_TYPES[st.type].send:
            state = "ready"
        return f"at step {st.s} ({st.type}, {state})"

    def _check_output(self) -> None:
        n = self.algo.ngpus
        for gpu in self.algo.gpus:
            sto, base = self.view[gpu.id]["o"]
            out = self.store[gpu.id][sto]
            for k, (unit, want) in enumerate(self.shapes[gpu.id].final):
                v = out[base + k]
                # allreduce in place names the storage (i), as it always has
                name = f"i[{k}]" if self.algo.coll == "allreduce" and self.inplace else f"o[{k}]"
                expected = (f"expected all of 0..{n - 1} once" if want == self.full else
                            f"expected {_ranks_text(want)} only (gpu "
                            f"{want.bit_length() - 1}'s shard, copied)")
                if v is None:
                    raise ScheduleError(f"{self.where}: gpu {gpu.id} {name} is never "
                                        f"written; {expected}")
                if v >> self.shift != unit:
                    raise ScheduleError(
                        f"{self.where}: gpu {gpu.id} {name} holds {self._text(v)}; "
                        f"expected chunk {unit} of "
                        + (f"all of 0..{n - 1} once" if want == self.full else
                           _ranks_text(want) + " only"))
                if v & self.full != want:
                    missing = want & ~v
                    raise ScheduleError(
                        f"{self.where}: gpu {gpu.id} {name} holds "
                        f"{_ranks_text(v & self.full)}; {expected}"
                        + (f" (missing {_ranks_text(missing)})" if missing else
                           f" (extra {_ranks_text(v & self.full & ~want)})"))


def verify_msccl(algo: Algo, *, capacity: int | None = None) -> CheckReport:
    """Check symbolically that an MSCCL algorithm computes its collective.

    ``coll`` is ``allreduce``, ``allgather`` or ``reducescatter``; the buffers are NCCL's
    for that collective (:data:`CHECKED`): ``nchunksperloop`` units cut the full buffer,
    rank ``g``'s shard is units ``g * nchunksperloop / ngpus`` onwards. Each buffer unit
    (one MSCCL chunk of ``i``, ``o`` or ``s`` on one gpu) holds the set of ranks whose
    input it sums, and which chunk of the full buffer that is, or nothing. At the start
    an allreduce's and a reduce-scatter's ``i[k]`` hold ``{g}`` (chunk ``k``) on gpu
    ``g``, an allgather's ``i[k]`` holds ``{g}`` (chunk ``k`` of ``g``'s shard); ``o``
    and ``s`` hold nothing. In place, ``o`` *is* ``i`` (allreduce), ``i`` is ``g``'s
    shard of ``o`` (allgather), ``o`` is ``g``'s shard of ``i`` (reduce-scatter). The
    algorithm is run once
    per mode it declares (``inplace``, ``outofplace``): each tb runs its steps in order;
    a step first waits for its dependency (the flag of tb ``depid`` reaching ``deps``;
    a tb sets its flag to a step's index when that step, with ``hasdep=1``, completes;
    nops never signal); connections are FIFOs per (sender gpu, receiver gpu, channel);
    a send of ``c`` units completes when the queued units plus ``c`` fit ``capacity``,
    or when the connection is empty and the receiver waits at its recv (rendezvous); a
    recv takes the oldest message, whose cnt must equal its own; fused steps (rcs, rrs,
    rrcs) receive, then send. Sends snapshot their data; sums of sets that share a rank
    and reads of units that hold nothing are errors; two accesses to a unit from
    different tbs of a gpu, one a write, must be ordered by program order and
    dependencies (vector clocks), whatever the timing. At the end every unit of ``o``
    must hold its chunk of the full buffer: every rank once (allreduce: ``o[k]``, chunk
    ``k``; reduce-scatter: ``o[k]``, chunk ``k`` of ``g``'s shard), or only the rank
    whose shard it is (allgather: ``o[k]``, chunk ``k``).

    Parameters
    ----------
    algo
        A parsed algorithm (:func:`loads_msccl`); ``coll`` one of :data:`CHECKED`, and
        for an allgather or a reduce-scatter ``nchunksperloop`` a multiple of ``ngpus``.
    capacity
        Units a connection buffers; default by protocol (Simple 2, LL and LL128 8).

    Returns
    -------
    CheckReport

    Raises
    ------
    ScheduleError
        Naming the file, mode, gpu, tb and step: a race, a double-counted rank, a read
        of an empty unit, a cnt mismatch, a deadlock (up to 5 blocked tbs and what each
        waits for), unreceived messages, or a wrong output unit.

    Notes
    -----
    Runs in time linear in the steps (an event-driven worklist) plus, per dependency,
    the number of tbs on the gpu (vector-clock joins).
    """
    if algo.coll not in CHECKED:
        raise ScheduleError(f"{algo.file}: verify_msccl checks {', '.join(CHECKED)} "
                            f"algorithms; coll={algo.coll!r} is not supported yet")
    if algo.coll != "allreduce" and algo.nchunksperloop % algo.ngpus:
        raise ScheduleError(
            f"{algo.file}: coll={algo.coll!r}: nchunksperloop={algo.nchunksperloop} is not "
            f"a multiple of ngpus={algo.ngpus}; each rank's shard of the full buffer (its "
            f"{'input' if algo.coll == 'allgather' else 'output'}) must be a whole number "
            "of chunks")
    if capacity is None:
        capacity = DEFAULT_CAPACITY[algo.proto]
    if capacity < 1:
        raise ScheduleError(f"capacity must be >= 1 unit, got {capacity}")
    modes = [m for m, on in (("inplace", algo.inplace), ("outofplace", algo.outofplace)) if on]
    if not modes:
        raise ScheduleError(f"{algo.file}: inplace=0 and outofplace=0: the algorithm is "
                            "declared valid for no buffer mode; set one of them to 1")
    for gpu, shape in zip(algo.gpus, _shapes(algo)):
        for buf, size, real in (("i", gpu.i_chunks, shape.i_units),
                                ("o", gpu.o_chunks, shape.o_units)):
            if size > real:
                raise ScheduleError(
                    f"{algo.file}: gpu {gpu.id} {buf}_chunks={size} exceeds "
                    + (f"nchunksperloop={algo.nchunksperloop}; an allreduce's user buffers "
                       "hold nchunksperloop chunks" if algo.coll == "allreduce" else
                       f"the {real} chunks of the {algo.coll}'s "
                       f"{'send' if buf == 'i' else 'receive'} buffer ("
                       + ("nchunksperloop / ngpus)" if real < algo.nchunksperloop
                          else "nchunksperloop)")))
    steps = messages = depth = 0
    for mode in modes:
        run = _Run(algo, mode == "inplace", capacity)
        run.run()
        steps, messages = run.steps, run.messages
        depth = max(depth, run.max_depth)
    return CheckReport(tuple(modes), steps, messages, depth, capacity)
