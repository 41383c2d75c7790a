"""The worker's runner: fixed-cost probe, crossover refinement and CPU skipping, on a known curve."""

from __future__ import annotations

import dataclasses
import time

from monitor.bench.contract import BackendOptions, RunBlock
from monitor.bench.runner import run_plan
from monitor.costs import cost_models
from monitor.crossover import crossovers
from monitor.model import (
    CrossoverState,
    DeviceFailure,
    DeviceInfo,
    Measurement,
    Mode,
    PointKey,
    Role,
    StopReason,
    Timing,
)
from monitor.protocol import Message, Plan
from monitor.settings import RefineSettings
from tests.conftest import make_plan
from tests.fakes import CurveBackend


def _run(plan: Plan) -> tuple[list[DeviceInfo], list[Measurement]]:
    messages: list[Message] = []
    run_plan(plan, CurveBackend(BackendOptions(tf32=False, cpu_threads=1)), messages.append, time.perf_counter)
    devices = [m for m in messages if isinstance(m, DeviceInfo)]
    return devices, [m for m in messages if isinstance(m, Measurement)]


def test_n1_is_probed_for_the_fixed_cost_when_not_configured() -> None:
    """Without 1 in the sizes, each device still gets a probe at n=1, and the cost model uses it."""
    _, measurements = _run(make_plan("tests.fakes:curve", modes=("compute",)))
    probes = [m for m in measurements if m.role == "probe"]
    assert {(m.key.device, m.key.size) for m in probes} == {("/CPU:0", 1), ("/GPU:0", 1)}
    costs = {c.device: c for c in cost_models(measurements)}
    assert costs["/GPU:0"].fixed_s > costs["/CPU:0"].fixed_s  # the fake GPU's 100 µs launch cost
    assert costs["/GPU:0"].peak_flops is not None
    assert costs["/GPU:0"].largest_size == 128


def test_refinement_pins_the_crossover_within_tolerance() -> None:
    """Bisection between 32 and 64 narrows the bracket around the true n ≈ 46 to within 5%."""
    plan = dataclasses.replace(
        make_plan("tests.fakes:curve", modes=("compute",)),
        refine=RefineSettings(enabled=True, tolerance=0.05, budget_s=30),
    )
    devices, measurements = _run(plan)
    assert {m.key.size for m in measurements if m.role == "refine"} <= set(range(33, 64))
    (crossover,) = crossovers(devices, measurements)
    assert crossover.state is CrossoverState.FOUND
    assert crossover.lower is not None
    assert crossover.upper is not None
    assert crossover.upper / crossover.lower - 1 <= 0.05 or crossover.upper - crossover.lower == 1
    assert crossover.lower <= 47
    assert crossover.upper >= 46


def test_refinement_stops_when_its_budget_is_spent() -> None:
    """A budget that is spent before the first bisection step adds no refined sizes."""
    plan = dataclasses.replace(
        make_plan("tests.fakes:curve", modes=("compute",)),
        refine=RefineSettings(enabled=True, tolerance=0.001, budget_s=1e-6),
    )
    _, measurements = _run(plan)
    assert {m.key.size for m in measurements if m.role == "refine"} == set()


def test_cpu_is_skipped_far_past_the_crossover_when_allowed() -> None:
    """With skip_cpu_above_speedup=10, the CPU stops after two sizes where the GPU won by 10x or more."""
    plan = dataclasses.replace(
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


def test_bootstrap_interval_surrounds_the_crossover() -> None:
    """The 95% interval from resampled blocks contains the point estimate."""
    devices, measurements = _run(make_plan("tests.fakes:curve", modes=("compute",)))
    (crossover,) = crossovers(devices, measurements)
    assert crossover.size is not None
    assert crossover.ci_lower is not None
    assert crossover.ci_upper is not None
    assert crossover.ci_lower <= crossover.size <= crossover.ci_upper


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


def test_the_fixed_cost_probe_does_not_sway_the_crossover() -> None:
    """A GPU 'win' at the unasked-for n=1 probe does not turn a clean crossing into 'ambiguous'."""

    def m(device: str, size: int, seconds: float, role: Role = "sweep") -> Measurement:
        key = PointKey(backend="fake", device=device, dtype="float32", mode="compute", size=size)
        timing = Timing(
            median_s=seconds, iqr_s=0, blocks=3, calls_per_block=1, stop_reason=StopReason.CONVERGED, noisy=False
        )
        return Measurement(key=key, timing=timing, role=role)

    cpu, gpu = CurveBackend(BackendOptions(tf32=False, cpu_threads=1)).discover()
    measurements = [m("/CPU:0", 1, 2.0, "probe"), m("/GPU:0", 1, 1.0, "probe")]
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
        key = PointKey(backend="b", device="d", dtype="float32", mode="compute", size=size)
        timing = Timing(
            median_s=seconds, iqr_s=0, blocks=3, calls_per_block=1, stop_reason=StopReason.CONVERGED, noisy=False
        )
        return Measurement(key=key, timing=timing)

    (model,) = cost_models([m(1, 1e-4), m(1000, 1e-4 + 2e9 / 1e12)])
    assert model.fixed_s == 1e-4
    assert model.peak_flops is not None
    assert abs(model.peak_flops - 1e12) / 1e12 < 1e-9
    assert cost_models([m(1000, 1.0)]) == ()  # no n=1 point, no model
