"""The interference guard: busy GPUs are never timed or published, disturbed CPU points are withheld.

The GPU side runs the real runner and sweep against a fake NVML (``FakeSampler``) whose answers are
scripted per look; the CPU side against a fake host meter, and once for real with another process
spinning on a core of this machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crossover_monitor.config.settings import GuardSettings, RefineSettings
from crossover_monitor.errors import EXIT_WITHHELD
from crossover_monitor.measure.common import cpu_device
from crossover_monitor.measure.guard.guard import (
    GpuProcess,
    GpuSample,
    GpuSampler,
    GuardUnavailable,
    HostLoad,
    JudgedPoint,
)
from crossover_monitor.measure.guard.podresources import PodResourcesUnavailable
from crossover_monitor.measure.guard.rule import DISTURBED_PAUSE_S
from crossover_monitor.measure.timing import BlockWatch
from crossover_monitor.model import (
    HOST_REFERENCE,
    HOST_REFERENCE_SPREAD,
    WORK_STEALING,
    CrossoverState,
    DeviceInfo,
    DeviceState,
    HardwareContext,
    HostReference,
    Measurement,
    PointKey,
    RangeTop,
    Snapshot,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.protocol import Environment, Message, Plan
from crossover_monitor.service.sweep import run_sweep
from tests.builders import point_key
from tests.conftest import make_plan
from tests.fakes import SPIN_FOR_A_MINUTE
from tests.guardfakes import (
    IDLE,
    JOB,
    OWN_PID,
    FailingSampler,
    FakeHost,
    FakeSampler,
    SlowedWhileTiming,
    ThreadWorker,
    fake_guard,
    run_guarded,
    sweep_with,
    timed_on,
    withheld_in,
)


def _hardware(messages: list[Message], device: str) -> HardwareContext:
    """The one hardware context the sweep recorded for ``device``."""
    (context,) = [m for m in messages if isinstance(m, HardwareContext) and m.device == device]
    return context


def test_gpu_with_another_process_is_withheld_and_never_touched() -> None:
    """A job already on the GPU: not one block runs there, and the reason names its process."""
    sampler = FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(GpuProcess(pid=OWN_PID), JOB)))
    backend, messages = run_guarded(fake_guard(sampler))
    (withheld,) = withheld_in(messages)
    assert withheld.device == "/GPU:0"
    assert withheld.reason is WithheldReason.GPU_BUSY
    assert "pid 4242 train.py" in withheld.detail
    assert "/GPU:0" not in backend.blocks
    assert timed_on(messages, "/CPU:0")  # the CPU is still measured


def test_gpu_busier_than_the_threshold_before_it_is_used_is_withheld() -> None:
    """Utilisation above gpu_max_utilization before the worker used the GPU means someone else is."""
    sampler = FakeSampler(lambda _: dataclasses.replace(IDLE, utilization_pct=87.0))
    backend, messages = run_guarded(fake_guard(sampler, gpu_max_utilization_pct=10))
    (withheld,) = withheld_in(messages)
    assert "87% utilisation" in withheld.detail
    assert "/GPU:0" not in backend.blocks


def test_own_utilisation_after_its_points_does_not_make_the_gpu_busy() -> None:
    """Once the worker has timed the GPU, utilisation is its own and is not held against it."""
    sampler = FakeSampler(lambda look: dataclasses.replace(IDLE, utilization_pct=0.0 if look == 1 else 100.0))
    _, messages = run_guarded(fake_guard(sampler))
    assert not withheld_in(messages)
    assert timed_on(messages, "/GPU:0")


def test_job_appearing_mid_sweep_stops_the_sweep_cpu_included() -> None:
    """A job that starts on a GPU mid-sweep: that GPU busy, and nothing more is timed at all (the CPU yields)."""
    # Looks alternate before/after each point: the job shows up at the look after the third point.
    sampler = FakeSampler(lambda look: IDLE if look <= 5 else dataclasses.replace(IDLE, processes=(JOB,)))
    _, messages = run_guarded(fake_guard(sampler))
    gpu, cpu = withheld_in(messages)
    assert (gpu.device, gpu.reason) == ("/GPU:0", WithheldReason.GPU_BUSY)
    assert "while it was timed" in gpu.detail
    assert (cpu.device, cpu.reason) == ("/CPU:0", WithheldReason.YIELDED)
    assert "job that started on /GPU:0" in cpu.detail
    assert len(timed_on(messages, "/GPU:0")) == 2  # the third point was timed but is not emitted
    assert sampler.looks == 6  # and the GPU is not looked at (or timed) again
    cpu_points = len(timed_on(messages, "/CPU:0"))
    assert messages.index(cpu) > max(i for i, m in enumerate(messages) if isinstance(m, Measurement))
    assert cpu_points == 3  # sizes 16, 32, 64 before the job; none after it


def test_a_job_arriving_after_a_gpus_points_were_withheld_alone_still_stops_the_sweep() -> None:
    """The host slowed every GPU point so far (each withheld alone), then a job appeared on the GPU: its points
    were timed clean of other jobs, so the job arrived mid-sweep and the CPU yields to it too."""
    backend = SlowedWhileTiming({("/GPU:0", 1), ("/GPU:0", 16)})
    sampler = FakeSampler(lambda look: IDLE if look <= 4 else dataclasses.replace(IDLE, processes=(JOB,)))
    guard = fake_guard(sampler, FakeHost([0.0]), reference=backend.reference, baseline=IDLE_REFERENCE)
    plan = make_plan("tests.fakes:curve", modes=("compute",))
    outcome = run_sweep(plan, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard, backend))
    snapshot = outcome.snapshot
    assert snapshot is not None
    whole = {w.device: w.reason for w in snapshot.withheld if w.whole_device}
    assert whole == {"/GPU:0": WithheldReason.GPU_BUSY, "/CPU:0": WithheldReason.YIELDED}


def test_a_withheld_gpu_publishes_no_point_and_no_crossover_from_its_sweep() -> None:
    """Points timed before the job appeared are dropped too; the crossover says withheld, not a number."""
    _, outcome = sweep_with(lambda look: IDLE if look <= 4 else dataclasses.replace(IDLE, processes=(JOB,)))
    snapshot = outcome.snapshot
    assert snapshot is not None
    # Busy is not a failure, but a sweep that measured nothing is no success either: it says what it withheld.
    assert outcome.result is SweepResult.WITHHELD
    assert outcome.reason.startswith("nothing measured: /GPU:0 withheld (gpu_busy)"), outcome.reason
    assert "/CPU:0 withheld (yielded)" in outcome.reason
    assert not snapshot.measurements  # the CPU yielded to the job as well
    assert {c.state for c in snapshot.crossovers} == {CrossoverState.WITHHELD}
    assert snapshot.withheld_devices == {"/GPU:0", "/CPU:0"}
    assert not snapshot.hardware


def test_a_gpu_busy_from_the_start_does_not_stop_the_cpu() -> None:
    """A job that was there before the sweep began is no reason to stop: the CPU and other GPUs go on."""
    _, outcome = sweep_with(lambda _: dataclasses.replace(IDLE, processes=(JOB,)))
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert {m.key.device for m in snapshot.measurements} == {"/CPU:0"}
    assert snapshot.withheld_devices == {"/GPU:0"}
    assert outcome.result is SweepResult.PARTIAL
    assert outcome.reason.startswith("measured /CPU:0; /GPU:0 withheld (gpu_busy): 1 other process"), outcome.reason


@pytest.mark.parametrize("sampler", [None, FailingSampler()], ids=["nvml-missing", "nvml-failing"])
def test_without_nvml_the_gpu_is_withheld_as_unguarded_with_the_way_out(sampler: GpuSampler | None) -> None:
    """NVML missing or failing: a clear state and reason, never a crash and never an unguarded timing."""
    backend, messages = run_guarded(fake_guard(sampler))
    (withheld,) = withheld_in(messages)
    assert withheld.reason is WithheldReason.UNGUARDED
    assert "guard.require_nvml: false" in withheld.detail
    assert "/GPU:0" not in backend.blocks


def test_require_nvml_false_times_gpus_unguarded() -> None:
    """The operator's explicit choice: without NVML the GPU is timed anyway."""
    _, messages = run_guarded(fake_guard(None, require_nvml=False))
    assert not withheld_in(messages)
    assert timed_on(messages, "/GPU:0")


