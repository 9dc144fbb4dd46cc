"""The ``mcf`` planner: LP-shaped constructions priced by a lock-step cost model.

:func:`plan_mcf` (in :mod:`.planner`) is the public function; the rest are its parts,
each module importing only those listed above it:

- :mod:`.lp`: link loads of GPU pairs and the tree-packing LP (column generation);
- :mod:`.trees`: tree shapes, rooting and the pipelined tree schedule;
- :mod:`.packing`: the tree packing, flat or by hierarchy (:func:`solve_mcf`);
- :mod:`.layout`: what the grid and rail constructions are made of (``RankGrid``,
  ``PieceMessages``, switch groups);
- :mod:`.rings`: Hamiltonian rings inside a box, weighted by an LP;
- :mod:`.grids`: the multi-level grids the ranks are laid out on;
- :mod:`.pricing`: the lock-step cost model;
- :mod:`.pieces`: pipeline sizing (how many pieces, how big);
- :mod:`.rails`: rail exchanges with in-box fan-out (reduce-scatter and allgather);
- :mod:`.messages`: the messages of one piece on a grid (or, through :mod:`.rails`,
  on rails);
- :mod:`.build`: the schedule of a layout's pipelined pieces.
"""

from __future__ import annotations

from .packing import MCFSolution, solve_mcf
from .planner import mcf_core, plan_mcf

__all__ = ["plan_mcf", "mcf_core", "MCFSolution", "solve_mcf"]
