"""The long-running service's life cycle: HTTP server, signals, reloads, service-manager notification.

The sweeps themselves (schedule, retries, manual runs, recording) are ``crossover_monitor.service.coordinator``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from crossover_monitor import __version__
from crossover_monitor.config.settings import Settings
from crossover_monitor.errors import ConfigError, StartupError
from crossover_monitor.http import page
from crossover_monitor.http.page import SweepPicture
from crossover_monitor.http.server import Lifecycle, MetricsServer
from crossover_monitor.http.webconfig import WebGate
from crossover_monitor.metrics import render_state, with_process_metrics
from crossover_monitor.model import ServiceState
from crossover_monitor.service import systemd
from crossover_monitor.service.coordinator import SweepCoordinator
from crossover_monitor.service.history import HistoryBusy, HistoryUnavailable, RunHistory
from crossover_monitor.service.preflight import host_problem
from crossover_monitor.service.state import StateStore
from crossover_monitor.service.sweep import Launcher, launch_subprocess

log = logging.getLogger(__name__)

_MAIN_LOOP_TICK_S = 1.0
_WAKE = 0  # on the inbox: not a signal, only "look at _stopping"


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


def _changed_keys(old: Settings, new: Settings) -> list[str]:
    """The settings a reload changed, as ``section.field`` (what the log says, so a half-written file shows)."""
    changed = []
    for section in dataclasses.fields(Settings):
        before, after = getattr(old, section.name), getattr(new, section.name)
        if before == after or not dataclasses.is_dataclass(before):
            continue
        changed += [
            f"{section.name}.{f.name}"
            for f in dataclasses.fields(before)
            if getattr(before, f.name) != getattr(after, f.name)
        ]
    return changed


def restored_state(history: RunHistory | None, settings: Settings) -> ServiceState | None:
    """What was served before the restart (if the same backend timed it); None for a first start."""
    restored = None if history is None else history.restore()
    if restored is None or history is None:
        return None
    state, backend = restored
    bench = settings.benchmark
    latest = state.latest
    if latest is not None and backend != bench.backend:
        log.info("run history: the served results were timed with another backend; not served again")
        latest = None
    ended = "none" if latest is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(latest.finished_at))
    log.info(
        "run history: resumed",
        extra={"history": str(history.path), "sweeps": sum(n for _, n in state.sweeps), "served_sweep_ended": ended},
    )
    return dataclasses.replace(state, latest=latest)


class Service:
    """Owns the store (configuration and served state), the sweeps' coordinator and the server; ``run`` blocks
    until a signal stops it."""

    def __init__(
        self,
        settings: Settings,
        *,
        launch: Launcher = launch_subprocess,
        load: Callable[[], Settings] | None = None,
        web_config: Path | None = None,
        enable_lifecycle: bool = False,
    ) -> None:
        # Reads the configuration again for SIGHUP (the CLI's loader: file and flags); None: nothing to reread.
        self._load = load
        # What the signals ask of the main loop, as signal numbers (and _WAKE from stop()). A queue.SimpleQueue
        # because its put() is reentrant: a handler may interrupt another's put in the main thread (a burst
        # of SIGHUPs), where Event.set() would wait forever for the lock its interrupted caller holds.
        self._inbox: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._reload_lock = threading.Lock()  # SIGHUP and POST /-/reload may come at once
        self._reload_refusal = ""
        gate = WebGate(web_config)  # a ConfigError for a bad file: exit 78, like a bad configuration
        self._history = open_history(settings)
        self._picture = SweepPicture()
        self._store = StateStore(restored_state(self._history, settings), history=self._history)
        self._store.record_config(settings, at=time.time())  # trims what was restored
        self._stopping = threading.Event()
        self._sweeps = SweepCoordinator(self._store, launch=launch)
        backend = settings.benchmark.backend
        server = settings.server
        try:
            self._server = MetricsServer(
                server.host,
                server.port,
                self.read_state,
                render_metrics=functools.partial(render_state, backend=backend),
                add_process=with_process_metrics,
                healthy=self.healthy,
                ready=self.ready,
                web=gate,
                lifecycle=Lifecycle(reload=self._reload_requested_over_http, sweep=self.request_sweep)
                if enable_lifecycle
                else None,
                landing=self._landing_page,
                picture=lambda: self._picture.look(self._store.read()),
            )
        except OSError as exc:
            raise StartupError(f"cannot listen on {server.listen}: {exc.strerror or exc}") from None

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    def read_state(self) -> ServiceState:
        return self._store.read()

    @property
    def settings(self) -> Settings:
        """The configuration running now (the last one that took)."""
        return self._store.settings

    def healthy(self) -> tuple[bool, str]:
        problem = self._sweeps.stuck()
        return (False, problem) if problem is not None else (True, "ok")

    def request_sweep(self) -> tuple[bool, str]:
        """A sweep now (SIGUSR1, POST /-/sweep); see ``SweepCoordinator.request_sweep``."""
        return self._sweeps.request_sweep()

    def ready(self) -> tuple[bool, str]:
        problem = host_problem()
        if problem is not None:
            return False, problem
        state = self._store.read()
        if state.latest is None:
            return False, "no sweep has completed yet"
        return True, "ok"

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
        runs, problem = None, ""
        if self._history is not None:
            try:
                runs = self._history.recent(20)
            except HistoryBusy as exc:  # another process's lock: the page does not wait for it
                problem = f"{self._history.path} {exc}"
        state = self.read_state()
        picture = self._picture.look(state).state  # drawn now if not yet: the page says whether it could be
        return page.render(
            self.settings, state, runs, picture=picture, now=time.time(), version=__version__, history_problem=problem
        )

    def _reload_requested_over_http(self) -> tuple[bool, str]:
        """POST /-/reload: the same as SIGHUP, answered with the outcome."""
        if self.reload():
            return True, "configuration reloaded"
        return False, f"reload refused; the running configuration stays: {self._reload_refusal}"

    def reload(self) -> bool:
        """Read the configuration again: a valid one takes effect at once, an invalid one is logged and ignored.

        The schedule, sizes, devices, dtypes, modes and guard change for the next sweep (one in flight
        finishes on its plan); series the new configuration no longer asks for disappear now. Where
        the service listens and which backend it times with cannot change without a restart.
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
            self._store.record_config_refused()
            return False
        running = self.settings
        if new.server != running.server:
            log.warning("server.listen changes take effect at the next restart", extra={"listen": new.server.listen})
            new = dataclasses.replace(new, server=running.server)
        if new.benchmark.backend != running.benchmark.backend:
            # /metrics labels its series with the backend read at start; sweeps with another backend under
            # them would be served under the wrong name. (The framework's version comes with each sweep.)
            log.warning(
                "benchmark.backend changes take effect at the next restart", extra={"backend": new.benchmark.backend}
            )
            new = dataclasses.replace(
                new, benchmark=dataclasses.replace(new.benchmark, backend=running.benchmark.backend)
            )
        changed = _changed_keys(running, new)
        self._store.record_config(new, at=time.time())
        self._sweeps.reschedule()
        log.info("configuration reloaded", extra={"config": new.source, "changed": ", ".join(changed) or "nothing"})
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
            self._sweeps.start()
            host, port = self.address
            log.info("serving", extra={"listen": f"{host}:{port}", "config": self.settings.source})
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
                # Stopped, the process is on its way out: a late SIGHUP or SIGTERM (a reload storm, a second
                # stop) whose default action is restored would kill it, and its exit would read as a crash.
                signal.signal(sig, signal.SIG_IGN if handler == signal.SIG_DFL else handler)
        return 0

    def stop(self) -> None:
        """Stop serving and kill any sweep in flight; returns within a few seconds."""
        systemd.notify("STOPPING=1")
        self._stopping.set()
        self._inbox.put(_WAKE)  # the main loop, if another thread called this
        if not self._sweeps.stop():
            log.warning("a sweep did not stop in time; its worker is killed when this process exits")
        self._server.stop()
        if self._history is not None:
            self._history.close()
        log.info("stopped")
