"""The deploy artefacts run for real: the CPU image built and run with podman, the unit booted under systemd.

No registry and no Docker daemon are reachable on the CI machine, so everything starts from Debian:

1. a Debian bookworm tree from ``debootstrap`` with systemd, dbus and python3 (cached between runs);
2. that tree imported into podman as the image's base (``--build-arg BASE=``; the public base is
   ``python:3.11-slim-bookworm``, the same Debian release and Python minor version);
3. ``deploy/container/Dockerfile`` built unchanged from it, offline, pip reading a wheelhouse of the
   lock's wheels (requirements/, checked against its hashes) that pip downloaded beside the test
   environment (``--network none``: nothing else reaches the build);
4. the image run by podman as the container tests' subject, and its tree -- the base's systemd, the
   project's virtual environment at the path the unit expects -- booted with ``systemd-nspawn`` for
   the unit's tests, with ``deploy/systemd/crossover-monitor.service`` copied in.

One build serves both. Root and the tools are needed: ``./scripts/test`` installs them with apt when
run as root. Without them the tests skip and say so; with ``CROSSOVER_MONITOR_DEPLOY_TESTS=required``
(set by ``.ci/run``) they fail instead, so CI cannot pass without running them. A machine without the
free disk a build needs (about 12 GB for the CPU image, 34 GB for the GPU one) skips the tests of that
image, saying how much is free: that is the machine's, not something the suite can install.

What stays in .cache/deploy between runs is bounded: the Debian tree, one wheelhouse per lock (the lock's
wheels only), and podman's store with the base and the CPU image; the GPU image and every untagged image a
build leaves are removed. ``rm -rf .cache/deploy`` frees it all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename

from tests.conftest import REPO
from tests.locks import LOCKS, dockerfile_lock, read_lock

CACHE = REPO / ".cache" / "deploy"
ROOTFS = CACHE / "rootfs-bookworm"
WHEELS = CACHE / "wheels"
# Podman's run state must not outlive a reboot (stale locks), so it lives on /run's tmpfs, one per checkout.
PODMAN_RUNROOT = Path("/run/crossover-monitor-tests") / hashlib.sha256(bytes(CACHE)).hexdigest()[:12]
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# procps: the unit's ExecReload= runs /bin/kill, as on any standard Debian install (minbase lacks it).
ROOTFS_PACKAGES = ("systemd", "dbus", "procps", "python3", "python3-venv", "python-is-python3")
BASE_IMAGE = "localhost/crossover-monitor-test-base:bookworm"
IMAGE = "localhost/crossover-monitor:test"
GPU_IMAGE = "localhost/crossover-monitor:gpu-test"
TOOLS = {
    "debootstrap": "debootstrap",
    "podman": "podman",
    "runc": "runc",
    "iptables": "iptables",  # netavark publishes ports through it
    "systemd-nspawn": "systemd-container",
}
REQUIRED_ENV = "CROSSOVER_MONITOR_DEPLOY_TESTS"
UNIT = REPO / "deploy" / "systemd" / "crossover-monitor.service"
EXAMPLE_CONFIG = REPO / "deploy" / "config.example.yaml"
UNIT_NAME = UNIT.name
# A shell test for a sweep's worker process (slim trees have no pgrep).
WORKER_RUNNING = "grep -qs crossover_monitor.measure.worker /proc/[0-9]*/cmdline"
# Free disk each build needs at its peak, on the filesystem of .cache/deploy, with the base image and the
# wheelhouse already there: the build stage's virtual environment, then the final stage's copy of it, each
# also written out once more while podman commits it. Measured with this suite's flags (--layers=false) on
# 2026-12-01, with a margin: CPU image 10.6 GB, GPU image 31.5 GB (benchmarks/README.md "Real-deploy
# tests' disk"); the CPU image from the lock again on 2026-12-06: 10.9 GB (README "What ./scripts/test
# installs and needs"). CI machines differ in free disk (one such run ran out half-way).
CPU_BUILD_NEEDS_GB = 12.0
GPU_BUILD_NEEDS_GB = 34.0


def unavailable() -> str | None:
    """Why the real-deploy tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: podman and systemd-nspawn run as root here; run ./scripts/test as root"
    missing = [f"{tool} (Debian package {package})" for tool, package in TOOLS.items() if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)}: ./scripts/test installs them with apt when run as root"
    return None


def require_tools() -> None:
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"real-deploy tests required ({REQUIRED_ENV}=required) but {reason}", pytrace=False)
    pytest.skip(reason)


