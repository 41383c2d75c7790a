"""Strings from a backend that are not text (a lone surrogate) or hold control characters: every endpoint, the chart
and the `history` command go on (issue 51, N4 and N8)."""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from crossover_monitor.cli.main import main
from crossover_monitor.codec import to_data
from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import DeviceInfo, ServiceState, SweepOutcome, SweepResult
from crossover_monitor.protocol import Environment, Plan, decode
from crossover_monitor.service.history import FILE_NAME, HistoryUnavailable, RunHistory, read_recent
from tests import builders
from tests.conftest import REPO
from tests.fakes import CPU, GPU, HOSTILE_TEXT, cpu_seconds, gpu_seconds
from tests.promql import promtool
from tests.service import RunningService, fake_config, find, parse, started_server

# HOSTILE_TEXT as the service keeps it: what is not a character is U+FFFD, a control character its escape.
CLEAN = "\ufffd \\x00\\x1b[2J\\x7f\\x85\\n\ufffd <&]]>-- $x^$"
# What no answer or output may hold: a control character but tab, newline and carriage return, or a non-character.
FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _history_command(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "history", "--directory", str(directory)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )


def _recorded(directory: Path) -> bool:
    try:
        return bool(read_recent(directory, 1))
    except HistoryUnavailable:
        return False


class _PageText(HTMLParser):
    """The text of a page, as a browser's parser reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _page_text(body: str) -> str:
    parser = _PageText()
    parser.feed(body)
    parser.close()
    return "".join(parser.parts)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningService, Path]]:
    """The real service, its backend naming its GPU and version with HOSTILE_TEXT, after its first sweep."""
    home = tmp_path_factory.mktemp("hostile")
    state = home / "state"
    service = RunningService(home, fake_config("hostile_names") + f"history: {{directory: {state}}}\n")
    try:
        service.wait_for(lambda: service.get("/-/ready")[0] == 200, 90, "the first sweep")
        service.wait_for(lambda: _recorded(state), 30, "the first sweep in the history")
        yield service, state
    finally:
        service.stop()


@pytest.mark.slow
def test_metrics_answer_and_parse_when_a_backend_sends_a_lone_surrogate(hostile: tuple[RunningService, Path]) -> None:
    """Issue 51 N4: a lone surrogate and control characters in a device's name and the framework version: /metrics
    answers 200, parses, passes promtool, and shows them as U+FFFD and escapes."""
    service, _ = hostile
    status, _, body = service.get("/metrics")
    assert status == 200, body
    samples = parse(body)
    (gpu,) = find(samples, "matmul_device_info", kind="gpu")
    assert dict(gpu)["name"] == f"Fake GPU{CLEAN}"
    assert dict(gpu)["device"] == f"/GPU:0{CLEAN}"
    (bench,) = find(samples, "matmul_benchmark_info")
    assert dict(bench)["framework_version"] == f"1.0{CLEAN}"
    assert not FORBIDDEN.search(body)
    result = promtool("check", "metrics", stdin=body)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_landing_page_answers_and_parses_when_a_backend_sends_a_lone_surrogate(
    hostile: tuple[RunningService, Path],
) -> None:
    """Issue 51 N4: with a lone surrogate and control characters in a device's name, / answers 200 and an HTML
    parser reads the name, replaced and escaped."""
    service, _ = hostile
    status, content_type, body = service.get("/")
    assert status == 200, body
    assert content_type == "text/html; charset=utf-8"
    assert f"/GPU:0{CLEAN} (Fake GPU{CLEAN})" in _page_text(body)
    assert not FORBIDDEN.search(body)


@pytest.mark.slow
def test_sweep_picture_is_well_formed_svg_when_a_backend_sends_control_characters(
    hostile: tuple[RunningService, Path],
) -> None:
    """Issue 51 N4 and N8: with a lone surrogate, a NUL and other control characters in a device's name,
    /sweep.svg answers 200 with XML that parses, the name in it as drawn text."""
    service, _ = hostile
    status, _, body = service.get("/sweep.svg")
    assert status == 200, body
    root = ET.fromstring(body.encode())  # noqa: S314 - the service's own chart
    assert f"Fake GPU{CLEAN}" in "".join(root.itertext())


@pytest.mark.slow
def test_history_command_lists_a_run_whose_device_name_held_a_lone_surrogate(
    hostile: tuple[RunningService, Path],
) -> None:
    """Issue 51 N4: `history` on the service's history, whose run names a device with a lone surrogate and control
    characters, exits 0 with no traceback and prints the name replaced and escaped."""
    _, state = hostile
    done = _history_command(state)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"/GPU:0{CLEAN} measured" in done.stdout
    assert not FORBIDDEN.search(done.stdout)


@pytest.mark.slow
def test_a_history_an_older_release_wrote_with_such_strings_is_listed_and_served(tmp_path: Path) -> None:
    """Issue 51 N4: a history an older release wrote, with a lone surrogate and control characters in a run's device
    and reason and in the served state: `history` exits 0 with no traceback, and the service restarted on it serves
    /metrics and / with them replaced and escaped."""
    state = tmp_path / "state"
    history = RunHistory.open(state, keep_runs=10)
    outcome = SweepOutcome(result=SweepResult.SUCCESS, started_at=1.0, finished_at=2.0, snapshot=builders.FULL_SNAPSHOT)
    served = ServiceState(latest=outcome.snapshot, last_success_at=2.0, last_outcome=outcome)
    assert history.record("sweep", outcome, served, "tests.fakes:slow")  # the backend it is served again with
    history.close()
    # As the older release stored them: JSON escapes in the JSON columns, the characters themselves in a text one.
    hostile_json = json.dumps("cuda:0\ud800\x00\x1b[2J")
    with sqlite3.connect(state / FILE_NAME) as db:
        db.execute("UPDATE runs SET devices = replace(devices, '\"cuda:0\"', ?)", (hostile_json,))
        db.execute("UPDATE runs SET reason = ?", ("worker said \x1b[2J\x00\x85 bye",))
        db.execute("UPDATE served SET state = replace(state, '\"cuda:0\"', ?)", (hostile_json,))
    db.close()
    done = _history_command(state)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "cuda:0\ufffd\\x00\\x1b[2J measured" in done.stdout
    assert "worker said \\x1b[2J\\x00\\x85 bye" in done.stdout
    assert not FORBIDDEN.search(done.stdout)
    # Every block takes a second: the sweep is still running while the restored state is served.
    service = RunningService(tmp_path, fake_config("slow") + f"history: {{directory: {state}}}\n")
    try:
        service.wait_for(lambda: service.get("/-/ready")[0] == 200, 30, "the restored state")
        status, _, body = service.get("/metrics")
        assert status == 200, body
        assert find(parse(body), "matmul_device_up", device="cuda:0\ufffd\\x00\\x1b[2J")
        assert not FORBIDDEN.search(body)
        status, _, page = service.get("/")
        assert status == 200, page
        assert "worker said \\x1b[2J\\x00\\x85 bye" in _page_text(page)
        assert not FORBIDDEN.search(page)
    finally:
        service.stop()


def test_worker_messages_are_read_as_printable_text_and_the_plan_as_written() -> None:
    """Issue 51 N4: the worker's JSON decodes a lone surrogate to U+FFFD and a control character to its escape, in
    values and keys, tab kept; the daemon's plan reaches the worker as written."""
    gpu = DeviceInfo(backend="fake", device=f"/GPU:0{HOSTILE_TEXT}", kind="gpu", name=f"a\tb{HOSTILE_TEXT}")
    assert decode(json.dumps({"type": "device", **to_data(gpu)})) == dataclasses.replace(
        gpu, device=f"/GPU:0{CLEAN}", name=f"a\tb{CLEAN}"
    )
    environment = {"type": "environment", "values": {f"key{HOSTILE_TEXT}": f"1.0{HOSTILE_TEXT}"}}
    assert decode(json.dumps(environment)) == Environment({f"key{CLEAN}": f"1.0{CLEAN}"})
    plan = Plan(bench=BenchmarkSettings(backend="tests.fakes:curve", devices=("/CPU:0", "/GPU:0\x01")))
    assert Plan.from_json(plan.to_json()) == plan


