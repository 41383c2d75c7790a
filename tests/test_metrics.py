"""The exporter read by value from its own registry, across sweep outcomes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from crossover_monitor.config.settings import BenchmarkSettings, Settings
from crossover_monitor.metrics import (
    EXPOSED_NAMES,
    StateCollector,
    build_registry,
    exposition_type,
    parse_exposition,
    render,
    render_state,
)
from crossover_monitor.model import (
    CostModel,
    DeviceInfo,
    HardwareContext,
    Measurement,
    PointKey,
    Role,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.service.state import StateStore
from tests import builders
from tests.service import parse

CPU = DeviceInfo(backend="tensorflow", device="/CPU:0", kind="cpu", name="cpu", details=(("threads", "4"),))
GPU = DeviceInfo(
    backend="tensorflow", device="/GPU:0", kind="gpu", name="NVIDIA H200", details=(("compute_capability", "9.0"),)
)
POINT = {"backend": "tensorflow", "device": "/GPU:0", "dtype": "float32", "mode": "compute", "size": "1024"}
PAIR = {"backend": "tensorflow", "gpu": "/GPU:0", "cpu": "/CPU:0", "dtype": "float32", "mode": "compute"}


def _snapshot(at: float) -> Snapshot:
    """A sweep ending at ``at``: the GPU's points (swept, fixed-cost n=1, refined), its n* and a cost model."""

    def point(size: int, role: Role = "sweep") -> Measurement:
        return builders.measurement("/GPU:0", size, 2e-3, backend="tensorflow", role=role, iqr_s=1e-4)

    found = builders.crossover(backend="tensorflow", size=300.0, lower=256, upper=512, ci_lower=280.0, ci_upper=330.0)
    return builders.snapshot(
        (CPU, GPU),
        (point(1024), point(1, "fixed_cost"), point(362, "refine")),
        started_at=at - 10,
        finished_at=at,
        crossovers=(found,),
        costs=(
            CostModel(
                backend="tensorflow",
                device="/GPU:0",
                dtype="float32",
                mode="compute",
                fixed_s=2e-5,
                peak_flops=5e14,
                largest_size=1024,
            ),
        ),
        environment=(("framework_version", "2.21.0"), ("tf32", "false")),
    )


def _registry(store: StateStore):
    return build_registry(store.read, backend="tensorflow")


def test_nothing_but_counters_and_build_info_before_the_first_sweep() -> None:
    """Before any sweep: zero counters, build info (no framework version: no worker has reported one), and no
    timings, devices or crossovers."""
    registry = _registry(StateStore())
    assert registry.get_sample_value("matmul_sweeps_total", {"result": "success"}) == 0
    assert (
        registry.get_sample_value(
            "matmul_monitor_build_info",
            {
                "version": "0.1.0",
                "python_version": __import__("platform").python_version(),
                "backend": "tensorflow",
                "framework_version": "",
            },
        )
        == 1
    )
    assert registry.get_sample_value("matmul_duration_seconds", POINT) is None
    assert registry.get_sample_value("matmul_sweep_last_success_timestamp_seconds") is None


def test_build_info_shows_the_framework_version_the_latest_sweep_ran_with() -> None:
    """The build info's framework version is the latest worker's, so a framework upgraded under a running service
    shows at its next sweep, without a restart."""
    store = StateStore()
    registry = _registry(store)

    def build_version() -> str | None:
        samples = (s for family in registry.collect() for s in family.samples)
        return next((s.labels["framework_version"] for s in samples if s.name == "matmul_monitor_build_info"), None)

    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=_snapshot(100)))
    assert build_version() == "2.21.0"
    upgraded = dataclasses.replace(_snapshot(200), environment=(("framework_version", "2.22.0"), ("tf32", "false")))
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=190, finished_at=200, snapshot=upgraded))
    assert build_version() == "2.22.0"


