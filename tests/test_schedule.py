"""Schedules: crontab semantics in UTC, immediate first run, never two sweeps at once."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from crossover_monitor.service.schedule import SweepScheduler, cron_problem, cron_trigger
from tests.fakes import SteppedClock
from tests.service import wait_until


@pytest.mark.parametrize(
    ("weekday_field", "expected"),
    [("0", "Sunday"), ("7", "Sunday"), ("1", "Monday"), ("sat", "Saturday"), ("5-7", "Friday")],
)
def test_crontab_weekdays_mean_what_crontab_says(weekday_field: str, expected: str) -> None:
    """Weekday 0 and 7 are Sunday as in crontab (APScheduler alone would read 0 as Monday)."""
    monday = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
    fire = cron_trigger(f"0 0 * * {weekday_field}").get_next_fire_time(None, monday)
    assert fire is not None
    assert fire.strftime("%A") == expected


def test_cron_is_evaluated_in_utc() -> None:
    """'0 3 * * *' fires at 03:00 UTC whatever the host's time zone."""
    fire = cron_trigger("0 3 * * *").get_next_fire_time(None, dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC))
    assert fire is not None
    assert (fire.utcoffset(), fire.hour) == (dt.timedelta(0), 3)


@pytest.mark.parametrize("expression", ["* * * *", "60 * * * *", "0 0 30 2 *", "0 0 * * funday"])
def test_unusable_cron_expressions_are_explained(expression: str) -> None:
    """Malformed or never-firing expressions get a reason."""
    assert cron_problem(expression) is not None


def test_sub_second_jitter_is_rounded_up_not_dropped() -> None:
    """APScheduler takes whole seconds of jitter: 500ms becomes 1s rather than none."""
    assert cron_trigger("*/5 * * * *", 0.5).jitter == 1
    assert cron_trigger("*/5 * * * *", 0).jitter is None


def test_first_sweep_runs_at_once_and_overlaps_are_skipped() -> None:
    """The first run starts right after start; a tick while it still runs is counted as skipped."""
    started = threading.Event()
    release = threading.Event()
    runs: list[float] = []
    skipped: list[str] = []

    def job() -> None:
        runs.append(time.monotonic())
        started.set()
        release.wait(10)

    scheduler = SweepScheduler(job=job, on_skipped=skipped.append, interval_s=0.5, cron=None, jitter_s=0)
    begin = time.monotonic()
    scheduler.start()
    try:
        assert started.wait(5)
        assert runs[0] - begin < 2
        deadline = time.monotonic() + 10
        while not skipped and time.monotonic() < deadline:
            time.sleep(0.1)
        assert skipped
        assert "still running" in skipped[0]
        assert len(runs) == 1
        next_run = scheduler.next_run_at()
        assert next_run is not None
        assert next_run > time.time() - 1
    finally:
        release.set()
        scheduler.shutdown()
    assert not scheduler.running


def test_a_wall_clock_step_forward_leaves_the_next_sweep_on_time_and_moves_its_wall_time() -> None:
    """Issue 51 N3: the wall clock a day ahead, the monotonic clock not: the next sweep is as far off as it was (not
    overdue by a day), its wall-clock time a day later, and the step is reported so that it is served."""
    wall = SteppedClock()
    ran = threading.Event()
    seen: list[float | None] = []
    scheduler = SweepScheduler(
        job=ran.set,
        on_skipped=lambda _: None,
        interval_s=3600,
        cron=None,
        jitter_s=0,
        clock=wall,
        on_clock_step=lambda: seen.append(scheduler.next_run_at()),
    )
    scheduler.start()
    try:
        assert ran.wait(5)
        before = scheduler.next_run_at()
        assert before is not None
        wall.offset = 86400
        wait_until(lambda: bool(seen), 5, "the step to be seen")
        left = scheduler.seconds_to_next()
        assert left is not None
        assert 3500 < left <= 3600
        assert seen[0] == pytest.approx(before + 86400, abs=1)
        assert scheduler.next_run_at() == pytest.approx(wall() + left, abs=1)
    finally:
        scheduler.shutdown()


def test_a_wall_clock_step_back_delays_no_sweep() -> None:
    """Issue 51 N6: after the wall clock steps back an hour, the next sweep still comes one interval (by the
    monotonic clock) after the last, not an hour later."""
    wall = SteppedClock()
    runs: list[float] = []
    scheduler = SweepScheduler(
        job=lambda: runs.append(time.monotonic()),
        on_skipped=lambda _: None,
        interval_s=1.0,
        cron=None,
        jitter_s=0,
        clock=wall,
    )
    scheduler.start()
    try:
        wait_until(lambda: len(runs) >= 1, 5, "the first sweep")
        wall.offset = -3600
        wait_until(lambda: len(runs) >= 3, 10, "two sweeps after the step")
    finally:
        scheduler.shutdown()
    assert 0.5 < runs[2] - runs[1] < 2


def test_a_cron_schedule_follows_the_wall_clock_when_it_steps() -> None:
    """Issue 51 N3, N6: a crontab line names wall-clock times, so after a step its next time is read from the
    new clock: at 02:00 '0 3 * * *' is an hour off; stepped to 02:59:58, it fires two seconds later."""
    two_am = dt.datetime(2026, 12, 1, 2, tzinfo=dt.UTC).timestamp()
    wall = SteppedClock(two_am - time.time())
    runs: list[float] = []
    scheduler = SweepScheduler(
        job=lambda: runs.append(wall()),
        on_skipped=lambda _: None,
        interval_s=None,
        cron="0 3 * * *",
        jitter_s=0,
        clock=wall,
    )
    scheduler.start()
    try:
        wait_until(lambda: len(runs) >= 1, 5, "the first sweep, at once")
        left = scheduler.seconds_to_next()
        assert left is not None
        assert 3500 < left <= 3600
        wall.offset += 3600 - 2 - (wall() - two_am)  # 02:59:58
        wait_until(lambda: len(runs) >= 2, 10, "the 03:00 sweep")
    finally:
        scheduler.shutdown()
    assert dt.datetime.fromtimestamp(runs[1], dt.UTC).strftime("%H:%M") == "03:00"
