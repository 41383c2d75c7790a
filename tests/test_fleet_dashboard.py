"""The fleet dashboard: provisionable beside the node dashboard, narrowed by its variables, reading only what a
fleet's central store holds (the fleet profile and the recorded series of the rules), with answers of a few series
at any fleet size; and every query answered by a real Prometheus that scrapes the fleet profile of a few nodes."""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.metrics import CROSSOVER_LABELS, METRICS, render_state
from crossover_monitor.model import DeviceFailure, ServiceState, SweepResult, Withheld, WithheldReason
from tests.conftest import REPO, free_port
from tests.nodes import BACKEND, node_state
from tests.promql import (
    DASHBOARD,
    FLEET_DASHBOARD,
    SCRAPE_EXAMPLE,
    dashboard_expressions,
    dashboard_panels,
    load_dashboard,
    load_rules,
    metric_names,
    recorded_names,
    rule_files_every,
)
from tests.service import stop_process, wait_until

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FLEET_NAMES = {spec.exposed_name for spec in METRICS.values() if spec.fleet}
# What each series the dashboard may read is labelled with, beyond job, instance and the scrape's own (cluster).
EXPORTED_LABELS = {spec.exposed_name: set(spec.labels) for spec in METRICS.values()}
PEER_SERIES = "instance_gpu:matmul_crossover_size:peer"
PEER_SERIES_LABELS = {*CROSSOVER_LABELS, "name", "driver_version", "framework_version"}  # rules.yml's group_left
ALERTS = "ALERTS"  # Prometheus's own series of the rules' alerts: labelled by each alert's expression
MAX_SERIES = 20  # what a target may answer with, however large the fleet: an aggregation, or a topk/bottomk
PER_SERIES_LABELS = {"instance", "gpu", "cpu", "device"}  # labels of a node's or a GPU's own series
AGGREGATION = re.compile(
    r"(?P<op>sum|count|min|max|avg|quantile|topk|bottomk)\s*(?:by\s*\((?P<by>[^)]*)\)\s*)?\(\s*(?P<k>\d+)?"
)
SELECTOR = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*(?::[A-Za-z0-9_]+)*)(\{[^}]*\})?")


def _peer_group_labels() -> dict[str, set[str]]:
    """The fleet tier's per-peer-group recordings and their labels: the `by` of each rule (no cluster, no node)."""
    found = {}
    for rule in load_rules():
        if rule.get("record", "").startswith("peer:"):
            by = re.search(r"by \(([^)]*)\)", rule["expr"])
            assert by is not None, rule["record"]
            found[rule["record"]] = {label.strip() for label in by.group(1).split(",")} - {"job"}
    return found


PEER_GROUP_LABELS = _peer_group_labels()
SERIES_LABELS = {**EXPORTED_LABELS, PEER_SERIES: PEER_SERIES_LABELS, **PEER_GROUP_LABELS, ALERTS: set()}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_fleet_dashboard()


def load_fleet_dashboard() -> dict[str, Any]:
    return json.loads(FLEET_DASHBOARD.read_text(encoding="utf-8"))


def _variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard["templating"]["list"]}


def _targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dashboard_panels(dashboard):
        for target in panel["targets"]:
            yield panel, target


def _selectors(expr: str) -> Iterator[tuple[str, str | None]]:
    """Each series the expression selects, with its `{...}` (None where it has none); other words are skipped."""
    for match in SELECTOR.finditer(expr):
        name, braces = match.group(1), match.group(2)
        if name in SERIES_LABELS or name in recorded_names() or braces is not None:
            yield name, braces


def test_fleet_dashboard_is_provisionable_beside_the_node_dashboard(dashboard: dict[str, Any]) -> None:
    """No __inputs or ${DS_...}, id null, a fixed uid of its own and the node dashboard's schemaVersion."""
    node = load_dashboard()
    assert "__inputs" not in dashboard
    assert "__requires" not in dashboard
    assert "${DS_" not in FLEET_DASHBOARD.read_text(encoding="utf-8")
    assert dashboard["id"] is None
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert dashboard["uid"] != node["uid"]
    assert dashboard["title"] != node["title"]
    assert dashboard["schemaVersion"] == node["schemaVersion"]


