"""``node-check`` run as node-problem-detector runs it, against the real service and a real Prometheus in each state."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from crossover_monitor.cli.main import _parse
from crossover_monitor.cli.nodecheck import ALERTS, Check, Status, Verdict, combine, judge_service
from tests.conftest import REPO, free_port
from tests.fakeserver import drip, flood, redirect_to, reply, server, serving
from tests.service import RunningService, fake_config, started_services, stop_process, wait_until

NPD_CONFIGS = sorted((REPO / "deploy" / "node-problem-detector").glob("*.json"))
PROMETHEUS = shutil.which("prometheus")

StartService = Callable[[str], RunningService]


def node_check(*args: str) -> tuple[int, str]:
    """The command's exit status and its standard output, as node-problem-detector reads them."""
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "node-check", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == "", done.stderr  # no traceback, no log line: the message is the first line of stdout
    return done.returncode, done.stdout.strip()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[StartService]:
    with started_services(tmp_path) as start_service:
        yield start_service


# -- the verdicts' rules, on their own (fast) ------------------------------------------------------


def test_a_problem_from_either_source_wins_then_unknown() -> None:
    """Combining verdicts: a problem from either source wins, then unknown, and ok only where both are ok."""
    ok, problem, unknown = (
        Verdict(Status.OK, "ok: /GPU:0 working"),
        Verdict(Status.PROBLEM, "problem: MatmulDeviceDown (/GPU:0)"),
        Verdict(Status.UNKNOWN, "unknown: alerts not read"),
    )
    assert combine(ok, problem) == problem
    assert combine(unknown, problem) == problem
    assert combine(ok, unknown) == unknown
    assert combine(ok, Verdict(Status.OK, "no alert")).status is Status.OK


@pytest.mark.parametrize("path", NPD_CONFIGS, ids=lambda p: p.name)
def test_the_node_problem_detector_config_runs_this_command_for_each_check(path: Path) -> None:
    """Every rule names a condition the config declares, and its arguments are ones node-check accepts."""
    assert len(NPD_CONFIGS) == 2  # on a host, and under Kubernetes
    config = json.loads(path.read_text(encoding="utf-8"))
    assert config["plugin"] == "custom"
    declared = {c["type"] for c in config["conditions"]}
    checks = set()
    for rule in config["rules"]:
        assert rule["type"] == "permanent"
        assert rule["condition"] in declared
        assert rule["path"].endswith("/crossover-monitor")
        args = _parse(rule["args"])
        assert args.command == "node-check"
        checks.add(args.check)
        # The plugin's timeout covers the command's own two requests.
        assert float(rule["timeout"].rstrip("s")) > 2 * float(args.timeout.rstrip("s"))
        # Under Kubernetes node-problem-detector's pod cannot reach the service's: Prometheus alone.
        assert (args.url == "") == path.name.endswith("-kubernetes.json")
        assert args.prometheus_url or args.check == Check.DEGRADED.value
    assert checks == {c.value for c in Check}
    assert config["pluginConfig"]["max_output_length"] >= 160  # room for a GPU's name and the alert


def test_results_left_old_by_failing_sweeps_are_unknown_though_the_next_sweep_is_near() -> None:
    """The scheduler moves the next sweep on past every failed one: staleness is judged on the last success."""
    now = 1_800_000_000.0
    samples = [
        ("matmul_monitor_build_info", {"version": "x"}, 1.0),
        ("matmul_device_info", {"device": "/CPU:0", "kind": "cpu"}, 1.0),
        ("matmul_device_info", {"device": "/GPU:0", "kind": "gpu"}, 1.0),
        ("matmul_device_up", {"device": "/CPU:0"}, 1.0),
        ("matmul_device_up", {"device": "/GPU:0"}, 1.0),
        ("matmul_sweep_last_success_timestamp_seconds", {}, now - 3 * 3600),
        ("matmul_sweep_next_timestamp_seconds", {}, now + 300),
    ]
    assert judge_service(samples, now, None) == Verdict(
        Status.UNKNOWN, "unknown: the latest successful sweep is 3h00m old (allowed 2h00m)"
    )
    assert judge_service(samples, now, 4 * 3600).status is Status.OK
    assert judge_service(samples, now - 3 * 3600 + 60, None).message.startswith("ok: /GPU:0 working, swept ")


_GOOD = {
    "matmul_monitor_build_info": '{version="x"} 1',
    "matmul_device_info": '{device="/CPU:0",kind="cpu"} 1\nmatmul_device_info{device="/GPU:0",kind="gpu"} 1',
    "matmul_device_up": '{device="/CPU:0"} 1\nmatmul_device_up{device="/GPU:0"} 1',
    "matmul_sweep_last_success_timestamp_seconds": " {now}",
}


