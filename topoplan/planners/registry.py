"""The planners, declared: what each one plans and takes, by name.

:data:`SPECS` holds a :class:`PlannerSpec` per planner (the collectives it plans, its
options, whether ``auto`` compares it and on large clusters); :data:`PLANNERS` maps the
names to the functions; :func:`register` adds one. The pipeline
(:mod:`~topoplan.planners.pipeline`) and ``auto`` look planners up here; nothing here
imports them.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

from ..ir.collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ..errors import PlannerError
from ..ir.schedule import Schedule

__all__ = ["PlannerSpec", "LazyPlanner", "SPECS", "PLANNERS", "register", "candidates",
           "takes", "collectives_of", "planners_for", "require_collective", "options_of",
           "check_names", "default_names", "spec_of"]

Planner = Callable[..., Schedule]


@dataclass(frozen=True)
class PlannerSpec:
    """What a planner is: its name, its function, what it plans and takes.

    Attributes
    ----------
    name : str
        The name the CLI and :func:`topoplan.plan` use.
    function : callable
        ``function(cluster, *, size, profile, max_step_ops, max_chunks[, collective],
        **options) -> Schedule``.
    collectives : tuple of str
        The collectives it plans (``collective=`` is passed when it plans more than
        allreduce).
    options : tuple of str
        Its own keyword options, beyond the request's.
    candidate : bool
        Compared by ``auto`` unless candidates are named.
    large : bool
        Still compared on clusters above :data:`MAX_PLAN_RANKS` ranks.
    profile, caps : bool
        Whether it takes ``profile=`` and the caps (``max_step_ops``, ``max_chunks``);
        a plan from one that does not take the caps is checked against them.
    core : callable or None
        ``core(request, **options) -> Schedule``: the planner on a validated
        :class:`~topoplan.planners.request.PlanRequest` (its runtime cluster, profile,
        size, collective and caps checked once), which the pipeline calls; ``function``
        checks its arguments into such a request and calls it. None for a planner
        registered from outside: the pipeline calls ``function``.
    min_ops : callable or None
        ``min_ops(request) -> int``: fewest ops its plan of a validated request holds,
        worked out without planning, for a planner whose plans carry no estimate of
        their own. Where it is above the simulator's limit the plan would have no time,
        and a comparison on a large cluster (or ``composed``'s cross-box choice) leaves
        the planner out instead of building it (:func:`~.comparison.too_big`).
    rsag : bool
        Its allreduce plans are RS+AG-structured: the RS+AG cut bound
        (:func:`~topoplan.analysis.bound.rsag_bound`) holds for every one of them, on any
        channels, so their certificate may measure them against it
        (:mod:`~topoplan.planners.certificate`). Declared for the rings: a ring moves
        ``2 (N - 1) / N`` of the buffer over each of its edges and leaves every node set
        ``S`` it does not cover by one edge at least, so ``2 (N - 1) M / N >=
        2 |S ∩ GPUs| M / N`` bytes leave ``S``. Not for plans that reduce inside a group
        before crossing an unbalanced cut, or overlap one chunk's reduce-scatter with
        another's allgather across it (mcf, rhd's fold, hierarchical, tree): on
        unequal clusters they run below it.
    """

    name: str
    function: Planner
    collectives: tuple[str, ...] = (DEFAULT_COLLECTIVE,)
    options: tuple[str, ...] = ()
    candidate: bool = True
    large: bool = False
    profile: bool = True
    caps: bool = True
    core: Planner | None = None
    min_ops: Callable[[Any], int] | None = None
    rsag: bool = False

    def plans(self, collective: str) -> bool:
        return collective in self.collectives



class LazyPlanner:
    """A planner imported on first use (``mcf`` pulls in scipy: seconds of import time).

    Calls and ``inspect.signature`` go to ``module.function``.
    """

    def __init__(self, module: str, function: str) -> None:
        self.module, self.function = module, function
        self._resolved: Planner | None = None

    def resolve(self) -> Planner:
        found = self._resolved
        if found is None:
            found = self._resolved = getattr(importlib.import_module(self.module),
                                             self.function)
        return found

    def names(self, planner: Any) -> bool:
        """Whether this is ``planner`` (a function), without importing it."""
        return (getattr(planner, "__module__", None) == self.module
                and getattr(planner, "__name__", None) == self.function)

    def __call__(self, *args: Any, **kwargs: Any) -> Schedule:
        return self.resolve()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.resolve())

    def __repr__(self) -> str:
        return f"<planner {self.module}.{self.function}>"


def _lazy(module: str, function: str) -> Planner:
    return LazyPlanner(f"topoplan.planners.{module}", function)


def _lazy_count(module: str, function: str) -> Callable[[Any], int]:
    """A planner module's ``min_ops`` function, imported on first use."""
    return cast(Callable[[Any], int], _lazy(module, function))


