"""`crossover-monitor plot`: reading a sweep from `once --json` or a live /metrics, and drawing it (an SVG with the
standard library, a PNG with matplotlib)."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from crossover_monitor.cli.main import main
from crossover_monitor.http.server import MetricsServer
from crossover_monitor.model import (
    DeviceInfo,
    Role,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
)
from crossover_monitor.view.chart import Chart, PlotError, from_json, from_url
from crossover_monitor.view.report import render_json
from tests import builders
from tests.conftest import REPO, free_port
from tests.fakes import CPU, GPU, cpu_seconds, gpu_seconds
from tests.fakeserver import serving
from tests.service import started_server

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (the plot extra) is not installed")
SIZES = (1, 16, 32, 64, 128, 256)
FINISHED_AT = 1_795_000_000.0


def _snapshot(devices: tuple[DeviceInfo, ...] = (CPU, GPU), dtypes: tuple[str, ...] = ("float32",)) -> Snapshot:
    """A sweep of the fake known curves (crossover near n=46 in compute mode), with refinement points too."""
    measurements = []
    points: list[tuple[int, Role]] = [*((n, "sweep") for n in SIZES), (45, "refine"), (47, "refine")]
    for dtype in dtypes:
        for mode in ("compute", "end_to_end"):
            for device in devices:
                for size, role in points:
                    seconds = cpu_seconds(size) if device.kind == "cpu" else gpu_seconds(size, mode)
                    point = builders.measurement(
                        device.device, size, seconds, dtype=dtype, mode=mode, role=role, iqr_s=seconds / 50
                    )
                    timing = dataclasses.replace(point.timing, calls_per_block=10, samples_s=(seconds,) * 5)
                    measurements.append(dataclasses.replace(point, timing=timing))
    environment = (("framework", "fake"), ("framework_version", "1.0"))
    return builders.snapshot(devices, measurements, finished_at=FINISHED_AT, environment=environment)


def _json_file(tmp_path: Path, snapshot: Snapshot | None, result: SweepResult = SweepResult.SUCCESS) -> Path:
    outcome = SweepOutcome(
        result=result,
        started_at=FINISHED_AT - 5,
        finished_at=FINISHED_AT,
        reason="" if snapshot else "the worker died with SIGSEGV",
        snapshot=snapshot,
    )
    path = tmp_path / "sweep.json"
    path.write_text(render_json(outcome))
    return path


@pytest.fixture
def serve() -> Iterator[Callable[[ServiceState], str]]:
    """Serves a ServiceState on a real MetricsServer on loopback; returns its /metrics URL."""
    servers: list[MetricsServer] = []

    def start(state: ServiceState) -> str:
        server = started_server(lambda: state, backend="fake")
        servers.append(server)
        host, port = server.address
        return f"http://{host}:{port}/metrics"

    yield start
    for server in servers:
        server.stop()


def _summary(chart: Chart) -> tuple[object, ...]:
    """What both sources must agree on: points, crossovers (state, n*, bracket) and devices."""
    return (
        sorted((key.device, key.dtype, key.mode, key.size, seconds) for key, seconds in chart.times),
        sorted((c.gpu, c.cpu, c.dtype, c.mode, c.state.value, c.size, c.lower, c.upper) for c in chart.crossovers),
        sorted((d.device, d.kind, d.name, d.details) for d in chart.devices),
    )


def test_json_file_and_live_metrics_give_the_same_chart(tmp_path: Path, serve: Callable[[ServiceState], str]) -> None:
    """A sweep read from `once --json` and from the service's /metrics yields identical points and crossovers."""
    snapshot = _snapshot()
    from_file = from_json(_json_file(tmp_path, snapshot))
    url = serve(ServiceState(latest=snapshot, last_success_at=FINISHED_AT))
    from_service = from_url(url)
    assert _summary(from_file) == _summary(from_service)
    found = [c for c in from_file.crossovers if c.mode == "compute"]
    assert [(c.state.value, round(c.size or 0)) for c in found] == [("found", 46)]


def test_only_configured_sizes_are_drawn(tmp_path: Path) -> None:
    """Refinement points (which /metrics never exports) are left out of the chart read from JSON."""
    chart = from_json(_json_file(tmp_path, _snapshot()))
    assert {key.size for key, _ in chart.times} == set(SIZES)


def test_failed_sweep_json_is_refused_with_its_reason(tmp_path: Path) -> None:
    """A `once --json` file of a failed sweep has nothing to draw, and the error says why the sweep failed."""
    path = _json_file(tmp_path, None, SweepResult.FAILED)
    with pytest.raises(PlotError, match="failed: the worker died with SIGSEGV"):
        from_json(path)


def test_file_that_is_not_once_json_is_refused(tmp_path: Path) -> None:
    """Malformed or foreign JSON gives an error naming the file and what it should be."""
    path = tmp_path / "other.json"
    path.write_text('{"snapshot": {"devices": [{"name": "x"}]}}')
    with pytest.raises(PlotError, match=r"other\.json is not the JSON that `crossover-monitor once --json` writes"):
        from_json(path)
    path.write_text("not json")
    with pytest.raises(PlotError, match="is not the JSON"):
        from_json(path)
    path.write_text('{"snapshot": {"devices": [], "measurements": ["x"], "crossovers": [], "finished_at": 0}}')
    with pytest.raises(PlotError, match="is not the JSON"):
        from_json(path)


