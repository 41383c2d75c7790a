"""deploy/container/Dockerfile built and run with podman: its user, read-only root, healthcheck, stop, /tmp.

tests/realdeploy.py says how the image is built without a registry. The container runs as the
DaemonSet runs it: read-only root, every capability dropped, no new privileges; podman's default
tmpfs on /tmp stands in for the DaemonSet's emptyDir.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

import crossover_monitor
from crossover_monitor.service.coordinator import STOP_WAIT_S
from tests.conftest import REPO, free_port
from tests.locks import dockerfile_lock, read_lock
from tests.realdeploy import WORKER_RUNNING, image_packages, podman
from tests.service import find, http_get, parse, wait_until

pytestmark = pytest.mark.slow

STOP_LINE = "INFO    crossover_monitor.service.coordinator: sweep stopped: the service is stopping"
UID_GID = "10001:10001"
DOCKERFILES = REPO / "deploy" / "container"

Start = Callable[..., tuple[str, int]]


# The embedded defaults but the CPU checks of the guard: these tests are about the container, and the suite
# loads this machine (a 2-core VM) while they run, which the guard would rightly withhold the sweeps for.
CONFIG = (
    "guard: {cpu_max_other_cores: 64, reference_max_slowdown: 100, range_max_slowdown: 100, "
    "cpu_max_threads_wait: 100}\n"
)


@pytest.fixture
def start_container(cpu_image: str, tmp_path: Path) -> Iterator[Start]:
    """Starts the image detached, hardened as the DaemonSet runs it: returns its name and host port."""
    started: list[str] = []
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)

    def start(*options: str) -> tuple[str, int]:
        name, port = f"cm-test-{uuid.uuid4().hex[:8]}", free_port()
        podman(
            "run",
            "--detach",
            f"--name={name}",
            "--read-only",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            # podman's defaults for these cannot be set on this kind of host: explicit, as a unit's LimitNOFILE=.
            "--ulimit=nofile=4096:4096",
            "--ulimit=nproc=4096:4096",
            f"--publish=127.0.0.1:{port}:9437",
            f"--volume={config}:/etc/crossover-monitor/config.yaml:ro",
            *options,
            cpu_image,
            "run",
            "--config",
            "/etc/crossover-monitor/config.yaml",
        )
        started.append(name)
        return name, port

    yield start
    for name in started:
        podman("rm", "--force", "--time=0", name, check=False)


def logs(name: str) -> Callable[[], str]:
    def read() -> str:
        done = podman("logs", name, check=False)
        return done.stdout + done.stderr

    return read


def test_runs_as_its_own_user_with_a_read_only_root_and_passes_its_healthcheck(start_container: Start) -> None:
    """The container runs as its own user, no capabilities, read-only root; healthy, then ready after a sweep."""
    name, port = start_container()
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, 60, "/healthz 200", logs=logs(name))
    ids = podman("exec", name, "sh", "-c", 'echo "$(id -u):$(id -g) $(id -un) $(id -gn)"').stdout.split()
    assert ids == [UID_GID, "crossover-monitor", "crossover-monitor"], ids  # both with an entry
    for path in ("/opt/crossover-monitor/probe", "/etc/probe", "/probe"):
        written = podman("exec", name, "touch", path, check=False)
        assert written.returncode != 0
        assert "Read-only file system" in written.stderr, written.stderr
    capabilities = podman("exec", name, "grep", "^CapEff", "/proc/1/status").stdout.split()
    assert int(capabilities[1], 16) == 0, capabilities
    # The image's own HEALTHCHECK, as the engine runs it (podman runs it on demand here: no systemd timers).
    checked = podman("healthcheck", "run", name, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert podman("inspect", "--format={{.State.Health.Status}}", name).stdout.strip() == "healthy"
    # A real TensorFlow sweep with the embedded defaults (but the guard's CPU checks), then ready.
    wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 180, "/readyz 200", logs=logs(name))
    samples = parse(http_get(f"{base}/metrics")[2])
    assert find(samples, "matmul_sweeps_total", result="success") == {frozenset({("result", "success")}): 1.0}
    assert not re.search(r"\b(ERROR|CRITICAL)\b|Traceback", logs(name)())


def test_stop_during_a_sweep_is_quick_clean_and_one_info_line(start_container: Start) -> None:
    """podman stop mid-sweep: quick, exit 0, one info line and no error in the logs."""
    name, _ = start_container()
    wait_until(
        lambda: podman("exec", name, "sh", "-c", WORKER_RUNNING, check=False).returncode == 0,
        60,
        "a sweep's worker",
        logs=logs(name),
    )
    time.sleep(2)  # into the worker's framework import and first points
    began = time.monotonic()
    podman("stop", "--time=30", name, timeout=60)
    took = time.monotonic() - began
    assert took < STOP_WAIT_S, f"podman stop took {took:.1f} s (bound {STOP_WAIT_S} s)"
    assert podman("inspect", "--format={{.State.ExitCode}}", name).stdout.strip() == "0"
    said = logs(name)()
    assert said.count(STOP_LINE) == 1, said
    assert not re.search(r"\b(ERROR|CRITICAL)\b|Traceback|status -15", said), said


def test_a_killed_container_serves_its_last_results_again_from_its_state_volume(start_container: Start) -> None:
    """Killed and started again, the container serves its last results from its state volume at once."""
    volume = f"cm-test-state-{uuid.uuid4().hex[:8]}"
    state = "/var/lib/crossover-monitor"
    try:
        name, port = start_container(f"--volume={volume}:{state}", f"--env=STATE_DIRECTORY={state}")
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 180, "the first sweep", logs=logs(name))
        before = parse(http_get(f"{base}/metrics")[2])
        podman("kill", "--signal=KILL", name)
        podman("start", name)
        wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 10, "ready after the restart", logs=logs(name))
        after = parse(http_get(f"{base}/metrics")[2])
        last_success = "matmul_sweep_last_success_timestamp_seconds"
        assert find(after, last_success) == find(before, last_success)
        assert find(after, "matmul_crossover_state") == find(before, "matmul_crossover_state")
        assert "run history: resumed" in logs(name)()
    finally:
        podman("rm", "--force", "--time=0", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)


def test_without_a_writable_tmp_readiness_says_why_and_no_sweep_crashes(start_container: Start) -> None:
    """With no writable /tmp, /readyz says why and what to set, and the sweep fails cleanly without a traceback."""
    name, port = start_container("--read-only-tmpfs=false")  # a read-only root with nothing mounted at /tmp
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(f"{base}/healthz")[0] == 200, 60, "/healthz 200", logs=logs(name))
    status, _, body = http_get(f"{base}/readyz")
    assert status == 503
    assert "no writable temporary directory (/tmp" in body, body
    assert "TMPDIR" in body, body  # and what to do about it
    wait_until(lambda: "sweep failed" in logs(name)(), 60, "the first sweep's result", logs=logs(name))
    said = logs(name)()
    assert "no writable temporary directory" in said, said
    assert "Traceback" not in said, said
    assert "FileNotFoundError" not in said, said


def assert_holds_its_lock(image: str, dockerfile: str) -> None:
    """The image's Python environment is its Dockerfile's lock, version for version, plus pip and the project."""
    packages = image_packages(image)
    assert packages.pop(canonicalize_name("crossover-monitor")) == crossover_monitor.__version__
    packages.pop(canonicalize_name("pip"), None)  # the venv's own, from the base's Python: no dependency of the service
    locked = {name: str(pin.version) for name, pin in read_lock(dockerfile_lock(DOCKERFILES / dockerfile)).items()}
    assert packages == locked


def test_the_image_holds_exactly_the_locked_versions(cpu_image: str) -> None:
    """Two builds of one commit list the same packages: the lock's, each at its locked version, and no other."""
    assert_holds_its_lock(cpu_image, "Dockerfile")
    # What scripts/release checks before it tags an image with the version: the image says that version.
    said = podman("run", "--rm", "--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096", cpu_image, "--version")
    assert said.stdout.strip().endswith(crossover_monitor.__version__), said.stdout


