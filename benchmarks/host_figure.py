"""The host reference's idle figure replayed over recorded shared_node.py runs: which sweeps it would call slowed.

Each run's sweeps (co-tenant and idle, in order) recorded their host reference's median. For every sweep this
prints its median against the figure of the sweeps before it, as the service's state computes it
(`HostReference.of`), and against the earlier first-quartile figure, each with the allowance the guard
derives from the figure's spread (`guard.host_max_slowdown` widened by the spread, at most 25%); a `*` marks
a sweep past it. A proxy: the guard judges each point by the readings taken around it, not the sweep's median.
Issue 32.

Usage: ``python benchmarks/host_figure.py benchmarks/results/shared-node-*-2026-12-06*.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crossover_monitor.bench.guard import host_allowance
from crossover_monitor.model import HostReference
from crossover_monitor.settings import GuardSettings

QUARTILES_FROM = 4  # HostReference.of: fewer sweeps give their median


def first_quartile(kept: list[HostReference]) -> HostReference:
    """The figure from 1ed9868 until 03450f0: the first quartile, its spread twice median less it, against it."""
    medians = [r.median_s for r in kept]
    within = statistics.median(r.spread for r in kept)
    if len(medians) < QUARTILES_FROM:
        return HostReference(median_s=statistics.median(medians), spread=within)
    q1, median, _ = statistics.quantiles(medians, n=4, method="inclusive")
    return HostReference(median_s=q1, spread=max(within, 2 * (median - q1) / q1))


def judged(median_s: float, figure: HostReference) -> tuple[float, bool]:
    allowed = host_allowance(GuardSettings().host_max_slowdown, figure.spread)
    ratio = median_s / figure.median_s
    return ratio, ratio - 1 > allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="shared_node.py --out files with a cotenants phase")
    args = parser.parse_args()
    differ = sweeps = 0
    for path in args.runs:
        rows = json.loads(path.read_text()).get("cotenants", [])
        readings = [
            (
                row["shape"],
                HostReference(median_s=float(env["host_reference_s"]), spread=float(env["host_reference_spread"])),
            )
            for row in rows
            if "host_reference_s" in (env := row["service"].get("environment", {}))
        ]
        if not readings:
            continue
        print(path.name)
        for index, (shape, reading) in enumerate(readings):
            kept = [r for _, r in readings[:index]]
            if not kept:
                print(f"  {shape[:16]:16} {reading.median_s * 1e3:.3f} ms")
                continue
            figure = HostReference.of(kept)
            assert figure is not None
            now, now_flag = judged(reading.median_s, figure)
            old, old_flag = judged(reading.median_s, first_quartile(kept))
            sweeps += 1
            differ += now_flag != old_flag
            print(
                f"  {shape[:16]:16} {reading.median_s * 1e3:.3f} ms  figure {now:.2f}{'*' if now_flag else ' '}"
                f"  first quartile {old:.2f}{'*' if old_flag else ' '}"
            )
    print(f"sweeps judged: {sweeps}, judged differently: {differ}")


if __name__ == "__main__":
    main()