def test_successful_sweep_exports_timings_crossover_and_bracket() -> None:
    """A success exports median, IQR, FLOP/s, crossover with bracket, state, up and timestamps."""
    store = StateStore()
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=_snapshot(100)))
    registry = _registry(store)
    assert registry.get_sample_value("matmul_duration_seconds", POINT) == 2e-3
    assert registry.get_sample_value("matmul_duration_iqr_seconds", POINT) == 1e-4
    assert registry.get_sample_value("matmul_flops_per_second", POINT) == 2 * 1024**3 / 2e-3
    assert registry.get_sample_value("matmul_crossover_size", PAIR) == 300
    assert registry.get_sample_value("matmul_crossover_lower_size", PAIR) == 256
    assert registry.get_sample_value("matmul_crossover_upper_size", PAIR) == 512
    assert registry.get_sample_value("matmul_crossover_ci_lower_size", PAIR) == 280
    assert registry.get_sample_value("matmul_crossover_ci_upper_size", PAIR) == 330
    assert registry.get_sample_value("matmul_crossover_state", {**PAIR, "state": "found"}) == 1
    assert registry.get_sample_value("matmul_crossover_state", {**PAIR, "state": "ambiguous"}) == 0
    assert registry.get_sample_value("matmul_device_up", {"backend": "tensorflow", "device": "/GPU:0"}) == 1
    assert registry.get_sample_value("matmul_sweep_last_success_timestamp_seconds") == 100
    assert registry.get_sample_value("matmul_sweep_duration_seconds") == 10
    assert registry.get_sample_value("matmul_sweeps_total", {"result": "success"}) == 1


def test_fixed_cost_and_peak_rate_are_exported_but_fixed_cost_and_refined_sizes_are_not_series() -> None:
    """The cost model is exported per device; n=1 and refined sizes never become series."""
    store = StateStore()
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=_snapshot(100)))
    registry = _registry(store)
    cost_labels = {"backend": "tensorflow", "device": "/GPU:0", "dtype": "float32", "mode": "compute"}
    assert registry.get_sample_value("matmul_fixed_cost_seconds", cost_labels) == 2e-5
    assert registry.get_sample_value("matmul_peak_flops_per_second", cost_labels) == 5e14
    assert registry.get_sample_value("matmul_duration_seconds", {**POINT, "size": "1"}) is None
    assert registry.get_sample_value("matmul_duration_seconds", {**POINT, "size": "362"}) is None


def test_timeout_after_success_keeps_last_good_timings_and_marks_devices_down() -> None:
    """A timed-out sweep keeps serving the last good results, counts the timeout, and sets up to 0."""
    store = StateStore()
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=_snapshot(100)))
    store.record(SweepOutcome(result=SweepResult.TIMEOUT, started_at=200, finished_at=260, reason="deadline"))
    registry = _registry(store)
    assert registry.get_sample_value("matmul_duration_seconds", POINT) == 2e-3
    assert registry.get_sample_value("matmul_sweeps_total", {"result": "timeout"}) == 1
    assert registry.get_sample_value("matmul_sweep_last_success_timestamp_seconds") == 100
    assert registry.get_sample_value("matmul_sweep_duration_seconds") == 60
    assert registry.get_sample_value("matmul_device_up", {"backend": "tensorflow", "device": "/GPU:0"}) == 0


def test_skipped_sweeps_are_counted() -> None:
    """A run skipped because the previous one still runs is counted under result=skipped."""
    store = StateStore()
    store.record_skipped("previous sweep still running")
    store.record_skipped("run missed")
    assert _registry(store).get_sample_value("matmul_sweeps_total", {"result": "skipped"}) == 2


def test_exposed_names_cover_every_family_rendered() -> None:
    """EXPOSED_NAMES (used by the dashboard and rules tests) lists every name a full scrape contains."""
    store = StateStore()
    snapshot = _snapshot(100)
    busy = DeviceInfo(backend="tensorflow", device="/GPU:1", kind="gpu", name="NVIDIA H200")
    snapshot = dataclasses.replace(
        snapshot,
        devices=(*snapshot.devices, busy),
        crossovers=tuple(dataclasses.replace(c, derived_at=100) for c in snapshot.crossovers),
        withheld=(
            Withheld(backend="tensorflow", device="/GPU:1", reason=WithheldReason.GPU_BUSY, detail="pid 7"),
            Withheld(
                backend="tensorflow",
                device="/GPU:0",
                reason=WithheldReason.HOST_SLOWED,
                detail="the host ran 1.3x slower",
                point=PointKey(backend="tensorflow", device="/GPU:0", dtype="float32", mode="compute", size=64),
            ),
        ),
        environment=(*snapshot.environment, ("worker_cpu_s", "61.5"), ("worker_peak_rss_bytes", "1932735283")),
        hardware=(
            HardwareContext(
                backend="tensorflow",
                device="/GPU:0",
                sm_clock_min_hz=1.9e9,
                sm_clock_max_hz=1.98e9,
                clock_events=("sw_power_cap",),
                temperature_max_c=60,
                power_max_w=500,
                pcie_generation_min=5,
                pcie_width_min=16,
                pcie_generation_max=5,
                pcie_width_max=16,
                other_processes_max=0,
                power_limited_ratio=0.02,
                thermal_limited_ratio=0.0,
                host_wait_ratio=0.004,
                host_slowdown_max=1.03,
                worker_gpu_memory_max_bytes=1_250_000_000,
            ),
            HardwareContext(
                backend="tensorflow",
                device="/CPU:0",
                other_cpu_cores=0.1,
                cpu_throttled_s=0.0,
                cpu_steal_cores=0.05,
                cpu_blocks_set_aside_ratio=0.02,
            ),
        ),
    )
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=snapshot))
    store.record_config(Settings(benchmark=BenchmarkSettings(sizes=(1024,), modes=("compute",))), at=80)
    body, content_type = render(_registry(store), exposition_type(None))
    assert content_type.startswith("text/plain")
    names = {name for name, _ in parse(body.decode())}
    assert names <= EXPOSED_NAMES
    # The next sweep needs a scheduler; the node's usual load, ten sweeps.
    assert EXPOSED_NAMES - names == {"matmul_sweep_next_timestamp_seconds", "matmul_host_usual_other_load_cores"}


