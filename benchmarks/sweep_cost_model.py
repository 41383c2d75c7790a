"""Where a sweep's CPU time goes, from recorded sweeps (issue 54's cost model, no GPU needed).

A recorded sweep (`once --json`, or `gpu_proof.py`'s JSON lines) keeps each point's timed blocks: its calls are
``blocks x calls_per_block`` and its timed wall time is that times its median. A CPU point keeps the framework's
pool busy (``cpu_threads`` cores), a GPU point the one thread that launches and waits (one core). Each point is put
in one of four parts: the fixed-cost point (n = 1), the sizes that bracket the sweep's n* and the refinement's,
the largest size, and the rest (sizes far from n*); the sum is set against the worker's CPU time where the sweep
recorded it (the remainder: the framework's start, warm-up calls, calibration, the guard's readings, retries).

    python benchmarks/sweep_cost_model.py benchmarks/results/gpu-proof-*.jsonl ../shared/data/h200-2026-12-01/*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

PARTS = ("fixed cost (n = 1)", "around n*", "largest size", "far from n*")


def _sweeps(path: Path) -> list[dict[str, Any]]:
    """The snapshots a file holds: one `once --json`, or one per JSON line that holds one."""
    text = path.read_text(encoding="utf-8")
    records = (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else [json.loads(text)]
    )
    found = []
    for record in records:
        once = record.get("once", record)
        snapshot = once.get("snapshot") if isinstance(once, dict) else None
        if snapshot and snapshot.get("measurements"):
            found.append(snapshot)
    return found


def _part(m: dict[str, Any], near: dict[str, set[int]], largest: int) -> str:
    key = m["key"]
    if key["size"] == 1:
        return PARTS[0]
    if m.get("role") == "refine" or key["size"] in near.get(key["mode"], set()):
        return PARTS[1]
    if key["size"] == largest:
        return PARTS[2]
    return PARTS[3]


def cost(snapshot: dict[str, Any]) -> dict[str, Any]:
    """CPU-seconds of the timed blocks by part and device kind, and the worker's own figure where recorded."""
    kinds = {d["device"]: d["kind"] for d in snapshot["devices"]}
    threads = {d["device"]: int(dict(d.get("details", [])).get("threads", "1") or 1) for d in snapshot["devices"]}
    configured = sorted({m["key"]["size"] for m in snapshot["measurements"] if m.get("role") != "refine"})
    near: dict[str, set[int]] = defaultdict(set)
    for c in snapshot.get("crossovers", []):
        if c.get("size"):
            below = [n for n in configured if n <= c["size"]][-1:]
            above = [n for n in configured if n > c["size"]][:1]
            near[c["mode"]].update(below + above)
    parts: dict[str, float] = defaultdict(float)
    for m in snapshot["measurements"]:
        t = m["timing"]
        wall = t["blocks"] * t["calls_per_block"] * t["median_s"]
        device = m["key"]["device"]
        cores = threads[device] if kinds[device] == "cpu" else 1
        parts[f"{kinds[device]} {_part(m, near, configured[-1])}"] += wall * cores
    environment = dict(snapshot.get("environment", []))
    reported = environment.get("worker_cpu_s")
    return {"parts": dict(parts), "timed": sum(parts.values()), "worker_cpu_s": float(reported) if reported else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [(path.name, cost(s)) for path in args.files for s in _sweeps(path)]
    keys = sorted({k for _, row in rows for k in row["parts"]})
    print(f"{len(rows)} sweeps; CPU-seconds of the timed blocks (median over the sweeps, and its share)")
    timed = statistics.median(row["timed"] for _, row in rows)
    for key in keys:
        value = statistics.median(row["parts"].get(key, 0.0) for _, row in rows)
        print(f"  {key:28s} {value:7.1f}  {value / timed:5.0%}")
    print(f"  {'all timed blocks':28s} {timed:7.1f}")
    reported = [row for _, row in rows if row["worker_cpu_s"]]
    if reported:
        share = statistics.median(row["timed"] / row["worker_cpu_s"] for row in reported)
        worker = statistics.median(row["worker_cpu_s"] for row in reported)
        print(
            f"  worker CPU-s (median of {len(reported)} that recorded it) {worker:.1f}; timed blocks {share:.0%} of it"
        )


if __name__ == "__main__":
    main()
