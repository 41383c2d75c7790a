"""The sweep coordinator in the running service: busy GPUs retried between sweeps."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.config.settings import (
    BenchmarkSettings,
    HistorySettings,
    RefineSettings,
    ServerSettings,
    Settings,
)
from crossover_monitor.measure import worker
from crossover_monitor.model import (
    HostReference,
    PointKey,
    PointMedians,
    RangeTop,
    RetryResult,
    ServiceState,
    SweepResult,
)
from crossover_monitor.protocol import Plan
from crossover_monitor.service.coordinator import SweepCoordinator
from crossover_monitor.service.daemon import Service
from crossover_monitor.service.history import RunHistory, read_recent
from crossover_monitor.service.state import StateStore
from tests.conftest import QUICK_TIMING, free_port
from tests.fakes import SteppedClock
from tests.guardfakes import IDLE, JOB, FakeSampler, ThreadWorker, fake_guard, until_a_retry_measures
from tests.service import wait_until


@pytest.mark.slow
def test_service_retries_a_busy_gpu_until_it_is_measured() -> None:
    """The daemon: a GPU busy in the sweep is retried after retry_interval, and the retry's timings are served."""
    busy = dataclasses.replace(IDLE, processes=(JOB,))
    launches: list[Plan] = []

    def launch(plan: Plan) -> ThreadWorker:
        launches.append(plan)
        script = (lambda _: busy) if len(launches) == 1 else (lambda _: IDLE)  # the job ends before the retry
        return ThreadWorker(plan, fake_guard(FakeSampler(script)))

    state = until_a_retry_measures(launch)
    assert dict(state.retries)[RetryResult.MEASURED] == 1
    assert launches[1].bench.devices == ("/CPU:0", "/GPU:0")  # the retry times the busy GPU and the CPU beside it
    assert launches[1].bench.expect_gpus == 0  # it names some GPUs only: the others are not missing
    assert state.latest is not None
    assert not state.latest.withheld
    assert any(m.key.device == "/GPU:0" for m in state.latest.measurements)
    # The sweep measured the CPU only; the retry that measured the GPU is not counted as a sweep.
    assert (state.count(SweepResult.PARTIAL), state.count(SweepResult.SUCCESS)) == (1, 0)


def _coordinator() -> SweepCoordinator:
    store = StateStore()
    store.record_config(settings_from_mapping({"schedule": {"interval": "1h"}, "benchmark": {"timeout": "60s"}}), at=0)
    return SweepCoordinator(store, launch=lambda plan: ThreadWorker(plan, fake_guard(None)))


