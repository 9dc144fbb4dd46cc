"""What the ``nccl`` row is told, as NCCL is told by its environment: the version whose
tables it follows, and ``NCCL_ALGO`` / ``NCCL_PROTO``.

``NCCL_ALGO`` and ``NCCL_PROTO`` are parsed exactly as NCCL parses them
(``src/graph/tuning.cc``, ``parseList``, master 5067397c lines 36-136: the comment
above it gives the examples; tuning.cc:440-461 sets the defaults and calls it; the
tests check :func:`parse_list` against it transcribed char by char): ``;``-separated
groups, each an optional function prefix and ``:`` (``allreduce:tree``), then a
``,``-separated list of names (case-insensitive: ``ncclFuncStr``, ``ncclAlgoStr``,
``ncclProtoStr`` in ``src/init.cc:52-55``), a leading ``^`` listing the ones to turn off.
Only the first group may omit the prefix (it applies to every function); a group sets
its function's list anew, so ``ring;allreduce:tree`` is Ring everywhere but Tree for
AllReduce. An unknown name is an error, as in NCCL (``ncclInvalidUsage``); so is a
space (NCCL keeps it: `` ring`` is no name).

The settings reach every ``nccl`` price, the row and a composed plan's native steps, by
:func:`nccl_settings` (a context) or the arguments of
:func:`~topoplan.analysis.native.nccl.nccl_model`::

    with nccl_settings(algo="ring", proto="simple"):
        topoplan.plan(cluster, size=1 << 30)      # the nccl row runs Ring/Simple
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator

from . import nccl_tables as T

__all__ = ["NcclSettings", "nccl_settings", "current", "resolved", "parse_list", "FUNCTIONS"]

#: NCCL's function names (``ncclFuncStr``, src/init.cc:52) and topoplan's for each.
FUNCTIONS = {"Broadcast": "broadcast", "Reduce": "reduce", "AllGather": "allgather",
             "ReduceScatter": "reduce_scatter", "AllReduce": "allreduce"}

#: An element NCCL enables by default only where its hardware rules allow (LL128:
#: ``protoEnable = 2``, tuning.cc:446); listing it turns it on unconditionally.
DEFAULT, OFF, ON = 2, 0, 1


def _tokens(text: str, delimiters: str) -> list[tuple[int, str]]:
    """What ``strtok_r`` cuts ``text`` into: the non-empty runs between delimiters, each
    with its offset (a run of delimiters is one cut, and none is a token)."""
    out, start = [], 0
    for k, char in enumerate(text + delimiters[0]):
        if char in delimiters:
            if k > start:
                out.append((start, text[start:k]))
            start = k + 1
    return out


def parse_list(text: str, names: tuple[str, ...], what: str) -> dict[str, tuple[int, ...]]:
    """``NCCL_ALGO``/``NCCL_PROTO`` text to a mask per collective (topoplan's names):
    for each of ``names`` :data:`ON`, :data:`OFF`, or :data:`DEFAULT` (not mentioned).

    As ``parseList`` (tuning.cc:55-130, master 5067397c), whose ``strtok_r`` makes empty
    pieces vanish (``ring,,tree;`` is ``ring,tree``), keeps spaces (`` ring`` is no name),
    reads a group's first two ``:``-pieces (``allreduce:tree:x`` is ``allreduce:tree``; a
    group of one piece has no prefix, ``:ring`` too), and takes ``^`` alone as "turn
    nothing off" (everything on, LL128 listed). Two liberties: a function may also be
    named as topoplan names it (``reduce_scatter``), and text with no group at all (``""``,
    ``";"``), which NCCL ignores, is an error here, as forcing nothing is likely a slip.

    Raises
    ------
    ValueError
        Naming the bad token and the valid names, for an unknown name or function, a
        group after the first without a function prefix, or no group at all.
    """
    text = str(text)
    masks = {coll: [DEFAULT] * len(names) for coll in FUNCTIONS.values()}
    groups = _tokens(text, ";")
    if not groups:
        raise ValueError(f"{what}={text!r}: empty, forcing nothing; give names such as "
                         f"{', '.join(names)}")
    for offset, group in groups:
        pieces = [piece for _, piece in _tokens(group, ":")]
        if not pieces:   # NCCL reads a NULL list here
            raise ValueError(f"{what}={text!r}: {group!r} names neither a function nor "
                             f"anything to run")
        prefix, elements = (pieces[0], pieces[1]) if len(pieces) > 1 else (None, pieces[0])
        if prefix is None and offset != 0:
            raise ValueError(f"{what}={text!r}: every entry but the first needs a function "
                             f"prefix, as in 'allreduce:{elements}' (NCCL: 'All entries "
                             f"except the first must have a prefix')")
        off = elements.startswith("^")
        elements = elements[1:] if off else elements
        targets = list(FUNCTIONS.values())
        if prefix is not None:
            targets = [coll for name, coll in FUNCTIONS.items()
                       if prefix.lower() in (name.lower(), coll)]
            if not targets:
                raise ValueError(f"{what}={text!r}: unknown function {prefix!r}; use one of "
                                 f"{', '.join(FUNCTIONS)}")
        chosen = []
        for _, token in _tokens(elements, ","):
            match = next((k for k, name in enumerate(names)
                          if token.lower() == name.lower()), None)
            if match is None:
                spaces = " (NCCL keeps spaces)" if token != token.strip() else ""
                raise ValueError(f"{what}={text!r}: unknown name {token!r}{spaces}; use one "
                                 f"of {', '.join(names)}, comma-separated, '^' before the "
                                 f"list to turn them off")
            chosen.append(match)
        for coll in targets:  # '^a,b': everything but a and b; 'a,b': only a and b
            masks[coll] = [(OFF if k in chosen else ON) if off else (ON if k in chosen else OFF)
                           for k in range(len(names))]
    return {coll: tuple(mask) for coll, mask in masks.items()}


@dataclass(frozen=True)
class NcclSettings:
    """The version the model follows (``None``: the default) and the ``NCCL_ALGO`` /
    ``NCCL_PROTO`` it is forced with (``None``: NCCL's own choice)."""

    version: str | None = None
    algo: str | None = None
    proto: str | None = None

    def __post_init__(self) -> None:
        if self.version is not None:
            T.constants(self.version)
        if self.algo is not None:
            parse_list(self.algo, T.ALGORITHM_NAMES, "NCCL_ALGO")
        if self.proto is not None:
            parse_list(self.proto, T.PROTOCOL_NAMES, "NCCL_PROTO")

    @property
    def forced(self) -> str:
        """``NCCL_ALGO=ring NCCL_PROTO=simple`` (what was set), or ``""``."""
        return " ".join(f"{name}={value}" for name, value in
                        (("NCCL_ALGO", self.algo), ("NCCL_PROTO", self.proto)) if value)

    def masks(self) -> tuple[dict[str, tuple[int, ...]] | None,
                             dict[str, tuple[int, ...]] | None]:
        """The algorithm and protocol masks (:func:`parse_list`), ``None`` where unset."""
        return (None if self.algo is None else parse_list(self.algo, T.ALGORITHM_NAMES,
                                                          "NCCL_ALGO"),
                None if self.proto is None else parse_list(self.proto, T.PROTOCOL_NAMES,
                                                           "NCCL_PROTO"))


_SETTINGS: contextvars.ContextVar[NcclSettings] = contextvars.ContextVar(
    "topoplan_nccl_settings", default=NcclSettings())


def current() -> NcclSettings:
    """The settings in force (the innermost :func:`nccl_settings`)."""
    return _SETTINGS.get()


def resolved(version: str | None = None, algo: str | None = None,
             proto: str | None = None) -> NcclSettings:
    """The settings in force with these in place of the enclosing ones (``None`` keeps
    the enclosing one), checked.

    Raises
    ------
    ValueError
        For an unknown version, algorithm, protocol or function.
    """
    outer = current()
    return NcclSettings(version if version is not None else outer.version,
                        algo if algo is not None else outer.algo,
                        proto if proto is not None else outer.proto)


def nccl_settings(version: str | None = None, algo: str | None = None,
                  proto: str | None = None) -> contextlib.AbstractContextManager[NcclSettings]:
    """Price every ``nccl`` row inside with NCCL ``version``'s tables and ``NCCL_ALGO`` /
    ``NCCL_PROTO`` set as given (``None`` keeps the enclosing setting); with none given,
    the enclosing settings unchanged.

    Raises
    ------
    ValueError
        For an unknown version, algorithm, protocol or function: when called, before the
        block runs.
    """
    return _in_force(resolved(version, algo, proto))


@contextlib.contextmanager
def _in_force(settings: NcclSettings) -> Iterator[NcclSettings]:
    token = _SETTINGS.set(settings)
    try:
        yield settings
    finally:
        _SETTINGS.reset(token)
