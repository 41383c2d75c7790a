"""What the chart of a sweep shows (a ``Chart``), read from ``once --json``, a running service's /metrics or the
served snapshot, and the styles both renderers share: svgchart.py (stdlib) and plot.py (matplotlib, for PNG)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover_monitor.codec import DecodeError, from_data, parse_json
from crossover_monitor.config.convert import MAX_SIZE
from crossover_monitor.errors import MonitorError
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
    Mode,
    PointKey,
    Snapshot,
    Timing,
)
from crossover_monitor.scrape import ScrapeError, fetch_samples
from crossover_monitor.text import printable, utc_text

_FETCH_TIMEOUT_S = 10.0

# A chart this big says nothing a reader can see (and would take minutes to draw): refused instead. A sweep has
# a curve per device, dtype and mode; 8 GPUs, a CPU, 2 dtypes and 2 modes make 36.
MAX_CURVES = 64
MAX_PANELS = 8  # dtypes, a panel each
_STATES = {state.value for state in CrossoverState}

# How each renderer draws a mode: its curves and its n* lines share the line, its points the marker.
MODE_STYLE: Mapping[Mode, tuple[str, str]] = {"compute": ("solid", "circle"), "end_to_end": ("dashed", "square")}
CPU_COLOR = "#000000"
# matplotlib's default cycle (tab10): a GPU has the same colour in the PNG and the SVG.
GPU_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
CROSSOVER_COLOR = "#808080"  # an n* whose GPU has no curve (read from /metrics without it)
LABEL_MINOR_BELOW = 100.0  # a y range (max / min) under which minor ticks get labels: too few decades to read


class PlotError(MonitorError):
    """The chart cannot be drawn; the message says what to fix."""


@dataclass(frozen=True, kw_only=True)
class Chart:
    """What the chart shows, whichever source it came from: median times of the configured sizes and the crossovers."""

    title: str
    devices: tuple[DeviceInfo, ...]
    times: tuple[tuple[PointKey, float], ...]
    crossovers: tuple[Crossover, ...]

    @property
    def dtypes(self) -> list[str]:
        """The dtypes drawn, a panel each, in the order of the panels."""
        return sorted({key.dtype for key, _ in self.times})


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
        title = _sweep_title(path.name, environment, float(snapshot["finished_at"]))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise PlotError(f"{path} is not the JSON that `crossover-monitor once --json` writes: {exc}") from None
    return checked(Chart(title=title, devices=devices, times=times, crossovers=crossovers), str(path))


def from_snapshot(snapshot: Snapshot, source: str) -> Chart:
    """The chart of a served snapshot (the landing page's); ``source`` heads its title (the host)."""
    chart = Chart(
        title=_sweep_title(source, dict(snapshot.environment), snapshot.finished_at),
        devices=snapshot.devices,
        times=tuple((m.key, m.timing.median_s) for m in snapshot.measurements if m.role == "sweep"),
        crossovers=snapshot.crossovers,
    )
    return checked(chart, f"the sweep that ended {utc_text(snapshot.finished_at)}")


def _sweep_title(source: str, environment: Mapping[str, Any], finished_at: float) -> str:
    versions = " ".join(str(environment[k]) for k in ("framework", "framework_version") if k in environment)
    finished = utc_text(finished_at, "%Y-%m-%d %H:%M UTC")
    return f"{source}: {versions + ', ' if versions else ''}sweep finished {finished}"


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
    return checked(chart, url)


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


def checked(chart: Chart, source: str) -> Chart:
    """``chart`` as it can be drawn: the points a log axis can place (a positive size and time), some of them, and
    no more curves and panels than a reader can see."""
    times = tuple((key, s) for key, s in chart.times if key.size > 0 and math.isfinite(s) and s > 0)
    if times != chart.times:
        chart = dataclasses.replace(chart, times=times)
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


def device_colors(chart: Chart) -> dict[str, str]:
    """Each drawn device's colour: black for CPUs, then one palette colour per GPU in name order, so a GPU keeps
    its colour from sweep to sweep."""
    kinds = {d.device: d.kind for d in chart.devices}
    devices = sorted({key.device for key, _ in chart.times}, key=lambda d: (kinds.get(d) != "cpu", d))
    gpus = [d for d in devices if kinds.get(d) != "cpu"]
    colors = {d: CPU_COLOR for d in devices if kinds.get(d) == "cpu"}
    colors.update({d: GPU_PALETTE[i % len(GPU_PALETTE)] for i, d in enumerate(gpus)})
    return colors


def curve_points(chart: Chart, device: str, dtype: str, mode: Mode) -> list[tuple[int, float]]:
    """One curve's (size, seconds), by size."""
    return sorted(
        (key.size, seconds)
        for key, seconds in chart.times
        if (key.device, key.dtype, key.mode) == (device, dtype, mode)
    )


def curve_label(chart: Chart, device: str, mode: Mode) -> str:
    """A curve's name in the legend: the device, its model name, the mode."""
    names = {d.device: d.name for d in chart.devices}
    name = f" ({names[device]})" if device in names else ""
    return f"{device}{name} {mode}"


def crossover_label(crossover: Crossover) -> str:
    """A found n*'s name in the legend."""
    return f"n* {crossover.gpu} {crossover.mode} ≈ {crossover.size or 0:.0f}"


def crossover_mark(crossover: Crossover) -> str:
    """The words beside a found n*'s line."""
    return f"n*≈{crossover.size or 0:.0f} ({crossover.mode})"


def state_label(crossover: Crossover) -> str | None:
    """What the legend says of a crossover with no n* to mark; None for a found one, and for a withheld one (the
    page and `once` say why it was withheld)."""
    if crossover.state is CrossoverState.WITHHELD or crossover.state not in STATE_SENTENCES:
        return None
    return f"{crossover.pair_label} {crossover.mode}: {STATE_SENTENCES[crossover.state]}"


def found(crossover: Crossover) -> bool:
    """Whether the crossover has an n* to mark."""
    size = crossover.size
    return crossover.state is CrossoverState.FOUND and size is not None and math.isfinite(size) and size > 0
