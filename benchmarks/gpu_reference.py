"""Checks the service's sweep on a real GPU against independent references, in one run.

Run on a GPU machine with PyTorch (and JAX for --backends jax):
    python benchmarks/gpu_reference.py --out DIR [--backends torch,jax] [--repeats 5] [--budget-s 540]

For float32 with TF32 off and on, sizes 1..8192, it
  1. runs the service's own sweep (worker process, the chosen backends, both modes);
  2. times every point independently (references.py, which never imports crossover_monitor.measure): CUDA
     events for torch, the GPU's kernel timestamps from JAX's profiler for jax, a plain
     perf_counter loop on the CPU for both; torch's CUDA events are also set beside the JAX
     sweep, as the same GEMM timed by another framework;
  3. reports service / reference per size and device, the crossover from the service against
     the one computed from the reference curves, and what the naive method (create operands,
     one matmul, stop the clock) would conclude;
  4. repeats the service sweep and reports the spread (max/min) of the crossover.
Targets (issue 4): ratio within 3% for n >= 1024 on the GPU and n >= 256 on the CPU; the service's
crossover inside the reference's bracket; spread over five sweeps at most 1.2.
Writes DIR/gpu_reference.json and DIR/gpu_reference.md after every step, so a run stopped by
its time limit keeps what it measured; --budget-s skips the steps that would not fit. gpu_report.py
prints the report of a recorded JSON again.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpu_report import render, sweeps_of  # noqa: E402
from references import MODES, empty_curves, jax_reference, torch_reference  # noqa: E402

from crossover_monitor.config.settings import BenchmarkSettings, GuardSettings, RefineSettings  # noqa: E402
from crossover_monitor.measure.guard.hostinfo import usable_cpus  # noqa: E402
from crossover_monitor.protocol import Plan  # noqa: E402
from crossover_monitor.service.sweep import run_sweep  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SAVE_MARGIN_S = 20  # left at the end of --budget-s to write the report


def service_sweep(
    backend: str, *, tf32: bool, skip_cpu: float | None, threads: int | None, timeout_s: float
) -> dict[str, Any]:
    """One sweep by the service itself; medians by device kind, and its crossovers."""
    bench = BenchmarkSettings(
        backend=backend,
        sizes=SIZES,
        modes=MODES,
        tf32=tf32,
        timeout_s=timeout_s,
        cpu_threads=threads,
        refine=RefineSettings(enabled=True, budget_s=60),
        skip_cpu_above_speedup=skip_cpu,
    )
    started = time.monotonic()
    outcome = run_sweep(Plan(bench=bench, guard=GuardSettings()), timeout_s=bench.timeout_s, cancel=threading.Event())
    if outcome.snapshot is None:
        return {"failed": outcome.reason, "seconds": time.monotonic() - started}
    first: dict[str, str] = {}  # kind -> device: the first CPU and the first GPU are the curves compared
    for device in outcome.snapshot.devices:
        first.setdefault(device.kind, device.device)
    compared = {device: kind for kind, device in first.items() if kind in ("cpu", "gpu")}
    curves = empty_curves()
    for m in outcome.snapshot.measurements:
        if m.role == "sweep" and m.key.device in compared:
            curves[compared[m.key.device]][m.key.mode][m.key.size] = m.timing.median_s
    crossovers = {
        c.mode: {
            "state": c.state.value,
            "size": c.size,
            "lower": c.lower,
            "upper": c.upper,
            "ci_lower": c.ci_lower,
            "ci_upper": c.ci_upper,
        }
        for c in outcome.snapshot.crossovers
        if c.gpu == first.get("gpu")
    }
    costs = [dataclasses.asdict(c) for c in outcome.snapshot.costs]
    noisy = sum(1 for m in outcome.snapshot.measurements if m.timing.noisy)
    return {
        "curves": curves,
        "crossovers": crossovers,
        "costs": costs,
        "seconds": time.monotonic() - started,
        "environment": dict(outcome.snapshot.environment),
        "result": outcome.result.value,
        "reason": outcome.reason,
        "noisy_points": noisy,
        "devices": [dataclasses.asdict(d) for d in outcome.snapshot.devices],
    }


NAIVE = r"""
import json, sys, time, torch
out = {"cpu": {}, "gpu": {}}
for n in [int(s) for s in sys.argv[1:]]:
    for kind, device in (("cpu", "cpu"), ("gpu", "cuda:0")):
        start = time.time()
        a = torch.rand(n, n, device=device)
        b = torch.rand(n, n, device=device)
        c = a @ b
        out[kind][n] = time.time() - start