def test_provisioning_and_compose_load_the_whole_dashboards_folder() -> None:
    """The file provider and the compose file take the folder the two dashboards share, not one file."""
    assert FLEET_DASHBOARD.parent == DASHBOARD.parent
    provider = REPO / "grafana" / "provisioning" / "dashboards" / "crossover-monitor.yaml"
    (only,) = yaml.safe_load(provider.read_text(encoding="utf-8"))["providers"]
    assert only["type"] == "file"
    assert not only["options"]["path"].endswith(".json")
    compose = yaml.safe_load((REPO / "deploy" / "container" / "compose.yaml").read_text(encoding="utf-8"))
    mounts = [m for service in compose["services"].values() for m in service.get("volumes", []) if isinstance(m, str)]
    assert f"../../grafana/dashboards:{only['options']['path']}:ro" in mounts


def test_datasource_variable_feeds_every_panel_target_and_variable(dashboard: dict[str, Any]) -> None:
    """A `datasource` variable (type datasource, prometheus) is the data source of every panel, target and query."""
    variables = _variables(dashboard)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel, target in _targets(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert target["datasource"] == DATASOURCE, panel["title"]
    assert all(v["datasource"] == DATASOURCE for v in variables.values() if v["type"] == "query")


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping(dashboard: dict[str, Any]) -> None:
    """Panel ids are unique, every panel lies within the 24-column grid, and no two panels cover the same cell."""
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["w"] > 0
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[x, y]}"
                cells[x, y] = panel["title"]
    assert 8 <= len(list(dashboard_panels(dashboard))) <= 12  # readable


def test_reads_only_fleet_profile_metrics(dashboard: dict[str, Any]) -> None:
    """It selects only metrics /metrics?profile=fleet serves, the rules' recorded series and ALERTS."""
    expressions = dashboard_expressions(dashboard)
    used = metric_names(expressions, recorded_names())
    assert "matmul_device_up" in used
    assert used - FLEET_NAMES == set()
    selected = {name for expr in expressions for name, _ in _selectors(expr)}
    assert selected - FLEET_NAMES - recorded_names() - {ALERTS} == set()


def test_reads_only_recorded_series_that_the_rules_define(dashboard: dict[str, Any]) -> None:
    """Every recorded series (level:metric:operations) it reads is recorded by rules.yml or fleet-rules.yml."""
    used = {m for e in dashboard_expressions(dashboard) for m in re.findall(r"\b[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", e)}
    assert {PEER_SERIES, *PEER_GROUP_LABELS} <= used
    assert used - recorded_names() == set()


def test_filter_variables_are_multi_value_with_an_all_of_any_value(dashboard: dict[str, Any]) -> None:
    """job, cluster, GPU model, dtype and mode: multi-value label_values of fleet metrics, All as .*."""
    # .* also matches a series without the label: a store whose scrape adds no cluster.
    variables = _variables(dashboard)
    expected = {"job": "job", "cluster": "cluster", "model": "name", "dtype": "dtype", "mode": "mode"}
    for name, label in expected.items():
        variable = variables[name]
        assert (variable["type"], variable["multi"], variable["includeAll"]) == ("query", True, True), name
        assert variable["allValue"] == ".*", name
        match = re.fullmatch(r"label_values\((\w+)(\{.*\})?, (\w+)\)", variable["query"])
        assert match is not None, variable["query"]
        assert match.group(1) in FLEET_NAMES
        assert match.group(3) == label
        if name not in {"job", "cluster"}:
            assert 'job=~"$job", cluster=~"$cluster"' in variable["query"], name


def test_every_query_is_narrowed_by_the_variables_where_its_series_has_the_label(dashboard: dict[str, Any]) -> None:
    """Each selector matches $job, $cluster, $dtype, $mode and $model where its series has the label."""
    # The fleet tier's per-peer-group series have no cluster; a device's series without `name` (up, withheld,
    # throughput) is narrowed by $model through a join with matmul_device_info.
    problems = []
    for panel, target in _targets(dashboard):
        where = f"{panel['title']} [{target['refId']}]"
        for name, braces in _selectors(target["expr"]):
            if braces is None:
                problems.append(f"{where}: {name} without a selector")
                continue
            labels = SERIES_LABELS.get(name, set())
            required = ['job=~"$job"', *([] if name in PEER_GROUP_LABELS else ['cluster=~"$cluster"'])]
            required += [f'{label}=~"${label}"' for label in ("dtype", "mode") if label in labels]
            problems += [f"{where}: {name} without {m}" for m in required if m not in braces]
            if "name" in labels and not re.search(r'name[=!]~"\$model"', braces):
                problems.append(f"{where}: {name} not narrowed by $model")
        per_device = any(SERIES_LABELS.get(name, set()) & {"device", "gpu"} for name, _ in _selectors(target["expr"]))
        if per_device and "$model" not in target["expr"]:
            problems.append(f"{where}: per-GPU series not narrowed by $model")
    assert problems == []


