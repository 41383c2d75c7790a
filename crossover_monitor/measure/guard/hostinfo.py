"""Facts about the host CPU that change the answer: usable cores (quota included), model, others' load."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from crossover_monitor.measure.guard.guard import HostLoad

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


def affinity_text(cores: Iterable[int] | None = None) -> str:
    """The cores this process may run on, written as a cpuset list is ("0-3,8"): a CPU manager's or a
    container's change of them changes the answer, so it is reported beside the thread count."""
    ordered = sorted(os.sched_getaffinity(0) if cores is None else cores)
    runs: list[list[int]] = []
    for core in ordered:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


# From this many usable cores on, "auto" leaves one of them to the rest of the node.
_SPARE_A_CORE_FROM = 4


def default_cpu_threads(root: Path = CGROUP_ROOT) -> int:
    """The framework threads for ``cpu_threads: auto``: the usable cores, less one for the node's other work.

    With a thread on every core, one core that another process keeps busy stalls every parallel call
    by a scheduler slice (8 ms per call at any size with 16 threads on 16 vCPUs; 15 threads were
    unaffected, benchmarks/results/cpu-gap-h200-*.log). On two or three cores one is too much
    to give away: there the guard withholds a disturbed point instead.
    """
    cores = usable_cpus(root)
    return cores - 1 if cores >= _SPARE_A_CORE_FROM else cores


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name, or the machine architecture when it cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


@dataclass(frozen=True)
class _Reading:
    cores_seen: int  # how many of the worker's cores /proc/stat listed
    idle_s: float  # time those cores sat idle (idle and iowait), summed over them
    steal_s: float  # time the hypervisor kept the worker's vCPUs waiting (steal), summed over them
    own_s: float  # CPU time of this process, all its threads
    wall_s: float
    throttled_s: float
    own_wait_s: float | None  # time the calling thread was runnable but not running (None: unknown)


