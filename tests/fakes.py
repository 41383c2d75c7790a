"""Fault-injecting and known-curve backends, loaded by the real worker as plugins ("tests.fakes:NAME").

They exercise the real worker, sweep, daemon and exporter without a GPU: the curves have a known
crossover, and the faults (hang, crash, a failing device) are what a real framework can do.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import time
from collections.abc import Mapping, Sequence

from crossover_monitor.errors import DeviceUnavailable
from crossover_monitor.measure.contract import BackendOptions, RunBlock
from crossover_monitor.model import DeviceInfo, Mode

CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="Fake CPU")
GPU = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="Fake GPU", details=(("compute_capability", "9.0"),))


def cpu_seconds(size: int) -> float:
    """A CPU that does 2 GFLOP/s with 2 µs of overhead."""
    return 2e-6 + 2 * size**3 / 2e9


def gpu_seconds(size: int, mode: Mode) -> float:
    """A GPU with 100 µs of launch cost (300 µs with copies) and 200 GFLOP/s."""
    fixed = 1e-4 if mode == "compute" else 3e-4
    return fixed + 2 * size**3 / 2e11


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# Another program busy (on the core given as its argument, if any); it ends by itself, should the test die first.
SPIN_FOR_A_MINUTE = """
import os, sys, time
if len(sys.argv) > 1:
    os.sched_setaffinity(0, {int(sys.argv[1])})
end = time.monotonic() + 60
while time.monotonic() < end:
    pass
"""


class CurveBackend:
    """Devices whose per-call time follows cpu_seconds / gpu_seconds, so the crossover is known."""

    name = "fake"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    def environment(self) -> Mapping[str, str]:
        return {"framework": "fake", "framework_version": "1.0", "tf32": str(self.options.tf32).lower()}

    def discover(self) -> Sequence[DeviceInfo]:
        return [CPU, GPU]

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        seconds = cpu_seconds(size) if device.kind == "cpu" else gpu_seconds(size, mode)

        def run(calls: int) -> None:
            _spin(seconds * calls)

        return run


class HangingBackend(CurveBackend):
    """Hangs in the first GPU block, as a wedged driver call would."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu":
            return lambda _calls: time.sleep(3600)
        return super().prepare(device, size, dtype, mode)


class CrashingBackend(CurveBackend):
    """Dies with SIGSEGV in the first GPU block, as a crashing native library would."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu":
            return lambda _calls: os.kill(os.getpid(), signal.SIGSEGV)
        return super().prepare(device, size, dtype, mode)


class BrokenGpuBackend(CurveBackend):
    """A GPU that fails every time it is used; the CPU keeps working."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu":
            raise DeviceUnavailable(device.device, "CUDA_ERROR_ECC_UNCORRECTABLE (injected)")
        return super().prepare(device, size, dtype, mode)


