"""The long-running service: scheduler, HTTP server, signals, service-manager notification."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from monitor import __version__, page, systemd
from monitor.carry import trimmed
from monitor.errors import ConfigError, StartupError
from monitor.history import HistoryUnavailable, RunHistory
from monitor.metrics import build_registry
from monitor.model import ServiceState, Snapshot, SweepOutcome, SweepResult
from monitor.page import SweepPicture
from monitor.preflight import host_problem
from monitor.protocol import Plan
from monitor.schedule import SweepScheduler
from monitor.server import Lifecycle, MetricsServer
from monitor.settings import Settings
from monitor.state import StateStore
from monitor.sweep import KILL_GRACE_S, Launcher, launch_subprocess, run_sweep
from monitor.webconfig import WebGate

log = logging.getLogger(__name__)

_DISTRIBUTIONS = {"tensorflow": ("tensorflow", "tensorflow-cpu"), "torch": ("torch",), "jax": ("jax",)}
# A sweep still running this long after its deadline means its kill path is stuck.
_STUCK_AFTER_DEADLINE_S = 30.0
_MAIN_LOOP_TICK_S = 1.0
_WAKE = 0  # on the inbox: not a signal, only "look at _stopping"
# A due sweep that has not started this long after its time means the scheduler thread is gone.
_OVERDUE_AFTER_S = 120.0
# How long stop() waits for a sweep in flight: SIGTERM, the grace, SIGKILL, reaping. The systemd
# unit's TimeoutStopSec and the pod's terminationGracePeriodSeconds must leave room for it.
STOP_WAIT_S = KILL_GRACE_S * 2 + 1


def framework_version(backend: str) -> str:
    """The installed version of a backend's framework, read from package metadata (no import)."""
    for dist in _DISTRIBUTIONS.get(backend, ()):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def open_history(settings: Settings) -> RunHistory | None:
    """The run history the settings ask for, or None (no directory, or it cannot be opened: logged)."""
    directory = settings.history.resolved_directory(os.environ)
    if directory is None:
        log.info("run history off: set history.directory (systemd's StateDirectory= sets one) to keep runs")
        return None
    try:
        return RunHistory.open(Path(directory), settings.history.keep_runs)
    except HistoryUnavailable as exc:
        log.error(f"run history off: {exc}")  # noqa: TRY400 - a machine's state, not a bug: no traceback
        return None


def trimmed_to_settings(snapshot: Snapshot, settings: Settings) -> Snapshot:
    """The snapshot without the sizes and devices ``settings`` no longer ask for (after a reload or a restart)."""
    return trimmed(snapshot, sizes=settings.benchmark.sizes, devices=settings.benchmark.devices)


def restored_state(history: RunHistory | None, settings: Settings) -> ServiceState | None:
    """What was served before the restart, trimmed to the configuration now; None for a first start."""
    restored = None if history is None else history.restore()
    if restored is None or history is None:
        return None
    state, backend = restored
    bench = settings.benchmark
    latest = state.latest
    if latest is not None and backend != bench.backend:
        log.info("run history: the served results were timed with another backend; not served again")
        latest = None
    elif latest is not None:
        latest = trimmed_to_settings(latest, settings)
    ended = "none" if latest is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(latest.finished_at))
    log.info(
        "run history: resumed",
        extra={"history": str(history.path), "sweeps": sum(n for _, n in state.sweeps), "served_sweep_ended": ended},
    )
    return dataclasses.replace(state, latest=latest)