def test_in_another_pid_namespace_one_hidden_process_is_the_workers_own() -> None:
    """NVML's host PIDs are not in a container's /proc: one hidden process is the worker's, a second is a job."""
    own = GpuProcess(pid=77001, visible=False)
    job = GpuProcess(pid=77002, visible=False)
    _, alone = run_guarded(fake_guard(FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(own,)))))
    assert not withheld_in(alone)
    _, shared = run_guarded(fake_guard(FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(own, job)))))
    assert withheld_in(shared)


def test_under_kubernetes_a_busy_gpu_names_the_pod_the_kubelet_gave_it() -> None:
    """With no hostPID the job's processes are nameless host PIDs; the kubelet's allocations name its pod."""
    own, job = GpuProcess(pid=77001, visible=False), GpuProcess(pid=77002, visible=False)
    asked: list[str] = []

    def pods(uuid: str) -> list[str]:
        asked.append(uuid)
        return ["ml/train-7"] if uuid == "GPU-fake-/GPU:0" else []

    def kubelet_down(uuid: str) -> list[str]:
        raise PodResourcesUnavailable("the kubelet's pod-resources API at /x.sock: StatusCode.UNAVAILABLE")

    def busy() -> FakeSampler:
        return FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(own, job)))

    (withheld, *_) = withheld_in(run_guarded(fake_guard(busy(), pods=pods))[1])
    assert withheld.detail.endswith("; allocated to pod ml/train-7")
    assert asked[0] == "GPU-fake-/GPU:0"
    (withheld, *_) = withheld_in(run_guarded(fake_guard(busy(), pods=kubelet_down))[1])
    assert withheld.detail.endswith(
        "; which pod holds it is unknown (the kubelet's pod-resources API at /x.sock: StatusCode.UNAVAILABLE)"
    )
    (withheld, *_) = withheld_in(run_guarded(fake_guard(busy(), pods=lambda _: []))[1])
    assert withheld.detail.endswith(
        "; no pod's allocation names GPU-fake-/GPU:0 (a process outside the device plugin's, or MIG or index ids)"
    )
    # Not under Kubernetes: the detail is as before, with no word of pods.
    (withheld, *_) = withheld_in(run_guarded(fake_guard(busy()))[1])
    assert "pod" not in withheld.detail


def test_a_hidden_process_beside_the_workers_own_pid_counts() -> None:
    """Where the worker finds itself, a process hidden from its /proc (systemd ProtectProc) is another program."""
    hidden_job = GpuProcess(pid=77002, visible=False)
    _, messages = run_guarded(
        fake_guard(FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(GpuProcess(pid=OWN_PID), hidden_job))))
    )
    assert withheld_in(messages)


def test_the_gpu_context_records_the_most_memory_the_workers_own_process_held() -> None:
    """The worker's own context as NVML lists it after each point (not before: 9 GiB there must not count), by
    its PID or, in a PID namespace apart, as the one hidden process; unknown where it cannot be told apart."""

    def own(memory: int) -> GpuProcess:
        return GpuProcess(pid=OWN_PID, used_memory_bytes=memory)

    # Odd looks come before a point, even looks after it; the third point's look after says 600 MiB.
    after = {2: 300 * 2**20, 4: 400 * 2**20, 6: 600 * 2**20}
    sampler = FakeSampler(
        lambda look: dataclasses.replace(IDLE, processes=(own(after.get(look, 9 * 2**30 if look % 2 else 2**20)),))
    )
    _, messages = run_guarded(fake_guard(sampler))
    assert sampler.looks >= 6
    assert _hardware(messages, "/GPU:0").worker_gpu_memory_max_bytes == 600 * 2**20

    def apart(*processes: GpuProcess) -> int | None:
        sampler = FakeSampler(lambda _: dataclasses.replace(IDLE, processes=processes))
        return _hardware(run_guarded(fake_guard(sampler, require_nvml=False))[1], "/GPU:0").worker_gpu_memory_max_bytes

    assert apart(GpuProcess(pid=9, visible=False, used_memory_bytes=600 * 2**20)) == 600 * 2**20
    # Two hidden (the worker's and another container's leftover): which is which is not known, so nothing.
    leftover = GpuProcess(pid=8, visible=False, used_memory_bytes=40 * 2**20, sm_utilization_pct=0.0)  # idle: ignored
    assert apart(GpuProcess(pid=9, visible=False, used_memory_bytes=5 * 2**20), leftover) is None
    assert apart() is None


def test_hardware_context_records_the_lowest_clock_and_every_throttle_reason() -> None:
    """What the GPU looked like while it was timed: min SM clock, clock events, PCIe link."""

    def script(look: int) -> GpuSample:
        slow = look == 4  # the look after the second point
        return dataclasses.replace(
            IDLE,
            sm_clock_hz=1.2e9 if slow else 1.98e9,
            sm_clock_max_hz=1.98e9,
            clock_events=("sw_thermal_slowdown",) if slow else (),
            pcie_generation=4 if slow else 5,
            pcie_generation_max=5,
            pcie_width=16,
            pcie_width_max=16,
        )

    _, messages = run_guarded(fake_guard(FakeSampler(script)))
    gpu = _hardware(messages, "/GPU:0")
    assert gpu.sm_clock_min_hz == 1.2e9
    assert gpu.clock_events == ("sw_thermal_slowdown",)
    assert (gpu.pcie_generation_min, gpu.pcie_generation_max) == (4, 5)


def test_time_held_back_by_a_limit_counts_over_the_points_only() -> None:
    """NVML's power-limit total: what it grew by during a point counts (however brief), between points not."""
    totals = {1: 100.0, 2: 100.0, 3: 105.0}  # 5 s held back between the first two points: not while timed

    def script(look: int) -> GpuSample:
        held = totals.get(look, 105.25)  # the second point (looks 3 and 4) ran held back for 0.25 s
        return dataclasses.replace(IDLE, power_limited_s=held, read_at_s=float(look))  # each point lasts 1 s

    sampler = FakeSampler(script)
    _, messages = run_guarded(fake_guard(sampler))
    gpu = _hardware(messages, "/GPU:0")
    points = sampler.looks // 2  # a look before and one after each point
    assert points >= 2
    assert gpu.power_limited_ratio == pytest.approx(0.25 / points)
    assert gpu.thermal_limited_ratio is None  # never read: unknown, not 0


def test_a_failed_look_never_pairs_a_points_start_with_another_points_end() -> None:
    """NVML failing after one point and before the next (require_nvml off): neither point is counted."""
    totals = {1: 0.0, 3: 5.0, 4: 5.0}  # looks 2 and 3 fail; 5 s held back between the points

    def script(look: int) -> GpuSample:
        if look in (2, 3):
            raise GuardUnavailable("NVML_ERROR_UNKNOWN (injected)")
        return dataclasses.replace(IDLE, power_limited_s=totals.get(look, 5.0), read_at_s=float(look))

    _, messages = run_guarded(fake_guard(FakeSampler(script), require_nvml=False))
    gpu = _hardware(messages, "/GPU:0")
    assert gpu.power_limited_ratio == 0.0  # the points from look 4 on ran clean; looks 1 and 4 never paired


def test_cpu_point_disturbed_twice_is_withheld_with_the_load_seen() -> None:
    """Others used a core the worker's threads needed, in the first try and when timed again: withheld."""
    host = FakeHost([1.0], cores=4)
    guard = fake_guard(FakeSampler(lambda _: IDLE), host)
    device = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    runs: list[int] = []
    verdict = guard.time_cpu_point(device, 4, lambda _: runs.append(1))
    assert verdict is not None
    assert verdict.reason is WithheldReason.CPU_CONTENDED
    assert "1.00 cores" in verdict.detail
    assert len(runs) == 2


def test_cpu_point_disturbed_once_stands_once_timed_again() -> None:
    """A burst that passed: timed again, it was clean, so the point stands."""
    guard = fake_guard(None, FakeHost([1.0, 0.0]))
    device = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    assert guard.time_cpu_point(device, 4, lambda _: None) is None
    assert DISTURBED_PAUSE_S > 0


