"""Runs the real service as a subprocess on loopback, for integration tests."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from crossover_monitor.http.server import MetricsServer
from crossover_monitor.metrics import render_state
from crossover_monitor.model import ServiceState
from tests.conftest import REPO, free_port

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fake_config(backend: str = "curve", *, interval: str = "1h", timeout: str = "30s") -> str:
    """A configuration that runs the fake plugin backend ``tests.fakes:BACKEND`` in about a second a sweep."""
    return f"""
schedule: {{interval: {interval}}}
benchmark:
  backend: "tests.fakes:{backend}"
  sizes: [16, 32, 64, 128]
  timeout: {timeout}
  timing: {{size_budget: 200ms, block_time: 2ms, min_blocks: 3}}
# The fake GPUs have no NVML behind them, and they spin a CPU thread where a real GPU's thread waits for
# the GPU: beside another service on a 2-core machine the host-wait check would withhold them. The guard's
# own tests cover both (tests/test_guard.py). Nor may the CPU check withhold the CPU beside other tests'
# load: a sweep the guard withheld is not a success, and these tests are not about the guard.
guard:
  {{require_nvml: false, gpu_max_host_wait: 1, cpu_max_other_cores: 64,
   reference_max_slowdown: 100, range_max_slowdown: 100, cpu_max_threads_wait: 100}}
"""


class RunningService:
    """``python -m crossover_monitor run`` with a config written to a temp dir; stopped by ``stop``."""

    def __init__(
        self, tmp_path: Path, config: str, extra: tuple[str, ...] = (), env: Mapping[str, str] | None = None
    ) -> None:
        """``env``: variables to set for the service beside this process's (a preloaded library, a notify socket)."""
        self.port = free_port()
        self.config = tmp_path / "config.yaml"
        self.config.write_text(config)
        self.log = tmp_path / "service.log"
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crossover_monitor",
                "--log-level",
                "debug",
                "run",
                "--config",
                str(self.config),
                "--listen",
                f"127.0.0.1:{self.port}",
                *extra,
            ],
            cwd=REPO,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        """Status, content type and body of a GET, without raising on 503."""
        return http_get(self.url + path, headers)

    def scrape(self) -> Samples:
        _, _, body = self.get("/metrics")
        return parse(body)

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        wait_until(condition, timeout, what, process=self.process, logs=self.logs)

    def wait_for_sweeps(self, result: str, count: int = 1, timeout: float = 90) -> Samples:
        key = ("matmul_sweeps_total", frozenset({("result", result)}))
        self.wait_for(lambda: self.scrape().get(key, 0) >= count, timeout, f"{count} {result} sweep(s)")
        return self.scrape()

    def logs(self) -> str:
        self._log_file.flush()
        return self.log.read_text()

    def stop(self) -> int:
        status = stop_process(self.process)
        self._log_file.close()
        return status


@contextlib.contextmanager
def started_services(directory: Path) -> Iterator[Callable[[str], RunningService]]:
    """A function that starts the real service with a config (each in a directory of its own); all stopped after."""
    started: list[RunningService] = []

    def start(config: str) -> RunningService:
        home = directory / f"service-{len(started)}"
        home.mkdir()
        started.append(RunningService(home, config))
        return started[-1]

    try:
        yield start
    finally:
        for service in started:
            service.stop()


def landing() -> str:
    """A landing page for a server built without the service (the service's own is crossover_monitor/http/page.py's)."""
    return "<html><body><a href='/metrics'>/metrics</a></body></html>"


def started_server(read_state: Callable[[], ServiceState], *, backend: str = "torch", **options: Any) -> MetricsServer:
    """A MetricsServer on a free loopback port serving ``read_state``; alive and ready unless ``options`` say."""
    server = MetricsServer(
        "127.0.0.1",
        0,
        read_state,
        **{
            "render_metrics": functools.partial(render_state, backend=backend),
            "healthy": lambda: (True, "ok"),
            "ready": lambda: (True, "ok"),
            "landing": landing,
            **options,
        },
    )
    server.start()
    return server


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Status, content type and body of a GET, without raising on an error status."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    logs: Callable[[], str] = str,
) -> None:
    """Poll ``condition`` (connection errors count as not yet) until true; fail at once if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process exited with {process.returncode} while waiting for {what}:\n{logs()}")
        try:
            if condition():
                return
        except OSError:  # urllib.error.URLError is one
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n{logs()}")


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15) -> int:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout``; its exit status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def parse(body: str) -> Samples:
    """Every sample of an exposition, keyed by name and label set."""
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def find(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one metric whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key: value for (n, key), value in samples.items() if n == name and wanted <= key}
