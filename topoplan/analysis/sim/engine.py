"""The simulator's engine: arrays, fixed-rate timers and lookahead windows.

How the engine stays fast (numbers for a 1024-rank ring on leaf_spine_1024 are in
scripts/bench_simulate.py):

1. Transfers that share (send step, recv step, bytes, reduce) are one *message* of
   multiplicity k: k identical max-min flows on the same paths, carried as one flow of
   weight k. A hierarchical plan's in-box step moving 128 chunks to one peer is then
   one message, not 128.
2. Fixed messages. A link whose users (over the whole schedule) all have the same
   source rank can only carry messages of that rank's current send step (steps run
   in order and a step ends after its sends arrive); likewise for one destination
   rank. A message whose every link is such a link, and that is the only message of
   its send (resp. recv) step on it, never shares a link with another message: its
   rate is its solo max-min rate for its whole life and its arrival time is known at
   launch. Such messages are timers (most of a ring or an in-box phase). Timers are
   drained eagerly, out of time order: everything downstream of a timer is a max()
   of times, and anything it launches starts later than it. With channels (IR v4) a
   rank runs one step per channel at once, so "one source" means one source
   *sequence* (rank and channel), and likewise for destinations.
3. The rest (dynamic flows) are simulated in time order, but in windows: a message
   launched now reaches its first link no sooner than ``lookahead`` = alpha + the
   smallest latency of a dynamic path, so during [t0, t0 + lookahead) the set of
   flows that can be on the network is known, and its connected components (flows
   joined by shared links) evolve independently. Each component advances on its own
   clock through the window, all components at once in numpy; only components with
   an event are re-rated (max-min fairness decomposes over components exactly).
4. Max-min rates by parallel water-filling: every link whose fair share is no larger
   than the share of any flow crossing it freezes in the same round (shares only
   grow during progressive filling, so this is exact), so the rounds are the depth of
   the bottleneck dependency, not the number of distinct rates.
5. Links that carry exactly the same paths (a GPU's edge to its NIC and the NIC's edge
   to its leaf) carry the same flows at all times: the dynamic engine re-rates over
   one link per such class (the one of least capacity; the others cannot bind) and
   copies its load to the rest. On leaf-spine fabrics that removes a third of the
   (flow, link) pairs. What remains costly: on a pipelined multi-level plan (the mcf
   grid at 1024 GPUs) the flows crossing spines form one or two components of
   thousands of flows with hundreds of events per lookahead window, each a global
   re-rate of the component.
6. Native collectives (IR v3) are items of their own, numbered after the messages: one
   starts once its last member has started its step (plus the step overhead), puts one
   dynamic flow on each link it loads (a path of one edge, carrying that link's bytes:
   its links are never a fixed message's), and ends for every member once those flows
   are done and its floor has passed (:mod:`topoplan.analysis.native.price`); one that
   loads no link is a timer.
"""

from __future__ import annotations

import math
import time as _time
from types import MappingProxyType
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from ..bound import collective_bound
from ...ir.collectives import bus_factor
from ...errors import ProfileError, TopoplanError
from .base import EPS_T, Setup, expand, maxmin, route_table
from .report import Edge, SimReport, TransferRecord

__all__ = ["Engine"]

_INF = math.inf


