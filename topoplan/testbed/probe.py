"""Measure shaped paths: raw TCP transfers between rank namespaces.

``python -m topoplan.testbed.probe recv ADDR PORT`` prints one JSON line: bytes, seconds
(timed at the receiver from the first byte to end of stream) and progress samples
``[wall time, bytes so far]``; ``send ADDR PORT NBYTES`` sends zeros. :func:`measure` runs
one transfer inside a testbed and returns bytes/s; :func:`measure_concurrent` runs several
at once and returns each one's rate while all of them were flowing, which is what the
simulator's max-min sharing of a link predicts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .netns import TestbedError

__all__ = ["measure", "measure_concurrent", "PORT"]

PORT = 5201
#: A progress sample every this many bytes received.
SAMPLE_BYTES = 256 << 10


def _recv(addr: str, port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen(1)
    print("ready", flush=True)
    server.settimeout(60)
    conn, _ = server.accept()
    conn.settimeout(60)
    buf = bytearray(1 << 20)
    first = conn.recv_into(buf)
    # The first read only starts the clock: its bytes arrived before it. Wall time
    # (shared by all namespaces) so transfers in other namespaces can be lined up.
    start, total, mark = time.time(), 0, SAMPLE_BYTES
    samples = [(start, 0)]
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        if total >= mark:
            samples.append((time.time(), total))
            mark = total + SAMPLE_BYTES
    end = time.time()
    samples.append((end, total))
    print(json.dumps({"bytes": total, "seconds": end - start, "first": first,
                      "samples": samples}), flush=True)


def _send(addr: str, port: int, nbytes: int) -> None:
    conn = socket.create_connection((addr, port), timeout=60)
    block = bytes(1 << 20)
    left = nbytes
    while left > 0:
        conn.sendall(block[:min(left, len(block))])
        left -= len(block)
    conn.close()


def _transfers(bed: Any, pairs: Sequence[tuple[int, int]], nbytes: int,
               timeout: float) -> list[dict[str, Any]]:
    """Run one transfer per (src, dst) pair, all at once; the receivers' JSON records."""
    layout = bed.layout
    argv = [sys.executable, "-m", "topoplan.testbed.probe"]
    # This very checkout, not whichever topoplan the interpreter would find first.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")]))}
    receivers: list[subprocess.Popen] = []
    senders: list[subprocess.Popen] = []
    try:
        for i, (src, dst) in enumerate(pairs):
            addr = layout.addresses[dst]
            receivers.append(subprocess.Popen(
                ["ip", "netns", "exec", layout.rank_ns[dst], *argv, "recv", addr, str(PORT + i)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
        for i, rx in enumerate(receivers):
            if rx.stdout is None or rx.stdout.readline().strip() != "ready":
                raise TestbedError(f"probe receiver in {layout.rank_ns[pairs[i][1]]} did not "
                                   f"start: {rx.stderr.read() if rx.stderr else ''}")
        for i, (src, dst) in enumerate(pairs):
            senders.append(subprocess.Popen(
                ["ip", "netns", "exec", layout.rank_ns[src], *argv, "send",
                 layout.addresses[dst], str(PORT + i), str(nbytes)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env))
        records = []
        for (src, dst), tx, rx in zip(pairs, senders, receivers):
            try:
                _, err = tx.communicate(timeout=timeout)
                out, rerr = rx.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"probe rank {src} -> {dst} took more than {timeout:g} s") \
                    from None
            if tx.returncode != 0 or rx.returncode != 0:
                raise TestbedError(f"probe rank {src} -> {dst} failed: {err or rerr}")
            records.append(json.loads(out))
        return records
    finally:
        for proc in (*senders, *receivers):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def measure(bed: Any, src: int, dst: int, nbytes: int = 4 << 20, timeout: float = 60) -> float:
    """Bytes/s of a TCP transfer from rank ``src`` to rank ``dst`` inside testbed ``bed``."""
    record = _transfers(bed, [(src, dst)], nbytes, timeout)[0]
    return record["bytes"] / record["seconds"]


def _bytes_at(samples: list[list[float]], t: float) -> float:
    """Bytes received by wall time ``t``, interpolated between progress samples."""
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return b0 + (b1 - b0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return samples[0][1] if t < samples[0][0] else samples[-1][1]


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
    records = _transfers(bed, list(pairs), nbytes, timeout)
    # Leave out the first and last 5% of the window: flows ramping up or draining.
    lo = max(r["samples"][0][0] for r in records)
    hi = min(r["samples"][-1][0] for r in records)
    if hi - lo <= 0:
        raise TestbedError(f"the {len(pairs)} transfers of {nbytes} bytes did not overlap; "
                           "use a larger size")
    lo, hi = lo + 0.05 * (hi - lo), hi - 0.05 * (hi - lo)
    return [(_bytes_at(r["samples"], hi) - _bytes_at(r["samples"], lo)) / (hi - lo)
            for r in records]


def main(argv: list[str]) -> int:
    if argv[0] == "recv":
        _recv(argv[1], int(argv[2]))
    elif argv[0] == "send":
        _send(argv[1], int(argv[2]), int(argv[3]))
    else:
        raise SystemExit(f"usage: probe recv ADDR PORT | send ADDR PORT NBYTES, got {argv}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
