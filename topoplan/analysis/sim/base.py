"""What both engines share: the schedule's messages at one size and their software
costs, its native steps and their prices, the route table, max-min fair rates, the
contention time map and the critical-path breakdown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..cost import CostProfile
from ...errors import ClusterSpecError, ScheduleError, TopoplanError
from ...ir.matching import deadlock_error, match_messages, wait_text
from ...ir.schedule import Schedule
from .natives import native_steps

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["Setup", "RouteTable", "route_table", "maxmin", "expand", "rank_within", "EPS_T",
           "COARSE", "COARSE_OPS"]

#: Events closer than this (relative to the clock) are one batch: the simulator's default
#: time resolution. Times that should coincide (the same step on symmetric ranks) drift
#: apart by rounding and by the batching itself; at 1e-9 the 256-GPU fat tree's 256 MiB
#: mcf plan had 36,886 component events in 19,490 distinct times, which fall into 251
#: groups at 1e-7, and simulating it took 10x longer (12.7 s, 1.3 s). 1e-7 of the clock
#: is 0.3 ns at 3 ms: results move by at most that per batch along a chain of steps
#: (5e-7 relative on the fat tree).
EPS_T = 1e-7
#: The resolution for schedules of more than COARSE_OPS ops. Under a cost profile the
#: posting costs spread a step's messages over distinct times and rounding scatters
#: their ends by nanoseconds: the fat tree's plan under ``nccl`` has 89,518 events in
#: 68,165 groups at 1e-7 and 5,916 at 1e-5 (27 s, 2.9 s to simulate; results differ by
#: 1.2e-5 relative); leaf_spine_1024's takes 60 s at 1e-5, more than 10 minutes at 1e-7.
COARSE = 1e-5
COARSE_OPS = 200_000
_INF = math.inf


def expand(ptr: np.ndarray, items: np.ndarray,
           which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR gather: ``items[ptr[w]:ptr[w+1]]`` for each ``w`` in ``which``, concatenated,
    and the position in ``which`` each item came from."""
    lo = ptr[which]
    lengths = ptr[which + 1] - lo
    total = int(lengths.sum())
    owner = np.repeat(np.arange(len(which)), lengths)
    idx = np.arange(total) + np.repeat(lo - (np.cumsum(lengths) - lengths), lengths)
    return items[idx], owner