def test_others_may_use_the_cores_the_worker_leaves_free() -> None:
    """With 2 threads on 4 cores, another process on one core disturbs nothing."""
    guard = fake_guard(None, FakeHost([1.2], cores=4))
    device = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    assert guard.time_cpu_point(device, 2, lambda _: None) is None


def _five_blocks(watch: BlockWatch | None) -> None:
    """A CPU point of five timed blocks, each asked of the guard's block watch as measure() asks it."""
    assert watch is not None
    for _ in range(5):
        watch.disturbed(watch.mark())


def test_blocks_its_threads_waited_in_are_set_aside_and_the_share_recorded() -> None:
    """Blocks over which the worker's threads waited more than cpu_max_threads_wait cores are set aside: the point
    stands on the others (three are enough) and the CPU's context says what share of its blocks went."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    guard = fake_guard(None, FakeHost([0.0], block_waits=[0.01, 0.3, 0.02, 0.25, 0.05]))
    assert guard.time_cpu_point(cpu, 3, _five_blocks) is None
    (context,) = guard.contexts([cpu])
    assert context.cpu_blocks_set_aside_ratio == pytest.approx(2 / 5)
    # Unknown wait (no schedstat) sets nothing aside; a large cpu_max_threads_wait turns the check off.
    for relaxed in (FakeHost([0.0]), FakeHost([0.0], block_waits=[0.5])):
        guard = fake_guard(None, relaxed, cpu_max_threads_wait=100 if relaxed.block_waits != [None] else 0.1)
        assert guard.time_cpu_point(cpu, 3, _five_blocks) is None
        assert guard.contexts([cpu])[0].cpu_blocks_set_aside_ratio == 0.0
    # Threads on every core (and the one timing them beside): they wait for each other, no watch is given.
    given: list[BlockWatch | None] = []
    guard = fake_guard(None, FakeHost([0.0], cores=4, block_waits=[0.5]))
    assert guard.time_cpu_point(cpu, 4, given.append) is None
    assert given == [None]


def test_blocks_of_a_work_stealing_pool_of_several_threads_are_not_set_aside_for_a_waiting_thread() -> None:
    """TensorFlow's CPU (its pool takes a waiting thread's share, so the wait costs the call nothing): no block
    watch, however long its threads waited; a fork-join pool (PyTorch, or a backend that does not say) has one,
    and so has a work-stealing pool of one thread (no other thread to take its share)."""
    stealing = cpu_device("tensorflow", "/CPU:0", 3, thread_pool=WORK_STEALING)
    given: list[BlockWatch | None] = []
    guard = fake_guard(None, FakeHost([0.0], block_waits=[0.5] * 5))
    assert guard.time_cpu_point(stealing, 3, given.append) is None
    assert given == [None]
    alone = cpu_device("tensorflow", "/CPU:0", 1, thread_pool=WORK_STEALING)
    for device, threads in (
        (cpu_device("torch", "cpu", 3), 3),
        (DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="c"), 3),
        (alone, 1),
    ):
        guard = fake_guard(None, FakeHost([0.0], block_waits=[0.5] * 10))
        verdict = guard.time_cpu_point(device, threads, _five_blocks)
        assert verdict is not None, device
        assert verdict.reason is WithheldReason.CPU_CONTENDED
        assert "its threads waited for a CPU in 5 of its 5 timed blocks" in verdict.detail
    # One thread on the one core it may use: it waits for the thread timing it, no neighbour's sign.
    given.clear()
    guard = fake_guard(None, FakeHost([0.0], cores=1, block_waits=[0.5] * 5))
    assert guard.time_cpu_point(alone, 1, given.append) is None
    assert given == [None]


def test_a_cpu_point_left_with_too_few_undisturbed_blocks_is_withheld_saying_why() -> None:
    """Threads waiting through most blocks of both tries: cpu_contended, naming the blocks and the wait."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    guard = fake_guard(None, FakeHost([0.0], block_waits=[0.4, 0.3, 0.0, 0.2, 0.35] * 2))
    verdict = guard.time_cpu_point(cpu, 3, _five_blocks)
    assert verdict is not None
    assert verdict.reason is WithheldReason.CPU_CONTENDED
    assert "its threads waited for a CPU in 4 of its 5 timed blocks (up to 0.40 cores, allowed 0.10" in verdict.detail
    assert verdict.detail.endswith("(timed twice)")
    # A burst that passed before the second try: it stands.
    guard = fake_guard(None, FakeHost([0.0], block_waits=[0.4] * 5 + [0.0]))
    assert guard.time_cpu_point(cpu, 3, _five_blocks) is None


def test_gpu_point_whose_host_side_waited_for_a_cpu_is_withheld() -> None:
    """Its time includes the wait: timed again once, then withheld as cpu_contended; the CPU goes on."""
    host = FakeHost([0.0], waits=[0.3])
    backend, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE), host))
    (gpu,) = withheld_in(messages)
    assert (gpu.device, gpu.reason) == ("/GPU:0", WithheldReason.CPU_CONTENDED)
    assert "waited for a CPU 30.0% of the time its point ran" in gpu.detail
    assert "(timed twice)" in gpu.detail
    assert not timed_on(messages, "/GPU:0")
    assert len(timed_on(messages, "/CPU:0")) == 5  # the CPU's own criterion is others' load, and there was none
    assert backend.blocks["/GPU:0"] > 0


def test_gpu_point_that_waited_once_stands_once_timed_again_and_unknown_wait_is_no_reason() -> None:
    """A burst that passed: clean when timed again. A kernel without schedstat: nothing to go on, nothing withheld."""
    # Windows: CPU n=1, GPU n=1 (waited), timed again (clean), CPU n=2, GPU n=2 (1%), then clean.
    _, messages = run_guarded(
        fake_guard(FakeSampler(lambda _: IDLE), FakeHost([0.0], waits=[0.0, 0.3, 0.0, 0.0, 0.01, 0.0]))
    )
    assert not withheld_in(messages)
    assert len(timed_on(messages, "/GPU:0")) == 5
    assert _hardware(messages, "/GPU:0").host_wait_ratio == 0.01  # the most over the tries that count
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE), FakeHost([0.0], waits=[None])))
    assert not withheld_in(messages)
    assert _hardware(messages, "/GPU:0").host_wait_ratio is None  # unknown, not 0


def test_quota_throttling_of_every_try_is_counted_and_a_throttled_point_timed_again() -> None:
    """Throttled 0.5 s of its first second: timed again (0.01 s, under 2%), and both tries' throttling is kept."""
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE), FakeHost([0.0], throttled=[0.5, 0.01, 0.0])))
    assert not withheld_in(messages)
    assert _hardware(messages, "/CPU:0").cpu_throttled_s == pytest.approx(0.51)


def test_without_nvml_a_gpu_publishes_its_host_wait_and_nothing_else() -> None:
    """require_nvml off and no NVML: the GPU's context holds the schedstat wait; NVML's fields stay unknown, not 0."""
    _, messages = run_guarded(fake_guard(None, FakeHost([0.0], waits=[0.0, 0.01]), require_nvml=False))
    gpu = _hardware(messages, "/GPU:0")
    assert gpu.host_wait_ratio == 0.01
    assert gpu.other_processes_max is None
    assert (gpu.sm_clock_min_hz, gpu.power_limited_ratio, gpu.clock_events) == (None, None, ())


def test_a_job_arriving_outranks_a_busy_host_and_stops_the_sweep() -> None:
    """Both at once at a GPU point: the job's arrival decides (busy, the rest yielded), not the host's load."""
    sampler = FakeSampler(lambda look: IDLE if look <= 5 else dataclasses.replace(IDLE, processes=(JOB,)))
    host = FakeHost([0.0], waits=[0.0, 0.0, 0.0, 0.0, 0.0, 0.3])  # the third GPU point's windows waited
    _, messages = run_guarded(fake_guard(sampler, host))
    gpu, cpu = withheld_in(messages)
    assert (gpu.reason, cpu.reason) == (WithheldReason.GPU_BUSY, WithheldReason.YIELDED)


