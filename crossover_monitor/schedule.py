"""The APScheduler adapter: builds triggers in UTC and runs the sweep job (the only apscheduler importer)."""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from crossover_monitor.convert import Bad, cron_line

log = logging.getLogger(__name__)

_JOB_ID = "sweep"
_RETRY_JOB_ID = "retry"
_SUNDAY_AS_SEVEN = 7  # crontab accepts 7 for Sunday as well as 0
# A cron expression that fires less than once in this long is almost certainly a mistake.
_CRON_HORIZON = dt.timedelta(days=366 * 5)


def cron_trigger(expression: str, jitter_s: float = 0.0) -> CronTrigger:
    """A UTC trigger for a standard 5-field crontab line; raises ValueError when it is malformed."""
    line = cron_line(expression)
    if isinstance(line, Bad):
        raise ValueError(line.message)  # noqa: TRY004 - a malformed line, whatever its type
    minute, hour, day, month, day_of_week = line.split()
    if day not in ("*", "?") and day_of_week not in ("*", "?"):
        # crontab fires when either matches; APScheduler only when both do: refuse the ambiguity
        raise ValueError("restrict the day of month or the weekday, not both")
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=_weekdays(day_of_week),
        timezone=dt.UTC,
        jitter=_whole_seconds(jitter_s),
    )


def _whole_seconds(jitter_s: float) -> int | None:
    """APScheduler's jitter is whole seconds: round up, so that a configured jitter never vanishes."""
    return math.ceil(jitter_s) or None


_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekday_number(token: str) -> int:
    if token.lower() in _DAY_NAMES:
        return _DAY_NAMES.index(token.lower())
    if token.isdigit() and int(token) <= _SUNDAY_AS_SEVEN:
        return int(token) % 7
    raise ValueError(f"bad weekday {token!r} (use 0-7 or sun..sat)")


def _weekdays(field: str) -> str:
    """A crontab weekday field in APScheduler's terms.

    APScheduler 3 numbers weekdays from Monday (0) where crontab numbers them from Sunday
    (0 or 7), so '0' would silently mean Monday; the days are spelled out as names instead.
    """
    if field in ("*", "?"):
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"bad step in weekday field {field!r}")
        if span == "*":
            first, last = 0, 6
        else:
            low, _, high = span.partition("-")
            first = _weekday_number(low)
            last = _weekday_number(high) if high else (6 if step_text else first)
            if high == str(_SUNDAY_AS_SEVEN):
                last = _SUNDAY_AS_SEVEN
        days.update(d % 7 for d in range(first, last + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def cron_problem(expression: str) -> str | None:
    """Why a crontab expression cannot be used, or None if it is fine."""
    try:
        trigger = cron_trigger(expression)
    except ValueError as exc:
        return f"is not a valid 5-field crontab expression ({exc})"
    now = dt.datetime.now(dt.UTC)
    first = trigger.get_next_fire_time(None, now)
    if first is None or first - now > _CRON_HORIZON:
        return "never fires (no matching date in the next five years)"
    return None


class SweepScheduler:
    """Runs ``job`` now and then on the schedule; never two at once; missed runs coalesced."""

    def __init__(
        self,
        *,
        job: Callable[[], None],
        on_skipped: Callable[[str], None],
        interval_s: float | None,
        cron: str | None,
        jitter_s: float,
    ) -> None:
        self._job = job
        self._on_skipped = on_skipped
        self._trigger = self._build_trigger(interval_s, cron, jitter_s)
        self._scheduler = BackgroundScheduler(timezone=dt.UTC)
        self._scheduler.add_listener(self._on_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)

    @staticmethod
    def _build_trigger(interval_s: float | None, cron: str | None, jitter_s: float) -> BaseTrigger:
        if cron is not None:
            return cron_trigger(cron, jitter_s)
        if interval_s is None:
            raise ValueError("a schedule needs an interval or a cron expression")
        return IntervalTrigger(seconds=interval_s, timezone=dt.UTC, jitter=_whole_seconds(jitter_s))

    def start(self) -> None:
        """Start the scheduler thread; the first sweep runs right away."""
        self._scheduler.add_job(
            self._job,
            self._trigger,
            id=_JOB_ID,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=dt.datetime.now(dt.UTC),
        )
        self._scheduler.start()

    def reschedule(self, *, interval_s: float | None, cron: str | None, jitter_s: float) -> None:
        """A new schedule for the sweep job (a reload); a sweep in flight is not touched."""
        self._trigger = self._build_trigger(interval_s, cron, jitter_s)
        if self._scheduler.get_job(_JOB_ID) is not None:
            self._scheduler.reschedule_job(_JOB_ID, trigger=self._trigger)

    def run_later(self, job: Callable[[], None], delay_s: float, *, name: str = _RETRY_JOB_ID) -> None:
        """Run ``job`` once, ``delay_s`` from now, replacing one of that name still waiting (a retry, a manual run)."""
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=delay_s)
        self._scheduler.add_job(
            job,
            DateTrigger(run_date=when, timezone=dt.UTC),
            id=name,
            replace_existing=True,
            max_instances=1,
            misfire_grace_time=None,
        )

    def shutdown(self) -> None:
        """Stop scheduling; a sweep in progress is stopped by its own cancel event, not here."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def next_run_at(self) -> float | None:
        """Unix time of the next sweep, or None when none is scheduled."""
        job = self._scheduler.get_job(_JOB_ID)
        when = getattr(job, "next_run_time", None) if job is not None else None
        return when.timestamp() if when is not None else None

    def _on_event(self, event: JobExecutionEvent) -> None:
        if event.job_id != _JOB_ID:  # a retry of busy GPUs that could not run is not a skipped sweep
            return
        reason = "previous sweep still running" if event.code == EVENT_JOB_MAX_INSTANCES else "run missed"
        log.warning("sweep skipped", extra={"reason": reason})
        self._on_skipped(reason)
