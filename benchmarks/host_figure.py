"""The host reference's idle figure replayed over recorded shared_node.py runs: which sweeps it would call slowed.

Each run's sweeps (its idle phase's, then its co-tenant phase's, in the order the process ran them) recorded their
host reference's median. For every sweep this prints its median against the figure of the sweeps before it, as
the service's state computes it (`HostReference.of`), and against the figure before 2026-12-07 (the median of
fewer than four sweeps), each with the allowance the guard derives from the figure's spread
(`guard.reference_max_slowdown` widened by the spread, at most 25%); a `*` marks a sweep past it. A proxy: the guard
judges each point by the readings taken around it, not the sweep's median. Issue 32.

Usage: ``python benchmarks/host_figure.py benchmarks/results/shared-node-*.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.measure.guard.rule import host_allowance
from crossover_monitor.model import HostReference

MEDIAN_BELOW = 4  # the figure before 2026-12-07: fewer sweeps gave their median


def young_median(kept: list[HostReference]) -> HostReference:
    """The figure until 2026-12-07: as now from four sweeps on, the median of fewer (and their spread within)."""
    if len(kept) >= MEDIAN_BELOW:
        figure = HostReference.of(kept)
        assert figure is not None
        return figure
    medians = [r.median_s for r in kept]
    return HostReference(median_s=statistics.median(medians), spread=statistics.median(r.spread for r in kept))


def sweeps_in_order(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(shape, service) of each sweep, in the order the process ran them: its idle phase, then its co-tenants'."""
    return [("idle", row["service"]) for row in run.get("idle", [])] + [
        (row["shape"], row["service"]) for row in run.get("cotenants", [])
    ]


def judged(median_s: float, figure: HostReference) -> tuple[float, bool]:
    allowed = host_allowance(GuardSettings().reference_max_slowdown, figure.spread)
    ratio = median_s / figure.median_s
    return ratio, ratio - 1 > allowed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="shared_node.py --out files with a cotenants phase")
    args = parser.parse_args()
    differ = sweeps = 0
    for path in args.runs:
        readings = [
            (
                shape,
                HostReference(median_s=float(env["host_reference_s"]), spread=float(env["host_reference_spread"])),
            )
            for shape, service in sweeps_in_order(json.loads(path.read_text()))
            if "host_reference_s" in (env := service.get("environment", {}))
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
            old, old_flag = judged(reading.median_s, young_median(kept))
            sweeps += 1
            differ += now_flag != old_flag
            print(
                f"  {shape[:16]:16} {reading.median_s * 1e3:.3f} ms  figure {now:.2f}{'*' if now_flag else ' '}"
                f"  before {old:.2f}{'*' if old_flag else ' '}"
            )
    print(f"sweeps judged: {sweeps}, judged differently: {differ}")


if __name__ == "__main__":
    main()
