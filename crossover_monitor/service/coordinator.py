"""The sweeps: on the schedule, the retries of withheld devices between them and manual ones, one worker at a time.

Each is planned from the configuration the store holds, and its outcome handed to the store as it ends
(``crossover_monitor.service.state``: served and written to the run history in one step).
The service's life cycle (server, signals, reloads, stopping) is ``crossover_monitor.service.daemon``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import SweepOutcome, SweepResult, retry_devices
from crossover_monitor.protocol import Plan
from crossover_monitor.service.planning import plan_sweep
from crossover_monitor.service.preflight import host_problem
from crossover_monitor.service.schedule import SweepScheduler
from crossover_monitor.service.state import StateStore
from crossover_monitor.service.sweep import KILL_GRACE_S, Launcher, run_ends, run_sweep

log = logging.getLogger(__name__)

# A sweep still running this long after its deadline means its kill path is stuck.
_STUCK_AFTER_DEADLINE_S = 30.0
# A due sweep that has not started this long after its time means the scheduler thread is gone.
_OVERDUE_AFTER_S = 120.0
# How long stop() waits for a sweep in flight: SIGTERM, the grace, SIGKILL, reaping. The systemd
# unit's TimeoutStopSec and the pod's terminationGracePeriodSeconds must leave room for it.
STOP_WAIT_S = KILL_GRACE_S * 2 + 1


class SweepCoordinator:
    """Runs every sweep and retry of the service, on its schedule or when asked, and hands each to the store."""

    def __init__(
        self,
        store: StateStore,
        *,
        launch: Launcher,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` and ``monotonic``: the wall clock (what is recorded and served) and the one that times the
        schedule, the deadlines and the durations."""
        self._store = store
        self._launch = launch
        self._clock = clock
        self._monotonic = monotonic
        self._manual_lock = threading.Lock()
        self._manual_pending = False  # a manual sweep accepted and not yet ended: one 202 per sweep
        self._next_sweep_lock = threading.Lock()
        self._stopping = threading.Event()
        self._cancel_sweep = threading.Event()
        self._sweep_idle = threading.Event()
        self._sweep_idle.set()
        self._sweep_started: float | None = None
        self._worker_lock = threading.Lock()
        self._given_up: set[str] = set()  # devices with a fatal failure: not retried until restart
        # What the runs cost, in the worker's CPU-seconds: the latest scheduled sweep that measured (a sweep's cost,
        # the retries' budget an interval), the retries since the latest scheduled sweep, and the latest run (what
        # the next retry is expected to cost; None: unknown).
        self._sweep_cpu_s: float | None = None
        self._retries_cpu_s = 0.0
        self._last_run_cpu_s: float | None = None
        self._retries_paused = False  # said once an interval
        schedule = store.settings.schedule
        self._scheduler = SweepScheduler(
            job=self._sweep,
            on_skipped=self._skipped,
            interval_s=schedule.interval_s,
            cron=schedule.cron,
            jitter_s=schedule.jitter_s,
            clock=clock,
            monotonic=monotonic,
            on_clock_step=self._note_next_sweep,  # the next sweep's wall-clock time moved with the clock
        )

    def start(self) -> None:
        """Start the schedule: the first sweep runs right away."""
        self._scheduler.start()
        self._note_next_sweep()

    def _note_next_sweep(self) -> None:
        """The schedule's next sweep into the served state, after each change to it: its start, a reload,
        each scheduled sweep as it begins (or is skipped), a step of the wall clock. Read and recorded together,
        so that of two changes at once the later one's time stays."""
        with self._next_sweep_lock:
            self._store.record_next_sweep(self._scheduler.next_run_at())

    def reschedule(self) -> None:
        """A configuration reloaded into the store: its schedule takes over now (the rest of it plans the next
        sweep; one in flight keeps its plan)."""
        schedule = self._store.settings.schedule
        self._scheduler.reschedule(interval_s=schedule.interval_s, cron=schedule.cron, jitter_s=schedule.jitter_s)
        self._note_next_sweep()

    def stop(self) -> bool:
        """No more sweeps; the one in flight is cancelled. False if it did not end within STOP_WAIT_S."""
        self._stopping.set()
        self._cancel_sweep.set()
        self._scheduler.shutdown()
        ended = self._sweep_idle.wait(STOP_WAIT_S)
        self._end_skipped()
        return ended

    def stuck(self) -> str | None:
        """Why sweeps no longer run (no scheduler, a due sweep not started, one that cannot be stopped), or None."""
        if not self._scheduler.running:
            return "the scheduler is not running"
        # On the monotonic clock, as the schedule: a step of the wall clock makes no sweep late.
        left = self._scheduler.seconds_to_next()
        if self._sweep_started is None and left is not None and -left > _OVERDUE_AFTER_S:
            return f"the next sweep was due {-left:.0f}s ago and has not started"
        started = self._sweep_started
        limit = self._store.settings.benchmark.timeout_s + _STUCK_AFTER_DEADLINE_S
        if started is not None and self._monotonic() - started > limit:
            return f"a sweep has been running for more than {limit:g}s and could not be stopped"
        return None

    def request_sweep(self) -> tuple[bool, str]:
        """A sweep now (SIGUSR1, POST /-/sweep), counted and recorded like a scheduled one.

        Refused while one runs or one asked for has not ended yet: each yes is a sweep of its own.
        """
        with self._manual_lock:
            if self._manual_pending or self._worker_lock.locked():
                log.info("manual sweep refused: a sweep or retry is running or about to")
                return False, "a sweep or retry is running or about to; try again when it ends"
            self._manual_pending = True
        log.info("manual sweep requested")
        try:
            self._scheduler.run_later(self._manual_sweep, 0, name="manual")
        except Exception:
            with self._manual_lock:
                self._manual_pending = False
            raise
        return True, "sweep started"

    def _manual_sweep(self) -> None:
        # Pending until the job has ended, not only begun: a second job of the same name accepted while this
        # one still runs would be skipped by the scheduler (one instance at a time), its flag never cleared.
        try:
            self._sweep()
        finally:
            with self._manual_lock:
                self._manual_pending = False

    def _sweep(self) -> None:
        # The timer sets the following sweep's time before it starts this one; noted again at the end, should a
        # reload have changed it meanwhile.
        self._note_next_sweep()
        self._run_worker(self._plan(self._store.settings.benchmark), retry=False)
        self._note_next_sweep()

    def _retry_withheld(self) -> None:
        """Time again the devices the latest sweep withheld whole for other work that may have passed: a GPU with
        the CPU beside it, a CPU with the GPUs compared against it."""
        self._store.record_next_retry(None)
        latest = self._store.read().latest
        retried = latest.devices_to_retry if latest else ()
        if not retried or latest is None:
            return
        # It names some GPUs only: the rest are not missing.
        devices = retry_devices(latest.devices, retried)
        bench = dataclasses.replace(self._store.settings.benchmark, devices=devices, expect_gpus=0)
        self._run_worker(self._plan(bench, retry=True), retry=True)

    def _plan(self, bench: BenchmarkSettings, *, retry: bool = False) -> Plan:
        """What a worker times ``bench`` with, from the loaded guard settings and what the store kept (one read)."""
        until_next = self._scheduler.seconds_to_next()
        return plan_sweep(
            bench,
            self._store.settings.guard,
            self._store.read(),
            given_up=tuple(sorted(self._given_up)),
            retry=retry,
            now=self._clock(),
            until_next_s=None if until_next is None else max(until_next, 0.0),
        )

    def _run_worker(self, plan: Plan, *, retry: bool) -> None:
        if self._stopping.is_set():
            return
        # One worker at a time: a retry never runs beside a sweep; a sweep waits for a retry to end.
        if not self._worker_lock.acquire(blocking=not retry):
            log.info("retry of withheld devices skipped: a sweep is running")
            return
        if self._stopping.is_set():  # it waited for a retry while the service began to stop
            self._worker_lock.release()
            return
        self._sweep_idle.clear()
        self._sweep_started = began = self._monotonic()
        what = "retry" if retry else "sweep"
        try:
            outcome = self._time(plan, what, began)
            if self._stopping.is_set() and not outcome.result.completed:
                # Cut short by the stop: not a failure, and logged in the same words whatever the worker said.
                log.info(f"{what} stopped: the service is stopping", extra={"duration_s": round(outcome.duration_s, 3)})
            else:
                self._record(outcome, retry=retry)
        except Exception as exc:  # a bug must not kill the scheduler thread, nor go uncounted
            log.exception(f"{what} crashed")
            reason = f"internal error: {type(exc).__name__}: {exc}"
            started_at, finished_at = run_ends(began, clock=self._clock, monotonic=self._monotonic)
            failed = SweepOutcome(
                result=SweepResult.FAILED, started_at=started_at, finished_at=finished_at, reason=reason
            )
            self._count_cost(failed, retry=retry)
            if retry:
                self._store.record_retry(failed)
            else:
                self._store.record(failed)
        finally:
            self._sweep_started = None
            self._sweep_idle.set()
            self._worker_lock.release()
        self._end_skipped()
        try:
            self._schedule_retry()
        except Exception:  # e.g. the scheduler stopped meanwhile: the next sweep measures them anyway
            log.exception("could not schedule a retry of withheld devices")

    def _skipped(self, reason: str) -> None:
        """A scheduled sweep due while one runs: counted (and served) now; the history and the log get the burst
        of them once, as it ends (``_end_skipped``): at a 1 s interval a slow sweep skips one a second."""
        self._note_next_sweep()
        self._store.record_skipped(reason, at=self._clock())

    def _end_skipped(self) -> None:
        """The sweeps skipped since the last run ended, as one history row and one log line (after each run, and
        as the service stops)."""
        burst = self._store.end_skipped()
        if burst is not None:
            log.warning("sweep skipped", extra={"count": burst.count, "reason": burst.reason})

    def _time(self, plan: Plan, what: str, began: float) -> SweepOutcome:
        bench = plan.bench
        log.info(f"{what} started", extra={"backend": bench.backend, "devices": bench.devices or "auto"})
        problem = host_problem()
        if problem is not None:  # say so, not a traceback (or slow timings) per sweep
            started_at, finished_at = run_ends(began, clock=self._clock, monotonic=self._monotonic)
            return SweepOutcome(
                result=SweepResult.FAILED, started_at=started_at, finished_at=finished_at, reason=problem
            )
        return run_sweep(
            plan,
            timeout_s=bench.timeout_s,
            cancel=self._cancel_sweep,
            launch=self._launch,
            clock=self._clock,
            monotonic=self._monotonic,
        )

    def _count_cost(self, outcome: SweepOutcome, *, retry: bool) -> None:
        cost = outcome.worker_cpu_seconds
        self._last_run_cpu_s = cost
        if retry:
            self._retries_cpu_s += cost or 0.0
            return
        self._retries_cpu_s, self._retries_paused = 0.0, False
        if outcome.result.measured and cost is not None:
            self._sweep_cpu_s = cost

    def _record(self, outcome: SweepOutcome, *, retry: bool) -> None:
        self._give_up_on_fatal(outcome)
        self._count_cost(outcome, retry=retry)
        fields: dict[str, object] = {"result": outcome.result.value, "duration_s": round(outcome.duration_s, 3)}
        problem = outcome.snapshot.gpu_problem if outcome.snapshot is not None else None
        if problem and problem not in outcome.reason:  # the no_gpu state's cause and fix (once: expect_gpus says it)
            fields["no_gpu"] = problem
        # Handed over whole: the store trims it to the configuration loaded as it records it, and the history
        # gets what it serves then.
        if retry:
            fields["result"] = self._store.record_retry(outcome).value
            log.info("retry finished", extra=fields)
            return
        self._store.record(outcome)
        if outcome.result is SweepResult.SUCCESS:
            log.info("sweep finished", extra=fields)
        elif outcome.result.completed:  # the guard withheld devices: said at warning, with each one's reason
            log.warning("sweep finished", extra={**fields, "reason": outcome.reason})
        else:
            log.error("sweep failed", extra={**fields, "reason": outcome.reason})

    def _schedule_retry(self) -> None:
        """While devices are withheld for other work that may pass, look again every retry_interval until one
        measures or the next sweep is near, within a sweep's worker CPU time an interval; the time served."""
        due = None
        try:
            if self._retry_wanted():
                interval = self._store.settings.guard.retry_interval_s
                self._scheduler.run_later(self._retry_withheld, interval)
                due = self._clock() + interval
        finally:
            self._store.record_next_retry(due)

    def _retry_wanted(self) -> bool:
        interval = self._store.settings.guard.retry_interval_s
        latest = self._store.read().latest
        if interval <= 0 or latest is None or self._stopping.is_set() or not latest.devices_to_retry:
            return False
        left = self._scheduler.seconds_to_next()
        if left is not None and left <= interval:
            return False  # the next sweep comes first and times them anyway
        return self._retry_affordable()

    def _retry_affordable(self) -> bool:
        """Whether one more retry keeps the retries since the latest sweep within a measured sweep's worker CPU
        time, each expected to cost what the latest run did. Until a sweep has measured, the schedule alone bounds
        them: a retry that finds the host busy again costs its worker's start and a look."""
        budget = self._sweep_cpu_s
        if budget is None:
            return True
        expected = self._last_run_cpu_s if self._last_run_cpu_s is not None else budget
        if self._retries_cpu_s + expected <= budget:
            return True
        if not self._retries_paused:
            self._retries_paused = True
            log.info(
                "retries of withheld devices wait for the next sweep: they would cost more than a sweep",
                extra={"retries_cpu_s": round(self._retries_cpu_s, 1), "sweep_cpu_s": round(budget, 1)},
            )
        return False

    def _give_up_on_fatal(self, outcome: SweepOutcome) -> None:
        failures = outcome.snapshot.failures if outcome.snapshot is not None else ()
        for failure in failures:
            if failure.fatal and failure.whole_device and failure.device not in self._given_up:
                self._given_up.add(failure.device)
                log.warning(
                    "device will not be retried until restart",
                    extra={"device": failure.device, "reason": failure.reason},
                )