def test_every_target_answers_with_a_few_series_at_any_fleet_size(dashboard: dict[str, Any]) -> None:
    """Each target aggregates over nodes and GPUs, keeps at most 20 or reads peer groups; tables are instant."""
    # An instant table: the throughput table's day's median must never be evaluated at every step of a range.
    problems = []
    for panel, target in _targets(dashboard):
        where = f"{panel['title']} [{target['refId']}]"
        expr = target["expr"].strip()
        match = AGGREGATION.match(expr)
        if match is None:
            if {name for name, _ in _selectors(expr)} - set(PEER_GROUP_LABELS):
                problems.append(f"{where}: not aggregated")
            continue
        by = {label.strip() for label in (match["by"] or "").split(",")}
        if by & PER_SERIES_LABELS:
            problems.append(f"{where}: aggregated by {by & PER_SERIES_LABELS}, one series a node or GPU")
        if match["op"] in {"topk", "bottomk"} and int(match["k"]) > MAX_SERIES:
            problems.append(f"{where}: keeps {match['k']}")
        if panel["type"] in {"table", "stat", "bargauge"} and not target["instant"]:
            problems.append(f"{where}: a range query for a {panel['type']}")
    assert problems == []


@pytest.mark.parametrize(
    ("reads", "panel_type"),
    [
        ("matmul_device_up", "stat"),
        ("matmul_device_withheld", "stat"),
        ('ALERTS{alertname=~"Matmul.*", alertstate="firing"', "bargauge"),
        ("quantile by (job, backend, name, driver_version, framework_version, dtype, mode)", "timeseries"),
        ("peer:matmul_crossover_size:count", "table"),
        ("group_left ()\n      last_over_time(peer:matmul_crossover_size:median", "table"),
        ("quantile_over_time(0.5, matmul_largest_size_flops_per_second", "table"),
        ("sum by (result) (increase(matmul_sweeps_total", "timeseries"),
        ("topk(20, time() - matmul_sweep_last_success_timestamp_seconds", "table"),
        ("quantile(0.9, matmul_sweep_worker_cpu_seconds", "timeseries"),
        ("quantile(0.9, matmul_sweep_worker_peak_memory_bytes", "timeseries"),
    ],
)
def test_a_panel_answers_each_fleet_question(dashboard: dict[str, Any], reads: str, panel_type: str) -> None:
    """Down, withheld, alerts, peer n* and spread, outliers, throughput, sweeps, staleness and cost have a panel."""
    types = {p["type"] for p, t in _targets(dashboard) if reads in t["expr"]}
    assert types == {panel_type}


def test_the_spread_panel_draws_the_peer_groups_tenth_median_and_ninetieth(dashboard: dict[str, Any]) -> None:
    """The fleet's n* per peer group over time: its 0.1, 0.5 and 0.9 quantiles over the GPUs' peer series."""
    (panel,) = [p for p in dashboard_panels(dashboard) if p["type"] == "timeseries" and PEER_SERIES in str(p)]
    quantiles = {q for t in panel["targets"] for q in re.findall(r"\(\s*(0\.\d)\s*,", t["expr"])}
    assert quantiles == {"0.1", "0.5", "0.9"}


# --- A real Prometheus over the fleet profile of three nodes ------------------------------------------------------

GPUS = 8
TROUBLED = 2  # the node with everything a fleet operator looks for
FAR = {"compute": 2.0, "end_to_end": 0.4}  # its n* against its peers'


def _troubled(now: float) -> ServiceState:
    """A node whose GPUs' n* are far from their peers' (twice theirs in compute mode, 0.4 of theirs end to end: a
    fleet outlier each way), /GPU:7 down, /GPU:6 withheld as busy, and no successful sweep for 3 hours."""
    state = node_state(GPUS, finished_at=now - 3 * 3600)
    latest = state.latest
    assert latest is not None
    latest = dataclasses.replace(
        latest,
        crossovers=tuple(dataclasses.replace(c, size=c.size * FAR[c.mode]) if c.size else c for c in latest.crossovers),
        failures=(DeviceFailure(backend=BACKEND, device="/GPU:7", reason="CUDA error: an illegal memory access"),),
        withheld=(
            Withheld(backend=BACKEND, device="/GPU:6", reason=WithheldReason.GPU_BUSY, detail="1 other process"),
        ),
    )
    return dataclasses.replace(state, latest=latest)


