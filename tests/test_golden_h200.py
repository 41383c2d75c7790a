"""The real-GPU golden scrape: /metrics of the service on an NVIDIA H200 (torch backend, 2026-11-29).

tests/fixtures/h200_torch_metrics.txt was scraped from the running service on the lent H200
(benchmarks/h200_service.yaml). The exporter must still render exactly those samples from the
same data, and the scrape must hold every metric family the contract promises.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from crossover_monitor import metrics
from crossover_monitor.codec import from_data
from crossover_monitor.metrics import EXPOSED_NAMES, build_registry, exposition_type, render
from crossover_monitor.model import (
    CostModel,
    Crossover,
    DeviceInfo,
    Measurement,
    PointKey,
    ServiceState,
    SweepOutcome,
    SweepResult,
)
from tests import builders
from tests.promql import promtool
from tests.service import Samples, find, parse

FIXTURE = Path(__file__).parent / "fixtures" / "h200_torch_metrics.txt"
# Set by the process and the scheduler, not by the sweep's data.
VOLATILE = {"matmul_monitor_build_info", "matmul_sweep_next_timestamp_seconds"}
# Families added after the fixture was recorded (the interference guard, issue 8): absent from it.
ADDED_SINCE_RECORDING = {
    metrics.DEVICE_WITHHELD,
    metrics.DEVICE_MEASURED_AT,
    metrics.CROSSOVER_DERIVED_AT,
    metrics.RETRIES + "_total",
    metrics.GPU_CLOCK_EVENT,
    metrics.SECTION_SUCCESS,  # issue 36
    *(name for name, _ in metrics.HARDWARE_GAUGES),
    metrics.CONFIG_LOADED,  # the reload (issue 10), later still
    metrics.CONFIG_LOADED_AT,
    metrics.WORKER_CPU,  # what a sweep costs the node (issue 35)
    metrics.WORKER_MEMORY,
    metrics.WORKER_CPU_TOTAL + "_total",  # the workers' CPU time by sweeps and retries (issue 55)
    metrics.POINTS_WITHHELD,  # points withheld alone (issue 32)
    metrics.USUAL_OTHER_LOAD,  # the node's usual load (issue 32)
    metrics.LARGEST_FLOPS,  # the fleet profile's throughput (issue 52): held against the curve below
    metrics.DURATION_AT,  # when each point was timed, carried between whole curves (issue 54)
}
# Labels added after it (dcgm-exporter's join keys, issue 19): empty in the data it holds, so dropped here.
LABELS_ADDED_SINCE_RECORDING = {"UUID", "pci_bus_id", "cpu_affinity", "driver_version"}
# Sweep results added after it (issue 32): 0 in the data it holds, so dropped here.
RESULTS_ADDED_SINCE_RECORDING = {("result", SweepResult.PARTIAL.value), ("result", SweepResult.WITHHELD.value)}


@pytest.fixture(scope="module")
def golden() -> Samples:
    return parse(FIXTURE.read_text())


def _labels(key: frozenset[tuple[str, str]]) -> dict[str, str]:
    return dict(key)


def _snapshot_from(samples: Samples) -> ServiceState:
    """The ServiceState that the H200 service held, rebuilt from its scrape through the model's own decoder."""

    def pick(labels: dict[str, str], *names: str) -> dict[str, object]:
        return {name: labels[name] for name in names}

    devices = []
    for key in find(samples, "matmul_device_info"):
        labels = _labels(key)
        details = [[k, labels[k]] for k in ("compute_capability", "threads") if labels.get(k)]
        devices.append(from_data(DeviceInfo, {**pick(labels, "backend", "device", "kind", "name"), "details": details}))
    measurements = []
    for key, median in find(samples, "matmul_duration_seconds").items():
        labels = _labels(key)
        point = from_data(PointKey, {**pick(labels, "backend", "device", "dtype", "mode"), "size": int(labels["size"])})
        # Blocks, calls per block and stop reason are not scraped: the builder's plain ones stand in.
        timing = builders.timing(
            median,
            iqr_s=samples[("matmul_duration_iqr_seconds", key)],
            noisy=samples[("matmul_duration_noisy", key)] == 1,
        )
        measurements.append(Measurement(key=point, timing=timing))
    crossovers = []
    for key, value in find(samples, "matmul_crossover_state").items():
        if value != 1:
            continue
        labels = _labels(key)
        pair = frozenset((k, v) for k, v in key if k != "state")
        bounds = {
            field: samples.get((f"matmul_crossover_{metric}", pair))
            for field, metric in (
                ("size", "size"),
                ("lower", "lower_size"),
                ("upper", "upper_size"),
                ("ci_lower", "ci_lower_size"),
                ("ci_upper", "ci_upper_size"),
            )
        }
        crossovers.append(
            from_data(Crossover, {**pick(labels, "backend", "gpu", "cpu", "dtype", "mode", "state"), **bounds})
        )
    costs = []
    for key, fixed in find(samples, "matmul_fixed_cost_seconds").items():
        labels = _labels(key)
        peak = samples.get(("matmul_peak_flops_per_second", key))
        costs.append(
            from_data(
                CostModel,
                {
                    **pick(labels, "backend", "device", "dtype", "mode"),
                    "fixed_s": fixed,
                    "peak_flops": peak,
                    "largest_size": 4096,
                },
            )
        )
    (bench_key,) = find(samples, "matmul_benchmark_info")
    environment = tuple(sorted((k, v) for k, v in bench_key if k != "backend" and v))
    finished = samples[("matmul_sweep_last_success_timestamp_seconds", frozenset())]
    started = finished - samples[("matmul_sweep_duration_seconds", frozenset())]
    snapshot = builders.snapshot(
        devices,
        measurements,
        started_at=started,
        finished_at=finished,
        crossovers=crossovers,
        costs=tuple(costs),
        environment=environment,
    )
    outcome = SweepOutcome(result=SweepResult.SUCCESS, started_at=started, finished_at=finished, snapshot=snapshot)
    # Results added since the scrape was taken (partial, withheld) count 0 there.
    counts = tuple(
        (r, int(samples.get(("matmul_sweeps_total", frozenset({("result", r.value)})), 0))) for r in SweepResult
    )
    return ServiceState(latest=snapshot, last_success_at=finished, last_outcome=outcome, sweeps=counts)


