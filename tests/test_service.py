"""The real service as a subprocess: scrape over HTTP, the metric contract, faults, and shutdown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.promql import promtool
from tests.service import RunningService, fake_config, find, parse, started_services

pytestmark = pytest.mark.slow

StartService = Callable[[str], RunningService]  # config YAML -> a running service, stopped after the test

TF_CONFIG = """
schedule: {interval: 1h}
benchmark:
  sizes: [8, 64, 256]
  timeout: 2m
  timing: {size_budget: 300ms, block_time: 5ms, min_blocks: 3}
# Not a test of the guard: a busy machine (one core kept busy by another program) must not withhold the CPU.
guard: {cpu_max_other_cores: 64, reference_max_slowdown: 100, range_max_slowdown: 100, cpu_max_threads_wait: 100}
"""


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartService]:
    with started_services(tmp_path) as start_service:
        yield start_service


@pytest.fixture(scope="module")
def tensorflow_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningService, str]]:
    """One real TensorFlow service for the contract tests, after its first sweep."""
    service = RunningService(tmp_path_factory.mktemp("tf"), TF_CONFIG)
    try:
        service.wait_for_sweeps("success", timeout=120)
        _, _, body = service.get("/metrics")
        yield service, body
    finally:
        service.stop()


def test_first_sweep_is_served_with_cpu_timings(tensorflow_service: tuple[RunningService, str]) -> None:
    """After the first sweep, /metrics has a positive median, IQR and FLOP/s per size and mode."""
    _, body = tensorflow_service
    samples = parse(body)
    for mode in ("compute", "end_to_end"):
        for size in (8, 64, 256):
            labels = {"backend": "tensorflow", "device": "/CPU:0", "dtype": "float32", "mode": mode, "size": str(size)}
            key = frozenset(labels.items())
            median = samples[("matmul_duration_seconds", key)]
            assert median > 0
            assert samples[("matmul_duration_iqr_seconds", key)] >= 0
            assert samples[("matmul_flops_per_second", key)] == pytest.approx(2 * size**3 / median)
            assert samples[("matmul_duration_noisy", key)] in (0, 1)


def test_no_gpu_is_stated_plainly(tensorflow_service: tuple[RunningService, str]) -> None:
    """On a CPU-only machine the crossover state is no_gpu, and no crossover size is made up."""
    samples = parse(tensorflow_service[1])
    states = find(samples, "matmul_crossover_state", state="no_gpu")
    assert set(states.values()) == {1.0}
    assert {dict(k)["mode"] for k in states} == {"compute", "end_to_end"}
    assert not find(samples, "matmul_crossover_size")


def test_why_there_is_no_gpu_is_logged_and_shown_but_never_a_label(
    tensorflow_service: tuple[RunningService, str],
) -> None:
    """The real TensorFlow service here says why it has no GPU in its sweep log line and on /, not on /metrics."""
    service, body = tensorflow_service
    (line,) = [line for line in service.logs().splitlines() if "sweep finished" in line]
    assert "no_gpu=no NVIDIA GPU or driver on this host" in line, line
    status, _, landing = service.get("/")
    assert status == 200
    assert "<p id='no-gpu'>No GPU: no NVIDIA GPU or driver on this host" in landing
    assert "no NVIDIA GPU or driver" not in body  # no label value: a new series at every rewording
    assert "gpu_problem" not in body


def test_sweep_and_device_metrics_follow_the_contract(tensorflow_service: tuple[RunningService, str]) -> None:
    """Sweep counters, timestamps, device up/info and build info are all present with sane values."""
    samples = parse(tensorflow_service[1])
    assert find(samples, "matmul_sweeps_total", result="success") == {frozenset({("result", "success")}): 1.0}
    for result in ("failed", "timeout", "skipped"):
        assert find(samples, "matmul_sweeps_total", result=result) == {frozenset({("result", result)}): 0.0}
    now = time.time()
    assert now - 300 < samples[("matmul_sweep_last_success_timestamp_seconds", frozenset())] <= now
    assert samples[("matmul_sweep_next_timestamp_seconds", frozenset())] > now
    assert 0 < samples[("matmul_sweep_duration_seconds", frozenset())] < 120
    assert find(samples, "matmul_device_up", device="/CPU:0") == {
        frozenset({("backend", "tensorflow"), ("device", "/CPU:0")}): 1.0
    }
    (info,) = find(samples, "matmul_device_info", device="/CPU:0")
    assert dict(info)["kind"] == "cpu"
    assert dict(info)["threads"].isdigit()
    (bench,) = find(samples, "matmul_benchmark_info")
    assert dict(bench)["tf32"] == "false"
    assert re.fullmatch(r"\d+\.\d+.*", dict(bench)["framework_version"])
    (build,) = find(samples, "matmul_monitor_build_info")
    assert dict(build)["backend"] == "tensorflow"
    assert dict(build)["framework_version"] == dict(bench)["framework_version"]  # one source: the worker


def test_scrape_passes_promtool_check_metrics(tensorflow_service: tuple[RunningService, str]) -> None:
    """promtool accepts the exposition with no warnings."""
    result = promtool("check", "metrics", stdin=tensorflow_service[1])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "", result.stdout


def test_probes_and_openmetrics(tensorflow_service: tuple[RunningService, str]) -> None:
    """/healthz and /readyz say ok after a sweep; OpenMetrics is served when asked for; unknown paths 404."""
    service, _ = tensorflow_service
    assert service.get("/healthz")[0] == 200
    assert service.get("/readyz")[0] == 200
    status, content_type, body = service.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")
    assert service.get("/nope")[0] == 404


def test_fake_gpu_crossover_is_exported_with_its_bracket(start: StartService) -> None:
    """With a GPU-like device whose curve is known, the crossover, its bracket and state are exported."""
    service = start(fake_config("curve"))
    samples = service.wait_for_sweeps("success")
    labels = {"backend": "fake", "gpu": "/GPU:0", "cpu": "/CPU:0", "dtype": "float32", "mode": "compute"}
    key = frozenset(labels.items())
    assert samples[("matmul_crossover_size", key)] == pytest.approx(46.3, rel=0.1)
    # refinement narrows the configured bracket (32, 64) around the true n ≈ 46.3
    assert (
        32
        <= samples[("matmul_crossover_lower_size", key)]
        <= 46.3
        <= samples[("matmul_crossover_upper_size", key)]
        <= 64
    )
    assert samples[("matmul_crossover_ci_lower_size", key)] <= samples[("matmul_crossover_ci_upper_size", key)]
    assert samples[("matmul_crossover_state", frozenset({*key, ("state", "found")}))] == 1
    assert samples[("matmul_crossover_state", frozenset({*key, ("state", "gpu_never_faster")}))] == 0
    (info,) = find(samples, "matmul_device_info", device="/GPU:0")
    assert dict(info)["compute_capability"] == "9.0"


def test_not_ready_before_the_first_sweep(start: StartService) -> None:
    """/readyz is 503 while no sweep has completed, /healthz is 200, and no timings are served."""
    service = start(fake_config("slow", timeout="60s"))
    service.wait_for(lambda: service.get("/healthz")[0] == 200, 20, "healthz")
    status, _, body = service.get("/readyz")
    assert status == 503
    assert "no sweep" in body
    assert not find(service.scrape(), "matmul_duration_seconds")


def test_hung_worker_is_counted_as_timeout_and_daemon_keeps_serving(start: StartService) -> None:
    """A worker that hangs is killed at the deadline; the sweep counts as timeout; the service stays healthy."""
    service = start(fake_config("hanging", timeout="3s"))
    samples = service.wait_for_sweeps("timeout", timeout=30)
    assert samples[("matmul_sweeps_total", frozenset({("result", "success")}))] == 0
    assert service.get("/healthz")[0] == 200
    assert service.get("/readyz")[0] == 503
    assert not find(samples, "matmul_duration_seconds")  # never a zero in place of a missing timing


def test_crashed_worker_is_counted_as_failed_and_daemon_keeps_serving(start: StartService) -> None:
    """A worker that dies of SIGSEGV fails the sweep; the service logs why and keeps serving."""
    service = start(fake_config("crashing"))
    service.wait_for_sweeps("failed", timeout=30)
    assert service.get("/healthz")[0] == 200
    assert "sweep failed" in service.logs()
    assert "-11" in service.logs()


def test_failed_gpu_is_down_and_its_series_are_gone(start: StartService) -> None:
    """A GPU that errors has matmul_device_up 0 and no timings; the CPU's timings stay."""
    service = start(fake_config("broken_gpu"))
    samples = service.wait_for_sweeps("failed", timeout=30)
    assert set(find(samples, "matmul_device_up", device="/GPU:0").values()) == {0.0}
    assert set(find(samples, "matmul_device_up", device="/CPU:0").values()) == {1.0}
    assert not find(samples, "matmul_duration_seconds", device="/GPU:0")
    assert find(samples, "matmul_duration_seconds", device="/CPU:0")


