"""The chart of a sweep as a small SVG written by our own code (stdlib only), so that the landing page, /sweep.svg
and ``plot OUT.svg`` have it with the default install: a log–log panel per dtype, time per multiplication against
n, CPU and each GPU in both modes, each found n* marked. Every string in it is made printable and XML-escaped."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from crossover_monitor.model import MODES
from crossover_monitor.text import brief, printable
from crossover_monitor.view.chart import (
    CROSSOVER_COLOR,
    LABEL_MINOR_BELOW,
    MODE_STYLE,
    Chart,
    checked,
    crossover_label,
    crossover_mark,
    curve_label,
    curve_points,
    device_colors,
    found,
    state_label,
)

PANEL_WIDTH = 800  # px a panel (a dtype), as the PNG's 8-inch panels
PLOT_HEIGHT = 440  # px of the plotting area
_LEFT, _RIGHT = 80, 24  # px beside the plotting area: the y ticks' labels and the axis's name; the last x label
_TOP = 56  # px above it: the chart's title and the panel's
_BELOW_AXIS = 56  # px under it: the x ticks' labels and the axis's name, before the legend
_FONT, _SMALL = 11, 10  # px: text, and the ticks' labels
_CHAR_WIDTH = 0.62  # of the font size: a generous average for sans-serif, so estimated text seldom overflows
_LEGEND_ROW = 16  # px
_LEGEND_SAMPLE = 30  # px of line and marker before an entry's words
_LABEL_GAP = 12  # px at least between two labels of the y axis
_MARGIN = 0.05  # of each axis's span, either side (matplotlib's default margins)
_DASH = {"solid": "", "dashed": "6 3"}
_GRID_MAJOR, _GRID_MINOR, _FRAME = "#c8c8c8", "#ececec", "#444444"
_PREFIXES = {-12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "k"}
_THOUSAND = 1000
_ONE_POINT = 1e-9  # exponents closer than this: one size or one time, drawn with a span around it

Value = str | int | float


def render(chart: Chart) -> bytes:
    """The chart as an SVG document (UTF-8), one panel per dtype side by side with its legend below."""
    chart = checked(chart, "the sweep")
    dtypes = chart.dtypes
    colors = device_colors(chart)
    seconds = _Log.over([s for _, s in chart.times], math.log10, PLOT_HEIGHT + _TOP, _TOP)
    panels = [_Panel(chart, dtype, colors, index * PANEL_WIDTH, seconds) for index, dtype in enumerate(dtypes)]
    legend_rows = max(panel.legend_rows for panel in panels)
    width = PANEL_WIDTH * len(panels)
    height = _TOP + PLOT_HEIGHT + _BELOW_AXIS + legend_rows * _LEGEND_ROW + 8
    root: dict[str, Value] = {
        "xmlns": "http://www.w3.org/2000/svg",
        "width": width,
        "height": height,
        "viewBox": f"0 0 {width} {height}",
        "font-family": "DejaVu Sans, Helvetica, Arial, sans-serif",
        "font-size": _FONT,
        "role": "img",
    }
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        _tag("svg", root, close=False),
        _tag("title", {}, chart.title),
        _tag("rect", {"width": width, "height": height, "fill": "#ffffff"}),
        _text(chart.title, width / 2, 22, width - 20, size=13, anchor="middle", kind="title"),
    ]
    for panel in panels:
        parts += panel.drawn()
    parts.append("</svg>")
    return ("\n".join(parts) + "\n").encode("utf-8")


@dataclass(frozen=True)
class _Log:
    """A logarithmic axis: exponents ``low`` to ``high`` (of ``log``'s base) onto pixels ``start`` to ``end``."""

    log: Callable[[float], float]
    low: float
    high: float
    start: float
    end: float

    @classmethod
    def over(cls, values: list[float], log: Callable[[float], float], start: float, end: float) -> _Log:
        exponents = [log(v) for v in values]
        low, high = min(exponents), max(exponents)
        if high - low < _ONE_POINT:
            low, high = low - 0.5, high + 0.5
        margin = (high - low) * _MARGIN
        return cls(log, low - margin, high + margin, start, end)

    def at(self, value: float) -> float:
        return self.start + (self.log(value) - self.low) / (self.high - self.low) * (self.end - self.start)

    def holds(self, value: float) -> bool:
        return self.low <= self.log(value) <= self.high


@dataclass(frozen=True)
class _Entry:
    """A legend entry: its words, and the line (and marker) it stands for; no colour: words alone."""

    words: str
    color: str = ""
    line: str = "solid"
    marker: str = ""


class _Panel:
    """One dtype's plot, its axes and its legend, ``x0`` pixels from the left."""

    def __init__(self, chart: Chart, dtype: str, colors: dict[str, str], x0: int, seconds: _Log) -> None:
        self.chart, self.dtype, self.colors, self.x0, self.seconds = chart, dtype, colors, x0, seconds
        self.left, self.right = x0 + _LEFT, x0 + PANEL_WIDTH - _RIGHT
        self.top, self.bottom = _TOP, _TOP + PLOT_HEIGHT
        self.sizes = sorted({key.size for key, _ in chart.times if key.dtype == dtype})
        self.crossovers = [c for c in chart.crossovers if c.dtype == dtype]
        marked = [c.size for c in self.crossovers if found(c) and c.size is not None]
        self.x = _Log.over([*map(float, self.sizes), *marked], math.log2, self.left, self.right)
        self.entries = self._entries()
        self.placed = _legend(self.entries, self.right - self.left)
        self.legend_rows = max((row + 1 for row, _, _, _ in self.placed), default=0)

    def drawn(self) -> list[str]:
        parts = [_tag("g", {"class": "panel", "data-dtype": self.dtype}, close=False)]
        parts += self._y_axis()
        parts += self._x_axis()
        parts += self._curves()
        parts += self._crossovers()
        width, height = self.right - self.left, self.bottom - self.top
        parts += [
            _tag(
                "rect",
                {
                    "class": "frame",
                    "x": self.left,
                    "y": self.top,
                    "width": width,
                    "height": height,
                    "fill": "none",
                    "stroke": _FRAME,
                },
            ),
            _text(self.dtype, (self.left + self.right) / 2, self.top - 10, width, size=12, anchor="middle"),
            _text(
                "matrix size n (n×n operands)", (self.left + self.right) / 2, self.bottom + 38, width, anchor="middle"
            ),
            _text(
                "median time of one multiplication",
                self.x0 + 16,
                (self.top + self.bottom) / 2,
                height,
                anchor="middle",
                rotate=True,
            ),
        ]
        parts += self._legend()
        parts.append("</g>")
        return parts

    def _y_axis(self) -> list[str]:
        axis = self.seconds
        ticks = [
            (m * 10.0**k, m == 1)
            for k in range(math.floor(axis.low), math.ceil(axis.high) + 1)
            for m in range(1, 10)
            if axis.holds(m * 10.0**k)
        ]
        label_minor = 10 ** (axis.high - axis.low) < LABEL_MINOR_BELOW
        labelled: list[float] = []
        parts = []
        # Majors first: a minor label gives way to them, and to each other where they would touch.
        for value, major in sorted(ticks, key=lambda tick: not tick[1]):
            y = axis.at(value)
            kind = "major" if major else "minor"
            grid: dict[str, Value] = {
                "x1": self.left,
                "x2": self.right,
                "y1": y,
                "y2": y,
                "stroke": _GRID_MAJOR if major else _GRID_MINOR,
            }
            parts.append(_tag("line", {"class": f"ytick {kind}", "data-value": f"{value:.6g}", **grid}))
            if (major or label_minor) and all(abs(y - other) >= _LABEL_GAP for other in labelled):
                labelled.append(y)
                label: dict[str, Value] = {
                    "class": "ylabel",
                    "x": self.left - 5,
                    "y": y + 3.5,
                    "font-size": _SMALL,
                    "text-anchor": "end",
                }
                parts.append(_tag("text", label, _seconds(value)))
        return parts

    def _x_axis(self) -> list[str]:
        parts = []
        last_end = -math.inf
        for size in self.sizes:
            x = self.x.at(size)
            grid: dict[str, Value] = {"x1": x, "x2": x, "y1": self.top, "y2": self.bottom, "stroke": _GRID_MAJOR}
            parts.append(_tag("line", {"class": "xtick", "data-value": size, **grid}))
            half = _width(str(size), _SMALL) / 2
            if x - half >= last_end + 4:  # sizes a few percent apart would print over each other
                last_end = x + half
                label: dict[str, Value] = {
                    "class": "xlabel",
                    "x": x,
                    "y": self.bottom + 15,
                    "font-size": _SMALL,
                    "text-anchor": "middle",
                }
                parts.append(_tag("text", label, str(size)))
        return parts

    def _curves(self) -> list[str]:
        parts = []
        for device, color in self.colors.items():
            for mode in MODES:
                points = curve_points(self.chart, device, self.dtype, mode)
                if not points:
                    continue
                line, marker = MODE_STYLE[mode]
                xy = [(self.x.at(size), self.seconds.at(seconds)) for size, seconds in points]
                curve: dict[str, Value] = {
                    "class": "curve",
                    "data-device": device,
                    "data-mode": mode,
                    "stroke": color,
                    "fill": color,
                }
                points_text = " ".join(f"{x:.2f},{y:.2f}" for x, y in xy)
                parts += [
                    _tag("g", curve, close=False),
                    _tag("polyline", {"points": points_text, "fill": "none", "stroke-width": 1.5, **_dashed(line)}),
                    *(_marker(marker, x, y) for x, y in xy),
                    "</g>",
                ]
        return parts

    def _crossovers(self) -> list[str]:
        parts = []
        for c in self.crossovers:
            if not found(c) or c.size is None:
                continue
            color = self.colors.get(c.gpu, CROSSOVER_COLOR)
            x = self.x.at(c.size)
            line, _ = MODE_STYLE[c.mode]
            mark: dict[str, Value] = {
                "class": "crossover",
                "data-gpu": c.gpu,
                "data-mode": c.mode,
                "data-size": f"{c.size:.6g}",
            }
            stroke: dict[str, Value] = {"stroke": color, "stroke-width": 1.2, "stroke-opacity": 0.8, **_dashed(line)}
            parts += [
                _tag("g", mark, close=False),
                _tag("line", {"x1": x, "x2": x, "y1": self.top, "y2": self.bottom, **stroke}),
                _text(crossover_mark(c), x - 3, self.bottom - 6, PLOT_HEIGHT, size=9, rotate=True, fill=color),
                "</g>",
            ]
        return parts

    def _entries(self) -> list[_Entry]:
        entries = []
        for device, color in self.colors.items():
            for mode in MODES:
                if curve_points(self.chart, device, self.dtype, mode):
                    line, marker = MODE_STYLE[mode]
                    entries.append(_Entry(curve_label(self.chart, device, mode), color, line, marker))
        for c in self.crossovers:
            if found(c):
                color = self.colors.get(c.gpu, CROSSOVER_COLOR)
                entries.append(_Entry(crossover_label(c), color, MODE_STYLE[c.mode][0]))
            elif (words := state_label(c)) is not None:
                entries.append(_Entry(words))
        return entries

    def _legend(self) -> list[str]:
        parts = [_tag("g", {"class": "legend"}, close=False)]
        for row, column, entry, width in self.placed:
            x = self.left + column * (self.right - self.left) / 2
            y = self.bottom + _BELOW_AXIS + row * _LEGEND_ROW
            if entry.color:
                sample: dict[str, Value] = {"x1": x + 2, "x2": x + 24, "y1": y - 4, "y2": y - 4, "stroke": entry.color}
                parts.append(_tag("line", {**sample, "stroke-width": 1.5, **_dashed(entry.line)}))
                if entry.marker:
                    parts.append(_marker(entry.marker, x + 13, y - 4, entry.color))
            parts.append(_text(entry.words, x + _LEGEND_SAMPLE, y, width - _LEGEND_SAMPLE, kind="entry"))
        parts.append("</g>")
        return parts


def _legend(entries: list[_Entry], width: float) -> list[tuple[int, int, _Entry, float]]:
    """Where each entry goes: (row, column, entry, its width), two columns, a row of its own for one too long."""
    placed: list[tuple[int, int, _Entry, float]] = []
    row, column = 0, 0
    for entry in entries:
        if _LEGEND_SAMPLE + _width(printable(entry.words), _FONT) <= width / 2:
            placed.append((row, column, entry, width / 2))
            row, column = (row + 1, 0) if column else (row, 1)
        else:
            row += column
            placed.append((row, 0, entry, width))
            row, column = row + 1, 0
    return placed


def _seconds(value: float) -> str:
    """A time in engineering units: 10µs, 200µs, 1.5ms, 2s."""
    exponent = min(max(math.floor(math.log10(value) / 3) * 3, min(_PREFIXES)), max(_PREFIXES))
    shown = f"{value / 10.0**exponent:.3g}"
    if float(shown) >= _THOUSAND and exponent < max(_PREFIXES):  # 999.9996µs is 1ms
        exponent += 3
        shown = f"{value / 10.0**exponent:.3g}"
    return f"{shown}{_PREFIXES[exponent]}s"


def _marker(shape: str, x: float, y: float, color: str = "") -> str:
    """A point's marker; without a colour, its group's."""
    paint = {"fill": color, "stroke": color} if color else {}
    if shape == "square":
        return _tag("rect", {"x": x - 3, "y": y - 3, "width": 6, "height": 6, **paint})
    return _tag("circle", {"cx": x, "cy": y, "r": 3.2, **paint})


def _dashed(line: str) -> dict[str, Value]:
    return {"stroke-dasharray": _DASH[line]} if _DASH[line] else {}


def _width(text: str, size: float) -> float:
    return len(text) * size * _CHAR_WIDTH


def _escaped(text: str) -> str:
    """Any string as XML text or an attribute's value: printable (XML 1.0 refuses control characters even escaped,
    and no encoder takes a lone surrogate), then escaped."""
    return html.escape(printable(text), quote=True)


def _tag(name: str, attributes: Mapping[str, Value], text: str | None = None, *, close: bool = True) -> str:
    """An element, each attribute's value and the text escaped (a number to two decimals); ``close=False``: its
    start tag alone, for the children that follow."""
    shown = " ".join(f'{key}="{_escaped(_number(value))}"' for key, value in attributes.items())
    start = f"<{name} {shown}" if shown else f"<{name}"
    if not close:
        return start + ">"
    return start + "/>" if text is None else f"{start}>{_escaped(text)}</{name}>"


def _number(value: Value) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _text(
    words: str,
    x: float,
    y: float,
    room: float,
    *,
    size: int = _FONT,
    anchor: str = "start",
    rotate: bool = False,
    fill: str = "",
    kind: str = "",
) -> str:
    """A text element of ``words``, cut to the ``room`` it has (px), the whole kept as its tooltip where cut."""
    whole = printable(words)
    shown = brief(whole, max(4, int(room / (size * _CHAR_WIDTH))))
    attributes: dict[str, Value] = {"x": x, "y": y, "font-size": size, "text-anchor": anchor}
    if rotate:
        attributes["transform"] = f"rotate(-90 {x:.2f} {y:.2f})"
    if fill:
        attributes["fill"] = fill
    if kind:
        attributes["class"] = kind
    element = _tag("text", attributes, shown)
    return element if shown == whole else f"<g>{_tag('title', {}, whole)}{element}</g>"
