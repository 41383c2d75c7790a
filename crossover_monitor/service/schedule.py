"""The schedule: when sweeps come due (on the monotonic clock), crontab lines in UTC, and running the jobs
(the only apscheduler importer)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import threading
import time
from collections.abc import Callable

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from crossover_monitor.config.convert import Bad, cron_line

log = logging.getLogger(__name__)

_JOB_ID = "sweep"
_RETRY_JOB_ID = "retry"
_SUNDAY_AS_SEVEN = 7  # crontab accepts 7 for Sunday as well as 0
# A cron expression that fires less than once in this long is almost certainly a mistake.
_CRON_HORIZON = dt.timedelta(days=366 * 5)
# The timer looks at the clocks at least this often: a step of the wall clock is followed within it.
_LOOK_S = 1.0
# A change of (wall - monotonic) larger than this between two looks is a step; NTP slews by 0.5 ms/s at most.
_STEP_S = 1.0
# A crontab line's next time is the first after now, never now itself (the sweep of now is the one starting).
_JUST_AFTER = dt.timedelta(microseconds=1)


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


class _Schedule:
    """When sweeps come due, as monotonic times: every ``interval_s``, or at a crontab line's (wall-clock) times."""

    def __init__(self, interval_s: float | None, cron: str | None, jitter_s: float) -> None:
        if cron is None and (interval_s is None or interval_s <= 0):
            raise ValueError("a schedule needs an interval (above 0) or a cron expression")
        self._cron = cron_trigger(cron, jitter_s) if cron is not None else None
        self._interval_s = interval_s
        self._jitter_s = _whole_seconds(jitter_s) or 0  # as the crontab line's: one rule for both

    @property
    def follows_wall_clock(self) -> bool:
        """A crontab line names wall-clock times: when that clock steps, the next time is read from it again."""
        return self._cron is not None

    def next_due(self, grid: float | None, *, wall: float, mono: float) -> tuple[float, float] | None:
        """(grid time, due time) of the next sweep after the one of ``grid`` (None: the schedule starts now).

        An interval's times stay on one grid, each jittered afresh, and those already past are skipped (not run
        late one after another); a crontab line's next time comes from the wall clock. None: it never fires.
        """
        if self._cron is None:
            step = self._interval_s or 0.0
            at = mono + step if grid is None else grid + step
            if at <= mono:
                at += (math.floor((mono - at) / step) + 1) * step
            return at, at + random.uniform(0, self._jitter_s)
        fire = self._cron.get_next_fire_time(None, dt.datetime.fromtimestamp(wall, dt.UTC) + _JUST_AFTER)
        if fire is None:
            return None
        due = mono + (fire.timestamp() - wall)
        return due, due


