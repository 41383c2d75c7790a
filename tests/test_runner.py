"""The worker's runner: the fixed-cost point, refinement in visits, CPU skipping and retries, on a known curve."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import statistics
import time

from crossover_monitor.analysis.costs import cost_models
from crossover_monitor.analysis.crossover import SpeedupPoint, crossovers, last_crossing, speedup_point
from crossover_monitor.config.settings import RefineSettings
from crossover_monitor.errors import MeasurementFailed
from crossover_monitor.measure.contract import BackendOptions, RunBlock
from crossover_monitor.measure.guard.hostinfo import affinity_text
from crossover_monitor.measure.runner import between, run_plan
from crossover_monitor.model import (
    CPU_AFFINITY,
    DRIVER_VERSION,
    Crossover,
    CrossoverState,
    DeviceFailure,
    DeviceInfo,
    Measurement,
    Mode,
    Role,
)
from crossover_monitor.protocol import Environment, Message, Plan
from tests.builders import measurement
from tests.conftest import make_plan, with_bench
from tests.fakes import CurveBackend, VirtualClock, VirtualCurveBackend, VisitNoiseBackend
from tests.guardfakes import IDLE, JOB, FakeSampler, fake_guard, run_guarded, timed_on, withheld_in


def _run(plan: Plan, *, real_clock: bool = False) -> tuple[list[DeviceInfo], list[Measurement]]:
    """The plan on the known curves and a virtual clock: a busy machine cannot move a point (issue 36).
    ``real_clock``: the curves spun for real, for what only passing time shows (a budget spent)."""
    messages: list[Message] = []
    options = BackendOptions(tf32=False, cpu_threads=1)
    if real_clock:
        run_plan(plan, CurveBackend(options), messages.append, time.perf_counter)
    else:
        clock = VirtualClock()
        run_plan(plan, VirtualCurveBackend(options, clock=clock), messages.append, clock)
    devices = [m for m in messages if isinstance(m, DeviceInfo)]
    return devices, [m for m in messages if isinstance(m, Measurement)]


def test_n1_is_timed_for_the_fixed_cost_when_not_configured() -> None:
    """Without 1 in the sizes, each device is still timed at n=1, and the cost model uses it."""
    _, measurements = _run(make_plan("tests.fakes:curve", modes=("compute",)))
    fixed_cost_points = [m for m in measurements if m.role == "fixed_cost"]
    assert {(m.key.device, m.key.size) for m in fixed_cost_points} == {("/CPU:0", 1), ("/GPU:0", 1)}
    costs = {c.device: c for c in cost_models(measurements)}
    assert costs["/GPU:0"].fixed_s > costs["/CPU:0"].fixed_s  # the fake GPU's 100 µs launch cost
    assert costs["/GPU:0"].peak_flops is not None
    assert costs["/GPU:0"].largest_size == 128


def test_refinement_times_the_bracket_in_visits_with_sizes_added_between() -> None:
    """Around the true n ≈ 46, the bracket 32–64 gains sizes ≤ 20% apart, each timed in 5 visits on both devices.

    On a virtual clock: the bracket is the known curves', not what a busy machine made of them."""
    plan = with_bench(
        make_plan("tests.fakes:curve", modes=("compute",)),
        refine=RefineSettings(enabled=True, visits=5, spacing=0.2, budget_s=30),
    )
    clock = VirtualClock()
    messages: list[Message] = []
    run_plan(plan, VirtualCurveBackend(BackendOptions(tf32=False, cpu_threads=1), clock=clock), messages.append, clock)
    devices = [m for m in messages if isinstance(m, DeviceInfo)]
    measurements = [m for m in messages if isinstance(m, Measurement)]
    added = {m.key.size for m in measurements if m.role == "refine"}
    assert added == set(between(32, 64, 0.2))
    ladder = sorted({32, 64, *added})
    assert all(b / a - 1 <= 0.2 for a, b in itertools.pairwise(ladder))
    visited = {(m.key.device, m.key.size): m.timing.visit_count for m in measurements if m.key.size in ladder}
    assert visited == {(d, n): 5 for d in ("/CPU:0", "/GPU:0") for n in ladder}
    assert {m.key.size: m.timing.visit_count for m in measurements if m.key.size in (16, 128)} == {16: 1, 128: 1}
    (crossover,) = crossovers(devices, measurements)
    assert crossover.state is CrossoverState.FOUND
    assert crossover.lower is not None
    assert crossover.upper is not None
    assert crossover.upper / crossover.lower - 1 <= 0.2
    assert crossover.lower <= 46.3 <= crossover.upper


