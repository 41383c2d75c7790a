"""The report of a gpu_reference.py run: what its JSON holds, as Markdown tables.

Run: python benchmarks/gpu_report.py results/NAME.json  (prints the report; the .md beside each
recorded .json in results/ is exactly this output, a test checks it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from references import MODES, Curves, ModeCurves, tighter_bound

from crossover_monitor.analysis.crossover import find_crossover

GPU_TARGET_FROM, CPU_TARGET_FROM, TOLERANCE = 1024, 256, 0.03


def crossover_of(cpu: dict[int, float], gpu: dict[int, float]) -> dict[str, Any]:
    common = sorted(set(cpu) & set(gpu))
    state, size, lower, upper = find_crossover([(n, cpu[n], gpu[n]) for n in common])
    return {"state": state.value, "size": size, "lower": lower, "upper": upper}


def load(path: Path) -> dict[str, Any]:
    """A recorded report, with its sizes as numbers again and older JAX references brought up to date."""

    def sizes_as_numbers(mapping: dict[str, Any]) -> dict[Any, Any]:
        return {int(key) if key.isdigit() else key: value for key, value in mapping.items()}

    report: dict[str, Any] = json.loads(path.read_text(), object_hook=sizes_as_numbers)
    if "references" not in report:
        raise SystemExit(f"{path}: written by an older gpu_reference.py; the .md beside it is its report")
    for key, reference in report["references"].get("jax", {}).items():
        notes = reference.get("notes") if key.startswith("tf32=") else None
        if notes is not None and "profiled" not in notes:
            # Recorded before tighter_bound: the GPU compute curve holds the profiler's figures where
            # it had them. The JSON stays as measured; the report applies today's rule.
            compute = reference["gpu"]["compute"]
            notes["profiled"] = {n: compute[n] for n, how in notes["gpu_compute"].items() if how.startswith("profiler")}
            chosen, notes["gpu_compute"] = tighter_bound(notes["profiled"], notes["host_loop"])
            compute.update(chosen)
    return report


def sweeps_of(report: dict[str, Any], backend: str) -> list[dict[str, Any]]:
    """The backend's TF32-off sweeps: the first of the comparison, then the repeats."""
    first = report["runs"].get("tf32=False", {}).get(backend)
    return [s for s in [first, *report["repeats"].get(backend, [])] if s is not None]


def _ratio_rows(
    sizes: list[int],
    service: Curves,
    reference: dict[str, Any],
    cpu_reference: ModeCurves | None,
    torch_events: ModeCurves | None,
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
    sizes = report.get("sizes") or sorted(report["naive"]["cpu"])  # older reports: the naive run has every size
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
                lines += [f"- failed: {sweep['failed']}" if sweep else "- not run: see 'skipped' at the end", ""]
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
        sweeps = [s for s in sweeps_of(report, backend) if "failed" not in s]
        for mode in MODES:
            found_at = [s["crossovers"].get(mode, {}).get("size") for s in sweeps]
            found = [size for size in found_at if size]
            ratio = max(found) / min(found) if found and len(found) == len(found_at) else None
            lines.append(
                f"- {backend} {mode}: " + ", ".join(_num(size) for size in found_at) + f" → max/min {_num(ratio, 3)}"
                f" over {len(found_at)} sweeps"
            )
        lines += [f"- {backend}: a sweep failed: {s['failed']}" for s in sweeps_of(report, backend) if "failed" in s]
    lines += [f"- skipped: {skip}" for skip in report["skipped"]]
    return "\n".join(lines) + "\n"


def _methods(notes: dict[str, Any]) -> str:
    """How the reference timed each part; for JAX also the profiler's outcome and the kernels it saw."""
    compute = notes.get("gpu_compute")
    if isinstance(compute, dict):
        compute = ", ".join(sorted(set(compute.values())))
    text = f"GPU compute: {compute}; GPU end_to_end: {notes.get('gpu_end_to_end')}; CPU: {notes.get('cpu')}"
    if notes.get("profiler_method"):
        text += "; profiler read as " + ", ".join(sorted(set(notes["profiler_method"].values())))
    if notes.get("profiler_error"):
        text += f"; profiler failed ({notes['profiler_error']})"
    kernels = notes.get("kernels") or {}
    if kernels:
        text += "; kernels at the largest size: " + ", ".join(kernels[max(kernels)])
    return text


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    recorded = load(Path(sys.argv[1]))
    print(render(recorded, recorded["arguments"]["backends"].split(",")), end="")