def _wait_until_spinning(spinners: list[subprocess.Popen[bytes]], timeout_s: float = 20.0) -> None:
    """Until every spinner has spent CPU time in its loop: under load an interpreter may take seconds to start."""
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spent = [int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[11]) for p in spinners]
        if all(t >= ticks // 10 for t in spent):  # 0.1 s of user time each: past start-up, spinning
            return
        time.sleep(0.1)
    raise AssertionError(f"the spinners did not start spinning within {timeout_s:g}s")


def test_gpu_point_starved_of_cpus_by_other_processes_is_withheld_for_real() -> None:
    """The real worker (a fake GPU that spins its thread), idle and then beside twice as many spinners as cores."""
    plan = dataclasses.replace(
        make_plan("tests.fakes:curve", sizes=(16, 32), modes=("compute",)), guard=GuardSettings(require_nvml=False)
    )

    def sweep() -> SweepOutcome:
        outcome = run_sweep(plan, timeout_s=120, cancel=threading.Event())
        assert outcome.snapshot is not None, outcome.reason
        return outcome

    idle = sweep().snapshot
    assert idle is not None
    idle_gpu = next((w for w in idle.withheld if w.device == "/GPU:0" and w.whole_device), None)
    if idle_gpu is not None:
        # Others' work kept this machine busy (a CI runner, a colleague's build): no idle control this time.
        # Withheld for that is right (its thread waited, or the host reference read slow); anything else is not.
        # The test goes on to what it is about, and says so.
        assert idle_gpu.reason in {WithheldReason.CPU_CONTENDED, WithheldReason.HOST_SLOWED}, idle_gpu
        warnings.warn(f"no idle control, the machine was busy: {idle_gpu.detail}", stacklevel=1)
    # Each in its own session, as other programs on a node are: the kernel shares CPU time between sessions
    # (autogroups) or services (cgroups) first, so spinners sharing the test's session would barely touch the worker.
    spinners: list[subprocess.Popen[bytes]] = []
    try:
        spinners.extend(
            subprocess.Popen([sys.executable, "-c", SPIN_FOR_A_MINUTE], start_new_session=True)
            for _ in range(2 * len(os.sched_getaffinity(0)))
        )
        _wait_until_spinning(spinners)
        busy = sweep().snapshot
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert busy is not None
    (gpu,) = [w for w in busy.withheld if w.device == "/GPU:0" and w.whole_device]
    assert gpu.reason is WithheldReason.CPU_CONTENDED
    assert "waited for a CPU" in gpu.detail
    assert not [m for m in busy.measurements if m.key.device == "/GPU:0"]


def test_the_most_steal_seen_over_the_cpus_points_is_recorded() -> None:
    """The CPU's hardware context carries the most steal of any of its points beside the load it is part of."""

    class StealingHost(FakeHost):
        def stop(self, started: object) -> HostLoad:
            load = super().stop(started)
            return dataclasses.replace(load, steal_cores=load.other_cores / 2)

    # Windows alternate CPU point, GPU point (n = 1, then each size); a GPU point's window counts for no CPU figure.
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE), StealingHost([0.1, 2.0, 0.6, 0.0, 0.2])))
    cpu = _hardware(messages, "/CPU:0")
    assert (cpu.other_cpu_cores, cpu.cpu_steal_cores) == (0.6, 0.3)
    # A first try disturbed beyond the limit and timed again: only the second try's load and steal count.
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE), StealingHost([0.1, 0.0, 3.0, 0.2], cores=1)))
    cpu = _hardware(messages, "/CPU:0")
    assert (cpu.other_cpu_cores, cpu.cpu_steal_cores) == (0.2, 0.1)


@pytest.mark.slow
def test_cpu_timed_beside_a_spinning_process_is_right_or_withheld(tmp_path: Path) -> None:
    """The real worker with another process spinning on a core: each CPU point is within 10% of idle, or withheld."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "benchmark: {backend: torch, devices: [cpu], sizes: [128, 256], modes: [compute], refine: {enabled: false}}\n"
    )

    def once() -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "crossover_monitor", "once", "--json", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode in {0, EXIT_WITHHELD}, done.stderr[-2000:]
        return json.loads(done.stdout)["snapshot"]

    def medians(snapshot: dict[str, Any]) -> dict[int, float]:
        return {m["key"]["size"]: m["timing"]["median_s"] for m in snapshot["measurements"] if m["role"] == "sweep"}

    # The baseline is what this machine gives now: where its own load has the guard withhold it, try again.
    idle: dict[int, float] = {}
    for _ in range(3):
        idle = medians(once())
        if idle:
            break
    spinner = subprocess.Popen([sys.executable, "-c", SPIN_FOR_A_MINUTE, str(min(os.sched_getaffinity(0)))])
    try:
        busy = once()
    finally:
        spinner.kill()
        spinner.wait()
    withheld = [w for w in busy["withheld"] if w["device"] == "cpu" and w["point"] is None]
    slowed = {w["point"]["size"] for w in busy["withheld"] if w["device"] == "cpu" and w["point"] is not None}
    if not idle:  # a machine too busy for an idle baseline (a loaded CI runner): with more load, still withheld
        assert withheld or slowed, "the guard withheld three sweeps without the spinner, and published one beside it"
    if withheld:
        assert withheld[0]["reason"] == "cpu_contended"
        assert not medians(busy)
        return
    assert not slowed & set(medians(busy)), "a point withheld alone was published"
    for size, seconds in medians(busy).items():
        assert abs(seconds / idle[size] - 1) <= 0.10, (size, seconds, idle[size])
    assert os.cpu_count()


@pytest.mark.parametrize(
    ("memory_mib", "sm_pct", "busy"),
    [(500, 0.0, False), (4096, 0.0, True), (500, 30.0, True), (500, None, True), (None, 0.0, True)],
    ids=["stray-context", "idle-job-holding-memory", "running-kernels", "no-samples", "memory-unknown"],
)
def test_only_an_idle_small_context_of_another_program_is_ignored(
    memory_mib: int | None, sm_pct: float | None, *, busy: bool
) -> None:
    """A framework's stray context on GPU 0 is no job; idle memory-holding jobs and unknowns still count."""
    other = GpuProcess(
        pid=4242,
        used_memory_bytes=memory_mib * 2**20 if memory_mib is not None else None,
        sm_utilization_pct=sm_pct,
    )
    _, messages = run_guarded(
        fake_guard(FakeSampler(lambda _: dataclasses.replace(IDLE, processes=(GpuProcess(pid=OWN_PID), other))))
    )
    assert bool(withheld_in(messages)) is busy


def test_in_a_pid_namespace_a_job_seen_only_after_the_first_point_withholds_that_gpu_alone() -> None:
    """Container without hostPID: the job passes for the worker's own context until the worker's joins it;
    then the GPU is withheld, but the sweep does not stop (the job was there first)."""
    own = GpuProcess(pid=77001, visible=False, used_memory_bytes=500 * 2**20)
    job = GpuProcess(pid=77002, visible=False, used_memory_bytes=20 * 2**30, sm_utilization_pct=95.0)
    sampler = FakeSampler(lambda look: dataclasses.replace(IDLE, processes=(job,) if look == 1 else (own, job)))
    _, messages = run_guarded(fake_guard(sampler))
    (withheld,) = withheld_in(messages)
    assert (withheld.device, withheld.reason) == ("/GPU:0", WithheldReason.GPU_BUSY)
    assert not timed_on(messages, "/GPU:0")
    assert {m.key.size for m in timed_on(messages, "/CPU:0")} == {1, 16, 32, 64, 128}


def test_the_driver_names_each_gpu_for_other_exporters_and_a_lost_nvml_names_none() -> None:
    """NVML's UUID and PCI bus id go into the GPU's details (the CPU gets none); without NVML, nothing is made up."""
    _, messages = run_guarded(fake_guard(FakeSampler(lambda _: IDLE)))
    devices = {m.device: dict(m.details) for m in messages if isinstance(m, DeviceInfo)}
    assert devices["/GPU:0"]["uuid"] == "GPU-fake-/GPU:0"
    assert devices["/GPU:0"]["pci_bus_id"] == "00000000:18:00.0"
    assert "uuid" not in devices["/CPU:0"]
    _, messages = run_guarded(fake_guard(FailingSampler()))
    devices = {m.device: dict(m.details) for m in messages if isinstance(m, DeviceInfo)}
    assert "uuid" not in devices["/GPU:0"]
    assert "pci_bus_id" not in devices["/GPU:0"]


