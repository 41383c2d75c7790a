"""The NVML adapter against a stand-in pynvml module: what it reads, how it names processes, how it fails.

No machine in CI has an NVIDIA driver, so the module is replaced by a fake that answers like
nvidia-ml-py (ctypes-like structs, NVMLError subclasses); the real one ran on the H200 machines
(benchmarks/results/shared-node-h200x2-*.log).
"""

from __future__ import annotations

import os
import types
from collections import Counter
from pathlib import Path

import pytest

from crossover_monitor.measure.guard import nvml
from crossover_monitor.measure.guard.guard import GuardUnavailable
from crossover_monitor.model import DeviceInfo

GPU = DeviceInfo(backend="torch", device="cuda:0", kind="gpu", name="H200", details=(("uuid", "GPU-abc"),))


class NVMLError(Exception):
    pass


class NVMLErrorNotFound(NVMLError):
    pass


def _fake_pynvml(*, samples: object = (), fail_init: bool = False) -> types.SimpleNamespace:
    def get_samples(_handle: object, _since: int) -> object:
        if isinstance(samples, Exception):
            raise samples
        return samples

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def by_uuid(uuid: str) -> str:
        if uuid != "GPU-abc":
            raise NVMLError("Not Found")
        return "handle-0"

    own = types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=600 * 2**20)
    job = types.SimpleNamespace(pid=4_000_000, usedGpuMemory=20 * 2**30)  # no such pid here: hidden
    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotFound=NVMLErrorNotFound,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetComputeRunningProcesses=lambda _h: [own, job],
        nvmlDeviceGetGraphicsRunningProcesses=lambda _h: [],
        nvmlDeviceGetProcessUtilization=get_samples,
        nvmlDeviceGetUtilizationRates=lambda _h: types.SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetClockInfo=lambda _h, _c: 1755,
        nvmlDeviceGetMaxClockInfo=lambda _h, _c: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda _h: 0x1 | 0x20,
        nvmlDeviceGetTemperature=lambda _h, _t: 61,
        nvmlDeviceGetPowerUsage=lambda _h: 512_000,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda _h: 4,
        nvmlDeviceGetCurrPcieLinkWidth=lambda _h: 8,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda _h: 5,
        nvmlDeviceGetMaxPcieLinkWidth=lambda _h: 16,
        NVML_PERF_POLICY_POWER=0,
        NVML_PERF_POLICY_THERMAL=1,
        # Running totals in nanoseconds: 2.5 s held back by the power limit since boot, never by heat.
        nvmlDeviceGetViolationStatus=lambda _h, policy: types.SimpleNamespace(
            referenceTime=1_700_000_000_000_000, violationTime=(2_500_000_000, 0)[policy]
        ),
    )


def test_probe_reads_every_field_in_base_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clocks in Hz, power in W, throttle reasons by name (idle left out), PCIe link now and at best."""
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml())
    sample = nvml.NvmlSampler(proc=Path("/proc")).sample(GPU)
    assert sample.utilization_pct == 87.0
    assert (sample.sm_clock_hz, sample.sm_clock_max_hz) == (1.755e9, 1.98e9)
    assert sample.clock_events == ("sw_thermal_slowdown",)
    assert (sample.temperature_c, sample.power_w) == (61, 512.0)
    assert (sample.pcie_generation, sample.pcie_width, sample.pcie_generation_max, sample.pcie_width_max) == (
        4,
        8,
        5,
        16,
    )
    assert (sample.power_limited_s, sample.thermal_limited_s) == (2.5, 0.0)
    assert sample.read_at_s is not None


def test_a_gpu_without_violation_counters_still_gives_its_other_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmlDeviceGetViolationStatus is NOT_SUPPORTED on some GPUs: those two readings are unknown, nothing fails."""
    fake = _fake_pynvml()

    def unsupported(_handle: object, _policy: int) -> object:
        raise NVMLError("Not Supported")

    fake.nvmlDeviceGetViolationStatus = unsupported
    monkeypatch.setattr(nvml, "pynvml", fake)
    sample = nvml.NvmlSampler().sample(GPU)
    assert (sample.power_limited_s, sample.thermal_limited_s) == (None, None)
    assert sample.sm_clock_hz == 1.755e9


def test_probe_names_processes_and_their_recent_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own pid is named from /proc; a pid outside this namespace is hidden; per-process SM samples are kept."""
    job_sample = types.SimpleNamespace(pid=4_000_000, smUtil=93, timeStamp=2**62)
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml(samples=[job_sample]))
    own, job = nvml.NvmlSampler().sample(GPU).processes
    assert (own.pid, own.visible, own.sm_utilization_pct) == (os.getpid(), True, 0.0)
    assert own.name != "?"
    assert (job.visible, job.used_memory_bytes, job.sm_utilization_pct) == (False, 20 * 2**30, 93.0)


def test_no_recent_samples_means_no_process_ran_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML answers NOT_FOUND when no process ran a kernel in the window: every process idle."""
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml(samples=NVMLErrorNotFound("Not Found")))
    assert {p.sm_utilization_pct for p in nvml.NvmlSampler().sample(GPU).processes} == {0.0}


