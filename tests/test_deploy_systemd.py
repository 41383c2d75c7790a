"""The systemd unit: systemd's own checker accepts it, its sandbox scores well, and its settings fit the service."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from crossover_monitor.cli.main import _parser
from crossover_monitor.errors import EXIT_CONFIG
from crossover_monitor.service.coordinator import STOP_WAIT_S
from tests.conftest import REPO
from tests.memorylimits import HEADROOM, mib, recorded_peak_mib

UNIT = REPO / "deploy" / "systemd" / "crossover-monitor.service"
INSTALLED_BINARY = "/opt/crossover-monitor/.venv/bin/crossover-monitor"
CONFIG = "/etc/crossover-monitor/config.yaml"
MAX_EXPOSURE = 2.5  # systemd-analyze security rates below this "OK"; 10 is an unsandboxed root service
# Service.stop waits this long at most for a sweep to be killed (SIGTERM, then SIGKILL after the grace).


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=60, check=False)


def verify(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on the unit text, with ExecStart= pointed at this checkout's real binary.

    verify insists that executables exist, and /opt/crossover-monitor is the install path, not this
    checkout; the binary of the virtual environment running the tests is the same program.
    """
    binary = Path(sys.executable).with_name("crossover-monitor")
    assert binary.is_file(), f"{binary} is missing: install the project into the virtual environment"
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(INSTALLED_BINARY, str(binary)), encoding="utf-8")
    return systemd_analyze("verify", str(unit))


def settings(text: str) -> dict[str, list[str]]:
    """``{"Section.Key": [values in order]}``; keys such as DeviceAllow= may repeat."""
    found: dict[str, list[str]] = defaultdict(list)
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found[f"{section}.{key.strip()}"].append(value.strip())
    return dict(found)


def seconds(timespan: str) -> float:
    """A systemd time span in seconds, as systemd itself parses it."""
    result = systemd_analyze("timespan", timespan)
    assert result.returncode == 0, result.stderr
    match = re.search(r"μs:\s*(\d+)", result.stdout)
    assert match, result.stdout
    return int(match.group(1)) / 1_000_000


def exposure(result: subprocess.CompletedProcess[str]) -> float:
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


