"""What every plot shares: the lazy matplotlib import, units on axes, fitting text."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure
    from matplotlib.text import Text

_HINT = "topoplan.viz needs matplotlib: pip install 'topoplan[viz]'"


def matplotlib() -> Any:
    """Import matplotlib on first use, with the install hint when it is missing."""
    try:
        import matplotlib as mpl
    except ImportError:
        raise ImportError(_HINT) from None
    return mpl


def new_figure(width: float, height: float, **kwargs: Any) -> Figure:
    """A Figure on an Agg canvas, not registered with pyplot.

    Why not ``pyplot.figure``: a pyplot figure returned from a notebook cell is shown
    twice (once as the cell's value, once when the inline backend flushes), pyplot keeps
    every figure alive until closed (a size sweep in a loop leaks), and it needs a GUI
    backend or a display. An Agg canvas renders PNG/SVG/PDF anywhere, and Jupyter
    displays the returned Figure once through its formatter.
    """
    matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(fig)
    return fig


def renderer(fig: Figure) -> Any:
    return fig.canvas.get_renderer()  # type: ignore[attr-defined]


def fit_text(text: Text, max_width_px: float, rend: Any, min_size: float = 4.5) -> bool:
    """Shrink ``text`` until it is at most ``max_width_px`` wide; hide it if it cannot fit.

    Measuring with the renderer (not a characters-times-size guess) is what keeps
    neighbouring labels from overlapping whatever the font. Returns whether it shows.
    """
    size = float(text.get_fontsize())  # points (the stubs also allow a name like "large")
    while True:
        width = text.get_window_extent(rend).width
        if width <= max_width_px:
            return True
        if size <= min_size:
            text.set_visible(False)
            return False
        size = max(min_size, size * max(0.6, max_width_px / width) * 0.97)
        text.set_fontsize(size)


def wrap_to_width(text: Text, max_width_px: float, rend: Any) -> None:
    """Break ``text`` into lines no wider than ``max_width_px``.

    Breaks go at a clause first (" \u2014 ", "; ", ": ", which keeps a title's parts
    whole), then at spaces.
    """
    import textwrap

    full = text.get_text()
    if not full or text.get_window_extent(rend).width <= max_width_px:
        return
    for sep, end in ((" \u2014 ", ""), ("; ", ";"), (": ", ":")):
        if sep in full:
            head, tail = full.split(sep, 1)
            text.set_text(f"{head}{end}\n{tail}")
            if text.get_window_extent(rend).width <= max_width_px:
                return
    width = text.get_window_extent(rend).width
    chars = max(12, int(len(full) * max_width_px / max(width, 1.0)))
    while True:
        text.set_text(textwrap.fill(full, chars, break_long_words=False))
        if chars <= 12 or text.get_window_extent(rend).width <= max_width_px:
            return
        chars = int(chars * 0.9)


def fitted_legend(fig: Figure, handles: list, ncol: int, **kwargs: Any) -> Any:
    """``fig.legend`` below the axes, in as many columns (at most ``ncol``) as fit.

    One row of many entries is wider than a narrow figure, and a figure legend is not
    shrunk by constrained layout: it would be cut off at both edges.
    """
    ncol = max(1, min(ncol, len(handles)))
    margin = 4.0
    while True:
        legend = fig.legend(handles=handles, loc="outside lower center", ncol=ncol,
                            frameon=False, **kwargs)
        if ncol == 1:
            return legend
        if legend.get_window_extent(renderer(fig)).width <= fig.bbox.width - 2 * margin:
            return legend
        legend.remove()
        ncol -= 1


def keep_titles_inside(fig: Figure, margin_px: float = 4.0) -> None:
    """Wrap the suptitle and axes titles that would run past the figure's edges.

    Constrained layout makes room above and below a title, never beside it, so a
    title wider than its figure is cut off at both edges. Call it before the layout
    runs (a draw), so the layout makes room for the extra lines.
    """
    fig.draw_without_rendering()
    rend = renderer(fig)
    titles = [fig._suptitle] if fig._suptitle is not None else []  # type: ignore[attr-defined]
    titles += [ax.title for ax in fig.axes if ax.get_title()]
    for text in titles:
        ext = text.get_window_extent(rend)
        centre = (ext.x0 + ext.x1) / 2  # titles are centred
        room = 2 * min(centre - fig.bbox.x0, fig.bbox.x1 - centre) - 2 * margin_px
        wrap_to_width(text, room, rend)


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """A binary unit for amounts of data (the CLI's --size is binary): ("MiB", 2**20)."""
    for unit, scale in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if max_bytes >= scale:
            return unit, scale
    return "B", 1.0


def time_unit(max_seconds: float) -> tuple[str, float]:
    """A unit for a time axis: ("ms", 1e-3)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if max_seconds >= scale:
            return unit, scale
    return "ns", 1e-9


def size_formatter() -> Any:
    """Tick labels for a log2 axis of message sizes: 1KiB, 1MiB, ..."""
    from matplotlib.ticker import FuncFormatter

    from ..units import format_size

    return FuncFormatter(lambda value, _pos: format_size(value) if value >= 1 else "")


def edge_name(edge: tuple[str, str]) -> str:
    u, v = edge
    return f"{u} \u2192 {v}"


def _png(fig: Figure) -> bytes:
    from io import BytesIO

    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def register_ipython_display() -> None:
    """Show returned Figures as PNG in IPython/Jupyter, without pyplot.

    Jupyter only knows how to show a bare ``Figure`` once the inline backend has
    registered a formatter, which happens when pyplot is imported; our figures skip
    pyplot. Register one by name (so matplotlib is not imported here), unless the
    user's setup already has one.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    formatters = getattr(getattr(shell, "display_formatter", None), "formatters", None)
    if not formatters or "image/png" not in formatters:
        return
    png = formatters["image/png"]
    key = ("matplotlib.figure", "Figure")
    if key in png.deferred_printers or any(
            getattr(t, "__module__", "") == key[0] and t.__name__ == key[1]
            for t in png.type_printers):
        return
    png.for_type_by_name(*key, _png)
