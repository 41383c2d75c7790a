"""Pure: which points of the served curve a sweep need not time again (it carries them, each with its own time).

A sweep every 15 minutes that times the whole curve spends most of the node's CPU time where the answer cannot
have moved: the CPU's large sizes, far past a clear GPU lead, and the small ones far below n*. Between whole
curves a sweep therefore times, for each (backend, dtype, mode):

- every configured size from the one at or below the served crossovers' lowest interval end to the one at or
  above their highest (and the refinement's sizes between, as every sweep does): these move n*;
- n = 1 on every device (the fixed cost, and the GPU's host share) and every GPU at the largest size (the
  throughput alert's point): cheap, and read every sweep;

and carries the rest from the served snapshot. A group is timed whole when any of its pairs has no crossover
found (ambiguous, withheld, one device always faster: the far sizes are what say so), when a device lacks a
configured point, and whenever a point would be older than ``benchmark.full_curve_every`` by the next sweep. The
worker times a group's carried points after all where the crossovers it finds lean on them (``runner``), and
drops them all where it times with something else than they were timed with (``carried_timed_as``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import CrossoverState, Measurement, Snapshot

_Group = tuple[str, str, str]  # backend, dtype, mode


def carried_points(
    bench: BenchmarkSettings,
    served: Snapshot | None,
    *,
    now: float,
    until_next_s: float | None,
    settings_since: float | None = None,
) -> tuple[Measurement, ...]:
    """The served points a sweep starting ``now`` may carry (each with ``timed_at``), the next sweep due
    ``until_next_s`` later (None: not known, taken as now). ``settings_since``: when the configuration the sweep
    runs with was loaded; a point of a sweep planned before it is timed again.

    Only the devices the latest sweep measured: a device it withheld serves an older sweep's curve, timed with
    what that sweep's worker ran (a driver since upgraded, say), which the worker cannot check against its own."""
    if bench.full_curve_every_s <= 0 or served is None:
        return ()
    measured_now = {device for device, at in served.measured_at if at == served.finished_at}
    gpus = {d.device for d in served.devices if d.kind == "gpu"}
    by_next = now + (until_next_s or 0.0)
    carried: list[Measurement] = []
    for group, points in _groups(served.measurements).items():
        fresh = _sizes_to_time(bench, served, group, points)
        if fresh is None:
            continue
        for point in points:
            # A point the latest sweep timed was planned as it started (a reload may land mid-sweep).
            planned_at = point.timed_at if point.timed_at is not None else served.started_at
            timed_at = point.timed_at if point.timed_at is not None else served.finished_at
            if point.key.device not in measured_now or (settings_since is not None and planned_at < settings_since):
                continue
            if by_next - timed_at > bench.full_curve_every_s or _always_timed(point, bench, fresh, gpus):
                continue
            carried.append(replace(point, timed_at=timed_at))
    return tuple(carried)


def _groups(measurements: Sequence[Measurement]) -> dict[_Group, list[Measurement]]:
    groups: dict[_Group, list[Measurement]] = {}
    for m in measurements:
        if m.role == "sweep":
            groups.setdefault((m.key.backend, m.key.dtype, m.key.mode), []).append(m)
    return groups


def _sizes_to_time(
    bench: BenchmarkSettings, served: Snapshot, group: _Group, points: Sequence[Measurement]
) -> set[int] | None:
    """The configured sizes a sweep times in ``group`` (whose served points are ``points``) this time; None: all of
    them (nothing may be carried)."""
    pairs = [c for c in served.crossovers if (c.backend, c.dtype, c.mode) == group]
    if not pairs or any(c.state is not CrossoverState.FOUND or c.size is None for c in pairs):
        return None
    devices = {c.cpu for c in pairs} | {c.gpu for c in pairs}
    timed = {(m.key.device, m.key.size) for m in points}
    if any((d, n) not in timed for d in devices for n in bench.sizes):
        return None
    reaches = [r for c in pairs if (r := c.reach) is not None]
    low, high = min(r[0] for r in reaches), max(r[1] for r in reaches)
    sizes = sorted(bench.sizes)
    below = max((n for n in sizes if n <= low), default=sizes[0])
    above = min((n for n in sizes if n >= high), default=sizes[-1])
    return {n for n in sizes if below <= n <= above} | {1}


def _always_timed(point: Measurement, bench: BenchmarkSettings, fresh: set[int], gpus: set[str]) -> bool:
    """Sizes around n*, n = 1, and a GPU's largest size (what the throughput alert reads) are timed every sweep."""
    return point.key.size in fresh or (point.key.size == max(bench.sizes) and point.key.device in gpus)