def require_disk(needs_gb: float, what: str) -> None:
    """Skip, with the figures, a build that the disk cannot hold -- even where the suite is required.

    Root and the tools are this suite's to install (missing ones fail a required run); free disk is the
    machine's. A build that runs out half-way fails with podman's "no space left on device" after
    minutes and leaves a half-written store; saying so up front tells the reader what to free.
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(CACHE).free / 1e9
    if free_gb < needs_gb:
        pytest.skip(f"{what} needs about {needs_gb:.0f} GB free on the filesystem of {CACHE}; {free_gb:.1f} GB is")


def run(
    args: list[str], *, timeout: float = 120, check: bool = True, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, input=input_text)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def podman_command(*args: str) -> list[str]:
    """podman with this suite's own store: runc (crun refuses the host's hybrid cgroups), overlay storage
    (vfs would copy the 2.4 GB image per container), cgroupfs and file events (no systemd on the host)."""
    store = [
        "--runtime=runc",
        "--storage-driver=overlay",
        f"--root={CACHE / 'podman'}",
        f"--runroot={PODMAN_RUNROOT}",
        "--cgroup-manager=cgroupfs",
        "--events-backend=file",
    ]
    # Layers being committed are written to TMPDIR (default /var/tmp, which may be a small filesystem of
    # its own): keep them beside the store, where require_disk() counted on them.
    return ["env", f"TMPDIR={CACHE / 'tmp'}", "podman", *store, *args]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(podman_command(*args), timeout=timeout, check=check)


def debian_tree() -> Path:
    """A Debian bookworm tree with systemd and python3, made once and kept under .cache/deploy."""
    stamp = ROOTFS / ".crossover-monitor-packages"
    if stamp.is_file() and stamp.read_text() == ",".join(ROOTFS_PACKAGES):
        return ROOTFS
    shutil.rmtree(ROOTFS, ignore_errors=True)
    ROOTFS.parent.mkdir(parents=True, exist_ok=True)
    run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(ROOTFS_PACKAGES)}",
            "bookworm",
            str(ROOTFS),
            DEBIAN_MIRROR,
        ],
        timeout=900,
    )
    stamp.write_text(",".join(ROOTFS_PACKAGES))
    return ROOTFS


def base_image() -> str:
    tree = debian_tree()
    digest = hashlib.sha256((tree / ".crossover-monitor-packages").read_bytes()).hexdigest()[:12]
    tag = f"{BASE_IMAGE}-{digest}"
    exists = podman("image", "exists", tag, check=False)
    if exists.returncode not in (0, 1):  # 1: no such image; anything else is podman failing
        raise AssertionError(
            f"podman image exists failed ({exists.returncode}): {exists.stderr.strip()}; if the store was made "
            f"by another checkout or podman version, remove {CACHE / 'podman'}"
        )
    if exists.returncode == 1:
        tar = subprocess.Popen(
            ["tar", "-C", str(tree), "--exclude=./.crossover-monitor-packages", "-c", "."], stdout=subprocess.PIPE
        )
        assert tar.stdout is not None
        try:
            imported = subprocess.run(
                podman_command("import", "--change", 'CMD ["/bin/bash"]', "-", tag),
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
        finally:
            tar.stdout.close()  # podman failing early must not leave tar blocked on a pipe only we hold
            tar.wait(timeout=60)
        assert imported.returncode == 0, f"podman import failed: {imported.stderr}"
        assert tar.returncode == 0, f"tar of {tree} failed"
    return tag


def wheelhouse(lock: Path) -> Path:
    """Every wheel the image installs: the lock's, checked against its hashes, and the project's build backend.

    pip downloads them beside the test environment; the build itself reaches no network. Bounded: one
    wheelhouse per lock file there is, holding that lock's wheels and the newest build backend, nothing older.
    """
    wheels = WHEELS / lock.stem
    for stale in WHEELS.glob("*"):
        if stale.is_dir() and not (LOCKS / f"{stale.name}.txt").is_file():  # a lock since removed, or renamed
            shutil.rmtree(stale)
    wheels.mkdir(parents=True, exist_ok=True)
    pins = {(name, pin.version) for name, pin in read_lock(lock).items()}
    for wheel in wheels.iterdir():
        name, version, *_ = parse_wheel_filename(wheel.name)
        if (name, version) not in pins:  # a version the lock no longer names, or a build backend since updated
            wheel.unlink()
    # No pip cache: it would hold a second copy of every wheel (several GB with the CUDA ones); pip skips
    # the wheels already in the wheelhouse itself.
    download = [sys.executable, "-m", "pip", "download", "-q", "--no-cache-dir", "--only-binary=:all:"]
    download += ["-d", str(wheels)]
    run([*download, "--require-hashes", "-r", str(lock)], timeout=900)
    build_backend = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]["requires"]
    run([*download, *build_backend], timeout=300)
    return wheels


def build_image(dockerfile: str, tag: str, needs_gb: float) -> str:
    """deploy/container/DOCKERFILE built on the Debian base, offline, from scratch each run (no layer cache)."""
    (CACHE / "tmp").mkdir(parents=True, exist_ok=True)
    base = base_image()
    wheels = wheelhouse(dockerfile_lock(REPO / "deploy" / "container" / dockerfile))
    # Counted once the base and the wheelhouse are on disk, as the figures were measured.
    require_disk(needs_gb, f"building {tag}")
    pip_conf = CACHE / "pip.conf"
    pip_conf.write_text("[global]\nno-index = true\nfind-links = /wheels\n")
    try:
        podman(
            "build",
            "--format=docker",  # the OCI format has no HEALTHCHECK; podman would drop it
            "--network=none",
            # No cached layer per step: each would keep another copy of the virtual environment on disk, for
            # a suite that builds each image once a run.
            "--layers=false",
            f"--volume={wheels}:/wheels:ro",
            f"--volume={pip_conf}:/etc/pip.conf:ro",
            f"--build-arg=BASE={base}",
            "--file",
            str(REPO / "deploy" / "container" / dockerfile),
            "--tag",
            tag,
            str(REPO),
            timeout=1200,
        )
    finally:
        # The build stage's image (a whole virtual environment) and the image this tag named before are no
        # tagged image's now, nor what a failed build left: free their space.
        podman("image", "prune", "--force", check=False)
    return tag


def image_packages(image: str) -> dict[NormalizedName, str]:
    """Every distribution in the image's Python environment, by canonical name, with its version."""
    script = "import importlib.metadata as m, json; print(json.dumps([[d.name, d.version] for d in m.distributions()]))"
    # Explicit limits, as the container tests set them: podman's defaults cannot be set on this kind of host.
    limits = ("--ulimit=nofile=4096:4096", "--ulimit=nproc=4096:4096")
    listed = podman("run", "--rm", "--network=none", *limits, "--entrypoint=python", image, "-c", script).stdout
    return {canonicalize_name(name): version for name, version in json.loads(listed)}


