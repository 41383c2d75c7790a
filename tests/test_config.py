"""Configuration: defaults, every documented key, and the errors a user sees for bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from crossover_monitor.cli.main import main
from crossover_monitor.config.convert import parse_duration
from crossover_monitor.config.loader import keys_of, load_settings, settings_from_mapping, with_listen
from crossover_monitor.config.settings import (
    DEFAULT_PORT,
    REPLACED_KEYS,
    BenchmarkSettings,
    GuardSettings,
    ScheduleSettings,
    Settings,
    TimingSettings,
    sections,
)
from crossover_monitor.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from tests.conftest import REPO

# (document, key path the message must name, a fragment of the message)
BAD_CONFIGS = [
    ("nonsense: 1", "nonsense", "unknown key"),
    ("schedule: {every: 5m}", "schedule.every", "unknown key"),
    ("schedule: 5m", "schedule", "must be a mapping"),
    ("schedule: {interval: soon}", "schedule.interval", "duration"),
    ("schedule: {interval: 0}", "schedule.interval", "greater than zero"),
    ("schedule: {interval: -30s}", "schedule.interval", "duration"),
    ("schedule: {interval: 5m, cron: '*/5 * * * *'}", "schedule", "not both"),
    ("schedule: {cron: '0 0 31 2 *'}", "schedule.cron", "never fires"),
    ("schedule: {cron: '*/5 * * *'}", "schedule.cron", "5-field"),
    ("schedule: {cron: '99 * * * *'}", "schedule.cron", "higher than the maximum"),
    ("schedule: {cron: 15}", "schedule.cron", "crontab string"),
    ("schedule: {interval: 1m, jitter: 2m}", "schedule.jitter", "shorter than the interval"),
    ("schedule: {jitter: [1]}", "schedule.jitter", "duration"),
    ("benchmark: {backend: cuda}", "benchmark.backend", "unknown backend"),
    ("benchmark: {devices: gpu}", "benchmark.devices", "'auto' or a list"),
    ("benchmark: {devices: []}", "benchmark.devices", "must not be empty"),
    ("benchmark: {devices: ['/GPU:0', '/GPU:0']}", "benchmark.devices[1]", "duplicate"),
    ("benchmark: {devices: [3]}", "benchmark.devices[0]", "device name"),
    ("benchmark: {sizes: []}", "benchmark.sizes", "must not be empty"),
    ("benchmark: {sizes: 100}", "benchmark.sizes", "must be a list"),
    ("benchmark: {sizes: [10, -5]}", "benchmark.sizes[1]", "positive integer"),
    ("benchmark: {sizes: [10, 0]}", "benchmark.sizes[1]", "positive integer"),
    ("benchmark: {sizes: [10, 10]}", "benchmark.sizes[1]", "duplicate"),
    ("benchmark: {sizes: [10, 2.5]}", "benchmark.sizes[1]", "positive integer"),
    ("benchmark: {sizes: [true]}", "benchmark.sizes[0]", "positive integer"),
    ("benchmark: {sizes: [100000]}", "benchmark.sizes[0]", "at most"),
    ("benchmark: {dtypes: [float8]}", "benchmark.dtypes[0]", "unknown dtype"),
    ("benchmark: {dtypes: [float32, float32]}", "benchmark.dtypes[1]", "duplicate"),
    ("benchmark: {modes: [fast]}", "benchmark.modes[0]", "unknown mode"),
    ("benchmark: {timeout: 0s}", "benchmark.timeout", "greater than zero"),
    ("benchmark: {tf32: 'yes'}", "benchmark.tf32", "true or false"),
    ("benchmark: {cpu_threads: 0}", "benchmark.cpu_threads", "at least 1"),
    ("benchmark: {cpu_threads: many}", "benchmark.cpu_threads", "integer"),
    ("benchmark: {timing: {target_spread: 5}}", "benchmark.timing.target_spread", "between 0 and 1"),
    ("benchmark: {timing: {min_blocks: 1}}", "benchmark.timing.min_blocks", "at least 3"),
    ("benchmark: {timing: {min_blocks: 10, max_blocks: 5}}", "benchmark.timing.max_blocks", "at least min_blocks"),
    ("benchmark: {timing: {block_time: fast}}", "benchmark.timing.block_time", "duration"),
    ("benchmark: {timing: {repeats: 3}}", "benchmark.timing.repeats", "unknown key"),
    ("benchmark: {timing: {warmup_calls: 0}}", "benchmark.timing.warmup_calls", "at least 1"),
    ("benchmark: {refine: {spacing: 0}}", "benchmark.refine.spacing", "between 0 and 1"),
    ("benchmark: {refine: {visits: 1}}", "benchmark.refine.visits", "at least 2"),
    ("benchmark: {refine: {tolerance: 0.05}}", "benchmark.refine.tolerance", "refine.spacing"),
    ("benchmark: {refine: {budget: forever}}", "benchmark.refine.budget", "duration"),
    ("benchmark: {refine: {enabled: 1}}", "benchmark.refine.enabled", "true or false"),
    ("benchmark: {refine: {steps: 4}}", "benchmark.refine.steps", "unknown key"),
    ("guard: {gpu_max_utilization: 150}", "guard.gpu_max_utilization", "between 0 and 100"),
    ("guard: {gpu_max_other_processes: -1}", "guard.gpu_max_other_processes", "at least 0"),
    ("guard: {cpu_max_other_cores: .nan}", "guard.cpu_max_other_cores", "must be a number"),
    ("guard: {retry_interval: soon}", "guard.retry_interval", "duration"),
    ("guard: {retry_interval: 1s}", "guard.retry_interval", "at least 10s"),
    ("guard: {enabled: 1}", "guard.enabled", "true or false"),
    ("guard: {nvml: off}", "guard.nvml", "unknown key"),
    ("guard: []", "guard", "must be a mapping"),
    ("benchmark: {skip_cpu_above_speedup: 0.5}", "benchmark.skip_cpu_above_speedup", "greater than 1"),
    ("schedule: {cron: '0 0 1 * mon'}", "schedule.cron", "not both"),
    ("benchmark: {devices: ['/GPU:0', 'gpu:0']}", "benchmark.devices[1]", "same device"),
    ("benchmark: {expect_gpus: -1}", "benchmark.expect_gpus", "at least 0"),
    ("server: {listen: 9437}", "server.listen", "HOST:PORT"),
    ("server: {listen: 'localhost'}", "server.listen", "HOST:PORT"),
    ("server: {listen: '0.0.0.0:70000'}", "server.listen", "between 1 and 65535"),
    ("server: {listen: '::1:9437'}", "server.listen", "brackets"),
    ("server: {listen: 'bad host!:9437'}", "server.listen", "host name"),
    ("server: {port: 9437}", "server.port", "unknown key"),
    ("- just\n- a list", "", "top level must be a mapping"),
    ("schedule: {interval: 5m\n", "", "not valid YAML"),
]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_no_file_gives_the_documented_defaults() -> None:
    """Running without a config file uses the embedded defaults from the README."""
    settings = load_settings(None)
    assert settings.schedule.interval_s == 900
    assert settings.schedule.cron is None
    assert settings.benchmark.backend == "tensorflow"
    assert settings.benchmark.devices is None
    assert settings.benchmark.sizes == (1, 10, 100, 500, 1000, 2000, 4000)
    assert settings.benchmark.modes == ("compute", "end_to_end")
    assert settings.benchmark.timeout_s == 600
    assert settings.server.port == DEFAULT_PORT


def test_empty_file_equals_defaults(tmp_path: Path) -> None:
    """An empty document is valid and means 'all defaults'."""
    assert load_settings(_write(tmp_path, "")).benchmark == Settings().benchmark


def test_example_config_is_valid_and_matches_the_defaults() -> None:
    """deploy/config.example.yaml validates and spells out the embedded defaults."""
    settings = load_settings(REPO / "deploy" / "config.example.yaml")
    defaults = Settings()
    assert settings.schedule == defaults.schedule
    assert settings.benchmark == defaults.benchmark
    assert settings.guard == defaults.guard
    assert settings.server == defaults.server
    assert settings.history == defaults.history
    assert settings.replaced == ()


def test_every_key_is_read(tmp_path: Path) -> None:
    """Each documented key changes the settings it names."""
    settings = load_settings(
        _write(
            tmp_path,
            """
