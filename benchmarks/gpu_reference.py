"""Checks the service's sweep on a real GPU against independent references, in one run.

Run on a GPU machine with PyTorch (and JAX for --backends jax):
    python benchmarks/gpu_reference.py --out DIR [--backends torch,jax] [--repeats 5] [--budget-s 540]

For float32 with TF32 off and on, sizes 1..8192, it
  1. runs the service's own sweep (worker process, the chosen backends, both modes);
  2. times every point independently (references.py, which never imports monitor.bench): CUDA
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
its time limit keeps what it measured; --budget-s skips the sweeps that would not fit.
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

from references import Curves, empty_curves, jax_reference, tighter_bound, torch_reference  # noqa: E402

from monitor.config import BenchmarkSettings, RefineSettings  # noqa: E402
from monitor.crossover import find_crossover  # noqa: E402
from monitor.protocol import Plan  # noqa: E402
from monitor.sweep import run_sweep  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MODES = ("compute", "end_to_end")
GPU_TARGET_FROM, CPU_TARGET_FROM, TOLERANCE = 1024, 256, 0.03


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
        refine=RefineSettings(enabled=True, tolerance=0.05, budget_s=60),
        skip_cpu_above_speedup=skip_cpu,
    )
    started = time.monotonic()
    outcome = run_sweep(Plan.from_settings(bench), timeout_s=bench.timeout_s, cancel=threading.Event())
    if outcome.snapshot is None:
        return {"failed": outcome.reason, "seconds": time.monotonic() - started}
    kinds = {d.device: d.kind for d in outcome.snapshot.devices}
    curves = empty_curves()
    for m in outcome.snapshot.measurements:
        if (
            m.role == "sweep"
            and kinds[m.key.device] in curves
            and m.key.device in (_first(kinds, "cpu"), _first(kinds, "gpu"))
        ):
            curves[kinds[m.key.device]][m.key.mode][m.key.size] = m.timing.median_s
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
        if c.gpu == _first(kinds, "gpu")
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


def _first(kinds: dict[str, str], kind: str) -> str | None:
    return next((d for d, k in kinds.items() if k == kind), None)


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


def crossover_of(cpu: dict[int, float], gpu: dict[int, float]) -> dict[str, Any]:
    common = sorted(set(cpu) & set(gpu))
    state, size, lower, upper = find_crossover([(n, cpu[n], gpu[n]) for n in common])
    return {"state": state.value, "size": size, "lower": lower, "upper": upper}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--render", type=Path, help="print the report of a recorded gpu_reference.json and exit")
    parser.add_argument("--backends", default="torch")
    parser.add_argument("--tf32", default="off,on", help="which TF32 settings to compare: off, on, or both")
    parser.add_argument("--repeats", type=int, default=5, help="sweeps (TF32 off) for the crossover's spread")
    parser.add_argument("--skip-cpu", type=float, default=None, help="skip_cpu_above_speedup for the repeats")
    parser.add_argument("--cpu-threads", type=int, default=None, help="cpu_threads for the service and the references")
    parser.add_argument("--budget-s", type=float, default=None, help="start no sweep that would not end by then")
    args = parser.parse_args()
    if args.render:
        report = load(args.render)
        print(render(report, list(report["arguments"]["backends"].split(","))), end="")
        return
    if args.out is None:
        parser.error("--out is required to measure")
    measure(args)


def measure(args: argparse.Namespace) -> None:
    # Before JAX starts in this process: it would take 75% of the GPU's memory from the worker.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    args.out.mkdir(parents=True, exist_ok=True)
    backends = args.backends.split(",")
    tf32_settings = [{"off": False, "on": True}[word] for word in args.tf32.split(",") if word]
    threads = args.cpu_threads or len(os.sched_getaffinity(0))
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

    def sweep(backend: str, label: str, *, tf32: bool, skip_cpu: float | None) -> dict[str, Any] | None:
        took = [s["seconds"] for s in _sweeps(report, backend)]
        if took and max(took) * 1.1 > left():
            report["skipped"].append(f"{backend} {label}: {left():.0f} s left, a sweep took up to {max(took):.0f} s")
            return None
        print(f"{backend} {label}", file=sys.stderr, flush=True)
        return service_sweep(
            backend, tf32=tf32, skip_cpu=skip_cpu, threads=args.cpu_threads, timeout_s=min(1200, max(30, left() - 20))
        )

    for index, tf32 in enumerate(tf32_settings):
        run = report["runs"][f"tf32={tf32}"] = {}
        # torch's CUDA events always: for the JAX sweep they are the same GEMM timed by another framework.
        for framework in ["torch", *(["jax"] if "jax" in backends else [])]:
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


def load(path: Path) -> dict[str, Any]:
    """A recorded report, with its sizes as numbers again and older JAX references brought up to date."""

    def sizes_as_numbers(mapping: dict[str, Any]) -> dict[Any, Any]:
        return {int(key) if key.isdigit() else key: value for key, value in mapping.items()}

    report: dict[str, Any] = json.loads(path.read_text(), object_hook=sizes_as_numbers)
    for key, reference in report["references"].get("jax", {}).items():
        notes = reference.get("notes") if key.startswith("tf32=") else None
        if notes is not None and "profiled" not in notes:  # recorded before tighter_bound existed
            compute = reference["gpu"]["compute"]
            notes["profiled"] = {n: compute[n] for n, how in notes["gpu_compute"].items() if how.startswith("profiler")}
            compute.update(tighter_bound(notes["profiled"], notes["host_loop"])[0])
            notes["gpu_compute"] = tighter_bound(notes["profiled"], notes["host_loop"])[1]
    return report


def _sweeps(report: dict[str, Any], backend: str) -> list[dict[str, Any]]:
    """The backend's TF32-off sweeps: the first of the comparison, then the repeats."""
    first = report["runs"].get("tf32=False", {}).get(backend)
    return [s for s in [first, *report["repeats"].get(backend, [])] if s is not None]