def test_sizes_between_are_aligned_where_they_can_be_and_never_repeat_the_ends() -> None:
    """between() adds multiples of 8 where one is in reach, no two neighbours more than the ratio asked apart
    (or one apart, at the smallest sizes), without the ends, and none where none fits."""
    assert between(64, 128, 0.2) == [72, 80, 96, 112]
    assert between(256, 512, 0.2) == [304, 360, 432]  # not 362, where TensorFlow's CPU stalls
    assert between(100, 110, 0.2) == []
    for lower, upper in ((1, 16), (16, 32), (64, 128), (128, 256), (500, 2000)):
        added = between(lower, upper, 0.2)
        assert added == sorted(set(added))
        sizes = [lower, *added, upper]
        assert all(b / a - 1 <= 0.2 + 1e-9 or b == a + 1 for a, b in itertools.pairwise(sizes))
    assert all(n % 8 == 0 for n in between(64, 2048, 0.2))


def test_refinement_stops_when_its_budget_is_spent() -> None:
    """A budget that is spent before the first visit adds no sizes and times nothing twice."""
    plan = with_bench(
        make_plan("tests.fakes:curve", modes=("compute",)),
        refine=RefineSettings(enabled=True, visits=5, spacing=0.01, budget_s=1e-6),
    )
    _, measurements = _run(plan, real_clock=True)  # on a virtual clock no time passes before the first visit
    assert {m.key.size for m in measurements if m.role == "refine"} == set()
    assert {m.timing.visit_count for m in measurements} == {1}


def _noisy_sweep(seed: int, *, refine: bool) -> Crossover:
    """One sweep of the visit-noise backend (levels ±10% a visit) around its true n ≈ 79.4."""
    crossover, _ = _noisy_sweep_and_points(seed, refine=refine, process_spread=0.0)
    return crossover


def _noisy_sweep_and_points(seed: int, *, refine: bool, process_spread: float) -> tuple[Crossover, list[SpeedupPoint]]:
    """The sweep's crossover, and its speed-up points as ``crossovers`` paired them."""
    clock = VirtualClock()
    backend = VisitNoiseBackend(
        BackendOptions(tf32=False, cpu_threads=1), clock=clock, seed=seed, spread=0.1, process_spread=process_spread
    )
    plan = with_bench(
        make_plan("tests.fakes:curve", sizes=(16, 32, 64, 128, 256, 512), modes=("compute",)),
        refine=RefineSettings(enabled=refine, visits=7, spacing=0.2, budget_s=30),
    )
    messages: list[Message] = []
    run_plan(plan, backend, messages.append, clock)
    latest = {m.key: m for m in messages if isinstance(m, Measurement)}  # a later visit's message replaces
    devices = [m for m in messages if isinstance(m, DeviceInfo)]
    (crossover,) = crossovers(devices, latest.values())
    timings = {(m.key.device, m.key.size): m.timing for m in latest.values() if m.role != "fixed_cost"}
    points = [
        speedup_point(n, timing, timings["/GPU:0", n]) for (device, n), timing in timings.items() if device == "/CPU:0"
    ]
    return crossover, sorted(points, key=lambda p: p.size)


def test_a_line_through_the_sizes_around_n_star_averages_what_visits_cannot() -> None:
    """Each size at its own level for a worker's life (±8%): n* fitted through the refined sizes scatters
    less over 30 sweeps than the bracket's interpolation of the same visits."""
    fitted, interpolated = [], []
    for seed in range(30):
        crossover, points = _noisy_sweep_and_points(seed, refine=True, process_spread=0.08)
        bracket = last_crossing([(p.size, p.median) for p in points])[1]
        assert crossover.size is not None
        assert bracket is not None
        fitted.append(math.log(crossover.size))
        interpolated.append(math.log(bracket))
    assert statistics.stdev(fitted) < 0.8 * statistics.stdev(interpolated)


def test_visits_make_the_crossover_steady_where_one_visit_scatters() -> None:
    """Over 30 sweeps, n* from visits scatters far less than from one visit a size, and its interval holds n*."""
    true_n = (10e-6 / (2 / 1e11 - 2 / 5e13)) ** (1 / 3)
    single = [_noisy_sweep(seed, refine=False) for seed in range(30)]
    visited = [_noisy_sweep(seed, refine=True) for seed in range(30)]
    assert all(c.ci_lower is None for c in single)  # one visit a size cannot show how a point moves
    single_found = [math.log(c.size) for c in single if c.size is not None]
    visited_found = [math.log(c.size) for c in visited if c.size is not None]
    assert len(visited_found) == 30
    assert statistics.stdev(visited_found) < 0.8 * statistics.stdev(single_found)
    covered = [
        c for c in visited if c.ci_lower is not None and c.ci_upper is not None and c.ci_lower <= true_n <= c.ci_upper
    ]
    assert len(covered) >= 27


