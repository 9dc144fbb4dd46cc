"""Pictures of clusters and schedules; every function returns a matplotlib Figure.

matplotlib loads on first use (``pip install 'topoplan[viz]'``). Figures are drawn
on an Agg canvas, not through pyplot: they render without a display, show once in
Jupyter (importing this module in IPython registers a PNG formatter for Figures when
none is set up), and are freed when dropped. Save one with ``fig.savefig("plan.png")``.

- :func:`draw_cluster`: the cluster by level, links coloured by the bytes on them; a
  box whose GPUs are joined by a mesh of direct links (NVLink) draws them on a ring.
- :func:`timeline`: a per-rank Gantt chart of a simulated schedule, bars coloured by what
  each step does, steps numbered on the top axis.
- :func:`link_utilisation`: utilisation over time of the busiest links.
- :func:`size_sweep`: algbw / busbw against message size for every planner.
"""

from __future__ import annotations

from ._common import register_ipython_display
from .schedule_plots import link_utilisation, timeline
from .sweep import size_sweep
from .topology import draw_cluster

__all__ = ["draw_cluster", "timeline", "link_utilisation", "size_sweep"]

register_ipython_display()
