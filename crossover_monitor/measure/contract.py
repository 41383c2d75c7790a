"""What every backend must provide; the runner and the worker depend only on this.

A backend is created in the worker process by a factory ``create(options) -> Backend``
named in ``crossover_monitor.measure.registry``. It may raise, from any method:

- ``BackendUnavailable`` — the framework cannot be imported or initialised (fatal);
- ``DeviceUnavailable`` — a device cannot be used; the rest of the sweep goes on without it;
- ``PlacementError`` — a result landed on another device than the one timed (fatal for it);
- ``MeasurementFailed`` — one point failed (e.g. out of memory); the next point is tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from crossover_monitor.model import DeviceInfo, Mode

# Runs ``calls`` multiplications back to back and returns only when all of them are complete
# (synchronised with the device) and their results were checked to live where they were timed.
# The timing loop ignores what it returns; the built-in backends return the last product, so that
# their accuracy check (``CheckedBackend``) reads the result of the very block that is timed.
RunBlock = Callable[[int], object]


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What changes the answer and is set before the framework starts."""

    tf32: bool
    cpu_threads: int


class Backend(Protocol):
    name: str

    def environment(self) -> Mapping[str, str]:
        """Versions and settings that change the answer (framework, CUDA, TF32, threads).

        A backend that finds no GPU adds ``GPU_PROBLEM`` (``crossover_monitor.model``): why, and how to fix it, in one
        sentence (``crossover_monitor.measure.nogpu.explain``); it is shown wherever the ``no_gpu`` state is.
        """
        ...

    def discover(self) -> Sequence[DeviceInfo]:
        """The CPU and every visible GPU, named as the framework names them."""
        ...

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        """Create operands for one point (outside any timed region) and return its block runner."""
        ...


class CheckedBackend(Backend, Protocol):
    """A backend that can also show its products are right (all built-in ones can).

    Kept apart from ``Backend`` because the runner never needs it: a plug-in or fake backend that
    only times stays a valid backend, and the contract tests hold every built-in one to this too.
    """

    def check(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> float:
        """Multiply seeded operands once, with the block ``prepare`` would time, and return the
        relative error ``max|C - A·B| / max|A·B|`` against float64 (``common.relative_error``).

        Raises what ``prepare`` raises.
        """
        ...


BackendFactory = Callable[[BackendOptions], Backend]
