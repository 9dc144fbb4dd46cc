"""A schedule as an MSCCL XML algorithm, for msccl-executor-nccl and RCCL.

How a topoplan schedule becomes thread blocks:

- **Collectives.** An allreduce, a reduce-scatter or an allgather (the schedule's
  ``collective``), written as ``coll="allreduce"``, ``"reducescatter"`` or
  ``"allgather"`` with NCCL's buffers: ``nchunksperloop`` cuts the full buffer (the
  executor multiplies a reduce-scatter's and an allgather's per-rank count by
  ``ngpus``), so each rank's shard is ``nchunksperloop / ngpus`` of them.
- **Native steps** (IR v3: the ``nccl`` plan, ``composed``'s steps). MSCCL XML has no
  collective steps: each native collective becomes what NCCL runs there, written as
  point-to-point steps (:func:`topoplan.ir.passes.lower_native`). An allreduce or an
  allgather over every GPU of a cluster with rails runs over NCCL's rings, one per NIC,
  each crossing between boxes on its own rail (:func:`topoplan.cluster.rails.rail_rings`);
  any other over one ring in group order; the chunks are cut finer until each ring
  has a part per member. A reduce-scatter, a reduce and a broadcast lower as
  :mod:`topoplan.ir.passes.lower` says. This needs the cluster: the export then simulates
  both, the native steps (NCCL's time, by the NCCL model) and the point-to-point
  algorithm, at the plan's size under its cost profile, says both in a note, and
  refuses (naming both) an algorithm more than ``max_slowdown`` times slower than the
  native steps. With ``lower=False`` (``topoplan export --no-lower``) such a schedule is
  refused.
- **Chunks to MSCCL chunks.** The buffer is cut into ``nchunksperloop`` equal MSCCL
  chunks; topoplan chunk ``k`` is a whole number of them (exact when the fractions are
  multiples of ``1/D`` for a ``D`` up to 4096, else rounded, and said so; a sharded
  collective's shards are rounded each on the same grid, so they stay equal). ``--channels
  K`` stacks ``K`` copies of the plan on ``K`` disjoint slices of the buffer, one set of
  channels each, as msccl-tools' instances do; for a sharded collective instance ``c``
  takes slice ``c`` of every shard, so that each instance is a reduce-scatter or an
  allgather of its own (messages are cut where they cross a shard).
- **Buffers** (:class:`_Space`). A rank reads its own contribution from the input
  buffer ``i`` until it has received into a chunk. An allreduce keeps what it received
  in the output buffer ``o``. An allgather's ``i`` is the rank's shard; every received
  chunk goes to ``o``, and a ``cpy`` puts the rank's own shard there. A
  reduce-scatter's ``o`` is the rank's shard: sums of its own chunks go there, partial
  sums of other ranks' chunks to scratch ``s`` (unless they are only forwarded, by an
  ``rrs``). The input is never written, so every algorithm is right both in place
  (NCCL's layouts: ``i`` is ``o``; ``i`` is the rank's shard of ``o``; ``o`` is the
  rank's shard of ``i``) and out of place.
- **Messages to steps.** A send is an ``s`` step; a recv an ``r`` (overwrite) or ``rrc``
  (reduce); a message longer than the executor's count limit is several steps.
- **Fusion.** A recv at step ``t`` whose result is exactly what the rank sends next, at
  step ``t + 1`` (nothing else writes those chunks in between) becomes one ``rrcs``
  (``rrs`` when nothing reads the sum again before it is overwritten) or ``rcs`` step,
  on a thread block that receives from one peer and sends to the other. Which
  recv-peer/send-peer pairs share a thread block is a maximum-weight matching on the
  number of steps they fuse.
- **Order.** Each thread block runs its steps in the plan's order. Across thread blocks
  of one rank, a step waits (``depid``/``deps``) for every earlier step of another
  thread block that touches the same chunks, when one of the two writes (read after
  write, write after read, write after write); one dependency per step, the rest on
  ``nop`` steps before it.
- **Channels** (IR v4). Channel ``b`` of the schedule is MSCCL channels ``b * nseg ..
  b * nseg + nseg - 1`` of each instance (instance ``c`` adds ``c * nchannels * nseg``),
  and its messages pair per pair of ranks on that channel, as MSCCL's connections are
  per channel; channels share no chunk, so no dependency crosses them and each runs
  on its own thread blocks. When ``nseg > 1`` the ``<algo>`` says so
  (:data:`~topoplan.interop.msccl.SEGMENTS_ATTR`), so that the import reads the
  plan's channels back.
- **Vectored messages** (IR v4). MSCCL steps carry one contiguous range: a vectored
  send or recv becomes one step per range (:func:`topoplan.ir.passes.split_vectored`),
  in the thread block the op's peer and channel give it, in range order, and a note
  says so. The executor then runs one MSCCL step per range, as it would for the
  unvectored plan.
- **Limits** (:class:`topoplan.interop.msccl.Limits`). The messages of one pair of
  ranks on one channel are split into ``nseg`` segments (consecutive MSCCL channels)
  when a thread block would exceed the executor's steps per thread block; when the
  channels run out, the error names the plan options that make the plan smaller.

The result is run through :func:`topoplan.interop.msccl.verify_msccl`, an independent
interpreter of the step types; when fused thread blocks could deadlock under the
executor's buffering, the export falls back to separate send and receive thread blocks.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Sequence

from ...ir.collectives import collective_of, shard_chunks
from ...errors import PlannerError, ScheduleError
from ...ir.fingerprint import META_KEY
from ...ir.passes import split_vectored
from ...ir.schedule import Native, OpKind, Schedule
from ...units import plural
from .limits import MAX_NODES, Limits, limit_violations
from .model import PROTOCOLS, STEP_TYPES, Algo, Gpu, Step, ThreadBlock
from .verify import verify_msccl

if TYPE_CHECKING:
    from ...analysis.cost import CostProfile
    from ...cluster import Cluster

__all__ = ["export_msccl", "ExportResult", "Prediction", "PROTOCOLS", "MAX_SLOWDOWN"]

MAX_UNITS = 4096  # the finest MSCCL chunk grid tried for exact chunk fractions
#: The export of native steps refuses point-to-point steps this many times slower than
#: the native steps in simulation (``topoplan export --max-slowdown``). Rings pay a
#: message latency per step where NCCL's pipelined protocols pay less: on a 4 x 8 H100
#: rail cluster NCCL's rings, written as MSCCL steps, are 2.1x NCCL at 64 MiB and 1.3x at
#: 256 MiB; the all-to-all they replaced was 67x.
MAX_SLOWDOWN = 3.0


@dataclass(frozen=True)
class Prediction:
    """What the export of native steps predicts: the point-to-point algorithm written
    against the native steps it replaces, simulated at ``size`` bytes under ``profile``
    on ``cluster``."""

    cluster: str
    size: int
    profile: str
    native_s: float          # the plan as it is: its native steps priced by their model
    exported_s: float        # the exported point-to-point algorithm
    rings: str               # what the native steps became, in words
    nccl: str = ""           # NCCL's own choice there (``Ring/LL128 x16``), if known

    @property
    def slowdown(self) -> float:
        return self.exported_s / self.native_s if self.native_s > 0 else 1.0

    def text(self) -> str:
        """``predicted 2.05 ms at 64MiB on rail4x8 (profile nccl), 2.14x the native
        steps' 957 us (NCCL: Ring/LL128 x16)``."""
        from ...units import format_size, format_time
        nccl = f" (NCCL: {self.nccl})" if self.nccl else ""
        return (f"predicted {format_time(self.exported_s)} at {format_size(self.size)} on "
                f"{self.cluster} (profile {self.profile}), {self.slowdown:.2f}x the native "
                f"steps' {format_time(self.native_s)}{nccl}")

    def to_dict(self) -> dict[str, object]:
        return {"cluster": self.cluster, "size_bytes": self.size, "profile": self.profile,
                "native_s": self.native_s, "exported_s": self.exported_s,
                "slowdown": self.slowdown, "rings": self.rings, "nccl": self.nccl}


