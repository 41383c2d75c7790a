"""The one YAML reader for every file the service reads (its configuration, the web config).

It refuses, with a message fit to show a user, what no such file needs and what could exhaust the
loader: a file over the size limit, text that is not UTF-8, aliases (a few hundred bytes of nested
aliases expand to gigabytes) and nesting deeper than ``MAX_NESTING`` (which would overflow the
constructor's stack: a RecursionError, not a message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from crossover_monitor.text import brief

MAX_FILE_BYTES = 1 << 20  # these files are a few kilobytes; /dev/zero is not one
MAX_NESTING = 20  # the configuration's schema nests three levels; anything deeper is a mistake (or an attack)

# libyaml's loader when PyYAML has it (a million entries: 25 s in pure Python), else PyYAML's own.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(Exception):
    """Why the file cannot be read as a YAML document: one line for the user."""


def read_document(path: str | Path, *, what: str = "a configuration") -> Any:
    """The file's YAML document (None for an empty one); YamlFileError says what is wrong with it."""
    try:
        with Path(path).open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise YamlFileError(f"cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise YamlFileError(f"the file is larger than {MAX_FILE_BYTES // 1024} KiB; {what} is a few kilobytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        byte = raw[exc.start]
        raise YamlFileError(f"not UTF-8 text: byte 0x{byte:02x} on line {line}; save the file as UTF-8") from None
    try:
        _refuse_what_could_exhaust_the_loader(text)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    except (ValueError, OverflowError) as exc:  # from the constructor: a date of February 30, an int of 5000 digits
        raise YamlFileError(f"not a valid YAML value: {brief(str(exc))}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise YamlFileError(f"not valid YAML: {where}{brief(reason)}") from None


def _refuse_what_could_exhaust_the_loader(text: str) -> None:
    """Walks the parser's events, before any object is built: aliases and deep nesting are refused."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            raise YamlFileError("YAML aliases (*name) are not supported here; write the value out")
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                mark = event.start_mark
                where = f" (line {mark.line + 1})" if mark is not None else ""
                raise YamlFileError(f"nested more than {MAX_NESTING} levels deep{where}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
