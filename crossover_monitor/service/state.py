"""The one mutable cell of the service: the loaded configuration and the ServiceState served from it.

Both change only here, under one lock. Each run (sweep, retry, skip) is recorded in one step: its outcome
trimmed once to the configuration loaded then, what is served computed (``crossover_monitor.analysis.carry``) and
published, and that same outcome and state handed to the run history.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from dataclasses import dataclass
from typing import TypeVar

from crossover_monitor.analysis.carry import served, trimmed
from crossover_monitor.analysis.ranges import others_gate
from crossover_monitor.config.settings import GuardSettings, Settings
from crossover_monitor.model import (
    Measurement,
    PointMedians,
    RetryResult,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
    same_timing,
    timed_with,
)
from crossover_monitor.service.history import RunHistory

# Sweeps whose host reference the baseline is the lower decile of: a day at the default 15-minute schedule.
HOST_REFERENCES_KEPT = 96
# Calm sweeps whose median of a point its idle range comes from: half a day at the default schedule (the served
# state, which the history writes after each run, holds this many for every configured point).
POINT_MEDIANS_KEPT = 48


@dataclass(frozen=True, kw_only=True)
class SkippedBurst:
    """Scheduled sweeps skipped one after another (while one ran): one row in the run history, one log line."""

    count: int
    first_at: float  # unix seconds
    last_at: float
    reason: str

    @property
    def described(self) -> str:
        """The history row's reason: how many, and why."""
        return self.reason if self.count == 1 else f"{self.reason} ({self.count} scheduled sweeps skipped)"


