"""svgchart.py: the chart of a sweep as SVG with the standard library alone, read back as XML and checked against the
axes it draws."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable

import pytest

from crossover_monitor.model import CrossoverState, DeviceInfo, Mode
from crossover_monitor.text import printable
from crossover_monitor.view import svgchart
from crossover_monitor.view.chart import MAX_CURVES, Chart, PlotError, from_snapshot
from tests import builders
from tests.fakes import CPU, GPU, cpu_seconds, gpu_seconds

SVG = "{http://www.w3.org/2000/svg}"
SIZES = (1, 16, 32, 64, 128, 256, 1024)
# What XML 1.0 refuses in a document, even escaped (tab, newline and carriage return are allowed).
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _gpus(count: int) -> tuple[DeviceInfo, ...]:
    return tuple(dataclasses.replace(GPU, device=f"/GPU:{i}", name=f"Fake GPU {i}") for i in range(count))


def _chart(
    devices: Iterable[DeviceInfo] = (CPU, GPU),
    dtypes: tuple[str, ...] = ("float32",),
    sizes: tuple[int, ...] = SIZES,
    slower: float = 1.0,
) -> Chart:
    """The fake known curves (compute n* near 46, end_to_end near 67), each GPU ``slower`` times the one before,
    their crossovers derived by the service's own code."""
    devices = tuple(devices)
    measurements = [
        builders.measurement(
            device.device,
            size,
            cpu_seconds(size) if device.kind == "cpu" else gpu_seconds(size, mode) * slower**index,
            dtype=dtype,
            mode=mode,
        )
        for dtype in dtypes
        for mode in ("compute", "end_to_end")
        for index, device in enumerate(devices)
        for size in sizes
    ]
    return from_snapshot(builders.snapshot(devices, measurements), "node-1")


def _parsed(chart: Chart) -> ET.Element:
    body = svgchart.render(chart)
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    assert not NOT_XML.search(body.decode("utf-8"))
    return ET.fromstring(body)  # noqa: S314 - our own output


def _of_class(root: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in root.iter() if name in (e.get("class") or "").split()]


def _points(curve: ET.Element) -> list[tuple[float, float]]:
    (line,) = curve.iter(f"{SVG}polyline")
    return [(float(x), float(y)) for x, y in (pair.split(",") for pair in line.get("points", "").split())]


def _axis(ticks: list[ET.Element], position: str, log: float) -> tuple[float, float]:
    """(pixels per unit of log, where log 0 would be) from the first and last tick, after checking that every
    tick between them sits on that line: the axis is logarithmic in ``log``'s base."""
    at = sorted((math.log(float(t.get("data-value", ""))) / math.log(log), float(t.get(position, ""))) for t in ticks)
    (low, low_px), (high, high_px) = at[0], at[-1]
    scale = (high_px - low_px) / (high - low)
    for exponent, px in at:
        assert px == pytest.approx(low_px + (exponent - low) * scale, abs=0.02)
    return scale, low_px - low * scale


def test_the_chart_parses_with_a_curve_per_device_and_mode_and_a_point_per_size() -> None:
    """An 8-GPU sweep: one curve per device and mode, each a polyline with a point (and a marker) per size."""
    chart = _chart((CPU, *_gpus(8)), slower=1.03)
    root = _parsed(chart)
    curves = _of_class(root, "curve")
    assert sorted((c.get("data-device"), c.get("data-mode")) for c in curves) == sorted(
        (d.device, mode) for d in (CPU, *_gpus(8)) for mode in ("compute", "end_to_end")
    )
    for curve in curves:
        assert len(_points(curve)) == len(SIZES)
        markers = [e for e in curve if e.tag in (f"{SVG}circle", f"{SVG}rect")]
        assert len(markers) == len(SIZES)
        assert {e.tag for e in markers} == {f"{SVG}circle" if curve.get("data-mode") == "compute" else f"{SVG}rect"}
    dashed = {c.get("data-mode"): next(c.iter(f"{SVG}polyline")).get("stroke-dasharray") for c in curves}
    assert dashed == {"compute": None, "end_to_end": "6 3"}
    colors = {c.get("data-device"): c.get("stroke") for c in curves}
    assert colors["/CPU:0"] == "#000000"
    assert len({colors[f"/GPU:{i}"] for i in range(8)}) == 8  # a colour each
    assert root.get("width") == str(svgchart.PANEL_WIDTH)


