"""An event-driven, flow-level simulator of a schedule on a cluster.

Model (DESIGN.md semantics, plus time):

- each rank runs its steps in order; a step starts when the previous one ends;
- a message (the k-th send src->dst matched with the k-th recv at dst from src) starts
  when both sides have started their steps (rendezvous), waits ``alpha`` plus the latency
  of its path, then flows along ``cluster.route_edges(src, dst)``, split evenly over the
  equal-cost paths;
- every directed link is shared max-min fairly among the flows crossing it
  (progressive filling);
- with ``reduce_bandwidth``, a reducing recv also pays ``bytes / reduce_bandwidth`` after
  its data arrived; a step ends when all its ops are done.

The engine works on arrays: all transfers are matched up front, events that happen at
the same instant are handled as one batch (a symmetric schedule has about two distinct
event times per step), and rates are recomputed only when the set of flows changes,
with one sparse link x flow incidence matrix per recomputation.
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from .bound import lower_bound
from .cluster import Cluster
from .errors import ScheduleError
from .schedule import OpKind, Schedule

__all__ = ["simulate", "SimReport", "TransferRecord"]

Edge = tuple[str, str]
_EPS_T = 1e-9  # events closer than this (relative to the clock) are one batch


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """One simulated message (``record=True``).

    ``start_s`` is the rendezvous (both sides in their steps); ``end_s`` the arrival of
    the last byte (a reducing recv may finish later by the reduction time).
    """

    src: int
    dst: int
    src_step: int
    dst_step: int
    chunk: int
    nbytes: int
    start_s: float
    end_s: float


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


def simulate(cluster: Cluster, schedule: Schedule, size: int, *, dtype_size: int = 4,
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
    dtype_size : int
        Bytes per element (4 for fp32).
    reduce_bandwidth : float, optional
        Bytes/s a GPU reduces at; a reducing recv pays ``bytes / reduce_bandwidth``
        after arrival. ``None``: free.
    alpha : float
        Seconds of software overhead per message, paid before it flows.
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

    Notes
    -----
    Cost: O(ops) to match messages, then per batch of simultaneous events O(flows on the
    network) plus one progressive filling, O(levels * incidence nonzeros). A ring of
    ``n`` ranks has ~4n event batches.
    """
    if schedule.nranks != cluster.nranks:
        raise ScheduleError(
            f"the schedule has {schedule.nranks} ranks but cluster {cluster.name!r} has "
            f"{cluster.nranks} GPUs; plan it for this cluster")
    if dtype_size < 1:
        raise ValueError(f"dtype_size must be >= 1, got {dtype_size}")
    if reduce_bandwidth is not None and not reduce_bandwidth > 0:
        raise ValueError(f"reduce_bandwidth must be > 0, got {reduce_bandwidth}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    engine = _Engine(cluster, schedule, int(size), dtype_size, reduce_bandwidth, float(alpha),
                     record, progress)
    engine.run()
    return engine.report()


