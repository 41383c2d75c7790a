"""The metric contract as one table (name, type, help, labels), and the collector that renders the latest state.

The only prometheus_client importer.

The collector reads one immutable ServiceState per scrape, so a scrape never sees half a sweep.
"""

from __future__ import annotations

import collections
import enum
import logging
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from crossover_monitor import __version__
from crossover_monitor.model import (
    CPU_AFFINITY,
    DRIVER_VERSION,
    CrossoverState,
    DeviceState,
    Measurement,
    ServiceState,
    Snapshot,
    SweepResult,
)

log = logging.getLogger(__name__)

POINT_LABELS = ("backend", "device", "dtype", "mode", "size")
CROSSOVER_LABELS = ("backend", "gpu", "cpu", "dtype", "mode")
COST_LABELS = ("backend", "device", "dtype", "mode")
DEVICE_LABELS = ("backend", "device")
# Label name -> the DeviceInfo detail it shows. UUID and pci_bus_id are NVML's, spelled as dcgm-exporter
# labels its series, so that `on (UUID)` joins a device with that exporter's series for the same GPU.
DEVICE_DETAIL_LABELS = {
    "compute_capability": "compute_capability",
    "threads": "threads",
    "UUID": "uuid",
    "pci_bus_id": "pci_bus_id",
}
ENVIRONMENT_LABELS = (
    "framework_version",
    "cuda_version",
    "cudnn_version",
    "tf32",
    "cpu_threads",
    CPU_AFFINITY,
    DRIVER_VERSION,
)
BUILD_LABELS = ("version", "python_version", "backend", "framework_version")

