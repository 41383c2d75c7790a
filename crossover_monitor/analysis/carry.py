"""Pure: what to serve, from what was served and a sweep's (or a retry's) new snapshot (``served``).

A device withheld as busy keeps its last good timings, costs, hardware context and crossovers,
each with the time it was measured, instead of losing its series or showing disturbed figures.
A retry that times only the busy GPUs (and the CPU to compare them with) is laid over the served
snapshot the same way. What the configuration no longer asks for is not served (``trimmed``).
"""

from __future__ import annotations

from dataclasses import replace

from crossover_monitor.analysis.crossover import with_recent_moves
from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import CrossoverState, RecentCrossovers, Snapshot, canonical_device


def served(
    previous: Snapshot | None,
    new: Snapshot,
    *,
    recent: tuple[RecentCrossovers, ...],
    partial: bool = False,
) -> tuple[Snapshot, tuple[RecentCrossovers, ...]]:
    """What to serve after ``new`` (a sweep's snapshot, already ``trimmed``; a retry's when ``partial``), and
    the recent n* to keep.

    ``new`` takes over from ``previous`` what it did not measure (``merge``), and its fresh crossovers'
    intervals are widened by their moves over the ``recent`` sweeps.
    """
    merged = merge(previous, new, partial=partial)
    crossovers, moves = with_recent_moves(merged.crossovers, recent, fresh_at=new.finished_at)
    return replace(merged, crossovers=crossovers), moves


def merge(previous: Snapshot | None, new: Snapshot, *, partial: bool = False) -> Snapshot:
    """``new`` with what it did not measure carried over from ``previous`` (the snapshot served until now).

    A full sweep carries over only its withheld devices; a partial one (a retry of busy GPUs) carries
    over every device it did not time. A device that failed in ``new`` is never carried: its series go.
    """
    measured_at = dict.fromkeys(new.measured_devices, new.finished_at)
    if previous is None:
        return replace(new, measured_at=tuple(sorted(measured_at.items())))
    failed = new.failed_devices
    known = {d.device for d in previous.devices} if partial else new.withheld_devices
    carried = known - new.measured_devices - failed
    previous_at = dict(previous.measured_at)
    measured_at.update({d: previous_at[d] for d in carried if d in previous_at})

    previous_crossovers = {c.key: c for c in previous.crossovers}
    crossovers = {
        c.key: previous_crossovers.get(c.key, c) if c.state is CrossoverState.WITHHELD else c for c in new.crossovers
    }
    if partial:
        crossovers = {
            **previous_crossovers,
            **{k: c for k, c in crossovers.items() if c.state is not CrossoverState.WITHHELD},
        }
        crossovers = {k: c for k, c in crossovers.items() if c.gpu not in failed and c.cpu not in failed}
    withheld = new.withheld
    if partial:
        settled = new.measured_devices | failed | new.withheld_devices
        withheld = tuple(w for w in previous.withheld if w.device not in settled) + new.withheld
    return replace(
        previous if partial else new,
        measurements=new.measurements + tuple(m for m in previous.measurements if m.key.device in carried),
        costs=new.costs + tuple(c for c in previous.costs if c.device in carried),
        hardware=new.hardware + tuple(h for h in previous.hardware if h.device in carried),
        crossovers=tuple(crossovers.values()),
        failures=new.failures + (tuple(f for f in previous.failures if f.device in carried) if partial else ()),
        withheld=withheld,
        measured_at=tuple(sorted(measured_at.items())),
    )


def trimmed(snapshot: Snapshot, wanted: BenchmarkSettings) -> Snapshot:
    """The snapshot without what the loaded configuration's benchmark no longer asks for: those series disappear.

    Sizes no longer configured lose their duration series, modes and dtypes no longer configured every
    series of theirs (timings, crossovers, costs); with devices listed, unlisted devices lose all of
    theirs. The rest is served as it was measured until the next sweep replaces it.
    """
    devices = None if wanted.devices is None else {canonical_device(d) for d in wanted.devices}

    def kept(device: str) -> bool:
        return devices is None or canonical_device(device) in devices or device == "none"

    def asked(mode: str, dtype: str) -> bool:
        return mode in wanted.modes and dtype in wanted.dtypes

    return replace(
        snapshot,
        measurements=tuple(
            m
            for m in snapshot.measurements
            if kept(m.key.device)
            and asked(m.key.mode, m.key.dtype)
            and (m.role != "sweep" or m.key.size in wanted.sizes)
        ),
        crossovers=tuple(c for c in snapshot.crossovers if kept(c.gpu) and kept(c.cpu) and asked(c.mode, c.dtype)),
        costs=tuple(c for c in snapshot.costs if kept(c.device) and asked(c.mode, c.dtype)),
        hardware=tuple(h for h in snapshot.hardware if kept(h.device)),
        withheld=tuple(
            w for w in snapshot.withheld if kept(w.device) and (w.point is None or asked(w.point.mode, w.point.dtype))
        ),
        devices=tuple(d for d in snapshot.devices if kept(d.device)),
    )