def test_unsupported_samples_leave_activity_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the GPU keeps no per-process samples nothing is assumed: activity unknown (so the process counts)."""
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml(samples=NVMLError("Not Supported")))
    assert {p.sm_utilization_pct for p in nvml.NvmlSampler().sample(GPU).processes} == {None}


def test_nvml_that_cannot_start_or_find_the_gpu_is_a_clear_guard_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver, no module, or an unknown GPU: GuardUnavailable with the reason, never a crash."""
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml(fail_init=True))
    with pytest.raises(GuardUnavailable, match="Driver Not Loaded"):
        nvml.NvmlSampler()
    monkeypatch.setattr(nvml, "pynvml", None)
    with pytest.raises(GuardUnavailable, match="nvidia-ml-py is not installed"):
        nvml.NvmlSampler()
    monkeypatch.setattr(nvml, "pynvml", _fake_pynvml())
    stranger = DeviceInfo(backend="torch", device="cuda:3", kind="gpu", name="H200", details=(("uuid", "GPU-zzz"),))
    with pytest.raises(GuardUnavailable, match="cannot find cuda:3"):
        nvml.NvmlSampler().sample(stranger)


def test_a_binding_that_raises_something_else_is_still_a_guard_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py raises plain Exceptions too (a driver without the _v3 calls): the GPU is unguarded, not failed."""
    fake = _fake_pynvml()

    def mismatch(_handle: object) -> object:
        raise RuntimeError("NVMLLibraryMismatchError: driver too old for nvmlDeviceGetComputeRunningProcesses_v3")

    fake.nvmlDeviceGetComputeRunningProcesses = mismatch
    monkeypatch.setattr(nvml, "pynvml", fake)
    with pytest.raises(GuardUnavailable, match="driver too old"):
        nvml.NvmlSampler().sample(GPU)


def test_a_look_asks_nvml_only_for_what_can_have_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's maxima (SM clock, PCIe link) are read once; per-process samples only while a process is listed.

    Those calls were two thirds of a look's 5 ms on an H200 (benchmarks/results/nvml-calls-h200-2026-12-01.json).
    """
    fake = _fake_pynvml()
    asked: Counter[str] = Counter()
    for name in (
        "nvmlDeviceGetMaxClockInfo",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetProcessUtilization",
    ):
        call = getattr(fake, name)
        setattr(fake, name, lambda *args, _name=name, _call=call: (asked.update([_name]), _call(*args))[1])
    listed: list[object] = []
    fake.nvmlDeviceGetComputeRunningProcesses = lambda _h: listed
    monkeypatch.setattr(nvml, "pynvml", fake)
    sampler = nvml.NvmlSampler()
    assert sampler.sample(GPU).processes == ()
    assert asked["nvmlDeviceGetProcessUtilization"] == 0
    listed.append(types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=600 * 2**20))  # the worker's context
    second = sampler.sample(GPU)
    assert [p.pid for p in second.processes] == [os.getpid()]
    assert asked["nvmlDeviceGetProcessUtilization"] == 1
    assert (second.sm_clock_max_hz, second.pcie_generation_max, second.pcie_width_max) == (1.98e9, 5, 16)
    for name in ("nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
        assert asked[name] == 1, name


def test_identity_is_the_drivers_uuid_and_long_pci_bus_id_and_never_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """UUID and busId as NVML gives them (bytes from older bindings decoded); a missing call leaves that key
    out; a binding that raises anything else is a GuardUnavailable, as for a look."""
    fake = _fake_pynvml()
    fake.nvmlDeviceGetUUID = lambda _h: b"GPU-5a0c1d2e-0000-4000-8000-000000000000"
    fake.nvmlDeviceGetPciInfo = lambda _h: types.SimpleNamespace(busId="00000000:18:00.0")
    monkeypatch.setattr(nvml, "pynvml", fake)
    assert nvml.NvmlSampler().identity(GPU) == {
        "uuid": "GPU-5a0c1d2e-0000-4000-8000-000000000000",
        "pci_bus_id": "00000000:18:00.0",
    }

    def unsupported(_handle: object) -> object:
        raise NVMLError("Not Supported")

    fake.nvmlDeviceGetPciInfo = unsupported
    assert nvml.NvmlSampler().identity(GPU) == {"uuid": "GPU-5a0c1d2e-0000-4000-8000-000000000000"}

    def mismatch(_handle: object) -> object:
        raise RuntimeError("NVMLLibraryMismatchError")

    fake.nvmlDeviceGetUUID = mismatch
    with pytest.raises(GuardUnavailable, match="NVMLLibraryMismatchError"):
        nvml.NvmlSampler().identity(GPU)


def test_nvml_index_follows_cuda_visible_devices() -> None:
    """Framework ordinals map through CUDA_VISIBLE_DEVICES to NVML indices or UUIDs; MIG is refused clearly."""
    gpu = DeviceInfo(backend="torch", device="cuda:1", kind="gpu", name="H200")
    assert nvml.nvml_index(gpu, None) == 1
    assert nvml.nvml_index(gpu, "3,5") == 5
    assert nvml.nvml_index(gpu, "GPU-aaa,GPU-bbb") == "GPU-bbb"
    with pytest.raises(GuardUnavailable, match="MIG"):
        nvml.nvml_index(gpu, "0,MIG-xyz")
    with pytest.raises(GuardUnavailable, match="not in CUDA_VISIBLE_DEVICES"):
        nvml.nvml_index(gpu, "0")
    assert nvml.clock_event_names(0x1 | 0x4 | 0x40) == ("sw_power_cap", "hw_thermal_slowdown")