class StateStore:
    """Readers get an immutable ServiceState and the loaded Settings; writers replace them atomically."""

    def __init__(self, initial: ServiceState | None = None, *, history: RunHistory | None = None) -> None:
        self._lock = threading.Lock()
        # Held from a run's change of the state until its history write: runs reach the history in the order
        # they were served (a skip from the scheduler's thread as a sweep ends cannot leave the older state as
        # the latest row), while a reload, which takes only _lock, never waits for the disk.
        self._history_order = threading.Lock()
        self._state = initial or ServiceState()
        self._settings: Settings | None = None  # None until a configuration is recorded: every series is served
        self._history = history
        self._skipped: SkippedBurst | None = None  # counted and served, not yet in the history (under _lock)

    def read(self) -> ServiceState:
        return self._state  # a reference read is atomic; the object itself never changes

    @property
    def settings(self) -> Settings:
        """The loaded configuration: what sweeps are planned from and what is served of them."""
        settings = self._settings
        if settings is None:  # the service records its start-up configuration before anything reads it
            raise LookupError("no configuration has been recorded in this store")
        return settings

    def record(self, outcome: SweepOutcome) -> None:
        """A finished sweep: its snapshot (if the worker completed) replaces the served one."""
        with self._history_order:
            with self._lock:
                outcome = self._as_loaded(outcome)
                state = _paid(_counted(self._state, outcome.result), "sweep", outcome)
                changes: dict[str, object] = {"last_outcome": outcome}
                if outcome.snapshot is not None:
                    changes["latest"], changes["recent"] = served(state.latest, outcome.snapshot, recent=state.recent)
                if outcome.result.measured:
                    changes["last_success_at"] = outcome.finished_at
                reference = outcome.snapshot.host_reference if outcome.snapshot is not None else None
                if reference is not None:  # withheld sweeps too: a lasting change of the host must become the figure
                    changes["host_references"] = (*state.host_references, reference)[-HOST_REFERENCES_KEPT:]
                if outcome.snapshot is not None:
                    # What the worker says it ran with: other threads, a framework or driver upgrade move the
                    # points, and their ranges start again (also for a sweep planned before a reload).
                    environment = dict(outcome.snapshot.environment)
                    earlier = state.point_medians_timed_as
                    kept = state.point_medians if same_timing(earlier, environment) else ()
                    changes["point_medians"] = self._with_calm_medians(kept, outcome.snapshot, state.usual_others)
                    typical = _typical_others(outcome.snapshot)
                    if typical is not None:
                        changes["others_typical"] = (*state.others_typical, typical)[-HOST_REFERENCES_KEPT:]
                    changes["point_medians_timed_as"] = timed_with(environment, earlier if kept else "")
                self._state = state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]
            self._remember("sweep", outcome, state)

    def record_retry(self, outcome: SweepOutcome) -> RetryResult:
        """A retry of withheld devices: what it measured is laid over the served snapshot; counted apart from sweeps,
        by what the configuration still asks for (a GPU a reload removed is not still busy)."""
        with self._history_order:
            with self._lock:
                outcome = self._as_loaded(outcome)
                state = _paid(self._state, "retry", outcome)
                snapshot = outcome.snapshot
                if snapshot is None or not outcome.result.completed:
                    result = RetryResult.FAILED
                elif snapshot.devices_to_retry:
                    result = RetryResult.BUSY
                else:
                    result = RetryResult.MEASURED
                changes: dict[str, object] = {"retries": _bumped(state.retries, result)}
                if snapshot is not None and state.latest is not None:
                    changes["latest"], changes["recent"] = served(
                        state.latest, snapshot, recent=state.recent, partial=True
                    )
                self._state = state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]
            self._remember("retry", outcome, state)
            return result

    def record_skipped(self, reason: str, *, at: float | None = None) -> None:
        """A scheduled sweep that did not run (``reason`` says why), at unix time ``at`` (None: now): counted and
        served now, and kept with the skips before it until ``end_skipped`` (no history write each: at a 1 s
        interval a slow sweep skips one a second, and each write holds the whole served state)."""
        at = time.time() if at is None else at
        with self._lock:
            self._state = _counted(self._state, SweepResult.SKIPPED)
            burst = self._skipped
            self._skipped = SkippedBurst(
                count=1 if burst is None else burst.count + 1,
                first_at=at if burst is None else burst.first_at,
                last_at=at,
                reason=reason if burst is None else burst.reason,
            )

    def end_skipped(self) -> SkippedBurst | None:
        """The sweeps skipped since the last call, into the history as one row (with the state served now, which
        counts them, so that a restart resumes the count); None if there were none."""
        with self._history_order:
            with self._lock:
                burst, self._skipped = self._skipped, None
                state = self._state
            if burst is not None:
                self._remember("skipped", None, state, burst.described, since=burst.first_at)
            return burst

    def record_config(self, settings: Settings, *, at: float) -> None:
        """A configuration that took (start-up or reload): sweeps are planned from it and only what it asks for
        is served from now on: the served snapshot loses the rest now, each later sweep's and retry's as it
        is recorded."""
        with self._lock:
            self._settings = settings
            state = self._state
            latest = None if state.latest is None else trimmed(state.latest, settings.benchmark)
            self._state = dataclasses.replace(state, config_loaded=True, config_loaded_at=at, latest=latest)

    def record_config_refused(self) -> None:
        """A reload whose configuration did not take: the loaded one stays, and the state says so."""
        with self._lock:
            self._state = dataclasses.replace(self._state, config_loaded=False)

    def record_next_sweep(self, at: float | None) -> None:
        """When the schedule's next sweep is due; the same time again leaves the state (and its /metrics) as it is."""
        with self._lock:
            if at != self._state.next_sweep_at:
                self._state = dataclasses.replace(self._state, next_sweep_at=at)

    def record_next_retry(self, at: float | None) -> None:
        """When the devices withheld in the latest sweep are tried again (None: not before the next sweep)."""
        with self._lock:
            if at != self._state.next_retry_at:
                self._state = dataclasses.replace(self._state, next_retry_at=at)

    def _with_calm_medians(
        self, kept: tuple[PointMedians, ...], snapshot: Snapshot, floor: float
    ) -> tuple[PointMedians, ...]:
        """``kept`` with this sweep's median of each configured point it timed while others used less than
        ``guard.range_others_cores`` (on a node never that quiet, that much above its usual load ``floor``, from
        the sweeps before: ``others_gate``; a refinement's sizes change from sweep to sweep: they have no range to
        keep), and without sizes the configuration no longer asks for. Under _lock.

        Calm points only: a point timed beside others' load is what the range judges, and letting it in would
        let a neighbour that stays widen the range until its slowdown passed (one there in nine sweeps of ten
        becomes the usual load). A lasting change of a point (a driver, a framework) enters with the first calm
        sweeps that time it, as its median is published."""
        settings = self._settings
        others_at_most = others_gate(
            floor, (settings.guard if settings is not None else GuardSettings()).range_others_cores
        )
        timed = {m.key: m.timing.median_s for m, others in _metered_points(snapshot) if others < others_at_most}
        by_key = {k.key: k for k in kept}
        for key, median in timed.items():
            earlier = by_key[key].medians_s if key in by_key else ()
            by_key[key] = PointMedians(key=key, medians_s=(*earlier, median)[-POINT_MEDIANS_KEPT:])
        if settings is not None:  # the n = 1 point is timed for the fixed cost whether or not it is configured
            sizes = {1, *settings.benchmark.sizes}
            by_key = {key: medians for key, medians in by_key.items() if key.size in sizes}
        return tuple(by_key.values())

    def _as_loaded(self, outcome: SweepOutcome) -> SweepOutcome:
        """The outcome with only what the loaded configuration asks for (a reload may come mid-sweep). Under _lock:
        the one trim of a run, which the served state and the history both hold."""
        if outcome.snapshot is None or self._settings is None:
            return outcome
        return dataclasses.replace(outcome, snapshot=trimmed(outcome.snapshot, self._settings.benchmark))

    def _remember(
        self, kind: str, outcome: SweepOutcome | None, state: ServiceState, reason: str = "", since: float | None = None
    ) -> None:
        """The run and the state served after it, into the history (when there is one). Under _history_order."""
        if self._history is not None:
            self._history.record(kind, outcome, state, self.settings.benchmark.backend, reason, since=since)


def _metered_points(snapshot: Snapshot) -> list[tuple[Measurement, float]]:
    """The sweep's configured points that say what others used of the host over them, with that load (a
    refinement's sizes change from sweep to sweep; a carried point was counted by the sweep that timed it)."""
    return [
        (m, m.others_cores)
        for m in snapshot.measurements
        if m.role != "refine" and m.others_cores is not None and not m.carried
    ]


def _typical_others(snapshot: Snapshot) -> float | None:
    """The median of what others used of the host over the sweep's metered configured points (None: none said)."""
    readings = [others for _, others in _metered_points(snapshot)]
    return statistics.median(readings) if readings else None


def _paid(state: ServiceState, run: str, outcome: SweepOutcome) -> ServiceState:
    """The state with the worker CPU time of ``outcome`` (a run of kind ``run``) added, where the worker said it."""
    cost = outcome.worker_cpu_seconds
    if cost is None:
        return state
    paid = tuple((k, s + cost if k == run else s) for k, s in state.worker_cpu_s)
    return dataclasses.replace(state, worker_cpu_s=paid)


def _counted(state: ServiceState, result: SweepResult) -> ServiceState:
    return dataclasses.replace(state, sweeps=_bumped(state.sweeps, result))


K = TypeVar("K")


def _bumped(counts: tuple[tuple[K, int], ...], key: K) -> tuple[tuple[K, int], ...]:
    """The counts with one more for ``key``."""
    return tuple((k, n + 1 if k is key else n) for k, n in counts)
