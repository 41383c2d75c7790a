"""The landing page: rendered by a real headless Chromium from the running service, and escaped."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import html.parser
import logging
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from crossover_monitor.config.settings import BenchmarkSettings, Settings
from crossover_monitor.http import page
from crossover_monitor.model import (
    GPU_PROBLEM,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.service.history import Run
from tests import builders
from tests.browser import browse
from tests.builders import FULL_SNAPSHOT
from tests.service import RunningService, fake_config, http_get, started_server

DRAWN = page.PictureState.DRAWN


class Elements(html.parser.HTMLParser):
    """Every element's id and attributes, and the rows of each table (cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, dict[str, str | None]] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.by_id[str(found["id"])] = found
        if tag == "table":
            self._table = str(found.get("id"))
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _no_matplotlib(directory: Path) -> dict[str, str]:
    """The environment of a service for which matplotlib is not installed, as with the default install: a package
    of that name first on its path that refuses to be imported."""
    shadow = directory / "no-matplotlib" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('matplotlib is not installed (the test says so)')\n")
    return {"PYTHONPATH": str(shadow.parent)}


@pytest.mark.slow
def test_chromium_shows_settings_crossovers_runs_and_the_picture_with_the_default_install(tmp_path: Path) -> None:
    """In a real Chromium the page of a service without matplotlib shows the settings, the crossovers, the runs
    and the chart of the finished sweep, an image the browser decoded (its natural width)."""
    config = fake_config() + f"history: {{directory: {tmp_path / 'state'}}}\n"
    service = RunningService(tmp_path, config, env=_no_matplotlib(tmp_path))
    try:
        service.wait_for_sweeps("success")
        status, content_type, body = service.get("/sweep.svg")  # drawn at the first ask, answered with it
        dom = Elements()
        dom.feed(browse(service.url + "/", tmp_path / "profile"))
    finally:
        service.stop()
    assert (status, content_type) == (200, "image/svg+xml"), body
    svg = ET.fromstring(body.encode())  # noqa: S314 - the service's own chart
    assert len([e for e in svg.iter() if e.get("class") == "curve"]) == 4  # CPU and GPU, two modes each
    settings = {row[0]: row[1] for row in dom.tables["settings"]}
    assert settings["backend"] == "tests.fakes:curve"
    assert settings["sizes"] == "16, 32, 64, 128"
    assert "UTC (in " in settings["next run"]
    header, *crossovers = dom.tables["crossovers"]
    assert header[:5] == ["GPU", "CPU", "dtype", "mode", "state"]
    assert {(row[3], row[4]) for row in crossovers} == {("compute", "found"), ("end_to_end", "found")}
    assert all(float(row[5]) > 0 for row in crossovers)
    header, *runs = dom.tables["runs"]
    assert runs
    assert runs[0][2:4] == ["sweep", "success"]
    # The browser fetched the chart and could draw it (the image's onload ran, not its onerror), at its size.
    assert dom.by_id["sweep"].get("data-shown") == "yes", dom.by_id["sweep"]
    assert int(dom.by_id["sweep"].get("data-width") or 0) == int(svg.get("width", "")) > 0


def test_values_are_escaped_and_the_picture_needs_no_extra() -> None:
    """Served values are HTML-escaped; the page shows the picture and names no extra to install."""
    hostile = Withheld(
        backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="<script>alert(1)</script>"
    )
    state = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, withheld=(hostile,)))
    rendered = page.render(Settings(), state, [], picture=DRAWN, now=0.0, version="x")
    assert "<script>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert "crossover-monitor[plot]" not in rendered
    assert "<img id='sweep' src='/sweep.svg'" in rendered
    assert "None yet." in rendered  # an empty history


