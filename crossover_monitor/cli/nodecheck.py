"""``node-check``: a node-problem-detector custom plugin that answers from the running service's results.

It runs no sweep of its own. What the node can tell for certain comes from the service's /metrics (a
GPU that failed in the latest sweep, results gone stale); what needs history (the crossover drifting,
throughput below its baseline) is judged where that history is, by the project's alert rules in
Prometheus, and read back as the alerts firing for this node. So a node condition and a page never
disagree about what "drifting" means.

Exit codes are node-problem-detector's plugin contract: 0 OK, 1 a problem, 2 unknown; the first line
of standard output is the condition's message.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from crossover_monitor.metrics import BUILD_INFO, DEVICE_INFO, DEVICE_UP, DEVICE_WITHHELD, LAST_SUCCESS
from crossover_monitor.scrape import Sample, ScrapeError, fetch_samples, prometheus_query
from crossover_monitor.text import brief


class Status(enum.IntEnum):
    """node-problem-detector's plugin exit codes."""

    OK = 0
    PROBLEM = 1
    UNKNOWN = 2


class Check(enum.Enum):
    """Which node condition is asked about (each its own rule in the node-problem-detector config)."""

    DEGRADED = "degraded"  # a GPU failed, went missing from the sweep, or its throughput fell (alert)
    DRIFT = "drift"  # the crossover moved from its baseline (alert; needs Prometheus)


# The alerts each check reads back from Prometheus: the rules in deploy/prometheus/rules.yml.
ALERTS = {
    Check.DEGRADED: ("MatmulDeviceDown", "MatmulGpuThroughputDegraded"),
    Check.DRIFT: ("MatmulCrossoverDrift",),
}

ALERTS_SHOWN = 5  # the condition's message is one short line (node-problem-detector cuts it)
STALE_ALERT = "MatmulResultsStale"  # firing: what the other alerts say is old, so the answer is unknown

# Without --max-age: results older than this are stale (two hours: eight sweeps at the default 15 minutes).
# Not derived from the next sweep's time: the scheduler moves that on past every failed or skipped run, so
# it says nothing of how old the results are.
DEFAULT_MAX_AGE_S = 2 * 3600.0
# A last success dated further ahead than this is not a fresh result but a clock (or a series) that is wrong.
FUTURE_TOLERANCE_S = 300.0


_ByName = dict[str, list[tuple[dict[str, str], float]]]  # samples by metric name


@dataclass(frozen=True)
class Verdict:
    status: Status
    message: str


@dataclass(frozen=True)
class Request:
    url: str  # the service's /metrics
    check: Check
    prometheus_url: str | None
    instance: str | None  # this node's `instance` label in Prometheus
    timeout_s: float
    max_age_s: float | None  # None: DEFAULT_MAX_AGE_S


def run(request: Request, now: float) -> Verdict:
    """The verdict for one check; the service and Prometheus are each asked once."""
    if request.check is Check.DRIFT and request.prometheus_url is None:
        return Verdict(Status.UNKNOWN, "unknown: drift is judged by the alert rules; give --prometheus.url")
    if not request.url and request.prometheus_url is None:
        return Verdict(Status.UNKNOWN, "unknown: nothing to ask: give --url or --prometheus.url")
    deadline = time.monotonic() + request.timeout_s  # one for the whole check, however many requests it makes

    def left() -> float:
        return max(0.05, deadline - time.monotonic())

    local = Verdict(Status.OK, "")
    if request.url:  # empty: Prometheus alone (where the service cannot be reached from here)
        try:
            local = judge_service(fetch_samples(metrics_url(request.url), left()), now, request.max_age_s)
        except ScrapeError as exc:
            local = Verdict(Status.UNKNOWN, f"unknown: crossover-monitor not read: {exc}")
    if request.check is Check.DRIFT:
        local = local if local.status is Status.UNKNOWN else Verdict(Status.OK, "")
    if request.prometheus_url is None:
        return local
    if not request.instance:
        alerts = Verdict(Status.UNKNOWN, "unknown: give --instance (this node's instance label) with --prometheus.url")
    else:
        alerts = _ask_prometheus(request.prometheus_url, ALERTS[request.check], request.instance, left)
    return combine(local, alerts)


def judge_service(samples: Iterable[Sample], now: float, max_age_s: float | None) -> Verdict:
    """What the service's latest results say of the node's GPUs."""
    by_name: _ByName = {}
    for name, labels, value in samples:
        by_name.setdefault(name, []).append((labels, value))
    if BUILD_INFO not in by_name:
        return Verdict(Status.UNKNOWN, "unknown: the URL serves no crossover-monitor metrics")
    odd = _odd_series(by_name)
    if odd is not None:
        return Verdict(Status.UNKNOWN, f"unknown: the service's metrics make no sense: {odd}")
    gpus = sorted(labels["device"] for labels, _ in by_name.get(DEVICE_INFO, []) if labels.get("kind") == "gpu")
    return _devices(by_name, gpus) or _freshness(by_name, now, max_age_s) or _working(by_name, gpus)


def _odd_series(by_name: _ByName) -> str | None:
    """What in the series the verdict reads no service of this project writes (a proxy's or a forger's), or None."""
    for name in (DEVICE_INFO, DEVICE_UP, DEVICE_WITHHELD):
        for labels, value in by_name.get(name, []):
            if "device" not in labels:
                return f"{name} without a device label"
            if name != DEVICE_INFO and value not in (0.0, 1.0):
                return f"{name}{{device={labels['device']!r}}} is {value:g}, neither 0 nor 1"
    last = _single(by_name, LAST_SUCCESS)
    if last is not None and not math.isfinite(last):
        return f"{LAST_SUCCESS} is {last:g}"
    return None