def _readings(values: list[float]) -> Callable[[], float]:
    """A host reference that reads ``values`` in turn (the last repeats)."""
    taken = iter(values)
    last = [values[-1]]

    def read() -> float:
        last[0] = next(taken, last[0])
        return last[0]

    return read


IDLE_REFERENCE = HostReference(median_s=1e-3, spread=0.02)


def test_a_point_the_slowed_host_moved_is_timed_again_then_withheld_as_host_slowed() -> None:
    """The reference read 1.5x its idle figure before and after the CPU's first point, and again when timed again:
    the CPU is withheld naming the slowdown; the GPU's point, timed with the host back at its figure, stands."""
    guard = fake_guard(None, FakeHost([0.0]), reference=_readings([1.5e-3] * 4 + [1e-3]), baseline=IDLE_REFERENCE)
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    verdict = guard.time_cpu_point(cpu, 1, lambda _: None)
    assert verdict is not None
    assert verdict.reason is WithheldReason.HOST_SLOWED
    assert verdict.detail.startswith("the host ran 1.50x slower than its idle reference while it was timed (1.5 ms")
    assert "by about 50% (allowed 10%) (timed twice)" in verdict.detail
    gpu = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
    assert guard.time_gpu_point(gpu, lambda: None) is None
    reference = guard.host_reference
    assert reference is not None
    assert reference.median_s == pytest.approx(1.5e-3)  # the median of its six readings, four of them slowed


def test_a_sweeps_reference_spread_is_read_from_its_lower_half() -> None:
    """A stretch of slowed readings (the last four of ten at 1.6x) does not widen the spread the sweep hands
    the next ones: only the readings at and below the median say how much the reference moves on its own."""
    readings = [1.0e-3, 1.02e-3, 0.98e-3, 1.01e-3, 0.99e-3, 1.0e-3] + [1.6e-3] * 4
    guard = fake_guard(None, FakeHost([0.0]), reference=_readings(readings), reference_max_slowdown=100)
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    for _ in range(5):
        assert guard.time_cpu_point(cpu, 1, lambda _: None) is None
    reference = guard.host_reference
    assert reference is not None
    assert reference.spread < 0.05  # the whole IQR would say 0.6


def test_a_compute_point_is_judged_by_its_host_share_and_a_burst_that_passed_lets_it_stand() -> None:
    """A 1.5x slower host moves a GPU point whose host share is 10% by 5%: it stands. A slowdown only on the
    first try passes once timed again."""
    gpu = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
    steady = fake_guard(None, FakeHost([0.0]), reference=_readings([1.5e-3]), baseline=IDLE_REFERENCE)
    assert steady.time_gpu_point(gpu, lambda: None, lambda: 0.1) is None
    burst = fake_guard(None, FakeHost([0.0]), reference=_readings([1e-3, 2e-3, 1e-3]), baseline=IDLE_REFERENCE)
    assert burst.time_gpu_point(gpu, lambda: None) is None


def test_a_noisy_reference_widens_what_is_allowed_and_without_a_baseline_a_sweep_judges_itself() -> None:
    """Where the idle readings spread by 10% (relative IQR), a 1.18x reading is within twice that; a spread
    of 20% widens the allowance to 25% at most, not 40%: a 1.3x reading is withheld. Without an idle
    baseline the first readings judge nothing, and later ones are held against the sweep's own median."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    for spread, reading, stands in ((0.1, 1.18e-3, True), (0.2, 1.2e-3, True), (0.2, 1.3e-3, False)):
        noisy = fake_guard(
            None, FakeHost([0.0]), reference=_readings([reading]), baseline=HostReference(median_s=1e-3, spread=spread)
        )
        assert (noisy.time_cpu_point(cpu, 1, lambda _: None) is None) is stands, (spread, reading)
    own = fake_guard(None, FakeHost([0.0]), reference=_readings([1e-3] * 8 + [1.6e-3]))
    assert own.time_cpu_point(cpu, 1, lambda _: None) is None  # two readings: too few to judge
    for _ in range(3):
        assert own.time_cpu_point(cpu, 1, lambda _: None) is None
    verdict = own.time_cpu_point(cpu, 1, lambda _: None)
    assert verdict is not None
    assert verdict.reason is WithheldReason.HOST_SLOWED


def test_the_host_check_off_or_the_guard_off_reads_nothing() -> None:
    """reference_max_slowdown large: nothing is withheld; the guard off: the reference is never read."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    relaxed = fake_guard(
        None, FakeHost([0.0]), reference=_readings([5e-3]), baseline=IDLE_REFERENCE, reference_max_slowdown=100
    )
    assert relaxed.time_cpu_point(cpu, 1, lambda _: None) is None
    calls: list[float] = []

    def counted() -> float:
        calls.append(1e-3)
        return 1e-3

    off = fake_guard(None, FakeHost([0.0]), reference=counted, enabled=False)
    assert off.time_cpu_point(cpu, 1, lambda _: None) is None
    assert calls == []


def test_a_sweep_on_a_host_slowed_from_its_middle_withholds_what_was_slowed_and_reports_its_reference() -> None:
    """The real runner: the reference reads 1 ms for the first points, then 2 ms (a neighbour started): the device
    being timed then is withheld host_slowed, the run reports the sweep's reference readings for the daemon's
    baseline, and the hardware record names the slowdown of what stood."""
    readings = [1e-3] * 6 + [2e-3]
    guard = fake_guard(
        FakeSampler(lambda _: IDLE), FakeHost([0.0]), reference=_readings(readings), baseline=IDLE_REFERENCE
    )
    _, messages = run_guarded(guard)
    withheld = withheld_in(messages)
    assert withheld, "a 2x slower host was published as normal"
    assert {w.reason for w in withheld} == {WithheldReason.HOST_SLOWED}
    assert "the host ran 2.00x slower than its idle reference" in withheld[0].detail
    environment: dict[str, str] = {}
    for message in messages:
        if isinstance(message, Environment):
            environment |= message.values
    assert float(environment[HOST_REFERENCE]) == pytest.approx(2e-3)  # most of its readings were slowed
    assert float(environment[HOST_REFERENCE_SPREAD]) >= 0


def _slowed_sweep(slowed: set[tuple[str, int]] | SlowedWhileTiming, plan: Plan | None = None) -> SweepOutcome:
    """A sweep of the known curves (compute; the GPU wins from n = 64) whose host ran 2x slower while the
    ``slowed`` points were timed."""
    backend = slowed if isinstance(slowed, SlowedWhileTiming) else SlowedWhileTiming(slowed)
    guard = fake_guard(
        FakeSampler(lambda _: IDLE), FakeHost([0.0]), reference=backend.reference, baseline=IDLE_REFERENCE
    )
    plan = plan or make_plan("tests.fakes:curve", modes=("compute",))
    return run_sweep(plan, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard, backend))


def test_a_point_the_slowed_host_moved_is_withheld_alone_and_its_device_goes_on() -> None:
    """The host slowed while the GPU's n = 128 point was timed: that point is withheld (timed twice) and named,
    the GPU's other points are published, the device stays measured (not withheld, not retried), and the
    crossover, which the gap at the end cannot move (the GPU already wins at 64), stands."""
    outcome = _slowed_sweep({("/GPU:0", 128)})
    snapshot = outcome.snapshot
    assert snapshot is not None
    (point,) = snapshot.withheld
    assert point.point is not None
    assert (point.point.device, point.point.size) == ("/GPU:0", 128)
    assert point.reason is WithheldReason.HOST_SLOWED
    assert "the host ran 2.00x slower" in point.detail
    assert point.detail.endswith("(timed twice)")
    gpu_sizes = {m.key.size for m in snapshot.measurements if m.key.device == "/GPU:0" and m.role == "sweep"}
    assert gpu_sizes == {16, 32, 64}
    assert snapshot.withheld_devices == frozenset()
    assert snapshot.device_state("/GPU:0")[0] is DeviceState.MEASURED
    assert snapshot.devices_to_retry == ()
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.FOUND
    assert crossover.lower == 32
    assert crossover.upper == 64
    assert outcome.result is SweepResult.PARTIAL
    assert "/GPU:0: 1 point(s) withheld (host_slowed: 128x128 float32 compute)" in outcome.reason