@pytest.mark.parametrize(
    ("loads", "served"),
    [
        ((), None),
        ((1.5,) * 9, None),  # nine sweeps: a neighbour at the start is not yet the node's usual load (no zero either)
        ((0.3, *[1.5] * 9), 1.5),  # what nine sweeps of ten reached: the load the guard now takes as usual
        ((0.3, 0.3, *[1.5] * 8), 0.3),
    ],
)
def test_the_usual_load_is_served_once_ten_sweeps_say(loads: tuple[float, ...], served: float | None) -> None:
    state = ServiceState(others_typical=loads)
    body, _ = render_state(state, exposition_type(None), backend="torch")
    found = [
        value for name, _, value in parse_exposition(body.decode()) if name == "matmul_host_usual_other_load_cores"
    ]
    assert found == ([] if served is None else [served])
    assert state.usual_others == (served or 0.0)  # the same figure the guard and the calm ranges go by


def test_up_says_down_for_a_gpu_whose_every_point_failed_and_up_for_a_withheld_one() -> None:
    """up: 1 when measured or withheld as busy; 0 when nothing of it was measured (e.g. out of memory every point)."""
    from crossover_monitor.model import DeviceFailure  # noqa: PLC0415

    snapshot = _snapshot(100)
    key = builders.point_key("/GPU:0", 1024, backend="tensorflow")
    broken = dataclasses.replace(
        snapshot,
        measurements=tuple(m for m in snapshot.measurements if m.key.device != "/GPU:0"),
        failures=(DeviceFailure(backend="tensorflow", device="/GPU:0", reason="out of memory", point=key),),
    )
    store = StateStore()
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=broken))
    gpu = {"backend": "tensorflow", "device": "/GPU:0"}
    assert _registry(store).get_sample_value("matmul_device_up", gpu) == 0
    busy = dataclasses.replace(
        broken, withheld=(Withheld(backend="tensorflow", device="/GPU:0", reason=WithheldReason.GPU_BUSY, detail="x"),)
    )
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=190, finished_at=200, snapshot=busy))
    assert _registry(store).get_sample_value("matmul_device_up", gpu) == 1


def test_points_withheld_alone_are_counted_and_leave_their_device_measured() -> None:
    """Two points of the GPU withheld alone (host_slowed): counted per dtype, mode and reason; the device is
    up, not withheld, and its other points' series stay."""
    snapshot = _snapshot(100)
    slowed = tuple(
        Withheld(
            backend="tensorflow",
            device="/GPU:0",
            reason=WithheldReason.HOST_SLOWED,
            detail="the host ran 1.4x slower",
            point=builders.point_key("/GPU:0", size, backend="tensorflow"),
        )
        for size in (16, 32)
    )
    store = StateStore()
    store.record(
        SweepOutcome(
            result=SweepResult.PARTIAL,
            started_at=90,
            finished_at=100,
            snapshot=dataclasses.replace(snapshot, withheld=slowed),
        )
    )
    registry = _registry(store)
    gpu = {"backend": "tensorflow", "device": "/GPU:0"}
    labels = gpu | {"dtype": "float32", "mode": "compute", "reason": "host_slowed"}
    assert registry.get_sample_value("matmul_points_withheld", labels) == 2
    assert registry.get_sample_value("matmul_device_withheld", gpu | {"reason": "host_slowed"}) is None
    assert registry.get_sample_value("matmul_device_up", gpu) == 1
    assert registry.get_sample_value("matmul_duration_seconds", POINT) is not None


