"""The configuration file of NCCL's example tuner plugin, from the NCCL model.

NVIDIA/nccl ``plugins/tuner/example`` (built as ``libnccl-tuner-example.so``, loaded
with ``NCCL_TUNER_PLUGIN``) reads a CSV file (``NCCL_TUNER_CONFIG_FILE``, default
``nccl_tuner.conf``), one rule per line::

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks

``collective_type`` is ``allreduce``, ``allgather``, ``reducescatter`` (also
``broadcast``, ``reduce``); ``algorithm`` one of ``tree``, ``ring``,
``collnet_direct``, ``collnet_chain``, ``nvls``, ``nvls_tree``, ``pat``; ``protocol``
``ll``, ``ll128`` or ``simple``; ``channels`` a count or ``-1`` (NCCL's default);
``nNodes`` and ``nRanks`` the communicator it applies to (``-1``: any). Byte ranges are
inclusive; ``0`` to ``4294967295`` covers every size. Lines starting with ``#`` are
comments (the plugin's README).

:func:`tuner_config` writes, per collective, contiguous size ranges from 0 to
4294967295 with the algorithm, protocol and channels that the model prices fastest on
the cluster's real fabric (:meth:`~topoplan.analysis.native.nccl.NcclModel.best`), for this
cluster's node and rank counts. ``channels`` is the model's count where it is one count
over the whole range, else ``-1``: NCCL's own rule, which adds channels as the size
grows and which the model follows. Where that differs from what NCCL's own fabric-blind
tuner would pick (:meth:`~topoplan.analysis.native.nccl.NcclModel.choose`), a comment above the
rule says so, with both predicted times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..analysis.native import nccl_tables as T
from ..analysis.native.nccl import NcclChoice, nccl_model
from ..units import plural

if TYPE_CHECKING:
    from ..cluster import Cluster

__all__ = ["TunerRule", "tuner_rules", "tuner_config", "MAX_BYTES", "COLLECTIVE_NAMES",
           "FIELDS"]

#: The plugin's "covers all sizes" maximum (its README).
MAX_BYTES = 4294967295
#: topoplan's collective names -> the plugin's ``collective_type``.
COLLECTIVE_NAMES = {"allreduce": "allreduce", "allgather": "allgather",
                    "reduce_scatter": "reducescatter"}
FIELDS = ("collective_type", "min_bytes", "max_bytes", "algorithm", "protocol", "channels",
          "nNodes", "nRanks")


@dataclass(frozen=True)
class TunerRule:
    """One line of the file, and why."""

    collective: str
    min_bytes: int
    max_bytes: int
    choice: NcclChoice   # what the line tells NCCL to run (priced mid-range)
    nccl: NcclChoice     # what NCCL's own tuner picks there
    channels: int = -1   # the channel count, or -1 where it grows with the size

    @property
    def overrides(self) -> bool:
        """Whether the rule differs from NCCL's own choice (algorithm or protocol)."""
        return (self.choice.algorithm, self.choice.protocol) != (self.nccl.algorithm,
                                                               self.nccl.protocol)

    def line(self, nnodes: int, nranks: int) -> str:
        a = T.ALGORITHM_NAMES.index(self.choice.algorithm)
        p = T.PROTOCOL_NAMES.index(self.choice.protocol)
        return ",".join(str(x) for x in (COLLECTIVE_NAMES[self.collective], self.min_bytes,
                                         self.max_bytes, T.TUNER_NAMES[a],
                                         T.TUNER_PROTOCOLS[p], self.channels, nnodes,
                                         nranks))


def _key(choice: NcclChoice) -> tuple[str, str]:
    return choice.algorithm, choice.protocol


