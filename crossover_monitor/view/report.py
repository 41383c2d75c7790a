"""Human and JSON renderings of one sweep, and its progress on a terminal, for ``crossover-monitor once``."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from crossover_monitor.codec import from_data, to_data
from crossover_monitor.model import (
    GPU_PROBLEM,
    STATE_SENTENCES,
    WORKER_CPU_SECONDS,
    WORKER_PEAK_RSS_BYTES,
    Crossover,
    CrossoverState,
    DeviceInfo,
    HardwareContext,
    Measurement,
    PointKey,
    Snapshot,
    SweepOutcome,
    Withheld,
    curves,
    gpu_cpu_pairs,
    speedup,
)
from crossover_monitor.protocol import Message, Plan, Started
from crossover_monitor.service.history import Run, with_current_roles
from crossover_monitor.text import took_text, utc_text


def _format_seconds(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _speedups(snapshot: Snapshot) -> dict[PointKey, float]:
    """CPU time over GPU time per GPU point, against the first CPU it is paired with."""
    times = {m.key: m.timing.median_s for m in snapshot.measurements}
    ratios: dict[PointKey, float] = {}
    for cpu, gpus in gpu_cpu_pairs(snapshot.devices):
        paired = {g.device for g in gpus}
        for where, gpu_time in times.items():
            reference = times.get(dataclasses.replace(where, device=cpu.device))
            if where.device in paired and reference is not None:
                ratios.setdefault(where, speedup(reference, gpu_time))
    return ratios


def _crossover_line(c: Crossover) -> str:
    head = f"{c.pair_label}  {c.dtype} {c.mode}: "
    if c.state is CrossoverState.FOUND and c.size is not None:
        line = head + f"GPU faster from n ≈ {c.size:.0f} (between measured sizes {c.lower:g} and {c.upper:g}"
        if c.ci_lower is not None and c.ci_upper is not None:
            line += (
                f"; from this sweep's visits, the next sweep's n* should land in {c.ci_lower:.0f} to "
                f"{c.ci_upper:.0f} (95%; the service widens this by the moves of recent sweeps)"
            )
        return line + ")"
    text = STATE_SENTENCES.get(c.state, c.state.value)
    if c.state is CrossoverState.WITHHELD:
        text += " (see 'withheld' below)"
    return head + text


def _environment_lines(snapshot: Snapshot) -> list[str]:
    """The versions and settings the worker ran with, then what the sweep cost (the GPU problem is said by the
    crossovers)."""
    footprint = (WORKER_CPU_SECONDS, WORKER_PEAK_RSS_BYTES)
    lines = [f"{k}: {v}" for k, v in snapshot.environment if k != GPU_PROBLEM and k not in footprint]
    cpu_s, rss = snapshot.worker_cpu_seconds, snapshot.worker_peak_rss_bytes
    costs = (
        [f"{cpu_s:.1f} CPU seconds, peak memory {rss / 2**30:.2f} GiB"] if cpu_s is not None and rss is not None else []
    )
    costs += [
        f"{h.worker_gpu_memory_max_bytes / 2**30:.2f} GiB on {h.device}"
        for h in snapshot.hardware
        if h.worker_gpu_memory_max_bytes is not None
    ]
    if costs:
        lines.append(f"what the sweep cost: {', '.join(costs)} (its worker)")
    return lines


def not_timed(snapshot: Snapshot) -> list[str]:
    """What the sweep served without timing it, and why: a line per device, dtype and mode whose far points it carried
    between whole curves (``benchmark.full_curve_every``), with the sizes and when they were timed."""
    carried: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in snapshot.measurements:
        if m.timed_at is not None:
            carried.setdefault((m.key.device, m.key.dtype, m.key.mode), []).append(m)
    lines = []
    for (device, dtype, mode), points in carried.items():
        sizes = ", ".join(str(m.key.size) for m in sorted(points, key=lambda m: m.key.size))
        oldest = min(m.timed_at for m in points if m.timed_at is not None)
        lines.append(
            f"{device} {dtype} {mode} n={sizes}: not timed in this sweep, served as timed at {utc_text(oldest)} "
            "(far from n*: between whole curves a sweep times the sizes around it; benchmark.full_curve_every)"
        )
    return lines


def render_table(outcome: SweepOutcome) -> str:
    """A table per device and mode (size, median, IQR, GFLOP/s, GPU speed-up), then the crossovers."""
    lines = [
        f"sweep {outcome.result.value} in {outcome.duration_s:.1f}s" + (f": {outcome.reason}" if outcome.reason else "")
    ]
    snapshot = outcome.snapshot
    if snapshot is None:
        return "\n".join(lines)
    lines += _environment_lines(snapshot)
    speedups = _speedups(snapshot)
    names = {d.device: d.name for d in snapshot.devices}
    for key, curve in curves(snapshot.measurements).items():
        device, dtype, mode, points = key.device, key.dtype, key.mode, list(curve.values())
        lines += ["", f"{device} ({names.get(device, '?')})  {dtype}  {mode}"]
        lines.append(f"{'size':>7} {'median':>10} {'IQR':>10} {'GFLOP/s':>9} {'GPU speed-up':>12}")
        for m in sorted(points, key=lambda p: p.key.size):
            ratio = speedups.get(m.key)
            flag = ("  noisy" if m.timing.noisy else "") + (
                "" if m.role == "sweep" else f"  ({m.role.replace('_', ' ')})"
            )
            flag += f"  {m.timing.visit_count} visits" if m.timing.visit_count > 1 else ""
            flag += f"  (carried: timed {utc_text(m.timed_at)})" if m.timed_at is not None else ""
            lines.append(
                f"{m.key.size:>7} {_format_seconds(m.timing.median_s):>10} {_format_seconds(m.timing.iqr_s):>10} "
                f"{m.flops_per_second / 1e9:>9.3g} {f'{ratio:.2f}x' if ratio is not None else '-':>12}{flag}"
            )
    lines.append("")
    for cost in snapshot.costs:
        rate = f"{cost.peak_flops / 1e9:.3g} GFLOP/s" if cost.peak_flops is not None else "-"
        lines.append(
            f"{cost.device} {cost.dtype} {cost.mode}: fixed cost {_format_seconds(cost.fixed_s)} per call; "
            f"rate beyond it {rate} at n={cost.largest_size}"
        )
    if snapshot.costs:
        lines.append("")
    if snapshot.crossovers:
        lines.append("crossovers:")
        lines += [f"  {_crossover_line(c)}" for c in snapshot.crossovers]
    else:
        lines.append("crossovers: none")
    if snapshot.gpu_problem:
        lines.append(f"no GPU: {snapshot.gpu_problem}")
    for f in snapshot.failures:
        lines.append(f"failed: {f.device}: {f.reason}")
    for w in snapshot.withheld:
        lines.append(f"withheld: {w.subject} ({w.reason.value}): {w.detail}")
    lines += [f"carried: {line}" for line in not_timed(snapshot)]
    lines += [f"hardware: {h.device}: {_hardware_line(h)}" for h in snapshot.hardware]
    return "\n".join(lines)


def _hardware_line(h: HardwareContext) -> str:
    """What the device looked like while it was timed, in the words of the metrics reference."""
    parts = [*_gpu_hardware(h)]
    if h.other_cpu_cores is not None:
        steal = f" (the hypervisor's steal ≤ {h.cpu_steal_cores:.2f})" if h.cpu_steal_cores else ""
        parts.append(f"other processes used ≤ {h.other_cpu_cores:.2f} cores{steal}")
    if h.cpu_blocks_set_aside_ratio:
        parts.append(f"{h.cpu_blocks_set_aside_ratio:.0%} of its blocks timed again (its threads waited for a CPU)")
    if h.cpu_throttled_s:
        parts.append(f"CPU quota throttled {h.cpu_throttled_s * 1000:.0f} ms")
    if h.host_slowdown_max is not None:
        parts.append(f"the host ran ≤ {h.host_slowdown_max:.2f}x its idle reference's time")
    return "; ".join(parts) or "nothing could be read"


def _gpu_hardware(h: HardwareContext) -> list[str]:
    parts = []
    if h.sm_clock_min_hz is not None:
        top = f" of {h.sm_clock_max_hz / 1e6:.0f}" if h.sm_clock_max_hz is not None else ""
        parts.append(f"SM clock ≥ {h.sm_clock_min_hz / 1e6:.0f}{top} MHz")
    if h.clock_events:
        parts.append(f"clock events {', '.join(h.clock_events)}")
    for limit, ratio in (("power", h.power_limited_ratio), ("thermal", h.thermal_limited_ratio)):
        if ratio:  # 0 or unknown: nothing to say
            parts.append(f"held back by its {limit} limit {ratio:.0%} of the time timed")
    if h.temperature_max_c is not None:
        parts.append(f"≤ {h.temperature_max_c:.0f} °C")
    if h.power_max_w is not None:
        parts.append(f"≤ {h.power_max_w:.0f} W")
    if h.pcie_generation_min is not None and h.pcie_width_min is not None:
        best = f"gen {h.pcie_generation_max} x{h.pcie_width_max}"
        parts.append(f"PCIe gen {h.pcie_generation_min} x{h.pcie_width_min} (at best {best})")
    if h.host_wait_ratio is not None:
        parts.append(f"its timing thread waited for a CPU ≤ {h.host_wait_ratio:.2%} of a point")
    if h.other_processes_max is not None:
        count = h.other_processes_max
        parts.append(f"{count} other process{'' if count == 1 else 'es'} at most")
    return parts


def read_json(data: Mapping[str, Any]) -> SweepOutcome:
    """The outcome ``render_json`` wrote (parsed), e.g. recorded sweeps to replay; a DecodeError names what is wrong."""
    body = copy.deepcopy(dict(data))
    snapshot = body.get("snapshot")
    if isinstance(snapshot, dict):
        snapshot["environment"] = sorted(dict(snapshot.get("environment") or {}).items())
        for raw in snapshot.get("measurements") or ():
            if isinstance(raw, dict):
                raw.pop("flops_per_second", None)
        with_current_roles(snapshot)  # files written before the n = 1 point's role was renamed
    return from_data(SweepOutcome, body)


def render_json(outcome: SweepOutcome) -> str:
    """The whole outcome as JSON (also the input of ``plot``)."""
    body = to_data(outcome)
    if outcome.snapshot is not None:
        body["snapshot"]["environment"] = dict(outcome.snapshot.environment)
        for m, raw in zip(outcome.snapshot.measurements, body["snapshot"]["measurements"], strict=True):
            raw["flops_per_second"] = m.flops_per_second
    return json.dumps(body, indent=2)


def render_history(runs: Sequence[Run]) -> str:
    """The recent runs, newest first: when, how long, what, how it ended, the crossovers, the devices' states."""
    if not runs:
        return "no runs recorded yet"
    lines = [f"{'started (UTC)':<20} {'took':>7}  {'kind':<7} {'result':<8} crossovers; devices"]
    for run in runs:
        started = utc_text(run.started_at, "%Y-%m-%d %H:%M:%S")
        crossovers = ", ".join(
            f"{gpu} {mode} {size:.0f}" if size is not None else f"{gpu} {mode} {state}"
            for gpu, mode, state, size in run.crossovers
        )
        devices = ", ".join(
            f"{device} {state}" + (f" ({reason})" if reason else "") for device, state, reason in run.devices
        )
        took = took_text(run.started_at, run.finished_at)
        details = "; ".join(part for part in (crossovers, devices) if part) or "-"
        lines.append(f"{started:<20} {took:>7}  {run.kind:<7} {run.result:<8} {details}")
        if run.reason:
            lines.append(f"{'':<20} {'':>7}  {run.reason}")
    return "\n".join(lines)


