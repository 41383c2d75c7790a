"""What a fleet's global Prometheus federates: its `match[]` selectors read against the metric contract.

A global tier keeps one series a GPU, dtype and mode (``instance_gpu:matmul_crossover_size:peer``); a selector that
can match the per-point curve (``matmul_duration_seconds`` and the rest the fleet profile leaves on the node, or a
recording per size) would bring 95 series a GPU to it, and one with no name at all everything. Used by
``crossover-monitor check-federation``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover_monitor.config.yamlfile import YamlFileError, read_document
from crossover_monitor.metrics import METRICS

# The series the global tier is for: the fleet outlier's input (deploy/prometheus/fleet-rules.yml).
GLOBAL_SERIES = frozenset({"instance_gpu:matmul_crossover_size:peer"})
# Per size, or per point of the curve: what must never reach the global tier.
PER_POINT = frozenset(
    {spec.exposed_name for spec in METRICS.values() if not spec.fleet} | {"instance_device:matmul_gpu_speedup:ratio"}
)
# Everything else this project names (the fleet profile's series, the recordings): allowed, but more than it needs.
KNOWN = frozenset({spec.exposed_name for spec in METRICS.values()} | GLOBAL_SERIES)

_MATCHER = re.compile(r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*(,|$)""")
_NAME = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{.*\})?\s*$", re.DOTALL)


class SelectorError(ValueError):
    """A `match[]` value that is not a series selector."""


@dataclass(frozen=True)
class Selector:
    """A series selector's matchers on the metric name (``__name__``); the others do not limit which names match."""

    text: str
    name_matchers: tuple[tuple[str, str], ...]  # (operator, value)

    def matches(self, name: str) -> bool:
        """Whether a series of this name can match (Prometheus anchors its regular expressions)."""
        for op, value in self.name_matchers:
            found = {
                "=": name == value,
                "!=": name != value,
                "=~": re.fullmatch(value, name) is not None,
                "!~": re.fullmatch(value, name) is None,
            }[op]
            if not found:
                return False
        return True


def _unquoted(quoted: str) -> str:
    """A PromQL string literal's value: its quotes off, its escapes (a backslash before any character) read."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), quoted[1:-1])


def parse_selector(text: str) -> Selector:
    """``name{label="value", ...}`` or ``{...}``; SelectorError says what is wrong."""
    whole = _NAME.fullmatch(text)
    if whole is None or (whole.group(1) is None and whole.group(2) is None):
        raise SelectorError(f'{text!r} is not a series selector (name{{label="value"}})')
    name_matchers = [("=", whole.group(1))] if whole.group(1) else []
    body = (whole.group(2) or "{}")[1:-1].strip()
    position = 0
    while position < len(body):
        matcher = _MATCHER.match(body, position)
        if matcher is None:
            raise SelectorError(f"{text!r}: cannot read the label matcher at {body[position:]!r}")
        label, op, value = matcher.group(1), matcher.group(2), _unquoted(matcher.group(3))
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise SelectorError(f"{text!r}: {value!r} is not a regular expression ({exc})") from None
        if label == "__name__":
            name_matchers.append((op, value))
        position = matcher.end()
    return Selector(text, tuple(name_matchers))


@dataclass(frozen=True)
class Finding:
    """One thing a federation job would bring to the global tier: ``error`` where it must not."""

    job: str
    selector: str
    message: str
    error: bool


def _federation_jobs(config: Any) -> list[dict[str, Any]]:
    jobs = config.get("scrape_configs") if isinstance(config, dict) else None
    return [job for job in jobs or [] if isinstance(job, dict) and job.get("metrics_path") == "/federate"]


def findings(config: Any) -> list[Finding]:
    """Each federation job's `match[]` selectors against what the global tier is for."""
    found = []
    for job in _federation_jobs(config):
        name = str(job.get("job_name", "?"))
        params = job.get("params")
        selectors = (params.get("match[]") if isinstance(params, dict) else None) or []
        if not selectors:
            found.append(Finding(name, "", "has no match[]: Prometheus refuses to federate without one", error=True))
        for text in selectors:
            try:
                selector = parse_selector(str(text))
            except SelectorError as exc:
                found.append(Finding(name, str(text), str(exc), error=True))
                continue
            found += _judged(name, selector)
    return found


_NAMES_SHOWN = 4  # a message names this many series, then how many more


def _listed(names: list[str]) -> str:
    more = len(names) - _NAMES_SHOWN
    return ", ".join(names[:_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _judged(job: str, selector: Selector) -> list[Finding]:
    if not selector.name_matchers:
        return [Finding(job, selector.text, "matches every series (no metric name): the whole curve too", error=True)]
    curve = sorted(n for n in PER_POINT if selector.matches(n))
    if curve:
        message = f"would federate the per-point curve ({_listed(curve)}): keep it on the shards and the nodes"
        return [Finding(job, selector.text, message, error=True)]
    extra = sorted(n for n in KNOWN - GLOBAL_SERIES if selector.matches(n))
    if extra:
        message = f"also federates {_listed(extra)}: the fleet outlier reads only {', '.join(sorted(GLOBAL_SERIES))}"
        return [Finding(job, selector.text, message, error=False)]
    return []


def check_file(path: Path) -> tuple[list[Finding], int]:
    """The findings of a Prometheus configuration file and how many federation jobs it has; YamlFileError where it
    cannot be read."""
    config = read_document(path, what="a Prometheus configuration")
    return findings(config), len(_federation_jobs(config))


__all__ = ["Finding", "SelectorError", "YamlFileError", "check_file", "findings", "parse_selector"]