def test_service_without_a_completed_sweep_has_nothing_to_draw(serve: Callable[[ServiceState], str]) -> None:
    """A live service that has not finished a sweep yet is reported as such, not drawn empty."""
    with pytest.raises(PlotError, match="no timings to draw yet"):
        from_url(serve(ServiceState()))


def test_unreachable_and_non_http_urls_are_reported() -> None:
    """A closed port and a non-HTTP URL each give a one-line error naming the URL."""
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(PlotError, match=f"cannot fetch {url}"):
        from_url(url)
    with pytest.raises(PlotError, match="needs an http"):
        from_url("file:///etc/hostname")
    with pytest.raises(PlotError, match="cannot fetch http://localhost:abc/metrics"):
        from_url("http://localhost:abc/metrics")


def test_a_page_that_is_not_metrics_is_reported(serve: Callable[[ServiceState], str]) -> None:
    """Pointing --from-url at the service's HTML index (not /metrics) says it did not answer with metrics."""
    url = serve(ServiceState()).removesuffix("metrics")
    with pytest.raises(PlotError, match="did not answer with Prometheus metrics"):
        from_url(url)


def test_unsupported_output_extension_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An output that is neither .png nor .svg is refused before anything is read."""
    code = main(["plot", "--from-json", str(tmp_path / "missing.json"), str(tmp_path / "chart.pdf")])
    assert code == 1
    assert "must be a .png or .svg file" in capsys.readouterr().err
    assert not (tmp_path / "chart.pdf").exists()


def _without_matplotlib(*argv: str) -> subprocess.CompletedProcess[str]:
    """`crossover-monitor ARGV` where matplotlib cannot be imported, as with the default install."""
    # A None entry in sys.modules is Python's own way of making an import fail.
    code = (
        "import sys; sys.modules['matplotlib'] = None; from crossover_monitor.cli.main import main; "
        f"sys.exit(main({list(argv)!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_missing_matplotlib_prints_the_install_hint_for_a_png_and_exits_1(tmp_path: Path) -> None:
    """Without matplotlib, `plot` of a PNG tells the user to install the plot extra and exits 1 with no traceback."""
    result = _without_matplotlib("plot", "--from-json", str(_json_file(tmp_path, _snapshot())), str(tmp_path / "c.png"))
    assert result.returncode == 1
    assert "pip install 'crossover-monitor[plot]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "c.png").exists()


def test_an_svg_needs_no_plot_extra(tmp_path: Path) -> None:
    """Without matplotlib, `plot` writes the SVG chart: a curve per device and mode, the n* marked."""
    output = tmp_path / "chart.svg"
    result = _without_matplotlib("plot", "--from-json", str(_json_file(tmp_path, _snapshot())), str(output))
    assert result.returncode == 0, result.stderr
    assert f"wrote {output}" in result.stdout
    root = ET.fromstring(output.read_bytes())  # noqa: S314 - our own output
    curves = [e for e in root.iter() if e.get("class") == "curve"]
    assert {(c.get("data-device"), c.get("data-mode")) for c in curves} == {
        (device, mode) for device in ("/CPU:0", "/GPU:0") for mode in ("compute", "end_to_end")
    }
    assert "n* /GPU:0 compute ≈ 46" in "".join(root.itertext())


@needs_matplotlib
def test_chart_is_log_log_with_a_curve_per_device_and_mode_and_a_line_at_each_crossover(tmp_path: Path) -> None:
    """Both axes are logarithmic; CPU and GPU each get a curve per mode; each n* gets a vertical line there."""
    from crossover_monitor.view.plot import draw  # noqa: PLC0415 - imports matplotlib

    chart = from_json(_json_file(tmp_path, _snapshot()))
    (axes,) = draw(chart).axes
    assert (axes.get_xscale(), axes.get_yscale()) == ("log", "log")
    lines = {line.get_label(): line for line in axes.get_lines()}
    for curve in ("/CPU:0 (Fake CPU) compute", "/GPU:0 (Fake GPU) end_to_end"):
        assert np.asarray(lines[curve].get_xdata()).tolist() == list(SIZES)
    for c in chart.crossovers:
        assert c.size is not None
        mark = lines[f"n* /GPU:0 {c.mode} ≈ {c.size:.0f}"]
        assert np.asarray(mark.get_xdata()).tolist() == [c.size, c.size]


@needs_matplotlib
def test_cpu_only_sweep_notes_that_there_is_no_gpu(tmp_path: Path) -> None:
    """A CPU-only sweep draws the CPU curves and names the no_gpu state in the legend instead of a crossover."""
    from crossover_monitor.view.plot import draw  # noqa: PLC0415 - imports matplotlib

    (axes,) = draw(from_json(_json_file(tmp_path, _snapshot(devices=(CPU,))))).axes
    legend = axes.get_legend()
    assert legend is not None
    labels = [text.get_text() for text in legend.get_texts()]
    assert "/CPU:0 compute: no GPU was measured, so there is nothing to compare the CPU with" in labels
    assert not [label for label in labels if label.startswith("n*")]


@needs_matplotlib
def test_each_dtype_gets_its_own_panel(tmp_path: Path) -> None:
    """Two dtypes in one sweep give two panels, titled by dtype."""
    from crossover_monitor.view.plot import draw  # noqa: PLC0415 - imports matplotlib

    figure = draw(from_json(_json_file(tmp_path, _snapshot(dtypes=("float32", "float16")))))
    assert [axes.get_title() for axes in figure.axes] == ["float16", "float32"]


@pytest.mark.parametrize(
    ("suffix", "magic"), [pytest.param(".png", b"\x89PNG\r\n\x1a\n", marks=needs_matplotlib), (".svg", b"<?xml")]
)
def test_plot_writes_png_or_svg_by_extension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str, magic: bytes
) -> None:
    """`plot --from-json FILE OUT` writes a PNG or an SVG, chosen by OUT's extension, and says where."""
    output = tmp_path / f"chart{suffix}"
    assert main(["plot", "--from-json", str(_json_file(tmp_path, _snapshot())), str(output)]) == 0
    assert output.read_bytes().startswith(magic)
    assert f"wrote {output}" in capsys.readouterr().out
    if suffix == ".svg":
        assert "n* /GPU:0 compute ≈ 46" in output.read_text(encoding="utf-8")  # text stays text


