"""The MSCCL executor's compile-time and parser limits, and what in an algorithm exceeds them.

References
----------
- Azure/msccl-executor-nccl: ``src/include/msccl/msccl_struct.h`` and
  ``makefiles/common.mk`` (the build options), ``src/include/msccl/msccl_parser.h`` (the
  parser's fixed sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import Algo

__all__ = ["Limits", "limit_violations", "MAX_NODES"]


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
