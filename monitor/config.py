"""Load the YAML configuration, validate every key, and return frozen settings.

Every problem is collected (not just the first) and names its key path and the bad value.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from monitor.errors import ConfigError, Problem
from monitor.model import BACKENDS, DTYPES, MODES, Mode, canonical_device

DEFAULT_PORT = 9437
MAX_PORT = 65535
MAX_SIZE = 65536  # an n-by-n float32 operand of this n is 16 GiB
MAX_SIZES = 1000  # configured sizes: far more than any sweep can time
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few kilobytes; /dev/zero is not one
MAX_NESTING = 20  # the schema nests three levels; anything deeper is a mistake (or an attack)
DAY_S = 86400.0
MAX_COUNT = 4096  # threads, GPUs, processes: more than any machine has
# A third-party or test backend: an import path "package.module:attribute".
PLUGIN_BACKEND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_MAX_HOST_NAME = 253
_SHOWN_CHARS = 60  # a value in a message is abridged to this many characters


KeyKind = Literal["integer", "number", "fraction", "duration", "positive_duration", "boolean", "special"]


@dataclass(frozen=True)
class Key:
    """How a settings field is written in the YAML file: its key, kind, bounds and meaning.

    Declared once on the field (``metadata``); the reader takes its converter from it and
    ``monitor/schema.py`` its JSON Schema, so the two cannot drift apart. A ``special`` key is read
    by hand and carries its own schema.
    """

    name: str
    kind: KeyKind
    help: str
    minimum: float | None = None  # durations: a non-zero value must be at least this (0 may still mean "off")
    maximum: float | None = None
    schema: Mapping[str, Any] | None = None  # for special keys


def key(name: str, kind: KeyKind, help_text: str, **bounds: Any) -> dict[str, Key]:
    return {"yaml": Key(name, kind, help_text, **bounds)}


def yaml_key(f: dataclasses.Field[Any]) -> Key | None:
    found = f.metadata.get("yaml")
    return found if isinstance(found, Key) else None


@dataclass(frozen=True, kw_only=True)
class ScheduleSettings:
    interval_s: float | None = field(
        default=900.0,
        metadata=key(
            "interval",
            "special",
            "time between sweeps (or use cron, not both)",
            minimum=1,
            maximum=366 * DAY_S,
            schema={"$ref": "#/definitions/duration"},
        ),
    )
    cron: str | None = field(
        default=None,
        metadata=key(
            "cron",
            "special",
            "5-field crontab in UTC; weekday 0 and 7 are Sunday; restrict day of month or weekday, not both",
            schema={"type": "string", "pattern": r"^\S+(\s+\S+){4}$"},
        ),
    )
    jitter_s: float = field(
        default=0.0,
        metadata=key(
            "jitter", "duration", "random delay up to this, to spread a fleet's sweeps; shorter than the interval"
        ),
    )


@dataclass(frozen=True, kw_only=True)
class TimingSettings:
    """How hard the timing loop tries for each point."""

    # At least one: it also waits out operand creation, which the GPU does asynchronously.
    warmup_calls: int = field(
        default=2, metadata=key("warmup_calls", "integer", "untimed calls per point before calibration", minimum=1)
    )
    block_s: float = field(
        default=0.02, metadata=key("block_time", "positive_duration", "a timed block lasts at least this")
    )
    min_blocks: int = field(
        default=5, metadata=key("min_blocks", "integer", "timed blocks per point, at least", minimum=3)
    )
    max_blocks: int = field(
        default=50, metadata=key("max_blocks", "integer", "timed blocks per point, at most", minimum=3)
    )
    target_spread: float = field(
        default=0.05,
        metadata=key("target_spread", "fraction", "stop once IQR/median is at most this; above it a point is noisy"),
    )
    size_budget_s: float = field(
        default=5.0, metadata=key("size_budget", "positive_duration", "stop repeating a point after this long")
    )


@dataclass(frozen=True, kw_only=True)
class RefineSettings:
    """Bisection between the sizes bracketing a crossover, after the configured sizes."""

    enabled: bool = field(default=True, metadata=key("enabled", "boolean", "bisect between the sizes around n*"))
    tolerance: float = field(
        default=0.05, metadata=key("tolerance", "fraction", "stop once upper / lower - 1 is at most this")
    )
    budget_s: float = field(
        default=60.0, metadata=key("budget", "positive_duration", "at most this much extra time per sweep")
    )


_LISTED = {"type": "array", "minItems": 1, "uniqueItems": True}


@dataclass(frozen=True, kw_only=True)
class BenchmarkSettings:
    backend: str = field(
        default="tensorflow",
        metadata=key(
            "backend",
            "special",
            "tensorflow, torch, jax, or a plugin 'package.module:attribute'",
            schema={"anyOf": [{"enum": list(BACKENDS)}, {"type": "string", "pattern": PLUGIN_BACKEND.pattern}]},
        ),
    )
    devices: tuple[str, ...] | None = field(  # None: "auto", the CPU and every visible GPU
        default=None,
        metadata=key(
            "devices",
            "special",
            "auto = the CPU and every visible GPU; or a list of framework device names",
            schema={"anyOf": [{"const": "auto"}, {**_LISTED, "items": {"type": "string", "minLength": 1}}]},
        ),
    )
    sizes: tuple[int, ...] = field(
        default=(1, 10, 100, 500, 1000, 2000, 4000),
        metadata=key(
            "sizes",
            "special",
            "n of the n×n operands",
            schema={
                **_LISTED,
                "maxItems": MAX_SIZES,
                "items": {"type": "integer", "minimum": 1, "maximum": MAX_SIZE},
            },
        ),
    )
    dtypes: tuple[str, ...] = field(
        default=("float32",),
        metadata=key("dtypes", "special", "element types", schema={**_LISTED, "items": {"enum": list(DTYPES)}}),
    )
    modes: tuple[Mode, ...] = field(
        default=("compute", "end_to_end"),
        metadata=key(
            "modes",
            "special",
            "compute: operands on the device; end_to_end: copied in and out every call",
            schema={**_LISTED, "items": {"enum": list(MODES)}},
        ),
    )
    timeout_s: float = field(default=600.0, metadata=key("timeout", "positive_duration", "deadline for a whole sweep"))
    tf32: bool = field(default=False, metadata=key("tf32", "boolean", "TensorFloat-32 for float32 matmul"))
    cpu_threads: int | None = field(  # None: "auto", from affinity and the container's CPU quota
        default=None,
        metadata=key(
            "cpu_threads",
            "special",
            "framework CPU threads; auto = the usable cores, less one from four cores on",
            schema={"anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 1, "maximum": MAX_COUNT}]},
        ),
    )
    timing: TimingSettings = field(default_factory=TimingSettings)
    refine: RefineSettings = field(default_factory=RefineSettings)
    # Stop timing the CPU at larger sizes once every GPU beat it by this factor at two sizes in a row.
    skip_cpu_above_speedup: float | None = field(
        default=None,
        metadata=key(
            "skip_cpu_above_speedup",
            "special",
            "stop timing the CPU once every GPU beat it by this factor at two sizes in a row",
            schema={"anyOf": [{"type": "null"}, {"type": "number", "exclusiveMinimum": 1}]},
        ),
    )
    # GPUs this machine must have: fewer found is a failure (driver gone), not a quiet CPU-only sweep.
    expect_gpus: int = field(default=0, metadata=key("expect_gpus", "integer", "GPUs the machine must have", minimum=0))


@dataclass(frozen=True, kw_only=True)
class GuardSettings:
    """The interference guard: what counts as another program using a GPU or the CPU's cores."""

    enabled: bool = field(default=True, metadata=key("enabled", "boolean", "the interference guard"))
    # Without NVML the guard cannot see other programs on a GPU: then the GPU is not timed.
    require_nvml: bool = field(
        default=True,
        metadata=key("require_nvml", "boolean", "without NVML, withhold GPUs instead of timing them blind"),
    )
    gpu_max_utilization_pct: float = field(  # busier than this before the worker uses it: busy
        default=10.0,
        metadata=key(
            "gpu_max_utilization", "number", "percent; busier before the worker used it is busy", minimum=0, maximum=100
        ),
    )
    gpu_max_other_processes: int = field(  # more processes of other programs on it than this: busy
        default=0,
        metadata=key("gpu_max_other_processes", "integer", "more other programs' processes than this: busy", minimum=0),
    )
    # A process that holds at most this much GPU memory and ran no kernel in the last second is a
    # stray context (a framework opens one on GPU 0 by default), not a job: it does not count.
    gpu_idle_process_max_mib: int = field(
        default=1024,
        metadata=key(
            "gpu_idle_process_max_mib", "integer", "an idle process holding at most this many MiB is ignored", minimum=0
        ),
    )
    # Other programs' load on the worker's cores, beyond the cores its threads leave free, in cores.
    cpu_max_other_cores: float = field(
        default=0.5,
        metadata=key(
            "cpu_max_other_cores",
            "number",
            "cores others may use beyond those the threads leave free",
            minimum=0,
            maximum=MAX_COUNT,
        ),
    )
    retry_interval_s: float = field(  # retry busy GPUs this often until measured or the next sweep; 0: off
        default=60.0,
        metadata=key(
            "retry_interval", "duration", "retry busy GPUs this often; 0 waits for the next sweep", minimum=10
        ),
    )


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    host: str = "0.0.0.0"  # noqa: S104 - an exporter listens on every interface by default
    port: int = DEFAULT_PORT

    @property
    def listen(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class Settings:
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    benchmark: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    source: str = "<defaults>"


@dataclass(frozen=True)
class _Bad:
    """A converter's verdict that a value is invalid, with the message to report."""

    message: str


def parse_duration(value: object) -> float | None:
    """Seconds from ``30s``, ``15m``, ``1h30m``, ``250ms`` or a plain number; None if malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def parse_listen(value: object) -> tuple[str, int] | _Bad:
    """``(host, port)`` from ``HOST:PORT`` or ``[V6]:PORT``, or what is wrong with it."""
    if not isinstance(value, str):
        return _Bad(f"must be a string HOST:PORT, got {_abridged(value)}")
    match = re.fullmatch(r"\[([^\]]+)\]:([0-9]{1,5})|([^:\[\]]+):([0-9]{1,5})", value.strip())
    if match is None:
        return _Bad(f"must be HOST:PORT (an IPv6 address in brackets: [ADDR]:PORT), got {_abridged(value)}")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if not 1 <= port <= MAX_PORT:
        return _Bad(f"port must be between 1 and {MAX_PORT}, got {port} in {_abridged(value)}")
    problem = _host_problem(host, bracketed=match.group(1) is not None)
    return _Bad(f"{problem} in {_abridged(value)}") if problem else (host, port)


def _host_problem(host: str, *, bracketed: bool) -> str | None:
    if bracketed:  # brackets hold an IPv6 address and nothing else
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"only an IPv6 address goes in brackets, got {_abridged(host)}"
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _is_host_name(host):
            return f"{_abridged(host)} is neither an IP address nor a valid host name"
    return None


def _is_host_name(host: str) -> bool:
    """RFC 1123 host name, label by label (one regular expression over the whole name backtracks exponentially)."""
    labels = host.removesuffix(".").split(".")
    return len(host) <= _MAX_HOST_NAME and all(_HOST_LABEL.fullmatch(label) for label in labels)


T = TypeVar("T")


class _Reader:
    """Reads one mapping, recording problems against key paths instead of raising."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def section(self, data: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = data.get(key, {})
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"must be a mapping, got {_show(value)}")
            return {}
        return value

    def reject_unknown(self, data: Mapping[str, Any], known: set[str], path: str) -> None:
        for key in data:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                choices = ", ".join(sorted(known))
                self.add(where, f"unknown key (known keys here: {choices})")

    def get(
        self,
        data: Mapping[str, Any],
        key: str,
        path: str,
        default: T,
        convert: Callable[[Any], T | _Bad],
    ) -> T:
        """The converted value, or the default after recording why ``convert`` rejected it."""
        if key not in data or data[key] is None:
            return default
        result = convert(data[key])
        if isinstance(result, _Bad):
            self.add(path, result.message)
            return default
        return result