@needs_matplotlib
@pytest.mark.slow
def test_plot_from_a_real_once_json_and_a_running_service(tmp_path: Path) -> None:
    """Real `once --json` output and a real running service's /metrics both plot to a PNG."""
    from tests.service import RunningService, fake_config  # noqa: PLC0415 - only the slow test starts services

    config = tmp_path / "config.yaml"
    config.write_text(fake_config())
    once = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "once", "--json", "--config", str(config)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (tmp_path / "once.json").write_text(once.stdout)
    assert main(["plot", "--from-json", str(tmp_path / "once.json"), str(tmp_path / "from-json.png")]) == 0

    service = RunningService(tmp_path, config.read_text())
    try:
        service.wait_for_sweeps("success")
        assert main(["plot", "--from-url", f"{service.url}/metrics", str(tmp_path / "from-url.png")]) == 0
    finally:
        service.stop()
    for name in ("from-json.png", "from-url.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")


ODD = "\n".join(
    [
        'matmul_monitor_build_info{version="x"} 1',
        'matmul_device_info{backend="fake",device="/CPU:0",kind="cpu",name="cpu"} 1',
        'matmul_device_info{backend="fake",device="/GPU:0",kind="gpu",name="gpu"} 1',
        'matmul_device_info{backend="fake",kind="gpu"} 1',  # no device, no name
        'matmul_duration_seconds{backend="fake",device="/CPU:0",dtype="float32",mode="compute",size="64"} 0.001',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="compute",size="64"} 0.002',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="sideways",size="64"} 0.002',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="compute",size="128"} NaN',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="compute",size="256"} +Inf',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="compute",size="'
        + "9" * 300
        + '"} 0.5',
        'matmul_duration_seconds{backend="fake",device="/GPU:0",dtype="float32",mode="compute",size="big"} 0.5',
        (
            'matmul_crossover_state{backend="fake",gpu="/GPU:0",cpu="/CPU:0",dtype="float32",mode="compute",'
            'state="sideways"} 1'
        ),
        'matmul_crossover_size{backend="fake",gpu="/GPU:0",cpu="/CPU:0",dtype="float32",mode="compute"} NaN',
    ]
)


def test_odd_metrics_are_left_out_not_a_traceback() -> None:
    """Issue 34 #8: an unknown mode, NaN and Inf times, a 300-digit size, a device without labels, an unknown
    state: each left out; the two good points are drawn."""
    with serving(ODD + "\n") as url:
        chart = from_url(url)
    assert sorted((key.device, key.mode, key.size, seconds) for key, seconds in chart.times) == [
        ("/CPU:0", "compute", 64, 0.001),
        ("/GPU:0", "compute", 64, 0.002),
    ]
    assert [d.device for d in chart.devices] == ["/CPU:0", "/GPU:0"]
    assert chart.crossovers == ()


def test_300_dtypes_are_refused_at_once_in_one_line() -> None:
    """Issue 34 #8: 300 dtypes were still being drawn after 150 s at 1.9 GB; now a PlotError names the count."""
    lines = [
        f'matmul_duration_seconds{{backend="fake",device="/GPU:0",dtype="t{i}",mode="compute",size="64"}} 0.002'
        for i in range(300)
    ]
    started = time.monotonic()
    with serving("\n".join(lines) + "\n") as url, pytest.raises(PlotError) as refused:
        from_url(url)
    assert "300 curves in 300 dtypes: more than a chart can show (at most 64 curves, 8 dtypes)" in str(refused.value)
    assert time.monotonic() - started < 10
