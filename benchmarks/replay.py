"""Recorded real sweeps replayed over a simulated month: false drift alerts, and how soon a real change fires.

Each simulated sweep is one recorded sweep drawn at random (seeded), given the simulated time,
its crossovers derived again by the current code (``crossover_monitor.analysis.crossover``) and laid into the
service's own state (``crossover_monitor.service.state.StateStore``, which widens the served interval by the moves
of recent sweeps), so what is replayed is what the service would serve. The served crossover series
(``matmul_crossover_size`` and its interval) go, one value per sweep at the default 15-minute
schedule, into ``promtool test rules`` with the project's real rules
(``deploy/prometheus/rules.yml``); promtool's own ALERTS series says when ``MatmulCrossoverDrift``
started firing.

A sweep recorded before the service metered each point (no ``others_cores`` on its points: ``once --json`` and
scrapes of /metrics from before 2026-12-06) is judged here as the guard judges one now while others use the host
(``guard.past_idle_range``): where the sweep's own reading of other programs' load and steal over the CPU's points
(its hardware context, standing for each point's) reaches ``guard.range_others_cores`` (``ranges.others_gate``),
each host-bound point is held against the top of its idle range in the replayed service's state (the calm sweeps drawn before it), and
one past it by more than ``guard.range_max_slowdown`` is withheld (``host_slowed``) and its crossover derived
without it. The service would time such a point again first; a replay cannot, so it withholds at once.
``--unjudged`` draws them as they published. Scrapes (``.prom`` files, or a directory of them, each taken right
after a sweep) are read back into sweeps: their medians and spreads, devices, environment and load readings.

With ``--planted``, sweeps from ``--plant-day`` on are drawn from the planted-change sweeps instead:
the delay until the alert fires, in sweeps, is what a user waits. Also reported: how often the
next sweep's n* lands inside the interval served after the previous one.

    python benchmarks/replay.py --idle benchmarks/results/gpu-proof-tensorflow-h200-2026-12-01.jsonl \\
        --planted benchmarks/results/gpu-proof-torch-planted-busy-h200-2026-12-01.jsonl:planted-2threads \\
        --months 10 --out benchmarks/results/replay-tensorflow.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from crossover_monitor.analysis import crossover as crossover_module  # noqa: E402
from crossover_monitor.analysis.crossover import crossovers  # noqa: E402
from crossover_monitor.analysis.ranges import others_gate  # noqa: E402
from crossover_monitor.config.settings import GuardSettings  # noqa: E402
from crossover_monitor.measure.guard.guard import host_share_at  # noqa: E402
from crossover_monitor.measure.guard.rule import past_idle_range  # noqa: E402
from crossover_monitor.metrics import parse_exposition  # noqa: E402
from crossover_monitor.model import (  # noqa: E402
    Crossover,
    CrossoverKey,
    CrossoverState,
    DeviceInfo,
    HardwareContext,
    Measurement,
    Mode,
    PointKey,
    ServiceState,
    Snapshot,
    StopReason,
    SweepOutcome,
    SweepResult,
    Timing,
    Withheld,
    WithheldReason,
)
from crossover_monitor.service.state import StateStore  # noqa: E402
from crossover_monitor.view.report import read_json  # noqa: E402

RULES = REPO / "deploy" / "prometheus" / "rules.yml"
SWEEP_S = 900  # the default schedule
SAMPLE_S = 300  # Prometheus samples every 5 minutes here: three per sweep
ALERT = "MatmulCrossoverDrift"
START = 1_800_000_000.0  # the simulated month's first sweep (any fixed time will do)


class ServedCrossover(NamedTuple):
    """What the service serves for one crossover: n* and its interval when found, and when it was derived."""

    size: float | None
    ci_lower: float | None
    ci_upper: float | None
    derived_at: float | None
    ambiguous: bool = False  # the sweep's curves crossed more than once: no n*, matmul_crossover_state says so


Served = dict[CrossoverKey, ServedCrossover]  # every crossover the service serves, found or not


def load(specs: Iterable[str], *, keep_withheld: bool = False) -> list[SweepOutcome]:
    """Sweeps from ``once --json`` files, from gpu_proof.py JSON lines, or from a shared_node.py run
    (``PATH:LABEL`` picks a label; shared_node's labels are ``idle`` and its co-tenant shapes).

    Sweeps that withheld a device are left out unless ``keep_withheld``: the service serves the
    previous crossover again after them, which would flatter both the coverage and the false alerts.
    Sweeps that withheld points alone (``host_slowed``) are kept: the service serves what they derived
    without those points, and that is what the replay is to judge.
    """
    found: list[SweepOutcome] = []
    for spec in specs:
        path, _, label = spec.partition(":")
        if Path(path).is_dir() or path.endswith(".prom"):
            scrapes = sorted(Path(path).glob("*.prom")) if Path(path).is_dir() else [Path(path)]
            if not scrapes:
                sys.exit(f"{path}: no .prom scrapes in it")
            found += [scraped_sweep(scrape) for scrape in scrapes]
            continue
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith(".jsonl"):
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            found += [read_json(r["once"]) for r in rows if "once" in r and r.get("label") == (label or "idle")]
        elif "snapshot" not in (data := json.loads(text)) and ("cotenants" in data or "idle" in data):
            found += _shared_node_sweeps(path, data, label or "idle")
        else:
            found.append(read_json(data))
    return [o for o in found if keep_withheld or (o.snapshot is not None and not _device_withheld(o))]


def _shared_node_sweeps(path: str, data: dict[str, Any], label: str) -> list[SweepOutcome]:
    """A shared_node.py --out file's sweeps of one label (``idle`` or a co-tenant shape)."""
    rows = [{"shape": "idle", **r} for r in data.get("idle", [])] + data.get("cotenants", [])
    chosen = [r["service"] for r in rows if r["shape"] == label]
    if any("once" not in service for service in chosen):
        sys.exit(f"{path}: recorded before shared_node.py kept each sweep's once --json; it cannot be replayed")
    return [read_json(service["once"]) for service in chosen]


def scraped_sweep(path: Path) -> SweepOutcome:
    """One sweep read back from a scrape of /metrics taken right after it: each point's median, spread and noisy
    flag (not its blocks, which /metrics does not carry), the n = 1 fixed cost where it was not a configured size,
    the devices, the environment (``matmul_benchmark_info``), the CPU's load readings, when it ran, and the devices
    it withheld (their timings in the scrape are an earlier sweep's: ``load`` leaves such a sweep out). Every
    timed size is taken as configured: /metrics does not say which were a refinement's. A sweep that withheld
    points alone cannot be read back (/metrics counts them, not which sizes), and is refused.
    Its crossovers are left to the current code to derive."""
    try:
        samples = parse_exposition(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        sys.exit(f"{path}: not a Prometheus text exposition: {exc}")
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for name, labels, value in samples:
        series.setdefault(name, []).append((labels, value))

    def point(labels: dict[str, str]) -> PointKey:
        mode: Mode = "compute" if labels["mode"] == "compute" else "end_to_end"
        return PointKey(
            backend=labels["backend"],
            device=labels["device"],
            dtype=labels["dtype"],
            mode=mode,
            size=int(labels["size"]),
        )

    spreads = {point(labels): value for labels, value in series.get("matmul_duration_iqr_seconds", [])}
    noisy = {point(labels): value > 0 for labels, value in series.get("matmul_duration_noisy", [])}
    measurements = []
    for labels, median in series.get("matmul_duration_seconds", []):
        key = point(labels)
        stop = StopReason.MAX_BLOCKS if noisy.get(key) else StopReason.CONVERGED
        timing = Timing(
            median_s=median,
            iqr_s=spreads.get(key, 0.0),
            blocks=0,
            calls_per_block=0,
            stop_reason=stop,
            noisy=stop is StopReason.MAX_BLOCKS,
        )
        measurements.append(Measurement(key=key, timing=timing))
    timed = {m.key for m in measurements}
    for labels, fixed in series.get("matmul_fixed_cost_seconds", []):
        key = point(labels | {"size": "1"})
        if key not in timed:  # the fixed-cost point, timed beside the configured sizes: a GPU point's host share
            timing = Timing(
                median_s=fixed, iqr_s=0.0, blocks=0, calls_per_block=0, stop_reason=StopReason.CONVERGED, noisy=False
            )
            measurements.append(Measurement(key=key, timing=timing, role="fixed_cost"))
    if any(count > 0 for _, count in series.get("matmul_points_withheld", [])):
        sys.exit(
            f"{path}: its sweep withheld points alone, and /metrics does not say which sizes; replay it from "
            "`once --json` or the run history instead"
        )
    withheld = tuple(
        Withheld(
            backend=labels.get("backend", ""),
            device=labels.get("device", ""),
            reason=WithheldReason(labels["reason"]),
            detail="withheld in the scraped sweep (its timings there are an earlier sweep's)",
        )
        for labels, value in series.get("matmul_device_withheld", [])
        if value > 0
    )
    devices = tuple(
        DeviceInfo(
            backend=labels["backend"],
            device=labels["device"],
            kind="gpu" if labels.get("kind") == "gpu" else "cpu",
            name=labels.get("name", ""),
        )
        for labels, _ in series.get("matmul_device_info", [])
    )
    readings = {name: values[0][1] for name, values in series.items() if name.startswith("matmul_cpu_") and values}
    cpu = next((d.device for d in devices if d.kind == "cpu"), "cpu")
    hardware = HardwareContext(
        backend=devices[0].backend if devices else "",
        device=cpu,
        other_cpu_cores=readings.get("matmul_cpu_other_load_cores"),
        cpu_steal_cores=readings.get("matmul_cpu_steal_cores"),
        cpu_throttled_s=readings.get("matmul_cpu_throttled_seconds"),
    )
    info = next((labels for labels, _ in series.get("matmul_benchmark_info", [])), {})
    environment = {k: v for k, v in info.items() if k != "backend"} | {"framework": info.get("backend", "")}
    finished = next((v for _, v in series.get("matmul_sweep_last_success_timestamp_seconds", [])), 0.0)
    duration = next((v for _, v in series.get("matmul_sweep_duration_seconds", [])), 0.0)
    if not measurements or not finished:
        sys.exit(f"{path}: no timings or no completed sweep in this scrape")
    snapshot = Snapshot(
        started_at=finished - duration,
        finished_at=finished,
        devices=devices,
        measurements=tuple(measurements),
        crossovers=(),
        environment=tuple(sorted(environment.items())),
        hardware=(hardware,),
        withheld=withheld,
    )
    return SweepOutcome(
        result=SweepResult.SUCCESS, started_at=finished - duration, finished_at=finished, snapshot=snapshot
    )


def judged(outcome: SweepOutcome, state: ServiceState, guard: GuardSettings) -> SweepOutcome:
    """A sweep recorded before the service metered each point, judged as the guard judges one now by the points'
    idle ranges in ``state`` (the module's docstring says how); one that metered its points judged itself, and
    is returned as it is. Its points carry the sweep's load reading, so that the store keeps a calm one's medians."""
    snapshot = outcome.snapshot
    # Metered: a point says what others used, or a point was withheld alone (which the guard did only once it
    # metered each point). A metered sweep whose every point the reference read slowed says no others anywhere.
    if snapshot is None or any(m.others_cores is not None for m in snapshot.measurements):
        return outcome
    if any(w.point is not None for w in snapshot.withheld):
        return outcome
    loads = [
        max(h.other_cpu_cores, h.cpu_steal_cores or 0.0) for h in snapshot.hardware if h.other_cpu_cores is not None
    ]
    if not loads:
        return outcome  # no reading to gate on: neither judged nor counted calm, as the service would not
    others = max(loads)
    metered = tuple(dataclasses.replace(m, others_cores=others) for m in snapshot.measurements)
    withheld: list[Withheld] = []
    if others >= others_gate(state.usual_others, guard.range_others_cores):
        figures = {f.key: f for f in state.range_tops}
        kinds = {d.device: d.kind for d in snapshot.devices}
        fixed = {
            (m.key.device, m.key.dtype): m.timing.median_s
            for m in metered
            if (m.key.size, m.key.mode) == (1, "compute")
        }
        for m in metered:
            figure = figures.get(m.key)
            if m.role == "refine" or figure is None or not (math.isfinite(figure.upper_s) and figure.upper_s > 0):
                continue  # a refinement's sizes move from sweep to sweep; the service keeps no range of them
            key = m.key
            share = host_share_at(
                kinds.get(key.device, "cpu"), key.mode, key.size, fixed.get((key.device, key.dtype)), figure.upper_s
            )
            ratio = past_idle_range(m.timing.median_s, figure.upper_s, share, guard.range_max_slowdown)
            if ratio is not None:
                detail = (
                    f"replayed: {ratio:.2f}x the top of its idle range over {figure.sweeps} calm sweeps while others "
                    f"used {others:.2f} cores (the sweep's reading over the CPU's points)"
                )
                withheld.append(
                    Withheld(
                        backend=key.backend,
                        device=key.device,
                        reason=WithheldReason.HOST_SLOWED,
                        detail=detail,
                        point=key,
                    )
                )
    moved = dataclasses.replace(snapshot, measurements=metered, withheld=(*snapshot.withheld, *withheld))
    return dataclasses.replace(outcome, snapshot=moved)


def _published(snapshot: Snapshot) -> tuple[Measurement, ...]:
    """The points the sweep publishes: all but those withheld alone (a sweep judged here still holds them)."""
    set_aside = {w.point for w in snapshot.withheld if w.point is not None}
    return tuple(m for m in snapshot.measurements if m.key not in set_aside)


def _device_withheld(outcome: SweepOutcome) -> bool:
    assert outcome.snapshot is not None
    return any(w.whole_device for w in outcome.snapshot.withheld)


@functools.lru_cache(maxsize=4096)  # bounded: a sweep judged here is a new object whenever its ranges moved
def _derived(outcome: SweepOutcome) -> tuple[Crossover, ...]:
    """The sweep's crossovers as the current code derives them (the same every time: its resampling is seeded)."""
    snapshot = outcome.snapshot
    assert snapshot is not None
    # As the service: only configured sizes leave a gap (the n = 1 fixed-cost point's withholding does not).
    configured = {m.key.size for m in snapshot.measurements if m.role == "sweep"}
    gaps = [w.point for w in snapshot.withheld if w.point is not None and w.point.size in configured]
    fresh = crossovers(snapshot.devices, _published(snapshot), gaps)
    derived = {c.key for c in fresh}
    return (*fresh, *(c for c in snapshot.crossovers if c.state is CrossoverState.WITHHELD and c.key not in derived))


def at(outcome: SweepOutcome, started: float) -> SweepOutcome:
    """The recorded sweep as if it ran at ``started``, its crossovers derived again by the current code."""
    snapshot = outcome.snapshot
    assert snapshot is not None  # recorded sweeps completed
    finished = started + (outcome.finished_at - outcome.started_at)
    derived = tuple(dataclasses.replace(c, derived_at=finished) for c in _derived(outcome))
    moved = dataclasses.replace(
        snapshot,
        started_at=started,
        finished_at=finished,
        measurements=_published(snapshot),
        crossovers=derived,
        measured_at=(),
    )
    return dataclasses.replace(outcome, started_at=started, finished_at=finished, snapshot=moved)


def recorded_at(outcome: SweepOutcome, started: float) -> SweepOutcome:
    """The recorded sweep as if it ran at ``started``, its crossovers as it published them (the code of then).

    Only the times move: the crossovers the sweep derived (all but the withheld ones, which serve no time)
    take the time it ends at here, as ``at`` gives them, so that the same sweep drawn twice in a row reads
    as two sweeps, not as one carried over, in the drift windows' counts and in the coverage.
    """
    snapshot = outcome.snapshot
    assert snapshot is not None  # recorded sweeps completed
    finished = started + (outcome.finished_at - outcome.started_at)
    retimed = tuple(
        c if c.state is CrossoverState.WITHHELD else dataclasses.replace(c, derived_at=finished)
        for c in snapshot.crossovers
    )
    moved = dataclasses.replace(snapshot, started_at=started, finished_at=finished, crossovers=retimed)
    return dataclasses.replace(outcome, started_at=started, finished_at=finished, snapshot=moved)


def shifted(outcome: SweepOutcome, factor: float) -> SweepOutcome:
    """A planted change with a known answer: every size times ``factor``, so the curves, noise and all,
    move along log n and every n* moves by exactly that factor (sizes rounded to integers).

    Where two sizes round to one (1 and 2 times 0.7 are both 1), the first is kept: two timings of one
    point would make the sweep unusable, and every crossover would vanish instead of moving.
    """
    snapshot = outcome.snapshot
    assert snapshot is not None
    moved: dict[object, Measurement] = {}
    for m in snapshot.measurements:
        key = dataclasses.replace(m.key, size=max(1, round(m.key.size * factor)))
        moved.setdefault((key, m.role), dataclasses.replace(m, key=key))
    return dataclasses.replace(outcome, snapshot=dataclasses.replace(snapshot, measurements=tuple(moved.values())))


def served_sequence(
    drawn: Sequence[SweepOutcome],
    *,
    as_recorded: bool = False,
    unjudged: bool = False,
    judgements: Counter[str] | None = None,
) -> list[Served]:
    """What the service serves after each of the sweeps, run one every 15 minutes from START.

    ``as_recorded``: the crossovers each sweep published when it ran, as they were (the code of then),
    but derived at the time the sweep is replayed at. ``unjudged``: a sweep recorded before the service metered
    each point is drawn as it published, not judged by its points' ranges (``judged``). ``judgements`` counts the
    sweeps judged here, those that withheld points, and the points withheld.
    """
    store = StateStore()
    guard = GuardSettings()
    served: list[Served] = []
    for index, outcome in enumerate(drawn):
        started = START + index * SWEEP_S
        if as_recorded:
            latest = recorded_at(outcome, started).snapshot
        else:
            kept = store.read()
            sweep = outcome if unjudged else judged(outcome, kept, guard)
            if judgements is not None and sweep is not outcome and sweep.snapshot and outcome.snapshot:
                added = len(sweep.snapshot.withheld) - len(outcome.snapshot.withheld)
                others = max((m.others_cores or 0.0 for m in sweep.snapshot.measurements), default=0.0)
                judgements.update(
                    unmetered=1,
                    beside_others=others >= others_gate(kept.usual_others, guard.range_others_cores),
                    withholding=added > 0,
                )
                judgements.update(points_withheld=added)
            store.record(at(sweep, started))
            latest = store.read().latest
        served.append(
            {}
            if latest is None
            else {
                c.key: ServedCrossover(c.size, c.ci_lower, c.ci_upper, c.derived_at)
                if c.state is CrossoverState.FOUND
                else ServedCrossover(None, None, None, c.derived_at, c.state is CrossoverState.AMBIGUOUS)
                for c in latest.crossovers
            }
        )
    return served


def draw(
    idle: Sequence[SweepOutcome], planted: Sequence[SweepOutcome], sweeps: int, plant_at: int | None, seed: int
) -> list[SweepOutcome]:
    rng = random.Random(seed)
    return [rng.choice(planted if plant_at is not None and i >= plant_at else idle) for i in range(sweeps)]


def coverage(served: Sequence[Served], mode: str) -> tuple[int, int]:
    """(pairs whose next n* lands inside the interval served before it, pairs with an interval), for one mode.

    Only pairs whose next n* is a fresh one: a crossover carried over unchanged would land inside by itself.
    """
    inside = pairs = 0
    for before, after in itertools.pairwise(served):
        for key, (_, low, high, derived_at, _) in before.items():
            nxt = after.get(key, ServedCrossover(None, None, None, None))
            fresh = nxt.size is not None and nxt.derived_at != derived_at
            if key[4] == mode and fresh and low is not None and high is not None:
                pairs += 1
                inside += low <= (nxt.size or 0) <= high
    return inside, pairs


YOUNG_SWEEPS = 6  # a service's first sweeps: its intervals rest on few earlier moves


def young_coverage(
    idle: Sequence[SweepOutcome], starts: int, seed: int, *, unjudged: bool = False
) -> dict[str, tuple[int, int]]:
    """Per mode, (next n* inside the interval served before it, pairs) over the first YOUNG_SWEEPS sweeps of
    ``starts`` services started afresh, each drawing its sweeps from ``idle``: what a new node's first hours serve."""
    rng = random.Random(seed)
    totals: dict[str, list[int]] = {}
    for _ in range(starts):
        served = served_sequence([rng.choice(idle) for _ in range(YOUNG_SWEEPS)], unjudged=unjudged)
        for mode in sorted({k[4] for sweep in served for k in sweep}):
            inside, pairs = coverage(served, mode)
            total = totals.setdefault(mode, [0, 0])
            total[0] += inside
            total[1] += pairs
    return {mode: (inside, pairs) for mode, (inside, pairs) in totals.items()}


def _values(samples: Sequence[float | None]) -> str:
    """promtool's notation for one sweep's value three times ("vx2"), or its absence ("_x3").

    A series that ends is marked stale, as a scrape that no longer finds it marks it: otherwise
    Prometheus would read its last value for five more minutes, beside the next sweep's other series.
    """
    tokens = []
    for before, v in itertools.pairwise([None, *samples]):
        if v is not None:
            tokens.append(f"{v:.12g}x2")
        else:
            tokens.append("_x3" if before is None else "stale _x2")
    return " ".join(tokens)


def rule_test(runs: dict[str, list[Served]], plant_at: int | None, rules: Path = RULES, evaluation_s: int = 300) -> str:
    """A promtool test file: every run's served series (instance = run name), and ALERTS queried at the end."""
    series = []
    for instance, served in runs.items():
        keys = sorted({k for s in served for k in s})
        for backend, gpu, cpu, dtype, mode in keys:
            labels = (
                f'job="crossover-monitor",instance="{instance}",backend="{backend}",gpu="{gpu}",cpu="{cpu}",'
                f'dtype="{dtype}",mode="{mode}"'
            )
            absent = ServedCrossover(None, None, None, None)
            columns = list(zip(*[s.get((backend, gpu, cpu, dtype, mode), absent) for s in served], strict=True))
            names = ("size", "ci_lower_size", "ci_upper_size", "timestamp_seconds")
            for name, column in zip(names, columns[:4], strict=True):
                series.append({"series": f"matmul_crossover_{name}{{{labels}}}", "values": _values(column)})
            # The state's series for `ambiguous`: 1 in an ambiguous sweep, 0 in any other served one.
            ambiguous = [None if t is None else float(a) for t, a in zip(columns[3], columns[4], strict=True)]
            series.append(
                {"series": f'matmul_crossover_state{{{labels},state="ambiguous"}}', "values": _values(ambiguous)}
            )
    sweeps = max(len(s) for s in runs.values())
    end = sweeps * SWEEP_S
    # promtool evaluates every group at the file's evaluation_interval (a group's own interval is not honoured):
    # ``evaluation_s`` stands for the interval of the group the drift alerts are in.
    onset = (
        f'(ALERTS{{alertname="{ALERT}",alertstate="firing"}}'
        f' unless ALERTS{{alertname="{ALERT}",alertstate="firing"}} offset {evaluation_s}s)'
    )
    # Each answer carries a label "q" naming its question, so that promtool's report can be read back.
    # Over both MatmulCrossoverDrift rules (the 2-hour one carries window="2h"): every onset counts, the first
    # of either is when a user hears of it.
    questions = {
        "count": f"sum by (instance, mode) (count_over_time({onset}[{end}s:{evaluation_s}s]))",
        "first": f"min by (instance, mode) (min_over_time(timestamp({onset})[{end}s:{evaluation_s}s]))",
    }
    if plant_at is not None:
        since = end - plant_at * SWEEP_S
        questions["after"] = f"min by (instance, mode) (min_over_time(timestamp({onset})[{since}s:{evaluation_s}s]))"
    tests = [
        {"expr": f'label_replace({expr}, "q", "{name}", "", "")', "eval_time": f"{end}s", "exp_samples": []}
        for name, expr in questions.items()
    ]
    document = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{evaluation_s}s",
        "tests": [{"interval": "5m", "input_series": series, "promql_expr_test": tests}],
    }
    return json.dumps(document)  # JSON is YAML


_GOT = re.compile(r"\{([^{}]*)\} ([-+0-9.eE]+)")


def run_promtool(text: str) -> dict[str, dict[tuple[str, str], float]]:
    """For each question of the test file, {(instance, mode): value} read from what promtool says it got."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool is not installed: scripts/test installs it with Debian's prometheus package")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as handle:
        handle.write(text)
    try:
        done = subprocess.run(
            [promtool, "test", "rules", handle.name], capture_output=True, text=True, check=False, timeout=3600
        )
    finally:
        Path(handle.name).unlink()
    report = done.stdout + done.stderr
    if "SUCCESS" not in report and "FAILED:" not in report:
        raise SystemExit(f"promtool could not run the replay: {report[-3000:]}")
    # A query promtool could not evaluate answers nothing, which would read as "never fired": say it.
    # (Ten runs of x0.7 in one file once hit its limit on samples in memory, and every delay read None.)
    if ", err: " in report:
        raise SystemExit(f"promtool could not evaluate the replay's queries: {report[-3000:]}")
    answers: dict[str, dict[tuple[str, str], float]] = {"count": {}, "first": {}, "after": {}}
    for labels, value in _GOT.findall(report):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if pairs.get("q") in answers:
            answers[pairs["q"]][(pairs.get("instance", ""), pairs.get("mode", ""))] = float(value)
    return answers


def replay(
    idle: Sequence[SweepOutcome],
    planted: Sequence[SweepOutcome],
    *,
    runs: int,
    days: float,
    plant_day: float | None,
    seed: int = 0,
    rules: Path = RULES,
    as_recorded: bool = False,
    unjudged: bool = False,
    evaluation_s: int = 300,
) -> dict[str, Any]:
    """``runs`` simulated periods of ``days``: onsets of the drift alert per run and mode, delays, coverage."""
    sweeps = round(days * 86400 / SWEEP_S)
    plant_at = None if plant_day is None or not planted else round(plant_day * 86400 / SWEEP_S)
    judgements: Counter[str] = Counter()
    served = {
        f"run-{r}": served_sequence(
            draw(idle, planted, sweeps, plant_at, seed + r),
            as_recorded=as_recorded,
            unjudged=unjudged,
            judgements=judgements,
        )
        for r in range(runs)
    }
    # One promtool run per simulated period: ten in one file can exceed what promtool holds in memory.
    count: dict[tuple[str, str], float] = {}
    first: dict[tuple[str, str], float] = {}
    after: dict[tuple[str, str], float] = {}
    for name, sequence in served.items():
        answers = run_promtool(rule_test({name: sequence}, plant_at, rules, evaluation_s))
        count |= answers["count"]
        first |= answers["first"]
        after |= answers["after"]
    modes = sorted({k[4] for s in served.values() for sweep in s for k in sweep})
    ratios = {
        mode: [
            v.ci_upper / v.ci_lower
            for s in served.values()
            for sweep in s
            for k, v in sweep.items()
            if k[4] == mode and v.ci_lower and v.ci_upper
        ]
        for mode in modes
    }
    # None where no sweep found an n* (TensorFlow's compute below the smallest size: gpu_always_faster).
    widths = {mode: statistics.median(found) if found else None for mode, found in ratios.items()}
    result: dict[str, Any] = {
        "runs": runs,
        "days": days,
        "sweeps_per_run": sweeps,
        "plant_day": plant_day,
        "idle_sweeps": len(idle),
        "planted_sweeps": len(planted),
        "coverage": {
            mode: [sum(x) for x in zip(*(coverage(s[:plant_at], mode) for s in served.values()), strict=True)]
            for mode in modes
        },  # [next n* inside the interval served before it, pairs], idle sweeps only
        "interval_width_median": widths,  # upper / lower of the served interval
        "per_mode": {},
        # Drawn sweeps recorded before the service metered each point, judged here (``judged``): how many, how
        # many beside others (at the gate or more), how many of those withheld points, and how many points.
        "judged_here": dict(judgements),
    }
    for mode in modes:
        row: dict[str, Any] = {"onsets": [], "false_onsets": [], "delay_sweeps": []}
        for r in range(runs):
            name = f"run-{r}"
            onsets = int(count.get((name, mode), 0))
            row["onsets"].append(onsets)
            if plant_at is None:
                row["false_onsets"].append(onsets)
                continue
            first_any = first.get((name, mode))
            first_after = after.get((name, mode))
            early = first_any is not None and first_any < plant_at * SWEEP_S
            row["false_onsets"].append(int(early))
            row["delay_sweeps"].append(None if first_after is None else (first_after - plant_at * SWEEP_S) / SWEEP_S)
        result["per_mode"][mode] = row
    result["served_n"] = {
        mode: sorted(
            round(v.size) for s in served.values() for sweep in s for k, v in sweep.items() if k[4] == mode and v.size
        )[:: max(1, sweeps // 20)]
        for mode in modes
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", nargs="+", required=True, help="recorded idle sweeps (PATH or PATH.jsonl[:LABEL])")
    parser.add_argument("--planted", nargs="*", default=[], help="recorded planted-change sweeps")
    parser.add_argument("--months", type=int, default=10, help="simulated runs of --days each")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--plant-day", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shift", type=float, nargs="*", default=[], help="also plant the idle sweeps with every size times this"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rules", type=Path, default=RULES, help="the rules file (e.g. an earlier release's)")
    parser.add_argument("--keep-withheld", action="store_true", help="draw sweeps that withheld a device too")
    parser.add_argument(
        "--move-share", type=float, help="an experiment: the share of recent moves the served interval covers"
    )
    parser.add_argument(
        "--as-recorded", action="store_true", help="serve the crossovers the sweeps published, not today's code's"
    )
    parser.add_argument(
        "--unjudged",
        action="store_true",
        help="draw sweeps recorded before the service metered each point as they published, unjudged by their ranges",
    )
    parser.add_argument("--young-starts", type=int, default=200, help="fresh services whose first sweeps are drawn")
    parser.add_argument("--young-only", action="store_true", help="only the fresh services' coverage, no promtool")
    parser.add_argument(
        "--evaluation-interval",
        type=int,
        default=600,
        metavar="SECONDS",
        help="how often the drift alerts' group is evaluated (default 600: the baselines group's 10m; the sweeps are "
        "sampled every 5m whatever it is)",
    )
    args = parser.parse_args()
    if args.move_share is not None:
        crossover_module._MOVE_SHARE = args.move_share  # noqa: SLF001 - an experiment on the constant, not a setting
    idle, planted = (
        load(args.idle, keep_withheld=args.keep_withheld),
        load(args.planted, keep_withheld=args.keep_withheld),
    )
    common: dict[str, Any] = {
        "runs": args.months,
        "days": args.days,
        "rules": args.rules.resolve(),
        "as_recorded": args.as_recorded,
        "unjudged": args.unjudged,
        "evaluation_s": args.evaluation_interval,
    }
    young = young_coverage(idle, args.young_starts, args.seed, unjudged=args.unjudged)
    for mode, (inside, pairs) in young.items():
        print(
            f"young services ({args.young_starts}, first {YOUNG_SWEEPS} sweeps): {mode} next n* inside {inside}/{pairs}"
        )
    if args.young_only:
        return
    report: dict[str, Any] = {"young": young, "idle": replay(idle, [], plant_day=None, seed=args.seed, **common)}
    if planted:
        report["planted"] = replay(idle, planted, plant_day=args.plant_day, seed=args.seed + 1000, **common)
    for factor in args.shift:
        moved = [shifted(o, factor) for o in idle]
        report[f"shift-{factor:g}"] = replay(idle, moved, plant_day=args.plant_day, seed=args.seed + 2000, **common)
    report["inputs"] = {
        "idle": args.idle,
        "planted": args.planted,
        "shift": args.shift,
        "rules": str(args.rules),
        "as_recorded": args.as_recorded,
        "keep_withheld": args.keep_withheld,
        "unjudged": args.unjudged,
        "evaluation_interval_s": args.evaluation_interval,
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    for phase, body in report.items():
        if phase in ("inputs", "young"):
            continue
        print(f"{phase}: {body['runs']} runs of {body['days']:g} days")
        for mode, (inside, pairs) in body["coverage"].items():
            width = body["interval_width_median"][mode]
            wide = "none served" if width is None else f"{width:.2f}"
            print(f"  {mode}: next n* inside the served interval {inside}/{pairs}, its width (upper/lower) {wide}")
        for mode, row in body["per_mode"].items():
            print(f"  {mode}: false onsets {row['false_onsets']} delays (sweeps) {row['delay_sweeps']}")
        if body["judged_here"]:
            print(f"  recorded before each point was metered, judged here: {body['judged_here']}")


if __name__ == "__main__":
    main()
