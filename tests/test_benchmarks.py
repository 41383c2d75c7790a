"""benchmarks/: its README's tables name every file there, and each maintained tool still runs in its cheapest mode.

The tools measure on GPU machines; these runs only catch a refactor of the service that breaks a tool.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
README = BENCHMARKS / "README.md"
# Tools that import TensorFlow at the top, so even --help takes seconds.
IMPORTS_TENSORFLOW = {"cpu_reference.py", "tf_peer.py"}


def _table(heading: str) -> dict[str, str]:
    """The rows of the table under ``heading``: each file named in the first column, with its last column."""
    section = README.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `"):
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells[-1]
    return rows


TOOLS = _table("## Maintained tools")
FINISHED = _table("## Finished investigations")
RUNNABLE = sorted(name for name, command in TOOLS.items() if name.endswith(".py") and command != "—")


def _run(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_every_file_in_benchmarks_is_in_the_readmes_tables_and_every_entry_exists() -> None:
    """A newcomer reads in the README what each file is for: none unlisted, none listed that is gone."""
    here = {p.name for p in BENCHMARKS.iterdir() if p.is_file() and p.name != "README.md"}
    assert here - TOOLS.keys() == set(), "benchmarks/ files missing from README's 'Maintained tools' tables"
    assert TOOLS.keys() - here == set(), "README names tools that benchmarks/ does not hold"


def test_finished_investigations_are_gone_from_the_tree_and_say_where_git_keeps_them() -> None:
    """A finished script is deleted, and its row gives the git-show command for its last version."""
    assert FINISHED, "no finished investigations listed"
    for name, where in FINISHED.items():
        assert not (BENCHMARKS / name).exists(), f"{name} is finished: fold it into the README and delete it"
        assert re.fullmatch(rf"`git show [0-9a-f]{{7,40}}:benchmarks/{re.escape(name)}`", where), where


@pytest.mark.parametrize(
    "tool",
    [pytest.param(t, marks=pytest.mark.slow) if t in IMPORTS_TENSORFLOW else t for t in RUNNABLE],
)
def test_each_maintained_tool_parses_its_arguments(tool: str) -> None:
    """Every tool still imports what it uses and builds its command line."""
    if tool == "gpu_report.py":  # no options: tests/test_benchmark_tools.py runs it on every recorded result
        return
    result = _run(BENCHMARKS / tool, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.sh")))
def test_each_shell_benchmark_is_valid_bash(script: str) -> None:
    """The disk measurement needs root and podman, the usual-load one a real service for minutes; their syntax
    at least is checked here."""
    result = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_replay_runs_fresh_services_over_a_recorded_sweep_file() -> None:
    """replay.py loads recorded sweeps through today's crossover code and state (its --young-only part, no
    promtool)."""
    sweeps = BENCHMARKS / "results" / "gpu-proof-tensorflow-h200-2026-12-04.jsonl"
    result = _run(BENCHMARKS / "replay.py", "--idle", sweeps, "--young-only", "--young-starts", "3")
    assert result.returncode == 0, result.stderr
    assert re.search(r"young services \(3, first 6 sweeps\): compute next n\* inside \d+/\d+", result.stdout)


def test_config_cases_times_every_hostile_file_and_each_exits_78(tmp_path: Path) -> None:
    """config_cases.py runs check-config on each of issue 9's files; every one is refused with exit 78."""
    out = tmp_path / "cases.md"
    result = _run(BENCHMARKS / "config_cases.py", "--repeats", "1", "--out", out)
    assert result.returncode == 0, result.stderr
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line][1:]
    rows = [row for row in rows if not row.startswith("| empty file")]  # the baseline: process start, exit 0
    assert rows
    assert all(row.rstrip(" |").endswith("78") for row in rows), rows


@pytest.mark.slow
def test_footprint_measures_one_sweep_of_the_fake_backend(tmp_path: Path) -> None:
    """footprint.py starts the real service and reads the daemon's and the worker's cost from /proc."""
    config = tmp_path / "service.yaml"
    config.write_text(
        "schedule: {interval: 1h}\n"
        "benchmark:\n"
        '  backend: "tests.fakes:curve"\n'
        "  sizes: [16, 32]\n"
        "  timing: {size_budget: 100ms, block_time: 2ms, min_blocks: 3}\n"
        "guard: {require_nvml: false}\n"
    )
    out = tmp_path / "footprint.json"
    result = _run(BENCHMARKS / "footprint.py", "--config", config, "--sweeps", "1", "--idle", "0", "--out", out)
    assert result.returncode == 0, result.stderr
    (first,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert first["phase"] == "first-sweep"
    assert first["daemon_rss_mib"] > 0


def test_shared_node_reports_a_recorded_cotenant_run_with_the_host_of_each_sweep() -> None:
    """shared_node.py --report reads a recorded cotenants phase: each shape against the idle range, and what the
    host did in each sweep (the reference, other work, steal), where a host that slowed itself shows."""
    recorded = BENCHMARKS / "results" / "shared-node-pointwise-h100-2026-12-06d.json"
    result = _run(BENCHMARKS / "shared_node.py", "--report", recorded)
    assert result.returncode == 0, result.stderr
    assert "blas1: partial, 17 points published" in result.stdout
    assert "host in the idle sweep: reference 0.584 ms 0.98 other, 1.05 steal" in result.stdout


def test_no_recorded_size_led_against_two_neighbours_that_both_led_clearly() -> None:
    """The margin by which the crossover takes a missing size to lead as its neighbours do (1.35x) stands on
    the recorded sweeps: crossover_gaps.py finds no size there that went against two clearer leads."""
    from crossover_monitor.analysis.crossover import _CLEAR_LEAD  # noqa: PLC0415 - the constant under test

    result = _run(BENCHMARKS / "crossover_gaps.py")
    assert result.returncode == 0, result.stderr
    sweeps = int(result.stdout.split(" recorded sweeps", 1)[0])
    assert sweeps >= 100, result.stdout  # the results folder's sweeps were found and read
    clearest = re.search(r"the clearest shared lead a size went against: ([\d.]+)", result.stdout)
    assert clearest is not None, result.stdout
    assert float(clearest.group(1)) < _CLEAR_LEAD
