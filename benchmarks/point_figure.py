"""Each point's own idle range replayed over recorded shared_node.py runs: what the guard would have withheld.

While other programs use at least ``guard.range_others_cores`` of the host (the gate alone: the recorded runs
are of quiet nodes, whose usual load is below it; ``ranges.others_gate``), the guard holds a host-bound
point against the top of its idle range (its medians in recent calm sweeps, ``PointMedians.top``), widened by
``guard.range_max_slowdown``. This replays that rule over the cotenants phase of recorded runs, in the order the
sweeps ran, as the service keeps the ranges: each sweep's published points against the ranges of the calm sweeps
before it (others below the gate), after which a calm sweep's points join them. It prints, per sweep, the points
outside the run's idle range +-10% (shared_node.py's report: every idle sweep of the run, later ones too), those
the rule would withhold, and what stays outside. Issue 32.

A proxy, and it says so: the guard gates each point on the load over that point, and calls a point calm by it;
the recordings keep the most the CPU's points saw over the sweep (its hardware context) or, where the CPU was
withheld, what its reason names, so this gates more points and calls fewer calm than the guard would; a
refinement's sizes are not judged here; a compute point's host share is the sweep's n = 1 point over its range's
top. A run
has a few calm sweeps before its co-tenants where the service has dozens: ``--all-idle`` takes every calm idle
sweep of the run but the one judged (the range a long-running service would have built that hour).

Usage: ``python benchmarks/point_figure.py benchmarks/results/shared-node-*-2026-12-06*.json``
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared_node import host_readings

from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.measure.guard.guard import host_share_at
from crossover_monitor.measure.guard.rule import past_idle_range
from crossover_monitor.model import DeviceKind, PointKey, PointMedians
from crossover_monitor.service.state import POINT_MEDIANS_KEPT

OTHERS_NAMED = re.compile(r"other processes used ([0-9.]+) cores")
RANGE_WIDENED = 0.10  # shared_node.py's report: the idle range widened by 10%


def others_cores(service: dict[str, Any]) -> float | None:
    """The most other programs (or steal) used over the sweep's CPU points; None where the CPU was not timed."""
    readings = host_readings(service)
    if readings["other_cores"] is not None:
        return max(readings["other_cores"], readings["steal_cores"] or 0.0)
    named = [float(m.group(1)) for w in service.get("withheld") or [] if (m := OTHERS_NAMED.search(w["detail"]))]
    return max(named, default=None)


def host_share(point: str, seconds: float, published: dict[str, float]) -> float | None:
    """The share of ``seconds`` of the point that is the host's, as the guard takes it (``guard.host_share_at``),
    the sweep's n = 1 point standing for its fixed cost; None (not judged) where the sweep published none."""
    device, mode, size = point.split()
    fixed = published.get(f"{device} compute 1")
    kind: DeviceKind = "cpu" if device == "cpu" else "gpu"
    return host_share_at(kind, "compute" if mode == "compute" else "end_to_end", int(size), fixed, seconds)


def judge(
    service: dict[str, Any], idle: list[dict[str, Any]], calm: dict[str, list[float]], gate: float
) -> dict[str, Any]:
    """The sweep's published points against the run's idle range, and against their calm ranges so far."""
    published: dict[str, float] = service.get("published", {})
    others = others_cores(service)
    allowed = GuardSettings().range_max_slowdown
    outside, withheld = {}, {}
    for point, seconds in published.items():
        medians = [s["published"][point] for s in idle if point in s.get("published", {})]
        if len(medians) >= 2:
            low, high = min(medians) / (1 + RANGE_WIDENED), max(medians) * (1 + RANGE_WIDENED)
            if not low <= seconds <= high:
                outside[point] = round(seconds / statistics.median(medians), 3)
        if others is None or others < gate:
            continue
        key = PointKey(backend="", device="", dtype="", mode="compute", size=0)
        figure = PointMedians(key=key, medians_s=tuple(calm.get(point, ())[-POINT_MEDIANS_KEPT:])).top
        if figure is None or not (math.isfinite(figure.upper_s) and figure.upper_s > 0):
            continue
        # The share at the range's top, as the guard takes it.
        ratio = past_idle_range(seconds, figure.upper_s, host_share(point, figure.upper_s, published), allowed)
        if ratio is not None:
            withheld[point] = round(ratio, 3)
    return {
        "others": others,
        "outside": outside,
        "withheld": withheld,
        "still_outside": {p: r for p, r in outside.items() if p not in withheld},
        "withheld_inside": sorted(p for p in withheld if p not in outside),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="shared_node.py --out files with a cotenants phase")
    parser.add_argument("--gate", type=float, default=GuardSettings().range_others_cores, help="cores")
    parser.add_argument("--all-idle", action="store_true", help="ranges from every calm idle sweep of the run")
    args = parser.parse_args()
    totals = {"outside": 0, "still_outside": 0, "withheld_inside": 0, "idle_sweeps": 0, "idle_withholding": 0}
    for path in args.runs:
        data = json.loads(path.read_text())
        rows = data.get("cotenants") or []
        idle = [r["service"] for r in rows if r["shape"] == "idle"]
        print(f"{path.name} ({data.get('backend')}): {len(idle)} idle sweeps, gate {args.gate} cores")
        calm: dict[str, list[float]] = {}
        for index, row in enumerate(rows):
            service = row["service"]
            others_idle = [s for s in idle if s is not service] if row["shape"] == "idle" else idle
            if args.all_idle:
                calm = {}
                for other in others_idle:
                    if (others_cores(other) or 0.0) < args.gate:
                        for point, seconds in other.get("published", {}).items():
                            calm.setdefault(point, []).append(seconds)
            found = judge(service, others_idle, calm, args.gate)
            if not args.all_idle and found["others"] is not None and found["others"] < args.gate:
                for point, seconds in service.get("published", {}).items():
                    calm.setdefault(point, []).append(seconds)
            if row["shape"] == "idle":
                totals["idle_sweeps"] += 1
                totals["idle_withholding"] += bool(found["withheld"])
            else:
                totals["outside"] += len(found["outside"])
                totals["still_outside"] += len(found["still_outside"])
            totals["withheld_inside"] += len(found["withheld_inside"])
            others = "?" if found["others"] is None else f"{found['others']:.2f}"
            print(
                f"  {index:2} {row['shape']:<16} others {others:>5}  outside {len(found['outside']):2}  "
                f"withheld {len(found['withheld']):2} (inside the range: {len(found['withheld_inside'])})  "
                f"still outside: {found['still_outside'] or 'none'}"
            )
    print(
        f"co-tenant points outside the idle range +-10%: {totals['outside']}, of them still published: "
        f"{totals['still_outside']}; points inside it withheld: {totals['withheld_inside']}; idle sweeps "
        f"withholding anything: {totals['idle_withholding']} of {totals['idle_sweeps']}"
    )


if __name__ == "__main__":
    main()