_ALL = tuple(COLLECTIVES)

#: The planners, declared: what each plans and takes (see :class:`PlannerSpec`). Each
#: is imported when first called, so that the registry imports no planner (the
#: planners import the request, which looks them up here).
SPECS: dict[str, PlannerSpec] = {spec.name: spec for spec in (
    PlannerSpec("ring", _lazy("ring", "plan_ring"), _ALL, ("order", "chunks"),
                core=_lazy("ring", "ring_core"), min_ops=_lazy_count("ring", "ring_min_ops"),
                rsag=True),
    PlannerSpec("ring-topo", _lazy("ring", "plan_ring_topo"), _ALL, ("chunks", "order"),
                core=_lazy("ring", "ring_topo_core"), min_ops=_lazy_count("ring", "ring_min_ops"),
                rsag=True),
    PlannerSpec("tree", _lazy("tree", "plan_tree"), (DEFAULT_COLLECTIVE,), ("chunks", "order"),
                core=_lazy("tree", "tree_core"), min_ops=_lazy_count("tree", "tree_min_ops")),
    PlannerSpec("rhd", _lazy("rhd", "plan_rhd"), _ALL, ("chunks", "order"),
                core=_lazy("rhd", "rhd_core"), min_ops=_lazy_count("rhd", "rhd_min_ops")),
    PlannerSpec("hierarchical", _lazy("hierarchical", "plan_hierarchical"),
                (DEFAULT_COLLECTIVE,), ("chunks",), large=True,
                core=_lazy("hierarchical", "hierarchical_core"),
                min_ops=_lazy_count("hierarchical", "hierarchical_min_ops")),
    PlannerSpec("mcf", _lazy("mcf", "plan_mcf"), _ALL, ("chunks", "exact", "time_limit",
                                                        "max_ops", "flat_max", "check",
                                                        "channels", "channel_skew",
                                                        "vectored"),
                large=True, core=_lazy("mcf", "mcf_core")),
    PlannerSpec("forest", _lazy("forest", "plan_forest"), _ALL,
                ("pieces", "time_limit", "channels", "channel_skew"),
                core=_lazy("forest", "forest_core")),
    PlannerSpec("nccl", _lazy("native", "plan_native"), _ALL, large=True, profile=False,
                caps=False, core=_lazy("native", "native_core")),
    PlannerSpec("composed", _lazy("composed", "plan_composed"), _ALL, ("variant", "inner"),
                large=True, core=_lazy("composed", "composed_core")),
    PlannerSpec("auto", _lazy("auto", "plan_auto"), _ALL,
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
    return next((s for s in SPECS.values() if s.function is planner
                 or (isinstance(s.function, LazyPlanner) and s.function.names(planner))),
                None)


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
    spec = spec_of(name)
    if not spec.plans(collective):
        raise PlannerError(f"planner {name!r} plans only {', '.join(spec.collectives)}; "
                           f"{collective} is planned by {', '.join(planners_for(collective))}")
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


def check_names(names: Sequence[str], *, allow_auto: bool = False) -> list[str]:
    """``names`` if each is a registered planner (and ``auto`` only with ``allow_auto``),
    else a :class:`PlannerError` naming the first unknown one, the closest known name,
    and every known one. The one check of a planner's name, for :func:`topoplan.plan`,
    ``auto``'s candidates, ``composed``'s inner planners and the CLI."""
    import difflib

    for name in names:
        if not isinstance(name, str) or name not in SPECS or (name == "auto" and not allow_auto):
            known = [n for n in SPECS if allow_auto or n != "auto"]
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PlannerError(f"unknown planner {name!r}{hint}; known: "
                               f"{', '.join(sorted(known))}")
    return list(names)


def spec_of(name: str) -> PlannerSpec:
    """The :class:`PlannerSpec` of planner ``name`` (:func:`check_names` checks it)."""
    check_names([name])
    return SPECS[name]


def default_names(request: Any, max_plan_ranks: int | None = None) -> list[str]:
    """The planners ``auto`` compares for ``request`` (a
    :class:`~topoplan.planners.request.PlanRequest`): every declared candidate that plans
    its collective, only the ``large`` ones above ``max_plan_ranks`` ranks (default the
    request's)."""
    limit = request.max_plan_ranks if max_plan_ranks is None else max_plan_ranks
    return [s.name for s in SPECS.values()
            if s.candidate and s.plans(request.collective)
            and (request.cluster.nranks <= limit or s.large)]
