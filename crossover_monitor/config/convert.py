"""The converters a settings key declares: each checks a value as YAML writes it or as a field holds it, returns
the value to hold or ``Bad`` with the message to report, and carries its JSON Schema (stdlib only).

A converter is the one statement of a key's rule: the YAML reader, the types' own check of values built in code
(or decoded in the worker) and the configuration's JSON Schema all take it from here.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crossover_monitor.model import BACKENDS
from crossover_monitor.text import abridged, show

MAX_PORT = 65535
MAX_SIZE = 65536  # an n-by-n float32 operand of this n is 16 GiB
MAX_SIZES = 1000  # entries of a list: far more than any sweep can time or any machine has devices
DAY_S = 86400.0
MAX_COUNT = 4096  # threads, GPUs, processes: more than any machine has
ANY_HOST = "0.0.0.0"  # noqa: S104 - ":PORT" listens on every interface, as Prometheus exporters read it
# A third-party or test backend: an import path "package.module:attribute".
PLUGIN_BACKEND = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# Five whitespace-separated fields; what each may hold is APScheduler's to say (crossover_monitor/service/schedule.py).
CRON_PATTERN = r"^\s*\S+(\s+\S+){4}\s*$"

# The duration grammar, stated once (parse_duration reads it; the JSON Schema's pattern is built from it): a
# number as Python's float() reads it (1e3, .5, +30, 1_000), or parts like 1h30m, 250ms; spaces around.
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_UNITS = "|".join(sorted(_UNIT_SECONDS, key=len, reverse=True))  # "ms" before "m"
_PART_TEXT = rf"(\d+(?:\.\d+)?)({_UNITS})"
_DURATION_PART = re.compile(_PART_TEXT)
_NUMBER_TEXT = r"[+-]?((\d(_?\d)*)(\.(\d(_?\d)*)?)?|\.\d(_?\d)*)([eE][+-]?\d(_?\d)*)?"
DURATION_PATTERN = rf"^\s*({_NUMBER_TEXT}|({_PART_TEXT})+)\s*$"
_LISTEN = re.compile(r"\[([^\]]+)\]:([0-9]{1,5})|([^:\[\]]*):([0-9]{1,5})")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_MAX_HOST_NAME = 253


@dataclass(frozen=True)
class Bad:
    """A converter's verdict that a value is invalid, with the message to report."""

    message: str
    items: tuple[tuple[int, str], ...] = ()  # a list's wrong entries, (index, message); message is the first's


@dataclass(frozen=True)
class Converter:
    """A key's rule: ``convert`` takes the YAML or the held form and returns the held value or ``Bad``."""

    convert: Callable[[Any], Any]
    schema: Mapping[str, Any]  # what the YAML form may be, as JSON Schema
    note: str = ""  # what the schema cannot say (a duration's bounds), added to the key's description
    text_form: bool = False  # YAML may write it as text (a duration: "15m"), though the field holds a number
    bounds: tuple[float, float] | None = None  # inclusive, where the schema states them as minimum and maximum
    written: Callable[[Any], Any] = field(default=lambda held: held)  # the held value as YAML writes it

    def __call__(self, value: Any) -> Any:
        return self.convert(value)


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


def span(seconds: float) -> str:
    days = seconds / DAY_S
    return f"{days:g} day{'s' if days != 1 else ''}" if seconds >= DAY_S else f"{seconds:g}s"


def duration(*, positive: bool, minimum: float = 0.0, maximum: float = DAY_S) -> Converter:
    """Seconds, written ``30s``, ``15m``, ``1h`` or plain; ``minimum`` binds a non-zero value (0 may mean off)."""

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

    least = f"at least {span(minimum)}, " if minimum else ""
    # The text form cannot carry bounds, so the description does.
    return Converter(
        convert, {"$ref": "#/definitions/duration"}, note=f" ({least}at most {span(maximum)})", text_form=True
    )