schedule: {cron: "*/5 * * * 1-5", jitter: 30s}
benchmark:
  backend: torch
  devices: [/CPU:0, /GPU:1]
  sizes: [4000, 1, 100]
  dtypes: [float16, bfloat16]
  modes: [end_to_end]
  timeout: 1h
  tf32: true
  cpu_threads: 3
  timing: {warmup_calls: 4, block_time: 50ms, min_blocks: 7, max_blocks: 9, target_spread: 0.1, size_budget: 2m}
  refine: {enabled: false, visits: 7, spacing: 0.1, budget: 10s}
  skip_cpu_above_speedup: 20
  expect_gpus: 2
server: {listen: "[::1]:9100"}
""",
        )
    )
    assert settings.schedule.cron == "*/5 * * * 1-5"
    assert settings.schedule.interval_s is None
    assert settings.schedule.jitter_s == 30
    bench = settings.benchmark
    assert bench.backend == "torch"
    assert bench.devices == ("/CPU:0", "/GPU:1")
    assert bench.sizes == (1, 100, 4000)
    assert bench.dtypes == ("float16", "bfloat16")
    assert bench.modes == ("end_to_end",)
    assert bench.timeout_s == 3600
    assert bench.tf32 is True
    assert bench.cpu_threads == 3
    assert (bench.timing.warmup_calls, bench.timing.block_s, bench.timing.min_blocks) == (4, 0.05, 7)
    assert (bench.timing.max_blocks, bench.timing.target_spread, bench.timing.size_budget_s) == (9, 0.1, 120)
    assert (bench.refine.enabled, bench.refine.visits, bench.refine.spacing, bench.refine.budget_s) == (
        False,
        7,
        0.1,
        10,
    )
    assert bench.skip_cpu_above_speedup == 20
    assert bench.expect_gpus == 2
    assert (settings.server.host, settings.server.port) == ("::1", 9100)
    assert settings.server.listen == "[::1]:9100"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("1h", 3600), ("1h30m", 5400), ("250ms", 0.25), ("90", 90), (45, 45), (1.5, 1.5)],
)
def test_durations_accept_units_and_plain_seconds(text: str | float, seconds: float) -> None:
    """Durations take s/m/h/d/ms suffixes, combinations of them, and plain numbers of seconds."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "m5", "1h 30m", "5x", True, None, [5]])
