"""The landing page at ``/``: what this instance measures, its latest crossovers, its recent runs, a picture.

Rendered on the server from the state the service serves (no script, no external asset), every value
escaped. The picture is the ``plot`` command's chart of the latest sweep, drawn in a separate process
(``python -m crossover_monitor plot``) so matplotlib never stays loaded in the daemon, and only where the
optional ``plot`` extra is installed; it is drawn once per sweep, on a thread of its own, and kept.
"""

from __future__ import annotations

import enum
import html
import importlib.util
import logging
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from crossover_monitor.errors import PLOT_EXTRA_HINT
from crossover_monitor.history import Run
from crossover_monitor.model import CrossoverState, ServiceState, Snapshot, SweepOutcome, SweepResult
from crossover_monitor.report import render_json
from crossover_monitor.settings import Settings
from crossover_monitor.text import took_text, utc_text

log = logging.getLogger(__name__)

_PLOT_TIMEOUT_S = 60.0
_RELOAD_S = 3  # a chart takes about that long to draw
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
        # No script: while the chart is being drawn, the page comes again by itself.
        f"<meta http-equiv='refresh' content='{_RELOAD_S}'>" if picture is PictureState.DRAWING else "",
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
        f"<tr><th>latest sweep</th><td>{_e(_time(latest.finished_at if latest else None))}</td></tr>",
        "</table>",
        "<h2>Crossovers</h2>",
    ]
    parts += _crossovers(state)
    parts.append("<h2>Latest sweep</h2>")
    if latest is None:
        parts.append("<p>No sweep has completed yet.</p>")
    elif picture is PictureState.DRAWN:
        # The two handlers only mark whether the browser could show it (the page's test reads them).
        parts.append(
            "<img id='sweep' src='/sweep.svg' alt='time against matrix size, CPU and GPU, crossovers marked'"
            " onload=\"this.dataset.shown='yes'\" onerror=\"this.dataset.shown='no'\">"
        )
    elif picture is PictureState.DRAWING:
        parts.append("<p id='drawing'>The chart of this sweep is being drawn; the page reloads in a few seconds.</p>")
    elif picture is PictureState.FAILED:
        parts.append("<p id='no-picture'>The chart of this sweep could not be drawn; the service's log says why.</p>")
    else:
        parts.append(f"<p id='no-picture'>Install the plot extra for a picture: {PLOT_EXTRA_HINT}.</p>")
    parts.append("<h2>Recent runs</h2>")
    parts += _runs(state, runs, history_problem)
    parts.append("</body></html>")
    return "\n".join(parts)


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
    return [*rows, *problem, *withheld]


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


def plot_available() -> bool:
    """Whether the plot extra is installed (looked up, not imported)."""
    return importlib.util.find_spec("matplotlib") is not None


class PictureState(enum.Enum):
    """Where the latest sweep's chart stands, for the page and ``/sweep.svg``."""

    NONE = "none"  # no sweep yet
    UNAVAILABLE = "unavailable"  # the plot extra is not installed
    DRAWING = "drawing"
    DRAWN = "drawn"
    FAILED = "failed"  # this sweep's chart could not be drawn (the log says why); not tried again


class Picture(NamedTuple):
    state: PictureState
    svg: bytes | None = None


class SweepPicture:
    """The latest sweep's chart as SVG, drawn once per sweep by a child process on a thread of its own.

    Asking never waits for the drawing (up to a minute): an HTTP handler thread held that long is one
    the scrapes cannot use. The first ask for a sweep starts it and hears DRAWING until it is done.
    """

    def __init__(self, draw: Callable[[Snapshot], bytes | None] | None = None) -> None:
        self._draw = draw or _draw_in_child
        self._lock = threading.Lock()
        # (the snapshot drawn, its picture or None: failed). Keyed on the object: a retry laid over the
        # served snapshot, or a reload's trim, keeps the sweep's end time but changes what is served.
        self._drawn: tuple[Snapshot, bytes | None] | None = None
        self._drawing = False

    def look(self, state: ServiceState) -> Picture:
        """The latest sweep's picture, or where it stands; starts drawing it if nobody has yet."""
        latest = state.latest
        if latest is None:
            return Picture(PictureState.NONE)
        if not plot_available():
            return Picture(PictureState.UNAVAILABLE)
        with self._lock:
            if self._drawn is not None and self._drawn[0] is latest:
                svg = self._drawn[1]
                return Picture(PictureState.DRAWN, svg) if svg is not None else Picture(PictureState.FAILED)
            if not self._drawing:  # one drawing at a time: a newer sweep's starts at the next ask after it
                self._drawing = True
                threading.Thread(target=self._draw_and_keep, args=(latest,), name="sweep-picture", daemon=True).start()
            return Picture(PictureState.DRAWING)

    def _draw_and_keep(self, latest: Snapshot) -> None:
        try:
            svg = self._draw(latest)
        except Exception:  # a bug in drawing must not leave "drawing" forever
            log.exception("drawing the sweep's chart failed")
            svg = None
        with self._lock:
            self._drawn = (latest, svg)  # a failure too: not tried again for this snapshot
            self._drawing = False


def _draw_in_child(latest: Snapshot) -> bytes | None:
    outcome = SweepOutcome(
        result=SweepResult.SUCCESS, started_at=latest.started_at, finished_at=latest.finished_at, snapshot=latest
    )
    with tempfile.TemporaryDirectory(prefix="crossover-monitor-plot-") as scratch:
        source, chart = Path(scratch) / "sweep.json", Path(scratch) / "sweep.svg"
        source.write_text(render_json(outcome), encoding="utf-8")
        # -P: never a "crossover_monitor" from the working directory instead of this one.
        command = [sys.executable, "-P", "-m", "crossover_monitor", "plot", "--from-json", str(source), str(chart)]
        try:
            done = subprocess.run(  # noqa: S603 - this interpreter and paths of our own
                command, capture_output=True, text=True, timeout=_PLOT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            log.warning("drawing the sweep's chart took too long; the page goes without it")
            return None
        if done.returncode != 0:
            log.warning("drawing the sweep's chart failed", extra={"stderr": done.stderr.strip()[-300:]})
            return None
        return chart.read_bytes()
