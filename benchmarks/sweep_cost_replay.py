"""Cheaper sweeps replayed over recorded idle ones (issue 54): what fewer blocks and fewer visits cost n*.

Each recorded idle sweep (`gpu_proof.py`'s JSON lines: every point's blocks and, for the sizes around n*, each
visit's median) is cut down as a cheaper plan would have timed it, then its crossovers are derived again by the
current code (``crossover_monitor.analysis.crossover``):

- ``visits=K``: a point timed in several visits keeps its first K (the CPU's and the GPU's k-th visits stay paired);
- ``blocks=B``: a point's first visit keeps its first B blocks (at least the 3 a point always takes), its median
  read from them; a revisit's blocks (3) are kept as they were.

- ``focused``: the sweeps taken as one every 15 minutes, each planned as the service plans it between whole curves
  (``analysis.focus.carried_points`` over the snapshot served before it, ``benchmark.full_curve_every`` 1 h): its
  carried points cost nothing and keep the served values, and where the crossovers lean on a carried size (its
  ``lower`` or ``upper``) the sweep's own points are taken instead, as the worker would time them.

For each variant and mode it prints the n* of every sweep's pair, their spread over the run's idle sweeps (range
over median, and the log standard deviation), how often the state changed from the recorded one, and the CPU-seconds
of the timed blocks kept (calls x median x the cores a point keeps busy) against the recorded sweeps'. A first-order
model: the refinement chose its sizes from the full timings, and warm-up, calibration and the worker's start are
not counted (sweep_cost.py measures those on a GPU host).

    python benchmarks/sweep_cost_replay.py benchmarks/results/gpu-proof-torch-h200-2026-12-03b.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crossover_monitor.analysis.carry import served
from crossover_monitor.analysis.crossover import crossovers
from crossover_monitor.analysis.focus import carried_points
from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.measure.runner import REVISIT_BLOCKS
from crossover_monitor.model import CrossoverState, Measurement, RecentCrossovers, Snapshot, Timing
from crossover_monitor.view.report import read_json

MIN_BLOCKS = 3
VARIANTS = (
    ("recorded", None, None, False),
    ("visits=5", 5, None, False),
    ("visits=3", 3, None, False),
    ("blocks=10", None, 10, False),
    ("blocks=5", None, 5, False),
    ("visits=3 blocks=5", 3, 5, False),
    ("focused", None, None, True),
    ("focused blocks=10", None, 10, True),
)
SCHEDULE_S = 900.0  # the default schedule: the focused plan's sweeps are taken as this far apart


def idle_sweeps(path: Path) -> Iterator[Snapshot]:
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        once = record.get("once") or {}
        if record.get("label") == "idle" and once.get("snapshot"):
            snapshot = read_json(once).snapshot
            if snapshot is not None:
                yield snapshot


def _median(values: tuple[float, ...]) -> float:
    return statistics.median(values)


def cut(timing: Timing, visits: int | None, blocks: int | None) -> Timing:
    """The timing as a plan of at most ``visits`` visits and ``blocks`` first-visit blocks would have left it."""
    revisits = max(len(timing.visits_s) - 1, 0)
    first = timing.samples_s[: len(timing.samples_s) - revisits * REVISIT_BLOCKS]
    later = timing.samples_s[len(first) :]
    kept_first = first if blocks is None else first[: max(blocks, MIN_BLOCKS)]
    if not timing.visits_s:
        samples = kept_first
        return dataclasses.replace(timing, median_s=_median(samples), blocks=len(samples), samples_s=samples)
    keep = len(timing.visits_s) if visits is None else min(visits, len(timing.visits_s))
    medians = (_median(kept_first), *timing.visits_s[1:keep])
    samples = kept_first + later[: (keep - 1) * REVISIT_BLOCKS]
    return dataclasses.replace(
        timing, median_s=_median(medians), blocks=len(samples), samples_s=samples, visits_s=medians if keep > 1 else ()
    )


def cpu_seconds(snapshot: Snapshot, measurements: tuple[Measurement, ...]) -> float:
    kinds = {d.device: d.kind for d in snapshot.devices}
    threads = {d.device: int(dict(d.details).get("threads", "1") or 1) for d in snapshot.devices}
    return sum(
        len(m.timing.samples_s)
        * m.timing.calls_per_block
        * m.timing.median_s
        * (threads[m.key.device] if kinds[m.key.device] == "cpu" else 1)
        for m in measurements
    )


def replay(snapshot: Snapshot, visits: int | None, blocks: int | None) -> tuple[dict[str, Any], float]:
    measurements = tuple(dataclasses.replace(m, timing=cut(m.timing, visits, blocks)) for m in snapshot.measurements)
    found: dict[str, Any] = {c.mode: (c.state, c.size) for c in crossovers(snapshot.devices, measurements)}
    return found, cpu_seconds(snapshot, measurements)


def focused(sweeps: list[Snapshot], blocks: int | None) -> list[tuple[dict[str, Any], float]]:
    """Each sweep as the service would have timed it at a 15-minute schedule: (crossovers by mode, timed CPU-s)."""
    rows: list[tuple[dict[str, Any], float]] = []
    latest: Snapshot | None = None
    recent: tuple[RecentCrossovers, ...] = ()
    for index, snapshot in enumerate(sweeps):
        at = index * SCHEDULE_S
        bench = BenchmarkSettings(sizes=tuple(sorted({m.key.size for m in snapshot.measurements if m.role == "sweep"})))
        carried = {m.key: m for m in carried_points(bench, latest, now=at, until_next_s=SCHEDULE_S)}
        recorded = tuple(dataclasses.replace(m, timing=cut(m.timing, None, blocks)) for m in snapshot.measurements)
        kept = tuple(carried.get(m.key, m) for m in _refined_around(snapshot, latest, blocks))
        # Where the crossing reaches a carried or a once-timed size (n* moved, or the curves cross more than once),
        # the worker times that curve's points again and visits them: as the recorded sweep did.
        again = {
            (c.dtype, c.mode)
            for c in crossovers(snapshot.devices, kept)
            if c.state is CrossoverState.AMBIGUOUS
            or any(k.size in (c.lower, c.upper) and (k.dtype, k.mode) == (c.dtype, c.mode) for k in carried)
        }
        kept = tuple(m for m in recorded if (m.key.dtype, m.key.mode) in again) + tuple(
            k for k in kept if (k.key.dtype, k.key.mode) not in again
        )
        timed = tuple(m for m in kept if not m.carried)
        new = dataclasses.replace(snapshot, measurements=kept, crossovers=crossovers(snapshot.devices, kept))
        new = dataclasses.replace(
            new, finished_at=at, crossovers=tuple(dataclasses.replace(c, derived_at=at) for c in new.crossovers)
        )
        latest, recent = served(latest, new, recent=recent)
        rows.append(({c.mode: (c.state, c.size) for c in new.crossovers}, cpu_seconds(snapshot, timed)))
    return rows


def _refined_around(snapshot: Snapshot, latest: Snapshot | None, blocks: int | None) -> tuple[Measurement, ...]:
    """The sweep's points as a refinement that visits first where the served n* was would have left them: sizes
    more than a step (20%) outside the served crossovers' reach not visited (a refinement's size not timed, a
    configured one timed once), unless the sweep's own n* lies out there (the next round would visit it)."""
    spans: dict[str, tuple[float, float]] = {}
    for c in latest.crossovers if latest is not None else ():
        if c.reach is not None:
            low, high = spans.get(c.mode, c.reach)
            spans[c.mode] = (min(low, c.reach[0]), max(high, c.reach[1]))
    reach = {mode: (low / 1.2, high * 1.2) for mode, (low, high) in spans.items()}
    found = {c.mode: c.size for c in snapshot.crossovers if c.size is not None}
    kept: list[Measurement] = []
    for m in snapshot.measurements:
        low, high = reach.get(m.key.mode, (0.0, math.inf))
        inside = found.get(m.key.mode) is None or low <= found[m.key.mode] <= high
        if inside and not low <= m.key.size <= high and m.timing.visits_s:
            if m.role == "refine":
                continue
            kept.append(dataclasses.replace(m, timing=cut(cut(m.timing, 1, None), None, blocks)))
        else:
            kept.append(dataclasses.replace(m, timing=cut(m.timing, None, blocks)))
    return tuple(kept)


