"""The GPU benchmark scripts' own arithmetic, and their recorded reports matching their data.

The scripts run on a GPU machine; what they compute from the timings does not need one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import block_overhead  # noqa: E402
import references  # noqa: E402

RECORDED = sorted(
    path
    for path in (BENCHMARKS / "results").glob("*.json")
    if '"references"' in path.read_text()  # written by the current gpu_reference.py
)


def test_block_fit_separates_the_per_block_cost_from_the_per_call_time() -> None:
    # 900 µs per block, 21.27 ms per call: an 8192² float32 matmul under JAX on an H200
    times = {k: 900e-6 + k * 21.27e-3 for k in block_overhead.CALLS}
    intercept, slope = block_overhead.fit(times)
    assert intercept == pytest.approx(900e-6)
    assert slope == pytest.approx(21.27e-3)


def test_jax_reference_takes_the_tighter_of_profiler_and_host_loop() -> None:
    profiled = {128: 53e-6, 8192: 21.27e-3}  # the profiler slows dispatch: long at small n
    host_loop = {64: 40e-6, 128: 36e-6, 8192: 21.71e-3}  # each block's wait: long at large n
    seconds, chosen = references.tighter_bound(profiled, host_loop)
    assert seconds == {64: 40e-6, 128: 36e-6, 8192: 21.27e-3}
    assert chosen == {64: "host loop", 128: "host loop", 8192: "profiler"}


def test_calls_per_block_fill_the_block_within_bounds() -> None:
    assert references.calls_per_block(1e-3) == 25
    assert references.calls_per_block(1.0) == 1
    assert references.calls_per_block(1e-9) == references.MAX_CALLS


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda path: path.name)
def test_recorded_report_is_what_its_data_renders_to(recorded: Path) -> None:
    """A report in benchmarks/results says exactly what the JSON beside it holds."""
    assert RECORDED, "no gpu_reference results recorded"
    rendered = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_reference.py"), "--render", str(recorded)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert rendered == recorded.with_suffix(".md").read_text()