def _abridged(value: object) -> str:
    """repr(value), cut to a few dozen characters: a message never carries a whole (maybe huge) value."""
    return _brief(repr(value))


def _brief(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def _show(value: object) -> str:
    kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    kind = kinds.get(type(value), type(value).__name__)
    return f"{kind} {_abridged(value)}"


def _duration(*, positive: bool, minimum: float = 0.0, maximum: float = DAY_S) -> Callable[[Any], float | _Bad]:
    def convert(value: Any) -> float | _Bad:
        seconds = parse_duration(value)
        if seconds is None or not math.isfinite(seconds):
            return _Bad(f"must be a duration like 30s, 15m, 1h or plain seconds, got {_show(value)}")
        if positive and seconds <= 0:
            return _Bad(f"must be greater than zero, got {_abridged(value)}")
        if seconds < 0:
            return _Bad(f"must not be negative, got {_abridged(value)}")
        if seconds and seconds < minimum:
            return _Bad(f"must be at least {minimum:g}s, got {_abridged(value)}")
        if seconds > maximum:
            return _Bad(f"must be at most {_span(maximum)}, got {_abridged(value)}")
        return seconds

    return convert


def _span(seconds: float) -> str:
    days = seconds / DAY_S
    return f"{days:g} day{'s' if days != 1 else ''}" if seconds >= DAY_S else f"{seconds:g}s"


def _integer(minimum: int, maximum: int = MAX_COUNT) -> Callable[[Any], int | _Bad]:
    def convert(value: Any) -> int | _Bad:
        if isinstance(value, bool) or not isinstance(value, int):
            return _Bad(f"must be an integer, got {_show(value)}")
        if value < minimum:
            return _Bad(f"must be at least {minimum}, got {_abridged(value)}")
        if value > maximum:
            return _Bad(f"must be at most {maximum}, got {_abridged(value)}")
        return value

    return convert


def _fraction(value: Any) -> float | _Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _Bad(f"must be a number, got {_show(value)}")
    if not 0 < value < 1:
        return _Bad(f"must be between 0 and 1 (exclusive), got {value}")
    return float(value)


def _boolean(value: Any) -> bool | _Bad:
    if not isinstance(value, bool):
        return _Bad(f"must be true or false, got {_show(value)}")
    return value


def _converter(k: Key) -> Callable[[Any], Any]:
    """The converter a key's kind and bounds call for (special keys are read by hand)."""
    low = k.minimum if k.minimum is not None else 0
    if k.kind == "integer":
        return _integer(int(low), int(k.maximum) if k.maximum is not None else MAX_COUNT)
    if k.kind in ("duration", "positive_duration"):
        top = k.maximum if k.maximum is not None else DAY_S
        return _duration(positive=k.kind == "positive_duration", minimum=low, maximum=top)
    if k.kind == "number":
        return _number(low, k.maximum if k.maximum is not None else math.inf)
    if k.kind == "fraction":
        return _fraction
    if k.kind == "boolean":
        return _boolean
    raise ValueError(f"key {k.name!r} is read by hand")


def _read_keys(r: _Reader, section: Mapping[str, Any], cls: type[Any], path: str) -> dict[str, Any]:
    """Every field of ``cls`` that its Key describes fully, read from ``section`` (its default where absent or bad)."""
    defaults = cls()
    return {
        f.name: r.get(section, k.name, f"{path}.{k.name}", getattr(defaults, f.name), _converter(k))
        for f in dataclasses.fields(cls)
        if (k := yaml_key(f)) is not None and k.kind != "special"
    }


def keys_of(cls: type[Any]) -> set[str]:
    """The YAML keys of a settings section."""
    return {k.name for f in dataclasses.fields(cls) if (k := yaml_key(f)) is not None}


def _read_schedule(r: _Reader, data: Mapping[str, Any]) -> ScheduleSettings:
    section = r.section(data, "schedule", "schedule")
    r.reject_unknown(section, keys_of(ScheduleSettings), "schedule")
    # At least a second (a sweep takes longer than that anyway), at most a year: see its Key.
    interval_key = yaml_key(next(f for f in dataclasses.fields(ScheduleSettings) if f.name == "interval_s"))
    assert interval_key is not None  # noqa: S101 - declared above
    bounds = _duration(positive=True, minimum=interval_key.minimum or 0, maximum=interval_key.maximum or DAY_S)
    interval = r.get(section, "interval", "schedule.interval", None, bounds)
    cron = section.get("cron")
    if cron is not None:
        # Imported here, not at the top: every timing worker imports this module (for the settings
        # its Plan carries) and needs no scheduler.
        from monitor.schedule import cron_problem  # noqa: PLC0415

        if not isinstance(cron, str):
            r.add("schedule.cron", f"must be a crontab string like '*/15 * * * *', got {_show(cron)}")
            cron = None
        elif (problem := cron_problem(cron)) is not None:
            r.add("schedule.cron", f"{problem}, got {_abridged(cron)}")
            cron = None
    if section.get("interval") is not None and section.get("cron") is not None:
        r.add("schedule", "set either interval or cron, not both")
    jitter = _read_keys(r, section, ScheduleSettings, "schedule")["jitter_s"]
    if cron is None and interval is None:
        interval = ScheduleSettings().interval_s
    if interval is not None and jitter >= interval:
        r.add(
            "schedule.jitter", f"must be shorter than the interval ({interval:g}s), got {_abridged(section['jitter'])}"
        )
    return ScheduleSettings(interval_s=None if cron else interval, cron=cron, jitter_s=jitter)


def _read_list(
    r: _Reader, section: Mapping[str, Any], key: str, default: tuple[T, ...], check: Callable[[Any], T | _Bad]
) -> tuple[T, ...]:
    path = f"benchmark.{key}"
    value = section.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        r.add(path, f"must be a list, got {_show(value)}")
        return default
    if not value:
        r.add(path, "must not be empty")
        return default
    if len(value) > MAX_SIZES:
        r.add(path, f"must have at most {MAX_SIZES} entries, got {len(value)}")
        return default
    items: list[T] = []
    seen: set[T] = set()
    for index, item in enumerate(value):
        result = check(item)
        if isinstance(result, _Bad):
            r.add(f"{path}[{index}]", result.message)
        elif result in seen:  # a set: a list's `in` made 65,536 sizes take 21 s
            r.add(f"{path}[{index}]", f"duplicate value {_abridged(item)}")
        else:
            seen.add(result)
            items.append(result)
    return tuple(items) if len(items) == len(value) else default


def _size(value: Any) -> int | _Bad:
    if isinstance(value, bool) or not isinstance(value, int):
        return _Bad(f"must be a positive integer matrix size, got {_show(value)}")
    if value <= 0:
        return _Bad(f"must be a positive integer matrix size, got {value}")
    if value > MAX_SIZE:
        return _Bad(f"must be at most {MAX_SIZE} (an n×n float32 operand of that n is 16 GiB), got {value}")
    return value


def _choice(choices: tuple[str, ...], what: str) -> Callable[[Any], str | _Bad]:
    def convert(value: Any) -> str | _Bad:
        if value in choices:
            return str(value)
        return _Bad(f"unknown {what} {_abridged(value)} (choose from {', '.join(choices)})")

    return convert


def _device(value: Any) -> str | _Bad:
    if isinstance(value, str) and value.strip():
        return value
    return _Bad(f"must be a device name string such as '/CPU:0' or '/GPU:0', got {_show(value)}")


def _read_timing(r: _Reader, bench: Mapping[str, Any]) -> TimingSettings:
    section = r.section(bench, "timing", "benchmark.timing")
    r.reject_unknown(section, keys_of(TimingSettings), "benchmark.timing")
    p = "benchmark.timing."
    timing = TimingSettings(**_read_keys(r, section, TimingSettings, "benchmark.timing"))
    if timing.max_blocks < timing.min_blocks:
        r.add(
            p + "max_blocks",
            f"must be at least min_blocks ({timing.min_blocks}), got {timing.max_blocks}",
        )
    return timing


def _speedup_factor(value: Any) -> float | _Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
        return _Bad(f"must be a number greater than 1, got {_show(value)}")
    return float(value)


def _read_refine(r: _Reader, bench: Mapping[str, Any]) -> RefineSettings:
    section = r.section(bench, "refine", "benchmark.refine")
    r.reject_unknown(section, keys_of(RefineSettings), "benchmark.refine")
    return RefineSettings(**_read_keys(r, section, RefineSettings, "benchmark.refine"))


def _read_benchmark(r: _Reader, data: Mapping[str, Any]) -> BenchmarkSettings:
    bench = r.section(data, "benchmark", "benchmark")
    r.reject_unknown(bench, keys_of(BenchmarkSettings) | {"timing", "refine"}, "benchmark")
    d = BenchmarkSettings()

    backend = bench.get("backend", d.backend)
    if not isinstance(backend, str) or (backend not in BACKENDS and PLUGIN_BACKEND.fullmatch(backend) is None):
        r.add(
            "benchmark.backend",
            f"unknown backend {_abridged(backend)} (choose from {', '.join(BACKENDS)}, "
            "or give a plugin as 'package.module:attribute')",
        )
        backend = d.backend

    devices: tuple[str, ...] | None = None
    raw_devices = bench.get("devices", "auto")
    if raw_devices != "auto" and raw_devices is not None:
        if isinstance(raw_devices, str):
            r.add("benchmark.devices", f"must be 'auto' or a list of device names, got {_abridged(raw_devices)}")
        else:
            devices = _read_list(r, bench, "devices", (), _device) or None
            seen: dict[str, str] = {}
            for index, name in enumerate(devices or ()):
                if canonical_device(name) in seen:
                    r.add(
                        f"benchmark.devices[{index}]",
                        f"{_abridged(name)} is the same device as {_abridged(seen[canonical_device(name)])}",
                    )
                seen.setdefault(canonical_device(name), name)

    cpu_threads: int | None = None
    if bench.get("cpu_threads", "auto") not in ("auto", None):
        cpu_threads = r.get(bench, "cpu_threads", "benchmark.cpu_threads", None, _integer(1))

    return BenchmarkSettings(
        backend=backend,
        devices=devices,
        sizes=tuple(sorted(_read_list(r, bench, "sizes", d.sizes, _size))),
        dtypes=_read_list(r, bench, "dtypes", d.dtypes, _choice(DTYPES, "dtype")),
        modes=_read_list(r, bench, "modes", d.modes, _choice(MODES, "mode")),  # type: ignore[arg-type]
        cpu_threads=cpu_threads,
        timing=_read_timing(r, bench),
        refine=_read_refine(r, bench),
        **_read_keys(r, bench, BenchmarkSettings, "benchmark"),  # timeout, tf32, expect_gpus
        skip_cpu_above_speedup=r.get(
            bench, "skip_cpu_above_speedup", "benchmark.skip_cpu_above_speedup", None, _speedup_factor
        ),
    )


def _number(low: float, high: float) -> Callable[[Any], float | _Bad]:
    def convert(value: Any) -> float | _Bad:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return _Bad(f"must be a number, got {_show(value)}")
        if not low <= value <= high:
            return _Bad(f"must be between {low:g} and {high:g}, got {value}")
        return float(value)

    return convert


def _read_guard(r: _Reader, data: Mapping[str, Any]) -> GuardSettings:
    section = r.section(data, "guard", "guard")
    r.reject_unknown(section, keys_of(GuardSettings), "guard")
    return GuardSettings(**_read_keys(r, section, GuardSettings, "guard"))


def _read_server(r: _Reader, data: Mapping[str, Any]) -> ServerSettings:
    section = r.section(data, "server", "server")
    r.reject_unknown(section, {"listen"}, "server")
    if section.get("listen") is None:
        return ServerSettings()
    parsed = parse_listen(section["listen"])
    if isinstance(parsed, _Bad):
        r.add("server.listen", parsed.message)
        return ServerSettings()
    return ServerSettings(host=parsed[0], port=parsed[1])


def settings_from_mapping(data: object, source: str = "<mapping>") -> Settings:
    """Validate an already-parsed document; raises ConfigError listing every problem."""
    problems: list[Problem] = []
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, [Problem("", f"the top level must be a mapping, got {_show(data)}")])
    r = _Reader(problems)
    r.reject_unknown(data, {"schedule", "benchmark", "guard", "server"}, "")
    settings = Settings(
        schedule=_read_schedule(r, data),
        benchmark=_read_benchmark(r, data),
        guard=_read_guard(r, data),
        server=_read_server(r, data),
        source=source,
    )
    if problems:
        raise ConfigError(source, problems)
    return settings


