"""The settings: frozen types whose fields declare their YAML key, kind and bounds (stdlib only).

The constraints hold however a value is built (from YAML, from the worker's JSON, in a test):
each type checks its fields against their ``Key`` when it is created. ``monitor/config.py`` reads
YAML into these types and ``monitor/schema.py`` describes them as a JSON Schema.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from monitor.model import BACKENDS, DTYPES, MODES, Mode, canonical_device

DEFAULT_PORT = 9437
MAX_PORT = 65535
MAX_SIZE = 65536  # an n-by-n float32 operand of this n is 16 GiB
MAX_SIZES = 1000  # configured sizes: far more than any sweep can time
DAY_S = 86400.0
MAX_COUNT = 4096  # threads, GPUs, processes: more than any machine has
SHOWN_CHARS = 60  # a value in a message is abridged to this many characters
# A third-party or test backend: an import path "package.module:attribute".
PLUGIN_BACKEND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Bad:
    """A converter's verdict that a value is invalid, with the message to report."""

    message: str
    items: tuple[tuple[int, str], ...] = ()  # a list's wrong entries, (index, message); message is the first's


class Conflict(NamedTuple):
    """A rule between keys of one section that the values break."""

    key: str  # the YAML key to name; "" names the section
    message: str
    fields: tuple[str, ...]  # the fields whose defaults stand in while the problem is reported


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


def abridged(value: object) -> str:
    """repr(value), cut to a few dozen characters: a message never carries a whole (maybe huge) value."""
    return brief(repr(value))


def brief(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def show(value: object) -> str:
    kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}
    kind = kinds.get(type(value), type(value).__name__)
    return f"{kind} {abridged(value)}"


def duration(*, positive: bool, minimum: float = 0.0, maximum: float = DAY_S) -> Callable[[Any], float | Bad]:
    def convert(value: Any) -> float | Bad:
        seconds = parse_duration(value)
        if seconds is None or not math.isfinite(seconds):
            return Bad(f"must be a duration like 30s, 15m, 1h or plain seconds, got {show(value)}")
        if positive and seconds <= 0:
            return Bad(f"must be greater than zero, got {abridged(value)}")
        if seconds < 0:
            return Bad(f"must not be negative, got {abridged(value)}")
        if seconds and seconds < minimum:
            return Bad(f"must be at least {minimum:g}s, got {abridged(value)}")
        if seconds > maximum:
            return Bad(f"must be at most {span(maximum)}, got {abridged(value)}")
        return seconds

    return convert


def span(seconds: float) -> str:
    days = seconds / DAY_S
    return f"{days:g} day{'s' if days != 1 else ''}" if seconds >= DAY_S else f"{seconds:g}s"


def integer(minimum: int, maximum: int = MAX_COUNT) -> Callable[[Any], int | Bad]:
    def convert(value: Any) -> int | Bad:
        if isinstance(value, bool) or not isinstance(value, int):
            return Bad(f"must be an integer, got {show(value)}")
        if value < minimum:
            return Bad(f"must be at least {minimum}, got {abridged(value)}")
        if value > maximum:
            return Bad(f"must be at most {maximum}, got {abridged(value)}")
        return value

    return convert


def fraction(value: Any) -> float | Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Bad(f"must be a number, got {show(value)}")
    if not 0 < value < 1:
        return Bad(f"must be between 0 and 1 (exclusive), got {value}")
    return float(value)


def boolean(value: Any) -> bool | Bad:
    if not isinstance(value, bool):
        return Bad(f"must be true or false, got {show(value)}")
    return value


def converter(k: Key) -> Callable[[Any], Any]:
    """The converter a key's kind and bounds call for, or the one a special key declares."""
    if k.convert is not None:
        return k.convert
    low = k.minimum if k.minimum is not None else 0
    if k.kind == "integer":
        return integer(int(low), int(k.maximum) if k.maximum is not None else MAX_COUNT)
    if k.kind in ("duration", "positive_duration"):
        top = k.maximum if k.maximum is not None else DAY_S
        return duration(positive=k.kind == "positive_duration", minimum=low, maximum=top)
    if k.kind == "number":
        return number(low, k.maximum if k.maximum is not None else math.inf)
    if k.kind == "fraction":
        return fraction
    if k.kind == "boolean":
        return boolean
    raise ValueError(f"key {k.name!r} is read by hand")