def integer(minimum: int, maximum: int = MAX_COUNT) -> Converter:
    def convert(value: Any) -> int | Bad:
        if isinstance(value, bool) or not isinstance(value, int):
            return Bad(f"must be an integer, got {show(value)}")
        if value < minimum:
            return Bad(f"must be at least {minimum}, got {abridged(value)}")
        if value > maximum:
            return Bad(f"must be at most {maximum}, got {abridged(value)}")
        return value

    schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    return Converter(convert, schema, bounds=(minimum, maximum))


def number(low: float, high: float) -> Converter:
    def convert(value: Any) -> float | Bad:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return Bad(f"must be a number, got {show(value)}")
        if not low <= value <= high:
            return Bad(f"must be between {low:g} and {high:g}, got {value}")
        return float(value)

    return Converter(convert, {"type": "number", "minimum": low, "maximum": high}, bounds=(low, high))


def _fraction(value: Any) -> float | Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Bad(f"must be a number, got {show(value)}")
    if not 0 < value < 1:
        return Bad(f"must be between 0 and 1 (exclusive), got {value}")
    return float(value)


fraction = Converter(_fraction, {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})


def _boolean(value: Any) -> bool | Bad:
    if not isinstance(value, bool):
        return Bad(f"must be true or false, got {show(value)}")
    return value


boolean = Converter(_boolean, {"type": "boolean"})


def _matrix_size(value: Any) -> int | Bad:
    if isinstance(value, bool) or not isinstance(value, int):
        return Bad(f"must be a positive integer matrix size, got {show(value)}")
    if value <= 0:
        return Bad(f"must be a positive integer matrix size, got {value}")
    if value > MAX_SIZE:
        return Bad(f"must be at most {MAX_SIZE} (an n×n float32 operand of that n is 16 GiB), got {value}")
    return value


matrix_size = Converter(_matrix_size, {"type": "integer", "minimum": 1, "maximum": MAX_SIZE})


def choice(choices: tuple[str, ...], what: str) -> Converter:
    def convert(value: Any) -> str | Bad:
        if value in choices:
            return str(value)
        return Bad(f"unknown {what} {abridged(value)} (choose from {', '.join(choices)})")

    return Converter(convert, {"enum": list(choices)})


def _device_name(value: Any) -> str | Bad:
    if isinstance(value, str) and value.strip():
        return value
    return Bad(f"must be a device name string such as '/CPU:0' or '/GPU:0', got {show(value)}")


device_name = Converter(_device_name, {"type": "string", "minLength": 1})


def _speedup_factor(value: Any) -> float | Bad:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
        return Bad(f"must be a number greater than 1, got {show(value)}")
    return float(value)


speedup_factor = Converter(_speedup_factor, {"type": "number", "exclusiveMinimum": 1})


def _backend_name(value: Any) -> str | Bad:
    if isinstance(value, str) and (value in BACKENDS or PLUGIN_BACKEND.fullmatch(value) is not None):
        return value
    return Bad(
        f"unknown backend {abridged(value)} (choose from {', '.join(BACKENDS)}, "
        "or give a plugin as 'package.module:attribute')"
    )


backend_name = Converter(
    _backend_name, {"anyOf": [{"enum": list(BACKENDS)}, {"type": "string", "pattern": PLUGIN_BACKEND.pattern}]}
)


def _cron_line(value: Any) -> str | Bad:
    if not isinstance(value, str):
        return Bad(f"must be a crontab string like '*/15 * * * *', got {show(value)}")
    if re.fullmatch(CRON_PATTERN, value) is None:
        return Bad(
            "is not a valid 5-field crontab expression "
            f"(expected 5 fields (minute hour day month weekday), got {len(value.split())}), got {abridged(value)}"
        )
    return value


# A crontab line of five fields (minute hour day month weekday); what they mean is checked by the scheduler.
cron_line = Converter(_cron_line, {"type": "string", "pattern": CRON_PATTERN})


def _directory_path(value: Any) -> str | Bad:
    if isinstance(value, str) and value.strip():
        return value
    return Bad(f"must be a directory path, got {abridged(value)}")


