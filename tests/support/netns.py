"""Skip marker for tests that build real network namespaces (root, CAP_NET_ADMIN, iproute2)."""

from __future__ import annotations

import sys

import pytest


def _reason() -> str | None:
    if sys.platform != "linux":
        return "needs Linux network namespaces"
    from topoplan.testbed import capable
    return capable()


REASON = _reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"testbed unavailable: {REASON}")
