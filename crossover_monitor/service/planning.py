"""Pure: the plan a sweep's worker is handed, from the configuration and what the store kept of recent sweeps."""

from __future__ import annotations

from crossover_monitor.analysis.focus import carried_points
from crossover_monitor.config.settings import BenchmarkSettings, GuardSettings
from crossover_monitor.model import ServiceState, timed_with
from crossover_monitor.protocol import Plan


def plan_sweep(
    bench: BenchmarkSettings,
    guard: GuardSettings,
    kept: ServiceState,
    *,
    given_up: tuple[str, ...] = (),
    retry: bool = False,
    now: float,
    until_next_s: float | None,
) -> Plan:
    """What a worker times ``bench`` with: ``guard``, and what the store ``kept`` of recent sweeps (the host
    reference's figure, the points' ranges, the served curve a sweep between whole curves carries from; a retry
    times its busy devices whole). The next sweep is due ``until_next_s`` after ``now`` (None: not known)."""
    latest = kept.latest
    carried = (
        ()
        if retry
        else carried_points(bench, latest, now=now, until_next_s=until_next_s, settings_since=kept.config_loaded_at)
    )
    return Plan(
        bench=bench,
        guard=guard,
        given_up=given_up,
        retry=retry,
        host_baseline=kept.host_baseline,
        range_tops=kept.range_tops,
        range_tops_timed_as=kept.point_medians_timed_as,
        usual_others=kept.usual_others,
        carried=carried,
        carried_timed_as=timed_with(dict(latest.environment)) if latest is not None else "",
        refine_around=() if retry or latest is None else tuple(c for c in latest.crossovers if c.size is not None),
    )
