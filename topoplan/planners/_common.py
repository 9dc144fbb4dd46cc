"""Moved: the planners' shared machinery now lives in one module per concept.

- :mod:`._checks`: argument checks (size, chunks, collective, caps, options);
- :mod:`._lockstep`: the lock-step schedule builders and the ring phases;
- :mod:`._order`: the topology tree and the rank orders it gives;
- :mod:`._pipeline_depth`: pipeline depth, link and message latency, fitting the caps.

This module re-exports their names so that branches still importing from it keep
working; import from the modules above instead. It goes once those have merged.
"""

from __future__ import annotations

from ._checks import (PlannerError, check_cap_args, check_caps, check_chunks, check_collective,
                      check_size, unknown_options)
from ._lockstep import (Timeline, empty_schedule, no_gc, ring_allgather, ring_reduce_scatter, runs,
                        schedule_from_arrays, split)
from ._order import TopoNode, box_order, resolve_order, topo_order, topo_tree
from ._pipeline_depth import OP_BUDGET, fit_depth, link_params, message_latency, pipeline_depth

__all__ = ["PlannerError", "Timeline", "TopoNode", "topo_tree", "topo_order", "box_order",
           "resolve_order", "check_size", "check_chunks", "unknown_options", "ring_reduce_scatter",
           "ring_allgather", "link_params", "message_latency", "pipeline_depth", "split",
           "no_gc", "check_caps", "check_cap_args", "fit_depth", "OP_BUDGET",
           "check_collective", "empty_schedule", "runs", "schedule_from_arrays"]
