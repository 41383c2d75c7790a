"""Shared builders of the value objects tests compare: timings, measurements and snapshots with defaults.

Each takes only what a test is about; everything else has a plain default (one visit, converged, not
noisy), so a test reads as its point, not as boilerplate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from monitor.crossover import crossovers as derive_crossovers
from monitor.model import (
    Crossover,
    DeviceInfo,
    Measurement,
    Mode,
    PointKey,
    Role,
    Snapshot,
    StopReason,
    Timing,
)


def timing(seconds: float, **fields: Any) -> Timing:
    """A converged timing of ``seconds`` per call; ``fields`` override the rest (iqr_s, blocks, noisy, …)."""
    plain: dict[str, Any] = {
        "median_s": seconds,
        "iqr_s": 0.0,
        "blocks": 5,
        "calls_per_block": 1,
        "stop_reason": StopReason.CONVERGED,
        "noisy": False,
    }
    return Timing(**{**plain, **fields})


def measurement(
    device: str,
    size: int,
    seconds: float,
    *,
    backend: str = "fake",
    dtype: str = "float32",
    mode: Mode = "compute",
    role: Role = "sweep",
    **timing_fields: Any,
) -> Measurement:
    """One point of ``device`` at ``size`` taking ``seconds`` per call."""
    key = PointKey(backend=backend, device=device, dtype=dtype, mode=mode, size=size)
    return Measurement(key=key, timing=timing(seconds, **timing_fields), role=role)


def snapshot(
    devices: Iterable[DeviceInfo],
    measurements: Iterable[Measurement] = (),
    *,
    finished_at: float = 1_795_000_000.0,
    crossovers: Iterable[Crossover] | None = None,
    **fields: Any,
) -> Snapshot:
    """A completed sweep of ``devices``: its crossovers derived from ``measurements`` unless given."""
    devices, measurements = tuple(devices), tuple(measurements)
    found = derive_crossovers(devices, measurements) if crossovers is None else tuple(crossovers)
    return Snapshot(
        started_at=finished_at - 5,
        finished_at=finished_at,
        devices=devices,
        measurements=measurements,
        crossovers=found,
        **fields,
    )
