"""Measure a shaped path: a raw TCP transfer between two rank namespaces.

``python -m topoplan.testbed.probe recv ADDR PORT`` prints ``bytes seconds`` (timed at the
receiver from the first byte to end of stream); ``send ADDR PORT NBYTES`` sends zeros.
:func:`measure` runs both inside a testbed and returns bytes/s.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from .netns import TestbedError

PORT = 5201


def _recv(addr: str, port: int) -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen(1)
    print("ready", flush=True)
    server.settimeout(30)
    conn, _ = server.accept()
    conn.settimeout(30)
    buf = bytearray(1 << 20)
    first = conn.recv_into(buf)
    start, total = time.perf_counter(), 0
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
    # The first read only starts the clock: its bytes arrived before it.
    print(total, time.perf_counter() - start, first, flush=True)


def _send(addr: str, port: int, nbytes: int) -> None:
    conn = socket.create_connection((addr, port), timeout=30)
    block = bytes(1 << 20)
    left = nbytes
    while left > 0:
        conn.sendall(block[:min(left, len(block))])
        left -= len(block)
    conn.close()


def measure(bed: object, src: int, dst: int, nbytes: int = 4 << 20, timeout: float = 60) -> float:
    """Bytes/s of a TCP transfer from rank ``src`` to rank ``dst`` inside testbed ``bed``."""
    layout = bed.layout  # type: ignore[attr-defined]
    addr = layout.addresses[dst]
    argv = [sys.executable, "-m", "topoplan.testbed.probe"]
    receiver = subprocess.Popen(["ip", "netns", "exec", layout.rank_ns[dst], *argv, "recv", addr,
                                 str(PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        if receiver.stdout is None or receiver.stdout.readline().strip() != "ready":
            raise TestbedError(f"probe receiver in {layout.rank_ns[dst]} did not start: "
                               f"{receiver.stderr.read() if receiver.stderr else ''}")
        subprocess.run(["ip", "netns", "exec", layout.rank_ns[src], *argv, "send", addr,
                        str(PORT), str(nbytes)], check=True, timeout=timeout, capture_output=True)
        out, err = receiver.communicate(timeout=timeout)
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"probe sender rank {src} -> {dst} failed: {exc.stderr!r}") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"probe rank {src} -> {dst} took more than {timeout:g} s") from None
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    total, seconds, _ = out.split()
    return int(total) / float(seconds)


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
