"""One validated plan request: every argument checked once, in one place.

A :class:`PlanRequest` holds what a planner needs (the cluster, the collective, the size,
the cost profile, the plan-size caps, its options) and, for a request that
:func:`topoplan.plan` or ``topoplan plan`` makes, what the pipeline does with the
planners (which one to use or ``auto``, the candidates, channels, vectored messages).
:meth:`PlanRequest.make` checks all of it; the planners, the comparison and the pipeline
then take it as it is. What every one of them derives from the request is computed once
and kept on it: the cluster as the profile's runtime moves bytes on it
(:attr:`PlanRequest.runtime`) and the yardsticks every row is measured against
(:attr:`PlanRequest.bounds`, :attr:`PlanRequest.yardsticks`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..analysis.cost import CostProfile, get_profile
from ..errors import InfeasiblePlanError, PlannerError
from ..ir.collectives import COLLECTIVES, DEFAULT as DEFAULT_COLLECTIVE
from ._checks import check_cap_args, check_size
from .channels import SKEW

if TYPE_CHECKING:
    from ..analysis.sim.report import Yardsticks
    from ..cluster import Cluster

__all__ = ["PlanRequest", "Bounds", "MAX_SIM_OPS", "MAX_PLAN_RANKS", "AUTO"]

#: Candidates with more ops are not simulated but ranked by their own estimate (the
#: simulator re-rates every flow at each event: mcf's 1024-GPU plan of 475 k ops took
#: ~40 s to simulate, its own estimate was 0.5% from the simulated time).
#: ``topoplan simulate`` simulates any plan.
MAX_SIM_OPS = 250_000
#: Above this many ranks only the planners declared ``large`` are compared by default.
MAX_PLAN_RANKS = 256
#: The name that compares the candidates and keeps the fastest.
AUTO = "auto"

# The options :func:`topoplan.plan` takes that are the pipeline's, not a planner's.
_PIPELINE_OPTIONS = ("candidates", "channels", "channel_skew", "vectored", "max_sim_ops",
                     "max_plan_ranks")


@dataclass(frozen=True)
class Bounds:
    """The lower bounds a request's rows are measured against, computed once.

    Attributes
    ----------
    lower_s : float
        No schedule of the collective is faster on the cluster
        (:func:`~topoplan.analysis.bound.collective_bound`; 0 on one GPU).
    rsag_s : float or None
        No reduce-scatter + allgather schedule is faster (an allreduce's
        :func:`~topoplan.analysis.bound.rsag_bound`; None for the other collectives). It
        does not bound plans of native steps (``nccl``, ``composed``).
    latency_s : float or None
        No point-to-point schedule is faster under the profile
        (:func:`~topoplan.analysis.bound.latency_bound`; None under ``ideal``, where it is
        ``lower_s``).
    """

    lower_s: float
    rsag_s: float | None = None
    latency_s: float | None = None

    def meta(self) -> dict[str, float]:
        """The bounds as a plan's ``meta`` records them."""
        out = {"lower_bound_s": self.lower_s}
        if self.rsag_s is not None:
            out["rsag_bound_s"] = self.rsag_s
        if self.latency_s is not None:
            out["latency_bound_s"] = self.latency_s
        return out


