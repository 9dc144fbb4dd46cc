"""A free TCP port on loopback, for tests that start a rendezvous of their own."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS picks it; a race with another process is
    possible but rare, as in torch's own tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
