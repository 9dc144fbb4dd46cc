"""Reading a schedule's JSON (docs/SCHEDULE.md): every field checked, every error placed.

:func:`load_schedule` reads a file, :func:`loads_schedule` text and
:func:`schedule_from_dict` a parsed JSON object; each checks the format, the version
and, per rank, step and op, what the version allows, and raises
:class:`~topoplan.errors.ScheduleError` naming the place:
``plan.json: ranks[2].steps[0][1]: peer 9 out of range(8)``. Writing is the IR's own:
:meth:`Schedule.to_json <topoplan.ir.schedule.Schedule.to_json>` and
:meth:`Schedule.save <topoplan.ir.schedule.Schedule.save>`.
"""

from __future__ import annotations

import json
import math
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from ..errors import ScheduleError
from .collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE, shard_chunks
from .schedule import (FORMAT, VERSIONS, Native, NativeKind, Op, OpKind, RankProgram, Schedule,
                       Step, chunk_text, recv_clash)

__all__ = ["load_schedule", "loads_schedule", "schedule_from_dict", "FRACTION_TOLERANCE"]

#: How far from 1 the chunks' fractions may sum.
FRACTION_TOLERANCE = 1e-9


def load_schedule(path: str | os.PathLike) -> Schedule:
    """Read and validate a schedule JSON file.

    Raises
    ------
    ScheduleError
        If the file is unreadable or breaks the format (unknown op, chunk out of range,
        fractions not summing to 1, ...), naming the place: ``plan.json: ranks[2].steps[0][1]: ...``.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"{source}: cannot read schedule: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = Path(path).read_bytes().count(b"\n", 0, exc.start) + 1
        raise ScheduleError(f"{source}:{line}: not a text file (UTF-8 expected, byte "
                            f"0x{exc.object[exc.start]:02x})") from None
    return loads_schedule(text, source)


def loads_schedule(text: str, source: str = "<string>") -> Schedule:
    """Parse schedule JSON text; see :func:`load_schedule`."""
    if not text.strip():
        raise ScheduleError(f"{source}: empty file; a schedule is a JSON object "
                            "(topoplan plan CLUSTER.yaml -o PLAN.json writes one)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if _CLUSTER_KEY.search(text):
            raise ScheduleError(f"{source}: looks like a cluster YAML file; a schedule JSON "
                                f"is wanted here (topoplan plan {source} -o PLAN.json writes "
                                "one)") from None
        raise ScheduleError(f"{source}:{exc.lineno}: {_json_problem(text, exc)}") from None
    except RecursionError:
        raise ScheduleError(f"{source}: not a schedule: JSON nested too deeply") from None
    return schedule_from_dict(data, source)


#: A top-level key of a cluster file (docs/CLUSTER.md) at the start of a line.
_CLUSTER_KEY = re.compile(r"^(?:boxes|switches)\s*:", re.M)


def _json_problem(text: str, exc: json.JSONDecodeError) -> str:
    """json's message as a whole sentence, saying when the text stops too early."""
    # Some of json's messages end in "at" and expect the position after them.
    reason = exc.msg.removesuffix(" at")
    message = f"not valid JSON: {reason[:1].lower()}{reason[1:]} at column {exc.colno}"
    if _ends_open(text):
        message += "; the text ends before its brackets close: a truncated file?"
    return message


def _ends_open(text: str) -> bool:
    """Whether ``text`` ends inside a string or an unclosed ``[`` or ``{``."""
    depth, in_string, escaped = 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    return in_string or depth > 0


