"""Load the YAML configuration, validate every key, and return the frozen settings (``config.settings``).

Every problem is collected (not just the first) and names its key path and the bad value; each
key's converter comes from the Key its settings field declares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from crossover_monitor.config.convert import Bad, listen_address
from crossover_monitor.config.settings import (
    REPLACED_KEYS,
    ScheduleSettings,
    Section,
    ServerSettings,
    Settings,
    sections,
    yaml_key,
)
from crossover_monitor.config.yamlfile import YamlFileError, read_document
from crossover_monitor.errors import ConfigError, Problem
from crossover_monitor.memory import MemoryLimit, matrices_bytes, refusal, size_text
from crossover_monitor.text import abridged, show

T = TypeVar("T")


class _Reader:
    """Reads one mapping, recording problems against key paths instead of raising."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        self.replaced: list[Problem] = []  # warnings: keys of earlier releases carried to their replacements

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


def _read_section(r: _Reader, data: Mapping[str, Any], cls: type[Section]) -> Any:
    """One section, each key by the converter its Key declares, then its rules between keys: every problem
    recorded against its key path, the default standing in for each bad value."""
    path = cls.SECTION
    section = r.section(data, path.rsplit(".", 1)[-1], path)
    for name in [name for name in section if f"{path}.{name}" in _REMOVED]:
        r.add(f"{path}.{name}", _REMOVED[f"{path}.{name}"])
        section = {k: v for k, v in section.items() if k != name}
    for name in [name for name in section if f"{path}.{name}" in REPLACED_KEYS]:
        section = _carried(r, section, path, name)
    inner = sections(cls)
    r.reject_unknown(section, keys_of(cls) | set(inner), path)
    values = _read_keys(r, section, cls, path)
    values.update({name: _read_section(r, section, sub) for name, sub in inner.items()})
    adjust = _ADJUST.get(cls)
    if adjust is not None:
        adjust(r, section, values)
    return _settled(r, cls, values, path)


def _carried(r: _Reader, section: Mapping[str, Any], path: str, old: str) -> dict[str, Any]:
    """``section`` with the replaced key ``old`` carried to each key that replaced it and not set there itself."""
    new = REPLACED_KEYS[f"{path}.{old}"]
    carried = {k: v for k, v in section.items() if k != old}
    kept = [name for name in new if name in section]
    carried.update({name: section[old] for name in new if name not in section})
    names = ", ".join(f"{path}.{name}" for name in new)
    message = f"replaced by {names} (one meaning each): its value {abridged(section[old])} is used for "
    message += "each of them the file does not set" if kept else "each of them"
    message += f" (the file's own {', '.join(kept)} kept)" if kept else ""
    r.replaced.append(Problem(f"{path}.{old}", message + "; write those keys instead"))
    return carried


def _read_keys(r: _Reader, section: Mapping[str, Any], cls: type[Any], path: str) -> dict[str, Any]:
    """Every key of ``cls`` with a converter, read from ``section`` (its default where absent, null or bad)."""
    defaults = cls()
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        k = yaml_key(f)
        if k is None:
            continue
        if k.auto and section.get(k.name) == "auto":
            values[f.name] = None
        else:
            values[f.name] = r.get(section, k.name, f"{path}.{k.name}", getattr(defaults, f.name), k.convert)
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


# A line the scheduler takes, standing in for a bad one while it is reported, so that the rules between
# keys still see that a cron was given ("set either interval or cron, not both" is reported alongside).
_STAND_IN_CRON = "0 0 * * *"


def _schedule_by_cron(r: _Reader, section: Mapping[str, Any], values: dict[str, Any]) -> None:
    """A cron line the scheduler can use replaces the default interval (a given interval stays: not both)."""
    if section.get("cron") is None:
        return
    cron = values["cron"]  # None: the converter refused it and said why
    if cron is not None:
        # Imported here: only a cron line needs the scheduler (check-config and `once` load none otherwise).
        from crossover_monitor.service.schedule import cron_problem  # noqa: PLC0415

        problem = cron_problem(cron)
        if problem is not None:
            r.add("schedule.cron", f"{problem}, got {abridged(cron)}")
            cron = None
    values["cron"] = cron if cron is not None else _STAND_IN_CRON
    if section.get("interval") is None:
        values["interval_s"] = None


# What reading a section from YAML adds to its rules: the cron line's fields are APScheduler's to judge.
_ADJUST: dict[type[Section], Adjust] = {ScheduleSettings: _schedule_by_cron}


def settings_from_mapping(data: object, source: str = "<mapping>") -> Settings:
    """Validate an already-parsed document; raises ConfigError listing every problem."""
    problems: list[Problem] = []
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(source, [Problem("", f"the top level must be a mapping, got {show(data)}")])
    r = _Reader(problems)
    top = sections(Settings)
    r.reject_unknown(data, set(top), "")
    settings = Settings(
        **{name: _read_section(r, data, cls) for name, cls in top.items()}, source=source, replaced=tuple(r.replaced)
    )
    if problems:
        raise ConfigError(source, problems)
    return settings


def load_settings(path: str | Path | None, *, empty_ok: bool = True) -> Settings:
    """Settings from a YAML file, or the embedded defaults when ``path`` is None.

    ``empty_ok`` False (a reload): an empty file is refused rather than read as the defaults, since a writer
    that has not finished (or truncated it) leaves one, and the defaults would replace the running settings.
    """
    if path is None:
        return Settings()
    source = str(path)

    def fail(message: str) -> ConfigError:
        return ConfigError(source, [Problem("", message)])

    try:
        data = read_document(path)
    except YamlFileError as exc:
        raise fail(str(exc)) from None
    if data is None and not empty_ok:
        raise fail(
            "the file is empty (a writer that has not finished, or a truncated file?); to run on the embedded"
            " defaults, write {} in it"
        )
    return settings_from_mapping(data, source)


def memory_warnings(settings: Settings, limit: MemoryLimit | None) -> list[Problem]:
    """The sizes whose matrices cannot fit ``limit``, what the worker may use on this host: warnings, not errors
    (the file may be meant for a bigger host). The worker refuses those points when it plans the sweep and
    times the rest."""
    bench = settings.benchmark
    found = []
    for index, size in enumerate(bench.sizes):
        for dtype in bench.dtypes:
            refused = [
                f"{mode} on the {kind.upper()} needs at least {size_text(matrices_bytes(size, dtype, mode, kind))}"
                for kind in ("cpu", "gpu")
                for mode in bench.modes
                if refusal(size, dtype, mode, kind, limit) is not None
            ]
            if refused:
                message = (
                    f"n={size} {dtype}: its matrices cannot fit the memory the worker may use, {limit}: "
                    f"{', '.join(refused)}; the worker will refuse those points and time the rest"
                )
                found.append(Problem(f"benchmark.sizes[{index}]", message))
    return found


def with_listen(settings: Settings, listen: str) -> Settings:
    """The settings with ``server.listen`` replaced (the ``--web.listen-address`` flag, alias ``--listen``)."""
    parsed = listen_address(listen)
    if isinstance(parsed, Bad):
        flag = "--web.listen-address (--listen)"
        raise ConfigError(flag, [Problem(flag, parsed.message)])
    return dataclasses.replace(settings, server=ServerSettings(address=parsed))
