"""How the Prometheus rules scale with the fleet: N simulated 8-GPU nodes, a day of their history, a real Prometheus.

Each node serves what the service renders (``crossover_monitor.metrics.render_state`` in the OpenMetrics that
Prometheus 2.42 asks for, with the process's own series) for a state built as the tests' builders build one: a
recorded single-GPU scrape (``--node``) read back into a sweep, its GPU repeated ``--gpus`` times. Between sweeps
(15 minutes) only values move: each GPU's n* per mode is the recorded one times a ratio drawn from the idle sweeps
of ``--spreads`` (each run's n* over its own median), each point's time moves about 2%, the timestamps and the
success counter step; the first node's n* moves x1.4 in its last 3 hours (the planted drift). While they are measured
the nodes go on sweeping: each serves its next sweep (timestamps, counter and a new draw of n*) every 15 minutes
after the history's last, so that no result turns stale however long the run takes.

The history (``--history``) is written as OpenMetrics and turned into blocks with ``promtool tsdb
create-blocks-from openmetrics``, two hours at a time. A series that a rule reads over a range or at an offset
gets a sample every scrape interval, as a scraped one has; any other series one per sweep, when its value
changes (only instant lookups read those, and none reaches into the history). Recorded series that rules read
over a range are written as their rules compute them: those of ``RECORDED_EXPRESSIONS`` where ``--rules`` records
them so, and any recorded as a plain copy of one metric; any other is listed in the results as given no history.
A first Prometheus compacts the blocks as a long-running one would have; a second, pinned to ``--cpus``, scrapes
every node from one local HTTP server at ``--scrape-interval`` and evaluates ``--rules``. After ``--warmup``
evaluations it records each group's evaluation time over ``--measure`` more (``/api/v1/rules``), iterations
missed, head series, resident memory, its CPU and the series per node; then each rule's samples read
(``stats=all``). The scales are fitted by least squares and extrapolated to 1,000 and 10,000 nodes.

    python benchmarks/fleet.py --scales 25,50,100,200 --out benchmarks/results/fleet-full-DATE.json
    python benchmarks/fleet.py --smoke        # 3 nodes, 3 h of history, 5 s intervals: the pipeline, in ~30 s
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import datetime as dt
import hashlib
import http.server
import inspect
import json
import math
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import replay  # noqa: E402 - the recorded sweeps' reader (benchmarks/ is the script's own folder)

from crossover_monitor import metrics  # noqa: E402
from crossover_monitor.analysis.ranges import OTHERS_SWEEPS_TO_JUDGE  # noqa: E402
from crossover_monitor.model import (  # noqa: E402
    WORKER_CPU_SECONDS,
    WORKER_PEAK_RSS_BYTES,
    CostModel,
    Crossover,
    CrossoverState,
    DeviceInfo,
    HardwareContext,
    Measurement,
    Mode,
    PointKey,
    RetryResult,
    ServiceState,
    Snapshot,
    StopReason,
    SweepOutcome,
    SweepResult,
    Timing,
    Withheld,
    WithheldReason,
)

RESULTS = REPO / "benchmarks" / "results"
DEFAULT_NODE = RESULTS / "fleet-node-h100-torch-2026-12-07.prom"
DEFAULT_SPREADS = (
    RESULTS / "gpu-proof-torch-h200-2026-12-03b.jsonl",
    RESULTS / "gpu-proof-torch-idlemeter-h200-2026-12-03.jsonl",
    RESULTS / "gpu-proof-torch-more-h200-2026-12-01b.jsonl",
    RESULTS / "shared-node-torch-membw-ranges-h100-2026-12-07.json",
)
# What Prometheus 2.42 sends when it scrapes: each node answers it as the service would.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
JOB = "crossover-monitor"
FULL = "full"  # every series the service renders: its default profile (`node` since profiles came)
SWEEP_S = 900  # the default schedule
PLANT_FACTOR = 1.4
PLANT_S = 3 * 3600
POINT_NOISE = 0.02  # log SD of a point's time between sweeps: no rule reads it, it only keeps the blocks honest
BLOCK_S = 2 * 3600  # promtool 2.42 writes 2-hour blocks (it has no --max-block-duration)
EVAL_SHARE = 0.10  # the target: every group's evaluation within 10% of its interval
RSS_TARGET = 8 * 2**30
EXTRAPOLATE_TO = (1_000, 10_000)

# Metric families whose values step with each sweep, and how (every other series keeps its recorded value).
SWEEP_TIMES = {
    "matmul_sweep_last_success_timestamp_seconds",
    "matmul_sweep_next_timestamp_seconds",
    "matmul_device_measured_timestamp_seconds",
    "matmul_crossover_timestamp_seconds",
}
NSTAR = {
    "matmul_crossover_size",
    "matmul_crossover_lower_size",
    "matmul_crossover_upper_size",
    "matmul_crossover_ci_lower_size",
    "matmul_crossover_ci_upper_size",
}
POINT_TIMES = {"matmul_duration_seconds", "matmul_duration_iqr_seconds"}
POINT_RATES = {"matmul_flops_per_second", "matmul_largest_size_flops_per_second"}


def _squash(expr: str) -> str:
    return " ".join(expr.split())


# Recorded series that rules read over a range, with the expressions (each a way the rules have written it) each
# is recorded from: the history holds them as a Prometheus that ran for a day would. A rules file that records one
# of these names otherwise gets no history for it (the results list it), rather than this one's.
RECORDED_EXPRESSIONS = {
    "instance_gpu:matmul_crossover_size:ln": ("ln(matmul_crossover_size)",),
    "instance_gpu:matmul_crossover_timestamp_seconds:found": (
        "matmul_crossover_timestamp_seconds and matmul_crossover_size",
    ),
    "instance_gpu:matmul_crossover_timestamp_seconds:ambiguous": (
        (
            "matmul_crossover_timestamp_seconds and on (job, instance, backend, gpu, cpu, dtype, mode) "
            '(matmul_crossover_state{state="ambiguous"} == 1)'
        ),
    ),
    "instance_gpu:matmul_crossover_timestamp_seconds:moved2h": (
        (
            "instance_gpu:matmul_crossover_timestamp_seconds:found and ( (instance_gpu:matmul_crossover_size:ln - "
            "instance_gpu:matmul_crossover_size:ln_avg1d_before2h) * sgn(instance_gpu:matmul_crossover_size:ln_move2h) > "
            "on () group_left () ln(1 + 0.75 * matmul:crossover_drift_threshold:ratio) )"
        ),
        # The same with its window means inline (issue 52's groups).
        (
            "instance_gpu:matmul_crossover_timestamp_seconds:found and ( (instance_gpu:matmul_crossover_size:ln - "
            "avg_over_time(instance_gpu:matmul_crossover_size:ln[1d] offset 2h)) * "
            "sgn((avg_over_time(instance_gpu:matmul_crossover_size:ln[2h]) - "
            "avg_over_time(instance_gpu:matmul_crossover_size:ln[1d] offset 2h))) > on () group_left () "
            "ln(1 + 0.75 * matmul:crossover_drift_threshold:ratio) )"
        ),
        # The same with the day before recorded once an evaluation (issue 52, after the split).
        (
            "instance_gpu:matmul_crossover_timestamp_seconds:found and ( (instance_gpu:matmul_crossover_size:ln - "
            "instance_gpu:matmul_crossover_size:ln_avg1d_before2h) * "
            "sgn((avg_over_time(instance_gpu:matmul_crossover_size:ln[2h]) - "
            "instance_gpu:matmul_crossover_size:ln_avg1d_before2h)) > on () group_left () "
            "ln(1 + 0.75 * matmul:crossover_drift_threshold:ratio) )"
        ),
    ),
    "instance_device:matmul_flops_per_second:largest_size": (
        (
            "matmul_flops_per_second and on (job, instance, backend, device, dtype, mode, size) topk by (job, instance, "
            "backend, device, dtype, mode) (1, matmul_duration_seconds) and on (job, instance, backend, device) "
            'matmul_device_info{kind="gpu"}'
        ),
    ),
    "instance:matmul_sweep_interval_seconds:observed": (
        (
            "matmul_sweep_next_timestamp_seconds - matmul_sweep_last_success_timestamp_seconds + "
            "matmul_sweep_duration_seconds"
        ),
    ),
    "instance:matmul_sweep_interval_seconds:estimate": (
        "min_over_time(instance:matmul_sweep_interval_seconds:observed[7d])",
    ),
}
MOVED_THRESHOLD = math.log(1 + 0.75 * 0.2)  # moved2h's: 3/4 of matmul:crossover_drift_threshold:ratio


# ---------------------------------------------------------------------------------------------------------------
# The node: a recorded scrape read back into the state it was rendered from, its GPU repeated.


class Scrape:
    """A recorded scrape of /metrics, by metric name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.series: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for name, labels, value in metrics.parse_exposition(path.read_text(encoding="utf-8")):
            self.series[name].append((labels, value))

    def one(self, name: str) -> float | None:
        return self.series[name][0][1] if self.series.get(name) else None

    def by(self, name: str, *keys: str) -> dict[tuple[str, ...], float]:
        return {tuple(labels[k] for k in keys): value for labels, value in self.series.get(name, [])}