def schedule_from_dict(data: Any, source: str = "<schedule>") -> Schedule:
    """A schedule from its parsed JSON object (``json.load`` of a schedule file).

    Raises
    ------
    ScheduleError
        As :func:`load_schedule` does, ``source`` naming the object in messages.
    """
    def fail(where: str, message: str) -> ScheduleError:
        return ScheduleError(f"{source}: {where}: {message}" if where else f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail("", f"a schedule is a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
    version = data.get("version")
    if isinstance(version, bool) or version not in VERSIONS:
        raise fail("version", f"this topoplan reads versions 1 to 4, got {version!r}")
    collective = data.get("collective", DEFAULT_COLLECTIVE)
    if not isinstance(collective, str) or collective not in COLLECTIVES:
        known = ", ".join(repr(name) for name in COLLECTIVES)
        raise fail("collective", f"expected one of {known}, got {collective!r}")
    nranks = data.get("nranks")
    if isinstance(nranks, bool) or not isinstance(nranks, int) or nranks < 1:
        raise fail("nranks", f"expected an integer >= 1, got {nranks!r}")

    chunks = data.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise fail("chunks", "expected a non-empty list of fractions")
    for k, c in enumerate(chunks):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not c > 0:
            raise fail(f"chunks[{k}]", f"fractions must be positive numbers, got {c!r}")
    try:
        total = math.fsum(chunks)
    except OverflowError:  # an integer beyond any float
        total = math.inf
    if abs(total - 1.0) > FRACTION_TOLERANCE:
        raise fail("chunks", f"fractions must sum to 1, got {total!r}")
    nchunks = len(chunks)

    ranks = data.get("ranks")
    if not isinstance(ranks, list) or len(ranks) != nranks:
        got = len(ranks) if isinstance(ranks, list) else type(ranks).__name__
        raise fail("ranks", f"expected a list of {nranks} rank programs, got {got}")
    programs: list[RankProgram | None] = [None] * nranks
    for i, entry in enumerate(ranks):
        where = f"ranks[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, "expected an object with rank and steps")
        rank = entry.get("rank", i)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nranks:
            raise fail(f"{where}.rank", f"expected a rank in range({nranks}), got {rank!r}")
        if programs[rank] is not None:
            raise fail(f"{where}.rank", f"rank {rank} appears twice")
        steps = entry.get("steps")
        if not isinstance(steps, list):
            raise fail(f"{where}.steps", "expected a list of steps")
        parsed_steps = []
        for s, step in enumerate(steps):
            if not isinstance(step, list):
                raise fail(f"{where}.steps[{s}]", "a step is a list of ops")
            parsed_steps.append(_parse_step(step, rank, nranks, nchunks, version,
                                            lambda j, m, s=s: fail(f"{where}.steps[{s}][{j}]", m),
                                            lambda m, s=s: fail(f"{where}.steps[{s}]", m)))
        programs[rank] = RankProgram(rank, tuple(parsed_steps))
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise fail("meta", "expected an object")
    if COLLECTIVES[collective].sharded:
        try:
            shard_chunks(nranks, chunks, collective)
        except ScheduleError as exc:
            raise fail("chunks", str(exc)) from None
    return Schedule(nranks=nranks, chunks=tuple(float(c) for c in chunks),
                    ranks=tuple(p for p in programs if p is not None), collective=collective,
                    meta=meta)


_OPS = {"send": OpKind.SEND, "recv": OpKind.RECV}
_NATIVE = {kind.value: kind for kind in NativeKind}


def _parse_native(raw: dict, rank: int, nranks: int, nchunks: int, version: int,
                  fail) -> Native:
    kind = _NATIVE[raw["op"]]
    if version < 3:
        raise fail(f"a native {kind.value} needs \"version\": 3")
    group: Any = raw.get("group")
    if isinstance(group, str):  # "first..last": consecutive ranks, one tuple for all
        first, last = _group_range(group, nranks, fail)
        if not first <= rank <= last:
            raise fail(f"rank {rank} runs a native {kind.value} over group {group} it is "
                       "not in")
        group = _range_tuple(first, last)
    else:
        if (not isinstance(group, list) or len(group) < 1
                or any(isinstance(m, bool) or not isinstance(m, int) for m in group)):
            raise fail(f"group must be a non-empty list of ranks or a range "
                       f"'first..last', got {group!r}")
        outside = [m for m in group if not 0 <= m < nranks]
        if outside:
            raise fail(f"group names rank {outside[0]}, outside range({nranks})")
        if len(set(group)) != len(group):
            twice = next(m for m in group if group.count(m) > 1)
            raise fail(f"group names rank {twice} twice")
        if rank not in group:
            raise fail(f"rank {rank} runs a native {kind.value} over group {group} it is "
                       "not in")
    chunk, count = raw.get("chunk"), raw.get("count", 1)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < nchunks:
        raise fail(f"chunk {chunk!r} out of range({nchunks})")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise fail(f"count must be an integer >= 1, got {count!r}")
    if chunk + count > nchunks:
        raise fail(f"{chunk_text(chunk, count)} run past the last chunk {nchunks - 1}")
    if kind.parted and count % len(group):
        raise fail(f"a native {kind.value} over {len(group)} ranks cuts its range into "
                   f"{len(group)} equal parts: count {count} is not a multiple of {len(group)}")
    root = raw.get("root")
    if kind.rooted:
        if isinstance(root, bool) or not isinstance(root, int) or root not in group:
            raise fail(f"a native {kind.value} needs a root in its group {group}, "
                       f"got {root!r}")
    elif root is not None:
        raise fail(f"a native {kind.value} has no root (got root {root!r})")
    return Native(kind, tuple(group), chunk, count, root)


_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def _group_range(text: str, nranks: int, fail: Callable[[str], Exception]) -> tuple[int, int]:
    """``(first, last)`` of a group written ``"first..last"``, checked."""
    found = _RANGE.fullmatch(text)
    if found is None:
        raise fail(f"group must be a non-empty list of ranks or a range 'first..last', "
                   f"got {text!r}")
    first, last = int(found[1]), int(found[2])
    if first > last:
        raise fail(f"group {text!r}: the first rank is after the last")
    if last >= nranks:
        raise fail(f"group names rank {last}, outside range({nranks})")
    return first, last


@lru_cache(maxsize=16)
def _range_tuple(first: int, last: int) -> tuple[int, ...]:
    """The group ``first..last`` as one tuple shared by every member's op (a group over
    16384 ranks once, not 16384 times)."""
    return tuple(range(first, last + 1))


def _parse_step(step: list, rank: int, nranks: int, nchunks: int, version: int, fail_op,
                fail_step) -> Step:
    ops: list[Op | Native] = []
    received: list[tuple[int, int, bool]] = []
    for j, raw in enumerate(step):
        if not isinstance(raw, dict):
            raise fail_op(j, "an op is an object with op, peer and chunk")
        if not isinstance(raw.get("op"), str):  # a list or an object is no op's name
            raise fail_op(j, f"unknown op {raw.get('op')!r}; expected 'send', 'recv' or a "
                             f"native collective ({', '.join(map(repr, _NATIVE))})")
        if raw.get("op") in _NATIVE:
            if len(step) != 1:
                raise fail_step(f"a native {raw.get('op')} stands alone in its step; this "
                                f"step has {len(step)} ops")
            ops.append(_parse_native(raw, rank, nranks, nchunks, version,
                                     lambda m, j=j: fail_op(j, m)))
            continue
        kind = _OPS.get(raw.get("op"))  # type: ignore[arg-type]
        if kind is None:
            raise fail_op(j, f"unknown op {raw.get('op')!r}; expected 'send', 'recv' or a "
                             f"native collective ({', '.join(map(repr, _NATIVE))})")
        peer, chunk = raw.get("peer"), raw.get("chunk")
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < nranks:
            raise fail_op(j, f"peer {peer!r} out of range({nranks})")
        if peer == rank:
            raise fail_op(j, f"rank {rank} names itself as peer")
        more: tuple[tuple[int, int], ...] = ()
        if "ranges" in raw:
            chunk, count, more = _parse_ranges(raw, nchunks, version,
                                               lambda m, j=j: fail_op(j, m))
        elif isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < nchunks:
            raise fail_op(j, f"chunk {chunk!r} out of range({nchunks})")
        else:
            count = raw.get("count", 1)
            if "count" in raw and version < 2:
                raise fail_op(j, "count (a chunk range) needs \"version\": 2")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise fail_op(j, f"count must be an integer >= 1, got {count!r}")
            if chunk + count > nchunks:
                raise fail_op(j, f"{chunk_text(chunk, count)} run past the last chunk "
                                 f"{nchunks - 1}")
        reduce = raw.get("reduce", False)
        if not isinstance(reduce, bool):
            raise fail_op(j, f"reduce must be true or false, got {reduce!r}")
        channel = raw.get("channel", 0)
        if "channel" in raw and version < 4:
            raise fail_op(j, "channel needs \"version\": 4")
        if isinstance(channel, bool) or not isinstance(channel, int) or channel < 0:
            raise fail_op(j, f"channel must be an integer >= 0, got {channel!r}")
        op = Op(kind, peer, chunk, reduce if kind is OpKind.RECV else False, count, channel,
                more)
        if kind is OpKind.RECV:
            received.extend((a, a + c, reduce) for a, c in op.ranges)
        ops.append(op)
    # Version 1 allows one recv per chunk in a step; version 2 lets reducing recvs
    # share a chunk (they all add).
    clash = recv_clash(received if version >= 2 else [(a, b, False) for a, b, _ in received])
    if clash is not None:
        v2_ok = version < 2 and recv_clash(received) is None
        raise fail_step(f"two recvs into chunk {clash} in one step"
                        + (" (several reducing recvs need version 2)" if v2_ok else ""))
    return tuple(ops)


def _parse_ranges(raw: dict, nchunks: int, version: int,
                  fail) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """An op's ``"ranges"`` (a vectored message, IR v4): its first chunk and count and
    the ranges after them."""
    if "chunk" in raw or "count" in raw:
        raise fail("give either ranges or chunk (and count), not both")
    if version < 4:
        raise fail("ranges (a vectored message) need \"version\": 4")
    ranges = raw["ranges"]
    if (not isinstance(ranges, list) or not ranges
            or any(not isinstance(r, list) or len(r) != 2
                   or any(isinstance(x, bool) or not isinstance(x, int) for x in r)
                   for r in ranges)):
        raise fail(f"ranges must be a non-empty list of [chunk, count] pairs of integers, "
                   f"got {ranges!r}")
    end = 0
    for k, (a, c) in enumerate(ranges):
        if not 0 <= a < nchunks:
            raise fail(f"ranges[{k}]: chunk {a} out of range({nchunks})")
        if c < 1:
            raise fail(f"ranges[{k}]: count must be >= 1, got {c}")
        if a + c > nchunks:
            raise fail(f"ranges[{k}]: {chunk_text(a, c)} run past the last chunk "
                       f"{nchunks - 1}")
        if k and a < end:
            raise fail(f"ranges[{k}]: {chunk_text(a, c)} starts before the end of the range "
                       f"before it ({chunk_text(*ranges[k - 1])}); ranges are disjoint and "
                       "in increasing chunk order")
        end = a + c
    return ranges[0][0], ranges[0][1], tuple((a, c) for a, c in ranges[1:])