Kind = Literal["gauge", "counter", "info"]
# What a scrape asks for (`/metrics?profile=...`): `node`, every series (the default: one machine's whole curve);
# `fleet`, what a fleet's central store needs for its alerts and dashboards (docs/fleet.md says why these).
Profile = Literal["node", "fleet"]
PROFILES: tuple[Profile, ...] = ("node", "fleet")


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the contract: its name, type, help text and label names, declared once, and whether the
    fleet profile serves it."""

    name: str  # as exposed, but without a counter's _total
    kind: Kind
    help: str
    labels: tuple[str, ...]
    fleet: bool = False

    @property
    def exposed_name(self) -> str:
        """The name a scrape shows: counters gain _total."""
        return self.name + "_total" if self.kind == "counter" else self.name


METRICS: dict[str, MetricSpec] = {}


def _metric(
    name: str, help_text: str, labels: tuple[str, ...] = (), kind: Kind = "gauge", *, fleet: bool = False
) -> str:
    METRICS[name] = MetricSpec(name, kind, help_text, labels, fleet)
    return name


# The metric contract: the dashboard, the alert rules and the docs use these names (docs/metrics.md's
# metrics reference is checked against this table by tests/test_metrics.py).
DURATION = _metric("matmul_duration_seconds", "Median time of one n×n matrix multiplication", POINT_LABELS)
DURATION_IQR = _metric("matmul_duration_iqr_seconds", "Interquartile range of that time", POINT_LABELS)
DURATION_NOISY = _metric(
    "matmul_duration_noisy", "1 if the spread stayed above the target (a noisy point)", POINT_LABELS
)
FLOPS = _metric("matmul_flops_per_second", "Achieved rate, 2·n³ / median", POINT_LABELS)
# Between whole curves a sweep carries the points that cannot move n* (``analysis.focus``): each says when it was timed.
DURATION_AT = _metric(
    "matmul_duration_timestamp_seconds",
    "When the served point was timed: its device's latest sweep, or an earlier one for a point a sweep carried",
    POINT_LABELS,
)
# The GPU throughput alert's input, served apart so that a fleet keeps it without the curve (relabeling keeps series
# by label, never by which size is the largest). Its `size` label starts a new series when the sizes change.
LARGEST_FLOPS = _metric(
    "matmul_largest_size_flops_per_second",
    "A GPU's achieved rate at the largest size served for it in the latest sweep, 2·n³ / median",
    POINT_LABELS,
    fleet=True,
)
CROSSOVER = _metric(
    "matmul_crossover_size", "Matrix size n* from which the GPU beats the CPU", CROSSOVER_LABELS, fleet=True
)
CROSSOVER_LOWER = _metric("matmul_crossover_lower_size", "Lower bound of the bracket around n*", CROSSOVER_LABELS)
CROSSOVER_UPPER = _metric("matmul_crossover_upper_size", "Upper bound of the bracket around n*", CROSSOVER_LABELS)
# The node profile serves each state (1 for the current one, 0 for the others, as an OpenMetrics state set); the
# fleet profile only the current one: one series a pair instead of six.
CROSSOVER_STATE = _metric(
    "matmul_crossover_state", "1 for the current crossover state", (*CROSSOVER_LABELS, "state"), fleet=True
)
CROSSOVER_CI_LOWER = _metric(
    "matmul_crossover_ci_lower_size",
    "Lower end of the 95% interval for the next sweep's n*, from resampling the visits of the sizes around it",
    CROSSOVER_LABELS,
    fleet=True,
)
CROSSOVER_CI_UPPER = _metric(
    "matmul_crossover_ci_upper_size",
    "Upper end of the 95% interval for the next sweep's n*, from resampling the visits of the sizes around it",
    CROSSOVER_LABELS,
    fleet=True,
)
CROSSOVER_DERIVED_AT = _metric(
    "matmul_crossover_timestamp_seconds",
    "When the sweep the served crossover comes from ended",
    CROSSOVER_LABELS,
    fleet=True,
)
FIXED_COST = _metric(
    "matmul_fixed_cost_seconds", "Time of a 1x1 multiplication: dispatch, launch, sync (and copies)", COST_LABELS
)
PEAK_FLOPS = _metric(
    "matmul_peak_flops_per_second", "Rate per FLOP at the largest size once the fixed cost is taken off", COST_LABELS
)
DEVICE_UP = _metric(
    "matmul_device_up",
    "1 if the device was measured, or withheld as busy, in the latest sweep; 0 if it failed",
    DEVICE_LABELS,
    fleet=True,
)
DEVICE_INFO = _metric(
    "matmul_device_info",
    "Devices the backend found",
    (*DEVICE_LABELS, "kind", "name", *DEVICE_DETAIL_LABELS),
    "info",
    fleet=True,
)
BENCHMARK_INFO = _metric(
    "matmul_benchmark_info",
    "Settings and versions that change the answer",
    ("backend", *ENVIRONMENT_LABELS),
    "info",
    fleet=True,
)
LAST_SUCCESS = _metric(
    "matmul_sweep_last_success_timestamp_seconds",
    "When the latest sweep that measured something (success, partial) ended",
    fleet=True,
)
SWEEP_DURATION = _metric("matmul_sweep_duration_seconds", "How long the latest sweep took", fleet=True)
WORKER_CPU = _metric(
    "matmul_sweep_worker_cpu_seconds",
    "CPU time the worker of the latest completed sweep used, all its threads",
    fleet=True,
)
WORKER_CPU_TOTAL = _metric(
    "matmul_worker_cpu_seconds",
    "CPU time the workers of sweeps and of retries used since the service started, all their threads",
    ("run",),
    "counter",
    fleet=True,
)
WORKER_MEMORY = _metric(
    "matmul_sweep_worker_peak_memory_bytes",
    "Peak resident memory of the worker of the latest completed sweep",
    fleet=True,
)
USUAL_OTHER_LOAD = _metric(
    "matmul_host_usual_other_load_cores",
    "Other processes' usual load on the host (steal included), in cores: what nine of ten recent sweeps reached",
    fleet=True,
)
SWEEPS = _metric("matmul_sweeps", "Sweeps by how they ended", ("result",), "counter", fleet=True)
NEXT_SWEEP = _metric("matmul_sweep_next_timestamp_seconds", "When the next sweep is due", fleet=True)
CONFIG_LOADED = _metric(
    "matmul_config_last_reload_successful",
    "1 if the latest configuration (re)load took, 0 if it was refused",
    fleet=True,
)
CONFIG_LOADED_AT = _metric(
    "matmul_config_last_reload_success_timestamp_seconds",
    "When the configuration last loaded (start-up or reload)",
    fleet=True,
)
BUILD_INFO = _metric(
    "matmul_monitor_build_info", "crossover-monitor build and framework versions", BUILD_LABELS, "info", fleet=True
)
# The interference guard and what the hardware looked like while it was timed.
DEVICE_WITHHELD = _metric(
    "matmul_device_withheld",
    "1 if the device's timings of the latest sweep were withheld: other work was (or may have been) on it",
    (*DEVICE_LABELS, "reason"),
    fleet=True,
)
POINTS_WITHHELD = _metric(
    "matmul_points_withheld",
    "How many points of the device's latest sweep were withheld alone (the host ran slower while they were "
    "timed, or they ran past their own idle range while others used the host); its other points are published",
    (*DEVICE_LABELS, "dtype", "mode", "reason"),
    fleet=True,
)
DEVICE_MEASURED_AT = _metric(
    "matmul_device_measured_timestamp_seconds",
    "When the device's served timings were measured (older while it is withheld)",
    DEVICE_LABELS,
    fleet=True,
)
RETRIES = _metric(
    "matmul_busy_retries",
    "Retries of devices withheld for other work (a busy GPU, every core taken), by how they ended",
    ("result",),
    "counter",
    fleet=True,
)
GPU_CLOCK_EVENT = _metric(
    "matmul_gpu_clock_event",
    "1 for each clock-event (throttle) reason seen while the GPU was timed",
    (*DEVICE_LABELS, "reason"),
    fleet=True,
)

# What the hardware looked like while a device was timed (HardwareContext), one gauge per field.
GPU_SM_CLOCK_MIN = _metric(
    "matmul_gpu_sm_clock_min_hertz",
    "Lowest SM clock seen after the GPU's points in the sweep its timings come from",
    DEVICE_LABELS,
    fleet=True,
)
GPU_SM_CLOCK_MAX = _metric("matmul_gpu_sm_clock_max_hertz", "The GPU's maximum SM clock", DEVICE_LABELS, fleet=True)
GPU_TEMPERATURE_MAX = _metric(
    "matmul_gpu_temperature_max_celsius", "Highest GPU temperature seen while it was timed", DEVICE_LABELS, fleet=True
)
GPU_POWER_MAX = _metric(
    "matmul_gpu_power_max_watts", "Highest GPU power draw seen while it was timed", DEVICE_LABELS, fleet=True
)
GPU_PCIE_GENERATION = _metric(
    "matmul_gpu_pcie_link_generation",
    "Lowest PCIe link generation seen while the GPU was timed",
    DEVICE_LABELS,
    fleet=True,
)
GPU_PCIE_GENERATION_MAX = _metric(
    "matmul_gpu_pcie_link_generation_max",
    "The PCIe link generation the GPU and its slot can reach",
    DEVICE_LABELS,
    fleet=True,
)
GPU_PCIE_WIDTH = _metric(
    "matmul_gpu_pcie_link_width",
    "Narrowest PCIe link width (lanes) seen while the GPU was timed",
    DEVICE_LABELS,
    fleet=True,
)
GPU_PCIE_WIDTH_MAX = _metric(
    "matmul_gpu_pcie_link_width_max", "The PCIe link width the GPU and its slot can reach", DEVICE_LABELS, fleet=True
)
GPU_POWER_LIMITED = _metric(
    "matmul_gpu_power_limited_ratio",
    "Share of the time the GPU's points ran during which NVML counted it held below its clocks by its power limit",
    DEVICE_LABELS,
    fleet=True,
)
GPU_THERMAL_LIMITED = _metric(
    "matmul_gpu_thermal_limited_ratio",
    "Share of the time the GPU's points ran during which NVML counted it held below its clocks by its thermal limit",
    DEVICE_LABELS,
    fleet=True,
)
GPU_HOST_WAIT = _metric(
    "matmul_gpu_host_wait_ratio",
    "Most the thread timing the GPU's points waited for a CPU (every core taken), as a share of a point",
    DEVICE_LABELS,
    fleet=True,
)
GPU_WORKER_MEMORY = _metric(
    "matmul_gpu_worker_memory_bytes",
    "Most GPU memory the worker's own process held on the GPU in the latest sweep (NVML, after its points)",
    DEVICE_LABELS,
)
GPU_OTHER_PROCESSES = _metric(
    "matmul_gpu_other_processes", "Most processes of other programs seen on the GPU while it was timed", DEVICE_LABELS
)
CPU_OTHER_LOAD = _metric(
    "matmul_cpu_other_load_cores",
    "Other processes' load on the worker's cores while the CPU was timed, in cores",
    DEVICE_LABELS,
    fleet=True,
)
CPU_THROTTLED = _metric(
    "matmul_cpu_throttled_seconds",
    "Time the container's CPU quota throttled the worker while the CPU was timed",
    DEVICE_LABELS,
    fleet=True,
)
CPU_STEAL = _metric(
    "matmul_cpu_steal_cores",
    "Of the other load, the hypervisor's steal on the worker's vCPUs while the CPU was timed, in cores",
    DEVICE_LABELS,
    fleet=True,
)
CPU_BLOCKS_SET_ASIDE = _metric(
    "matmul_cpu_blocks_set_aside_ratio",
    "Share of the CPU's timed blocks set aside and timed again because the worker's threads waited for a CPU in them",
    DEVICE_LABELS,
)
HOST_SLOWDOWN = _metric(
    "matmul_host_slowdown_ratio",
    "Most the host reference ran slower than its idle figure over the device's points (1: as fast)",
    DEVICE_LABELS,
)
HARDWARE_GAUGES = (  # (metric, the HardwareContext field it shows)
    (GPU_SM_CLOCK_MIN, "sm_clock_min_hz"),
    (GPU_SM_CLOCK_MAX, "sm_clock_max_hz"),
    (GPU_TEMPERATURE_MAX, "temperature_max_c"),
    (GPU_POWER_MAX, "power_max_w"),
    (GPU_PCIE_GENERATION, "pcie_generation_min"),
    (GPU_PCIE_GENERATION_MAX, "pcie_generation_max"),
    (GPU_PCIE_WIDTH, "pcie_width_min"),
    (GPU_PCIE_WIDTH_MAX, "pcie_width_max"),
    (GPU_POWER_LIMITED, "power_limited_ratio"),
    (GPU_THERMAL_LIMITED, "thermal_limited_ratio"),
    (GPU_OTHER_PROCESSES, "other_processes_max"),
    (GPU_WORKER_MEMORY, "worker_gpu_memory_max_bytes"),
    (GPU_HOST_WAIT, "host_wait_ratio"),
    (CPU_OTHER_LOAD, "other_cpu_cores"),
    (CPU_THROTTLED, "cpu_throttled_s"),
    (CPU_STEAL, "cpu_steal_cores"),
    (CPU_BLOCKS_SET_ASIDE, "cpu_blocks_set_aside_ratio"),
    (HOST_SLOWDOWN, "host_slowdown_max"),
)

# Every name a scrape can contain (counters with their _total suffix): the dashboard and rules tests use it.
SECTION_SUCCESS = _metric(
    "matmul_scrape_section_success",
    "1 if this section of /metrics rendered, 0 if it failed (the log says why; the other sections are served)",
    ("section",),
    fleet=True,
)

EXPOSED_NAMES = frozenset(spec.exposed_name for spec in METRICS.values())
# The families the fleet profile serves, by the name a family carries (an info family's without _info).
_FLEET_FAMILIES = frozenset(spec.name.removesuffix("_info") for spec in METRICS.values() if spec.fleet)


def _spec(name: str, kind: Kind) -> MetricSpec:
    spec = METRICS[name]
    if spec.kind != kind:
        raise TypeError(f"{name} is a {spec.kind}, not a {kind}")
    return spec


def _gauge(name: str) -> GaugeMetricFamily:
    spec = _spec(name, "gauge")
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


def _counter(name: str) -> CounterMetricFamily:
    spec = _spec(name, "counter")
    return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)


def _info(name: str) -> InfoMetricFamily:
    """An info family: its name without _info (the library adds it back), its values as labels."""
    spec = _spec(name, "info")
    return InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=spec.labels)


def _label_values(name: str, source: object = None, /, **given: str) -> list[str]:
    """Metric ``name``'s label values in its declared order: each one ``given``, else ``source``'s attribute
    of the label's name (an enum's value, a number as text)."""
    values = []
    for label in METRICS[name].labels:
        value = given[label] if label in given else getattr(source, label)
        values.append(str(value.value if isinstance(value, enum.Enum) else value))
    return values


class StateCollector(Collector):
    """Renders the ServiceState returned by ``read_state`` at scrape time, every series or the fleet profile's."""

    def __init__(self, read_state: Callable[[], ServiceState], *, backend: str, profile: Profile = "node") -> None:
        self._read_state = read_state
        self._build_labels = {"version": __version__, "python_version": platform.python_version(), "backend": backend}
        self._fleet = profile == "fleet"

    def describe(self) -> list[Metric]:
        return []  # collected lazily: the registry must not call collect() at registration

    def collect(self) -> Iterator[Metric]:
        """Every section of the state's series; a section that fails (a bug) is left out and said so, not the rest
        (as node_exporter serves the collectors that worked beside node_scrape_collector_success)."""
        state = self._read_state()
        sections: tuple[tuple[str, Callable[[ServiceState], Iterator[Metric]]], ...] = (
            ("sweeps", self._sweep_metrics),
            ("devices", self._device_metrics),
            ("points", self._point_metrics),
            ("crossovers", self._crossover_metrics),
            ("build", self._build_metrics),
        )
        success = _gauge(SECTION_SUCCESS)
        for name, section in sections:
            try:
                families = list(section(state))  # whole or not at all: no half a section
            except Exception:  # a bug in one section must not take the others' series away
                log.exception("rendering /metrics failed in one section", extra={"section": name})
                success.add_metric([name], 0)
                continue
            success.add_metric([name], 1)
            yield from (f for f in families if not self._fleet or f.name in _FLEET_FAMILIES)
        yield success

    def _build_metrics(self, state: ServiceState) -> Iterator[Metric]:
        # The framework's version is what the latest sweep's worker imported (its environment), not what the
        # daemon finds installed: a framework upgraded under a running service shows at the next sweep.
        environment = dict(state.latest.environment) if state.latest is not None else {}
        build = _info(BUILD_INFO)
        framework = environment.get("framework_version", "")
        build.add_metric(_label_values(BUILD_INFO, **self._build_labels, framework_version=framework), {})
        yield build

    def _sweep_metrics(self, state: ServiceState) -> Iterator[Metric]:
        sweeps = _counter(SWEEPS)
        for result in SweepResult:
            sweeps.add_metric(_label_values(SWEEPS, result=result.value), state.count(result))
        yield sweeps
        retries = _counter(RETRIES)
        for retry, count in state.retries:
            retries.add_metric(_label_values(RETRIES, result=retry.value), count)
        yield retries
        paid = _counter(WORKER_CPU_TOTAL)
        for run, seconds in state.worker_cpu_s:
            paid.add_metric(_label_values(WORKER_CPU_TOTAL, run=run), seconds)
        yield paid
        for name, value in (
            (SWEEP_DURATION, state.last_outcome.duration_s if state.last_outcome is not None else None),
            (LAST_SUCCESS, state.last_success_at),
            (NEXT_SWEEP, state.next_sweep_at),
            (CONFIG_LOADED, None if state.config_loaded is None else float(state.config_loaded)),
            (CONFIG_LOADED_AT, state.config_loaded_at),
            (WORKER_CPU, state.latest.worker_cpu_seconds if state.latest is not None else None),
            (WORKER_MEMORY, state.latest.worker_peak_rss_bytes if state.latest is not None else None),
            (USUAL_OTHER_LOAD, state.usual_others_if_known),
        ):
            if value is not None:
                gauge = _gauge(name)
                gauge.add_metric([], value)
                yield gauge

    def _device_metrics(self, state: ServiceState) -> Iterator[Metric]:
        latest = state.latest
        if latest is None:
            return
        # Up unless it failed: a device withheld as busy works (its timings are carried over), and a
        # sweep whose worker died measured nothing, so every device is down.
        completed = state.last_outcome is not None and state.last_outcome.snapshot is not None
        up = _gauge(DEVICE_UP)
        info = _info(DEVICE_INFO)
        seen = set()
        for device in latest.devices:
            seen.add((device.backend, device.device))
            details = dict(device.details)
            shown = {label: details.get(key, "") for label, key in DEVICE_DETAIL_LABELS.items()}
            info.add_metric(_label_values(DEVICE_INFO, device, **shown), {})
            works = latest.device_state(device.device)[0] is not DeviceState.FAILED
            up.add_metric(_label_values(DEVICE_UP, device), 1 if completed and works else 0)
        for failure in latest.failures:
            if failure.whole_device and (failure.backend, failure.device) not in seen:
                seen.add((failure.backend, failure.device))
                up.add_metric(_label_values(DEVICE_UP, failure), 0)
        yield up
        yield info
        environment = dict(latest.environment)
        bench = _info(BENCHMARK_INFO)
        versions = {k: environment.get(k, "") for k in ENVIRONMENT_LABELS}
        bench.add_metric(_label_values(BENCHMARK_INFO, backend=self._build_labels["backend"], **versions), {})
        yield bench
        yield from self._guard_metrics(latest)

    def _guard_metrics(self, latest: Snapshot) -> Iterator[Metric]:
        withheld = _gauge(DEVICE_WITHHELD)
        points: collections.Counter[tuple[str, ...]] = collections.Counter()
        for w in latest.withheld:
            if w.point is None:
                withheld.add_metric(_label_values(DEVICE_WITHHELD, w), 1)
            else:
                points[tuple(_label_values(POINTS_WITHHELD, w, dtype=w.point.dtype, mode=w.point.mode))] += 1
        yield withheld
        points_withheld = _gauge(POINTS_WITHHELD)
        for labels, count in sorted(points.items()):
            points_withheld.add_metric(list(labels), count)
        yield points_withheld
        backends = {d.device: d.backend for d in latest.devices}
        measured_at = _gauge(DEVICE_MEASURED_AT)
        for device, when in latest.measured_at:
            measured_at.add_metric(
                _label_values(DEVICE_MEASURED_AT, backend=backends.get(device, ""), device=device), when
            )
        yield measured_at
        events = _gauge(GPU_CLOCK_EVENT)
        for h in latest.hardware:
            for reason in h.clock_events:
                events.add_metric(_label_values(GPU_CLOCK_EVENT, h, reason=reason), 1)
        yield events
        for name, attribute in HARDWARE_GAUGES:
            gauge = _gauge(name)
            for h in latest.hardware:
                value = getattr(h, attribute)
                if value is not None:
                    gauge.add_metric(_label_values(name, h), float(value))
            yield gauge

    def _point_metrics(self, state: ServiceState) -> Iterator[Metric]:
        if state.latest is None:
            return
        duration, iqr, noisy, flops, timed_at = (
            _gauge(n) for n in (DURATION, DURATION_IQR, DURATION_NOISY, FLOPS, DURATION_AT)
        )
        measured_at = dict(state.latest.measured_at)
        # Only configured sizes become series: the fixed-cost point and refinement sizes vary between sweeps.
        for m in (m for m in state.latest.measurements if m.role == "sweep"):
            labels = _label_values(DURATION, m.key)  # the five point gauges' alike
            duration.add_metric(labels, m.timing.median_s)
            iqr.add_metric(labels, m.timing.iqr_s)
            noisy.add_metric(labels, 1 if m.timing.noisy else 0)
            flops.add_metric(labels, m.flops_per_second)
            when = m.timed_at if m.timed_at is not None else measured_at.get(m.key.device)
            if when is not None:
                timed_at.add_metric(labels, when)
        yield from (duration, iqr, noisy, flops, timed_at)
        yield _largest_flops(state.latest)
        fixed, peak = _gauge(FIXED_COST), _gauge(PEAK_FLOPS)
        for cost in state.latest.costs:
            labels = _label_values(FIXED_COST, cost)  # PEAK_FLOPS's alike
            fixed.add_metric(labels, cost.fixed_s)
            if cost.peak_flops is not None:
                peak.add_metric(labels, cost.peak_flops)
        yield from (fixed, peak)

    def _crossover_metrics(self, state: ServiceState) -> Iterator[Metric]:
        if state.latest is None:
            return
        size, lower, upper, states, ci_lower, ci_upper, derived_at = (
            _gauge(n)
            for n in (
                CROSSOVER,
                CROSSOVER_LOWER,
                CROSSOVER_UPPER,
                CROSSOVER_STATE,
                CROSSOVER_CI_LOWER,
                CROSSOVER_CI_UPPER,
                CROSSOVER_DERIVED_AT,
            )
        )
        for c in state.latest.crossovers:
            labels = _label_values(CROSSOVER, c)  # every crossover gauge's but the state's
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
                if s is c.state or not self._fleet:
                    states.add_metric(_label_values(CROSSOVER_STATE, c, state=s.value), 1 if s is c.state else 0)
        yield from (size, lower, upper, ci_lower, ci_upper, states, derived_at)