print(json.dumps(out))
"""


def naive() -> dict[str, dict[int, float]]:
    """The classic script: create operands, one matmul, stop the clock (no warm-up, no sync)."""
    result = subprocess.run([sys.executable, "-c", NAIVE, *map(str, SIZES)], capture_output=True, text=True, check=True)
    return {kind: {int(n): t for n, t in times.items()} for kind, times in json.loads(result.stdout).items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", default="torch")
    parser.add_argument("--tf32", default="off,on", help="which TF32 settings to compare: off, on, or both")
    parser.add_argument("--repeats", type=int, default=5, help="sweeps (TF32 off) for the crossover's spread")
    parser.add_argument("--skip-cpu", type=float, default=None, help="skip_cpu_above_speedup for the repeats")
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="cpu_threads for the service and the torch reference (JAX's CPU reference uses every CPU this process may)",
    )
    parser.add_argument("--budget-s", type=float, default=None, help="start no sweep that would not end by then")
    measure(parser.parse_args())


def measure(args: argparse.Namespace) -> None:
    # Before JAX starts in this process: it would take 75% of the GPU's memory from the worker.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    args.out.mkdir(parents=True, exist_ok=True)
    backends = args.backends.split(",")
    tf32_settings = [{"off": False, "on": True}[word] for word in args.tf32.split(",") if word]
    threads = args.cpu_threads or usable_cpus()  # as the worker counts them, container CPU quota included
    started = time.monotonic()
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "machine": platform.node(),
        "arguments": vars(args) | {"out": str(args.out)},
        "cpu_threads": threads,
        "sizes": list(SIZES),
        "references": {},
        "runs": {},
        "repeats": {},
        "skipped": [],
    }
    report["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    report["naive"] = naive()
    _save(args.out, report, backends)

    def left() -> float:
        return math.inf if args.budget_s is None else args.budget_s - (time.monotonic() - started)

    def fits(step: str, needs_s: float) -> bool:
        """Whether a step that took up to ``needs_s`` before can still end within the budget; if not, say so."""
        if needs_s * 1.1 + SAVE_MARGIN_S < left():
            return True
        needs = f"it took {needs_s:.0f} s before" if needs_s else f"{SAVE_MARGIN_S} s are kept to write the report"
        report["skipped"].append(f"{step}: {left():.0f} s left, {needs}")
        _save(args.out, report, backends)
        return False

    def sweep(backend: str, label: str, *, tf32: bool, skip_cpu: float | None) -> dict[str, Any] | None:
        if not fits(f"{backend} {label}", max([s["seconds"] for s in sweeps_of(report, backend)], default=0)):
            return None
        print(f"{backend} {label}", file=sys.stderr, flush=True)
        # Past its deadline the sweep is killed and recorded as failed, so the report is still written.
        timeout_s = min(1200, left() - SAVE_MARGIN_S)
        return service_sweep(backend, tf32=tf32, skip_cpu=skip_cpu, threads=args.cpu_threads, timeout_s=timeout_s)

    for index, tf32 in enumerate(tf32_settings):
        run = report["runs"][f"tf32={tf32}"] = {}
        # torch's CUDA events always: for the JAX sweep they are the same GEMM timed by another framework.
        for framework in ["torch", *(["jax"] if "jax" in backends else [])]:
            if not fits(f"{framework} reference tf32={tf32}", 0):
                continue
            print(f"{framework} reference tf32={tf32}", file=sys.stderr, flush=True)
            if framework == "torch":
                curves, notes = torch_reference(SIZES, tf32=tf32, cpu=index == 0, threads=threads)
            else:
                curves, notes = jax_reference(SIZES, tf32=tf32, cpu=index == 0)
            references = report["references"].setdefault(framework, {})
            references[f"tf32={tf32}"] = {"gpu": curves["gpu"], "notes": notes}
            if index == 0:  # TF32 does not change the CPU
                references["cpu"] = curves["cpu"]
            _save(args.out, report, backends)
        for backend in backends:
            result = sweep(backend, f"tf32={tf32}", tf32=tf32, skip_cpu=None)
            if result is not None:
                run[backend] = result
            _save(args.out, report, backends)
    for backend in backends:
        for index in range(args.repeats - (1 if False in tf32_settings else 0)):
            result = sweep(backend, f"repeat {index + 1}", tf32=False, skip_cpu=args.skip_cpu)
            if result is None:
                break
            report["repeats"].setdefault(backend, []).append(result)
            _save(args.out, report, backends)
    print(render(report, backends))


def _save(out: Path, report: dict[str, Any], backends: list[str]) -> None:
    """Everything measured so far, so that a run stopped at its time limit still leaves its data."""
    (out / "gpu_reference.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_reference.md").write_text(render(report, backends))


if __name__ == "__main__":
    main()
