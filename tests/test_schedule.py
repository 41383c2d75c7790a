"""Schedules: crontab semantics in UTC, immediate first run, never two sweeps at once."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from crossover_monitor.schedule import SweepScheduler, cron_problem, cron_trigger


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