def test_golden_scrape_passes_promtool() -> None:
    """The real-GPU exposition passes promtool check metrics with no warnings."""
    result = promtool("check", "metrics", stdin=FIXTURE.read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_golden_scrape_has_every_family_of_the_contract(golden: Samples) -> None:
    """With a real GPU every exported family appears, and nothing outside the contract does."""
    names = {name for name, _ in golden}
    assert names == EXPOSED_NAMES - ADDED_SINCE_RECORDING


def test_golden_scrape_found_the_h200_crossovers(golden: Samples) -> None:
    """On the H200 both modes found a crossover inside its bracket and confidence interval."""
    (gpu,) = find(golden, "matmul_device_info", kind="gpu")
    assert _labels(gpu)["name"] == "NVIDIA H200"
    assert _labels(gpu)["compute_capability"] == "9.0"
    for mode in ("compute", "end_to_end"):
        (key,) = find(golden, "matmul_crossover_size", mode=mode)
        size = golden[("matmul_crossover_size", key)]
        assert golden[("matmul_crossover_lower_size", key)] <= size <= golden[("matmul_crossover_upper_size", key)]
        assert (
            golden[("matmul_crossover_ci_lower_size", key)] <= size <= golden[("matmul_crossover_ci_upper_size", key)]
        )


def test_exporter_renders_the_golden_scrape_again(golden: Samples) -> None:
    """The current exporter, fed the same data, renders exactly the H200 service's samples."""
    state = _snapshot_from(golden)
    registry = build_registry(lambda: state, backend="torch")
    body, _ = render(registry, exposition_type(None))
    rendered = {
        (name, frozenset((k, v) for k, v in labels if k not in LABELS_ADDED_SINCE_RECORDING or v)): value
        for (name, labels), value in parse(body.decode()).items()
        if name not in VOLATILE | ADDED_SINCE_RECORDING
        and ("state", "withheld") not in labels
        and not RESULTS_ADDED_SINCE_RECORDING & set(labels)
    }
    expected = {k: v for k, v in golden.items() if k[0] not in VOLATILE}
    assert rendered == expected


def test_the_largest_size_rate_is_the_golden_curves_largest_point(golden: Samples) -> None:
    """matmul_largest_size_flops_per_second, rendered from the H200's data, is the GPU's rate at its largest size."""
    state = _snapshot_from(golden)
    body, _ = render(build_registry(lambda: state, backend="torch"), exposition_type(None))
    largest = find(parse(body.decode()), "matmul_largest_size_flops_per_second")
    assert {(_labels(key)["mode"], _labels(key)["size"]) for key in largest} == {
        ("compute", "4096"),
        ("end_to_end", "4096"),
    }
    for key, value in largest.items():
        assert value == golden[("matmul_flops_per_second", key)]
