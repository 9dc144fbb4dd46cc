"""How long planning a request will take and how much memory it will hold, before it starts.

:func:`estimate_work` prices a validated
:class:`~topoplan.planners.request.PlanRequest` from the cluster's rank count and the
candidates the pipeline would plan (the request's, less those it would leave out
without planning, :func:`~topoplan.planners.comparison.too_big`, and NCCL's row), with
no planning at all: per planner, seconds and bytes as a constant plus a share per rank,
fitted to ``topoplan plan -a NAME --size 1MiB`` on the rail-optimised clusters of
``topoplan topo generate rail`` at 1024, 2048, 4096 and 8192 GPUs
(``scripts/bench_plan_limits.py``, docs/RESULTS.md "Planning at scale"); the planners
without a fit (``ring``, ``ring-topo``, ``rhd``, ``tree``) are priced per op of their
plan (:attr:`~topoplan.planners.registry.PlannerSpec.min_ops`, a lower bound), and a
planner registered from outside not at all. The message size enters through mcf, which
pipelines a large message until its plan fills its op budget (:func:`budget_share`:
from 16 MiB to 256 MiB, fitted to 1024 to 16384 GPUs at 256 MiB).

:func:`check_budget` turns the estimate into the bound ``topoplan plan`` keeps: above
``max_bytes`` (default :data:`DEFAULT_MAX_BYTES`) or the memory this machine has
available, a :class:`~topoplan.errors.BudgetError` saying the estimate and how to go on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import BudgetError
from .comparison import NCCL, too_big
from .request import PlanRequest

__all__ = ["WorkEstimate", "PlannerWork", "estimate_work", "check_budget", "available_memory",
           "DEFAULT_MAX_BYTES", "NOTE_SECONDS", "NOTE_BYTES", "MODEL"]

#: The memory ``topoplan plan`` may plan in unless told otherwise (``--max-memory``).
DEFAULT_MAX_BYTES = 4 << 30
#: Above either, ``topoplan plan`` says what it estimates before it starts.
NOTE_SECONDS = 10.0
NOTE_BYTES = 1 << 30

#: ``name -> (seconds, seconds per 1024 ranks, bytes, bytes per 1024 ranks)``: what
#: planning a planner's row adds to the process (:data:`BASE`), as a constant and a
#: share that grows with the ranks. Fitted to ``scripts/bench_plan_limits.py --gpus
#: 1024,2048,4096,8192 -a nccl,mcf,composed,hierarchical`` (each planner alone less
#: NCCL's row alone; docs/RESULTS.md, "Planning at scale"), rounded up. ``nccl`` is
#: NCCL's row, which every request plans. ``forest`` plans at most 128 ranks and is not
#: in that fit: its entry is rounded up from single runs at 32 and 64 GPUs (2.6 s and
#: 4.3 s, 21 MB and 38 MB more resident, 256 MiB allgathers under ``nccl``).
MODEL: dict[str, tuple[float, float, float, float]] = {
    "mcf": (12.0, 0.3, 180e6, 30e6),
    "forest": (1.0, 70.0, 30e6, 600e6),
    "composed": (7.0, 0.1, 200e6, 40e6),
    "hierarchical": (0.0, 6.5, 0.0, 150e6),
    NCCL: (0.0, 0.01, 0.0, 1e6),
}
#: The process without any row: imports, the cluster, its routes and the bounds, fitted
#: to NCCL's row alone at 1024 to 16384 GPUs: ``(seconds, per 1024 ranks, per 1024
#: ranks squared, bytes, per 1024 ranks, per 1024 ranks squared)``; the squared terms
#: take over above 8192 GPUs (NCCL's row alone: 0.3 GiB at 8192, 0.8 GiB at 16384).
BASE = (3.0, 0.5, 0.16, 85e6, 14e6, 2.4e6)
#: mcf pipelines a large message until its plan fills its op budget
#: (:func:`mcf_ops_budget`): from 16 MiB to 256 MiB (:func:`budget_share`) its row adds
#: up to this much per op of the budget (8192 GPUs at 256 MiB: 2.6 GB and 36 s more
#: than at 1 MiB, for a budget of 8 M ops).
MCF_OP_SECONDS = 4.5e-6
#: ``forest``'s :data:`~topoplan.planners.forest.MAX_RANKS`, without importing it
#: (scipy); tests/test_forest.py checks that they agree.
FOREST_MAX_RANKS = 128
MCF_OP_BYTES = 290.0
#: ... and, per 1024 ranks squared, this much more (its budget stops at 8 M ops, its
#: arrays over the ranks do not: 16384 GPUs at 256 MiB held 6.5 GiB, 8192 GPUs 3.4).
MCF_SQUARE_SECONDS = 0.4
MCF_SQUARE_BYTES = 7e6
#: A planner priced by its ops (:attr:`~.registry.PlannerSpec.min_ops`), per op: a flat
#: ring over 256 and 512 ranks took 9-11 us and 550 bytes an op.
OP_SECONDS = 10e-6
OP_BYTES = 550.0


@dataclass(frozen=True)
class PlannerWork:
    """One planner's share of the work: seconds and bytes (None: not modelled)."""

    name: str
    seconds: float | None
    bytes: float | None