def _serve(state: ServiceState) -> http.server.ThreadingHTTPServer:
    """A node's /metrics?profile=fleet on a port of its own; any other profile is refused, so the store holds the
    fleet profile alone."""
    body, content_type = render_state(state, "", backend=BACKEND, profile="fleet")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            profile = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("profile")
            self.send_response(200 if profile == ["fleet"] else 400)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body) if profile == ["fleet"] else 0))
            self.end_headers()
            if profile == ["fleet"]:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _prometheus_config(tmp: Path, targets: list[str]) -> Path:
    """The example scrape job asking for the fleet profile every second, and both rule files with every group at the
    1 s global interval (their own 5m would wait minutes for a first evaluation)."""
    (job,) = yaml.safe_load(SCRAPE_EXAMPLE.read_text(encoding="utf-8"))["scrape_configs"]
    job.update(
        scrape_interval="1s", scrape_timeout="1s", params={"profile": ["fleet"]}, static_configs=[{"targets": targets}]
    )
    rule_files = rule_files_every(tmp)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [job],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@dataclass(frozen=True)
class Store:
    """A fleet's central store: a real Prometheus over the nodes' fleet profile, with the shipped rules."""

    url: str
    instances: list[str]  # the nodes', TROUBLED's at its index

    def api(self, path: str, **params: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as answer:  # noqa: S310 - loopback
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result; an error fails the test with Prometheus's message."""
        try:
            return list(self.api("/api/v1/query", query=expr)["result"])
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}\n-> HTTP {exc.code}: {exc.read().decode()}") from None


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    prometheus_binary = shutil.which("prometheus")
    assert prometheus_binary, "prometheus is not installed: scripts/test installs it with Debian's prometheus package"
    tmp = tmp_path_factory.mktemp("fleet-store")
    now = time.time()
    stops: list[Callable[[], object]] = []
    try:
        states = [node_state(GPUS, finished_at=now - 60) for _ in range(TROUBLED)] + [_troubled(now)]
        servers = [_serve(state) for state in states]
        for server in servers:
            stops.append(server.server_close)
            stops.append(server.shutdown)
        instances = [f"127.0.0.1:{server.server_address[1]}" for server in servers]
        port = free_port()
        log = (tmp / "prometheus.log").open("w", encoding="utf-8")
        stops.append(log.close)
        prometheus = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={_prometheus_config(tmp, instances)}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stops.append(lambda: stop_process(prometheus))
        store = Store(f"http://127.0.0.1:{port}", instances)

        def logs() -> str:
            return (tmp / "prometheus.log").read_text(encoding="utf-8")[-3000:]

        def ready() -> bool:
            with urllib.request.urlopen(f"{store.url}/-/ready", timeout=2) as answer:  # noqa: S310 - loopback
                return bool(answer.status == 200)

        wait_until(ready, 30, "Prometheus to be ready", process=prometheus, logs=logs)
        # Two scrapes of every node's counters (for increase()), and the fleet tier's rules over the peer series.
        counters = len(instances) * len(SweepResult)
        wait_until(lambda: len(store.query("increase(matmul_sweeps_total[1m])")) == counters, 30, "two scrapes")
        outlier = 'ALERTS{alertname="MatmulCrossoverFleetOutlier", alertstate="firing"}'
        wait_until(lambda: bool(store.query(outlier)), 60, "the fleet outlier to fire", process=prometheus, logs=logs)
        yield store
    finally:
        for stop in reversed(stops):
            stop()