@dataclass
class ExportResult:
    """An exported algorithm and what the export decided."""

    algo: Algo
    notes: list[str] = field(default_factory=list)  # one short line each
    details: list[str] = field(default_factory=list)  # why a layout was not used
    fused: int = 0          # fused steps (rrcs, rrs, rcs) per instance
    segments: int = 1       # MSCCL channels per channel of the plan and instance
    max_steps: int = 0      # the longest thread block, nops included
    max_tbs: int = 0        # the most thread blocks on one GPU
    prediction: Prediction | None = None  # native steps: the time against theirs
    planned_bytes: int | None = None        # the size the plan was made for (or given)

    def serves(self) -> str:
        """Which calls the executor picks the algorithm for (:func:`serves`)."""
        return serves(self.algo, self.planned_bytes)


@dataclass(eq=False)
class _Node:
    """One topoplan op (or a fused recv + send) on one rank."""

    rank: int
    step: int
    phase: int               # 0 send, 1 recv: a step's sends read before its recvs land
    idx: int
    kind: str                # "s", "r", "rrc", and after fusion "rcs", "rrs", "rrcs"
    chunk: int
    count: int
    recv_peer: int = -1
    send_peer: int = -1
    recv_msg: int = -1
    send_msg: int = -1
    chan: int = 0
    tb: tuple[int, int, int] | None = None
    deps: list[_Node] = field(default_factory=list)
    send_idx: int = -1       # fused: the index of its send in step + 1
    position: int = 0        # index among its thread block's nodes
    last_s: int = 0          # the step index (s) of its last piece
    pieces: list[tuple[int, int, str, str]] = field(default_factory=list)  # cpy: its own

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.step, self.phase, self.idx)


@dataclass
class _Message:
    src: int
    dst: int
    k: int                   # the k-th message of the pair on its channel
    chunk: int
    count: int
    send_node: _Node
    recv_node: _Node
    pieces: list[tuple[int, int, str, str]] = field(default_factory=list)
    # (unit start, unit end, sender's source buffer, receiver's operand buffer)
    channel: int = 0         # the schedule's channel (IR v4)

    @property
    def pair(self) -> tuple[int, int, int]:
        """``(src, dst, channel)``: messages pair in order within it (IR v4)."""
        return (self.src, self.dst, self.channel)