def test_a_gap_where_the_lead_changes_withholds_the_crossover_not_the_curve() -> None:
    """Slowed over the CPU's n = 64 point, inside the change of lead (the CPU wins at 32, the GPU at 64 and
    up): the crossover is withheld, never derived across the gap, and every other point is published."""
    outcome = _slowed_sweep({("/CPU:0", 64)})
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert [w.subject for w in snapshot.withheld] == ["/CPU:0 64x64 float32 compute"]
    cpu_sizes = {m.key.size for m in snapshot.measurements if m.key.device == "/CPU:0" and m.role == "sweep"}
    assert cpu_sizes == {16, 32, 128}
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.WITHHELD


def test_the_fixed_cost_point_withheld_alone_moves_no_crossover() -> None:
    """The n = 1 fixed-cost point (not a configured size) slowed on the GPU: withheld and named, and the
    crossover of the configured sizes stands."""
    outcome = _slowed_sweep({("/GPU:0", 1)})
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert [w.subject for w in snapshot.withheld] == ["/GPU:0 1x1 float32 compute"]
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.FOUND


def test_a_pair_with_a_device_withheld_whole_and_a_point_withheld_alone_has_one_crossover() -> None:
    """Others' load withholds the CPU whole while the host slowed the GPU's n = 32 point: the pair's crossover is
    withheld once (two series of one name and labels would make the scrape invalid)."""
    backend = SlowedWhileTiming({("/GPU:0", 32)})
    guard = fake_guard(
        FakeSampler(lambda _: IDLE), FakeHost([5.0]), reference=backend.reference, baseline=IDLE_REFERENCE
    )
    plan = make_plan("tests.fakes:curve", modes=("compute",))
    outcome = run_sweep(plan, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard, backend))
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert {(w.subject, w.reason) for w in snapshot.withheld} == {
        ("/CPU:0", WithheldReason.CPU_CONTENDED),
        ("/GPU:0 32x32 float32 compute", WithheldReason.HOST_SLOWED),
    }
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.WITHHELD


def test_refinement_never_visits_a_point_withheld_alone_and_the_sweeps_end_times_it_once_more() -> None:
    """The host slowed over the CPU's n = 64, a configured size inside the crossing that refinement also lands on:
    the refinement does not visit it (the crossover comes from the refined sizes around it, whose leads agree across
    the gap), and it is timed once more as the sweep ends (issue 54: a spell outlasts the second try a second
    later). Slowed then too, it is withheld; its spell over by then, it is published from that one visit."""
    plan = make_plan("tests.fakes:curve", modes=("compute",), refine=RefineSettings(spacing=0.2, visits=2))
    for spell_over, withheld in ((False, ["/CPU:0 64x64 float32 compute"]), (True, [])):
        backend = SlowedWhileTiming({("/CPU:0", 64)}, visits=1 if spell_over else None)
        snapshot = _slowed_sweep(backend, plan).snapshot
        assert snapshot is not None
        assert [w.subject for w in snapshot.withheld] == withheld
        assert backend.prepared[("/CPU:0", 64)] == 2  # its first visit's tries, and once more at the end
        published = [m for m in snapshot.measurements if (m.key.device, m.key.size) == ("/CPU:0", 64)]
        assert [m.timing.visit_count for m in published] == ([1] if spell_over else [])
        refined = {m.key.size for m in snapshot.measurements if m.role == "refine"}
        assert refined, "refinement timed nothing: the test's premise is gone"


class _RefinementSlowed(SlowedWhileTiming):
    """The host 2x slower over the GPU's points at the sizes refinement adds (none configured): which sizes those
    are depends on the timings (a busy machine moves them), so they are slowed by not being configured."""

    def __init__(self, configured: tuple[int, ...]) -> None:
        super().__init__(set())
        self.configured = configured

    def reference(self) -> float:
        device, size = self.current or ("", 0)
        return 2e-3 if device == "/GPU:0" and size not in self.configured and size != 1 else 1e-3


def test_a_refinements_point_the_host_slowed_is_named_and_the_crossover_its_gap_could_move_is_withheld() -> None:
    """The host slowed only over the GPU's points at the sizes refinement added beside the crossing (between 32 and
    64): each is withheld and named like a configured one, so the sweep is partial and says why, never prepared
    again, and the crossover their gaps could have moved (the CPU's sizes there stand alone) is withheld."""
    plan = make_plan("tests.fakes:curve", modes=("compute",), refine=RefineSettings(spacing=0.2, visits=2))
    backend = _RefinementSlowed(plan.bench.sizes)
    outcome = _slowed_sweep(backend, plan)
    snapshot = outcome.snapshot
    assert snapshot is not None
    added = {m.key.size for m in snapshot.measurements if m.key.device == "/CPU:0" and m.role == "refine"}
    assert added, "refinement added no size"
    withheld = {w.subject for w in snapshot.withheld}
    assert withheld == {f"/GPU:0 {n}x{n} float32 compute" for n in added}
    assert outcome.result is SweepResult.PARTIAL
    assert all(str(n) in outcome.reason for n in added)
    assert all(backend.prepared[("/GPU:0", n)] == 2 for n in added)  # not visited; once more as the sweep ended
    (crossover,) = snapshot.crossovers
    assert crossover.state is CrossoverState.WITHHELD


class _RevisitSlowed(SlowedWhileTiming):
    """The host 2x slower over the ``slowed`` points' second visit and after, not their first."""

    def reference(self) -> float:
        slowed = self.current in self.slowed and self.prepared[self.current] >= 2
        return 2e-3 if slowed else 1e-3


class _LoadByVisit(FakeHost):
    """Others' load over each window by the point being timed and its visit: ``loads[(device, size, visit)]``,
    0.1 cores elsewhere."""

    def __init__(self, backend: SlowedWhileTiming, loads: dict[tuple[str, int, int], float]) -> None:
        super().__init__([0.1])
        self._backend = backend
        self._loads = loads

    def stop(self, started: object) -> HostLoad:
        current = self._backend.current
        visit = 0 if current is None else self._backend.prepared[current]
        load = 0.1 if current is None else self._loads.get((*current, visit), 0.1)
        return HostLoad(other_cores=load, throttled_s=0.0, own_wait=0.0)


def test_a_refinement_round_taken_back_restores_what_others_used_over_the_visits_kept() -> None:
    """n = 32's second round: the CPU's visit ran beside a busy core (1.0 cores of others), the GPU's was slowed
    by the host and set aside, so the round is taken back. The CPU's point is its first visit again, and says the
    0.1 cores of that visit, not the 1.0 of the visit it dropped: it still counts as calm for its idle range."""
    backend = _RevisitSlowed({("/GPU:0", 32)})
    host = _LoadByVisit(backend, {("/CPU:0", 32, 2): 1.0})
    guard = fake_guard(FakeSampler(lambda _: IDLE), host, reference=backend.reference, baseline=IDLE_REFERENCE)
    plan = make_plan("tests.fakes:curve", modes=("compute",), refine=RefineSettings(spacing=0.2, visits=2))
    outcome = run_sweep(plan, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard, backend))
    snapshot = outcome.snapshot
    assert snapshot is not None
    assert backend.prepared[("/CPU:0", 32)] == backend.prepared[("/GPU:0", 32)] == 2, "no second round of n = 32"
    points = {(m.key.device, m.key.size): m for m in snapshot.measurements}
    cpu = points[("/CPU:0", 32)]
    assert cpu.timing.visit_count == 1
    assert cpu.others_cores == pytest.approx(0.1)
    assert points[("/CPU:0", 64)].timing.visit_count == 2  # a round that stood keeps its visits