def _save(out: Path, report: dict[str, Any], backends: list[str]) -> None:
    """Everything measured so far, so that a run stopped at its time limit still leaves its data."""
    (out / "gpu_reference.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_reference.md").write_text(render(report, backends))


def _ratio_rows(
    sizes: list[int],
    service: Curves,
    reference: dict[str, Any],
    cpu_reference: Curves | None,
    torch_events: Curves | None,
) -> list[str]:
    rows = []
    for kind, target_from in (("gpu", GPU_TARGET_FROM), ("cpu", CPU_TARGET_FROM)):
        for mode in MODES:
            for n in sizes:
                svc = service[kind][mode].get(n)
                ref_curves = reference.get("gpu") if kind == "gpu" else cpu_reference
                ref = (ref_curves or {}).get(mode, {}).get(n)
                if svc is None or ref is None:
                    continue
                ratio = svc / ref
                verdict = ("yes" if abs(ratio - 1) <= TOLERANCE else "NO") if n >= target_from else "-"
                other = (torch_events or {}).get(mode, {}).get(n) if kind == "gpu" else None
                versus = f"{svc / other:.3f}" if other else "-"
                rows.append(
                    f"| {kind} | {mode} | {n} | {svc * 1e6:.2f} | {ref * 1e6:.2f} | {ratio:.3f} | {verdict} | {versus} |"
                )
    return rows


