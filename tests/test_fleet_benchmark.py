"""benchmarks/fleet.py in its smoke mode: three simulated 8-GPU nodes, their history, a real Prometheus on the rules.

The figures it records come from hundreds of nodes and take minutes a scale; this run only holds that every step
still gives real numbers when the service's exposition or the rules change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="needs the prometheus server and promtool (Debian's prometheus package; the test command installs it)",
    ),
]


def test_smoke_run_measures_every_rule_group_over_three_simulated_nodes(tmp_path: Path) -> None:
    """The smoke run exits 0 with its report, and the report holds real figures: every group evaluated (time > 0, no
    failures), every node scraped with the series the service renders for 8 GPUs, every group's samples read, and
    the planted node's n* moved against the others'."""
    out = tmp_path / "fleet.json"
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "fleet.py"), "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| nodes | series/node |" in result.stdout
    report = json.loads(out.read_text())
    (scale,) = report["scales"]
    measured = scale["measure"]
    assert measured["targets_up"] == 3
    groups = [group["name"] for group in report["rules"]["groups"]]
    assert sorted(key.rsplit(";", 1)[1] for key in measured["groups"]) == sorted(groups)
    for key, group in measured["groups"].items():
        assert group["evaluations"] >= 1, key
        assert group["eval_s_median"] > 0, key
        assert group["evaluation_failures"] == 0, key
        assert measured["samples_read"][key]["samples"] > 0, key
    assert measured["series_per_node"]["min"] == report["series_rendered_8_gpu"] > 0
    assert measured["head_series"] > 3 * report["series_rendered_8_gpu"]  # the recorded series on top
    assert measured["rss_bytes_end"] > 0
    assert report["recorded_not_written"] == []  # every recorded series a rule reads over a range has a history
    moved = measured["planted"]["nstar_over_others"]
    assert set(moved) == {"compute", "end_to_end"}
    assert all(ratio > 1.2 for ratio in moved.values()), moved  # planted x1.4


def test_nodes_go_on_sweeping_while_measured() -> None:
    """A simulated node serves a new sweep every 15 minutes after its history's last (timestamps, success counter and
    a new draw of n*), so that a run measured for longer than two sweep intervals does not turn every node stale."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fleet  # noqa: PLC0415 - the benchmark script, importable only from its folder

    from crossover_monitor import metrics  # noqa: PLC0415

    base, backend = fleet.recorded_state(fleet.DEFAULT_NODE)
    (node,) = fleet.simulate(
        1,
        base=base,
        backend=backend,
        gpus=2,
        profile="fleet",
        ratios=fleet.idle_ratios(fleet.DEFAULT_SPREADS),
        end=1_800_000_000.0,
        history_s=3 * 3600,
        scrape_s=30,
        seed=3,
    )
    last = node.finished[-1]

    def served(t: float) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for name, _, value in metrics.parse_exposition(node.body_at(t).decode()):
            found.setdefault(name, []).append(value)
        return found

    now, later = served(last + 60), served(last + 2 * fleet.SWEEP_S + 60)
    assert now["matmul_sweep_last_success_timestamp_seconds"] == [last]
    assert later["matmul_sweep_last_success_timestamp_seconds"] == [last + 2 * fleet.SWEEP_S]
    assert later["matmul_crossover_timestamp_seconds"] == [
        t + 2 * fleet.SWEEP_S for t in now["matmul_crossover_timestamp_seconds"]
    ]
    assert later["matmul_crossover_size"] != now["matmul_crossover_size"]  # n* drawn again