directory_path = Converter(_directory_path, {"type": "string", "minLength": 1})


def listed(
    check: Converter,
    *,
    ascending: bool = False,
    same: Callable[[Any], Any] | None = None,
    noun: str = "",
    instead_of_text: str = "",
) -> Converter:
    """A list of entries each ``check`` accepts: not empty, at most MAX_SIZES of them, each once.

    ``same`` says which entries name one thing (two names of a ``noun``: '/GPU:0' and 'gpu:0');
    ``ascending`` returns them sorted; ``instead_of_text`` is what a string given for the list is told
    the key takes (where one string is the likely mistake). The YAML list and the tuple a value holds are
    read alike.
    """

    def convert(value: Any) -> tuple[Any, ...] | Bad:
        shape = _list_shape(value, instead_of_text)
        if shape is not None:
            return shape
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

    schema = {"type": "array", "minItems": 1, "maxItems": MAX_SIZES, "uniqueItems": True, "items": check.schema}
    return Converter(convert, schema, written=list)


def _list_shape(value: Any, instead_of_text: str) -> Bad | None:
    """What is wrong with ``value`` as a list before its entries are looked at, if anything."""
    if not isinstance(value, (list, tuple)):
        if isinstance(value, str) and instead_of_text:
            return Bad(f"must be {instead_of_text}, got {abridged(value)}")
        return Bad(f"must be a list, got {show(value)}")
    if not value:
        return Bad("must not be empty")
    if len(value) > MAX_SIZES:
        return Bad(f"must have at most {MAX_SIZES} entries, got {len(value)}")
    return None


def _listen_address(value: Any) -> tuple[str, int] | Bad:
    if isinstance(value, tuple) and len(value) == 2:  # noqa: PLR2004 - as a field holds it: (host, port)
        host, port = value
        if isinstance(host, str) and isinstance(port, int) and 1 <= port <= MAX_PORT:
            problem = _host_problem(host, bracketed=":" in host)
            return Bad(problem) if problem else (host, port)
        return Bad(f"must be a host and a port between 1 and {MAX_PORT}, got {abridged(value)}")
    if not isinstance(value, str):
        return Bad(f"must be a string HOST:PORT, got {abridged(value)}")
    match = _LISTEN.fullmatch(value.strip())
    if match is None:
        return Bad(f"must be HOST:PORT or :PORT (an IPv6 address in brackets: [ADDR]:PORT), got {abridged(value)}")
    host = match.group(1) or match.group(3) or ANY_HOST
    port = int(match.group(2) or match.group(4))
    if not 1 <= port <= MAX_PORT:
        return Bad(f"port must be between 1 and {MAX_PORT}, got {port} in {abridged(value)}")
    problem = _host_problem(host, bracketed=match.group(1) is not None)
    return Bad(f"{problem} in {abridged(value)}") if problem else (host, port)


def _host_problem(host: str, *, bracketed: bool) -> str | None:
    if bracketed:  # brackets hold an IPv6 address and nothing else
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"only an IPv6 address goes in brackets, got {abridged(host)}"
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _is_host_name(host):
            return f"{abridged(host)} is neither an IP address nor a valid host name"
    return None


def _is_host_name(host: str) -> bool:
    """RFC 1123 host name, label by label (one regular expression over the whole name backtracks exponentially)."""
    labels = host.removesuffix(".").split(".")
    return len(host) <= _MAX_HOST_NAME and all(_HOST_LABEL.fullmatch(label) for label in labels)


def listen_text(address: tuple[str, int]) -> str:
    """``HOST:PORT``, an IPv6 address in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# (host, port) from HOST:PORT, [V6]:PORT or :PORT (every interface, as Prometheus exporters read --web.listen-address).
listen_address = Converter(
    _listen_address,
    {"type": "string", "pattern": r"^\s*(\[[^\]]+\]|[^:\[\]]*):[0-9]{1,5}\s*$"},
    written=listen_text,
)
