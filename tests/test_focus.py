"""Between whole curves a sweep times what can move n* and carries the rest with its own time (issue 54).

The real runner, sweep and carry on the known curves (CPU 2 GFLOP/s, GPU 100 µs launch: compute n* ≈ 46) on a
virtual clock, in process; the planning is the daemon's (``analysis.focus``)."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import Counter

from crossover_monitor.analysis.carry import served
from crossover_monitor.analysis.focus import carried_points
from crossover_monitor.config.settings import RefineSettings, Settings
from crossover_monitor.errors import MeasurementFailed
from crossover_monitor.http import page
from crossover_monitor.measure.contract import BackendOptions, RunBlock
from crossover_monitor.measure.runner import run_plan
from crossover_monitor.metrics import render_state
from crossover_monitor.model import (
    CrossoverState,
    DeviceInfo,
    Mode,
    RecentCrossovers,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
    timed_with,
)
from crossover_monitor.protocol import Done, Message, Plan
from crossover_monitor.service.state import StateStore
from crossover_monitor.service.sweep import END_OF_STREAM, EndOfStream, run_sweep
from crossover_monitor.text import utc_text
from crossover_monitor.view.report import render_table
from tests.builders import crossover as served_crossover
from tests.conftest import make_plan, with_bench
from tests.fakes import VirtualClock, VirtualCurveBackend, cpu_seconds, gpu_seconds

SIZES = (1, 8, 16, 32, 64, 128, 256)
HOUR = 3600.0


class _Backend(VirtualCurveBackend):
    """The known curves; ``launch`` times the GPU's fixed cost (a slower driver moves n* up); counts what it timed."""

    def __init__(
        self,
        clock: VirtualClock,
        launch: float,
        prepared: Counter[tuple[str, int, str]],
        failing: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        super().__init__(BackendOptions(tf32=False, cpu_threads=1), clock=clock)
        self._launch, self._prepared, self._failing = launch, prepared, failing

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        self._prepared[device.device, size, mode] += 1
        if (device.device, size) in self._failing:
            raise MeasurementFailed(device.device, f"n={size}", "out of memory")
        gpu = gpu_seconds(size, mode) + (self._launch - 1) * (gpu_seconds(1, mode) - 2 / 2e11)
        seconds = cpu_seconds(size) if device.kind == "cpu" else gpu

        def run(calls: int) -> None:
            self._clock.now += seconds * calls

        return run


class _InProcess:
    """A worker that ran the plan in this process: its messages, handed out as a subprocess's would be."""

    def __init__(self, messages: list[Message]) -> None:
        self._messages = messages

    def next_message(self, timeout: float) -> Message | EndOfStream | None:
        return self._messages.pop(0) if self._messages else END_OF_STREAM

    def stop(self) -> int | None:
        return 0

    def exit_status(self, timeout: float) -> int | None:
        return 0

    def diagnostics(self) -> str:
        return ""


def _sweep(
    plan: Plan,
    *,
    at: float,
    launch: float = 1.0,
    environment: dict[str, str] | None = None,
    failing: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[Snapshot, Counter[tuple[str, int, str]]]:
    """One sweep of ``plan`` ending at unix time ``at``: its snapshot and how often each point was prepared;
    ``failing``: the (device, size) points that fail to be timed."""
    prepared: Counter[tuple[str, int, str]] = Counter()
    messages: list[Message] = []
    clock = VirtualClock()
    backend = _Backend(clock, launch, prepared, failing)
    if environment is not None:
        backend.environment = lambda: environment  # type: ignore[method-assign]
    run_plan(plan, backend, messages.append, clock)
    messages.append(Done())  # as the worker's main says once the plan ran
    outcome = run_sweep(
        plan, timeout_s=60, cancel=threading.Event(), launch=lambda _: _InProcess(messages), clock=lambda: at
    )
    assert outcome.snapshot is not None, outcome.reason
    return outcome.snapshot, prepared


def _served_after(snapshots: list[Snapshot]) -> Snapshot:
    latest: Snapshot | None = None
    recent: tuple[RecentCrossovers, ...] = ()
    for snapshot in snapshots:
        latest, recent = served(latest, snapshot, recent=recent)
    assert latest is not None
    return latest


def _plan() -> Plan:
    return make_plan("tests.fakes:curve", sizes=SIZES, modes=("compute",))


def _next_plan(plan: Plan, latest: Snapshot, *, now: float, until_next_s: float = 900.0) -> Plan:
    carried = carried_points(plan.bench, latest, now=now, until_next_s=until_next_s)
    return dataclasses.replace(plan, carried=carried, carried_timed_as=timed_with(dict(latest.environment)))


def test_between_whole_curves_a_sweep_times_the_sizes_around_n_star_and_carries_the_rest() -> None:
    """n* ≈ 46 lies between 32 and 64: those, n = 1 and the GPU's 256 are timed; the rest is served as the whole
    curve timed it, with that sweep's time, and n* is derived again from the fresh bracket."""
    plan = _plan()
    first, _ = _sweep(plan, at=1000.0)
    latest = _served_after([first])
    following = _next_plan(plan, latest, now=1900.0)
    carried = {(m.key.device, m.key.size) for m in following.carried}
    assert carried == {("/CPU:0", n) for n in (8, 16, 128, 256)} | {("/GPU:0", n) for n in (8, 16, 128)}
    assert {m.timed_at for m in following.carried} == {1000.0}

    second, prepared = _sweep(following, at=1900.0)
    assert {(d, n) for d, n, _ in prepared} == {(d, n) for d in ("/CPU:0", "/GPU:0") for n in (1, 32, 64)} | {
        ("/GPU:0", 256)
    }
    by_key = {(m.key.device, m.key.size): m for m in second.measurements if m.role == "sweep"}
    assert {k for k, m in by_key.items() if m.carried} == carried
    first_points = {(m.key.device, m.key.size): m for m in first.measurements}
    assert all(by_key[k].timing == first_points[k].timing for k in carried)  # as timed, not again
    (crossover,) = second.crossovers
    assert crossover.state is CrossoverState.FOUND
    assert crossover.size is not None
    assert 32 < crossover.size < 64
    assert crossover.derived_at == 1900.0  # a crossover of this sweep's own


def test_every_point_is_timed_again_before_it_is_older_than_full_curve_every() -> None:
    """A point that would be older than full_curve_every at the next sweep is timed now; one that would not is
    carried (at a 15-minute schedule and 1 h: whole curves every hour)."""
    plan = _plan()
    latest = _served_after([_sweep(plan, at=0.0)[0]])
    assert carried_points(plan.bench, latest, now=HOUR - 900, until_next_s=900)  # due again exactly at the hour
    assert carried_points(plan.bench, latest, now=HOUR - 899, until_next_s=900) == ()
    assert carried_points(plan.bench, latest, now=HOUR + 1, until_next_s=None) == ()  # no schedule: its age now
    assert carried_points(dataclasses.replace(plan.bench, full_curve_every_s=0), latest, now=1, until_next_s=900) == ()


def test_a_point_timed_before_the_configuration_was_loaded_is_timed_again() -> None:
    plan = _plan()
    latest = _served_after([_sweep(plan, at=100.0)[0]])
    assert carried_points(plan.bench, latest, now=200, until_next_s=900, settings_since=99.0)
    assert carried_points(plan.bench, latest, now=200, until_next_s=900, settings_since=101.0) == ()


def test_a_curve_without_a_crossover_found_is_timed_whole() -> None:
    """Where the GPU never wins (or always does), the far sizes are what say so: nothing is carried."""
    plan = _plan()
    snapshot, _ = _sweep(plan, at=0.0)
    for state in (CrossoverState.GPU_NEVER_FASTER, CrossoverState.AMBIGUOUS, CrossoverState.WITHHELD):
        changed = dataclasses.replace(
            snapshot, crossovers=tuple(dataclasses.replace(c, state=state) for c in snapshot.crossovers)
        )
        assert carried_points(plan.bench, _served_after([changed]), now=900, until_next_s=900) == ()


def test_a_crossover_that_moves_onto_a_carried_size_has_its_curve_timed_whole() -> None:
    """The GPU's launch four times slower moves n* from ≈46 to ≈74, past the 64 timed around it: the worker
    times the carried points too, and n* is found between 64 and 128 from this sweep's points alone."""
    plan = _plan()
    latest = _served_after([_sweep(plan, at=0.0)[0]])
    following = _next_plan(plan, latest, now=900)
    assert following.carried
    moved, prepared = _sweep(following, at=900.0, launch=4.0)
    assert not any(m.carried for m in moved.measurements)
    assert {(d, n) for d, n, _ in prepared} >= {("/CPU:0", 128), ("/CPU:0", 8), ("/GPU:0", 128)}
    (crossover,) = moved.crossovers
    assert crossover.state is CrossoverState.FOUND
    assert crossover.size is not None
    truth = next(n for n in range(1, 256) if cpu_seconds(n) > gpu_seconds(n, "compute") + 3 * (1e-4 - 1e-11))
    assert 64 < crossover.size < 128
    assert math.isclose(crossover.size, truth, rel_tol=0.1)


def test_a_worker_that_times_with_another_framework_times_every_point() -> None:
    """Carried points were timed with framework_version 1.0; a worker on 1.1 serves none of them."""
    plan = _plan()
    latest = _served_after([_sweep(plan, at=0.0)[0]])
    following = _next_plan(plan, latest, now=900)
    assert following.carried
    upgraded = {"framework": "fake", "framework_version": "1.1", "tf32": "false"}
    second, prepared = _sweep(following, at=900.0, environment=upgraded)
    assert not any(m.carried for m in second.measurements)
    assert ("/CPU:0", 256, "compute") in prepared


def test_a_carried_point_says_when_it_was_timed_and_joins_no_idle_range() -> None:
    """/metrics serves a carried point's own time (the fresh ones their sweep's end); the store's calm ranges
    take only what a sweep timed itself."""
    plan = _plan()
    first, _ = _sweep(plan, at=1000.0)
    second, _ = _sweep(_next_plan(plan, _served_after([first]), now=1900.0), at=1900.0)
    latest = _served_after([first, second])
    text = render_state(ServiceState(latest=latest), "", backend="fake")[0].decode()
    stamp = 'matmul_duration_timestamp_seconds{backend="fake",device="/CPU:0",dtype="float32",mode="compute",size="%d"}'
    assert f"{stamp % 128} 1000.0" in text
    assert f"{stamp % 32} 1900.0" in text

    store = StateStore()
    metered = [
        dataclasses.replace(s, measurements=tuple(dataclasses.replace(m, others_cores=0.0) for m in s.measurements))
        for s in (first, second)
    ]
    for snapshot in metered:
        store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=0, finished_at=1, snapshot=snapshot))
    medians = {(k.key.device, k.key.size): len(k.medians_s) for k in store.read().point_medians}
    assert medians[("/CPU:0", 32)] == 2
    assert medians[("/CPU:0", 128)] == 1  # timed once, carried once