def test_chart_of_device_names_with_control_characters_is_well_formed_svg(tmp_path: Path) -> None:
    """Issue 51 N8: `plot --from-url` of a service whose device names hold a NUL, an escape, DEL, a C1 control and a
    non-character (text no codec read) writes SVG an XML parser reads, the names in it escaped."""
    odd = "\x00\x1b[2J\x7f\x85\x0b\ufffe <&]]>--"
    gpu = dataclasses.replace(GPU, device="/GPU:0\x00", name=f"Fake GPU{odd}")
    measurements = [
        builders.measurement(
            device.device, size, cpu_seconds(size) if device is CPU else gpu_seconds(size, mode), mode=mode
        )
        for mode in ("compute", "end_to_end")
        for size in (16, 32, 64, 128)
        for device in (CPU, gpu)
    ]
    snapshot = builders.snapshot((CPU, gpu), measurements)
    assert snapshot.crossovers  # the chart marks them, named by the GPU
    server = started_server(lambda: ServiceState(latest=snapshot, last_success_at=snapshot.finished_at), backend="fake")
    try:
        host, port = server.address
        chart = tmp_path / "chart.svg"
        assert main(["plot", "--from-url", f"http://{host}:{port}/metrics", str(chart)]) == 0
    finally:
        server.stop()
    root = ET.fromstring(chart.read_bytes())  # noqa: S314 - a chart of our own
    drawn = "".join(root.itertext())
    assert "/GPU:0\\x00 (Fake GPU\\x00\\x1b[2J\\x7f\\x85\\x0b\ufffd <&]]>--) compute" in drawn