def render_history_json(runs: Sequence[Run]) -> str:
    return json.dumps([dataclasses.asdict(run) for run in runs], indent=2)


class Progress:
    """One line on a terminal saying which point the sweep is timing and how far it has come.

    Fed every message of the sweep; writes to ``stream`` (stderr) and erases its line when closed.
    Refined points come after the counted ones and are shown as such.
    """

    def __init__(self, plan: Plan, stream: TextIO) -> None:
        sizes = len(plan.bench.sizes) + (
            0 if 1 in plan.bench.sizes else 1
        )  # the n=1 fixed-cost point when 1 is not configured
        self._per_device = sizes * len(plan.bench.dtypes) * len(plan.bench.modes)
        self._devices = 0
        self._done: set[PointKey] = set()  # a point timed again (refinement's visits) counts once
        self._stream = stream

    def __call__(self, message: Message) -> None:
        if isinstance(message, DeviceInfo):
            self._devices += 1
        elif isinstance(message, Measurement) and message.role != "refine":
            self._done.add(message.key)
        elif isinstance(message, Withheld) and message.point is not None:  # timed, then withheld alone
            self._done.add(message.point)
        elif isinstance(message, Started):
            k = message.key
            where = "refining" if message.role == "refine" else f"{len(self._done)}/{self._devices * self._per_device}"
            self._write(f"[{where}] timing {k.device} n={k.size} {k.dtype} {k.mode}")

    def _write(self, text: str) -> None:
        self._stream.write("\r\x1b[K" + text)  # back to the line's start, erase it, write
        self._stream.flush()

    def close(self) -> None:
        self._write("")
