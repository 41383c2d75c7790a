"""Load the YAML configuration, validate every key, and return the frozen settings of ``monitor.settings``.

Every problem is collected (not just the first) and names its key path and the bad value; each
key's converter comes from the Key its settings field declares.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from monitor.errors import ConfigError, Problem
from monitor.settings import (
    MAX_PORT,
    Bad,
    BenchmarkSettings,
    GuardSettings,
    HistorySettings,
    RefineSettings,
    ScheduleSettings,
    ServerSettings,
    Settings,
    TimingSettings,
    abridged,
    converter,
    show,
    yaml_key,
)
from monitor.yamlfile import YamlFileError, read_document

_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_MAX_HOST_NAME = 253


def parse_listen(value: object) -> tuple[str, int] | Bad:
    """``(host, port)`` from ``HOST:PORT``, ``[V6]:PORT`` or ``:PORT``, or what is wrong with it."""
    if not isinstance(value, str):
        return Bad(f"must be a string HOST:PORT, got {abridged(value)}")
    match = re.fullmatch(r"\[([^\]]+)\]:([0-9]{1,5})|([^:\[\]]*):([0-9]{1,5})", value.strip())
    if match is None:
        return Bad(f"must be HOST:PORT or :PORT (an IPv6 address in brackets: [ADDR]:PORT), got {abridged(value)}")
    # ":PORT" is every interface, as Prometheus exporters read --web.listen-address.
    host = match.group(1) or match.group(3) or ServerSettings.host
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
            self.add(path, f"must be a mapping, got {show(value)}")
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
        convert: Callable[[Any], T | Bad],
    ) -> T:
        """The converted value, or the default after recording why ``convert`` rejected it."""
        if key not in data or data[key] is None:
            return default
        result = convert(data[key])
        if isinstance(result, Bad):
            for index, message in result.items or ((None, result.message),):
                self.add(path if index is None else f"{path}[{index}]", message)
            return default
        return result


# Keys of earlier releases: say what replaced them rather than "unknown key".
_REMOVED = {
    "benchmark.refine.tolerance": "no longer exists: refinement now times sizes spaced by refine.spacing (default 0.2) "
    "in refine.visits visits each (default 7) instead of bisecting to a tolerance; remove the key",
}
Adjust = Callable[["_Reader", Mapping[str, Any], dict[str, Any]], None]


def keys_of(cls: type[Any]) -> set[str]:
    """The YAML keys of a settings section."""
    return {k.name for f in dataclasses.fields(cls) if (k := yaml_key(f)) is not None}


def _read_section(
    r: _Reader, data: Mapping[str, Any], cls: Any, *, nested: tuple[Any, ...] = (), adjust: Adjust | None = None
) -> Any:
    """One section, each key by the converter its Key declares, then its rules between keys: every problem
    recorded against its key path, the default standing in for each bad value."""
    path: str = cls.SECTION
    section = r.section(data, path.rsplit(".", 1)[-1], path)
    for name in [name for name in section if f"{path}.{name}" in _REMOVED]:
        r.add(f"{path}.{name}", _REMOVED[f"{path}.{name}"])
        section = {k: v for k, v in section.items() if k != name}
    inner = {sub.SECTION.rsplit(".", 1)[-1]: sub for sub in nested}
    r.reject_unknown(section, keys_of(cls) | set(inner), path)
    values = _read_keys(r, section, cls, path)
    values.update({name: _read_section(r, section, sub) for name, sub in inner.items()})
    if adjust is not None:
        adjust(r, section, values)
    return _settled(r, cls, values, path)


def _read_keys(r: _Reader, section: Mapping[str, Any], cls: type[Any], path: str) -> dict[str, Any]:
    """Every key of ``cls`` with a converter, read from ``section`` (its default where absent, null or bad)."""
    defaults = cls()
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        k = yaml_key(f)
        if k is None or (k.kind == "special" and k.convert is None):
            continue
        if k.auto and section.get(k.name) == "auto":
            values[f.name] = None
        else:
            values[f.name] = r.get(section, k.name, f"{path}.{k.name}", getattr(defaults, f.name), converter(k))
    return values


def _settled(r: _Reader, cls: Any, values: dict[str, Any], path: str) -> Any:
    """``cls`` built from ``values`` once every rule between its keys they break is recorded, defaults standing in."""
    defaults = cls()
    conflicts = cls.conflicts(values)
    for conflict in conflicts:
        r.add(f"{path}.{conflict.key}" if conflict.key else path, conflict.message)
    for _ in values:  # a default put in may break another rule, already reported: put in its defaults too
        if not conflicts:
            break
        values.update({name: getattr(defaults, name) for c in conflicts for name in c.fields})
        conflicts = cls.conflicts(values)
    return cls(**values)


def _schedule_by_cron(r: _Reader, section: Mapping[str, Any], values: dict[str, Any]) -> None:
    """A cron line the scheduler can use replaces the default interval (a given interval stays: not both)."""
    cron = values["cron"]
    if cron is None:
        return
    # Imported here, not at the top: every timing worker imports this module (for the settings
    # its Plan carries) and needs no scheduler.
    from monitor.schedule import cron_problem  # noqa: PLC0415

    problem = cron_problem(cron)
    if problem is not None:
        r.add("schedule.cron", f"{problem}, got {abridged(cron)}")
        values["cron"] = None
    elif section.get("interval") is None:
        values["interval_s"] = None


def _read_server(r: _Reader, data: Mapping[str, Any]) -> ServerSettings:
    section = r.section(data, "server", "server")
    r.reject_unknown(section, {"listen"}, "server")
    if section.get("listen") is None:
        return ServerSettings()
    parsed = parse_listen(section["listen"])
    if isinstance(parsed, Bad):
        r.add("server.listen", parsed.message)
        return ServerSettings()
    return ServerSettings(host=parsed[0], port=parsed[1])


def settings_from_mapping(data: object, source: str = "<mapping>") -> Settings:
    """Validate an already-parsed document; raises ConfigError listing every problem."""
    problems: list[Problem] = []
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, [Problem("", f"the top level must be a mapping, got {show(data)}")])
    r = _Reader(problems)
    r.reject_unknown(data, {"schedule", "benchmark", "guard", "server", "history"}, "")
    settings = Settings(
        schedule=_read_section(r, data, ScheduleSettings, adjust=_schedule_by_cron),
        benchmark=_read_section(r, data, BenchmarkSettings, nested=(TimingSettings, RefineSettings)),
        guard=_read_section(r, data, GuardSettings),
        server=_read_server(r, data),
        history=_read_section(r, data, HistorySettings),
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
        data = read_document(path)
    except YamlFileError as exc:
        raise fail(str(exc)) from None
    return settings_from_mapping(data, source)


def with_listen(settings: Settings, listen: str) -> Settings:
    """The settings with ``server.listen`` replaced (the ``--web.listen-address`` flag, alias ``--listen``)."""
    parsed = parse_listen(listen)
    if isinstance(parsed, Bad):
        flag = "--web.listen-address (--listen)"
        raise ConfigError(flag, [Problem(flag, parsed.message)])
    return dataclasses.replace(settings, server=ServerSettings(host=parsed[0], port=parsed[1]))
