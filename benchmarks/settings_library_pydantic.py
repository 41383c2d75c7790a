# mypy: disable-error-code="import-not-found, misc, untyped-decorator"
# pydantic is not in the project's environment: there mypy sees its names as Any, and subclassing Any (misc) or
# decorating with it (untyped-decorator) is an error in strict mode. Where pydantic is installed the file passes
# `mypy --strict` without this line.
"""The configuration of ``crossover_monitor/config/settings.py`` as pydantic v2 models, for ``settings_library.py`` to measure.

Not used by the service. Every section and key of ``crossover_monitor/config/settings.py`` with the same bounds and the same
rules between keys (interval or cron, not both; jitter shorter than the interval; max_blocks at least
min_blocks; lists not empty, at most MAX_SIZES entries, each once, sizes sorted; '/GPU:0' and 'gpu:0' are one
device), written the way pydantic is usually written: bounds as ``Field`` constraints, durations and "auto" as
before-validators, rules between keys as field or model validators. Field names are those of
``crossover_monitor/config/settings.py`` (``interval_s``), the YAML keys their aliases (``interval``), so error locations are key
paths. Around the model: the service's own YAML reader (``crossover_monitor/config/yamlfile.py``, which a pydantic design would
keep) and ``key_paths``, which turns pydantic's errors into the current ``path: message`` lines (the first 50,
then how many more).

Usage: ``python benchmarks/settings_library_pydantic.py [--messages pydantic|paths] FILE`` (exit 78 on a bad
file, as ``check-config``). Needs pydantic and PyYAML; imports ``crossover_monitor.model`` for the backend, dtype and mode
names and the device-name rule, and ``crossover_monitor.config.convert.parse_duration`` for the duration syntax.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import re
import sys
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from crossover_monitor.config.convert import parse_duration
from crossover_monitor.config.yamlfile import YamlFileError, read_document
from crossover_monitor.model import BACKENDS, DTYPES, MODES, canonical_device
from crossover_monitor.text import abridged

DEFAULT_PORT = 9437
MAX_PORT = 65535
MAX_SIZE = 65536
MAX_SIZES = 1000
DAY_S = 86400.0
MAX_COUNT = 4096
SHOWN_PROBLEMS = 50  # as crossover_monitor.errors.ConfigError
EXIT_CONFIG = 78
PLUGIN_BACKEND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CRON_PATTERN = r"^\s*\S+(\s+\S+){4}\s*$"
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

Dtype = Literal["float16", "bfloat16", "float32", "float64"]
Mode = Literal["compute", "end_to_end"]
assert get_args(Dtype) == DTYPES, "crossover_monitor.model.DTYPES changed: update Dtype"
assert get_args(Mode) == MODES, "crossover_monitor.model.MODES changed: update Mode"


# --- converters the constraints cannot express -------------------------------------------------------------


def _seconds(value: object) -> object:
    seconds = parse_duration(value)
    if seconds is None or not math.isfinite(seconds):
        raise ValueError("must be a duration like 30s, 15m, 1h or plain seconds")
    return seconds


def _auto(value: object) -> object:
    return None if value == "auto" else value


def _off_or_at_least(minimum: float) -> Any:
    def check(seconds: float) -> float:
        if seconds and seconds < minimum:
            raise ValueError(f"must be 0 (off) or at least {minimum:g}s")
        return seconds

    return check


def _each_once(values: tuple[Any, ...]) -> tuple[Any, ...]:
    seen: set[Any] = set()
    for index, value in enumerate(values):
        if value in seen:
            raise ValueError(f"duplicate value {value!r} at [{index}]")
        seen.add(value)
    return values


def _ascending(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(values))


def _one_name_per_device(names: tuple[str, ...]) -> tuple[str, ...]:
    first: dict[str, str] = {}
    for index, name in enumerate(names):
        same = first.setdefault(canonical_device(name), name)
        if same != name:
            raise ValueError(f"{name!r} at [{index}] is the same device as {same!r}")
    return names


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _backend(name: str) -> str:
    if name in BACKENDS or PLUGIN_BACKEND.fullmatch(name) is not None:
        return name
    raise ValueError(
        f"unknown backend (choose from {', '.join(BACKENDS)}, or give a plugin as 'package.module:attribute')"
    )


@functools.cache
def parse_listen(value: str) -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT``, ``[V6]:PORT`` or ``:PORT``; ValueError says what is wrong."""
    match = re.fullmatch(r"\[([^\]]+)\]:([0-9]{1,5})|([^:\[\]]*):([0-9]{1,5})", value.strip())
    if match is None:
        raise ValueError("must be HOST:PORT or :PORT (an IPv6 address in brackets: [ADDR]:PORT)")
    host = match.group(1) or match.group(3) or "0.0.0.0"  # noqa: S104 - ":PORT" is every interface
    port = int(match.group(2) or match.group(4))
    if not 1 <= port <= MAX_PORT:
        raise ValueError(f"port must be between 1 and {MAX_PORT}, got {port}")
    if match.group(1) is not None:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"only an IPv6 address goes in brackets, got {host!r}") from None
        return host, port
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.removesuffix(".").split(".")
        if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):  # RFC 1123
            raise ValueError(f"{host!r} is neither an IP address nor a valid host name") from None
    return host, port