@dataclass(frozen=True)
class WorkEstimate:
    """What planning a request will take, estimated before it starts.

    Attributes
    ----------
    nranks : int
    parts : tuple of PlannerWork
        The rows it will plan (NCCL's included), each with its share.
    left_out : tuple of str
        The candidates the pipeline will leave out without planning (their rows would
        have no time).
    seconds, bytes : float
        The whole command's time and peak resident memory (the rows it keeps, and the
        process), by the model: within 2x of the measurements it was fitted to.
    """

    nranks: int
    parts: tuple[PlannerWork, ...]
    left_out: tuple[str, ...]
    seconds: float
    bytes: float

    @property
    def unmodelled(self) -> tuple[str, ...]:
        """Planners without a model (registered from outside): not in the totals."""
        return tuple(p.name for p in self.parts if p.seconds is None)

    @property
    def large(self) -> bool:
        """Worth saying before it starts (:data:`NOTE_SECONDS`, :data:`NOTE_BYTES`)."""
        return self.seconds > NOTE_SECONDS or self.bytes > NOTE_BYTES

    def text(self) -> str:
        """``about 3 min and 2.9 GiB (mcf 2 min, 1.9 GiB; ...)``: the totals, and the
        planners that hold a tenth of either."""
        shares = "; ".join(f"{p.name} {_duration(p.seconds)}, {_gb(p.bytes)}"
                           for p in sorted(self.parts, key=lambda p: -(p.bytes or 0))
                           if p.seconds is not None and p.bytes is not None
                           and (p.seconds > self.seconds / 10 or p.bytes > self.bytes / 10))
        text = f"about {_duration(self.seconds)} and {_gb(self.bytes)} of memory" + (
            f" ({shares})" if shares else "")
        if self.unmodelled:
            text += f", and {', '.join(self.unmodelled)}, which the estimate does not know"
        return text


def estimate_work(request: PlanRequest) -> WorkEstimate:
    """Estimate the time and peak memory of planning ``request`` (made with an
    algorithm) from its rank count and candidates, without planning (see the module's
    notes). O(ranks) at most (the hierarchy of ``hierarchical``'s op count)."""
    n = request.cluster.nranks
    names = list(request.candidates) or [request.algorithm or NCCL]
    left_out: list[str] = []
    parts: list[PlannerWork] = []
    for name in dict.fromkeys([*names, NCCL]):
        if name != request.algorithm and n > request.max_plan_ranks \
                and too_big(request, name, request.max_sim_ops) is not None:
            left_out.append(name)
            continue
        parts.append(_work(request, name))
    k = n / 1024
    base_s = BASE[0] + BASE[1] * k + BASE[2] * k * k
    base_bytes = BASE[3] + BASE[4] * k + BASE[5] * k * k
    seconds = base_s + sum(p.seconds or 0.0 for p in parts)
    total = base_bytes + sum(p.bytes or 0.0 for p in parts)
    return WorkEstimate(n, tuple(parts), tuple(left_out), seconds, total)


