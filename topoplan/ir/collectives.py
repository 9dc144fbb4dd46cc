"""What a schedule computes: allreduce, reduce-scatter or allgather (docs/SCHEDULE.md).

A collective fixes, for a schedule of ``nranks`` ranks over the chunks ``chunks``
(fractions of the full buffer), three things, as msccl-tools' collective classes do:

- the **buffer layout**: how many elements each rank passes in and gets out for a
  collective over a full buffer of ``size`` elements;
- the **initial state**: which ranks' contributions each (rank, chunk) holds before the
  first step, as a bitmask of ranks (0: the chunk holds nothing yet);
- the **postcondition**: what each (rank, chunk) must hold after the last step, a
  bitmask, or ``None`` where the result does not matter.

Shards. Reduce-scatter and allgather cut the full buffer into ``nranks`` equal shards
in order; shard ``r`` belongs to rank ``r`` (rank ``r``'s output of a reduce-scatter,
its input to an allgather; MPI_Reduce_scatter_block's and MPI_Allgather's layout, and
torch's ``reduce_scatter_tensor`` / ``all_gather_into_tensor``). A schedule's chunks are
grouped into the shards in order: shard ``r`` is the chunks that cover the fractions
``r / nranks`` to ``(r + 1) / nranks`` of the buffer. A chunk may not straddle two
shards. Shards may hold different numbers of chunks, as long as their fractions add
up to ``1 / nranks`` each.

The classes are *specifications* (:class:`AllReduceSpec`, :class:`ReduceScatterSpec`,
:class:`AllGatherSpec`, one instance per schedule: :func:`collective_of`); the calls that
run a schedule are the executor's :class:`topoplan.Allreduce`, :class:`topoplan.ReduceScatter`
and :class:`topoplan.AllGather`. The old names of the classes here (``AllReduce``,
``ReduceScatter``, ``AllGather``) still work, with a :class:`DeprecationWarning`.

This module is part of the schedule IR's layer: it imports nothing but the errors.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, ClassVar, Literal, Sequence

from ..errors import ScheduleError

if TYPE_CHECKING:
    from .schedule import Schedule

__all__ = ["Collective", "AllReduceSpec", "ReduceScatterSpec", "AllGatherSpec", "COLLECTIVES",
           "get_collective", "collective_of", "chunk_bounds", "shard_chunks", "DEFAULT",
           "SHARD_TOLERANCE", "bus_factor"]

DEFAULT = "allreduce"
#: How far (as a fraction of the buffer) a chunk boundary may sit from ``r / nranks``
#: and still count as the boundary of shard ``r`` (float round-off of the fractions).
SHARD_TOLERANCE = 1e-9

Run = tuple[int, int, int]  # chunks [start, end) all holding one bitmask of ranks
#: The part of the full buffer a rank passes in or gets out: all of it, or its own shard.
Part = Literal["all", "shard"]
Expected = tuple[int, int, "int | None"]  # the same, None: the result does not matter


@dataclass(frozen=True)
class Collective:
    """A collective over ``nranks`` ranks and the chunks ``chunks`` of a schedule.

    Parameters
    ----------
    nranks : int
        Ranks taking part, >= 1.
    chunks : sequence of float
        The schedule's chunks: fractions of the full buffer, in order, summing to 1.

    Raises
    ------
    ScheduleError
        For a sharded collective, when a chunk straddles two shards.

    Notes
    -----
    Subclasses set :attr:`name` (the schedule JSON's ``"collective"``), :attr:`sharded`,
    the buffer layout (:attr:`input_part`, :attr:`output_part`, :attr:`reduces`) and
    implement :meth:`initial` and :meth:`postcondition`.
    Initial states and postconditions are given per rank as runs of chunks, so a rank's
    state costs O(runs), not O(chunks): one run for an allreduce, up to ``nranks`` for an
    allgather's result.
    """

    name: ClassVar[str] = ""
    sharded: ClassVar[bool] = False  #: whether the buffer is cut into per-rank shards
    #: What each rank passes in and gets out: the full buffer, or its own shard of it.
    input_part: ClassVar[Part] = "all"
    output_part: ClassVar[Part] = "all"
    #: Whether contributions are added (an allgather only copies them).
    reduces: ClassVar[bool] = True

    nranks: int
    chunks: tuple[float, ...]
    shards: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(self.chunks))
        if self.nranks < 1:
            raise ScheduleError(f"{self.name}: nranks must be >= 1, got {self.nranks}")
        shards = shard_chunks(self.nranks, self.chunks, self.name) if self.sharded else ()
        object.__setattr__(self, "shards", shards)

    @property
    def nchunks(self) -> int:
        return len(self.chunks)

    @property
    def full(self) -> int:
        """The bitmask of every rank."""
        return (1 << self.nranks) - 1

    # ---- buffer layout -------------------------------------------------------
    def input_size(self, size: int) -> int:
        """Elements each rank passes in, for a full buffer of ``size`` elements.

        Raises
        ------
        ScheduleError
            For a sharded collective, when ``size`` is not a multiple of ``nranks``.
        """
        a, b = self.input_range(0, size)
        return b - a

    def output_size(self, size: int) -> int:
        """Elements each rank gets out, for a full buffer of ``size`` elements (raises as
        :meth:`input_size`)."""
        a, b = self.output_range(0, size)
        return b - a

    def input_range(self, rank: int, size: int) -> tuple[int, int]:
        """The elements ``[start, end)`` of the full buffer of ``size`` elements that
        ``rank`` passes in (raises as :meth:`input_size`)."""
        return self._part_range(self.input_part, rank, size)

    def output_range(self, rank: int, size: int) -> tuple[int, int]:
        """The elements ``[start, end)`` of the full buffer of ``size`` elements that
        ``rank`` gets out (raises as :meth:`input_size`)."""
        return self._part_range(self.output_part, rank, size)

    def _part_range(self, part: Part, rank: int, size: int) -> tuple[int, int]:
        m = self.shard_size(size) if self.sharded else size
        return (rank * m, (rank + 1) * m) if part == "shard" else (0, size)

    def shard_size(self, size: int) -> int:
        """Elements of one shard: ``size / nranks``.

        Raises
        ------
        ScheduleError
            When ``size`` is not a multiple of ``nranks``.
        """
        if size % self.nranks:
            raise ScheduleError(f"{self.name} of {self.nranks} ranks: the full buffer "
                                f"({size} elements) must be a multiple of {self.nranks}, "
                                "one equal shard per rank")
        return size // self.nranks

    def chunk_bounds(self, size: int) -> list[tuple[int, int]]:
        """Element ranges ``[start, end)`` of each chunk in the full buffer of ``size`` elements.

        :func:`chunk_bounds`' rule (chunk ``k`` starts at ``floor(C_k * size)``), except
        that a sharded collective puts shard ``r``'s first element at
        ``floor(r * size / nranks)`` exactly (``r * size / nranks`` when ``size`` is a
        multiple of ``nranks``, as the executor's buffers are), so no element of a shard
        lands in a chunk of another when the fractions round.
        """
        bounds = chunk_bounds(self.chunks, size)
        if not self.sharded:
            return bounds
        cuts = [a for a, _ in bounds] + [size]
        n = self.nranks
        for r, (a, b) in enumerate(self.shards):
            lo, hi = r * size // n, (r + 1) * size // n
            cuts[a:b + 1] = [min(max(c, lo), hi) for c in cuts[a:b + 1]]
            cuts[a], cuts[b] = lo, hi
        return list(zip(cuts[:-1], cuts[1:]))

    # ---- symbolic states -----------------------------------------------------
    def initial(self, rank: int) -> list[Run]:
        """What ``rank`` holds before the first step: ``(start, end, mask)`` runs
        covering chunks ``0 .. nchunks - 1`` in order (mask 0: nothing yet)."""
        raise NotImplementedError

    def postcondition(self, rank: int) -> list[Expected]:
        """What ``rank`` must hold after the last step: ``(start, end, mask or None)``
        runs covering every chunk in order (``None``: the result does not matter)."""
        raise NotImplementedError

    @property
    def starts_empty(self) -> bool:
        """Whether some chunk starts holding nothing (mask 0), so that sending or adding
        into it before it is filled is a fault."""
        return False

    def shard_of(self, chunk: int) -> int:
        """The rank whose shard holds ``chunk`` (sharded collectives only)."""
        return bisect_left([b for _, b in self.shards], chunk + 1)

    def _own_shard(self, rank: int, inside: int | None, outside: int | None) -> list:
        """Runs: ``inside`` on ``rank``'s shard, ``outside`` elsewhere (empty runs dropped)."""
        a, b = self.shards[rank]
        runs = [(0, a, outside), (a, b, inside), (b, self.nchunks, outside)]
        return [run for run in runs if run[0] < run[1]]


class AllReduceSpec(Collective):
    """Every rank ends with the sum of every rank's full buffer (in = out = ``size``)."""

    name = "allreduce"

    def initial(self, rank: int) -> list[Run]:
        return [(0, self.nchunks, 1 << rank)]

    def postcondition(self, rank: int) -> list[Expected]:
        return [(0, self.nchunks, self.full)]


class ReduceScatterSpec(Collective):
    """Rank ``r`` ends with shard ``r`` of the sum of every rank's full buffer.

    In ``size`` elements, out ``size / nranks`` (MPI_Reduce_scatter_block). Every chunk
    of every rank starts with that rank's contribution; the chunks of shard ``r`` on rank
    ``r`` end with every contribution exactly once, and the rest do not matter.
    """

    name = "reduce_scatter"
    sharded = True
    output_part = "shard"

    def initial(self, rank: int) -> list[Run]:
        return [(0, self.nchunks, 1 << rank)]

    def postcondition(self, rank: int) -> list[Expected]:
        return self._own_shard(rank, self.full, None)


class AllGatherSpec(Collective):
    """Every rank ends with every rank's shard, in rank order.

    In ``size / nranks`` elements (rank ``r``'s shard), out ``size`` (MPI_Allgather).
    Rank ``r`` starts holding only the chunks of shard ``r`` (contribution ``{r}``);
    its other chunks hold nothing. Every rank ends with each chunk of shard ``q``
    holding exactly ``{q}``: copied, never added to.
    """

    name = "allgather"
    sharded = True
    input_part = "shard"
    reduces = False

    def initial(self, rank: int) -> list[Run]:
        return self._own_shard(rank, 1 << rank, 0)

    def postcondition(self, rank: int) -> list[Expected]:
        return [(a, b, 1 << q) for q, (a, b) in enumerate(self.shards) if a < b]

    @property
    def starts_empty(self) -> bool:
        return self.nranks > 1


#: The collectives by the name a schedule's JSON gives them.
COLLECTIVES: dict[str, type[Collective]] = {
    cls.name: cls for cls in (AllReduceSpec, ReduceScatterSpec, AllGatherSpec)}


def get_collective(name: str) -> type[Collective]:
    """The collective class named ``name`` (``"allreduce"``, ``"reduce_scatter"``, ``"allgather"``).

    Raises
    ------
    ScheduleError
        For an unknown name, listing the known ones.
    """
    cls = COLLECTIVES.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(repr(n) for n in COLLECTIVES)
        raise ScheduleError(f"unknown collective {name!r}; expected one of {known}")
    return cls


def collective_of(schedule: Schedule) -> Collective:
    """The :class:`Collective` a schedule computes, over its ranks and chunks."""
    return get_collective(schedule.collective)(schedule.nranks, schedule.chunks)


def chunk_bounds(chunks: Sequence[float], n: int) -> list[tuple[int, int]]:
    """Element ranges ``[start, end)`` of each chunk for a buffer of ``n`` elements.

    Piece ``k`` covers ``[floor(C_k * n), floor(C_{k+1} * n))`` with ``C_k`` the sum
    of the first ``k`` fractions; the last boundary is ``n`` exactly (docs/SCHEDULE.md).
    """
    cuts = [0] + [math.floor(c * n) for c in accumulate(chunks)][:-1] + [n]
    for k in range(1, len(cuts)):  # guard against float round-off past n
        cuts[k] = min(max(cuts[k], cuts[k - 1]), n)
    return list(zip(cuts[:-1], cuts[1:]))


def shard_chunks(nranks: int, chunks: Sequence[float], collective: str = "reduce_scatter"
                 ) -> tuple[tuple[int, int], ...]:
    """The chunks of each shard: ``(first, end)`` for shard ``r = 0 .. nranks - 1``.

    Shard ``r`` covers the fractions ``r / nranks`` to ``(r + 1) / nranks`` of the buffer;
    its chunks are those between the chunk boundaries at those fractions.

    Raises
    ------
    ScheduleError
        When no chunk boundary sits at some ``r / nranks`` (within
        :data:`SHARD_TOLERANCE`): naming the chunk that straddles two shards.
    """
    cum = [0.0, *accumulate(chunks)]
    bounds = [0]
    for r in range(1, nranks):
        target = r / nranks
        k = bisect_left(cum, target - SHARD_TOLERANCE)
        if k < len(cum) and abs(cum[k] - target) <= SHARD_TOLERANCE:
            bounds.append(k)
            continue
        k -= 1  # cum[k] < target < cum[k + 1]: chunk k straddles
        raise ScheduleError(
            f"{collective} of {nranks} ranks: chunk {k} covers {cum[k]:.6g}..{cum[k + 1]:.6g} "
            f"of the buffer and straddles shards {r - 1} and {r} (each 1/{nranks} of it); "
            f"cut the chunks at every multiple of 1/{nranks}")
    bounds.append(len(chunks))
    return tuple(zip(bounds[:-1], bounds[1:]))


#: The classes' old names -> (their new names, the executor's call of the old name). The
#: old names clashed with the calls (``collectives.AllReduce`` and ``Allreduce`` differed
#: in case only), so they are deprecated.
_RENAMED = {"AllReduce": ("AllReduceSpec", "Allreduce"),
            "ReduceScatter": ("ReduceScatterSpec", "ReduceScatter"),
            "AllGather": ("AllGatherSpec", "AllGather")}


def __getattr__(name: str) -> type[Collective]:
    if name not in _RENAMED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new, call = _RENAMED[name]
    warnings.warn(f"topoplan.ir.collectives.{name} is deprecated; use topoplan.ir.collectives.{new} "
                  f"(topoplan.{call} is the executor's call that runs a schedule)",
                  DeprecationWarning, stacklevel=2)
    return globals()[new]  # type: ignore[no-any-return]


def bus_factor(nranks: int, collective: str = "allreduce") -> float:
    """busbw / algbw of ``collective`` over ``nranks`` ranks: ``2(n-1)/n`` for an
    allreduce, ``(n-1)/n`` for a reduce-scatter or an allgather.

    nccl-tests' convention (its PERFORMANCE.md): the bus bandwidth a ring would need,
    comparable across rank counts with the links' own speed. 0 for one rank, which
    moves nothing.
    """
    if nranks < 2:
        return 0.0
    return (nranks - 1) / nranks * (1 if get_collective(collective).sharded else 2)
