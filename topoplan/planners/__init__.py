"""Collective planners: one module per algorithm, one signature, and the ``plan`` facade.

Every planner is ``plan_x(cluster, *, size, chunks=None, profile=None, **options) ->
Schedule`` and sets ``meta["algorithm"]``, ``meta["cluster"]`` and ``meta["profile"]``;
a planner that plans more than allreduce takes ``collective=`` (:func:`collectives_of`);
:func:`plan` adds ``meta["cluster_fingerprint"]`` (:mod:`topoplan.fingerprint`) and
``meta["size_bytes"]``.
``profile`` is the runtime's :class:`~topoplan.cost.CostProfile` (or a name): planners
pick their pipelining depth, and ``mcf`` its construction, against it. :data:`PLANNERS`
maps the names the CLI shows to them; adding one is one line (or :func:`register`).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence

from ..cluster import Cluster
from ..collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ..cost import CostProfile, get_profile
from ..fingerprint import META_KEY, cluster_fingerprint
from ..schedule import Schedule
from ..errors import PlannerError
from ._common import check_size, topo_order, unknown_options
from .hierarchical import plan_hierarchical
from .rhd import plan_rhd
from .ring import plan_ring, plan_ring_topo
from .tree import plan_tree

__all__ = ["PLANNERS", "plan", "register", "candidates", "takes", "options_of", "PlannerError",
           "collectives_of", "planners_for", "require_collective",
           "LazyPlanner",
           "plan_ring",
           "plan_ring_topo", "plan_tree", "plan_rhd", "plan_hierarchical", "topo_order"]

Planner = Callable[..., Schedule]


class LazyPlanner:
    """A planner imported on first use (``mcf`` pulls in scipy: seconds of import time).

    Calls and ``inspect.signature`` go to ``module.function``.
    """

    def __init__(self, module: str, function: str) -> None:
        self.module, self.function = module, function

    def resolve(self) -> Planner:
        return getattr(importlib.import_module(self.module), self.function)

    def __call__(self, *args: Any, **kwargs: Any) -> Schedule:
        return self.resolve()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.resolve())

    def __repr__(self) -> str:
        return f"<planner {self.module}.{self.function}>"


PLANNERS: dict[str, Planner] = {
    "ring": plan_ring,
    "ring-topo": plan_ring_topo,
    "tree": plan_tree,
    "rhd": plan_rhd,
    "hierarchical": plan_hierarchical,
    "mcf": LazyPlanner("topoplan.planners.mcf", "plan_mcf"),
    "auto": LazyPlanner("topoplan.planners.auto", "plan_auto"),
}


def register(name: str, planner: Planner) -> Planner:
    """Add (or replace) ``PLANNERS[name]``; returns ``planner`` so it works as a decorator helper."""
    PLANNERS[name] = planner
    return planner


def candidates() -> list[str]:
    """The planner names a comparison should run: every registered one but ``auto``."""
    return [name for name in PLANNERS if name != "auto"]


def takes(planner: Planner, option: str) -> bool:
    """Whether ``planner`` accepts the keyword ``option`` (or any keyword)."""
    params = inspect.signature(planner).parameters
    return option in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                   for p in params.values())


def collectives_of(planner: Planner) -> tuple[str, ...]:
    """The collectives ``planner`` plans: every one when it takes ``collective=``, else
    allreduce alone."""
    return tuple(COLLECTIVES) if takes(planner, "collective") else (DEFAULT_COLLECTIVE,)


def planners_for(collective: str, names: Sequence[str] | None = None) -> list[str]:
    """The names among ``names`` (default: every registered planner) that plan ``collective``."""
    return [name for name in (PLANNERS if names is None else names)
            if name in PLANNERS and collective in collectives_of(PLANNERS[name])]


def require_collective(name: str, collective: Any) -> str:
    """``collective`` if planner ``name`` plans it, else a :class:`PlannerError` naming the
    planners that do (or, for an unknown collective, the known collectives)."""
    if not isinstance(collective, str) or collective not in COLLECTIVES:
        raise PlannerError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if collective not in collectives_of(PLANNERS[name]):
        raise PlannerError(f"planner {name!r} plans only allreduce; {collective} is planned "
                           f"by {', '.join(planners_for(collective))}")
    return collective


def options_of(planner: Planner) -> list[str]:
    """The keyword options ``planner`` takes, in signature order."""
    params = inspect.signature(planner).parameters
    return [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]


def _check_options(name: str, planner: Planner, options: dict[str, Any]) -> None:
    params = inspect.signature(planner).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = options_of(planner)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise unknown_options(name, unknown, known)


def plan(cluster: Cluster, algorithm: str = "auto", *, size: int | str = 256 << 20,
         profile: CostProfile | str | None = None, collective: str = DEFAULT_COLLECTIVE,
         **options: Any) -> Schedule:
    """Plan ``collective`` (an allreduce) of ``size`` bytes on ``cluster`` with the named
    algorithm.

    Parameters
    ----------
    cluster : Cluster
    algorithm : str
        A key of :data:`PLANNERS` (``ring``, ``ring-topo``, ``tree``, ``rhd``,
        ``hierarchical``, ``mcf``, and whatever else is registered), or ``auto``, which
        simulates the candidates and returns the fastest (:mod:`topoplan.planners.auto`).
    size : int or str
        Message size in bytes, or a size such as ``"256MiB"``
        (:func:`~topoplan.units.parse_size`, as ``topoplan plan --size``).
    profile : CostProfile or str, optional
        The runtime's costs (:mod:`topoplan.cost`), a shipped profile's name or a YAML
        path. Default :data:`topoplan.cost.DEFAULT_PROFILE` (``nccl``).
    collective : {"allreduce", "reduce_scatter", "allgather"}
        What to plan (:mod:`topoplan.collectives`); ``size`` is the full buffer (an
        allgather's output, a reduce-scatter's input).
    **options
        Passed to the planner (``chunks``, ``order``, ``max_step_ops``, ...).

    Returns
    -------
    Schedule
        With ``meta["cluster_fingerprint"]``, the cluster's
        :func:`~topoplan.fingerprint.cluster_fingerprint`, ``meta["size_bytes"]``, the size
        it was planned for, and ``meta["nccl"]``: what NCCL itself runs for the same
        collective and size on the cluster and its time there
        (:meth:`topoplan.native.nccl.NcclChoice.to_dict`; ``algorithm`` is ``"nccl"``,
        NCCL's own is ``nccl_algorithm``, with ``protocol`` and ``channels``).

    Raises
    ------
    PlannerError
        Unknown algorithm (the message lists the known ones), an option the planner does
        not take (the message lists those it takes), a size that is not a positive
        number of bytes, or a collective the planner does not plan (the message lists
        the planners that do).
    """
    planner = PLANNERS.get(algorithm)
    if planner is None:
        known = ", ".join(sorted(PLANNERS))
        raise PlannerError(f"unknown algorithm {algorithm!r}; known: {known}")
    _check_options(algorithm, planner, options)
    require_collective(algorithm, collective)
    if takes(planner, "collective"):
        options["collective"] = collective
    size = check_size(size, algorithm)
    costs = get_profile(profile)
    if takes(planner, "profile"):
        options["profile"] = costs
    schedule = planner(cluster, size=size, **options)
    # The size it was made for: simulate marks the sizes it runs that are not this one.
    extra: dict[str, Any] = {META_KEY: cluster_fingerprint(cluster), "size_bytes": size}
    if "profile" not in schedule.meta:
        extra["profile"] = costs.name
    from ..sim.run import nccl_row
    choice = nccl_row(cluster, size, collective)
    if choice is not None:
        extra["nccl"] = choice.to_dict()
    return schedule.with_meta(**extra)