class ProcStatMeter:
    """Other processes' load on this process's cores, from /proc/stat and the cgroup's throttling counters.

    Others' load is the time the cores were not idle, less this process's own CPU time. Not idle is
    wall time less /proc/stat's idle and iowait, which a tickless kernel measures at every idle
    entry and exit, rather than the sum of its user, system and steal fields, which are tick
    samples: on an idle 16-vCPU H200 VM (HZ=250) with TensorFlow's 15 threads waking and sleeping,
    those read 1–2 cores more than the cores were busy — the hypervisor's steal, sampled at the
    tick, double counts the wake-up latency of vCPUs that the guest also counts as idle — and the
    guard withheld the CPU of one idle sweep in three (benchmarks/README.md, "cpu_accounting.py").
    /proc/stat counts in clock ticks, so a short window carries a rounding error of about a tick per
    core; ``stop`` takes the statistical part of it (√cores ticks) off before reporting.
    """

    def __init__(
        self,
        *,
        proc_stat: Path = Path("/proc/stat"),
        root: Path = CGROUP_ROOT,
        schedstat: Path = Path("/proc/thread-self/schedstat"),
        tasks: Path = Path("/proc/self/task"),
        clock: Callable[[], float] = time.monotonic,
        own_cpu_time: Callable[[], float] = time.process_time,
    ) -> None:
        self._proc_stat = proc_stat
        self._clock = clock
        self._own_cpu_time = own_cpu_time
        self._schedstat = schedstat
        self._tasks = tasks
        self._cores = sorted(os.sched_getaffinity(0))
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self._cpu_stat = _cgroup_file(root, "cpu.stat")

    def cores(self) -> int:
        return len(self._cores)

    def _read(self) -> _Reading:
        wanted = {f"cpu{core}" for core in self._cores}
        seen = idle_ticks = steal_ticks = 0
        for line in self._proc_stat.read_text().splitlines():
            name, *fields = line.split()
            if name in wanted:
                # user nice system idle iowait irq softirq steal ...
                values = [int(v) for v in fields[:8]]
                seen += 1
                idle_ticks += values[3] + values[4]
                steal_ticks += values[7]
        wall = self._clock()  # next to the read: the cores' wall time is set against their idle time
        tick, throttled = self._tick_s, self._throttled_s()
        own, waited = self._own_cpu_time(), self._own_wait_s()
        return _Reading(seen, idle_ticks * tick, steal_ticks * tick, own, wall, throttled, waited)

    def _own_wait_s(self) -> float | None:
        """The calling thread's run-queue wait so far (schedstat's second field, in ns).

        The thread that times a point, not all of the worker's: a GPU point's host side runs on it,
        and the wait of a framework's CPU threads spinning down after a CPU point counts only where it
        kept this thread from a CPU.
        """
        try:
            return int(self._schedstat.read_text().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            return None  # a kernel without schedstat

    def _threads_wait(self) -> dict[str, float] | None:
        """Each of the worker's threads' run-queue wait so far, by thread id (a thread that ends drops out,
        one that starts comes in at its total: only threads seen at both ends of a window count)."""
        waits: dict[str, float] = {}
        try:
            for task in self._tasks.iterdir():
                try:
                    waits[task.name] = int((task / "schedstat").read_text().split()[1]) / 1e9
                except (OSError, ValueError, IndexError):
                    continue  # it ended while we looked
        except OSError:
            return None
        return waits or None

    def _throttled_s(self) -> float:
        if self._cpu_stat is None:
            return 0.0
        try:
            for line in self._cpu_stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "throttled_usec":  # cgroup v2
                    return int(value) / 1e6
                if key == "throttled_time":  # cgroup v1, nanoseconds
                    return int(value) / 1e9
        except (OSError, ValueError):
            return 0.0
        return 0.0

    def start(self) -> object:
        return self._read()

    def stop(self, started: object) -> HostLoad:
        if not isinstance(started, _Reading):
            raise TypeError("stop() takes what start() returned")
        now = self._read()
        wall = max(now.wall_s - started.wall_s, 1e-9)
        # A core /proc/stat does not list (a container's remapped view) counts as neither busy nor idle.
        busy = min(now.cores_seen, started.cores_seen) * wall - (now.idle_s - started.idle_s)
        others = busy - (now.own_s - started.own_s)
        rounding = math.sqrt(len(self._cores)) * self._tick_s
        return HostLoad(
            other_cores=max(0.0, others - rounding) / wall,
            throttled_s=max(0.0, now.throttled_s - started.throttled_s),
            wall_s=wall,
            steal_cores=max(0.0, now.steal_s - started.steal_s - rounding) / wall,
            own_wait=(
                max(0.0, now.own_wait_s - started.own_wait_s) / wall
                if now.own_wait_s is not None and started.own_wait_s is not None
                else None
            ),
        )

    def threads_mark(self) -> object:
        return _ThreadsMark(self._clock(), self._threads_wait())

    def threads_waited(self, since: object) -> float | None:
        if not isinstance(since, _ThreadsMark):
            raise TypeError("threads_waited() takes what threads_mark() returned")
        waits, wall = self._threads_wait(), self._clock() - since.wall_s
        return _waited_cores(since.waits_s, waits, wall) if wall > 0 else None


@dataclass(frozen=True)
class _ThreadsMark:
    wall_s: float
    waits_s: dict[str, float] | None


def _waited_cores(before: dict[str, float] | None, after: dict[str, float] | None, wall_s: float) -> float | None:
    """The run-queue wait of the threads seen at both readings between them, summed, per second of wall time."""
    if before is None or after is None:
        return None
    waited = sum(max(0.0, w - before[t]) for t, w in after.items() if t in before)
    return waited / max(wall_s, 1e-9)


def _cgroup_file(root: Path, name: str, proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> Path | None:
    """This process's cgroup file ``name`` (v2 unified, else the v1 cpu controller's), if there is one."""
    candidates = []
    try:
        for line in proc_self_cgroup.read_text().splitlines():
            number, controllers, path = line.split(":", 2)
            if number == "0":
                candidates.append(root / path.lstrip("/") / name)
            elif "cpu" in controllers.split(","):
                candidates.append(root / "cpu" / path.lstrip("/") / name)
    except (OSError, ValueError):
        return None
    return next((c for c in candidates if c.is_file()), None)
