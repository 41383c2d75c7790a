"""No configuration file can crash, hang or bloat ``check-config``: each odd or hostile case found by
trying about 340 of them (issue 9) ends at once with exit 78, its key path and a short message.

The cases run the real command in a subprocess; a generous timeout catches a hang without making
the test a timing benchmark. A property-based test then feeds generated documents to the loader.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossover_monitor.config.loader import load_settings
from crossover_monitor.errors import EXIT_CONFIG, ConfigError, Problem
from crossover_monitor.protocol import Plan
from crossover_monitor.service.schedule import SweepScheduler

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)

CASES = [
    ("latin-1", "# caf\xe9\nschedule: {interval: 15m}\n".encode("latin-1"), "", "not UTF-8 text"),
    ("deep-nesting", b"benchmark: {sizes: " + b"[" * 500 + b"]" * 500 + b"}\n", "", "nested more than"),
    ("alias-bomb", ALIAS_BOMB.encode(), "", "aliases"),
    ("host-backtracking", b"server: {listen: '" + b"a" * 30 + b"!:80'}\n", "server.listen", "valid host name"),
    ("interval-1e12", b"schedule: {interval: 1e12}\n", "schedule.interval", "at most 366 days"),
    ("interval-1ms", b"schedule: {interval: 1ms}\n", "schedule.interval", "at least 1s"),
    ("cron-jitter-1e300", b"schedule: {cron: '*/5 * * * *', jitter: 1e300}\n", "schedule.jitter", "at most 1 day"),
    (
        "expect-gpus-huge",
        b"benchmark: {expect_gpus: 10000000000000000000000000000000}\n",
        "benchmark.expect_gpus",
        "at most",
    ),
    (
        "cpu-threads-huge",
        b"benchmark: {cpu_threads: 1000000000000000000000000000000}\n",
        "benchmark.cpu_threads",
        "at most",
    ),
    ("ipv4-in-brackets", b"server: {listen: '[127.0.0.1]:9437'}\n", "server.listen", "only an IPv6 address"),
    ("full-width-port", "server: {listen: '0.0.0.0:９４３７'}\n".encode(), "server.listen", "HOST:PORT"),
    (
        "65536-sizes",
        ("benchmark: {sizes: [" + ", ".join(map(str, range(1, 65537))) + "]}\n").encode(),
        "benchmark.sizes",
        "at most 1000 entries",
    ),
    ("impossible-date", b"schedule: {interval: 2024-02-30}\n", "", "not a valid YAML value"),
    ("5000-digit-integer", b"benchmark: {expect_gpus: " + b"9" * 5000 + b"}\n", "", "not a valid YAML value"),
    ("million-entries", b"benchmark: {sizes: [" + b"1, " * 1_000_000 + b"1]}\n", "", "larger than"),
]


def _check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crossover_monitor", *args, str(path)]
        if args == ("check-config",)
        else [sys.executable, "-m", "crossover_monitor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("name", "content", "key", "message"), CASES, ids=[c[0] for c in CASES])
def test_hostile_file_is_refused_with_its_key_path_and_a_short_message(
    tmp_path: Path, name: str, content: bytes, key: str, message: str
) -> None:
    """Exit 78, the key path and the reason on stderr, no traceback, and the value shown abridged."""
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    done = _check(path, "check-config")
    assert done.returncode == EXIT_CONFIG, done.stderr[-1000:]
    assert message in done.stderr
    assert f"  {key}: " in done.stderr if key else "(1 problem)" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr) < 1000


def test_dev_zero_is_refused_without_reading_it_all() -> None:
    """An endless file is read only up to the size limit."""
    done = _check(Path("/dev/zero"), "check-config")
    assert done.returncode == EXIT_CONFIG
    assert "larger than 1024 KiB" in done.stderr


@pytest.mark.parametrize("listen", ["", "[127.0.0.1]:9437"])
def test_bad_listen_flag_stops_the_service_before_it_starts(listen: str) -> None:
    """`run --listen ''` is an error (exit 78), not a silent 0.0.0.0:9437."""
    done = _check(Path(), "run", "--listen", listen)
    assert done.returncode == EXIT_CONFIG
    assert "--listen" in done.stderr


# Documents built from the real keys (and some that are not), with values of every YAML kind.
KEYS = {
    "schedule": ["interval", "cron", "jitter"],
    "benchmark": [
        "backend",
        "devices",
        "sizes",
        "dtypes",
        "modes",
        "timeout",
        "tf32",
        "cpu_threads",
        "expect_gpus",
        "skip_cpu_above_speedup",
        "timing",
        "refine",
    ],
    "guard": [
        "enabled",
        "require_nvml",
        "gpu_max_utilization",
        "gpu_max_other_processes",
        "gpu_idle_process_max_mib",
        "cpu_max_other_cores",
        "gpu_max_host_wait",
        "retry_interval",
    ],
    "server": ["listen"],
}
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "15m",
            "1h30m",
            "250ms",
            "1e300",
            "*/5 * * * *",
            "0 3 * * 0",
            "torch",
            "auto",
            "0.0.0.0:9437",
            "[::]:9437",
            "float32",
            "compute",
            "-1",
            "0",
            "99999999999",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
DOCUMENTS = st.dictionaries(
    st.sampled_from([*KEYS, "extra"]),
    st.dictionaries(st.sampled_from(sorted({k for ks in KEYS.values() for k in ks} | {"x"})), VALUES, max_size=5)
    | VALUES,
    max_size=4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=DOCUMENTS)
def test_any_document_is_accepted_and_usable_or_refused_clearly(tmp_path: Path, document: dict[str, object]) -> None:
    """Fuzz: every document either loads into settings that `run` can use, or raises ConfigError; nothing else."""
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    problems: tuple[Problem, ...] | None
    try:
        loaded = load_settings(path)
    except ConfigError as exc:
        problems = exc.problems
    else:
        problems = None
    if problems is not None:
        assert problems
        assert all(len(str(p)) < 400 for p in problems)
        return
    # What `run` does with them before any sweep: the worker's plan and the scheduler's trigger.
    plan = Plan(bench=loaded.benchmark, guard=loaded.guard)
    assert Plan.from_json(plan.to_json()) == plan
    schedule = loaded.schedule
    trigger = SweepScheduler._build_trigger(schedule.interval_s, schedule.cron, schedule.jitter_s)
    assert trigger is not None