@dataclass(frozen=True)
class PlanRequest:
    """One validated request: everything a planner, ``auto`` and the simulator need.

    Attributes
    ----------
    cluster : Cluster
    collective : str
        ``allreduce``, ``reduce_scatter`` or ``allgather``.
    size : int
        Bytes of the full buffer: an allreduce's buffer on every rank, a
        reduce-scatter's input, an allgather's output (as nccl-tests counts them).
    profile : CostProfile
        The runtime's costs; planners plan against it and the simulator charges it.
    max_step_ops, max_chunks : int or None
        Plan-size caps: most ops a rank posts in one step, most chunks (of the plan as
        it runs, on all its channels).
    options : mapping
        Planner options (``chunks``, ``order``, ...), given to the planners that take them.
    machine : Cluster or None
        Where the plans will run when not on ``cluster`` (a calibrated profile's host):
        candidates are simulated there.
    algorithm : str or None
        The planner to use, or ``"auto"`` (compare the candidates, keep the fastest);
        None for a planner's own request (a planner called directly).
    candidates : tuple of str
        The planners to compare: with ``auto``, every one of them; with a named planner,
        it and these beside it (``topoplan plan -a mcf --candidates ring,tree``).
    left_out : mapping
        Candidates dropped before planning, and why (native steps cannot be cut over
        channels).
    channels : int or "auto"
        Channels the chosen plan runs on (IR v4); ``"auto"``: ``mcf`` and ``forest``
        pick 1, 2 or 4.
    channel_skew : float
        One channel's slice of the data over the next one's.
    vectored : bool
        Merge each step's messages from one rank to one peer into one message.
    max_sim_ops : int
        Candidates of more ops are ranked by their own estimate, not simulated.
    max_plan_ranks : int
        Above this many ranks only the planners declared ``large`` are compared by
        default.
    """

    cluster: Cluster
    collective: str = DEFAULT_COLLECTIVE
    size: int = 256 << 20
    profile: CostProfile = field(default_factory=lambda: get_profile(None))
    max_step_ops: int | None = None
    max_chunks: int | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    machine: Cluster | None = None
    algorithm: str | None = None
    candidates: tuple[str, ...] = ()
    left_out: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    channels: int | str = 1
    channel_skew: float = SKEW
    vectored: bool = False
    max_sim_ops: int = MAX_SIM_OPS
    max_plan_ranks: int = MAX_PLAN_RANKS

    @classmethod
    def make(cls, cluster: Cluster | str | os.PathLike, *, size: int | str = 256 << 20,
             collective: str = DEFAULT_COLLECTIVE, profile: CostProfile | str | None = None,
             max_step_ops: int | None = None, max_chunks: int | None = None,
             machine: Cluster | None = None, algorithm: str | None = None,
             who: str | None = None, **options: Any) -> PlanRequest:
        """Check every argument once and build the request.

        ``options`` are the planners' options and, with ``algorithm``, the pipeline's:
        ``candidates``, ``channels``, ``channel_skew``, ``vectored``, ``max_sim_ops``,
        ``max_plan_ranks`` (see the attributes). ``who`` names the caller in messages
        (default the algorithm, else ``plan``).

        Raises
        ------
        PlannerError
            A size that is not a positive number of bytes (an int, or a string such as
            ``"256MiB"``), an unknown collective, a cap that is not an integer >= 1, an
            unknown planner (the message lists the known ones), one that does not plan
            the collective, an option no planner of the request takes, or bad channels,
            skew or vectored.
        ProfileError
            An unknown profile name or a bad profile file.
        InfeasiblePlanError
            A ``machine`` with another rank count than ``cluster``.
        """
        from ..cluster import as_cluster  # networkx and yaml load with the first plan
        who = who or algorithm or "plan"
        cluster = as_cluster(cluster, who)
        if not (isinstance(collective, str) and collective in COLLECTIVES):
            raise PlannerError(f"{who}: unknown collective {collective!r}; known: "
                               f"{', '.join(COLLECTIVES)}")
        size = check_size(size, who)
        check_cap_args(max_step_ops, max_chunks, who)
        if machine is None and algorithm is not None:  # plan(..., machine=M) passes it so
            machine = options.pop("machine", None)
        if machine is not None and machine.nranks != cluster.nranks:
            raise InfeasiblePlanError(f"{who}: the machine {machine.name!r} has "
                                      f"{machine.nranks} ranks but cluster {cluster.name!r} "
                                      f"has {cluster.nranks}")
        request = cls(cluster=cluster, collective=collective, size=size,
                      profile=get_profile(profile), max_step_ops=max_step_ops,
                      max_chunks=max_chunks, machine=machine)
        if algorithm is None:
            return replace(request, options=MappingProxyType(dict(options)))
        return request._with_pipeline(algorithm, options)

    def _with_pipeline(self, algorithm: str, options: dict[str, Any]) -> PlanRequest:
        """The request with the pipeline's arguments, checked (see :meth:`make`)."""
        from ..ir.passes import check_channels, check_skew
        from .channels import NATIVE_PLANNERS
        from .registry import SPECS, check_names, default_names, require_collective

        ask = {k: options.pop(k) for k in _PIPELINE_OPTIONS if k in options}
        check_names([algorithm], allow_auto=True)
        if algorithm != AUTO:
            require_collective(algorithm, self.collective)
        named = ask.get("candidates")
        if named is not None:
            if isinstance(named, str) or not all(isinstance(n, str) for n in named):
                raise PlannerError(f"candidates: must be a list of planner names, got "
                                   f"{named!r}")
            check_names(named)
            for name in named:
                require_collective(name, self.collective)
        limits: dict[str, Any] = {}
        for key, default in (("max_sim_ops", MAX_SIM_OPS), ("max_plan_ranks", MAX_PLAN_RANKS)):
            value = ask.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlannerError(f"{key}: must be an integer >= 0, got {value!r}")
            limits[key] = value
        vectored = ask.get("vectored", False)
        if not isinstance(vectored, bool):
            raise PlannerError(f"vectored: must be True or False, got {vectored!r}")
        skew = check_skew(ask.get("channel_skew", SKEW))
        channels = ask.get("channels", 1)
        if channels != "auto":
            channels = check_channels(channels)
        request = replace(self, algorithm=algorithm, channels=channels, channel_skew=skew,
                          vectored=vectored, **limits)
        if algorithm == AUTO:
            names = list(named) if named is not None else \
                default_names(request, limits["max_plan_ranks"])
        else:
            names = [algorithm] + [n for n in (named or ()) if n != algorithm]
        left_out: dict[str, str] = {}
        if channels == "auto":
            if not any("channels" in SPECS[n].options for n in names):
                pickers = sorted(n for n, spec in SPECS.items() if "channels" in spec.options)
                raise PlannerError(f"channels='auto': {', '.join(names)} cannot pick "
                                   f"{'its' if len(names) == 1 else 'their'} channels (only "
                                   f"{' and '.join(pickers)} do); give a count")
        elif channels != 1:
            # native steps cannot be cut over channels
            cut = [n for n in names if n in NATIVE_PLANNERS]
            if algorithm in cut:
                raise PlannerError(f"{algorithm}: its plans hold native steps, which cannot "
                                   f"be cut over {channels} channels")
            for name in cut:
                left_out[name] = (f"{name}: its plans hold native steps, which cannot be cut "
                                  f"over {channels} channels")
            names = [n for n in names if n not in cut]
        # An option no planner of the request takes is a mistake (a misspelling).
        unused = sorted(k for k in options if not any(k in SPECS[n].options for n in names))
        if unused:
            from ._checks import unknown_options
            known = sorted({o for n in names for o in SPECS[n].options})
            raise unknown_options(algorithm if algorithm != AUTO or len(names) != 1
                                  else names[0], unused, known)
        return replace(request, candidates=tuple(names),
                       left_out=MappingProxyType(left_out),
                       options=MappingProxyType(dict(options)))

    # -- what is derived from it, once ----------------------------------------------
    @property
    def where(self) -> Cluster:
        """The cluster the candidates are simulated on."""
        return self.cluster if self.machine is None else self.machine

    @property
    def caps(self) -> dict[str, int]:
        return {k: v for k, v in (("max_step_ops", self.max_step_ops),
                                  ("max_chunks", self.max_chunks)) if v is not None}

    @cached_property
    def runtime(self) -> Cluster:
        """The cluster as the profile's runtime moves bytes on it (NVLink at NCCL's rate
        under ``nvlink: nccl``): what the planners plan on."""
        from ..analysis.native.clusters import runtime_cluster
        return runtime_cluster(self.cluster, self.profile)

    @cached_property
    def bounds(self) -> Bounds:
        """The lower bounds on :attr:`where`, each computed once for the request."""
        from ..analysis.bound import collective_bound, latency_bound, rsag_bound
        where, size = self.where, self.effective_size
        if where.nranks < 2:
            return Bounds(0.0)
        lower = collective_bound(where, size, self.collective)
        rsag = rsag_bound(where, size) if self.collective == "allreduce" else None
        latency = None if self.profile.is_ideal else latency_bound(
            where, size, self.profile, self.collective)
        return Bounds(lower, rsag, latency)

    @cached_property
    def yardsticks(self) -> Yardsticks:
        """What every simulation of the request is measured against: the lower bound and
        NCCL's own row (:func:`topoplan.analysis.sim.simulate`'s ``yardsticks``)."""
        from ..analysis.sim.report import Yardsticks
        from ..analysis.sim.run import nccl_row
        return Yardsticks(self.effective_size, self.collective, self.bounds.lower_s,
                          nccl_row(self.where, self.effective_size, self.collective))

    @property
    def effective_size(self) -> int:
        """The bytes whole fp32 elements cover (the simulator's size)."""
        return (self.size // 4) * 4

    def with_options(self, **options: Any) -> PlanRequest:
        return replace(self, options=MappingProxyType({**self.options, **options}))

    def for_planner(self, name: str) -> PlanRequest:
        """The request as planner ``name`` plans it: a planner that does not plan the
        channels itself plans to the caps over the channels (every chunk and op is
        ``channels`` of them once cut)."""
        from .channels import per_channel
        from .registry import SPECS
        if not isinstance(self.channels, int) or self.channels == 1 \
                or "channels" in SPECS[name].options:
            return self
        return replace(self, max_step_ops=per_channel(self.max_step_ops, self.channels),
                       max_chunks=per_channel(self.max_chunks, self.channels))

    def planner_options(self, name: str) -> dict[str, Any]:
        """The options planner ``name`` gets: the request's that it takes, and the
        channels and vectored messages when it plans them itself."""
        from .registry import SPECS
        spec = SPECS[name]
        options = {k: v for k, v in self.options.items() if k in spec.options}
        if self.channels != 1 and "channels" in spec.options:
            options.update(channels=self.channels, channel_skew=self.channel_skew)
        if self.vectored and "vectored" in spec.options:
            options["vectored"] = True
        return options

    def plans_itself(self, name: str) -> tuple[bool, bool]:
        """Whether planner ``name`` plans (and prices) the channels and the vectored
        messages itself."""
        from .registry import SPECS
        options = SPECS[name].options
        return (self.channels != 1 and "channels" in options,
                self.vectored and "vectored" in options)
