"""The configuration's JSON Schema: generated from the settings' declared keys, shipped, and never stricter
or looser than the loader where it can tell (bounds, kinds, unknown keys)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover_monitor.config.convert import MAX_SIZES
from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.config.schema import config_schema, render
from crossover_monitor.config.settings import (
    BenchmarkSettings,
    GuardSettings,
    RefineSettings,
    ScheduleSettings,
    ServerSettings,
    TimingSettings,
    yaml_key,
)
from crossover_monitor.errors import ConfigError
from tests.conftest import REPO

SHIPPED = REPO / "deploy" / "config.schema.json"
SECTIONS = {
    ("schedule",): ScheduleSettings,
    ("benchmark",): BenchmarkSettings,
    ("benchmark", "timing"): TimingSettings,
    ("benchmark", "refine"): RefineSettings,
    ("guard",): GuardSettings,
    ("server",): ServerSettings,
}
VALIDATOR = jsonschema.Draft7Validator(config_schema())


def _loads(document: dict[str, Any]) -> bool:
    try:
        settings_from_mapping(document)
    except ConfigError:
        return False
    return True


def _nest(path: tuple[str, ...], key: str, value: object) -> dict[str, Any]:
    document: dict[str, Any] = {key: value}
    for part in reversed(path):
        document = {part: document}
    return document


def test_shipped_schema_is_the_generated_one() -> None:
    """deploy/config.schema.json is what the code generates (regenerate: crossover-monitor config-schema)."""
    assert SHIPPED.read_text(encoding="utf-8") == render()


def test_config_schema_command_prints_it() -> None:
    """`crossover-monitor config-schema` prints the schema, a valid draft-07 document."""
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "config-schema"], capture_output=True, text=True, check=True
    )
    schema = json.loads(done.stdout)
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema == config_schema()


def test_example_configuration_is_valid_and_points_editors_at_the_schema() -> None:
    """The example validates, and its modeline tells yaml-language-server where the schema is."""
    text = (REPO / "deploy" / "config.example.yaml").read_text(encoding="utf-8")
    VALIDATOR.validate(yaml.safe_load(text))
    assert text.startswith("# yaml-language-server: $schema=config.schema.json\n")


def _bounded_keys() -> list[tuple[tuple[str, ...], str, float, float, bool]]:
    found = []
    for path, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            k = yaml_key(f)
            if k is None or k.convert.bounds is None:
                continue
            low, high = k.convert.bounds
            found.append((path, k.name, low, high, k.convert.schema["type"] == "integer"))
    return found


@pytest.mark.parametrize(("path", "key", "low", "high", "integral"), _bounded_keys(), ids=str)
def test_bounds_agree_between_schema_and_loader(
    path: tuple[str, ...], key: str, low: float, high: float, *, integral: bool
) -> None:
    """At each bound both accept; one step beyond, both refuse."""
    step = 1 if integral else 0.5
    # min_blocks <= max_blocks is a rule across keys: give the other one room.
    companion = {"min_blocks": {"max_blocks": 4096}, "max_blocks": {"min_blocks": 3}}.get(key, {})
    for value, ok in ((low, True), (high, True), (low - step, False), (high + step, False)):
        document = _nest(path, key, int(value) if integral else value)
        if companion:
            document["benchmark"]["timing"].update(companion)
        assert VALIDATOR.is_valid(document) is ok, (document, ok)
        assert _loads(document) is ok, (document, ok)


KEYS = {
    path: sorted({k.name for f in dataclasses.fields(cls) if (k := yaml_key(f)) is not None})
    for path, cls in SECTIONS.items()
}
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5000),
    st.floats(-2, 200, allow_nan=False),
    st.sampled_from(["15m", "250ms", "1h30m", "auto", "soon", "*/5 * * * *", "torch", "compute", "float16", "[::]:1"]),
    st.lists(st.one_of(st.integers(-1, 70000), st.sampled_from(["compute", "float32", "cpu"])), max_size=4),
)


@pytest.mark.parametrize(
    "document",
    [
        {"schedule": None, "benchmark": {"timing": None, "refine": None}, "guard": None, "server": {"listen": None}},
        {"schedule": {"interval": "1e3", "jitter": " 30s "}},
        {"schedule": {"interval": ".5e1"}},
        {"server": {"listen": "[fe80::1%eth0]:9437"}},
        {"schedule": {"cron": " */5 * * * * "}},
        {"server": {"listen": ":9437"}},
    ],
    ids=["nulls", "float-text", "dot-float", "zone-id", "spaced-cron", "port-only"],
)
def test_forms_the_loader_takes_pass_the_schema(document: dict[str, Any]) -> None:
    """Null sections and keys, float() forms of durations, spaces the loader strips: valid for both."""
    assert _loads(document), document
    assert VALIDATOR.is_valid(document), document


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_whatever_the_loader_accepts_the_schema_accepts(data: st.DataObject) -> None:
    """The schema is never stricter than the loader: an editor never flags a configuration the service takes."""
    path = data.draw(st.sampled_from(sorted(KEYS)))
    key = data.draw(st.sampled_from(KEYS[path]))
    document = _nest(path, key, data.draw(VALUES))
    if _loads(document):
        assert VALIDATOR.is_valid(document), document


@pytest.mark.parametrize("key", ["devices", "sizes", "dtypes", "modes"])
def test_every_list_is_bounded_alike_by_schema_and_loader(key: str) -> None:
    """A list of more than MAX_SIZES entries is refused by both (the schema bounded only sizes before)."""
    entries: list[Any] = list(range(1, MAX_SIZES + 2)) if key == "sizes" else [f"x{i}" for i in range(MAX_SIZES + 1)]
    document = {"benchmark": {key: entries}}
    assert not VALIDATOR.is_valid(document)
    assert not _loads(document)