def _work(request: PlanRequest, name: str) -> PlannerWork:
    from .registry import SPECS

    fit = MODEL.get(name)
    if name == "forest" and request.cluster.nranks > FOREST_MAX_RANKS:
        return PlannerWork(name, 0.0, 0.0)  # it refuses before it plans
    if fit is not None:
        seconds, nbytes = _affine(fit, request.cluster.nranks)
        if name == "mcf":
            share, k = budget_share(request.size), request.cluster.nranks / 1024
            channels = request.channels
            ops = mcf_ops_budget(request.cluster.nranks,
                                 4 if channels == "auto" else int(channels)) * share
            seconds += ops * MCF_OP_SECONDS + share * k * k * MCF_SQUARE_SECONDS
            nbytes += ops * MCF_OP_BYTES + share * k * k * MCF_SQUARE_BYTES
        return PlannerWork(name, seconds, nbytes)
    spec = SPECS.get(name)
    if spec is not None and spec.min_ops is not None:
        ops = spec.min_ops(request.for_planner(name))
        return PlannerWork(name, ops * OP_SECONDS, ops * OP_BYTES)
    return PlannerWork(name, None, None)


def mcf_ops_budget(nranks: int, channels: int = 1) -> int:
    """mcf's default op budget for ``nranks`` ranks on ``channels`` channels, over all of
    them (:func:`topoplan.planners.mcf.planner.default_ops`), without importing it
    (scipy); tests/test_plan_limits.py checks that the numbers are mcf's."""
    per_rank = 1000 * nranks
    return 400_000 if per_rank <= 400_000 else min(per_rank * channels, 6_900_000)


def budget_share(size: int) -> float:
    """How much of its op budget mcf's plan of ``size`` bytes fills, by the measurements:
    none up to 16 MiB (1 MiB and 16 MiB held the same memory at 4096 GPUs), all from
    256 MiB, log-linear between."""
    import math
    return min(1.0, max(0.0, math.log2(max(size, 1) / (16 << 20)) / 4))


def _affine(fit: tuple[float, float, float, float], n: int) -> tuple[float, float]:
    seconds, per_s, nbytes, per_bytes = fit
    scale = n / 1024
    return seconds + per_s * scale, nbytes + per_bytes * scale


def available_memory() -> int | None:
    """Bytes this process may still take: the kernel's ``MemAvailable``, less where a
    cgroup (v2) limit is lower; None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                found.append(int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else None


def check_budget(request: PlanRequest, estimate: WorkEstimate, max_bytes: int | None,
                 *, where: str, alternatives: Sequence[str] = (NCCL, "mcf")) -> None:
    """Refuse to plan ``request`` when ``estimate`` holds more memory than ``max_bytes``
    (None or 0: no bound at all) or than this machine has available
    (:func:`available_memory`).

    Raises
    ------
    BudgetError
        ``where: planning N ranks (...) would take about ... and X GiB of memory, over
        ...; to go on: --max-memory ..., or fewer candidates: -a ...``.
    """
    if not max_bytes:
        return
    have = available_memory()
    limit, why = max_bytes, f"the {_gb(max_bytes)} budget (--max-memory)"
    if have is not None and have < limit:
        limit, why = have, f"the {_gb(have)} this machine has available"
    if estimate.bytes <= limit:
        return
    cheaper = []
    for name in alternatives:
        if name == request.algorithm:
            continue
        alone = estimate_work(_alone(request, name))
        if alone.bytes <= limit:
            cheaper.append(f"-a {name} ({_duration(alone.seconds)}, {_gb(alone.bytes)})")
    need = -(-int(estimate.bytes * 1.25) // 2**30)  # whole GiB, a quarter to spare
    how = f"--max-memory {need}GiB (or 0: no bound)" if have is None \
        or need * 2**30 <= have else "a machine with more memory (--max-memory 0 tries anyway)"
    raise BudgetError(
        f"{where}: planning {estimate.nranks} ranks would take {estimate.text()}, "
        f"over {why}; to go on: {how}"
        + (f", or fewer candidates: {', '.join(cheaper)}" if cheaper else ""))


def _alone(request: PlanRequest, name: str) -> PlanRequest:
    """``request`` with planner ``name`` alone (beside NCCL's row), as ``-a NAME``."""
    from dataclasses import replace
    return replace(request, algorithm=name, candidates=(name,))


def _gb(nbytes: float | None) -> str:
    """Binary units, as ``--max-memory`` reads them."""
    if nbytes is None:
        return "?"
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**27 else f"{nbytes / 2**20:.0f} MiB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
