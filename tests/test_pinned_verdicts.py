"""Today's verdicts on recorded sweeps, pinned: the replay tools of benchmarks/ run over the recordings the repository
keeps, and their reports must match the golden files under tests/golden/verdicts/ to the character.

They replay the guard's rule (each point's idle range, the host reference's figure and allowance, the gate that
others' load opens) and the crossover's derivation over real sweeps from H100 and H200 hosts, so that moving code
(the guard's rule into one place, the package into folders) is shown to change no verdict. A change that means to
change one regenerates them and says why in its commit:

    CROSSOVER_MONITOR_UPDATE_GOLDEN=1 pytest tests/test_pinned_verdicts.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

RESULTS = REPO / "benchmarks" / "results"
GOLDEN = REPO / "tests" / "golden" / "verdicts"
SHARED_NODE_RUNS = sorted(str(path.relative_to(REPO)) for path in RESULTS.glob("shared-node-*.json"))
TOOLS: dict[str, list[str]] = {
    # Each point against its idle range while others use the host, sweep by sweep (issue 32's rule).
    "point_figure": ["benchmarks/point_figure.py", *SHARED_NODE_RUNS],
    "point_figure_all_idle": ["benchmarks/point_figure.py", "--all-idle", *SHARED_NODE_RUNS],
    # The host reference's idle figure and allowance, sweep by sweep.
    "host_figure": ["benchmarks/host_figure.py", *SHARED_NODE_RUNS],
    # Recorded H200 sweeps judged and derived again, laid into the service's state, through the rules: idle, and a
    # planted change of CPU threads.
    "replay": [
        "benchmarks/replay.py",
        "--idle",
        "benchmarks/results/gpu-proof-tensorflow-h200-2026-12-01.jsonl",
        "--planted",
        "benchmarks/results/gpu-proof-torch-planted-busy-h200-2026-12-01.jsonl:planted-2threads",
        "--months",
        "1",
        "--days",
        "2",
        "--plant-day",
        "1",
        "--seed",
        "7",
    ],
}


def _report(name: str, tmp_path: Path) -> str:
    command = [sys.executable, *TOOLS[name]]
    if name == "replay":
        command += ["--out", str(tmp_path / "replay.json")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_there_are_recordings_to_replay() -> None:
    assert len(SHARED_NODE_RUNS) >= 20  # the H100 and H200 runs of issues 32 and 43


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_verdicts_on_recorded_sweeps_are_unchanged(name: str, tmp_path: Path) -> None:
    if name == "replay" and shutil.which("promtool") is None:
        pytest.skip("needs promtool (Debian's prometheus package; the test command installs it)")
    report = _report(name, tmp_path)
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("CROSSOVER_MONITOR_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(report, encoding="utf-8")
    assert report.strip(), "the tool reported nothing"
    assert report == golden.read_text(encoding="utf-8")