def _ranges(pick: Callable[[int], NcclChoice], low: int, high: int
            ) -> list[tuple[int, int, NcclChoice]]:
    """Contiguous ``[lo, hi]`` ranges over ``low .. high`` with one choice each: the
    choice is sampled at every power of two, and where it changes between two samples,
    the first size of the new choice is found by bisection."""
    points = sorted({low, high} | {1 << k for k in range(33) if low < (1 << k) < high})
    out: list[tuple[int, int, NcclChoice]] = []
    start, current, prev = low, pick(low), low
    for point in points[1:]:
        while _key(pick(point)) != _key(current):
            a, b = prev, point  # pick(a) is `current`, pick(b) is not
            while b - a > 1:
                mid = (a + b) // 2
                if _key(pick(mid)) == _key(current):
                    a = mid
                else:
                    b = mid
            out.append((start, b - 1, current))
            start, current, prev = b, pick(b), b
        prev = point
    out.append((start, high, current))
    return out


def tuner_rules(cluster: Cluster, collectives: tuple[str, ...] = ("allreduce", "allgather",
                                                                   "reduce_scatter")
                ) -> list[TunerRule]:
    """The rules of :func:`tuner_config`, contiguous per collective from 0 to
    :data:`MAX_BYTES`."""
    model = nccl_model(cluster)
    rules: list[TunerRule] = []
    for collective in collectives:
        cache: dict[int, NcclChoice] = {}

        def best(size: int, collective: str = collective) -> NcclChoice:
            if size not in cache:
                cache[size] = model.best(collective, max(size, 1))
            return cache[size]

        for lo, hi, choice in _ranges(best, 0, MAX_BYTES):
            # NCCL adds channels as the size grows (enqueue.cc); the model follows the same
            # rule, so a range whose count changes keeps NCCL's default (-1).
            top = model.best(collective, hi)
            channels = choice.channels if top.channels == choice.channels else -1
            # Compared with NCCL's own choice in the middle of the range (geometric, at
            # most 1 GiB), away from the edges where the two are equal.
            middle = min(int(math.sqrt(max(lo, 1) * hi)), 1 << 30)
            rules.append(TunerRule(collective, lo, hi, model.best(collective, middle),
                                   model.choose(collective, middle), channels))
    return rules


def tuner_config(cluster: Cluster, command: str | None = None) -> str:
    """The plugin's configuration file for ``cluster`` (see the module docstring)."""
    model = nccl_model(cluster)
    nnodes, nranks = model.nnodes, model.nranks
    out = [f"# NCCL example tuner plugin rules for cluster {cluster.name!r}: {nranks} ranks "
           f"on {nnodes} nodes",
           "# Written by topoplan" + (f" ({command})" if command else "")
           + " from its model of NCCL (docs/NCCL_MODEL.md):",
           "# per size range, the algorithm, protocol and channels fastest on this fabric.",
           "# Use: NCCL_TUNER_PLUGIN=libnccl-tuner-example.so NCCL_TUNER_CONFIG_FILE=<this file>",
           "# " + ",".join(FIELDS)]
    if model.assumed_gpu:
        out.append("# note: the cluster file names no GPU model for some boxes; NCCL's "
                   "A100 (Ampere) tables were used")
    differ = 0
    for rule in tuner_rules(cluster):
        if rule.overrides:
            differ += 1
            out.append(
                f"# fabric-aware: at {rule.choice.size} B NCCL's own tuner picks "
                f"{rule.nccl.algorithm}/{rule.nccl.protocol}, {rule.nccl.time_s * 1e6:.1f} us "
                f"on this fabric; {rule.choice.algorithm}/{rule.choice.protocol} takes "
                f"{rule.choice.time_s * 1e6:.1f} us ({rule.nccl.time_s / rule.choice.time_s:.2f}x)")
        out.append(rule.line(nnodes, nranks))
    out.insert(5, f"# {plural(differ, 'rule differs', 'rules differ')} from NCCL's own choice"
               if differ else
               "# every rule is what NCCL's own tuner would pick on this cluster")
    return "\n".join(out) + "\n"
