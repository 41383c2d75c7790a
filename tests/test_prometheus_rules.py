"""The Prometheus rules and scrape example, checked by the real promtool and against the metric contract."""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.config.settings import DEFAULT_PORT
from crossover_monitor.metrics import EXPOSED_NAMES, METRICS
from tests.promql import (
    ALERTS_DOC,
    RULE_FILES,
    RULE_TESTS,
    SCRAPE_EXAMPLE,
    doc_anchors,
    load_groups,
    load_rules,
    metric_names,
    promtool,
    recorded_names,
)


def _alerts() -> list[dict[str, Any]]:  # as YAML gives them
    return [rule for rule in load_rules() if "alert" in rule]


def _unit_test_files() -> list[Path]:
    return sorted(RULE_TESTS.glob("*.yml"))


# promtool unit-test files whose replay takes more than about 10 s alone on the 2-core machine: `slow`, so that
# the fast loop (-m "not slow") goes without them; the full suite runs them. Most evaluate every 5m, as their
# samples come, and take a few seconds.
SLOW_UNIT_TESTS = frozenset({"setting_changes.yml"})


def _unit_test_params() -> list[Any]:
    return [
        pytest.param(path, id=path.name, marks=[pytest.mark.slow] if path.name in SLOW_UNIT_TESTS else [])
        for path in _unit_test_files()
    ]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_rules_file_passes_promtool_check(path: Path) -> None:
    """`promtool check rules` accepts deploy/prometheus/rules.yml and fleet-rules.yml."""
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_there_are_rule_unit_tests() -> None:
    """tests/prometheus holds the promtool unit tests of the rules (at least nine files), the slow ones among them."""
    assert len(_unit_test_files()) >= 9, "promtool unit tests missing from tests/prometheus"
    assert SLOW_UNIT_TESTS - {path.name for path in _unit_test_files()} == set(), "slow files not in tests/prometheus"


