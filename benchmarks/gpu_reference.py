"""Checks the service's sweep on a real GPU against CUDA-event and plain-loop references, in one run.

Run on a GPU machine with PyTorch (and JAX for --backends jax):
    python benchmarks/gpu_reference.py --out DIR [--backends torch,jax] [--repeats 5]

For float32 with TF32 off and on, sizes 1..8192, it
  1. runs the service's own sweep (worker process, the chosen backends, both modes);
  2. times every point independently: CUDA events around back-to-back torch.mm calls on the
     GPU (compute), CUDA events around copy-in + mm + copy-out (end_to_end), and a plain
     perf_counter loop on the CPU — this script never imports monitor.bench;
  3. reports service / reference per size and device, the crossover from the service against
     the one computed from the reference curves, and what the naive method (create operands,
     one matmul, stop the clock) would conclude;
  4. repeats the service sweep and reports the spread (max/min) of the crossover.
Targets (issue 4): ratio within 3% for n >= 1024 on the GPU and n >= 256 on the CPU; the service's
crossover inside the reference's bracket; spread over five sweeps at most 1.2.
Writes DIR/gpu_reference.json and DIR/gpu_reference.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from monitor.config import BenchmarkSettings, RefineSettings  # noqa: E402
from monitor.crossover import find_crossover  # noqa: E402
from monitor.protocol import Plan  # noqa: E402
from monitor.sweep import run_sweep  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MODES = ("compute", "end_to_end")
GPU_TARGET_FROM, CPU_TARGET_FROM, TOLERANCE = 1024, 256, 0.03

Curves = dict[str, dict[str, dict[int, float]]]  # device kind -> mode -> size -> seconds


def service_sweep(backend: str, *, tf32: bool, skip_cpu: float | None) -> dict[str, Any]:
    """One sweep by the service itself; medians by device kind, and its crossovers."""
    bench = BenchmarkSettings(
        backend=backend,
        sizes=SIZES,
        modes=MODES,
        tf32=tf32,
        timeout_s=1200,
        refine=RefineSettings(enabled=True, tolerance=0.05, budget_s=60),
        skip_cpu_above_speedup=skip_cpu,
    )
    started = time.monotonic()
    outcome = run_sweep(Plan.from_settings(bench), timeout_s=bench.timeout_s, cancel=threading.Event())
    if outcome.snapshot is None:
        raise SystemExit(f"{backend} sweep failed: {outcome.reason}")
    kinds = {d.device: d.kind for d in outcome.snapshot.devices}
    curves: Curves = {"cpu": {m: {} for m in MODES}, "gpu": {m: {} for m in MODES}}
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


def reference(*, tf32: bool, cpu: bool) -> Curves:
    """Independent timings with torch: CUDA events on the GPU, a perf_counter loop on the CPU."""
    import torch  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    gpu = torch.device("cuda:0")
    curves: Curves = {"cpu": {m: {} for m in MODES}, "gpu": {m: {} for m in MODES}}
    for n in SIZES:
        a_host, b_host = torch.rand(n, n), torch.rand(n, n)
        a, b = a_host.to(gpu), b_host.to(gpu)
        flops = 2 * n**3
        # compute: per-call time of back-to-back matmul calls between two events, median over
        # blocks of at least 25 ms (a sustained load, as the service's blocks are: the GPU's clocks
        # in a short burst differ from those under load)
        torch.matmul(a, b)
        torch.cuda.synchronize()
        probe = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize()
        calls = max(1, min(5000, math.ceil(25e-3 / (time.perf_counter() - probe))))
        blocks = []
        for block in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            if block >= 3:  # warm-up blocks
                blocks.append(start.elapsed_time(end) / 1e3 / calls)
        curves["gpu"]["compute"][n] = statistics.median(blocks)
        # end_to_end: events around copy in, mm, copy out (the copy out blocks the host)
        times = []
        for call in range(23):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            torch.matmul(a_host.to(gpu), b_host.to(gpu)).cpu()
            end.record()
            end.synchronize()
            if call >= 3:
                times.append(start.elapsed_time(end) / 1e3)
        curves["gpu"]["end_to_end"][n] = statistics.median(times)
        if cpu:
            repeats = max(5, min(500, int(1.0 / max(flops / 5e11, 1e-5))))
            times = []
            for call in range(repeats + 2):
                t0 = time.perf_counter()
                torch.matmul(a_host, b_host)
                if call >= 2:
                    times.append(time.perf_counter() - t0)
            # On the CPU the operands already live in host memory: end_to_end copies nothing.
            curves["cpu"]["compute"][n] = curves["cpu"]["end_to_end"][n] = statistics.median(times)
    return curves


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
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", default="torch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-cpu", type=float, default=None, help="skip_cpu_above_speedup for the repeats")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    backends = args.backends.split(",")
    report: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(), "machine": platform.node(), "runs": {}}
    report["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    report["naive"] = naive()
    for tf32 in (False, True):
        ref = reference(tf32=tf32, cpu=not tf32)  # TF32 does not change the CPU
        if not tf32:
            report["cpu_reference"] = ref["cpu"]
        report["runs"][f"tf32={tf32}"] = {"reference_gpu": ref["gpu"]}
        for backend in backends:
            print(f"{backend} tf32={tf32}", file=sys.stderr, flush=True)
            report["runs"][f"tf32={tf32}"][backend] = service_sweep(backend, tf32=tf32, skip_cpu=None)
            _save_partial(args.out, report)
    spread: dict[str, Any] = {}
    for backend in backends:
        sweeps = [report["runs"]["tf32=False"][backend]]
        for index in range(args.repeats - 1):
            print(f"{backend} repeat {index + 2}", file=sys.stderr, flush=True)
            sweeps.append(service_sweep(backend, tf32=False, skip_cpu=args.skip_cpu))
            report["repeats"] = {**report.get("repeats", {}), backend: sweeps}
            _save_partial(args.out, report)
        spread[backend] = {mode: [s["crossovers"].get(mode, {}).get("size") for s in sweeps] for mode in MODES}
    report["spread"] = spread
    (args.out / "gpu_reference.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "gpu_reference.md").write_text(render(report, backends))
    print(render(report, backends))


def _save_partial(out: Path, report: dict[str, Any]) -> None:
    """Everything measured so far, so that a run stopped at its time limit still leaves its data."""
    (out / "gpu_reference.partial.json").write_text(json.dumps(report, indent=1, default=str))


def _ratio_rows(
    service: Curves, ref_gpu: dict[str, dict[int, float]], ref_cpu: dict[str, dict[int, float]]
) -> list[str]:
    rows = []
    for kind, ref, target_from in (("gpu", ref_gpu, GPU_TARGET_FROM), ("cpu", ref_cpu, CPU_TARGET_FROM)):
        for mode in MODES:
            for n in SIZES:
                svc = service[kind][mode].get(n)
                reference_time = ref.get(mode, {}).get(n) if ref else None
                if svc is None or reference_time is None:
                    continue
                ratio = svc / reference_time
                verdict = ("yes" if abs(ratio - 1) <= TOLERANCE else "NO") if n >= target_from else "-"
                rows.append(
                    f"| {kind} | {mode} | {n} | {svc * 1e6:.2f} | {reference_time * 1e6:.2f} | {ratio:.3f} | {verdict} |"
                )
    return rows


def render(report: dict[str, Any], backends: list[str]) -> str:
    lines = [
        "# Service vs reference on a real GPU",
        "",
        f"- date: {report['date']}",
        f"- GPU: {report['nvidia_smi']}",
        "- sizes: " + ", ".join(map(str, SIZES)) + "; float32; times in µs",
        f"- targets: service/reference within {TOLERANCE:.0%} for n >= {GPU_TARGET_FROM} (GPU) and n >= {CPU_TARGET_FROM} (CPU)",
        "",
    ]
    cpu_ref = report.get("cpu_reference", {})
    for run, by_backend in report["runs"].items():
        for backend in backends:
            sweep = by_backend[backend]
            lines += [
                f"## {backend}, {run}",
                "",
                f"- environment: {sweep['environment']}",
                f"- sweep took {sweep['seconds']:.0f} s; result {sweep['result']} {sweep['reason']}; noisy points: {sweep['noisy_points']}",
                "",
            ]
            lines += [
                "| device | mode | n | service | reference | ratio | within target |",
                "| --- | --- | ---: | ---: | ---: | ---: | --- |",
            ]
            lines += _ratio_rows(sweep["curves"], by_backend["reference_gpu"], cpu_ref)
            lines += [
                "",
                "| mode | service n* | service bracket | 95% CI | reference n* | reference bracket | service n* in reference bracket |",
                "| --- | ---: | --- | --- | ---: | --- | --- |",
            ]
            for mode in MODES:
                svc = sweep["crossovers"].get(mode, {})
                ref = crossover_of(cpu_ref.get(mode, {}), by_backend["reference_gpu"][mode]) if cpu_ref else {}
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
        "## The naive method (create operands, one matmul, stop the clock)",
        "",
        "| n | CPU | GPU |",
        "| ---: | ---: | ---: |",
    ]
    lines += [f"| {n} | {report['naive']['cpu'][n] * 1e6:.1f} | {report['naive']['gpu'][n] * 1e6:.1f} |" for n in SIZES]
    lines += ["", f"naive conclusion: {naive_cross}", "", "## Crossover spread over repeated sweeps (TF32 off)", ""]
    for backend, modes in report["spread"].items():
        for mode, sizes in modes.items():
            found = [s for s in sizes if s]
            ratio = max(found) / min(found) if len(found) == len(sizes) and found else None
            lines.append(f"- {backend} {mode}: " + ", ".join(_num(s) for s in sizes) + f" → max/min {_num(ratio, 3)}")
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