class SweepScheduler:
    """Runs ``job`` now and then on the schedule; never two at once; runs due while one runs are skipped.

    The due times are kept on the monotonic clock and waited for by this class's own timer thread; the wall-clock
    time of the next sweep is derived when asked (now, plus the time left). So a step of the wall clock (NTP, a
    host's resume) neither delays a sweep nor makes one look overdue. APScheduler 3 decides that a job is due by
    comparing wall-clock datetimes: after a step back of an hour it would wait that hour out, and a run time
    re-armed from outside races its own update of it after each run. It runs the jobs here (its thread pool, one
    instance at a time) and does a crontab line's arithmetic; a crontab line names wall-clock times, so its next
    one is read from the wall clock again when that clock steps.
    """

    def __init__(
        self,
        *,
        job: Callable[[], None],
        on_skipped: Callable[[str], None],
        interval_s: float | None,
        cron: str | None,
        jitter_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_clock_step: Callable[[], None] | None = None,
    ) -> None:
        """``on_clock_step``: called (from the timer thread) after the wall clock stepped: the next sweep's
        wall-clock time moved with it."""
        self._job = job
        self._on_skipped = on_skipped
        self._on_clock_step = on_clock_step
        self._clock = clock
        self._monotonic = monotonic
        self._schedule = self._build_trigger(interval_s, cron, jitter_s)
        self._lock = threading.Lock()  # the due times, read by any thread, changed by the timer and reschedule
        self._started = False
        self._grid: float | None = None
        self._due: float | None = None  # monotonic; None: not started, or the crontab line never fires again
        self._later: dict[str, tuple[float, Callable[[], None]]] = {}  # one-off jobs by name: (due, job)
        self._sweep_running = False
        self._offset = clock() - monotonic()  # wall minus monotonic at the timer's last look
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._timer = threading.Thread(target=self._keep_time, name="sweep-timer", daemon=True)
        self._scheduler = BackgroundScheduler(timezone=dt.UTC)
        self._scheduler.add_listener(self._on_event, EVENT_JOB_MAX_INSTANCES)

    @staticmethod
    def _build_trigger(interval_s: float | None, cron: str | None, jitter_s: float) -> _Schedule:
        return _Schedule(interval_s, cron, jitter_s)

    def start(self) -> None:
        """Start the scheduler and its timer; the first sweep runs right away."""
        with self._lock:
            self._started = True
            self._grid = self._due = self._monotonic()
        self._scheduler.start()
        self._timer.start()

    def reschedule(self, *, interval_s: float | None, cron: str | None, jitter_s: float) -> None:
        """A new schedule for the sweep job (a reload), counted from now; a sweep in flight is not touched."""
        schedule = self._build_trigger(interval_s, cron, jitter_s)
        with self._lock:
            self._schedule = schedule
            if self._started:
                self._set_next(None)
        self._wake.set()

    def run_later(self, job: Callable[[], None], delay_s: float, *, name: str = _RETRY_JOB_ID) -> None:
        """Run ``job`` once, ``delay_s`` from now, replacing one of that name still waiting (a retry, a manual run);
        never, once the scheduler is shut down."""
        with self._lock:
            self._later[name] = (self._monotonic() + delay_s, job)
        self._wake.set()

    def shutdown(self) -> None:
        """Stop scheduling; a sweep in progress is stopped by its own cancel event, not here."""
        self._stopped.set()
        self._wake.set()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running) and self._timer.is_alive() and not self._stopped.is_set()

    def next_run_at(self) -> float | None:
        """Unix time of the next sweep, on the wall clock as it reads now; None when none is scheduled."""
        left = self.seconds_to_next()
        return None if left is None else self._clock() + left

    def seconds_to_next(self) -> float | None:
        """How long until the next sweep is due, by the monotonic clock (below 0: it is late); None when none is."""
        with self._lock:
            due = self._due
        return None if due is None else due - self._monotonic()

    def _set_next(self, grid: float | None) -> None:
        """The sweep after the one of ``grid`` (None: from now). Under _lock."""
        following = self._schedule.next_due(grid, wall=self._clock(), mono=self._monotonic())
        self._grid, self._due = following if following is not None else (None, None)

    def _keep_time(self) -> None:
        """The timer thread: looks at least every _LOOK_S (a step of the wall clock is seen that soon), and as
        each due time comes."""
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                wait = self._look()
            except Exception:  # a bug must not stop the schedule: /-/healthy would say so only once it is late
                log.exception("the sweep timer failed; looking again")
                wait = _LOOK_S
            self._wake.wait(wait)

    def _look(self) -> float:
        """Follow a step of the wall clock, start what is due; how long until the next look."""
        stepped = self._follow_wall_clock()
        now = self._monotonic()
        with self._lock:
            sweep_due = self._due is not None and now >= self._due
            if sweep_due:
                self._set_next(self._grid)
            ready = [(name, job) for name, (due, job) in self._later.items() if now >= due]
            for name, _ in ready:
                del self._later[name]
            dues = [d for d in (self._due, *(due for due, _ in self._later.values())) if d is not None]
        if stepped and self._on_clock_step is not None:
            self._on_clock_step()
        if sweep_due:
            self._start_sweep()
        for name, job in ready:
            self._submit(job, name)
        return max(0.0, min([_LOOK_S, *(d - now for d in dues)]))

    def _follow_wall_clock(self) -> bool:
        """Whether the wall clock stepped since the last look (slewing moves it by far less than _STEP_S); a
        crontab line's next time is then read from it again."""
        offset = self._clock() - self._monotonic()
        step, self._offset = offset - self._offset, offset
        if abs(step) < _STEP_S:
            return False
        log.info("the wall clock stepped", extra={"step_s": round(step, 1)})
        with self._lock:
            if self._schedule.follows_wall_clock and self._due is not None:
                self._set_next(None)
        return True

    def _start_sweep(self) -> None:
        with self._lock:
            running, self._sweep_running = self._sweep_running, True
        if running:
            self._on_skipped("previous sweep still running")
            return
        try:
            self._submit(self._sweep, _JOB_ID)
        except Exception:
            with self._lock:
                self._sweep_running = False
            raise

    def _sweep(self) -> None:
        try:
            self._job()
        finally:
            with self._lock:
                self._sweep_running = False

    def _submit(self, job: Callable[[], None], name: str) -> None:
        """Run ``job`` now on APScheduler's pool; one instance of a name at a time (and never dropped as late)."""
        self._scheduler.add_job(job, id=name, replace_existing=True, max_instances=1, misfire_grace_time=None)

    def _on_event(self, event: JobExecutionEvent) -> None:
        if event.job_id != _JOB_ID:  # a retry of busy GPUs that could not run is not a skipped sweep
            return
        # The timer skips a sweep due while one runs before handing it over; this is the rare one due between that
        # sweep's end and APScheduler's count of it: it never ran, so it is not running.
        with self._lock:
            self._sweep_running = False
        self._on_skipped("previous sweep still running")
