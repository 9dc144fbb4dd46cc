"""The MSCCL XML algorithm format as data: frozen dataclasses and the format's vocabulary.

MSCCL algorithms are XML files run by the MSCCL executor (Azure/msccl-executor-nccl,
and RCCL's copy of it): ``<algo>`` holds one ``<gpu>`` per rank, each gpu holds thread
blocks ``<tb>`` bound to a channel and to at most one send and one receive peer, and each
thread block runs its ``<step>`` elements in order. :class:`Algo`, :class:`Gpu`,
:class:`ThreadBlock` and :class:`Step` hold one element each; :data:`STEP_TYPES` says
what each step type does. Reading (:mod:`.parse`), writing (:mod:`.write`), the
executor's limits (:mod:`.limits`) and the symbolic checker (:mod:`.verify`) all work
on these.

References
----------
- Azure/msccl-executor-nccl: ``src/misc/msccl/msccl_parser.cc`` (what a file may hold).
- microsoft/msccl-tools: ``msccl/language/ir.py`` (``ir_to_xml``, the writer of the format).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Step", "ThreadBlock", "Gpu", "Algo", "STEP_TYPES", "PROTOCOLS", "COLLECTIVES",
           "BUFFERS", "FINGERPRINT_ATTR", "SEGMENTS_ATTR", "SERVES_ATTR"]

#: The ``<algo>`` attribute in which topoplan's export records the cluster fingerprint
#: of the plan. The executor's parser (msccl_parser.h) keeps up to 16 attributes per
#: element (MAX_ATTR_COUNT; ``<algo>`` has 10 without it and the two below) and looks up
#: only those it knows.
FINGERPRINT_ATTR = "topoplanCluster"
#: The ``<algo>`` attribute in which topoplan's export records how many consecutive MSCCL
#: channels (segments) each channel of the plan (IR v4) and instance took, when more than
#: one: MSCCL channel ``ch`` is then the plan's channel ``ch // segments`` (of instance
#: ``ch // (segments * plan channels)``), which the import reads back. Executors ignore it.
SEGMENTS_ATTR = "topoplanSegments"
#: The ``<algo>`` attribute in which topoplan's export says, in words, which calls the
#: executor picks the algorithm for (``element counts that are multiples of 256``: the
#: executor's rule on ``nchunksperloop``, msccl_lifecycle.cc). Executors ignore it.
SERVES_ATTR = "topoplanServes"

PROTOCOLS = ("Simple", "LL", "LL128")
#: The collectives the executor's parser knows (``mscclGetAlgoFromXmlFile``).
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "reduce", "broadcast", "send",
               "recv", "gather", "scatter", "alltoall", "alltoallv")
BUFFERS = ("i", "o", "s")


@dataclass(frozen=True, slots=True)
class _Kind:
    """What a step type does: receives, sends, reads src, writes dst, reduces."""

    recv: bool
    send: bool
    src: bool  # reads its src units
    dst: bool  # writes its dst units
    reduce: bool  # the result is the sum of the received (or dst) data and src


#: Step types of the executor's parser (``mscclGetAlgoFromXmlFile``) and what each does.
STEP_TYPES: dict[str, _Kind] = {
    "s": _Kind(recv=False, send=True, src=True, dst=False, reduce=False),
    "r": _Kind(recv=True, send=False, src=False, dst=True, reduce=False),
    "rcs": _Kind(recv=True, send=True, src=False, dst=True, reduce=False),
    "rrs": _Kind(recv=True, send=True, src=True, dst=False, reduce=True),
    "rrc": _Kind(recv=True, send=False, src=True, dst=True, reduce=True),
    "rrcs": _Kind(recv=True, send=True, src=True, dst=True, reduce=True),
    "cpy": _Kind(recv=False, send=False, src=True, dst=True, reduce=False),
    "re": _Kind(recv=False, send=False, src=True, dst=True, reduce=True),
    "nop": _Kind(recv=False, send=False, src=False, dst=False, reduce=False),
}


@dataclass(frozen=True, slots=True)
class Step:
    """One ``<step>``: ``s`` is its index in its thread block; offsets and cnt count
    MSCCL chunks; ``depid``/``deps`` name a thread block of the same gpu and one of its
    steps to wait for (``-1`` for none); ``hasdep`` makes the step signal its index to
    waiters when it completes. ``plan`` is topoplan's own ``tp`` attribute (the executor
    ignores it): where in the plan an exported step came from, ``(step, index of its op
    in that step)``, and for a fused step the index of its send in the next step too;
    ``()`` for none. ``line`` is where it was read (not compared)."""

    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: bool
    plan: tuple[int, ...] = ()
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class ThreadBlock:
    """One ``<tb>``: its id (0..n-1 on its gpu), send and receive peers (-1 for none),
    channel and steps."""

    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[Step, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One ``<gpu>``: its rank, the sizes (in MSCCL chunks) of its input, output and
    scratch buffers, and its thread blocks in id order."""

    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[ThreadBlock, ...]
    line: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Algo:
    """One ``<algo>``: the header attributes and the gpus in rank order.

    ``min_bytes``/``max_bytes`` are the ``minBytes``/``maxBytes`` attributes (the
    message sizes the executor picks the algorithm for; ``maxBytes=0`` means no limit).
    ``cluster_fingerprint`` is the :data:`FINGERPRINT_ATTR` attribute a file topoplan
    exported carries (the cluster the plan was made for, :mod:`topoplan.ir.fingerprint`;
    ``""`` when absent): executors ignore it, topoplan's importer keeps it in the plan.
    ``segments`` is the :data:`SEGMENTS_ATTR` attribute (1 when absent): the MSCCL
    channels each channel of the plan took in a file topoplan exported. ``serves`` is
    the :data:`SERVES_ATTR` attribute (``""`` when absent).
    ``file`` names the source in errors (not compared).
    """

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    coll: str
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int
    gpus: tuple[Gpu, ...]
    file: str = field(default="<algo>", compare=False)
    cluster_fingerprint: str = ""
    segments: int = 1
    serves: str = ""