def test_a_crossover_line_stands_where_its_n_star_falls_on_the_log2_axis() -> None:
    """Each found n* gets a vertical line at the x its size maps to on the axis the size ticks define."""
    chart = _chart()
    root = _parsed(chart)
    scale, origin = _axis(_of_class(root, "xtick"), "x1", 2)
    found = [c for c in chart.crossovers if c.state is CrossoverState.FOUND and c.size is not None]
    assert sorted(c.mode for c in found) == ["compute", "end_to_end"]
    lines = {m.get("data-mode"): m for m in _of_class(root, "crossover")}
    for c in found:
        assert c.size is not None
        (line,) = lines[c.mode].iter(f"{SVG}line")
        x = origin + math.log2(c.size) * scale
        assert float(line.get("x1", "")) == pytest.approx(x, abs=0.02)
        assert float(line.get("x2", "")) == pytest.approx(x, abs=0.02)
        assert f"n*≈{c.size:.0f} ({c.mode})" in "".join(lines[c.mode].itertext())
    # Between the sizes either side of it, where the curves' points stand.
    cpu = next(
        c for c in _of_class(root, "curve") if (c.get("data-device"), c.get("data-mode")) == ("/CPU:0", "compute")
    )
    xs = dict(zip(SIZES, (x for x, _ in _points(cpu)), strict=True))
    assert xs[32] < float(next(lines["compute"].iter(f"{SVG}line")).get("x1", "")) < xs[64]


def test_a_point_stands_higher_the_longer_it_took_as_the_time_ticks_say() -> None:
    """y rises with time on every curve, at the height a log10 axis through the time ticks gives its seconds."""
    chart = _chart()
    root = _parsed(chart)
    scale, origin = _axis(_of_class(root, "ytick"), "y1", 10)
    assert scale < 0  # up the page: SVG's y grows downwards
    for curve in _of_class(root, "curve"):
        device, mode = curve.get("data-device"), curve.get("data-mode")
        seconds = [
            s for key, s in sorted(chart.times, key=lambda t: t[0].size) if (key.device, key.mode) == (device, mode)
        ]
        ys = [y for _, y in _points(curve)]
        for s, y in zip(seconds, ys, strict=True):
            assert y == pytest.approx(origin + math.log10(s) * scale, abs=0.02)
        by_time = sorted(zip(seconds, ys, strict=True))
        assert all(y2 < y1 for (s1, y1), (s2, y2) in itertools.pairwise(by_time) if s2 > s1)


def _labels(root: ET.Element) -> list[str]:
    return ["".join(e.itertext()) for e in _of_class(root, "ylabel")]


def _seconds(label: str) -> float:
    read = re.fullmatch(r"([\d.]+)(p|n|µ|m|k|)s", label)
    assert read is not None, label
    number, prefix = read.groups()
    return float(number) * {"p": 1e-12, "n": 1e-9, "µ": 1e-6, "m": 1e-3, "k": 1e3, "": 1.0}[prefix]


def test_times_read_in_engineering_units_minor_ticks_labelled_only_under_two_decades() -> None:
    """Over 5 decades only powers of ten are labelled (10µs, 1ms); over one, the ticks between them too."""
    wide = _labels(_parsed(_chart()))
    assert {"10µs", "100µs", "1ms"} <= set(wide)
    assert all(math.log10(_seconds(label)) == pytest.approx(round(math.log10(_seconds(label)))) for label in wide)
    narrow = _labels(_parsed(_chart(devices=(GPU,), sizes=(1, 16, 64, 128, 256))))  # 100µs to 470µs
    assert len(narrow) >= 4
    assert any(not math.log10(_seconds(label)).is_integer() for label in narrow)  # a minor tick's label


def test_a_cpu_only_sweep_says_there_is_no_gpu_and_marks_no_crossover() -> None:
    """The no_gpu state is legend text, as every state but found and withheld; there is no n* line."""
    root = _parsed(_chart(devices=(CPU,)))
    entries = ["".join(e.itertext()) for e in _of_class(root, "entry")]
    assert "/CPU:0 compute: no GPU was measured, so there is nothing to compare the CPU with" in entries
    assert "/CPU:0 (Fake CPU) compute" in entries
    assert not _of_class(root, "crossover")
    assert not [e for e in entries if e.startswith("n*")]


def test_a_withheld_crossover_is_left_out_of_the_legend() -> None:
    """A withheld pair has no line and no legend words (the page says why it was withheld)."""
    chart = _chart()
    withheld = dataclasses.replace(chart.crossovers[0], state=CrossoverState.WITHHELD, size=None)
    root = _parsed(dataclasses.replace(chart, crossovers=(withheld,)))
    entries = ["".join(e.itertext()) for e in _of_class(root, "entry")]
    assert len(entries) == 4  # the four curves alone
    assert not _of_class(root, "crossover")


