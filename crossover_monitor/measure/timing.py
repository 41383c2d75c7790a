"""The timing loop and its statistics: pure, with the clock passed in."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Protocol

from crossover_monitor.analysis.ranges import relative_iqr
from crossover_monitor.config.settings import TimingSettings
from crossover_monitor.measure.contract import RunBlock
from crossover_monitor.model import StopReason, Timing

Clock = Callable[[], float]

MAX_CALLS_PER_BLOCK = 1_000_000
MIN_BLOCKS_ON_BUDGET = 3  # a median and an IQR need at least this many blocks, budget or not


class BlockWatch(Protocol):
    """Says whether something outside a timed block slowed it (the guard's, for CPU points): such a block is
    set aside and another timed in its place."""

    def mark(self) -> object:
        """An opaque reading taken just before a block, to pass to ``disturbed``."""
        ...

    def disturbed(self, since: object) -> bool:
        """Whether the block timed since ``since`` was disturbed."""
        ...


def median_and_iqr(samples: Sequence[float]) -> tuple[float, float]:
    """Median and interquartile range (inclusive quartiles; 0 spread for a single sample)."""
    if not samples:
        raise ValueError("no samples")
    median = statistics.median(samples)
    if len(samples) == 1:
        return median, 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return median, q3 - q1


def _timed(run: RunBlock, calls: int, clock: Clock) -> float:
    start = clock()
    run(calls)
    return clock() - start


def calibrate(run: RunBlock, block_s: float, clock: Clock) -> int:
    """Calls per block so that one block lasts at least ``block_s`` (timer cost then negligible)."""
    calls = 1
    while calls < MAX_CALLS_PER_BLOCK:
        elapsed = _timed(run, calls, clock)
        if elapsed >= block_s:
            break
        # Aim 20% past the target so that the next try usually lands; at least double.
        grow = math.ceil(calls * 1.2 * block_s / elapsed) if elapsed > 0 else calls * 10
        calls = min(MAX_CALLS_PER_BLOCK, max(calls * 2, grow))
    return calls


def measure(
    run: RunBlock, settings: TimingSettings, clock: Clock, *, calls: int | None = None, watch: BlockWatch | None = None
) -> Timing:
    """Warm up, calibrate, then repeat timed blocks until the spread is small or the budget is spent.

    ``calls`` skips the calibration: a later visit of a point keeps the block length of its first.
    ``watch``: blocks it calls disturbed are set aside and timed again, up to ``max_blocks`` of them; if fewer
    than ``MIN_BLOCKS_ON_BUDGET`` stood, every block counts (the watch knows, and its owner judges the point).
    """
    started = clock()
    for _ in range(settings.warmup_calls):
        run(1)
    calls = calls or calibrate(run, settings.block_s, clock)
    samples: list[float] = []
    set_aside: list[float] = []
    spread = math.inf
    while True:
        mark = watch.mark() if watch is not None else None
        sample = _timed(run, calls, clock) / calls
        (set_aside if watch is not None and watch.disturbed(mark) else samples).append(sample)
        count = len(samples)
        if count:
            spread = relative_iqr(*median_and_iqr(samples))
        if count >= settings.min_blocks and spread <= settings.target_spread:
            reason = StopReason.CONVERGED
            break
        if count >= settings.max_blocks or len(set_aside) >= settings.max_blocks:
            reason = StopReason.MAX_BLOCKS
            break
        over_budget = clock() - started >= settings.size_budget_s
        if over_budget and max(count, len(set_aside)) >= MIN_BLOCKS_ON_BUDGET:
            reason = StopReason.BUDGET
            break
    if count < MIN_BLOCKS_ON_BUDGET:
        samples += set_aside
        spread = relative_iqr(*median_and_iqr(samples))
    median, iqr = median_and_iqr(samples)
    return Timing(
        median_s=median,
        iqr_s=iqr,
        blocks=len(samples),
        calls_per_block=calls,
        stop_reason=reason,
        noisy=spread > settings.target_spread,
        samples_s=tuple(samples),
    )


def with_visit(timing: Timing, visit: Timing, target_spread: float) -> Timing:
    """A point's timing with one more visit: median and IQR over the visits' medians, every block kept.

    Between visits a point's level moves by more than its blocks within one visit show, so the
    visits, not the blocks, say how well the point is known; a spread above ``target_spread`` is
    flagged as noisy like any other.
    """
    visits = (*(timing.visits_s or (timing.median_s,)), visit.median_s)
    median, iqr = median_and_iqr(visits)
    return dataclasses.replace(
        timing,
        median_s=median,
        iqr_s=iqr,
        blocks=timing.blocks + visit.blocks,
        noisy=relative_iqr(median, iqr) > target_spread,
        samples_s=timing.samples_s + visit.samples_s,
        visits_s=visits,
    )
