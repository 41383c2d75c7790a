"""The configuration's JSON Schema, generated from the Key each settings field declares.

Editors validate and complete ``config.yaml`` with it (yaml-language-server); ``crossover-monitor
config-schema`` prints it and ``deploy/config.schema.json`` ships it (a test keeps that file equal).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from crossover_monitor.config.convert import DURATION_PATTERN
from crossover_monitor.config.settings import REPLACED_KEYS, Key, Settings, sections, yaml_key

SCHEMA_ID = "https://github.com/crossover-monitor/crossover-monitor/deploy/config.schema.json"


def _property(k: Key, default: Any) -> dict[str, Any]:
    """The schema of one key: what its converter accepts, "auto" where the key takes it, and null."""
    body = dict(k.convert.schema)
    if k.auto:
        body = {"anyOf": [{"const": "auto"}, body]}
    # Every key may also be null: the loader reads a null key as absent (its default).
    return {"anyOf": [body, {"type": "null"}], "description": k.help + k.convert.note, "default": _default(k, default)}


def _default(k: Key, value: Any) -> Any:
    if value is None:
        return "auto" if k.auto else None  # devices and cpu_threads: None is how "auto" is held
    return k.convert.written(value)


def _section(cls: type[Any]) -> dict[str, Any]:
    defaults = cls()
    properties: dict[str, Any] = {
        k.name: _property(k, getattr(defaults, f.name))
        for f in dataclasses.fields(cls)
        if (k := yaml_key(f)) is not None
    }
    properties.update({name: _section(sub) for name, sub in sections(cls).items()})
    path = getattr(cls, "SECTION", "")
    for old, new in REPLACED_KEYS.items():
        section, _, name = old.rpartition(".")
        if section == path:
            replaced = f"replaced by {', '.join(f'{section}.{n}' for n in new)} (its value is used for each)"
            properties[name] = {**properties[new[0]], "description": replaced, "deprecated": True}
            properties[name].pop("default", None)
    # A section may be null too: the loader reads a null section as empty.
    return {"type": ["object", "null"], "additionalProperties": False, "properties": properties}


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft-07, which yaml-language-server reads) of a configuration file."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        "title": "crossover-monitor configuration",
        "description": "Every key is optional; deploy/config.example.yaml spells out the defaults.",
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": {name: _section(cls) for name, cls in sections(Settings).items()},
        "definitions": {
            "duration": {
                "description": "a duration: 30s, 15m, 1h30m, 250ms or plain seconds",
                "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": DURATION_PATTERN}],
            }
        },
    }


def render() -> str:
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"
