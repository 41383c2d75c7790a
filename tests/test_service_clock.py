"""The real service when its wall clock steps (NTP, a host's resume) and when sweeps come due faster than they end.

The wall clock is stepped under the running service with libfaketime (Debian's ``faketime`` package), which
leaves the monotonic clock alone; the tests skip, saying so, where it is not installed.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crossover_monitor.service.history import read_recent
from crossover_monitor.text import utc_text
from tests.service import RunningService, Samples, fake_config

pytestmark = pytest.mark.slow

NEXT: tuple[str, frozenset[tuple[str, str]]] = ("matmul_sweep_next_timestamp_seconds", frozenset())
DURATION: tuple[str, frozenset[tuple[str, str]]] = ("matmul_sweep_duration_seconds", frozenset())
SKIPPED = ("matmul_sweeps_total", frozenset({("result", "skipped")}))
LIBFAKETIME = "faketime/libfaketime.so.1"
# libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC fails Python 3.11's time.sleep with EINVAL (wolfcw/libfaketime
# issue 426), which subprocess's wait with a timeout uses: the service sleeps on a monotonic wait instead. Its workers
# run on the real clock: they time points, the daemon schedules and records.
SHIM = """
import os, threading, time
os.environ.pop("LD_PRELOAD", None)
time.sleep = lambda seconds: threading.Event().wait(seconds) and None
"""


def slow_cpu_config(interval: str, history: Path) -> str:
    """The fake backend whose every block takes a second, on the CPU alone: a sweep of about 12 s."""
    config = fake_config("slow", interval=interval, timeout="60s")
    one_point = "sizes: [16]\n  modes: [compute]\n  devices: ['/CPU:0']"
    return config.replace("sizes: [16, 32, 64, 128]", one_point) + f"history: {{directory: {history}}}\n"


def ended(samples: Samples) -> float:
    """How many sweeps ended, whatever their result (skipped ones did not run)."""
    return sum(v for (name, labels), v in samples.items() if name == "matmul_sweeps_total" and SKIPPED[1] != labels)


def wall_clock(tmp_path: Path) -> tuple[dict[str, str], Callable[[int], None]]:
    """The environment that puts the service on a wall clock the test steps, and the function that steps it (by
    whole seconds from the real time: the monotonic clock is left as it is)."""
    found = sorted([*Path("/usr/lib").glob(f"*/{LIBFAKETIME}"), *Path("/usr/lib").glob(LIBFAKETIME)])
    if not found:
        pytest.skip("libfaketime is not installed (Debian's faketime package): the wall clock cannot be stepped")
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    env = {
        "LD_PRELOAD": str(found[0]),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",  # read the file at every call: a step takes effect at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(shim),
    }

    def step(seconds: int) -> None:
        offset.write_text(f"{seconds:+d}\n")

    return env, step


@contextlib.contextmanager
def notify_socket(path: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's notify socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        sock.setblocking(False)
        yield sock
    finally:
        sock.close()


def received(sock: socket.socket) -> list[str]:
    """The notifications that came since the last call."""
    messages = []
    with contextlib.suppress(BlockingIOError):
        while True:
            messages.append(sock.recv(4096).decode())
    return messages


def test_a_wall_clock_step_forward_stops_neither_health_nor_the_watchdog(tmp_path: Path) -> None:
    """Issue 51 N3: the real service's wall clock a day ahead, the monotonic clock not: /-/healthy stays 200, the
    watchdog pings go on, and matmul_sweep_next_timestamp_seconds and the page's next run move a day on."""
    env, step = wall_clock(tmp_path)
    with notify_socket(tmp_path / "notify") as notify:
        watchdog = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "2000000"}  # a ping a second
        service = RunningService(tmp_path, fake_config(interval="1h"), env={**env, **watchdog})
        try:
            before = service.wait_for_sweeps("success")[NEXT]
            step(86400)
            time.sleep(3)
            received(notify)
            time.sleep(4)
            status, _, body = service.get("/-/healthy")
            assert status == 200, body
            assert received(notify).count("WATCHDOG=1") >= 2
            assert service.scrape()[NEXT] == pytest.approx(before + 86400, abs=5)
            _, _, page = service.get("/")
            assert utc_text(before + 86400)[:13] in page  # the day and hour
        finally:
            service.stop()


