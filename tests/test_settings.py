"""Each settings rule is stated once, on the types: the YAML reader and code-built values break it in the same words."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from crossover_monitor.config.convert import MAX_SIZES
from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.config.settings import (
    BenchmarkSettings,
    HistorySettings,
    ScheduleSettings,
    Settings,
    TimingSettings,
    sections,
)
from crossover_monitor.errors import ConfigError

# (the document, the same values built in code, the section the code's message is relative to)
SAME_RULE: list[tuple[dict[str, Any], Callable[[], object], str]] = [
    ({"schedule": {"interval": 60, "jitter": 60}}, lambda: ScheduleSettings(interval_s=60, jitter_s=60), "schedule"),
    (
        {"schedule": {"interval": 300, "cron": "*/5 * * * *"}},
        lambda: ScheduleSettings(interval_s=300, cron="*/5 * * * *"),
        "schedule",
    ),
    ({"schedule": {"cron": "*/5 * * *"}}, lambda: ScheduleSettings(interval_s=None, cron="*/5 * * *"), "schedule"),
    ({"schedule": {"interval": 0.5}}, lambda: ScheduleSettings(interval_s=0.5), "schedule"),
    (
        {"benchmark": {"timing": {"min_blocks": 10, "max_blocks": 5}}},
        lambda: TimingSettings(min_blocks=10, max_blocks=5),
        "benchmark.timing",
    ),
    ({"benchmark": {"sizes": []}}, lambda: BenchmarkSettings(sizes=()), "benchmark"),
    ({"benchmark": {"sizes": [10, 10]}}, lambda: BenchmarkSettings(sizes=(10, 10)), "benchmark"),
    ({"benchmark": {"sizes": [10, 0]}}, lambda: BenchmarkSettings(sizes=(10, 0)), "benchmark"),
    (
        {"benchmark": {"sizes": list(range(1, MAX_SIZES + 2))}},
        lambda: BenchmarkSettings(sizes=tuple(range(1, MAX_SIZES + 2))),
        "benchmark",
    ),
    ({"benchmark": {"devices": []}}, lambda: BenchmarkSettings(devices=()), "benchmark"),
    (
        {"benchmark": {"devices": ["/GPU:0", "gpu:0"]}},
        lambda: BenchmarkSettings(devices=("/GPU:0", "gpu:0")),
        "benchmark",
    ),
    ({"benchmark": {"dtypes": ["float8"]}}, lambda: BenchmarkSettings(dtypes=("float8",)), "benchmark"),
    ({"benchmark": {"modes": ["fast"]}}, lambda: BenchmarkSettings(modes=("fast",)), "benchmark"),  # type: ignore[arg-type]
    ({"benchmark": {"backend": "cuda"}}, lambda: BenchmarkSettings(backend="cuda"), "benchmark"),
    ({"benchmark": {"cpu_threads": 0}}, lambda: BenchmarkSettings(cpu_threads=0), "benchmark"),
    (
        {"benchmark": {"skip_cpu_above_speedup": 0.5}},
        lambda: BenchmarkSettings(skip_cpu_above_speedup=0.5),
        "benchmark",
    ),
    ({"history": {"directory": " "}}, lambda: HistorySettings(directory=" "), "history"),
]


@pytest.mark.parametrize(("document", "build", "section"), SAME_RULE, ids=[str(c[0])[:50] for c in SAME_RULE])
def test_the_reader_and_code_break_a_rule_in_the_same_words(
    document: dict[str, Any], build: Callable[[], object], section: str
) -> None:
    """A rule broken in YAML and the same rule broken in code give the same message, with the key's path."""
    with pytest.raises(ConfigError) as read:
        settings_from_mapping(document)
    (problem,) = read.value.problems
    with pytest.raises(ValueError, match=r".+") as built:
        build()
    said = str(built.value)
    # The code names the key within its section ("jitter: …") or the section itself ("schedule: …").
    expected = said if said.startswith(f"{section}:") else f"{section}.{said}"
    assert str(problem) == expected


def test_code_built_sizes_must_be_ascending_where_the_reader_sorts_them() -> None:
    """The reader sorts the sizes it reads; sizes built in code out of order are refused."""
    assert settings_from_mapping({"benchmark": {"sizes": [100, 10]}}).benchmark.sizes == (10, 100)
    with pytest.raises(ValueError, match="sizes: must be in ascending order"):
        BenchmarkSettings(sizes=(100, 10))


def test_every_problem_of_a_list_is_named_by_its_index() -> None:
    """Every bad entry of a list is reported at once, each named by its index."""
    with pytest.raises(ConfigError) as read:
        settings_from_mapping({"benchmark": {"sizes": [10, -1, 10, "x"], "devices": ["cpu:0", "/CPU:0", "/GPU:0"]}})
    assert [str(p) for p in read.value.problems] == [
        "benchmark.devices[1]: '/CPU:0' is the same device as 'cpu:0'",
        "benchmark.sizes[1]: must be a positive integer matrix size, got -1",
        "benchmark.sizes[2]: duplicate value 10",
        "benchmark.sizes[3]: must be a positive integer matrix size, got a string 'x'",
    ]


def test_a_default_standing_in_for_a_broken_rule_cannot_break_another() -> None:
    """Interval and cron both given: the default interval (15m) stands in, and the jitter the user's 20m
    allowed is too long for it; that is reported once, not a traceback."""
    document = {"schedule": {"interval": "20m", "cron": "0 3 * * *", "jitter": "15m"}}
    with pytest.raises(ConfigError) as read:
        settings_from_mapping(document)
    assert [str(p) for p in read.value.problems] == ["schedule: set either interval or cron, not both"]


def test_auto_and_null_read_as_the_default_and_the_cron_line_replaces_the_interval() -> None:
    """`auto` and null read as the default; a cron line replaces the interval."""
    read = settings_from_mapping(
        {"schedule": {"cron": "0 3 * * *"}, "benchmark": {"devices": "auto", "cpu_threads": "auto", "timeout": None}}
    )
    assert (read.schedule.interval_s, read.schedule.cron) == (None, "0 3 * * *")
    assert (read.benchmark.devices, read.benchmark.cpu_threads, read.benchmark.timeout_s) == (None, None, 600.0)


def test_a_list_built_in_code_is_held_to_the_ascending_rule_too() -> None:
    """A list (not only a tuple) given for sizes in code is refused when out of order, not left to the worker."""
    with pytest.raises(ValueError, match="sizes: must be in ascending order"):
        BenchmarkSettings(sizes=[100, 10])  # type: ignore[arg-type]


def test_every_section_is_read_under_the_key_its_path_ends_with() -> None:
    """The reader finds a section by its field's name and reports it by SECTION: the two must agree."""

    def walk(cls: type[Any], path: str) -> list[tuple[str, str]]:
        found = []
        for name, section in sections(cls).items():
            where = f"{path}.{name}" if path else name
            found += [(section.SECTION, where), *walk(section, where)]
        return found

    pairs = walk(Settings, "")
    assert len(pairs) == 7  # schedule, benchmark (timing, refine), guard, server, history
    assert all(declared == walked for declared, walked in pairs), pairs
