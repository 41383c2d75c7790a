"""Service.reload in-process: what a valid, an invalid and a listen-changing configuration do to the state."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import pytest

from crossover_monitor.config.settings import BenchmarkSettings, ServerSettings, Settings
from crossover_monitor.errors import ConfigError, Problem
from crossover_monitor.service.daemon import Service
from tests.conftest import free_port
from tests.guardfakes import IDLE, FakeSampler, ThreadWorker, fake_guard
from tests.service import http_get, parse, wait_until


def _service(loads: list[object]) -> Service:
    """A service (not started) whose configuration loader hands out ``loads`` in turn (raising errors)."""

    def load() -> Settings:
        value = loads.pop(0)
        if isinstance(value, Exception):
            raise value
        assert isinstance(value, Settings)
        return value

    settings = Settings(server=ServerSettings(address=("127.0.0.1", free_port())))
    return Service(settings, load=load)


def test_reload_takes_a_valid_configuration_and_refuses_an_invalid_one() -> None:
    """Valid: applied and counted as loaded. Invalid: refused, the running settings kept, loaded says 0."""
    current = Settings(server=ServerSettings(address=("127.0.0.1", free_port())))
    fewer = dataclasses.replace(current, benchmark=BenchmarkSettings(sizes=(8, 64)))
    bad = ConfigError("config.yaml", [Problem("benchmark.sizes[0]", "must be a positive integer matrix size")])
    service = _service([fewer, bad])
    try:
        assert service.read_state().config_loaded is True
        assert service.reload() is True
        assert service.read_state().config_loaded is True
        assert service.reload() is False
        state = service.read_state()
        assert state.config_loaded is False
        assert state.config_loaded_at is not None
        assert service.settings.benchmark.sizes == (8, 64)  # the last good one still runs
    finally:
        service.stop()


def test_reload_keeps_the_listen_address_until_a_restart() -> None:
    """A new server.listen is not applied (the socket is bound): the rest of the file is."""
    moved = Settings(server=ServerSettings(address=("127.0.0.1", 1)), benchmark=BenchmarkSettings(sizes=(8,)))
    service = _service([moved])
    try:
        before = service.settings.server
        assert service.reload() is True
        assert service.settings.server == before
        assert service.settings.benchmark.sizes == (8,)
    finally:
        service.stop()


def test_reload_keeps_the_backend_until_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    """/metrics names the backend read at start: a new benchmark.backend waits for a restart, the rest applies."""
    other = Settings(benchmark=BenchmarkSettings(backend="tests.fakes:curve", sizes=(8,)))
    service = _service([other])
    try:
        before = service.settings.benchmark.backend
        assert before != other.benchmark.backend
        with caplog.at_level(logging.WARNING):
            assert service.reload() is True
        assert service.settings.benchmark.backend == before
        assert service.settings.benchmark.sizes == (8,)
        assert "benchmark.backend changes take effect at the next restart" in caplog.text
    finally:
        service.stop()


def test_without_a_loader_reload_is_ignored() -> None:
    """A service built without a configuration source says so and changes nothing."""
    service = Service(Settings(server=ServerSettings(address=("127.0.0.1", free_port()))))
    try:
        assert service.reload() is False
    finally:
        service.stop()


def test_sweep_requests_before_the_sweep_begins_get_one_yes() -> None:
    """Issue 18 #8: requests that came before the accepted sweep had begun were each told "sweep started"."""
    service = _service([])  # not started: the accepted sweep waits in the scheduler, as for a moment it does
    try:
        answers = [service.request_sweep()[0] for _ in range(8)]
        assert answers == [True] + [False] * 7
    finally:
        service.stop()


def test_a_manual_sweep_refuses_others_until_it_has_ended() -> None:
    """Cleared only at its start, the flag let a request in while the job still ran; the scheduler then skipped
    that second job (one instance per name) and the flag stayed set: every later request refused."""
    service = _service([])
    entered, release = threading.Event(), threading.Event()

    def slow_sweep() -> None:
        entered.set()
        release.wait(10)

    service._sweeps._sweep = slow_sweep  # type: ignore[method-assign]
    try:
        assert service.request_sweep()[0] is True  # accepted; the scheduler is not started, so run it by hand
        job = threading.Thread(target=service._sweeps._manual_sweep)
        job.start()
        assert entered.wait(5)
        assert service.request_sweep()[0] is False  # the manual sweep has not ended
        release.set()
        job.join(5)
        assert service.request_sweep()[0] is True
    finally:
        release.set()
        service.stop()


def test_the_next_sweep_time_is_served_state_and_a_reload_moves_it() -> None:
    """The schedule's next sweep is in the state the server reads (and /metrics shows): an hour after the
    first sweep began; a reload to every two hours moves it, and the next scrape shows the new time."""
    from crossover_monitor.config.loader import settings_from_mapping  # noqa: PLC0415

    def settings(interval: str) -> Settings:
        return settings_from_mapping(
            {
                "schedule": {"interval": interval},
                "benchmark": {"sizes": [16, 32], "modes": ["compute"]},
                "server": {"listen": f"127.0.0.1:{listen}"},
            }
        )

    listen = free_port()
    loads = [settings("2h")]
    service = Service(
        settings("1h"),
        launch=lambda plan: ThreadWorker(plan, fake_guard(FakeSampler(lambda _: IDLE))),
        load=lambda: loads.pop(0),
    )
    thread = threading.Thread(target=service.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: (service.read_state().next_sweep_at or 0) > time.time() + 3000, 30, "the next sweep's time")
        assert service.read_state().next_sweep_at == pytest.approx(time.time() + 3600, abs=60)
        url = "http://{}:{}/metrics".format(*service.address)
        next_sweep = ("matmul_sweep_next_timestamp_seconds", frozenset[tuple[str, str]]())
        assert parse(http_get(url)[2])[next_sweep] == service.read_state().next_sweep_at
        assert service.reload() is True
        moved = service.read_state().next_sweep_at
        assert moved == pytest.approx(time.time() + 7200, abs=60)
        assert parse(http_get(url)[2])[next_sweep] == moved
    finally:
        service.stop()
        thread.join(10)
