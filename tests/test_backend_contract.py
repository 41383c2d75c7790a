"""One contract suite that every built-in backend (TensorFlow, PyTorch, JAX) passes on this CPU-only machine.

Nothing here skips: a framework that is missing fails its tests, so CI must install all three.
"""

from __future__ import annotations

import math
import threading
import time
from typing import cast

import pytest

from crossover_monitor.errors import DeviceUnavailable, MeasurementFailed, PlacementError
from crossover_monitor.measure.contract import BackendOptions, CheckedBackend
from crossover_monitor.measure.guard.hostinfo import usable_cpus
from crossover_monitor.measure.registry import load_backend
from crossover_monitor.measure.runner import run_plan
from crossover_monitor.measure.timing import measure
from crossover_monitor.model import (
    BACKENDS,
    BUILTIN_BACKENDS,
    DTYPES,
    FORK_JOIN,
    GPU_PROBLEM,
    MODES,
    THREAD_POOL,
    WORK_STEALING,
    DeviceFailure,
    DeviceInfo,
    Measurement,
    Mode,
    SweepResult,
)
from crossover_monitor.protocol import Environment, Message
from crossover_monitor.service.sweep import run_sweep
from tests.conftest import QUICK_TIMING, make_plan, with_bench

pytestmark = pytest.mark.framework

# Unit roundoff doubled (machine epsilon) per dtype; every backend multiplies all four on the CPU.
EPSILON = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
CHECK_SIZE = 64


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> CheckedBackend:
    """Each backend once per module: TensorFlow refuses new thread settings once it has started."""
    options = BackendOptions(tf32=False, cpu_threads=usable_cpus())
    return cast("CheckedBackend", load_backend(request.param, options))


@pytest.fixture
def cpu(backend: CheckedBackend) -> DeviceInfo:
    return next(d for d in backend.discover() if d.kind == "cpu")


def test_discover_finds_exactly_one_named_cpu(backend: CheckedBackend) -> None:
    """On a machine without a GPU, discover() lists the CPU alone, with its model name."""
    devices = list(backend.discover())
    assert [d.kind for d in devices] == ["cpu"]
    assert devices[0].name.strip()
    assert devices[0].backend == backend.name
    # How its threads share a call decides whether a thread's wait for a CPU stalls it (the guard's block watch).
    stealing = backend.name == "tensorflow"
    assert dict(devices[0].details)[THREAD_POOL] == (WORK_STEALING if stealing else FORK_JOIN)


def test_environment_records_what_changes_the_answer(backend: CheckedBackend) -> None:
    """environment() names the framework and its version and reads back the TF32 and thread settings."""
    env = backend.environment()
    assert env["framework"] == backend.name
    assert env["framework_version"]
    assert env["tf32"] == "false"
    assert env["cpu_threads"] == str(usable_cpus())


def test_environment_says_why_there_is_no_gpu(backend: CheckedBackend) -> None:
    """With no GPU found, environment() carries the cause and its fix: on this machine, no NVIDIA driver."""
    problem = backend.environment()[GPU_PROBLEM]
    assert problem.startswith("no NVIDIA GPU or driver on this host"), problem
    assert "fine on a CPU-only machine" in problem


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_products_match_numpy_in_float64(backend: CheckedBackend, cpu: DeviceInfo, dtype: str, mode: Mode) -> None:
    """The block that is timed computes A·B to within a few roundoffs of the dtype (a float32 stand-in fails)."""
    error = backend.check(cpu, CHECK_SIZE, dtype, mode)
    assert 0 <= error <= 2 * math.sqrt(CHECK_SIZE) * EPSILON[dtype]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_timing_loop_gives_positive_medians(backend: CheckedBackend, cpu: DeviceInfo, dtype: str, mode: Mode) -> None:
    """prepare() returns a block the timing loop can warm up, calibrate and repeat."""
    timing = measure(backend.prepare(cpu, 32, dtype, mode), QUICK_TIMING, time.perf_counter)
    assert timing.median_s > 0
    assert all(sample > 0 for sample in timing.samples_s)


def test_unsupported_dtype_fails_the_point_with_a_clear_reason(backend: CheckedBackend, cpu: DeviceInfo) -> None:
    """A dtype the backend cannot time is a MeasurementFailed that names it, not a crash of the sweep."""
    with pytest.raises(MeasurementFailed, match="unsupported dtype 'float8_e4m3fn'"):
        backend.prepare(cpu, 16, "float8_e4m3fn", "compute")


def test_run_plan_emits_environment_devices_and_measurements(backend: CheckedBackend) -> None:
    """A two-size plan yields the environment first, then the CPU, then a measurement of every point."""
    messages: list[Message] = []
    run_plan(make_plan(backend.name, sizes=(8, 16)), backend, messages.append, time.perf_counter)
    assert isinstance(messages[0], Environment)
    assert [m.kind for m in messages if isinstance(m, DeviceInfo)] == ["cpu"]
    assert not [m for m in messages if isinstance(m, DeviceFailure)]
    points = {(m.key.size, m.key.mode) for m in messages if isinstance(m, Measurement)}
    assert {(size, mode) for size in (8, 16) for mode in MODES} <= points


def test_a_missing_gpu_is_a_fatal_failure_not_a_cpu_timing(backend: CheckedBackend) -> None:
    """Asking for a GPU this machine lacks emits a fatal DeviceFailure and times nothing in its place."""
    messages: list[Message] = []
    gpu = BUILTIN_BACKENDS[backend.name].gpu_device(0)  # none exists here: asking for it must fail, never fall back
    plan = with_bench(make_plan(backend.name, sizes=(8,)), devices=(gpu,))
    run_plan(plan, backend, messages.append, time.perf_counter)
    failures = [m for m in messages if isinstance(m, DeviceFailure)]
    assert [(f.device, f.fatal) for f in failures] == [(gpu, True)]
    assert "no such device" in failures[0].reason
    assert not [m for m in messages if isinstance(m, Measurement)]


@pytest.mark.parametrize("device_name", ["gpu", "nonsense"])
def test_prepare_refuses_a_device_it_does_not_know(backend: CheckedBackend, device_name: str) -> None:
    """prepare() for a device the backend did not discover raises, rather than running somewhere else."""
    name = BUILTIN_BACKENDS[backend.name].gpu_device(0) if device_name == "gpu" else "npu:3"
    device = DeviceInfo(backend=backend.name, device=name, kind="gpu", name="NVIDIA H200")
    with pytest.raises((DeviceUnavailable, PlacementError), match=name):
        backend.prepare(device, 16, "float32", "compute")


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_worker_process_sweep_succeeds_with_the_options_applied(name: str) -> None:
    """The real worker process times a plan with the backend and reports TF32 and one CPU thread as asked."""
    plan = with_bench(make_plan(name, sizes=(16, 32)), tf32=True, cpu_threads=1)
    outcome = run_sweep(plan, timeout_s=120, cancel=threading.Event())
    assert outcome.result is SweepResult.SUCCESS, outcome.reason
    assert outcome.snapshot is not None
    assert [d.kind for d in outcome.snapshot.devices] == ["cpu"]
    points = {(m.key.size, m.key.mode) for m in outcome.snapshot.measurements}
    assert {(size, mode) for size in (16, 32) for mode in MODES} <= points
    environment = dict(outcome.snapshot.environment)
    assert (environment["framework"], environment["tf32"], environment["cpu_threads"]) == (name, "true", "1")