def _refined(plan: Plan, launch: float = 1.0) -> tuple[dict[int, int], Snapshot]:
    """Each size's visits on the CPU in one sweep of ``plan``, and its snapshot."""
    snapshot, _ = _sweep(plan, at=0.0, launch=launch)
    visits = {m.key.size: m.timing.visit_count for m in snapshot.measurements if m.key.device == "/CPU:0"}
    return visits, snapshot


def test_the_refinement_visits_where_n_star_was_first_and_widens_where_it_is_no_longer() -> None:
    """With the served n* ≈ 46 (found between 45 and 54, its interval 42-50), the visits go to the sizes within a
    refinement step of that, not to the whole 32-64 bracket; where the GPU's launch slowed and n* moved to ≈ 74,
    the next round finds it between 64 and 128 all the same."""
    plan = with_bench(_plan(), refine=RefineSettings(enabled=True, visits=3, spacing=0.2, budget_s=60))
    whole, _ = _refined(plan)
    assert {n for n, v in whole.items() if v == 3} == {32, 38, 45, 54, 64}
    served = [served_crossover(size=46.0, lower=45, upper=54, ci_lower=42.0, ci_upper=50.0)]
    timed_as = timed_with(
        VirtualCurveBackend(BackendOptions(tf32=False, cpu_threads=1), clock=VirtualClock()).environment()
    )
    around = dataclasses.replace(plan, refine_around=tuple(served), carried_timed_as=timed_as)
    focused, snapshot = _refined(around)
    assert {n for n, v in focused.items() if v == 3} == {38, 45, 54, 64}  # within 20% of 42-54
    (crossover,) = snapshot.crossovers
    assert crossover.size is not None
    assert 45 < crossover.size < 54

    moved_visits, moved = _refined(around, launch=4.0)
    assert {72, 80} <= {n for n, v in moved_visits.items() if v == 3}
    (crossover,) = moved.crossovers
    assert crossover.state is CrossoverState.FOUND
    assert crossover.size is not None
    assert 64 < crossover.size < 96


