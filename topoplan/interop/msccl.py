"""The MSCCL XML algorithm format: a model, its parser and writer, and a symbolic checker.

MSCCL algorithms are XML files run by the MSCCL executor (Azure/msccl-executor-nccl,
and RCCL's copy of it): ``<algo>`` holds one ``<gpu>`` per rank, each gpu holds thread
blocks ``<tb>`` bound to a channel and to at most one send and one receive peer, and each
thread block runs its ``<step>`` elements in order. This module reads that format into
frozen dataclasses (:class:`Algo`, :class:`Gpu`, :class:`ThreadBlock`, :class:`Step`),
refuses what the executor's parser refuses (with file, line and element), writes it back
(:func:`to_xml`), reports what exceeds the executor's compile-time limits
(:func:`limit_violations`) and checks symbolically that the steps compute their
collective, an allreduce, a reduce-scatter or an allgather (:func:`check_msccl`), without
running a GPU.

The checker interprets the step types over contribution sets (which ranks' inputs a
buffer unit holds), with FIFO connections of bounded capacity between thread blocks,
dependency flags as the kernel sets them (``src/device/msccl_kernel.cu``), and a
vector-clock race detector over each gpu's thread blocks. It is written from the
executor's sources, independently of topoplan's exporter, so that it can be the
exporter's test oracle.

References
----------
- Azure/msccl-executor-nccl: ``src/misc/msccl/msccl_parser.cc`` (what a file may hold;
  ``coll`` and its ``sizeMultiplier``), ``src/device/msccl_kernel.cu`` (how steps,
  dependencies and flags run), ``src/misc/msccl/msccl_setup.cc`` (the kernel's count:
  the caller's count times ``sizeMultiplier``), ``src/misc/msccl/msccl_lifecycle.cc``
  (when a call is in place, and which counts an algorithm is picked for),
  ``src/include/msccl/msccl_struct.h`` and ``makefiles/common.mk`` (the limits).
- microsoft/msccl-tools: ``msccl/language/ir.py`` (``ir_to_xml``, the writer of the format),
  ``msccl/language/collectives.py`` (``AllGather``, ``ReduceScatter``: buffers in place
  and out of place, and their postconditions).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ScheduleError, XmlFormatError
from .xmlfile import Element, parse_xml, read_xml

__all__ = [
    "Step", "ThreadBlock", "Gpu", "Algo", "Limits", "CheckReport",
    "parse_msccl", "read_msccl", "to_xml", "limit_violations", "check_msccl",
    "STEP_TYPES", "PROTOCOLS", "COLLECTIVES", "CHECKED", "FINGERPRINT_ATTR",
]

#: The ``<algo>`` attribute in which topoplan's export records the cluster fingerprint
#: of the plan. The executor's parser (msccl_parser.h) keeps up to 16 attributes per
#: element (MAX_ATTR_COUNT; ``<algo>`` has 10 without it) and looks up only those it knows.
FINGERPRINT_ATTR = "topoplanCluster"

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
    exported carries (the cluster the plan was made for, :mod:`topoplan.fingerprint`;
    ``""`` when absent): executors ignore it, topoplan's importer keeps it in the plan.
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


# --------------------------------------------------------------------------- parsing


def _flag(el: Element, attr: str) -> bool:
    return el.int(attr, minimum=0, maximum=1) == 1


def _choice(el: Element, attr: str, allowed: tuple[str, ...]) -> str:
    value = el.require(attr)
    if value not in allowed:
        raise el.error(f"must be one of {', '.join(allowed)}, got {value!r}", attr)
    return value


def _only_children(el: Element, tag: str) -> list[Element]:
    for child in el.children:
        if child.tag != tag:
            raise child.error(f"unexpected element <{child.tag}> in <{el.tag}>; "
                              f"only <{tag}> belongs here")
    return el.children


_STEP_INTS = ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep")


def _step_ints(el: Element) -> list[int]:
    """The integer attributes of a step; a fast path for the common, valid case (large
    files hold ~10^6 of them), falling back to :meth:`Element.int` for the error."""
    attrs = el.attrs
    try:
        values = [int(attrs[k]) for k in _STEP_INTS]
    except (KeyError, ValueError):
        values = []
    if (len(values) == 7 and min(values[1], values[2], values[4], values[5]) >= -1
            and values[3] >= 0 and values[6] in (0, 1)):
        return values
    return [el.int("s"), el.int("srcoff", minimum=-1), el.int("dstoff", minimum=-1),
            el.int("cnt", minimum=0), el.int("depid", minimum=-1),
            el.int("deps", minimum=-1), el.int("hasdep", minimum=0, maximum=1)]


def _plan_attr(el: Element) -> tuple[int, ...]:
    """topoplan's ``tp="step,op[,send op]"``: where an exported step sits in its plan."""
    raw = el.attrs["tp"]
    try:
        values = tuple(int(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) not in (2, 3) or min(values) < 0:
        raise el.error(f"must be 'step,op' or 'step,op,send op' (integers >= 0), got {raw!r}",
                       "tp")
    return values


def _parse_step(el: Element, position: int, gpu: int, tb: int, nbuf: dict[str, int],
                send: int, recv: int) -> Step:
    s, srcoff, dstoff, cnt, depid, deps, hasdep_int = _step_ints(el)
    hasdep = hasdep_int == 1
    if s != position:
        raise el.error(f"must be the step's position in its tb ({position}), got {s}", "s")
    kind_name = el.require("type")
    kind = STEP_TYPES.get(kind_name)
    if kind is None:
        raise el.error(f"unknown step type {kind_name!r}; the executor knows "
                       f"{', '.join(STEP_TYPES)}", "type")
    srcbuf = _choice(el, "srcbuf", BUFFERS)
    dstbuf = _choice(el, "dstbuf", BUFFERS)
    if kind_name != "nop":
        if cnt < 1:
            raise el.error(f"must be >= 1 for a {kind_name} step, got {cnt}", "cnt")
        for used, buf, off, attr in ((kind.src, srcbuf, srcoff, "srcoff"),
                                     (kind.dst, dstbuf, dstoff, "dstoff")):
            if used and (off < 0 or off + cnt > nbuf[buf]):
                raise el.error(f"units {off}..{off + cnt - 1} are outside buffer {buf} "
                               f"of gpu {gpu} ({buf}_chunks={nbuf[buf]})", attr)
        if kind.send and send < 0:
            raise el.error(f"a {kind_name} step sends, but tb {tb} has no send peer "
                           "(send=-1)", "type")
        if kind.recv and recv < 0:
            raise el.error(f"a {kind_name} step receives, but tb {tb} has no recv peer "
                           "(recv=-1)", "type")
    if depid >= 0 and depid == tb:
        raise el.error(f"a tb cannot depend on itself (tb {tb}); its steps already run "
                       "in order", "depid")
    if depid >= 0 and deps < 0:
        raise el.error(f"must be a step of tb {depid} (>= 0) when depid is set, got {deps}",
                       "deps")
    plan = _plan_attr(el) if "tp" in el.attrs else ()
    return Step(s, kind_name, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep,
                plan, line=el.line)


def _check_tb_sequences(el_steps: list[Element], steps: list[Step]) -> None:
    """Refuse what the executor's step folding would run differently from the file.

    The parser folds nops into the next real step (which must carry a dependency of its
    own, or it refuses the file) and the kernel counts one step per folded dependency, so
    a nop without one would shift every later flag; it fuses consecutive ``re`` steps with the same dst,
    the same src buffer and no depid into one reduction (whose count is the last one's).
    """
    pending_nop: Step | None = None
    bare_nop: Step | None = None
    chain: Step | None = None  # the re step a following re would fuse with
    for el, st in zip(el_steps, steps):
        if st.type == "nop":
            if st.depid >= 0 and pending_nop is None:
                pending_nop = st
            if st.depid < 0 and bare_nop is None:
                bare_nop = st
            continue
        if bare_nop is not None:
            bad = el_steps[bare_nop.s]
            raise bad.error("a nop without a dependency is dropped by the executor, whose "
                            "step count (the flags it signals) then no longer matches s; "
                            "remove it or give it a depid", "depid")
        fuses = (st.type == "re" and chain is not None and chain.dstbuf == st.dstbuf
                 and chain.dstoff == st.dstoff and chain.srcbuf == st.srcbuf
                 and st.depid < 0)
        if fuses and chain is not None and chain.cnt != st.cnt:
            raise el.error(f"this re fuses with the re at step {chain.s} (same dst, no "
                           f"depid) and the executor would run both with cnt={st.cnt}; "
                           f"give them the same cnt or split the chain", "cnt")
        if pending_nop is not None and st.depid < 0 and not fuses:
            raise el.error(f"nop step {pending_nop.s} carries a dependency, so the next "
                           "real step must carry one too (the executor refuses: 'the last "
                           "reduction must be a part of the first immediate instruction')",
                           "depid")
        if pending_nop is not None and fuses:
            raise el.error(f"nop step {pending_nop.s} carries a dependency, but this re "
                           f"fuses with step {chain.s if chain else '?'} and the executor "
                           "would not wait for it; move the nop before the first re",
                           "depid")
        pending_nop = None
        chain = st if st.type == "re" and not st.hasdep else None


def _parse_tb(el: Element, gpu: int, ngpus: int, nchannels: int,
              nbuf: dict[str, int]) -> ThreadBlock:
    tid = el.int("id", minimum=0)
    send = el.int("send", minimum=-1, maximum=ngpus - 1)
    recv = el.int("recv", minimum=-1, maximum=ngpus - 1)
    if send == gpu:
        raise el.error(f"a tb cannot send to its own gpu {gpu}; use -1 for none", "send")
    if recv == gpu:
        raise el.error(f"a tb cannot receive from its own gpu {gpu}; use -1 for none",
                       "recv")
    chan = el.int("chan")
    if not 0 <= chan < nchannels:
        raise el.error(f"must be in [0, nchannels={nchannels}), got {chan}", "chan")
    step_els = _only_children(el, "step")
    steps = [_parse_step(s, k, gpu, tid, nbuf, send, recv) for k, s in enumerate(step_els)]
    _check_tb_sequences(step_els, steps)
    return ThreadBlock(tid, send, recv, chan, tuple(steps), line=el.line)


def _parse_gpu(el: Element, ngpus: int, nchannels: int) -> Gpu:
    gid = el.int("id", minimum=0)
    if gid >= ngpus:
        raise el.error(f"must be < ngpus={ngpus}, got {gid}", "id")
    nbuf = {b: el.int(f"{b}_chunks", minimum=0) for b in BUFFERS}
    tb_els = _only_children(el, "tb")
    tbs: dict[int, ThreadBlock] = {}
    tb_el: dict[int, Element] = {}
    conns: dict[tuple[str, int, int], int] = {}
    for tel in tb_els:
        tb = _parse_tb(tel, gid, ngpus, nchannels, nbuf)
        if tb.id in tbs:
            raise tel.error(f"duplicate tb id {tb.id} on gpu {gid} (first at line "
                            f"{tb_el[tb.id].line})", "id")
        for role, peer in (("send", tb.send), ("recv", tb.recv)):
            if peer < 0:
                continue
            other = conns.setdefault((role, peer, tb.chan), tb.id)
            if other != tb.id:
                raise tel.error(f"tb {other} already has {role} peer {peer} on channel "
                                f"{tb.chan}; a channel has one connection per peer, so "
                                "put this tb on another channel", role)
        tbs[tb.id] = tb
        tb_el[tb.id] = tel
    for tid in range(len(tbs)):
        if tid not in tbs:
            raise el.error(f"tb ids must be 0..{len(tbs) - 1} without gaps; tb {tid} is "
                           f"missing (ids: {sorted(tbs)})")
    # dependencies name another tb of this gpu and one of its steps
    for tid, tb in tbs.items():
        step_els = tb_el[tid].children
        for st, sel in zip(tb.steps, step_els):
            if st.depid < 0:
                continue
            target = tbs.get(st.depid)
            if target is None:
                raise sel.error(f"gpu {gid} has no tb {st.depid} (tbs 0..{len(tbs) - 1})",
                                "depid")
            if st.deps >= len(target.steps):
                raise sel.error(f"tb {st.depid} of gpu {gid} has {len(target.steps)} steps "
                                f"(0..{len(target.steps) - 1}), got {st.deps}", "deps")
    return Gpu(gid, nbuf["i"], nbuf["o"], nbuf["s"],
               tuple(tbs[t] for t in range(len(tbs))), line=el.line)


_COMMENT = re.compile(r"<!--.*?-->", re.S)
def _check_executor_lexing(text: str | bytes, file: str) -> None:
    """Refuse what well-formed XML allows but the executor's hand-written reader does not.

    ``mscclXmlGetNode`` skips only spaces and newlines between elements, reads attributes
    separated by single spaces up to the end of the line, values in double quotes, and
    knows no ``<?xml?>`` declaration (it would swallow the whole file as an unknown
    element); a tab, a tag spread over lines or text between elements make it fail.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    clean = _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)

    def refuse(pos: int, what: str) -> None:
        line = clean.count("\n", 0, pos) + 1
        raise XmlFormatError(f"{what}; the executor's parser cannot read it "
                             "(msccl_parser.cc)", file=file, line=line)

    # str methods, not regular expressions: files run to ~10^6 elements
    for needle, what in (("<?", "an XML declaration or processing instruction (<?...?>); "
                                "remove it"),
                         ("\t", "a tab; indent with spaces and separate attributes with one "
                                "space")):
        pos = clean.find(needle)
        if pos >= 0:
            refuse(pos, what)
    for needle in ("='", " =", "= "):
        pos = clean.find(needle)
        if pos >= 0:
            refuse(pos, "an attribute written as name = value or with single quotes; write "
                        'name="value"')
    for line, text_line in enumerate(clean.split("\n"), 1):
        body = text_line.strip(" \r")
        if body and (body[0] != "<" or body[-1] != ">"):
            raise XmlFormatError("a tag spread over several lines, or text outside the "
                                 "elements; write each element on one line; the executor's "
                                 "parser cannot read it (msccl_parser.cc)", file=file,
                                 line=line)


def _executor_attrs(root: Element, inplace: bool) -> None:
    """Refuse an ``<algo>`` without ``outofplace``, ``minBytes`` or ``maxBytes``, saying
    what to add: msccl-executor-nccl's parser requires all three, and msccl-tools'
    ``ir_to_xml`` writes none of them (its programs are in place or out of place, as
    ``inplace`` says, for every size)."""
    absent = [a for a in ("outofplace", "minBytes", "maxBytes") if a not in root.attrs]
    if not absent:
        return
    values = {"outofplace": "0" if inplace else "1", "minBytes": "0", "maxBytes": "0"}
    add = " ".join(f'{a}="{values[a]}"' for a in absent)
    raise root.error(
        f"missing attribute (it has: {', '.join(sorted(root.attrs))}); msccl-executor-nccl "
        f"needs {', '.join(absent)} (msccl_parser.cc) and msccl-tools does not write them: "
        f"add {add} to <algo> ({'in place' if inplace else 'out of place'} only, every "
        "size)", absent[0])


def _parse_root(root: Element, file: str) -> Algo:
    if root.tag != "algo":
        raise root.error(f"the root element must be <algo>, got <{root.tag}>")
    name = root.require("name")
    proto = _choice(root, "proto", PROTOCOLS)
    nchannels = root.int("nchannels", minimum=1)
    nchunks = root.int("nchunksperloop", minimum=1)
    ngpus = root.int("ngpus", minimum=1)
    if root.attrs.get("coll") == "reduce_scatter":
        raise root.error("'reduce_scatter' is msccl-tools' name for its ReduceScatter, but the "
                         "executor knows only 'reducescatter' (msccl_parser.cc refuses the "
                         "file: unsupported collective); write coll=\"reducescatter\"", "coll")
    coll = _choice(root, "coll", COLLECTIVES)
    inplace = _flag(root, "inplace")
    _executor_attrs(root, inplace)
    outofplace = _flag(root, "outofplace")
    min_bytes = root.int("minBytes", minimum=0)
    max_bytes = root.int("maxBytes", minimum=0)
    gpus: dict[int, Gpu] = {}
    lines: dict[int, int] = {}
    for gel in _only_children(root, "gpu"):
        gpu = _parse_gpu(gel, ngpus, nchannels)
        if gpu.id in gpus:
            raise gel.error(f"duplicate gpu id {gpu.id} (first at line {lines[gpu.id]})",
                            "id")
        gpus[gpu.id] = gpu
        lines[gpu.id] = gel.line
    missing = [g for g in range(ngpus) if g not in gpus]
    if missing:
        raise root.error(f"ngpus={ngpus} but there is no <gpu> with id "
                         f"{', '.join(map(str, missing[:8]))}"
                         f"{', ...' if len(missing) > 8 else ''}", "ngpus")
    return Algo(name, proto, nchannels, nchunks, ngpus, coll, inplace, outofplace,
                min_bytes, max_bytes, tuple(gpus[g] for g in range(ngpus)), file=file,
                cluster_fingerprint=root.attrs.get(FINGERPRINT_ATTR, ""))


def parse_msccl(text: str | bytes, file: str = "<string>") -> Algo:
    """Parse an MSCCL XML algorithm and check its structure.

    Refuses what the executor's parser refuses (a missing attribute, an unknown step
    type or buffer, a tb id gap or duplicate, a tb whose peer is its own gpu, a send
    step in a tb without a send peer, a nop whose dependency the next step would drop)
    and what is well-formed XML but not for the executor's hand-written reader (an
    ``<?xml?>`` declaration, tabs, a tag over several lines, single-quoted values);
    and what would make it run something else than the file says: ``s`` not equal to
    the step's position, units outside their buffer (for the src and dst each type
    uses), channel outside ``[0, nchannels)``, two tbs of a gpu sharing a connection
    (same peer and channel), a dependency on a missing tb or step, ngpus not matching
    the ``<gpu>`` elements, and re steps that the executor fuses but that differ in cnt.
    Compile-time limits (steps per tb, cnt, tbs per channel) are left to
    :func:`limit_violations`. Unknown attributes are ignored (RCCL adds ``maxcount`` and
    ``nthreadblocks``); unknown elements are refused.

    Parameters
    ----------
    text
        The XML text.
    file
        The name used in error messages.

    Returns
    -------
    Algo

    Raises
    ------
    XmlFormatError
        ``FILE:LINE: ELEMENT: ATTRIBUTE: what is wrong``.
    """
    root = parse_xml(text, file=file)
    _check_executor_lexing(text, file)
    return _parse_root(root, file)


def read_msccl(path: str | Path) -> Algo:
    """Read and parse an MSCCL XML file; see :func:`parse_msccl`."""
    root = read_xml(path)
    _check_executor_lexing(Path(path).read_bytes(), str(path))
    return _parse_root(root, str(path))


# --------------------------------------------------------------------------- writing


def _attr_value(value: str, what: str, file: str) -> str:
    # The executor's parser reads a value up to the next '"' and unescapes nothing.
    if any(c in value for c in '"<>&\n\r'):
        raise XmlFormatError(f"{what} {value!r} has a character the executor's parser "
                             "cannot read (one of \" < > & or a newline)", file=file)
    return value


def to_xml(algo: Algo) -> str:
    """Write the algorithm in the form the executor's parser reads.

    Every attribute is written (``minBytes`` and ``maxBytes`` too), one element per line
    with 2-space indentation, attributes separated by single spaces in double quotes,
    and no ``<?xml?>`` declaration (the executor's hand-written parser reads neither
    tabs between attributes nor a declaration). ``parse_msccl(to_xml(a)) == a``.
    """
    out = [f'<algo name="{_attr_value(algo.name, "name", algo.file)}" proto="{algo.proto}" '
           f'nchannels="{algo.nchannels}" nchunksperloop="{algo.nchunksperloop}" '
           f'ngpus="{algo.ngpus}" coll="{_attr_value(algo.coll, "coll", algo.file)}" '
           f'inplace="{int(algo.inplace)}" outofplace="{int(algo.outofplace)}" '
           f'minBytes="{algo.min_bytes}" maxBytes="{algo.max_bytes}"']
    if algo.cluster_fingerprint:
        value = _attr_value(algo.cluster_fingerprint, FINGERPRINT_ATTR, algo.file)
        out[0] += f' {FINGERPRINT_ATTR}="{value}"'
    out[0] += ">"
    for gpu in algo.gpus:
        out.append(f'  <gpu id="{gpu.id}" i_chunks="{gpu.i_chunks}" '
                   f'o_chunks="{gpu.o_chunks}" s_chunks="{gpu.s_chunks}">')
        for tb in gpu.tbs:
            out.append(f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" '
                       f'chan="{tb.chan}">')
            for st in tb.steps:
                out.append(f'      <step s="{st.s}" type="{st.type}" srcbuf="{st.srcbuf}" '
                           f'srcoff="{st.srcoff}" dstbuf="{st.dstbuf}" '
                           f'dstoff="{st.dstoff}" cnt="{st.cnt}" depid="{st.depid}" '
                           f'deps="{st.deps}" hasdep="{int(st.hasdep)}"'
                           + (f' tp="{",".join(map(str, st.plan))}"/>' if st.plan else "/>"))
            out.append("    </tb>")
        out.append("  </gpu>")
    out.append("</algo>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class Limits:
    """The executor's compile-time limits.

    ``max_steps`` is ``MSCCL_MAX_NUM_STEPS`` (a build option, 64 by default in
    ``makefiles/common.mk``); ``max_count`` is ``MSCCL_MAX_COUNT`` (cnt must be below
    it); ``max_tbs_per_channel`` is ``MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL`` (per
    channel, that many tbs with a send peer and that many with a recv peer);
    ``max_channels`` is ``MAXCHANNELS``.
    """

    max_steps: int = 64
    max_count: int = 72
    max_tbs_per_channel: int = 32
    max_channels: int = 32


#: Fixed sizes of the executor's parser (``src/include/msccl/msccl_parser.h``) and
#: transmission struct (``msccl_struct.h``), not build options.
MAX_NODES = 4096  # XML nodes one rank loads: algo, every gpu, its own tbs and steps
_MAX_SUBS = 1024  # children of one element (unchecked: more overflow the parser)
_MAX_STR_LEN = 255
_MAX_DEPID = 127  # dependentBid is int8_t
_MAX_OFFSET = 32767  # srcOffset/dstOffset are int16_t


def limit_violations(algo: Algo, limits: Limits = Limits()) -> list[str]:
    """What the executor would refuse (or mis-run) because of its fixed limits.

    Each entry names the gpu, tb (or channel) and the limit, e.g. ``gpu 3 tb 5 has 71
    steps; the executor allows 64 (MSCCL_MAX_NUM_STEPS, a build option)``. An empty list
    means the file fits. The build-time limits come from ``limits``; the parser's node
    count (4096 per rank), children per element (1024), name length (254), int8 depid and
    int16 offsets are fixed in the executor's sources.
    """
    out: list[str] = []
    if algo.nchannels > limits.max_channels:
        out.append(f"nchannels={algo.nchannels}; the executor allows {limits.max_channels} "
                   "(MAXCHANNELS)")
    if len(algo.name) >= _MAX_STR_LEN:
        out.append(f"the name has {len(algo.name)} characters; the executor's parser reads "
                   f"at most {_MAX_STR_LEN - 1} (MAX_STR_LEN)")
    if algo.ngpus > _MAX_SUBS:
        out.append(f"ngpus={algo.ngpus}; the executor's parser holds at most {_MAX_SUBS} "
                   "children per element (MAX_SUBS)")
    max_tbs = limits.max_tbs_per_channel * limits.max_channels
    for gpu in algo.gpus:
        nodes = 1 + algo.ngpus + len(gpu.tbs) + sum(len(tb.steps) for tb in gpu.tbs)
        if nodes >= MAX_NODES:
            out.append(f"gpu {gpu.id} needs {nodes} XML nodes (algo, {algo.ngpus} gpus, its "
                       f"tbs and steps); the executor's parser holds {MAX_NODES - 1} "
                       "(MAX_NODES)")
        if len(gpu.tbs) > max_tbs:
            out.append(f"gpu {gpu.id} has {len(gpu.tbs)} tbs; the executor allows {max_tbs} "
                       "(MSCCL_MAX_NUM_THREAD_BLOCKS)")
        elif len(gpu.tbs) > _MAX_SUBS:
            out.append(f"gpu {gpu.id} has {len(gpu.tbs)} tbs; the executor's parser holds "
                       f"at most {_MAX_SUBS} children per element (MAX_SUBS)")
        senders: dict[int, int] = {}
        receivers: dict[int, int] = {}
        for tb in gpu.tbs:
            if tb.chan >= limits.max_channels:
                out.append(f"gpu {gpu.id} tb {tb.id} uses channel {tb.chan}; the executor "
                           f"allows channels 0..{limits.max_channels - 1} (MAXCHANNELS)")
            if tb.send >= 0:
                senders[tb.chan] = senders.get(tb.chan, 0) + 1
            if tb.recv >= 0:
                receivers[tb.chan] = receivers.get(tb.chan, 0) + 1
            if len(tb.steps) > limits.max_steps:
                out.append(f"gpu {gpu.id} tb {tb.id} has {len(tb.steps)} steps; the executor "
                           f"allows {limits.max_steps} (MSCCL_MAX_NUM_STEPS, a build option)")
            for st in tb.steps:
                if st.type != "nop" and st.cnt >= limits.max_count:
                    out.append(f"gpu {gpu.id} tb {tb.id} step {st.s} has cnt={st.cnt}; the "
                               f"executor allows at most {limits.max_count - 1} "
                               f"(MSCCL_MAX_COUNT={limits.max_count})")
                if st.depid > _MAX_DEPID:
                    out.append(f"gpu {gpu.id} tb {tb.id} step {st.s} depends on tb "
                               f"{st.depid}; the executor stores depid in an int8 (at most "
                               f"{_MAX_DEPID})")
                if max(st.srcoff, st.dstoff) > _MAX_OFFSET:
                    out.append(f"gpu {gpu.id} tb {tb.id} step {st.s} has an offset above "
                               f"{_MAX_OFFSET}; the executor stores offsets in an int16")
        for role, counts in (("send", senders), ("recv", receivers)):
            for chan, n in sorted(counts.items()):
                if n > limits.max_tbs_per_channel:
                    out.append(f"gpu {gpu.id} channel {chan} has {n} tbs with a {role} "
                               f"peer; the executor allows {limits.max_tbs_per_channel} "
                               "(MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL)")
    return out


# --------------------------------------------------------------------------- checker


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`check_msccl` checked.

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


def check_msccl(algo: Algo, *, capacity: int | None = None) -> CheckReport:
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
        A parsed algorithm (:func:`parse_msccl`); ``coll`` one of :data:`CHECKED`, and
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
        raise ScheduleError(f"{algo.file}: check_msccl checks {', '.join(CHECKED)} "
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
