"""What every backend must provide; the runner and the worker depend only on this.

A backend is created in the worker process by a factory ``create(options) -> Backend``
named in ``monitor.bench.registry``. It may raise, from any method:

- ``BackendUnavailable`` — the framework cannot be imported or initialised (fatal);
- ``DeviceUnavailable`` — a device cannot be used; the rest of the sweep goes on without it;
- ``PlacementError`` — a result landed on another device than the one timed (fatal for it);
- ``MeasurementFailed`` — one point failed (e.g. out of memory); the next point is tried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from monitor.model import DeviceInfo, Mode

# Runs ``calls`` multiplications back to back and returns only when all of them are complete
# (synchronised with the device) and their results were checked to live where they were timed.
RunBlock = Callable[[int], None]


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What changes the answer and is set before the framework starts."""

    tf32: bool
    cpu_threads: int


class Backend(Protocol):
    name: str

    def environment(self) -> Mapping[str, str]:
        """Versions and settings that change the answer (framework, CUDA, TF32, threads)."""
        ...

    def discover(self) -> Sequence[DeviceInfo]:
        """The CPU and every visible GPU, named as the framework names them."""
        ...

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        """Create operands for one point (outside any timed region) and return its block runner."""
        ...


BackendFactory = Callable[[BackendOptions], Backend]