def test_malformed_durations_are_rejected(text: object) -> None:
    """Anything else is not a duration."""
    assert parse_duration(text) is None


def test_null_schedule_keys_mean_unset() -> None:
    """'cron: null' falls back to the default interval; 'interval: null' beside a cron is not 'both'."""
    assert settings_from_mapping({"schedule": {"cron": None}}).schedule.interval_s == 900
    schedule = settings_from_mapping({"schedule": {"interval": None, "cron": "*/5 * * * *"}}).schedule
    assert (schedule.interval_s, schedule.cron) == (None, "*/5 * * * *")


def test_plugin_backend_is_accepted() -> None:
    """A backend may be given as 'package.module:attribute' for third-party frameworks."""
    settings = settings_from_mapping({"benchmark": {"backend": "tests.fakes:curve"}})
    assert settings.benchmark.backend == "tests.fakes:curve"


@pytest.mark.parametrize(("text", "path", "fragment"), BAD_CONFIGS, ids=[c[0][:40] for c in BAD_CONFIGS])
def test_bad_config_names_key_path_and_exits_78(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, path: str, fragment: str
) -> None:
    """check-config prints the key path and the problem, no traceback, and exits with the config code."""
    config = _write(tmp_path, text)
    assert main(["check-config", str(config)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert str(config) in err
    line = next((ln for ln in err.splitlines() if fragment in ln), None)
    assert line is not None, err
    if path:
        assert line.strip().startswith(f"{path}:"), line


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    """Several mistakes in one file are all listed, not just the first."""
    config = _write(tmp_path, "schedule: {interval: never}\nbenchmark: {sizes: [0], modes: [x]}\nserver: {listen: 1}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    paths = [p.path for p in caught.value.problems]
    assert paths == ["schedule.interval", "benchmark.sizes[0]", "benchmark.modes[0]", "server.listen"]
    assert "4 problems" in str(caught.value)


def test_missing_file_is_a_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config path that does not exist is reported plainly with the config exit code."""
    assert main(["check-config", str(tmp_path / "absent.yaml")]) == EXIT_CONFIG
    assert "cannot read the file" in capsys.readouterr().err


def test_valid_config_passes_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check-config exits 0 and says the file is valid."""
    config = _write(tmp_path, "schedule: {interval: 1m}\n")
    assert main(["check-config", str(config)]) == EXIT_OK
    assert "valid" in capsys.readouterr().out


def test_listen_flag_overrides_config() -> None:
    """--listen replaces server.listen and is validated like it."""
    assert with_listen(Settings(), "127.0.0.1:1234").server.port == 1234
    with pytest.raises(ConfigError, match="--listen"):
        with_listen(Settings(), "nowhere")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TimingSettings(min_blocks=10, max_blocks=5), "max_blocks: must be at least min_blocks"),
        (lambda: TimingSettings(block_s=0), "block_time: must be greater than zero"),
        (lambda: GuardSettings(retry_interval_s=1), "retry_interval: must be at least 10s"),
        (lambda: GuardSettings(gpu_max_utilization_pct=150), "gpu_max_utilization: must be between 0 and 100"),
        (lambda: BenchmarkSettings(sizes=(0,)), r"sizes\[0\]: must be a positive integer matrix size"),
        (lambda: BenchmarkSettings(expect_gpus=10**31), "expect_gpus: must be at most 4096"),
        (lambda: ScheduleSettings(interval_s=60, jitter_s=60), "jitter: must be shorter than the interval"),
        (lambda: ScheduleSettings(interval_s=None, cron=None), "set an interval or a cron"),
    ],
    ids=["blocks", "block_time", "retry", "utilisation", "sizes", "expect_gpus", "jitter", "no-schedule"],
)
def test_constraints_hold_however_settings_are_built(build: Any, message: str) -> None:
    """Settings built in code (or from the worker's JSON) are checked against their declared keys too."""
    with pytest.raises(ValueError, match=message):
        build()


