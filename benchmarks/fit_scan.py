"""How to put n* on a sweep's visits, and which drift window that allows (issue 17, 2026-12-02).

Every recorded idle H200 sweep's end_to_end and compute points (the paired visits' median log
speed-ups, as ``crossover_monitor.crossover`` pairs them) located in several ways: the bracket's interpolation
(the service before this session), and a polynomial in log n of degree 1 or 2 fitted through the
revisited sizes within ``reach`` of the bracket (falling back to the interpolation where it does not
rise or crosses outside them). For each: the standard deviation of log n* between idle sweeps (fresh
processes), and its level against the interpolation's (a bias from the curve's bend). Then, with the
chosen estimator's values, ``drift_window_scan.fires`` over windows of 5-8 sweeps, 3.5-4 standard
errors, hold 0-1: false alerts in 30 simulated months and the share of 200 planted moves (x1.3,
x0.77) caught within 8 sweeps, with the slowest. Output: results/fit-scan-2026-12-02.txt.

    python benchmarks/fit_scan.py
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from drift_window_scan import SWEEPS, false_onsets, plant_waits  # noqa: E402
from replay import load  # noqa: E402

from crossover_monitor.crossover import SpeedupPoint, last_crossing, speedup_point  # noqa: E402
from crossover_monitor.model import curves  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
IDLE = {
    "tensorflow": [
        "gpu-proof-tensorflow-h200-2026-12-01.jsonl:idle",
        "gpu-proof-tensorflow-nosampler-h200-2026-12-01b.jsonl:idle-nosampler",
        "gpu-proof-tensorflow-more-h200-2026-12-01b.jsonl:idle",
    ],
    "torch": [
        "gpu-proof-torch-planted-busy-h200-2026-12-01.jsonl:idle",
        "gpu-proof-torch-more-h200-2026-12-01b.jsonl:idle",
    ],
}
ESTIMATORS = {
    "interpolated": (1.0, 0),
    "line, reach 1.3": (1.3, 1),
    "line, reach 1.5": (1.5, 1),
    "quadratic, 1.5": (1.5, 2),
}
CHOSEN = "line, reach 1.5"


def sweep_points(backend: str, mode: str) -> list[list[SpeedupPoint]]:
    """Each recorded idle sweep's speed-up points of one mode (sweeps without a CPU and a GPU curve left out)."""
    found = []
    for outcome in load([str(RESULTS / spec) for spec in IDLE[backend]]):
        assert outcome.snapshot is not None
        grouped = curves(outcome.snapshot.measurements, roles=("sweep", "refine"))
        timings = {
            key.device: {n: m.timing for n, m in points.items()} for key, points in grouped.items() if key.mode == mode
        }
        cpu = next((t for d, t in timings.items() if "cpu" in d.lower()), None)
        gpu = next((t for d, t in timings.items() if "cpu" not in d.lower()), None)
        if cpu and gpu:
            found.append(sorted((speedup_point(n, cpu[n], gpu[n]) for n in set(cpu) & set(gpu)), key=lambda p: p.size))
    return found


def located(points: list[SpeedupPoint], reach: float, degree: int) -> float | None:
    """n* by the bracket's interpolation (degree 0), or by a fit of that degree through the revisited sizes near it."""
    _, size, lower, upper = last_crossing([(p.size, p.median) for p in points])
    if size is None or lower is None or upper is None or degree == 0:
        return size
    near = [p for p in points if len(p.log_ratios) > 1 and lower / reach <= p.size <= upper * reach]
    if len(near) < degree + 2:
        return size
    xs = np.log([p.size for p in near]) - math.log(size)
    coefficients = np.polyfit(xs, [p.median for p in near], degree)
    slope = np.polyder(coefficients)
    roots = [r.real for r in np.roots(coefficients) if abs(r.imag) < 1e-12 and xs[0] <= r.real <= xs[-1]]
    roots = [r for r in roots if np.polyval(slope, r) > 0]
    return size if not roots else size * math.exp(min(roots, key=abs))


def main() -> None:
    chosen: dict[str, np.ndarray] = {}
    for backend in IDLE:
        for mode in ("compute", "end_to_end"):
            sweeps = [p for p in sweep_points(backend, mode) if last_crossing([(q.size, q.median) for q in p])[1]]
            logs = {name: [math.log(located(p, *how) or math.nan) for p in sweeps] for name, how in ESTIMATORS.items()}
            base = statistics.fmean(logs["interpolated"])
            cells = [
                f"{name} SD {statistics.stdev(v):.3f} level {statistics.fmean(v) - base:+.3f}"
                for name, v in logs.items()
            ]
            print(f"{backend} {mode} ({len(sweeps)} idle sweeps): " + " | ".join(cells))
            chosen[f"{backend} {mode}"] = np.array(logs[CHOSEN])
    print(f"\nDrift windows on '{CHOSEN}' (false alerts in 30 months; within 8 sweeps of x1.3 and x0.77 / slowest):")
    for window in (5, 6, 7, 8):
        for multiple in (3.5, 4.0):
            for hold in (0, 1):
                row = []
                for name, values in chosen.items():
                    rng = np.random.default_rng(2)
                    false_alerts = false_onsets(values, 3 * SWEEPS, (window, multiple, hold), rng=rng)
                    caught = []
                    for factor in (1.3, 0.77):
                        waits = plant_waits(values, factor, 200, (window, multiple, hold), rng=rng)
                        caught.append(f"{np.mean(np.array(waits) <= 8):.2f}/{max(waits)}")
                    row.append(f"{name} false={false_alerts} " + " ".join(caught))
                print(f"W={window} m={multiple} hold={hold} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
