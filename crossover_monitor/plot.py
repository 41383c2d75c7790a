"""The latest sweep as a chart of time against matrix size for ``crossover-monitor plot`` (the only matplotlib user).

The sweep comes from ``once --json`` output or from a running service's /metrics. matplotlib is the
optional ``plot`` extra: it is imported only when a chart is drawn, so a missing install is one clear error.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crossover_monitor.codec import DecodeError, from_data, parse_json
from crossover_monitor.convert import MAX_SIZE
from crossover_monitor.errors import PLOT_EXTRA_HINT, MonitorError
from crossover_monitor.metrics import (
    BENCHMARK_INFO,
    CROSSOVER,
    CROSSOVER_LABELS,
    CROSSOVER_LOWER,
    CROSSOVER_STATE,
    CROSSOVER_UPPER,
    DEVICE_DETAIL_LABELS,
    DEVICE_INFO,
    DURATION,
    POINT_LABELS,
)
from crossover_monitor.model import (
    MODES,
    STATE_SENTENCES,
    Crossover,
    CrossoverState,
    DeviceInfo,
    DeviceKind,
    PointKey,
    Timing,
)
from crossover_monitor.scrape import ScrapeError, fetch_samples
from crossover_monitor.text import printable

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg")
_FETCH_TIMEOUT_S = 10.0
_LABEL_MINOR_BELOW = 100.0  # a y range (max / min) under which minor ticks get labels
_MODE_STYLE = {"compute": ("-", "o"), "end_to_end": ("--", "s")}


class PlotError(MonitorError):
    """The chart cannot be drawn; the message says what to fix."""


# A chart this big says nothing a reader can see (and would take minutes to draw): refused instead. A sweep has
# a curve per device, dtype and mode; 8 GPUs, a CPU, 2 dtypes and 2 modes make 36.
MAX_CURVES = 64
MAX_PANELS = 8  # dtypes, a panel each
_STATES = {state.value for state in CrossoverState}


@dataclass(frozen=True, kw_only=True)
class Chart:
    """What the chart shows, whichever source it came from: median times of the configured sizes and the crossovers."""

    title: str
    devices: tuple[DeviceInfo, ...]
    times: tuple[tuple[PointKey, float], ...]
    crossovers: tuple[Crossover, ...]


def plot(output: Path, *, json_file: Path | None = None, url: str | None = None) -> Path:
    """Read the sweep from ``json_file`` or ``url`` and write the chart to ``output`` (.png or .svg)."""
    if output.suffix.lower() not in FORMATS:
        raise PlotError(f"the chart must be a .png or .svg file, got {str(output)!r}")
    figure_class = _figure_class()  # before any reading: a missing extra is the first thing to hear about
    if json_file is not None:
        chart = from_json(json_file)
    elif url is not None:
        chart = from_url(url)
    else:
        raise PlotError("give the sweep to draw: --from-json FILE or --from-url URL")
    figure = draw(chart, figure_class)
    from matplotlib import rc_context  # noqa: PLC0415 - matplotlib is the optional `plot` extra

    try:
        # SVG keeps its text as text (searchable, selectable) instead of outlines.
        with rc_context({"svg.fonttype": "none"}):
            figure.savefig(output, format=output.suffix.lower()[1:], dpi=150)
    except OSError as exc:
        raise PlotError(f"cannot write {output}: {exc.strerror or exc}") from None
    return output


def from_json(path: Path) -> Chart:
    """The chart of the sweep in a file written by ``crossover-monitor once --json``."""
    try:
        body = parse_json(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlotError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # ValueError: json's, or nested too deep
        raise PlotError(f"{path} is not the JSON that `crossover-monitor once --json` writes: {exc}") from None
    snapshot = body.get("snapshot") if isinstance(body, dict) else None
    if not isinstance(snapshot, dict):
        result = body.get("result", "?") if isinstance(body, dict) else "?"
        reason = body.get("reason", "") if isinstance(body, dict) else ""
        raise PlotError(f"{path} holds no results to draw (the sweep ended: {result}{': ' + reason if reason else ''})")
    try:
        # The parts the chart needs, each decoded by the types `once --json` wrote them from.
        devices = tuple(
            from_data(DeviceInfo, d, f"snapshot.devices[{i}]") for i, d in enumerate(_listed(snapshot, "devices"))
        )
        measurements = _listed(snapshot, "measurements")
        times = tuple(
            (
                from_data(PointKey, m.get("key"), f"snapshot.measurements[{i}].key"),
                from_data(Timing, m.get("timing"), f"snapshot.measurements[{i}].timing").median_s,
            )
            for i, m in enumerate(measurements)
            if m.get("role", "sweep") == "sweep"
        )
        crossovers = tuple(
            from_data(Crossover, c, f"snapshot.crossovers[{i}]") for i, c in enumerate(_listed(snapshot, "crossovers"))
        )
        environment: Mapping[str, Any] = snapshot.get("environment", {})
        finished = dt.datetime.fromtimestamp(float(snapshot["finished_at"]), tz=dt.UTC)
        versions = " ".join(str(environment[k]) for k in ("framework", "framework_version") if k in environment)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise PlotError(f"{path} is not the JSON that `crossover-monitor once --json` writes: {exc}") from None
    title = f"{path.name}: {versions + ', ' if versions else ''}sweep finished {finished:%Y-%m-%d %H:%M} UTC"
    return _checked(Chart(title=title, devices=devices, times=times, crossovers=crossovers), str(path))


def _listed(snapshot: Mapping[str, Any], key: str) -> list[Any]:
    value = snapshot.get(key)
    if not isinstance(value, list):
        raise DecodeError(f"snapshot.{key}", f"expected a list, got {type(value).__name__}")
    return value


def from_url(url: str) -> Chart:
    """The chart of the latest sweep a running service serves at ``url`` (its /metrics)."""
    try:
        samples = fetch_samples(url, _FETCH_TIMEOUT_S, what="--from-url")
        chart = chart_from_samples(samples, title=url)
    except ScrapeError as exc:
        raise PlotError(str(exc)) from None
    except (KeyError, ValueError) as exc:
        raise PlotError(f"{url} did not answer with Prometheus metrics of crossover-monitor: {exc!r}") from None
    return _checked(chart, url)


def chart_from_samples(samples: Iterable[tuple[str, dict[str, str], float]], *, title: str) -> Chart:
    """The chart of the sweep described by exposition samples (names and labels of crossover_monitor.metrics)."""
    times: list[tuple[PointKey, float]] = []
    devices: list[DeviceInfo] = []
    states: dict[tuple[str, ...], CrossoverState] = {}
    values: dict[str, dict[tuple[str, ...], float]] = {CROSSOVER: {}, CROSSOVER_LOWER: {}, CROSSOVER_UPPER: {}}
    versions = ""
    for name, raw, value in samples:
        # As the codec reads a string (the points' keys are read through it): one name for a device throughout.
        labels = {label: printable(text) for label, text in raw.items()}
        pair = tuple(labels.get(k, "") for k in CROSSOVER_LABELS)
        if name == DURATION:
            point = _point(labels, value)
            if point is not None:
                times.append(point)
        elif name == DEVICE_INFO and all(k in labels for k in ("backend", "device", "name")):
            kind: DeviceKind = "gpu" if labels.get("kind") == "gpu" else "cpu"
            details = tuple((key, labels[label]) for label, key in DEVICE_DETAIL_LABELS.items() if labels.get(label))
            devices.append(
                DeviceInfo(
                    backend=labels["backend"], device=labels["device"], kind=kind, name=labels["name"], details=details
                )
            )
        elif name == CROSSOVER_STATE and value == 1 and labels.get("state") in _STATES and pair[-1] in MODES:
            states[pair] = CrossoverState(labels["state"])
        elif name in values and math.isfinite(value) and 0 < value <= MAX_SIZE:
            values[name][pair] = value
        elif name == BENCHMARK_INFO:
            versions = f"{labels.get('backend', '')} {labels.get('framework_version', '')}".strip()
    crossovers = tuple(
        Crossover(
            # Each label to the field of its name; the exporter only writes the two modes.
            **dict(zip(CROSSOVER_LABELS, pair, strict=True)),  # type: ignore[arg-type]
            state=state,
            size=values[CROSSOVER].get(pair),
            lower=values[CROSSOVER_LOWER].get(pair),
            upper=values[CROSSOVER_UPPER].get(pair),
        )
        for pair, state in sorted(states.items())
    )
    return Chart(
        title=f"{title}{': ' + versions if versions else ''}",
        devices=tuple(devices),
        times=tuple(times),
        crossovers=crossovers,
    )


def _point(labels: Mapping[str, str], seconds: float) -> tuple[PointKey, float] | None:
    """A duration sample as a point; None for one no service of this project writes (a mode it does not
    time, a size out of range, a time that is not a positive number): such a point is left out, not drawn."""
    try:
        size = int(labels.get("size", ""))
        key = from_data(PointKey, {k: size if k == "size" else labels.get(k) for k in POINT_LABELS}, "point")
    except (ValueError, DecodeError):
        return None
    return (key, seconds) if 0 < key.size <= MAX_SIZE and math.isfinite(seconds) and seconds > 0 else None


def _checked(chart: Chart, source: str) -> Chart:
    if not chart.times:
        raise PlotError(f"{source} has no timings to draw yet: no sweep has completed")
    dtypes = {key.dtype for key, _ in chart.times}
    curves = {(key.device, key.dtype, key.mode) for key, _ in chart.times}
    if len(dtypes) > MAX_PANELS or len(curves) > MAX_CURVES:
        raise PlotError(
            f"{source} has {len(curves)} curves in {len(dtypes)} dtypes: more than a chart can show"
            f" (at most {MAX_CURVES} curves, {MAX_PANELS} dtypes)"
        )
    return chart


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
    dtypes = sorted({key.dtype for key, _ in chart.times})
    figure = figure_class(figsize=(8 * len(dtypes), 7), layout="constrained")
    figure.suptitle(_shown(chart.title), fontsize=10)
    colors = _device_colors(chart)
    names = {d.device: d.name for d in chart.devices}
    first: Axes | None = None
    for index, dtype in enumerate(dtypes):
        axes = figure.add_subplot(1, len(dtypes), index + 1, sharey=first)
        first = first or axes
        _draw_curves(axes, chart, dtype, colors, names)
        _draw_crossovers(axes, chart, dtype, colors)
        axes.set_xscale("log", base=2)
        axes.set_xticks(sorted({key.size for key, _ in chart.times if key.dtype == dtype}))
        axes.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(EngFormatter(unit="s"))
        low, high = axes.get_ylim()
        # Under two decades there are too few major ticks to read a time off: label the minor ones too.
        axes.yaxis.set_minor_formatter(EngFormatter(unit="s") if high / low < _LABEL_MINOR_BELOW else NullFormatter())
        axes.set_xlabel("matrix size n (n×n operands)")
        axes.set_ylabel("median time of one multiplication")
        axes.set_title(_shown(dtype))
        axes.grid(visible=True, which="major", alpha=0.4)
        axes.grid(visible=True, which="minor", alpha=0.15)
        # Below the chart, so that it never hides a curve or a crossover.
        axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=2, frameon=False)
    return figure


def _shown(text: str) -> str:
    """Text to draw as it reads, whatever its source (a scrape, a file name, a URL): printable, since XML 1.0 refuses
    control characters even escaped and no encoder takes a lone surrogate; each $ escaped, or mathtext would read a
    name between two of them as a formula (and fail on one it cannot parse)."""
    return printable(text).replace("$", r"\$")


def _device_colors(chart: Chart) -> dict[str, str]:
    """Black for CPUs, then one palette colour per GPU, stable across charts."""
    kinds = {d.device: d.kind for d in chart.devices}
    devices = sorted({key.device for key, _ in chart.times}, key=lambda d: (kinds.get(d) != "cpu", d))
    gpus = [d for d in devices if kinds.get(d) != "cpu"]
    colors = {d: "black" for d in devices if kinds.get(d) == "cpu"}
    colors.update({d: f"C{i % 10}" for i, d in enumerate(gpus)})
    return colors


def _draw_curves(axes: Axes, chart: Chart, dtype: str, colors: Mapping[str, str], names: Mapping[str, str]) -> None:
    for device, color in colors.items():
        for mode in MODES:
            points = sorted(
                (key.size, seconds)
                for key, seconds in chart.times
                if (key.device, key.dtype, key.mode) == (device, dtype, mode)
            )
            if not points:
                continue
            linestyle, marker = _MODE_STYLE[mode]
            name = f" ({names[device]})" if device in names else ""
            axes.plot(
                [size for size, _ in points],
                [seconds for _, seconds in points],
                color=color,
                linestyle=linestyle,
                marker=marker,
                markersize=4,
                label=_shown(f"{device}{name} {mode}"),
            )


def _draw_crossovers(axes: Axes, chart: Chart, dtype: str, colors: Mapping[str, str]) -> None:
    for c in (c for c in chart.crossovers if c.dtype == dtype):
        if c.state is CrossoverState.FOUND and c.size is not None:
            linestyle, _ = _MODE_STYLE[c.mode]
            axes.axvline(
                c.size,
                color=colors.get(c.gpu, "grey"),
                linestyle=linestyle,
                linewidth=1.2,
                alpha=0.8,
                label=_shown(f"n* {c.gpu} {c.mode} ≈ {c.size:.0f}"),
            )
            axes.annotate(
                f"n*≈{c.size:.0f} ({c.mode})",
                xy=(c.size, 0.02),
                xycoords=("data", "axes fraction"),
                rotation=90,
                ha="right",
                va="bottom",
                fontsize="x-small",
                color=colors.get(c.gpu, "grey"),
            )
        elif c.state in STATE_SENTENCES and c.state is not CrossoverState.WITHHELD:
            # A legend entry with no line: the state is read where the curves are named.
            axes.plot([], [], linestyle="none", label=_shown(f"{c.pair_label} {c.mode}: {STATE_SENTENCES[c.state]}"))
