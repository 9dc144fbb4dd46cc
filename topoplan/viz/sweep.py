"""algbw and busbw against message size for every candidate planner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ..cluster import Cluster
from ..analysis.cost import CostProfile, get_profile
from ..errors import TopoplanError
from .._util import step
from ..units import format_size
from ..ir.collectives import bus_factor
from ._common import matplotlib, new_figure, size_formatter

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["size_sweep", "DEFAULT_SIZES", "sweep_rows"]

DEFAULT_SIZES = tuple(1 << p for p in range(10, 31, 4))  # 1KiB .. 1GiB, factor 16
_SKIP = {"auto"}  # auto picks one of the others; plotting it would draw a line twice


def sweep_rows(cluster: Cluster, algorithms: Iterable[str] | None = None,
               sizes: Sequence[int] = DEFAULT_SIZES,
               profile: CostProfile | str | None = None) -> tuple[list[dict], dict[str, str]]:
    """Plan and simulate every algorithm at every size under ``profile`` (the runtime's
    costs, default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`).

    Returns
    -------
    rows
        ``{"algorithm", "size", "time_s", "algbw", "busbw", "lower_bound_s"}`` per
        (algorithm, size), bandwidths in bytes/s.
    failed
        ``algorithm -> reason`` for planners that cannot plan this cluster.
    """
    from ..planners import PLANNERS, plan
    from ..analysis.sim import simulate

    costs = get_profile(profile)
    names = [a for a in PLANNERS if a not in _SKIP] if algorithms is None else list(algorithms)
    unknown = [a for a in names if a not in PLANNERS]
    if unknown:
        raise ValueError(f"unknown algorithm(s) {unknown}; known: {sorted(PLANNERS)}")
    rows: list[dict] = []
    failed: dict[str, str] = {}
    for name in names:
        for size in sizes:
            step(f"sweep: {name} at {format_size(size)} ...")
            try:
                schedule = plan(cluster, algorithm=name, size=size, profile=costs)
                report = simulate(cluster, schedule, size, profile=costs)
            except TopoplanError as exc:
                failed[name] = str(exc).splitlines()[0]
                break
            rows.append({"algorithm": name, "size": size, "time_s": report.time_s,
                         "algbw": report.algbw, "busbw": report.busbw,
                         "lower_bound_s": report.lower_bound_s})
        else:
            continue
        rows[:] = [r for r in rows if r["algorithm"] != name]
    return rows, failed


def size_sweep(cluster: Cluster, algorithms: Iterable[str] | None = None,
               sizes: Sequence[int] = DEFAULT_SIZES,
               profile: CostProfile | str | None = None) -> Figure:
    """algbw and busbw against message size for every planner, with the lower bound.

    Parameters
    ----------
    cluster
        The cluster to plan for.
    algorithms
        Planner names from :data:`topoplan.planners.PLANNERS`; default all of them but
        ``auto`` (which picks one of the others). A planner that cannot plan this
        cluster is left out and named in the legend.
    sizes
        Message sizes in bytes (default 1KiB to 1GiB by factors of 16). Each
        algorithm is planned at each size, since a planner may choose by size.
    profile
        The runtime's cost profile (:mod:`topoplan.analysis.cost`): the planners plan against it
        and the simulations charge it. Default :data:`topoplan.analysis.cost.DEFAULT_PROFILE`.

    Returns
    -------
    matplotlib.figure.Figure
        Two axes side by side, algbw and busbw in GB/s against the message size (log
        x), one line per planner, and the best any schedule can do (size divided by
        :func:`topoplan.analysis.bound.lower_bound`) as a dashed black line.

    Notes
    -----
    Cost: one plan and one simulation per (algorithm, size). That is seconds for a
    handful of GPUs; on 32 GPUs and more pass a few ``algorithms`` (an mcf schedule
    on 32 GPUs can take minutes to simulate).
    """
    matplotlib()
    from ..analysis.bound import lower_bound

    sizes = sorted(int(s) for s in sizes)
    if not sizes or sizes[0] <= 0:
        raise ValueError(f"sizes must be positive byte counts, got {sizes}")
    costs = get_profile(profile)
    rows, failed = sweep_rows(cluster, algorithms, sizes, costs)
    factor = bus_factor(cluster.nranks)
    fig = new_figure(11.5, 4.6)
    ax_alg, ax_bus = fig.subplots(1, 2, sharex=True)
    bound = np.array([s / lower_bound(cluster, s) for s in sizes]) / 1e9
    markers = "osD^v<>ph*"
    styles = ("-", "--", "-.", ":")  # planners that tie stay visible under each other
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    curves = {name: [r["time_s"] for r in sorted((r for r in rows if r["algorithm"] == name),
                                                 key=lambda r: r["size"])] for name in names}
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r["algorithm"] == name), key=lambda r: r["size"])
        x = [r["size"] for r in mine]
        # Planners that tie would hide each other: name the twin in the legend, and draw
        # later lines on top with smaller markers so both stay visible.
        twin = next((other for other in names[:i]
                     if np.allclose(curves[other], curves[name], rtol=1e-9, atol=0)), None)
        label = f"{name} (same as {twin})" if twin else name
        for ax, key in ((ax_alg, "algbw"), (ax_bus, "busbw")):
            ax.plot(x, [r[key] / 1e9 for r in mine], marker=markers[i % len(markers)],
                    ms=max(3.0, 8.0 - 1.1 * i), ls=styles[i % len(styles)], lw=1.6, label=label,
                    mfc="none" if i % 2 else None, zorder=2 + i)
    for ax, scale in ((ax_alg, 1.0), (ax_bus, factor)):
        ax.plot(sizes, bound * scale, color="black", ls="--", lw=1.4,
                label="lower bound (best possible)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(matplotlib().ticker.LogLocator(base=4))
        ax.xaxis.set_major_formatter(size_formatter())
        ax.set_xlabel("message size")
        ax.grid(alpha=0.3, which="both")
        ax.set_ylim(bottom=0)
    ax_alg.set_ylabel("algbw (GB/s) = size / time")
    ax_bus.set_ylabel(f"busbw (GB/s) = algbw \u00d7 2(n-1)/n = algbw \u00d7 {factor:.3g}")
    ax_alg.set_title("algorithm bandwidth", fontsize=10)
    ax_bus.set_title("bus bandwidth (nccl-tests)", fontsize=10)
    handles, labels = ax_alg.get_legend_handles_labels()
    from matplotlib.lines import Line2D
    for name, reason in failed.items():
        handles.append(Line2D([], [], ls="", marker="x", color="grey"))
        labels.append(f"{name}: n/a ({reason[:60]})")
    fig.legend(handles, labels, loc="outside right center", fontsize=8.5, frameon=False)
    fig.suptitle(f"{cluster.name}: {cluster.nranks} GPUs, simulated allreduce by planner "
                 f"(cost profile {costs.name})", fontsize=11)
    return fig
