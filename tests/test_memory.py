"""Memory (issue 51, N10): what the worker may use, sizes that cannot fit it, and a worker the OOM killer ended.

The sweeps here run for real in a memory cgroup of their own (the tests run as root), the worker with a plugin
backend that takes more memory than allowed at one size: fault injection, not mocks.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crossover_monitor.config.loader import memory_warnings
from crossover_monitor.config.settings import BenchmarkSettings, Settings
from crossover_monitor.measure.contract import BackendOptions
from crossover_monitor.measure.runner import run_plan
from crossover_monitor.memory import MemoryLimit, matrices_bytes, memory_limit, oom_kills, refusal
from crossover_monitor.model import DTYPES, DeviceFailure, Measurement
from crossover_monitor.protocol import Message
from tests.conftest import REPO, make_plan
from tests.fakes import VirtualClock, VirtualCurveBackend

GIB = 1 << 30
CGROUP_LIMIT = 256 << 20  # the test cgroup's: the daemon and a fake worker need about 100 MiB together


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_usable_memory_is_the_tightest_cgroup_limit_or_the_ram(tmp_path: Path) -> None:
    """Issue 51 N10: the worker may use the least of its cgroup's limits (an ancestor's too) and the host's RAM."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16777216 kB\nMemFree:         1 kB\n")  # 16 GiB
    v2 = tmp_path / "v2"
    _write(
        v2,
        {
            "cgroup.controllers": "cpu memory\n",
            "kubepods/memory.max": f"{3 * GIB}\n",  # the pod's limit binds its container
            "kubepods/pod1/ctr/memory.max": "max\n",
        },
    )
    own = tmp_path / "self-cgroup"
    own.write_text("0::/kubepods/pod1/ctr\n")
    limit = memory_limit(root=v2, proc_self_cgroup=own, meminfo=meminfo)
    assert limit == MemoryLimit(bytes=3 * GIB, source="cgroup memory.max")
    assert str(limit) == "3.00 GiB (cgroup memory.max)"

    v1 = tmp_path / "v1"
    _write(v1, {"memory/system.slice/cm.service/memory.stat": f"cache 0\nhierarchical_memory_limit {GIB}\n"})
    own.write_text("5:memory:/system.slice/cm.service\n0::/system.slice/cm.service\n")
    assert memory_limit(root=v1, proc_self_cgroup=own, meminfo=meminfo) == MemoryLimit(
        bytes=GIB, source="cgroup memory.limit_in_bytes"
    )
    _write(v1, {"memory/system.slice/cm.service/memory.stat": "hierarchical_memory_limit 9223372036854771712\n"})
    ram = memory_limit(root=v1, proc_self_cgroup=own, meminfo=meminfo)  # v1's "unlimited": the RAM binds
    assert ram == MemoryLimit(bytes=16 * GIB, source="MemTotal, the host's RAM")


def test_oom_kills_are_read_from_the_cgroups_own_counter(tmp_path: Path) -> None:
    """Issue 51 N10: the OOM killer's count comes from memory.events (v2) or memory.oom_control (v1)."""
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/cm.service\n")
    v2 = tmp_path / "v2"
    _write(v2, {"cgroup.controllers": "memory\n", "system.slice/cm.service/memory.events": "oom 3\noom_kill 2\n"})
    assert oom_kills(root=v2, proc_self_cgroup=own) == 2
    own.write_text("4:memory:/system.slice/cm.service\n")
    v1 = tmp_path / "v1"
    _write(v1, {"memory/system.slice/cm.service/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"})
    assert oom_kills(root=v1, proc_self_cgroup=own) == 5
    assert oom_kills(root=tmp_path / "none", proc_self_cgroup=own) is None


def test_a_points_matrices_count_what_its_mode_holds_on_the_host() -> None:
    """Issue 51 N10: A, B and C on a CPU, plus host copies in end_to_end; a GPU's compute matrices are its own."""
    square = 16384 * 16384 * 4
    assert matrices_bytes(16384, "float32", "compute", "cpu") == 3 * square  # 3 GiB
    assert matrices_bytes(16384, "float32", "end_to_end", "cpu") == 5 * square
    assert matrices_bytes(16384, "float32", "compute", "gpu") == 0
    assert matrices_bytes(16384, "float32", "end_to_end", "gpu") == 3 * square
    assert {matrices_bytes(1, dtype, "compute", "cpu") for dtype in DTYPES} == {6, 12, 24}  # every dtype has a size