@pytest.fixture(scope="module")
def unit() -> dict[str, list[str]]:
    return settings(UNIT.read_text(encoding="utf-8"))


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit without a single warning."""
    result = verify(UNIT.read_text(encoding="utf-8"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


@pytest.mark.parametrize(
    ("good", "bad", "complaint"),
    [
        ("ProtectSystem=strict", "ProtektSystem=strict", "Unknown key"),
        ("WatchdogSec=60s", "WatchdogSec=sixty", "Failed to parse"),
        ("Type=notify", "Type=notifyy", "Failed to parse service type"),
    ],
)
def test_verify_flags_a_broken_unit(tmp_path: Path, good: str, bad: str, complaint: str) -> None:
    """The same verify check reports a misspelled key or a bad value (systemd only warns and ignores them)."""
    text = UNIT.read_text(encoding="utf-8")
    assert good in text
    result = verify(text.replace(good, bad), tmp_path)
    assert complaint in result.stderr


def test_verify_rejects_a_missing_executable(tmp_path: Path) -> None:
    """verify fails when ExecStart= names a program that does not exist."""
    text = UNIT.read_text(encoding="utf-8").replace(INSTALLED_BINARY, "/nonexistent/bin/crossover-monitor")
    unit = tmp_path / UNIT.name
    unit.write_text(text, encoding="utf-8")
    result = systemd_analyze("verify", str(unit))
    assert result.returncode != 0
    assert "is not executable" in result.stderr


def test_security_exposure_is_below_the_ok_threshold() -> None:
    """systemd-analyze security --offline rates the sandbox below 2.5 (and its own --threshold agrees)."""
    threshold = round(MAX_EXPOSURE * 10) - 1  # --threshold counts tenths: 24 means at most 2.4
    result = systemd_analyze("security", "--offline=true", f"--threshold={threshold}", "--no-pager", str(UNIT))
    assert result.returncode == 0, result.stdout + result.stderr
    assert exposure(result) < MAX_EXPOSURE


def test_security_threshold_fails_an_unhardened_unit(tmp_path: Path) -> None:
    """The same security check fails a unit that runs the service without a sandbox."""
    bare = tmp_path / UNIT.name
    bare.write_text(f"[Service]\nExecStart={INSTALLED_BINARY} run\n", encoding="utf-8")
    threshold = round(MAX_EXPOSURE * 10) - 1
    result = systemd_analyze("security", "--offline=true", f"--threshold={threshold}", "--no-pager", str(bare))
    assert result.returncode != 0
    assert exposure(result) > MAX_EXPOSURE


def test_service_notifies_systemd_and_is_watched(unit: dict[str, list[str]]) -> None:
    """Type=notify from the main process only, with a watchdog the service pings while healthy."""
    assert unit["Service.Type"] == ["notify"]
    assert unit["Service.NotifyAccess"] == ["main"]
    assert seconds(unit["Service.WatchdogSec"][-1]) > 0


def test_configuration_error_is_not_restarted_in_a_loop(unit: dict[str, list[str]]) -> None:
    """Exit code 78 (bad configuration) prevents a restart; no ExecStartPre= escapes that rule (systemd #11868)."""
    assert unit["Service.Restart"] == ["on-failure"]
    prevented = " ".join(unit["Service.RestartPreventExitStatus"]).split()
    assert str(EXIT_CONFIG) in prevented
    assert "Service.ExecStartPre" not in unit


def test_manual_starts_never_use_up_the_watchdog_restarts(unit: dict[str, list[str]]) -> None:
    """No start rate limit: systemd counts manual starts against it, which once left a watchdog kill unrestarted."""
    assert seconds(unit["Unit.StartLimitIntervalSec"][-1]) == 0
    assert seconds(unit["Service.RestartSec"][-1]) > 0  # crashes are paced instead


def test_the_service_runs_the_installed_configuration(unit: dict[str, list[str]]) -> None:
    """ExecStart= runs the installed binary on the installed configuration, as the CLI parses it."""
    (start,) = unit["Service.ExecStart"]
    binary, *args = shlex.split(start)
    assert binary == INSTALLED_BINARY
    run = _parser().parse_args(args)  # the service's own parser: exits on a bad command line
    assert (run.command, run.config) == ("run", CONFIG)


def test_stop_goes_to_the_main_process_first(unit: dict[str, list[str]]) -> None:
    """KillMode=mixed: SIGTERM to the service, which stops its worker itself; SIGKILL to the rest only later."""
    assert unit["Service.KillMode"] == ["mixed"]


def test_stop_timeout_outlasts_the_sweep_kill_path(unit: dict[str, list[str]]) -> None:
    """systemd waits well past the service's own bounded stop before it sends SIGKILL."""
    assert seconds(unit["Service.TimeoutStopSec"][-1]) >= 2 * STOP_WAIT_S


def test_sandbox_keeps_what_tensorflow_and_cuda_need(unit: dict[str, list[str]]) -> None:
    """No W^X ban (XLA JIT), AF_UNIX for sd_notify, NVIDIA devices allowed, /proc/driver visible."""
    assert "Service.MemoryDenyWriteExecute" not in unit
    assert "AF_UNIX" in unit["Service.RestrictAddressFamilies"][-1].split()
    assert unit["Service.DevicePolicy"] == ["closed"]
    allowed = {entry.split()[0] for entry in unit["Service.DeviceAllow"]}
    # the device nodes current drivers register as "nvidia" and "nvidiactl"; older ones as "nvidia-frontend"
    assert {"char-nvidia-frontend", "char-nvidia", "char-nvidiactl", "char-nvidia-uvm"} <= allowed
    assert unit.get("Service.PrivateDevices", ["no"]) == ["no"]  # it would hide /dev/nvidia*
    assert unit.get("Service.ProcSubset", ["all"]) == ["all"]  # CUDA reads /proc/driver/nvidia


def test_service_runs_unprivileged(unit: dict[str, list[str]]) -> None:
    """A dynamic user with no capabilities that cannot gain privileges, and a read-only system."""
    assert unit["Service.DynamicUser"] == ["yes"]
    assert unit["Service.CapabilityBoundingSet"] == [""]
    assert unit["Service.NoNewPrivileges"] == ["yes"]
    assert unit["Service.ProtectSystem"] == ["strict"]


def test_reload_sends_sighup_to_the_service(unit: dict[str, list[str]]) -> None:
    """`systemctl reload` rereads the configuration: SIGHUP to the main process."""
    (reload,) = unit["Service.ExecReload"]
    assert shlex.split(reload) == ["/bin/kill", "-HUP", "$MAINPID"]


def test_unit_caps_memory_above_the_measured_peak_without_swap(unit: dict[str, list[str]]) -> None:
    """Issue 51 N10: MemoryMax= holds the default sweep's measured peak with room, no swap slows a timing, and a worker
    the OOM killer ends does not stop the unit (systemd's OOMPolicy= default, stop, would)."""
    assert mib(unit["Service.MemoryMax"][-1]) >= HEADROOM * recorded_peak_mib()
    assert unit["Service.MemorySwapMax"] == ["0"]
    assert unit["Service.OOMPolicy"] == ["continue"]


def test_unit_compose_and_daemonset_limit_memory_alike(unit: dict[str, list[str]]) -> None:
    """Issue 51 N10: one figure, matched to one measurement, caps the service on every path."""
    import yaml  # noqa: PLC0415

    services = yaml.safe_load((REPO / "deploy" / "container" / "compose.yaml").read_text(encoding="utf-8"))["services"]
    daemonset = yaml.safe_load((REPO / "deploy" / "kubernetes" / "daemonset.yaml").read_text(encoding="utf-8"))
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    limits = {
        "unit MemoryMax=": mib(unit["Service.MemoryMax"][-1]),
        "compose cpu mem_limit": mib(services["crossover-monitor"]["mem_limit"]),
        "compose gpu mem_limit": mib(services["crossover-monitor-gpu"]["mem_limit"]),
        "DaemonSet limits.memory": mib(container["resources"]["limits"]["memory"]),
    }
    assert len(set(limits.values())) == 1, limits