def test_the_page_and_once_say_what_the_sweep_did_not_time_and_when_it_was() -> None:
    """The carried points are named, with their time and why, in ``once``'s table and on the page."""
    plan = _plan()
    first, _ = _sweep(plan, at=1000.0)
    second, _ = _sweep(_next_plan(plan, _served_after([first]), now=1900.0), at=1900.0)
    outcome = SweepOutcome(result=SweepResult.SUCCESS, started_at=1800, finished_at=1900, snapshot=second)
    table = render_table(outcome)
    carried = [line for line in table.splitlines() if line.startswith("carried: ")]
    assert [line.split(" n=")[1].split(":")[0] for line in carried] == ["8, 16, 128, 256", "8, 16, 128"]
    assert all(utc_text(1000.0) in line and "full_curve_every" in line for line in carried)
    assert f"(carried: timed {utc_text(1000.0)})" in table
    shown = page.render(
        Settings(), ServiceState(latest=second), [], picture=page.PictureState.DRAWN, now=1900.0, version="x"
    )
    assert shown.count("class='carried'") == 2
    assert "/CPU:0 float32 compute n=8, 16, 128, 256: not timed in this sweep" in shown


def test_a_carried_point_timed_again_after_all_is_never_served_stale_even_where_that_fails() -> None:
    """n* moved onto the carried CPU n = 128, whose timing again fails (out of memory): its failure is said and
    the earlier value is not served beside it, so no crossover rests on it."""
    plan = _plan()
    latest = _served_after([_sweep(plan, at=0.0)[0]])
    moved, _ = _sweep(_next_plan(plan, latest, now=900), at=900.0, launch=4.0, failing=frozenset({("/CPU:0", 128)}))
    assert ("/CPU:0", 128) not in {(m.key.device, m.key.size) for m in moved.measurements}
    assert any(f.point is not None and f.point.size == 128 for f in moved.failures)
    assert all(c.upper != 128 for c in moved.crossovers)


def test_only_what_the_latest_sweep_measured_and_planned_after_the_last_reload_is_carried() -> None:
    """A device the latest sweep withheld serves an older curve (timed with what that worker ran): none of its
    points is carried. A reload that landed while the latest sweep ran (planned before it) carries nothing."""
    plan = _plan()
    snapshot = dataclasses.replace(_sweep(plan, at=1000.0)[0], started_at=900.0)
    latest = _served_after([snapshot])
    gpu_older = dataclasses.replace(latest, measured_at=(("/CPU:0", 1000.0), ("/GPU:0", 400.0)))
    carried = carried_points(plan.bench, gpu_older, now=1100, until_next_s=900)
    assert carried
    assert {m.key.device for m in carried} == {"/CPU:0"}
    assert carried_points(plan.bench, latest, now=1100, until_next_s=900, settings_since=950.0) == ()
