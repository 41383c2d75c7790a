"""The sharded layout's shipped configurations, and `check-federation` on what a global Prometheus federates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossover_monitor.cli.federation import GLOBAL_SERIES, SelectorError, findings, parse_selector
from tests.conftest import REPO
from tests.promql import FLEET_RULES, RULES, promtool

LAYOUT = REPO / "deploy" / "prometheus" / "fleet"
SHARD, GLOBAL = LAYOUT / "shard.yml", LAYOUT / "global.yml"


def _global_with(*selectors: str) -> dict[str, object]:
    job = {"job_name": "federate", "metrics_path": "/federate", "params": {"match[]": list(selectors)}}
    return {"scrape_configs": [job]}


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "check-federation", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize("path", [SHARD, GLOBAL], ids=["shard", "global"])
def test_the_shipped_layout_passes_promtool(path: Path) -> None:
    """`promtool check config` accepts the shard and the global configuration with the rules they load."""
    result = promtool("check", "config", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_shard_scrapes_the_fleet_profile_its_share_and_evaluates_the_node_rules() -> None:
    """The shard keeps the targets whose address hashes to its index, asks for the fleet profile and loads
    rules.yml (not the fleet tier's rules)."""
    config = yaml.safe_load(SHARD.read_text(encoding="utf-8"))
    assert [(SHARD.parent / f).resolve() for f in config["rule_files"]] == [RULES]
    (job,) = config["scrape_configs"]
    assert job["params"] == {"profile": ["fleet"]}
    hashmod, keep = job["relabel_configs"][:2]
    assert (hashmod["action"], hashmod["source_labels"], hashmod["target_label"]) == (
        "hashmod",
        ["__address__"],
        "__tmp_shard",
    )
    assert (keep["action"], keep["source_labels"], keep["regex"]) == ("keep", ["__tmp_shard"], "0")
    assert config["global"]["external_labels"]["shard"] == keep["regex"]


def test_the_global_tier_federates_the_peer_series_alone_and_evaluates_the_fleet_rules() -> None:
    """The global configuration loads fleet-rules.yml and federates only the peer series, keeping the shards' labels;
    `check-federation` says so."""
    config = yaml.safe_load(GLOBAL.read_text(encoding="utf-8"))
    assert [(GLOBAL.parent / f).resolve() for f in config["rule_files"]] == [FLEET_RULES]
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert {parse_selector(s).name_matchers for s in job["params"]["match[]"]} == {(("=", n),) for n in GLOBAL_SERIES}
    done = _check(GLOBAL)
    assert done.returncode == 0, done.stderr
    assert "federates only what the fleet tier reads" in done.stdout


@pytest.mark.parametrize(
    ("selector", "said"),
    [
        ('{job="crossover-monitor"}', "matches every series (no metric name)"),
        ("matmul_duration_seconds", "would federate the per-point curve (matmul_duration_seconds)"),
        ('{__name__=~"matmul_.*"}', "matmul_crossover_lower_size, matmul_crossover_upper_size"),
        ('{__name__=~"instance_device:.*"}', "instance_device:matmul_gpu_speedup:ratio"),
    ],
)
def test_a_global_config_that_would_federate_the_curve_is_refused_naming_it(
    tmp_path: Path, selector: str, said: str
) -> None:
    """Issue 52: a federation job whose match[] can bring the per-point curve (or everything) to the global tier exits
    78 naming the job, the selector and what it would bring."""
    path = tmp_path / "global.yml"
    path.write_text(yaml.safe_dump(_global_with('{__name__="instance_gpu:matmul_crossover_size:peer"}', selector)))
    done = _check(path)
    assert done.returncode == 78
    assert f"error: job federate, match[] {selector}: " in done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_more_than_the_peer_series_is_a_warning_and_a_broken_selector_an_error() -> None:
    """A per-GPU fleet series beside the peer series is allowed but said; a selector that does not parse is an
    error naming it; a federation job without match[] too."""
    (extra,) = findings(_global_with("matmul_crossover_size"))
    assert not extra.error
    assert "also federates matmul_crossover_size" in extra.message
    (broken,) = findings(_global_with('{__name__=~"("}'))
    assert broken.error
    assert "is not a regular expression" in broken.message
    (empty,) = findings({"scrape_configs": [{"job_name": "f", "metrics_path": "/federate"}]})
    assert empty.error
    assert findings({"scrape_configs": [{"job_name": "nodes", "metrics_path": "/metrics"}]}) == []
    with pytest.raises(SelectorError, match="not a series selector"):
        parse_selector("rate(x[5m])")


def test_an_unreadable_file_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    """A file that is not YAML exits 78 with the reason."""
    path = tmp_path / "global.yml"
    path.write_text("scrape_configs: [\n")
    done = _check(path)
    assert done.returncode == 78
    assert str(path) in done.stderr
    assert "Traceback" not in done.stderr
