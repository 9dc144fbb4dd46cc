"""What a native collective step costs (IR v3), under a cost profile.

A native step is the transport's own collective over a group of ranks
(:class:`topoplan.ir.schedule.Native`). Its price depends on who runs it, which the
profile says (docs/COST_MODEL.md, "Native steps"):

- ``native: nccl`` (the ``nccl`` profile): NCCL's own collective over the group, from
  the NCCL model on the group's GPUs, their boxes' NICs and the fabric
  (:func:`topoplan.analysis.native.nccl.nccl_group_time`): NCCL's algorithm, protocol
  and channels for that communicator, its tuner's time, and the bytes the algorithm
  lays on every link. Over every rank in rank order it is the ``nccl`` row exactly.
- ``native: {allreduce: {alpha, alpha_per_rank, bandwidth}, ...}`` (calibrated
  profiles): the transport's measured collective
  (:class:`~topoplan.analysis.cost.NativeCost`), on top of the bytes a ring over the
  group moves on the links.
- ``ideal`` (no costs but the links): on a GPU cluster, NCCL's own algorithm over the
  group, as under ``nccl``, paying its links alone: the bytes NCCL's choice lays on each
  link, after the path latencies of a ring over the group (its steps times the slowest
  hop), with no software latency, tuner floor or protocol start-up, so that the
  ``nccl`` row is measured by the same rule as every plan (on a calibrated host, where
  NCCL does not run, a ring as below).
- no ``native`` entry for the kind (a profile calibrated before native steps existed):
  a ring over the group in group order, reduce-scatter then allgather (a pipelined
  chain from the root for broadcast and reduce), on the links it loads, with each of
  its steps paying the profile's step, posting and message costs and its adds; the
  price says so in its ``note``.

A price is a *floor* (the op cannot end sooner after it starts), a *latency* (its bytes
start to move that long after it starts) and *loads* (the bytes it moves over each
directed link of the cluster). Alone on the cluster it takes ``max(floor, latency +
the busiest link's bytes over its bandwidth)`` (:attr:`NativePrice.time_s`); the
simulator shares its links max-min fairly with whatever else flows at the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..cost import CostProfile, get_profile, native_bus_factor

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["NativePrice", "native_price", "ring_loads"]

Edge = tuple[str, str]
_KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")


@dataclass(frozen=True)
class NativePrice:
    """The price of one native collective (see the module notes).

    Attributes
    ----------
    kind : str
        ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast`` or ``reduce``.
    group : tuple of int
        Its ranks, in group order.
    nbytes : int
        Bytes of its range (a reduce-scatter's input, an allgather's output).
    floor_s : float
        It ends no sooner than this after it starts (NCCL's tuner time, the measured
        collective's time; 0 for a ring).
    latency_s : float
        Its bytes start to move this long after it starts (NCCL's latency term; the
        ring's steps' latencies, software costs and adds).
    loads : mapping
        Bytes over each directed edge ``(u, v)`` of the cluster's graph.
    time_s : float
        Alone on the cluster: ``max(floor_s, latency_s + busiest link)``.
    source : str
        Who prices it: ``"NCCL Ring/Simple x16"``, ``"measured"``, ``"ring"``.
    note : str
        Why it is priced as a ring when the profile does not price it (empty
        otherwise).
    busy : bool
        Whether its ranks count as working while it runs (a ring on a calibrated
        host's cores); a measured collective's time already holds the host's sharing.
    """

    kind: str
    group: tuple[int, ...]
    nbytes: int
    floor_s: float
    latency_s: float
    loads: Mapping[Edge, float] = field(default_factory=lambda: MappingProxyType({}))
    time_s: float = 0.0
    source: str = "ring"
    note: str = ""
    busy: bool = False


def native_price(cluster: Cluster, kind: str, group: Iterable[int], nbytes: int,
                 profile: CostProfile | str | None = None, *,
                 links: Cluster | None = None) -> NativePrice:
    """The price of a native ``kind`` over ``group`` on ``nbytes`` bytes.

    Parameters
    ----------
    cluster : Cluster
        As written (the NCCL model counts NVLink itself).
    kind : str
    group : iterable of int
        Ranks of ``cluster``, distinct, in group order.
    nbytes : int
        Bytes of the op's range.
    profile : CostProfile or str, optional
        Default :data:`~topoplan.analysis.cost.DEFAULT_PROFILE` (``nccl``).
    links : Cluster, optional
        The cluster as the profile's runtime moves bytes on it
        (:func:`~topoplan.analysis.native.clusters.runtime_cluster`; computed when not
        given): the ring's routes and the bandwidths ``time_s`` divides by.

    Returns
    -------
    NativePrice
        Nothing to pay for one rank or no bytes (the transport returns at once).

    Raises
    ------
    ValueError
        For an unknown kind or a bad group.
    """
    from .clusters import runtime_cluster

    if kind not in _KINDS:
        raise ValueError(f"unknown native collective {kind!r}; expected one of "
                         f"{', '.join(_KINDS)}")
    members = tuple(int(r) for r in group)
    if len(set(members)) != len(members) or not members:
        raise ValueError(f"a group names each of its ranks once, got {list(members)}")
    bad = [r for r in members if not 0 <= r < cluster.nranks]
    if bad:
        raise ValueError(f"group names rank {bad[0]}, outside range({cluster.nranks})")
    costs = get_profile(profile)
    links = runtime_cluster(cluster, costs) if links is None else links
    nbytes = int(nbytes)
    if len(members) < 2 or nbytes <= 0:
        return NativePrice(kind, members, nbytes, 0.0, 0.0, source="nothing to move")
    note = ""
    if costs.native_model == "nccl" or costs.is_ideal:
        priced = _nccl(cluster, kind, members, nbytes)
        if isinstance(priced, NativePrice):
            if costs.native_model != "nccl":  # ideal: NCCL's algorithm on the links alone
                from dataclasses import replace
                _, hops = ring_loads(links, kind, members, nbytes)
                priced = replace(priced, floor_s=0.0, time_s=0.0,
                                 latency_s=_ring_steps(kind, len(members)) * max(hops),
                                 source=f"{priced.source}, links alone")
            return _timed(priced, links)
        if costs.native_model == "nccl":
            note = priced
    measured = costs.native_cost(kind)
    loads, hop_latency = ring_loads(links, kind, members, nbytes)
    steps = _ring_steps(kind, len(members))
    if measured is not None:
        floor = measured.time(kind, len(members), nbytes)
        return _timed(NativePrice(kind, members, nbytes, floor, steps * max(hop_latency),
                                  MappingProxyType(loads), source="measured"), links)
    if not note and not costs.is_ideal:
        note = (f"native {kind} priced as a point-to-point ring over its group: profile "
                f"{costs.name!r} has no native.{kind} (topoplan calibrate measures it)")
    latency = _ring_software(links, costs, kind, members, nbytes, hop_latency)
    return _timed(NativePrice(kind, members, nbytes, 0.0, latency, MappingProxyType(loads),
                              source="ring", note=note, busy=not costs.is_ideal), links)


def _nccl(cluster: Cluster, kind: str, members: tuple[int, ...],
          nbytes: int) -> NativePrice | str:
    """NCCL's price, or why there is none (a note)."""
    from ...cluster import HostCluster
    from .nccl import nccl_group_time

    if isinstance(cluster, HostCluster):
        return (f"native {kind} priced as a point-to-point ring over its group: the NCCL "
                f"model prices GPU clusters, not the host {cluster.name!r}")
    try:
        choice, model, sub = nccl_group_time(cluster, members, kind, nbytes)
    except ValueError as exc:
        return f"native {kind} over {list(members)} priced as a ring: {exc}"
    loads: dict[Edge, float] = {}
    for edge, amount in model.edge_loads(choice).items():
        key = sub.edge(edge)
        loads[key] = loads.get(key, 0.0) + amount
    return NativePrice(kind, members, nbytes, choice.tuner_time_s, choice.latency_s,
                       MappingProxyType(loads), choice.time_s, f"NCCL {choice.label()}")


def _timed(price: NativePrice, links: Cluster) -> NativePrice:
    """``price`` with ``time_s`` alone on ``links`` (kept when already set: NCCL's own)."""
    if price.time_s > 0:
        return price
    graph = links.graph
    busiest = max((amount / graph.edges[edge]["bandwidth"] for edge, amount
                   in price.loads.items()), default=0.0)
    from dataclasses import replace
    return replace(price, time_s=max(price.floor_s, price.latency_s + busiest))


def _ring_steps(kind: str, g: int) -> int:
    """Steps of the ring (chain) a native ``kind`` over ``g`` ranks runs as."""
    return 2 * (g - 1) if kind == "allreduce" else g - 1


def ring_loads(links: Cluster, kind: str, group: tuple[int, ...],
               nbytes: int) -> tuple[dict[Edge, float], list[float]]:
    """Bytes a ring over ``group`` (in group order) moves over each directed edge of
    ``links`` for a native ``kind`` of ``nbytes`` bytes, and each hop's latency (the
    slowest of its equal-cost paths).

    Every hop ``group[i] -> group[i + 1]`` (and the last back to the first) carries
    ``bus(g) * nbytes`` (nccl-tests' bus factor: ``2 (g - 1) / g`` for an allreduce,
    ``(g - 1) / g`` for a reduce-scatter or an allgather), split evenly over the
    cluster's equal-cost routes; a broadcast or a reduce is a pipelined chain from the
    root along the ring, whose every hop carries the buffer (all ``g`` hops are
    counted: the root's place does not move the busiest link).
    """
    g = len(group)
    per_hop = native_bus_factor(kind, g) * nbytes
    loads: dict[Edge, float] = {}
    latency = []
    graph = links.graph
    for i in range(g):
        a, b = group[i], group[(i + 1) % g]
        paths = links.route_edges(a, b)
        share = per_hop / len(paths)
        slowest = 0.0
        for path in paths:
            slowest = max(slowest, sum(graph.edges[e]["latency"] for e in path))
            for edge in path:
                loads[edge] = loads.get(edge, 0.0) + share
        latency.append(slowest)
    return loads, latency


def _ring_software(links: Cluster, costs: CostProfile, kind: str, group: tuple[int, ...],
                   nbytes: int, hop_latency: list[float]) -> float:
    """Seconds a ring's steps pay besides their bytes: each step its step overhead, two
    posted ops, the slowest hop's alpha and path latency; then the adds (``g - 1`` parts
    of ``nbytes / g`` for an allreduce, a reduce-scatter and a reduce)."""
    import numpy as np

    g = len(group)
    message = nbytes / g if kind in ("allreduce", "reduce_scatter", "allgather") else nbytes
    boxes = [links.box_index(r) for r in group]
    network = np.array([boxes[i] != boxes[(i + 1) % g] for i in range(g)])
    alphas = np.asarray(costs.alphas(np.full(g, message), network), dtype=np.float64)
    step = costs.step_overhead + 2 * costs.op_overhead + float(np.max(alphas + hop_latency))
    adds = 0.0
    if costs.reduce_bandwidth is not None and kind in ("allreduce", "reduce_scatter", "reduce"):
        adds = (g - 1) * (nbytes / g) / costs.reduce_bandwidth
    return _ring_steps(kind, g) * step + adds