def test_cpu_is_skipped_far_past_the_crossover_when_allowed() -> None:
    """With skip_cpu_above_speedup=10, the CPU stops after two sizes where the GPU won by 10x or more."""
    plan = with_bench(
        make_plan("tests.fakes:curve", sizes=(16, 32, 64, 128, 256, 512), modes=("compute",)),
        skip_cpu_above_speedup=10.0,
    )
    _, measurements = _run(plan)
    cpu_sizes = {m.key.size for m in measurements if m.key.device == "/CPU:0" and m.role == "sweep"}
    gpu_sizes = {m.key.size for m in measurements if m.key.device == "/GPU:0" and m.role == "sweep"}
    assert gpu_sizes == {16, 32, 64, 128, 256, 512}
    assert cpu_sizes == {16, 32, 64, 128, 256}  # 128 (17x) and 256 (62x) were the two


def test_cpu_is_never_skipped_by_default() -> None:
    """Without the setting every configured size is timed on the CPU."""
    _, measurements = _run(make_plan("tests.fakes:curve", sizes=(16, 64, 256, 512), modes=("compute",)))
    assert {m.key.size for m in measurements if m.key.device == "/CPU:0" and m.role == "sweep"} == {16, 64, 256, 512}


def test_interval_comes_from_visits_and_contains_the_estimate() -> None:
    """With refinement the interval surrounds n*; without it (one visit a size) none is published."""
    refined = with_bench(
        make_plan("tests.fakes:curve", modes=("compute",)),
        refine=RefineSettings(enabled=True, visits=5, spacing=0.2, budget_s=30),
    )
    devices, measurements = _run(refined)
    (crossover,) = crossovers(devices, measurements)
    assert crossover.size is not None
    assert crossover.ci_lower is not None
    assert crossover.ci_upper is not None
    assert crossover.ci_lower <= crossover.size <= crossover.ci_upper
    devices, measurements = _run(make_plan("tests.fakes:curve", modes=("compute",)))
    (single,) = crossovers(devices, measurements)
    assert single.state is CrossoverState.FOUND
    assert (single.ci_lower, single.ci_upper) == (None, None)


