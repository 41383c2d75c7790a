"""The landing page: rendered by a real headless Chromium from the running service, and escaped."""

from __future__ import annotations

import dataclasses
import html.parser
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from crossover_monitor import page
from crossover_monitor.history import Run
from crossover_monitor.model import (
    GPU_PROBLEM,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.settings import Settings
from tests import builders
from tests.browser import browse
from tests.builders import FULL_SNAPSHOT
from tests.service import RunningService, fake_config, http_get, started_server, wait_until

NO_PLOT = page.PictureState.UNAVAILABLE  # what the page shows without the plot extra
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


@pytest.mark.slow
def test_chromium_shows_settings_crossovers_runs_and_the_picture(tmp_path: Path) -> None:
    """In a real Chromium the page shows the settings, the crossovers, the runs and the drawn chart."""
    config = fake_config() + f"history: {{directory: {tmp_path / 'state'}}}\n"
    service = RunningService(tmp_path, config)
    try:
        service.wait_for_sweeps("success")
        # The chart is drawn off the handler threads: the first ask starts it, and it takes a few seconds.
        wait_until(lambda: service.get("/sweep.svg")[0] == 200, 90, "the sweep's chart")
        dom = Elements()
        dom.feed(browse(service.url + "/", tmp_path / "profile"))
    finally:
        service.stop()
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
    # The browser fetched the chart and could draw it (the image's onload ran, not its onerror).
    assert dom.by_id["sweep"].get("data-shown") == "yes", dom.by_id["sweep"]


def test_values_are_escaped_and_a_missing_plot_extra_is_named() -> None:
    """Served values are HTML-escaped; without the plot extra the page says what to install."""
    hostile = Withheld(
        backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="<script>alert(1)</script>"
    )
    state = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, withheld=(hostile,)))
    rendered = page.render(Settings(), state, [], picture=NO_PLOT, now=0.0, version="x")
    assert "<script>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert "pip install 'crossover-monitor[plot]'" in rendered
    assert "None yet." in rendered  # an empty history


def test_the_reason_for_no_gpu_is_shown_and_escaped() -> None:
    """Where the backend found no GPU, the page says why under the crossovers (escaped), and also without any."""
    reason = "CUDA_VISIBLE_DEVICES='<-1>' hides every GPU from this process: unset it"
    latest = dataclasses.replace(FULL_SNAPSHOT, environment=(*FULL_SNAPSHOT.environment, (GPU_PROBLEM, reason)))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=NO_PLOT, now=0.0, version="x")
    assert "<p id='no-gpu'>No GPU: CUDA_VISIBLE_DEVICES=&#x27;&lt;-1&gt;&#x27; hides every GPU" in rendered
    assert rendered.index("id='crossovers'") < rendered.index("id='no-gpu'")
    alone = dataclasses.replace(latest, crossovers=())
    alone_page = page.render(Settings(), ServiceState(latest=alone), [], picture=NO_PLOT, now=0.0, version="x")
    assert "id='no-gpu'" in alone_page
    assert "id='no-gpu'" not in page.render(
        Settings(), ServiceState(latest=FULL_SNAPSHOT), [], picture=NO_PLOT, now=0.0, version="x"
    )


def test_every_withheld_device_is_named_with_its_reason_also_where_no_crossover_could_be_compared() -> None:
    """A sweep that measured nothing (the CPU alone, withheld) says on the page what it withheld and why."""
    contended = Withheld(
        backend="fake", device="/CPU:0", reason=WithheldReason.CPU_CONTENDED, detail="other processes used <1.2> cores"
    )
    latest = dataclasses.replace(FULL_SNAPSHOT, crossovers=(), measurements=(), withheld=(contended,))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=NO_PLOT, now=0.0, version="x")
    assert "<p>None yet.</p>" in rendered
    assert "<p class='withheld'>/CPU:0 withheld (cpu_contended): other processes used &lt;1.2&gt; cores</p>" in rendered
    point = builders.point_key("/GPU:0", 64, backend="fake")
    slowed = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.HOST_SLOWED, detail="1.4x", point=point)
    latest = dataclasses.replace(FULL_SNAPSHOT, withheld=(slowed,))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=NO_PLOT, now=0.0, version="x")
    assert "<p class='withheld'>/GPU:0 64x64 float32 compute withheld (host_slowed): 1.4x</p>" in rendered


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
    alone.feed(page.render(Settings(), ServiceState(last_outcome=outcome), None, picture=NO_PLOT, now=0.0, version="x"))
    assert alone.tables["runs"][1][2:] == ["sweep", "timeout", "deadline passed"]
    # A history another process holds locked: the page says so and shows the latest outcome, it does not wait.
    busy = page.render(
        Settings(),
        ServiceState(last_outcome=outcome),
        None,
        picture=NO_PLOT,
        now=0.0,
        version="x",
        history_problem="/var/lib/h.sqlite3 is busy (database is locked)",
    )
    assert "The run history cannot be read just now: /var/lib/h.sqlite3 is busy (database is locked)." in busy
    assert "set history.directory" not in busy
    # A row whose times could not be read shows them as unknown.
    unreadable = dataclasses.replace(run, started_at=None, finished_at=None, reason="this row cannot be read (…)")
    odd = Elements()
    odd.feed(page.render(Settings(), ServiceState(), [unreadable], picture=NO_PLOT, now=0.0, version="x"))
    assert odd.tables["runs"][1][:2] == ["–", "?"]


def _drawn(picture: page.SweepPicture, state: ServiceState) -> page.Picture:
    looked = picture.look(state)
    deadline = time.monotonic() + 120
    while looked.state is page.PictureState.DRAWING and time.monotonic() < deadline:
        time.sleep(0.05)
        looked = picture.look(state)
    return looked


