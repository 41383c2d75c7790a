"""Issue 55: a device withheld whole for other work (a CPU beside busy cores, a busy GPU) is tried again every
guard.retry_interval, within a sweep's worker CPU time, and the page and /metrics say when and how it ended."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.metrics import parse_exposition, render_state
from crossover_monitor.model import (
    WORKER_CPU_SECONDS,
    CrossoverState,
    DeviceInfo,
    RetryResult,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
    retry_devices,
)
from crossover_monitor.protocol import Plan
from crossover_monitor.service.coordinator import SweepCoordinator
from crossover_monitor.service.state import StateStore
from tests.builders import snapshot
from tests.guardfakes import IDLE, FakeHost, FakeSampler, ThreadWorker, fake_guard, until_a_retry_measures
from tests.service import RunningService, find


def cpu(device: str) -> DeviceInfo:
    return DeviceInfo(backend="fake", device=device, kind="cpu", name="CPU")


def gpu(device: str) -> DeviceInfo:
    return DeviceInfo(backend="fake", device=device, kind="gpu", name="GPU")


def test_a_retry_times_a_withheld_cpu_with_every_gpu_compared_against_it_and_a_gpu_with_its_cpu() -> None:
    devices = (cpu("/CPU:0"), gpu("/GPU:0"), gpu("/GPU:1"))
    assert retry_devices(devices, ["/CPU:0"]) == ("/CPU:0", "/GPU:0", "/GPU:1")
    assert retry_devices(devices, ["/GPU:1"]) == ("/CPU:0", "/GPU:1")
    assert retry_devices(devices, ["/GPU:1", "/CPU:0"]) == ("/CPU:0", "/GPU:0", "/GPU:1")
    assert retry_devices(devices[:1], ["/CPU:0"]) == ("/CPU:0",)  # a CPU-only host: the CPU alone


@pytest.mark.slow
def test_a_cpu_withheld_beside_busy_cores_is_retried_with_its_gpu_and_the_retry_serves_the_crossover() -> None:
    """The daemon with the real runner: every core taken in the sweep withholds the CPU (and so every crossover);
    a minute later, by guard.retry_interval, the CPU and its GPU are timed again and the crossover is served."""
    launches: list[Plan] = []
    due: list[float | None] = []

    def launch(plan: Plan) -> ThreadWorker:
        launches.append(plan)
        # The sweep: other processes use all 4 cores beside a 1-thread CPU timing (one past the 3 it leaves free, more
        # than guard.cpu_max_other_cores); the retry: gone.
        host = FakeHost([4.0] if len(launches) == 1 else [0.0], cores=4)
        return ThreadWorker(plan, fake_guard(FakeSampler(lambda _: IDLE), host))

    state = until_a_retry_measures(launch, watch=lambda served: due.append(served.next_retry_at))
    assert dict(state.retries)[RetryResult.MEASURED] == 1
    assert launches[1].bench.devices == ("/CPU:0", "/GPU:0")
    assert state.last_outcome is not None
    assert state.latest is not None
    assert not state.latest.withheld
    assert [c.state for c in state.latest.crossovers] == [CrossoverState.FOUND]
    # While it waited, the served state said when the retry would come: about retry_interval after the sweep.
    waiting = [at for at in due if at is not None]
    assert waiting
    assert 0 < waiting[0] - state.latest.started_at < 15
    assert state.next_retry_at is None  # measured: nothing left to retry


def _outcome(result: SweepResult, cpu_s: float | None, *, withheld: bool) -> SweepOutcome:
    contended = Withheld(backend="fake", device="/CPU:0", reason=WithheldReason.CPU_CONTENDED, detail="busy cores")
    environment = {} if cpu_s is None else {WORKER_CPU_SECONDS: str(cpu_s)}
    return SweepOutcome(
        result=result,
        started_at=0.0,
        finished_at=1.0,
        snapshot=snapshot(
            (cpu("/CPU:0"), gpu("/GPU:0")),
            withheld=(contended,) if withheld else (),
            environment=tuple(environment.items()),
        ),
    )


@contextlib.contextmanager
def _coordinator() -> Iterator[SweepCoordinator]:
    store = StateStore()
    store.record_config(settings_from_mapping({"schedule": {"interval": "1h"}}), at=0)
    yield SweepCoordinator(store, launch=lambda plan: ThreadWorker(plan, fake_guard(None)))


def test_retries_stop_once_another_would_cost_more_worker_cpu_than_a_sweep(caplog: pytest.LogCaptureFixture) -> None:
    """The retries since a sweep stay within the worker CPU time of the latest sweep that measured, each expected to
    cost what the run before it did; a new sweep starts a new allowance. Until a sweep has measured, the schedule
    alone bounds them."""
    caplog.set_level(logging.INFO, logger="crossover_monitor.service.coordinator")
    with _coordinator() as coordinator:
        coordinator._record(_outcome(SweepResult.WITHHELD, 4.0, withheld=True), retry=False)
        assert coordinator._retry_affordable()  # nothing measured yet: no sweep's cost to hold them to
        coordinator._record(_outcome(SweepResult.PARTIAL, 40.0, withheld=True), retry=False)  # GPU timed, CPU not
        assert coordinator._retry_affordable()  # 0 + 40 <= 40
        coordinator._record(_outcome(SweepResult.PARTIAL, 30.0, withheld=True), retry=True)
        assert not coordinator._retry_affordable()  # 30 + 30 > 40
        assert "retries of withheld devices wait for the next sweep" in caplog.text
        coordinator._record(_outcome(SweepResult.PARTIAL, 40.0, withheld=True), retry=False)
        assert coordinator._retry_affordable()  # a new sweep, a new allowance
        coordinator._record(_outcome(SweepResult.WITHHELD, 5.0, withheld=True), retry=True)
        coordinator._record(_outcome(SweepResult.WITHHELD, 5.0, withheld=True), retry=True)
        assert coordinator._retry_affordable()  # looks that find the host busy again cost little: 10 + 5 <= 40
        coordinator._record(_outcome(SweepResult.FAILED, None, withheld=True), retry=True)
        assert not coordinator._retry_affordable()  # a retry of unknown cost counts as a whole sweep's


def test_what_the_workers_of_sweeps_and_of_retries_cost_is_counted_apart_and_exported() -> None:
    """matmul_worker_cpu_seconds_total{run}: the retries' worker CPU time is in the sweep-cost figures, beside the
    sweeps'; a run whose worker did not say what it used adds nothing (no zero in place of a figure)."""
    store = StateStore()
    store.record(_outcome(SweepResult.PARTIAL, 40.0, withheld=True))
    store.record_retry(_outcome(SweepResult.WITHHELD, 5.5, withheld=True))
    store.record_retry(_outcome(SweepResult.FAILED, None, withheld=True))
    store.record(_outcome(SweepResult.SUCCESS, 41.0, withheld=False))
    assert dict(store.read().worker_cpu_s) == {"sweep": 81.0, "retry": 5.5}
    body, _ = render_state(store.read(), "", backend="fake", profile="fleet")
    exported = {
        labels["run"]: value
        for name, labels, value in parse_exposition(body.decode())
        if name == "matmul_worker_cpu_seconds_total"
    }
    assert exported == {"sweep": 81.0, "retry": 5.5}