def _exposition(**replaced: str) -> str:
    series = {**_GOOD, **replaced}
    return "".join(f"{name}{value}\n" for name, value in series.items() if value)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (_exposition(), "ok: /GPU:0 working"),
        (
            _exposition(matmul_device_up='{device="/CPU:0"} 1\nmatmul_device_up{device="/GPU:0"} NaN'),
            "unknown: the service's metrics make no sense: matmul_device_up{device='/GPU:0'} is nan, neither 0 nor 1",
        ),
        (
            _exposition(matmul_device_up='{device="/CPU:0"} 1\nmatmul_device_up{device="/GPU:0"} -1'),
            "unknown: the service's metrics make no sense: matmul_device_up{device='/GPU:0'} is -1, neither 0 nor 1",
        ),
        (
            _exposition(matmul_device_up='{device="/CPU:0"} 1\nmatmul_device_up{gpu="/GPU:0"} 1'),
            "unknown: the service's metrics make no sense: matmul_device_up without a device label",
        ),
        (
            _exposition(matmul_sweep_last_success_timestamp_seconds=" +Inf"),
            "unknown: the service's metrics make no sense: matmul_sweep_last_success_timestamp_seconds is inf",
        ),
        (
            _exposition(matmul_sweep_last_success_timestamp_seconds=" {ten_days_ahead}"),
            "unknown: the latest successful sweep is dated 10d0h in the future",
        ),
        (
            _exposition(matmul_sweep_last_success_timestamp_seconds=" 1e300"),
            "unknown: the latest successful sweep is dated ",
        ),
    ],
)
def test_node_check_on_metrics_no_service_writes_says_unknown_in_plain_words(body: str, said: str) -> None:
    """Issue 34 #10: NaN or -1 for up, a missing device label, non-finite or future times, served by a real
    HTTP server: never "working", never an internal error's wording, one line, exit 2."""
    now = time.time()
    text = body.replace("{now}", f"{now - 60:.0f}").replace("{ten_days_ahead}", f"{now + 10 * 86400 + 30:.0f}")
    with serving(text) as url:
        status, message = node_check("--url", url)
    assert message.startswith(said), message
    assert status == (0 if said.startswith("ok") else 2)
    assert "\n" not in message


def test_node_check_against_a_server_that_drips_floods_or_redirects_stops_at_its_timeout() -> None:
    """Issue 34 #6: one deadline for the whole request and a cap on the body; exit 2 in one line."""
    with server(drip(60)) as dripping, server(flood) as flooding:
        for url, said in (
            (f"{dripping}/metrics", "too slow: no whole answer within 2s"),
            (f"{flooding}/metrics", "too large: more than 16 MiB"),
        ):
            started = time.monotonic()
            status, message = node_check("--url", url, "--timeout", "2s")
            assert status == 2, message
            assert said in message
            assert time.monotonic() - started < 15  # a Python start, then the 2 s
        with server(redirect_to(f"{flooding}/metrics")) as redirect:
            status, message = node_check("--url", f"{redirect}/metrics", "--timeout", "5s")
        assert status == 2
        assert "too large" in message


def test_node_check_names_five_alerts_of_100000_in_one_line_and_reads_a_base_url() -> None:
    """Issue 34 #6 and issue 35: Prometheus answering 100,000 firing alerts gives one short line (it was a
    100 MB first line); the service given by its base URL is read at /metrics."""
    firing = [
        {"metric": {"alertname": "MatmulCrossoverDrift", "gpu": f"/GPU:{i}", "mode": "compute"}, "value": [0, "1"]}
        for i in range(100_000)
    ]
    present = [{"metric": {"__name__": "matmul_monitor_build_info"}, "value": [0, "1"]}]

    def prometheus(handler: http.server.BaseHTTPRequestHandler) -> None:
        result = firing if "ALERTS" in urllib.parse.unquote(handler.path) else present
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        reply(handler, json.dumps(body).encode(), "application/json")

    now = time.time()
    with serving(_exposition().replace("{now}", f"{now - 60:.0f}")) as metrics, server(prometheus) as prom:
        base = metrics.removesuffix("/metrics")
        args = ("--check", "drift", "--prometheus.url", prom, "--instance", "node-1:9437", "--timeout", "20s")
        status, message = node_check("--url", base, *args)
    assert status == 1
    assert message.startswith("problem: MatmulCrossoverDrift (/GPU:0 compute), ")
    assert message.endswith(" and 99995 more")
    assert len(message) < 500


