"""Gaps in a curve and the crossover (issue 32): how often a size leads the other way from both its neighbours
in recorded sweeps, and which recorded crossovers a change to ``crossover.py`` turns to another state.

Reads every sweep recorded under ``benchmarks/results`` (and ``--more`` folders) as ``once --json`` writes it
(``snapshot`` objects anywhere in a JSON or JSON-lines file) and prints:

- the sizes between two others on one GPU-CPU curve: how far each one's median log speed-up lies from the
  line through its neighbours', and, by how clearly the neighbours lead, how many led the other way;
- with ``--against REV``: each crossover whose state ``crossover.py`` at that git revision derives otherwise
  than the working tree's, with the curve's leads, its named gaps and its sizes timed on one side only.

Usage: ``python benchmarks/crossover_gaps.py --against 1fc8a3c > benchmarks/results/crossover-gaps-DATE.log``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from crossover_monitor.analysis import crossover  # noqa: E402 - after the path
from crossover_monitor.model import PointKey, Snapshot  # noqa: E402
from crossover_monitor.model import curves as group_curves  # noqa: E402
from crossover_monitor.view.report import read_json  # noqa: E402

LEAD_BINS = ((0.0, 0.05), (0.05, 0.1), (0.1, 0.2), (0.2, 0.3), (0.3, math.inf))


def recorded(folders: list[Path]) -> Iterator[tuple[str, Snapshot]]:
    """Every sweep's snapshot in the JSON files under ``folders`` (``once --json`` outcomes anywhere in them, read
    by ``report.read_json`` as the replay reads them), with its file's name."""
    for folder in folders:
        for path in sorted([*folder.glob("*.json"), *folder.glob("*.jsonl")]):
            lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
            for line in lines:
                try:
                    data = json.loads(line)
                except ValueError:
                    continue
                for raw in _outcomes(data):
                    snapshot = read_json(raw).snapshot
                    if snapshot is not None:
                        yield path.name, snapshot


def _outcomes(data: Any) -> Iterator[dict[str, Any]]:
    """The objects holding a sweep's snapshot (``once --json``'s outcome), wherever a file nests them."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("snapshot"), dict) and "measurements" in item["snapshot"]:
                yield item
                continue
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def named_gaps(snapshot: Snapshot) -> list[PointKey]:
    """The configured sizes withheld alone, as the sweep hands them to ``crossovers``."""
    sizes = {m.key.size for m in snapshot.measurements if m.role == "sweep"}
    return [w.point for w in snapshot.withheld if w.point is not None and w.point.size in sizes]


def leads(snapshot: Snapshot) -> dict[tuple[str, str, str, str, str], list[tuple[int, float]]]:
    """Per (backend, gpu, cpu, dtype, mode): the sizes both timed, with the median log speed-up of each."""
    kinds = {d.device: d.kind for d in snapshot.devices}
    grouped = group_curves(snapshot.measurements, roles=("sweep", "refine"))
    curves = {(k.backend, k.device, k.dtype, k.mode): {n: m.timing for n, m in p.items()} for k, p in grouped.items()}
    found: dict[tuple[str, str, str, str, str], list[tuple[int, float]]] = {}
    for (backend, gpu, dtype, mode), gpu_curve in curves.items():
        if kinds.get(gpu) != "gpu":
            continue
        for (b, cpu, d, m), cpu_curve in curves.items():
            if (b, d, m) != (backend, dtype, mode) or kinds.get(cpu) != "cpu":
                continue
            common = sorted(set(gpu_curve) & set(cpu_curve))
            points = [crossover.speedup_point(n, cpu_curve[n], gpu_curve[n]) for n in common]
            found[(backend, gpu, cpu, dtype, mode)] = [(p.size, p.median) for p in points]
    return found


def flips(sweeps: list[tuple[str, Snapshot]]) -> None:
    deviations: list[float] = []
    by_lead = {b: [0, 0] for b in LEAD_BINS}
    flipped: list[float] = []  # the smaller of the neighbours' leads, where the size between led the other way
    for _, snapshot in sweeps:
        for points in leads(snapshot).values():
            for (n0, r0), (n1, r1), (n2, r2) in zip(points, points[1:], points[2:], strict=False):
                line = r0 + (r2 - r0) * math.log(n1 / n0) / math.log(n2 / n0)
                deviations.append(abs(r1 - line))
                if (r0 > 0) != (r2 > 0):
                    continue
                if (r1 > 0) != (r0 > 0):
                    flipped.append(min(abs(r0), abs(r2)))
                for low, high in LEAD_BINS:
                    if low <= min(abs(r0), abs(r2)) < high:
                        by_lead[(low, high)][0] += 1
                        by_lead[(low, high)][1] += (r1 > 0) != (r0 > 0)
                        break
    deviations.sort()
    q = [deviations[int(p * (len(deviations) - 1))] for p in (0.5, 0.9, 0.99)]
    print(f"{len(deviations)} sizes between two others; |log speed-up - the neighbours' line| p50 {q[0]:.3f}", end="")
    print(f" p90 {q[1]:.3f} p99 {q[2]:.3f} max {deviations[-1]:.3f}")
    for (low, high), (count, other) in by_lead.items():
        print(f"  neighbours share a lead, the smaller {low}-{high}: {count} sizes, {other} led the other way")
    if flipped:
        print(f"  the clearest shared lead a size went against: {max(flipped):.3f} ({math.exp(max(flipped)):.2f}x)")


def previous(revision: str) -> ModuleType:
    """``crossover.py`` as it was at ``revision``, imported as its own module."""
    text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{revision}:crossover_monitor/analysis/crossover.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "crossover_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("crossover_before", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["crossover_before"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def changes(sweeps: list[tuple[str, Snapshot]], before: ModuleType) -> None:
    total = changed = 0
    for name, snapshot in sweeps:
        gaps = named_gaps(snapshot)
        then = {c.key: c for c in before.crossovers(snapshot.devices, snapshot.measurements, gaps)}
        now = {c.key: c for c in crossover.crossovers(snapshot.devices, snapshot.measurements, gaps)}
        curves = leads(snapshot)
        for key, old in then.items():
            total += 1
            new = now[key]
            if old.state is new.state:
                continue
            changed += 1
            size = f" {old.size:.1f} ({old.lower}-{old.upper})" if old.size is not None else ""
            print(f"{name}: {key[0]} {key[4]}: {old.state.value}{size} -> {new.state.value}")
            pair = {key[1], key[2]}
            named = sorted(
                {(p.device, p.size) for p in gaps if p.mode == key[4] and p.dtype == key[3] and p.device in pair}
            )
            sides = {
                d: {
                    m.key.size
                    for m in snapshot.measurements
                    if (m.key.device, m.key.mode, m.key.dtype) == (d, key[4], key[3])
                }
                for d in pair
            }
            one_sided = sorted(sides[key[1]] ^ sides[key[2]])
            print(f"  withheld {named}; timed on one side only {one_sided}")
            print("  leads " + " ".join(f"{n}:{r:+.2f}" for n, r in curves.get(key, [])))
    print(f"{total} crossovers, {changed} derived otherwise")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a git revision whose crossover.py to compare the working tree's with")
    parser.add_argument("--more", nargs="*", type=Path, default=[], help="more folders of recorded sweeps")
    args = parser.parse_args()
    sweeps = list(recorded([REPO / "benchmarks" / "results", *args.more]))
    print(f"{len(sweeps)} recorded sweeps")
    flips(sweeps)
    if args.against:
        changes(sweeps, previous(args.against))


if __name__ == "__main__":
    main()