def test_metrics_reference_lists_exactly_the_metric_table() -> None:
    """Every metric of metrics.METRICS is in docs/metrics.md's reference, and the reference names no other."""
    import re  # noqa: PLC0415

    from crossover_monitor.metrics import METRICS  # noqa: PLC0415
    from tests.conftest import REPO  # noqa: PLC0415

    section = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `matmul_")]
    documented = {name for cell in first_cells for name in re.findall(r"`(matmul_\w+)`", cell)}
    assert documented == EXPOSED_NAMES
    assert all(spec.help and spec.kind in {"gauge", "counter", "info"} for spec in METRICS.values())


def test_device_info_carries_the_gpus_uuid_and_pci_bus_id_as_dcgm_exporter_labels_them() -> None:
    """UUID and pci_bus_id (dcgm-exporter's label names) on matmul_device_info; empty for a CPU."""
    gpu = dataclasses.replace(
        GPU,
        details=(
            *GPU.details,
            ("uuid", "GPU-5a0c1d2e-0000-4000-8000-000000000000"),
            ("pci_bus_id", "00000000:18:00.0"),
        ),
    )
    snapshot = dataclasses.replace(_snapshot(100), devices=(CPU, gpu))
    store = StateStore()
    store.record(SweepOutcome(result=SweepResult.SUCCESS, started_at=90, finished_at=100, snapshot=snapshot))
    labels = {"backend": "tensorflow", "kind": "gpu", "name": "NVIDIA H200", "compute_capability": "9.0", "threads": ""}
    gpu_labels = {**labels, "device": "/GPU:0", "UUID": "GPU-5a0c1d2e-0000-4000-8000-000000000000"}
    registry = _registry(store)
    assert registry.get_sample_value("matmul_device_info", {**gpu_labels, "pci_bus_id": "00000000:18:00.0"}) == 1
    cpu_labels = {**labels, "device": "/CPU:0", "kind": "cpu", "name": "cpu", "compute_capability": "", "threads": "4"}
    assert registry.get_sample_value("matmul_device_info", {**cpu_labels, "UUID": "", "pci_bus_id": ""}) == 1


def test_a_section_that_fails_to_render_is_left_out_and_said_so_while_the_rest_is_served(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in one section (here the points') costs its series only: the sweeps, crossovers and build info are
    served, matmul_scrape_section_success says which section failed, and the log says why."""
    store = StateStore()
    store.record(
        SweepOutcome(result=SweepResult.SUCCESS, started_at=90.0, finished_at=100.0, snapshot=_snapshot(100.0))
    )

    def broken(self: StateCollector, state: object) -> Iterator[object]:
        yield from ()
        raise RuntimeError("injected")

    monkeypatch.setattr(StateCollector, "_point_metrics", broken)
    registry = _registry(store)
    assert registry.get_sample_value("matmul_duration_seconds", POINT) is None
    assert registry.get_sample_value("matmul_crossover_size", PAIR) == 300.0
    assert registry.get_sample_value("matmul_sweeps_total", {"result": "success"}) == 1
    assert registry.get_sample_value("matmul_scrape_section_success", {"section": "points"}) == 0
    for section in ("sweeps", "devices", "crossovers", "build"):
        assert registry.get_sample_value("matmul_scrape_section_success", {"section": section}) == 1
    assert "injected" in caplog.text


def test_every_section_reports_success_when_nothing_failed() -> None:
    """An ordinary scrape: each section says 1, before the first sweep too."""
    registry = _registry(StateStore())
    for section in ("sweeps", "devices", "points", "crossovers", "build"):
        assert registry.get_sample_value("matmul_scrape_section_success", {"section": section}) == 1


def test_the_metrics_reference_marks_exactly_the_fleet_profile() -> None:
    """docs/metrics.md's fleet column says yes for exactly the metrics the fleet profile serves."""
    import re  # noqa: PLC0415

    from crossover_monitor.metrics import METRICS  # noqa: PLC0415
    from tests.conftest import REPO  # noqa: PLC0415

    marked: dict[str, bool] = {}
    for line in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `matmul_"):
            cells = line.split("|")
            marked |= dict.fromkeys(re.findall(r"`(matmul_\w+)`", cells[1]), cells[2].strip() == "yes")
    assert marked == {spec.exposed_name: spec.fleet for spec in METRICS.values()}