def _devices(by_name: _ByName, gpus: list[str]) -> Verdict | None:
    """A verdict if the latest sweep lost a GPU, measured nothing, or found no GPU."""
    up = {labels["device"]: value for labels, value in by_name.get(DEVICE_UP, [])}
    if not up:
        return Verdict(Status.UNKNOWN, "unknown: no sweep has finished yet")
    if all(value == 0 for value in up.values()):
        return Verdict(Status.UNKNOWN, "unknown: the latest sweep measured no device (see the service's log)")
    # A device down that is not among those found is a GPU that was lost (the CPU is always found).
    cpus = {labels["device"] for labels, _ in by_name.get(DEVICE_INFO, []) if labels.get("kind") == "cpu"}
    failed = sorted(device for device, value in up.items() if value == 0 and device not in cpus)
    if failed:
        return Verdict(Status.PROBLEM, f"problem: GPU {', '.join(failed)} failed in the latest sweep")
    if not gpus:
        return Verdict(Status.UNKNOWN, "unknown: the service found no GPU (its landing page says why)")
    return None


def _freshness(by_name: _ByName, now: float, max_age_s: float | None) -> Verdict | None:
    """A verdict if no sweep succeeded, or the latest success is older than DEFAULT_MAX_AGE_S (or --max-age),
    or dated in the future (this host's clock and the service's disagree)."""
    last = _single(by_name, LAST_SUCCESS)
    if last is None:
        return Verdict(Status.UNKNOWN, "unknown: no sweep has succeeded yet")
    if last - now > FUTURE_TOLERANCE_S:
        ahead = _ago(last - now)
        return Verdict(Status.UNKNOWN, f"unknown: the latest successful sweep is dated {ahead} in the future")
    limit = max_age_s if max_age_s is not None else DEFAULT_MAX_AGE_S
    if now - last > limit:
        return Verdict(
            Status.UNKNOWN, f"unknown: the latest successful sweep is {_ago(now - last)} old (allowed {_ago(limit)})"
        )
    return None


def _working(by_name: _ByName, gpus: list[str]) -> Verdict:
    last = _single(by_name, LAST_SUCCESS) or 0.0
    withheld = {labels["device"] for labels, value in by_name.get(DEVICE_WITHHELD, []) if value == 1}
    busy = [g for g in gpus if g in withheld]
    note = f"; {', '.join(busy)} withheld (in use by other work)" if busy else ""
    when = dt.datetime.fromtimestamp(last, tz=dt.UTC)
    return Verdict(Status.OK, f"ok: {', '.join(gpus)} working, swept {when:%H:%M} UTC{note}")


def combine(local: Verdict, alerts: Verdict) -> Verdict:
    """A problem from either source wins; then an unknown; both OK is OK."""
    for status in (Status.PROBLEM, Status.UNKNOWN):
        found = [v.message for v in (local, alerts) if v.status is status and v.message]
        if found:
            return Verdict(status, "; ".join(found))
    return Verdict(Status.OK, "; ".join(v.message for v in (local, alerts) if v.message))


def metrics_url(url: str) -> str:
    """The service's /metrics: a URL given as the service's base (``http://node:9437``) gets the path."""
    return url.rstrip("/") + "/metrics" if urllib.parse.urlsplit(url).path in ("", "/") else url


def _ask_prometheus(base_url: str, names: Sequence[str], instance: str, left: Callable[[], float]) -> Verdict:
    node = f"instance={_quoted(instance)}"
    alerts = "|".join((*names, STALE_ALERT))
    try:
        # A wrong --instance would find no alert forever: first make sure Prometheus has this node at all.
        present = prometheus_query(base_url, f"{BUILD_INFO}{{{node}}}", left())
        # MatmulDeviceDown fires for a CPU too; the node's GPU conditions leave CPUs out.
        firing_expr = (
            f'ALERTS{{alertstate="firing", alertname=~"{alerts}", {node}}}'
            f' unless on (instance, device) {DEVICE_INFO}{{kind="cpu"}}'
        )
        firing = prometheus_query(base_url, firing_expr, left()) if present else []
    except ScrapeError as exc:
        return Verdict(Status.UNKNOWN, f"unknown: alerts not read: {exc}")
    if not present:
        return Verdict(Status.UNKNOWN, f"unknown: Prometheus has no crossover-monitor series with {node}")
    labels = [a.get("metric") or {} for a in firing]
    problems = sorted({_alert_text(m) for m in labels if m.get("alertname") != STALE_ALERT})
    if problems:
        more = f" and {len(problems) - ALERTS_SHOWN} more" if len(problems) > ALERTS_SHOWN else ""
        return Verdict(Status.PROBLEM, "problem: " + ", ".join(brief(p) for p in problems[:ALERTS_SHOWN]) + more)
    if firing:
        return Verdict(Status.UNKNOWN, f"unknown: {STALE_ALERT} is firing: the results are old")
    return Verdict(Status.OK, f"no {'/'.join(names)} alert")


def _alert_text(labels: dict[str, str]) -> str:
    """``MatmulCrossoverDrift (/GPU:0 end_to_end)``: the alert and what it is about, briefly."""
    where = [labels[k] for k in ("gpu", "device", "mode") if labels.get(k)]
    return f"{labels.get('alertname', 'alert')} ({' '.join(where)})" if where else labels.get("alertname", "alert")


def _quoted(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _single(by_name: _ByName, name: str) -> float | None:
    values = by_name.get(name)
    return values[0][1] if values else None


def _ago(seconds: float) -> str:
    """A duration as people read one: ``45s``, ``12m``, ``3h05m``, ``12d3h``."""
    if seconds < 60:  # noqa: PLR2004 - a minute
        return f"{seconds:.0f}s"
    hours, minutes = divmod(int(seconds // 60), 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"
