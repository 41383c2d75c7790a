"""The `once` table: each GPU's speed-up is taken against the CPU it is paired with."""

from __future__ import annotations

import dataclasses
import io
import json

from crossover_monitor.model import (
    WORKER_CPU_SECONDS,
    WORKER_PEAK_RSS_BYTES,
    DeviceInfo,
    HardwareContext,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.protocol import Started
from crossover_monitor.view.report import Progress, read_json, render_json, render_table
from tests.builders import measurement, point_key, snapshot
from tests.conftest import make_plan

CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
GPU = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
OTHER_CPU = DeviceInfo(backend="other", device="cpu", kind="cpu", name="cpu")


def _rows(table: str, device: str) -> list[str]:
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{device} ("))
    return [line for line in lines[start + 2 :] if line.strip() and line.split()[0].isdigit()][:2]


def test_the_gpu_rows_show_cpu_time_over_gpu_time_and_the_cpu_rows_none() -> None:
    """A GPU row's speed-up is its own backend's CPU time over its time at that size; a CPU row shows none."""
    points = [
        measurement("/CPU:0", 64, 1e-3),
        measurement("/GPU:0", 64, 2.5e-4),
        measurement("/CPU:0", 128, 8e-3),
        measurement("/GPU:0", 128, 1e-3),
        # A CPU of another backend at the same sizes must not stand in for this GPU's CPU.
        measurement("cpu", 64, 1.0, backend="other"),
        measurement("cpu", 128, 1.0, backend="other"),
    ]
    served = snapshot([CPU, GPU, OTHER_CPU], points)
    table = render_table(SweepOutcome(result=SweepResult.SUCCESS, started_at=0.0, finished_at=1.0, snapshot=served))
    assert [row.split()[-1] for row in _rows(table, "/GPU:0")] == ["4.00x", "8.00x"]
    assert [row.split()[-1] for row in _rows(table, "/CPU:0")] == ["-", "-"]


def test_an_older_once_json_with_the_probe_role_is_read_with_the_current_name() -> None:
    """`once --json` files written before the rename (role "probe") still read back, as fixed_cost."""
    fixed_cost = measurement("/GPU:0", 1, 1e-5, role="fixed_cost")
    outcome = SweepOutcome(
        result=SweepResult.SUCCESS,
        started_at=1.0,
        finished_at=2.0,
        snapshot=snapshot((), [fixed_cost], started_at=1.0, finished_at=2.0),
    )
    older = json.loads(render_json(outcome).replace('"role": "fixed_cost"', '"role": "probe"'))
    assert older["snapshot"]["measurements"][0]["role"] == "probe"
    assert read_json(older) == outcome


def test_the_cost_line_names_the_gpu_memory_the_worker_held_on_each_gpu() -> None:
    """What the sweep cost: CPU seconds and peak memory from the worker, and each GPU's memory where NVML saw it."""
    environment = {WORKER_CPU_SECONDS: "12.5", WORKER_PEAK_RSS_BYTES: str(2**30)}
    gpu = HardwareContext(backend="fake", device="/GPU:0", worker_gpu_memory_max_bytes=3 * 2**29)
    served = dataclasses.replace(
        snapshot([CPU, GPU], [measurement("/CPU:0", 64, 1e-3)]),
        environment=tuple(environment.items()),
        hardware=(gpu, HardwareContext(backend="fake", device="/CPU:0")),
    )
    table = render_table(SweepOutcome(result=SweepResult.SUCCESS, started_at=0.0, finished_at=1.0, snapshot=served))
    assert "what the sweep cost: 12.5 CPU seconds, peak memory 1.00 GiB, 1.50 GiB on /GPU:0 (its worker)" in table


def test_progress_counts_a_point_withheld_alone_as_done() -> None:
    """A point timed and then withheld alone (the host slowed it) counts towards the total, as a measured one."""
    plan = make_plan("tests.fakes:curve", sizes=(16, 32), modes=("compute",))
    shown = io.StringIO()
    progress = Progress(plan, shown)
    progress(DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu"))
    slowed = point_key("/GPU:0", 16)
    progress(Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.HOST_SLOWED, detail="1.4x", point=slowed))
    progress(Started(key=point_key("/GPU:0", 32), role="sweep"))
    assert shown.getvalue().endswith("[1/3] timing /GPU:0 n=32 float32 compute")
