"""The Grafana dashboard and provisioning files: loadable as-is, with the variables and panels the docs promise."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.metrics import (
    BENCHMARK_INFO,
    BUILD_INFO,
    CPU_OTHER_LOAD,
    CPU_THROTTLED,
    CROSSOVER,
    CROSSOVER_CI_LOWER,
    CROSSOVER_CI_UPPER,
    CROSSOVER_LOWER,
    CROSSOVER_STATE,
    CROSSOVER_UPPER,
    DEVICE_INFO,
    DEVICE_MEASURED_AT,
    DEVICE_UP,
    DEVICE_WITHHELD,
    DURATION,
    EXPOSED_NAMES,
    FIXED_COST,
    FLOPS,
    GPU_CLOCK_EVENT,
    GPU_OTHER_PROCESSES,
    GPU_PCIE_GENERATION,
    GPU_PCIE_GENERATION_MAX,
    GPU_PCIE_WIDTH,
    GPU_PCIE_WIDTH_MAX,
    GPU_POWER_MAX,
    GPU_SM_CLOCK_MAX,
    GPU_SM_CLOCK_MIN,
    GPU_TEMPERATURE_MAX,
    LAST_SUCCESS,
    NEXT_SWEEP,
    PEAK_FLOPS,
    POINTS_WITHHELD,
    RETRIES,
    SWEEP_DURATION,
    SWEEPS,
)
from crossover_monitor.model import CrossoverState, WithheldReason
from tests.conftest import REPO
from tests.promql import (
    DASHBOARD,
    dashboard_expressions,
    dashboard_panels,
    load_dashboard,
    metric_names,
    promtool,
    recorded_names,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PROVISIONING = REPO / "grafana" / "provisioning"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def _panels_reading(dashboard: dict[str, Any], name: str) -> list[dict[str, Any]]:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return [p for p in dashboard_panels(dashboard) if any(pattern.search(t["expr"]) for t in p["targets"])]


def test_dashboard_is_provisionable_as_is(dashboard: dict[str, Any]) -> None:
    """No __inputs or ${DS_...} placeholders, a fixed uid, no database id: provisioning and the sidecar load it."""
    text = DASHBOARD.read_text(encoding="utf-8")
    assert "__inputs" not in dashboard
    assert "__requires" not in dashboard
    assert "${DS_" not in text
    assert dashboard.get("id") is None
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)


def test_datasource_is_a_prometheus_variable_used_by_every_query(dashboard: dict[str, Any]) -> None:
    """A `datasource` variable of type datasource (prometheus) feeds every panel, target and query variable."""
    variables = _variables(dashboard)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard_panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]
    assert all(v["datasource"] == DATASOURCE for v in variables.values() if v["type"] == "query")


def test_filter_variables_come_from_the_exported_labels(dashboard: dict[str, Any]) -> None:
    """instance, gpu (crossover_state's gpu label), dtype and mode are multi-value query variables with All."""
    variables = _variables(dashboard)
    expected = {
        "instance": ("instance", None),
        "gpu": ("gpu", CROSSOVER_STATE),
        "dtype": ("dtype", DURATION),
        "mode": ("mode", DURATION),
    }
    for name, (label, metric) in expected.items():
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        match = re.fullmatch(r"label_values\((\w+)(\{.*\})?, (\w+)\)", variable["query"])
        assert match is not None, variable["query"]
        assert match.group(3) == label
        if metric is not None:
            assert match.group(1) == metric


def test_panels_have_unique_ids_and_fit_the_grid(dashboard: dict[str, Any]) -> None:
    """Panel ids are unique and every panel lies within Grafana's 24-column grid."""
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["w"] > 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_crossover_panel_shows_size_with_its_bracket_over_time(dashboard: dict[str, Any]) -> None:
    """One time series panel plots matmul_crossover_size with its bracket and confidence interval, by $gpu."""
    panels = [p for p in _panels_reading(dashboard, CROSSOVER) if p["type"] == "timeseries" and len(p["targets"]) >= 3]
    assert len(panels) == 1
    exprs = " ".join(t["expr"] for t in panels[0]["targets"])
    assert CROSSOVER_LOWER in exprs
    assert CROSSOVER_UPPER in exprs
    assert CROSSOVER_CI_LOWER in exprs
    assert CROSSOVER_CI_UPPER in exprs
    assert 'gpu=~"$gpu"' in exprs


def test_latest_sweep_is_a_log_log_xy_chart_of_time_against_size(dashboard: dict[str, Any]) -> None:
    """An XY chart over an instant query of durations turns `size` into the numeric x axis, log on both axes."""
    (panel,) = [p for p in _panels_reading(dashboard, DURATION) if p["type"] == "xychart"]
    (target,) = panel["targets"]
    assert target["instant"] is True
    assert target["format"] == "table"
    assert CROSSOVER in target["expr"]  # the crossover marks
    transformations = {t["id"]: t["options"] for t in panel["transformations"]}
    conversions = transformations["convertFieldType"]["conversions"]
    assert {"targetField": "size", "destinationType": "number"} in conversions
    assert {"device", "mode"} <= set(transformations["partitionByValues"]["fields"])
    assert panel["options"]["series"][0]["x"]["matcher"] == {"id": "byName", "options": "size"}
    assert panel["fieldConfig"]["defaults"]["custom"]["scaleDistribution"]["type"] == "log"
    (size_override,) = [
        o for o in panel["fieldConfig"]["overrides"] if o["matcher"] == {"id": "byName", "options": "size"}
    ]
    properties = {p["id"]: p["value"] for p in size_override["properties"]}
    assert properties["custom.scaleDistribution"]["type"] == "log"
    (mark_override,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byRegexp"]
    assert re.fullmatch(mark_override["matcher"]["options"], "gpu-1:9437 n* /GPU:0 float32 compute")
    assert not re.fullmatch(mark_override["matcher"]["options"], "gpu-1:9437 /GPU:0 float32 compute")


def test_speedup_panel_reads_the_recorded_cpu_over_gpu_ratio(dashboard: dict[str, Any]) -> None:
    """The GPU speed-up panel plots the recording rule instance_device:matmul_gpu_speedup:ratio."""
    name = "instance_device:matmul_gpu_speedup:ratio"
    assert name in recorded_names()
    panels = [p for p in dashboard_panels(dashboard) if any(name in t["expr"] for t in p["targets"])]
    assert [p["type"] for p in panels] == ["timeseries"]


@pytest.mark.parametrize(
    ("metric", "panel_types"),
    [
        (FLOPS, {"timeseries"}),
        (FIXED_COST, {"timeseries"}),
        (PEAK_FLOPS, {"timeseries"}),
        (LAST_SUCCESS, {"stat"}),
        (NEXT_SWEEP, {"stat"}),
        (SWEEP_DURATION, {"timeseries"}),
        (SWEEPS + "_total", {"timeseries"}),
        (CROSSOVER_STATE, {"table"}),
        (DEVICE_UP, {"state-timeline", "stat", "table"}),
        (DEVICE_INFO, {"table", "timeseries", "xychart"}),
        (BENCHMARK_INFO, {"table"}),
        (BUILD_INFO, {"table"}),
        (DEVICE_WITHHELD, {"table"}),
        (POINTS_WITHHELD, {"stat"}),
        (DEVICE_MEASURED_AT, {"table", "timeseries"}),
        (RETRIES + "_total", {"timeseries"}),
        (GPU_SM_CLOCK_MIN, {"timeseries"}),
        (GPU_SM_CLOCK_MAX, {"timeseries"}),
        (GPU_CLOCK_EVENT, {"state-timeline"}),
        (GPU_PCIE_GENERATION, {"table"}),
        (GPU_PCIE_GENERATION_MAX, {"table"}),
        (GPU_PCIE_WIDTH, {"table"}),
        (GPU_PCIE_WIDTH_MAX, {"table"}),
        (GPU_TEMPERATURE_MAX, {"timeseries"}),
        (GPU_POWER_MAX, {"timeseries"}),
        (GPU_OTHER_PROCESSES, {"timeseries"}),
        (CPU_OTHER_LOAD, {"timeseries"}),
        (CPU_THROTTLED, {"timeseries"}),
    ],
)
def test_dashboard_has_a_panel_for_each_metric(dashboard: dict[str, Any], metric: str, panel_types: set[str]) -> None:
    """FLOP/s, costs, sweep health, crossover state, device up and info tables each have a panel of the right kind."""
    types = {p["type"] for p in _panels_reading(dashboard, metric)}
    assert types
    assert types <= panel_types


def test_sweep_failures_are_shown_by_result(dashboard: dict[str, Any]) -> None:
    """The sweeps panel splits matmul_sweeps_total by its result label."""
    (panel,) = _panels_reading(dashboard, SWEEPS + "_total")
    assert "result" in panel["targets"][0]["expr"]
    assert "{{result}}" in panel["targets"][0]["legendFormat"]


def test_crossover_state_table_colours_every_state(dashboard: dict[str, Any]) -> None:
    """The state table maps every crossover state, no_gpu and withheld included, to a colour."""
    (panel,) = _panels_reading(dashboard, CROSSOVER_STATE)
    (override,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "state"]
    (mappings,) = [p["value"] for p in override["properties"] if p["id"] == "mappings"]
    assert set(mappings[0]["options"]) == {state.value for state in CrossoverState}


def _row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels laid out under the (expanded) row of that title, up to the next row."""
    panels = dashboard["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    end = next((i for i, p in enumerate(panels) if i > start and p["type"] == "row"), len(panels))
    return panels[start + 1 : end]


def test_shared_node_row_follows_the_crossover_and_reads_the_guard_and_hardware_metrics(
    dashboard: dict[str, Any],
) -> None:
    """Right under the crossover, one row shows the withheld devices and every hardware-context metric."""
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows[:2] == ["Crossover", "Shared node: interference and hardware"]
    exprs = " ".join(t["expr"] for p in _row_panels(dashboard, rows[1]) for t in p["targets"])
    hardware = {
        GPU_SM_CLOCK_MIN,
        GPU_SM_CLOCK_MAX,
        GPU_CLOCK_EVENT,
        GPU_TEMPERATURE_MAX,
        GPU_POWER_MAX,
        GPU_PCIE_GENERATION,
        GPU_PCIE_GENERATION_MAX,
        GPU_PCIE_WIDTH,
        GPU_PCIE_WIDTH_MAX,
        GPU_OTHER_PROCESSES,
        CPU_OTHER_LOAD,
        CPU_THROTTLED,
    }
    for name in {DEVICE_WITHHELD, DEVICE_MEASURED_AT, RETRIES + "_total"} | hardware:
        assert re.search(rf"\b{name}\b", exprs), name
    assert re.search(rf"time\(\) - {DEVICE_MEASURED_AT}\b", exprs)


def test_guard_table_colours_every_withheld_reason(dashboard: dict[str, Any]) -> None:
    """The guard table maps every withheld reason, measured and failed to a colour."""
    (panel,) = _panels_reading(dashboard, DEVICE_WITHHELD)
    (override,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "status"]
    (mappings,) = [p["value"] for p in override["properties"] if p["id"] == "mappings"]
    assert set(mappings[0]["options"]) == {r.value for r in WithheldReason} | {"measured", "failed"}


def test_dashboard_reads_only_exported_metric_names(dashboard: dict[str, Any]) -> None:
    """Every exporter metric the dashboard queries is in crossover_monitor.metrics.EXPOSED_NAMES."""
    used = metric_names(dashboard_expressions(dashboard), recorded_names())
    assert DURATION in used
    assert used - EXPOSED_NAMES == set()


def test_dashboard_reads_only_recording_rules_that_exist(dashboard: dict[str, Any]) -> None:
    """Every recorded series (level:metric:ops) the dashboard queries is defined in deploy/prometheus/rules.yml."""
    used = {
        m for expr in dashboard_expressions(dashboard) for m in re.findall(r"\b[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", expr)
    }
    assert used
    assert used - recorded_names() == set()


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards_folder() -> None:
    """The provisioning files declare a Prometheus data source and a file provider for the dashboards folder."""
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text(encoding="utf-8"))
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"].startswith("http")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "crossover-monitor.yaml").read_text(encoding="utf-8"))
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/")


def test_job_and_cluster_variables_narrow_every_query(dashboard: dict[str, Any]) -> None:
    """Issue 19: job and cluster variables (cluster may be absent: All is .*), chained into instance and every panel."""
    variables = _variables(dashboard)
    for name in ("job", "cluster"):
        assert variables[name]["type"] == "query"
        assert variables[name]["includeAll"] is True
        assert variables[name]["allValue"] == ".*"  # matches series without a cluster label too
    assert 'job=~"$job", cluster=~"$cluster"' in variables["instance"]["query"]
    for panel in dashboard_panels(dashboard):
        for target in panel["targets"]:
            assert 'job=~"$job", cluster=~"$cluster", instance=~"$instance"' in target["expr"], panel["title"]


def test_annotations_mark_a_change_of_versions_or_settings(dashboard: dict[str, Any], tmp_path: Path) -> None:
    """The version annotations' queries, run by promtool over a TensorFlow upgrade, mark it once, then go quiet."""
    queries = [a for a in dashboard["annotations"]["list"] if "expr" in a]
    assert {a["name"] for a in queries} == {"Framework, CUDA or settings changed", "crossover-monitor version changed"}
    (settings,) = [a["expr"] for a in queries if "Framework" in a["name"]]
    expr = settings.replace("$job", ".*").replace("$cluster", ".*").replace("$instance", ".*")
    before = (
        'backend="tensorflow",framework_version="2.20.0",cuda_version="12.5",cudnn_version="9",tf32="false",'
        'cpu_threads="15"'
    )
    after = before.replace("2.20.0", "2.21.0")
    labels = 'job="crossover-monitor",instance="gpu-1:9437"'
    test = {
        "tests": [
            {
                "interval": "5m",
                "input_series": [
                    {"series": f"matmul_benchmark_info{{{labels},{before}}}", "values": "1x23 _x24"},
                    {"series": f"matmul_benchmark_info{{{labels},{after}}}", "values": "_x23 1x24"},
                ],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "1h", "exp_samples": []},  # nothing changed for the last 30m
                    {
                        "expr": expr,
                        "eval_time": "2h5m",  # the upgrade (at 1h55m) is marked
                        "exp_samples": [{"labels": f"matmul_benchmark_info{{{labels},{after}}}", "value": 1}],
                    },
                    {"expr": expr, "eval_time": "3h", "exp_samples": []},  # and only while it is new
                ],
            }
        ]
    }
    path = tmp_path / "annotation_test.yml"
    path.write_text(yaml.safe_dump(test))
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
