"""Facts about the host CPU that change the answer: usable cores (container quota included) and model."""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs allowed by the cgroup's CFS quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), None if unlimited."""
    candidates = [root / "cpu.max"]
    try:
        for line in proc_self_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                candidates.insert(0, root / line[3:].lstrip("/") / "cpu.max")
    except OSError:
        pass
    for path in candidates:
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else int(quota) / int(period)
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 else quota_us / period_us


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """Cores this process may use: its affinity mask, capped by the container's CPU quota."""
    cores = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cores = min(cores, max(1, math.floor(limit)))
    return max(1, cores)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name, or the machine architecture when it cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine
