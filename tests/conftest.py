"""Shared fixtures: small plans and settings that keep real sweeps to seconds."""

from __future__ import annotations

import dataclasses
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from crossover_monitor.config.settings import BenchmarkSettings, RefineSettings, TimingSettings
from crossover_monitor.model import Mode
from crossover_monitor.protocol import Plan

# The real-deploy fixtures (an image built with podman, machines booted with systemd-nspawn).
pytest_plugins = ("tests.realdeploy",)

REPO = Path(__file__).resolve().parent.parent
QUICK_TIMING = TimingSettings(
    warmup_calls=1, block_s=0.002, min_blocks=3, max_blocks=10, target_spread=0.2, size_budget_s=0.2
)


def make_plan(
    backend: str,
    sizes: tuple[int, ...] = (16, 32, 64, 128),
    modes: tuple[Mode, ...] = ("compute", "end_to_end"),
    devices: tuple[str, ...] | None = None,
    **bench: Any,
) -> Plan:
    """A quick plan: few sizes, short timing blocks, no refinement and no guard unless asked for."""
    settings = BenchmarkSettings(
        backend=backend,
        devices=devices,
        sizes=sizes,
        dtypes=("float32",),
        modes=modes,
        tf32=False,
        cpu_threads=None,
        timing=QUICK_TIMING,
        refine=RefineSettings(enabled=False),
    )
    return Plan(bench=dataclasses.replace(settings, **bench))


def with_bench(plan: Plan, **changes: Any) -> Plan:
    """The plan with some of its benchmark settings changed."""
    return dataclasses.replace(plan, bench=dataclasses.replace(plan.bench, **changes))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers import the fake backends as 'tests.fakes', so they start from the repository root."""
    monkeypatch.chdir(REPO)


def tool(name: str, package: str) -> str:
    """The path of a checker the tests need; fails (never skips) with what to install when it is missing."""
    path = shutil.which(name)
    assert path, f"{name} is not installed: scripts/test installs it with Debian's {package} package"
    return path
