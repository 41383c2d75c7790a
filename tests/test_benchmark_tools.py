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

import references  # noqa: E402

RECORDED = sorted(
    path
    for path in (BENCHMARKS / "results").glob("*.json")
    if '"references"' in path.read_text()  # written by the current gpu_reference.py
)


def test_jax_reference_takes_the_tighter_of_profiler_and_host_loop() -> None:
    """At each size the JAX reference keeps the shorter of the profiler's and the host loop's time, and says which."""
    profiled = {128: 53e-6, 8192: 21.27e-3}  # the profiler slows dispatch: long at small n
    host_loop = {64: 40e-6, 128: 36e-6, 8192: 21.71e-3}  # each block's wait: long at large n
    seconds, chosen = references.tighter_bound(profiled, host_loop)
    assert seconds == {64: 40e-6, 128: 36e-6, 8192: 21.27e-3}
    assert chosen == {64: "host loop", 128: "host loop", 8192: "profiler"}


def test_calls_per_block_fill_the_block_within_bounds() -> None:
    """Calls per block fill the block's time, never fewer than one nor more than MAX_CALLS."""
    assert references.calls_per_block(1e-3) == 25
    assert references.calls_per_block(1.0) == 1
    assert references.calls_per_block(1e-9) == references.MAX_CALLS


def test_gpu_reference_results_are_recorded() -> None:
    """benchmarks/results holds at least one gpu_reference result."""
    assert RECORDED, "no gpu_reference results in benchmarks/results"


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda path: path.name)
def test_recorded_report_is_what_its_data_renders_to(recorded: Path) -> None:
    """A report in benchmarks/results says exactly what the JSON beside it holds."""
    rendered = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_report.py"), str(recorded)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert rendered == recorded.with_suffix(".md").read_text()


def kernel_blocks(
    blocks: int, calls: int, kernel_ns: list[float], *, call_gap: float, block_gap: float
) -> list[references.Kernel]:
    """Kernels of back-to-back calls (``kernel_ns`` long each, ``call_gap`` apart), blocks ``block_gap`` apart."""
    kernels: list[references.Kernel] = []
    clock = 0.0
    for _ in range(blocks):
        for _ in range(calls):
            for length in kernel_ns:
                kernels.append((clock, clock + length))
                clock += length + call_gap
        clock += block_gap
    return kernels


def test_kernel_timestamps_give_the_per_call_span_of_each_block() -> None:
    """Kernels in equal blocks give a call's time from each block's span, the host's gaps between blocks left out."""
    # a memset and a GEMM per call, 2 µs apart; the host takes 900 µs to start the next block
    kernels = kernel_blocks(5, 3, [1e3, 2e6], call_gap=2e3, block_gap=9e5)
    seconds, method = references.per_call_from_kernels(kernels, blocks=5, calls=3)
    one_call = 1e3 + 2e3 + 2e6 + 2e3  # memset, gap, GEMM, gap
    assert seconds == pytest.approx((3 * one_call - 2e3) / 3 / 1e9)  # the block ends with its last kernel
    assert method == "block spans, 2 kernel(s) per call"


def test_kernel_timestamps_that_do_not_split_into_equal_blocks_use_the_whole_span() -> None:
    """Kernels that do not split into equal blocks (one lost): a call's time is the whole trace's span per call."""
    kernels = kernel_blocks(5, 3, [2e6], call_gap=2e3, block_gap=9e5)[:-1]  # one kernel lost
    seconds, method = references.per_call_from_kernels(kernels, blocks=5, calls=3)
    assert method == "trace span"
    assert seconds == pytest.approx((kernels[-1][1] - kernels[0][0]) / 1e9 / 15)


def test_a_cheaper_plan_replayed_keeps_what_it_would_have_timed_and_the_full_plan_changes_nothing() -> None:
    """sweep_cost_replay.cut: a point's first visit keeps its first B blocks (at least 3) and its median is read from
    them; a visited point keeps its first K visits (its first visit's median re-read from the blocks kept) and the
    revisits' blocks with them; with no cut the recorded crossovers come back unchanged."""
    import sweep_cost_replay as replay  # noqa: PLC0415 - a script of benchmarks/

    from crossover_monitor.model import StopReason, Timing  # noqa: PLC0415

    once = Timing(
        median_s=3.0,
        iqr_s=0.0,
        blocks=6,
        calls_per_block=1,
        stop_reason=StopReason.CONVERGED,
        noisy=False,
        samples_s=(1.0, 2.0, 9.0, 9.0, 9.0, 9.0),
    )
    assert replay.cut(once, None, 3).median_s == 2.0
    assert replay.cut(once, None, 3).blocks == 3
    assert replay.cut(once, None, 1).blocks == 3  # a point always takes 3
    visited = Timing(
        median_s=5.0,
        iqr_s=0.0,
        blocks=5 + 2 * 3,
        calls_per_block=1,
        stop_reason=StopReason.CONVERGED,
        noisy=False,
        samples_s=(1.0, 1.0, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 8.0, 8.0, 8.0),
        visits_s=(1.0, 5.0, 8.0),
    )
    two = replay.cut(visited, 2, None)
    assert (two.visits_s, two.median_s, two.blocks) == ((1.0, 5.0), 3.0, 8)
    assert replay.cut(visited, 1, None).visits_s == ()
    path = BENCHMARKS / "results" / "gpu-proof-torch-h200-2026-12-03b.jsonl"
    for snapshot in list(replay.idle_sweeps(path))[:2]:
        found, cost = replay.replay(snapshot, None, None)
        assert found == {c.mode: (c.state, c.size) for c in snapshot.crossovers if c.gpu != "none"}
        assert cost > 0


def test_the_focused_replay_carries_far_points_between_whole_curves_and_times_all_of_them_hourly() -> None:
    """sweep_cost_replay.focused: the first sweep (nothing served yet) and the fifth (an hour on at 15 minutes) time
    every point; the three between carry the far ones, costing less, and still find both crossovers."""
    import sweep_cost_replay as replay  # noqa: PLC0415 - a script of benchmarks/

    from crossover_monitor.model import CrossoverState  # noqa: PLC0415

    sweeps = list(replay.idle_sweeps(BENCHMARKS / "results" / "gpu-proof-torch-h200-2026-12-03b.jsonl"))
    rows = replay.focused(sweeps[:6], None)
    whole = [replay.replay(s, None, None)[1] for s in sweeps[:6]]
    assert rows[0][1] == pytest.approx(whole[0])
    assert all(rows[i][1] < 0.9 * whole[i] for i in (1, 2, 3))
    assert rows[4][1] > 0.8 * whole[4]  # every point timed; the refinement's first visits around n* only
    assert all(found[mode][0] is CrossoverState.FOUND for found, _ in rows for mode in ("compute", "end_to_end"))