def test_stuck_says_why_sweeps_no_longer_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What /-/healthy answers 503 on, each cause injected into a coordinator whose schedule never starts a
    sweep: no scheduler; a sweep due long ago and not started; a sweep running past its deadline and the
    grace after it. A schedule on time with no sweep stuck says nothing."""
    coordinator = _coordinator()
    assert coordinator.stuck() == "the scheduler is not running"
    scheduler = coordinator._scheduler
    monkeypatch.setattr(type(scheduler), "running", property(lambda _: True))
    monkeypatch.setattr(scheduler, "seconds_to_next", lambda: 3600.0)
    assert coordinator.stuck() is None
    monkeypatch.setattr(scheduler, "seconds_to_next", lambda: -600.0)
    overdue = coordinator.stuck()
    assert overdue is not None
    assert overdue.startswith("the next sweep was due 600s ago")
    monkeypatch.setattr(scheduler, "seconds_to_next", lambda: 3600.0)
    monkeypatch.setattr(coordinator, "_sweep_started", time.monotonic() - 60 - 31)
    assert coordinator.stuck() == "a sweep has been running for more than 90s and could not be stopped"
    monkeypatch.setattr(coordinator, "_sweep_started", time.monotonic() - 60)  # within its deadline and grace
    assert coordinator.stuck() is None


@contextlib.contextmanager
def _on_call(function: Callable[..., object], action: Callable[[], object]) -> Iterator[None]:
    """Runs ``action`` once, on this thread, as ``function`` is called and before its body: an event placed
    exactly between two steps of the code under test, which runs unchanged (nothing is replaced)."""
    code = getattr(function, "__code__", None)
    assert code is not None
    fired = False

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal fired
        if event == "call" and frame.f_code is code and not fired:
            fired = True
            action()

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(None)
    assert fired, f"{function.__qualname__} was not called"


@pytest.mark.parametrize(
    ("mid_sweep", "at_recording", "recorded"),
    [
        ((), ("/CPU:0",), {"/CPU:0"}),
        ((("/CPU:0",),), None, {"/CPU:0", "/GPU:0"}),
    ],
    ids=["fewer-devices-at-recording", "every-device-again-at-recording"],
)
def test_a_reload_as_a_sweep_is_recorded_decides_alone_what_is_served_and_what_the_history_holds(
    tmp_path: Path,
    mid_sweep: tuple[tuple[str, ...] | None, ...],
    at_recording: tuple[str, ...] | None,
    recorded: set[str],
) -> None:
    """Issue 36: the sweep's outcome is trimmed once, to the configuration loaded when the store records it,
    and the history holds that very record. A reload landing after the sweep ended and before its recording
    (while the coordinator handed the outcome over) was undone in the history, which got the coordinator's
    earlier trim; and a reload mid-sweep, then back, left the served snapshot trimmed by both."""
    listen = ("127.0.0.1", free_port())

    def settings(devices: tuple[str, ...] | None) -> Settings:
        bench = BenchmarkSettings(
            sizes=(16, 32, 64, 128),
            modes=("compute",),
            devices=devices,
            timing=QUICK_TIMING,
            refine=RefineSettings(enabled=False),
        )
        return Settings(
            benchmark=bench, server=ServerSettings(address=listen), history=HistorySettings(directory=str(tmp_path))
        )

    loads = [settings(devices) for devices in (*mid_sweep, at_recording)]

    def launch(plan: Plan) -> ThreadWorker:
        for _ in mid_sweep:  # the plan is made: a reload now lands mid-sweep
            assert service.reload()
        return ThreadWorker(plan, fake_guard(FakeSampler(lambda _: IDLE)))

    service = Service(settings(None), launch=launch, load=lambda: loads.pop(0))
    try:
        with _on_call(StateStore.record, service.reload):
            service._sweeps._sweep()  # the scheduler is not started: the sweep runs here, on this thread
        state = service.read_state()
    finally:
        service.stop()  # closes the history
    assert not loads
    assert state.latest is not None
    assert state.last_outcome is not None
    assert state.last_outcome.snapshot is not None
    assert {m.key.device for m in state.latest.measurements} == recorded
    assert {d.device for d in state.last_outcome.snapshot.devices} == recorded
    (run,) = read_recent(tmp_path, 10)
    assert {device for device, _, _ in run.devices} == recorded
    assert {gpu for gpu, _, _, _ in run.crossovers} == {c.gpu for c in state.latest.crossovers}
    restored = RunHistory.open(tmp_path, keep_runs=10).restore()
    assert restored is not None
    assert restored[0].latest == state.latest


def test_a_sweep_is_planned_with_the_hosts_figure_and_the_points_ranges_the_store_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the store kept of recent sweeps reaches the worker's plan: the host reference's idle figure and each
    point's calm range (without them the guard would judge against nothing), and the node's usual load."""
    key = PointKey(backend="tensorflow", device="/CPU:0", dtype="float32", mode="compute", size=64)
    kept = ServiceState(
        host_references=(HostReference(median_s=4.5e-4, spread=0.03),) * 4,
        point_medians=(PointMedians(key=key, medians_s=(1.0e-3, 1.2e-3, 1.1e-3, 0.9e-3)),),
        others_typical=(1.2, 1.4, 1.3) * 3 + (1.25,),
    )
    store = StateStore(kept)
    bench = {"backend": "tests.fakes:curve", "sizes": [16, 32], "modes": ["compute"], "timeout": "60s"}
    store.record_config(settings_from_mapping({"schedule": {"interval": "1h"}, "benchmark": bench}), at=0)
    plans: list[Plan] = []

    def launch(plan: Plan) -> ThreadWorker:
        plans.append(plan)
        return ThreadWorker(plan, fake_guard(None))

    SweepCoordinator(store, launch=launch)._sweep()  # one sweep, without starting the schedule
    (plan,) = plans
    assert plan.host_baseline is not None
    assert plan.host_baseline.median_s == pytest.approx(4.5e-4)
    assert plan.host_baseline.spread == 0.03
    assert plan.range_tops == (RangeTop(key=key, upper_s=1.2e-3, sweeps=4),)
    assert plan.usual_others == 1.2  # what nine of the ten sweeps' typical loads reached
    assert Plan.from_json(plan.to_json()).usual_others == plan.usual_others  # as the worker reads it
    # And the worker hands all of it to its guard (a field dropped there would leave the guard judging by nothing).
    given: dict[str, Any] = {}
    monkeypatch.setattr(worker, "Guard", lambda settings, **kwargs: given.update(kwargs, settings=settings))
    # The guard off: the figures travel all the same, and the test opens no NVML on a GPU host.
    quiet = dataclasses.replace(plan, guard=dataclasses.replace(plan.guard, enabled=False))
    worker.build_guard(Plan.from_json(quiet.to_json()))
    assert given["settings"] == quiet.guard
    assert (given["reference_baseline"], tuple(given["range_tops"]), given["usual_others"]) == (
        plan.host_baseline,
        plan.range_tops,
        plan.usual_others,
    )


