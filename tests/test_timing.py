"""The timing loop and its statistics, driven by a fake clock so that every number is known."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crossover_monitor.config.settings import TimingSettings
from crossover_monitor.measure.timing import MIN_BLOCKS_ON_BUDGET, calibrate, measure, median_and_iqr, with_visit
from crossover_monitor.model import StopReason, Timing


class FakeDevice:
    """A clock and a device in one: each call advances the clock by the next per-call cost."""

    def __init__(self, costs: Iterator[float]) -> None:
        self.now = 0.0
        self.calls = 0
        self._costs = costs

    def clock(self) -> float:
        return self.now

    def run(self, calls: int) -> None:
        for _ in range(calls):
            self.now += next(self._costs)
            self.calls += 1


def _settings(**overrides: Any) -> TimingSettings:
    base = TimingSettings(
        warmup_calls=2, block_s=0.01, min_blocks=5, max_blocks=20, target_spread=0.05, size_budget_s=10.0
    )
    return dataclasses.replace(base, **overrides)


def test_steady_device_converges_at_min_blocks_with_exact_median() -> None:
    """A device with a constant cost stops as soon as min_blocks are in, with that cost as median."""
    device = FakeDevice(itertools.repeat(1e-4))
    timing = measure(device.run, _settings(), device.clock)
    assert timing.stop_reason is StopReason.CONVERGED
    assert timing.blocks == 5
    assert timing.median_s == pytest.approx(1e-4)
    assert timing.iqr_s == pytest.approx(0.0, abs=1e-12)
    assert timing.noisy is False


def test_calibration_makes_blocks_last_at_least_block_time() -> None:
    """Tiny calls are batched so one block lasts at least block_time (timer cost negligible)."""
    device = FakeDevice(itertools.repeat(1e-6))
    calls = calibrate(device.run, 0.02, device.clock)
    assert calls * 1e-6 >= 0.02
    assert calls * 1e-6 < 0.02 * 3  # but not wastefully more


def test_warmup_calls_are_not_counted() -> None:
    """Slow first calls (compilation, allocation) do not move the median."""
    costs = itertools.chain([5.0, 5.0], itertools.repeat(1e-3))
    device = FakeDevice(costs)
    timing = measure(device.run, _settings(warmup_calls=2), device.clock)
    assert timing.median_s == pytest.approx(1e-3)


def test_noisy_device_stops_at_max_blocks_and_is_flagged() -> None:
    """A device whose blocks alternate between two costs never converges and is flagged noisy."""
    device = FakeDevice(itertools.cycle([1e-2, 2e-2]))
    timing = measure(device.run, _settings(block_s=1e-3, max_blocks=12), device.clock)
    assert timing.stop_reason is StopReason.MAX_BLOCKS
    assert timing.blocks == 12
    assert timing.noisy is True
    assert timing.relative_iqr > 0.05


def test_a_visit_adds_its_median_and_a_zero_median_is_noisy_not_a_division_by_zero() -> None:
    """The visits' spread is held to the target as the blocks' is; at a zero median (a broken clock) it is infinite."""
    first = Timing(median_s=1e-3, iqr_s=0.0, blocks=5, calls_per_block=1, stop_reason=StopReason.CONVERGED, noisy=False)
    steady = with_visit(first, dataclasses.replace(first, blocks=3), target_spread=0.05)
    assert (steady.visits_s, steady.blocks, steady.noisy) == ((1e-3, 1e-3), 8, False)
    assert with_visit(steady, dataclasses.replace(first, median_s=2e-3), target_spread=0.05).noisy is True
    stopped = dataclasses.replace(first, median_s=0.0)
    assert with_visit(stopped, stopped, target_spread=0.05).noisy is True
    assert stopped.relative_iqr == float("inf")


def test_budget_stops_a_slow_point_after_the_minimum_blocks() -> None:
    """A point slower than its budget still gets the minimum blocks for a median and IQR, then stops."""
    device = FakeDevice(itertools.cycle([1.0, 1.5]))
    timing = measure(device.run, _settings(size_budget_s=2.0, block_s=0.5), device.clock)
    assert timing.stop_reason is StopReason.BUDGET
    assert timing.blocks == MIN_BLOCKS_ON_BUDGET
    assert timing.calls_per_block == 1


def test_samples_are_per_call_times_in_order() -> None:
    """Each sample is one block's time divided by its calls."""
    device = FakeDevice(itertools.repeat(2e-3))
    timing = measure(device.run, _settings(block_s=0.01), device.clock)
    assert len(timing.samples_s) == timing.blocks
    assert all(s == pytest.approx(2e-3) for s in timing.samples_s)
    assert timing.calls_per_block * 2e-3 >= 0.01


def test_median_and_iqr_known_values() -> None:
    """Inclusive quartiles: 1..9 has median 5 and IQR 7 - 3 = 4."""
    assert median_and_iqr([float(v) for v in range(1, 10)]) == (5.0, 4.0)
    assert median_and_iqr([3.0]) == (3.0, 0.0)
    with pytest.raises(ValueError, match="no samples"):
        median_and_iqr([])


@given(st.lists(st.floats(min_value=1e-9, max_value=10.0), min_size=1, max_size=200))
def test_median_lies_within_samples_and_iqr_within_range(samples: list[float]) -> None:
    """For any samples the median is between min and max and the IQR between 0 and the range."""
    median, iqr = median_and_iqr(samples)
    assert min(samples) <= median <= max(samples)
    assert 0.0 <= iqr <= max(samples) - min(samples) + 1e-12


class _Neighbour:
    """A neighbour that slows the blocks it is told to (by their order), and the block watch that sees it."""

    def __init__(self, slowed: Iterator[bool]) -> None:
        self.slowed = slowed
        self.now_slow = False
        self.asked = 0

    def cost(self) -> Iterator[float]:
        while True:
            yield 2e-3 if self.now_slow else 1e-3

    def mark(self) -> object:
        self.now_slow = next(self.slowed)
        return None

    def disturbed(self, since: object) -> bool:
        self.asked += 1
        return self.now_slow


def test_blocks_the_watch_calls_disturbed_are_set_aside_and_timed_again() -> None:
    """A neighbour that slowed every other block: those blocks leave the median, and enough others are timed."""
    neighbour = _Neighbour(itertools.cycle([False, True]))
    device = FakeDevice(neighbour.cost())
    timing = measure(device.run, _settings(), device.clock, watch=neighbour)
    assert timing.stop_reason is StopReason.CONVERGED
    assert (timing.blocks, neighbour.asked) == (5, 9)  # the four slow blocks between them set aside
    assert timing.median_s == pytest.approx(1e-3)
    assert all(s == pytest.approx(1e-3) for s in timing.samples_s)


def test_a_point_whose_blocks_were_all_disturbed_keeps_them_all_and_stops() -> None:
    """Too few blocks stood: every block counts (the watch's owner withholds the point), and the set-aside
    blocks are bounded by max_blocks, as the kept ones are."""
    neighbour = _Neighbour(itertools.repeat(True))
    device = FakeDevice(neighbour.cost())
    timing = measure(device.run, _settings(max_blocks=12), device.clock, watch=neighbour)
    assert timing.stop_reason is StopReason.MAX_BLOCKS
    assert (timing.blocks, neighbour.asked) == (12, 12)
    assert timing.median_s == pytest.approx(2e-3)