def test_the_reason_for_no_gpu_is_shown_and_escaped() -> None:
    """Where the backend found no GPU, the page says why under the crossovers (escaped), and also without any."""
    reason = "CUDA_VISIBLE_DEVICES='<-1>' hides every GPU from this process: unset it"
    latest = dataclasses.replace(FULL_SNAPSHOT, environment=(*FULL_SNAPSHOT.environment, (GPU_PROBLEM, reason)))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=DRAWN, now=0.0, version="x")
    assert "<p id='no-gpu'>No GPU: CUDA_VISIBLE_DEVICES=&#x27;&lt;-1&gt;&#x27; hides every GPU" in rendered
    assert rendered.index("id='crossovers'") < rendered.index("id='no-gpu'")
    alone = dataclasses.replace(latest, crossovers=())
    alone_page = page.render(Settings(), ServiceState(latest=alone), [], picture=DRAWN, now=0.0, version="x")
    assert "id='no-gpu'" in alone_page
    assert "id='no-gpu'" not in page.render(
        Settings(), ServiceState(latest=FULL_SNAPSHOT), [], picture=DRAWN, now=0.0, version="x"
    )


def test_every_withheld_device_is_named_with_its_reason_also_where_no_crossover_could_be_compared() -> None:
    """A sweep that measured nothing (the CPU alone, withheld) says on the page what it withheld and why."""
    contended = Withheld(
        backend="fake", device="/CPU:0", reason=WithheldReason.CPU_CONTENDED, detail="other processes used <1.2> cores"
    )
    latest = dataclasses.replace(FULL_SNAPSHOT, crossovers=(), measurements=(), withheld=(contended,))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=DRAWN, now=0.0, version="x")
    assert "<p>None yet.</p>" in rendered
    assert "<p class='withheld'>/CPU:0 withheld (cpu_contended): other processes used &lt;1.2&gt; cores</p>" in rendered
    point = builders.point_key("/GPU:0", 64, backend="fake")
    slowed = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.HOST_SLOWED, detail="1.4x", point=point)
    latest = dataclasses.replace(FULL_SNAPSHOT, withheld=(slowed,))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=DRAWN, now=0.0, version="x")
    assert "<p class='withheld'>/GPU:0 64x64 float32 compute withheld (host_slowed): 1.4x</p>" in rendered


def test_a_withheld_sweep_says_when_the_next_try_comes_and_what_the_user_can_change() -> None:
    """Issue 55: while nothing is measured yet the page says when the withheld devices are tried again, and for a CPU
    beside busy cores, what to change (cpu_threads below the cores); a point withheld alone gets no advice."""
    contended = Withheld(backend="fake", device="/CPU:0", reason=WithheldReason.CPU_CONTENDED, detail="busy cores")
    latest = dataclasses.replace(FULL_SNAPSHOT, crossovers=(), measurements=(), withheld=(contended,))
    settings = Settings(benchmark=BenchmarkSettings(cpu_threads=2))
    state = ServiceState(latest=latest, next_retry_at=1_795_000_060.0)
    rendered = page.render(settings, state, [], picture=DRAWN, now=1_795_000_000.0, version="x")
    assert "<td id='next-try'>2026-11-18 11:07:40 UTC (in 60 s): /CPU:0, withheld in the latest sweep</td>" in rendered
    (advice,) = [line for line in rendered.splitlines() if line.startswith("<p class='advice'>")]
    assert "benchmark.cpu_threads is 2" in advice
    assert "set benchmark.cpu_threads below the cores" in advice
    # No retry planned (the next sweep comes first): no row; nothing withheld whole: no advice.
    quiet = page.render(settings, ServiceState(latest=latest), [], picture=DRAWN, now=0.0, version="x")
    assert "id='next-try'" not in quiet
    point = builders.point_key("/GPU:0", 64, backend="fake")
    slowed = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.HOST_SLOWED, detail="1.4x", point=point)
    alone = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, withheld=(slowed,)), next_retry_at=1.0)
    rendered = page.render(settings, alone, [], picture=DRAWN, now=0.0, version="x")
    assert "class='advice'" not in rendered
    assert "id='next-try'" not in rendered