def number(low: float, high: float) -> Callable[[Any], float | Bad]:
    def convert(value: Any) -> float | Bad:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return Bad(f"must be a number, got {show(value)}")
        if not low <= value <= high:
            return Bad(f"must be between {low:g} and {high:g}, got {value}")
        return float(value)

    return convert


def matrix_size(value: Any) -> int | Bad:
    if isinstance(value, bool) or not isinstance(value, int):
        return Bad(f"must be a positive integer matrix size, got {show(value)}")
    if value <= 0:
        return Bad(f"must be a positive integer matrix size, got {value}")
    if value > MAX_SIZE:
        return Bad(f"must be at most {MAX_SIZE} (an n×n float32 operand of that n is 16 GiB), got {value}")
    return value


def choice(choices: tuple[str, ...], what: str) -> Callable[[Any], str | Bad]:
    def convert(value: Any) -> str | Bad:
        if value in choices:
            return str(value)
        return Bad(f"unknown {what} {abridged(value)} (choose from {', '.join(choices)})")

    return convert


def device_name(value: Any) -> str | Bad:
    if isinstance(value, str) and value.strip():
        return value
    return Bad(f"must be a device name string such as '/CPU:0' or '/GPU:0', got {show(value)}")


def speedup_factor(value: Any) -> float | Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
        return Bad(f"must be a number greater than 1, got {show(value)}")
    return float(value)


def backend_name(value: Any) -> str | Bad:
    if isinstance(value, str) and (value in BACKENDS or PLUGIN_BACKEND.fullmatch(value) is not None):
        return value
    return Bad(
        f"unknown backend {abridged(value)} (choose from {', '.join(BACKENDS)}, "
        "or give a plugin as 'package.module:attribute')"
    )


def listed(
    check: Callable[[Any], Any],
    *,
    ascending: bool = False,
    same: Callable[[Any], Any] | None = None,
    noun: str = "",
    shape: str = "a list",
) -> Callable[[Any], Any]:
    """A list of entries each ``check`` accepts: not empty, at most MAX_SIZES of them, each once.

    ``same`` says which entries name one thing (two names of a ``noun``: '/GPU:0' and 'gpu:0');
    ``ascending`` returns them sorted; ``shape`` is what a value that is no list is told to be.
    The YAML list and the tuple a value holds are read alike.
    """

    def convert(value: Any) -> tuple[Any, ...] | Bad:
        if not isinstance(value, (list, tuple)):
            return Bad(f"must be {shape}, got {show(value)}")
        if not value:
            return Bad("must not be empty")
        if len(value) > MAX_SIZES:
            return Bad(f"must have at most {MAX_SIZES} entries, got {len(value)}")
        entries: list[Any] = []
        problems: list[tuple[int, str]] = []
        first: dict[Any, Any] = {}  # a dict: a list's `in` made 65,536 sizes take 21 s
        for index, item in enumerate(value):
            entry = check(item)
            if isinstance(entry, Bad):
                problems.append((index, entry.message))
                continue
            identity = same(entry) if same else entry
            if identity not in first:
                first[identity] = entry
                entries.append(entry)
            elif first[identity] == entry:
                problems.append((index, f"duplicate value {abridged(item)}"))
            else:
                problems.append((index, f"{abridged(item)} is the same {noun} as {abridged(first[identity])}"))
        if problems:
            return Bad(problems[0][1], items=tuple(problems))
        return tuple(sorted(entries)) if ascending else tuple(entries)

    return convert


# Five whitespace-separated fields; what each may hold is APScheduler's to say (monitor/schedule.py).
CRON_PATTERN = r"^\s*\S+(\s+\S+){4}\s*$"


def cron_line(value: Any) -> str | Bad:
    """A crontab line of five fields (minute hour day month weekday); what they mean is checked by the scheduler."""
    if not isinstance(value, str):
        return Bad(f"must be a crontab string like '*/15 * * * *', got {show(value)}")
    if re.fullmatch(CRON_PATTERN, value) is None:
        return Bad(
            f"is not a valid 5-field crontab expression (minute hour day month weekday, got {len(value.split())}), "
            f"got {abridged(value)}"
        )
    return value


def directory_path(value: Any) -> str | Bad:
    if isinstance(value, str) and value.strip():
        return value
    return Bad(f"must be a directory path, got {abridged(value)}")


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
    auto: bool = False  # the field holds None for the YAML value "auto"
    nullable: bool = False  # None is a value the field may hold (off, or another key in use); auto implies it
    convert: Callable[[Any], Any] | None = None  # a special key's converter (without one it is read by hand)


