"""The one mutable cell of the service: the current ServiceState, replaced whole under a lock.

What is served changes only here, as ``crossover_monitor.carry`` says: each sweep, retry and configuration is handed in.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TypeVar

from crossover_monitor.carry import Wanted, served, trimmed
from crossover_monitor.model import RetryResult, ServiceState, SweepOutcome, SweepResult

# Sweeps whose host reference the baseline is the median of: a day at the default 15-minute schedule.
HOST_REFERENCES_KEPT = 96


class StateStore:
    """Readers get an immutable ServiceState; writers replace it atomically."""

    def __init__(self, initial: ServiceState | None = None) -> None:
        self._lock = threading.Lock()
        self._state = initial or ServiceState()
        self._wanted: Wanted | None = None  # the loaded configuration's; None until one is recorded: all

    def read(self) -> ServiceState:
        return self._state  # a reference read is atomic; the object itself never changes

    def _counted(self, state: ServiceState, result: SweepResult) -> ServiceState:
        return dataclasses.replace(state, sweeps=_bumped(state.sweeps, result))

    def as_wanted(self, outcome: SweepOutcome) -> SweepOutcome:
        """The outcome with only what the loaded configuration asks for (a reload may come mid-sweep): what
        is recorded of it, here and in the run history."""
        if outcome.snapshot is None or self._wanted is None:
            return outcome
        return dataclasses.replace(outcome, snapshot=trimmed(outcome.snapshot, self._wanted))

    def record(self, outcome: SweepOutcome) -> None:
        """A finished sweep: its snapshot (if the worker completed) replaces the served one."""
        with self._lock:
            outcome = self.as_wanted(outcome)
            state = self._counted(self._state, outcome.result)
            changes: dict[str, object] = {"last_outcome": outcome}
            if outcome.snapshot is not None:
                changes["latest"], changes["recent"] = served(
                    state.latest, outcome.snapshot, wanted=self._wanted, recent=state.recent
                )
            if outcome.result.measured:
                changes["last_success_at"] = outcome.finished_at
            reference = outcome.snapshot.host_reference if outcome.snapshot is not None else None
            if reference is not None:  # withheld sweeps too: a lasting change of the host must become the figure
                changes["host_references"] = (*state.host_references, reference)[-HOST_REFERENCES_KEPT:]
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]

    def record_retry(self, outcome: SweepOutcome) -> RetryResult:
        """A retry of busy GPUs: what it measured is laid over the served snapshot; counted apart from sweeps,
        by what the configuration still asks for (a GPU a reload removed is not still busy)."""
        with self._lock:
            outcome = self.as_wanted(outcome)
            state = self._state
            snapshot = outcome.snapshot
            if snapshot is None or not outcome.result.completed:
                result = RetryResult.FAILED
            elif snapshot.gpus_to_retry:
                result = RetryResult.BUSY
            else:
                result = RetryResult.MEASURED
            changes: dict[str, object] = {"retries": _bumped(state.retries, result)}
            if snapshot is not None and state.latest is not None:
                changes["latest"], changes["recent"] = served(
                    state.latest, snapshot, wanted=self._wanted, recent=state.recent, partial=True
                )
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]
            return result

    def record_config(self, *, loaded: bool, at: float, wanted: Wanted | None = None) -> None:
        """A configuration (start-up or reload): whether it took. One that took serves only what it ``wanted``
        from now on: the served snapshot loses the rest now, each later sweep's and retry's as it is recorded."""
        with self._lock:
            state = self._state
            changes: dict[str, object] = {"config_loaded": loaded}
            if loaded:
                changes["config_loaded_at"] = at
                self._wanted = wanted
                if wanted is not None and state.latest is not None:
                    changes["latest"] = trimmed(state.latest, wanted)
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]

    def record_next_sweep(self, at: float | None) -> None:
        """When the schedule's next sweep is due; the same time again leaves the state (and its /metrics) as it is."""
        with self._lock:
            if at != self._state.next_sweep_at:
                self._state = dataclasses.replace(self._state, next_sweep_at=at)

    def record_skipped(self) -> None:
        with self._lock:
            self._state = self._counted(self._state, SweepResult.SKIPPED)


K = TypeVar("K")


def _bumped(counts: tuple[tuple[K, int], ...], key: K) -> tuple[tuple[K, int], ...]:
    """The counts with one more for ``key``."""
    return tuple((k, n + 1 if k is key else n) for k, n in counts)
