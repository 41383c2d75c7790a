"""deploy/systemd/crossover-monitor.service under real systemd: booted with systemd-nspawn on the image's tree.

tests/realdeploy.py says how the machine is made. Each test boots its own (about 3 s), installs the
unit as shipped and deploy/config.example.yaml (listening on a free loopback port), and drives it with
systemctl as an operator would.
"""

from __future__ import annotations

import re
import time

import pytest

from crossover_monitor.errors import EXIT_CONFIG
from crossover_monitor.service.coordinator import STOP_WAIT_S
from tests.conftest import free_port
from tests.realdeploy import UNIT_NAME, WORKER_RUNNING, Machine, config_text
from tests.service import find, http_get, parse, wait_until

pytestmark = pytest.mark.slow

STOP_LINE = "INFO    crossover_monitor.service.coordinator: sweep stopped: the service is stopping"
# systemd's dynamic users come from this range (systemd's docs/UIDS-GIDS.md).
DYNAMIC_UIDS = range(61184, 65520)


def start(machine: Machine, config: str, dropin: str | None = None) -> int:
    """Install the unit and config, start it (returns once READY=1 came: Type=notify), and its main PID."""
    machine.install_unit(config, dropin)
    started = machine.run("systemctl", "start", UNIT_NAME, timeout=60, check=False)
    assert started.returncode == 0, f"{started.stderr}\n{machine.journal()}"
    shown = machine.show("ActiveState", "SubState", "MainPID")
    assert (shown["ActiveState"], shown["SubState"]) == ("active", "running"), machine.journal()
    return int(shown["MainPID"])


def wait_for_worker(machine: Machine) -> None:
    """Until a sweep's worker process runs: a stop then lands in the middle of a sweep."""
    wait_until(
        lambda: machine.sh(WORKER_RUNNING, check=False).returncode == 0,
        60,
        "a sweep's worker",
        logs=machine.journal,
    )
    time.sleep(2)  # into the worker's framework import and first points


def test_start_reaches_ready_serves_and_sweeps_with_tensorflow(machine: Machine) -> None:
    """Started under systemd: healthy, then ready after a TensorFlow sweep with every device up and no error."""
    port = free_port()
    start(machine, config_text(port))
    base = f"http://127.0.0.1:{port}"
    status, _, _ = http_get(f"{base}/healthz")
    assert status == 200
    # Ready only once a sweep has results; the example config's sweep times TensorFlow on this CPU.
    wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 180, "/readyz 200", logs=machine.journal)
    samples = parse(http_get(f"{base}/metrics")[2])
    assert find(samples, "matmul_sweeps_total", result="success") == {frozenset({("result", "success")}): 1.0}
    up = find(samples, "matmul_device_up", backend="tensorflow")
    assert up, "no device in matmul_device_up"
    assert all(value == 1.0 for value in up.values()), up
    journal = machine.journal()
    assert "sweep finished result=success" in journal
    assert not re.search(r"\b(ERROR|CRITICAL)\b|Traceback", journal), journal


@pytest.mark.parametrize("how", ["systemctl stop", "SIGTERM"])
def test_stop_during_a_sweep_is_one_info_line_and_quick(machine: Machine, how: str) -> None:
    """Stopped mid-sweep (systemctl stop or SIGTERM): quick, a clean result, one info line, no restart."""
    main_pid = start(machine, config_text(free_port()))
    wait_for_worker(machine)
    began = time.monotonic()
    if how == "systemctl stop":
        machine.run("systemctl", "stop", UNIT_NAME, timeout=60)
    else:
        machine.sh(f"kill -TERM {main_pid}")
        wait_until(
            lambda: machine.show("ActiveState")["ActiveState"] == "inactive", 60, "inactive", logs=machine.journal
        )
    took = time.monotonic() - began
    assert took < STOP_WAIT_S, f"{how} took {took:.1f} s (bound {STOP_WAIT_S} s; TimeoutStopSec= is 30 s)"
    shown = machine.show("ActiveState", "Result", "NRestarts")
    assert shown == {"ActiveState": "inactive", "Result": "success", "NRestarts": "0"}, machine.journal()
    journal = machine.journal()
    assert journal.count(STOP_LINE) == 1, journal
    assert not re.search(r"\b(ERROR|CRITICAL)\b|Traceback|status -15", journal), journal


