"""What is served when a sweep withholds a device: its last good timings carried over, a retry laid over them."""

from __future__ import annotations

import dataclasses

from crossover_monitor.analysis.carry import merge, served, trimmed
from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import CrossoverState
from crossover_monitor.service.state import StateStore
from tests.conftest import make_plan
from tests.guardfakes import IDLE, JOB, sweep_with


def test_a_busy_gpu_keeps_its_last_good_timings_with_their_age() -> None:
    """The served snapshot carries the GPU's previous timings, crossover and measurement time over."""
    store = StateStore()
    _, good = sweep_with(lambda _: IDLE)
    store.record(good)
    first = store.read().latest
    assert first is not None
    _, busy = sweep_with(lambda _: dataclasses.replace(IDLE, processes=(JOB,)))
    store.record(busy)
    served = store.read().latest
    assert served is not None
    gpu_then = {m.key.size: m.timing.median_s for m in first.measurements if m.key.device == "/GPU:0"}
    gpu_now = {m.key.size: m.timing.median_s for m in served.measurements if m.key.device == "/GPU:0"}
    assert gpu_now == gpu_then
    assert dict(served.measured_at)["/GPU:0"] == dict(first.measured_at)["/GPU:0"]
    assert dict(served.measured_at)["/CPU:0"] > dict(first.measured_at)["/CPU:0"]
    (crossover,) = served.crossovers
    assert crossover.state is CrossoverState.FOUND
    assert crossover.derived_at == first.finished_at
    assert served.withheld_devices == {"/GPU:0"}


def test_a_retry_that_measures_the_gpu_replaces_what_was_carried() -> None:
    """A retry of only the busy GPU (and the CPU) is laid over the served snapshot; nothing stays withheld."""
    store = StateStore()
    for script in (lambda _: IDLE, lambda _: dataclasses.replace(IDLE, processes=(JOB,))):
        store.record(sweep_with(script)[1])
    before = store.read().latest
    assert before is not None
    _, retry = sweep_with(
        lambda _: IDLE, make_plan("tests.fakes:curve", modes=("compute",), devices=("/CPU:0", "/GPU:0"))
    )
    assert store.record_retry(retry).value == "measured"
    served = store.read().latest
    assert served is not None
    assert not served.withheld
    assert dict(served.measured_at)["/GPU:0"] > dict(before.measured_at)["/GPU:0"]
    assert dict(store.read().retries)[store.record_retry(retry)] >= 1


def test_merge_drops_a_device_that_failed() -> None:
    """A device that failed in the new sweep is never carried over: its series go."""
    _, good = sweep_with(lambda _: IDLE)
    snapshot = good.snapshot
    assert snapshot is not None
    from crossover_monitor.model import DeviceFailure  # noqa: PLC0415

    failed = dataclasses.replace(
        snapshot,
        measurements=tuple(m for m in snapshot.measurements if m.key.device != "/GPU:0"),
        failures=(DeviceFailure(backend="fake", device="/GPU:0", reason="lost"),),
        withheld=(),
    )
    served = merge(snapshot, failed)
    assert {m.key.device for m in served.measurements} == {"/CPU:0"}


def test_a_snapshot_trimmed_to_the_configuration_is_served_without_what_it_no_longer_wants() -> None:
    """A sweep that began before a reload, trimmed (as the store does) and served: its unwanted device and
    sizes are gone, and so is their age."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    cpu_only = BenchmarkSettings(sizes=(16, 32), devices=("/cpu:0",), modes=("compute",))
    snapshot, recent = served(None, trimmed(outcome.snapshot, cpu_only), recent=())
    assert {m.key.device for m in snapshot.measurements} == {"/CPU:0"}
    assert {m.key.size for m in snapshot.measurements if m.role == "sweep"} == {16, 32}
    assert dict(snapshot.measured_at).keys() == {"/CPU:0"}
    assert (snapshot.crossovers, recent) == ((), ())


def test_served_widens_the_fresh_crossover_by_its_recent_moves() -> None:
    """What ``merge`` serves, each crossover found again remembered among the recent n*."""
    _, first = sweep_with(lambda _: IDLE)
    _, second = sweep_with(lambda _: IDLE)
    assert first.snapshot is not None
    assert second.snapshot is not None
    previous, recent = served(None, first.snapshot, recent=())
    snapshot, recent = served(previous, second.snapshot, recent=recent)
    assert snapshot.measurements == merge(previous, second.snapshot).measurements
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.FOUND
    ((key, sizes),) = [(r.key, r.sizes) for r in recent]
    assert key == crossover.key
    assert len(sizes) == 2  # one n* per sweep that found it
