"""Measure the emulated network against the model: raw TCP transfers between ranks.

One agent per rank namespace (:mod:`topoplan.testbed._agent`, stdlib only) runs the
transfers on command. :func:`measure` times one transfer; :func:`measure_concurrent`
runs several at once and returns each one's rate while all of them were flowing, which
is what the simulator's max-min sharing predicts. :func:`check_pairs` is the testbed's
self-test: every ordered pair alone, with the bytes each interface sent read from the
kernel's counters (so the path the packets took is measured, not assumed) and the rate
compared with the model's; then ``shift`` patterns where every rank sends at once. The
model is the layout at the rates its degraded links have now (:func:`model_layout`).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .netns import TestbedError

__all__ = ["measure", "measure_concurrent", "counters", "check_pairs", "predicted_rates",
           "model_layout", "PairCheck", "ProbeReport", "PORT", "TOLERANCE"]

PORT = 5201
#: How far a measured rate or a path's share of the bytes may be from the model.
TOLERANCE = 0.10
#: An interface off a pair's paths may carry this much of its bytes (TCP ACKs of the
#: reverse direction, about 0.4% with jumbo frames, and ARP-free routing adds nothing).
OFF_PATH = 0.03
#: Ethernet + IP + TCP header bytes per payload byte at the testbed's MTU, as counted by
#: the interfaces' tx_bytes.
_FRAME = (9000 + 14) / (9000 - 52)


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    """Move an agent's output lines into ``lines``; ``None`` when it ends."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


class _Agents:
    """One probe agent per rank namespace, started once and reused for every transfer."""

    def __init__(self, layout: Any, ranks: Sequence[int]) -> None:
        self.layout = layout
        self.procs: dict[int, subprocess.Popen] = {}
        self.next_id = 0
        self.early: dict[tuple[int, Any], dict[str, Any]] = {}  # answers read ahead
        self.lines: dict[int, queue.Queue] = {}
        agent = str(Path(__file__).with_name("_agent.py"))
        try:
            for r in sorted(set(ranks)):
                self.procs[r] = subprocess.Popen(
                    ["ip", "netns", "exec", layout.rank_ns[r], sys.executable, agent,
                     layout.addresses[r]],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, bufsize=1)
            for r, proc in self.procs.items():
                self.lines[r] = queue.Queue()
                threading.Thread(target=_pump, args=(proc, self.lines[r]), daemon=True).start()
            for r in self.procs:
                self._read(r, None, 30)
        except BaseException:
            self.close()
            raise

    def _read(self, rank: int, want: int | None, timeout: float) -> dict[str, Any]:
        """The answer with id ``want`` from rank ``rank``'s agent (others are kept)."""
        deadline = time.monotonic() + timeout
        while (rank, want) not in self.early:
            left = deadline - time.monotonic()
            try:
                line = self.lines[rank].get(timeout=max(left, 0))
            except queue.Empty:
                raise TestbedError(f"probe agent of rank {rank} did not answer in "
                                   f"{timeout:g} s") from None
            if line is None:
                proc = self.procs[rank]
                err = proc.stderr.read() if proc.stderr else ""
                raise TestbedError(f"probe agent of rank {rank} ended: {err.strip()[-500:]}")
            record = json.loads(line)
            if "error" in record:
                raise TestbedError(f"probe agent of rank {rank}: {record['error']}")
            self.early[(rank, record.get("id"))] = record
        return self.early.pop((rank, want))

    def _send(self, rank: int, cmd: dict[str, Any]) -> None:
        proc = self.procs[rank]
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()

    def transfers(self, pairs: Sequence[tuple[int, int]], nbytes: Sequence[int],
                  timeout: float) -> list[dict[str, Any]]:
        """Run one transfer per (src, dst) pair, all at once; the receivers' records."""
        ids = []
        for i, (src, dst) in enumerate(pairs):
            self.next_id += 1
            ids.append(self.next_id)
            self._send(dst, {"op": "recv", "id": self.next_id, "port": PORT + i})
            self._read(dst, self.next_id, 30)
        for i, (src, dst) in enumerate(pairs):
            self._send(src, {"op": "send", "id": -ids[i], "addr": self.layout.addresses[dst],
                             "port": PORT + i, "nbytes": int(nbytes[i])})
        records = []
        for i, (src, dst) in enumerate(pairs):
            try:
                records.append(self._read(dst, ids[i], timeout))
                self._read(src, -ids[i], timeout)
            except TestbedError as exc:
                raise TestbedError(f"probe rank {src} -> {dst}: {exc}") from None
        return records

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def __enter__(self) -> _Agents:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def model_layout(bed: Any) -> Any:
    """The layout whose rates the testbed should deliver now: with the links degraded
    on it (:meth:`Testbed.current_layout`, from its state file) at their factors."""
    current = getattr(bed, "current_layout", None)
    return current() if callable(current) else bed.layout