class _Engine:
    def __init__(self, cluster: Cluster, schedule: Schedule, size: int, dtype_size: int,
                 reduce_bandwidth: float | None, alpha: float, record: bool,
                 progress: Callable[[float, float], None] | None) -> None:
        self.cluster, self.schedule, self.size = cluster, schedule, size
        self.dtype_size, self.alpha, self.record = dtype_size, alpha, record
        self.reduce_bandwidth = reduce_bandwidth
        self.progress = progress
        n = schedule.nranks
        nelems = size // dtype_size
        bounds = np.array(schedule.chunk_bounds(nelems), dtype=np.int64).reshape(-1, 2)
        self.chunk_bytes = (bounds[:, 1] - bounds[:, 0]) * dtype_size

        # ---- flatten the ops ------------------------------------------------------
        nsteps = np.array([len(p.steps) for p in schedule.ranks], dtype=np.int64)
        self.step_base = np.concatenate([[0], np.cumsum(nsteps)])
        nglobal = int(self.step_base[-1])
        self.nglobal = nglobal
        self.step_rank = np.repeat(np.arange(n), nsteps)
        self.step_last = np.repeat(self.step_base[1:], nsteps)  # one past the rank's last step
        send_rows: list[tuple[int, int, int]] = []
        recv_rows: list[tuple[int, int, int, bool]] = []
        SEND = OpKind.SEND
        for program in schedule.ranks:
            r = program.rank
            g = int(self.step_base[r])
            for step in program.steps:
                for op in step:
                    if op.kind is SEND:
                        send_rows.append((g, op.peer, op.chunk))
                    else:
                        recv_rows.append((g, op.peer, op.chunk, op.reduce))
                g += 1
        sends = np.array(send_rows, dtype=np.int64).reshape(-1, 3)
        recvs = np.array(recv_rows, dtype=np.int64).reshape(-1, 4)
        self._match(sends, recvs)

        # Ops per step: a step ends when this drops to 0.
        self.pending = (np.bincount(sends[:, 0], minlength=nglobal)
                        + np.bincount(recvs[:, 0], minlength=nglobal)).astype(np.int64)
        self.nops = len(sends) + len(recvs)
        # Step -> transfers touching it (both sides), CSR.
        ntr = len(self.t_src)
        both_steps = np.concatenate([self.t_sstep, self.t_rstep])
        both_tr = np.concatenate([np.arange(ntr), np.arange(ntr)])
        order = np.argsort(both_steps, kind="stable")
        self.st_tr = both_tr[order]
        self.st_ptr = np.concatenate([[0], np.cumsum(np.bincount(both_steps, minlength=nglobal))])
        self.ready = np.full(ntr, 2, dtype=np.int8)
        self._routes()

    # ------------------------------------------------------------------------------
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
        bad = np.flatnonzero(sends[:, 2] != recvs[:, 2])
        if len(bad):
            i = bad[0]
            src, dst = int(self.step_rank[sends[i, 0]]), int(sends[i, 1])
            raise ScheduleError(
                f"{self.schedule.algorithm} schedule: a message from rank {src} to rank {dst}: "
                f"rank {src} step {self._local(sends[i, 0])} sends chunk {sends[i, 2]} but "
                f"rank {dst} step {self._local(recvs[i, 0])} receives it as chunk {recvs[i, 2]}")
        self.t_src = self.step_rank[sends[:, 0]]
        self.t_dst = sends[:, 1].copy()
        self.t_sstep = sends[:, 0].copy()
        self.t_rstep = recvs[:, 0].copy()
        self.t_chunk = sends[:, 2].copy()
        self.t_reduce = recvs[:, 3].astype(bool)
        self.t_bytes = self.chunk_bytes[self.t_chunk].astype(np.float64)

    def _local(self, g: int) -> int:
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
                    f"{name}: unmatched send: rank {src} step {self._local(row[0])} sends chunk "
                    f"{row[2]} to rank {dst}, which receives only {nr} of {ns} messages from "
                    f"rank {src}")
            row = recvs[np.flatnonzero(r_key == key)[ns]]
            raise ScheduleError(
                f"{name}: unmatched recv: rank {dst} step {self._local(row[0])} waits for chunk "
                f"{row[2]} from rank {src}, which sends only {ns} of {nr} messages to rank {dst}")

    def _routes(self) -> None:
        """Path table: pair -> paths (CSR), path -> edges (CSR), latencies, bytes per link."""
        cluster, n = self.cluster, self.schedule.nranks
        graph = cluster.graph
        self.edges: list[Edge] = list(graph.edges)
        edge_index = {e: i for i, e in enumerate(self.edges)}
        self.cap = np.array([graph.edges[e]["bandwidth"] for e in self.edges], dtype=np.float64)
        lat = np.array([graph.edges[e]["latency"] for e in self.edges], dtype=np.float64)
        pair_key = self.t_src * n + self.t_dst
        pairs, self.t_pair = np.unique(pair_key, return_inverse=True)
        self.t_pair = self.t_pair.reshape(-1)
        path_edges: list[int] = []
        path_ptr = [0]
        pair_ptr = [0]
        for key in pairs.tolist():
            src, dst = divmod(key, n)
            for path in cluster.route_edges(src, dst):
                path_edges.extend(edge_index[e] for e in path)
                path_ptr.append(len(path_edges))
            pair_ptr.append(len(path_ptr) - 1)
        self.path_edges = np.array(path_edges, dtype=np.int64)
        self.path_ptr = np.array(path_ptr, dtype=np.int64)
        self.path_len = np.diff(self.path_ptr)
        self.pair_ptr = np.array(pair_ptr, dtype=np.int64)
        self.pair_npaths = np.diff(self.pair_ptr)
        if len(pairs) and self.pair_npaths.min() == 0:
            i = int(np.argmin(self.pair_npaths))
            src, dst = divmod(int(pairs[i]), n)
            raise ScheduleError(f"no route from rank {src} to rank {dst} in cluster "
                                f"{cluster.name!r}")
        self.path_lat = (np.add.reduceat(lat[self.path_edges], self.path_ptr[:-1])
                         if len(self.path_edges) else np.zeros(0))
        # Bytes per link are fixed by the routes: total per pair, spread over its paths.
        pair_bytes = np.bincount(self.t_pair, weights=self.t_bytes, minlength=len(pairs))
        per_path = np.repeat(pair_bytes / np.maximum(self.pair_npaths, 1), self.pair_npaths)
        per_edge = np.repeat(per_path, self.path_len)
        self.link_bytes = np.bincount(self.path_edges, weights=per_edge, minlength=len(self.edges))

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
        # Reductions in progress: finish time, transfer.
        self.r_time = np.zeros(0)
        self.r_tr = np.zeros(0, np.int64)
        self.ended = 0

        t = 0.0
        last_report = _time.monotonic()
        first = self.step_base[:-1][self.step_base[:-1] < self.step_base[1:]]
        self._start_steps(first, t)
        while True:
            self._settle(t)
            next_t = math.inf
            if len(self.a_rem):
                next_t = min(next_t, t + float(np.min(self.a_rem / self.a_rate)))
            if len(self.w_act):
                next_t = min(next_t, float(self.w_act.min()))
            if len(self.r_time):
                next_t = min(next_t, float(self.r_time.min()))
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
            self._deadlock()
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
                    if self.reduce_bandwidth is None:
                        ops_done.append(self.t_rstep[arrived])
                    else:
                        slow = self.t_reduce[arrived] & (self.t_bytes[arrived] > 0)
                        ops_done.append(self.t_rstep[arrived[~slow]])
                        if slow.any():
                            red = arrived[slow]
                            self.r_time = np.concatenate(
                                [self.r_time, t + self.t_bytes[red] / self.reduce_bandwidth])
                            self.r_tr = np.concatenate([self.r_tr, red])
            if len(self.r_time):
                due = self.r_time <= t + tol
                if due.any():
                    ops_done.append(self.t_rstep[self.r_tr[due]])
                    self.r_time, self.r_tr = self.r_time[~due], self.r_tr[~due]
            if not ops_done:
                break
            steps, counts = np.unique(np.concatenate(ops_done), return_counts=True)
            self.pending[steps] -= counts
            finished_steps = steps[self.pending[steps] == 0]
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
        self.t_start[trs] = t
        pair = self.t_pair[trs]
        npaths = self.pair_npaths[pair]
        self.sub_left[trs] = npaths
        total = int(npaths.sum())
        offsets = np.arange(total) - np.repeat(np.cumsum(npaths) - npaths, npaths)
        paths = np.repeat(self.pair_ptr[pair], npaths) + offsets
        sub_tr = np.repeat(trs, npaths)
        sub_bytes = np.repeat(self.t_bytes[trs] / npaths, npaths)
        act = t + self.alpha + self.path_lat[paths]
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
            load = np.bincount(rows, weights=rate[cols], minlength=nedges)
        else:
            load = np.zeros(nedges)
        self.loaded = np.flatnonzero(load > 0)
        if self.record:
            changed = np.flatnonzero(load != self.last_load)
            if len(changed):
                self.timeline.append((t, changed, load[changed]))
            self.last_load = load

    def _deadlock(self) -> None:
        stuck = np.flatnonzero(np.isnan(self.step_end))
        g = int(stuck[0])
        r = int(self.step_rank[g])
        s = self._local(g)
        # The first transfer of this step still waiting for its peer.
        waits = []
        for tr in self.st_tr[self.st_ptr[g]:self.st_ptr[g + 1]].tolist():
            if self.ready[tr] > 0 or np.isnan(self.t_start[tr]):
                if self.t_sstep[tr] == g:
                    peer, peer_step = int(self.t_dst[tr]), int(self.t_rstep[tr])
                    what = "send"
                else:
                    peer, peer_step = int(self.t_src[tr]), int(self.t_sstep[tr])
                    what = "recv"
                waits.append(f"{what} chunk {int(self.t_chunk[tr])} with rank {peer}, whose "
                             f"matching step is {self._local(peer_step)}")
        ranks = len(np.unique(self.step_rank[stuck]))
        raise ScheduleError(f"{self.schedule.algorithm} schedule: deadlock: {ranks} ranks "
                            f"cannot finish; rank {r} step {s} waits to " + "; ".join(waits[:3]))

    # ------------------------------------------------------------------------------
    def report(self) -> SimReport:
        n = self.schedule.nranks
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
        step_times = tuple(
            tuple(zip(starts[self.step_base[r]:self.step_base[r + 1]],
                      ends[self.step_base[r]:self.step_base[r + 1]]))
            for r in range(n))
        transfers: tuple[TransferRecord, ...] = ()
        timeline: dict[Edge, tuple[tuple[float, float], ...]] = {}
        if self.record:
            base = self.step_base
            transfers = tuple(
                TransferRecord(src, dst, ss - int(base[src]), rs - int(base[dst]), chunk,
                               int(nbytes), start, end)
                for src, dst, ss, rs, chunk, nbytes, start, end in zip(
                    self.t_src.tolist(), self.t_dst.tolist(), self.t_sstep.tolist(),
                    self.t_rstep.tolist(), self.t_chunk.tolist(), self.t_bytes.tolist(),
                    self.t_start.tolist(), self.t_end.tolist()))
            changes: dict[int, list[tuple[float, float]]] = {}
            for t, edges, rates in self.timeline:
                for e, rate in zip(edges.tolist(), rates.tolist()):
                    changes.setdefault(e, []).append((t, rate))
            timeline = {self.edges[e]: tuple(v) for e, v in changes.items()}
        return SimReport(
            cluster=self.cluster.name, algorithm=self.schedule.algorithm, nranks=n,
            size=self.size, time_s=time_s, lower_bound_s=bound, algbw=algbw, busbw=busbw,
            link_bytes=MappingProxyType(link_bytes), link_busy_s=MappingProxyType(link_busy),
            step_times=step_times, transfers=transfers,
            link_timeline=MappingProxyType(timeline))
