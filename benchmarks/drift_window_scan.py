"""Which window, standard-error multiple and hold a two-sample drift condition needs (issue 17, 2026-12-02).

A quick scan before the real rules are replayed: log n* drawn at random (seeded) from the recorded
idle H200 sweeps (``VALUES``: TensorFlow 15, PyTorch 18, both modes), 10 months at the 15-minute
schedule; the condition is the mean of the last ``W`` sweeps against the mean and standard
deviation of the day (96 sweeps) before them, beyond the threshold (20%) and ``m`` standard
errors, held for ``hold`` more evaluations. Prints, per setting, the false alerts in the 10 months
and the delay (median/max sweeps over 10 plants; 99 = never) of a move x1.3, x0.7 and x0.77.
The chosen setting (W = 8, m = 4, hold = 1) was then replayed through the real rules with
``replay.py``. Output: results/drift-window-scan-2026-12-02.txt.

    python benchmarks/drift_window_scan.py
"""

import math
import sys

import numpy as np

# Crossovers (n*) of the recorded idle sweeps (gpu-proof-*-h200-2026-12-01*.jsonl, as replay.py loads them).
VALUES = {
    "tensorflow compute": [86, 92, 92, 86, 93, 86, 86, 82, 91, 85, 93, 88, 92, 86, 88],
    "tensorflow end_to_end": [810, 684, 882, 678, 659, 830, 820, 917, 630, 1058, 924, 900, 714, 742, 689],
    "torch compute": [136, 135, 138, 163, 128, 127, 135, 135, 138, 136, 143, 133, 153, 131, 149, 136, 136, 144],
    "torch end_to_end": [611, 685, 583, 569, 636, 567, 622, 623, 625, 630, 556, 569, 555, 785, 579, 536, 582, 598],
}
BASELINE = 96  # the day before the window, in sweeps
THRESHOLD = 0.2
SWEEPS = 10 * 30 * 96  # 10 months at 15 minutes


def fires(logs: np.ndarray, window: int, multiple: float, hold: int) -> np.ndarray:
    """Where the condition has held for ``hold`` more evaluations after the one that first met it."""
    total = np.cumsum(np.r_[0, logs])
    squares = np.cumsum(np.r_[0, logs * logs])
    met = np.zeros(len(logs), bool)
    for i in range(window + BASELINE - 1, len(logs)):
        recent = (total[i + 1] - total[i + 1 - window]) / window
        j = i + 1 - window
        mean = (total[j] - total[j - BASELINE]) / BASELINE
        variance = max((squares[j] - squares[j - BASELINE]) / BASELINE - mean * mean, 0.0)
        spread = math.sqrt(variance * BASELINE / (BASELINE - 1))
        move = abs(recent - mean)
        met[i] = move > math.log(1 + THRESHOLD) and move > multiple * spread * math.sqrt(1 / window + 1 / BASELINE)
    held = np.zeros(len(logs), bool)
    run = 0
    for i, now in enumerate(met):
        run = run + 1 if now else 0
        held[i] = run > hold
    return held


Condition = tuple[int, float, int]  # window (sweeps), standard-error multiple, hold (sweeps)


def false_onsets(logs: np.ndarray, sweeps: int, condition: Condition, *, rng: np.random.Generator) -> int:
    """Onsets of the condition over ``sweeps`` idle sweeps drawn at random from ``logs``."""
    alerts = fires(rng.choice(logs, sweeps), *condition)
    return int(np.sum(alerts[1:] & ~alerts[:-1]) + alerts[0])


def plant_waits(
    logs: np.ndarray, factor: float, plants: int, condition: Condition, *, rng: np.random.Generator
) -> list[int]:
    """Sweeps until the condition fires after 200 idle sweeps and then every n* times ``factor`` (99: never)."""
    waits = []
    for _ in range(plants):
        planted = np.r_[rng.choice(logs, 200), rng.choice(logs, 60) + math.log(factor)]
        after = np.nonzero(fires(planted, *condition)[200:])[0]
        waits.append(int(after[0]) + 1 if len(after) else 99)
    return waits


def main() -> None:
    rng = np.random.default_rng(1)
    for window in (4, 6, 8, 12, 24):
        for multiple in (3.0, 3.5, 4.0):
            for hold in (0, 1):
                row = []
                for name, sizes in VALUES.items():
                    logs = np.log(sizes)
                    false_alerts = false_onsets(logs, SWEEPS, (window, multiple, hold), rng=rng)
                    delays = []
                    for factor in (1.3, 0.7, 0.77):
                        waits = plant_waits(logs, factor, 10, (window, multiple, hold), rng=rng)
                        delays.append(f"x{factor}:{int(np.median(waits))}/{max(waits)}")
                    row.append(f"{name} false={false_alerts} " + " ".join(delays))
                print(f"W={window} m={multiple} hold={hold} | " + " | ".join(row))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
