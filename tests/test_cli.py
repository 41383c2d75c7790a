"""The command line: version, `once` in both formats, and usage errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossover_monitor import __version__
from crossover_monitor.cli.main import main
from crossover_monitor.model import GPU_PROBLEM, CrossoverState, HardwareContext, SweepOutcome, SweepResult
from crossover_monitor.view.report import render_table
from tests import builders
from tests.conftest import REPO
from tests.service import fake_config

CONFIG = fake_config()


def _once(tmp_path: Path, *flags: str, config: str = CONFIG) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "once", "--config", str(path), *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version."""
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_once_prints_tables_with_speedup_and_crossover(tmp_path: Path) -> None:
    """`once` prints per-device tables with GFLOP/s and GPU speed-up, then the crossovers."""
    result = _once(tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "/GPU:0 (Fake GPU)  float32  compute" in out
    assert "GPU speed-up" in out
    assert "GPU faster from n ≈" in out
    interval = r"; from this sweep's visits, the next sweep's n\* should land in \d+ to \d+ \(95%"
    assert re.search(r"between measured sizes (3[2-9]|4\d) and (4\d|5\d|6[0-4])" + interval, out), out
    assert re.search(r"^ +4\d .*\(refine\)  \d visits$", out, re.MULTILINE), out  # sizes around n* timed in visits
    assert "fixed cost" in out
    assert "(fixed cost)" in out  # the n=1 point, timed though not configured
    # What the host did while the CPU was timed, from the guard's real /proc/stat meter.
    hardware = (
        r"^hardware: /CPU:0: other processes used ≤ \d+\.\d\d cores( \(the hypervisor's steal ≤ \d+\.\d\d\))?"
        r"; the host ran ≤ \d+\.\d\dx its idle reference's time$"
    )
    assert re.search(hardware, out, re.MULTILINE), out
    # Issue 35: what the sweep cost the node, as its worker measured itself.
    cost = re.search(
        r"^what the sweep cost: (\d+\.\d) CPU seconds, peak memory (\d+\.\d\d) GiB \(its worker\)$", out, re.MULTILINE
    )
    assert cost is not None, out
    assert float(cost[1]) > 0
    assert 0.005 < float(cost[2]) < 4  # a Python worker with the fake backend: tens of MiB


def test_once_json_is_machine_readable(tmp_path: Path) -> None:
    """`once --json` prints the outcome with measurements, crossovers and environment."""
    result = _once(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["result"] == "success"
    snapshot = body["snapshot"]
    assert snapshot["environment"]["framework"] == "fake"
    assert {m["key"]["device"] for m in snapshot["measurements"]} == {"/CPU:0", "/GPU:0"}
    assert all(m["flops_per_second"] > 0 for m in snapshot["measurements"])
    assert {c["state"] for c in snapshot["crossovers"]} == {"found"}
    (cpu,) = [h for h in snapshot["hardware"] if h["device"] == "/CPU:0"]
    assert cpu["other_cpu_cores"] >= 0
    assert cpu["cpu_throttled_s"] >= 0
    assert cpu["sm_clock_min_hz"] is None  # a CPU has no GPU readings, and none are made up


def test_once_says_what_a_gpu_looked_like_while_it_was_timed() -> None:
    """A GPU's hardware context (from NVML in production) reads as one line of the table, in the metrics' terms."""
    gpu = HardwareContext(
        backend="torch",
        device="cuda:0",
        sm_clock_min_hz=1.2e9,
        sm_clock_max_hz=1.98e9,
        clock_events=("hw_thermal_slowdown", "sw_power_cap"),
        temperature_max_c=87.0,
        power_max_w=690.4,
        pcie_generation_min=5,
        pcie_width_min=8,
        pcie_generation_max=5,
        pcie_width_max=16,
        other_processes_max=1,
        power_limited_ratio=0.124,
        thermal_limited_ratio=0.0,
    )
    snapshot = builders.snapshot(hardware=(gpu,))
    outcome = SweepOutcome(result=SweepResult.SUCCESS, started_at=0.0, finished_at=1.0, snapshot=snapshot)
    lines = [line for line in render_table(outcome).splitlines() if line.startswith("hardware:")]
    assert lines == [
        (
            "hardware: cuda:0: SM clock ≥ 1200 of 1980 MHz; clock events hw_thermal_slowdown, sw_power_cap; "
            "held back by its power limit 12% of the time timed; ≤ 87 °C; ≤ 690 W; PCIe gen 5 x8 (at best gen 5 x16); "
            "1 other process at most"
        )
    ]


def test_once_says_why_there_is_no_gpu_beside_the_crossovers() -> None:
    """The backend's reason for finding no GPU is one line under the no_gpu crossovers, not among the versions."""
    no_gpu = builders.crossover(CrossoverState.NO_GPU, backend="tensorflow", gpu="none")
    reason = "TensorFlow as installed here is CPU-only, although the NVIDIA driver is loaded: install the cuda extra"
    snapshot = builders.snapshot(crossovers=(no_gpu,), environment=(("framework", "tensorflow"), (GPU_PROBLEM, reason)))
    outcome = SweepOutcome(result=SweepResult.SUCCESS, started_at=0.0, finished_at=1.0, snapshot=snapshot)
    lines = render_table(outcome).splitlines()
    tail = lines[lines.index("crossovers:") :]
    assert tail == [
        "crossovers:",
        "  /CPU:0  float32 compute: no GPU was measured, so there is nothing to compare the CPU with",
        f"no GPU: {reason}",
    ]
    assert "framework: tensorflow" in lines
    assert not [line for line in lines if line.startswith(GPU_PROBLEM)]


def test_once_exits_1_when_the_sweep_fails(tmp_path: Path) -> None:
    """A failed sweep makes `once` exit 1 and say why."""
    result = _once(tmp_path, config=fake_config("crashing"))
    assert result.returncode == 1
    assert "sweep failed" in result.stdout


@pytest.mark.parametrize(
    ("devices", "result", "reason"),
    [
        ("auto", "partial", "measured /CPU:0; /GPU:0 withheld (unguarded): the guard cannot see"),
        ('["/GPU:0"]', "withheld", "nothing measured: /GPU:0 withheld (unguarded): the guard cannot see"),
    ],
)
def test_once_exits_4_and_names_each_device_the_guard_withheld(
    tmp_path: Path, devices: str, result: str, reason: str
) -> None:
    """A sweep the guard withheld a device of is not a success: its result, reason and exit code say so."""
    # The fake GPU has no NVML behind it: with the guard requiring NVML it is withheld as unguarded.
    config = fake_config().replace("require_nvml: false", "require_nvml: true")
    config = config.replace("benchmark:\n", f"benchmark:\n  devices: {devices}\n")
    done = _once(tmp_path, "--json", config=config)
    assert done.returncode == 4, done.stderr
    body = json.loads(done.stdout)
    assert (body["result"], body["reason"][: len(reason)]) == (result, reason), body["reason"]
    table = _once(tmp_path, config=config)
    assert table.returncode == 4
    assert table.stdout.startswith(f"sweep {result} in "), table.stdout
    assert "withheld: /GPU:0 (unguarded): the guard cannot see" in table.stdout


def test_sigterm_stops_once_and_its_worker(tmp_path: Path) -> None:
    """SIGTERM during `once` kills the sweep's worker (its own process group) and exits 130."""
    path = tmp_path / "config.yaml"
    path.write_text(fake_config("slow"))
    process = subprocess.Popen([sys.executable, "-m", "crossover_monitor", "once", "--config", str(path)], cwd=REPO)
    try:
        workers: list[int] = []
        deadline = time.monotonic() + 20
        while not workers and time.monotonic() < deadline:
            time.sleep(0.2)
            found = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True, check=False)
            workers = [int(pid) for pid in found.stdout.split()]
        assert workers, "the worker never started"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 130
        time.sleep(0.5)
        for pid in workers:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        process.kill()


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's exit code 2 for usage errors, distinct from config errors (78)."""
    with pytest.raises(SystemExit) as caught:
        main(["explode"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--log.format", "json", "--log.level", "warn", "config-schema"],
        ["config-schema", "--log.format", "json", "--log.level", "warn"],
        ["config-schema", "--log-format=json", "--log-level=warning"],
    ],
)
def test_log_flags_go_before_or_after_the_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--log.level/--log.format (and the older --log-level/--log-format) are taken anywhere on the line."""
    import logging  # noqa: PLC0415

    assert main(argv) == 0
    assert "properties" in json.loads(capsys.readouterr().out)
    root = logging.getLogger()
    assert root.level == logging.WARNING
    assert type(root.handlers[0].formatter).__name__ == "JsonFormatter"


def test_logfmt_lines_parse_back_to_their_fields() -> None:
    """--log.format logfmt: key=value pairs, values with spaces, quotes or line breaks quoted and escaped."""
    import logging  # noqa: PLC0415

    from crossover_monitor.cli.logs import LogfmtFormatter  # noqa: PLC0415

    record = logging.LogRecord("crossover_monitor", logging.WARNING, __file__, 1, 'sweep "a"\nended', None, None)
    record.device = "/GPU:0"
    record.reason = "busy pid=12 (python)"
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    pairs = {
        key: json.loads(value) if value.startswith('"') else value
        for key, value in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line)
    }
    assert pairs["level"] == "warn"
    assert pairs["source"] == "test_cli.py:1"
    assert pairs["logger"] == "crossover_monitor"
    assert pairs["msg"] == 'sweep "a"\nended'
    assert pairs["device"] == "/GPU:0"
    assert pairs["reason"] == "busy pid=12 (python)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", pairs["time"])


def test_json_lines_use_prometheus_keys_and_text_lines_cannot_be_forged() -> None:
    """Issue 35: JSON logs carry Prometheus's keys (time, level, source, msg); issue 34 #11: a message holding
    a client's text with line breaks stays one line in the text format too (no forged journald line)."""
    import logging  # noqa: PLC0415

    from crossover_monitor.cli.logs import JsonFormatter, TextFormatter  # noqa: PLC0415

    forged = "kubelet said: no\n2026-12-06T00:00:00.00Z ERROR   crossover_monitor.service.daemon: forged"
    record = logging.LogRecord("crossover_monitor.guard", logging.INFO, "/x/guard.py", 7, forged, None, None)
    record.detail = "a\nb"
    body = json.loads(JsonFormatter().format(record))
    assert list(body)[:5] == ["time", "level", "source", "msg", "logger"]
    assert (body["level"], body["source"], body["msg"], body["detail"]) == ("info", "guard.py:7", forged, "a\nb")
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert line.endswith(
        "crossover_monitor.guard: kubelet said: no\\n"
        "2026-12-06T00:00:00.00Z ERROR   crossover_monitor.service.daemon: forged detail=a\\nb"
    )


@pytest.mark.parametrize("spelling", [["--config"], ["--config.file"], []])
def test_check_config_takes_the_file_as_the_other_commands_do(
    spelling: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-config FILE, --config FILE and --config.file FILE all check the file."""
    config = tmp_path / "c.yaml"
    config.write_text("schedule:\n  interval: 10m\n")
    assert main(["check-config", *spelling, str(config)]) == 0
    assert f"{config}: configuration is valid" in capsys.readouterr().out
    config.write_text("schedule:\n  interval: 0s\n")
    assert main(["check-config", *spelling, str(config)]) == 78


@pytest.mark.parametrize("argv", [["check-config"], ["check-config", "a.yaml", "--config", "b.yaml"]])
def test_check_config_needs_the_file_once(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """No file, or two, is a usage error that says how to give it."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "give the file once" in capsys.readouterr().err


def test_listen_address_takes_a_bare_port_and_keeps_its_old_name() -> None:
    """--web.listen-address :PORT listens on every interface; --listen is the same flag."""
    from crossover_monitor.cli.main import _parse, _settings  # noqa: PLC0415

    for flag in ("--web.listen-address", "--listen"):
        settings = _settings(_parse(["run", flag, ":9555"]))
        assert (settings.server.host, settings.server.port) == ("0.0.0.0", 9555)
    settings = _settings(_parse(["run", "--web.listen-address=[::1]:9556"]))
    assert (settings.server.host, settings.server.port) == ("::1", 9556)
