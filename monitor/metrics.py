"""Every exported metric name, and the collector that renders the latest state (the only prometheus_client importer).

The collector reads one immutable ServiceState per scrape, so a scrape never sees half a sweep.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from monitor import __version__
from monitor.model import CrossoverState, ServiceState, Snapshot, SweepResult

Registry = CollectorRegistry  # for modules that hold a registry without importing prometheus_client

# The metric contract: the dashboard, the alert rules and the docs use these names.
DURATION = "matmul_duration_seconds"
DURATION_IQR = "matmul_duration_iqr_seconds"
DURATION_NOISY = "matmul_duration_noisy"
FLOPS = "matmul_flops_per_second"
CROSSOVER = "matmul_crossover_size"
CROSSOVER_LOWER = "matmul_crossover_lower_size"
CROSSOVER_UPPER = "matmul_crossover_upper_size"
CROSSOVER_STATE = "matmul_crossover_state"
CROSSOVER_CI_LOWER = "matmul_crossover_ci_lower_size"
CROSSOVER_CI_UPPER = "matmul_crossover_ci_upper_size"
FIXED_COST = "matmul_fixed_cost_seconds"
PEAK_FLOPS = "matmul_peak_flops_per_second"
DEVICE_UP = "matmul_device_up"
DEVICE_INFO = "matmul_device_info"
BENCHMARK_INFO = "matmul_benchmark_info"
LAST_SUCCESS = "matmul_sweep_last_success_timestamp_seconds"
SWEEP_DURATION = "matmul_sweep_duration_seconds"
SWEEPS = "matmul_sweeps"  # exposed as matmul_sweeps_total
NEXT_SWEEP = "matmul_sweep_next_timestamp_seconds"
BUILD_INFO = "matmul_monitor_build_info"
# The interference guard and what the hardware looked like while it was timed.
DEVICE_WITHHELD = "matmul_device_withheld"
DEVICE_MEASURED_AT = "matmul_device_measured_timestamp_seconds"
CROSSOVER_DERIVED_AT = "matmul_crossover_timestamp_seconds"
RETRIES = "matmul_busy_retries"  # exposed as matmul_busy_retries_total
GPU_SM_CLOCK_MIN = "matmul_gpu_sm_clock_min_hertz"
GPU_SM_CLOCK_MAX = "matmul_gpu_sm_clock_max_hertz"
GPU_CLOCK_EVENT = "matmul_gpu_clock_event"
GPU_TEMPERATURE_MAX = "matmul_gpu_temperature_max_celsius"
GPU_POWER_MAX = "matmul_gpu_power_max_watts"
GPU_PCIE_GENERATION = "matmul_gpu_pcie_link_generation"
GPU_PCIE_GENERATION_MAX = "matmul_gpu_pcie_link_generation_max"
GPU_PCIE_WIDTH = "matmul_gpu_pcie_link_width"
GPU_PCIE_WIDTH_MAX = "matmul_gpu_pcie_link_width_max"
GPU_OTHER_PROCESSES = "matmul_gpu_other_processes"
CPU_OTHER_LOAD = "matmul_cpu_other_load_cores"
CPU_THROTTLED = "matmul_cpu_throttled_seconds"

# Hardware context gauges: (name, help, the HardwareContext field).
HARDWARE_GAUGES = (
    (
        GPU_SM_CLOCK_MIN,
        "Lowest SM clock seen after the GPU's points in the sweep its timings come from",
        "sm_clock_min_hz",
    ),
    (GPU_SM_CLOCK_MAX, "The GPU's maximum SM clock", "sm_clock_max_hz"),
    (GPU_TEMPERATURE_MAX, "Highest GPU temperature seen while it was timed", "temperature_max_c"),
    (GPU_POWER_MAX, "Highest GPU power draw seen while it was timed", "power_max_w"),
    (GPU_PCIE_GENERATION, "Lowest PCIe link generation seen while the GPU was timed", "pcie_generation_min"),
    (GPU_PCIE_GENERATION_MAX, "The PCIe link generation the GPU and its slot can reach", "pcie_generation_max"),
    (GPU_PCIE_WIDTH, "Narrowest PCIe link width (lanes) seen while the GPU was timed", "pcie_width_min"),
    (GPU_PCIE_WIDTH_MAX, "The PCIe link width the GPU and its slot can reach", "pcie_width_max"),
    (GPU_OTHER_PROCESSES, "Most processes of other programs seen on the GPU while it was timed", "other_processes_max"),
    (
        CPU_OTHER_LOAD,
        "Other processes' load on the worker's cores while the CPU was timed, in cores",
        "other_cpu_cores",
    ),
    (CPU_THROTTLED, "Time the container's CPU quota throttled the worker while the CPU was timed", "cpu_throttled_s"),
)

POINT_LABELS = ["backend", "device", "dtype", "mode", "size"]
CROSSOVER_LABELS = ["backend", "gpu", "cpu", "dtype", "mode"]
COST_LABELS = ["backend", "device", "dtype", "mode"]
DEVICE_DETAIL_LABELS = ("compute_capability", "threads")
ENVIRONMENT_LABELS = ("framework_version", "cuda_version", "cudnn_version", "tf32", "cpu_threads")

# Every name a scrape can contain (counters with their _total suffix): the dashboard and rules tests use it.
EXPOSED_NAMES = frozenset(
    {
        DURATION,
        DURATION_IQR,
        DURATION_NOISY,
        FLOPS,
        CROSSOVER,
        CROSSOVER_LOWER,
        CROSSOVER_UPPER,
        CROSSOVER_STATE,
        CROSSOVER_CI_LOWER,
        CROSSOVER_CI_UPPER,
        FIXED_COST,
        PEAK_FLOPS,
        DEVICE_UP,
        DEVICE_INFO,
        BENCHMARK_INFO,
        LAST_SUCCESS,
        SWEEP_DURATION,
        SWEEPS + "_total",
        NEXT_SWEEP,
        BUILD_INFO,
        DEVICE_WITHHELD,
        DEVICE_MEASURED_AT,
        CROSSOVER_DERIVED_AT,
        RETRIES + "_total",
        GPU_CLOCK_EVENT,
        *(name for name, _, _ in HARDWARE_GAUGES),
    }
)


class StateCollector(Collector):
    """Renders the ServiceState returned by ``read_state`` at scrape time."""

    def __init__(self, read_state: Callable[[], ServiceState], *, backend: str, framework_version: str) -> None:
        self._read_state = read_state
        self._build_labels = {
            "version": __version__,
            "python_version": platform.python_version(),
            "backend": backend,
            "framework_version": framework_version,
        }

    def describe(self) -> list[Metric]:
        return []  # collected lazily: the registry must not call collect() at registration

    def collect(self) -> Iterator[Metric]:
        state = self._read_state()
        yield from self._sweep_metrics(state)
        yield from self._device_metrics(state)
        yield from self._point_metrics(state)
        yield from self._crossover_metrics(state)
        build = GaugeMetricFamily(
            BUILD_INFO, "crossover-monitor build and framework versions", labels=list(self._build_labels)
        )
        build.add_metric(list(self._build_labels.values()), 1)
        yield build

    def _sweep_metrics(self, state: ServiceState) -> Iterator[Metric]:
        sweeps = CounterMetricFamily(SWEEPS, "Sweeps by how they ended", labels=["result"])
        for result in SweepResult:
            sweeps.add_metric([result.value], state.count(result))
        yield sweeps
        retries = CounterMetricFamily(RETRIES, "Retries of GPUs withheld as busy, by how they ended", labels=["result"])
        for retry, count in state.retries:
            retries.add_metric([retry.value], count)
        yield retries
        if state.last_outcome is not None:
            yield GaugeMetricFamily(
                SWEEP_DURATION, "How long the latest sweep took", value=state.last_outcome.duration_s
            )
        if state.last_success_at is not None:
            yield GaugeMetricFamily(LAST_SUCCESS, "When the latest successful sweep ended", value=state.last_success_at)
        if state.next_sweep_at is not None:
            yield GaugeMetricFamily(NEXT_SWEEP, "When the next sweep is due", value=state.next_sweep_at)

    def _device_metrics(self, state: ServiceState) -> Iterator[Metric]:
        latest = state.latest
        if latest is None:
            return
        # Up unless it failed: a device withheld as busy works (its timings are carried over), and a
        # sweep whose worker died measured nothing, so every device is down.
        completed = state.last_outcome is not None and state.last_outcome.snapshot is not None
        failed = {f.device for f in latest.failures if f.point is None}
        up = GaugeMetricFamily(
            DEVICE_UP,
            "1 if the device was measured, or withheld as busy, in the latest sweep; 0 if it failed",
            labels=["backend", "device"],
        )
        info = GaugeMetricFamily(
            DEVICE_INFO,
            "Devices the backend found",
            labels=["backend", "device", "kind", "name", *DEVICE_DETAIL_LABELS],
        )
        seen = set()
        for device in latest.devices:
            seen.add((device.backend, device.device))
            details = dict(device.details)
            info.add_metric(
                [
                    device.backend,
                    device.device,
                    device.kind,
                    device.name,
                    *(details.get(k, "") for k in DEVICE_DETAIL_LABELS),
                ],
                1,
            )
            # Measured or withheld; a GPU whose every point failed (out of memory, say) measured nothing: down.
            works = device.device in latest.measured_devices | latest.withheld_devices
            up.add_metric(
                [device.backend, device.device], 1 if completed and works and device.device not in failed else 0
            )
        for failure in latest.failures:
            if failure.point is None and (failure.backend, failure.device) not in seen:
                seen.add((failure.backend, failure.device))
                up.add_metric([failure.backend, failure.device], 0)
        yield up
        yield info
        environment = dict(latest.environment)
        bench = GaugeMetricFamily(
            BENCHMARK_INFO, "Settings and versions that change the answer", labels=["backend", *ENVIRONMENT_LABELS]
        )
        bench.add_metric([self._build_labels["backend"], *(environment.get(k, "") for k in ENVIRONMENT_LABELS)], 1)
        yield bench
        yield from self._guard_metrics(latest)

    def _guard_metrics(self, latest: Snapshot) -> Iterator[Metric]:
        labels = ["backend", "device"]
        withheld = GaugeMetricFamily(
            DEVICE_WITHHELD,
            "1 if the device's timings of the latest sweep were withheld: other work was (or may have been) on it",
            labels=[*labels, "reason"],
        )
        for w in latest.withheld:
            withheld.add_metric([w.backend, w.device, w.reason.value], 1)
        yield withheld
        backends = {d.device: d.backend for d in latest.devices}
        measured_at = GaugeMetricFamily(
            DEVICE_MEASURED_AT,
            "When the device's served timings were measured (older while it is withheld)",
            labels=labels,
        )
        for device, when in latest.measured_at:
            measured_at.add_metric([backends.get(device, ""), device], when)
        yield measured_at
        events = GaugeMetricFamily(
            GPU_CLOCK_EVENT,
            "1 for each clock-event (throttle) reason seen while the GPU was timed",
            labels=[*labels, "reason"],
        )
        for h in latest.hardware:
            for reason in h.clock_events:
                events.add_metric([h.backend, h.device, reason], 1)
        yield events
        for name, help_text, attribute in HARDWARE_GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            for h in latest.hardware:
                value = getattr(h, attribute)
                if value is not None:
                    gauge.add_metric([h.backend, h.device], float(value))
            yield gauge

    def _point_metrics(self, state: ServiceState) -> Iterator[Metric]:
        if state.latest is None:
            return
        duration = GaugeMetricFamily(DURATION, "Median time of one n×n matrix multiplication", labels=POINT_LABELS)
        iqr = GaugeMetricFamily(DURATION_IQR, "Interquartile range of that time", labels=POINT_LABELS)
        noisy = GaugeMetricFamily(
            DURATION_NOISY, "1 if the spread stayed above the target (a noisy point)", labels=POINT_LABELS
        )
        flops = GaugeMetricFamily(FLOPS, "Achieved rate, 2·n³ / median", labels=POINT_LABELS)
        # Only configured sizes become series: probe and refinement sizes vary between sweeps.
        for m in (m for m in state.latest.measurements if m.role == "sweep"):
            labels = [m.key.backend, m.key.device, m.key.dtype, m.key.mode, str(m.key.size)]
            duration.add_metric(labels, m.timing.median_s)
            iqr.add_metric(labels, m.timing.iqr_s)
            noisy.add_metric(labels, 1 if m.timing.noisy else 0)
            flops.add_metric(labels, m.flops_per_second)
        yield from (duration, iqr, noisy, flops)
        fixed = GaugeMetricFamily(
            FIXED_COST, "Time of a 1x1 multiplication: dispatch, launch, sync (and copies)", labels=COST_LABELS
        )
        peak = GaugeMetricFamily(
            PEAK_FLOPS, "Rate per FLOP at the largest size once the fixed cost is taken off", labels=COST_LABELS
        )
        for cost in state.latest.costs:
            labels = [cost.backend, cost.device, cost.dtype, cost.mode]
            fixed.add_metric(labels, cost.fixed_s)
            if cost.peak_flops is not None:
                peak.add_metric(labels, cost.peak_flops)
        yield from (fixed, peak)

    def _crossover_metrics(self, state: ServiceState) -> Iterator[Metric]:
        if state.latest is None:
            return
        size = GaugeMetricFamily(CROSSOVER, "Matrix size n* from which the GPU beats the CPU", labels=CROSSOVER_LABELS)
        lower = GaugeMetricFamily(CROSSOVER_LOWER, "Lower bound of the bracket around n*", labels=CROSSOVER_LABELS)
        upper = GaugeMetricFamily(CROSSOVER_UPPER, "Upper bound of the bracket around n*", labels=CROSSOVER_LABELS)
        states = GaugeMetricFamily(
            CROSSOVER_STATE, "1 for the current crossover state", labels=[*CROSSOVER_LABELS, "state"]
        )
        ci_lower = GaugeMetricFamily(CROSSOVER_CI_LOWER, "Lower 95% confidence bound of n*", labels=CROSSOVER_LABELS)
        ci_upper = GaugeMetricFamily(CROSSOVER_CI_UPPER, "Upper 95% confidence bound of n*", labels=CROSSOVER_LABELS)
        derived_at = GaugeMetricFamily(
            CROSSOVER_DERIVED_AT, "When the sweep the served crossover comes from ended", labels=CROSSOVER_LABELS
        )
        for c in state.latest.crossovers:
            labels = [c.backend, c.gpu, c.cpu, c.dtype, c.mode]
            if c.derived_at is not None:
                derived_at.add_metric(labels, c.derived_at)
            if c.size is not None:
                size.add_metric(labels, c.size)
            if c.lower is not None and c.upper is not None:
                lower.add_metric(labels, c.lower)
                upper.add_metric(labels, c.upper)
            if c.ci_lower is not None and c.ci_upper is not None:
                ci_lower.add_metric(labels, c.ci_lower)
                ci_upper.add_metric(labels, c.ci_upper)
            for s in CrossoverState:
                states.add_metric([*labels, s.value], 1 if s is c.state else 0)
        yield from (size, lower, upper, ci_lower, ci_upper, states, derived_at)


def build_registry(
    read_state: Callable[[], ServiceState], *, backend: str, framework_version: str
) -> CollectorRegistry:
    """A registry of the service's own (never the global one) holding only the state collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(read_state, backend=backend, framework_version=framework_version))
    return registry


def render(registry: CollectorRegistry, accept_header: str | None) -> tuple[bytes, str]:
    """The exposition body and its content type, in the format the scraper asked for."""
    encoder, content_type = choose_encoder(accept_header or "")
    return encoder(registry), content_type


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a text exposition (what /metrics serves) as (name, labels, value); ValueError if malformed."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
