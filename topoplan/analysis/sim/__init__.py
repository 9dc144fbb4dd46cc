"""An event-driven, flow-level simulator of a schedule on a cluster.

Model (the schedule semantics of docs/SCHEDULE.md, plus time and a
:class:`~topoplan.analysis.cost.CostProfile` of the runtime; docs/COST_MODEL.md states it with a
worked example):

- every rank starts after the profile's ``call_overhead`` and runs its steps in order;
  a step starts when the previous one ends;
- channels (IR v4): a rank's ops of one channel are a sequence of their own (a step
  with ops on two channels is one step in each channel's sequence), and a channel's step
  starts when that channel's previous step ends, whatever the other channels do: one
  channel's latency and overheads hide behind another's transfers, which share the links
  as any flows do. Posting costs are charged per channel: each channel's step pays its
  own ``step_overhead`` and posts its own ops (``op_overhead`` each) at once with the
  other channels', as NCCL runs each channel on its own SMs; without channels nothing
  changes. ``SimReport.step_times`` stays per program step (the span of its channels);
- a step with ops pays ``step_overhead``, then posts its ops one after another,
  receives first, ``op_overhead`` each;
- a message (the k-th send src->dst matched with the k-th recv at dst from src,
  :mod:`topoplan.ir.matching`) starts when both its send and its recv are posted, waits
  the profile's ``alpha`` for its link class (both ranks in one box, or not) plus the
  latency of its path, then flows along ``cluster.route_edges(src, dst)``, split evenly
  over the equal-cost paths; messages of zero bytes are not sent (the executor skips
  them) and cost nothing;
- every directed link is shared max-min fairly among the flows crossing it
  (progressive filling);
- a step ends when its last op is posted and its messages are done, then adds its
  reducing receives' bytes at ``reduce_bandwidth`` (the executor adds after the wait);
- a native step (IR v3: a collective over a group) pays ``step_overhead``; its op starts
  once every member of the group has reached it, loads the links it moves bytes over
  (shared max-min fairly with everything else), and ends for every member at once,
  no sooner than its price's floor (:mod:`topoplan.analysis.native.price`: the NCCL
  model under ``nccl``, the measured collective under a calibrated profile, a ring over
  the group otherwise); a rank whose every op is native pays no ``call_overhead``.

The report splits the time along the critical path into bandwidth (bytes flowing,
link sharing included), latency (alpha and path latency), overhead (call, step, posting)
and reduction, and native collectives (``SimReport.breakdown``). On a host with fewer cores than ranks
(:class:`topoplan.cluster.HostCluster`, the machine a profile was calibrated on), ranks
that work at once take turns on the cores: the stretch is the ``contention`` part.

Modules: :mod:`~topoplan.analysis.sim.run` (:func:`simulate`, the entry point),
:mod:`~topoplan.analysis.sim.report` (what it returns), :mod:`~topoplan.analysis.sim.engine` (the engine:
all transfers matched up front, messages that can never share a link as timers known at
launch, the others in lookahead windows, each connected component of flows on its own
clock), :mod:`~topoplan.analysis.sim.base` (what the engines share) and
:mod:`~topoplan.analysis.sim.reference` (the first, simpler engine: global event batches, global
re-rating; kept as the tests' oracle).
"""

from __future__ import annotations

from .report import NativeRecord, SimReport, TransferRecord
from .run import simulate

__all__ = ["simulate", "SimReport", "TransferRecord", "NativeRecord"]