def test_load_warns_about_sizes_whose_matrices_cannot_fit_naming_size_and_limit() -> None:
    """Issue 51 N10: sizes 16384 and 65536 in a 3 GiB cgroup are each named with the limit; the defaults are not."""
    limit = MemoryLimit(bytes=3 * GIB, source="cgroup memory.max")
    settings = Settings(benchmark=BenchmarkSettings(sizes=(1000, 16384, 65536)))
    problems = memory_warnings(settings, limit)
    assert [p.path for p in problems] == ["benchmark.sizes[1]", "benchmark.sizes[2]"]
    assert problems[0].message.startswith("n=16384 float32: its matrices cannot fit")
    assert "3.00 GiB (cgroup memory.max)" in problems[0].message
    assert "compute on the CPU needs at least 3.00 GiB" in problems[0].message
    assert "n=65536" in problems[1].message
    assert memory_warnings(Settings(), limit) == []
    assert memory_warnings(settings, None) == []  # nothing known about this host: nothing to say


def test_the_plan_refuses_points_that_cannot_fit_and_times_the_rest() -> None:
    """Issue 51 N10: each point whose matrices exceed the limit fails at once, naming size and limit; the rest run."""
    limit = MemoryLimit(bytes=3 * GIB, source="cgroup memory.max")
    plan = make_plan("tests.fakes:curve", sizes=(16, 32, 16384))
    clock = VirtualClock()
    messages: list[Message] = []
    backend = VirtualCurveBackend(BackendOptions(tf32=False, cpu_threads=1), clock=clock)
    run_plan(plan, backend, messages.append, clock, memory=limit)
    failures = [m for m in messages if isinstance(m, DeviceFailure)]
    refused = {(f.device, f.point.mode) for f in failures if f.point is not None and f.point.size == 16384}
    # The fake GPU's compute operands live in its own memory: only the host's limit is judged here.
    assert refused == {("/CPU:0", "compute"), ("/CPU:0", "end_to_end"), ("/GPU:0", "end_to_end")}
    assert all(not f.whole_device for f in failures)
    assert "n=16384 refused" in failures[0].reason
    assert "3.00 GiB (cgroup memory.max)" in failures[0].reason
    timed = {(m.key.device, m.key.size, m.key.mode) for m in messages if isinstance(m, Measurement)}
    assert {(d, n) for d, n, _ in timed} >= {("/CPU:0", 32), ("/GPU:0", 32)}
    assert ("/GPU:0", 16384, "compute") in timed
    assert not any(n == 16384 and (d, mode) in refused for d, n, mode in timed)
    assert refusal(16384, "float32", "compute", "cpu", None) is None


@dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup with a limit, made for one test; processes started through ``command`` run in it."""

    path: Path

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the cgroup (the shell joins it, then becomes ``argv``; its children stay in it)."""
        return ["sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"', "sh", *argv]


def _make_cgroup(name: str, limit: int) -> MemoryCgroup | str:
    """A child of this process's memory cgroup limited to ``limit`` bytes, swap off; or why none can be made here."""
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as exc:
        return f"cannot read /proc/self/cgroup: {exc}"
    fields = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    unified = next((path for number, controllers, path in fields if number == "0" and not controllers), None)
    v1 = next((path for _, controllers, path in fields if "memory" in controllers.split(",")), None)
    if (root / "cgroup.controllers").is_file() and unified is not None:
        parent = root / unified.lstrip("/")
        files = {"memory.max": str(limit), "memory.swap.max": "0"}
    elif v1 is not None and (root / "memory").is_dir():
        parent = root / "memory" / v1.lstrip("/")
        parent = parent if parent.is_dir() else root / "memory"
        files = {"memory.limit_in_bytes": str(limit), "memory.swappiness": "0"}
    else:
        return "no memory cgroup controller is mounted under /sys/fs/cgroup"
    path = parent / name
    try:
        path.mkdir()
        for file, value in files.items():
            if (path / file).exists():
                (path / file).write_text(value)
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.rmdir()
        return f"cannot make a memory cgroup under {parent} (root, and a delegated cgroup, are needed): {exc}"
    if not any((path / file).exists() for file in ("memory.max", "memory.limit_in_bytes")):
        path.rmdir()
        return f"no memory controller in {path}: enable it in {parent}/cgroup.subtree_control"
    return MemoryCgroup(path)


@pytest.fixture
def cgroup(request: pytest.FixtureRequest) -> Iterator[MemoryCgroup]:
    made = _make_cgroup(f"crossover-monitor-test-{request.node.name[:40]}-{time.monotonic_ns()}", CGROUP_LIMIT)
    if isinstance(made, str):
        pytest.skip(made)
    yield made
    for _ in range(50):  # the kernel empties it as the killed processes are reaped
        try:
            made.path.rmdir()
        except OSError:
            time.sleep(0.1)
        else:
            break


# A daemon's part of a sweep: run_sweep in a process of its own, inside the cgroup, the worker started from it.
SWEEP = """
import json, sys, threading
from crossover_monitor.service.sweep import run_sweep
from tests.conftest import make_plan
sizes = tuple(int(n) for n in sys.argv[2].split(","))
outcome = run_sweep(make_plan(sys.argv[1], sizes=sizes, modes=("compute",)), timeout_s=20, cancel=threading.Event())
snapshot = outcome.snapshot
failures = [[f.device, f.point.size if f.point else None, f.reason] for f in (snapshot.failures if snapshot else ())]
sizes = sorted({m.key.size for m in snapshot.measurements}) if snapshot else []
print(json.dumps({"result": outcome.result.value, "reason": outcome.reason, "failures": failures, "sizes": sizes}))
"""


def _sweep_in(cgroup: MemoryCgroup, backend: str, sizes: str) -> dict[str, object]:
    done = subprocess.run(
        cgroup.command(sys.executable, "-c", SWEEP, backend, sizes),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_worker_the_oom_killer_ends_is_reported_out_of_memory_naming_the_size(cgroup: MemoryCgroup) -> None:
    """Issue 51 N10: a worker OOM-killed in a 256 MiB cgroup at n=64 fails the sweep "out of memory" at n=64."""
    outcome = _sweep_in(cgroup, "tests.memoryfakes:greedy", "16,64")
    assert outcome["result"] == "failed"
    reason = str(outcome["reason"])
    assert reason.startswith("out of memory: the kernel's OOM killer killed the worker (SIGKILL, status -9)"), reason
    assert "while timing n=64 (64x64 float32 compute on /CPU:0)" in reason
    assert "256 MiB (cgroup memory." in reason


def test_a_sigkill_from_elsewhere_is_not_called_out_of_memory(cgroup: MemoryCgroup) -> None:
    """Issue 51 N10: a worker killed by someone else's SIGKILL at n=64 is named at n=64, not as out of memory."""
    reason = str(_sweep_in(cgroup, "tests.memoryfakes:killed", "16,64")["reason"])
    assert reason.startswith("the worker was killed by SIGKILL (status -9) while timing n=64"), reason
    assert "not by this service nor the OOM killer" in reason


def test_a_real_worker_refuses_sizes_its_cgroup_cannot_hold_and_times_the_rest(cgroup: MemoryCgroup) -> None:
    """Issue 51 N10: in a 256 MiB cgroup the worker refuses n=8192 (768 MiB of matrices), naming the limit."""
    outcome = _sweep_in(cgroup, "tests.fakes:cpu_only", "16,32,8192")
    assert outcome["result"] == "success", outcome["reason"]
    assert outcome["sizes"] == [1, 16, 32]
    failures = outcome["failures"]
    assert isinstance(failures, list)
    ((device, size, reason),) = failures
    assert (device, size) == ("/CPU:0", 8192)
    assert "n=8192 refused" in reason
    assert "768 MiB" in reason
    assert "256 MiB (cgroup memory." in reason


def test_check_config_warns_in_a_cgroup_too_small_for_a_size_and_still_passes(
    cgroup: MemoryCgroup, tmp_path: Path
) -> None:
    """Issue 51 N10: check-config says which size cannot fit the cgroup's limit, and exits 0 (a bigger host may)."""
    config = tmp_path / "config.yaml"
    config.write_text("benchmark:\n  sizes: [16, 8192]\n")
    done = subprocess.run(
        cgroup.command(sys.executable, "-m", "crossover_monitor", "check-config", str(config)),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "configuration is valid" in done.stdout
    assert "benchmark.sizes[1]: n=8192 float32: its matrices cannot fit" in done.stderr
    assert "256 MiB (cgroup memory." in done.stderr