@pytest.fixture(scope="session")
def cpu_image() -> str:
    require_tools()
    return build_image("Dockerfile", IMAGE, CPU_BUILD_NEEDS_GB)


@pytest.fixture(scope="session")
def gpu_image() -> Iterator[str]:
    """The GPU image (TensorFlow with NVIDIA's CUDA wheels): about 7 GB and 4-5 minutes to build here.

    Removed after its test: the CPU image is what the other tests run.
    """
    require_tools()
    yield build_image("Dockerfile.gpu", GPU_IMAGE, GPU_BUILD_NEEDS_GB)
    podman("rmi", "--force", GPU_IMAGE, check=False)
    podman("image", "prune", "--force", check=False)


@pytest.fixture(scope="session")
def image_tree(cpu_image: str) -> Iterator[Path]:
    """The image's file tree, mounted read-only for nspawn (each machine writes to its own memory overlay)."""
    mounted = Path(podman("image", "mount", cpu_image).stdout.strip())
    yield mounted
    podman("image", "unmount", cpu_image, check=False)


def config_text(port: int, **changes: object) -> str:
    """deploy/config.example.yaml, listening on 127.0.0.1:port, with ``section.key`` changes."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    config["server"]["listen"] = f"127.0.0.1:{port}"
    # Not tests of the guard: a CI machine's other load must not withhold the CPU (a sweep that measured
    # nothing is no success), nor the host's moves (a VM's vCPUs change speed) withhold its points.
    config["guard"].update(
        cpu_max_other_cores=64, reference_max_slowdown=100, range_max_slowdown=100, cpu_max_threads_wait=100
    )
    for dotted, value in changes.items():
        section, key = dotted.split(".", 1)
        config[section][key] = value
    return yaml.safe_dump(config, sort_keys=False)


class Machine:
    """A Debian system booted by systemd-nspawn from the image's tree; its writes go to memory.

    It shares the host's network (the tests scrape it on 127.0.0.1). Commands run inside through
    nsenter into its PID 1: no machined here (hence --register=no), so no machinectl.
    """

    def __init__(self, tree: Path, name: str) -> None:
        self.tree, self.name = tree, name
        self.console = CACHE / f"{name}.console"
        self.leader = 0
        self._nspawn: subprocess.Popen[bytes] | None = None

    def boot(self) -> None:
        # cgroup v2 inside, so DevicePolicy= is enforced (v1 ignores it here); that needs seccomp off and
        # BPF/perfmon capabilities for systemd's device programs.
        env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1", "SYSTEMD_SECCOMP": "0"}
        with self.console.open("wb") as console:
            self._nspawn = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "--quiet",
                    "--register=no",
                    "--keep-unit",
                    "--console=read-only",  # passive blocked PID 1 once the console filled
                    "--volatile=overlay",
                    "--capability=CAP_BPF,CAP_PERFMON",
                    f"--machine={self.name}",
                    f"--directory={self.tree}",
                    "--boot",
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 60
        while not self.leader:
            assert self._nspawn.poll() is None, f"systemd-nspawn exited: {self.console.read_text(errors='replace')}"
            assert time.monotonic() < deadline, "no PID 1 in the container after 60 s"
            self.leader = self._find_leader(self._nspawn.pid) or 0
            time.sleep(0.1)
        # The boot is done when systemd says so (running, or degraded for a unit the container lacks).
        # Early on, systemctl cannot reach the bus yet ("Failed to connect to bus") and answers at once:
        # ask again until it can.
        deadline = time.monotonic() + 120
        while True:
            left = max(1.0, deadline - time.monotonic())
            try:
                state = self.run("systemctl", "is-system-running", "--wait", timeout=left, check=False)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"not booted after 120 s: {self.console.read_text(errors='replace')}") from None
            answer = state.stdout.strip()
            if answer in ("running", "degraded"):
                return
            # Only "offline" (no bus yet) or an empty answer means not up yet; any other state is final.
            assert answer in ("", "offline"), f"boot ended {answer!r}: {self.console.read_text(errors='replace')}"
            assert self._nspawn.poll() is None, f"systemd-nspawn exited: {self.console.read_text(errors='replace')}"
            assert time.monotonic() < deadline, f"not booted after 120 s: {state.stderr}"
            time.sleep(0.2)

    @staticmethod
    def _find_leader(parent: int) -> int | None:
        """The descendant of ``parent`` that is PID 1 of its own PID namespace."""
        pending = [parent]
        while pending:
            pid = pending.pop()
            with contextlib.suppress(OSError):
                status = dict(
                    line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
                )
                if status.get("NSpid", "").split()[-1:] == ["1"] and pid != parent:
                    return pid
                for task in Path(f"/proc/{pid}/task").iterdir():
                    pending.extend(int(child) for child in (task / "children").read_text().split())
        return None

    def run(
        self, *args: str, timeout: float = 60, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(
            ["nsenter", f"--target={self.leader}", "--all", *args], timeout=timeout, check=check, input_text=input_text
        )

    def sh(self, script: str, *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("sh", "-c", script, timeout=timeout, check=check)

    def write(self, path: str, text: str) -> None:
        self.run("sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write", path, input_text=text)

    def install_unit(self, config: str, dropin: str | None = None) -> None:
        # The image's own state directory (for a container's volume) is not a host's: on a host, systemd's
        # StateDirectory= makes it. Left there, DynamicUser= would try to migrate it across the overlay's
        # layers (EXDEV), which no real host filesystem does.
        self.run("rm", "-rf", "/var/lib/crossover-monitor")
        self.write(f"/etc/systemd/system/{UNIT_NAME}", UNIT.read_text(encoding="utf-8"))
        self.write("/etc/crossover-monitor/config.yaml", config)
        if dropin is not None:
            self.write(f"/etc/systemd/system/{UNIT_NAME}.d/test.conf", dropin)
        self.run("systemctl", "daemon-reload")

    def show(self, *properties: str) -> dict[str, str]:
        shown = self.run("systemctl", "show", f"--property={','.join(properties)}", UNIT_NAME).stdout
        return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)

    def journal(self) -> str:
        """The unit's journal: the service's own lines and systemd's about the unit."""
        return self.run("journalctl", "--unit", UNIT_NAME, "--output=short-iso", "--no-pager").stdout

    def poweroff(self) -> None:
        if self._nspawn is None:
            return
        if self._nspawn.poll() is None and self.leader:
            run(["nsenter", f"--target={self.leader}", "--all", "systemctl", "poweroff", "--no-block"], check=False)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._nspawn.wait(timeout=30)
        if self._nspawn.poll() is None:  # killing PID 1 of the namespace takes every process in it along
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, 9)
            self._nspawn.kill()
            self._nspawn.wait(timeout=30)


@pytest.fixture
def machine(image_tree: Path, request: pytest.FixtureRequest) -> Iterator[Machine]:
    name = "cm-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]
    booted = Machine(image_tree, name)
    try:
        booted.boot()
        yield booted
    finally:
        booted.poweroff()
