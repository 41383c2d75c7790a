"""The served state's store: what a retry of withheld GPUs counts as."""

from __future__ import annotations

import dataclasses

import pytest

from crossover_monitor.carry import Wanted
from crossover_monitor.model import (
    HOST_REFERENCE,
    HOST_REFERENCE_SPREAD,
    HostReference,
    RetryResult,
    ServiceState,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.state import HOST_REFERENCES_KEPT, StateStore
from tests.guardfakes import IDLE, sweep_with


def test_a_gpu_withheld_for_a_busy_host_is_retried_and_a_retry_that_finds_it_so_again_counts_busy() -> None:
    """Every core taken passes like a job does: the GPU is tried again; the CPU alone is not (it has no retries)."""
    _, outcome = sweep_with(lambda _: IDLE)
    snapshot = outcome.snapshot
    assert snapshot is not None
    contended = [
        Withheld(backend="fake", device=d, reason=WithheldReason.CPU_CONTENDED, detail="every core taken")
        for d in ("/GPU:0", "/CPU:0")
    ]
    assert dataclasses.replace(snapshot, withheld=tuple(contended)).gpus_to_retry == ("/GPU:0",)
    assert dataclasses.replace(snapshot, withheld=(contended[1],)).gpus_to_retry == ()
    store = StateStore()
    store.record(outcome)
    retry = dataclasses.replace(outcome, snapshot=dataclasses.replace(snapshot, withheld=(contended[0],)))
    assert store.record_retry(retry) is RetryResult.BUSY


def test_the_store_serves_only_what_the_loaded_configuration_wants() -> None:
    """A reload (or the start-up's load) trims the served snapshot now, and every sweep and retry recorded after it."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    store = StateStore(ServiceState(latest=outcome.snapshot))  # as restored from the history
    cpu_only = Wanted(sizes=(16, 32), devices=("/CPU:0",))

    def served_points() -> set[tuple[str, int]]:
        latest = store.read().latest
        assert latest is not None
        return {(m.key.device, m.key.size) for m in latest.measurements if m.role == "sweep"}

    store.record_config(loaded=True, at=1.0, wanted=cpu_only)
    assert served_points() == {("/CPU:0", 16), ("/CPU:0", 32)}
    store.record_config(loaded=False, at=2.0, wanted=None)  # refused: the running configuration stays
    store.record(outcome)  # a sweep that began before the reload
    assert served_points() == {("/CPU:0", 16), ("/CPU:0", 32)}
    store.record_retry(outcome)
    assert served_points() == {("/CPU:0", 16), ("/CPU:0", 32)}
    store.record_config(loaded=True, at=3.0, wanted=Wanted(sizes=(16, 32, 64, 128)))
    store.record(outcome)
    assert {device for device, _ in served_points()} == {"/CPU:0", "/GPU:0"}


def test_a_retry_whose_busy_gpu_a_reload_removed_counts_measured_and_is_recorded_without_it() -> None:
    """A reload mid-retry drops the GPU: the retry is not 'busy' for a GPU no longer asked for, and the
    outcome the run history records lists only what the configuration still wants."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    busy = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.GPU_BUSY, detail="a job")
    retry = dataclasses.replace(outcome, snapshot=dataclasses.replace(outcome.snapshot, withheld=(busy,)))
    store = StateStore()
    store.record(outcome)
    store.record_config(loaded=True, at=1.0, wanted=Wanted(sizes=(16, 32), devices=("/CPU:0",)))
    assert store.record_retry(retry) is RetryResult.MEASURED
    recorded = store.as_wanted(retry).snapshot
    assert recorded is not None
    assert {d.device for d in recorded.devices} == {"/CPU:0"}
    assert not recorded.withheld


def test_a_sweep_the_guard_withheld_whole_is_counted_so_and_does_not_move_the_last_success() -> None:
    """A sweep that measured nothing is not a success: it is counted withheld and leaves the last success; one
    that measured part is counted partial and moves it; a retry that finds its GPU withheld again counts busy."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    store = StateStore()
    store.record(outcome)
    busy = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.GPU_BUSY, detail="a job")
    snapshot = dataclasses.replace(outcome.snapshot, withheld=(busy,))
    nothing = dataclasses.replace(outcome, result=SweepResult.WITHHELD, finished_at=1e10, snapshot=snapshot)
    store.record(nothing)
    state = store.read()
    assert (state.count(SweepResult.WITHHELD), state.last_success_at) == (1, outcome.finished_at)
    store.record(dataclasses.replace(nothing, result=SweepResult.PARTIAL, finished_at=2e10))
    state = store.read()
    assert (state.count(SweepResult.PARTIAL), state.last_success_at) == (1, 2e10)
    assert store.record_retry(nothing) is RetryResult.BUSY


def test_the_store_keeps_each_sweeps_host_reference_and_its_baseline_moves_only_with_most_of_them() -> None:
    """Every sweep's host reference is kept (withheld sweeps too), the last HOST_REFERENCES_KEPT only; the
    baseline is their median, and its spread the larger of a sweep's own and the medians' between sweeps."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    store = StateStore()
    assert store.read().host_baseline is None

    def record(median_s: float, spread: float, result: SweepResult = SweepResult.SUCCESS) -> None:
        assert outcome.snapshot is not None
        environment = (
            *outcome.snapshot.environment,
            (HOST_REFERENCE, str(median_s)),
            (HOST_REFERENCE_SPREAD, str(spread)),
        )
        snapshot = dataclasses.replace(outcome.snapshot, environment=environment)
        store.record(dataclasses.replace(outcome, result=result, snapshot=snapshot))

    for median_s in (1.0e-3, 1.1e-3, 0.9e-3):
        record(median_s, 0.02)
    baseline = store.read().host_baseline
    assert baseline == HostReference(median_s=1.0e-3, spread=0.02)  # too few sweeps for a spread between them
    for median_s in (0.8e-3, 1.2e-3):
        record(median_s, 0.02)
    baseline = store.read().host_baseline
    assert baseline is not None
    assert baseline.spread == pytest.approx(0.2)  # medians 0.8-1.2 ms: twice (median - first quartile) is 20%
    for _ in range(3):  # three slowed sweeps of eight move the figure a little, and the allowance little
        record(5.0e-3, 0.5, SweepResult.WITHHELD)
    baseline = store.read().host_baseline
    assert baseline is not None
    assert baseline.median_s == pytest.approx(1.15e-3)
    # From the lower half: first quartile 0.975 ms, so 30%; the interquartile range would have read 3.5 (350%).
    assert baseline.spread == pytest.approx(2 * (1.15 - 0.975) / 1.15)
    for _ in range(HOST_REFERENCES_KEPT):
        record(2.0e-3, 0.03)  # a lasting change of the host becomes the figure
    assert store.read().host_references[0] == HostReference(median_s=2.0e-3, spread=0.03)
    assert len(store.read().host_references) == HOST_REFERENCES_KEPT
    assert store.read().host_baseline == HostReference(median_s=2.0e-3, spread=0.03)


def test_a_snapshot_without_a_readable_host_reference_has_none() -> None:
    """A worker that took no readings, or an entry that is not a positive number, gives no host reference."""
    _, outcome = sweep_with(lambda _: IDLE)
    assert outcome.snapshot is not None
    for median_s, spread in (("nan", "0.1"), ("-1", "0.1"), ("0.001", "many")):
        environment = ((HOST_REFERENCE, median_s), (HOST_REFERENCE_SPREAD, spread))
        assert dataclasses.replace(outcome.snapshot, environment=environment).host_reference is None
    good = dataclasses.replace(outcome.snapshot, environment=((HOST_REFERENCE, "0.001"), (HOST_REFERENCE_SPREAD, "0")))
    assert good.host_reference == HostReference(median_s=0.001, spread=0.0)