def _unit_grid(chunks: Sequence[float], nshards: int = 0, *, exact_first: bool = True
               ) -> tuple[list[int], str | None]:
    """Cumulative MSCCL-chunk boundaries of each topoplan chunk, and a note if rounded.

    ``nshards``: for a reduce-scatter or an allgather, the ranks whose shards (equal
    runs of chunks, :func:`topoplan.ir.collectives.shard_chunks`) must each be the same
    whole number of MSCCL chunks; the rounding then keeps every shard boundary.
    ``exact_first``: the exact grid where there is one (else a power-of-two grid, per
    shard for a sharded collective, rounded by largest remainder).
    """
    fracs = [Fraction(c).limit_denominator(1 << 20) for c in chunks]
    exact = exact_first and all(abs(float(f) - c) < 1e-12 for f, c in zip(fracs, chunks))
    shards = shard_chunks(nshards, chunks) if nshards else ()
    if exact:
        lcm = math.lcm(*(f.denominator for f in fracs), nshards or 1)
        if lcm <= MAX_UNITS:
            bounds = [0]
            for f in fracs:
                bounds.append(bounds[-1] + int(f * lcm))
            if not shards or (bounds[-1] == lcm and all(
                    bounds[a] * nshards == r * lcm for r, (a, _) in enumerate(shards))):
                return bounds, None
    n = len(chunks)
    if not shards:
        # Round on a power-of-two grid fine enough that the smallest chunk gets >= 8
        # units (at most MAX_UNITS, at least one unit per chunk), by largest remainder.
        grid = 1 << max(3, math.ceil(math.log2(max(n, 8 / max(min(chunks), 1e-9)))))
        grid = max(min(grid, MAX_UNITS), n)
        units = _largest_remainder(chunks, grid)
        what = f"a grid of {grid} MSCCL chunks"
    else:
        # Each shard on the same grid (its chunks' fractions of the shard, rounded as
        # above; at most MAX_UNITS in all), so that shard r starts at r * grid.
        local = [[chunks[k] * nshards for k in range(a, b)] for a, b in shards]
        most = max(len(c) for c in local)
        cap = 1 << max(0, (MAX_UNITS // nshards).bit_length() - 1)
        grid = max(min(max(1 << max(3, math.ceil(math.log2(max(len(c), 8 / max(min(c), 1e-9)))))
                               for c in local), cap), most)
        units = [u for c in local for u in _largest_remainder(c, grid)]
        grid *= nshards
        what = (f"a grid of {grid} MSCCL chunks ({grid // nshards} per shard, each shard "
                "rounded on its own)")
    bounds = [0]
    for u in units:
        bounds.append(bounds[-1] + u)
    worst = max(abs(u / grid - c) / c for u, c in zip(units, chunks))
    moved = sum(abs(u / grid - c) for u, c in zip(units, chunks)) / 2
    return bounds, (f"chunk fractions are not multiples of 1/D for any D <= {MAX_UNITS}: rounded "
                    f"to {what} ({moved:.2%} of the buffer changes "
                    f"chunk; the largest change of one chunk's size is {worst:.1%}); the data "
                    "each step moves shifts by as much")


def _largest_remainder(chunks: Sequence[float], grid: int) -> list[int]:
    """Units per chunk summing to ``grid``, each >= 1, closest to ``chunk * grid``."""
    n = len(chunks)
    ideal = [c * grid for c in chunks]
    units = [max(1, math.floor(x)) for x in ideal]
    excess = sum(units) - grid
    if excess < 0:  # give the missing units to the chunks rounded down the most
        for k in sorted(range(n), key=lambda k: units[k] - ideal[k])[:-excess]:
            units[k] += 1
    while excess > 0:  # chunks raised to one unit: take back from the most over-served
        for k in sorted((k for k in range(n) if units[k] > 1),
                        key=lambda k: ideal[k] - units[k])[:excess]:
            units[k] -= 1
        excess = sum(units) - grid
    return units


#: topoplan's collective names and the executor's ``coll`` (``msccl_parser.cc``).
MSCCL_COLL = {"allreduce": "allreduce", "allgather": "allgather",
              "reduce_scatter": "reducescatter"}


@dataclass(frozen=True)
class _Space:
    """Where a topoplan unit lives in the MSCCL buffers of one rank.

    A topoplan unit ``u`` (an MSCCL chunk of one instance, ``0 <= u < units``) of
    instance ``c`` is unit :meth:`full` of the full buffer: instances stacked
    (allreduce: ``c * units + u``), or, for a sharded collective, instance ``c`` takes
    slice ``c`` of every shard, so that shard ``r`` of the full buffer is shard ``r`` of
    every instance (``K`` instances: shard ``r`` is ``K * s`` units, ``s = units / N``).
    :meth:`loc` is the buffer and offset of a unit on a rank, before (``written``
    False: the rank's own input) or after the rank has received into it:

    - allreduce: ``i[F]``, then ``o[F]``;
    - allgather: the rank's own shard in ``i`` (``i[F - rank * K * s]``), every
      received chunk in ``o[F]``;
    - reduce-scatter: ``i[F]``; then the rank's own shard in ``o`` (``o[F - rank * K *
      s]``) and partial sums of other shards in scratch (``s``, the full buffer without
      the rank's shard).
    """

    coll: str
    nranks: int
    units: int        # per instance
    instances: int

    @property
    def sharded(self) -> bool:
        return self.coll != "allreduce"

    @property
    def total(self) -> int:
        return self.units * self.instances

    @property
    def shard(self) -> int:
        """Units of one shard of the full buffer."""
        return self.total // self.nranks

    def full(self, u: int, c: int) -> int:
        if not self.sharded:
            return c * self.units + u
        s = self.units // self.nranks
        return u + (u // s) * s * (self.instances - 1) + c * s

    def loc(self, rank: int, u: int, c: int, written: bool) -> tuple[str, int]:
        f = self.full(u, c)
        if self.coll == "allreduce":
            return ("o" if written else "i"), f
        lo = rank * self.shard
        own = lo <= f < lo + self.shard
        if self.coll == "allgather":
            return ("i", f - lo) if own and not written else ("o", f)
        if not written:
            return "i", f
        if own:
            return "o", f - lo
        return "s", (f if f < lo else f - self.shard)

    def key(self, rank: int, u: int, written: bool) -> tuple[str, int]:
        """The buffer and offset of ``u`` less ``u``: consecutive units with one key are
        consecutive in one buffer (in every instance)."""
        buf, off = self.loc(rank, u, 0, written)
        return buf, off - u

    def one_range(self, pieces: list[tuple[int, int, str, str]]) -> bool:
        """Whether a message's pieces are one range of the full buffer in every instance:
        always, but with instances of a sharded collective, whose shards are apart."""
        if not self.sharded or self.instances == 1:
            return True
        s = self.units // self.nranks
        return pieces[0][0] // s == (pieces[-1][1] - 1) // s

    def sizes(self) -> tuple[int, int]:
        """Units of the send and receive buffers (``i_chunks``, ``o_chunks``)."""
        return ((self.shard if self.coll == "allgather" else self.total),
                (self.shard if self.coll == "reduce_scatter" else self.total))


def _build_nodes(schedule: Schedule) -> tuple[list[list[_Node]], list[_Message]]:
    """Every op as a node, and messages paired in order per pair of ranks and channel
    (IR v4; the schedule is verified)."""
    nodes: list[list[_Node]] = [[] for _ in range(schedule.nranks)]
    send_q: dict[tuple[int, int, int], list[_Node]] = defaultdict(list)
    recv_q: dict[tuple[int, int, int], list[_Node]] = defaultdict(list)
    for program in schedule.ranks:
        r = program.rank
        for t, step in enumerate(program.steps):
            for j, op in enumerate(step):
                if isinstance(op, Native):
                    raise ScheduleError(f"rank {r} step {t}: MSCCL XML has no native "
                                        f"collective steps ({op.text()})")
                if op.kind is OpKind.SEND:
                    node = _Node(r, t, 0, j, "s", op.chunk, op.count, send_peer=op.peer)
                    send_q[(r, op.peer, op.channel)].append(node)
                else:
                    node = _Node(r, t, 1, j, "rrc" if op.reduce else "r", op.chunk, op.count,
                                 recv_peer=op.peer)
                    recv_q[(op.peer, r, op.channel)].append(node)
                nodes[r].append(node)
        nodes[r].sort(key=lambda nd: nd.key)
    msgs: list[_Message] = []
    for (src, dst, ch), sends in sorted(send_q.items()):
        for k, (sn, rn) in enumerate(zip(sends, recv_q[(src, dst, ch)])):
            m = len(msgs)
            sn.send_msg = rn.recv_msg = m
            msgs.append(_Message(src, dst, k, sn.chunk, sn.count, sn, rn, channel=ch))
    return nodes, msgs


def _statuses(nodes: list[_Node], nchunks: int, msgs: list[_Message]
              ) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """Per message, the sender's source buffer and the receiver's operand buffer per chunk.

    A chunk is read from ``i`` until the rank has received into it, then from ``o``.
    """
    written = [False] * nchunks
    src_of: dict[int, list[str]] = {}
    opnd_of: dict[int, list[str]] = {}
    for node in nodes:  # in (step, phase, idx) order: a step's sends see its start
        span = range(node.chunk, node.chunk + node.count)
        if node.kind == "s":
            src_of[node.send_msg] = ["o" if written[c] else "i" for c in span]
        else:
            opnd_of[node.recv_msg] = ["o" if written[c] else "i" for c in span]
            for c in span:
                written[c] = True
    return src_of, opnd_of


def _pieces(msg: _Message, src: list[str], opnd: list[str], bounds: list[int],
            max_cnt: int, reduce: bool, space: _Space) -> list[tuple[int, int, str, str]]:
    """Split a message where a buffer changes or the count limit is reached.

    A buffer changes where the sender's source, the receiver's destination or (for a
    reduce) its operand is no longer the next unit of the same buffer.
    """
    out: list[tuple[int, int, str, str]] = []
    start = 0
    n = msg.count
    keys: list[tuple] = []
    if space.sharded:
        for c in range(n):
            u = bounds[msg.chunk + c]
            keys.append((space.key(msg.src, u, src[c] == "o"), space.key(msg.dst, u, True),
                         space.key(msg.dst, u, opnd[c] == "o") if reduce else None))
    for c in range(1, n + 1):
        if c < n and (keys[c] == keys[start] if keys else
                      src[c] == src[start] and (not reduce or opnd[c] == opnd[start])):
            continue
        ua, ub = bounds[msg.chunk + start], bounds[msg.chunk + c]
        for a in range(ua, ub, max_cnt):
            out.append((a, min(ub, a + max_cnt), src[start], opnd[start] if reduce else "o"))
        start = c
    return out


def _fuse(nodes: list[_Node], msgs: list[_Message], space: _Space
          ) -> list[tuple[_Node, _Node]]:
    """Pairs (recv at t, send at t+1) where the send carries exactly what the recv left.

    The recv must be the only recv of its chunks in step t and the last from its peer on
    its channel (a later one would wait behind the send, a step late); the send must be
    the first to its peer on its channel in step t+1 (an earlier one would be reordered).
    Its message must be one range of the full buffer in every instance (with instances
    of a sharded collective, a message over several shards is not: its fused pieces
    would each forward before the next receives, a step per shard).
    """
    by_step: dict[int, list[_Node]] = defaultdict(list)
    for node in nodes:
        by_step[node.step].append(node)
    pairs = []
    for t, here in by_step.items():
        recvs = [n for n in here if n.kind != "s"]
        cover: dict[int, int] = defaultdict(int)
        last: dict[tuple[int, int], _Node] = {}
        for rn in recvs:
            for c in range(rn.chunk, rn.chunk + rn.count):
                cover[c] += 1
            last[(rn.recv_peer, rn.chan)] = rn
        firsts: dict[tuple[int, int, int], list[_Node]] = defaultdict(list)
        seen: set[tuple[int, int]] = set()
        for sn in by_step.get(t + 1, []):
            if sn.kind == "s" and (sn.send_peer, sn.chan) not in seen:
                seen.add((sn.send_peer, sn.chan))
                firsts[(sn.chan, sn.chunk, sn.count)].append(sn)
        for rn in recvs:
            if last[(rn.recv_peer, rn.chan)] is not rn or any(
                    cover[c] > 1 for c in range(rn.chunk, rn.chunk + rn.count)):
                continue
            if not space.one_range(msgs[rn.recv_msg].pieces):
                continue
            rpieces = [(a, b) for a, b, _, _ in msgs[rn.recv_msg].pieces]
            for sn in firsts.get((rn.chan, rn.chunk, rn.count), ()):
                if [(a, b) for a, b, _, _ in msgs[sn.send_msg].pieces] == rpieces:
                    pairs.append((rn, sn))
    # each recv and each send at most once: keep the first pairing of each
    used: set[int] = set()
    chosen = []
    for rn, sn in pairs:
        if id(rn) in used or id(sn) in used:
            continue
        used.update((id(rn), id(sn)))
        chosen.append((rn, sn))
    return chosen


class _Touches:
    """Per chunk, the nodes of one rank that touch it, in (step, phase, idx) order."""

    def __init__(self, nodes: list[_Node]) -> None:
        self.keys: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        self.nodes: dict[int, list[_Node]] = defaultdict(list)
        for node in nodes:
            for c in range(node.chunk, node.chunk + node.count):
                self.keys[c].append(node.key)
                self.nodes[c].append(node)

    def dead_after(self, sn: _Node, kept: range) -> bool:
        """True when every chunk ``sn`` sends is next overwritten before anything reads
        it (a send or a reduce reads), or, outside ``kept`` (the chunks whose final
        value is the rank's output, which must stay in its buffer), never touched again."""
        for c in range(sn.chunk, sn.chunk + sn.count):
            keys = self.keys[c]
            i = bisect.bisect_right(keys, sn.key)
            if i == len(keys):
                if c in kept:
                    return False
            elif self.nodes[c][i].kind not in ("r", "rcs"):
                return False
        return True


def _assign_tbs(rank_nodes: list[_Node], fused: list[tuple[_Node, _Node]]
                ) -> list[_Node]:
    """Fold fused pairs into one node and give every node its thread block key."""
    import networkx as nx

    weight: dict[tuple[int, int, int], int] = defaultdict(int)  # (chan, recv peer, send peer)
    for rn, sn in fused:
        weight[(rn.chan, rn.recv_peer, sn.send_peer)] += 1
    graph = nx.Graph()
    for (chan, p, q), w in weight.items():
        graph.add_edge(("r", chan, p), ("s", chan, q), weight=w)
    matching = nx.max_weight_matching(graph)
    partner: dict[tuple[str, int, int], tuple[str, int, int]] = {}
    for a, b in matching:
        partner[a], partner[b] = b, a
    kept = set()
    for rn, sn in fused:
        if partner.get(("r", rn.chan, rn.recv_peer)) == ("s", sn.chan, sn.send_peer):
            kept.add(id(sn))
            rn.send_peer, rn.send_msg, rn.send_idx = sn.send_peer, sn.send_msg, sn.idx
            rn.kind = {"rrc": "rrcs", "r": "rcs"}[rn.kind]
    out = [n for n in rank_nodes if id(n) not in kept]
    for node in out:
        if node.kind == "s":
            conn = partner.get(("s", node.chan, node.send_peer))
            recv_peer = conn[2] if conn else -1
            node.tb = (node.chan, recv_peer, node.send_peer)
        else:
            conn = partner.get(("r", node.chan, node.recv_peer))
            send_peer = conn[2] if conn else -1
            node.tb = (node.chan, node.recv_peer, send_peer)
    return out


def _dependencies(nodes: list[_Node]) -> None:
    """Each node's conflicting predecessors on other thread blocks, pruned."""
    last_writer: dict[int, _Node] = {}
    readers: dict[int, list[_Node]] = defaultdict(list)
    for node in nodes:  # (step, phase, idx) order
        deps: dict[int, _Node] = {}
        span = range(node.chunk, node.chunk + node.count)
        writes = node.kind != "s"
        for c in span:
            w = last_writer.get(c)
            if w is not None:
                deps[id(w)] = w
            if writes:
                for rd in readers[c]:
                    deps[id(rd)] = rd
        for c in span:
            if writes:
                last_writer[c] = node
                readers[c] = []
            if node.kind != "r":  # s, rrc, rrs, rrcs, rcs read (rcs forwards what it got)
                readers[c].append(node)
        node.deps = [d for d in deps.values() if d.tb != node.tb]


def _prune(tbs: dict[tuple[int, int, int], list[_Node]]) -> None:
    """Keep, per thread block, only dependencies not implied by an earlier one."""
    for members in tbs.values():
        seen: dict[tuple[int, int, int], int] = {}
        for node in members:
            latest: dict[tuple[int, int, int], _Node] = {}
            for d in node.deps:
                assert d.tb is not None
                if d.position > seen.get(d.tb, -1) and (
                        d.tb not in latest or d.position > latest[d.tb].position):
                    latest[d.tb] = d
            node.deps = sorted(latest.values(), key=lambda d: (d.tb, d.position))
            for d in node.deps:
                assert d.tb is not None
                seen[d.tb] = d.position


def _interleave_offsets(nodes: list[list[_Node]], msgs: list[_Message]
                        ) -> dict[tuple[int, int, int], int]:
    """Per pair ``(src, dst, channel)``, an offset such that message ``k`` on channel
    ``(k + offset) % nseg`` puts a recv and the send that forwards it at the next step
    on one channel, wherever the pairs' chains agree (first come, first served)."""
    # (pair, other pair, delta): offset[other] = offset[pair] + delta aligns a forward
    links: dict[tuple[int, int, int], list[tuple[tuple[int, int, int], int]]] = defaultdict(list)
    for rank_nodes in nodes:
        by_step: dict[int, list[_Node]] = defaultdict(list)
        for node in rank_nodes:
            by_step[node.step].append(node)
        for t, here in by_step.items():
            sends = {(sn.chunk, sn.count): sn for sn in by_step.get(t + 1, ())
                     if sn.kind == "s"}
            for rn in here:
                sn = sends.get((rn.chunk, rn.count)) if rn.kind != "s" else None
                if sn is None:
                    continue
                p, q = msgs[rn.recv_msg].pair, msgs[sn.send_msg].pair
                delta = msgs[rn.recv_msg].k - msgs[sn.send_msg].k
                links[p].append((q, delta))
                links[q].append((p, -delta))
    offset: dict[tuple[int, int, int], int] = {}
    for start in sorted({m.pair for m in msgs}):
        if start in offset:
            continue
        offset[start] = 0
        stack = [start]
        while stack:
            p = stack.pop()
            for q, delta in links.get(p, ()):
                if q not in offset:
                    offset[q] = offset[p] + delta
                    stack.append(q)
    return offset


def _channels(msgs: list[_Message], nodes: list[list[_Node]],
              segs: dict[tuple[int, int, int], int], interleave: bool) -> None:
    """Give every message its MSCCL channel within an instance: ``channel * nseg +
    segment``, with ``channel`` the schedule's (IR v4) and ``nseg`` the most segments of
    any pair (``segs`` is per ``(src, dst, channel)``).

    Consecutive: pair ``p``'s messages in ``segs[p]`` consecutive runs. Interleaved
    (every pair on the same number of segments ``C``): message ``k`` on ``(k + offset)
    % C``, offsets aligned along forwarding chains, so that fused thread blocks pay no
    step at segment boundaries (a ring whose rank count is a multiple of ``C`` then
    fills every channel evenly).
    """
    nseg = max(segs.values())
    if interleave:
        offset = _interleave_offsets(nodes, msgs)
        for m in msgs:
            m.send_node.chan = m.recv_node.chan = (
                m.channel * nseg + (m.k + offset[m.pair]) % nseg)
        return
    npair: dict[tuple[int, int, int], int] = defaultdict(int)
    for m in msgs:
        npair[m.pair] += 1
    for m in msgs:
        m.send_node.chan = m.recv_node.chan = (
            m.channel * nseg + m.k * segs[m.pair] // npair[m.pair])


def _layout(schedule: Schedule, bounds: list[int], *, fuse: bool,
            segs: dict[tuple[int, int, int], int], max_cnt: int, space: _Space,
            interleave: bool = False
            ) -> tuple[list[dict[tuple[int, int, int], list[_Node]]], list[_Message], int]:
    """Nodes on thread blocks for one instance; returns per rank {tb key: nodes}."""
    nodes, msgs = _build_nodes(schedule)
    _channels(msgs, nodes, segs, interleave)
    nchunks = schedule.nchunks
    shards = collective_of(schedule).shards
    src_of: dict[int, list[str]] = {}
    opnd_of: dict[int, list[str]] = {}
    for rank_nodes in nodes:
        s, o = _statuses(rank_nodes, nchunks, msgs)
        src_of.update(s)
        opnd_of.update(o)
    for i, m in enumerate(msgs):
        m.pieces = _pieces(m, src_of[i], opnd_of[i], bounds, max_cnt,
                           m.recv_node.kind == "rrc", space)
    per_rank = []
    nfused = 0
    for r, rank_nodes in enumerate(nodes):
        pairs = _fuse(rank_nodes, msgs, space) if fuse else []
        live = _assign_tbs(rank_nodes, pairs)
        touches = _Touches(rank_nodes) if pairs else None
        # the chunks whose final value is this rank's output
        kept = range(*shards[r]) if space.coll == "reduce_scatter" else range(nchunks)
        for node in live:
            if node.kind == "rrcs" and touches is not None:
                if touches.dead_after(msgs[node.send_msg].send_node, kept):
                    node.kind = "rrs"
        nfused += sum(n.kind in ("rcs", "rrs", "rrcs") for n in live)
        if space.coll == "allgather":
            live.extend(_own_copies(r, rank_nodes, shards[r], bounds, max_cnt,
                                    schedule.nsteps))
        tbs: dict[tuple[int, int, int], list[_Node]] = defaultdict(list)
        for node in live:
            assert node.tb is not None
            tbs[node.tb].append(node)
        for members in tbs.values():
            for pos, node in enumerate(members):
                node.position = pos
        _dependencies(live)
        _prune(tbs)
        per_rank.append(dict(tbs))
    return per_rank, msgs, nfused


def _own_copies(rank: int, rank_nodes: list[_Node], shard: tuple[int, int],
                bounds: list[int], max_cnt: int, nsteps: int) -> list[_Node]:
    """An allgather's copies of the rank's own shard from ``i`` into ``o``.

    Out of place, nothing else puts the rank's own shard in its output. One ``cpy`` per
    run of own chunks that no receive writes, after the last step, on a thread block of
    its own (no peers): it depends on the sends that read those chunks, so that in place,
    where ``i`` is that shard of ``o``, the copy onto itself never races with a read.
    """
    received = {c for nd in rank_nodes if nd.kind != "s"
                for c in range(nd.chunk, nd.chunk + nd.count)}
    out: list[_Node] = []
    c = shard[0]
    while c < shard[1]:
        if c in received:
            c += 1
            continue
        end = c
        while end < shard[1] and end not in received:
            end += 1
        node = _Node(rank, nsteps, 0, len(out), "cpy", c, end - c, tb=(0, -1, -1))
        ua, ub = bounds[c], bounds[end]
        node.pieces = [(a, min(ub, a + max_cnt), "i", "o") for a in range(ua, ub, max_cnt)]
        out.append(node)
        c = end
    return out


def _npieces(node: _Node, msgs: list[_Message]) -> int:
    if node.kind == "cpy":
        return len(node.pieces)
    return len(msgs[node.send_msg if node.kind == "s" else node.recv_msg].pieces)


def _steps_of(node: _Node, msgs: list[_Message], space: _Space, c: int) -> list[Step]:
    """The MSCCL steps of one node of instance ``c`` (several when its message is in
    pieces). Buffers and offsets are :meth:`_Space.loc`'s; a recv's unused source is its
    destination; the unused destination of a send or an ``rrs`` is where the data lands
    on the receiver (as msccl-tools writes it)."""
    out = []
    loc = space.loc
    r = node.rank
    if node.kind == "s":
        m = msgs[node.send_msg]
        for a, b, src, _ in m.pieces:
            out.append(("s", *loc(r, a, c, src == "o"), *loc(m.dst, a, c, True), b - a))
    elif node.kind in ("r", "rcs"):
        for a, b, _, _ in msgs[node.recv_msg].pieces:
            dst = loc(r, a, c, True)
            out.append((node.kind, *dst, *dst, b - a))
    elif node.kind == "cpy":
        for a, b, _, _ in node.pieces:
            out.append(("cpy", *loc(r, a, c, False), *loc(r, a, c, True), b - a))
    else:  # rrc, rrs, rrcs: the received data plus the local operand
        # rrs stores nothing: like a send, it names where its sum lands
        to = msgs[node.send_msg].dst if node.kind == "rrs" else r
        for a, b, _, opnd in msgs[node.recv_msg].pieces:
            out.append((node.kind, *loc(r, a, c, opnd == "o"), *loc(to, a, c, True), b - a))
    plan: tuple[int, ...] = ()
    if node.kind != "cpy":
        plan = (node.step, node.idx) + ((node.send_idx,) if node.send_idx >= 0 else ())
    return [Step(0, kind, sb, so, db, do, cnt, -1, -1, False, plan)
            for kind, sb, so, db, do, cnt in out]


def _emit(schedule: Schedule, per_rank: list[dict[tuple[int, int, int], list[_Node]]],
          msgs: list[_Message], *, space: _Space, nseg: int, proto: str,
          name: str, min_bytes: int, max_bytes: int) -> Algo:
    """The algorithm: instance ``c`` on MSCCL channels ``c * per .. c * per + per - 1``,
    ``per = schedule.nchannels * nseg``."""
    gpus = []
    instances = space.instances
    per = schedule.nchannels * nseg
    i_units, o_units = space.sizes()
    for r, tbs in enumerate(per_rank):
        keys = sorted(tbs, key=lambda k: (k[2], k[1], k[0]))  # send, recv, channel
        # first pass: step indexes (nops for all dependencies but one)
        for key in keys:
            s = 0
            for node in tbs[key]:
                s += max(0, len(node.deps) - 1)
                s += _npieces(node, msgs)
                node.last_s = s - 1
        flagged = {(d.tb, d.last_s) for key in keys for node in tbs[key] for d in node.deps}
        blocks = []
        scratch = 0
        for c in range(instances):
            base_id = c * len(keys)
            tb_id = {key: base_id + i for i, key in enumerate(keys)}
            for key in keys:
                steps: list[Step] = []
                for node in tbs[key]:
                    deps = [(tb_id[d.tb], d.last_s) for d in node.deps if d.tb is not None]
                    for dep_tb, dep_s in deps[:-1]:
                        steps.append(Step(len(steps), "nop", "i", -1, "o", -1, 0, dep_tb, dep_s,
                                          False))
                    pieces = _steps_of(node, msgs, space, c)
                    for j, piece in enumerate(pieces):
                        depid, deps_s = deps[-1] if (deps and j == 0) else (-1, -1)
                        hasdep = j == len(pieces) - 1 and (key, len(steps)) in flagged
                        steps.append(Step(len(steps), piece.type, piece.srcbuf, piece.srcoff,
                                          piece.dstbuf, piece.dstoff, piece.cnt, depid, deps_s,
                                          hasdep, piece.plan))
                        kind = STEP_TYPES[piece.type]
                        if kind.src and piece.srcbuf == "s":
                            scratch = max(scratch, piece.srcoff + piece.cnt)
                        if kind.dst and piece.dstbuf == "s":
                            scratch = max(scratch, piece.dstoff + piece.cnt)
                chan, recv_peer, send_peer = key
                blocks.append(ThreadBlock(tb_id[key], send_peer, recv_peer,
                                          c * per + chan, tuple(steps)))
        blocks.sort(key=lambda b: b.id)
        gpus.append(Gpu(r, i_units, o_units, scratch, tuple(blocks)))
    return Algo(name=name, proto=proto, nchannels=instances * per,
                nchunksperloop=space.total, ngpus=schedule.nranks,
                coll=MSCCL_COLL[space.coll], inplace=True, outofplace=True,
                min_bytes=min_bytes, max_bytes=max_bytes, gpus=tuple(gpus), segments=nseg)


def _too_big(name: str, why: str, channels: int) -> str:
    return (f"{name}: does not fit the executor's limits with "
            f"{plural(channels, 'instance')}: {why}. "
            "Make the plan smaller: fewer chunks (topoplan plan --max-chunks N), fewer ops "
            "per step (--max-step-ops N), a planner with fewer steps (rhd, hierarchical), "
            "or fewer --channels; or raise --max-steps for an executor built with a larger "
            "MSCCL_MAX_NUM_STEPS")


def _fitting_layout(schedule: Schedule, bounds: list[int], *, fuse: bool,
                    per_pair: dict[tuple[int, int, int], int], max_cnt: int, space: _Space,
                    proto: str, name: str, min_bytes: int, max_bytes: int, limits: Limits
                    ) -> tuple[Algo, int, int, bool] | str:
    """The algorithm that fits ``limits`` on few segments, with its segment count, fused
    steps and whether messages are interleaved over channels (tried, fused, when
    consecutive segments do not fit); or why none fits.

    Each pair starts on as many segments as its ``per_pair`` messages need; only the
    pairs of a thread block over the step limit get more (more segments mean more
    thread blocks, and the executor numbers dependencies on them in an int8).
    """
    nir = schedule.nchannels
    most_segs = limits.max_channels // (space.instances * nir)
    why = []
    for interleave in (False, True) if fuse else (False,):
        segs = {pair: max(1, math.ceil(n / limits.max_steps)) for pair, n in per_pair.items()}
        if interleave:
            segs = dict.fromkeys(segs, max(segs.values()))
        while True:
            nseg = max(segs.values())
            per_rank, msgs, nfused = _layout(schedule, bounds, fuse=fuse, segs=segs,
                                             max_cnt=max_cnt, space=space,
                                             interleave=interleave)
            algo = _emit(schedule, per_rank, msgs, space=space, nseg=nseg, proto=proto,
                         name=name, min_bytes=min_bytes, max_bytes=max_bytes)
            problems = limit_violations(algo, limits)
            if not problems:
                return algo, nseg, nfused, interleave
            # Only a thread block over the step limit is helped by more segments: aim
            # its pairs a little under the limit (boundaries cost steps), never past
            # the channels there are.
            grown = dict(segs)
            for gpu in algo.gpus:
                for tb in gpu.tbs:
                    if len(tb.steps) <= limits.max_steps:
                        continue
                    ch = (tb.chan % (nir * nseg)) // nseg  # the schedule's channel
                    for pair in ((gpu.id, tb.send, ch), (tb.recv, gpu.id, ch)):
                        if pair in segs:
                            want = math.ceil(segs[pair] * len(tb.steps) / (limits.max_steps * 0.9))
                            grown[pair] = min(most_segs, max(grown[pair], segs[pair] + 1, want))
            if interleave:
                grown = dict.fromkeys(grown, max(grown.values()))
            if grown == segs:
                why.append(("interleaved" if interleave else "consecutive")
                           + f" on {plural(nseg, 'channel')} each: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
                break
            segs = grown
    return "; ".join(why)


def export_msccl(schedule: Schedule, *, proto: str = "Simple", channels: int = 1,
                 min_bytes: int = 0, max_bytes: int = 0, name: str | None = None,
                 limits: Limits | None = None, fuse: bool = True,
                 check: bool = True, lower: bool = True, cluster: Cluster | None = None,
                 size: int | None = None, profile: CostProfile | str | None = None,
                 max_slowdown: float = MAX_SLOWDOWN, grid: str = "auto") -> ExportResult:
    """Write ``schedule`` as an MSCCL algorithm (see the module docstring).

    Parameters
    ----------
    schedule : Schedule
        An allreduce, a reduce-scatter or an allgather; it is verified first.
    proto : {"Simple", "LL", "LL128"}
        The NCCL protocol the executor runs the algorithm with.
    channels : int
        Instances of the plan, each on its own channels and slice of the buffer; with
        the plan's own channels (IR v4) at most 32 MSCCL channels in all.
    min_bytes, max_bytes : int
        The message sizes the executor may pick the algorithm for (0: no upper limit).
    limits : Limits
        The executor build's limits (default: msccl-executor-nccl's defaults).
    fuse : bool
        Fuse recv-then-send into ``rrcs``/``rrs``/``rcs`` steps where the plan allows.
    check : bool
        Run the symbolic checker on the result (and fall back to unfused thread blocks
        when fused ones could deadlock).
    lower : bool
        MSCCL XML has no collective steps: write a schedule's native steps (IR v3) as the
        point-to-point rings NCCL runs there (see the module docstring), and say so in a
        note; with ``False``, refuse such a schedule.
    cluster : Cluster, optional
        The cluster the plan is for: needed for native steps (their rings, and the
        prediction); checked against the plan's recorded fingerprint.
    size : int, optional
        The message size (bytes) the plan is for: the prediction simulates it, and the
        grid serves it (default: the plan's ``meta["size_bytes"]``).
    profile : CostProfile or str, optional
        The prediction's cost profile (default: the plan's ``meta["profile"]``, else
        the default profile).
    max_slowdown : float
        Refuse native steps whose point-to-point version simulates more than this many
        times their time (default :data:`MAX_SLOWDOWN`).
    grid : {"auto", "exact", "pow2"}
        The MSCCL chunk grid (``nchunksperloop``). The executor picks an algorithm only
        for calls whose count is a multiple of it, so an exact grid of, say, 1932 chunks
        serves no power-of-two buffer. ``"auto"``: the exact grid when it serves the
        plan's size (as float32), else a power-of-two grid, the chunks rounded to it (a
        note says so and how much moved); ``"exact"``: the exact grid (where there is
        one up to 4096); ``"pow2"``: always the power-of-two grid.

    Returns
    -------
    ExportResult

    Raises
    ------
    ScheduleError
        The schedule does not verify, it has native steps and ``lower`` is False or no
        ``cluster`` is given, the cluster is not the plan's, or (a bug) the result fails
        the MSCCL check.
    PlannerError
        A bad option; the plan does not fit the executor's limits even with every
        channel used (the message names the plan options that shrink it); or its
        native steps, written as point-to-point steps, simulate more than
        ``max_slowdown`` times slower than themselves (the message gives both times).
    """
    from ...ir.verify import verify

    if proto not in PROTOCOLS:
        raise PlannerError(f"proto: must be one of {', '.join(PROTOCOLS)}, got {proto!r}")
    limits = limits or Limits()
    if not 1 <= channels <= limits.max_channels:
        raise PlannerError(f"channels: must be 1..{limits.max_channels}, got {channels}")
    if channels * schedule.nchannels > limits.max_channels:
        raise PlannerError(f"channels: the schedule runs on {schedule.nchannels} channels, "
                           f"so {channels} instances need {channels * schedule.nchannels} "
                           f"MSCCL channels; the executor has {limits.max_channels} "
                           f"(MAXCHANNELS): use at most "
                           f"{limits.max_channels // schedule.nchannels} instances")
    if min_bytes < 0 or max_bytes < 0 or (max_bytes and max_bytes < min_bytes):
        raise PlannerError(f"min/max bytes: need 0 <= min <= max (max 0: no limit), got "
                           f"{min_bytes} and {max_bytes}")
    report = verify(schedule)
    lowered_note = None
    prediction = None
    if report.nnative:
        first = next((r, s, op) for r, s, op in schedule.ops() if isinstance(op, Native))
        op_text = first[2].text()
        if len(first[2].group) > 8:  # not every member by name
            op_text = (f"{first[2].kind.value} over {len(first[2].group)} ranks "
                       f"({', '.join(map(str, first[2].group[:3]))}, ...) of "
                       f"{first[2].chunk_text()}")
        where = (f"{schedule.algorithm} schedule: rank {first[0]} step {first[1]} runs a "
                 f"native {op_text}; MSCCL XML has no collective steps")
        if not lower:
            raise ScheduleError(f"{where}: lower them to point-to-point (leave out "
                                "--no-lower, or export_msccl(..., lower=True))")
        if cluster is None:
            raise ScheduleError(f"{where}, and each is written as the rings NCCL runs on "
                                "the cluster, whose time the export checks against the "
                                "native step's: give the plan's cluster (topoplan export "
                                "--cluster CLUSTER.yaml, or export_msccl(..., cluster=...))")
        schedule, prediction = _lower_natives(schedule, cluster, size, profile,
                                              max_slowdown, name)
        lowered_note = (f"{plural(report.ncollectives, 'native collective')} "
                        f"({plural(report.nnative, 'native step')}) written as "
                        f"point-to-point steps: {prediction.rings}")
    vectored_note = None
    split = split_vectored(schedule)  # vectored messages (IR v4): one step a range
    if split is not schedule:
        vectored_note = (f"{schedule.nmessages} messages, some vectored (several chunk "
                         f"ranges, IR v4), written as {split.nmessages} MSCCL sends and "
                         "recvs, one per range, in the thread block of the op's peer and "
                         "channel")
        schedule = split
    coll = schedule.collective
    if coll not in MSCCL_COLL:  # pragma: no cover - every collective topoplan plans
        raise ScheduleError(f"{schedule.algorithm} schedule: collective {coll!r}: MSCCL "
                            f"export writes {', '.join(MSCCL_COLL)}")
    if schedule.nranks < 2:
        raise PlannerError(f"a {coll} of one rank has nothing to send; MSCCL needs >= 2 GPUs")
    sharded = collective_of(schedule).sharded
    nshards = schedule.nranks if sharded else 0
    bounds, note = _unit_grid(schedule.chunks, nshards)
    planned = size if size is not None else schedule.meta.get("size_bytes")
    count = served_count(coll, planned, schedule.nranks) if isinstance(planned, int) else None
    if grid not in GRIDS:
        raise PlannerError(f"grid: must be one of {', '.join(GRIDS)}, got {grid!r}")
    if grid == "pow2" or (grid == "auto" and count and count % (bounds[-1] * channels)):
        # The executor picks an algorithm only for counts that are multiples of
        # nchunksperloop: an exact grid such as 1932 serves no power-of-two buffer.
        rounded, why = _unit_grid(schedule.chunks, nshards, exact_first=False)
        if grid == "pow2":
            bounds, note = rounded, why
        elif count is not None and isinstance(planned, int) and \
                count % (rounded[-1] * channels) == 0:
            note = (f"the exact grid of {bounds[-1] * channels} MSCCL chunks would serve no "
                    f"call of the plan's {_count_text(coll, planned, count)}; {why}")
            bounds = rounded
    notes = [lowered_note] if lowered_note else []
    notes += [vectored_note] if vectored_note else []
    notes += [note] if note else []
    details: list[str] = []
    space = _Space(coll, schedule.nranks, bounds[-1], channels)
    name = name or f"topoplan-{schedule.algorithm}"
    max_cnt = limits.max_count - 1
    # Fail fast: the messages of one pair take a step each on the thread blocks of that
    # pair, and there are at most max_channels // channels of those.
    per_pair: dict[tuple[int, int, int], int] = defaultdict(int)
    for program in schedule.ranks:
        for step in program.steps:
            for op in step:
                if op.kind is OpKind.SEND:
                    per_pair[(program.rank, op.peer, op.channel)] += 1
    # Unfused, every op is at least one step, and the executor's parser loads the algo,
    # every gpu element and one rank's tbs and steps into MAX_NODES nodes.
    busiest = max(schedule.ranks, key=lambda p: sum(map(len, p.steps)))
    unfused_nodes = 2 + schedule.nranks + sum(map(len, busiest.steps))
    (src, dst, ch), most = max(per_pair.items(), key=lambda kv: kv[1])
    room = limits.max_channels // (channels * schedule.nchannels)
    if most > limits.max_steps * room:
        on = f" on channel {ch}" if schedule.nchannels > 1 else ""
        raise PlannerError(_too_big(
            name, f"ranks {src} -> {dst} exchange {most} messages{on}, one step each, but "
                  f"{plural(room, 'channel')} of {limits.max_steps} steps hold "
                  f"{limits.max_steps * room}", channels))
    attempts = [True, False] if fuse else [False]
    no_unfused = (f"separate send and receive thread blocks need at least {unfused_nodes} "
                  f"XML nodes on gpu {busiest.rank} (algo, {schedule.nranks} gpus, one step "
                  f"per op); the executor's parser holds {MAX_NODES - 1} (MAX_NODES)"
                  if unfused_nodes >= MAX_NODES else None)
    if no_unfused and not fuse:
        raise PlannerError(_too_big(name, no_unfused, channels))
    last_error: Exception | None = None
    misfits: list[str] = []
    for fused_try in attempts:
        if not fused_try and no_unfused:
            misfits.append(no_unfused)
            raise PlannerError(_too_big(name, "; ".join(misfits), channels))
        layout = _fitting_layout(schedule, bounds, fuse=fused_try, per_pair=per_pair,
                                 max_cnt=max_cnt, space=space, proto=proto, name=name,
                                 min_bytes=min_bytes, max_bytes=max_bytes, limits=limits)
        if isinstance(layout, str):
            misfits.append(("fused, " if fused_try else "unfused, ") + layout)
            if fused_try and len(attempts) > 1:
                notes.append("fused thread blocks do not fit the executor's limits; "
                             "exported with separate send and receive thread blocks")
                continue
            raise PlannerError(_too_big(name, "; ".join(misfits), channels))
        algo, nseg, nfused, interleaved = layout
        if interleaved:
            notes.append(f"a pair's messages take its {nseg} channels in turn (consecutive "
                         "runs would cost fused thread blocks a step at every boundary)")
        if not check:
            break
        try:
            verify_msccl(algo)
        except ScheduleError as exc:
            last_error = exc
            if fused_try and len(attempts) > 1:
                misfits.append(f"fused thread blocks fail the MSCCL check: {exc}")
                notes.append(_fused_failure(algo, exc, proto))
                details.append(f"fused thread blocks: {exc}")
                continue
            raise ScheduleError(f"{name}: the exported algorithm fails the MSCCL check: {exc}"
                                ) from None
        last_error = None
        break
    if last_error is not None:  # pragma: no cover - the loop raises or breaks
        raise last_error
    fingerprint = schedule.meta.get(META_KEY)
    if isinstance(fingerprint, str) and fingerprint:
        algo = replace(algo, cluster_fingerprint=fingerprint)
    what = "element counts" if coll == "allreduce" else "counts per rank"
    algo = replace(algo, serves=f"{what} that are multiples of {algo.nchunksperloop}")
    return ExportResult(algo=algo, notes=notes, details=details, fused=nfused, segments=nseg,
                        max_steps=max(len(tb.steps) for g in algo.gpus for tb in g.tbs),
                        max_tbs=max(len(g.tbs) for g in algo.gpus), prediction=prediction,
                        planned_bytes=planned if isinstance(planned, int) else None)


#: How the export picks the MSCCL chunk grid (``topoplan export --grid``).
GRIDS = ("auto", "exact", "pow2")


def served_count(collective: str, size: int, nranks: int, itemsize: int = 4) -> int | None:
    """The count the executor compares with ``nchunksperloop`` for a call of ``size``
    bytes of ``itemsize``-byte elements (msccl_lifecycle.cc: the call's count, per rank
    for a reduce-scatter or an allgather), or ``None`` when no such call exists."""
    elements, left = divmod(size, itemsize)
    if left or elements <= 0:
        return None
    if collective == "allreduce":
        return elements
    per_rank, left = divmod(elements, nranks)
    return per_rank if not left and per_rank else None


def _count_text(collective: str, size: int, count: int) -> str:
    from ...units import format_size
    per = "" if collective == "allreduce" else " per rank"
    return f"{format_size(size)} ({count} float32 elements{per})"


def serves(algo: Algo, size: int | None = None) -> str:
    """Which calls the executor picks ``algo`` for (msccl_lifecycle.cc: the count, per
    rank for a reduce-scatter or an allgather, is a multiple of ``nchunksperloop``, and
    the bytes lie in ``minBytes .. maxBytes``), and whether a call of ``size`` bytes of
    float32 is one: ``serves calls whose element count is a multiple of 256 (1 KiB of
    float32); the plan's 64MiB (16777216 float32 elements) is one``."""
    from ...units import format_size
    coll = {"reducescatter": "reduce_scatter"}.get(algo.coll, algo.coll)
    what = "element count" if coll == "allreduce" else "count per rank"
    text = (f"serves calls whose {what} is a multiple of {algo.nchunksperloop} "
            f"({format_size(algo.nchunksperloop * 4)} of float32)")
    if algo.min_bytes or algo.max_bytes:
        text += (f", of {format_size(algo.min_bytes)} to "
                 + (format_size(algo.max_bytes) if algo.max_bytes else "any size"))
    if size is None:
        return text
    count = served_count(coll, size, algo.ngpus)
    ok = (count is not None and count % algo.nchunksperloop == 0
          and size >= algo.min_bytes and (not algo.max_bytes or size <= algo.max_bytes))
    plan = (_count_text(coll, size, count) if count is not None else format_size(size))
    return f"{text}; the plan's {plan} is {'one' if ok else 'NOT one'}"


def _fused_failure(algo: Algo, exc: Exception, proto: str) -> str:
    """The note for fused thread blocks that failed the MSCCL check, saying why.

    The usual why is a deadlock under the executor's buffering: a fused thread block has
    a send peer and a receive peer and runs its steps in order, so where a plan step
    sends and receives (a ring step, or an exchange of two ranks), the thread block
    posts its send first; a send of more MSCCL chunks than a connection buffers waits
    for the peer to receive, and the peer's thread block waits in its own send. Separate
    send and receive thread blocks never wait on each other that way.
    """
    from .verify import DEFAULT_CAPACITY
    capacity = DEFAULT_CAPACITY[proto]
    sends = [st.cnt for g in algo.gpus for tb in g.tbs if tb.send >= 0 and tb.recv >= 0
             for st in tb.steps if st.type == "s"]
    big = max(sends, default=0)
    tail = "exported with separate send and receive thread blocks (the same steps and data)"
    if "deadlock" not in str(exc) or big <= capacity:
        return f"fused thread blocks failed the MSCCL check; {tail}"
    hint = ""
    if proto != "LL128" and big <= DEFAULT_CAPACITY["LL128"]:
        hint = f" (--proto LL128 buffers {DEFAULT_CAPACITY['LL128']}: fused there)"
    return (f"fused thread blocks would deadlock: one that sends and receives posts its "
            f"send first, and its messages of up to {big} MSCCL chunks are over the "
            f"{capacity} a connection buffers under {proto}{hint}, so each GPU waits for "
            f"a peer that is sending too; {tail}")


def _lower_natives(schedule: Schedule, cluster: Cluster, size: int | None,
                   profile: CostProfile | str | None,
                   max_slowdown: float, name: str | None) -> tuple[Schedule, Prediction]:
    """``schedule``'s native steps as NCCL's rings on ``cluster``, verified, and the
    prediction of both; refused past ``max_slowdown`` (see :func:`export_msccl`)."""
    from ...analysis.cost import get_profile
    from ...analysis.native.nccl import nccl_model
    from ...analysis.sim import simulate
    from ...cluster.rails import MAX_RING_OPS, rail_rings
    from ...ir.fingerprint import check_fingerprint
    from ...ir.passes import lower_native
    from ...ir.verify import verify
    from ...units import format_size

    check_fingerprint(schedule, cluster, force_hint="export the plan made for this cluster")
    n = cluster.nranks
    # Over every GPU: NCCL's ring channels; where the cluster has rails, laid out so that
    # each crosses between boxes on its rail with point-to-point routes (NCCL's own
    # channels leave a box from another GPU than the NIC's, which NCCL's PXN forwards
    # and a send does not).
    whole = [tuple(ring) for ring in rail_rings(cluster)]
    kind = "rails" if whole else "nccl"
    if not whole:
        whole = nccl_model(cluster).rings() if n > 1 else []
    # Each ring adds a ring's ops; past MAX_RING_OPS, fewer rings (as ring-topo).
    whole = whole[:max(1, MAX_RING_OPS // max(1, 4 * n * (n - 1)))]
    everyone = tuple(range(n))
    used = {"whole": False, "ring": False}

    def rings(op: Native) -> list[tuple[int, ...]]:
        if whole and tuple(sorted(op.group)) == everyone:
            used["whole"] = True
            return whole
        used["ring"] = True
        return [op.group]

    size = size or schedule.meta.get("size_bytes")
    if not isinstance(size, int) or size <= 0:
        raise ScheduleError(f"{schedule.algorithm} schedule: the plan records no size "
                            "(meta size_bytes) to predict its native steps at: give one "
                            "(topoplan export --size SIZE, or export_msccl(..., size=...))")
    recorded = schedule.meta.get("profile")
    costs = get_profile(profile if profile is not None else
                        recorded if isinstance(recorded, str) else None)
    native_s = simulate(cluster, schedule, size, profile=costs).time_s
    others = any(isinstance(op, Native) and op.kind.value not in ("allreduce", "allgather")
                 for _, _, op in schedule.ops())
    # NCCL runs rings, or trees where the latency outweighs the bytes: both are tried,
    # and the faster in simulation is written.
    lowered = lower_native(schedule, rings=rings)
    verify(lowered)
    exported_s = simulate(cluster, lowered, size, profile=costs).time_s
    what = []
    if used["whole"] and kind == "rails":
        what.append(f"{plural(len(whole), 'ring')} over every GPU, one per rail (NCCL's "
                    "ring channels, crossing between boxes on their rails)")
    elif used["whole"]:
        what.append(f"{plural(len(whole), 'ring')} over every GPU (NCCL's ring channels)")
    if used["ring"]:
        what.append("a ring over each group in its order")
    if any(isinstance(op, Native) and op.kind.value == "allreduce" and len(op.group) > 2
           for _, _, op in schedule.ops()):
        tree = lower_native(schedule, rings=rings, tree=True)
        verify(tree)
        tree_s = simulate(cluster, tree, size, profile=costs).time_s
        if tree_s < exported_s:
            lowered, exported_s = tree, tree_s
            what = ["a binomial tree for each allreduce (reduce, then broadcast), as NCCL's "
                    "Tree at sizes where latency outweighs bytes"]
            what += ["a ring over each group in its order for the allgathers"] if any(
                isinstance(op, Native) and op.kind.value == "allgather"
                for _, _, op in schedule.ops()) else []
    what += ["direct exchanges and trees for the others"] if others else []
    nccl = ""
    meta_nccl = schedule.meta.get("nccl")
    own = "nccl" in (schedule.algorithm, schedule.meta.get("chosen"))  # NCCL's own plan
    if own and isinstance(meta_nccl, dict) and meta_nccl.get("nccl_algorithm"):
        nccl = (f"{meta_nccl['nccl_algorithm']}/{meta_nccl.get('protocol')} "
                f"x{meta_nccl.get('channels')}")
    prediction = Prediction(cluster=cluster.name, size=size, profile=costs.name,
                            native_s=native_s, exported_s=exported_s,
                            rings="; ".join(what), nccl=nccl)
    if prediction.slowdown > max_slowdown:
        raise PlannerError(
            f"{name or 'topoplan-' + schedule.algorithm}: the native steps, written as "
            f"point-to-point steps ({prediction.rings}), would be "
            f"{prediction.slowdown:.1f}x slower: {prediction.text()}; over max_slowdown "
            f"{max_slowdown:g}. Run the plan natively (topoplan bench, the executor), "
            f"export a point-to-point plan (topoplan plan --size {format_size(size)} "
            "-a mcf -o PLAN.json), or allow it (--max-slowdown)")
    return lowered, prediction
