"""The real service scraped by a real Prometheus that loads the shipped rules; every dashboard and rule query runs.

Two services are scraped: the real TensorFlow one (this machine has no GPU, so it exports the CPU and
the explicit `no_gpu` crossover state) and one on the fake known-curve backend of tests/fakes.py, whose
fake GPU gives the GPU-only queries (speed-up, crossover size, fleet join) data to return.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.model import SweepResult
from tests.conftest import free_port
from tests.promql import SCRAPE_EXAMPLE, dashboard_panels, load_dashboard, load_rules, rule_files_every
from tests.service import RunningService, fake_config, stop_process, wait_until

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.slow  # never skipped: a missing prometheus fails (scripts/test installs it)

TENSORFLOW_CONFIG = """
schedule: {interval: 20s}
benchmark:
  sizes: [1, 32, 128, 256]
  timeout: 60s
  timing: {size_budget: 300ms}
# Not a test of the guard: this machine's other load must not withhold the CPU.
guard: {cpu_max_other_cores: 64, reference_max_slowdown: 100, range_max_slowdown: 100, cpu_max_threads_wait: 100}
"""
FAKE_GPU_CONFIG = fake_config(interval="20s")
# What Grafana would put in for its built-in interval variables.
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Panels whose data can only exist where a GPU was measured. The TensorFlow service on this CPU-only
# machine legitimately returns nothing for them (they must still evaluate without error).
GPU_PROCESSES_PANEL = "GPU: other programs' processes, and its timing thread's wait for a CPU, while timed"
GPU_ONLY_PANELS = {
    "Crossover size n* over time",
    "GPU speed-up over time (CPU time / GPU time)",
    GPU_PROCESSES_PANEL,
}
# Read from NVML while a real GPU is timed: empty for the fake GPU too (tests/test_guard.py fakes NVML;
# tests/test_metrics.py renders these families from a recorded hardware context). A whole panel, or one
# query of it ("title [refId]"): the fake GPU's timing thread's wait for a CPU comes from the kernel.
# Empty unless something changed or went wrong (a setting in the last day, an ambiguous sweep, a reload):
# evaluated here without error; the promtool tests (tests/prometheus/setting_changes.yml,
# crossover_drift_ambiguous.yml) give them the change.
CHANGE_ONLY_PANELS = {"Settings changed in the last day"}
# The node's usual load is served once ten sweeps say (tests/test_metrics.py renders it from ten).
CPU_LOAD_PANEL = (
    "CPU: other processes' load (and the node's usual load), the hypervisor's steal and quota throttling while timed"
)
TEN_SWEEPS_PANELS = {f"{CPU_LOAD_PANEL} [D]"}
CHANGE_ONLY_RECORDINGS = {
    "instance:matmul_setting_changed:info",
    "instance:matmul_config_reloaded:timestamp_seconds",
    "instance_gpu:matmul_crossover_timestamp_seconds:ambiguous",
}
NVML_PANELS = {
    "GPU SM clock while timed (lowest / maximum) and time held back by its limits",
    "GPU clock events (throttle reasons) seen while timed",
    "GPU PCIe link while timed, against its maximum",
    "GPU temperature and power peaks while timed",
    f"{GPU_PROCESSES_PANEL} [A]",
    "What a sweep costs the node [C]",  # the GPU memory of the worker's own process, as NVML lists it
}


@dataclass(frozen=True)
class Stack:
    prometheus: str  # base URL
    tensorflow: RunningService
    fake_gpu: RunningService

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; an error status or HTTP error fails the test."""
        try:
            data = self.api("/api/v1/query", query=expr)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}\n-> HTTP {exc.code}: {exc.read().decode()}") from None
        return list(data["result"])


