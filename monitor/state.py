"""The one mutable cell of the service: the current ServiceState, replaced whole under a lock."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TypeVar

from monitor.carry import merge
from monitor.crossover import with_recent_moves
from monitor.model import RetryResult, ServiceState, Snapshot, SweepOutcome, SweepResult


class StateStore:
    """Readers get an immutable ServiceState; writers replace it atomically."""

    def __init__(self, initial: ServiceState | None = None) -> None:
        self._lock = threading.Lock()
        self._state = initial or ServiceState()

    def read(self) -> ServiceState:
        return self._state  # a reference read is atomic; the object itself never changes

    def _counted(self, state: ServiceState, result: SweepResult) -> ServiceState:
        return dataclasses.replace(state, sweeps=_bumped(state.sweeps, result))

    def record(self, outcome: SweepOutcome) -> None:
        """A finished sweep: its snapshot (if the worker completed) replaces the served one."""
        with self._lock:
            state = self._counted(self._state, outcome.result)
            changes: dict[str, object] = {"last_outcome": outcome}
            if outcome.snapshot is not None:
                changes.update(_served(merge(state.latest, outcome.snapshot), state, outcome.snapshot.finished_at))
            if outcome.result is SweepResult.SUCCESS:
                changes["last_success_at"] = outcome.finished_at
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]

    def record_retry(self, outcome: SweepOutcome) -> RetryResult:
        """A retry of busy GPUs: what it measured is laid over the served snapshot; counted apart from sweeps."""
        with self._lock:
            state = self._state
            snapshot = outcome.snapshot
            if snapshot is None or outcome.result is not SweepResult.SUCCESS:
                result = RetryResult.FAILED
            elif snapshot.gpus_to_retry:
                result = RetryResult.BUSY
            else:
                result = RetryResult.MEASURED
            changes: dict[str, object] = {"retries": _bumped(state.retries, result)}
            if snapshot is not None and state.latest is not None:
                changes.update(_served(merge(state.latest, snapshot, partial=True), state, snapshot.finished_at))
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]
            return result

    def record_config(self, *, loaded: bool, at: float, keep: Callable[[Snapshot], Snapshot] | None = None) -> None:
        """A configuration (re)load: whether it took; ``keep`` trims the served snapshot to the new configuration."""
        with self._lock:
            state = self._state
            changes: dict[str, object] = {"config_loaded": loaded}
            if loaded:
                changes["config_loaded_at"] = at
                if keep is not None and state.latest is not None:
                    changes["latest"] = keep(state.latest)
            self._state = dataclasses.replace(state, **changes)  # type: ignore[arg-type]

    def record_skipped(self) -> None:
        with self._lock:
            self._state = self._counted(self._state, SweepResult.SKIPPED)


def _served(snapshot: Snapshot, state: ServiceState, fresh_at: float) -> dict[str, object]:
    """The snapshot to serve, its fresh crossovers' intervals widened by their recent moves, and those moves."""
    crossovers, recent = with_recent_moves(snapshot.crossovers, state.recent, fresh_at=fresh_at)
    return {"latest": dataclasses.replace(snapshot, crossovers=crossovers), "recent": recent}


K = TypeVar("K")


def _bumped(counts: tuple[tuple[K, int], ...], key: K) -> tuple[tuple[K, int], ...]:
    """The counts with one more for ``key``."""
    return tuple((k, n + 1 if k is key else n) for k, n in counts)
