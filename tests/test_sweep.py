"""Sweeps through the real worker process: success, deadlines, crashes, failed devices, cancellation."""

from __future__ import annotations

import io
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable

import pytest

from crossover_monitor.model import CrossoverState, Snapshot, SweepResult
from crossover_monitor.protocol import Plan
from crossover_monitor.service.sweep import MESSAGE_CHARS, SubprocessWorker, Worker, bounded_lines, run_sweep
from tests.conftest import make_plan, with_bench


class RecordingLauncher:
    """Starts real workers and remembers them, so a test can check they are gone afterwards."""

    def __init__(self) -> None:
        self.workers: list[SubprocessWorker] = []

    def __call__(self, plan: Plan) -> Worker:
        worker = SubprocessWorker(plan)
        self.workers.append(worker)
        return worker


def _group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_known_curves_give_a_successful_sweep_with_the_right_crossover() -> None:
    """The fake curves cross between 32 and 64 (true n ≈ 46) in compute mode; the sweep finds that."""
    outcome = run_sweep(make_plan("tests.fakes:curve"), timeout_s=60, cancel=threading.Event())
    assert outcome.result is SweepResult.SUCCESS, outcome.reason
    assert outcome.snapshot is not None
    roles = [m.role for m in outcome.snapshot.measurements]
    assert roles.count("sweep") == 4 * 2 * 2
    assert roles.count("fixed_cost") == 2 * 2  # n=1 per device and mode, for the fixed cost
    compute = next(c for c in outcome.snapshot.crossovers if c.mode == "compute")
    assert compute.state is CrossoverState.FOUND
    assert (compute.lower, compute.upper) == (32, 64)
    assert compute.size == pytest.approx(46.3, rel=0.1)
    assert dict(outcome.snapshot.environment)["framework"] == "fake"


def test_hung_worker_is_killed_and_sweep_marked_timeout() -> None:
    """A worker stuck in a GPU call is killed with its process group at the deadline."""
    launcher = RecordingLauncher()
    started = time.monotonic()
    outcome = run_sweep(make_plan("tests.fakes:hanging"), timeout_s=3, cancel=threading.Event(), launch=launcher)
    assert outcome.result is SweepResult.TIMEOUT
    assert "deadline" in outcome.reason
    assert outcome.snapshot is None
    assert time.monotonic() - started < 3 + 6
    assert _group_is_gone(launcher.workers[0].pid)


def test_crashed_worker_fails_the_sweep_with_its_exit_status() -> None:
    """A worker killed by SIGSEGV ends the sweep as failed, saying how it died."""
    outcome = run_sweep(make_plan("tests.fakes:crashing"), timeout_s=30, cancel=threading.Event())
    assert outcome.result is SweepResult.FAILED
    assert "-11" in outcome.reason
    assert outcome.snapshot is None


def _failed_keeping_the_cpu(plan: Plan) -> tuple[str, Snapshot]:
    """Run a sweep that must fail with the CPU's timings still served; its reason and snapshot."""
    outcome = run_sweep(plan, timeout_s=30, cancel=threading.Event())
    assert outcome.result is SweepResult.FAILED
    assert outcome.snapshot is not None, outcome.reason
    assert outcome.snapshot.measured_devices == {"/CPU:0"}
    return outcome.reason, outcome.snapshot


def test_failed_gpu_keeps_cpu_results_and_fails_the_sweep() -> None:
    """A GPU error leaves the CPU's timings in the snapshot, records why, and marks the sweep failed."""
    reason, snapshot = _failed_keeping_the_cpu(make_plan("tests.fakes:broken_gpu"))
    assert "CUDA_ERROR_ECC_UNCORRECTABLE" in reason
    assert [f.device for f in snapshot.failures] == ["/GPU:0"]


def test_gpu_failing_mid_sweep_keeps_no_points_and_no_crossover() -> None:
    """A GPU that fails after some sizes loses all its points: no crossover from a truncated curve."""
    reason, snapshot = _failed_keeping_the_cpu(make_plan("tests.fakes:late_failing_gpu"))
    assert "/GPU:0" in reason
    assert snapshot.crossovers == ()
    assert all(c.device == "/CPU:0" for c in snapshot.costs)