def _mode(labels: dict[str, str]) -> Mode:
    return "compute" if labels["mode"] == "compute" else "end_to_end"


def _measurements(scrape: Scrape) -> tuple[Measurement, ...]:
    keys = ("backend", "device", "dtype", "mode", "size")
    spreads, noisy = scrape.by("matmul_duration_iqr_seconds", *keys), scrape.by("matmul_duration_noisy", *keys)
    found = []
    for labels, median in scrape.series["matmul_duration_seconds"]:
        key = tuple(labels[k] for k in keys)
        flagged = noisy.get(key, 0) > 0
        timing = Timing(
            median_s=median,
            iqr_s=spreads.get(key, 0.0),
            blocks=5,  # not on /metrics: the builders' plain ones
            calls_per_block=1,
            stop_reason=StopReason.MAX_BLOCKS if flagged else StopReason.CONVERGED,
            noisy=flagged,
        )
        point = PointKey(backend=key[0], device=key[1], dtype=key[2], mode=_mode(labels), size=int(key[4]))
        found.append(Measurement(key=point, timing=timing))
    return tuple(found)


def _devices(scrape: Scrape) -> tuple[DeviceInfo, ...]:
    return tuple(
        DeviceInfo(
            backend=labels["backend"],
            device=labels["device"],
            kind="gpu" if labels["kind"] == "gpu" else "cpu",
            name=labels["name"],
            details=tuple(
                (key, labels[label]) for label, key in metrics.DEVICE_DETAIL_LABELS.items() if labels.get(label)
            ),
        )
        for labels, _ in scrape.series["matmul_device_info"]
    )


def _costs(scrape: Scrape, largest: int) -> tuple[CostModel, ...]:
    peaks = scrape.by("matmul_peak_flops_per_second", "backend", "device", "dtype", "mode")
    return tuple(
        CostModel(
            backend=labels["backend"],
            device=labels["device"],
            dtype=labels["dtype"],
            mode=_mode(labels),
            fixed_s=fixed,
            peak_flops=peaks.get((labels["backend"], labels["device"], labels["dtype"], labels["mode"])),
            largest_size=largest,
        )
        for labels, fixed in scrape.series.get("matmul_fixed_cost_seconds", [])
    )


def _crossovers(scrape: Scrape) -> tuple[Crossover, ...]:
    keys = ("backend", "gpu", "cpu", "dtype", "mode")
    bounds = {
        field: scrape.by(f"matmul_crossover_{metric}", *keys)
        for field, metric in (
            ("size", "size"),
            ("lower", "lower_size"),
            ("upper", "upper_size"),
            ("ci_lower", "ci_lower_size"),
            ("ci_upper", "ci_upper_size"),
            ("derived_at", "timestamp_seconds"),
        )
    }
    found = []
    for labels, value in scrape.series.get("matmul_crossover_state", []):
        if value == 1:
            pair = tuple(labels[k] for k in keys)
            found.append(
                Crossover(
                    backend=pair[0],
                    gpu=pair[1],
                    cpu=pair[2],
                    dtype=pair[3],
                    mode=_mode(labels),
                    state=CrossoverState(labels["state"]),
                    **{f: values.get(pair) for f, values in bounds.items()},
                )
            )
    return tuple(found)


def _hardware(scrape: Scrape) -> tuple[HardwareContext, ...]:
    readings: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    kinds = {f.name: str(f.type) for f in dataclasses.fields(HardwareContext)}
    for name, field in metrics.HARDWARE_GAUGES:
        for labels, value in scrape.series.get(name, []):
            readings[labels["backend"], labels["device"]][field] = int(value) if "int" in kinds[field] else value
    for labels, value in scrape.series.get("matmul_gpu_clock_event", []):
        if value == 1:
            fields = readings[labels["backend"], labels["device"]]
            fields["clock_events"] = (*fields.get("clock_events", ()), labels["reason"])
    return tuple(HardwareContext(backend=b, device=d, **f) for (b, d), f in readings.items())


def _environment(scrape: Scrape) -> tuple[tuple[str, str], ...]:
    found = {k: v for k, v in scrape.series["matmul_benchmark_info"][0][0].items() if k != "backend" and v}
    if (seconds := scrape.one("matmul_sweep_worker_cpu_seconds")) is not None:
        found[WORKER_CPU_SECONDS] = f"{seconds:.3f}"
    if (peak := scrape.one("matmul_sweep_worker_peak_memory_bytes")) is not None:
        found[WORKER_PEAK_RSS_BYTES] = f"{peak:.0f}"
    return tuple(sorted(found.items()))


def recorded_state(path: Path) -> tuple[ServiceState, str]:
    """The state a recorded scrape of /metrics was rendered from, as far as /metrics shows it, and its backend."""
    scrape = Scrape(path)
    if any(value > 0 for _, value in scrape.series.get("matmul_points_withheld", [])):
        raise SystemExit(f"{path}: its sweep withheld points alone, which /metrics does not name; pick another")
    finished = scrape.one("matmul_sweep_last_success_timestamp_seconds")
    measurements = _measurements(scrape)
    if finished is None or not measurements:
        raise SystemExit(f"{path}: no completed sweep in this scrape")
    started = finished - (scrape.one("matmul_sweep_duration_seconds") or 0.0)
    snapshot = Snapshot(
        started_at=started,
        finished_at=finished,
        devices=_devices(scrape),
        measurements=measurements,
        crossovers=_crossovers(scrape),
        costs=_costs(scrape, max(m.key.size for m in measurements)),
        environment=_environment(scrape),
        withheld=tuple(
            Withheld(
                backend=labels["backend"],
                device=labels["device"],
                reason=WithheldReason(labels["reason"]),
                detail="withheld in the recorded sweep",
            )
            for labels, value in scrape.series.get("matmul_device_withheld", [])
            if value > 0
        ),
        hardware=_hardware(scrape),
        measured_at=tuple(
            (labels["device"], v) for labels, v in scrape.series.get("matmul_device_measured_timestamp_seconds", [])
        ),
    )
    counts = scrape.by("matmul_sweeps_total", "result")
    retries = scrape.by("matmul_busy_retries_total", "result")
    usual = scrape.one("matmul_host_usual_other_load_cores")
    loaded = scrape.one("matmul_config_last_reload_successful")
    state = ServiceState(
        latest=snapshot,
        last_success_at=finished,
        last_outcome=SweepOutcome(
            result=SweepResult.SUCCESS, started_at=started, finished_at=finished, snapshot=snapshot
        ),
        sweeps=tuple((r, int(counts.get((r.value,), 0))) for r in SweepResult),
        next_sweep_at=scrape.one("matmul_sweep_next_timestamp_seconds"),
        retries=tuple((r, int(retries.get((r.value,), 0))) for r in RetryResult),
        config_loaded=None if loaded is None else loaded == 1,
        config_loaded_at=scrape.one("matmul_config_last_reload_success_timestamp_seconds"),
        others_typical=() if usual is None else (usual,) * OTHERS_SWEEPS_TO_JUDGE,
    )
    (build,) = [labels for labels, _ in scrape.series["matmul_monitor_build_info"]]
    return state, build["backend"]


def _gpu_name(device: str, index: int) -> str:
    """The ``index``-th GPU's name in the recorded GPU's spelling: cuda:0 -> cuda:3, /GPU:0 -> /GPU:3."""
    return re.sub(r"\d+$", str(index), device)


def node_state(
    base: ServiceState,
    *,
    gpus: int,
    node: int,
    finished: float,
    nstar: dict[tuple[int, str], float],
    sweeps: int,
    loaded_at: float,
) -> ServiceState:
    """``base`` (one GPU) as a node of ``gpus`` of them whose latest sweep ended at ``finished``: each GPU its own
    UUID and PCI address, its crossovers' n* and bounds scaled by ``nstar[(gpu, mode)]``; ``sweeps`` more
    successes counted; its configuration loaded at ``loaded_at``."""
    latest = base.latest
    assert latest is not None
    (gpu,) = [d.device for d in latest.devices if d.kind == "gpu"]
    names = [_gpu_name(gpu, k) for k in range(gpus)]

    def each(device: str) -> list[tuple[int, str]]:
        return list(enumerate(names)) if device == gpu else [(-1, device)]

    def identity(k: int) -> tuple[tuple[str, str], ...]:
        return (
            ("uuid", f"GPU-{uuid.UUID(int=(node << 32) | (k + 1))}"),
            ("pci_bus_id", f"00000000:{(0x18 + 0x10 * k) % 0x100:02X}:00.0"),
        )

    devices = []
    for d in latest.devices:
        for k, name in each(d.device):
            kept = tuple((key, v) for key, v in d.details if key not in {"uuid", "pci_bus_id"})
            devices.append(dataclasses.replace(d, device=name, details=kept + identity(k) if k >= 0 else d.details))
    crossovers = []
    for c in latest.crossovers:
        for k, name in each(c.gpu):
            scale = nstar.get((k, c.mode), 1.0)

            def scaled(value: float | None, scale: float = scale) -> float | None:
                return None if value is None else value * scale

            crossovers.append(
                dataclasses.replace(
                    c,
                    gpu=name,
                    size=scaled(c.size),
                    lower=scaled(c.lower),
                    upper=scaled(c.upper),
                    ci_lower=scaled(c.ci_lower),
                    ci_upper=scaled(c.ci_upper),
                    derived_at=finished,
                )
            )
    started = finished - (latest.finished_at - latest.started_at)
    snapshot = dataclasses.replace(
        latest,
        started_at=started,
        finished_at=finished,
        devices=tuple(devices),
        measurements=tuple(
            dataclasses.replace(m, key=dataclasses.replace(m.key, device=name))
            for m in latest.measurements
            for _, name in each(m.key.device)
        ),
        crossovers=tuple(crossovers),
        costs=tuple(dataclasses.replace(c, device=name) for c in latest.costs for _, name in each(c.device)),
        hardware=tuple(dataclasses.replace(h, device=name) for h in latest.hardware for _, name in each(h.device)),
        withheld=tuple(dataclasses.replace(w, device=name) for w in latest.withheld for _, name in each(w.device)),
        measured_at=tuple((name, finished) for device, _ in latest.measured_at for _, name in each(device)),
    )
    counts = dict(base.sweeps)
    counts[SweepResult.SUCCESS] += sweeps
    return dataclasses.replace(
        base,
        latest=snapshot,
        last_success_at=finished,
        last_outcome=SweepOutcome(
            result=SweepResult.SUCCESS, started_at=started, finished_at=finished, snapshot=snapshot
        ),
        sweeps=tuple(counts.items()),
        next_sweep_at=started + SWEEP_S,
        config_loaded_at=loaded_at,
    )


