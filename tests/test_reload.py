"""SIGHUP rereads the configuration: a valid one takes effect at once, twenty bad ones in a row change nothing."""

from __future__ import annotations

import signal
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
        return logs.count("monitor.daemon: configuration reloaded") + logs.count("monitor.daemon: reload refused")

    service.wait_for(lambda: done() >= reloads, 10, f"reload {reloads} to be logged")
    return service.scrape()


def test_a_valid_reload_takes_effect_and_removed_sizes_disappear(service: RunningService) -> None:
    """Fewer sizes: their series go at once, the next sweep times only the new ones, the reload metric says 1."""
    assert _sizes(service.scrape()) == {"16", "32", "64", "128"}
    before = service.scrape()[("matmul_config_last_reload_success_timestamp_seconds", frozenset())]
    samples = _reload(service, fake_config().replace("[16, 32, 64, 128]", "[16, 32]"), 1)
    assert "configuration reloaded" in service.logs()
    assert samples[LOADED] == 1
    assert samples[("matmul_config_last_reload_success_timestamp_seconds", frozenset())] > before
    assert _sizes(samples) == {"16", "32"}
    service.process.send_signal(signal.SIGUSR1)  # a sweep now, on the new plan
    samples = service.wait_for_sweeps("success", 2, timeout=30)
    assert _sizes(samples) == {"16", "32"}


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