def _prometheus_config(tmp: Path, targets: list[str]) -> Path:
    """The repository's scrape example with the targets rewritten, 1s intervals and the shipped rules, every group at
    the 1s interval (a group's own, 5m, would wait up to 5 minutes for its first evaluation)."""
    example = yaml.safe_load(SCRAPE_EXAMPLE.read_text(encoding="utf-8"))
    (job,) = example["scrape_configs"]
    job.update(scrape_interval="1s", scrape_timeout="1s", static_configs=[{"targets": targets}])
    rule_files = rule_files_every(tmp)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [job],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    started: list[Callable[[], object]] = []
    try:
        tensorflow = RunningService(tmp_path_factory.mktemp("tensorflow"), TENSORFLOW_CONFIG)
        started.append(tensorflow.stop)
        fake_gpu = RunningService(tmp_path_factory.mktemp("fake-gpu"), FAKE_GPU_CONFIG)
        started.append(fake_gpu.stop)
        port = free_port()
        config = _prometheus_config(tmp, [f"127.0.0.1:{tensorflow.port}", f"127.0.0.1:{fake_gpu.port}"])
        log = (tmp / "prometheus.log").open("w")
        started.append(log.close)
        assert PROMETHEUS is not None
        prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(lambda: stop_process(prometheus))
        stack = Stack(f"http://127.0.0.1:{port}", tensorflow, fake_gpu)
        wait_until(lambda: urllib.request.urlopen(f"{stack.prometheus}/-/ready", timeout=2).status == 200, 20, "ready")  # noqa: S310
        # Both services have swept and been scraped, and the rules have run over their data.
        wait_until(lambda: bool(stack.query('matmul_duration_seconds{backend="tensorflow"}')), 45, "TensorFlow timings")
        wait_until(lambda: bool(stack.query("instance_device:matmul_gpu_speedup:ratio")), 30, "the GPU speed-up rule")
        # Two scrapes of each target's counters (one per result), so that increase() has something to compare.
        counters = 2 * len(SweepResult)  # two targets
        wait_until(lambda: len(stack.query("increase(matmul_sweeps_total[1m])")) == counters, 10, "two scrapes")
        yield stack
    finally:
        for stop in reversed(started):
            stop()


def _regex_literal(values: list[str]) -> str:
    """A multi-value selection as Grafana writes it into a =~ matcher, escaped for a PromQL string."""
    return "(" + "|".join(re.escape(v) for v in values).replace("\\", "\\\\") + ")"


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **{f"${k}": v for k, v in values.items()}}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr.replace("$1", ""), f"unsubstituted variable in {expr}"
    return expr


def _resolve_variables(stack: Stack, instance: str) -> dict[str, str]:
    """Each query variable's values as Grafana would fetch them, with `instance` fixed to one target."""
    values: dict[str, str] = {"instance": _regex_literal([instance])}
    for variable in load_dashboard()["templating"]["list"]:
        if variable["type"] != "query" or variable["name"] == "instance":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
        assert match is not None, variable["query"]
        selector = _substitute(match.group(1), values)
        found = stack.api(f"/api/v1/label/{match.group(2)}/values", **{"match[]": selector})
        if not found and variable["name"] == "cluster":  # no cluster label here: Grafana's All, .*
            values["cluster"] = variable["allValue"]
            continue
        assert found, f"variable {variable['name']} has no values for {instance}"
        values[variable["name"]] = _regex_literal(found)
    return values


def test_variables_offer_the_gpus_and_no_gpu_state(stack: Stack) -> None:
    """The GPU variable lists the fake /GPU:0 and the TensorFlow service's explicit "none" (state no_gpu)."""
    assert _resolve_variables(stack, f"127.0.0.1:{stack.fake_gpu.port}")["gpu"] == "(/GPU:0)"
    assert _resolve_variables(stack, f"127.0.0.1:{stack.tensorflow.port}")["gpu"] == "(none)"
    states = stack.query('matmul_crossover_state{backend="tensorflow"} == 1')
    assert {s["metric"]["state"] for s in states} == {"no_gpu"}


