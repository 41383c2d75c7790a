"""Does a GPU end_to_end point start cold? Per-call times right after the GPU sat idle, and the guard's cost.

The service's worker times the CPU point of a size right before the GPU's, so the GPU idles for
that long before its end_to_end point, and the point's timing (2 warm-up calls, then about 0.15 s
of 20 ms blocks) falls in its first fraction of a second. This script times the service's own
end_to_end block (``TorchBackend.prepare``) call by call after four preconditions, in one process:

- ``idle``: the GPU and CPU idle for 2 s;
- ``cpu``: 1 s of CPU matmuls of the same size with the worker's threads (as the CPU point before it);
- ``gpu``: 0.5 s of GPU matmuls (as a compute point before it);
- ``warm``: 0.5 s of the same end_to_end calls.

After each, 400 single calls are timed (medians per window of calls), then, after the same
precondition again, the service's ``measure`` with its default settings. SM clock and PCIe link
are read through NVML before and after. Then the guard's own cost: ``NvmlSampler.sample`` and the
host meter's start/stop, 200 times each (the sampler on an empty GPU, then with this process's context on
it), and one sample in full (do the violation counters answer?). ``--sizes ''`` measures the cost alone.

    python3 benchmarks/e2e_ramp.py --threads 15 --out results/e2e-ramp.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

WINDOWS = ((0, 5), (5, 20), (20, 50), (50, 100), (100, 200), (200, 400))
CONDITIONS = ("idle", "cpu", "gpu", "warm")


def _nvml_now(handle: Any) -> dict[str, int]:
    import pynvml  # noqa: PLC0415

    return {
        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "pcie_gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        "pcie_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
    }


def ramp(n: int, threads: int, repeats: int) -> dict[str, Any]:
    import pynvml  # noqa: PLC0415

    from crossover_monitor.bench.contract import BackendOptions  # noqa: PLC0415
    from crossover_monitor.bench.timing import measure  # noqa: PLC0415
    from crossover_monitor.bench.torch_backend import TorchBackend  # noqa: PLC0415
    from crossover_monitor.settings import TimingSettings  # noqa: PLC0415

    backend = TorchBackend(BackendOptions(tf32=False, cpu_threads=threads))
    gpu = next(d for d in backend.discover() if d.device == "cuda:0")
    cpu = next(d for d in backend.discover() if d.kind == "cpu")
    e2e = backend.prepare(gpu, n, "float32", "end_to_end")
    cpu_run = backend.prepare(cpu, n, "float32", "compute")
    gpu_run = backend.prepare(gpu, n, "float32", "compute")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def for_s(run: Any, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            run(1)

    preconditions = {
        "idle": lambda: time.sleep(2.0),
        "cpu": lambda: for_s(cpu_run, 1.0),
        "gpu": lambda: for_s(gpu_run, 0.5),
        "warm": lambda: for_s(e2e, 0.5),
    }
    for_s(e2e, 1.0)  # everything allocated and compiled once
    per_call: dict[str, list[list[float]]] = {c: [] for c in CONDITIONS}
    measured: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    clocks: dict[str, list[dict[str, Any]]] = {c: [] for c in CONDITIONS}
    for _ in range(repeats):
        for condition in CONDITIONS:
            preconditions[condition]()
            before = _nvml_now(handle)
            times = []
            for _ in range(WINDOWS[-1][1]):
                start = time.perf_counter()
                e2e(1)
                times.append(time.perf_counter() - start)
            clocks[condition].append({"before": before, "after": _nvml_now(handle)})
            per_call[condition].append(times)
            preconditions[condition]()
            measured[condition].append(measure(e2e, TimingSettings(), time.perf_counter).median_s)
    summary = {
        condition: {
            "windows_us": {
                f"{lo}-{hi}": round(statistics.median(t for run in per_call[condition] for t in run[lo:hi]) * 1e6, 1)
                for lo, hi in WINDOWS
            },
            "measure_us": [round(m * 1e6, 1) for m in measured[condition]],
            "clocks": clocks[condition],
        }
        for condition in CONDITIONS
    }
    return {"n": n, "threads": threads, "summary": summary, "per_call_s": per_call}


def guard_cost(threads: int) -> dict[str, Any]:
    from crossover_monitor.bench.contract import BackendOptions  # noqa: PLC0415
    from crossover_monitor.bench.hostinfo import ProcStatMeter  # noqa: PLC0415
    from crossover_monitor.bench.nvml import NvmlSampler  # noqa: PLC0415
    from crossover_monitor.bench.torch_backend import TorchBackend  # noqa: PLC0415

    backend = TorchBackend(BackendOptions(tf32=False, cpu_threads=threads))
    gpu = next(d for d in backend.discover() if d.kind == "gpu")
    sampler, meter = NvmlSampler(), ProcStatMeter()

    def timed(call: Any, times: int = 200) -> dict[str, float]:
        spent = []
        for _ in range(times):
            start = time.perf_counter()
            call()
            spent.append(time.perf_counter() - start)
        spent.sort()
        return {
            "median_us": round(statistics.median(spent) * 1e6, 1),
            "p90_us": round(spent[int(0.9 * len(spent))] * 1e6, 1),
            "max_us": round(spent[-1] * 1e6, 1),
        }

    listed_before = len(sampler.sample(gpu).processes)  # 0: the per-process samples are skipped
    empty = timed(lambda: sampler.sample(gpu))
    backend.prepare(gpu, 256, "float32", "compute")(1)  # this process's context on it, as the worker's is
    sample = sampler.sample(gpu)
    return {
        "nvml_sample_empty_gpu": {**empty, "processes_listed": listed_before},
        "nvml_sample": timed(lambda: sampler.sample(gpu)),
        "host_meter_start_stop": timed(lambda: meter.stop(meter.start())),
        "one_sample": {k: (str(v) if k == "processes" else v) for k, v in sample.__dict__.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"guard_cost": guard_cost(args.threads), "ramps": []}
    print(json.dumps(result["guard_cost"]), flush=True)
    for n in (int(s) for s in args.sizes.split(",") if s):  # --sizes '': the guard's cost alone
        found = ramp(n, args.threads, args.repeats)
        result["ramps"].append(found)
        print(json.dumps({"n": n, "summary": found["summary"]}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