@pytest.fixture(scope="session")
def unit_test_runs(request: pytest.FixtureRequest) -> dict[Path, subprocess.CompletedProcess[str] | Exception]:
    """promtool on every unit-test file this session selected, as many at once as there are cores (the largest
    first): a file deselected (slow, -k) is not run.

    One promtool per file, so that each gets promtool's whole timeout and a failure names its file;
    run side by side, since each is one single-threaded process. A run that raised (promtool missing, past
    its timeout) keeps its exception as that file's result, so that the runs are still made once and each
    file's test fails with its own.
    """
    selected = {
        item.callspec.params["path"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == test_rule_unit_tests_pass_underpromtool.__name__
    }
    files = sorted(
        (path for path in _unit_test_files() if path in selected), key=lambda path: path.stat().st_size, reverse=True
    )
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {path: pool.submit(promtool, "test", "rules", path) for path in files}
    return {path: _result(run) for path, run in runs.items()}


def _result(
    run: concurrent.futures.Future[subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str] | Exception:
    """What a finished run gave: promtool's result, or the exception it raised (anything else propagates)."""
    error = run.exception()
    return error if isinstance(error, Exception) else run.result()


@pytest.mark.parametrize("path", _unit_test_params())
def test_rule_unit_tests_pass_underpromtool(
    path: Path, unit_test_runs: dict[Path, subprocess.CompletedProcess[str] | Exception]
) -> None:
    """`promtool test rules` passes the unit tests of each file in tests/prometheus."""
    result = unit_test_runs[path]
    if isinstance(result, Exception):
        raise result
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == 1, result.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    """Each alert is expected to fire in some promtool test and to stay silent in another."""
    fires: set[str] = set()
    silent: set[str] = set()
    for path in _unit_test_files():
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = {str(rule["alert"]) for rule in _alerts()}
    assert alerts - fires == set(), "alerts never shown firing"
    assert alerts - silent == set(), "alerts never shown staying silent"


def test_scrape_example_is_a_valid_prometheus_config() -> None:
    """The scrape example passes `promtool check config`, scrapes port 9437 every 15–30s and loads the rules."""
    result = promtool("check", "config", SCRAPE_EXAMPLE)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(SCRAPE_EXAMPLE.read_text(encoding="utf-8"))
    assert config["rule_files"] == [path.name for path in RULE_FILES]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "crossover-monitor"
    assert job["scrape_interval"] in {"15s", "20s", "30s"}
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert [t.rsplit(":", 1)[1] for t in targets] == [str(DEFAULT_PORT)]


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda path: path.name)
def test_rules_file_is_plain_prometheus_rule_groups(path: Path) -> None:
    """rules.yml and fleet-rules.yml hold only `groups:` (no Kubernetes wrapper), each with a name and rules."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert list(document) == ["groups"]
    assert all({"name", "rules"} <= set(group) for group in document["groups"])


def test_rules_read_only_exported_metric_names() -> None:
    """Every exporter metric a rule expression reads is in crossover_monitor.metrics.EXPOSED_NAMES."""
    used = metric_names([str(rule["expr"]) for rule in load_rules()], recorded_names())
    assert used, "no metric names found in the rules: the parser is broken"
    assert used - EXPOSED_NAMES == set()


def test_unit_tests_feed_the_rules_only_exported_metric_names() -> None:
    """The input series of the promtool tests are metrics the service really exports, not invented ones."""
    fed = {
        series["series"].split("{", 1)[0]
        for path in _unit_test_files()
        for test in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]
        for series in test["input_series"]
    }
    assert fed
    # dcgm-exporter's series (from its default counters), to prove the join on UUID.
    assert fed - EXPOSED_NAMES == {"DCGM_FI_DEV_XID_ERRORS"}


def test_metric_name_parser_reports_unknown_names_and_skips_recorded_ones() -> None:
    """The name check finds a misspelt metric and ignores names that recording rules define."""
    recorded = {"instance_device:matmul_gpu_speedup:ratio"}
    assert metric_names(['rate(matmul_sweep_total{result="failed"}[5m])'], recorded) == {"matmul_sweep_total"}
    assert metric_names(["instance_device:matmul_gpu_speedup:ratio > 1"], recorded) == set()


# A query an annotation template runs: `printf "<format>" <args> | query` or `query "<expression>"`.
_ANNOTATION_QUERY = re.compile(r'printf\s+"((?:[^"\\]|\\.)*)"[^|}]*\|\s*query|query\s+"((?:[^"\\]|\\.)*)"')
# A selector in it: a metric name (ours, a recorded one or dcgm-exporter's) and what follows it.
_SELECTOR = re.compile(r"\b((?:[a-z_]+:)?(?:matmul_|DCGM_FI_)[A-Za-z_:]+)(\{?)")


def _annotation_queries() -> list[str]:
    return [
        next(text for text in match.groups() if text is not None)
        for alert in _alerts()
        for annotation in alert.get("annotations", {}).values()
        for match in _ANNOTATION_QUERY.finditer(str(annotation))
    ]


def test_annotation_queries_select_one_pair_or_device_on_every_side() -> None:
    """Prometheus expands annotations for every pending and firing alert at every evaluation: a selector without
    matchers there reads every node's series once an alert (quadratic in the fleet; at 1,000 simulated nodes the
    drift alert's annotations took 70 s of a 100 s evaluation). A label-less recorded name (one series) is allowed."""
    queries = _annotation_queries()
    assert len(queries) > 20, "the annotation query parser found too few queries"
    unfiltered = [
        (query, name)
        for query in queries
        for name, brace in _SELECTOR.findall(query)
        if not brace and name != "matmul:runbook_base_url:info"
    ]
    assert unfiltered == []
    assert _SELECTOR.findall('a{x="1"} / matmul_gpu_sm_clock_max_hertz') == [("matmul_gpu_sm_clock_max_hertz", "")]


@pytest.mark.parametrize("alert", _alerts(), ids=lambda rule: str(rule["alert"]))
def test_alert_has_summary_description_and_runbook_section(alert: dict[str, Any]) -> None:
    """Each alert has a summary, a description and a runbook_url: the one base address and an anchor of docs/alerts.md.

    promtool's tests see the rendered link (the base's address, absolute); this checks the template.
    """
    annotations = alert["annotations"]
    assert isinstance(annotations, dict)
    assert annotations["summary"].strip()
    assert annotations["description"].strip()
    anchor = str(alert["alert"]).lower()
    base = (
        '{{ with query "matmul:runbook_base_url:info" }}{{ . | first | label "url" }}{{ else }}docs/alerts.md{{ end }}'
    )
    assert annotations["runbook_url"] == f"{base}#{anchor}"
    assert anchor in doc_anchors(ALERTS_DOC)
    assert alert.get("labels", {}).get("severity") in {"info", "warning", "critical"}


def test_recording_rule_names_follow_level_metric_operations() -> None:
    """Recorded names have the level:metric:operations shape, so they never clash with exported names."""
    for name in recorded_names():
        assert name.count(":") == 2, name
        assert name not in EXPOSED_NAMES


def test_runbook_base_address_is_one_absolute_link_to_the_alerts_doc() -> None:
    """The one place the runbook address is set: an https URL of docs/alerts.md (the promtool tests render it)."""
    (rule,) = [r for r in load_rules() if r.get("record") == "matmul:runbook_base_url:info"]
    (url,) = re.findall(r'"url", "([^"]+)"', str(rule["expr"]))
    assert url.startswith("https://")
    assert url.endswith("/docs/alerts.md")


NAME_TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def later_reads(groups: list[dict[str, Any]]) -> list[str]:
    """Each rule that reads a name its own group records after it, as 'group: rule reads name'."""
    found = []
    for group in groups:
        rules = group["rules"]
        for index, rule in enumerate(rules):
            read = set(NAME_TOKEN.findall(str(rule["expr"])))
            later = {str(r["record"]) for r in rules[index + 1 :] if "record" in r}
            reader = rule.get("record") or rule.get("alert")
            found += [f"{group['name']}: {reader} reads {name}" for name in sorted(read & later)]
    return found


def test_no_rule_reads_a_series_its_group_records_after_it() -> None:
    """Issue 52: a rule that reads one its group evaluates later sees the previous evaluation's value, and none at all
    where the group's interval is past the 5-minute lookback (the ambiguous-sweeps drift alert could then not fire)."""
    assert later_reads(load_groups()) == []
    # The check itself finds such a rule.
    backwards = [{"name": "g", "rules": [{"record": "a:b:c", "expr": "x:y:z + 1"}, {"record": "x:y:z", "expr": "1"}]}]
    assert later_reads(backwards) == ["g: a:b:c reads x:y:z"]


def test_every_metric_an_alert_reads_is_in_the_fleet_profile() -> None:
    """Issue 52: a fleet's store scrapes /metrics?profile=fleet, so every exported metric an alert reads, through the
    recording rules it reads and in its description, must be one the fleet profile serves (or the alert goes quiet
    there: the throughput alert read the whole curve)."""
    rules = load_rules()
    recorded = {str(rule["record"]): str(rule["expr"]) for rule in rules if "record" in rule}

    def read_by(text: str, seen: set[str]) -> set[str]:
        names = metric_names([text], set(recorded))
        for name in set(NAME_TOKEN.findall(text)) & set(recorded) - seen:
            seen.add(name)
            names |= read_by(recorded[name], seen)
        return names

    fleet = {spec.exposed_name for spec in METRICS.values() if spec.fleet}
    for alert in (rule for rule in rules if "alert" in rule):
        text = str(alert["expr"]) + " ".join(str(v) for v in alert.get("annotations", {}).values())
        assert read_by(text, set()) - fleet == set(), alert["alert"]


def _interval_s(group: dict[str, Any]) -> float:
    """A group's interval in seconds (Prometheus's global one, taken as 30 s, where it sets none)."""
    text = str(group.get("interval", "30s"))
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def unguarded_reads(groups: list[dict[str, Any]]) -> list[str]:
    """Each read of a series another group records that is not through last_over_time over more than that group's
    interval, as 'group: rule reads name'."""
    recorder = {str(rule["record"]): group for group in groups for rule in group["rules"] if "record" in rule}
    found = []
    for group in groups:
        for rule in group["rules"]:
            expr = str(rule["expr"])
            for name in sorted(set(NAME_TOKEN.findall(expr)) & set(recorder)):
                other = recorder[name]
                if other is group or (other.get("interval") is None and group.get("interval") is not None):
                    continue  # its own group's, or the global interval's (it is fresher than any slower group's)
                windows = re.findall(rf"last_over_time\({re.escape(name)}(?:{{[^}}]*}})?\[(\d+)([smh])\]\)", expr)
                guarded = (
                    windows
                    and all(float(n) * {"s": 1, "m": 60, "h": 3600}[unit] > _interval_s(other) for n, unit in windows)
                    and len(windows) == expr.count(name)
                )
                if not guarded:
                    found.append(f"{group['name']}: {rule.get('record') or rule.get('alert')} reads {name}")
    return found


def test_a_group_reads_a_slower_groups_series_through_last_over_time() -> None:
    """Issue 52: an alert read a baseline a slower group recorded as an instant vector, older than the 5-minute
    lookback for most of that group's interval; each such read now spans more than that group's interval."""
    assert unguarded_reads(load_groups()) == []
    slow = {"name": "slow", "interval": "15m", "rules": [{"record": "a:b:c", "expr": "1"}]}
    fast = {
        "name": "fast",
        "rules": [{"alert": "A", "expr": "a:b:c > 0"}, {"alert": "B", "expr": "last_over_time(a:b:c[20m]) > 0"}],
    }
    assert unguarded_reads([slow, fast]) == ["fast: A reads a:b:c"]