def _largest_flops(latest: Snapshot) -> GaugeMetricFamily:
    """Each GPU's rate at its largest configured size served, by dtype and mode."""
    gpus = {(d.backend, d.device) for d in latest.devices if d.kind == "gpu"}
    largest: dict[tuple[str, str, str, str], Measurement] = {}
    for m in latest.measurements:
        key = (m.key.backend, m.key.device, m.key.dtype, m.key.mode)
        if m.role == "sweep" and key[:2] in gpus and (key not in largest or m.key.size > largest[key].key.size):
            largest[key] = m
    family = _gauge(LARGEST_FLOPS)
    for m in largest.values():
        family.add_metric(_label_values(LARGEST_FLOPS, m.key), m.flops_per_second)
    return family


def build_registry(
    read_state: Callable[[], ServiceState], *, backend: str, profile: Profile = "node"
) -> CollectorRegistry:
    """A registry of the service's own (never the global one) holding only the state collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(read_state, backend=backend, profile=profile))
    return registry


# The two expositions served, by what a scraper's Accept header is reduced to. Only these two reach
# prometheus_client, whose own negotiation echoes the client's version= into the content type (a
# cache keyed on it grew with every new header) and raises on a version that is not a number.
_OPENMETRICS = "application/openmetrics-text; version=1.0.0"
_TEXT = ""  # prometheus_client's text format 0.0.4


def exposition_type(accept_header: str | None) -> str:
    """Which of the two expositions answers this Accept header: the canonical header ``render`` takes.

    OpenMetrics when the header accepts it (no version, or a 1.x one) with a weight at least that of
    any text format it accepts; otherwise the text format 0.0.4, which every Prometheus reads (also
    for a header that accepts neither: an exporter answers with what it has). ``q=0`` refuses a type.
    """
    best_text = best_openmetrics = -1.0
    for position, item in enumerate((accept_header or "").split(",")):
        media, *params = (part.strip() for part in item.split(";"))
        options = dict(p.partition("=")[::2] for p in params)
        try:
            weight = float(options.get("q", "1"))
        except ValueError:
            weight = 0.0
        weight -= position * 1e-6  # equal weights: the first listed wins
        if weight <= 0:
            continue
        media = media.lower()
        if media == "application/openmetrics-text" and options.get("version", "1.0.0").startswith("1."):
            best_openmetrics = max(best_openmetrics, weight)
        elif media in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text, weight)
    return _OPENMETRICS if best_openmetrics > 0 and best_openmetrics >= best_text else _TEXT


def render(registry: CollectorRegistry, exposition: str) -> tuple[bytes, str]:
    """The body and content type of one of the expositions ``exposition_type`` names."""
    encoder, content_type = choose_encoder(exposition)
    return encoder(registry), content_type


# The process's own series, as every exporter serves them (client_python's collectors): CPU seconds, resident
# and virtual memory, start time, open and maximum file descriptors, and the Python build. Rendered apart from
# the state's body, which is kept per state: these move between scrapes.
_PROCESS_REGISTRY = CollectorRegistry(auto_describe=False)
ProcessCollector(registry=_PROCESS_REGISTRY)
PlatformCollector(registry=_PROCESS_REGISTRY)
_EOF = b"# EOF\n"  # OpenMetrics' last line


def with_process_metrics(body: bytes, exposition: str) -> bytes:
    """``body`` (a state's /metrics) with the process's series rendered now, before OpenMetrics' ``# EOF``."""
    encoder, _ = choose_encoder(exposition)
    process = encoder(_PROCESS_REGISTRY)
    if body.endswith(_EOF):
        return body[: -len(_EOF)] + process
    return body + process


def render_state(state: ServiceState, exposition: str, *, backend: str, profile: Profile = "node") -> tuple[bytes, str]:
    """/metrics of this one state (the caller read it once) in one profile: body and content type, as ``render``
    gives them."""
    return render(build_registry(lambda: state, backend=backend, profile=profile), exposition)


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a text exposition (what /metrics serves) as (name, labels, value); ValueError if malformed."""
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