def measure(bed: Any, src: int, dst: int, nbytes: int = 4 << 20, timeout: float = 60) -> float:
    """Bytes/s of a TCP transfer from rank ``src`` to rank ``dst`` inside testbed ``bed``."""
    with _Agents(bed.layout, [src, dst]) as agents:
        record = agents.transfers([(src, dst)], [nbytes], timeout)[0]
    return record["bytes"] / record["seconds"]


def _bytes_at(samples: list[list[float]], t: float) -> float:
    """Bytes received by wall time ``t``, interpolated between progress samples."""
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return samples[0][1] if t < samples[0][0] else samples[-1][1]


def _overlap_rates(records: list[dict[str, Any]], what: str) -> list[float]:
    # Leave out the first and last 5% of the window: flows ramping up or draining.
    lo = max(r["samples"][0][0] for r in records)
    hi = min(r["samples"][-1][0] for r in records)
    if hi - lo <= 0:
        raise TestbedError(f"the transfers of {what} did not overlap; use a larger size")
    lo, hi = lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo)
    return [(_bytes_at(r["samples"], hi) - _bytes_at(r["samples"], lo)) / (hi - lo)
            for r in records]


def measure_concurrent(bed: Any, pairs: Sequence[tuple[int, int]], nbytes: int = 16 << 20,
                       timeout: float = 120) -> list[float]:
    """Bytes/s of each of several simultaneous transfers, over the time all of them flowed.

    Two flows through one shaped link should each get half its rate (max-min fair
    sharing, as :func:`topoplan.simulate` assumes).

    Raises
    ------
    TestbedError
        A transfer failed, or the transfers never overlapped (the machine too slow to
        start them together: use a larger ``nbytes``).
    """
    ranks = [r for pair in pairs for r in pair]
    with _Agents(bed.layout, ranks) as agents:
        records = agents.transfers(list(pairs), [nbytes] * len(pairs), timeout)
    return _overlap_rates(records, f"{len(pairs)} pairs of {nbytes} bytes")


def counters(layout: Any) -> dict[tuple[str, str], int]:
    """Bytes sent so far by every veth end of the testbed: (namespace, interface) -> tx."""
    names = sorted({v.ns_a for v in layout.veths} | {v.ns_b for v in layout.veths})
    script = "".join(f'echo "@ {ns}"; ip netns exec {ns} cat /proc/net/dev; ' for ns in names)
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    out: dict[tuple[str, str], int] = {}
    ns = ""
    for line in proc.stdout.splitlines():
        if line.startswith("@ "):
            ns = line[2:].strip()
        elif ":" in line and ns:
            dev, fields = line.split(":", 1)
            values = fields.split()
            if len(values) >= 9:
                out[(ns, dev.strip())] = int(values[8])  # transmit bytes
    return out


