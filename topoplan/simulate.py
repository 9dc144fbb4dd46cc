"""An event-driven, flow-level simulator of a schedule on a cluster.

Model (DESIGN.md semantics, plus time and a :class:`~topoplan.cost.CostProfile` of the
runtime; docs/COST_MODEL.md states it with a worked example):

- every rank starts after the profile's ``call_overhead`` and runs its steps in order;
  a step starts when the previous one ends;
- a step with ops pays ``step_overhead``, then posts its ops one after another,
  receives first, ``op_overhead`` each;
- a message (the k-th send src->dst matched with the k-th recv at dst from src) starts
  when both its send and its recv are posted, waits the profile's ``alpha`` for its
  link class (both ranks in one box, or not) plus the latency of its path, then flows
  along ``cluster.route_edges(src, dst)``, split evenly over the equal-cost paths;
  messages of zero bytes are not sent (the executor skips them) and cost nothing;
- every directed link is shared max-min fairly among the flows crossing it
  (progressive filling);
- a step ends when its last op is posted and its messages are done, then adds its
  reducing receives' bytes at ``reduce_bandwidth`` (the executor adds after the wait).

The report splits the time along the critical path into bandwidth (bytes flowing,
link sharing included), latency (alpha and path latency), overhead (call, step, posting)
and reduction (``SimReport.breakdown``). On a host with fewer cores than ranks
(:class:`topoplan.cluster.HostCluster`, the machine a profile was calibrated on), ranks
that work at once take turns on the cores: the stretch is the ``contention`` part.

The engine works on arrays: all transfers are matched up front (and cached per
schedule), messages that can never share a link are timers known at launch, and the
others advance in lookahead windows, each connected component of flows on its own
clock; see the notes above ``_Flat`` below. ``_simulate_reference`` is the first,
simpler engine (global event batches, global re-rating), kept as the tests' oracle.
"""

from __future__ import annotations

import gc
import math
import time as _time
import weakref
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from .bound import lower_bound
from .cluster import Cluster
from .cost import IDEAL, CostProfile, get_profile
from .errors import ScheduleError
from .schedule import OpKind, Schedule

__all__ = ["simulate", "SimReport", "TransferRecord"]

Edge = tuple[str, str]
_EPS_T = 1e-9  # events closer than this (relative to the clock) are one batch


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """One simulated message (``record=True``).

    ``start_s`` is when both its send and its recv are posted; ``end_s`` the arrival of
    the last byte (a reducing recv adds it when its step's messages are all done).
    Messages of zero bytes are not sent: their ``start_s`` and ``end_s`` are equal.
    """

    src: int
    dst: int
    src_step: int
    dst_step: int
    chunk: int
    nbytes: int
    start_s: float
    end_s: float
    count: int = 1  #: chunks ``chunk .. chunk + count - 1`` (IR v2 ranges)


