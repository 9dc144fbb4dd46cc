"""What the ``nccl`` row is told, as NCCL is told by its environment: the version whose
tables it follows, and ``NCCL_ALGO`` / ``NCCL_PROTO``.

``NCCL_ALGO`` and ``NCCL_PROTO`` are parsed exactly as NCCL parses them
(``src/graph/tuning.cc``, ``parseList``, master 5067397c lines 36-128: the comment
above it gives the examples): ``;``-separated
groups, each an optional function prefix and ``:`` (``allreduce:tree``), then a
``,``-separated list of names (case-insensitive: ``ncclFuncStr``, ``ncclAlgoStr``,
``ncclProtoStr`` in ``src/init.cc:52-55``), a leading ``^`` listing the ones to turn off.
Only the first group may omit the prefix (it applies to every function); a group sets
its function's list anew, so ``ring;allreduce:tree`` is Ring everywhere but Tree for
AllReduce. An unknown name is an error, as in NCCL (``ncclInvalidUsage``).

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

__all__ = ["NcclSettings", "nccl_settings", "current", "parse_list", "FUNCTIONS"]

#: NCCL's function names (``ncclFuncStr``, src/init.cc:52) and topoplan's for each.
FUNCTIONS = {"Broadcast": "broadcast", "Reduce": "reduce", "AllGather": "allgather",
             "ReduceScatter": "reduce_scatter", "AllReduce": "allreduce"}

#: An element NCCL enables by default only where its hardware rules allow (LL128:
#: ``protoEnable = 2``, tuning.cc:446); listing it turns it on unconditionally.
DEFAULT, OFF, ON = 2, 0, 1


def parse_list(text: str, names: tuple[str, ...], what: str) -> dict[str, tuple[int, ...]]:
    """``NCCL_ALGO``/``NCCL_PROTO`` text to a mask per collective (topoplan's names):
    for each of ``names`` :data:`ON`, :data:`OFF`, or :data:`DEFAULT` (not mentioned).

    Raises
    ------
    ValueError
        Naming the bad token and the valid names, for an unknown name or function, an
        empty list, or a group after the first without a function prefix.
    """
    masks = {coll: [DEFAULT] * len(names) for coll in FUNCTIONS.values()}
    groups = str(text).split(";")
    if not str(text).strip():
        raise ValueError(f"{what}: empty; give names such as {', '.join(names)}")
    for index, group in enumerate(groups):
        prefix, sep, elements = group.partition(":")
        if not sep:
            if index > 0:
                raise ValueError(f"{what}={text!r}: every entry but the first needs a function "
                                 f"prefix, as in 'allreduce:{group}' (NCCL: 'All entries except "
                                 f"the first must have a prefix')")
            prefix, elements = "", group
        prefix, elements = prefix.strip(), elements.strip()
        off = elements.startswith("^")
        elements = elements[1:] if off else elements
        targets = list(FUNCTIONS.values())
        if prefix:
            found = [coll for name, coll in FUNCTIONS.items()
                     if prefix.lower() in (name.lower(), coll.replace("_", ""), coll)]
            if not found:
                raise ValueError(f"{what}={text!r}: unknown function {prefix!r}; use one of "
                                 f"{', '.join(FUNCTIONS)}")
            targets = found
        chosen = []
        for token in (t.strip() for t in elements.split(",")):
            match = next((k for k, name in enumerate(names)
                          if token.lower() == name.lower()), None)
            if match is None:
                raise ValueError(f"{what}={text!r}: unknown name {token!r}; use one of "
                                 f"{', '.join(names)}, comma-separated, '^' before the list "
                                 f"to turn them off")
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


@contextlib.contextmanager
def nccl_settings(version: str | None = None, algo: str | None = None,
                  proto: str | None = None) -> Iterator[NcclSettings]:
    """Price every ``nccl`` row inside with NCCL ``version``'s tables and ``NCCL_ALGO`` /
    ``NCCL_PROTO`` set as given (``None`` keeps the enclosing setting).

    Raises
    ------
    ValueError
        For an unknown version, algorithm, protocol or function (before anything runs).
    """
    outer = current()
    settings = NcclSettings(version if version is not None else outer.version,
                            algo if algo is not None else outer.algo,
                            proto if proto is not None else outer.proto)
    token = _SETTINGS.set(settings)
    try:
        yield settings
    finally:
        _SETTINGS.reset(token)
