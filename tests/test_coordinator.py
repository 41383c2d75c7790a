"""The sweep coordinator in the running service: busy GPUs retried between sweeps."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from crossover_monitor.config import settings_from_mapping
from crossover_monitor.coordinator import SweepCoordinator
from crossover_monitor.model import RetryResult, SweepResult
from crossover_monitor.protocol import Plan
from crossover_monitor.state import StateStore
from tests.conftest import free_port
from tests.guardfakes import IDLE, JOB, FakeSampler, ThreadWorker, fake_guard


@pytest.mark.slow
def test_service_retries_a_busy_gpu_until_it_is_measured() -> None:
    """The daemon: a GPU busy in the sweep is retried after retry_interval, and the retry's timings are served."""
    from crossover_monitor.config import settings_from_mapping  # noqa: PLC0415
    from crossover_monitor.daemon import Service  # noqa: PLC0415

    busy = dataclasses.replace(IDLE, processes=(JOB,))
    launches: list[Plan] = []

    def launch(plan: Plan) -> ThreadWorker:
        launches.append(plan)
        script = (lambda _: busy) if len(launches) == 1 else (lambda _: IDLE)  # the job ends before the retry
        return ThreadWorker(plan, fake_guard(FakeSampler(script)))

    settings = settings_from_mapping(
        {
            "schedule": {"interval": "1h"},
            "benchmark": {"sizes": [16, 32, 64, 128], "modes": ["compute"], "expect_gpus": 1},
            "guard": {"retry_interval": "10s"},  # the shortest allowed
            "server": {"listen": f"127.0.0.1:{free_port()}"},
        }
    )
    service = Service(settings, launch=launch)
    thread = threading.Thread(target=service.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and dict(service.read_state().retries)[RetryResult.MEASURED] < 1:
            time.sleep(0.1)
        state = service.read_state()
    finally:
        service.stop()
        thread.join(10)
    assert dict(state.retries)[RetryResult.MEASURED] == 1
    assert launches[1].bench.devices == ("/CPU:0", "/GPU:0")  # the retry times the busy GPU and the CPU beside it
    assert launches[1].bench.expect_gpus == 0  # it names some GPUs only: the others are not missing
    assert state.latest is not None
    assert not state.latest.withheld
    assert any(m.key.device == "/GPU:0" for m in state.latest.measurements)
    # The sweep measured the CPU only; the retry that measured the GPU is not counted as a sweep.
    assert (state.count(SweepResult.PARTIAL), state.count(SweepResult.SUCCESS)) == (1, 0)


def _coordinator() -> SweepCoordinator:
    settings = settings_from_mapping({"schedule": {"interval": "1h"}, "benchmark": {"timeout": "60s"}})
    return SweepCoordinator(settings, StateStore(), None, launch=lambda plan: ThreadWorker(plan, fake_guard(None)))


def test_stuck_says_why_sweeps_no_longer_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What /-/healthy answers 503 on, each cause injected into a coordinator whose schedule never starts a
    sweep: no scheduler; a sweep due long ago and not started; a sweep running past its deadline and the
    grace after it. A schedule on time with no sweep stuck says nothing."""
    coordinator = _coordinator()
    assert coordinator.stuck() == "the scheduler is not running"
    scheduler = coordinator._scheduler
    monkeypatch.setattr(type(scheduler), "running", property(lambda _: True))
    monkeypatch.setattr(scheduler, "next_run_at", lambda: time.time() + 3600)
    assert coordinator.stuck() is None
    monkeypatch.setattr(scheduler, "next_run_at", lambda: time.time() - 600)
    overdue = coordinator.stuck()
    assert overdue is not None
    assert overdue.startswith("the next sweep was due 600s ago")
    monkeypatch.setattr(scheduler, "next_run_at", lambda: time.time() + 3600)
    monkeypatch.setattr(coordinator, "_sweep_started", time.monotonic() - 60 - 31)
    assert coordinator.stuck() == "a sweep has been running for more than 90s and could not be stopped"
    monkeypatch.setattr(coordinator, "_sweep_started", time.monotonic() - 60)  # within its deadline and grace
    assert coordinator.stuck() is None