class Service:
    """Owns the state, the scheduler and the server; ``run`` blocks until a signal stops it."""

    def __init__(
        self,
        settings: Settings,
        *,
        launch: Launcher = launch_subprocess,
        load: Callable[[], Settings] | None = None,
        web_config: Path | None = None,
        enable_lifecycle: bool = False,
    ) -> None:
        self._settings = settings
        self._launch = launch
        # Reads the configuration again for SIGHUP (the CLI's loader: file and flags); None: nothing to reread.
        self._load = load
        # What the signals ask of the main loop, as signal numbers (and _WAKE from stop()). A queue.SimpleQueue
        # because its put() is reentrant: a handler may interrupt another's put in the main thread (a burst
        # of SIGHUPs), where Event.set() would wait forever for the lock its interrupted caller holds.
        self._inbox: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._manual_lock = threading.Lock()
        self._manual_pending = False  # a manual sweep accepted and not yet ended: one 202 per sweep
        self._reload_lock = threading.Lock()  # SIGHUP and POST /-/reload may come at once
        self._reload_refusal = ""
        gate = WebGate(web_config)  # a ConfigError for a bad file: exit 78, like a bad configuration
        self._history = open_history(settings)
        self._picture = SweepPicture()
        self._remember_lock = threading.Lock()
        self._store = StateStore(restored_state(self._history, settings))
        self._store.record_config(loaded=True, at=time.time())
        self._stopping = threading.Event()
        self._cancel_sweep = threading.Event()
        self._sweep_idle = threading.Event()
        self._sweep_idle.set()
        self._sweep_started: float | None = None
        self._worker_lock = threading.Lock()
        # Devices whose failure was fatal (e.g. no such device): not retried until a restart.
        self._given_up: set[str] = set()  # devices with a fatal failure: not retried until restart
        schedule = settings.schedule
        self._scheduler = SweepScheduler(
            job=self._sweep,
            on_skipped=self._skipped,
            interval_s=schedule.interval_s,
            cron=schedule.cron,
            jitter_s=schedule.jitter_s,
        )
        backend = settings.benchmark.backend
        registry = build_registry(self.read_state, backend=backend, framework_version=framework_version(backend))
        server = settings.server
        try:
            self._server = MetricsServer(
                server.host,
                server.port,
                registry,
                healthy=self.healthy,
                ready=self.ready,
                web=gate,
                lifecycle=Lifecycle(reload=self._reload_requested_over_http, sweep=self.request_sweep)
                if enable_lifecycle
                else None,
                landing=self._landing_page,
                freshness=lambda: (self._store.read(), self._scheduler.next_run_at()),
                picture=lambda: self._picture.look(self._store.read()),
            )
        except OSError as exc:
            raise StartupError(f"cannot listen on {server.listen}: {exc.strerror or exc}") from None

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    def read_state(self) -> ServiceState:
        return dataclasses.replace(self._store.read(), next_sweep_at=self._scheduler.next_run_at())

    def healthy(self) -> tuple[bool, str]:
        if not self._scheduler.running:
            return False, "the scheduler is not running"
        due = self._scheduler.next_run_at()
        if self._sweep_started is None and due is not None and time.time() - due > _OVERDUE_AFTER_S:
            return False, f"the next sweep was due {time.time() - due:.0f}s ago and has not started"
        started = self._sweep_started
        limit = self._settings.benchmark.timeout_s + _STUCK_AFTER_DEADLINE_S
        if started is not None and time.monotonic() - started > limit:
            return False, f"a sweep has been running for more than {limit:g}s and could not be stopped"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        problem = host_problem()
        if problem is not None:
            return False, problem
        state = self._store.read()
        if state.latest is None:
            return False, "no sweep has completed yet"
        return True, "ok"

    def _sweep(self) -> None:
        plan = Plan(bench=self._settings.benchmark, guard=self._settings.guard, given_up=tuple(sorted(self._given_up)))
        self._run_worker(plan, retry=False)

    def _retry_busy(self) -> None:
        """Time again, with the CPU beside them, the GPUs the latest sweep left out as busy."""
        latest = self._store.read().latest
        busy = latest.gpus_to_retry if latest else ()
        if not busy or latest is None:
            return
        cpus = [d.device for d in latest.devices if d.kind == "cpu"]
        plan = Plan(
            # It names some GPUs only: the rest are not missing.
            bench=dataclasses.replace(self._settings.benchmark, devices=(*cpus, *busy), expect_gpus=0),
            guard=self._settings.guard,
            given_up=tuple(sorted(self._given_up)),
            retry=True,
        )
        self._run_worker(plan, retry=True)

    def _run_worker(self, plan: Plan, *, retry: bool) -> None:
        if self._stopping.is_set():
            return
        # One worker at a time: a retry never runs beside a sweep; a sweep waits for a retry to end.
        if not self._worker_lock.acquire(blocking=not retry):
            log.info("retry of busy GPUs skipped: a sweep is running")
            return
        if self._stopping.is_set():  # it waited for a retry while the service began to stop
            self._worker_lock.release()
            return
        self._sweep_idle.clear()
        self._sweep_started = time.monotonic()
        started_at = time.time()
        what = "retry" if retry else "sweep"
        try:
            outcome = self._time(plan, what, started_at)
            if self._stopping.is_set() and outcome.result is not SweepResult.SUCCESS:
                # Cut short by the stop: not a failure, and logged in the same words whatever the worker said.
                log.info(f"{what} stopped: the service is stopping", extra={"duration_s": round(outcome.duration_s, 3)})
            else:
                self._record(outcome, retry=retry)
        except Exception as exc:  # a bug must not kill the scheduler thread, nor go uncounted
            log.exception(f"{what} crashed")
            reason = f"internal error: {type(exc).__name__}: {exc}"
            failed = SweepOutcome(
                result=SweepResult.FAILED, started_at=started_at, finished_at=time.time(), reason=reason
            )
            if retry:
                self._store.record_retry(failed)
            else:
                self._store.record(failed)
            self._remember("retry" if retry else "sweep", failed)
        finally:
            self._sweep_started = None
            self._sweep_idle.set()
            self._worker_lock.release()
        try:
            self._schedule_retry()
        except Exception:  # e.g. the scheduler stopped meanwhile: the next sweep measures them anyway
            log.exception("could not schedule a retry of busy GPUs")

    def _skipped(self, reason: str) -> None:
        self._store.record_skipped()
        self._remember("skipped", None, reason)

    def _remember(self, kind: str, outcome: SweepOutcome | None, reason: str = "") -> None:
        """The run and what is served now, into the history (when there is one)."""
        if self._history is not None:
            # Read and written together: a skip recorded from the scheduler's thread while a sweep ends
            # cannot leave an older served state as the latest row.
            with self._remember_lock:
                self._history.record(kind, outcome, self._store.read(), self._settings.benchmark.backend, reason)

    def _time(self, plan: Plan, what: str, started_at: float) -> SweepOutcome:
        bench = plan.bench
        log.info(f"{what} started", extra={"backend": bench.backend, "devices": bench.devices or "auto"})
        problem = host_problem()
        if problem is not None:  # say so, not a traceback (or slow timings) per sweep
            return SweepOutcome(
                result=SweepResult.FAILED, started_at=started_at, finished_at=time.time(), reason=problem
            )
        return run_sweep(plan, timeout_s=bench.timeout_s, cancel=self._cancel_sweep, launch=self._launch)

    def _record(self, outcome: SweepOutcome, *, retry: bool) -> None:
        self._give_up_on_fatal(outcome)
        if outcome.snapshot is not None:  # a sweep that began before a reload: only what is asked for now
            outcome = dataclasses.replace(outcome, snapshot=trimmed_to_settings(outcome.snapshot, self._settings))
        fields: dict[str, object] = {"result": outcome.result.value, "duration_s": round(outcome.duration_s, 3)}
        problem = outcome.snapshot.gpu_problem if outcome.snapshot is not None else None
        if problem and problem not in outcome.reason:  # the no_gpu state's cause and fix (once: expect_gpus says it)
            fields["no_gpu"] = problem
        if retry:
            fields["result"] = self._store.record_retry(outcome).value
            self._remember("retry", outcome)
            log.info("retry finished", extra=fields)
            return
        self._store.record(outcome)
        self._remember("sweep", outcome)
        if outcome.result is SweepResult.SUCCESS:
            log.info("sweep finished", extra=fields)
        else:
            log.error("sweep failed", extra={**fields, "reason": outcome.reason})

    def _schedule_retry(self) -> None:
        """While GPUs are withheld as busy, look again every retry_interval until the next sweep is near."""
        interval = self._settings.guard.retry_interval_s
        latest = self._store.read().latest
        if interval <= 0 or latest is None or self._stopping.is_set():
            return
        if not latest.gpus_to_retry:
            return
        due = self._scheduler.next_run_at()
        if due is not None and due - time.time() <= interval:
            return  # the next sweep comes first and times them anyway
        self._scheduler.run_later(self._retry_busy, interval)

    def _give_up_on_fatal(self, outcome: SweepOutcome) -> None:
        failures = outcome.snapshot.failures if outcome.snapshot is not None else ()
        for failure in failures:
            if failure.fatal and failure.whole_device and failure.device not in self._given_up:
                self._given_up.add(failure.device)
                log.warning(
                    "device will not be retried until restart",
                    extra={"device": failure.device, "reason": failure.reason},
                )

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """Every handled signal: only put on the inbox (no lock, no logging); the main loop acts on it."""
        self._inbox.put(signum)

    def _take_signals(self, wait_s: float) -> set[int]:
        """The signals that came since the last call (a burst of one kind counts once), waiting up to ``wait_s``."""
        try:
            came = {self._inbox.get(timeout=wait_s)}
        except queue.Empty:
            return set()
        with contextlib.suppress(queue.Empty):
            while True:
                came.add(self._inbox.get_nowait())
        return came

    def _landing_page(self) -> str:
        runs = self._history.recent(20) if self._history is not None else None
        state = self.read_state()
        picture = self._picture.look(state).state  # the page's visitor will ask for it: start drawing now
        return page.render(self._settings, state, runs, picture=picture, now=time.time(), version=__version__)

    def _reload_requested_over_http(self) -> tuple[bool, str]:
        """POST /-/reload: the same as SIGHUP, answered with the outcome."""
        if self.reload():
            return True, "configuration reloaded"
        return False, f"reload refused; the running configuration stays: {self._reload_refusal}"

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

    def reload(self) -> bool:
        """Read the configuration again: a valid one takes effect at once, an invalid one is logged and ignored.

        The schedule, sizes, devices, dtypes, modes and guard change for the next sweep (one in flight
        finishes on its plan); series the new configuration no longer asks for disappear now. Where
        the service listens cannot change without a restart.
        """
        with self._reload_lock:
            return self._reload()

    def _reload(self) -> bool:
        if self._load is None:
            log.warning("reload ignored: this service was started without a configuration to reread")
            self._reload_refusal = "this service was started without a configuration file to reread"
            return False
        try:
            new = self._load()
        except ConfigError as exc:
            self._reload_refusal = str(exc)
            log.error("reload refused; the running configuration stays", extra={"problems": str(exc)})  # noqa: TRY400 - a user's mistake: the problems, no traceback
            self._store.record_config(loaded=False, at=time.time())
            return False
        if new.server != self._settings.server:
            log.warning("server.listen changes take effect at the next restart", extra={"listen": new.server.listen})
            new = dataclasses.replace(new, server=self._settings.server)
        self._settings = new
        self._scheduler.reschedule(
            interval_s=new.schedule.interval_s, cron=new.schedule.cron, jitter_s=new.schedule.jitter_s
        )
        self._store.record_config(
            loaded=True,
            at=time.time(),
            keep=lambda snapshot: trimmed_to_settings(snapshot, new),
        )
        log.info("configuration reloaded", extra={"config": new.source})
        return True

    def run(self, *, install_signal_handlers: bool = True) -> int:
        previous: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
        if install_signal_handlers:
            # SIGTERM and SIGINT stop, SIGHUP rereads the configuration, SIGUSR1 sweeps now (e.g. after a
            # driver upgrade): all acted on by the loop below, never inside the handler.
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._server.start()
            self._scheduler.start()
            host, port = self.address
            log.info("serving", extra={"listen": f"{host}:{port}", "config": self._settings.source})
            systemd.notify("READY=1")
            watchdog = systemd.watchdog_interval_s()
            tick = min(_MAIN_LOOP_TICK_S, watchdog) if watchdog else _MAIN_LOOP_TICK_S
            while not self._stopping.is_set():
                came = self._take_signals(tick)
                stop = came & {signal.SIGTERM, signal.SIGINT}
                if stop:
                    log.info("stopping", extra={"signal": signal.Signals(min(stop)).name})
                    break
                if signal.SIGHUP in came:
                    self.reload()
                if signal.SIGUSR1 in came:
                    self.request_sweep()
                if watchdog and self.healthy()[0]:
                    systemd.notify("WATCHDOG=1")
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0

    def stop(self) -> None:
        """Stop serving and kill any sweep in flight; returns within a few seconds."""
        systemd.notify("STOPPING=1")
        self._stopping.set()
        self._inbox.put(_WAKE)  # the main loop, if another thread called this
        self._cancel_sweep.set()
        self._scheduler.shutdown()
        if not self._sweep_idle.wait(STOP_WAIT_S):
            log.warning("a sweep did not stop in time; its worker is killed when this process exits")
        self._server.stop()
        if self._history is not None:
            self._history.close()
        log.info("stopped")
