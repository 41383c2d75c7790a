"""SIGHUP rereads the configuration: a valid one takes effect at once, twenty bad ones in a row change nothing."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service import RunningService, Samples, fake_config

pytestmark = pytest.mark.slow

LOADED: tuple[str, frozenset[tuple[str, str]]] = ("matmul_config_last_reload_successful", frozenset())


def _sizes(samples: Samples) -> set[str]:
    return {dict(labels)["size"] for name, labels in samples if name == "matmul_duration_seconds"}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[RunningService]:
    running = RunningService(tmp_path, fake_config())
    try:
        running.wait_for_sweeps("success", 1)
        yield running
    finally:
        running.stop()


def _reload(service: RunningService, config: str, reloads: int) -> Samples:
    service.config.write_text(config)
    service.process.send_signal(signal.SIGHUP)

    def done() -> int:
        logs = service.logs()
        return logs.count("crossover_monitor.service.daemon: configuration reloaded") + logs.count(
            "crossover_monitor.service.daemon: reload refused"
        )

    service.wait_for(lambda: done() >= reloads, 10, f"reload {reloads} to be logged")
    return service.scrape()


def test_a_valid_reload_takes_effect_and_removed_sizes_disappear(service: RunningService) -> None:
    """Fewer sizes: their series go at once, the next sweep times only the new ones, the reload metric says 1."""
    assert _sizes(service.scrape()) == {"16", "32", "64", "128"}
    before = service.scrape()[("matmul_config_last_reload_success_timestamp_seconds", frozenset())]
    samples = _reload(service, fake_config().replace("[16, 32, 64, 128]", "[16, 32]"), 1)
    assert "configuration reloaded" in service.logs()
    assert "changed=benchmark.sizes" in service.logs()  # what a reload changed is said
    assert samples[LOADED] == 1
    assert samples[("matmul_config_last_reload_success_timestamp_seconds", frozenset())] > before
    assert _sizes(samples) == {"16", "32"}
    service.process.send_signal(signal.SIGUSR1)  # a sweep now, on the new plan
    samples = service.wait_for_sweeps("success", 2, timeout=30)
    assert _sizes(samples) == {"16", "32"}


def test_a_reload_that_drops_a_mode_or_a_dtype_removes_their_series_at_once(tmp_path: Path) -> None:
    """Issue 34 #9: sizes were trimmed at once, but a dropped mode or dtype went on being served (and its
    alerts firing on stale series) until the next successful sweep."""
    two = fake_config().replace(
        "benchmark:\n", "benchmark:\n  modes: [compute, end_to_end]\n  dtypes: [float32, float64]\n"
    )
    running = RunningService(tmp_path, two)
    try:
        running.wait_for_sweeps("success", 1)

        def served(samples: Samples, label: str) -> set[str]:
            return {
                dict(labels)[label] for name, labels in samples if name in SERIES_BY_POINT and label in dict(labels)
            }

        before = running.scrape()
        assert served(before, "mode") == {"compute", "end_to_end"}
        assert served(before, "dtype") == {"float32", "float64"}
        one = two.replace("modes: [compute, end_to_end]", "modes: [compute]").replace(
            "dtypes: [float32, float64]", "dtypes: [float32]"
        )
        samples = _reload(running, one, 1)
        assert samples[LOADED] == 1
        assert served(samples, "mode") == {"compute"}
        assert served(samples, "dtype") == {"float32"}
    finally:
        running.stop()


SERIES_BY_POINT = ("matmul_duration_seconds", "matmul_crossover_size", "matmul_fixed_cost_seconds")


def test_a_reload_of_a_file_that_shrank_to_nothing_is_refused(service: RunningService) -> None:
    """Issue 34: a SIGHUP racing a writer that truncates then writes (not atomically) found an empty file,
    which is valid, and silently swapped the running settings for the defaults. Now it is refused, saying why."""
    served = _sizes(service.scrape())
    samples = _reload(service, "", 1)
    assert samples[LOADED] == 0
    assert _sizes(samples) == served
    assert "the file is empty (a writer that has not finished, or a truncated file?)" in service.logs()
    samples = _reload(service, "{}\n", 2)  # the defaults, asked for
    assert samples[LOADED] == 1


def test_twenty_bad_reloads_change_nothing_then_a_good_one_takes(service: RunningService) -> None:
    """Each bad file is refused with its problems logged; the old configuration serves throughout."""
    served = _sizes(service.scrape())
    for attempt in range(1, 21):
        samples = _reload(service, f"benchmark: {{sizes: [{-attempt}]}}\n", attempt)
        assert samples[LOADED] == 0
        assert _sizes(samples) == served
        assert service.process.poll() is None
    assert service.logs().count("reload refused") == 20
    assert "benchmark.sizes[0]" in service.logs()
    samples = _reload(service, fake_config(), 21)
    assert samples[LOADED] == 1
    assert _sizes(samples) == served


@pytest.mark.parametrize("burst", [signal.SIGHUP, signal.SIGUSR1])
def test_a_burst_of_signals_is_coalesced_and_sigterm_still_stops_it(service: RunningService, burst: int) -> None:
    """Issue 18 #1: bursts of 2,000 SIGHUPs in a tight loop (here: for 3 s) deadlocked the main thread (a
    handler's Event.set() re-entered while the call it interrupted held the lock), or, nested, ended it
    with a RecursionError: no later reload, SIGTERM ignored. Now handlers only queue; the loop acts once."""
    storm = (
        "import os, sys, time\n"
        "pid, sig, end = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + 3\n"
        "sent = 0\n"
        "while time.monotonic() < end:\n"
        "    for _ in range(2000):\n"
        "        os.kill(pid, sig)\n"
        "    sent += 2000\n"
        "print(sent)\n"
    )
    sender = subprocess.run(
        [sys.executable, "-c", storm, str(service.process.pid), str(int(burst))],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert int(sender.stdout) >= 2000
    time.sleep(2)  # the storm's own reloads or sweeps (coalesced, each logged) are done
    done = service.logs().count("crossover_monitor.service.daemon: configuration reloaded")
    samples = _reload(service, fake_config().replace("[16, 32, 64, 128]", "[16, 32]"), done + 1)
    assert _sizes(samples) == {"16", "32"}
    assert service.get("/healthz")[0] == 200
    began = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    service.process.wait(timeout=10)
    assert time.monotonic() - began < 10
    assert "crossover_monitor.service.daemon: stopping" in service.logs()


def test_sigterm_in_a_sighup_storm_exits_0(service: RunningService) -> None:
    """Issue 34 #12: SIGTERM while SIGHUPs keep coming stopped the service, then a SIGHUP arriving after the
    default handler was put back killed it (status -1): the exit read as a crash. Now it exits 0."""
    storm = (
        "import os, sys, time\n"
        "pid, end = int(sys.argv[1]), time.monotonic() + 4\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        "        os.kill(pid, 1)\n"
        "    except ProcessLookupError:\n"
        "        break\n"
    )
    sender = subprocess.Popen([sys.executable, "-c", storm, str(service.process.pid)])
    try:
        time.sleep(1)
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(timeout=15) == 0
    finally:
        sender.wait(timeout=15)
    assert "crossover_monitor.service.daemon: stopped" in service.logs()


def test_simultaneous_sweep_requests_get_one_yes_per_sweep(tmp_path: Path) -> None:
    """Issue 18 #8: eight POST /-/sweep at once while idle got two 202s for one sweep."""
    running = RunningService(tmp_path, fake_config(), extra=("--web.enable-lifecycle",))
    try:
        running.wait_for_sweeps("success", 1)
        barrier = threading.Barrier(8)

        def post() -> int:
            barrier.wait()
            request = urllib.request.Request(running.url + "/-/sweep", method="POST")  # noqa: S310 - loopback
            try:
                with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = sorted(pool.map(lambda _: post(), range(8)))
        assert answers.count(202) == 1, answers
        assert set(answers) == {202, 409}
        samples = running.wait_for_sweeps("success", 2, timeout=30)
        time.sleep(2)  # a second sweep, if one were started, would be counted by now (the fake curve is fast)
        assert running.scrape()[("matmul_sweeps_total", frozenset({("result", "success")}))] == 2, samples
    finally:
        running.stop()
