"""The ``mcf`` planner: LP-shaped constructions priced by a lock-step cost model.

:func:`plan_mcf` (in :mod:`.planner`) is the public function; the rest are its parts:

- :mod:`.lp`: link loads of GPU pairs and the tree-packing LP (column generation);
- :mod:`.trees`: tree shapes, rooting and the pipelined tree schedule;
- :mod:`.grids`: the multi-level reduce-scatter/allgather grids;
- :mod:`.rails`: rail exchanges with in-box fan-out (reduce-scatter and allgather).
"""

from __future__ import annotations

from .planner import MCFSolution, plan_mcf, solve_mcf

__all__ = ["plan_mcf", "MCFSolution", "solve_mcf"]