def test_each_dtype_gets_a_panel_side_by_side_on_one_time_axis() -> None:
    """Two dtypes: two panels by name, the picture twice as wide, the same time ticks in both."""
    root = _parsed(_chart(dtypes=("float32", "float16")))
    panels = _of_class(root, "panel")
    assert [p.get("data-dtype") for p in panels] == ["float16", "float32"]
    assert root.get("width") == str(2 * svgchart.PANEL_WIDTH)
    ticks = [[(t.get("data-value"), t.get("y1")) for t in _of_class(p, "ytick")] for p in panels]
    assert ticks[0] == ticks[1]
    assert float(_of_class(panels[1], "frame")[0].get("x", "")) >= svgchart.PANEL_WIDTH


HOSTILE = "\ud800 \x00\x1b[2J\x7f\x85\n\ufffe <&\">' ]]>-- $x^$"


def test_hostile_names_come_out_printable_escaped_and_parseable() -> None:
    """Control characters, a lone surrogate, a non-character and <&"> in a device, its name, the dtype and the
    title: the SVG encodes, parses, and reads them as printable text, in attributes and in text alike."""
    gpu = dataclasses.replace(GPU, device=f"/GPU:0{HOSTILE}", name=f"Fake GPU{HOSTILE}")
    chart = _chart(devices=(CPU, gpu), dtypes=(f"float32{HOSTILE}",))
    chart = dataclasses.replace(chart, title=f"node{HOSTILE}")
    root = _parsed(chart)
    shown = printable(HOSTILE)
    assert '<&">' in shown
    assert {c.get("data-device") for c in _of_class(root, "curve")} == {"/CPU:0", f"/GPU:0{shown}"}
    assert {c.get("data-gpu") for c in _of_class(root, "crossover")} == {f"/GPU:0{shown}"}
    assert _of_class(root, "panel")[0].get("data-dtype") == f"float32{shown}"
    text = "".join(root.itertext())
    assert f"/GPU:0{shown} (Fake GPU{shown}) compute" in text
    assert f"node{shown}" in text
    assert "\\x00\\x1b[2J" in text  # seen, not obeyed


def test_a_name_too_long_for_the_legend_is_cut_and_kept_whole_in_its_tooltip() -> None:
    """A 500-character GPU name is cut to the panel's width in the legend; its <title> holds all of it."""
    gpu = dataclasses.replace(GPU, name="N" * 500)
    root = _parsed(_chart(devices=(CPU, gpu)))
    entries = ["".join(e.itertext()) for e in _of_class(root, "entry")]
    cut = [e for e in entries if e.startswith("/GPU:0 (NNN")]
    assert cut
    assert all(len(e) < 150 and e.endswith("…") for e in cut)
    titles = ["".join(t.itertext()) for t in root.iter(f"{SVG}title")]
    assert f"/GPU:0 ({'N' * 500}) compute" in titles


def test_more_curves_than_a_chart_can_show_are_refused() -> None:
    """The chart's limits hold for svgchart as for the readers: 66 curves are a PlotError, not a picture."""
    mode: Mode = "compute"
    times = tuple(
        (builders.point_key(f"/GPU:{i}", 64, dtype=dtype, mode=mode), 1e-4) for i in range(33) for dtype in ("a", "b")
    )
    assert len(times) > MAX_CURVES
    chart = Chart(title="many", devices=(), times=times, crossovers=())
    with pytest.raises(PlotError, match="66 curves in 2 dtypes: more than a chart can show"):
        svgchart.render(chart)


def test_points_a_log_axis_cannot_place_are_left_out() -> None:
    """A zero or infinite time (a broken clock, a damaged file) is not drawn; the rest of the curve is."""
    chart = _chart(devices=(CPU,))
    key = next(k for k, _ in chart.times if k.size == 16 and k.mode == "compute")
    infinite = next(k for k, _ in chart.times if k.size == 32 and k.mode == "compute")
    broken = tuple((k, {key: 0.0, infinite: math.inf}.get(k, s)) for k, s in chart.times)
    root = _parsed(dataclasses.replace(chart, times=broken))
    compute = next(c for c in _of_class(root, "curve") if c.get("data-mode") == "compute")
    assert len(_points(compute)) == len(SIZES) - 2
