"""Reading MSCCL XML: what the executor's parser accepts, refused with file, line and element.

:func:`loads_msccl` (text) and :func:`load_msccl` (a file) build an :class:`~.model.Algo`
and refuse what msccl-executor-nccl's parser refuses (``src/misc/msccl/msccl_parser.cc``),
what well-formed XML allows but its hand-written reader does not, and what it would run
differently from what the file says.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import XmlFormatError
from ..xmlfile import Element, parse_xml, read_xml
from .model import (BUFFERS, COLLECTIVES, FINGERPRINT_ATTR, PROTOCOLS, SEGMENTS_ATTR,
                    SERVES_ATTR, STEP_TYPES, Algo, Gpu, Step, ThreadBlock)

__all__ = ["loads_msccl", "load_msccl"]


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
                cluster_fingerprint=root.attrs.get(FINGERPRINT_ATTR, ""),
                segments=root.int(SEGMENTS_ATTR, 1, minimum=1, maximum=nchannels),
                serves=root.attrs.get(SERVES_ATTR, ""))


def loads_msccl(text: str | bytes, file: str = "<string>") -> Algo:
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


def load_msccl(path: str | Path) -> Algo:
    """Read and parse an MSCCL XML file; see :func:`loads_msccl`."""
    root = read_xml(path)
    _check_executor_lexing(Path(path).read_bytes(), str(path))
    return _parse_root(root, str(path))
