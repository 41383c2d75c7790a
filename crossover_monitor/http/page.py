"""The landing page at ``/``: what this instance measures, its latest crossovers, its recent runs, a picture.

Rendered on the server from the state the service serves (no script, no external asset), every value
escaped. The picture is the latest sweep's chart as SVG (``/sweep.svg``), drawn by svgchart.py in this
process with the standard library alone, once per served sweep, and kept.
"""

from __future__ import annotations

import enum
import html
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

from crossover_monitor.config.settings import Settings
from crossover_monitor.model import CrossoverState, ServiceState, Snapshot, SweepOutcome, WithheldReason
from crossover_monitor.service.history import Run
from crossover_monitor.text import took_text, utc_text
from crossover_monitor.view import svgchart
from crossover_monitor.view.chart import PlotError, from_snapshot
from crossover_monitor.view.report import not_timed

log = logging.getLogger(__name__)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; max-width: 72rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.75rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.failed, .timeout, .withheld { color: #b00020; }
.partial { color: #8a5a00; }
.success, .found { color: #1b5e20; }
img { max-width: 100%; border: 1px solid #ddd; }
nav a { margin-right: 1rem; }
"""


def _time(seconds: float | None) -> str:
    return "–" if seconds is None else utc_text(seconds)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render(
    settings: Settings,
    state: ServiceState,
    runs: Sequence[Run] | None,
    *,
    picture: PictureState,
    now: float,
    version: str,
    history_problem: str = "",
) -> str:
    """The whole page; ``history_problem``: why the run history could not be read for it (then ``runs`` is None)."""
    bench = settings.benchmark
    schedule = settings.schedule
    cadence = f"cron {schedule.cron}" if schedule.cron else f"every {schedule.interval_s:g} s"
    due = state.next_sweep_at
    next_run = "not scheduled" if due is None else f"{_time(due)} (in {max(0.0, due - now):.0f} s)"
    latest = state.latest
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>crossover-monitor on {_e(socket.gethostname())}</title><style>{_STYLE}</style></head><body>",
        f"<h1>crossover-monitor <small>{_e(version)}</small></h1>",
        "<nav><a href='/metrics'>/metrics</a><a href='/-/healthy'>/-/healthy</a><a href='/-/ready'>/-/ready</a></nav>",
        "<h2>What it measures</h2><table id='settings'>",
        f"<tr><th>host</th><td>{_e(socket.gethostname())}</td></tr>",
        f"<tr><th>backend</th><td>{_e(bench.backend)}</td></tr>",
        f"<tr><th>devices</th><td>{_e(_devices(state) or 'auto')}</td></tr>",
        f"<tr><th>sizes</th><td>{_e(', '.join(map(str, bench.sizes)))}</td></tr>",
        f"<tr><th>dtypes, modes</th><td>{_e(', '.join(bench.dtypes))}; {_e(', '.join(bench.modes))}</td></tr>",
        f"<tr><th>schedule</th><td>{_e(cadence)}</td></tr>",
        f"<tr><th>next run</th><td id='next-run'>{_e(next_run)}</td></tr>",
        *_next_try(state, now),
        f"<tr><th>latest sweep</th><td>{_e(_time(latest.finished_at if latest else None))}</td></tr>",
        "</table>",
        "<h2>Crossovers</h2>",
    ]
    parts += _crossovers(state)
    parts += _what_to_do(settings, state)
    parts.append("<h2>Latest sweep</h2>")
    if latest is None:
        parts.append("<p>No sweep has completed yet.</p>")
    elif picture is PictureState.DRAWN:
        # The two handlers only mark whether the browser could show it, and at what size (the page's test reads them).
        parts.append(
            "<img id='sweep' src='/sweep.svg' alt='time against matrix size, CPU and GPU, crossovers marked'"
            " onload=\"this.dataset.shown='yes';this.dataset.width=this.naturalWidth\""
            " onerror=\"this.dataset.shown='no'\">"
        )
    else:
        parts.append("<p id='no-picture'>The chart of this sweep could not be drawn; the service's log says why.</p>")
    parts.append("<h2>Recent runs</h2>")
    parts += _runs(state, runs, history_problem)
    parts.append("</body></html>")
    return "\n".join(parts)


def _next_try(state: ServiceState, now: float) -> list[str]:
    """When the devices withheld in the latest sweep are timed again, where a retry is planned."""
    due, latest = state.next_retry_at, state.latest
    if due is None or latest is None or not latest.devices_to_retry:
        return []
    devices = ", ".join(latest.devices_to_retry)
    row = (
        f"<tr><th>next try</th><td id='next-try'>{_e(_time(due))} (in {max(0.0, due - now):.0f} s): "
        f"{_e(devices)}, withheld in the latest sweep</td></tr>"
    )
    return [row]


def _what_to_do(settings: Settings, state: ServiceState) -> list[str]:
    """For each reason the latest sweep withheld a whole device for, what a person can change (once a reason)."""
    latest = state.latest
    if latest is None:
        return []
    reasons = sorted({w.reason for w in latest.withheld if w.whole_device}, key=lambda r: r.value)
    advice = [_ADVICE[r](settings) for r in reasons if r in _ADVICE]
    return [f"<p class='advice'>{_e(text)}</p>" for text in advice]


def _contended(settings: Settings) -> str:
    threads = settings.benchmark.cpu_threads
    cores = len(os.sched_getaffinity(0))
    using = (
        f"benchmark.cpu_threads is {threads}" if threads is not None else "benchmark.cpu_threads is auto: all of them"
    )
    return (
        f"Other programs used the cores the CPU timing needed ({using}, of {cores} cores here). It is tried again "
        f"every guard.retry_interval until they leave room; to time beside them, set benchmark.cpu_threads below "
        f"the cores, so that a busy core leaves some free (or raise guard.cpu_max_other_cores, at the cost of "
        f"timings slowed by them)."
    )


# What to change, per reason a whole device is withheld for (a point withheld alone says its reason beside it).
_ADVICE: dict[WithheldReason, Callable[[Settings], str]] = {
    WithheldReason.CPU_CONTENDED: _contended,
    WithheldReason.GPU_BUSY: lambda _: (
        "Another program uses the GPU: the monitor stays out of its way and tries again every guard.retry_interval "
        "until it is free (guard.gpu_max_utilization and guard.gpu_max_other_processes say what counts as busy)."
    ),
    WithheldReason.YIELDED: lambda _: (
        "A job started on a GPU while the sweep ran, so the rest of the sweep was given up; it is tried again every "
        "guard.retry_interval."
    ),
    WithheldReason.UNGUARDED: lambda _: (
        "The guard cannot see the GPU's other users (NVML missing or failing), so the GPU is not timed: give the "
        "service NVML (nvidia-ml-py), or set guard.require_nvml: false to time it unguarded."
    ),
}


def _devices(state: ServiceState) -> str:
    latest = state.latest
    if latest is None:
        return ""
    return ", ".join(f"{d.device} ({d.name})" if d.name else d.device for d in latest.devices)


def _crossovers(state: ServiceState) -> list[str]:
    latest = state.latest
    # Why the backend found no GPU: beside the no_gpu state, or alone where no curve came to be compared.
    problem = (
        [] if latest is None or not latest.gpu_problem else [f"<p id='no-gpu'>No GPU: {_e(latest.gpu_problem)}</p>"]
    )
    if latest is None:
        return ["<p>None yet.</p>", *problem]
    # Every withheld device with its reason, also where nothing could be compared: a sweep that measured
    # nothing says what it withheld and why, never only "none yet".
    withheld = [
        f"<p class='withheld'>{_e(w.subject)} withheld ({_e(w.reason.value)}): {_e(w.detail)}</p>"
        for w in latest.withheld
    ]
    if not latest.crossovers:
        return ["<p>None yet.</p>", *problem, *withheld]
    head = "".join(f"<th>{h}</th>" for h in ("GPU", "CPU", "dtype", "mode", "state", "n*", "bracket", "measured"))
    rows = [f"<table id='crossovers'><tr>{head}</tr>"]
    measured = dict(latest.measured_at)
    for c in latest.crossovers:
        size = f"{c.size:.0f}" if c.state is CrossoverState.FOUND and c.size is not None else "–"
        bracket = f"{c.lower:g} – {c.upper:g}" if c.lower is not None and c.upper is not None else "–"
        when = _time(measured.get(c.gpu, latest.finished_at))
        rows.append(
            f"<tr><td>{_e(c.gpu)}</td><td>{_e(c.cpu)}</td><td>{_e(c.dtype)}</td><td>{_e(c.mode)}</td>"
            f"<td class='{_e(c.state.value)}'>{_e(c.state.value)}</td><td>{size}</td><td>{bracket}</td>"
            f"<td>{_e(when)}</td></tr>"
        )
    rows.append("</table>")
    carried = [f"<p class='carried'>{_e(line)}</p>" for line in not_timed(latest)]
    return [*rows, *problem, *withheld, *carried]


def _runs(state: ServiceState, runs: Sequence[Run] | None, history_problem: str = "") -> list[str]:
    if runs is None:  # no history (or none readable now): the latest attempt is all there is
        outcome = state.last_outcome
        note = (
            f"<p>The run history cannot be read just now: {_e(history_problem)}. The latest run only.</p>"
            if history_problem
            else "<p>No run history (set history.directory): the latest run only.</p>"
        )
        if outcome is None:
            return [note, "<p>None yet.</p>"]
        runs = [_as_run(outcome)]
        rows = [note]
    else:
        rows = []
    if not runs:
        return [*rows, "<p>None yet.</p>"]
    rows.append("<table id='runs'><tr><th>started</th><th>took</th><th>kind</th><th>result</th><th>reason</th></tr>")
    for run in runs:
        took = took_text(run.started_at, run.finished_at, " s")
        rows.append(
            f"<tr><td>{_e(_time(run.started_at))}</td><td>{took}</td><td>{_e(run.kind)}</td>"
            f"<td class='{_e(run.result)}'>{_e(run.result)}</td><td>{_e(run.reason)}</td></tr>"
        )
    rows.append("</table>")
    return rows


def _as_run(outcome: SweepOutcome) -> Run:
    return Run(
        kind="sweep",
        started_at=outcome.started_at,
        finished_at=outcome.finished_at,
        result=outcome.result.value,
        reason=outcome.reason,
        devices=(),
        crossovers=(),
    )


class PictureState(enum.Enum):
    """Where the latest sweep's chart stands, for the page and ``/sweep.svg``."""

    NONE = "none"  # no sweep yet
    DRAWN = "drawn"
    FAILED = "failed"  # this sweep's chart could not be drawn (the log says why); not tried again


class Picture(NamedTuple):
    state: PictureState
    svg: bytes | None = None


def draw(latest: Snapshot) -> bytes:
    """The served sweep's chart as SVG, its title naming this host."""
    return svgchart.render(from_snapshot(latest, socket.gethostname()))


class SweepPicture:
    """The latest sweep's chart as SVG, drawn at the first ask for each served snapshot and kept.

    Drawn on the asking thread, once per sweep: a real sweep's chart takes a few milliseconds, the largest the
    limits allow (64 curves in 8 panels) under 20 ms (benchmarks/README.md, "The landing page's picture without
    matplotlib").
    """

    def __init__(self, draw: Callable[[Snapshot], bytes] = draw) -> None:
        self._draw = draw
        self._lock = threading.Lock()  # two first asks at once draw it once
        # (the snapshot drawn, its picture or None: failed). Keyed on the object: a retry laid over the
        # served snapshot, or a reload's trim, keeps the sweep's end time but changes what is served.
        self._drawn: tuple[Snapshot, bytes | None] | None = None

    def look(self, state: ServiceState) -> Picture:
        """The latest sweep's picture, drawn now if nobody has asked for it yet."""
        latest = state.latest
        if latest is None:
            return Picture(PictureState.NONE)
        with self._lock:
            if self._drawn is None or self._drawn[0] is not latest:
                self._drawn = (latest, self._drawn_or_none(latest))  # a failure too: not tried again for it
            svg = self._drawn[1]
        return Picture(PictureState.DRAWN, svg) if svg is not None else Picture(PictureState.FAILED)

    def _drawn_or_none(self, latest: Snapshot) -> bytes | None:
        try:
            return self._draw(latest)
        except PlotError as exc:  # nothing to draw, or more than a chart can show
            log.warning("the sweep's chart cannot be drawn", extra={"reason": str(exc)})
        except Exception:  # a bug in drawing must not take the page down with it
            log.exception("drawing the sweep's chart failed")
        return None