# -- against the real service ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_working_gpu_is_ok_and_a_failing_one_is_a_problem(start: StartService) -> None:
    """Against a running service: a GPU that worked is ok (exit 0), one that failed its sweep a problem (exit 1)."""
    working = start(fake_config("curve"))
    failing = start(fake_config("broken_gpu"))
    working.wait_for_sweeps("success")
    failing.wait_for_sweeps("failed")

    status, message = node_check("--url", f"{working.url}/metrics")
    assert (status, message.split(",")[0]) == (0, "ok: /GPU:0 working")

    status, message = node_check("--url", f"{failing.url}/metrics")
    assert (status, message) == (1, "problem: GPU /GPU:0 failed in the latest sweep")


@pytest.mark.slow
def test_no_service_no_sweep_yet_and_stale_results_are_unknown(start: StartService) -> None:
    """No service, no finished sweep yet, or a last success older than --max-age: unknown (exit 2), saying which."""
    status, message = node_check("--url", f"http://127.0.0.1:{free_port()}/metrics")
    assert status == 2
    assert message.startswith("unknown: crossover-monitor not read: cannot fetch")

    sweeping = start(fake_config("slow", timeout="5m"))  # a second a block: its first sweep is still running
    sweeping.wait_for(lambda: sweeping.get("/metrics")[0] == 200, 30, "the server")
    assert node_check("--url", f"{sweeping.url}/metrics") == (2, "unknown: no sweep has finished yet")

    done = start(fake_config("curve"))
    done.wait_for_sweeps("success")
    time.sleep(2)
    status, message = node_check("--url", f"{done.url}/metrics", "--max-age", "1s")
    assert status == 2
    assert message.startswith("unknown: the latest successful sweep is ")
    assert message.endswith("s old (allowed 1s)")  # seconds, not "0m"


def test_bad_flags_are_unknown_with_the_reason() -> None:
    """A bad flag is unknown (exit 2) with what is wrong, never a traceback."""
    assert node_check("--timeout", "soon") == (
        2,
        "unknown: --timeout must be a duration from 1ms to 1d such as 10s or 2h, got 'soon'",
    )
    assert node_check("--check", "drift") == (2, "unknown: drift is judged by the alert rules; give --prometheus.url")


# -- with a real Prometheus: the alerts for this node --------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus server (the test command installs it)")
def test_the_alerts_firing_for_this_node_are_read_from_prometheus(tmp_path: Path, start: StartService) -> None:
    """A real Prometheus scrapes the real service; a rule standing in for the drift rule's verdict fires at once.

    (The drift rule itself needs a day of history; tests/prometheus/crossover_drift*.yml test when it fires.)
    """
    service = start(fake_config("curve"))
    service.wait_for_sweeps("success")
    instance = f"127.0.0.1:{service.port}"
    rules = tmp_path / "rules.yml"
    rules.write_text(
        textwrap.dedent(
            """
            groups:
              - name: stand-in
                rules:
                  - alert: MatmulCrossoverDrift
                    expr: matmul_crossover_size{mode="end_to_end"} > 0
                  # A CPU down is no GPU condition: the degraded check must not take it for one.
                  - alert: MatmulDeviceDown
                    expr: matmul_device_up{device="/CPU:0"} > 0
            """
        )
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [{"job_name": "crossover-monitor", "static_configs": [{"targets": [instance]}]}],
            }
        )
    )
    port = free_port()
    assert PROMETHEUS is not None
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        query = f"{url}/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%7D"

        def firing() -> bool:
            with urllib.request.urlopen(query, timeout=2) as response:  # noqa: S310 - loopback
                body = response.read().decode()
                return "MatmulCrossoverDrift" in body and "MatmulDeviceDown" in body

        wait_until(firing, 30, "the stand-in alert firing")

        # Prometheus alone (--url empty), as where the service cannot be reached from node-problem-detector.
        status, message = node_check("--check", "drift", "--url", "", "--prometheus.url", url, "--instance", instance)
        assert (status, message) == (1, "problem: MatmulCrossoverDrift (/GPU:0 end_to_end)")
        # The degraded check reads other alerts, and the service's own answer too.
        status, message = node_check("--url", f"{service.url}/metrics", "--prometheus.url", url, "--instance", instance)
        assert status == 0, message
        assert message.endswith("; no " + "/".join(ALERTS[Check.DEGRADED]) + " alert")
        # A wrong instance is not taken for a healthy node.
        status, message = node_check(
            "--check", "drift", "--url", "", "--prometheus.url", url, "--instance", "other-node:9437"
        )
        assert (status, message) == (
            2,
            'unknown: Prometheus has no crossover-monitor series with instance="other-node:9437"',
        )
    finally:
        stop_process(prometheus)
    status, message = node_check("--check", "drift", "--url", "", "--prometheus.url", url, "--instance", instance)
    assert status == 2
    assert message.startswith("unknown: alerts not read: cannot fetch")