def spread(sizes: list[float]) -> str:
    if len(sizes) < 2:
        return "-"
    logs = [math.log(s) for s in sizes]
    return (
        f"range/median {(max(sizes) - min(sizes)) / statistics.median(sizes):.2f}, log SD {statistics.stdev(logs):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.runs:
        sweeps = list(idle_sweeps(path))
        print(f"{path.name}: {len(sweeps)} idle sweeps")
        base: dict[int, dict[str, Any]] = {}
        base_cost = 0.0
        for name, visits, blocks, focus in VARIANTS:
            rows = focused(sweeps, blocks) if focus else [replay(s, visits, blocks) for s in sweeps]
            cost = statistics.mean(c for _, c in rows)  # a sweep's cost over the run: focused runs alternate
            if name == "recorded":
                base = dict(enumerate(r for r, _ in rows))
                base_cost = cost
            print(f"  {name:18s} timed CPU-s {cost:6.1f} ({cost / base_cost:4.0%})")
            for mode in ("compute", "end_to_end"):
                sizes = [r[mode][1] for r, _ in rows if r.get(mode, (None, None))[0] is CrossoverState.FOUND]
                changed = sum(
                    1
                    for i, (r, _) in enumerate(rows)
                    if r.get(mode) and r[mode][0] != base[i].get(mode, (None, None))[0]
                )
                shown = " ".join(f"{s:.0f}" for s in sizes)
                print(f"    {mode:10s} n* {shown}  ({spread(sizes)}; state changed in {changed})")


if __name__ == "__main__":
    main()