def test_thousands_of_problems_list_the_first_fifty_and_count_the_rest(tmp_path: Path) -> None:
    """Issue 20: 50,000 unknown keys printed 50,001 lines; now the first 50 and how many more, all still carried."""
    config = tmp_path / "many.yaml"
    config.write_text("".join(f"k{i:05d}: 1\n" for i in range(50_000)))
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    lines = str(raised.value).splitlines()
    assert lines[0].endswith("(50000 problems):")
    assert len(lines) == 1 + 50 + 1
    assert lines[1].startswith("  k00000: unknown key")
    assert lines[-1] == "  ... and 49950 more: fix these and check again"
    assert len(raised.value.problems) == 50_000


FIVE_FIELDS = "is not a valid 5-field crontab expression (expected 5 fields (minute hour day month weekday), got"


@pytest.mark.parametrize(
    ("document", "problems"),
    [
        ({"schedule": {"cron": "*/15 * * *"}}, [f"schedule.cron: {FIVE_FIELDS} 4), got '*/15 * * *'"]),
        (
            {"schedule": {"interval": "15m", "cron": "bad"}},
            [f"schedule.cron: {FIVE_FIELDS} 1), got 'bad'", "schedule: set either interval or cron, not both"],
        ),
        (
            {"schedule": {"interval": "15m", "cron": 7}},
            [
                "schedule.cron: must be a crontab string like '*/15 * * * *', got int 7",
                "schedule: set either interval or cron, not both",
            ],
        ),
        ({"benchmark": {"devices": 5}}, ["benchmark.devices: must be a list, got int 5"]),
        ({"benchmark": {"devices": "gpu"}}, ["benchmark.devices: must be 'auto' or a list of device names, got 'gpu'"]),
        ({"benchmark": {"sizes": "10"}}, ["benchmark.sizes: must be a list, got a string '10'"]),
        ({"server": {"listen": 9437}}, ["server.listen: must be a string HOST:PORT, got 9437"]),
        ({"server": {"listen": ":0"}}, ["server.listen: port must be between 1 and 65535, got 0 in ':0'"]),
    ],
    ids=["cron-4-fields", "bad-cron-and-interval", "cron-not-text", "devices-int", "devices-text", "sizes-text",
         "listen-int", "listen-port-0"],
)  # fmt: skip
def test_messages_read_word_for_word_as_before_the_rules_moved_onto_the_types(
    document: dict[str, Any], problems: list[str]
) -> None:
    """Issue 20 kept every message: these are the words of the reader before the converters (7723bed), in full,
    and a bad cron line beside an interval still reports both problems."""
    with pytest.raises(ConfigError) as raised:
        settings_from_mapping(document)
    assert [str(p) for p in raised.value.problems] == problems