@dataclass
class PairCheck:
    """One probe of one pair alone (``pattern`` None) or within a concurrent pattern."""

    src: int
    dst: int
    model_rate: float | None  # bytes/s; None: every hop unshaped
    measured_rate: float
    pattern: str | None = None
    #: (namespace, interface, expected share of the bytes, measured share), for every
    #: interface on the pair's paths and every other one that carried more than OFF_PATH.
    hops: list[tuple[str, str, float, float]] = field(default_factory=list)
    path_ok: bool = True
    #: How many times it was measured (a slow measurement is repeated, the fastest kept).
    attempts: int = 1

    @property
    def ratio(self) -> float | None:
        return None if not self.model_rate else self.measured_rate / self.model_rate

    @property
    def rate_ok(self) -> bool:
        return self.ratio is None or abs(self.ratio - 1) <= TOLERANCE

    @property
    def ok(self) -> bool:
        return self.path_ok and self.rate_ok


@dataclass
class ProbeReport:
    """What :func:`check_pairs` measured: the checks and the worst deviation."""

    checks: list[PairCheck]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[PairCheck]:
        return [c for c in self.checks if not c.ok]

    @property
    def worst(self) -> float:
        """The largest |measured / model - 1| over the checks with a model rate."""
        return max((abs(c.ratio - 1) for c in self.checks if c.ratio is not None), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "worst": self.worst, "seconds": self.seconds,
                "checks": [{**asdict(c), "ratio": c.ratio, "ok": c.ok} for c in self.checks]}


def predicted_rates(layout: Any, pairs: Sequence[tuple[int, int]]) -> list[float | None]:
    """The model's rate of each pair while all of them flow (bytes/s; ``None``: unshaped).

    Each equal-cost path of a pair is a flow of its own, shared max-min fairly on every
    interface, as in :func:`topoplan.simulate`; a pair's bytes are split evenly over its
    paths, so it moves at its slowest path's rate times the number of paths.
    """
    from ..analysis.sim.base import maxmin as _maxmin
    rate = {(v.ns_a, v.name_a): v.rate for v in layout.veths}
    rate |= {(v.ns_b, v.name_b): v.rate for v in layout.veths}
    links: dict[tuple[str, str], int] = {}
    pf: list[int] = []
    pe: list[int] = []
    owner: list[int] = []
    for p, (src, dst) in enumerate(pairs):
        for path in layout.route(src, dst).paths:
            flow = len(owner)
            owner.append(p)
            for hop in path:
                hop = tuple(hop)
                if rate[hop] is None:
                    continue
                pf.append(flow)
                pe.append(links.setdefault(hop, len(links)))
    cap = np.array([rate[h] for h in links], dtype=np.float64)
    flows = _maxmin(len(owner), np.ones(len(owner)), np.array(pf, dtype=np.int64),
                    np.array(pe, dtype=np.int64), cap)
    out: list[float | None] = []
    for p in range(len(pairs)):
        mine = [flows[f] for f, o in enumerate(owner) if o == p]
        slowest = min(mine)
        out.append(None if not np.isfinite(slowest) or slowest <= 0 else float(slowest) * len(mine))
    return out


def _path_check(layout: Any, src: int, dst: int, delta: dict[tuple[str, str], int],
                nbytes: int) -> tuple[list[tuple[str, str, float, float]], bool]:
    """Compare each interface's bytes with the pair's paths (``nbytes`` sent)."""
    paths = layout.route(src, dst).paths
    expected: dict[tuple[str, str], float] = {}
    for path in paths:
        for hop in path:
            expected[tuple(hop)] = expected.get(tuple(hop), 0.0) + 1 / len(paths)
    wire = nbytes * _FRAME
    hops, ok = [], True
    for key in sorted(set(expected) | set(delta)):
        share = delta.get(key, 0) / wire
        want = expected.get(key, 0.0)
        if want:
            good = abs(share - want) <= TOLERANCE * want + 0.01
        else:
            good = share <= OFF_PATH
            if good:
                continue
        ok &= good
        hops.append((key[0], key[1], want, share))
    return hops, ok


def _nbytes(rate: float | None, seconds: float) -> int:
    return int(min(max((rate or 50e6) * seconds, 1 << 20), 512 << 20))