def _regex_literal(values: list[str]) -> str:
    """A multi-value selection as Grafana writes it into a =~ matcher (its regex escaping, which leaves spaces),
    escaped for a PromQL string."""
    escaped = (re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\" + m.group(0), v) for v in values)
    return "(" + "|".join(escaped).replace("\\", "\\\\") + ")"


def _resolve_variables(store: Store, dashboard: dict[str, Any], **fixed: str) -> dict[str, str]:
    """Each query variable's values as Grafana fetches them (its selector from the values before it), or ``fixed``."""
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        if variable["name"] in fixed:
            values[variable["name"]] = fixed[variable["name"]]
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"])
        assert match is not None, variable["query"]
        found = store.api(f"/api/v1/label/{match.group(2)}/values", **{"match[]": _substitute(match.group(1), values)})
        if not found and variable["name"] == "cluster":  # no cluster label here: Grafana's All
            values["cluster"] = variable["allValue"]
            continue
        assert found, f"variable {variable['name']} offers nothing"
        values[variable["name"]] = _regex_literal(found)
    return values


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in {"$__rate_interval": "1m", **{f"${k}": v for k, v in values.items()}}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def _legend(target: dict[str, Any], metric: dict[str, str]) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m.group(1), ""), target["legendFormat"])


def _answers(store: Store, dashboard: dict[str, Any], values: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Every target's instant answer, by "panel title [refId]"."""
    return {
        f"{panel['title']} [{target['refId']}]": store.query(_substitute(target["expr"], values))
        for panel, target in _targets(dashboard)
    }


@pytest.mark.slow
def test_every_fleet_query_answers_from_a_store_of_the_fleet_profile(store: Store, dashboard: dict[str, Any]) -> None:
    """Over three nodes' fleet profile and both rule files, every target evaluates to data of at most 20 series."""
    # Nothing is allowed empty: the troubled node gives the alerts, down and withheld counts their data. 48 GPU
    # pairs here, so an answer per GPU would break the bound.
    values = _resolve_variables(store, dashboard)
    assert values["model"] == "(NVIDIA H200)"
    answers = _answers(store, dashboard, values)
    assert [where for where, answer in answers.items() if not answer] == []
    assert {where: len(a) for where, a in answers.items() if len(a) > MAX_SERIES} == {}
    assert len(store.query(f"last_over_time({PEER_SERIES}[10m])")) > MAX_SERIES  # so the bound above can fail


@pytest.mark.slow
def test_the_fleet_panels_find_what_was_planted(store: Store, dashboard: dict[str, Any]) -> None:
    """The overview, alerts, outlier (signed) and stale tables find the troubled node; another GPU model gives 0."""
    values = _resolve_variables(store, dashboard)
    answers = _answers(store, dashboard, values)
    overview_panel = next(p for p in dashboard_panels(dashboard) if p["title"].startswith("Fleet now"))
    overview = {
        _legend(target, row["metric"]): float(row["value"][1])
        for target in overview_panel["targets"]
        for row in answers[f"{overview_panel['title']} [{target['refId']}]"]
    }
    assert overview == {
        "nodes reporting": 3,
        "GPUs reporting": 3 * GPUS,
        "devices down": 1,
        "withheld: gpu_busy": 1,
        "stale nodes (no successful sweep for 2h)": 1,
    }
    (alerts,) = [a for where, a in answers.items() if where.startswith("Alerts firing")]
    assert "MatmulCrossoverFleetOutlier" in {row["metric"]["alertname"] for row in alerts}
    (outliers,) = [a for where, a in answers.items() if where.startswith("GPUs furthest")]
    far = {row["metric"]["instance"] for row in outliers if abs(float(row["value"][1])) > 0.5}
    assert far == {store.instances[TROUBLED]}
    differences = {
        row["metric"]["mode"]: float(row["value"][1]) for row in outliers if abs(float(row["value"][1])) > 0.5
    }
    assert differences == pytest.approx({mode: factor - 1 for mode, factor in FAR.items()}, rel=0.01)
    (stale,) = [a for where, a in answers.items() if where.startswith("Stale nodes")]
    oldest = max(stale, key=lambda row: float(row["value"][1]))
    assert oldest["metric"]["instance"] == store.instances[TROUBLED]

    other_model = _resolve_variables(store, dashboard, model="(NVIDIA A100)")
    narrowed = _answers(store, dashboard, other_model)
    counts = {
        _legend(target, row["metric"]): float(row["value"][1])
        for target in overview_panel["targets"]
        for row in narrowed[f"{overview_panel['title']} [{target['refId']}]"]
    }
    assert counts["GPUs reporting"] == counts["devices down"] == counts["withheld: none"] == 0
    assert counts["nodes reporting"] == 3  # a node's series carries no GPU model
    assert [w for w, a in narrowed.items() if a and w.startswith(("GPUs furthest", "Largest size"))] == []