@dataclass(frozen=True)
class SimReport:
    """What :func:`simulate` predicts for one schedule, cluster and size.

    Attributes
    ----------
    cluster, algorithm : str
        Names (``cluster.name``, ``schedule.meta["algorithm"]``).
    nranks, size : int
        Ranks; bytes per rank.
    time_s : float
        When the last rank finishes its last step.
    lower_bound_s : float
        :func:`topoplan.bound.lower_bound` for this cluster and size.
    algbw, busbw : float
        ``size / time_s`` and ``algbw * 2(n-1)/n`` in bytes/s (nccl-tests conventions).
    link_bytes : mapping
        Bytes that crossed each directed edge ``(u, v)`` of ``cluster.graph``.
    link_busy_s : mapping
        Seconds each directed edge carried at least one flow.
    step_times : tuple
        ``step_times[rank][step] == (start_s, end_s)``.
    transfers : tuple of TransferRecord
        Every message, only with ``record=True`` (else empty).
    link_timeline : mapping
        ``edge -> ((t, rate), ...)``: the piecewise-constant rate (bytes/s) on each edge,
        one entry per change; only with ``record=True`` (else empty).
    profile : str
        The cost profile's name.
    breakdown : mapping
        ``time_s`` split along the critical path: ``bandwidth`` (bytes flowing, link
        sharing included), ``latency`` (alpha and path latency), ``overhead`` (call, step
        and posting costs), ``reduce`` (adds) and ``contention`` (ranks taking turns on a
        host with fewer cores than ranks; 0 elsewhere); the parts sum to ``time_s``.
    messages : int
        Messages that move bytes at this size.
    """

    cluster: str
    algorithm: str
    nranks: int
    size: int
    time_s: float
    lower_bound_s: float
    algbw: float
    busbw: float
    link_bytes: Mapping[Edge, float]
    link_busy_s: Mapping[Edge, float]
    step_times: tuple[tuple[tuple[float, float], ...], ...]
    transfers: tuple[TransferRecord, ...] = ()
    link_timeline: Mapping[Edge, tuple[tuple[float, float], ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    profile: str = "ideal"
    breakdown: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    messages: int = 0

    @property
    def efficiency(self) -> float:
        """``lower_bound_s / time_s`` (1.0 = optimal; 1.0 when nothing had to move)."""
        if self.time_s <= 0:
            return 1.0
        return self.lower_bound_s / self.time_s

    def busiest_links(self, k: int = 5) -> list[tuple[Edge, float, float]]:
        """The ``k`` edges busy longest, as ``(edge, busy_s, bytes)``, busiest first."""
        ranked = sorted(self.link_busy_s.items(),
                        key=lambda item: (-item[1], -self.link_bytes.get(item[0], 0.0), item[0]))
        return [(edge, busy, self.link_bytes.get(edge, 0.0)) for edge, busy in ranked[:k]]


def simulate(cluster: Cluster, schedule: Schedule, size: int, *,
             profile: CostProfile | str | None = None, dtype_size: int = 4,
             reduce_bandwidth: float | None = None, alpha: float = 0.0, record: bool = False,
             progress: Callable[[float, float], None] | None = None) -> SimReport:
    """Predict how long ``schedule`` takes on ``cluster`` for ``size`` bytes per rank.

    Parameters
    ----------
    cluster : Cluster
    schedule : Schedule
        Must have ``cluster.nranks`` ranks. It need not be verified: unmatched messages
        and deadlocks raise :class:`ScheduleError`.
    size : int
        Buffer bytes per rank; chunks cover ``size // dtype_size`` elements.
    profile : CostProfile or str, optional
        The runtime's costs (a :class:`~topoplan.cost.CostProfile`, a shipped name such as
        ``"nccl"`` or a profile YAML path). Default: ``ideal`` (links only) plus ``alpha``
        and ``reduce_bandwidth``.
    dtype_size : int
        Bytes per element (4 for fp32).
    reduce_bandwidth : float, optional
        Without ``profile``: bytes/s a rank adds at (after each step's messages).
        ``None``: free.
    alpha : float
        Without ``profile``: seconds per message, paid before it flows.
    record : bool
        Also return every transfer and each link's rate over time.
    progress : callable, optional
        ``progress(fraction_of_steps_done, simulated_time)``, called about once a second
        of wall time on long runs.

    Returns
    -------
    SimReport

    Raises
    ------
    ScheduleError
        If the schedule's rank count differs from the cluster's, a message is
        unmatched, or the ranks deadlock.
    ProfileError
        For an unknown profile name or a bad profile file.

    Notes
    -----
    Cost: O(ops) to flatten and match messages (cached per schedule object), then one
    vectorized pass per wave of fixed-rate messages (about one per step of a ring) and
    one per lookahead window of link-sharing flows, each O(messages in it). 256 MiB on
    ``topologies/leaf_spine_1024.yaml``: ring ~6 s, hierarchical ~3 s on a 2-core
    machine (``scripts/bench_simulate.py``).
    """
    if schedule.nranks != cluster.nranks:
        raise ScheduleError(
            f"the schedule has {schedule.nranks} ranks but cluster {cluster.name!r} has "
            f"{cluster.nranks} GPUs; plan it for this cluster")
    if dtype_size < 1:
        raise ValueError(f"dtype_size must be >= 1, got {dtype_size}")
    costs = _costs(profile, alpha, reduce_bandwidth)
    # The cyclic GC would rescan the schedule's millions of ops each time the report's
    # millions of (start, end) tuples trigger a collection (seconds at 1024 ranks); the
    # engine makes no reference cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        engine = _Engine(cluster, schedule, int(size), dtype_size, costs, record, progress)
        engine.run()
        return engine.report()
    finally:
        if collecting:
            gc.enable()


def _costs(profile: CostProfile | str | None, alpha: float,
           reduce_bandwidth: float | None) -> CostProfile:
    """The profile to simulate with: ``profile``, or ideal plus the two plain costs."""
    if reduce_bandwidth is not None and not reduce_bandwidth > 0:
        raise ValueError(f"reduce_bandwidth must be > 0, got {reduce_bandwidth}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if profile is not None:
        if alpha or reduce_bandwidth is not None:
            raise ValueError("give the costs either as a profile or as alpha and "
                             "reduce_bandwidth, not both (profile.with_costs changes one)")
        return get_profile(profile)
    if not alpha and reduce_bandwidth is None:
        return IDEAL
    return IDEAL.with_costs(name="custom", alpha_box=float(alpha), alpha_network=float(alpha),
                            reduce_bandwidth=reduce_bandwidth)


# ----------------------------------------------------------------------------------
# How the engine stays fast (numbers for a 1024-rank ring on leaf_spine_1024 are in
# scripts/bench_simulate.py):
#
# 1. Transfers that share (send step, recv step, bytes, reduce) are one *message* of
#    multiplicity k: k identical max-min flows on the same paths, carried as one flow of
#    weight k. A hierarchical plan's in-box step moving 128 chunks to one peer is then
#    one message, not 128.
# 2. Fixed messages. A link whose users (over the whole schedule) all have the same
#    source rank can only carry messages of that rank's current send step (steps run
#    in order and a step ends after its sends arrive); likewise for one destination
#    rank. A message whose every link is such a link, and that is the only message of
#    its send (resp. recv) step on it, never shares a link with another message: its
#    rate is its solo max-min rate for its whole life and its arrival time is known at
#    launch. Such messages are timers (most of a ring or an in-box phase). Timers are
#    drained eagerly, out of time order: everything downstream of a timer is a max()
#    of times, and anything it launches starts later than it.
# 3. The rest (dynamic flows) are simulated in time order, but in windows: a message
#    launched now reaches its first link no sooner than ``lookahead`` = alpha + the
#    smallest latency of a dynamic path, so during [t0, t0 + lookahead) the set of
#    flows that can be on the network is known, and its connected components (flows
#    joined by shared links) evolve independently. Each component advances on its own
#    clock through the window, all components at once in numpy; only components with
#    an event are re-rated (max-min fairness decomposes over components exactly).
# 4. Max-min rates by parallel water-filling: every link whose fair share is no larger
#    than the share of any flow crossing it freezes in the same round (shares only
#    grow during progressive filling, so this is exact), so the rounds are the depth of
#    the bottleneck dependency, not the number of distinct rates.
# 5. Links that carry exactly the same paths (a GPU's edge to its NIC and the NIC's edge
#    to its leaf) carry the same flows at all times: the dynamic engine re-rates over
#    one link per such class (the one of least capacity; the others cannot bind) and
#    copies its load to the rest. On leaf-spine fabrics that removes a third of the
#    (flow, link) pairs. What remains costly: on a pipelined multi-level plan (the mcf
#    grid at 1024 GPUs) the flows crossing spines form one or two components of
#    thousands of flows with hundreds of events per lookahead window, each a global
#    re-rate of the component.
# ----------------------------------------------------------------------------------

_INF = math.inf


class _Flat:
    """A schedule's ops flattened and matched into transfers (independent of size).

    Cached per Schedule object (``simulate --sizes`` and the planners' candidate loop
    simulate one schedule at many sizes): flattening 4 M ops costs seconds.
    """

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        n = schedule.nranks
        nsteps = np.fromiter((len(p.steps) for p in schedule.ranks), np.int64, count=n)
        self.step_base = np.concatenate([[0], np.cumsum(nsteps)]).astype(np.int64)
        nglobal = int(self.step_base[-1])
        self.nglobal = nglobal
        self.step_rank = np.repeat(np.arange(n), nsteps)
        self.step_last = np.repeat(self.step_base[1:], nsteps)  # one past the rank's last step
        steps = list(chain.from_iterable(p.steps for p in schedule.ranks))
        nops = np.fromiter(map(len, steps), np.int64, count=nglobal)
        ops = list(chain.from_iterable(steps))
        total = len(ops)
        op_step = np.repeat(np.arange(nglobal, dtype=np.int64), nops)
        is_send = np.fromiter(map(OpKind.SEND.__eq__, map(attrgetter("kind"), ops)), bool,
                              count=total)
        peer = np.fromiter(map(attrgetter("peer"), ops), np.int64, count=total)
        chunk = np.fromiter(map(attrgetter("chunk"), ops), np.int64, count=total)
        reduce = np.fromiter(map(attrgetter("reduce"), ops), bool, count=total)
        count = np.fromiter(map(attrgetter("count"), ops), np.int64, count=total)
        del ops, steps
        self.ops_per_step = nops
        # Columns: step, peer, chunk, count, program position (and reduce for recvs).
        index = np.arange(total, dtype=np.int64)
        sends = np.stack([op_step[is_send], peer[is_send], chunk[is_send], count[is_send],
                          index[is_send]], axis=1)
        rmask = ~is_send
        recvs = np.stack([op_step[rmask], peer[rmask], chunk[rmask], count[rmask],
                          index[rmask], reduce[rmask].astype(np.int64)], axis=1)
        self._match(sends, recvs)

    def _match(self, sends: np.ndarray, recvs: np.ndarray) -> None:
        """Pair the k-th send src->dst with the k-th recv at dst from src, vectorized."""
        n = self.schedule.nranks
        s_src = self.step_rank[sends[:, 0]] if len(sends) else np.zeros(0, np.int64)
        r_dst = self.step_rank[recvs[:, 0]] if len(recvs) else np.zeros(0, np.int64)
        s_key = s_src * n + sends[:, 1]
        r_key = recvs[:, 1] * n + r_dst
        s_order = np.argsort(s_key, kind="stable")  # stable: program order within a pair
        r_order = np.argsort(r_key, kind="stable")
        if len(s_key) != len(r_key) or not np.array_equal(s_key[s_order], r_key[r_order]):
            self._unmatched(sends, recvs, s_key, r_key)
        sends, recvs = sends[s_order], recvs[r_order]
        bad = np.flatnonzero((sends[:, 2] != recvs[:, 2]) | (sends[:, 3] != recvs[:, 3]))
        if len(bad):
            i = bad[0]
            src, dst = int(self.step_rank[sends[i, 0]]), int(sends[i, 1])
            raise ScheduleError(
                f"{self.schedule.algorithm} schedule: a message from rank {src} to rank {dst}: "
                f"rank {src} step {self.local(sends[i, 0])} sends {_chunk_text(sends[i])} but "
                f"rank {dst} step {self.local(recvs[i, 0])} receives it as "
                f"{_chunk_text(recvs[i])}")
        self.t_src = self.step_rank[sends[:, 0]]
        self.t_dst = sends[:, 1].copy()
        self.t_sstep = sends[:, 0].copy()
        self.t_rstep = recvs[:, 0].copy()
        self.t_chunk = sends[:, 2].copy()
        self.t_count = sends[:, 3].copy()
        self.t_sop = sends[:, 4].copy()  # program position of the send and of the recv
        self.t_rop = recvs[:, 4].copy()
        self.t_reduce = recvs[:, 5].astype(bool)

    def local(self, g: int) -> int:
        return int(g - self.step_base[self.step_rank[g]])

    def _unmatched(self, sends, recvs, s_key, r_key) -> None:
        n = self.schedule.nranks
        s_keys, s_counts = np.unique(s_key, return_counts=True)
        r_keys, r_counts = np.unique(r_key, return_counts=True)
        s_map = dict(zip(s_keys.tolist(), s_counts.tolist()))
        r_map = dict(zip(r_keys.tolist(), r_counts.tolist()))
        for key in sorted(set(s_map) | set(r_map)):
            ns, nr = s_map.get(key, 0), r_map.get(key, 0)
            if ns == nr:
                continue
            src, dst = divmod(key, n)
            name = f"{self.schedule.algorithm} schedule"
            if ns > nr:
                row = sends[np.flatnonzero(s_key == key)[nr]]
                raise ScheduleError(
                    f"{name}: unmatched send: rank {src} step {self.local(row[0])} sends "
                    f"{_chunk_text(row)} to rank {dst}, which receives only {nr} of {ns} messages from "
                    f"rank {src}")
            row = recvs[np.flatnonzero(r_key == key)[ns]]
            raise ScheduleError(
                f"{name}: unmatched recv: rank {dst} step {self.local(row[0])} waits for "
                f"{_chunk_text(row)} from rank {src}, which sends only {ns} of {nr} messages to rank {dst}")


def _chunk_text(row: np.ndarray) -> str:
    """``chunk 3`` or ``chunks 3..6`` for an op row (step, peer, chunk, count, ...)."""
    first, count = int(row[2]), int(row[3])
    return f"chunk {first}" if count == 1 else f"chunks {first}..{first + count - 1}"


_FLAT_CACHE: dict[int, _Flat] = {}


def _flat(schedule: Schedule) -> _Flat:
    key = id(schedule)
    flat = _FLAT_CACHE.get(key)
    if flat is None or flat.schedule is not schedule:
        flat = _Flat(schedule)
        _FLAT_CACHE[key] = flat
        weakref.finalize(schedule, _FLAT_CACHE.pop, key, None)
    return flat


def _expand(ptr: np.ndarray, items: np.ndarray, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR gather: ``items[ptr[w]:ptr[w+1]]`` for each ``w`` in ``which``, concatenated,
    and the position in ``which`` each item came from."""
    lo = ptr[which]
    lengths = ptr[which + 1] - lo
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(which)), lengths)
    idx = np.arange(total) + np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
    return items[idx], owner


def _maxmin(nflows: int, weight: np.ndarray, pf: np.ndarray, pe: np.ndarray,
            cap: np.ndarray) -> np.ndarray:
    """Max-min fair rate per unit of each flow (Bertsekas and Gallager, 6.5.2).

    Flow ``f`` stands for ``weight[f]`` identical flows; ``(pf[i], pe[i])`` are the
    (flow, link) incidence pairs, links numbered ``0..len(cap)-1``. Parallel
    water-filling: a link whose share (capacity left over unfrozen flows) is no larger
    than the smallest share seen by any of its flows is a bottleneck of all of them
    (shares never fall while filling), so all such links freeze in one round.
    """
    nlinks = len(cap)
    rate = np.zeros(nflows)
    remaining = cap.astype(np.float64, copy=True)
    share = np.empty(nlinks)
    fmin = np.empty(nflows)
    lmin = np.empty(nlinks)
    w = weight[pf]
    while len(pf):
        count = np.bincount(pe, weights=w, minlength=nlinks)
        share.fill(_INF)
        np.divide(remaining, count, out=share, where=count > 0)
        fmin.fill(_INF)
        np.minimum.at(fmin, pf, share[pe])
        lmin.fill(_INF)
        np.minimum.at(lmin, pe, fmin[pf])
        tight = share <= lmin * (1 + 1e-12)
        hit = np.zeros(nflows, dtype=bool)
        hit[pf[tight[pe]]] = True
        rate[hit] = fmin[hit]
        frozen = hit[pf]
        remaining -= np.bincount(pe[frozen], weights=w[frozen] * rate[pf[frozen]],
                                 minlength=nlinks)
        np.maximum(remaining, 0.0, out=remaining)
        keep = ~frozen
        pf, pe, w = pf[keep], pe[keep], w[keep]
    return rate


@dataclass(frozen=True)
class _RouteTable:
    """Every (src, dst) pair's ECMP paths as CSR arrays over the graph's edges.

    ``pair_ptr`` indexes paths per pair, ``path_ptr`` edges per path; ``path_lat``
    is each path's latency. Built once per simulation from ``cluster.route_edges``.
    """

    edges: list
    cap: np.ndarray
    pair_inverse: np.ndarray
    path_edges: np.ndarray
    path_ptr: np.ndarray
    path_len: np.ndarray
    pair_ptr: np.ndarray
    pair_npaths: np.ndarray
    path_lat: np.ndarray
    npairs: int
    pair_keys: np.ndarray


def _route_table(cluster: Cluster, n: int, src: np.ndarray, dst: np.ndarray) -> _RouteTable:
    """Routes for the pairs ``(src[i], dst[i])``; raises ScheduleError for a pair with none."""
    graph = cluster.graph
    edges = list(graph.edges)
    edge_index = {e: i for i, e in enumerate(edges)}
    cap = np.array([graph.edges[e]["bandwidth"] for e in edges], dtype=np.float64)
    lat = np.array([graph.edges[e]["latency"] for e in edges], dtype=np.float64)
    pairs, inverse = np.unique(src * n + dst, return_inverse=True)
    path_edges: list[int] = []
    path_ptr = [0]
    pair_ptr = [0]
    for key in pairs.tolist():
        a, b = divmod(key, n)
        for path in cluster.route_edges(a, b):
            path_edges.extend(edge_index[e] for e in path)
            path_ptr.append(len(path_edges))
        pair_ptr.append(len(path_ptr) - 1)
    pe = np.array(path_edges, dtype=np.int64)
    pp = np.array(path_ptr, dtype=np.int64)
    pr = np.array(pair_ptr, dtype=np.int64)
    npaths = np.diff(pr)
    if len(pairs) and npaths.min() == 0:
        i = int(np.argmin(npaths))
        a, b = divmod(int(pairs[i]), n)
        raise ScheduleError(f"no route from rank {a} to rank {b} in cluster {cluster.name!r}")
    path_lat = np.add.reduceat(lat[pe], pp[:-1]) if len(pe) else np.zeros(0)
    return _RouteTable(edges=edges, cap=cap, pair_inverse=inverse.reshape(-1), path_edges=pe,
                       path_ptr=pp, path_len=np.diff(pp), pair_ptr=pr, pair_npaths=npaths,
                       path_lat=path_lat, npairs=len(pairs), pair_keys=pairs)


class _Setup:
    """What both engines start from: costs, chunk sizes, the flat schedule, and each
    transfer's and step's software costs at this size."""

    step_start: np.ndarray  # set by the engines' run()
    step_end: np.ndarray

    def __init__(self, cluster: Cluster, schedule: Schedule, size: int, dtype_size: int,
                 costs: CostProfile, record: bool,
                 progress: Callable[[float, float], None] | None) -> None:
        self.cluster, self.schedule, self.size = cluster, schedule, size
        self.dtype_size, self.costs, self.record = dtype_size, costs, record
        self.reduce_bandwidth = costs.reduce_bandwidth
        self.progress = progress
        nelems = size // dtype_size
        bounds = np.array(schedule.chunk_bounds(nelems), dtype=np.int64).reshape(-1, 2)
        self.chunk_bytes = (bounds[:, 1] - bounds[:, 0]) * dtype_size
        self.flat = flat = _flat(schedule)
        # Bytes of chunks [0, k): a transfer of chunks a..b-1 carries cum[b] - cum[a].
        cum = np.concatenate([[0], np.cumsum(self.chunk_bytes)]).astype(np.float64)
        self.t_bytes = cum[flat.t_chunk + flat.t_count] - cum[flat.t_chunk]
        self.step_base, self.step_rank, self.step_last = (flat.step_base, flat.step_rank,
                                                         flat.step_last)
        self.nglobal = flat.nglobal
        self.t0 = costs.call_overhead  # every rank's first step starts here
        self._software_costs()

    def _software_costs(self) -> None:
        """Per transfer: when its send and its recv are posted, after their steps start
        (``t_soff``, ``t_roff``). Per step: when its last op is posted (``step_post``) and
        how long its adds take after its messages (``step_red``)."""
        f, c = self.flat, self.costs
        nglobal = self.nglobal
        live = self.t_bytes > 0  # zero-byte messages are not sent
        self.t_live = live
        s_live, r_live = f.t_sstep[live], f.t_rstep[live]
        ops = (np.bincount(s_live, minlength=nglobal) + np.bincount(r_live, minlength=nglobal))
        self.step_ops = ops
        sigma = np.where(ops > 0, c.step_overhead, 0.0)
        self.step_post = sigma + ops * c.op_overhead
        self.t_soff = np.zeros(len(live))
        self.t_roff = np.zeros(len(live))
        if c.op_overhead > 0 or c.step_overhead > 0:
            # The executor posts a step's receives first, then its sends, each kind in
            # program order; the i-th op (from 0) is posted at sigma + (i + 1) o.
            nrecv = np.bincount(r_live, minlength=nglobal)
            rpos = _rank_within(r_live, f.t_rop[live])
            spos = nrecv[s_live] + _rank_within(s_live, f.t_sop[live])
            self.t_soff[live] = sigma[s_live] + (spos + 1) * c.op_overhead
            self.t_roff[live] = sigma[r_live] + (rpos + 1) * c.op_overhead
        self.step_red = np.zeros(nglobal)
        if self.reduce_bandwidth is not None:
            red = live & f.t_reduce
            self.step_red = np.bincount(f.t_rstep[red], weights=self.t_bytes[red],
                                        minlength=nglobal) / self.reduce_bandwidth

    def _pair_network(self, pair_keys: np.ndarray) -> np.ndarray:
        """Whether each (src * n + dst) pair crosses boxes (the ``network`` class)."""
        n = self.schedule.nranks
        if len(self.cluster.boxes) == 1:
            return np.zeros(len(pair_keys), dtype=bool)
        box = np.asarray([self.cluster.box_index(r) for r in range(n)], dtype=np.int64)
        src, dst = np.divmod(pair_keys, n)
        return box[src] != box[dst]

    def _contention(self, m_dst: np.ndarray, m_flow: np.ndarray, m_end: np.ndarray,
                    m_live: np.ndarray) -> Callable[[Any], Any] | None:
        """The time map of a host with fewer cores than ranks, or None.

        A rank works while it pays the call overhead, posts a step's ops, receives a
        message (from its launch: a transport's handshake and copies need the receiver
        on a core) and adds; otherwise it waits, and gives its core away. Where ``A`` ranks work at once on a host of ``C < A`` cores
        (:class:`topoplan.cluster.HostCluster`), they take turns: that stretch of time
        lasts ``A / C`` times as long (processor sharing, applied as one monotone
        stretch of the whole timeline). Returns ``t -> t'``.
        """
        cores = getattr(self.cluster, "cores", None)
        n = self.schedule.nranks
        if not cores or n <= cores or not self.nglobal:
            return None
        has = self.step_ops > 0
        post_end = self.step_start + self.step_post
        red_start = self.step_end - self.step_red
        busy = [(np.arange(n), np.zeros(n), np.full(n, self.t0)),
                (self.step_rank[has], self.step_start[has], post_end[has]),
                (self.step_rank, red_start, self.step_end),
                (m_dst[m_live], m_flow[m_live], m_end[m_live])]
        rank = np.concatenate([b[0] for b in busy])
        lo = np.concatenate([b[1] for b in busy])
        hi = np.concatenate([b[2] for b in busy])
        keep = hi > lo
        rank, lo, hi = rank[keep], lo[keep], hi[keep]
        if not len(lo):
            return None
        # Union of each rank's intervals: sorted by (rank, start), a new run starts where
        # the start passes every earlier end of the same rank (offset ranks apart).
        span = float(hi.max()) + 1.0
        order = np.lexsort((lo, rank))
        rank, lo, hi = rank[order], lo[order] + rank[order] * span, hi[order] + rank[order] * span
        reach = np.maximum.accumulate(hi)
        new = np.ones(len(lo), dtype=bool)
        new[1:] = lo[1:] > reach[:-1]
        starts = np.flatnonzero(new)
        u_lo = lo[starts] - rank[starts] * span
        u_hi = np.maximum.reduceat(hi, starts) - rank[starts] * span
        # Ranks at work over time, and the stretched clock at every change.
        times = np.concatenate([u_lo, u_hi])
        delta = np.concatenate([np.ones(len(u_lo)), -np.ones(len(u_hi))])
        order = np.argsort(times, kind="stable")
        times, working = times[order], np.cumsum(delta[order])
        factor = np.maximum(1.0, working[:-1] / cores)
        clock = np.concatenate([[times[0]], times[0] + np.cumsum(np.diff(times) * factor)])
        last_t, last_c = float(times[-1]), float(clock[-1])

        def warp(t: Any) -> Any:
            t = np.asarray(t, dtype=np.float64)
            out = np.interp(t, times, clock)
            return np.where(t > last_t, last_c + (t - last_t), out)

        return warp

    def _breakdown(self, m_sstep: np.ndarray, m_rstep: np.ndarray, m_launch: np.ndarray,
                   m_end: np.ndarray, m_delay: np.ndarray, m_soff: np.ndarray,
                   m_roff: np.ndarray, st_ptr: np.ndarray, st_msg: np.ndarray
                   ) -> dict[str, float]:
        """``time_s`` split along the critical path (see :class:`SimReport`).

        Walks back from the last step to end: a step's end is either its posting (step
        and op overhead) or its last message's arrival; a message's bandwidth time is its
        flow after alpha and path latency (``m_delay``), and its launch waits for the
        posting in the later of its two steps, whose start is the end of that rank's step
        before (or the call overhead).
        """
        out = {"bandwidth": 0.0, "latency": 0.0, "overhead": 0.0, "reduce": 0.0,
               "contention": 0.0}
        if not self.nglobal or not np.isfinite(self.step_end).all():
            return out
        start, end = self.step_start, self.step_end
        g = int(np.argmax(end))
        while True:
            red = float(self.step_red[g])
            out["reduce"] += red
            t = float(end[g]) - red
            lo, hi = int(st_ptr[g]), int(st_ptr[g + 1])
            msgs = st_msg[lo:hi]
            last = -1
            if len(msgs):
                ends = m_end[msgs]
                k = int(np.argmax(ends))
                if ends[k] >= float(start[g]) + float(self.step_post[g]) - 1e-12 * max(t, 1e-6):
                    last = int(msgs[k])
            if last < 0:  # the step waited for its own posting
                out["overhead"] += t - float(start[g])
                g2 = g
            else:
                flight = float(m_end[last] - m_launch[last])
                lat = min(float(m_delay[last]), flight)
                out["latency"] += lat
                out["bandwidth"] += flight - lat
                s_at = float(start[m_sstep[last]] + m_soff[last])
                r_at = float(start[m_rstep[last]] + m_roff[last])
                g2 = int(m_sstep[last] if s_at >= r_at else m_rstep[last])
                out["overhead"] += float(m_launch[last]) - float(start[g2])
            if g2 == self.step_base[self.step_rank[g2]]:  # the rank's first step
                out["overhead"] += float(start[g2])
                break
            g = g2 - 1
        return out


def _rank_within(group: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For each item, how many items of its ``group`` come before it by ``order``."""
    if not len(group):
        return np.zeros(0, np.int64)
    idx = np.lexsort((order, group))
    g = group[idx]
    first = np.ones(len(g), dtype=bool)
    first[1:] = g[1:] != g[:-1]
    starts = np.flatnonzero(first)
    run = np.repeat(starts, np.diff(np.append(starts, len(g))))
    out = np.empty(len(g), np.int64)
    out[idx] = np.arange(len(g)) - run
    return out


class _Engine(_Setup):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        flat = self.flat
        self._messages()
        self._routes()
        self._classify()

    # ------------------------------------------------------------------------------
    def _messages(self) -> None:
        """Merge transfers with the same send step, recv step, bytes and reduce flag."""
        f = self.flat
        ntr = len(f.t_src)
        if ntr and np.bincount(f.t_sstep).max() == 1:
            # One send per step (rings, trees): nothing to merge.
            self.t_msg = np.arange(ntr)
            self.m_soff, self.m_roff = self.t_soff, self.t_roff
            self.m_k = np.ones(ntr)
            self.m_sstep, self.m_rstep = f.t_sstep, f.t_rstep
            self.m_bytes, self.m_reduce = self.t_bytes, f.t_reduce
        elif ntr:
            # Transfers posted at different times (a per-op cost) flow from different
            # times: they stay apart.
            so, ro = self.t_soff, self.t_roff
            order = np.lexsort((ro, so, f.t_reduce, self.t_bytes, f.t_rstep, f.t_sstep))
            ss, rs = f.t_sstep[order], f.t_rstep[order]
            by, red = self.t_bytes[order], f.t_reduce[order]
            so, ro = so[order], ro[order]
            new = np.ones(ntr, dtype=bool)
            new[1:] = (ss[1:] != ss[:-1]) | (rs[1:] != rs[:-1]) | (by[1:] != by[:-1]) \
                | (red[1:] != red[:-1]) | (so[1:] != so[:-1]) | (ro[1:] != ro[:-1])
            first = np.flatnonzero(new)
            self.t_msg = np.empty(ntr, np.int64)
            self.t_msg[order] = np.cumsum(new) - 1
            self.m_k = np.diff(np.append(first, ntr)).astype(np.float64)
            self.m_sstep, self.m_rstep = ss[first], rs[first]
            self.m_bytes, self.m_reduce = by[first], red[first]
            self.m_soff, self.m_roff = so[first], ro[first]
        else:
            self.t_msg = np.zeros(0, np.int64)
            self.m_k = np.zeros(0)
            self.m_sstep = self.m_rstep = np.zeros(0, np.int64)
            self.m_bytes, self.m_reduce = np.zeros(0), np.zeros(0, bool)
            self.m_soff = self.m_roff = np.zeros(0)
        nmsg = len(self.m_k)
        self.m_n = self.m_k.astype(np.int64)  # ops each side of a message
        self.m_src = self.step_rank[self.m_sstep]
        self.m_dst = self.step_rank[self.m_rstep]
        nglobal = self.nglobal
        # Step -> messages touching it (both sides), CSR; ops per step.
        both_steps = np.concatenate([self.m_sstep, self.m_rstep])
        both_m = np.concatenate([np.arange(nmsg), np.arange(nmsg)])
        order = np.argsort(both_steps, kind="stable")
        self.st_msg = both_m[order]
        self.st_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(both_steps, minlength=nglobal))]).astype(np.int64)

    def _routes(self) -> None:
        """Path table: pair -> paths (CSR), path -> edges (CSR), latencies, bytes per link,
        each pair's solo max-min rates and its set of links."""
        cluster, n = self.cluster, self.schedule.nranks
        table = _route_table(cluster, n, self.m_src, self.m_dst)
        self.edges: list[Edge] = table.edges
        nedges = len(self.edges)
        self.cap = table.cap
        self.m_pair = table.pair_inverse
        self.path_edges, self.path_ptr, self.path_len = (table.path_edges, table.path_ptr,
                                                         table.path_len)
        self.pair_ptr, self.pair_npaths = table.pair_ptr, table.pair_npaths
        self.path_lat = table.path_lat
        self.pair_network = self._pair_network(table.pair_keys)
        npairs, npaths = table.npairs, len(table.path_len)
        self.path_pair = np.repeat(np.arange(npairs), self.pair_npaths)
        # Bytes per link are fixed by the routes: total per pair, spread over its paths.
        pair_bytes = np.bincount(self.m_pair, weights=self.m_bytes * self.m_k, minlength=npairs)
        per_path = np.repeat(pair_bytes / np.maximum(self.pair_npaths, 1), self.pair_npaths)
        per_edge = np.repeat(per_path, self.path_len)
        self.link_bytes = np.bincount(self.path_edges, weights=per_edge, minlength=nedges)
        # One transfer of each pair alone on the network: max-min over its own paths
        # (links renumbered per pair so that pairs do not interact).
        inc_path = np.repeat(np.arange(npaths), self.path_len)
        inc_key = self.path_pair[inc_path] * nedges + self.path_edges
        ukey, inc_local = np.unique(inc_key, return_inverse=True)
        inc_local = inc_local.reshape(-1)
        self.solo_rate = _maxmin(npaths, np.ones(npaths), inc_path, inc_local,
                                 self.cap[ukey % nedges])
        # Each pair's distinct links and the load one transfer puts on them.
        self.pe_edge = (ukey % nedges).astype(np.int64)
        self.pe_ptr = np.searchsorted(ukey // nedges, np.arange(npairs + 1)).astype(np.int64)
        self.pe_load = np.bincount(inc_local, weights=self.solo_rate[inc_path],
                                   minlength=len(ukey))
        self._link_classes()
        if npaths:
            lo = self.pair_ptr[:-1]
            rmax = np.maximum.reduceat(self.solo_rate, lo)
            rmin = np.minimum.reduceat(self.solo_rate, lo)
            lmax = np.maximum.reduceat(self.path_lat, lo)
            lmin = np.minimum.reduceat(self.path_lat, lo)
            self.pair_uniform = (rmin >= rmax * (1 - 1e-12)) & (lmin >= lmax - 1e-15)
            self.pair_lat = lmax
            self.pair_rate = rmin
        else:
            self.pair_uniform = np.zeros(0, bool)
            self.pair_lat = self.pair_rate = np.zeros(0)

    def _link_classes(self) -> None:
        """Links that carry exactly the same paths (a GPU's edge to its NIC and the NIC's
        edge to its switch) always carry the same flows: one stands for all of them in
        the dynamic engine, with the smallest capacity of the class (the others can never
        be tight). ``rpath_*`` are the paths over class representatives; ``rep_ptr`` /
        ``rep_members`` list each representative's class (CSR over edge ids)."""
        nedges, npaths = len(self.edges), len(self.path_len)
        inc_path = np.repeat(np.arange(npaths), self.path_len)
        order = np.lexsort((inc_path, self.path_edges))
        users = np.bincount(self.path_edges, minlength=nedges)
        per_edge = np.split(inc_path[order], np.cumsum(users)[:-1])
        first: dict[bytes, int] = {}
        rep = np.arange(nedges)
        # Representative: the smallest capacity, then the smallest index.
        for e in np.lexsort((np.arange(nedges), self.cap)).tolist():
            if users[e]:
                rep[e] = first.setdefault(per_edge[e].tobytes(), e)
        self.edge_rep = rep
        key = np.unique(inc_path * nedges + rep[self.path_edges])
        self.rpath_edges = key % nedges
        self.rpath_ptr = np.searchsorted(key // nedges, np.arange(npaths + 1)).astype(np.int64)
        order = np.argsort(rep, kind="stable")
        self.rep_members = order
        self.rep_ptr = np.concatenate(
            [[0], np.cumsum(np.bincount(rep, minlength=nedges))]).astype(np.int64)

    def _classify(self) -> None:
        """Which messages are fixed (never share a link; see the notes above)."""
        n, nedges, nmsg = self.schedule.nranks, len(self.edges), len(self.m_k)
        npairs = len(self.pair_npaths)
        pe_pair = np.repeat(np.arange(npairs), np.diff(self.pe_ptr))
        if npairs:
            src_of_pair, dst_of_pair = self._pair_src_dst()
            lo_s = np.full(nedges, n); hi_s = np.full(nedges, -1)
            lo_r = np.full(nedges, n); hi_r = np.full(nedges, -1)
            np.minimum.at(lo_s, self.pe_edge, src_of_pair[pe_pair])
            np.maximum.at(hi_s, self.pe_edge, src_of_pair[pe_pair])
            np.minimum.at(lo_r, self.pe_edge, dst_of_pair[pe_pair])
            np.maximum.at(hi_r, self.pe_edge, dst_of_pair[pe_pair])
            sx, rx = lo_s == hi_s, lo_r == hi_r  # links of one source / one destination
            ok_edge = (sx | rx)[self.pe_edge]
            pair_ok = np.minimum.reduceat(ok_edge.astype(np.int8), self.pe_ptr[:-1]) > 0
        else:
            sx = rx = np.zeros(nedges, bool)
            pair_ok = np.zeros(0, bool)
        moving = self.m_bytes > 0
        # Messages that are the only moving one on their send (recv) step.
        ns = np.bincount(self.m_sstep[moving], minlength=self.nglobal)
        nr = np.bincount(self.m_rstep[moving], minlength=self.nglobal)
        single = (ns[self.m_sstep] <= 1) & (nr[self.m_rstep] <= 1)
        fixed = ~moving | (self.pair_uniform[self.m_pair] & single & pair_ok[self.m_pair])
        # Steps with several moving messages: check link by link (counting every moving
        # message of the step, fixed candidate or not).
        todo = np.flatnonzero(moving & ~single)
        if len(todo):
            edges, owner = _expand(self.pe_ptr, self.pe_edge, self.m_pair[todo])
            m = todo[owner]
            ks = self.m_sstep[m] * nedges + edges
            kr = self.m_rstep[m] * nedges + edges
            _, inv_s, cnt_s = np.unique(ks, return_inverse=True, return_counts=True)
            _, inv_r, cnt_r = np.unique(kr, return_inverse=True, return_counts=True)
            ok = (sx[edges] & (cnt_s[inv_s.reshape(-1)] == 1)) \
                | (rx[edges] & (cnt_r[inv_r.reshape(-1)] == 1))
            bad = np.zeros(len(todo), dtype=bool)
            bad[owner[~ok]] = True
            todo = todo[~bad]
            fixed[todo[self.pair_uniform[self.m_pair[todo]]]] = True
        self.m_fixed = fixed
        # Fixed: arrival = launch + alpha + latency + duration.
        npth = self.pair_npaths[self.m_pair].astype(np.float64) if nmsg else np.zeros(0)
        rate = self.pair_rate[self.m_pair] if nmsg else np.zeros(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            dur = np.where(moving, self.m_k * self.m_bytes / npth / rate, 0.0)
        self.m_dur = np.where(fixed, dur, 0.0)
        # Alpha (by class and protocol) and path latency before the first byte; zero-byte
        # messages are not sent.
        self.m_alpha = (self.costs.alphas(self.m_bytes, self.pair_network[self.m_pair])
                        if nmsg else np.zeros(0))
        self.m_wait = np.where(moving, (self.m_alpha + self.pair_lat[self.m_pair])
                               if nmsg else 0.0, 0.0)
        self.m_delay = self.m_wait + self.m_dur
        dyn = np.flatnonzero(~fixed)
        if len(dyn):
            lat_min = np.minimum.reduceat(self.path_lat, self.pair_ptr[:-1])
            self.lookahead = float((self.m_alpha[dyn] + lat_min[self.m_pair[dyn]]).min())
        else:
            self.lookahead = _INF

    def _pair_src_dst(self) -> tuple[np.ndarray, np.ndarray]:
        npairs = len(self.pair_npaths)
        src = np.zeros(npairs, np.int64)
        dst = np.zeros(npairs, np.int64)
        src[self.m_pair] = self.m_src
        dst[self.m_pair] = self.m_dst
        return src, dst

    # ------------------------------------------------------------------------------
    def run(self) -> None:
        nglobal, nmsg, nedges = self.nglobal, len(self.m_k), len(self.edges)
        self.step_start = np.full(nglobal, np.nan)
        self.step_end = np.full(nglobal, np.nan)
        self.step_tmax = np.full(nglobal, -_INF)
        self.pending = self.flat.ops_per_step.copy()
        self.ready = np.full(nmsg, 2, dtype=np.int8)
        self.m_mark = np.zeros(nmsg, np.int64)
        self.m_start = np.full(nmsg, np.nan)
        self.m_end = np.full(nmsg, np.nan)
        self.m_left = np.zeros(nmsg, np.int64)
        self.m_tmax = np.full(nmsg, -_INF)
        # A fixed message keeps its links busy for its duration, alone: known up front.
        pair_busy = np.bincount(self.m_pair, weights=self.m_dur, minlength=len(self.pair_npaths))
        pe_pair = np.repeat(np.arange(len(self.pair_npaths)), np.diff(self.pe_ptr))
        self.busy = np.bincount(self.pe_edge, weights=pair_busy[pe_pair], minlength=nedges)
        self.e_load = np.zeros(nedges)
        self.e_since = np.zeros(nedges)
        self.timeline: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.timers: list[tuple[np.ndarray, np.ndarray]] = []
        # Dynamic flows launched and not done: message, path, activation time, bytes left
        # per unit at time tu, rate per unit, active.
        self.f_msg = np.zeros(0, np.int64)
        self.f_path = np.zeros(0, np.int64)
        self.f_act = np.zeros(0)
        self.f_rem = np.zeros(0)
        self.f_tu = np.zeros(0)
        self.f_rate = np.zeros(0)
        self.f_active = np.zeros(0, bool)
        self.ended = 0
        self.clock = 0.0

        last_report = _time.monotonic()
        first = self.step_base[:-1][self.step_base[:-1] < self.step_base[1:]]
        empty = self._start_steps(first, np.full(len(first), self.t0))
        self._end_steps(empty)
        self._drain()
        while len(self.f_msg):
            ev = np.where(self.f_active, self.f_tu + self.f_rem / np.where(
                self.f_active, self.f_rate, 1.0), self.f_act)
            t0 = float(ev.min())
            tol = _EPS_T * max(t0, 1e-6)
            if self.lookahead > tol:
                self._window(t0 + self.lookahead)
                self.clock = t0 + self.lookahead
            else:
                # No lookahead (zero latency and alpha): the first engine's batches,
                # everything due within the tolerance happens at t0, cascades included.
                self._window(t0 + tol, at=t0)
                self.clock = t0
            self._drain()
            if self.progress is not None and _time.monotonic() - last_report > 1.0:
                last_report = _time.monotonic()
                self.progress(self.ended / max(nglobal, 1), t0)
        if self.ended < nglobal:
            self._deadlock()
        self.time_s = float(np.max(self.step_end)) if nglobal else 0.0

    # ---- steps and messages -------------------------------------------------------
    def _end_steps(self, steps: np.ndarray) -> None:
        while len(steps):
            # Done when the last op is posted and every message is done; then the adds.
            t = np.maximum(self.step_tmax[steps], self.step_start[steps] + self.step_post[steps]) \
                + self.step_red[steps]
            self.step_end[steps] = t
            self.ended += len(steps)
            nxt = steps + 1
            keep = nxt < self.step_last[steps]
            steps = self._start_steps(nxt[keep], t[keep])  # empty steps end at once

    def _start_steps(self, steps: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Start ``steps`` at times ``t``; launch the messages now matched; return the
        steps with nothing to do."""
        if not len(steps):
            return steps
        self.step_start[steps] = t
        self.step_tmax[steps] = t
        msgs, _ = _expand(self.st_ptr, self.st_msg, steps)
        if len(msgs):
            # A message may touch two of these steps (both sides start together): count
            # both, launch it once (the last position naming it wins, without a sort).
            np.subtract.at(self.ready, msgs, 1)
            pos = np.flatnonzero(self.ready[msgs] == 0)
            if len(pos):
                self.m_mark[msgs[pos]] = pos
                go = msgs[pos[self.m_mark[msgs[pos]] == pos]]
                self._launch(go)
        return steps[self.pending[steps] == 0]

    def _launch(self, msgs: np.ndarray) -> None:
        # Once both sides have posted their op.
        t = np.maximum(self.step_start[self.m_sstep[msgs]] + self.m_soff[msgs],
                       self.step_start[self.m_rstep[msgs]] + self.m_roff[msgs])
        self.m_start[msgs] = t
        fixed = self.m_fixed[msgs]
        fm, ft = msgs[fixed], t[fixed]
        if len(fm):
            arrive = ft + self.m_delay[fm]
            self.timers.append((arrive, fm))
            moving = self.m_dur[fm] > 0
            if self.record and moving.any():
                mm, dur = fm[moving], self.m_dur[fm[moving]]
                idx, owner = _expand(self.pe_ptr, np.arange(len(self.pe_edge)),
                                     self.m_pair[mm])
                edges = self.pe_edge[idx]
                start = (ft[moving] + self.m_wait[mm])[owner]
                self.timeline.append((start, edges, self.pe_load[idx]))
                self.timeline.append((start + dur[owner], edges, np.zeros(len(edges))))
        dm, dt = msgs[~fixed], t[~fixed]
        if len(dm):
            pair = self.m_pair[dm]
            npaths = self.pair_npaths[pair]
            self.m_left[dm] = npaths
            paths, owner = _expand(self.pair_ptr, np.arange(len(self.path_len)), pair)
            sub = dm[owner]
            self.f_msg = np.concatenate([self.f_msg, sub])
            self.f_path = np.concatenate([self.f_path, paths])
            # Every dynamic event before ``clock`` is done. Only with a lookahead below the
            # batch tolerance can a new flow be due earlier (by less than the tolerance).
            act = np.maximum(dt[owner] + self.m_alpha[dm][owner] + self.path_lat[paths],
                             self.clock)
            self.f_act = np.concatenate([self.f_act, act])
            self.f_rem = np.concatenate([self.f_rem, self.m_bytes[sub] / npaths[owner]])
            self.f_tu = np.concatenate([self.f_tu, np.zeros(len(sub))])
            self.f_rate = np.concatenate([self.f_rate, np.zeros(len(sub))])
            self.f_active = np.concatenate([self.f_active, np.zeros(len(sub), bool)])

    def _drain(self) -> None:
        """Process every timer (arrivals), whatever its time, and what follows."""
        while self.timers:
            times = np.concatenate([x[0] for x in self.timers])
            msgs = np.concatenate([x[1] for x in self.timers])
            self.timers = []
            self.m_end[msgs] = times
            # Both sides' ops are done (a step's adds come after all of its messages).
            self._ops_done(np.concatenate([self.m_sstep[msgs], self.m_rstep[msgs]]),
                           np.concatenate([times, times]),
                           np.concatenate([self.m_n[msgs], self.m_n[msgs]]))

    def _ops_done(self, steps: np.ndarray, times: np.ndarray, counts: np.ndarray) -> None:
        if not len(steps):
            return
        np.maximum.at(self.step_tmax, steps, times)
        np.subtract.at(self.pending, steps, counts)
        finished = steps[self.pending[steps] == 0]
        if len(finished) > 1:
            finished = np.unique(finished)  # a step's send and recv may end together
        self._end_steps(finished)

    # ---- dynamic flows --------------------------------------------------------------
    def _window(self, te: float, at: float | None = None) -> None:
        """Advance every component of the flows that can be active before ``te`` through
        its events before ``te``, each on its own clock (or all at time ``at``)."""
        inw = self.f_active | (self.f_act < te)
        widx = np.flatnonzero(inw)
        nw = len(widx)
        w_msg, w_path = self.f_msg[widx], self.f_path[widx]
        w_act, w_rem, w_tu = self.f_act[widx], self.f_rem[widx], self.f_tu[widx]
        w_rate, w_active = self.f_rate[widx], self.f_active[widx]
        w_done = np.zeros(nw, dtype=bool)
        w_k = self.m_k[w_msg]
        full = self.m_bytes[w_msg] / self.pair_npaths[self.m_pair[w_msg]]
        inc_e, inc_f = _expand(self.rpath_ptr, self.rpath_edges, w_path)
        ue, le = np.unique(inc_e, return_inverse=True)
        le = le.reshape(-1)
        nue = len(ue)
        if nw > 1:
            graph = sp.coo_array((np.ones(len(inc_f)), (inc_f, nw + le)),
                                 shape=(nw + nue, nw + nue)).tocsr()
            ncomp, labels = connected_components(graph, directed=False)
            comp_f, comp_e = labels[:nw], labels[nw:]
        else:
            ncomp, comp_f, comp_e = 1, np.zeros(nw, np.int64), np.zeros(nue, np.int64)
        cap = self.cap[ue]
        ct = np.empty(ncomp)
        while True:
            safe_rate = np.where(w_active, w_rate, 1.0)
            ev = np.where(w_done, _INF, np.where(w_active, w_tu + w_rem / safe_rate, w_act))
            ct.fill(_INF)
            np.minimum.at(ct, comp_f, ev)
            live = ct < te
            if not live.any():
                break
            if at is not None:
                ct[live] = np.maximum(ct[live], at)
            tcf = ct[comp_f]
            tolf = _EPS_T * np.maximum(tcf, 1e-6)
            inlive = live[comp_f] & ~w_done
            upd = w_active & inlive
            w_rem[upd] -= w_rate[upd] * (tcf[upd] - w_tu[upd])
            w_tu[upd] = tcf[upd]
            done = upd & (w_rem <= w_rate * tolf)
            w_done |= done
            w_active &= ~done
            act = inlive & ~w_active & ~w_done & (w_act <= tcf + tolf)
            w_active |= act
            w_rem[act] = full[act]
            w_tu[act] = tcf[act]
            # Re-rate the components that moved.
            rr = w_active & live[comp_f]
            sel = rr[inc_f]
            lmask = live[comp_e]
            rates = _maxmin(nw, w_k, inc_f[sel], le[sel], cap)
            w_rate[rr] = rates[rr]
            load = np.bincount(le[sel], weights=(w_k * rates)[inc_f[sel]], minlength=nue)
            lidx = np.flatnonzero(lmask)
            ge, owner = _expand(self.rep_ptr, self.rep_members, ue[lidx])
            lidx = lidx[owner]
            new, tl = load[lidx], ct[comp_e[lidx]]
            old = self.e_load[ge]
            on = (old <= 0) & (new > 0)
            off = (old > 0) & (new <= 0)
            self.e_since[ge[on]] = tl[on]
            self.busy[ge[off]] += tl[off] - self.e_since[ge[off]]
            self.e_load[ge] = new
            if self.record:
                ch = new != old
                if ch.any():
                    self.timeline.append((tl[ch], ge[ch], new[ch]))
            if done.any():
                dm = w_msg[done]
                np.subtract.at(self.m_left, dm, 1)
                np.maximum.at(self.m_tmax, dm, tcf[done])
                um = np.unique(dm)
                arrived = um[self.m_left[um] == 0]
                if len(arrived):
                    self.timers.append((self.m_tmax[arrived], arrived))
        # Write back; drop finished flows.
        self.f_rem[widx], self.f_tu[widx] = w_rem, w_tu
        self.f_rate[widx], self.f_active[widx] = w_rate, w_active
        if w_done.any():
            keep = np.ones(len(self.f_msg), dtype=bool)
            keep[widx[w_done]] = False
            for name in ("f_msg", "f_path", "f_act", "f_rem", "f_tu", "f_rate", "f_active"):
                setattr(self, name, getattr(self, name)[keep])

    def _deadlock(self) -> None:
        f = self.flat
        stuck = np.flatnonzero(np.isnan(self.step_end))
        g = int(stuck[0])
        r = int(self.step_rank[g])
        s = f.local(g)
        # The first transfer of this step still waiting for its peer.
        waits = []
        for tr in np.flatnonzero((f.t_sstep == g) | (f.t_rstep == g)).tolist():
            m = self.t_msg[tr]
            if self.ready[m] > 0 or np.isnan(self.m_start[m]):
                if f.t_sstep[tr] == g:
                    peer, peer_step = int(f.t_dst[tr]), int(f.t_rstep[tr])
                    what = "send"
                else:
                    peer, peer_step = int(f.t_src[tr]), int(f.t_sstep[tr])
                    what = "recv"
                waits.append(f"{what} chunk {int(f.t_chunk[tr])} with rank {peer}, whose "
                             f"matching step is {f.local(peer_step)}")
        ranks = len(np.unique(self.step_rank[stuck]))
        raise ScheduleError(f"{self.schedule.algorithm} schedule: deadlock: {ranks} ranks "
                            f"cannot finish; rank {r} step {s} waits to " + "; ".join(waits[:3]))

    # ------------------------------------------------------------------------------
    def _link_timeline(self) -> dict[Edge, tuple[tuple[float, float], ...]]:
        if not self.timeline:
            return {}
        t = np.concatenate([x[0] for x in self.timeline])
        e = np.concatenate([x[1] for x in self.timeline])
        v = np.concatenate([x[2] for x in self.timeline])
        # Per edge in time order. Entries closer than the batch tolerance are one instant
        # (flow times computed along different chains of steps differ by rounding, and a
        # flow due less than the tolerance after a window joins at the window's end); an
        # instant keeps its first time and the load recorded last (entries are appended in
        # causal order per link: a link's next flow is launched after its previous one's
        # end was processed).
        seq = np.arange(len(t))
        order = np.lexsort((t, e))
        t, e, v, seq = t[order], e[order], v[order], seq[order]
        new = np.ones(len(t), dtype=bool)
        new[1:] = (e[1:] != e[:-1]) | (t[1:] - t[:-1] > 2 * _EPS_T * np.maximum(t[1:], 1e-6))
        instant = np.cumsum(new) - 1
        first_t = t[new]
        order = np.lexsort((seq, instant))
        e, v, instant = e[order], v[order], instant[order]
        last = np.ones(len(e), dtype=bool)
        last[:-1] = instant[1:] != instant[:-1]
        e, v = e[last], v[last]
        t = first_t[instant[last]]
        prev = np.concatenate([[0.0], v[:-1]])
        first = np.ones(len(t), dtype=bool)
        first[1:] = e[1:] != e[:-1]
        prev[first] = 0.0
        keep = v != prev
        out: dict[Edge, list[tuple[float, float]]] = {}
        for edge, when, rate in zip(e[keep].tolist(), t[keep].tolist(), v[keep].tolist()):
            out.setdefault(self.edges[edge], []).append((when, rate))
        return {edge: tuple(v) for edge, v in out.items()}

    def report(self) -> SimReport:
        n = self.schedule.nranks
        f = self.flat
        breakdown = self._breakdown(self.m_sstep, self.m_rstep, self.m_start, self.m_end,
                                    self.m_wait, self.m_soff, self.m_roff, self.st_ptr,
                                    self.st_msg)
        warp = self._contention(self.m_dst, self.m_start, self.m_end, self.m_bytes > 0)
        if warp is not None:
            stretched = float(warp(self.time_s))
            breakdown["contention"] = stretched - self.time_s
            self.time_s = stretched
            self.step_start, self.step_end = warp(self.step_start), warp(self.step_end)
            self.m_start, self.m_end = warp(self.m_start), warp(self.m_end)
            self.timeline = [(warp(t), e, v) for t, e, v in self.timeline]
        effective = (self.size // self.dtype_size) * self.dtype_size
        bound = lower_bound(self.cluster, effective)
        time_s = self.time_s
        algbw = self.size / time_s if time_s > 0 else math.inf
        busbw = algbw * 2 * (n - 1) / n if n > 1 else 0.0
        used = np.flatnonzero(self.link_bytes > 0)
        busy_edges = np.flatnonzero(self.busy > 0)
        link_bytes = {self.edges[i]: float(self.link_bytes[i]) for i in used.tolist()}
        link_busy = {self.edges[i]: float(self.busy[i]) for i in busy_edges.tolist()}
        starts, ends = self.step_start.tolist(), self.step_end.tolist()
        base = self.step_base.tolist()
        pairs = list(zip(starts, ends))
        step_times = tuple(tuple(pairs[base[r]:base[r + 1]]) for r in range(n))
        transfers: tuple[TransferRecord, ...] = ()
        timeline: dict[Edge, tuple[tuple[float, float], ...]] = {}
        if self.record:
            sb = self.step_base
            transfers = tuple(
                TransferRecord(src, dst, ss - int(sb[src]), rs - int(sb[dst]), chunk,
                               int(nbytes), start, end, count)
                for src, dst, ss, rs, chunk, nbytes, start, end, count in zip(
                    f.t_src.tolist(), f.t_dst.tolist(), f.t_sstep.tolist(),
                    f.t_rstep.tolist(), f.t_chunk.tolist(), self.t_bytes.tolist(),
                    self.m_start[self.t_msg].tolist(), self.m_end[self.t_msg].tolist(),
                    f.t_count.tolist()))
            timeline = self._link_timeline()
        return SimReport(
            cluster=self.cluster.name, algorithm=self.schedule.algorithm, nranks=n,
            size=self.size, time_s=time_s, lower_bound_s=bound, algbw=algbw, busbw=busbw,
            link_bytes=MappingProxyType(link_bytes), link_busy_s=MappingProxyType(link_busy),
            step_times=step_times, transfers=transfers,
            link_timeline=MappingProxyType(timeline), profile=self.costs.name,
            breakdown=MappingProxyType(breakdown), messages=int(self.t_live.sum()))


class _ReferenceEngine(_Setup):
    """The first engine, kept as the oracle for tests and benchmarks: every event batch
    in global time order, every active flow re-rated by global progressive filling.
    Same model, same results; O(batches x flows) and so slow at scale."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        flat, nglobal = self.flat, self.nglobal
        self.t_src, self.t_dst, self.t_sstep = flat.t_src, flat.t_dst, flat.t_sstep
        self.t_rstep, self.t_chunk, self.t_reduce = flat.t_rstep, flat.t_chunk, flat.t_reduce
        self.pending = flat.ops_per_step.copy()
        ntr = len(self.t_src)
        both_steps = np.concatenate([self.t_sstep, self.t_rstep])
        both_tr = np.concatenate([np.arange(ntr), np.arange(ntr)])
        order = np.argsort(both_steps, kind="stable")
        self.st_tr = both_tr[order]
        self.st_ptr = np.concatenate([[0], np.cumsum(np.bincount(both_steps, minlength=nglobal))])
        self.ready = np.full(ntr, 2, dtype=np.int8)
        self._routes()

    def _routes(self) -> None:
        """Path table: pair -> paths (CSR), path -> edges (CSR), latencies, bytes per link."""
        cluster, n = self.cluster, self.schedule.nranks
        table = _route_table(cluster, n, self.t_src, self.t_dst)
        self.edges: list[Edge] = table.edges
        self.cap = table.cap
        self.t_pair = table.pair_inverse
        self.path_edges, self.path_ptr, self.path_len = (table.path_edges, table.path_ptr,
                                                         table.path_len)
        self.pair_ptr, self.pair_npaths = table.pair_ptr, table.pair_npaths
        self.path_lat = table.path_lat
        self.t_alpha = self.costs.alphas(self.t_bytes,
                                         self._pair_network(table.pair_keys)[self.t_pair])
        pairs = range(table.npairs)
        # Bytes per link are fixed by the routes: total per pair, spread over its paths.
        pair_bytes = np.bincount(self.t_pair, weights=self.t_bytes, minlength=len(pairs))
        per_path = np.repeat(pair_bytes / np.maximum(self.pair_npaths, 1), self.pair_npaths)
        per_edge = np.repeat(per_path, self.path_len)
        self.link_bytes = np.bincount(self.path_edges, weights=per_edge, minlength=len(self.edges))
        self.pair_lat_max = (np.maximum.reduceat(self.path_lat, self.pair_ptr[:-1])
                             if len(self.path_lat) else np.zeros(0))

    # ------------------------------------------------------------------------------
    def run(self) -> None:
        nglobal, ntr = self.nglobal, len(self.t_src)
        self.step_start = np.full(nglobal, np.nan)
        self.step_end = np.full(nglobal, np.nan)
        self.t_start = np.full(ntr, np.nan)
        self.t_end = np.full(ntr, np.nan)
        self.sub_left = np.zeros(ntr, dtype=np.int64)
        self.busy = np.zeros(len(self.edges))
        self.timeline: list[tuple[float, np.ndarray, np.ndarray]] = []
        self.last_load = np.zeros(len(self.edges))
        # Waiting flows (paying latency): activation time, transfer, path, bytes.
        self.w_act = np.zeros(0)
        self.w_tr = np.zeros(0, np.int64)
        self.w_path = np.zeros(0, np.int64)
        self.w_bytes = np.zeros(0)
        # Active flows.
        self.a_tr = np.zeros(0, np.int64)
        self.a_path = np.zeros(0, np.int64)
        self.a_rem = np.zeros(0)
        self.a_rate = np.zeros(0)
        self.loaded = np.zeros(0, np.int64)  # edges with rate > 0
        # Steps whose ops are done, ending later (posting, adds): end time, step.
        self.e_time = np.zeros(0)
        self.e_step = np.zeros(0, np.int64)
        self.ended = 0

        t = self.t0
        last_report = _time.monotonic()
        first = self.step_base[:-1][self.step_base[:-1] < self.step_base[1:]]
        self._end_steps(self._start_steps(first, t), t)  # (the first engine dropped these)
        while True:
            self._settle(t)
            next_t = math.inf
            if len(self.a_rem):
                next_t = min(next_t, t + float(np.min(self.a_rem / self.a_rate)))
            if len(self.w_act):
                next_t = min(next_t, float(self.w_act.min()))
            if len(self.e_time):
                next_t = min(next_t, float(self.e_time.min()))
            if next_t == math.inf:
                break
            dt = next_t - t
            if len(self.a_rem):
                self.a_rem = self.a_rem - self.a_rate * dt
                self.busy[self.loaded] += dt
            t = next_t
            if self.progress is not None and _time.monotonic() - last_report > 1.0:
                last_report = _time.monotonic()
                self.progress(self.ended / max(nglobal, 1), t)
        if self.ended < nglobal:
            raise ScheduleError(f"{self.schedule.algorithm} schedule: deadlock")
        self.time_s = float(np.max(self.step_end)) if nglobal else 0.0

    def _settle(self, t: float) -> None:
        """Handle everything due at time ``t`` (cascading zero-time events), then re-rate."""
        tol = _EPS_T * max(t, 1e-6)
        changed = False
        while True:
            done_tr = []
            if len(self.a_rem):
                done = self.a_rem <= self.a_rate * tol
                if done.any():
                    done_tr.append(self.a_tr[done])
                    keep = ~done
                    self.a_tr, self.a_path = self.a_tr[keep], self.a_path[keep]
                    self.a_rem, self.a_rate = self.a_rem[keep], self.a_rate[keep]
                    changed = True
            if len(self.w_act):
                due = self.w_act <= t + tol
                if due.any():
                    empty = due & (self.w_bytes <= 0)
                    go = due & ~empty
                    if empty.any():
                        done_tr.append(self.w_tr[empty])
                    if go.any():
                        self.a_tr = np.concatenate([self.a_tr, self.w_tr[go]])
                        self.a_path = np.concatenate([self.a_path, self.w_path[go]])
                        self.a_rem = np.concatenate([self.a_rem, self.w_bytes[go]])
                        self.a_rate = np.concatenate([self.a_rate, np.zeros(int(go.sum()))])
                        changed = True
                    keep = ~due
                    self.w_act, self.w_tr = self.w_act[keep], self.w_tr[keep]
                    self.w_path, self.w_bytes = self.w_path[keep], self.w_bytes[keep]
            ops_done: list[np.ndarray] = []
            if done_tr:
                finished = np.concatenate(done_tr)
                trs, counts = np.unique(finished, return_counts=True)
                self.sub_left[trs] -= counts
                arrived = trs[self.sub_left[trs] == 0]
                if len(arrived):
                    self.t_end[arrived] = t
                    ops_done.append(self.t_sstep[arrived])
                    ops_done.append(self.t_rstep[arrived])
            ending: list[np.ndarray] = []
            if ops_done:
                steps, counts = np.unique(np.concatenate(ops_done), return_counts=True)
                self.pending[steps] -= counts
                finished = steps[self.pending[steps] == 0]
                if len(finished):
                    # Done when the last op is posted too; then the adds.
                    due_at = np.maximum(t, self.step_start[finished]
                                        + self.step_post[finished]) + self.step_red[finished]
                    later = due_at > t + tol
                    ending.append(finished[~later])
                    self.e_time = np.concatenate([self.e_time, due_at[later]])
                    self.e_step = np.concatenate([self.e_step, finished[later]])
            if len(self.e_time):
                due = self.e_time <= t + tol
                if due.any():
                    ending.append(self.e_step[due])
                    self.e_time, self.e_step = self.e_time[~due], self.e_step[~due]
            if not ending:
                break
            finished_steps = np.unique(np.concatenate(ending))
            if len(finished_steps):
                self._end_steps(finished_steps, t)
        if changed:
            self._rerate(t)

    def _end_steps(self, steps: np.ndarray, t: float) -> None:
        while len(steps):
            self.step_end[steps] = t
            self.ended += len(steps)
            nxt = steps + 1
            nxt = nxt[nxt < self.step_last[steps]]
            empty = self._start_steps(nxt, t)
            steps = empty  # empty steps end the moment they start

    def _start_steps(self, steps: np.ndarray, t: float) -> np.ndarray:
        """Start ``steps`` at ``t``; launch the messages now matched; return empty steps."""
        if not len(steps):
            return steps
        self.step_start[steps] = t
        lo, hi = self.st_ptr[steps], self.st_ptr[steps + 1]
        lengths = hi - lo
        total = int(lengths.sum())
        if total:
            idx = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) \
                + np.arange(total)
            trs = self.st_tr[idx]
            # A transfer may touch two of these steps (both sides start together).
            uniq, counts = np.unique(trs, return_counts=True)
            self.ready[uniq] -= counts.astype(np.int8)
            go = uniq[self.ready[uniq] == 0]
            if len(go):
                self._launch(go, t)
        return steps[self.pending[steps] == 0]

    def _launch(self, trs: np.ndarray, t: float) -> None:
        # Once both sides have posted their op (no earlier than now: one side starts now).
        t = np.maximum(self.step_start[self.t_sstep[trs]] + self.t_soff[trs],
                       self.step_start[self.t_rstep[trs]] + self.t_roff[trs])
        self.t_start[trs] = t
        pair = self.t_pair[trs]
        npaths = self.pair_npaths[pair]
        self.sub_left[trs] = npaths
        total = int(npaths.sum())
        offsets = np.arange(total) - np.repeat(np.cumsum(npaths) - npaths, npaths)
        paths = np.repeat(self.pair_ptr[pair], npaths) + offsets
        sub_tr = np.repeat(trs, npaths)
        sub_bytes = np.repeat(self.t_bytes[trs] / npaths, npaths)
        # Zero-byte messages are not sent: done once posted.
        wait = np.where(sub_bytes > 0, np.repeat(self.t_alpha[trs], npaths) + self.path_lat[paths],
                        0.0)
        act = np.repeat(t, npaths) + wait
        self.w_act = np.concatenate([self.w_act, act])
        self.w_tr = np.concatenate([self.w_tr, sub_tr])
        self.w_path = np.concatenate([self.w_path, paths])
        self.w_bytes = np.concatenate([self.w_bytes, sub_bytes])

    def _rerate(self, t: float) -> None:
        """Max-min fair rates by progressive filling (Bertsekas and Gallager, 6.5.2).

        Each round gives every unfrozen flow the smallest fair share left on any link it
        crosses, computed for all links at once with ``bincount`` over the (link, flow)
        incidence pairs, and freezes the flows crossing the tightest links.
        """
        nflows = len(self.a_tr)
        nedges = len(self.edges)
        if nflows:
            lengths = self.path_len[self.a_path]
            total = int(lengths.sum())
            starts = np.cumsum(lengths) - lengths
            idx = np.repeat(self.path_ptr[self.a_path] - starts, lengths) + np.arange(total)
            rows = self.path_edges[idx]  # link of each incidence pair
            cols = np.repeat(np.arange(nflows), lengths)  # flow of each pair
            # Work on the links in use only, renumbered 0..U-1.
            used, local = np.unique(rows, return_inverse=True)
            local = local.reshape(-1)
            nused = len(used)
            remaining = self.cap[used]
            rate = np.zeros(nflows)
            live_rows, live_cols = local, cols
            count = np.zeros(nused)
            share = np.empty(nused)
            hit = np.zeros(nflows, dtype=bool)
            while len(live_cols):
                count[:] = np.bincount(live_rows, minlength=nused)
                np.divide(remaining, count, out=share, where=count > 0)
                share[count == 0] = np.inf
                level = float(share.min())
                tight = share <= level * (1 + 1e-12)
                hit[:] = False
                hit[live_cols[tight[live_rows]]] = True
                rate[hit] = level
                frozen_pairs = hit[live_cols]
                remaining -= np.bincount(live_rows[frozen_pairs], minlength=nused) * level
                np.maximum(remaining, 0.0, out=remaining)
                keep = ~frozen_pairs
                live_rows, live_cols = live_rows[keep], live_cols[keep]
            self.a_rate = rate
            load: np.ndarray = np.bincount(rows, weights=rate[cols], minlength=nedges)
        else:
            load = np.zeros(nedges)
        self.loaded = np.flatnonzero(load > 0)
        if self.record:
            changed = np.flatnonzero(load != self.last_load)
            if len(changed):
                self.timeline.append((t, changed, load[changed]))
            self.last_load = load

    def report(self) -> SimReport:
        """The same report as :class:`_Engine` (transfers and timelines included)."""
        n = self.schedule.nranks
        delay = np.where(self.t_live, self.t_alpha + self.pair_lat_max[self.t_pair], 0.0)
        breakdown = self._breakdown(self.t_sstep, self.t_rstep, self.t_start, self.t_end, delay,
                                    self.t_soff, self.t_roff, self.st_ptr, self.st_tr)
        warp = self._contention(self.t_dst, self.t_start, self.t_end, self.t_live)
        if warp is not None:
            stretched = float(warp(self.time_s))
            breakdown["contention"] = stretched - self.time_s
            self.time_s = stretched
            self.step_start, self.step_end = warp(self.step_start), warp(self.step_end)
            self.t_start, self.t_end = warp(self.t_start), warp(self.t_end)
            self.timeline = [(float(warp(t)), e, v) for t, e, v in self.timeline]
        bound = lower_bound(self.cluster, (self.size // self.dtype_size) * self.dtype_size)
        algbw = self.size / self.time_s if self.time_s > 0 else math.inf
        starts, ends = self.step_start.tolist(), self.step_end.tolist()
        base = self.step_base.tolist()
        pairs = list(zip(starts, ends))
        transfers: tuple[TransferRecord, ...] = ()
        timeline: dict[Edge, tuple[tuple[float, float], ...]] = {}
        if self.record:
            sb = self.step_base
            transfers = tuple(
                TransferRecord(src, dst, ss - int(sb[src]), rs - int(sb[dst]), chunk,
                               int(nbytes), start, end, count)
                for src, dst, ss, rs, chunk, nbytes, start, end, count in zip(
                    self.t_src.tolist(), self.t_dst.tolist(), self.t_sstep.tolist(),
                    self.t_rstep.tolist(), self.t_chunk.tolist(), self.t_bytes.tolist(),
                    self.t_start.tolist(), self.t_end.tolist(), self.flat.t_count.tolist()))
            changes: dict[int, list[tuple[float, float]]] = {}
            for t, edges, rates in self.timeline:
                for e, rate in zip(edges.tolist(), rates.tolist()):
                    changes.setdefault(e, []).append((t, rate))
            timeline = {self.edges[e]: tuple(v) for e, v in changes.items()}
        return SimReport(
            cluster=self.cluster.name, algorithm=self.schedule.algorithm, nranks=n,
            size=self.size, time_s=self.time_s, lower_bound_s=bound, algbw=algbw,
            busbw=algbw * 2 * (n - 1) / n if n > 1 else 0.0,
            link_bytes=MappingProxyType({self.edges[i]: float(self.link_bytes[i])
                                         for i in np.flatnonzero(self.link_bytes > 0).tolist()}),
            link_busy_s=MappingProxyType({self.edges[i]: float(self.busy[i])
                                          for i in np.flatnonzero(self.busy > 0).tolist()}),
            step_times=tuple(tuple(pairs[base[r]:base[r + 1]]) for r in range(n)),
            transfers=transfers, link_timeline=MappingProxyType(timeline),
            profile=self.costs.name, breakdown=MappingProxyType(breakdown),
            messages=int(self.t_live.sum()))


def _simulate_reference(cluster: Cluster, schedule: Schedule, size: int, *, dtype_size: int = 4,
                        profile: CostProfile | str | None = None,
                        reduce_bandwidth: float | None = None, alpha: float = 0.0,
                        record: bool = False) -> SimReport:
    """:func:`simulate` by :class:`_ReferenceEngine` (tests and benchmarks only)."""
    if schedule.nranks != cluster.nranks:
        raise ScheduleError("rank count differs")
    engine = _ReferenceEngine(cluster, schedule, int(size), dtype_size,
                              _costs(profile, alpha, reduce_bandwidth), record, None)
    engine.run()
    return engine.report()
