"""``crossover-monitor plot``: the chart of a sweep to a file; an SVG by svgchart.py, a PNG by matplotlib (the
optional ``plot`` extra, and this module is its only user: imported only when a PNG is drawn, so a missing
install is one clear error).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from crossover_monitor.errors import PLOT_EXTRA_HINT
from crossover_monitor.model import MODES
from crossover_monitor.text import printable
from crossover_monitor.view import svgchart
from crossover_monitor.view.chart import (
    CROSSOVER_COLOR,
    LABEL_MINOR_BELOW,
    MODE_STYLE,
    Chart,
    PlotError,
    crossover_label,
    crossover_mark,
    curve_label,
    curve_points,
    device_colors,
    found,
    from_json,
    from_url,
    state_label,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg")
# matplotlib's spelling of the shared styles (crossover_monitor.view.chart.MODE_STYLE).
_LINES = {"solid": "-", "dashed": "--"}
_MARKERS = {"circle": "o", "square": "s"}


def plot(output: Path, *, json_file: Path | None = None, url: str | None = None) -> Path:
    """Read the sweep from ``json_file`` or ``url`` and write the chart to ``output`` (.svg, or .png with the extra)."""
    suffix = output.suffix.lower()
    if suffix not in FORMATS:
        raise PlotError(f"the chart must be a .png or .svg file, got {str(output)!r}")
    # Before any reading: a missing extra is the first thing to hear about.
    figure_class = _figure_class() if suffix == ".png" else None
    if json_file is not None:
        chart = from_json(json_file)
    elif url is not None:
        chart = from_url(url)
    else:
        raise PlotError("give the sweep to draw: --from-json FILE or --from-url URL")
    try:
        if figure_class is None:
            output.write_bytes(svgchart.render(chart))
        else:
            draw(chart, figure_class).savefig(output, format="png", dpi=150)
    except OSError as exc:
        raise PlotError(f"cannot write {output}: {exc.strerror or exc}") from None
    return output


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 - matplotlib is the optional `plot` extra
    except ImportError:
        raise PlotError(f"drawing charts needs matplotlib, which is not installed: {PLOT_EXTRA_HINT}") from None
    return Figure


def draw(chart: Chart, figure_class: type[Figure] | None = None) -> Figure:
    """A log–log chart per dtype: time per multiplication against n, CPU and each GPU, both modes, n* marked."""
    from matplotlib.ticker import EngFormatter, NullFormatter, StrMethodFormatter  # noqa: PLC0415 - optional extra

    figure_class = figure_class or _figure_class()
    dtypes = chart.dtypes
    figure = figure_class(figsize=(8 * len(dtypes), 7), layout="constrained")
    figure.suptitle(_shown(chart.title), fontsize=10)
    colors = device_colors(chart)
    first: Axes | None = None
    for index, dtype in enumerate(dtypes):
        axes = figure.add_subplot(1, len(dtypes), index + 1, sharey=first)
        first = first or axes
        _draw_curves(axes, chart, dtype, colors)
        _draw_crossovers(axes, chart, dtype, colors)
        axes.set_xscale("log", base=2)
        axes.set_xticks(sorted({key.size for key, _ in chart.times if key.dtype == dtype}))
        axes.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(EngFormatter(unit="s"))
        low, high = axes.get_ylim()
        # Under two decades there are too few major ticks to read a time off: label the minor ones too.
        axes.yaxis.set_minor_formatter(EngFormatter(unit="s") if high / low < LABEL_MINOR_BELOW else NullFormatter())
        axes.set_xlabel("matrix size n (n×n operands)")
        axes.set_ylabel("median time of one multiplication")
        axes.set_title(_shown(dtype))
        axes.grid(visible=True, which="major", alpha=0.4)
        axes.grid(visible=True, which="minor", alpha=0.15)
        # Below the chart, so that it never hides a curve or a crossover.
        axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, frameon=False)
    return figure


def _shown(text: str) -> str:
    """Text to draw as it reads, whatever its source (a scrape, a file name, a URL): printable, since no encoder
    takes a lone surrogate; each $ escaped, or mathtext would read a name between two of them as a formula (and
    fail on one it cannot parse)."""
    return printable(text).replace("$", r"\$")


def _draw_curves(axes: Axes, chart: Chart, dtype: str, colors: dict[str, str]) -> None:
    for device, color in colors.items():
        for mode in MODES:
            points = curve_points(chart, device, dtype, mode)
            if not points:
                continue
            line, marker = MODE_STYLE[mode]
            axes.plot(
                [size for size, _ in points],
                [seconds for _, seconds in points],
                color=color,
                linestyle=_LINES[line],
                marker=_MARKERS[marker],
                markersize=4,
                label=_shown(curve_label(chart, device, mode)),
            )


def _draw_crossovers(axes: Axes, chart: Chart, dtype: str, colors: dict[str, str]) -> None:
    for c in (c for c in chart.crossovers if c.dtype == dtype):
        if found(c) and c.size is not None:
            color = colors.get(c.gpu, CROSSOVER_COLOR)
            axes.axvline(
                c.size,
                color=color,
                linestyle=_LINES[MODE_STYLE[c.mode][0]],
                linewidth=1.2,
                alpha=0.8,
                label=_shown(crossover_label(c)),
            )
            axes.annotate(
                _shown(crossover_mark(c)),
                xy=(c.size, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                ha="right",
                va="bottom",
                fontsize="x-small",
                color=color,
            )
        elif (words := state_label(c)) is not None:
            # A legend entry with no line: the state is read where the curves are named.
            axes.plot([], [], linestyle="none", label=_shown(words))