@pytest.mark.skipif(not page.plot_available(), reason="needs the plot extra (matplotlib)")
def test_the_picture_is_drawn_once_per_sweep_in_a_child_process() -> None:
    """The chart is drawn once per sweep, in a child process: matplotlib stays out of the daemon."""
    picture = page.SweepPicture()
    state = ServiceState(latest=FULL_SNAPSHOT)
    drawn = _drawn(picture, state)
    assert drawn.state is page.PictureState.DRAWN
    assert drawn.svg is not None
    assert b"<svg" in drawn.svg
    assert picture.look(state).svg is drawn.svg  # the same sweep: kept, not drawn again
    assert picture.look(ServiceState()).state is page.PictureState.NONE  # no sweep, no picture
    # Drawing it leaves matplotlib out of the process that asked (the daemon).
    probe = (
        "import sys; from crossover_monitor import page; from crossover_monitor.model import ServiceState; "
        "from tests.builders import FULL_SNAPSHOT; from tests.test_page import _drawn; "
        "assert _drawn(page.SweepPicture(), ServiceState(latest=FULL_SNAPSHOT)).svg; "
        "print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


class _HeldDrawing:
    """A drawing that takes as long as the test says (fault injection: a slow or failing chart)."""

    def __init__(self, result: bytes | None = b"<svg/>") -> None:
        self.release = threading.Event()
        self.drew: list[float] = []
        self.result = result

    def __call__(self, latest: Snapshot) -> bytes | None:
        self.drew.append(latest.finished_at)
        assert self.release.wait(30)
        return self.result


@pytest.mark.skipif(not page.plot_available(), reason="needs the plot extra (matplotlib)")
def test_asking_for_the_picture_never_waits_for_the_drawing_and_draws_each_sweep_once() -> None:
    """Asking for the chart never waits for the drawing, and each sweep is drawn once however often asked."""
    drawing = _HeldDrawing()
    picture = page.SweepPicture(drawing)
    state = ServiceState(latest=FULL_SNAPSHOT)
    asked = time.monotonic()
    assert [picture.look(state).state for _ in range(3)] == [page.PictureState.DRAWING] * 3
    assert time.monotonic() - asked < 5  # the drawing is held for up to 30 s
    drawing.release.set()
    assert _drawn(picture, state) == page.Picture(page.PictureState.DRAWN, b"<svg/>")
    newer = ServiceState(latest=dataclasses.replace(FULL_SNAPSHOT, finished_at=FULL_SNAPSHOT.finished_at + 900))
    assert _drawn(picture, newer).state is page.PictureState.DRAWN
    assert drawing.drew == [FULL_SNAPSHOT.finished_at, FULL_SNAPSHOT.finished_at + 900]  # once each


@pytest.mark.skipif(not page.plot_available(), reason="needs the plot extra (matplotlib)")
def test_a_retry_laid_over_the_sweep_is_drawn_anew_though_the_sweep_end_is_the_same() -> None:
    """A retry's timings change what is served but not the sweep's end time: the chart follows what is served."""
    drawing = _HeldDrawing()
    drawing.release.set()
    picture = page.SweepPicture(drawing)
    assert _drawn(picture, ServiceState(latest=FULL_SNAPSHOT)).state is page.PictureState.DRAWN
    retried = dataclasses.replace(FULL_SNAPSHOT, withheld=())
    assert retried.finished_at == FULL_SNAPSHOT.finished_at
    assert _drawn(picture, ServiceState(latest=retried)).state is page.PictureState.DRAWN
    assert drawing.drew == [FULL_SNAPSHOT.finished_at] * 2


@pytest.mark.skipif(not page.plot_available(), reason="needs the plot extra (matplotlib)")
def test_a_chart_that_cannot_be_drawn_is_said_and_not_tried_again_for_that_sweep() -> None:
    """A chart that cannot be drawn is reported as failed and not tried again for the same sweep."""
    drawing = _HeldDrawing(result=None)
    drawing.release.set()
    picture = page.SweepPicture(drawing)
    state = ServiceState(latest=FULL_SNAPSHOT)
    assert _drawn(picture, state).state is page.PictureState.FAILED
    assert picture.look(state).state is page.PictureState.FAILED
    assert drawing.drew == [FULL_SNAPSHOT.finished_at]


def test_the_page_reloads_itself_while_the_chart_is_drawn_and_says_so() -> None:
    """While the chart is drawn the page says so and reloads itself; once drawn or failed it does not."""
    state = ServiceState(latest=FULL_SNAPSHOT)
    drawing = page.render(Settings(), state, [], picture=page.PictureState.DRAWING, now=0.0, version="x")
    assert "<meta http-equiv='refresh'" in drawing
    assert "id='drawing'" in drawing
    assert "id='sweep'" not in drawing
    drawn = page.render(Settings(), state, [], picture=page.PictureState.DRAWN, now=0.0, version="x")
    assert "http-equiv='refresh'" not in drawn
    failed = page.render(Settings(), state, [], picture=page.PictureState.FAILED, now=0.0, version="x")
    assert "could not be drawn" in failed


@pytest.mark.parametrize(
    ("looked", "status", "says"),
    [
        (page.Picture(page.PictureState.DRAWING), 503, "being drawn"),
        (page.Picture(page.PictureState.FAILED), 500, "could not be drawn"),
        (page.Picture(page.PictureState.NONE), 404, "no sweep has completed yet"),
        (page.Picture(page.PictureState.UNAVAILABLE), 404, "plot extra is not installed"),
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
