"""Fakes for the interference guard's tests: a scripted NVML, a scripted host meter, and the real runner on a thread.

``FakeSampler`` answers per look as its script says; ``run_guarded`` runs the real runner under a guard
built on it, and ``sweep_with`` a whole sweep (the real runner and sweep), for the guard's tests, the
runner's retries, and what the service does with a withheld device (carry-over, retries).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.measure.contract import BackendOptions, RunBlock
from crossover_monitor.measure.guard.guard import GpuProcess, GpuSample, GpuSampler, Guard, GuardUnavailable, HostLoad
from crossover_monitor.measure.runner import run_plan
from crossover_monitor.model import (
    DeviceInfo,
    HostReference,
    Measurement,
    Mode,
    RangeTop,
    RetryResult,
    ServiceState,
    SweepOutcome,
    SweepResult,
    Withheld,
)
from crossover_monitor.protocol import Message, Plan
from crossover_monitor.service.daemon import Service
from crossover_monitor.service.sweep import END_OF_STREAM, EndOfStream, run_sweep
from tests.conftest import free_port, make_plan
from tests.fakes import CurveBackend

OWN_PID = 1000
IDLE = GpuSample(processes=(GpuProcess(pid=OWN_PID),), utilization_pct=0.0, sm_clock_hz=1.98e9)
JOB = GpuProcess(pid=4242, name="train.py")


class FakeSampler:
    """A fake NVML: ``script(look_number)`` says what the GPU looks like at each look."""

    def __init__(self, script: Callable[[int], GpuSample]) -> None:
        self.script = script
        self.looks = 0

    def sample(self, device: DeviceInfo) -> GpuSample:
        self.looks += 1
        return self.script(self.looks)

    def identity(self, device: DeviceInfo) -> dict[str, str]:
        return {"uuid": f"GPU-fake-{device.device}", "pci_bus_id": "00000000:18:00.0"}

    def driver_version(self) -> str:
        return "580.159.04"


class FailingSampler:
    def sample(self, device: DeviceInfo) -> GpuSample:
        raise GuardUnavailable("NVML_ERROR_GPU_IS_LOST (injected)")

    def identity(self, device: DeviceInfo) -> dict[str, str]:
        raise GuardUnavailable("NVML_ERROR_GPU_IS_LOST (injected)")

    def driver_version(self) -> str:
        raise GuardUnavailable("NVML_ERROR_GPU_IS_LOST (injected)")


class CountingBackend(CurveBackend):
    """The known curves, counting the blocks run on each device."""

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self.blocks: dict[str, int] = {}

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        run = super().prepare(device, size, dtype, mode)

        def counted(calls: int) -> object:
            self.blocks[device.device] = self.blocks.get(device.device, 0) + 1
            return run(calls)

        return counted


class SlowedWhileTiming(CountingBackend):
    """The known curves, with a host reference that reads ``factor`` times its idle figure while the ``slowed``
    points (device, size) are timed: a neighbour that slowed the host for those points only; with
    ``visits``, only over their first that many visits (each visit prepares the point once)."""

    def __init__(self, slowed: set[tuple[str, int]], *, factor: float = 2.0, visits: int | None = None) -> None:
        super().__init__(BackendOptions(tf32=False, cpu_threads=1))
        self.slowed = slowed
        self.factor = factor
        self.visits = visits
        self.prepared: dict[tuple[str, int], int] = {}
        self.current: tuple[str, int] | None = None

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        self.current = (device.device, size)
        self.prepared[self.current] = self.prepared.get(self.current, 0) + 1
        return super().prepare(device, size, dtype, mode)

    def reference(self) -> float:
        if self.current not in self.slowed:
            return 1e-3
        early = self.visits is None or self.prepared[self.current] <= self.visits
        return self.factor * 1e-3 if early else 1e-3


class FakeHost:
    """Other processes' load and the worker's own wait for a CPU, per timed window, from lists (the last repeats)."""

    def __init__(
        self,
        loads: list[float],
        cores: int = 4,
        waits: list[float | None] | None = None,
        throttled: list[float] | None = None,
        *,
        block_waits: Sequence[float | None] | None = None,
    ) -> None:
        """``block_waits``: the worker's threads' wait over each timed block of a CPU point, in cores (the last
        repeats; None: the kernel does not say)."""
        self.loads = loads
        self.block_waits = list(block_waits or [None])
        self.blocks = 0
        self.waits = waits or [0.0]
        self.throttled = throttled or [0.0]
        self.windows = 0
        self._cores = cores

    def cores(self) -> int:
        return self._cores

    def start(self) -> object:
        return None

    def threads_mark(self) -> object:
        return None

    def threads_waited(self, since: object) -> float | None:
        waited = self.block_waits[min(self.blocks, len(self.block_waits) - 1)]
        self.blocks += 1
        return waited

    def stop(self, started: object) -> HostLoad:
        load = self.loads[min(self.windows, len(self.loads) - 1)]
        wait = self.waits[min(self.windows, len(self.waits) - 1)]
        throttled = self.throttled[min(self.windows, len(self.throttled) - 1)]
        self.windows += 1
        return HostLoad(other_cores=load, throttled_s=throttled, own_wait=wait)


def fake_guard(
    sampler: GpuSampler | None,
    host: FakeHost | None = None,
    pods: Callable[[str], list[str]] | None = None,
    reference: Callable[[], float] | None = None,
    baseline: HostReference | None = None,
    *,
    figures: Iterable[RangeTop] = (),
    usual_others: float = 0.0,
    **settings: Any,
) -> Guard:
    sleeps: list[float] = []
    return Guard(
        GuardSettings(**settings),
        gpu_sampler=sampler,
        gpu_sampler_problem="nvidia-ml-py is not installed",
        host=host,
        own_pid=OWN_PID,
        sleep=sleeps.append,
        pods=pods,
        reference=reference,
        reference_baseline=baseline,
        range_tops=figures,
        usual_others=usual_others,
    )


def run_guarded(
    guard: Guard, plan: Plan | None = None, backend: CountingBackend | None = None
) -> tuple[CountingBackend, list[Message]]:
    """The real runner timing ``plan`` (the known curves, compute mode, by default) under ``guard``."""
    backend = backend or CountingBackend(BackendOptions(tf32=False, cpu_threads=1))
    messages: list[Message] = []
    run_plan(
        plan or make_plan("tests.fakes:curve", modes=("compute",)), backend, messages.append, time.perf_counter, guard
    )
    return backend, messages


def withheld_in(messages: list[Message]) -> list[Withheld]:
    """The devices a run withheld, in the order it withheld them."""
    return [m for m in messages if isinstance(m, Withheld)]


def timed_on(messages: list[Message], device: str) -> list[Measurement]:
    """The points a run emitted for ``device``."""
    return [m for m in messages if isinstance(m, Measurement) and m.key.device == device]


class ThreadWorker:
    """The real runner on a thread, behind the Worker protocol the sweep reads."""

    def __init__(self, plan: Plan, guard: Guard, backend: CountingBackend | None = None) -> None:
        self._messages: queue.Queue[Message | EndOfStream] = queue.Queue()
        backend = backend or CountingBackend(BackendOptions(tf32=False, cpu_threads=1))

        def work() -> None:
            from crossover_monitor.protocol import Done  # noqa: PLC0415

            run_plan(plan, backend, self._messages.put, time.perf_counter, guard)
            self._messages.put(Done())
            self._messages.put(END_OF_STREAM)

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def next_message(self, timeout: float) -> Message | EndOfStream | None:
        try:
            return self._messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> int | None:
        return 0

    def exit_status(self, timeout: float) -> int | None:
        self._thread.join(timeout)
        return 0

    def diagnostics(self) -> str:
        return ""


def sweep_with(script: Callable[[int], GpuSample], plan: Plan | None = None) -> tuple[SweepResult, SweepOutcome]:
    plan = plan or make_plan("tests.fakes:curve", modes=("compute",))
    guard = fake_guard(FakeSampler(script))
    outcome = run_sweep(plan, timeout_s=60, cancel=threading.Event(), launch=lambda p: ThreadWorker(p, guard))
    return outcome.result, outcome


def until_a_retry_measures(
    launch: Callable[[Plan], ThreadWorker], watch: Callable[[ServiceState], object] = lambda _: None
) -> ServiceState:
    """The daemon (1-hour schedule, the known curves, compute mode, one GPU expected, retries every 10 s: the shortest
    allowed) with workers from ``launch``, run until a retry measures or a minute has passed; its state then.
    ``watch`` is given the state at each look meanwhile."""
    settings = settings_from_mapping(
        {
            "schedule": {"interval": "1h"},
            "benchmark": {"sizes": [16, 32, 64, 128], "modes": ["compute"], "expect_gpus": 1},
            "guard": {"retry_interval": "10s"},
            "server": {"listen": f"127.0.0.1:{free_port()}"},
        }
    )
    service = Service(settings, launch=launch)
    thread = threading.Thread(target=service.run, kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and dict(service.read_state().retries)[RetryResult.MEASURED] < 1:
            watch(service.read_state())
            time.sleep(0.1)
        return service.read_state()
    finally:
        service.stop()
        thread.join(10)
