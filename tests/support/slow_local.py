"""Thread ranks whose messages take the time a cluster's links give them: a fault
injector for link health's tests (the testbed does the same with tc, as root).

A send of ``b`` bytes from rank ``s`` to rank ``d`` is delivered ``b / rate`` seconds
after it is posted (or after the pair's previous message, whichever is later), ``rate``
the slowest link on the pair's route in ``world.cluster`` with ``world.faults`` applied
(links at a fraction of their bandwidth); the send itself completes at once, as an
eager send does. No two flows of the schedules used here share a link in a step, so
this is what the simulator predicts for them under the ``ideal`` profile.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Sequence

from topoplan.cluster.links import degraded
from topoplan.runtime.transports.local import Local, LocalWorld


class SlowWorld(LocalWorld):
    def __init__(self, cluster: Any) -> None:
        super().__init__(cluster.nranks)
        self.cluster = cluster
        self.faults: dict[str, float] = {}
        self._rates: dict[tuple, float] = {}
        self._busy: dict[tuple[int, int], float] = {}  # pair -> when its last message lands
        self.timers: dict[int, list[threading.Timer]] = {}  # sender -> its deliveries

    def rate(self, src: int, dst: int) -> float:
        key = (tuple(sorted(self.faults.items())), src, dst)
        rate = self._rates.get(key)
        if rate is None:
            machine = degraded(self.cluster, self.faults) if self.faults else self.cluster
            loads, _ = machine.route_loads(src, dst)
            graph = machine.graph
            rate = self._rates[key] = min(graph.edges[e]["bandwidth"] / share
                                          for e, share in loads.items())
        return rate

    def transport(self, rank: int, timeout: float = 60.0) -> Local:
        return SlowLocal(self, rank, timeout=timeout)


class SlowLocal(Local):
    def start(self, messages: Sequence[Any]) -> list:
        world = self.world
        now = time.perf_counter()
        for m in messages:
            if not m.send:
                continue
            pair = (self.rank, m.peer)
            lands = max(world._busy.get(pair, 0.0), now) + \
                m.wire.nbytes / world.rate(self.rank, m.peer)
            world._busy[pair] = lands
            data = m.wire.copy()

            def deliver(pair=pair, tag=m.tag, data=data) -> None:
                with world.cond:
                    world.mail.setdefault(pair, deque()).append((tag, data))
                    world.cond.notify_all()

            timer = threading.Timer(max(0.0, lands - time.perf_counter()), deliver)
            timer.daemon = True
            timer.start()
            mine = world.timers.setdefault(self.rank, [])
            mine[:] = [t for t in mine if t.is_alive()]
            mine.append(timer)
        return [(i, m) for i, m in enumerate(messages) if not m.send]


def launch(cluster: Any, fn: Any, timeout: float = 60.0) -> list:
    """Run ``fn(transport, world)`` on every rank of ``cluster`` (threads)."""
    from topoplan.runtime.transports.launch import run_threads
    world = SlowWorld(cluster)

    def rank(t: Any) -> Any:
        try:
            return fn(t, world)
        finally:
            # A rank done is a rank gone (its peers' receives fail): its messages still
            # on the wire land first.
            for timer in world.timers.get(t.rank, []):
                timer.join()

    return run_threads(cluster.nranks, rank,
                       lambda rank: world.transport(rank, timeout), leave=world.leave,
                       name="topoplan-slow")