def test_a_fatally_failed_device_is_not_retried(start: StartService) -> None:
    """A configured device that does not exist fails fatally once; later sweeps report it without retrying."""
    config = fake_config(interval="2s")
    config = config.replace("  timeout: 30s", "  timeout: 30s\n  devices: ['/CPU:0', '/GPU:7']")
    service = start(config)
    samples = service.wait_for_sweeps("failed", count=2, timeout=60)
    assert service.logs().count("device will not be retried until restart") == 1
    assert "not retried after a fatal failure" in service.logs()
    assert set(find(samples, "matmul_device_up", device="/GPU:7").values()) == {0.0}
    assert set(find(samples, "matmul_device_up", device="/CPU:0").values()) == {1.0}


def test_sigterm_mid_sweep_exits_zero_within_ten_seconds(start: StartService) -> None:
    """SIGTERM during a sweep stops the service, kills the worker's group, and exits 0 in under 10 s."""
    service = start(fake_config("slow", timeout="60s"))
    service.wait_for(lambda: "sweep started" in service.logs(), 20, "a sweep to start")
    time.sleep(1.5)  # the worker is now inside a one-second block
    children = subprocess.run(["pgrep", "-P", str(service.process.pid)], capture_output=True, text=True, check=False)
    workers = [int(pid) for pid in children.stdout.split()]
    assert workers, "the sweep's worker process should be running"
    started = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    code = service.process.wait(timeout=15)
    assert code == 0, service.logs()
    assert time.monotonic() - started < 10
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # A normal stop is one INFO line in the same words every time, not an error with the worker's stderr.
    logs = service.logs()
    assert "sweep stopped: the service is stopping" in logs
    assert "ERROR" not in logs, logs


def test_taken_port_fails_start_with_exit_3(start: StartService) -> None:
    """A listen address already in use is reported plainly with the start-up exit code."""
    first = start(fake_config("slow", timeout="60s"))
    first.wait_for(lambda: first.get("/healthz")[0] == 200, 20, "healthz")
    clash = subprocess.run(
        [
            sys.executable,
            "-m",
            "crossover_monitor",
            "run",
            "--config",
            str(first.config),
            "--listen",
            f"127.0.0.1:{first.port}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert clash.returncode == 3
    assert "cannot listen" in clash.stderr
    assert "Traceback" not in clash.stderr


def test_sigusr1_runs_a_sweep_now_counted_like_a_scheduled_one(start: StartService) -> None:
    """SIGUSR1 starts a sweep at once (an hour before the schedule's), recorded and counted as a success."""
    service = start(fake_config())
    service.wait_for_sweeps("success", 1)
    service.process.send_signal(signal.SIGUSR1)
    samples = service.wait_for_sweeps("success", 2, timeout=30)
    assert samples[("matmul_sweeps_total", frozenset({("result", "skipped")}))] == 0
    assert "manual sweep requested" in service.logs()
