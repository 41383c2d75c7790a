"""The landing page: rendered by a real headless Chromium from the running service, and escaped."""

from __future__ import annotations

import dataclasses
import html.parser
import subprocess
import sys
from pathlib import Path

import pytest

from monitor import page
from monitor.history import Run
from monitor.model import GPU_PROBLEM, ServiceState, SweepOutcome, SweepResult, Withheld, WithheldReason
from monitor.settings import Settings
from tests.conftest import tool
from tests.service import RunningService, fake_config
from tests.test_codec import SNAPSHOT


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


def browse(url: str, profile: Path) -> str:
    """The DOM after Chromium loaded ``url`` and its picture (and ran the page's handlers)."""
    done = subprocess.run(
        [
            tool("chromium", "chromium"),
            "--headless",
            "--no-sandbox",  # as root in CI
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",  # the machine has no network: no stray connections
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@pytest.mark.slow
def test_chromium_shows_settings_crossovers_runs_and_the_picture(tmp_path: Path) -> None:
    config = fake_config() + f"history: {{directory: {tmp_path / 'state'}}}\n"
    service = RunningService(tmp_path, config)
    try:
        service.wait_for_sweeps("success")
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
    hostile = Withheld(
        backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="<script>alert(1)</script>"
    )
    state = ServiceState(latest=dataclasses.replace(SNAPSHOT, withheld=(hostile,)))
    rendered = page.render(Settings(), state, [], picture=False, now=0.0, version="x")
    assert "<script>" not in rendered
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert "pip install 'crossover-monitor[plot]'" in rendered
    assert "None yet." in rendered  # an empty history


def test_the_reason_for_no_gpu_is_shown_and_escaped() -> None:
    """Where the backend found no GPU, the page says why under the crossovers (escaped), and also without any."""
    reason = "CUDA_VISIBLE_DEVICES='<-1>' hides every GPU from this process: unset it"
    latest = dataclasses.replace(SNAPSHOT, environment=(*SNAPSHOT.environment, (GPU_PROBLEM, reason)))
    rendered = page.render(Settings(), ServiceState(latest=latest), [], picture=False, now=0.0, version="x")
    assert "<p id='no-gpu'>No GPU: CUDA_VISIBLE_DEVICES=&#x27;&lt;-1&gt;&#x27; hides every GPU" in rendered
    assert rendered.index("id='crossovers'") < rendered.index("id='no-gpu'")
    alone = dataclasses.replace(latest, crossovers=())
    assert "id='no-gpu'" in page.render(Settings(), ServiceState(latest=alone), [], picture=False, now=0.0, version="x")
    assert "id='no-gpu'" not in page.render(
        Settings(), ServiceState(latest=SNAPSHOT), [], picture=False, now=0.0, version="x"
    )


def test_runs_from_the_history_or_the_latest_outcome_alone() -> None:
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
    parsed.feed(page.render(Settings(), ServiceState(latest=SNAPSHOT), [run], picture=True, now=0.0, version="x"))
    assert parsed.tables["runs"][1] == ["1970-01-01 00:00:10 UTC", "4.5 s", "retry", "failed", run.reason]
    assert parsed.by_id["sweep"]["src"] == "/sweep.svg"
    outcome = SweepOutcome(result=SweepResult.TIMEOUT, started_at=1.0, finished_at=601.0, reason="deadline passed")
    alone = Elements()
    alone.feed(page.render(Settings(), ServiceState(last_outcome=outcome), None, picture=False, now=0.0, version="x"))
    assert alone.tables["runs"][1][2:] == ["sweep", "timeout", "deadline passed"]


@pytest.mark.skipif(not page.plot_available(), reason="needs the plot extra (matplotlib)")
def test_the_picture_is_drawn_once_per_sweep_in_a_child_process() -> None:
    picture = page.SweepPicture()
    state = ServiceState(latest=SNAPSHOT)
    drawn = picture.svg(state)
    assert drawn is not None
    assert b"<svg" in drawn
    assert picture.svg(state) is drawn  # the same sweep: kept, not drawn again
    assert picture.svg(ServiceState()) is None  # no sweep, no picture
    # Drawing it leaves matplotlib out of the process that asked (the daemon).
    probe = (
        "import sys; from monitor.page import SweepPicture; from monitor.model import ServiceState; "
        "from tests.test_codec import SNAPSHOT; assert SweepPicture().svg(ServiceState(latest=SNAPSHOT)); "
        "print('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"
