"""A probe agent inside one rank's namespace: raw TCP transfers on command (stdlib only).

Run by path (``python .../_agent.py ADDRESS``), not as part of the package, so that it
starts in tens of milliseconds. Reads one JSON command per line on stdin and answers
with JSON lines on stdout, each carrying the command's ``id``:

* ``{"op": "recv", "id": I, "port": P}``: listen on ``ADDRESS:P``, answer
  ``{"id": I, "ready": true}``, then after the stream ends
  ``{"id": I, "bytes", "seconds", "first", "samples"}`` (timed at the receiver from
  the first byte to the end of the stream; samples are ``[wall time, bytes so far]``);
* ``{"op": "send", "id": I, "addr": A, "port": P, "nbytes": N}``: send N zero bytes,
  answer ``{"id": I, "sent": N}``;
* ``{"op": "quit"}``, or end of input: leave.

Each command runs in a thread of its own, so one agent sends and receives at once.
An error answers ``{"id": I, "error": "..."}``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any

#: A progress sample every this many bytes received.
SAMPLE_BYTES = 256 << 10
TIMEOUT = 120.0

_out = threading.Lock()


def _say(record: dict[str, Any]) -> None:
    with _out:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def _recv(address: str, cmd: dict[str, Any]) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, int(cmd["port"])))
    server.listen(1)
    server.settimeout(TIMEOUT)
    _say({"id": cmd["id"], "ready": True})
    conn, _ = server.accept()
    server.close()
    conn.settimeout(TIMEOUT)
    buf = bytearray(1 << 20)
    first = conn.recv_into(buf)
    # The first read only starts the clock: its bytes arrived before it. Wall time
    # (shared by all namespaces) so transfers in other namespaces can be lined up.
    start, total, mark = time.time(), 0, SAMPLE_BYTES
    samples = [(start, 0)]
    while True:
        got = conn.recv_into(buf)
        if not got:
            break
        total += got
        if total >= mark:
            samples.append((time.time(), total))
            mark = total + SAMPLE_BYTES
    end = time.time()
    conn.close()
    samples.append((end, total))
    _say({"id": cmd["id"], "bytes": total, "seconds": end - start, "first": first,
          "samples": samples})


def _send(cmd: dict[str, Any]) -> None:
    conn = socket.create_connection((cmd["addr"], int(cmd["port"])), timeout=TIMEOUT)
    block = bytes(1 << 20)
    left = int(cmd["nbytes"])
    while left > 0:
        conn.sendall(block[:min(left, len(block))])
        left -= len(block)
    conn.close()
    _say({"id": cmd["id"], "sent": int(cmd["nbytes"])})


def _run(address: str, cmd: dict[str, Any]) -> None:
    try:
        if cmd["op"] == "recv":
            _recv(address, cmd)
        elif cmd["op"] == "send":
            _send(cmd)
        else:
            raise ValueError(f"unknown op {cmd['op']!r}")
    except Exception as exc:  # the driver reports it with the pair that failed
        _say({"id": cmd.get("id"), "error": f"{type(exc).__name__}: {exc}"})


def main(argv: list[str]) -> int:
    address = argv[0]
    _say({"id": None, "ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("op") == "quit":
            break
        threading.Thread(target=_run, args=(address, cmd), daemon=True).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
