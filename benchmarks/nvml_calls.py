"""What one look of the guard costs, call by call: each NVML call NvmlSampler.sample makes, timed 100 times.

python3 benchmarks/nvml_calls.py > results/nvml-calls.json
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import pynvml


def timed(call: Callable[[], Any], times: int = 100) -> dict[str, Any]:
    spent, outcome = [], "ok"
    for _ in range(times):
        start = time.perf_counter()
        try:
            call()
        except pynvml.NVMLError as exc:
            outcome = str(exc)
        spent.append(time.perf_counter() - start)
    return {
        "median_us": round(statistics.median(spent) * 1e6, 1),
        "max_us": round(max(spent) * 1e6, 1),
        "outcome": outcome,
    }


def main() -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    since = int(time.time() * 1e6) - 1_000_000
    calls = {
        "compute_processes": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        "graphics_processes": lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        "process_utilization": lambda: pynvml.nvmlDeviceGetProcessUtilization(h, since),
        "utilization_rates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "sm_clock": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "sm_clock_max": lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
        "clock_events": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "violation_power": lambda: pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_POWER),
        "violation_thermal": lambda: pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL),
        "temperature": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "pcie_generation": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
        "pcie_generation_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
        "pcie_width_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
    }
    print(json.dumps({name: timed(call) for name, call in calls.items()}, indent=1))


if __name__ == "__main__":
    main()
