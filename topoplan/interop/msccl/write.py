"""Writing MSCCL XML in the form the executor's hand-written parser reads."""

from __future__ import annotations

from ...errors import XmlFormatError
from .model import FINGERPRINT_ATTR, SEGMENTS_ATTR, SERVES_ATTR, Algo

__all__ = ["to_xml"]


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
    tabs between attributes nor a declaration). ``loads_msccl(to_xml(a)) == a``.
    """
    out = [f'<algo name="{_attr_value(algo.name, "name", algo.file)}" proto="{algo.proto}" '
           f'nchannels="{algo.nchannels}" nchunksperloop="{algo.nchunksperloop}" '
           f'ngpus="{algo.ngpus}" coll="{_attr_value(algo.coll, "coll", algo.file)}" '
           f'inplace="{int(algo.inplace)}" outofplace="{int(algo.outofplace)}" '
           f'minBytes="{algo.min_bytes}" maxBytes="{algo.max_bytes}"']
    if algo.cluster_fingerprint:
        value = _attr_value(algo.cluster_fingerprint, FINGERPRINT_ATTR, algo.file)
        out[0] += f' {FINGERPRINT_ATTR}="{value}"'
    if algo.segments != 1:
        out[0] += f' {SEGMENTS_ATTR}="{algo.segments}"'
    if algo.serves:
        out[0] += f' {SERVES_ATTR}="{_attr_value(algo.serves, SERVES_ATTR, algo.file)}"'
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