class InstantBackend(CurveBackend):
    """Blocks that take no time at all: with a clock that never moves, every median is zero."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        return lambda _calls: None


def test_impossible_medians_are_failures_not_numbers() -> None:
    """A zero median (a broken clock or backend) is reported as a failed point, never exported."""
    messages: list[Message] = []
    backend = InstantBackend(BackendOptions(tf32=False, cpu_threads=1))
    run_plan(make_plan("tests.fakes:curve", sizes=(16,), modes=("compute",)), backend, messages.append, lambda: 0.0)
    assert not [m for m in messages if isinstance(m, Measurement)]
    failures = [m for m in messages if isinstance(m, DeviceFailure)]
    assert failures
    assert all("impossible median" in f.reason and f.point is not None for f in failures)


def test_the_fixed_cost_point_does_not_sway_the_crossover() -> None:
    """A GPU 'win' at the unasked-for n=1 point does not turn a clean crossing into 'ambiguous'."""

    def m(device: str, size: int, seconds: float, role: Role = "sweep") -> Measurement:
        return measurement(device, size, seconds, role=role)

    cpu, gpu = CurveBackend(BackendOptions(tf32=False, cpu_threads=1)).discover()
    measurements = [m("/CPU:0", 1, 2.0, "fixed_cost"), m("/GPU:0", 1, 1.0, "fixed_cost")]
    measurements += [m("/CPU:0", 16, 1.0), m("/GPU:0", 16, 2.0), m("/CPU:0", 64, 4.0), m("/GPU:0", 64, 1.0)]
    (crossover,) = crossovers([cpu, gpu], measurements)
    assert crossover.state is CrossoverState.FOUND


def test_given_up_devices_are_reported_but_never_touched() -> None:
    """A device that failed fatally before is reported down again, and not one point is timed on it."""
    plan = dataclasses.replace(make_plan("tests.fakes:curve", sizes=(16,), modes=("compute",)), given_up=("/GPU:0",))
    messages: list[Message] = []
    run_plan(plan, CurveBackend(BackendOptions(tf32=False, cpu_threads=1)), messages.append, time.perf_counter)
    measured = {m.key.device for m in messages if isinstance(m, Measurement)}
    assert measured == {"/CPU:0"}
    (failure,) = [m for m in messages if isinstance(m, DeviceFailure)]
    assert failure.device == "/GPU:0"
    assert failure.fatal
    assert "not retried" in failure.reason


def test_cost_model_of_known_times() -> None:
    """fixed = t(1); peak = 2n³ / (t(n) - fixed) at the largest n."""

    def m(size: int, seconds: float) -> Measurement:
        return measurement("d", size, seconds, backend="b")

    (model,) = cost_models([m(1, 1e-4), m(1000, 1e-4 + 2e9 / 1e12)])
    assert model.fixed_s == 1e-4
    assert model.peak_flops is not None
    assert abs(model.peak_flops - 1e12) / 1e12 < 1e-9
    assert cost_models([m(1000, 1.0)]) == ()  # no n=1 point, no model


class FailsOnceBackend(VisitNoiseBackend):
    """The tie curves, whose GPU fails its third visit of every size it is visited at three times (an odd OOM)."""

    def __init__(self, options: BackendOptions, *, clock: VirtualClock) -> None:
        super().__init__(options, clock=clock, seed=1, spread=0.05)
        self.visits: dict[int, int] = {}

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu":
            self.visits[size] = self.visits.get(size, 0) + 1
            if self.visits[size] == 3:
                raise MeasurementFailed(device.device, f"n={size}", "out of memory (injected)")
        return super().prepare(device, size, dtype, mode)


def test_a_failed_visit_takes_its_round_back_so_visits_stay_paired() -> None:
    """A GPU visit that fails mid-refinement leaves CPU and GPU with as many visits at that size, never shifted."""
    clock = VirtualClock()
    backend = FailsOnceBackend(BackendOptions(tf32=False, cpu_threads=1), clock=clock)
    plan = with_bench(
        make_plan("tests.fakes:curve", sizes=(16, 32, 64, 128, 256, 512), modes=("compute",)),
        refine=RefineSettings(enabled=True, visits=5, spacing=0.2, budget_s=30),
    )
    messages: list[Message] = []
    run_plan(plan, backend, messages.append, clock)
    latest = {m.key: m for m in messages if isinstance(m, Measurement)}
    counts: dict[int, dict[str, int]] = {}
    for key, m in latest.items():
        counts.setdefault(key.size, {})[key.device] = m.timing.visit_count
    failed = {m.point.size for m in messages if isinstance(m, DeviceFailure) and m.point is not None}
    assert failed  # the injected failures happened
    for size in failed:
        assert counts[size]["/CPU:0"] == counts[size]["/GPU:0"] == 2, (size, counts[size])
    (crossover,) = crossovers([m for m in messages if isinstance(m, DeviceInfo)], latest.values())
    assert crossover.state is CrossoverState.FOUND


def _retry_plan(devices: tuple[str, ...] | None = None) -> Plan:
    """A retry of the known curves in compute mode, of ``devices`` (all found by default)."""
    return dataclasses.replace(make_plan("tests.fakes:curve", modes=("compute",), devices=devices), retry=True)


def test_a_retry_of_a_still_busy_gpu_times_nothing_at_all() -> None:
    """A retry looks at the GPUs first: all still busy, so not even the CPU is timed (no load on the node)."""
    busy = FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(JOB,)))
    backend, messages = run_guarded(fake_guard(busy), _retry_plan())
    assert withheld_in(messages)
    assert backend.blocks == {}


def test_a_retry_stops_as_soon_as_its_gpus_are_busy_again() -> None:
    """A retry whose GPU turns out busy after its first point times no further CPU point."""
    sampler = FakeSampler(lambda look: IDLE if look <= 2 else dataclasses.replace(IDLE, processes=(JOB,)))
    _, messages = run_guarded(fake_guard(sampler), _retry_plan())
    assert withheld_in(messages)
    assert len(timed_on(messages, "/CPU:0")) == 1  # the n=1 point before the GPU's; nothing after


def test_a_retry_does_not_give_up_on_a_gpu_that_vanished_for_a_moment() -> None:
    """A named device missing from a retry is a failure, but not a fatal one (a GPU reset heals)."""
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE)), _retry_plan(devices=("/CPU:0", "/GPU:7")))
    (failure,) = [m for m in messages if isinstance(m, DeviceFailure)]
    assert failure.device == "/GPU:7"
    assert not failure.fatal


def test_the_environment_names_the_cores_the_worker_may_use_and_the_gpu_driver() -> None:
    """What a drift alert names when it changes: the worker's cpuset as a list, and NVML's driver version; with
    no NVML there is no driver entry, not an empty or made-up one."""
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE)))
    environment = {k: v for m in messages if isinstance(m, Environment) for k, v in m.values.items()}
    assert environment[CPU_AFFINITY] == affinity_text(os.sched_getaffinity(0))
    assert environment[DRIVER_VERSION] == "580.159.04"
    _, without_nvml = run_guarded(fake_guard(None))
    assert not any(DRIVER_VERSION in m.values for m in without_nvml if isinstance(m, Environment))