class Engine(Setup):
    """The simulator's engine (see the module notes); ``run()`` then ``report()``."""

    eps = EPS_T  # the relative time resolution (set per run by ``simulate``)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
        table = route_table(cluster, n, self.m_src, self.m_dst)
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
        self.solo_rate = maxmin(npaths, np.ones(npaths), inc_path, inc_local,
                                 self.cap[ukey % nedges])
        # Each pair's distinct links and the load one transfer puts on them.
        self.pe_edge = (ukey % nedges).astype(np.int64)
        self.pe_ptr = np.searchsorted(ukey // nedges, np.arange(npairs + 1)).astype(np.int64)
        self.pe_load = np.bincount(inc_local, weights=self.solo_rate[inc_path],
                                   minlength=len(ukey))
        self._native_paths()
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

    def _native_paths(self) -> None:
        """Native flows are paths of one edge, numbered after the pairs' paths from
        ``nat_path0``; their bytes count in ``link_bytes``."""
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
        nedges, nmsg = len(self.edges), len(self.m_k)
        n = len(self.flat.seq_rank)  # the sequences: the ranks, without channels
        npairs = len(self.pair_npaths)
        pe_pair = np.repeat(np.arange(npairs), np.diff(self.pe_ptr))
        if npairs:
            if self.flat.nchannels > 1:
                # A rank runs a step of each channel at once: "one source" is one source
                # sequence (rank and channel), as is "one destination".
                edge, src, dst = self._sequence_links()
            else:
                src_of_pair, dst_of_pair = self._pair_src_dst()
                edge, src, dst = self.pe_edge, src_of_pair[pe_pair], dst_of_pair[pe_pair]
            lo_s = np.full(nedges, n); hi_s = np.full(nedges, -1)
            lo_r = np.full(nedges, n); hi_r = np.full(nedges, -1)
            np.minimum.at(lo_s, edge, src)
            np.maximum.at(hi_s, edge, src)
            np.minimum.at(lo_r, edge, dst)
            np.maximum.at(hi_r, edge, dst)
            sx, rx = lo_s == hi_s, lo_r == hi_r  # links of one source / one destination
            # A link a native collective loads may carry two flows at once.
            sx[self.nat_flow_edge] = False
            rx[self.nat_flow_edge] = False
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
            edges, owner = expand(self.pe_ptr, self.pe_edge, self.m_pair[todo])
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
        flowing = np.diff(self.nat_flow_ptr) > 0
        if flowing.any():  # a native's flows reach their links its latency after it starts
            self.lookahead = min(self.lookahead, float(self.nat_lat[flowing].min()))

    def _sequence_links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """With channels (IR v4): each link each message crosses, with the message's
        source and destination sequences, once per (pair, channel)."""
        f = self.flat
        nchan = f.nchannels
        combo, inverse = np.unique(self.m_pair * nchan + f.step_channel[self.m_sstep],
                                   return_inverse=True)
        inverse = inverse.reshape(-1)
        src = np.empty(len(combo), np.int64)
        dst = np.empty(len(combo), np.int64)
        src[inverse] = f.step_seq[self.m_sstep]
        dst[inverse] = f.step_seq[self.m_rstep]
        edges, owner = expand(self.pe_ptr, self.pe_edge, combo // nchan)
        return edges, src[owner], dst[owner]

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
        self.pending = self.ops_per_step.copy()
        self.ready = np.full(nmsg, 2, dtype=np.int8)
        self.m_mark = np.zeros(nmsg, np.int64)
        self.m_start = np.full(nmsg, np.nan)
        self.m_end = np.full(nmsg, np.nan)
        # Items: messages 0..nmsg-1, then native instances (flows left, last flow's end,
        # weight per flow, the floor's end).
        nnat = self.nnat
        self.m_left = np.zeros(nmsg + nnat, np.int64)
        self.m_tmax = np.full(nmsg + nnat, -_INF)
        self.u_k = np.concatenate([self.m_k, np.ones(nnat)])
        self.u_floor = np.full(nmsg + nnat, -_INF)
        self.nat_ready = np.diff(self.nat_ptr).astype(np.int64)
        self.n_start = np.full(nnat, np.nan)
        self.n_end = np.full(nnat, np.nan)
        # A fixed message keeps its links busy for its duration, alone: known up front.
        pair_busy = np.bincount(self.m_pair, weights=self.m_dur, minlength=len(self.pair_npaths))
        pe_pair = np.repeat(np.arange(len(self.pair_npaths)), np.diff(self.pe_ptr))
        self.busy = np.bincount(self.pe_edge, weights=pair_busy[pe_pair],
                                minlength=nedges).astype(np.float64)
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
        self.f_full = np.zeros(0)  # bytes per unit of each flow
        self.ended = 0
        self.clock = 0.0

        last_report = _time.monotonic()
        first = self.first_steps()
        empty = self._start_steps(first, self.rank_t0[self.step_rank[first]])
        self._end_steps(empty)
        self._drain()
        state, still = None, 0
        while len(self.f_msg):
            ev = np.where(self.f_active, self.f_tu + self.f_rem / np.where(
                self.f_active, self.f_rate, 1.0), self.f_act)
            t0 = float(ev.min())
            # Every pass handles the earliest event, so the state moves on; one that does
            # not (a NaN or infinite clock, a flow that never ends) would spin forever.
            now = (t0, self.ended, len(self.f_msg), int(self.f_active.sum()))
            still = still + 1 if now == state else 0
            state = now
            if not math.isfinite(t0) or still > 2:
                raise self._stuck(t0)
            tol = self.eps * max(t0, 1e-6)
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
        if not math.isfinite(self.time_s):
            raise self._stuck(self.time_s)

    def _stuck(self, t: float) -> TopoplanError:
        """The error for a run that cannot go on (its clock is NaN or infinite, or stands
        still): the cost that made it so, where one is out of range."""
        costs = self.costs
        for key in ("alpha_box", "alpha_network", "small_alpha_box", "small_alpha_network",
                    "op_overhead", "step_overhead", "call_overhead", "reduce_bandwidth"):
            value = getattr(costs, key)
            if value is not None and not (math.isfinite(value) and value >= 0):
                return ProfileError(f"{value!r} stops the simulator: it needs a finite "
                                    f"number >= 0", key=f"{costs.name}: {key}")
        return TopoplanError(f"the simulator made no progress at t = {t:g} s with "
                             f"{len(self.f_msg)} flows on the network and "
                             f"{self.nglobal - self.ended} steps to go: a link, a size or a "
                             f"cost is not a finite number")

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
        msgs, _ = expand(self.st_ptr, self.st_msg, steps)
        if len(msgs):
            # A message may touch two of these steps (both sides start together): count
            # both, launch it once (the last position naming it wins, without a sort).
            np.subtract.at(self.ready, msgs, 1)
            pos = np.flatnonzero(self.ready[msgs] == 0)
            if len(pos):
                self.m_mark[msgs[pos]] = pos
                go = msgs[pos[self.m_mark[msgs[pos]] == pos]]
                self._launch(go)
        if self.nnat:
            nat = self.step_nat[steps]
            nat = nat[nat >= 0]
            if len(nat):
                np.subtract.at(self.nat_ready, nat, 1)
                go = np.unique(nat[self.nat_ready[nat] == 0])
                if len(go):
                    self._launch_natives(go)
        return steps[self.pending[steps] == 0]

    def _launch_natives(self, js: np.ndarray) -> None:
        """Start native instances ``js`` (every member has started): their flows, or a
        timer for those that load no link."""
        t = self.nat_launch_times(js)
        self.n_start[js] = t
        items = self.m_k.shape[0] + js
        self.u_floor[items] = t + self.nat_floor[js]
        nflows = np.diff(self.nat_flow_ptr)[js]
        none = nflows == 0
        if none.any():
            self.timers.append((self.u_floor[items[none]], items[none]))
        if (~none).any():
            flows, owner = expand(self.nat_flow_ptr, np.arange(len(self.nat_flow_edge)), js)
            self.m_left[items] = nflows
            self.f_msg = np.concatenate([self.f_msg, items[owner]])
            self.f_path = np.concatenate([self.f_path, self.nat_path0 + flows])
            act = np.maximum(t[owner] + self.nat_lat[js][owner], self.clock)
            self.f_act = np.concatenate([self.f_act, act])
            self.f_rem = np.concatenate([self.f_rem, self.nat_flow_bytes[flows]])
            self.f_full = np.concatenate([self.f_full, self.nat_flow_bytes[flows]])
            self.f_tu = np.concatenate([self.f_tu, np.zeros(len(flows))])
            self.f_rate = np.concatenate([self.f_rate, np.zeros(len(flows))])
            self.f_active = np.concatenate([self.f_active, np.zeros(len(flows), bool)])

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
                idx, owner = expand(self.pe_ptr, np.arange(len(self.pe_edge)),
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
            paths, owner = expand(self.pair_ptr, np.arange(len(self.path_len)), pair)
            sub = dm[owner]
            self.f_msg = np.concatenate([self.f_msg, sub])
            self.f_path = np.concatenate([self.f_path, paths])
            # Every dynamic event before ``clock`` is done. Only with a lookahead below the
            # batch tolerance can a new flow be due earlier (by less than the tolerance).
            act = np.maximum(dt[owner] + self.m_alpha[dm][owner] + self.path_lat[paths],
                             self.clock)
            self.f_act = np.concatenate([self.f_act, act])
            self.f_rem = np.concatenate([self.f_rem, self.m_bytes[sub] / npaths[owner]])
            self.f_full = np.concatenate([self.f_full, self.m_bytes[sub] / npaths[owner]])
            self.f_tu = np.concatenate([self.f_tu, np.zeros(len(sub))])
            self.f_rate = np.concatenate([self.f_rate, np.zeros(len(sub))])
            self.f_active = np.concatenate([self.f_active, np.zeros(len(sub), bool)])

    def _drain(self) -> None:
        """Process every timer (arrivals), whatever its time, and what follows."""
        nmsg = len(self.m_k)
        while self.timers:
            times = np.concatenate([x[0] for x in self.timers])
            msgs = np.concatenate([x[1] for x in self.timers])
            self.timers = []
            native = msgs >= nmsg
            if native.any():
                # A native instance ends for every member at once.
                js, at = msgs[native] - nmsg, times[native]
                self.n_end[js] = at
                steps, owner = expand(self.nat_ptr, self.nat_steps, js)
                msgs, times = msgs[~native], times[~native]
                self.m_end[msgs] = times
                self._ops_done(np.concatenate([self.m_sstep[msgs], self.m_rstep[msgs], steps]),
                               np.concatenate([times, times, at[owner]]),
                               np.concatenate([self.m_n[msgs], self.m_n[msgs],
                                               np.ones(len(steps), np.int64)]))
                continue
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
        w_k = self.u_k[w_msg]
        full = self.f_full[widx]
        inc_e, inc_f = expand(self.rpath_ptr, self.rpath_edges, w_path)
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
        idle = 0
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
            tolf = self.eps * np.maximum(tcf, 1e-6)
            inlive = live[comp_f] & ~w_done
            upd = w_active & inlive
            w_rem[upd] -= w_rate[upd] * (tcf[upd] - w_tu[upd])
            w_tu[upd] = tcf[upd]
            done = upd & (w_rem <= w_rate * tolf)
            w_done |= done
            w_active &= ~done
            act = inlive & ~w_active & ~w_done & (w_act <= tcf + tolf)
            # A round ends or starts a flow of each live component; twice none is a spin.
            idle = 0 if (done.any() or act.any()) else idle + 1
            if idle > 2:
                raise self._stuck(float(ct[live].min()))
            w_active |= act
            w_rem[act] = full[act]
            w_tu[act] = tcf[act]
            # Re-rate the components that moved.
            rr = w_active & live[comp_f]
            sel = rr[inc_f]
            lmask = live[comp_e]
            pf, pe = inc_f[sel], le[sel]
            rates = maxmin(nw, w_k, pf, pe, cap)
            w_rate[rr] = rates[rr]
            load = np.bincount(pe, weights=(w_k * rates)[pf], minlength=nue)
            lidx = np.flatnonzero(lmask)
            ge, owner = expand(self.rep_ptr, self.rep_members, ue[lidx])
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
                if len(arrived):  # (a native ends no sooner than its floor)
                    self.timers.append((np.maximum(self.m_tmax[arrived], self.u_floor[arrived]),
                                        arrived))
        # Write back; drop finished flows.
        self.f_rem[widx], self.f_tu[widx] = w_rem, w_tu
        self.f_rate[widx], self.f_active[widx] = w_rate, w_active
        if w_done.any():
            keep = np.ones(len(self.f_msg), dtype=bool)
            keep[widx[w_done]] = False
            for name in ("f_msg", "f_path", "f_act", "f_rem", "f_tu", "f_rate", "f_active",
                         "f_full"):
                setattr(self, name, getattr(self, name)[keep])

    def _deadlock(self) -> None:
        # A transfer waits while its message has not been launched.
        m = self.t_msg
        self.raise_deadlock((self.ready[m] > 0) | np.isnan(self.m_start[m]))

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
        new[1:] = (e[1:] != e[:-1]) | (t[1:] - t[:-1] > 2 * self.eps * np.maximum(t[1:], 1e-6))
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
            self.n_start, self.n_end = warp(self.n_start), warp(self.n_end)
            self.timeline = [(warp(t), e, v) for t, e, v in self.timeline]
        effective = (self.size // self.dtype_size) * self.dtype_size
        collective = self.schedule.collective
        bound = self.bound if self.bound is not None else \
            collective_bound(self.base, effective, collective)
        time_s = self.time_s
        algbw = self.size / time_s if time_s > 0 else math.inf
        busbw = algbw * bus_factor(n, collective) if n > 1 else 0.0  # not inf x 0
        used = np.flatnonzero(self.link_bytes > 0)
        busy_edges = np.flatnonzero(self.busy > 0)
        link_bytes = {self.edges[i]: float(self.link_bytes[i]) for i in used.tolist()}
        link_busy = {self.edges[i]: float(self.busy[i]) for i in busy_edges.tolist()}
        step_times = self.step_times()
        transfers: tuple[TransferRecord, ...] = ()
        timeline: dict[Edge, tuple[tuple[float, float], ...]] = {}
        if self.record:
            sstep, rstep = self.transfer_steps()
            more = f.t_more
            transfers = tuple(
                TransferRecord(src, dst, ss, rs, chunk, int(nbytes), start, end, count,
                               more.get(i, ()))
                for i, (src, dst, ss, rs, chunk, nbytes, start, end, count) in enumerate(zip(
                    f.t_src.tolist(), f.t_dst.tolist(), sstep, rstep,
                    f.t_chunk.tolist(), self.t_bytes.tolist(),
                    self.m_start[self.t_msg].tolist(), self.m_end[self.t_msg].tolist(),
                    f.t_count.tolist())))
            timeline = self._link_timeline()
        return SimReport(
            cluster=self.cluster.name, algorithm=self.schedule.algorithm, nranks=n,
            size=self.size, time_s=time_s, lower_bound_s=bound, algbw=algbw, busbw=busbw,
            link_bytes=MappingProxyType(link_bytes), link_busy_s=MappingProxyType(link_busy),
            step_times=step_times, transfers=transfers,
            link_timeline=MappingProxyType(timeline), profile=self.costs.name,
            breakdown=MappingProxyType(breakdown), messages=int(self.t_live.sum()),
            resolution=self.eps, natives=self.native_records(), notes=self.native_notes)

