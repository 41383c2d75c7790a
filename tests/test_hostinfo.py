"""CPU facts: the container's CPU quota is respected when choosing thread counts; the /proc/stat meter
of others' load, steal and this process's wait, against scripted files and real spinning processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from crossover_monitor.measure.guard.hostinfo import (
    ProcStatMeter,
    affinity_text,
    cgroup_cpu_limit,
    cpu_model,
    default_cpu_threads,
    usable_cpus,
)
from tests.fakes import SPIN_FOR_A_MINUTE


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


def test_proc_stat_meter_measures_how_long_this_process_waited_for_a_cpu() -> None:
    """The real meter: this process sharing one core with a spinner waits about half the time; alone (on the
    idlest of its cores), hardly."""
    script = r"""
import os, subprocess, sys, time
from crossover_monitor.measure.guard.hostinfo import ProcStatMeter

def idle_ticks():
    lines = open("/proc/stat").read().splitlines()
    return {int(l.split()[0][3:]): int(l.split()[4]) for l in lines if l.startswith("cpu") and l[3].isdigit()}

# The idlest of our cores over a moment: a developer's or CI's machine is rarely idle, and "alone"
# must mean alone on this core.
before = idle_ticks(); time.sleep(0.5); after = idle_ticks()
core = max(os.sched_getaffinity(0), key=lambda c: after.get(c, 0) - before.get(c, 0))
idle_share = (after.get(core, 0) - before.get(core, 0)) / os.sysconf("SC_CLK_TCK") / 0.5
os.sched_setaffinity(0, {core})
meter = ProcStatMeter()

def spin_window():
    started, end = meter.start(), time.perf_counter() + 1.0
    while time.perf_counter() < end:
        pass
    return meter.stop(started).own_wait

alone = spin_window()
spinner = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(core)])  # on the same core
try:
    time.sleep(0.3)
    shared = spin_window()
finally:
    spinner.kill()
print(alone, shared, idle_share)
"""
    done = subprocess.run(
        [sys.executable, "-c", script, SPIN_FOR_A_MINUTE], capture_output=True, text=True, timeout=60, check=True
    )
    alone, shared, idle_share = (float(x) for x in done.stdout.split())
    if idle_share > 0.9:  # a core of its own: CFS shares it with the spinner about evenly
        assert alone < 0.1, done.stdout
        assert 0.3 < shared < 0.7, done.stdout
    else:  # every core already busy (a loaded CI runner): one more process on it is still waited for
        assert shared > alone + 0.1, done.stdout


def test_proc_stat_meter_without_schedstat_says_the_wait_is_unknown(tmp_path: Path) -> None:
    """A kernel without schedstat: own_wait is None (unknown, so no GPU point is withheld for it), not 0."""
    meter = ProcStatMeter(schedstat=tmp_path / "no-schedstat")
    assert meter.stop(meter.start()).own_wait is None
    (tmp_path / "schedstat").write_text("1000 2500000000 7\n")  # ns on CPU, ns waiting, timeslices
    meter = ProcStatMeter(schedstat=tmp_path / "schedstat")
    started = meter.start()
    (tmp_path / "schedstat").write_text("1000 2600000000 8\n")
    load = meter.stop(started)
    assert load.own_wait == pytest.approx(0.1 / load.wall_s)


def _fake_meter(stat: Path, own_cpu_s: list[float]) -> ProcStatMeter:
    """A meter on a written /proc/stat whose window lasts exactly one second of wall time."""
    walls = iter([100.0, 101.0])
    owns = iter(own_cpu_s)
    return ProcStatMeter(proc_stat=stat, clock=lambda: next(walls), own_cpu_time=lambda: next(owns))


def _write_proc_stat(stat: Path, cores: Sequence[int], user: int, idle: int, steal: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    lines = [f"cpu{core} {user} 0 50 {idle} 0 0 0 {steal} 0 0" for core in cores]
    stat.write_text("\n".join(["cpu  1 2 3 4 5 6 7 8 0 0", *lines, "intr 0"]) + "\n")


def test_proc_stat_meter_counts_busy_time_from_idle_time_not_tick_samples(tmp_path: Path) -> None:
    """Others' load is the cores' time not idle less this process's; steal the guest also counted idle is not in it.

    A VM's steal clock counts the wake-up latency of an idle vCPU that the guest counts idle too, so
    /proc/stat's fields add up to more than the wall time; the sum of its busy fields would read that
    as others' load (an idle H200 VM: 1-2 cores of it beside TensorFlow's threads).
    """
    stat = tmp_path / "stat"
    cores = sorted(os.sched_getaffinity(0))
    tick = 1 / os.sysconf("SC_CLK_TCK")
    second = round(1 / tick)
    _write_proc_stat(stat, cores, user=100, idle=9000, steal=0)
    meter = _fake_meter(stat, [5.0, 5.25])  # this process used 0.25 s of CPU in the window
    started = meter.start()
    # Each core: 40% of the second busy, 60% idle, and 30% steal, half of it counted idle as well.
    _write_proc_stat(stat, cores, user=100 + second * 4 // 10, idle=9000 + second * 6 // 10, steal=second * 3 // 10)
    load = meter.stop(started)
    rounding = len(cores) ** 0.5 * tick
    assert load.wall_s == pytest.approx(1.0)
    assert load.other_cores == pytest.approx(len(cores) * 0.4 - 0.25 - rounding)
    assert load.steal_cores == pytest.approx(len(cores) * 0.3 - rounding)
    tick_samples = len(cores) * (0.4 + 0.3) - 0.25 - rounding  # user and steal summed, as the meter once did
    assert load.other_cores < tick_samples - 0.25 * len(cores)


def test_proc_stat_meter_leaves_out_cores_that_proc_stat_does_not_list(tmp_path: Path) -> None:
    """A container's remapped /proc/stat may list fewer cores than the affinity mask: those count as neither."""
    stat = tmp_path / "stat"
    cores = sorted(os.sched_getaffinity(0))
    second = round(os.sysconf("SC_CLK_TCK"))
    _write_proc_stat(stat, cores[:1], user=100, idle=9000, steal=0)
    meter = _fake_meter(stat, [5.0, 5.0])
    started = meter.start()
    _write_proc_stat(stat, cores[:1], user=100, idle=9000 + second, steal=0)  # the one listed core idled
    assert meter.stop(started).other_cores == 0.0