def _quick_store(history: RunHistory | None = None, interval: str = "1h") -> StateStore:
    """A store with a configuration whose sweeps (on a ThreadWorker) take well under a second."""
    store = StateStore(history=history)
    bench = {"backend": "tests.fakes:curve", "sizes": [16, 32], "modes": ["compute"], "timeout": "60s"}
    store.record_config(settings_from_mapping({"schedule": {"interval": interval}, "benchmark": bench}), at=0)
    return store


def test_a_wall_clock_step_forward_keeps_the_service_healthy_and_serves_the_next_sweep_moved_with_it() -> None:
    """Issue 51 N3: the wall clock a day ahead, the monotonic clock not: what /-/healthy and the watchdog ask
    (``stuck``) says nothing is late, and the next sweep's served time (its metric, the page) is a day later."""
    wall = SteppedClock()
    store = _quick_store()
    coordinator = SweepCoordinator(store, launch=lambda plan: ThreadWorker(plan, fake_guard(None)), clock=wall)
    coordinator.start()
    try:
        wait_until(lambda: store.read().last_outcome is not None, 30, "the first sweep")
        before = store.read().next_sweep_at
        assert before is not None
        wall.offset = 86400
        wait_until(lambda: (store.read().next_sweep_at or 0) > before + 86000, 5, "the next sweep's time to move")
        assert coordinator.stuck() is None
        assert store.read().next_sweep_at == pytest.approx(before + 86400, abs=2)
    finally:
        coordinator.stop()


