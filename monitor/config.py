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
from monitor.model import DTYPES, MODES, canonical_device
from monitor.settings import (
    MAX_PORT,
    MAX_SIZES,
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
    backend_name,
    choice,
    converter,
    device_name,
    integer,
    interval_converter,
    matrix_size,
    show,
    speedup_factor,
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
            self.add(path, result.message)
            return default
        return result


def _read_keys(r: _Reader, section: Mapping[str, Any], cls: type[Any], path: str) -> dict[str, Any]:
    """Every field of ``cls`` that its Key describes fully, read from ``section`` (its default where absent or bad)."""
    defaults = cls()
    return {
        f.name: r.get(section, k.name, f"{path}.{k.name}", getattr(defaults, f.name), converter(k))
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
    interval = r.get(section, "interval", "schedule.interval", None, interval_converter())
    cron = section.get("cron")
    if cron is not None:
        # Imported here, not at the top: every timing worker imports this module (for the settings
        # its Plan carries) and needs no scheduler.
        from monitor.schedule import cron_problem  # noqa: PLC0415

        if not isinstance(cron, str):
            r.add("schedule.cron", f"must be a crontab string like '*/15 * * * *', got {show(cron)}")
            cron = None
        elif (problem := cron_problem(cron)) is not None:
            r.add("schedule.cron", f"{problem}, got {abridged(cron)}")
            cron = None
    if section.get("interval") is not None and section.get("cron") is not None:
        r.add("schedule", "set either interval or cron, not both")
    jitter = _read_keys(r, section, ScheduleSettings, "schedule")["jitter_s"]
    if cron is None and interval is None:
        interval = ScheduleSettings().interval_s
    if interval is not None and jitter >= interval:
        r.add(
            "schedule.jitter", f"must be shorter than the interval ({interval:g}s), got {abridged(section['jitter'])}"
        )
        jitter = 0.0
    return ScheduleSettings(interval_s=None if cron else interval, cron=cron, jitter_s=jitter)


def _read_list(
    r: _Reader, section: Mapping[str, Any], key: str, default: tuple[T, ...], check: Callable[[Any], T | Bad]
) -> tuple[T, ...]:
    path = f"benchmark.{key}"
    value = section.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        r.add(path, f"must be a list, got {show(value)}")
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
        if isinstance(result, Bad):
            r.add(f"{path}[{index}]", result.message)
        elif result in seen:  # a set: a list's `in` made 65,536 sizes take 21 s
            r.add(f"{path}[{index}]", f"duplicate value {abridged(item)}")
        else:
            seen.add(result)
            items.append(result)
    return tuple(items) if len(items) == len(value) else default


def _read_timing(r: _Reader, bench: Mapping[str, Any]) -> TimingSettings:
    section = r.section(bench, "timing", "benchmark.timing")
    r.reject_unknown(section, keys_of(TimingSettings), "benchmark.timing")
    values = _read_keys(r, section, TimingSettings, "benchmark.timing")
    if values["max_blocks"] < values["min_blocks"]:
        r.add(
            "benchmark.timing.max_blocks",
            f"must be at least min_blocks ({values['min_blocks']}), got {values['max_blocks']}",
        )
        del values["max_blocks"], values["min_blocks"]  # the defaults stand in while the problem is reported
    return TimingSettings(**values)


def _read_refine(r: _Reader, bench: Mapping[str, Any]) -> RefineSettings:
    section = r.section(bench, "refine", "benchmark.refine")
    if "tolerance" in section:  # a key of earlier releases: say what replaced it rather than "unknown key"
        r.add(
            "benchmark.refine.tolerance",
            "no longer exists: refinement now times sizes spaced by refine.spacing (default 0.2) in "
            "refine.visits visits each (default 7) instead of bisecting to a tolerance; remove the key",
        )
        section = {k: v for k, v in section.items() if k != "tolerance"}
    r.reject_unknown(section, keys_of(RefineSettings), "benchmark.refine")
    return RefineSettings(**_read_keys(r, section, RefineSettings, "benchmark.refine"))


def _read_benchmark(r: _Reader, data: Mapping[str, Any]) -> BenchmarkSettings:
    bench = r.section(data, "benchmark", "benchmark")
    r.reject_unknown(bench, keys_of(BenchmarkSettings) | {"timing", "refine"}, "benchmark")
    d = BenchmarkSettings()

    backend = r.get(bench, "backend", "benchmark.backend", d.backend, backend_name)

    devices: tuple[str, ...] | None = None
    raw_devices = bench.get("devices", "auto")
    if raw_devices != "auto" and raw_devices is not None:
        if isinstance(raw_devices, str):
            r.add("benchmark.devices", f"must be 'auto' or a list of device names, got {abridged(raw_devices)}")
        else:
            devices = _read_list(r, bench, "devices", (), device_name) or None
            seen: dict[str, str] = {}
            for index, name in enumerate(devices or ()):
                if canonical_device(name) in seen:
                    r.add(
                        f"benchmark.devices[{index}]",
                        f"{abridged(name)} is the same device as {abridged(seen[canonical_device(name)])}",
                    )
                seen.setdefault(canonical_device(name), name)
            if devices is not None and len(seen) < len(devices):
                devices = None  # the default stands in while the problem is reported

    cpu_threads: int | None = None
    if bench.get("cpu_threads", "auto") not in ("auto", None):
        cpu_threads = r.get(bench, "cpu_threads", "benchmark.cpu_threads", None, integer(1))

    return BenchmarkSettings(
        backend=backend,
        devices=devices,
        sizes=tuple(sorted(_read_list(r, bench, "sizes", d.sizes, matrix_size))),
        dtypes=_read_list(r, bench, "dtypes", d.dtypes, choice(DTYPES, "dtype")),
        modes=_read_list(r, bench, "modes", d.modes, choice(MODES, "mode")),  # type: ignore[arg-type]
        cpu_threads=cpu_threads,
        timing=_read_timing(r, bench),
        refine=_read_refine(r, bench),
        **_read_keys(r, bench, BenchmarkSettings, "benchmark"),  # timeout, tf32, expect_gpus
        skip_cpu_above_speedup=r.get(
            bench, "skip_cpu_above_speedup", "benchmark.skip_cpu_above_speedup", None, speedup_factor
        ),
    )


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
    if isinstance(parsed, Bad):
        r.add("server.listen", parsed.message)
        return ServerSettings()
    return ServerSettings(host=parsed[0], port=parsed[1])


def _read_history(r: _Reader, data: Mapping[str, Any]) -> HistorySettings:
    section = r.section(data, "history", "history")
    r.reject_unknown(section, keys_of(HistorySettings), "history")
    directory = r.get(section, "directory", "history.directory", None, _directory)
    return HistorySettings(directory=directory, **_read_keys(r, section, HistorySettings, "history"))


def _directory(value: Any) -> str | Bad:
    if isinstance(value, str) and value.strip():
        return value
    return Bad(f"must be a directory path, got {abridged(value)}")


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
        schedule=_read_schedule(r, data),
        benchmark=_read_benchmark(r, data),
        guard=_read_guard(r, data),
        server=_read_server(r, data),
        history=_read_history(r, data),
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