def render(report: dict[str, Any], backends: list[str]) -> str:
    sizes = report.get("sizes", list(SIZES))
    lines = [
        "# Service vs reference on a real GPU",
        "",
        f"- date: {report['date']}",
        f"- GPU: {report.get('nvidia_smi')}",
        f"- arguments: {report['arguments']}; CPU threads {report['cpu_threads']}",
        "- sizes: " + ", ".join(map(str, sizes)) + "; float32; times in µs",
        f"- targets: service/reference within {TOLERANCE:.0%} for n >= {GPU_TARGET_FROM} (GPU) and n >= {CPU_TARGET_FROM} (CPU)",
        "",
    ]
    for run, by_backend in report["runs"].items():
        for backend in backends:
            sweep = by_backend.get(backend)
            references = report["references"].get(backend, {})
            reference = references.get(run, {})
            lines += [f"## {backend}, {run}", ""]
            if sweep is None or "failed" in sweep:
                lines += [f"- not run or failed: {sweep}", ""]
                continue
            torch_events = report["references"]["torch"][run]["gpu"] if backend != "torch" else None
            lines += [
                f"- environment: {sweep['environment']}",
                f"- sweep took {sweep['seconds']:.0f} s; result {sweep['result']} {sweep['reason']}; noisy points: {sweep['noisy_points']}",
                f"- reference: {_methods(reference.get('notes', {}))}",
                "",
                "| device | mode | n | service | reference | ratio | within target | service / torch CUDA events |",
                "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |",
            ]
            lines += _ratio_rows(sizes, sweep["curves"], reference, references.get("cpu"), torch_events)
            lines += [
                "",
                "| mode | service n* | service bracket | 95% CI | reference n* | reference bracket | service n* in reference bracket |",
                "| --- | ---: | --- | --- | ---: | --- | --- |",
            ]
            for mode in MODES:
                svc = sweep["crossovers"].get(mode, {})
                cpu_curve = references.get("cpu", {}).get(mode, {})
                gpu_curve = reference.get("gpu", {}).get(mode, {})
                ref = crossover_of(cpu_curve, gpu_curve) if cpu_curve and gpu_curve else {}
                inside = "-"
                if svc.get("size") and ref.get("lower") and ref.get("upper"):
                    inside = "yes" if ref["lower"] <= svc["size"] <= ref["upper"] else "NO"
                lines.append(
                    f"| {mode} | {_num(svc.get('size'))} ({svc.get('state')}) | {svc.get('lower')}–{svc.get('upper')} | "
                    f"{_num(svc.get('ci_lower'))}–{_num(svc.get('ci_upper'))} | {_num(ref.get('size'))} ({ref.get('state')}) | "
                    f"{ref.get('lower')}–{ref.get('upper')} | {inside} |"
                )
            lines += [
                "",
                "fixed cost and rate: "
                + "; ".join(
                    f"{c['device']} {c['mode']}: {c['fixed_s'] * 1e6:.1f} µs, {(c['peak_flops'] or 0) / 1e12:.1f} TFLOP/s"
                    for c in sweep["costs"]
                ),
                "",
            ]
    naive_cross = crossover_of(report["naive"]["cpu"], report["naive"]["gpu"])
    lines += [
        "## The naive method (torch: create operands, one matmul, stop the clock)",
        "",
        "| n | CPU | GPU |",
        "| ---: | ---: | ---: |",
    ]
    lines += [f"| {n} | {report['naive']['cpu'][n] * 1e6:.1f} | {report['naive']['gpu'][n] * 1e6:.1f} |" for n in sizes]
    lines += ["", f"naive conclusion: {naive_cross}", "", "## Crossover spread over repeated sweeps (TF32 off)", ""]
    for backend in backends:
        sweeps = [s for s in _sweeps(report, backend) if "failed" not in s]
        for mode in MODES:
            sizes = [s["crossovers"].get(mode, {}).get("size") for s in sweeps]
            found = [size for size in sizes if size]
            ratio = max(found) / min(found) if found and len(found) == len(sizes) else None
            lines.append(
                f"- {backend} {mode}: " + ", ".join(_num(size) for size in sizes) + f" → max/min {_num(ratio, 3)}"
                f" over {len(sizes)} sweeps"
            )
    lines += [f"- skipped: {skip}" for skip in report["skipped"]]
    return "\n".join(lines) + "\n"


def _methods(notes: dict[str, Any]) -> str:
    """How the reference timed each part; for JAX also the profiler's outcome and the kernels it saw."""
    compute = notes.get("gpu_compute")
    if isinstance(compute, dict):
        compute = ", ".join(sorted(set(compute.values())))
    text = f"GPU compute: {compute}; GPU end_to_end: {notes.get('gpu_end_to_end')}; CPU: {notes.get('cpu')}"
    if notes.get("profiler_error"):
        text += f"; profiler failed ({notes['profiler_error']})"
    kernels = notes.get("kernels") or {}
    if kernels:
        text += "; kernels at the largest size: " + ", ".join(kernels[max(kernels)])
    return text


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
