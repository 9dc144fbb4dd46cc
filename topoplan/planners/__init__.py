"""Collective planners: one module per algorithm, one signature, and the ``plan`` facade.

Every planner is ``plan_x(cluster, *, size, chunks=None, profile=None, **options) ->
Schedule`` and sets ``meta["algorithm"]``, ``meta["cluster"]`` and ``meta["profile"]``;
a planner that plans more than allreduce takes ``collective=``. :data:`SPECS` declares
each one (:class:`~topoplan.planners.pipeline.PlannerSpec`: the collectives it plans, the
options it takes); :data:`PLANNERS` maps the names to the functions; :func:`register`
adds one. :func:`plan`, ``auto`` and ``topoplan plan`` go through one pipeline
(:mod:`~topoplan.planners.pipeline`): a validated
:class:`~topoplan.planners.pipeline.PlanRequest`, :func:`run` and :func:`compare`.
:func:`plan` adds ``meta["cluster_fingerprint"]`` (:mod:`topoplan.fingerprint`),
``meta["size_bytes"]`` and ``meta["nccl"]`` (:func:`stamp`). ``profile`` is the
runtime's :class:`~topoplan.cost.CostProfile` (or a name): planners pick their
pipelining depth, and ``mcf`` its construction, against it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence

from ..cluster import Cluster
from ..collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ..cost import CostProfile
from ..fingerprint import META_KEY, cluster_fingerprint
from ..schedule import Schedule
from ..errors import PlannerError
from ._checks import unknown_options
from ._order import topo_order
from .pipeline import Candidate, PlannerSpec, PlanRequest, compare, nccl_candidate, run
from .hierarchical import plan_hierarchical
from .rhd import plan_rhd
from .ring import plan_ring, plan_ring_topo
from .tree import plan_tree

__all__ = ["PLANNERS", "SPECS", "plan", "register", "candidates", "takes", "options_of",
           "PlannerError", "collectives_of", "planners_for", "require_collective",
           "PlannerSpec", "PlanRequest", "Candidate", "compare", "run", "nccl_candidate",
           "stamp",
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


def _mcf() -> Planner:
    return LazyPlanner("topoplan.planners.mcf", "plan_mcf")


_ALL = tuple(COLLECTIVES)

#: The planners, declared: what each plans and takes (see :class:`PlannerSpec`).
SPECS: dict[str, PlannerSpec] = {spec.name: spec for spec in (
    PlannerSpec("ring", plan_ring, _ALL, ("order", "chunks")),
    PlannerSpec("ring-topo", plan_ring_topo, _ALL, ("chunks", "order")),
    PlannerSpec("tree", plan_tree, (DEFAULT_COLLECTIVE,), ("chunks", "order")),
    PlannerSpec("rhd", plan_rhd, _ALL, ("chunks", "order")),
    PlannerSpec("hierarchical", plan_hierarchical, (DEFAULT_COLLECTIVE,), ("chunks",),
                large=True),
    PlannerSpec("mcf", _mcf(), _ALL, ("chunks", "exact", "time_limit", "max_ops",
                                      "flat_max", "check"), large=True),
    PlannerSpec("auto", LazyPlanner("topoplan.planners.auto", "plan_auto"), _ALL,
                ("candidates", "max_sim_ops", "max_plan_ranks"), candidate=False),
)}


class _Planners(dict):
    """``name -> planner function``, kept in step with :data:`SPECS`: setting an entry
    registers it (:func:`register`)."""

    def __setitem__(self, name: str, planner: Planner) -> None:
        register(name, planner)

    def __delitem__(self, name: str) -> None:
        dict.__delitem__(self, name)
        SPECS.pop(name, None)

    def pop(self, name: str, *default: Any) -> Any:
        SPECS.pop(name, None)
        return dict.pop(self, name, *default)


#: The planner functions by name (``PLANNERS["ring"](cluster, size=...)``).
PLANNERS: dict[str, Planner] = _Planners({name: spec.function for name, spec in SPECS.items()})


def register(name: str, planner: Planner, *, collectives: Sequence[str] | None = None,
             options: Sequence[str] | None = None, candidate: bool = True,
             large: bool = False) -> Planner:
    """Add (or replace) planner ``name``; returns ``planner``.

    ``collectives`` and ``options`` declare what it plans and which keyword options it
    takes beyond ``size``, ``profile``, ``collective``, ``max_step_ops`` and
    ``max_chunks``; left out, they are read from its signature (every collective when it
    takes ``collective=``).
    """
    params = inspect.signature(planner).parameters
    if collectives is None:
        collectives = _ALL if "collective" in params else (DEFAULT_COLLECTIVE,)
    if options is None:
        standard = {"size", "profile", "collective", "max_step_ops", "max_chunks"}
        options = [p for p, v in params.items()
                   if v.kind is inspect.Parameter.KEYWORD_ONLY and p not in standard]
    SPECS[name] = PlannerSpec(name, planner, tuple(collectives), tuple(options),
                              candidate=candidate, large=large,
                              profile="profile" in params,
                              caps={"max_step_ops", "max_chunks"} <= set(params))
    dict.__setitem__(PLANNERS, name, planner)
    return planner


def candidates() -> list[str]:
    """The planner names a comparison should run: every registered one but ``auto``."""
    return [name for name, spec in SPECS.items() if spec.candidate]


def _spec_of(planner: Planner | str) -> PlannerSpec | None:
    if isinstance(planner, str):
        return SPECS.get(planner)
    return next((s for s in SPECS.values() if s.function is planner), None)


def takes(planner: Planner | str, option: str) -> bool:
    """Whether ``planner`` (a function or a name) accepts the keyword ``option``."""
    spec = _spec_of(planner)
    if spec is None:
        params = inspect.signature(planner).parameters  # type: ignore[arg-type]
        return option in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                       for p in params.values())
    standard = {"size"} | ({"profile"} if spec.profile else set()) | (
        {"max_step_ops", "max_chunks"} if spec.caps else set())
    return (option in standard or option in spec.options
            or (option == "collective" and len(spec.collectives) > 1))


def collectives_of(planner: Planner | str) -> tuple[str, ...]:
    """The collectives ``planner`` (a function or a name) plans."""
    spec = _spec_of(planner)
    if spec is None:
        return _ALL if takes(planner, "collective") else (DEFAULT_COLLECTIVE,)
    return spec.collectives


def planners_for(collective: str, names: Sequence[str] | None = None) -> list[str]:
    """The names among ``names`` (default: every registered planner) that plan ``collective``."""
    return [name for name in (SPECS if names is None else names)
            if name in SPECS and SPECS[name].plans(collective)]


def require_collective(name: str, collective: Any) -> str:
    """``collective`` if planner ``name`` plans it, else a :class:`PlannerError` naming the
    planners that do (or, for an unknown collective, the known collectives)."""
    if not isinstance(collective, str) or collective not in COLLECTIVES:
        raise PlannerError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if not SPECS[name].plans(collective):
        raise PlannerError(f"planner {name!r} plans only allreduce; {collective} is planned "
                           f"by {', '.join(planners_for(collective))}")
    return collective


def options_of(planner: Planner | str) -> list[str]:
    """The keyword options ``planner`` (a function or a name) takes: the request's own
    (``size``, ``profile``, the caps, ``collective`` where it plans more than allreduce)
    and its declared ones."""
    spec = _spec_of(planner)
    if spec is None:
        params = inspect.signature(planner).parameters  # type: ignore[arg-type]
        return [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
    out = ["size", *spec.options] + (["profile"] if spec.profile else []) + (
        ["max_step_ops", "max_chunks"] if spec.caps else [])
    return out + (["collective"] if len(spec.collectives) > 1 else [])


def plan(cluster: Cluster, algorithm: str = "auto", *, size: int | str = 256 << 20,
         profile: CostProfile | str | None = None, collective: str = DEFAULT_COLLECTIVE,
         max_step_ops: int | None = None, max_chunks: int | None = None,
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
    max_step_ops, max_chunks : int, optional
        Plan-size caps (planners pipeline less to fit, or raise
        :class:`InfeasiblePlanError`).
    **options
        Passed to the planner (``chunks``, ``order``, ...; ``auto``: ``candidates``,
        ``machine``).

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
    if algorithm not in SPECS:
        raise PlannerError(f"unknown algorithm {algorithm!r}; known: {', '.join(sorted(SPECS))}")
    machine = options.pop("machine", None)
    request = PlanRequest.make(cluster, size=size, collective=collective, profile=profile,
                               max_step_ops=max_step_ops, max_chunks=max_chunks,
                               machine=machine, who=algorithm, **options)
    if algorithm == "auto":
        from .auto import choose
        limits = {k: v for k, v in request.options.items()
                  if k in ("candidates", "max_sim_ops", "max_plan_ranks")}
        schedule = choose(request, **limits)
    else:
        if machine is not None:
            raise unknown_options(algorithm, ["machine"], list(SPECS[algorithm].options))
        schedule = run(request, algorithm)
    return stamp(request, schedule)


def stamp(request: PlanRequest, schedule: Schedule) -> Schedule:
    """``schedule`` with what :func:`plan` records: the cluster's fingerprint, the size it
    was made for, the profile and the ``nccl`` row."""
    # The size it was made for: simulate marks the sizes it runs that are not this one.
    extra: dict[str, Any] = {META_KEY: cluster_fingerprint(request.cluster),
                             "size_bytes": request.size}
    if "profile" not in schedule.meta:
        extra["profile"] = request.profile.name
    nccl = nccl_candidate(request)
    if nccl is not None and nccl.nccl is not None:
        extra["nccl"] = nccl.nccl.to_dict()
    return schedule.with_meta(**extra)