def key(name: str, kind: KeyKind, help_text: str, **bounds: Any) -> dict[str, Key]:
    return {"yaml": Key(name, kind, help_text, **bounds)}


def yaml_key(f: dataclasses.Field[Any]) -> Key | None:
    found = f.metadata.get("yaml")
    return found if isinstance(found, Key) else None


def _check(instance: Any) -> None:
    """Every field against its Key, then the section's rules between keys; a ValueError naming the key
    for the first that does not hold (the same converters and rules as the YAML reader's, so the same words)."""
    values = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}
    for f in dataclasses.fields(instance):
        k = yaml_key(f)
        value = values[f.name]
        if k is None or (k.kind == "special" and k.convert is None) or (value is None and (k.nullable or k.auto)):
            continue
        if k.kind not in ("boolean", "special") and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TypeError(f"{k.name}: must be a number (seconds for a duration), got {abridged(value)}")
        verdict = converter(k)(value)
        if isinstance(verdict, Bad):
            where = f"{k.name}[{verdict.items[0][0]}]" if verdict.items else k.name
            raise ValueError(f"{where}: {verdict.message}")  # noqa: TRY004 - a broken rule: the codec names the field
        if isinstance(value, tuple) and verdict != value:  # only an ascending list changes a tuple
            raise ValueError(f"{k.name}: must be in ascending order")
    for conflict in type(instance).conflicts(values):
        raise ValueError(f"{conflict.key or type(instance).SECTION}: {conflict.message}")


class _Section:
    """What every settings section has: its place in the file and its rules between keys."""

    SECTION: ClassVar[str]

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:  # noqa: ARG004 - most sections have none
        """The rules between keys that ``values`` (field name to value, each valid alone) break."""
        return []

    def __post_init__(self) -> None:
        _check(self)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, kw_only=True)
class ScheduleSettings(_Section):
    SECTION: ClassVar[str] = "schedule"

    interval_s: float | None = field(  # None: the cron line says when
        default=900.0,
        metadata=key(
            "interval",
            "positive_duration",
            "time between sweeps (or use cron, not both)",
            minimum=1,
            maximum=366 * DAY_S,
            nullable=True,
        ),
    )
    cron: str | None = field(
        default=None,
        metadata=key(
            "cron",
            "special",
            "5-field crontab in UTC; weekday 0 and 7 are Sunday; restrict day of month or weekday, not both",
            schema={"type": "string", "pattern": CRON_PATTERN},
            convert=cron_line,
            nullable=True,
        ),
    )
    jitter_s: float = field(
        default=0.0,
        metadata=key(
            "jitter", "duration", "random delay up to this, to spread a fleet's sweeps; shorter than the interval"
        ),
    )

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:
        interval, cron, jitter = values["interval_s"], values["cron"], values["jitter_s"]
        found = []
        if interval is not None and cron is not None:
            found.append(Conflict("", "set either interval or cron, not both", ("interval_s", "cron")))
        if interval is None and cron is None:
            found.append(Conflict("", "set an interval or a cron", ("interval_s",)))
        if interval is not None and jitter >= interval:
            message = f"must be shorter than the interval ({interval:g}s), got {jitter:g}s"
            found.append(Conflict("jitter", message, ("jitter_s",)))
        return found


@dataclass(frozen=True, kw_only=True)
class TimingSettings(_Section):
    """How hard the timing loop tries for each point."""

    SECTION: ClassVar[str] = "benchmark.timing"

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

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:
        least, most = values["min_blocks"], values["max_blocks"]
        if most >= least:
            return []
        return [
            Conflict("max_blocks", f"must be at least min_blocks ({least}), got {most}", ("max_blocks", "min_blocks"))
        ]


@dataclass(frozen=True, kw_only=True)
class RefineSettings(_Section):
    """Sizes added around each crossover, each timed in several visits: where n* lies, and how well it is known."""

    SECTION: ClassVar[str] = "benchmark.refine"

    enabled: bool = field(
        default=True, metadata=key("enabled", "boolean", "time sizes around each crossover in several visits")
    )
    visits: int = field(
        default=7,
        metadata=key(
            "visits",
            "integer",
            "visits of each size around a crossover, round-robin; n* and its interval come from their medians",
            minimum=2,
            maximum=50,
        ),
    )
    spacing: float = field(
        default=0.2,
        metadata=key(
            "spacing", "fraction", "sizes added between the configured sizes around n* are this far apart at most"
        ),
    )
    budget_s: float = field(
        default=60.0, metadata=key("budget", "positive_duration", "at most this much extra time per sweep")
    )