def test_a_point_first_timed_while_the_host_read_slowed_joins_no_range_after_a_calm_revisit() -> None:
    """The host 2x slower over the CPU's first visit of n = 64, which reads inside its own idle range and stands;
    refinement visits it again with the host calm. The point's median holds that slowed visit, so it says no
    others reading (it joins no range), not the calm revisit's; the points timed calm say theirs."""
    plan = make_plan("tests.fakes:curve", modes=("compute",), refine=RefineSettings(spacing=0.2, visits=2))
    _, idle = sweep_with(lambda _: IDLE, plan)
    assert idle.snapshot is not None
    timed = {(m.key.device, m.key.size): m.timing.median_s for m in idle.snapshot.measurements}
    figure = RangeTop(key=point_key("/CPU:0", 64), upper_s=timed[("/CPU:0", 64)] * 1.05, sweeps=4)
    backend = SlowedWhileTiming({("/CPU:0", 64)}, visits=1)
    guard = fake_guard(
        FakeSampler(lambda _: IDLE),
        FakeHost([0.1]),
        reference=backend.reference,
        baseline=IDLE_REFERENCE,
        figures=[figure],
    )
    planned = dataclasses.replace(plan, range_tops=(figure,))
    launch = lambda p: ThreadWorker(p, guard, backend)  # noqa: E731 - as the other sweeps here
    outcome = run_sweep(planned, timeout_s=60, cancel=threading.Event(), launch=launch)
    assert outcome.snapshot is not None
    assert not outcome.snapshot.withheld
    points = {(m.key.device, m.key.size): m for m in outcome.snapshot.measurements}
    assert points[("/CPU:0", 64)].timing.visit_count == 2, "no calm revisit: the test's premise is gone"
    assert points[("/CPU:0", 64)].others_cores is None
    assert points[("/CPU:0", 32)].others_cores == pytest.approx(0.1)


def test_a_withheld_fixed_cost_point_still_bounds_the_host_share_of_the_devices_other_points() -> None:
    """The host 1.3x slower over the GPU's n = 1 point (withheld alone: all of it is the host's) and over its
    n = 512 point, 7% of whose time is the host's: that point moved by about 2% and stands. Without the n = 1
    figure it would be judged as all host's and withheld."""
    backend = SlowedWhileTiming({("/GPU:0", 1), ("/GPU:0", 512)}, factor=1.3)
    plan = make_plan("tests.fakes:curve", sizes=(512,), modes=("compute",), devices=("/GPU:0",))
    snapshot = _slowed_sweep(backend, plan).snapshot
    assert snapshot is not None
    assert [w.subject for w in snapshot.withheld] == ["/GPU:0 1x1 float32 compute"]
    assert [m.key.size for m in snapshot.measurements] == [512]


def test_an_idle_host_reference_withholds_nothing_and_its_slowdown_is_recorded() -> None:
    """The reference at its idle figure all sweep: every device measured, each one's hardware record at 1.00x."""
    guard = fake_guard(
        FakeSampler(lambda _: IDLE), FakeHost([0.0]), reference=_readings([1e-3]), baseline=IDLE_REFERENCE
    )
    _, messages = run_guarded(guard)
    assert not withheld_in(messages)
    contexts = [m for m in messages if isinstance(m, HardwareContext)]
    assert {c.device for c in contexts} == {"/CPU:0", "/GPU:0"}
    assert all(c.host_slowdown_max == pytest.approx(1.0) for c in contexts)


def _figure(device: str, size: int, upper_s: float) -> RangeTop:
    key = PointKey(backend="fake", device=device, dtype="float32", mode="compute", size=size)
    return RangeTop(key=key, upper_s=upper_s, sweeps=12)


class _Tries:
    """A point's median on each try, ``medians`` in turn (the last repeats): the guard's measure() moves it on, and
    it reads the same however often the guard asks within a try, as the runner's last timing does."""

    def __init__(self, medians: list[float]) -> None:
        self._medians = medians
        self._tried = 0

    def measure(self, *_: object) -> None:
        self._tried += 1

    def median(self) -> float:
        return self._medians[min(max(self._tried - 1, 0), len(self._medians) - 1)]


def _judged(
    figure: RangeTop,
    medians: list[float],
    share: float | None = 1.0,
    size: int | None = None,
    tries: _Tries | None = None,
) -> JudgedPoint:
    """The point of ``figure`` (or at ``size`` on its curve), reading ``medians`` (one per try of ``tries``; the
    last repeats), ``share`` of it the host's."""
    key = figure.key if size is None else dataclasses.replace(figure.key, size=size)
    return JudgedPoint(key, (tries or _Tries(medians)).median, lambda _: share)


def test_a_host_bound_point_past_its_idle_range_while_others_use_a_core_is_withheld_as_host_slowed() -> None:
    """A neighbour's BLAS thread beside a framework's pool: others use a core the worker's threads leave free
    (not contended), the reference reads its idle figure, and the CPU point reads 1.3x the top of its idle
    range on both tries: withheld, naming the range and the load. Beside less than range_others_cores,
    within 10% of the range, after a burst that passed, or with no range yet, it stands."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    figure = _figure("/CPU:0", 64, 10e-3)

    def verdict(load: float, medians: list[float], point: RangeTop = figure) -> Withheld | None:
        guard = fake_guard(
            None, FakeHost([load]), reference=_readings([1e-3]), baseline=IDLE_REFERENCE, figures=[point]
        )
        tries = _Tries(medians)
        found = guard.time_cpu_point(cpu, 1, tries.measure, _judged(figure, medians, tries=tries))
        assert guard.last_point_others == pytest.approx(load)
        return found

    slowed = verdict(1.0, [13e-3])
    assert slowed is not None
    assert slowed.reason is WithheldReason.HOST_SLOWED
    assert slowed.detail == (
        "it ran 1.30x the top of its idle range over 12 calm sweeps (13 ms against 10 ms, allowed 10%) while others "
        "used 1.00 cores of the 4, and 100% of its time is the host's (timed twice)"
    )
    assert verdict(0.74, [13e-3]) is None  # others below range_others_cores: a real change is published
    assert verdict(0.75, [13e-3]) is not None
    assert verdict(1.0, [10.9e-3]) is None
    assert verdict(1.0, [13e-3, 10.5e-3]) is None  # a burst that passed before it was timed again
    assert verdict(1.0, [13e-3], _figure("/CPU:0", 128, 10e-3)) is None  # no range for this point
    off = fake_guard(None, FakeHost([1.0]), figures=[figure], range_others_cores=100)
    assert off.time_cpu_point(cpu, 1, lambda _: None, _judged(figure, [13e-3])) is None
    # On a node whose others usually use 1.5 cores, beside others means 0.75 more than that; on a quiet one
    # (usually 0.3) the gate stands.
    for floor, load, withheld in ((0.3, 0.8, True), (1.5, 2.0, False), (1.5, 2.25, True)):
        usual = fake_guard(
            None,
            FakeHost([load]),
            reference=_readings([1e-3]),
            baseline=IDLE_REFERENCE,
            figures=[figure],
            usual_others=floor,
        )
        found = usual.time_cpu_point(cpu, 1, lambda _: None, _judged(figure, [13e-3]))
        assert (found is not None) is withheld, load
    assert found is not None
    assert f"while others used {2.25:.2f} cores of the 4 (usually 1.50)" in found.detail


def test_a_point_the_reference_could_not_judge_yet_is_not_counted_calm() -> None:
    """A sweep with no idle figure judges the reference by its own first readings: the points timed before there
    are enough of them say no reading (they join no range), those after say the load."""
    guard = fake_guard(None, FakeHost([0.2]), reference=_readings([1e-3]))
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    seen = []
    for _ in range(6):  # two readings a point: the fourth point's make the eight a judgement needs
        assert guard.time_cpu_point(cpu, 1, lambda _: None) is None
        seen.append(guard.last_point_others)
    assert seen[:3] == [None] * 3
    assert seen[3:] == [pytest.approx(0.2)] * 3
    # With an idle figure every point is judged, from the first; with no reference at all, the load alone counts.
    for judged in (
        fake_guard(None, FakeHost([0.2]), reference=_readings([1e-3]), baseline=IDLE_REFERENCE),
        fake_guard(None, FakeHost([0.2])),
    ):
        assert judged.time_cpu_point(cpu, 1, lambda _: None) is None
        assert judged.last_point_others == pytest.approx(0.2)


def test_a_point_inside_its_own_idle_range_stands_whatever_the_host_reference_read() -> None:
    """The reference reads the host 1.5x slower on both tries, no others: a CPU point that reads inside its own
    idle range (widened by 10%) stands, as it was not moved; one past it, one without a range, and a refinement's
    size held against the next size's range are withheld by the reference, as before the ranges."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    figure = _figure("/CPU:0", 64, 10e-3)

    def verdict(point: JudgedPoint, reference: float = 1.5e-3) -> Withheld | None:
        guard = fake_guard(
            None, FakeHost([0.0]), reference=_readings([reference]), baseline=IDLE_REFERENCE, figures=[figure]
        )
        found = guard.time_cpu_point(cpu, 1, lambda _: None, point)
        # Let through by its range while the host read slowed, it says no reading, so it does not join that range.
        # Timed while the host read slowed, it says no reading (withheld or let through by its range), so that
        # it does not join that range.
        assert (guard.last_point_others is None) is (reference > 1.2e-3)
        return found

    assert verdict(_judged(figure, [10.9e-3])) is None
    assert verdict(_judged(figure, [6e-3])) is None  # faster than its calm sweeps: not slowed either
    assert verdict(_judged(figure, [10.9e-3]), reference=1e-3) is None  # the host at its figure: a calm reading
    for moved in (
        _judged(figure, [12e-3]),
        _judged(_figure("/CPU:0", 128, 10e-3), [10e-3]),  # no range of its own
        dataclasses.replace(_judged(figure, [9e-3], size=60), range_from=figure.key),
    ):
        found = verdict(moved)
        assert found is not None, moved.key
        assert found.reason is WithheldReason.HOST_SLOWED
        assert found.detail.startswith("the host ran 1.50x slower than its idle reference")
    moved_detail = verdict(_judged(figure, [12e-3]))
    assert moved_detail is not None
    assert "(allowed 10%); it read 12 ms, 1.20x the top of its idle range over 12 calm sweeps (timed twice)" in (
        moved_detail.detail
    )