def load_settings(path: str | Path | None) -> Settings:
    """Settings from a YAML file, or the embedded defaults when ``path`` is None."""
    if path is None:
        return Settings()
    source = str(path)

    def fail(message: str) -> ConfigError:
        return ConfigError(source, [Problem("", message)])

    try:
        with Path(path).open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise fail(f"the file is larger than {MAX_CONFIG_BYTES // 1024} KiB; a configuration is a few kilobytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise fail(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} on line {line}; save the file as UTF-8") from None
    try:
        data = _load_yaml(text)
    except (ValueError, OverflowError) as exc:  # from the constructor: 2024-02-30, an int of 5000 digits
        raise fail(f"not a valid YAML value: {_brief(str(exc))}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise fail(f"not valid YAML: {where}{_brief(reason)}") from None
    except _Refused as exc:
        raise fail(str(exc)) from None
    return settings_from_mapping(data, source)


class _Refused(Exception):
    """YAML that is valid but that no configuration needs, and that could exhaust the loader."""


# libyaml's loader when PyYAML has it (a million entries: 25 s in pure Python), else PyYAML's own.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    """The document, after refusing what could exhaust time, memory or the stack before it is built.

    Aliases are refused (a few hundred bytes of nested aliases expand to gigabytes), and so is
    nesting deeper than the configuration needs (deep nesting overflows the constructor's stack).
    """
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            raise _Refused("YAML aliases (*name) are not supported in the configuration; write the value out")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                mark = event.start_mark
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise _Refused(f"nested more than {MAX_NESTING} levels deep{where}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)


def with_listen(settings: Settings, listen: str) -> Settings:
    """The settings with ``server.listen`` replaced (the ``--listen`` flag)."""
    parsed = parse_listen(listen)
    if isinstance(parsed, _Bad):
        raise ConfigError("--listen", [Problem("--listen", parsed.message)])
    return dataclasses.replace(settings, server=ServerSettings(host=parsed[0], port=parsed[1]))
