"""The configuration's JSON Schema, generated from the Key each settings field declares.

Editors validate and complete ``config.yaml`` with it (yaml-language-server); ``crossover-monitor
config-schema`` prints it and ``deploy/config.schema.json`` ships it (a test keeps that file equal).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from monitor.settings import DAY_S, MAX_COUNT, MAX_PORT, Key, Settings, span, yaml_key

SCHEMA_ID = "https://github.com/crossover-monitor/crossover-monitor/deploy/config.schema.json"
# A duration as text: Python's float() forms (1e3, .5, +30, 1_000) or parts like 1h30m, 250ms;
# surrounding spaces allowed, as the loader strips them.
_NUMBER_TEXT = r"[+-]?((\d(_?\d)*)(\.(\d(_?\d)*)?)?|\.\d(_?\d)*)([eE][+-]?\d(_?\d)*)?"
_DURATION_TEXT = rf"^\s*({_NUMBER_TEXT}|((\d+(\.\d+)?)(ms|s|m|h|d))+)\s*$"


def _property(k: Key, default: Any) -> dict[str, Any]:
    """The schema of one key, from its kind and bounds."""
    low = k.minimum if k.minimum is not None else 0
    if k.kind == "special":
        body: dict[str, Any] = dict(k.schema or {})
    elif k.kind == "integer":
        top = k.maximum if k.maximum is not None else MAX_COUNT
        body = {"type": "integer", "minimum": int(low), "maximum": int(top)}
    elif k.kind == "number":
        body = {"type": "number", "minimum": low}
        if k.maximum is not None:
            body["maximum"] = k.maximum
    elif k.kind == "fraction":
        body = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}
    elif k.kind == "boolean":
        body = {"type": "boolean"}
    else:  # durations: the text form cannot carry bounds, so the description does
        body = {"$ref": "#/definitions/duration"}
    description = k.help
    if k.kind in ("duration", "positive_duration"):
        top = k.maximum if k.maximum is not None else DAY_S
        least = f"at least {span(low)}, " if low else ""
        description += f" ({least}at most {span(top)})"
    # Every key may also be null: the loader reads a null key as absent (its default).
    return {"anyOf": [body, {"type": "null"}], "description": description, "default": _default(k, default)}


def _default(k: Key, value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if value is None and k.auto:
        return "auto"  # devices and cpu_threads: None is how "auto" is held
    return value


def _section(cls: type[Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    defaults = cls()
    properties = {
        k.name: _property(k, getattr(defaults, f.name))
        for f in dataclasses.fields(cls)
        if (k := yaml_key(f)) is not None
    }
    # A section may be null too: the loader reads a null section as empty.
    return {"type": ["object", "null"], "additionalProperties": False, "properties": {**properties, **(extra or {})}}


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft-07, which yaml-language-server reads) of a configuration file."""
    settings = Settings()
    benchmark = type(settings.benchmark)
    nested = {
        "timing": _section(type(settings.benchmark.timing)),
        "refine": _section(type(settings.benchmark.refine)),
    }
    sections = {
        "schedule": _section(type(settings.schedule)),
        "benchmark": _section(benchmark, nested),
        "guard": _section(type(settings.guard)),
        "history": _section(type(settings.history)),
        "server": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "properties": {
                "listen": {
                    "type": ["string", "null"],
                    "pattern": r"^\s*(\[[^\]]+\]|[^:\[\]]+):[0-9]{1,5}\s*$",
                    "description": f"where to serve, HOST:PORT (IPv6 in brackets); port 1 to {MAX_PORT}",
                    "default": settings.server.listen,
                }
            },
        },
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        "title": "crossover-monitor configuration",
        "description": "Every key is optional; deploy/config.example.yaml spells out the defaults.",
        "type": ["object", "null"],
        "additionalProperties": False,
        "properties": sections,
        "definitions": {
            "duration": {
                "description": "a duration: 30s, 15m, 1h30m, 250ms or plain seconds",
                "anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": _DURATION_TEXT}],
            }
        },
    }


def render() -> str:
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"