def _alone(agents: _Agents, src: int, dst: int, seconds: float, timeout: float) -> PairCheck:
    """One transfer of ``src -> dst`` alone, its path read from the interface counters."""
    layout = agents.layout
    model = layout.route(src, dst).rate
    before = counters(layout)
    record = agents.transfers([(src, dst)], [_nbytes(model, seconds)], timeout)[0]
    after = counters(layout)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    hops, path_ok = _path_check(layout, src, dst, delta, record["bytes"] + record["first"])
    return PairCheck(src, dst, model, record["bytes"] / record["seconds"], None, hops, path_ok)


def _shift(agents: _Agents, k: int, seconds: float, timeout: float) -> list[PairCheck]:
    """Every rank ``r`` sends to ``r + k`` at once: each pair's rate while all flow."""
    n = agents.layout.nranks
    group = [(r, (r + k) % n) for r in range(n)]
    models = predicted_rates(agents.layout, group)
    records = agents.transfers(group, [_nbytes(m, seconds * 2) for m in models], timeout)
    rates = _overlap_rates(records, f"shift {k}")
    return [PairCheck(src, dst, model, rate, f"shift {k}")
            for (src, dst), model, rate in zip(group, models, rates)]


def _slow(check: PairCheck) -> bool:
    return check.ratio is not None and check.ratio < 1 - TOLERANCE


def check_pairs(bed: Any, pairs: Sequence[tuple[int, int]] | None = None, *,
                seconds: float = 0.4, shifts: Sequence[int] | None = None,
                timeout: float = 120, retries: int = 2, progress: Any = None) -> ProbeReport:
    """Probe pairs alone (path and rate) and under concurrent load (rates).

    Parameters
    ----------
    bed : Testbed
    pairs : sequence of (int, int), optional
        The pairs to probe alone; every ordered pair by default.
    seconds : float
        How long each transfer should last at the model's rate (its size follows).
    shifts : sequence of int, optional
        Concurrent patterns: for each ``k``, every rank ``r`` sends to ``r + k`` at once;
        default ``1 .. n-1``. Empty: none.
    retries : int
        A pair (or a pattern with a pair) measured slower than the model by more than
        :data:`TOLERANCE` is measured again, up to this many times, and its fastest
        measurement kept: on a shared machine a descheduled process can only slow a
        transfer down, while a link faster than its model stays a failure. Each check
        records its ``attempts``.
    progress : callable, optional
        Called with a line of text after each measurement.

    Returns
    -------
    ProbeReport
    """
    layout = model_layout(bed)
    n = layout.nranks
    started = time.monotonic()
    if pairs is None:
        pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    shifts = range(1, n) if shifts is None else shifts
    checks: list[PairCheck] = []
    with _Agents(layout, range(n)) as agents:
        for src, dst in pairs:
            check = _alone(agents, src, dst, seconds, timeout)
            while _slow(check) and check.attempts <= retries:
                again = _alone(agents, src, dst, seconds, timeout)
                again.attempts = check.attempts + 1
                check = again if again.measured_rate > check.measured_rate else \
                    replace(check, attempts=again.attempts)
            checks.append(check)
            if progress:
                progress(_line(check))
        for k in shifts:
            if k % n == 0:
                continue
            group = _shift(agents, k, seconds, timeout)
            attempts = 1
            while any(_slow(c) for c in group) and attempts <= retries:
                attempts += 1
                group = [max(old, new, key=lambda c: c.measured_rate)
                         for old, new in zip(group, _shift(agents, k, seconds, timeout))]
            for check in group:
                check.attempts = attempts
                checks.append(check)
                if progress:
                    progress(_line(check))
    return ProbeReport(checks, time.monotonic() - started)


def _line(c: PairCheck) -> str:
    what = f"{c.src} -> {c.dst}" + (f" ({c.pattern})" if c.pattern else "")
    model = "unshaped" if c.model_rate is None else f"{c.model_rate * 8 / 1e6:,.0f} Mbit/s"
    return (f"{what}: {c.measured_rate * 8 / 1e6:,.0f} Mbit/s, model {model}"
            + ("" if c.path_ok else ", PATH DIFFERS") + ("" if c.rate_ok else ", RATE DIFFERS")
            + (f" (best of {c.attempts})" if c.attempts > 1 else ""))
