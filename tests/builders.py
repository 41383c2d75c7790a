"""Shared builders of the value objects tests compare: timings, point keys, measurements, crossovers, snapshots.

Each takes only what a test is about; everything else has a plain default (one visit, converged, not
noisy), so a test reads as its point, not as boilerplate. ``FULL_SNAPSHOT`` is one sweep with an entry of
every kind, for the round trips and stores that must give back all of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from crossover_monitor.analysis.crossover import crossovers as derive_crossovers
from crossover_monitor.model import (
    Crossover,
    CrossoverState,
    DeviceInfo,
    HardwareContext,
    Measurement,
    Mode,
    PointKey,
    Role,
    Snapshot,
    StopReason,
    Timing,
    Withheld,
    WithheldReason,
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


# A served sweep with an entry of every kind (a GPU with its UUID, a point with its samples, a found n*, a
# withheld GPU, a hardware context, when each device was measured): what a round trip or a store must give back.
FULL_SNAPSHOT = snapshot(
    (DeviceInfo(backend="torch", device="cuda:0", kind="gpu", name="H200", details=(("uuid", "GPU-1"),)),),
    (measurement("cuda:0", 1024, 6e-5, backend="torch", iqr_s=1e-6, calls_per_block=300, samples_s=(6e-5, 6.1e-5)),),
    started_at=1.0,
    finished_at=2.0,
    crossovers=(crossover(backend="torch", gpu="cuda:0", cpu="cpu", size=140.5),),
    withheld=(Withheld(backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="pid 7"),),
    hardware=(HardwareContext(backend="torch", device="cuda:0", clock_events=("sw_power_cap",), pcie_width_min=16),),
    measured_at=(("cuda:0", 2.0),),
)