_LISTED = {"type": "array", "minItems": 1, "uniqueItems": True}


@dataclass(frozen=True, kw_only=True)
class BenchmarkSettings(_Section):
    SECTION: ClassVar[str] = "benchmark"

    backend: str = field(
        default="tensorflow",
        metadata=key(
            "backend",
            "special",
            "tensorflow, torch, jax, or a plugin 'package.module:attribute'",
            schema={"anyOf": [{"enum": list(BACKENDS)}, {"type": "string", "pattern": PLUGIN_BACKEND.pattern}]},
            convert=backend_name,
        ),
    )
    devices: tuple[str, ...] | None = field(  # None: "auto", the CPU and every visible GPU
        default=None,
        metadata=key(
            "devices",
            "special",
            "auto = the CPU and every visible GPU; or a list of framework device names",
            schema={"anyOf": [{"const": "auto"}, {**_LISTED, "items": {"type": "string", "minLength": 1}}]},
            auto=True,
            convert=listed(device_name, same=canonical_device, noun="device", shape="'auto' or a list of device names"),
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
            convert=listed(matrix_size, ascending=True),
        ),
    )
    dtypes: tuple[str, ...] = field(
        default=("float32",),
        metadata=key(
            "dtypes",
            "special",
            "element types",
            schema={**_LISTED, "items": {"enum": list(DTYPES)}},
            convert=listed(choice(DTYPES, "dtype")),
        ),
    )
    modes: tuple[Mode, ...] = field(
        default=("compute", "end_to_end"),
        metadata=key(
            "modes",
            "special",
            "compute: operands on the device; end_to_end: copied in and out every call",
            schema={**_LISTED, "items": {"enum": list(MODES)}},
            convert=listed(choice(MODES, "mode")),
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
            auto=True,
            convert=integer(1),
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
            convert=speedup_factor,
            nullable=True,
        ),
    )
    # GPUs this machine must have: fewer found is a failure (driver gone), not a quiet CPU-only sweep.
    expect_gpus: int = field(default=0, metadata=key("expect_gpus", "integer", "GPUs the machine must have", minimum=0))


@dataclass(frozen=True, kw_only=True)
class GuardSettings(_Section):
    """The interference guard: what counts as another program using a GPU or the CPU's cores."""

    SECTION: ClassVar[str] = "guard"

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
    # A GPU point whose host side waited for a CPU longer than this share of it is disturbed (its time includes it).
    gpu_max_host_wait: float = field(
        default=0.05,
        metadata=key(
            "gpu_max_host_wait",
            "number",
            "a GPU point whose timing thread waited for a CPU more than this share of it is disturbed (1: never)",
            minimum=0,
            maximum=1,
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

    def __post_init__(self) -> None:
        _require(bool(self.host) and 1 <= self.port <= MAX_PORT, f"listen: port 1 to {MAX_PORT} and a host")

    @property
    def listen(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


# systemd's StateDirectory= sets this; where it is set and history.directory is not, the history lives there.
STATE_DIRECTORY_ENV = "STATE_DIRECTORY"


@dataclass(frozen=True, kw_only=True)
class HistorySettings(_Section):
    """The run history: every sweep in SQLite, and the served results read back after a restart."""

    SECTION: ClassVar[str] = "history"

    directory: str | None = field(
        default=None,
        metadata=key(
            "directory",
            "special",
            f"where the history lives; null: ${STATE_DIRECTORY_ENV} (systemd's StateDirectory=), else no history",
            schema={"type": "string", "minLength": 1},
            convert=directory_path,
            nullable=True,
        ),
    )
    keep_runs: int = field(
        default=10000,
        metadata=key("keep_runs", "integer", "runs kept; older ones are deleted", minimum=1, maximum=10_000_000),
    )

    def resolved_directory(self, environ: Mapping[str, str]) -> str | None:
        """The directory in use: the configured one, else systemd's state directory, else none."""
        if self.directory is not None:
            return self.directory
        # StateDirectory= may list several, separated by colons; the first is this service's.
        return (environ.get(STATE_DIRECTORY_ENV) or "").split(":")[0] or None


@dataclass(frozen=True, kw_only=True)
class Settings:
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    benchmark: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    source: str = "<defaults>"
