"""CPU facts: the container's CPU quota is respected when choosing thread counts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from monitor.bench.hostinfo import cgroup_cpu_limit, cpu_model, default_cpu_threads, usable_cpus


def _cgroup_v2(tmp_path: Path, content: str) -> tuple[Path, Path]:
    (tmp_path / "cpu.max").write_text(content)
    self_cgroup = tmp_path / "self_cgroup"
    self_cgroup.write_text("0::/\n")
    return tmp_path, self_cgroup


def test_cgroup_v2_quota_gives_fractional_cpus(tmp_path: Path) -> None:
    """cpu.max '150000 100000' means 1.5 CPUs."""
    root, self_cgroup = _cgroup_v2(tmp_path, "150000 100000\n")
    assert cgroup_cpu_limit(root, self_cgroup) == 1.5


def test_cgroup_v2_max_means_unlimited(tmp_path: Path) -> None:
    """cpu.max 'max 100000' means no quota."""
    root, self_cgroup = _cgroup_v2(tmp_path, "max 100000\n")
    assert cgroup_cpu_limit(root, self_cgroup) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    """cgroup v1 cfs_quota_us / cfs_period_us is read when v2 is absent; -1 is unlimited."""
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path, tmp_path / "absent") == 2.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path, tmp_path / "absent") is None


def test_usable_cpus_is_capped_by_quota_and_never_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads = min(affinity, floor(quota)), at least 1."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert usable_cpus(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == 16


def test_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    """The model name line of /proc/cpuinfo names the CPU."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU @ 3.00GHz\n")
    assert cpu_model(cpuinfo) == "Example CPU @ 3.00GHz"
    assert cpu_model(tmp_path / "absent") == os.uname().machine


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (3, 3), (4, 3), (16, 15), (32, 31)])
def test_auto_threads_leave_a_core_to_the_node_from_four_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    """cpu_threads auto: one usable core is left to the node's other work once there are four."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    assert default_cpu_threads(tmp_path) == threads