def test_runs_from_the_history_or_the_latest_outcome_alone() -> None:
    """The runs table comes from the history, or without one from the latest outcome alone."""
    run = Run(
        kind="retry",
        started_at=10.0,
        finished_at=14.5,
        result="failed",
        reason="the worker exited (status 1)",
        devices=(),
        crossovers=(),
    )
    parsed = Elements()
    parsed.feed(page.render(Settings(), ServiceState(latest=FULL_SNAPSHOT), [run], picture=DRAWN, now=0.0, version="x"))
    assert parsed.tables["runs"][1] == ["1970-01-01 00:00:10 UTC", "4.5 s", "retry", "failed", run.reason]
    assert parsed.by_id["sweep"]["src"] == "/sweep.svg"
    outcome = SweepOutcome(result=SweepResult.TIMEOUT, started_at=1.0, finished_at=601.0, reason="deadline passed")
    alone = Elements()
    alone.feed(page.render(Settings(), ServiceState(last_outcome=outcome), None, picture=DRAWN, now=0.0, version="x"))
    assert alone.tables["runs"][1][2:] == ["sweep", "timeout", "deadline passed"]
    # A history another process holds locked: the page says so and shows the latest outcome, it does not wait.
    busy = page.render(
        Settings(),
        ServiceState(last_outcome=outcome),
        None,
        picture=DRAWN,
        now=0.0,
        version="x",
        history_problem="/var/lib/h.sqlite3 is busy (database is locked)",
    )
    assert "The run history cannot be read just now: /var/lib/h.sqlite3 is busy (database is locked)." in busy
    assert "set history.directory" not in busy
    # A row whose times could not be read shows them as unknown.
    unreadable = dataclasses.replace(run, started_at=None, finished_at=None, reason="this row cannot be read (…)")
    odd = Elements()
    odd.feed(page.render(Settings(), ServiceState(), [unreadable], picture=DRAWN, now=0.0, version="x"))
    assert odd.tables["runs"][1][:2] == ["–", "?"]


def test_the_picture_is_drawn_once_per_sweep_in_process_without_matplotlib() -> None:
    """The chart is drawn in the asking process with the standard library alone (matplotlib refuses to import,
    as with the default install), once per sweep, and kept."""
    probe = (
        "import sys; sys.modules['matplotlib'] = None; import xml.etree.ElementTree as ET; "
        "from crossover_monitor.http import page; from crossover_monitor.model import ServiceState; "
        "from tests.builders import FULL_SNAPSHOT; "
        "picture = page.SweepPicture(); state = ServiceState(latest=FULL_SNAPSHOT); drawn = picture.look(state); "
        "assert drawn.state is page.PictureState.DRAWN, drawn; ET.fromstring(drawn.svg); "
        "assert picture.look(state).svg is drawn.svg; "  # the same sweep: kept, not drawn again
        "assert picture.look(ServiceState()).state is page.PictureState.NONE; "  # no sweep, no picture
        "print(drawn.svg.count(b'class=\"curve\"'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"  # FULL_SNAPSHOT's one curve


class _CountedDrawing:
    """The real drawing, counted, and slow enough that asks overlap (a drawing of a big chart on a busy host)."""

    def __init__(self) -> None:
        self.drew: list[float] = []

    def __call__(self, latest: Snapshot) -> bytes:
        self.drew.append(latest.finished_at)
        time.sleep(0.2)
        return page.draw(latest)


def test_each_sweep_is_drawn_once_however_many_ask_at_once() -> None:
    """Eight handlers asking at once for a new sweep's chart get the same picture, drawn once; a newer sweep's
    is drawn at its first ask."""
    drawing = _CountedDrawing()
    picture = page.SweepPicture(drawing)
    state = ServiceState(latest=FULL_SNAPSHOT)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        looked = list(pool.map(lambda _: picture.look(state), range(8)))
    assert {p.state for p in looked} == {DRAWN}
    assert len({id(p.svg) for p in looked}) == 1
    newer = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, finished_at=FULL_SNAPSHOT.finished_at + 900))
    assert picture.look(newer).state is DRAWN
    assert picture.look(newer).state is DRAWN
    assert drawing.drew == [FULL_SNAPSHOT.finished_at, FULL_SNAPSHOT.finished_at + 900]  # once each


def test_a_retry_laid_over_the_sweep_is_drawn_anew_though_the_sweep_end_is_the_same() -> None:
    """A retry's timings change what is served but not the sweep's end time: the chart follows what is served."""
    drawing = _CountedDrawing()
    picture = page.SweepPicture(drawing)
    assert picture.look(ServiceState(latest=FULL_SNAPSHOT)).state is DRAWN
    retried = dataclasses.replace(FULL_SNAPSHOT, withheld=())
    assert retried.finished_at == FULL_SNAPSHOT.finished_at
    assert picture.look(ServiceState(latest=retried)).state is DRAWN
    assert drawing.drew == [FULL_SNAPSHOT.finished_at] * 2


def test_a_chart_that_cannot_be_drawn_is_logged_said_and_not_tried_again_for_that_sweep(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sweep with nothing to draw (every point withheld) and one with more curves than a chart can show: each
    picture is FAILED, the log says why, and it is not drawn again for that sweep."""
    drawing = _CountedDrawing()
    picture = page.SweepPicture(drawing)
    nothing = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, measurements=()))
    many = [builders.measurement(f"cuda:{i}", 64, 1e-4, backend="torch", dtype=t) for i in range(33) for t in "ab"]
    too_many = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, measurements=tuple(many)))
    with caplog.at_level(logging.WARNING, logger="crossover_monitor.http.page"):
        for state in (nothing, nothing, too_many, too_many):
            assert picture.look(state) == page.Picture(page.PictureState.FAILED)
    assert len(drawing.drew) == 2
    reasons = [
        getattr(r, "reason", "") for r in caplog.records if r.getMessage() == "the sweep's chart cannot be drawn"
    ]
    assert len(reasons) == 2
    assert "no timings to draw yet" in reasons[0]
    assert "66 curves in 2 dtypes: more than a chart can show" in reasons[1]


def test_a_bug_in_drawing_is_logged_with_its_traceback_and_the_page_says_the_picture_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A drawing that raises (a bug) leaves the picture FAILED, logged with its traceback; the page says so."""

    def broken(latest: Snapshot) -> bytes:
        raise ZeroDivisionError(latest.finished_at)

    state = ServiceState(latest=FULL_SNAPSHOT)
    with caplog.at_level(logging.ERROR, logger="crossover_monitor.http.page"):
        looked = page.SweepPicture(broken).look(state)
    assert looked.state is page.PictureState.FAILED
    (record,) = [r for r in caplog.records if r.getMessage() == "drawing the sweep's chart failed"]
    assert record.exc_info is not None
    rendered = page.render(Settings(), state, [], picture=looked.state, now=0.0, version="x")
    assert "The chart of this sweep could not be drawn; the service's log says why." in rendered
    assert "id='sweep'" not in rendered
    assert "http-equiv='refresh'" not in rendered


@pytest.mark.parametrize(
    ("looked", "status", "says"),
    [
        (page.Picture(page.PictureState.FAILED), 500, "could not be drawn"),
        (page.Picture(page.PictureState.NONE), 404, "no sweep has completed yet"),
        (page.Picture(page.PictureState.DRAWN, b"<svg/>"), 200, "<svg/>"),
    ],
)
def test_sweep_svg_answers_where_the_picture_stands(looked: page.Picture, status: int, says: str) -> None:
    """/sweep.svg answers by where the chart stands: the SVG, or a status that says why not."""
    server = started_server(ServiceState, backend="tensorflow", picture=lambda: looked)
    host, port = server.address
    try:
        answered, _, body = http_get(f"http://{host}:{port}/sweep.svg")
    finally:
        server.stop()
    assert answered == status
    assert says in body
