"""Shared builders of the value objects tests compare: timings, point keys, measurements, crossovers, snapshots.

Each takes only what a test is about; everything else has a plain default (one visit, converged, not
noisy), so a test reads as its point, not as boilerplate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from monitor.crossover import crossovers as derive_crossovers
from monitor.model import (
    Crossover,
    CrossoverState,
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


def point_key(
    device: str, size: int, *, backend: str = "fake", dtype: str = "float32", mode: Mode = "compute"
) -> PointKey:
    """The point of ``device`` at ``size`` (float32, compute mode, the fake backend unless told)."""
    return PointKey(backend=backend, device=device, dtype=dtype, mode=mode, size=size)


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
    key = point_key(device, size, backend=backend, dtype=dtype, mode=mode)
    return Measurement(key=key, timing=timing(seconds, **timing_fields), role=role)


def crossover(
    state: CrossoverState = CrossoverState.FOUND,
    *,
    backend: str = "fake",
    gpu: str = "/GPU:0",
    cpu: str = "/CPU:0",
    dtype: str = "float32",
    mode: Mode = "compute",
    **fields: Any,
) -> Crossover:
    """The crossover of ``gpu`` against ``cpu`` in ``state``; ``fields`` give the rest (size, lower, ci_upper, …)."""
    return Crossover(backend=backend, gpu=gpu, cpu=cpu, dtype=dtype, mode=mode, state=state, **fields)


def snapshot(
    devices: Iterable[DeviceInfo] = (),
    measurements: Iterable[Measurement] = (),
    *,
    finished_at: float = 1_795_000_000.0,
    started_at: float | None = None,
    crossovers: Iterable[Crossover] | None = None,
    **fields: Any,
) -> Snapshot:
    """A completed sweep of ``devices`` (5 s long unless it started at ``started_at``): its crossovers derived
    from ``measurements`` unless given; ``fields`` give the rest (costs, withheld, hardware, environment, …)."""
    devices, measurements = tuple(devices), tuple(measurements)
    found = derive_crossovers(devices, measurements) if crossovers is None else tuple(crossovers)
    return Snapshot(
        started_at=finished_at - 5 if started_at is None else started_at,
        finished_at=finished_at,
        devices=devices,
        measurements=measurements,
        crossovers=found,
        **fields,
    )
