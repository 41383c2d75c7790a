"""Times a plan against a backend point by point and emits what it finds as messages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from monitor.bench.contract import Backend
from monitor.bench.timing import Clock, measure
from monitor.errors import BackendError, MeasurementFailed
from monitor.model import DeviceFailure, DeviceInfo, Measurement, PointKey
from monitor.protocol import Environment, Message, Plan

Emit = Callable[[Message], None]


def canonical_device(name: str) -> str:
    """A device name compared loosely: '/device:GPU:0', '/GPU:0' and 'gpu:0' are one device."""
    return name.strip().lower().removeprefix("/").removeprefix("device:")


def select_devices(backend: Backend, requested: Sequence[str] | None, emit: Emit) -> list[DeviceInfo]:
    """The discovered devices the plan asks for; each requested one that is missing is a fatal failure."""
    found = list(backend.discover())
    if requested is None:
        return found
    by_name = {canonical_device(d.device): d for d in found}
    chosen = []
    for name in requested:
        device = by_name.get(canonical_device(name))
        if device is None:
            available = ", ".join(d.device for d in found) or "none"
            reason = f"no such device (this machine has: {available})"
            emit(DeviceFailure(backend=backend.name, device=name, reason=reason, fatal=True))
        else:
            chosen.append(device)
    return chosen


def run_plan(plan: Plan, backend: Backend, emit: Emit, clock: Clock) -> None:
    """Time every (dtype, mode, size, device) of the plan; a failed device is left out from then on.

    Sizes are the outer loop over devices so that the CPU and GPU timings of one size are taken
    close together in time, and drift on the host affects both alike.
    """
    emit(Environment(dict(backend.environment())))
    devices = select_devices(backend, plan.devices, emit)
    for device in devices:
        emit(device)
    failed: set[str] = set()
    for dtype in plan.dtypes:
        for mode in plan.modes:
            for size in plan.sizes:
                for device in devices:
                    if device.device in failed:
                        continue
                    key = PointKey(backend=backend.name, device=device.device, dtype=dtype, mode=mode, size=size)
                    try:
                        run = backend.prepare(device, size, dtype, mode)
                        timing = measure(run, plan.timing, clock)
                    except MeasurementFailed as exc:
                        emit(DeviceFailure(backend=backend.name, device=device.device, reason=str(exc), point=key))
                        continue
                    except BackendError as exc:
                        failed.add(device.device)
                        emit(
                            DeviceFailure(backend=backend.name, device=device.device, reason=str(exc), fatal=exc.fatal)
                        )
                        continue
                    emit(Measurement(key=key, timing=timing))
