"""A whole GPU node's served state, as the service would hold it after one sweep with the default settings.

What the fleet tests and ``benchmarks/fleet.py`` render: the code's own /metrics of a CPU and ``gpus`` GPUs at the
default sizes, dtypes and modes, with every hardware gauge the guard records. The times follow a plain cost model
(a fixed cost per call plus a rate), whose crossovers are derived by the real crossover code: a value here is
illustrative, its series are what a real node serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import (
    CPU_AFFINITY,
    DRIVER_VERSION,
    WORKER_CPU_SECONDS,
    WORKER_PEAK_RSS_BYTES,
    CostModel,
    DeviceInfo,
    HardwareContext,
    Measurement,
    Mode,
    Role,
    ServiceState,
    SweepOutcome,
    SweepResult,
)
from tests.builders import measurement, snapshot

BACKEND = "tensorflow"
DEFAULTS = BenchmarkSettings()
MODES: tuple[Mode, ...] = ("compute", "end_to_end")


def seconds(kind: str, mode: Mode, size: int, *, speed: float = 1.0) -> float:
    """One n×n product's time: a fixed cost per call and a rate (``speed`` scales the GPU's rate)."""
    flops = 2.0 * size**3
    if kind == "cpu":
        return 4e-6 + flops / 1.2e12
    copies = 3 * size * size * 4 / 2.0e10 + 2.5e-5 if mode == "end_to_end" else 0.0
    return 1.5e-5 + copies + flops / (4.0e14 * speed)


def _gpu(index: int) -> DeviceInfo:
    details = (
        ("compute_capability", "9.0"),
        ("uuid", f"GPU-{index:08x}"),
        ("pci_bus_id", f"00000000:{index:02X}:00.0"),
    )
    return DeviceInfo(backend=BACKEND, device=f"/GPU:{index}", kind="gpu", name="NVIDIA H200", details=details)


def _points(device: DeviceInfo, *, speed: float) -> Iterator[Measurement]:
    for dtype in DEFAULTS.dtypes:
        for mode in MODES:
            for size in DEFAULTS.sizes:
                role: Role = "fixed_cost" if size == 1 else "sweep"
                time = seconds(device.kind, mode, size, speed=speed)
                yield measurement(
                    device.device, size, time, backend=BACKEND, dtype=dtype, mode=mode, role=role, iqr_s=time * 0.02
                )


def _hardware(device: DeviceInfo) -> HardwareContext:
    if device.kind == "cpu":
        return HardwareContext(
            backend=BACKEND,
            device=device.device,
            other_cpu_cores=0.3,
            cpu_throttled_s=0.0,
            cpu_steal_cores=0.0,
            cpu_blocks_set_aside_ratio=0.0,
            host_slowdown_max=1.02,
        )
    return HardwareContext(
        backend=BACKEND,
        device=device.device,
        sm_clock_min_hz=1.98e9,
        sm_clock_max_hz=1.98e9,
        temperature_max_c=41.0,
        power_max_w=310.0,
        pcie_generation_min=5,
        pcie_width_min=16,
        pcie_generation_max=5,
        pcie_width_max=16,
        other_processes_max=0,
        worker_gpu_memory_max_bytes=600 * 2**20,
        power_limited_ratio=0.0,
        thermal_limited_ratio=0.0,
        host_wait_ratio=0.0,
        host_slowdown_max=1.01,
    )


def node_state(gpus: int = 8, *, finished_at: float = 1_795_000_000.0, speed: float = 1.0) -> ServiceState:
    """The state a node with a CPU and ``gpus`` GPUs serves after one successful sweep at the default settings."""
    cpu = DeviceInfo(backend=BACKEND, device="/CPU:0", kind="cpu", name="Intel Xeon", details=(("threads", "16"),))
    devices = (cpu, *(_gpu(i) for i in range(gpus)))
    points = tuple(p for d in devices for p in _points(d, speed=speed))
    costs = tuple(
        CostModel(
            backend=BACKEND,
            device=d.device,
            dtype=dtype,
            mode=mode,
            fixed_s=seconds(d.kind, mode, 1),
            peak_flops=2.0 * DEFAULTS.sizes[-1] ** 3 / seconds(d.kind, mode, DEFAULTS.sizes[-1], speed=speed),
            largest_size=DEFAULTS.sizes[-1],
        )
        for d in devices
        for dtype in DEFAULTS.dtypes
        for mode in MODES
    )
    environment = (
        ("framework_version", "2.21.0"),
        ("cuda_version", "12.5"),
        ("cudnn_version", "9"),
        ("tf32", "false"),
        ("cpu_threads", "15"),
        (CPU_AFFINITY, "0-15"),
        (DRIVER_VERSION, "580.159.04"),
        (WORKER_CPU_SECONDS, "61.5"),
        (WORKER_PEAK_RSS_BYTES, str(1_050_000_000)),
    )
    sweep = snapshot(
        devices,
        points,
        finished_at=finished_at,
        costs=costs,
        environment=environment,
        hardware=tuple(_hardware(d) for d in devices),
        measured_at=tuple((d.device, finished_at) for d in devices),
    )
    # As a sweep with refinement serves them: when each came, and the interval for the next sweep's n*.
    crossovers = tuple(
        dataclasses.replace(c, derived_at=finished_at, ci_lower=c.size * 0.93, ci_upper=c.size * 1.07)
        if c.size is not None
        else dataclasses.replace(c, derived_at=finished_at)
        for c in sweep.crossovers
    )
    latest = dataclasses.replace(sweep, crossovers=crossovers)
    outcome = SweepOutcome(
        result=SweepResult.SUCCESS, started_at=latest.started_at, finished_at=finished_at, snapshot=latest
    )
    counts = tuple((result, 96 if result is SweepResult.SUCCESS else 0) for result in SweepResult)
    return ServiceState(
        latest=latest,
        last_success_at=finished_at,
        last_outcome=outcome,
        sweeps=counts,
        next_sweep_at=finished_at + 900,
        config_loaded=True,
        config_loaded_at=finished_at - 86_400,
        others_typical=(0.3,) * 12,
    )