def test_bad_config_exits_78_and_is_not_restarted(machine: Machine) -> None:
    """A bad config exits 78 naming every problem, and systemd does not restart it."""
    bad = config_text(free_port(), **{"benchmark.sizes": [], "schedule.interval": "soon"})
    machine.install_unit(bad)
    started = machine.run("systemctl", "start", UNIT_NAME, check=False, timeout=60)
    assert started.returncode != 0
    shown = machine.show("ActiveState", "Result", "ExecMainStatus", "RestartUSec")
    assert (shown["ActiveState"], shown["Result"], shown["ExecMainStatus"]) == ("failed", "exit-code", str(EXIT_CONFIG))
    time.sleep(float(shown["RestartUSec"].removesuffix("s")) + 2)  # past RestartSec=: a restart would have come
    after = machine.show("ActiveState", "NRestarts")
    assert after == {"ActiveState": "failed", "NRestarts": "0"}, machine.journal()
    journal = machine.journal()
    # Every problem named once, in one go, without a traceback.
    assert "benchmark.sizes" in journal, journal
    assert "schedule.interval" in journal, journal
    assert "Traceback" not in journal, journal


def test_watchdog_restarts_a_hung_service_however_many_manual_starts_came_before(machine: Machine) -> None:
    """A hung service is restarted by the watchdog, even after several manual starts."""
    # The unit's own start limits; only the watchdog and restart delay shortened, to keep the test short.
    dropin = "[Service]\nWatchdogSec=4s\nRestartSec=1s\n"
    start(machine, config_text(free_port()), dropin)
    machine.run("systemctl", "restart", UNIT_NAME, timeout=60)
    machine.run("systemctl", "restart", UNIT_NAME, timeout=60)  # three manual starts: the old limit's burst
    hung = int(machine.show("MainPID")["MainPID"])
    machine.sh(f"kill -STOP {hung}")

    def restarted() -> bool:
        shown = machine.show("ActiveState", "SubState", "NRestarts", "MainPID")
        return shown["NRestarts"] == "1" and shown["SubState"] == "running" and int(shown["MainPID"]) != hung

    wait_until(restarted, 40, "a watchdog restart", logs=machine.journal)
    journal = machine.journal()
    assert "Watchdog timeout" in journal, journal
    assert "Start request repeated too quickly" not in journal, journal


def test_systemctl_reload_applies_a_valid_config_and_keeps_the_old_one_on_a_bad_one(machine: Machine) -> None:
    """systemctl reload applies a valid config and keeps the old one on a bad one, the process the same."""
    port = free_port()
    main_pid = start(machine, config_text(port))
    base = f"http://127.0.0.1:{port}"

    def reloads(successful: float) -> bool:
        samples = parse(http_get(f"{base}/metrics")[2])
        return samples.get(("matmul_config_last_reload_successful", frozenset())) == successful

    machine.write("/etc/crossover-monitor/config.yaml", config_text(port, **{"benchmark.sizes": [8, 16, 32]}))
    machine.run("systemctl", "reload", UNIT_NAME)  # ExecReload=: SIGHUP to the main process
    wait_until(lambda: "configuration reloaded" in machine.journal(), 30, "the reload", logs=machine.journal)
    assert reloads(1.0)
    machine.write("/etc/crossover-monitor/config.yaml", "benchmark: {sizes: []}\n")
    machine.run("systemctl", "reload", UNIT_NAME)
    wait_until(lambda: reloads(0.0), 30, "a refused reload", logs=machine.journal)
    shown = machine.show("ActiveState", "MainPID", "NRestarts")
    assert shown == {"ActiveState": "active", "MainPID": str(main_pid), "NRestarts": "0"}, machine.journal()
    assert "benchmark.sizes: must not be empty" in machine.journal()


def test_memory_deny_write_execute_is_refused_with_its_reason_not_timed_slowly(machine: Machine) -> None:
    """Under MemoryDenyWriteExecute= the service refuses to time and says why, rather than time slowly."""
    # Under MemoryDenyWriteExecute= TensorFlow ran its CPU products about 4x slower instead of failing:
    # the service now refuses to time and says why, on /readyz and in the sweep's result.
    port = free_port()
    start(machine, config_text(port), "[Service]\nMemoryDenyWriteExecute=yes\n")
    base = f"http://127.0.0.1:{port}"
    status, _, body = http_get(f"{base}/readyz")
    assert status == 503
    assert "memory cannot be mapped writable and executable" in body, body
    assert "MemoryDenyWriteExecute=" in body, body
    wait_until(lambda: "sweep failed" in machine.journal(), 60, "the sweep's result", logs=machine.journal)
    samples = parse(http_get(f"{base}/metrics")[2])
    assert find(samples, "matmul_sweeps_total", result="failed") == {frozenset({("result", "failed")}): 1.0}
    assert not find(samples, "matmul_duration_seconds"), "a timing was published"