def maxmin(nflows: int, weight: np.ndarray, pf: np.ndarray, pe: np.ndarray,
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
        if not frozen.any():  # NaN capacities or weights: no link ever tightens
            raise TopoplanError("the simulator's max-min rates made no progress: a link "
                                "capacity or a flow weight is not a finite number")
        keep = ~frozen
        pf, pe, w = pf[keep], pe[keep], w[keep]
    return rate


@dataclass(frozen=True)
class RouteTable:
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


def route_table(cluster: Cluster, n: int, src: np.ndarray, dst: np.ndarray) -> RouteTable:
    """Routes for the pairs ``(src[i], dst[i])``; raises ScheduleError for a pair with none."""
    graph = cluster.graph
    edges = list(graph.edges)
    edge_index = {e: i for i, e in enumerate(edges)}
    cap = np.array([graph.edges[e]["bandwidth"] for e in edges], dtype=np.float64)
    lat = np.array([graph.edges[e]["latency"] for e in edges], dtype=np.float64)
    # simulate() refuses such a cluster (check_cluster); an engine handed one directly
    # would divide by zero or wait forever on a NaN clock.
    bad = np.flatnonzero(~(np.isfinite(cap) & (cap > 0)) | ~(np.isfinite(lat) & (lat >= 0)))
    if len(bad):
        i = int(bad[0])
        what, value = (("bandwidth", cap[i]) if not (np.isfinite(cap[i]) and cap[i] > 0)
                       else ("latency", lat[i]))
        u, v = edges[i]
        raise ClusterSpecError(f"{value:g} {'bytes/s' if what == 'bandwidth' else 's'} on "
                               f"link {u} -> {v}: the simulator needs a finite "
                               f"{'bandwidth > 0' if what == 'bandwidth' else 'latency >= 0'}",
                               key=f"cluster {cluster.name!r}: graph[{u!r}][{v!r}].{what}")
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
    return RouteTable(edges=edges, cap=cap, pair_inverse=inverse.reshape(-1), path_edges=pe,
                       path_ptr=pp, path_len=np.diff(pp), pair_ptr=pr, pair_npaths=npaths,
                       path_lat=path_lat, npairs=len(pairs), pair_keys=pairs)


class Setup:
    """What both engines start from: costs, chunk sizes, the schedule's messages
    (:func:`topoplan.ir.matching.match_messages`), its native instances
    (:mod:`~topoplan.analysis.sim.natives`) and their prices
    (:func:`topoplan.analysis.native.price.native_price`), and each transfer's and
    step's software costs at this size.

    ``cluster`` is the cluster as the profile's runtime moves bytes on it; ``base`` the
    cluster as written (the NCCL model counts NVLink itself), ``cluster`` by default.
    """

    step_start: np.ndarray  # set by the engines' run()
    step_end: np.ndarray
    n_start: np.ndarray  # per native instance, set by the engines' run()
    n_end: np.ndarray

    def __init__(self, cluster: Cluster, schedule: Schedule, size: int, dtype_size: int,
                 costs: CostProfile, record: bool,
                 progress: Callable[[float, float], None] | None,
                 base: Cluster | None = None, bound: float | None = None) -> None:
        self.cluster, self.schedule, self.size = cluster, schedule, size
        self.base = cluster if base is None else base
        #: the collective's lower bound on ``base`` (computed in the report when None)
        self.bound = bound
        self.dtype_size, self.costs, self.record = dtype_size, costs, record
        self.reduce_bandwidth = costs.reduce_bandwidth
        self.progress = progress
        nelems = size // dtype_size
        bounds = np.array(schedule.chunk_bounds(nelems), dtype=np.int64).reshape(-1, 2)
        self.chunk_bytes = (bounds[:, 1] - bounds[:, 0]) * dtype_size
        self.natives = native_steps(schedule)
        self.flat = flat = match_messages(schedule if self.natives is None else self.natives.p2p,
                                    vectored=True)
        # Bytes of chunks [0, k): a transfer of chunks a..b-1 carries cum[b] - cum[a].
        cum = np.concatenate([[0], np.cumsum(self.chunk_bytes)]).astype(np.float64)
        self.chunk_cum = cum
        self.t_bytes = cum[flat.t_chunk + flat.t_count] - cum[flat.t_chunk]
        # A vectored message (IR v4) is one message of all its ranges' bytes.
        for m, more in flat.t_more.items():
            self.t_bytes[m] += sum(cum[a + c] - cum[a] for a, c in more)
        self.step_base, self.step_rank, self.step_last = (flat.step_base, flat.step_rank,
                                                         flat.step_last)
        # Each sequence (a rank's program on one channel, IR v4; a rank without channels)
        # runs its steps in order: step g follows g - 1 unless g is its sequence's first.
        self.step_first, self.seq_base = flat.step_first, flat.seq_base
        self.nglobal = flat.nglobal
        self.t0 = costs.call_overhead  # every rank's first step starts here, but:
        self._software_costs()
        self._native_setup()

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
            rpos = rank_within(r_live, f.t_rop[live])
            spos = nrecv[s_live] + rank_within(s_live, f.t_sop[live])
            self.t_soff[live] = sigma[s_live] + (spos + 1) * c.op_overhead
            self.t_roff[live] = sigma[r_live] + (rpos + 1) * c.op_overhead
        self.step_red = np.zeros(nglobal)
        if self.reduce_bandwidth is not None:
            red = live & f.t_reduce
            self.step_red = np.bincount(f.t_rstep[red], weights=self.t_bytes[red],
                                        minlength=nglobal) / self.reduce_bandwidth

    def _native_setup(self) -> None:
        """Per native instance: its member steps, its price at this size (floor, latency,
        the bytes it moves over each edge), whether its ranks count as working; per
        step, its instance; per rank, when its first step starts (a rank whose every op
        is native pays no ``call_overhead``: each native collective carries its own).
        Native steps hold one op each (``ops_per_step``) and post it after the step
        overhead."""
        from ..native.price import NativePrice, native_price

        nglobal, n = self.nglobal, self.schedule.nranks
        self.ops_per_step = self.flat.ops_per_step.copy()
        self.step_nat = np.full(nglobal, -1, dtype=np.int64)
        self.rank_t0 = np.full(n, float(self.t0))
        self.nat_prices: list[NativePrice] = []
        self.native_notes: tuple[str, ...] = ()
        natives = self.natives
        if natives is None:
            self.nnat = 0
            self.nat_ptr = np.zeros(1, np.int64)
            self.nat_steps = np.zeros(0, np.int64)
            self.nat_floor = self.nat_lat = np.zeros(0)
            self.nat_busy = np.zeros(0, bool)
            self.nat_flow_ptr = np.zeros(1, np.int64)
            self.nat_flow_edges: list = []
            self.nat_flow_bytes = np.zeros(0)
            return
        self.nnat = nnat = len(natives)
        self.nat_ptr, self.nat_steps = natives.global_steps(self.flat)
        self.step_nat[self.nat_steps] = np.repeat(np.arange(nnat), np.diff(self.nat_ptr))
        self.ops_per_step[self.nat_steps] += 1
        self.step_post[self.nat_steps] = self.costs.step_overhead
        cum = self.chunk_cum
        priced: dict[tuple, NativePrice] = {}
        notes: list[str] = []
        flow_edges: list = []
        flow_bytes: list[float] = []
        flow_ptr = [0]
        for op in natives.ops:
            nbytes = int(round(cum[op.end] - cum[op.chunk]))
            key = (op.kind.value, op.group, nbytes)
            price = priced.get(key)
            if price is None:
                price = priced[key] = native_price(self.base, op.kind.value, op.group, nbytes,
                                                   self.costs, links=self.cluster)
                if price.note and price.note not in notes:
                    notes.append(price.note)
            self.nat_prices.append(price)
            for edge, amount in price.loads.items():
                if amount > 0:
                    flow_edges.append(edge)
                    flow_bytes.append(amount)
            flow_ptr.append(len(flow_edges))
        prices = self.nat_prices
        self.nat_floor = np.array([p.floor_s for p in prices], dtype=np.float64)
        self.nat_lat = np.array([p.latency_s for p in prices], dtype=np.float64)
        self.nat_busy = np.array([p.busy for p in prices], dtype=bool)
        self.nat_flow_ptr = np.array(flow_ptr, dtype=np.int64)
        self.nat_flow_edges = flow_edges
        self.nat_flow_bytes = np.array(flow_bytes, dtype=np.float64)
        self.native_notes = tuple(notes)
        # Ranks whose every op is native: their first step starts at once.
        p2p_ops = np.bincount(self.step_rank, weights=self.flat.ops_per_step, minlength=n)
        has_native = np.zeros(n, dtype=bool)
        has_native[self.step_rank[self.nat_steps]] = True
        self.rank_t0[has_native & (p2p_ops == 0)] = 0.0

    def native_records(self) -> tuple:
        """One :class:`~topoplan.analysis.sim.report.NativeRecord` per instance."""
        from .report import NativeRecord
        natives = self.natives
        if natives is None:
            return ()
        return tuple(NativeRecord(op.kind.value, op.group, op.chunk, op.count, p.nbytes,
                                  float(self.n_start[j]), float(self.n_end[j]),
                                  tuple(s for _, s in members), p.source)
                     for j, (op, members, p) in enumerate(zip(natives.ops, natives.members,
                                                              self.nat_prices)))

    def nat_launch_times(self, js: np.ndarray) -> np.ndarray:
        """When instances ``js`` start: once every member has started its step and paid
        its step overhead."""
        steps, owner = expand(self.nat_ptr, self.nat_steps, js)
        t = np.full(len(js), -_INF)
        np.maximum.at(t, owner, self.step_start[steps] + self.costs.step_overhead)
        return t

    def _pair_network(self, pair_keys: np.ndarray) -> np.ndarray:
        """Whether each (src * n + dst) pair crosses boxes (the ``network`` class)."""
        n = self.schedule.nranks
        if len(self.cluster.boxes) == 1:
            return np.zeros(len(pair_keys), dtype=bool)
        box = np.asarray([self.cluster.box_index(r) for r in range(n)], dtype=np.int64)
        src, dst = np.divmod(pair_keys, n)
        return box[src] != box[dst]

    def first_steps(self) -> np.ndarray:
        """The first global step of every sequence that has steps (every rank's first,
        without channels)."""
        base = self.seq_base
        return base[:-1][base[:-1] < base[1:]]

    def step_times(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        """``SimReport.step_times``: per rank, per step of its program as written, its
        ``(start, end)``. A step whose ops are on several channels (IR v4) ran as one
        step of each channel's sequence: it spans from the first of them to start to the
        last to end."""
        f = self.flat
        starts, ends = self.step_start, self.step_end
        if f.nchannels > 1:
            prog = f.prog_base[self.step_rank] + f.step_local
            nprog = int(f.prog_base[-1])
            starts, ends = np.full(nprog, np.inf), np.full(nprog, -np.inf)
            np.minimum.at(starts, prog, self.step_start)
            np.maximum.at(ends, prog, self.step_end)
        pairs = list(zip(starts.tolist(), ends.tolist()))
        base = f.prog_base.tolist()
        return tuple(tuple(pairs[base[r]:base[r + 1]]) for r in range(self.schedule.nranks))

    def transfer_steps(self) -> tuple[list[int], list[int]]:
        """Each transfer's send step and recv step, as written in their programs."""
        f = self.flat
        return f.step_local[f.t_sstep].tolist(), f.step_local[f.t_rstep].tolist()

    def _stuck_at(self, h: int) -> int:
        """Where the sequence of global step ``h`` is stuck: its first step that never
        ended, as written in its rank's program (its length in steps if none)."""
        lo, hi = int(self.step_first[h]), int(self.step_last[h])
        stuck = np.flatnonzero(np.isnan(self.step_end[lo:hi]))
        return self.flat.local(lo + int(stuck[0])) if len(stuck) else hi - lo

    def raise_deadlock(self, waiting: np.ndarray) -> None:
        """Raise the deadlock error for the first step that never ended, naming the
        transfers of that step still waiting for their peer (``waiting``, per transfer)."""
        f = self.flat
        stuck = np.flatnonzero(np.isnan(self.step_end))
        g = int(stuck[0])
        r = int(self.step_rank[g])
        if self.step_nat[g] >= 0:
            self._native_deadlock(g, stuck)
        channel = int(f.step_channel[g]) if f.nchannels > 1 else None
        waits = []
        for tr in np.flatnonzero(waiting & ((f.t_sstep == g) | (f.t_rstep == g))).tolist():
            if f.t_sstep[tr] == g:
                kind, peer, peer_step = "send", int(f.t_dst[tr]), int(f.t_rstep[tr])
            else:
                kind, peer, peer_step = "recv", int(f.t_src[tr]), int(f.t_sstep[tr])
            waits.append(wait_text(kind, int(f.t_chunk[tr]), int(f.t_count[tr]), peer,
                                   self._stuck_at(peer_step), f.local(peer_step), channel,
                                   f.t_more.get(tr, ())))
        ranks = len(np.unique(self.step_rank[stuck]))
        raise deadlock_error(f.name, ranks, r, f.local(g), waits, channel)

    def _native_deadlock(self, g: int, stuck: np.ndarray) -> None:
        """Raise the deadlock error for native step ``g``: the members it waits for."""
        assert self.natives is not None
        j = int(self.step_nat[g])
        op = self.natives.ops[j]
        waits = []
        steps = self.nat_steps[self.nat_ptr[j]:self.nat_ptr[j + 1]].tolist()
        for (rank, step), h in zip(self.natives.members[j], steps):
            if not np.isnan(self.step_start[h]):
                continue
            waits.append(f"run {op.text()} with rank {rank}, which is stuck at step "
                         f"{self._stuck_at(h)} before its matching step {step}")
        ranks = len(np.unique(self.step_rank[stuck]))
        f = self.flat
        raise deadlock_error(f.name, ranks, int(self.step_rank[g]), f.local(g), waits,
                             0 if f.nchannels > 1 else None)

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
        busy = [(np.arange(n), np.zeros(n), self.rank_t0),
                (self.step_rank[has], self.step_start[has], post_end[has]),
                (self.step_rank, red_start, self.step_end),
                (m_dst[m_live], m_flow[m_live], m_end[m_live])]
        if self.nnat and self.nat_busy.any():
            # A ring run as native steps works its ranks as its messages would.
            js = np.flatnonzero(self.nat_busy)
            steps, owner = expand(self.nat_ptr, self.nat_steps, js)
            busy.append((self.step_rank[steps], self.n_start[js][owner],
                         self.n_end[js][owner]))
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
        posting in the later of its two steps, whose start is the end of the step before
        in that step's sequence (or the call overhead).
        """
        out = {"bandwidth": 0.0, "latency": 0.0, "overhead": 0.0, "reduce": 0.0,
               "contention": 0.0}
        if self.nnat:
            out["native"] = 0.0
        if not self.nglobal or not np.isfinite(self.step_end).all():
            return out
        start, end = self.step_start, self.step_end
        g = int(np.argmax(end))
        while True:
            j = int(self.step_nat[g])
            if j >= 0:
                # A native step: its op ran from the last member's posting to its end.
                launched = float(self.n_start[j])
                out["native"] += float(end[g]) - launched
                steps = self.nat_steps[self.nat_ptr[j]:self.nat_ptr[j + 1]]
                g2 = int(steps[np.argmax(start[steps])])
                out["overhead"] += launched - float(start[g2])
                if g2 == self.step_first[g2]:
                    out["overhead"] += float(start[g2])
                    break
                g = g2 - 1
                continue
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
            if g2 == self.step_first[g2]:  # its sequence's first step
                out["overhead"] += float(start[g2])
                break
            g = g2 - 1
        return out


def rank_within(group: np.ndarray, order: np.ndarray) -> np.ndarray:
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

