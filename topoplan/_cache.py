"""A cache of values computed once per live object, keyed by identity."""

from __future__ import annotations

import weakref
from typing import Callable, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["ObjectCache"]


class ObjectCache(Generic[K, V]):
    """``compute(obj)``, computed once per live object and keyed by identity.

    An entry goes away with its object (``weakref.finalize``), so the cache never keeps
    an object alive; values must not refer back to their object. It suits objects that
    are slow to hash (a schedule of millions of ops, a frozen cluster of a thousand
    boxes): the simulator's flattened schedules and the bound's bottleneck cuts.
    """

    def __init__(self, compute: Callable[[K], V]) -> None:
        self._compute = compute
        self._values: dict[int, V] = {}

    def __call__(self, obj: K) -> V:
        key = id(obj)
        try:
            return self._values[key]
        except KeyError:
            pass
        value = self._compute(obj)
        self._values[key] = value
        weakref.finalize(obj, self._values.pop, key, None)
        return value

    def __len__(self) -> int:
        return len(self._values)