def _listen(value: str) -> str:
    parse_listen(value)
    return value


# --- the types of the keys ---------------------------------------------------------------------------------

Duration = Annotated[float, BeforeValidator(_seconds), Field(ge=0, le=DAY_S)]
PositiveDuration = Annotated[float, BeforeValidator(_seconds), Field(gt=0, le=DAY_S)]
Count = Annotated[int, Strict(), Field(le=MAX_COUNT)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(gt=0, lt=1)]
Flag = Annotated[bool, Strict()]
Text = Annotated[str, Strict()]
Listed = Field(min_length=1, max_length=MAX_SIZES)  # not empty, at most MAX_SIZES entries


class Section(BaseModel):
    """What every section shares: no unknown keys, frozen, and a null value standing for the default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return cls.prepare({k: v for k, v in data.items() if v is not None})
        return data

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The section's keys before validation (a hook for sections whose keys depend on each other)."""
        return data


class ScheduleSettings(Section):
    interval_s: Annotated[float, BeforeValidator(_seconds), Field(ge=1, le=366 * DAY_S)] | None = Field(
        default=900.0, alias="interval"
    )
    cron: Annotated[Text, Field(pattern=CRON_PATTERN)] | None = None
    jitter_s: Duration = Field(default=0.0, alias="jitter")

    @classmethod
    def prepare(cls, data: dict[str, Any]) -> dict[str, Any]:
        if "cron" in data and "interval" not in data:  # a cron line replaces the default interval
            return {**data, "interval": None}
        return data

    @field_validator("cron")
    @classmethod
    def _cron_fires(cls, cron: str | None) -> str | None:
        if cron is not None:
            from crossover_monitor.service.schedule import cron_problem  # noqa: PLC0415 - APScheduler's reading, only for a cron line

            if (problem := cron_problem(cron)) is not None:
                raise ValueError(problem)
        return cron

    @field_validator("jitter_s")
    @classmethod
    def _shorter_than_the_interval(cls, jitter: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_s")
        if interval is not None and jitter >= interval:
            raise ValueError(f"must be shorter than the interval ({interval:g}s)")
        return jitter

    @model_validator(mode="after")
    def _interval_or_cron(self) -> ScheduleSettings:
        if self.interval_s is not None and self.cron is not None:
            raise ValueError("set either interval or cron, not both")
        if self.interval_s is None and self.cron is None:
            raise ValueError("set an interval or a cron")
        return self


class TimingSettings(Section):
    warmup_calls: Annotated[Count, Field(ge=1)] = 2
    block_s: PositiveDuration = Field(default=0.02, alias="block_time")
    min_blocks: Annotated[Count, Field(ge=3)] = 5
    max_blocks: Annotated[Count, Field(ge=3)] = 50
    target_spread: Fraction = 0.05
    size_budget_s: PositiveDuration = Field(default=5.0, alias="size_budget")

    @field_validator("max_blocks")
    @classmethod
    def _at_least_min_blocks(cls, most: int, info: ValidationInfo) -> int:
        least = info.data.get("min_blocks")
        if least is not None and most < least:
            raise ValueError(f"must be at least min_blocks ({least})")
        return most


class RefineSettings(Section):
    enabled: Flag = True
    visits: Annotated[Count, Field(ge=2, le=50)] = 7
    spacing: Fraction = 0.2
    budget_s: PositiveDuration = Field(default=60.0, alias="budget")
    # A key of earlier releases: said what replaced it rather than "extra inputs are not permitted".
    tolerance: None = Field(default=None, exclude=True)

    @field_validator("tolerance", mode="before")
    @classmethod
    def _removed(cls, _value: object) -> None:
        raise ValueError(
            "no longer exists: refinement now times sizes spaced by refine.spacing (default 0.2) "
            "in refine.visits visits each (default 7) instead of bisecting to a tolerance; remove the key"
        )


class BenchmarkSettings(Section):
    backend: Annotated[Text, AfterValidator(_backend)] = "tensorflow"
    devices: (  # None: "auto", the CPU and every visible GPU
        Annotated[
            tuple[Annotated[Text, AfterValidator(_not_blank)], ...],
            Listed,
            AfterValidator(_each_once),
            AfterValidator(_one_name_per_device),
        ]
        | None
    ) = Field(default=None, validate_default=False)
    sizes: Annotated[
        tuple[Annotated[int, Strict(), Field(ge=1, le=MAX_SIZE)], ...],
        Listed,
        AfterValidator(_each_once),
        AfterValidator(_ascending),
    ] = (1, 10, 100, 500, 1000, 2000, 4000)
    dtypes: Annotated[tuple[Dtype, ...], Listed, AfterValidator(_each_once)] = ("float32",)
    modes: Annotated[tuple[Mode, ...], Listed, AfterValidator(_each_once)] = ("compute", "end_to_end")
    timeout_s: PositiveDuration = Field(default=600.0, alias="timeout")
    tf32: Flag = False
    cpu_threads: Annotated[Count, Field(ge=1)] | None = None  # None: "auto"
    timing: TimingSettings = Field(default_factory=TimingSettings)
    refine: RefineSettings = Field(default_factory=RefineSettings)
    skip_cpu_above_speedup: Annotated[Number, Field(gt=1)] | None = None
    expect_gpus: Annotated[Count, Field(ge=0)] = 0

    @field_validator("devices", "cpu_threads", mode="before")
    @classmethod
    def _auto_is_none(cls, value: object) -> object:
        return _auto(value)


class GuardSettings(Section):
    enabled: Flag = True
    require_nvml: Flag = True
    gpu_max_utilization_pct: Annotated[Number, Field(ge=0, le=100)] = Field(default=10.0, alias="gpu_max_utilization")
    gpu_max_other_processes: Annotated[Count, Field(ge=0)] = 0
    gpu_idle_process_max_mib: Annotated[Count, Field(ge=0)] = 1024
    cpu_max_other_cores: Annotated[Number, Field(ge=0, le=MAX_COUNT)] = 0.5
    gpu_max_host_wait: Annotated[Number, Field(ge=0, le=1)] = 0.05
    retry_interval_s: Annotated[Duration, AfterValidator(_off_or_at_least(10))] = Field(
        default=60.0, alias="retry_interval"
    )


class ServerSettings(Section):
    listen: Annotated[Text, AfterValidator(_listen)] = f"0.0.0.0:{DEFAULT_PORT}"

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]