@pytest.mark.parametrize("target", ["tensorflow", "fake_gpu"])
def test_every_dashboard_query_evaluates_and_returns_data(stack: Stack, target: str) -> None:
    """Every panel query runs without error for each instance, and returns data unless it needs a missing GPU."""
    service: RunningService = getattr(stack, target)
    values = _resolve_variables(stack, f"127.0.0.1:{service.port}")
    empty = [
        f"{panel['title']} [{query['refId']}]"
        for panel in dashboard_panels(load_dashboard())
        for query in panel["targets"]
        if not stack.query(_substitute(query["expr"], values))
    ]
    # On this CPU-only machine the real TensorFlow service has no GPU, so its GPU-only panels are empty;
    # the fake GPU fills every panel but those read from NVML.
    expected_empty = (
        NVML_PANELS | CHANGE_ONLY_PANELS | TEN_SWEEPS_PANELS | (GPU_ONLY_PANELS if target == "tensorflow" else set())
    )
    allowed = {e for e in empty if e in expected_empty or e.split(" [")[0] in expected_empty}
    assert set(empty) <= allowed


def test_latest_sweep_chart_has_each_device_and_mode_and_a_line_at_each_crossover(stack: Stack) -> None:
    """The XY chart's query returns CPU and GPU in both modes, plus two points at n* spanning the curves."""
    (panel,) = [p for p in dashboard_panels(load_dashboard()) if p["type"] == "xychart"]
    values = _resolve_variables(stack, f"127.0.0.1:{stack.fake_gpu.port}")
    rows = stack.query(_substitute(panel["targets"][0]["expr"], values))
    curves = {(r["metric"]["device"], r["metric"]["mode"]) for r in rows}
    assert {("/CPU:0", "compute"), ("/CPU:0", "end_to_end"), ("/GPU:0", "compute"), ("/GPU:0", "end_to_end")} <= curves
    for mode in ("compute", "end_to_end"):
        marks = {
            r["metric"]["edge"]: r for r in rows if r["metric"]["device"] == "n* /GPU:0" and r["metric"]["mode"] == mode
        }
        assert set(marks) == {"bottom", "top"}
        times = [float(r["value"][1]) for r in rows if r["metric"]["mode"] == mode and "edge" not in r["metric"]]
        assert float(marks["bottom"]["value"][1]) == min(times)
        assert float(marks["top"]["value"][1]) == max(times)
        (crossover,) = stack.query(f'matmul_crossover_size{{gpu="/GPU:0", mode="{mode}", backend="fake"}}')
        assert marks["bottom"]["metric"]["size"] == marks["top"]["metric"]["size"]
        assert float(marks["top"]["metric"]["size"]) == pytest.approx(float(crossover["value"][1]))


def test_every_rule_expression_evaluates_and_every_recording_has_data(stack: Stack) -> None:
    """Each rule's expression runs through /api/v1/query; each recorded series exists (the fake GPU feeds them)."""

    def has_data(record: str) -> Callable[[], bool]:
        return lambda: bool(stack.query(record))

    # A rule over data older than this test (``offset 6h``), or over a recording of such a rule, cannot
    # record anything here; the promtool tests (tests/prometheus/) give it that history.
    rules = load_rules()
    history_only: set[str] = set()
    while True:
        more = {
            r["record"]
            for r in rules
            if "record" in r and ("offset" in r["expr"] or any(h in r["expr"] for h in history_only))
        }
        if more == history_only:
            break
        history_only = more
    assert "instance_gpu:matmul_crossover_timestamp_seconds:moved2h" in history_only  # reads the day before 2h
    for rule in rules:
        stack.query(rule["expr"])  # alerts are quiet on healthy services: evaluating without error is the point
        if "record" in rule and rule["record"] not in history_only | CHANGE_ONLY_RECORDINGS:
            record = rule["record"]
            # A rule evaluated between a target's first and second scrape records nothing until the next round.
            wait_until(has_data(record), 5, f"{record} to record something")


def test_rules_are_loaded_and_healthy(stack: Stack) -> None:
    """/api/v1/rules lists every rule of rules.yml and fleet-rules.yml with health ok and no error."""
    expected = {rule.get("record") or rule["alert"] for rule in load_rules()}

    def rules() -> list[dict[str, Any]]:
        return [r for g in stack.api("/api/v1/rules")["groups"] for r in g["rules"]]

    wait_until(lambda: all(r["health"] == "ok" for r in rules()), 10, "every rule evaluated")
    assert {r["name"] for r in rules()} == expected
    assert [r for r in rules() if r.get("lastError")] == []
    assert [r["name"] for r in rules() if r["type"] == "alerting" and r["state"] == "firing"] == []