def render_node(state: ServiceState, profile: str, *, backend: str, exposition: str) -> tuple[bytes, str]:
    """One node's /metrics as the service serves it in ``profile``: the state's series in ``exposition``, then the
    process's own. ``full`` is the renderer's default (every series); any other name is passed to it as
    ``profile=`` (``/metrics?profile=NAME``), which a renderer without profiles cannot take."""
    renderer: Callable[..., tuple[bytes, str]] = metrics.render_state
    options: dict[str, str] = {"backend": backend}
    if profile != FULL:
        if "profile" not in inspect.signature(renderer).parameters:
            raise SystemExit(
                f"--profile {profile}: crossover_monitor.metrics.render_state takes no profile= keyword, so it "
                f"renders the full /metrics only (--profile {FULL})"
            )
        options["profile"] = profile
    body, content_type = renderer(state, exposition, **options)
    return metrics.with_process_metrics(body, exposition), content_type


# ---------------------------------------------------------------------------------------------------------------
# The rules: which series they read over a range or at an offset, and the recorded ones this tool can write.


@dataclasses.dataclass(frozen=True)
class RulesInfo:
    groups: list[dict[str, Any]]  # name, interval (None: the global one), rules
    ranged: set[str]  # every metric name read over a range or at an offset
    recorded: dict[str, str]  # record name -> its expression, squashed


SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*(\[|offset\b)")


def _recording_interval(path: Path, scrape_s: float) -> float:
    """The interval of the group that records n* as a logarithm (the windows' input), as ``path`` gives it; the
    scrape interval where it gives none."""
    for group in yaml.safe_load(path.read_text(encoding="utf-8")).get("groups", []):
        if any(rule.get("record") == "instance_gpu:matmul_crossover_size:ln" for rule in group.get("rules", [])):
            return _seconds(str(group["interval"])) if group.get("interval") else scrape_s
    return scrape_s


def read_rules(path: Path) -> RulesInfo:
    """The groups of ``path`` and the metric names its expressions read over a range (``name[1d]``) or at an
    offset (``name offset 6h``): those need a sample every scrape interval in the history."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups, ranged, recorded = [], set(), {}
    for group in loaded.get("groups", []):
        rules = group.get("rules", [])
        groups.append({"name": group["name"], "interval": group.get("interval"), "rules": len(rules)})
        for rule in rules:
            expr = str(rule["expr"])
            ranged |= {m.group(1) for m in SELECTOR.finditer(expr) if m.group(1) not in {"by", "without", "on"}}
            if "record" in rule:
                recorded[rule["record"]] = _squash(expr)
    return RulesInfo(groups=groups, ranged=ranged, recorded=recorded)


# ---------------------------------------------------------------------------------------------------------------
# The simulated nodes and their history.


def idle_ratios(paths: Sequence[Path]) -> dict[str, list[float]]:
    """Per mode, each recorded idle sweep's n* over the median of its run's: the spread a node's n* is drawn from."""
    ratios: dict[str, list[float]] = {"compute": [], "end_to_end": []}
    for path in paths:
        outcomes = replay.load([str(path)])
        for mode, kept in ratios.items():
            sizes = [c.size for o in outcomes if o.snapshot for c in o.snapshot.crossovers if c.mode == mode and c.size]
            if sizes:
                middle = statistics.median(sizes)
                kept += [size / middle for size in sizes]
    return {mode: kept or [1.0] for mode, kept in ratios.items()}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _series_text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


@dataclasses.dataclass
class SimNode:
    """One simulated node: its live body, its series, and each sweep's values."""

    instance: str
    planted: bool
    body: bytes
    content_type: str
    names: list[str]
    labels: list[dict[str, str]]
    last: list[float]  # the values it serves now (its latest sweep's)
    finished: list[float]  # each sweep's end, oldest first (the last is the served one)
    ratios: list[dict[tuple[str, str], float]]  # each sweep's n* over the served one, per (gpu, mode)
    noise: list[list[float]]  # each sweep's factor on each series' point time (1 for the others)
    offset: float  # where in the scrape interval Prometheus would scrape it
    # The body after ``j`` more sweeps than the history holds (the run goes on sweeping while it is measured: a body
    # held at the history's last sweep would turn stale, and MatmulResultsStale would fire on every node).
    later: Callable[[int], bytes] | None = None
    later_bodies: dict[int, bytes] = dataclasses.field(default_factory=dict)
    dense: list[int] = dataclasses.field(default_factory=list)
    sparse: list[int] = dataclasses.field(default_factory=list)
    prefixes: list[str] = dataclasses.field(default_factory=list)
    cached: tuple[int, list[str], list[str], list[str]] | None = None
    sparse_written: int = -1
    recorded_slot: int = -1

    def body_at(self, t: float) -> bytes:
        """What the node serves at ``t``: its latest sweep then, one every SWEEP_S after the history's last."""
        j = int((t - self.finished[-1]) // SWEEP_S)
        if j <= 0 or self.later is None:
            return self.body
        if j not in self.later_bodies:
            self.later_bodies.clear()  # one sweep's body at a time: at 1,000 nodes they are tens of MB
            self.later_bodies[j] = self.later(j)
        return self.later_bodies[j]

    def sweep_at(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.finished, t) - 1)

    def values(self, k: int) -> list[float]:
        """Every series' value after sweep ``k``."""
        steps = len(self.finished) - 1 - k
        values = []
        for i, (name, labels, last) in enumerate(zip(self.names, self.labels, self.last, strict=True)):
            if name in SWEEP_TIMES:
                values.append(last - steps * SWEEP_S)
            elif name == "matmul_sweeps_total" and labels.get("result") == "success":
                values.append(last - steps)
            elif name in NSTAR:
                values.append(last * self.ratios[k].get((labels["gpu"], labels["mode"]), 1.0))
            elif name in POINT_TIMES:
                values.append(last * self.noise[k][i])
            elif name in POINT_RATES:
                values.append(last / self.noise[k][i])
            else:
                values.append(last)
        return values


def simulate(
    count: int,
    *,
    base: ServiceState,
    backend: str,
    gpus: int,
    profile: str,
    ratios: dict[str, list[float]],
    end: float,
    history_s: float,
    scrape_s: float,
    seed: int,
) -> list[SimNode]:
    """``count`` nodes whose history runs to ``end``: each sweeping every 15 minutes at its own phase, its n*
    drawn per sweep, GPU and mode from ``ratios``; the first one planted."""
    exposition = metrics.exposition_type(PROMETHEUS_ACCEPT)
    text = metrics.exposition_type(None)
    sweeps = int(history_s // SWEEP_S) + 2  # the first ends before the history starts: every sample has a sweep
    gpu = next(d.device for d in base.latest.devices if d.kind == "gpu") if base.latest else "cuda:0"
    nodes = []
    for node in range(count):
        rng = random.Random(f"{seed}-{node}")
        last = end - rng.uniform(0, SWEEP_S)
        finished = [last - (sweeps - 1 - k) * SWEEP_S for k in range(sweeps)]
        planted = node == 0
        drawn = [
            {
                (k, mode): rng.choice(ratios[mode]) * (PLANT_FACTOR if planted and at > end - PLANT_S else 1.0)
                for k in range(gpus)
                for mode in ("compute", "end_to_end")
            }
            for at in finished
        ]
        state = node_state(
            base,
            gpus=gpus,
            node=node,
            finished=last,
            nstar=drawn[-1],
            sweeps=sweeps,
            loaded_at=finished[0] - 3600,
        )
        body, content_type = render_node(state, profile, backend=backend, exposition=exposition)
        plain, _ = render_node(state, profile, backend=backend, exposition=text)
        samples = metrics.parse_exposition(plain.decode())
        served = sorted(line.split("{")[0].split(" ")[0] for line in body.decode().splitlines() if line[:1] != "#")
        if served != sorted(name for name, _, _ in samples):
            raise SystemExit("the OpenMetrics and text renders of a node hold different series: cannot simulate it")
        names = [name for name, _, _ in samples]
        labels = [dict(sample_labels) for _, sample_labels, _ in samples]
        points = {}
        for i, (name, sample_labels) in enumerate(zip(names, labels, strict=True)):
            if name in POINT_TIMES | POINT_RATES:
                points[i] = tuple(sorted(sample_labels.items()))
        noise = []
        for k in range(sweeps):
            factor = {
                key: math.exp(rng.gauss(0, POINT_NOISE)) if k < sweeps - 1 else 1.0
                for key in sorted(set(points.values()))  # sorted: a set's order would change the draws
            }
            noise.append([factor[points[i]] if i in points else 1.0 for i in range(len(names))])

        def later(
            j: int, *, node: int = node, last: float = last, sweeps: int = sweeps, loaded_at: float = finished[0] - 3600
        ) -> bytes:
            drawn_then = random.Random(f"{seed}-{node}-live-{j}")
            nstar = {
                (k, mode): drawn_then.choice(ratios[mode]) * (PLANT_FACTOR if node == 0 else 1.0)
                for k in range(gpus)
                for mode in ("compute", "end_to_end")
            }
            state = node_state(
                base,
                gpus=gpus,
                node=node,
                finished=last + j * SWEEP_S,
                nstar=nstar,
                sweeps=sweeps + j,
                loaded_at=loaded_at,
            )
            return render_node(state, profile, backend=backend, exposition=exposition)[0]

        now = drawn[-1]
        ratios_by_name = [
            {(_gpu_name(gpu, g), mode): r / now[g, mode] for (g, mode), r in sweep.items()} for sweep in drawn
        ]
        nodes.append(
            SimNode(
                instance=f"node-{node:04d}",
                planted=planted,
                body=body,
                content_type=content_type,
                names=names,
                labels=labels,
                last=[value for _, _, value in samples],
                finished=finished,
                ratios=ratios_by_name,
                noise=noise,
                offset=rng.uniform(0, scrape_s),
                later=later,
            )
        )
    return nodes


@dataclasses.dataclass
class Recorder:
    """The recorded series that ``--rules`` reads over a range: those of ``RECORDED_EXPRESSIONS`` it records as
    there (``names``), and those it records as a copy of one scraped metric (``copies``: record -> metric)."""

    names: set[str]
    copies: dict[str, str]
    # How often the rules record them (their group's interval as --rules gives it): a day of a series recorded
    # every 5 minutes is 288 samples, and a window over it reads those, not the 2,880 of a 30 s scrape.
    every_s: float = 0.0

    # One branch per recorded series it knows.
    def series(self, node: SimNode, k: int, values: list[float]) -> list[tuple[str, float]]:  # noqa: PLR0912
        out: list[tuple[str, float]] = []
        index = {
            (name, tuple(sorted(labels.items()))): i
            for i, (name, labels) in enumerate(zip(node.names, node.labels, strict=True))
        }
        base = {"instance": node.instance, "job": JOB}
        for record, source in self.copies.items():
            out += [
                (_series_text(record, base | labels), values[i])
                for i, (name, labels) in enumerate(zip(node.names, node.labels, strict=True))
                if name == source
            ]
        for i, (name, labels) in enumerate(zip(node.names, node.labels, strict=True)):
            if name != "matmul_crossover_size":
                continue
            at = index.get(("matmul_crossover_timestamp_seconds", tuple(sorted(labels.items()))))
            if "instance_gpu:matmul_crossover_size:ln" in self.names:
                out.append((_series_text("instance_gpu:matmul_crossover_size:ln", base | labels), math.log(values[i])))
            if at is None:
                continue
            if "instance_gpu:matmul_crossover_timestamp_seconds:found" in self.names:
                out.append(
                    (_series_text("instance_gpu:matmul_crossover_timestamp_seconds:found", base | labels), values[at])
                )
            if "instance_gpu:matmul_crossover_timestamp_seconds:moved2h" in self.names and _moved(node, k, i):
                out.append(
                    (_series_text("instance_gpu:matmul_crossover_timestamp_seconds:moved2h", base | labels), values[at])
                )
        if "instance_gpu:matmul_crossover_timestamp_seconds:ambiguous" in self.names:
            for i, (name, labels) in enumerate(zip(node.names, node.labels, strict=True)):
                if name == "matmul_crossover_state" and labels.get("state") == "ambiguous" and values[i] == 1:
                    pair = {key: v for key, v in labels.items() if key != "state"}
                    at = index.get(("matmul_crossover_timestamp_seconds", tuple(sorted(pair.items()))))
                    if at is not None:
                        out.append(
                            (
                                _series_text("instance_gpu:matmul_crossover_timestamp_seconds:ambiguous", base | pair),
                                values[at],
                            )
                        )
        if "instance_device:matmul_flops_per_second:largest_size" in self.names:
            gpus = {
                labels["device"]
                for name, labels in zip(node.names, node.labels, strict=True)
                if name == "matmul_device_info" and labels.get("kind") == "gpu"
            }
            longest: dict[tuple[str, ...], tuple[float, int]] = {}
            for i, (name, labels) in enumerate(zip(node.names, node.labels, strict=True)):
                if name == "matmul_duration_seconds" and labels["device"] in gpus:
                    key = (labels["backend"], labels["device"], labels["dtype"], labels["mode"])
                    longest[key] = max(longest.get(key, (-1.0, -1)), (values[i], i))
            for _, i in longest.values():
                rate = index.get(("matmul_flops_per_second", tuple(sorted(node.labels[i].items()))))
                if rate is not None:
                    out.append(
                        (
                            _series_text("instance_device:matmul_flops_per_second:largest_size", base | node.labels[i]),
                            values[rate],
                        )
                    )
        interval = {
            "instance:matmul_sweep_interval_seconds:observed",
            "instance:matmul_sweep_interval_seconds:estimate",
        }
        if interval & self.names:
            parts = [
                index.get((name, ()))
                for name in (
                    "matmul_sweep_next_timestamp_seconds",
                    "matmul_sweep_last_success_timestamp_seconds",
                    "matmul_sweep_duration_seconds",
                )
            ]
            if None not in parts:
                nxt, last, took = (values[p] for p in parts if p is not None)
                # The estimate is the least observed over a week: every simulated sweep observes the same interval.
                out += [(_series_text(name, base), nxt - last + took) for name in sorted(interval & self.names)]
        return out


def _moved(node: SimNode, k: int, i: int) -> bool:
    """moved2h as its rule reads it when sweep ``k`` is served, at sweep granularity: this sweep's log n* beyond
    3/4 of the threshold from the day before the last 2 hours, the way the 2 hours' mean moved."""
    pair = (node.labels[i]["gpu"], node.labels[i]["mode"])
    last = node.last[i]
    finished = node.finished

    def ln(j: int) -> float:
        return math.log(last * node.ratios[j].get(pair, 1.0))

    window = [j for j in range(k + 1) if finished[k] - finished[j] < 2 * 3600]
    before = [j for j in range(k + 1) if 2 * 3600 <= finished[k] - finished[j] < 26 * 3600]
    if not before:
        return False
    baseline = statistics.fmean(ln(j) for j in before)
    move = statistics.fmean(ln(j) for j in window) - baseline
    return (ln(k) - baseline) * math.copysign(1.0, move) > MOVED_THRESHOLD if move else False


def _heads(node: SimNode, k: int, recorder: Recorder) -> tuple[list[str], list[str], list[str]]:
    """Sweep ``k``'s dense, recorded and sparse lines of ``node`` without their timestamps."""
    if node.cached is not None and node.cached[0] == k:
        return node.cached[1], node.cached[2], node.cached[3]
    values = node.values(k)
    dense = [f"{node.prefixes[i]} {values[i]!r}" for i in node.dense]
    recorded = [f"{text} {value!r}" for text, value in recorder.series(node, k, values)]
    sparse = [f"{node.prefixes[i]} {values[i]!r}" for i in node.sparse]
    node.cached = (k, dense, recorded, sparse)
    return dense, recorded, sparse


def write_chunk(
    path: Path, nodes: Sequence[SimNode], recorder: Recorder, *, start: float, stop: float, scrape_s: float
) -> int:
    """The samples of every node in [``start``, ``stop``) as OpenMetrics in ``path``; how many."""
    count = 0
    t = math.floor(start / scrape_s) * scrape_s - scrape_s
    with path.open("w", encoding="utf-8") as out:
        while t < stop:
            parts = []
            for node in nodes:
                at = t + node.offset
                if not start <= at < stop:
                    continue
                k = node.sweep_at(at)
                dense, recorded, sparse = _heads(node, k, recorder)
                stamp = f" {at:.3f}\n"
                lines = dense + sparse if node.sparse_written != k else list(dense)
                node.sparse_written = k
                slot = math.floor(at / recorder.every_s) if recorder.every_s > scrape_s else math.floor(at / scrape_s)
                if slot != node.recorded_slot:  # at the rules' own cadence, as their group writes them
                    lines += recorded
                    node.recorded_slot = slot
                if lines:
                    parts.append(stamp.join(lines) + stamp)
                    count += len(lines)
            out.write("".join(parts))
            t += scrape_s
        out.write("# EOF\n")
    return count


def write_history(
    nodes: Sequence[SimNode],
    *,
    rules: RulesInfo,
    recorder: Recorder,
    start: float,
    end: float,
    scrape_s: float,
    work: Path,
    data: Path,
    promtool: str,
) -> dict[str, Any]:
    """The nodes' history from ``start`` to ``end`` as TSDB blocks in ``data``: written two hours at a time, each
    piece turned into blocks by promtool while the next is written."""
    for node in nodes:
        node.prefixes = [
            _series_text(name, labels | {"instance": node.instance, "job": JOB})
            for name, labels in zip(node.names, node.labels, strict=True)
        ]
        node.dense = [i for i, name in enumerate(node.names) if name in rules.ranged]
        node.sparse = [i for i, name in enumerate(node.names) if name not in rules.ranged]
    written = 0
    text_bytes = 0
    took = {"write_s": 0.0, "promtool_wait_s": 0.0}
    pending: tuple[subprocess.Popen[bytes], Path] | None = None

    def finish(job: tuple[subprocess.Popen[bytes], Path]) -> None:
        began = time.monotonic()
        process, path = job
        _, error = process.communicate()
        took["promtool_wait_s"] += time.monotonic() - began
        path.unlink()
        if process.returncode != 0:
            raise SystemExit(
                f"promtool tsdb create-blocks-from openmetrics failed on {path.name}: {error.decode()[-2000:]}"
            )

    try:
        piece = math.floor(start / BLOCK_S) * BLOCK_S
        while piece < end:
            path = work / f"history-{piece:.0f}.om"
            began = time.monotonic()
            written += write_chunk(
                path, nodes, recorder, start=max(start, piece), stop=min(end, piece + BLOCK_S), scrape_s=scrape_s
            )
            took["write_s"] += time.monotonic() - began
            text_bytes += path.stat().st_size
            if pending is not None:
                finish(pending)
            command = [promtool, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(path), str(data)]
            pending = (subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE), path)
            piece += BLOCK_S
        if pending is not None:
            finish(pending)
            pending = None
    finally:
        if pending is not None:
            pending[0].kill()
            pending[0].wait()
    return {"samples": written, "openmetrics_bytes": text_bytes, **{k: round(v, 1) for k, v in took.items()}}


def blocks(data: Path) -> list[dict[str, Any]]:
    """The TSDB blocks in ``data``: span in hours, samples, series."""
    found = []
    for meta in sorted(data.glob("*/meta.json")):
        content = json.loads(meta.read_text())
        found.append(
            {
                "hours": round((content["maxTime"] - content["minTime"]) / 3.6e6, 2),
                "samples": content["stats"].get("numSamples", 0),
                "series": content["stats"].get("numSeries", 0),
            }
        )
    return found


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------------------------
# The live side: one HTTP server for every node, and Prometheus.


@contextlib.contextmanager
def serving(nodes: Sequence[SimNode]) -> Iterator[int]:
    """An HTTP server on a free loopback port answering /node/NAME with that node's body; its port."""
    by_path = {f"/node/{node.instance}": node for node in nodes}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            node = by_path.get(self.path)
            if node is None:
                self.send_error(404)
                return
            body = node.body_at(time.time())
            self.send_response(200)
            self.send_header("Content-Type", node.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the signature http.server calls
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _seconds(text: str) -> float:
    """A Prometheus duration (``30s``, ``1m``, ``26h``, ``1d``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    total, rest = 0.0, text.strip()
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", rest):
        total += float(number) * units[unit]
    if not total or re.sub(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", "", rest):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 26h)")
    return total


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


class Prometheus:
    """A Prometheus process on a free loopback port, and its HTTP API."""

    def __init__(self, binary: str, config: dict[str, Any], data: Path, work: Path, cpus: str | None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = work / f"prometheus-{self.port}.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = work / f"prometheus-{self.port}.log"
        command = [
            binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=30d",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if cpus:
            command = ["taskset", "-c", cpus, *command]
        self._log: IO[bytes] = self.log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()

    def get(self, path: str, *, timeout: float = 120, query: dict[str, str] | None = None) -> Any:
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - a loopback http URL built here
            body = answer.read().decode()
        return json.loads(body) if path.startswith("/api/") else body

    def query(self, expr: str) -> Any:
        return self.get("/api/v1/query", query={"query": expr})["data"]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (name, tuple(sorted(labels.items()))): value
            for name, labels, value in metrics.parse_exposition(self.get("/metrics"))
        }

    def wait_ready(self, limit_s: float = 300) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"prometheus exited ({self.process.returncode}): {self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError, ValueError):
                if "Ready" in self.get("/-/ready", timeout=5):
                    return
            time.sleep(0.5)
        raise SystemExit(f"prometheus not ready after {limit_s:.0f} s: {self.log_path.read_text()[-3000:]}")

    def status(self) -> dict[str, int]:
        """Its resident memory now and at its peak, from /proc, in bytes."""
        found = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in {"VmRSS", "VmHWM"}:
                    found[key] = int(value.split()[0]) * 1024
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def compact(binary: str, data: Path, work: Path, limit_s: float) -> dict[str, Any]:
    """Let a Prometheus with nothing to scrape compact the written 2-hour blocks as a long-running one would have
    (its compactor first runs a minute after start, and runs until nothing is left to do; the second run's
    start says the first finished)."""
    began = time.monotonic()
    prometheus = Prometheus(binary, {"global": {"scrape_interval": "1m"}}, data, work, None)
    try:
        prometheus.wait_ready()
        deadline = time.monotonic() + limit_s
        triggered = 0.0
        while time.monotonic() < deadline:
            found = prometheus.metrics()
            triggered = _value(found, "prometheus_tsdb_compactions_triggered_total") or 0.0
            if triggered >= 2:
                break
            time.sleep(2)
        found = prometheus.metrics()
        return {
            "seconds": round(time.monotonic() - began, 1),
            "compactions": _value(found, "prometheus_tsdb_compactions_total"),
            "finished": triggered >= 2,
        }
    finally:
        prometheus.stop()


# ---------------------------------------------------------------------------------------------------------------
# One scale.


def loadavg() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def wait_for_quiet(threshold: float, limit_s: float) -> dict[str, Any]:
    """Wait up to ``limit_s`` for the 1-minute load to fall below ``threshold`` (other work on a shared machine)."""
    began = time.monotonic()
    while loadavg()[0] >= threshold and time.monotonic() - began < limit_s:
        time.sleep(10)
    return {"waited_s": round(time.monotonic() - began), "load": loadavg()}


def _cpu_set(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus |= set(range(int(low), int(high or low) + 1))
    return cpus


def _group_key(group: dict[str, Any]) -> str:
    return f"{group['file']};{group['name']}"


def _rule_names(group: dict[str, Any]) -> list[str]:
    """Each rule's name in the group, alerts marked and repeated names numbered (three rules fire one alert)."""
    names: list[str] = []
    for rule in group["rules"]:
        name = rule["name"] + ("" if rule["type"] == "recording" else " (alert)")
        seen = sum(1 for n in names if n == name or n.startswith(f"{name} #"))
        names.append(f"{name} #{seen + 1}" if seen else name)
    return names


def observe_groups(prometheus: Prometheus, *, warmup: int, measure: int, interval_s: float) -> dict[str, Any]:
    """Each group's evaluation time over ``measure`` evaluations after ``warmup`` (``/api/v1/rules``), with each
    rule's, and Prometheus's resident memory meanwhile. A group slower than ``interval_s`` counts 2 after 1: the
    faster groups have warmed Prometheus by then, and more would keep each scale for an hour at 5 minutes."""
    seen: dict[str, str] = {}
    counts: dict[str, int] = defaultdict(int)
    taken: dict[str, list[float]] = defaultdict(list)
    per_rule: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    intervals: dict[str, float] = {}
    rss: list[int] = []

    def needs(key: str) -> tuple[int, int]:
        return (warmup, measure) if intervals[key] <= interval_s else (1, 2)

    began = time.monotonic()
    while True:
        for group in prometheus.get("/api/v1/rules")["data"]["groups"]:
            key = _group_key(group)
            intervals[key] = float(group["interval"])
            if key in seen and group["lastEvaluation"] != seen[key]:
                counts[key] += 1
                skip, keep = needs(key)
                if counts[key] > skip and len(taken[key]) < keep:
                    taken[key].append(float(group["evaluationTime"]))
                    for name, rule in zip(_rule_names(group), group["rules"], strict=True):
                        per_rule[key][name].append(float(rule["evaluationTime"]))
            seen[key] = group["lastEvaluation"]
        if taken:
            rss.append(prometheus.status().get("VmRSS", 0))
        if seen and all(len(taken[k]) >= needs(k)[1] for k in seen):
            break
        slowest = max((sum(needs(k)) + 2) * intervals[k] for k in seen) if seen else interval_s
        if time.monotonic() - began > 2 * slowest + 120:
            break
        time.sleep(min(2.0, interval_s / 5))
    return {
        "taken": {k: taken.get(k, []) for k in seen},
        "per_rule": {k: dict(per_rule.get(k, {})) for k in seen},
        "intervals": intervals,
        "rss": rss,
    }


def samples_read(prometheus: Prometheus) -> dict[str, dict[str, Any]]:
    """Each rule's expression run once now with ``stats=all``: the samples it read and how long it took, per group."""
    read: dict[str, dict[str, Any]] = {}
    for group in prometheus.get("/api/v1/rules")["data"]["groups"]:
        rules = {}
        for name, rule in zip(_rule_names(group), group["rules"], strict=True):
            answer = prometheus.get("/api/v1/query", timeout=600, query={"query": rule["query"], "stats": "all"})[
                "data"
            ]
            stats = answer.get("stats", {})
            rules[name] = {
                "samples": int(stats.get("samples", {}).get("totalQueryableSamples", 0)),
                "s": round(float(stats.get("timings", {}).get("execTotalTime", 0.0)), 4),
                "series_out": len(answer.get("result", [])),
            }
        read[_group_key(group)] = {"samples": sum(r["samples"] for r in rules.values()), "rules": rules}
    return read


def planted_drift(prometheus: Prometheus, planted: str) -> dict[str, Any]:
    """The planted node's n* over its last hour against the other nodes' median, per mode; and the alerts."""
    result = prometheus.query(f'avg by (instance, mode) (avg_over_time(matmul_crossover_size{{job="{JOB}"}}[1h]))')
    per_mode: dict[str, dict[str, float]] = defaultdict(dict)
    for row in result["result"]:
        per_mode[row["metric"]["mode"]][row["metric"]["instance"]] = float(row["value"][1])
    ratio = {}
    for mode, values in per_mode.items():
        others = [v for instance, v in values.items() if instance != planted]
        if planted in values and others:
            ratio[mode] = round(values[planted] / statistics.median(others), 3)
    alerts: dict[str, int] = defaultdict(int)
    on_planted = []
    elsewhere: dict[str, set[str]] = defaultdict(set)
    firing_elsewhere: list[dict[str, str]] = []
    for row in prometheus.query("ALERTS")["result"]:
        labels = row["metric"]
        alerts[f"{labels['alertname']} {labels['alertstate']}"] += 1
        if labels.get("instance") == planted:
            on_planted.append(f"{labels['alertname']} {labels['alertstate']} {labels.get('mode', '')}".strip())
        else:
            elsewhere[f"{labels['alertname']} {labels['alertstate']}"].add(labels.get("instance", ""))
            if labels["alertstate"] == "firing":  # which rule of the alert, on what: a false alert to look into
                firing_elsewhere.append({k: v for k, v in labels.items() if k not in {"__name__", "job"}})
    return {
        "nstar_over_others": ratio,
        "alerts": dict(alerts),
        "alerts_on_planted": sorted(set(on_planted)),
        "nodes_alerting_elsewhere": {name: len(nodes) for name, nodes in sorted(elsewhere.items())},
        "firing_elsewhere": firing_elsewhere,
    }


@dataclasses.dataclass(frozen=True)
class Setup:
    rules: Path
    rules_info: RulesInfo
    recorder: Recorder
    base: ServiceState
    backend: str
    ratios: dict[str, list[float]]
    profile: str
    gpus: int
    history_s: float
    scrape_s: float
    warmup: int
    measure: int
    cpus: str | None
    compact: bool
    quiet_load: float
    quiet_wait_s: float
    prometheus: str
    promtool: str
    seed: int
    keep: Path | None


def run_scale(setup: Setup, count: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One scale: simulate, write the history, compact, serve, measure, read back."""
    began = time.monotonic()
    quiet = wait_for_quiet(setup.quiet_load, setup.quiet_wait_s)
    row: dict[str, Any] = {"nodes": count, "load_at_start": quiet["load"], "waited_for_load_s": quiet["waited_s"]}
    work = Path(tempfile.mkdtemp(prefix=f"fleet-{count}-", dir="/tmp"))
    data = work / "data"
    data.mkdir()
    try:
        end = math.floor(time.time() / setup.scrape_s) * setup.scrape_s - setup.scrape_s
        start = end - setup.history_s
        t = time.monotonic()
        nodes = simulate(
            count,
            base=setup.base,
            backend=setup.backend,
            gpus=setup.gpus,
            profile=setup.profile,
            ratios=setup.ratios,
            end=end,
            history_s=setup.history_s,
            scrape_s=setup.scrape_s,
            seed=setup.seed,
        )
        row["render_s"] = round(time.monotonic() - t, 1)
        row["series_per_node_rendered"] = len(nodes[0].names)
        log(f"  {count} nodes rendered ({row['render_s']} s); writing {setup.history_s / 3600:g} h of history")
        history = write_history(
            nodes,
            rules=setup.rules_info,
            recorder=setup.recorder,
            start=start,
            end=end,
            scrape_s=setup.scrape_s,
            work=work,
            data=data,
            promtool=setup.promtool,
        )
        history["dense_series_per_node"] = len(nodes[0].dense) + len(
            setup.recorder.series(nodes[0], 0, nodes[0].values(0))
        )
        history["sparse_series_per_node"] = len(nodes[0].sparse)
        history["blocks_written"] = len(blocks(data))
        row["history"] = history
        log(
            f"  history: {history['samples'] / 1e6:.1f} M samples, {history['openmetrics_bytes'] / 2**30:.2f} GiB of "
            f"text, written in {history['write_s']} s, promtool waited {history['promtool_wait_s']} s"
        )
        if setup.compact:
            row["compaction"] = compact(setup.prometheus, data, work, limit_s=600)
            log(f"  compacted as a running Prometheus would: {row['compaction']}")
        row["blocks"] = blocks(data)
        row["tsdb_bytes"] = disk_bytes(data)
        # Other work may have started meanwhile: wait for it again before the measured part.
        row["before_measure"] = wait_for_quiet(setup.quiet_load, setup.quiet_wait_s)
        row["measure"] = measure_live(setup, nodes, data=data, work=work, end=end, log=log)
        row["load_at_end"] = loadavg()
        row["wall_s"] = round(time.monotonic() - began, 1)
        return row
    finally:
        if setup.keep is not None:
            shutil.copytree(data, setup.keep / f"data-{count}", dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def measure_live(
    setup: Setup, nodes: Sequence[SimNode], *, data: Path, work: Path, end: float, log: Callable[[str], None]
) -> dict[str, Any]:
    """Serve the nodes, start the measured Prometheus on the history, and read what it costs."""
    scrape = _duration(setup.scrape_s)
    own = os.sched_getaffinity(0)
    with serving(nodes) as port:
        config = {
            "global": {
                "scrape_interval": scrape,
                "evaluation_interval": scrape,
                "scrape_timeout": _duration(min(10.0, setup.scrape_s)),
            },
            "rule_files": [str(setup.rules.resolve())],
            "scrape_configs": [
                {
                    "job_name": JOB,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{port}"],
                            "labels": {"__metrics_path__": f"/node/{node.instance}", "instance": node.instance},
                        }
                        for node in nodes
                    ],
                }
            ],
        }
        prometheus = Prometheus(setup.prometheus, config, data, work, setup.cpus)
        try:
            if setup.cpus and own - _cpu_set(setup.cpus):
                os.sched_setaffinity(0, own - _cpu_set(setup.cpus))  # the nodes' server off Prometheus's core
            prometheus.wait_ready()
            row: dict[str, Any] = {"history_gap_s": round(time.time() - end, 1)}
            deadline = time.monotonic() + 180 + len(nodes)
            up = 0
            while time.monotonic() < deadline:
                answer = prometheus.query(f'count(up{{job="{JOB}"}} == 1)')["result"]
                up = int(float(answer[0]["value"][1])) if answer else 0
                if up == len(nodes):
                    break
                time.sleep(1)
            row["targets_up"] = up
            row["load_at_measure_start"] = loadavg()
            before = prometheus.metrics()
            t0 = time.monotonic()
            observed = observe_groups(prometheus, warmup=setup.warmup, measure=setup.measure, interval_s=setup.scrape_s)
            after = prometheus.metrics()
            row["measure_s"] = round(time.monotonic() - t0, 1)
            row["load_at_measure_end"] = loadavg()
            row.update(read_costs(prometheus, before=before, after=after, observed=observed, wall_s=row["measure_s"]))
            log(f"  measured {row['measure_s']} s; reading each rule's samples")
            row["samples_read"] = samples_read(prometheus)
            row["planted"] = planted_drift(prometheus, nodes[0].instance)
            row["prometheus_log_tail"] = prometheus.log_path.read_text()[-1500:]
            return row
        finally:
            prometheus.stop()
            os.sched_setaffinity(0, own)


def read_costs(
    prometheus: Prometheus,
    *,
    before: dict[Any, float],
    after: dict[Any, float],
    observed: dict[str, Any],
    wall_s: float,
) -> dict[str, Any]:
    """Per group: evaluation time (median, max, as a share of the interval), iterations missed; and the whole
    Prometheus: head series, resident memory, CPU, series per node."""
    groups = {}
    for key, taken in observed["taken"].items():
        interval = observed["intervals"][key]
        missed = [
            (_value(found, "prometheus_rule_group_iterations_missed_total", rule_group=key) or 0.0)
            for found in (before, after)
        ]
        iterations = [
            (_value(found, "prometheus_rule_group_iterations_total", rule_group=key) or 0.0)
            for found in (before, after)
        ]
        slowest = sorted(((statistics.median(v), name) for name, v in observed["per_rule"][key].items()), reverse=True)
        groups[key] = {
            "interval_s": interval,
            "evaluations": len(taken),
            "eval_s_median": round(statistics.median(taken), 4) if taken else None,
            "eval_s_min": round(min(taken), 4) if taken else None,
            "eval_s_max": round(max(taken), 4) if taken else None,
            "eval_s_all": [round(t, 4) for t in taken],
            "eval_share_of_interval": round(statistics.median(taken) / interval, 4) if taken else None,
            "last_duration_s": _value(after, "prometheus_rule_group_last_duration_seconds", rule_group=key),
            "iterations_missed_during": missed[1] - missed[0],
            "iterations_missed_total": missed[1],
            "iterations_during": iterations[1] - iterations[0],
            "evaluation_failures": _value(after, "prometheus_rule_evaluation_failures_total", rule_group=key),
            "slowest_rules": [{"rule": name, "s": round(s, 4)} for s, name in slowest[:8]],
        }
    cpu = [(_value(found, "process_cpu_seconds_total") or 0.0) for found in (before, after)]
    per_node = prometheus.query(f'scrape_samples_post_metric_relabeling{{job="{JOB}"}}')["result"]
    counts = [float(row["value"][1]) for row in per_node]
    peak = prometheus.status()
    return {
        "groups": groups,
        "head_series": _value(after, "prometheus_tsdb_head_series"),
        "rss_bytes_end": _value(after, "process_resident_memory_bytes"),
        "rss_bytes_max_sampled": max(observed["rss"], default=None),
        "rss_bytes_peak_vmhwm": peak.get("VmHWM"),
        "heap_inuse_bytes": _value(after, "go_memstats_heap_inuse_bytes"),
        "prometheus_cpu_cores": round((cpu[1] - cpu[0]) / wall_s, 3) if wall_s else None,
        "series_per_node": {
            "min": min(counts, default=0),
            "max": max(counts, default=0),
            "mean": statistics.fmean(counts) if counts else 0,
        },
        "blocks_loaded": _value(after, "prometheus_tsdb_blocks_loaded"),
    }


# ---------------------------------------------------------------------------------------------------------------
# Fit and report.


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """Least squares y = intercept + slope * x, with its r²; None below two distinct x."""
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    mean = statistics.fmean(ys)
    total = sum((y - mean) ** 2 for y in ys)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"intercept": intercept, "slope": slope, "r2": 1 - residual / total if total else 1.0}


def fit(scales: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per group evaluation seconds, and RSS, head series and samples read, against nodes; extrapolated."""
    xs = [float(s["nodes"]) for s in scales]
    out: dict[str, Any] = {"groups": {}}
    capacity = []
    for key in scales[0]["measure"]["groups"]:
        pairs = [
            (float(s["nodes"]), s["measure"]["groups"][key]["eval_s_median"])
            for s in scales
            if s["measure"]["groups"].get(key, {}).get("eval_s_median") is not None
        ]
        line = line_fit([x for x, _ in pairs], [y for _, y in pairs])
        interval = scales[0]["measure"]["groups"][key]["interval_s"]
        entry: dict[str, Any] = {"fit": line, "interval_s": interval}
        if line is not None:
            entry["at"] = {str(n): round(line["intercept"] + line["slope"] * n, 2) for n in EXTRAPOLATE_TO}
            if line["slope"] > 0:
                entry["nodes_at_10pct_of_interval"] = round((EVAL_SHARE * interval - line["intercept"]) / line["slope"])
                capacity.append(entry["nodes_at_10pct_of_interval"])
        out["groups"][key] = entry
    measured = {
        "rss_bytes": [s["measure"]["rss_bytes_max_sampled"] or s["measure"]["rss_bytes_end"] or 0.0 for s in scales],
        "head_series": [s["measure"]["head_series"] or 0.0 for s in scales],
        "samples_read_per_evaluation": [
            sum(g["samples"] for g in s["measure"]["samples_read"].values()) for s in scales
        ],
    }
    for name, ys in measured.items():
        line = line_fit(xs, [float(y) for y in ys])
        out[name] = {"fit": line}
        if line is not None:
            out[name]["at"] = {str(n): line["intercept"] + line["slope"] * n for n in EXTRAPOLATE_TO}
    rss = out["rss_bytes"]["fit"]
    if rss is not None and rss["slope"] > 0:
        out["rss_bytes"]["nodes_at_8GiB"] = round((RSS_TARGET - rss["intercept"]) / rss["slope"])
        capacity.append(out["rss_bytes"]["nodes_at_8GiB"])
    if capacity:
        per_shard = min(capacity)
        out["nodes_per_shard"] = per_shard
        out["shards_for_10000"] = math.ceil(10_000 / per_shard) if per_shard > 0 else None
    return out


def report(result: dict[str, Any]) -> str:
    """The markdown summary printed at the end."""
    lines = [
        f"## Fleet scale: profile {result['profile']}, {result['gpus']} GPUs a node, {result['date']}",
        "",
        (
            f"{result['machine']['summary']}; {result['prometheus_version']}; Prometheus on cpus {result['cpus']}; "
            f"rules {result['rules']['path']} ({result['rules']['sha256'][:12]}); history {result['history_h']:g} h at "
            f"{result['scrape_interval_s']:g} s (series no rule reads over a range: one sample per sweep)"
        ),
        "",
        (
            "| nodes | series/node | head series | RSS MiB (max) | group: eval s median / max (share of interval) | "
            "missed | samples read per eval | Prometheus CPU cores | load 1m start→end | wall min |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scale in result["scales"]:
        m = scale["measure"]
        groups = "; ".join(
            f"{key.split(';')[-1]}: {g['eval_s_median']} / {g['eval_s_max']} "
            f"({100 * (g['eval_share_of_interval'] or 0):.1f}%)"
            for key, g in m["groups"].items()
        )
        missed = sum(g["iterations_missed_during"] for g in m["groups"].values())
        read = sum(g["samples"] for g in m["samples_read"].values())
        rss = (m["rss_bytes_max_sampled"] or m["rss_bytes_end"] or 0) / 2**20
        lines.append(
            f"| {scale['nodes']} | {m['series_per_node']['mean']:.0f} | {m['head_series']:.0f} | {rss:.0f} | "
            f"{groups} | {missed:.0f} | {read / 1e6:.2f} M ({read / scale['nodes'] / 1e3:.0f} k/node) | "
            f"{m['prometheus_cpu_cores']} | "
            f"{scale['load_at_start'][0]:.2f}→{scale['load_at_end'][0]:.2f} | {scale['wall_s'] / 60:.1f} |"
        )
    fitted = result.get("fit")
    if fitted:
        lines += ["", "Fit (least squares over the scales) and extrapolation:", ""]
        for key, entry in fitted["groups"].items():
            line = entry["fit"]
            if line is None:
                continue
            lines.append(
                f"- group {key.split(';')[-1]}: eval s = {line['intercept']:.3f} + "
                f"{line['slope'] * 1000:.2f} ms × nodes "
                f"(r² {line['r2']:.3f}); 1,000 nodes {entry['at']['1000']} s, 10,000 nodes {entry['at']['10000']} s; "
                f"10% of its {entry['interval_s']:g} s interval at {entry.get('nodes_at_10pct_of_interval')} nodes"
            )
        for name, unit, scale in (
            ("rss_bytes", "MiB", 2**20),
            ("head_series", "series", 1),
            ("samples_read_per_evaluation", "samples", 1),
        ):
            line = fitted[name]["fit"]
            if line is not None:
                at = fitted[name]["at"]
                lines.append(
                    f"- {name}: {line['intercept'] / scale:.0f} + {line['slope'] / scale:.2f} {unit} × nodes "
                    f"(r² {line['r2']:.3f}); 1,000 nodes {at['1000'] / scale:,.0f}, "
                    f"10,000 nodes {at['10000'] / scale:,.0f}"
                )
        if "nodes_per_shard" in fitted:
            lines.append(
                f"- one shard holds {fitted['nodes_per_shard']} nodes (every group within 10% of its interval, RSS "
                f"≤ 8 GiB): {fitted['shards_for_10000']} shards for 10,000 nodes"
            )
    last = result["scales"][-1]["measure"]
    for key, group in last["groups"].items():
        lines += [
            "",
            f"Slowest rules of {key.split(';')[-1]} at {result['scales'][-1]['nodes']} nodes (median s): "
            + ", ".join(f"{r['rule']} {r['s']}" for r in group["slowest_rules"][:5]),
        ]
        read = last["samples_read"].get(key, {}).get("rules", {})
        most = sorted(read.items(), key=lambda item: -item[1]["samples"])[:5]
        lines.append("Most samples read: " + ", ".join(f"{name} {v['samples'] / 1e6:.2f} M" for name, v in most))
    planted = last["planted"]
    lines += [
        "",
        (
            f"Planted node: n* over the others' median {planted['nstar_over_others']}; alerts on it "
            f"{planted['alerts_on_planted'] or 'none'}; "
            f"other nodes alerting {planted['nodes_alerting_elsewhere'] or 'none'}"
        ),
    ]
    if result["recorded_not_written"]:
        lines.append(
            f"Recorded series read over a range but given no history: {', '.join(result['recorded_not_written'])}"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    memory = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    cores = os.cpu_count() or 0
    return {
        "cpus": cores,
        "nproc": len(os.sched_getaffinity(0)),
        "model": model,
        "memory_bytes": memory,
        "summary": f"{cores}-core VM ({model}), {memory / 2**30:.0f} GiB",
    }


def _git_head() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    return "unknown"


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    today = dt.datetime.now(dt.UTC).date().isoformat()
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rules", type=Path, default=REPO / "deploy" / "prometheus" / "rules.yml")
    parser.add_argument(
        "--profile",
        default="full",
        help="what each node serves: full (every series, the renderer's default) or a profile it takes (fleet)",
    )
    parser.add_argument(
        "--node",
        type=Path,
        default=DEFAULT_NODE,
        help="a recorded single-GPU scrape of /metrics the nodes are built from",
    )
    parser.add_argument(
        "--spreads",
        type=Path,
        nargs="+",
        default=list(DEFAULT_SPREADS),
        help="recorded idle sweeps whose n* spread each node's is drawn from",
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scales", default="50,100,200,400", help="node counts, comma-separated")
    parser.add_argument(
        "--scrape-interval", type=_seconds, default=30.0, help="also the evaluation interval and the history's cadence"
    )
    parser.add_argument("--history", type=_seconds, default=26 * 3600.0)
    # Six: at 25 nodes the first evaluations after a start took 3.3, 2.9, 1.8, 1.5 s before settling at 1.2 s.
    parser.add_argument("--warmup", type=int, default=6, help="evaluations of each group not counted")
    parser.add_argument("--measure", type=int, default=6, help="evaluations of each group counted")
    parser.add_argument(
        "--cpus", default=str((os.cpu_count() or 1) - 1), help="taskset's list for Prometheus ('' for none)"
    )
    parser.add_argument(
        "--compact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let a first Prometheus compact the history's 2-hour blocks",
    )
    parser.add_argument(
        "--quiet-load", type=float, default=1.5, help="wait for the 1-minute load below this before each scale"
    )
    parser.add_argument("--quiet-wait", type=_seconds, default=300.0, help="...for at most this long")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--prometheus", default=shutil.which("prometheus"))
    parser.add_argument("--promtool", default=shutil.which("promtool"))
    parser.add_argument(
        "--out",
        type=Path,
        help=f"results JSON (default benchmarks/results/fleet-PROFILE-{today}.json; none with --smoke)",
    )
    parser.add_argument("--keep", type=Path, help="copy each scale's TSDB here")
    parser.add_argument(
        "--group-interval", type=_seconds, help="evaluate every group at this interval, not the one --rules gives it"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="3 nodes, 3 h of history, 5 s intervals, one short measurement"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.history, args.scrape_interval = "3", 3 * 3600.0, 5.0
        args.warmup, args.measure, args.compact, args.quiet_wait = 1, 2, False, 0.0
        args.group_interval = args.scrape_interval  # a group of 5 minutes would keep the smoke for 10
    elif args.out is None:
        args.out = RESULTS / f"fleet-{args.profile}-{today}.json"
    if not args.prometheus or not args.promtool:
        parser.error("needs prometheus and promtool (Debian's prometheus package; --prometheus, --promtool)")
    args.today = today
    args.argv = sys.argv[1:] if argv is None else list(argv)
    return args


def with_interval(rules: Path, interval_s: float, work: Path) -> Path:
    """A copy of ``rules`` in ``work`` whose every group is evaluated every ``interval_s``."""
    loaded = yaml.safe_load(rules.read_text(encoding="utf-8"))
    for group in loaded.get("groups", []):
        group["interval"] = _duration(interval_s)
    copy = work / rules.name
    copy.write_text(yaml.safe_dump(loaded, sort_keys=False), encoding="utf-8")
    return copy


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    work = Path(tempfile.mkdtemp(prefix="fleet-rules-", dir="/tmp"))
    try:
        evaluated = args.rules if args.group_interval is None else with_interval(args.rules, args.group_interval, work)
        return measure_scales(args, evaluated)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure_scales(args: argparse.Namespace, evaluated: Path) -> int:
    """Every scale of ``args`` with the rules of ``evaluated`` (``--rules``, or its copy at ``--group-interval``)."""
    scales = [int(n) for n in args.scales.split(",")]

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    base, backend = recorded_state(args.node)
    rules_info = read_rules(args.rules)
    writable = {
        name
        for name, exprs in RECORDED_EXPRESSIONS.items()
        if rules_info.recorded.get(name) in {_squash(expr) for expr in exprs}
    }
    needed = rules_info.ranged & set(rules_info.recorded)
    copies = {
        record: expr
        for record, expr in rules_info.recorded.items()
        if record in needed and re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)
    }
    setup = Setup(
        rules=evaluated,
        rules_info=rules_info,
        recorder=Recorder(writable & needed, copies, _recording_interval(args.rules, args.scrape_interval)),
        base=base,
        backend=backend,
        ratios=idle_ratios(args.spreads),
        profile=args.profile,
        gpus=args.gpus,
        history_s=args.history,
        scrape_s=args.scrape_interval,
        warmup=args.warmup,
        measure=args.measure,
        cpus=args.cpus or None,
        compact=args.compact,
        quiet_load=args.quiet_load,
        quiet_wait_s=args.quiet_wait,
        prometheus=args.prometheus,
        promtool=args.promtool,
        seed=args.seed,
        keep=args.keep,
    )
    version = subprocess.run([args.prometheus, "--version"], capture_output=True, text=True, check=False)
    result: dict[str, Any] = {
        "tool": "benchmarks/fleet.py",
        "argv": args.argv,
        "date": args.today,
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "prometheus_version": (version.stdout or version.stderr).splitlines()[0],
        "git_head": _git_head(),
        "profile": args.profile,
        "gpus": args.gpus,
        "node_source": str(args.node.relative_to(REPO) if args.node.is_relative_to(REPO) else args.node),
        "spreads": [str(p.relative_to(REPO) if p.is_relative_to(REPO) else p) for p in args.spreads],
        "nstar_ratio_pool": {
            mode: {
                "count": len(v),
                "min": round(min(v), 3),
                "max": round(max(v), 3),
                "log_sd": round(statistics.pstdev(math.log(x) for x in v), 4),
            }
            for mode, v in setup.ratios.items()
        },
        "rules": {
            "path": str(args.rules),
            "sha256": hashlib.sha256(args.rules.read_bytes()).hexdigest(),
            "groups": rules_info.groups,
            "read_over_a_range_or_offset": sorted(rules_info.ranged),
            "every_group_evaluated_every_s": args.group_interval,
        },
        "recorded_written": sorted(setup.recorder.names | set(copies)),
        "recorded_not_written": sorted(needed - writable - set(copies)),
        "history_h": args.history / 3600,
        "scrape_interval_s": args.scrape_interval,
        "cpus": args.cpus or "any",
        "compacted": args.compact,
        "planted": {"node": "node-0000", "factor": PLANT_FACTOR, "last_hours": PLANT_S / 3600},
        "notes": [
            (
                "series no rule reads over a range or at an offset get one sample per sweep in the history (their "
                "value changes only then); the others one per scrape interval"
            ),
            "the head holds only the live minutes of the run; a Prometheus that ran for a day holds 2-3 h there",
            "moved2h's history is computed at sweep granularity from the drawn n*",
        ],
        "scales": [],
    }
    for gpus in (1, args.gpus):
        state = node_state(base, gpus=gpus, node=0, finished=time.time(), nstar={}, sweeps=0, loaded_at=time.time())
        plain, _ = render_node(state, args.profile, backend=backend, exposition=metrics.exposition_type(None))
        result[f"series_rendered_{gpus}_gpu"] = len(metrics.parse_exposition(plain.decode()))
    if args.gpus > 1:
        result["series_per_extra_gpu"] = (
            result[f"series_rendered_{args.gpus}_gpu"] - result["series_rendered_1_gpu"]
        ) / (args.gpus - 1)
    for count in scales:
        log(f"scale {count} nodes, load {loadavg()}")
        result["scales"].append(run_scale(setup, count, log))
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    if len(scales) > 1:
        result["fit"] = fit(result["scales"])
    result["summary"] = report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["summary"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