class HistorySettings(Section):
    directory: Annotated[Text, AfterValidator(_not_blank)] | None = None
    keep_runs: Annotated[int, Strict(), Field(ge=1, le=10_000_000)] = 10000


class Settings(Section):
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    benchmark: BenchmarkSettings = Field(default_factory=BenchmarkSettings)
    guard: GuardSettings = Field(default_factory=GuardSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)


# --- around the model: the file, and the current messages --------------------------------------------------


def validate(data: Any) -> Settings:
    """The settings from a parsed document (None: the defaults); ValidationError lists every problem."""
    settings: Settings = Settings.model_validate({} if data is None else data)
    return settings


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The YAML keys of the section at ``loc`` (a location of pydantic's, by alias)."""
    model: type[BaseModel] = Settings
    for part in loc:
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        inner = fields[str(part)].annotation
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return []
        model = inner
    return sorted(f.alias or name for name, f in model.model_fields.items() if not f.exclude)


def key_paths(error: ValidationError) -> list[str]:
    """pydantic's errors as the current ``path: message`` lines: what it takes to keep today's messages."""
    lines = []
    for e in error.errors(include_url=False):
        loc = e["loc"]
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = f"unknown key (known keys here: {', '.join(_known_keys(loc[:-1]))})"
        elif e["type"] != "missing":
            message = f"{message}, got {abridged(e['input'])}"
        lines.append(f"{path}: {message}" if path else message)
    return lines


def main(argv: list[str]) -> int:
    """``[--messages pydantic|paths] FILE``: check-config with the model; exit 78 on a bad file."""
    style = "pydantic"
    if argv[:1] == ["--messages"]:
        style, argv = argv[1], argv[2:]
    (path,) = argv
    try:
        validate(read_document(path))
    except ValidationError as exc:
        if style == "pydantic":
            print(f"crossover-monitor: invalid configuration {path}: {exc}", file=sys.stderr)
        else:
            lines = key_paths(exc)
            shown = [f"  {line}" for line in lines[:SHOWN_PROBLEMS]]
            if len(lines) > SHOWN_PROBLEMS:
                shown.append(f"  ... and {len(lines) - SHOWN_PROBLEMS} more: fix these and check again")
            noun = "problem" if len(lines) == 1 else "problems"
            print(f"crossover-monitor: invalid configuration {path} ({len(lines)} {noun}):", file=sys.stderr)
            print("\n".join(shown), file=sys.stderr)
        return EXIT_CONFIG
    except YamlFileError as exc:
        print(f"crossover-monitor: invalid configuration {path}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{path}: configuration is valid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