def test_a_wall_clock_step_back_during_a_sweep_leaves_its_duration_true(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 51 N6: the wall clock an hour back while a sweep runs: the duration served, logged and kept in the
    history is the monotonic clock's (under a minute), not -3600 s."""
    wall = SteppedClock()
    history = RunHistory.open(tmp_path, keep_runs=10)
    store = _quick_store(history)

    def launch(plan: Plan) -> ThreadWorker:
        wall.offset -= 3600  # the sweep has begun
        return ThreadWorker(plan, fake_guard(None))

    coordinator = SweepCoordinator(store, launch=launch, clock=wall)
    with caplog.at_level(logging.INFO, logger="crossover_monitor.service.coordinator"):
        coordinator._sweep()  # the scheduler is not started: the sweep runs here, on this thread
    history.close()
    outcome = store.read().last_outcome
    assert outcome is not None
    assert outcome.snapshot is not None
    assert 0 <= outcome.duration_s < 60
    assert 0 <= outcome.snapshot.finished_at - outcome.snapshot.started_at < 60
    assert outcome.finished_at == pytest.approx(wall(), abs=60)  # on the clock as it reads now
    (line,) = [r for r in caplog.records if r.getMessage() == "sweep finished"]
    assert 0 <= line.__dict__["duration_s"] < 60
    (run,) = read_recent(tmp_path, 10)
    assert run.started_at is not None
    assert run.finished_at is not None
    assert 0 <= run.finished_at - run.started_at < 60


def test_a_burst_of_skipped_sweeps_is_one_history_row_and_one_log_line_and_a_restart_resumes_its_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 51 N9: 68 scheduled sweeps skipped while one ran are counted and served at once, but written to the
    history (with the whole served state) only as the burst ends: one row with their count, one log line; the
    restored skipped counter is 68."""
    history = RunHistory.open(tmp_path, keep_runs=100)
    store = _quick_store(history, interval="1s")
    coordinator = SweepCoordinator(store, launch=lambda plan: ThreadWorker(plan, fake_guard(None)))
    with caplog.at_level(logging.INFO):
        for _ in range(68):
            coordinator._skipped("previous sweep still running")  # what the schedule calls, from its timer
        assert store.read().count(SweepResult.SKIPPED) == 68
        assert read_recent(tmp_path, 100) == []  # no history write (of the served state) per skip
        coordinator.stop()  # the burst ends as the service stops, if no sweep ended it before
    history.close()
    (run,) = read_recent(tmp_path, 100)
    assert (run.kind, run.result) == ("skipped", "skipped")
    assert run.reason == "previous sweep still running (68 scheduled sweeps skipped)"
    (line,) = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert (line.getMessage(), line.__dict__["count"]) == ("sweep skipped", 68)
    reopened = RunHistory.open(tmp_path, keep_runs=100)
    restored = reopened.restore()
    reopened.close()
    assert restored is not None
    assert restored[0].count(SweepResult.SKIPPED) == 68


def test_the_sweep_after_a_whole_curve_carries_its_far_points_and_a_reload_times_them_all_again() -> None:
    """Planned by the coordinator from what the store serves: the second sweep hands the worker the far points
    (the GPU's largest size and the sizes around n* ≈ 46 excepted), which travel whole with their time and are
    served with it; after a configuration reload every point is timed again."""
    store = StateStore()
    bench = {
        "backend": "tests.fakes:curve",
        "sizes": [1, 8, 16, 32, 64, 128, 256],
        "modes": ["compute"],
        "timing": {"block_time": "2ms", "size_budget": "1s"},
        "refine": {"visits": 3, "budget": "2s"},
    }
    settings = settings_from_mapping(
        {"schedule": {"interval": "15m"}, "benchmark": {**bench, "timeout": "60s"}, "guard": {"enabled": False}}
    )
    store.record_config(settings, at=0)
    plans: list[Plan] = []

    def launch(plan: Plan) -> ThreadWorker:
        plans.append(Plan.from_json(plan.to_json()))  # as the worker reads it
        return ThreadWorker(plans[-1], fake_guard(None, enabled=False))

    coordinator = SweepCoordinator(store, launch=launch)
    coordinator._sweep()
    first = store.read().latest
    assert first is not None
    coordinator._sweep()
    assert plans[0].carried == ()
    carried = {(m.key.device, m.key.size) for m in plans[1].carried}
    # (which of 16 and 128 are carried depends on how wide a busy machine made n*'s interval)
    assert {("/CPU:0", 8), ("/CPU:0", 256), ("/GPU:0", 8)} <= carried
    assert not carried & ({(d, n) for d in ("/CPU:0", "/GPU:0") for n in (1, 32, 64)} | {("/GPU:0", 256)})
    served = store.read().latest
    assert served is not None
    assert {(m.key.device, m.key.size): m.timed_at for m in served.measurements if m.carried} == dict.fromkeys(
        carried, first.finished_at
    )
    store.record_config(settings, at=time.time())
    coordinator._sweep()
    assert plans[2].carried == ()
