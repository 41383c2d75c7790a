"""What the dashboard and rules tests share: the shipped files, their PromQL, and the metric names in it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, tool

RULES = REPO / "deploy" / "prometheus" / "rules.yml"
FLEET_RULES = REPO / "deploy" / "prometheus" / "fleet-rules.yml"  # the fleet tier's: one Prometheus loads both
RULE_FILES = (RULES, FLEET_RULES)
SCRAPE_EXAMPLE = REPO / "deploy" / "prometheus" / "scrape-config.example.yml"
RULE_TESTS = REPO / "tests" / "prometheus"
DASHBOARD = REPO / "grafana" / "dashboards" / "crossover-monitor.json"
FLEET_DASHBOARD = REPO / "grafana" / "dashboards" / "crossover-monitor-fleet.json"  # for a fleet's central store
ALERTS_DOC = REPO / "docs" / "alerts.md"

# A metric name of the exporter, as it appears in an expression.
METRIC_TOKEN = re.compile(r"matmul_[a-z_]+")


def load_groups() -> list[dict[str, Any]]:
    """Every group of deploy/prometheus/rules.yml and fleet-rules.yml, in that order."""
    return [group for path in RULE_FILES for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]]


def rule_files_every(tmp: Path, interval: str | None = None) -> list[Path]:
    """Copies of the shipped rule files in ``tmp`` with every group at ``interval`` (None: the global evaluation
    interval): a test cannot wait minutes for a 5-minute group's first evaluation."""
    copies = []
    for source in RULE_FILES:
        document = yaml.safe_load(source.read_text(encoding="utf-8"))
        for group in document["groups"]:
            group.pop("interval", None)
            if interval is not None:
                group["interval"] = interval
        copies.append(tmp / source.name)
        copies[-1].write_text(yaml.safe_dump(document), encoding="utf-8")
    return copies


def load_rules() -> list[dict[str, Any]]:
    """Every rule of every group in deploy/prometheus/rules.yml and fleet-rules.yml."""
    return [rule for group in load_groups() for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in load_rules() if "record" in rule}


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that queries data, including those nested in collapsed rows."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from (p for p in panel.get("panels", []) if p.get("targets"))
        elif panel.get("targets"):
            yield panel


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of every panel target and every query variable."""
    exprs = [target["expr"] for panel in dashboard_panels(dashboard) for target in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def metric_names(expressions: list[str], recorded: set[str]) -> set[str]:
    """Exporter metric names the expressions read, not counting the recording rules' own names."""
    names: set[str] = set()
    for expr in expressions:
        text = expr
        # Longest first, so that a recorded name containing another one is removed whole.
        for record in sorted(recorded, key=len, reverse=True):
            text = text.replace(record, " ")
        names.update(METRIC_TOKEN.findall(text))
    return names


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def doc_anchors(path: Path) -> set[str]:
    return {
        github_anchor(line.lstrip("#"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.match(r"^#{1,6} ", line)
    }


def promtool(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real promtool on ``args`` (relative paths from the rules' folder), ``stdin`` as its input."""
    return subprocess.run(
        [tool("promtool", "prometheus"), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,  # the longest replays (two days of sweeps) take 5-15 s on the 2-core machine, far longer loaded
        check=False,
        cwd=RULES.parent,
    )