def test_plugin_bug_fails_its_device_not_the_sweep() -> None:
    """An unexpected exception from a backend fails that device with its type named; the CPU's results stay."""
    reason, _ = _failed_keeping_the_cpu(make_plan("tests.fakes:buggy"))
    assert "unexpected ZeroDivisionError" in reason


def test_missing_expected_gpu_fails_the_sweep_and_is_named() -> None:
    """With expect_gpus=1 and no GPU found, the sweep fails and 'expected-gpu-0' is reported down."""
    reason, snapshot = _failed_keeping_the_cpu(with_bench(make_plan("tests.fakes:cpu_only"), expect_gpus=1))
    assert "expected 1 GPU(s)" in reason
    assert "is the driver loaded" in reason  # a backend that cannot tell why: the question to check
    assert [f.device for f in snapshot.failures] == ["expected-gpu-0"]


def test_cancelled_before_start_launches_no_worker() -> None:
    """A sweep that begins after shutdown started does not start a worker at all."""
    launcher = RecordingLauncher()
    cancel = threading.Event()
    cancel.set()
    outcome = run_sweep(make_plan("tests.fakes:curve"), timeout_s=30, cancel=cancel, launch=launcher)
    assert outcome.result is SweepResult.FAILED
    assert launcher.workers == []


def test_cancel_stops_a_sweep_in_flight_within_seconds() -> None:
    """Setting the cancel event (service shutdown) kills the worker promptly."""
    launcher = RecordingLauncher()
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    started = time.monotonic()
    outcome = run_sweep(make_plan("tests.fakes:slow"), timeout_s=60, cancel=cancel, launch=launcher)
    assert outcome.result is SweepResult.FAILED
    assert "cancelled" in outcome.reason
    assert time.monotonic() - started < 6
    assert _group_is_gone(launcher.workers[0].pid)


def test_unknown_plugin_backend_fails_with_a_clear_reason() -> None:
    """A backend that cannot be imported fails the sweep naming the module."""
    outcome = run_sweep(make_plan("tests.no_such_module:create"), timeout_s=30, cancel=threading.Event())
    assert outcome.result is SweepResult.FAILED
    assert "tests.no_such_module" in outcome.reason


@pytest.mark.slow
def test_tensorflow_sweep_on_this_cpu_says_no_gpu() -> None:
    """The real TensorFlow backend times the CPU, and with no GPU the crossover state says so."""
    outcome = run_sweep(make_plan("tensorflow", sizes=(8, 64)), timeout_s=120, cancel=threading.Event())
    assert outcome.result is SweepResult.SUCCESS, outcome.reason
    assert outcome.snapshot is not None
    assert outcome.snapshot.measured_devices == {"/CPU:0"}
    assert {c.state for c in outcome.snapshot.crossovers} == {CrossoverState.NO_GPU}
    assert all(m.timing.median_s > 0 for m in outcome.snapshot.measurements)


@pytest.mark.slow
def test_tensorflow_expecting_a_gpu_here_fails_naming_the_missing_driver() -> None:
    """expect_gpus on this driverless machine fails the sweep; the missing GPU's reason says why TensorFlow has none."""
    plan = with_bench(make_plan("tensorflow", sizes=(8,), modes=("compute",)), expect_gpus=1)
    outcome = run_sweep(plan, timeout_s=120, cancel=threading.Event())
    assert outcome.result is SweepResult.FAILED
    assert outcome.snapshot is not None
    (failure,) = outcome.snapshot.failures
    assert failure.device == "expected-gpu-0"
    assert failure.reason.startswith("expected 1 GPU(s), tensorflow found 0: no NVIDIA GPU or driver on this host")
    assert outcome.snapshot.gpu_problem is not None
    assert outcome.snapshot.gpu_problem in outcome.reason