def test_sigkill_then_restart_serves_the_last_results_from_the_state_directory(machine: Machine) -> None:
    """Killed with SIGKILL and restarted by systemd: the last results are served at once from the state directory."""
    port = free_port()
    start(machine, config_text(port), "[Service]\nRestartSec=1s\n")
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 180, "the first sweep", logs=machine.journal)
    before = parse(http_get(f"{base}/metrics")[2])
    killed = int(machine.show("MainPID")["MainPID"])
    # The service's own process, as the OOM killer or a crash would end it; systemd then ends the rest of
    # the unit. (`systemctl kill` on the whole unit failed once under load with EIO on "auxiliary
    # processes": a sweep's worker that was exiting at that moment.)
    machine.run("kill", "-KILL", str(killed))

    def restarted() -> bool:
        shown = machine.show("MainPID", "SubState")
        return shown["SubState"] == "running" and int(shown["MainPID"]) not in (0, killed)

    wait_until(restarted, 30, "the restart", logs=machine.journal)
    # Served again at once: ready, the same crossovers, the same last-success time, counters going on.
    wait_until(lambda: http_get(f"{base}/readyz")[0] == 200, 5, "ready after the restart", logs=machine.journal)
    after = parse(http_get(f"{base}/metrics")[2])
    for name in ("matmul_crossover_state", "matmul_sweep_last_success_timestamp_seconds"):
        assert find(after, name) == find(before, name), name
    assert find(after, "matmul_sweeps_total", result="success") == find(before, "matmul_sweeps_total", result="success")
    listed = machine.run(
        "/opt/crossover-monitor/.venv/bin/crossover-monitor", "history", "--directory", "/var/lib/crossover-monitor"
    ).stdout
    assert " sweep " in listed, listed
    assert "success" in listed, listed
    assert "run history: resumed" in machine.journal()


def test_sandbox_holds(machine: Machine) -> None:
    """The sandbox holds: no capabilities, an unprivileged user, read-only system paths, private /tmp, no homes."""
    main_pid = start(machine, config_text(free_port()))
    status = dict(
        line.split(":", 1) for line in machine.run("cat", f"/proc/{main_pid}/status").stdout.splitlines() if ":" in line
    )
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[capabilities], 16) == 0, f"{capabilities}: {status[capabilities]}"
    assert status["NoNewPrivs"].strip() == "1"
    uid = int(status["Uid"].split()[0])
    # DynamicUser= takes a static user of the unit's name where one exists (this tree is the image's,
    # which has crossover-monitor as 10001), else allocates one from systemd's dynamic range.
    static = machine.run("getent", "passwd", "crossover-monitor", check=False).stdout.split(":")
    assert uid == int(static[2]) if len(static) > 2 else uid in DYNAMIC_UIDS, f"runs as uid {uid}"
    assert uid != 0

    def in_service(script: str) -> tuple[int, str]:
        """A shell in the service's own mount namespace (as root: what the unit's mounts allow anyone)."""
        done = machine.run("nsenter", f"--target={main_pid}", "--mount", "sh", "-c", script, check=False)
        return done.returncode, done.stdout + done.stderr

    for path in ("/opt/crossover-monitor/probe", "/etc/probe", "/usr/probe", "/var/probe"):
        code, said = in_service(f"touch {path}")
        assert code != 0, f"{path} is writable in the service's namespace"
        assert "Read-only file system" in said, said
    # A private /tmp: the machine's /tmp and the service's are different directories.
    machine.run("touch", "/tmp/outside-marker")
    code, said = in_service("test ! -e /tmp/outside-marker && touch /tmp/inside-marker && echo private")
    assert (code, said.strip()) == (0, "private"), said
    assert machine.run("test", "-e", "/tmp/inside-marker", check=False).returncode != 0
    # ProtectHome=: home directories empty (and inaccessible to the service's own user).
    machine.sh("mkdir -p /home/someone && touch /root/root-marker /home/someone/home-marker")
    code, said = in_service("ls -AR /root /home")
    assert "marker" not in said, f"home directories visible: {said}"
    assert "someone" not in said, f"home directories visible: {said}"


def test_device_policy_is_enforced(machine: Machine) -> None:
    """DevicePolicy=closed keeps the service's cgroup from opening a device outside DeviceAllow=."""
    start(machine, config_text(free_port()))
    if machine.run("stat", "-fc", "%T", "/sys/fs/cgroup").stdout.strip() != "cgroup2fs":
        pytest.skip("the container has cgroup v1, where systemd does not enforce DevicePolicy=")
    cgroup = f"/sys/fs/cgroup/system.slice/{UNIT_NAME}/cgroup.procs"
    opener = "exec 3</dev/net/tun && echo opened"
    outside = machine.sh(opener, check=False)
    assert outside.stdout.strip() == "opened", f"/dev/net/tun cannot be opened at all here: {outside.stderr}"
    # The same open from a process moved into the service's cgroup: DevicePolicy=closed denies it.
    inside = machine.sh(f"echo $$ > {cgroup} && {opener}", check=False)
    assert inside.returncode != 0, "a device outside DeviceAllow= opened from the service's cgroup"
    assert "Operation not permitted" in inside.stderr, inside.stderr