def test_gpu_image_builds_and_times_the_cpu_where_there_is_no_gpu(gpu_image: str, tmp_path: Path) -> None:
    """Dockerfile.gpu built for real: TensorFlow with NVIDIA's CUDA wheels as locked, the same user and healthcheck.

    No GPU here: a sweep with the image's TensorFlow times the CPU and reports a CUDA build.
    """
    assert_holds_its_lock(gpu_image, "Dockerfile.gpu")
    assert podman("inspect", "--format={{.Config.User}}", gpu_image).stdout.strip() == UID_GID
    assert "healthz" in podman("image", "inspect", "--format={{json .HealthCheck}}", gpu_image).stdout
    config = tmp_path / "config.yaml"
    config.write_text("benchmark: {sizes: [16, 64], modes: [compute]}\n" + CONFIG)
    done = podman(
        "run",
        "--rm",
        "--read-only",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=4096:4096",
        f"--volume={config}:/etc/crossover-monitor/config.yaml:ro",
        gpu_image,
        "once",
        "--json",
        "--config",
        "/etc/crossover-monitor/config.yaml",
        timeout=300,
        check=False,
    )
    outcome = json.loads(done.stdout)
    environment = outcome["snapshot"]["environment"]
    assert environment["framework"] == "tensorflow"
    assert environment["cuda_build"] == "true", environment
    assert [d["kind"] for d in outcome["snapshot"]["devices"]] == ["cpu"]
    assert outcome["result"] == "success", done.stderr