def test_a_key_of_an_earlier_release_is_carried_to_the_keys_that_replaced_it_with_a_warning(tmp_path: Path) -> None:
    """guard.host_max_slowdown fed three checks in two units; its value goes to each key that replaced it (so a large
    value still turns off all it turned off), the file still loads, and the warning names the new keys. A new key the
    file sets itself is kept. point_figure_other_cores became range_others_cores."""
    old = load_settings(_write(tmp_path, "guard: {host_max_slowdown: 100, point_figure_other_cores: 2}\n"))
    assert (old.guard.reference_max_slowdown, old.guard.range_max_slowdown, old.guard.cpu_max_threads_wait) == (
        100,
        100,
        100,
    )
    assert old.guard.range_others_cores == 2
    assert [str(p) for p in old.replaced] == [
        (
            "guard.host_max_slowdown: replaced by guard.reference_max_slowdown, guard.range_max_slowdown, "
            "guard.cpu_max_threads_wait (one meaning each): its value 100 is used for each of them; write those keys "
            "instead"
        ),
        (
            "guard.point_figure_other_cores: replaced by guard.range_others_cores (one meaning each): its value 2 is "
            "used for each of them; write those keys instead"
        ),
    ]
    both = load_settings(_write(tmp_path, "guard: {host_max_slowdown: 0.3, range_max_slowdown: 0.2}\n"))
    assert (both.guard.reference_max_slowdown, both.guard.range_max_slowdown, both.guard.cpu_max_threads_wait) == (
        0.3,
        0.2,
        0.3,
    )
    assert "(the file's own range_max_slowdown kept)" in str(both.replaced[0])
    assert load_settings(_write(tmp_path, "guard: {range_max_slowdown: 0.2}\n")).replaced == ()
    assert old == load_settings(
        _write(
            tmp_path,
            "guard: {reference_max_slowdown: 100, range_max_slowdown: 100, cpu_max_threads_wait: 100, "
            "range_others_cores: 2}\n",
        )
    )


def _key_paths() -> set[str]:
    """Every YAML key path the settings declare (``benchmark.timing.block_time``)."""
    found: set[str] = set()

    def walk(cls: type[Any]) -> None:
        found.update(f"{cls.SECTION}.{name}" for name in keys_of(cls))
        for sub in sections(cls).values():
            walk(sub)

    for section in sections(Settings).values():
        walk(section)
    return found


def _example_keys() -> dict[str, int]:
    """Each key path of deploy/config.example.yaml (a commented-out alternative too) and the lines of comment
    directly above it."""
    found: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    comment = 0
    for line in (REPO / "deploy" / "config.example.yaml").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        match = re.match(r"(\s*)(?:# )?([a-z_0-9]+):( |$)", line)
        if match is None or (stripped.startswith("#") and not re.match(r"\s*# [a-z_0-9]+: \S", line)):
            comment = comment + 1 if stripped.startswith("#") else 0
            continue
        indent = len(match.group(1))
        stack = [(i, name) for i, name in stack if i < indent]
        path = ".".join([name for _, name in stack] + [match.group(2)])
        found.setdefault(path, comment)
        stack.append((indent, match.group(2)))
        comment = 0
    return found


def _documented_keys() -> set[str]:
    """The key paths docs/configuration.md's table names (``a.b.c` / `d``: d is a.b.d)."""
    found: set[str] = set()
    for line in (REPO / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for name in re.findall(r"`([a-z_.0-9]+)`", line.split("|")[1]):
            if "." in name:
                parent = name.rpartition(".")[0]
                found.add(name)
            else:
                found.add(f"{parent}.{name}")
    return found


def test_every_key_is_in_the_example_config_and_the_reference_each_explained_in_at_most_three_lines() -> None:
    """A key missing from either is a key nobody can find; a comment longer than three lines is not acted on."""
    keys = _key_paths()
    assert len(keys) > 30  # the parser found the settings
    example = _example_keys()
    assert keys - set(example) == set()
    assert {path: lines for path, lines in example.items() if lines > 3} == {}
    assert keys - _documented_keys() == set()
    assert set(REPLACED_KEYS) - _documented_keys() == set()  # the old keys are named with what replaced them