def test_proc_stat_meter_sees_a_process_spinning_beside_it() -> None:
    """The real meter: others' load over a window includes all the CPU a spinning child used in it."""
    meter = ProcStatMeter()
    tick = 1 / os.sysconf("SC_CLK_TCK")

    def cpu_seconds(pid: int) -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * tick  # utime + stime

    spinner = subprocess.Popen([sys.executable, "-c", SPIN_FOR_A_MINUTE])
    try:
        time.sleep(0.3)
        before, started, wall = cpu_seconds(spinner.pid), meter.start(), time.monotonic()
        time.sleep(1.0)
        load = meter.stop(started)
        spun = (cpu_seconds(spinner.pid) - before) / (time.monotonic() - wall)
    finally:
        spinner.kill()
        spinner.wait()
    assert spun > 0.3  # it did run (on a loaded machine it gets less than a core)
    assert load.other_cores > spun - 0.25, (load, spun)  # the rounding the meter takes off, and ticks
    assert load.other_cores <= len(os.sched_getaffinity(0))


def test_proc_stat_meter_does_not_count_this_process() -> None:
    """This process's own busy loop is not others' load (against quiet seconds before and after it)."""
    meter = ProcStatMeter()

    def others(work: Callable[[], None]) -> float:
        started = meter.start()
        work()
        return meter.stop(started).other_cores

    def spin() -> None:
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            pass

    quiet = [others(lambda: time.sleep(1.0))]
    busy = others(spin)
    quiet.append(others(lambda: time.sleep(1.0)))
    assert busy - max(quiet) < 0.5, (quiet, busy)


@pytest.mark.parametrize(
    ("cores", "text"),
    [({0}, "0"), (set(range(16)), "0-15"), ({0, 1, 2, 3, 8}, "0-3,8"), ({5, 1, 2, 7, 8, 9}, "1-2,5,7-9")],
)
def test_affinity_is_written_as_a_cpuset_list(cores: set[int], text: str) -> None:
    """The worker's cores as the kernel's cpuset files write them: ranges of neighbours, in order."""
    assert affinity_text(cores) == text


def test_threads_waited_sums_each_threads_run_queue_wait_per_second(tmp_path: Path) -> None:
    """The worker's threads' wait between a mark and now, summed over the threads seen at both, per second of
    wall time; a thread that started meanwhile does not count its whole life's wait."""
    tasks = tmp_path / "task"

    def write(waits: dict[str, int]) -> None:
        for tid, ns in waits.items():
            (tasks / tid).mkdir(parents=True, exist_ok=True)
            (tasks / tid / "schedstat").write_text(f"1000 {ns} 3\n")

    walls = iter([10.0, 10.5])
    meter = ProcStatMeter(tasks=tasks, clock=lambda: next(walls))
    write({"100": 1_000_000_000, "101": 0})
    mark = meter.threads_mark()
    write({"100": 1_050_000_000, "101": 100_000_000, "102": 9_000_000_000})
    assert meter.threads_waited(mark) == pytest.approx((0.05 + 0.1) / 0.5)
    assert ProcStatMeter(tasks=tmp_path / "none").threads_waited(ProcStatMeter().threads_mark()) is None
