"""The guard's eyes on NVIDIA GPUs: NVML through nvidia-ml-py (the only module that imports pynvml).

A framework's GPU is found in NVML by the UUID or PCI bus id its backend reports, else by its
ordinal (the worker sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA's ordinals follow NVML's
order) translated through ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from crossover_monitor.measure.guard.guard import GpuProcess, GpuSample, GuardUnavailable
from crossover_monitor.model import DeviceInfo

R = TypeVar("R")

try:
    import pynvml
except ImportError:  # nvidia-ml-py absent: the sampler says so when created
    pynvml = None

# NVML's clock-event (formerly "throttle") reason bits, named as nvidia-smi names them.
CLOCK_EVENTS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_MHZ = 1e6
_MILLIWATT = 1e-3
_NANOSECOND = 1e-9  # nvmlViolationTime_t.violationTime


def clock_event_names(mask: int) -> tuple[str, ...]:
    """The reasons set in an NVML clock-event mask (``gpu_idle`` left out: it is no slowdown)."""
    return tuple(name for bit, name in CLOCK_EVENTS.items() if mask & bit and name != "gpu_idle")


def nvml_index(device: DeviceInfo, visible: str | None) -> int | str:
    """The NVML index (or a GPU UUID) of a framework GPU named like 'cuda:1', '/GPU:1' or 'gpu:1'."""
    match = re.search(r"(\d+)$", device.device)
    if match is None:
        raise GuardUnavailable(f"cannot tell which GPU {device.device!r} is")
    ordinal = int(match.group(1))
    if visible is None:
        return ordinal
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if ordinal >= len(entries):
        raise GuardUnavailable(f"{device.device} is not in CUDA_VISIBLE_DEVICES={visible!r}")
    entry = entries[ordinal]
    if entry.isdigit():
        return int(entry)
    if entry.startswith("GPU-"):
        return entry
    raise GuardUnavailable(f"cannot find CUDA_VISIBLE_DEVICES entry {entry!r} in NVML (MIG devices are not guarded)")


_SAMPLES_WINDOW_US = 1_000_000  # per-process utilisation over the last second


def _missing(*_args: object) -> None:
    raise pynvml.NVMLError_FunctionNotFound


def _process(pid: int, memory: int | None, utilization: float | None, proc: Path) -> GpuProcess:
    try:
        name = (proc / str(pid) / "comm").read_text(errors="replace").strip()
    except OSError:
        name, visible = "?", (proc / str(pid)).exists()
    else:
        visible = True
    return GpuProcess(pid=pid, name=name, visible=visible, used_memory_bytes=memory, sm_utilization_pct=utilization)


class NvmlSampler:
    """Samples GPUs through NVML; creating one raises GuardUnavailable if NVML cannot be used."""

    def __init__(self, *, environ: Mapping[str, str] = os.environ, proc: Path = Path("/proc")) -> None:
        if pynvml is None:
            raise GuardUnavailable("nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GuardUnavailable(f"NVML did not start: {exc}") from None
        self._environ = environ
        self._proc = proc
        self._handles: dict[str, Any] = {}
        self._maxima: dict[str, tuple[Any, Any, Any]] = {}  # per device: max SM clock, PCIe generation, width

    def _handle(self, device: DeviceInfo) -> Any:
        if device.device in self._handles:
            return self._handles[device.device]
        details = dict(device.details)
        try:
            if details.get("uuid"):
                handle = pynvml.nvmlDeviceGetHandleByUUID(details["uuid"])
            elif details.get("pci_bus_id"):
                handle = pynvml.nvmlDeviceGetHandleByPciBusId(details["pci_bus_id"])
            else:
                index = nvml_index(device, self._environ.get("CUDA_VISIBLE_DEVICES"))
                if isinstance(index, str):
                    handle = pynvml.nvmlDeviceGetHandleByUUID(index)
                else:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            raise GuardUnavailable(f"NVML cannot find {device.device}: {exc}") from None
        self._handles[device.device] = handle
        return handle

    @staticmethod
    def _process_utilization(handle: Any, pids: Mapping[int, object]) -> dict[int, float]:
        """Each process's highest SM utilisation in NVML's samples of the last second.

        NOT_FOUND means no process ran a kernel in that window (0 for all); where the GPU does not keep
        samples, nothing is known and every process counts as active. With no process listed it is not
        asked: the call takes 2.6 ms on an H200, half of a look (benchmarks/results/nvml-calls-*.json).
        """
        if not pids:
            return {}
        since = int(time.time() * 1e6) - _SAMPLES_WINDOW_US
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError_NotFound:
            return dict.fromkeys(pids, 0.0)
        except pynvml.NVMLError:
            return {}
        found = dict.fromkeys(pids, 0.0)
        for s in samples:
            if s.timeStamp >= since:
                found[s.pid] = max(found.get(s.pid, 0.0), float(s.smUtil))
        return found

    def identity(self, device: DeviceInfo) -> dict[str, str]:
        return _as_guard_error(self._identity, device)

    def driver_version(self) -> str:
        try:
            value = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError as exc:
            raise GuardUnavailable(f"NVML cannot read the driver's version: {exc}") from None
        return value.decode() if isinstance(value, bytes) else str(value)

    def _identity(self, device: DeviceInfo) -> dict[str, str]:
        handle = self._handle(device)
        found: dict[str, str] = {}
        for key, call in (
            ("uuid", pynvml.nvmlDeviceGetUUID),
            # "00000000:18:00.0", the long form, as dcgm-exporter's pci_bus_id label has it.
            ("pci_bus_id", lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId),
        ):
            try:
                value = call(handle)
            except pynvml.NVMLError:
                continue
            found[key] = value.decode() if isinstance(value, bytes) else str(value)
        return found

    def sample(self, device: DeviceInfo) -> GpuSample:
        return _as_guard_error(self._sample, device)

    def _sample(self, device: DeviceInfo) -> GpuSample:
        handle = self._handle(device)
        try:
            processes = [
                *pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
                *pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
            ]
        except pynvml.NVMLError as exc:
            raise GuardUnavailable(f"NVML cannot list the processes on {device.device}: {exc}") from None
        memory: dict[int, int | None] = {}
        for p in processes:
            used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None  # None under some drivers
            known = memory.get(p.pid)  # a pid listed as compute and graphics process: both its memories
            memory[p.pid] = used if known is None else known + (used or 0)
        per_process = self._process_utilization(handle, memory)

        def read(call: Callable[..., Any], *args: Any) -> Any:
            """One reading; None where this GPU or driver does not support it."""
            try:
                return call(handle, *args)
            except pynvml.NVMLError:
                return None

        utilization = read(pynvml.nvmlDeviceGetUtilizationRates)
        sm_clock = read(pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        # Fixed for a device (the max clock alone took 1.5 ms a look): kept once all three were read.
        maxima = self._maxima.get(device.device) or (
            read(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
            read(pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
            read(pynvml.nvmlDeviceGetMaxPcieLinkWidth),
        )
        if None not in maxima:
            self._maxima[device.device] = maxima
        sm_clock_max, pcie_generation_max, pcie_width_max = maxima
        # The newer name where the driver has it; older drivers only know the "throttle" one.
        events = read(getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", _missing))
        if events is None:
            events = read(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        power = read(pynvml.nvmlDeviceGetPowerUsage)
        power_limited = read(pynvml.nvmlDeviceGetViolationStatus, pynvml.NVML_PERF_POLICY_POWER)
        thermal_limited = read(pynvml.nvmlDeviceGetViolationStatus, pynvml.NVML_PERF_POLICY_THERMAL)
        return GpuSample(
            processes=tuple(_process(pid, memory[pid], per_process.get(pid), self._proc) for pid in sorted(memory)),
            utilization_pct=float(utilization.gpu) if utilization is not None else None,
            sm_clock_hz=sm_clock * _MHZ if sm_clock is not None else None,
            sm_clock_max_hz=sm_clock_max * _MHZ if sm_clock_max is not None else None,
            clock_events=clock_event_names(int(events)) if events is not None else (),
            temperature_c=read(pynvml.nvmlDeviceGetTemperature, pynvml.NVML_TEMPERATURE_GPU),
            power_w=power * _MILLIWATT if power is not None else None,
            pcie_generation=read(pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
            pcie_width=read(pynvml.nvmlDeviceGetCurrPcieLinkWidth),
            pcie_generation_max=pcie_generation_max,
            pcie_width_max=pcie_width_max,
            power_limited_s=power_limited.violationTime * _NANOSECOND if power_limited is not None else None,
            thermal_limited_s=thermal_limited.violationTime * _NANOSECOND if thermal_limited is not None else None,
            read_at_s=time.monotonic(),
        )


def _as_guard_error(call: Callable[[DeviceInfo], R], device: DeviceInfo) -> R:
    """``call(device)``, anything the binding raises turned into GuardUnavailable: an unguarded GPU, not a crash."""
    try:
        return call(device)
    except GuardUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. the binding's NVMLLibraryMismatchError, a plain Exception
        raise GuardUnavailable(f"NVML failed on {device.device}: {type(exc).__name__}: {exc}") from None