@pytest.mark.slow
def test_tensorflow_refuses_a_gpu_this_machine_lacks() -> None:
    """Asking TensorFlow for /GPU:0 on a CPU-only machine is a reported failure, never a CPU timing."""
    outcome = run_sweep(
        make_plan("tensorflow", sizes=(8,), devices=("/CPU:0", "/GPU:0")), timeout_s=120, cancel=threading.Event()
    )
    assert outcome.result is SweepResult.FAILED
    assert outcome.snapshot is not None
    assert outcome.snapshot.measured_devices == {"/CPU:0"}
    failure = outcome.snapshot.failures[0]
    assert failure.device == "/GPU:0"
    assert failure.fatal
    assert "no such device" in failure.reason


def _misbehaving(script: str) -> Callable[[Plan], Worker]:
    """A program in the worker's place that writes what ``script`` writes (fault injection)."""
    return lambda plan: SubprocessWorker(plan, command=(sys.executable, "-c", script))


@pytest.mark.parametrize(
    ("script", "said"),
    [
        # JSON nested past the parser: the reader thread used to die of a RecursionError, the sweep waited its deadline.
        ("print('[' * 200_000, flush=True); import time; time.sleep(60)", "not JSON (JSON nested too deeply to read)"),
        # A 64 MiB line with no end on stdout: read in pieces, never held whole.
        (
            "import sys, time; sys.stdout.write('x' * (64 << 20)); sys.stdout.flush(); time.sleep(60)",
            f"the worker wrote a line longer than {MESSAGE_CHARS} characters",
        ),
    ],
)
def test_a_worker_that_writes_garbage_fails_the_sweep_at_once_saying_why(script: str, said: str) -> None:
    """Issue 34 #7: the sweep fails as soon as the line is read, not at its deadline, and says why."""
    started = time.monotonic()
    plan = make_plan("tests.fakes:curve")
    outcome = run_sweep(plan, timeout_s=50, cancel=threading.Event(), launch=_misbehaving(script))
    assert outcome.result is SweepResult.FAILED
    assert said in outcome.reason
    assert time.monotonic() - started < 30


def test_a_worker_stderr_line_without_an_end_is_kept_cut_and_the_sweep_goes_on() -> None:
    """Issue 34 #7: 256 MiB on stderr without a newline is read in pieces; what the failure reason keeps of it
    is cut to a few KiB, and the daemon's reader holds no more than a piece at a time."""
    script = (
        "import sys\n"
        "chunk = 'e' * (1 << 20)\n"
        "for _ in range(256): sys.stderr.write(chunk)\n"
        "sys.stderr.write('\\nthe end\\n'); sys.stderr.flush(); sys.exit(3)\n"
    )
    tracemalloc.start()
    try:
        plan = make_plan("tests.fakes:curve")
        outcome = run_sweep(plan, timeout_s=50, cancel=threading.Event(), launch=_misbehaving(script))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.result is SweepResult.FAILED
    assert "the end" in outcome.reason
    assert peak < 32 << 20  # the whole line would be 256 MiB
    lines = list(bounded_lines(io.StringIO("a" * 10 + "\nshort\n" + "b" * 25), 8))
    assert lines == [("aaaaaaaa", False), ("short\n", True), ("bbbbbbbb", False)]


def test_a_worker_stderr_with_control_characters_reaches_the_reason_printable() -> None:
    """Issue 51 N4/N8: a worker's stderr (an ESC sequence, a NUL) reaches the failed sweep's reason, the page and the
    history as printable text, as every other string from the worker."""
    script = "import sys; sys.stderr.write('boom \\x1b[31mred\\x00\\n'); sys.stderr.flush(); sys.exit(3)\n"
    outcome = run_sweep(
        make_plan("tests.fakes:curve"), timeout_s=50, cancel=threading.Event(), launch=_misbehaving(script)
    )
    assert outcome.result is SweepResult.FAILED
    assert "boom \\x1b[31mred\\x00" in outcome.reason
    assert "\x1b" not in outcome.reason
    assert "\x00" not in outcome.reason
