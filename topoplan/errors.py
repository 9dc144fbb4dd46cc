"""The exception tree. Every error a user can cause is a :class:`TopoplanError`.

- :class:`SpecError`: a YAML or XML input is malformed (:class:`ClusterSpecError`,
  :class:`ProfileError`, :class:`XmlFormatError`);
- :class:`ScheduleError`: a schedule is malformed or is not an allreduce;
- :class:`PlannerError`: a planner was asked for something it cannot do;
- :class:`InfeasiblePlanError`: no schedule exists under the constraints given;
- :class:`TransportError`: a transfer failed or timed out while running;
- :class:`EstimateError`: the training estimator lacks or refuses an input.

The CLI turns any of them into ``topoplan: error: <message>`` and a non-zero
exit; the library never prints or exits on user input.

Input that is read but may not mean what its author meant is a warning, issued with
:mod:`warnings` so that callers can filter it (:class:`TopoplanWarning`, and under it
:class:`UnitWarning`); the CLI prints each as ``topoplan: warning: <message>``.
"""

from __future__ import annotations


class TopoplanError(Exception):
    """Base class of every error topoplan raises for bad input or a failed run."""


class SpecError(TopoplanError, ValueError):
    """A YAML input file (cluster, cost profile) is malformed; names file, line and key.

    The message reads ``FILE:LINE: KEY: what is wrong``.
    """

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file, self.line, self.key, self.reason = file, line, key, message
        super().__init__(_where(file, line, key) + message)


def _where(file: str | None, line: int | None, key: str | None) -> str:
    """``FILE:LINE: KEY: `` (the parts known), the prefix of spec errors and warnings."""
    where = ""
    if file is not None:
        where = f"{file}:{line}: " if line is not None else f"{file}: "
    if key:
        # a key as written may hold what YAML reads as a line break (U+0085, U+2028):
        # shown escaped, so that the error stays one line
        shown = key if key.isprintable() else key.encode("unicode_escape").decode("ascii")
        where += f"{shown}: "
    return where


class ClusterSpecError(SpecError):
    """A cluster YAML file is malformed; the message names file, line and key.

    The message reads ``cluster.yaml:14: boxes[2].nics[0].bandwidth: must be > 0, got -5``.
    """


class ProfileError(SpecError):
    """A cost profile (YAML file or name) is malformed or unknown; names file, line and key.

    The message reads ``mpi.yaml:7: op_overhead: must be >= 0, got -1 us``.
    """


class XmlFormatError(SpecError):
    """An XML input (NCCL topology file, MSCCL algorithm) is malformed or not supported.

    The message reads ``FILE:LINE: ELEMENT: ATTRIBUTE: what is wrong``, with the element
    as its path from the root (``algo/gpu[2]/tb[0]/step[3]``).
    """


class ScheduleError(TopoplanError, ValueError):
    """A schedule is malformed or does not compute an allreduce.

    Raised by :func:`topoplan.load_schedule` for files that break the format and by
    :func:`topoplan.verify` for schedules that deadlock, leave messages unmatched or
    end with a wrong sum; the message names the rank, step and chunk.
    """


class PlannerError(TopoplanError, ValueError):
    """A planner was asked for something it cannot do.

    An unknown algorithm name, a bad option (``order`` that is not a permutation of the
    ranks, ``chunks < 1``, a non-positive ``size``, an option the planner does not take);
    the message names the option and what is allowed.
    """


class InfeasiblePlanError(TopoplanError):
    """No schedule exists for this cluster (e.g. the GPUs are not connected).

    The message names the cut that blocks the data.
    """


class BudgetError(TopoplanError):
    """Planning would hold more memory than allowed (``topoplan plan --max-memory``, or
    what the machine has available), by the estimate made before it starts.

    The message gives the estimate and how to go on (a larger budget, fewer candidates).
    """


class TransportError(TopoplanError, RuntimeError):
    """A point-to-point transfer failed or timed out while running a schedule.

    Carries the ``rank``, ``step``, ``peer``, ``chunk`` and ``channel`` (IR v4) involved,
    where known.
    """

    def __init__(self, message: str, *, rank: int | None = None, step: int | None = None,
                 peer: int | None = None, chunk: int | None = None,
                 channel: int | None = None) -> None:
        self.rank, self.step, self.peer, self.chunk = rank, step, peer, chunk
        self.channel = channel
        super().__init__(message)


class EstimateError(TopoplanError, ValueError):
    """The training estimator (:mod:`topoplan.estimate`) cannot price what it was given.

    An unknown model or GPU, no published throughput for the pair (give
    ``--compute-time``), a non-positive time, batch or fraction; the message names the
    input and what to give instead.
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the process was (:func:`topoplan._util.signals_raise`)
    so that ``finally`` blocks end launchers and remove scratch as Ctrl-C does. A
    :class:`KeyboardInterrupt`, so every handler of Ctrl-C handles it too."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class TopoplanWarning(UserWarning):
    """Base class of the warnings topoplan issues: input it reads, but which may not mean
    what its author meant. Filter them with :mod:`warnings`, e.g.
    ``warnings.simplefilter("error", topoplan.TopoplanWarning)`` to refuse such input."""


class SpecWarning(TopoplanWarning):
    """Input read from a file that may not mean what its author meant, located: the
    message starts ``FILE:LINE: KEY: `` and ``file``, ``line``, ``key`` and ``reason``
    hold the parts."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.file, self.line, self.key, self.reason = file, line, key, message
        super().__init__(_where(file, line, key) + message)


class PortWarning(SpecWarning):
    """A box whose NICs look like the ports of fewer cards: more NICs than GPUs, two of
    them serving the same GPUs. NCCL merges the ports of one card into one device
    (``NCCL_IB_MERGE_NICS``, default 1) and aws-ofi-nccl presents a GPU's EFA devices as
    one, so the ``nccl`` row sees fewer, faster NICs than such a file says
    (docs/CLUSTER.md, "NICs as NCCL sees them")."""


class RangeWarning(SpecWarning):
    """A bandwidth, latency or count outside the range real clusters have, or a cost
    outside the range real runtimes have, but within what topoplan computes with: a unit
    mixed up (``100 Kbit/s`` for ``100 Gbit/s``), a typo, or a fabric bigger than any
    measured (docs/CLUSTER.md and docs/COST_MODEL.md, "Ranges"). Beyond that range a
    value is a :class:`ClusterSpecError` (a :class:`ProfileError` in a cost profile). The
    message reads ``cluster.yaml:12: boxes[0].nics[0].bandwidth: 100 Kbit/s is outside
    the plausible range 1 Mbit/s to 100 TB/s; check the unit``.
    """


class UnitWarning(SpecWarning):
    """A bandwidth or latency written as a bare number, read in the default unit.

    A bare bandwidth is GB/s and a bare latency microseconds (docs/CLUSTER.md); a NIC
    written ``bandwidth: 100`` by someone who meant 100 Gbit/s is then 8 times too fast.
    The message reads ``cluster.yaml:12: boxes[0].nics[0].bandwidth: bare number 100 read
    as 100 GB/s (800 Gbit/s); write '100 GB/s' or '100 Gbit/s'``; ``file``, ``line`` and
    ``key`` hold the parts.
    """