class LateFailingGpuBackend(CurveBackend):
    """A GPU that works for small sizes, then fails for good (a card that falls off the bus)."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu" and size >= 64:
            raise DeviceUnavailable(device.device, "CUDA_ERROR_LAUNCH_FAILED (injected)")
        return super().prepare(device, size, dtype, mode)


class BuggyBackend(CurveBackend):
    """A plug-in whose GPU code has a plain bug (not one of the contract's errors)."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "gpu":
            return lambda calls: calls // 0
        return super().prepare(device, size, dtype, mode)


class CpuOnlyBackend(CurveBackend):
    """A GPU machine whose driver is gone: only the CPU is found."""

    def discover(self) -> Sequence[DeviceInfo]:
        return [CPU]


class SlowBackend(CurveBackend):
    """Every block takes a second, so a sweep is reliably in flight when the test signals."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        return lambda _calls: time.sleep(1.0)


class VirtualClock:
    """A clock that only the backend below moves: a sweep over it takes no real time and is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SteppedClock:
    """The wall clock as a host reads it, stepped by the test (an NTP step, a resume): ``offset`` seconds off."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.time() + self.offset


class VirtualCurveBackend(CurveBackend):
    """The known curves on a VirtualClock: a sweep takes no real time, and a busy machine cannot move a point."""

    def __init__(self, options: BackendOptions, *, clock: VirtualClock) -> None:
        super().__init__(options)
        self._clock = clock

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        seconds = cpu_seconds(size) if device.kind == "cpu" else gpu_seconds(size, mode)

        def run(calls: int) -> None:
            self._clock.now += seconds * calls

        return run


# What a broken or hostile plugin may put in its strings: a lone surrogate (no UTF-8 encoder takes it), a NUL, a
# terminal escape, DEL, a C1 control, a newline, a non-character, and what XML and matplotlib's mathtext read specially.
HOSTILE_TEXT = "\ud800 \x00\x1b[2J\x7f\x85\n\ufffe <&]]>-- $x^$"


class HostileNamesBackend(CurveBackend):
    """The known curves, with HOSTILE_TEXT in the GPU's name, device and details and in the framework version."""

    def environment(self) -> Mapping[str, str]:
        return {**super().environment(), "framework_version": f"1.0{HOSTILE_TEXT}"}

    def discover(self) -> Sequence[DeviceInfo]:
        gpu = dataclasses.replace(
            GPU,
            device=f"/GPU:0{HOSTILE_TEXT}",
            name=f"Fake GPU{HOSTILE_TEXT}",
            details=(("compute_capability", f"9.0{HOSTILE_TEXT}"),),
        )
        return [CPU, gpu]


def tie_cpu_seconds(size: int) -> float:
    """A CPU behind a framework's 40 µs dispatch cost, at 100 GFLOP/s."""
    return 40e-6 + 2 * size**3 / 1e11


def tie_gpu_seconds(size: int) -> float:
    """A GPU behind 50 µs of dispatch and launch, at 50 TFLOP/s: the two curves run close (n* ≈ 79.4)."""
    return 50e-6 + 2 * size**3 / 5e13


class VisitNoiseBackend(CurveBackend):
    """Curves that tie over a range of sizes, each visit of a point at its own level: TensorFlow on an H200.

    Every visit (one ``prepare``) is off by a random factor: one the CPU's visit of a size draws and
    the GPU's visit right after it shares (the framework's dispatch cost, common to both), and one
    of its own. With ``process_spread``, each (device, size) also keeps a level of its own for the
    backend's life, as a fresh worker process's placement gives it: no number of visits averages
    that out. Blocks within a visit are exact, so a converged visit hides its level completely.
    Runs on a ``VirtualClock``: for in-process tests, not a plugin.
    """

    def __init__(
        self, options: BackendOptions, *, clock: VirtualClock, seed: int, spread: float, process_spread: float = 0.0
    ) -> None:
        super().__init__(options)
        self._clock = clock
        self._rng = random.Random(seed)
        self._spread = spread
        self._process_spread = process_spread
        self._process_levels: dict[tuple[str, int], float] = {}
        self._shared = 1.0

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if device.kind == "cpu":
            self._shared = self._level()
        if (device.kind, size) not in self._process_levels:
            spread = self._process_spread
            self._process_levels[device.kind, size] = math.exp(self._rng.uniform(-spread, spread))
        seconds = (
            (tie_cpu_seconds(size) if device.kind == "cpu" else tie_gpu_seconds(size))
            * self._shared
            * self._level()
            * self._process_levels[device.kind, size]
        )

        def run(calls: int) -> None:
            self._clock.now += seconds * calls

        return run

    def _level(self) -> float:
        return float(math.exp(self._rng.uniform(-self._spread, self._spread)))


# The plugin factories ("tests.fakes:NAME"): load_backend calls factory(options), as a class is called.
curve = CurveBackend
hanging = HangingBackend
crashing = CrashingBackend
broken_gpu = BrokenGpuBackend
late_failing_gpu = LateFailingGpuBackend
buggy = BuggyBackend
cpu_only = CpuOnlyBackend
slow = SlowBackend
hostile_names = HostileNamesBackend
