"""Would a median guard keep a few outlier sweeps from firing the 2-hour drift window? (issue 17, 2026-12-03)

A numpy scan like ``drift_window_scan.py``, on n* of every recorded idle H200 sweep as the current
code locates them (``replay.py``'s loading; the TensorFlow pool includes the 2026-12-02 sweep at 474
and the 2026-12-01 one at 983). The 2-hour condition (8 sweeps, 20%, 4 standard errors, no hold) is
compared, on the same draws, with the same condition that also needs the window's median of log n*
moved in the mean's direction by more than ``fraction`` of the threshold. Prints false onsets in 30
idle months and, over 400 plants each, how often a move x1.3, x0.7, x0.77 fired within 8 sweeps.
Not in the rules yet (see benchmarks/README.md, "Fifth session").

    python benchmarks/median_guard_scan.py
"""

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drift_window_scan as scan

POOLS = {
    "tensorflow end_to_end": [782, 747, 766, 686, 676, 813, 811, 866, 725, 983, 868, 850, 723, 726, 721, 474, 757, 703,
                              808, 790, 786, 776, 699, 729, 762, 846, 741, 802, 740, 779, 851, 834, 760, 835, 729, 751,
                              802, 786, 804, 704, 743, 711, 804, 844, 786, 793, 803, 809, 783],
    "tensorflow compute": [79, 84, 86, 86, 87, 84, 81, 79, 86, 81, 87, 83, 85, 83, 82, 81, 84, 86, 87, 75, 83, 78, 83,
                           78, 80, 76, 79, 77, 84, 86, 79, 81, 79, 77, 79, 78, 80, 78, 77, 75, 77, 81, 76, 77, 77, 85,
                           83, 87, 77, 80, 95, 88],
    "torch compute": [136, 133, 142, 130, 154, 131, 150, 131, 131, 146, 145, 153, 163, 164, 165],
    "torch end_to_end": [615, 647, 561, 577, 561, 741, 594, 533, 602, 590, 648, 630, 702, 646, 697],
}  # fmt: skip
WINDOW, MULTIPLE = 8, 4.0
FRACTIONS = (None, 0.5, 0.75, 1.0)  # None: the rule as it is


def guarded(logs: np.ndarray, fired: np.ndarray, fraction: float | None) -> np.ndarray:
    """``fired`` where the window's median also moved, in the mean's direction, beyond fraction x threshold."""
    if fraction is None:
        return fired
    out = fired.copy()
    total = np.cumsum(np.r_[0, logs])
    for i in np.nonzero(fired)[0]:
        j = i + 1 - WINDOW
        baseline = (total[j] - total[j - scan.BASELINE]) / scan.BASELINE
        recent = (total[i + 1] - total[j]) / WINDOW
        median = float(np.median(logs[j : i + 1]))
        out[i] = (median - baseline) * np.sign(recent - baseline) > math.log(1 + fraction * scan.THRESHOLD)
    return out


def main() -> None:
    rng = np.random.default_rng(7)
    for name, sizes in POOLS.items():
        logs = np.log(sizes)
        idle = rng.choice(logs, 30 * 30 * 96)
        fired = scan.fires(idle, WINDOW, MULTIPLE, 0)
        onsets = []
        for fraction in FRACTIONS:
            alerts = guarded(idle, fired, fraction)
            onsets.append(f"{fraction}: {int(np.sum(alerts[1:] & ~alerts[:-1]) + alerts[0])}")
        print(f"{name}: false onsets in 30 idle months, by median fraction: " + ", ".join(onsets))
        for factor in (1.3, 0.7, 0.77):
            waits: dict[float | None, list[int]] = {f: [] for f in FRACTIONS}
            for _ in range(400):
                planted = np.r_[rng.choice(logs, 200), rng.choice(logs, 60) + math.log(factor)]
                base = scan.fires(planted, WINDOW, MULTIPLE, 0)
                for fraction in FRACTIONS:
                    after = np.nonzero(guarded(planted, base, fraction)[200:])[0]
                    waits[fraction].append(int(after[0]) + 1 if len(after) else 99)
            cells = [f"{f}: {np.mean(np.array(w) <= 8):.1%} (slowest {max(w)})" for f, w in waits.items()]
            print(f"  x{factor} within 8 sweeps: " + ", ".join(cells))


if __name__ == "__main__":
    main()