def test_a_point_past_its_idle_range_while_the_reference_read_the_host_slowed_is_withheld_with_no_others() -> None:
    """No other program, the reference reads the host 1.3x slower on both tries: a GPU point 30% of whose time is
    the host's moves by about 9% by the reference (allowed 10%), yet reads 1.5x the top of its idle range: the
    host moved it further than the reference's reading says (an idle H100, 2026-12-07), so it is withheld by its
    range, naming the reading. With the reference at its figure the same point stands (a real change is
    published); so it does within its range. Timed while the host read slowed, a point says no others reading."""
    gpu = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
    figure = _figure("/GPU:0", 512, 40e-6)

    def verdict(reference: float, median: float) -> tuple[Withheld | None, float | None]:
        guard = fake_guard(
            None, FakeHost([0.0]), reference=_readings([reference]), baseline=IDLE_REFERENCE, figures=[figure]
        )
        found = guard.time_gpu_point(gpu, lambda: None, lambda: 0.3, _judged(figure, [median], share=0.3))
        return found, guard.last_point_others

    slowed, others = verdict(1.3e-3, 60e-6)
    assert slowed is not None
    assert slowed.reason is WithheldReason.HOST_SLOWED
    assert slowed.detail == (
        "it ran 1.50x the top of its idle range over 12 calm sweeps (0.06 ms against 0.04 ms, allowed 10%) while "
        "the host reference read the host 1.30x slower than its idle figure, and 30% of its time is the host's "
        "(timed twice)"
    )
    assert others is None
    assert verdict(1.0e-3, 60e-6) == (None, 0.0)  # the host at its figure: published, and a calm reading
    assert verdict(1.3e-3, 42e-6) == (None, None)  # inside its range: stands, but joins no range


def test_a_gpu_point_is_held_against_its_idle_range_only_where_a_quarter_of_its_time_is_the_hosts() -> None:
    """A GPU compute point 2x its range beside a busy core: withheld where 30% of its time (at the range's top) is
    the host's; where 20% is, its move is the GPU's (NVML's look judges that), and it stands; so it does where
    the share is not known."""
    gpu = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
    figure = _figure("/GPU:0", 64, 1e-4)
    for share, stands in ((0.3, False), (0.2, True), (None, True)):  # None: no n = 1 point to tell
        guard = fake_guard(None, FakeHost([1.5]), figures=[figure])
        verdict = guard.time_gpu_point(gpu, lambda: None, lambda: 1.0, _judged(figure, [2e-4], share))
        assert (verdict is None) is stands, share
        if verdict is not None:
            assert verdict.reason is WithheldReason.HOST_SLOWED
            assert "30% of its time is the host's" in verdict.detail


def test_a_point_past_its_idle_range_beside_others_is_withheld_alone_and_each_point_says_what_others_used() -> None:
    """The real runner and sweep: the tops of the CPU's n = 128 point's and the GPU's n = 1 point's idle ranges
    are a quarter of what they read now while others use a core (the reference unmoved): those points alone are
    withheld (the n = 1 point is all host: its own fixed cost) and the rest published, each saying the others' load it
    was timed beside; well inside their ranges, nothing is withheld; with ranges timed with other threads, nothing is
    judged."""
    plan = make_plan("tests.fakes:curve", modes=("compute",))
    _, idle = sweep_with(lambda _: IDLE, plan)
    assert idle.snapshot is not None
    timed = {(m.key.device, m.key.size): m.timing.median_s for m in idle.snapshot.measurements}

    def sweep(share: float, timed_as: str = "") -> Snapshot:
        figures = [
            RangeTop(key=point_key(device, size), upper_s=timed[(device, size)] * share, sweeps=4)
            for device, size in (("/CPU:0", 128), ("/GPU:0", 1))
        ]
        guard = fake_guard(FakeSampler(lambda _: IDLE), FakeHost([1.0]), figures=figures)
        planned = dataclasses.replace(plan, range_tops=tuple(figures), range_tops_timed_as=timed_as)
        outcome = run_sweep(planned, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard))
        assert outcome.snapshot is not None
        return outcome.snapshot

    # A quarter and four times: the two sweeps are timed for real, and on a busy machine one may run 2x the other.
    slowed = sweep(0.25)
    assert {w.subject for w in slowed.withheld} == {"/CPU:0 128x128 float32 compute", "/GPU:0 1x1 float32 compute"}
    assert {w.reason for w in slowed.withheld} == {WithheldReason.HOST_SLOWED}
    assert all("the top of its idle range over 4 calm sweeps" in w.detail for w in slowed.withheld)
    assert ("/CPU:0", 128) not in {(m.key.device, m.key.size) for m in slowed.measurements}
    assert {m.others_cores for m in slowed.measurements} == {1.0}
    assert not sweep(4.0).withheld
    assert not sweep(0.25, timed_as="framework_version=0.9").withheld  # the ranges are of another version
    assert {m.others_cores for m in idle.snapshot.measurements} == {None}  # no host meter: nothing said


def test_a_refinements_size_is_held_against_the_next_configured_sizes_range_and_a_broken_range_judges_nothing() -> None:
    """No range at n = 128 (a refinement's size): the range of n = 256, the next configured size up, stands in,
    and the reason says so; within it, or with a range whose top is not a time, the point stands."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    above = dataclasses.replace(_figure("/CPU:0", 256, 8e-3), sweeps=5)
    refined = dataclasses.replace(above.key, size=128)

    def verdict(median: float, figure: RangeTop = above) -> Withheld | None:
        guard = fake_guard(None, FakeHost([1.0]), figures=[figure])
        return guard.time_cpu_point(
            cpu, 1, lambda _: None, JudgedPoint(refined, _readings([median]), range_from=above.key)
        )

    slowed = verdict(9.5e-3)
    assert slowed is not None
    assert "1.19x the top of the idle range of n = 256 over 5 calm sweeps (9.5 ms against 8 ms" in slowed.detail
    assert verdict(8.5e-3) is None
    assert verdict(9.5e-3, dataclasses.replace(above, upper_s=0.0)) is None
    assert verdict(9.5e-3, dataclasses.replace(above, upper_s=float("nan"))) is None


def test_a_point_that_stood_once_others_left_says_they_were_there_when_it_was_first_timed() -> None:
    """Beside a busy core the first try read 1.3x its range; timed again with the host calm it stood, and it
    reports the most others used over its tries, so it does not join its calm range."""
    cpu = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
    figure = _figure("/CPU:0", 64, 10e-3)
    guard = fake_guard(None, FakeHost([1.0, 0.1]), figures=[figure])
    tries = _Tries([13e-3, 10e-3])
    assert guard.time_cpu_point(cpu, 1, tries.measure, _judged(figure, [], tries=tries)) is None
    assert guard.last_point_others == pytest.approx(1.0)