def test_a_wall_clock_step_back_delays_no_sweep(tmp_path: Path) -> None:
    """Issue 51 N6: the real service's wall clock an hour back between two sweeps 10 s apart: the next sweep comes
    on time, not an hour later."""
    env, step = wall_clock(tmp_path)
    service = RunningService(tmp_path, fake_config(interval="10s"), env=env)
    try:
        service.wait_for_sweeps("success")
        step(-3600)
        service.wait_for_sweeps("success", 2, timeout=40)
    finally:
        service.stop()


def test_a_wall_clock_step_back_during_a_sweep_leaves_its_duration_true(tmp_path: Path) -> None:
    """Issue 51 N6: the real service's wall clock an hour back during a sweep of about 12 s: its duration in the
    metric, the log, the history and the page is that, not -3588 s."""
    env, step = wall_clock(tmp_path)
    state = tmp_path / "state"
    service = RunningService(tmp_path, slow_cpu_config("1h", state), env=env)
    try:
        service.wait_for(lambda: "sweep started" in service.logs(), 30, "the sweep to start")
        time.sleep(1)
        step(-3600)
        service.wait_for(lambda: ended(service.scrape()) >= 1, 60, "the sweep to end")
        samples = service.scrape()
        _, _, page = service.get("/")
        logs = service.logs()
    finally:
        service.stop()
    assert 5 < samples[DURATION] < 60
    (logged,) = re.findall(r"sweep finished .*duration_s=(-?[\d.]+)", logs)
    assert 5 < float(logged) < 60
    (run,) = read_recent(state, 10)
    assert run.started_at is not None
    assert run.finished_at is not None
    assert 5 < run.finished_at - run.started_at < 60
    assert f"<td>{run.finished_at - run.started_at:.1f} s</td>" in page


def test_a_burst_of_skipped_sweeps_is_one_history_row_and_one_log_line_and_its_count_survives_a_restart(
    tmp_path: Path,
) -> None:
    """Issue 51 N9: at a 1 s interval with sweeps of about 12 s, the runs skipped while one runs are one history
    row with their count (no write of the served state each) and one log line; the restarted service serves the
    skipped count the first one had."""
    state = tmp_path / "state"
    first = tmp_path / "first"
    first.mkdir()
    service = RunningService(first, slow_cpu_config("1s", state))
    try:
        service.wait_for(lambda: ended(service.scrape()) >= 1, 60, "the first sweep to end")
        service.wait_for(lambda: any(r.kind == "skipped" for r in read_recent(state, 100)), 10, "the skips' row")
        time.sleep(3)  # a few skips into the second sweep
    finally:
        service.stop()  # writes the second sweep's skips
    logs = service.log.read_text()
    runs = read_recent(state, 1000)
    skips = [r for r in runs if r.kind == "skipped"]
    counts = [
        int(m.group(1)) if (m := re.search(r"\((\d+) scheduled sweeps skipped\)", r.reason)) else 1 for r in skips
    ]
    assert len(skips) == 2, [r.reason for r in skips]  # the first sweep's burst, and the second's as it stopped
    assert counts[1] >= 8, counts  # newest first: the first sweep's, of about 11
    assert logs.count("sweep skipped") == len(skips), logs
    assert "maximum number of running instances" not in logs
    second = tmp_path / "second"
    second.mkdir()
    restarted = RunningService(second, slow_cpu_config("1h", state))
    try:
        restarted.wait_for(lambda: SKIPPED in restarted.scrape(), 30, "the restarted service to serve")
        assert restarted.scrape()[SKIPPED] == sum(counts)
    finally:
        restarted.stop()