@contextlib.contextmanager
def _on_one_core() -> Iterator[None]:
    """What this process starts meanwhile runs on one core of its own (children inherit the affinity): the load
    beside the service is then the spinners', whatever the rest of the machine does."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


@contextlib.contextmanager
def _spinning(count: int) -> Iterator[None]:
    """``count`` processes that each keep a CPU busy, ended on leaving."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)


_CONFIG = """
schedule: {interval: 1h}
benchmark:
  backend: "tests.fakes:curve"
  sizes: [16, 32, 64, 128]
  modes: [compute]
  timeout: 60s
  # Blocks long enough for /proc/stat's 10 ms ticks to see the load beside a point.
  timing: {size_budget: 600ms, block_time: 50ms, min_blocks: 3}
# The fake GPU has no NVML behind it and spins a CPU thread where a real GPU's thread would wait: only the CPU
# check is the guard's here. On its one core the 1-thread CPU timing leaves no core free: others may use 0.3.
guard:
  {require_nvml: false, gpu_max_host_wait: 1, retry_interval: 10s, cpu_max_other_cores: 0.3,
   reference_max_slowdown: 100, range_max_slowdown: 100, cpu_max_threads_wait: 100}
"""


def _measured_retries(service: RunningService) -> float:
    return sum(find(service.scrape(), "matmul_busy_retries_total", result="measured").values())


@pytest.mark.slow
def test_the_real_service_beside_busy_cores_retries_its_withheld_first_sweep_and_the_page_says_when(
    tmp_path: Path,
) -> None:
    """The real service and worker on one core, real load beside them there: four spinning processes, far past
    guard.cpu_max_other_cores. Its first sweep withholds the CPU and the page says when the next try comes and what
    to change; once the load ends, a retry serves the crossover a retry_interval later, not at the next scheduled
    sweep an hour on."""
    with contextlib.ExitStack() as load:
        with _on_one_core():
            load.enter_context(_spinning(4))
            service = RunningService(tmp_path, _CONFIG)
        try:
            service.wait_for(
                lambda: bool(find(service.scrape(), "matmul_device_withheld", device="/CPU:0", reason="cpu_contended")),
                timeout=90,
                what="the first sweep to withhold the CPU",
            )
            _, _, page = service.get("/")
        except BaseException:
            service.stop()
            raise
    try:
        assert "id='next-try'" in page
        assert "cpu_threads" in page  # what the user can change
        service.wait_for(lambda: _measured_retries(service) >= 1, timeout=120, what="a retry to measure the CPU")
        samples = service.scrape()
        assert not find(samples, "matmul_device_withheld", device="/CPU:0")
        assert list(find(samples, "matmul_crossover_state", state="found").values()) == [1.0]
        assert sum(find(samples, "matmul_sweeps_total").values()) == 1  # retries are not sweeps
    finally:
        service.stop()
