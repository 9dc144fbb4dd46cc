"""The first engine, kept as the oracle of the tests and the benchmarks.

Every event batch in global time order, every active flow re-rated by max-min
fairness over the whole network at each batch. Same model and same results as
:class:`~topoplan.analysis.sim.engine.Engine`, but O(batches x flows): slow at scale.
Native collectives are items numbered after the transfers; their flows are paths of one
edge, and one ends at its flows' end or its floor, the later.
"""

from __future__ import annotations

import math
import time as _time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..bound import collective_bound
from ...ir.collectives import bus_factor
from ..cost import CostProfile
from ...errors import ScheduleError
from ...ir.schedule import Schedule
from .base import EPS_T, Setup, expand, maxmin, route_table
from .report import Edge, SimReport, TransferRecord
from .run import costs_for

if TYPE_CHECKING:
    from ...cluster import Cluster

__all__ = ["ReferenceEngine", "simulate_reference"]


class ReferenceEngine(Setup):
    """The first engine, kept as the oracle for tests and benchmarks: every event batch
    in global time order, every active flow re-rated over the whole network.
    Same model, same results; O(batches x flows) and so slow at scale."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flat, nglobal = self.flat, self.nglobal
        self.t_src, self.t_dst, self.t_sstep = flat.t_src, flat.t_dst, flat.t_sstep
        self.t_rstep, self.t_chunk, self.t_reduce = flat.t_rstep, flat.t_chunk, flat.t_reduce
        self.pending = self.ops_per_step.copy()
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
        table = route_table(cluster, n, self.t_src, self.t_dst)
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
        # Native flows: paths of one edge after the pairs' paths.
        index = {e: i for i, e in enumerate(self.edges)}
        self.nat_flow_edge = np.array([index[e] for e in self.nat_flow_edges], dtype=np.int64)
        self.nat_path0 = len(self.path_len)
        nflows = len(self.nat_flow_edge)
        if nflows:
            self.path_edges = np.concatenate([self.path_edges, self.nat_flow_edge])
            self.path_ptr = np.concatenate([self.path_ptr,
                                            self.path_ptr[-1] + 1 + np.arange(nflows)])
            self.path_len = np.concatenate([self.path_len, np.ones(nflows, np.int64)])
            self.link_bytes = self.link_bytes + np.bincount(
                self.nat_flow_edge, weights=self.nat_flow_bytes, minlength=len(self.edges))

    # ------------------------------------------------------------------------------
    def run(self) -> None:
        nglobal, ntr = self.nglobal, len(self.t_src)
        self.step_start = np.full(nglobal, np.nan)
        self.step_end = np.full(nglobal, np.nan)
        self.t_start = np.full(ntr, np.nan)
        self.t_end = np.full(ntr, np.nan)
        nnat = self.nnat
        self.sub_left = np.zeros(ntr + nnat, dtype=np.int64)  # transfers, then natives
        self.nat_ready = np.diff(self.nat_ptr).astype(np.int64)
        self.n_start = np.full(nnat, np.nan)
        self.n_end = np.full(nnat, np.nan)
        self.n_floor = np.full(nnat, -math.inf)
        # Natives whose flows are done (or that have none), ending at their floor.
        self.v_time = np.zeros(0)
        self.v_nat = np.zeros(0, np.int64)
        # First steps that start later (ranks that pay the call overhead).
        self.s_time = np.zeros(0)
        self.s_step = np.zeros(0, np.int64)
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

        last_report = _time.monotonic()
        first = self.first_steps()
        at = self.rank_t0[self.step_rank[first]]
        t = float(at.min()) if len(at) else self.t0
        now = at <= t
        self.s_time, self.s_step = at[~now], first[~now]
        self._end_steps(self._start_steps(first[now], t), t)  # (the first engine dropped these)
        while True:
            self._settle(t)
            next_t = math.inf
            if len(self.v_time):
                next_t = min(next_t, float(self.v_time.min()))
            if len(self.s_time):
                next_t = min(next_t, float(self.s_time.min()))
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
            self.raise_deadlock((self.ready > 0) | np.isnan(self.t_start))
        self.time_s = float(np.max(self.step_end)) if nglobal else 0.0

    def _settle(self, t: float) -> None:
        """Handle everything due at time ``t`` (cascading zero-time events), then re-rate."""
        tol = EPS_T * max(t, 1e-6)
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
            ntr = len(self.t_src)
            if done_tr:
                finished = np.concatenate(done_tr)
                trs, counts = np.unique(finished, return_counts=True)
                self.sub_left[trs] -= counts
                arrived = trs[self.sub_left[trs] == 0]
                native = arrived >= ntr
                if native.any():  # flows done: the native ends at its floor, or now
                    js = arrived[native] - ntr
                    self.v_time = np.concatenate([self.v_time, np.maximum(self.n_floor[js], t)])
                    self.v_nat = np.concatenate([self.v_nat, js])
                    arrived = arrived[~native]
                if len(arrived):
                    self.t_end[arrived] = t
                    ops_done.append(self.t_sstep[arrived])
                    ops_done.append(self.t_rstep[arrived])
            if len(self.v_time):
                due = self.v_time <= t + tol
                if due.any():
                    js = self.v_nat[due]
                    self.n_end[js] = t
                    steps, _ = expand(self.nat_ptr, self.nat_steps, js)
                    ops_done.append(steps)
                    self.v_time, self.v_nat = self.v_time[~due], self.v_nat[~due]
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
            if len(self.s_time):
                due = self.s_time <= t + tol
                if due.any():
                    starting = self.s_step[due]
                    self.s_time, self.s_step = self.s_time[~due], self.s_step[~due]
                    ending.append(self._start_steps(starting, t))
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
        nat = self.step_nat[steps]
        nat = nat[nat >= 0]
        if len(nat):
            np.subtract.at(self.nat_ready, nat, 1)
            ready = np.unique(nat[self.nat_ready[nat] == 0])
            if len(ready):
                self._launch_natives(ready)
        return steps[self.pending[steps] == 0]

    def _launch_natives(self, js: np.ndarray) -> None:
        """Start native instances ``js``: their flows wait their latency; one without
        flows ends at its floor."""
        t = self.nat_launch_times(js)
        self.n_start[js] = t
        self.n_floor[js] = t + self.nat_floor[js]
        nflows = np.diff(self.nat_flow_ptr)[js]
        none = nflows == 0
        self.v_time = np.concatenate([self.v_time, self.n_floor[js[none]]])
        self.v_nat = np.concatenate([self.v_nat, js[none]])
        if (~none).any():
            flows, owner = expand(self.nat_flow_ptr, np.arange(len(self.nat_flow_edge)), js)
            self.sub_left[len(self.t_src) + js] = nflows
            self.w_act = np.concatenate([self.w_act, t[owner] + self.nat_lat[js][owner]])
            self.w_tr = np.concatenate([self.w_tr, len(self.t_src) + js[owner]])
            self.w_path = np.concatenate([self.w_path, self.nat_path0 + flows])
            self.w_bytes = np.concatenate([self.w_bytes, self.nat_flow_bytes[flows]])

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
        """Max-min fair rates of every active flow over the whole network."""
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
            rate = maxmin(nflows, np.ones(nflows), cols, local.reshape(-1), self.cap[used])
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
        """The same report as :class:`Engine` (transfers and timelines included)."""
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
            self.n_start, self.n_end = warp(self.n_start), warp(self.n_end)
            self.timeline = [(float(warp(t)), e, v) for t, e, v in self.timeline]
        collective = self.schedule.collective
        bound = collective_bound(self.cluster, (self.size // self.dtype_size) * self.dtype_size,
                                 collective)
        algbw = self.size / self.time_s if self.time_s > 0 else math.inf
        transfers: tuple[TransferRecord, ...] = ()
        timeline: dict[Edge, tuple[tuple[float, float], ...]] = {}
        if self.record:
            sstep, rstep = self.transfer_steps()
            more = self.flat.t_more
            transfers = tuple(
                TransferRecord(src, dst, ss, rs, chunk, int(nbytes), start, end, count,
                               more.get(i, ()))
                for i, (src, dst, ss, rs, chunk, nbytes, start, end, count) in enumerate(zip(
                    self.t_src.tolist(), self.t_dst.tolist(), sstep, rstep,
                    self.t_chunk.tolist(), self.t_bytes.tolist(),
                    self.t_start.tolist(), self.t_end.tolist(), self.flat.t_count.tolist())))
            changes: dict[int, list[tuple[float, float]]] = {}
            for t, edges, rates in self.timeline:
                for e, rate in zip(edges.tolist(), rates.tolist()):
                    changes.setdefault(e, []).append((t, rate))
            timeline = {self.edges[e]: tuple(v) for e, v in changes.items()}
        return SimReport(
            cluster=self.cluster.name, algorithm=self.schedule.algorithm, nranks=n,
            size=self.size, time_s=self.time_s, lower_bound_s=bound, algbw=algbw,
            busbw=algbw * bus_factor(n, collective) if n > 1 else 0.0,
            link_bytes=MappingProxyType({self.edges[i]: float(self.link_bytes[i])
                                         for i in np.flatnonzero(self.link_bytes > 0).tolist()}),
            link_busy_s=MappingProxyType({self.edges[i]: float(self.busy[i])
                                          for i in np.flatnonzero(self.busy > 0).tolist()}),
            step_times=self.step_times(),
            transfers=transfers, link_timeline=MappingProxyType(timeline),
            profile=self.costs.name, breakdown=MappingProxyType(breakdown),
            messages=int(self.t_live.sum()), natives=self.native_records(),
            notes=self.native_notes)



def simulate_reference(cluster: Cluster, schedule: Schedule, size: int, *, dtype_size: int = 4,
                        profile: CostProfile | str | None = None,
                        reduce_bandwidth: float | None = None, alpha: float | None = None,
                        record: bool = False) -> SimReport:
    """:func:`simulate` by :class:`ReferenceEngine` (tests and benchmarks only)."""
    if schedule.nranks != cluster.nranks:
        raise ScheduleError("rank count differs")
    from ..native.clusters import runtime_cluster
    costs = costs_for(profile, alpha, reduce_bandwidth)
    engine = ReferenceEngine(runtime_cluster(cluster, costs), schedule, int(size), dtype_size,
                              costs, record, None, base=cluster)
    engine.run()
    return engine.report()

