"""The derived facts named once in monitor.model: which GPU is compared with which CPU, and each device's state."""

from __future__ import annotations

from typing import Any

from monitor.model import (
    DeviceFailure,
    DeviceInfo,
    DeviceState,
    Withheld,
    WithheldReason,
    gpu_cpu_pairs,
)
from tests.builders import measurement, point_key, snapshot

CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
GPU0 = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
GPU1 = DeviceInfo(backend="fake", device="/GPU:1", kind="gpu", name="gpu")
TORCH_CPU = DeviceInfo(backend="torch", device="cpu", kind="cpu", name="cpu")
TORCH_GPU = DeviceInfo(backend="torch", device="cuda:0", kind="gpu", name="gpu")


def test_each_cpu_is_paired_with_the_gpus_of_its_own_backend_in_order() -> None:
    """Each CPU is paired with its own backend's GPUs, in the order they were found."""
    pairs = gpu_cpu_pairs([GPU0, TORCH_GPU, CPU, GPU1, TORCH_CPU])
    assert pairs == ((CPU, (GPU0, GPU1)), (TORCH_CPU, (TORCH_GPU,)))


def test_a_cpu_without_a_gpu_beside_it_is_paired_with_none() -> None:
    """A CPU with no GPU of its backend is paired with none; a GPU with no CPU makes no pair."""
    assert gpu_cpu_pairs([CPU, TORCH_GPU]) == ((CPU, ()),)
    assert gpu_cpu_pairs([GPU0]) == ()


def _states(**fields: Any) -> dict[str, tuple[DeviceState, str]]:
    served = snapshot([CPU, GPU0, GPU1], [measurement("/CPU:0", 16, 1.0)], crossovers=(), **fields)
    return {d.device: served.device_state(d.device) for d in served.devices}


def test_a_measured_device_is_measured_even_where_a_point_of_it_failed() -> None:
    """A device with points served is measured, whatever failures of single points it had."""
    point = point_key("/CPU:0", 32)
    states = _states(failures=(DeviceFailure(backend="fake", device="/CPU:0", reason="oom", point=point),))
    assert states["/CPU:0"] == (DeviceState.MEASURED, "")


def test_a_withheld_device_says_why_and_a_whole_failure_outranks_it() -> None:
    """A withheld device's state says the reason; a device that failed as a whole is failed, withheld or not."""
    busy = Withheld(backend="fake", device="/GPU:0", reason=WithheldReason.GPU_BUSY, detail="1 other process")
    gone = DeviceFailure(backend="fake", device="/GPU:1", reason="device lost")
    also = Withheld(backend="fake", device="/GPU:1", reason=WithheldReason.YIELDED, detail="a job started")
    states = _states(withheld=(busy, also), failures=(gone,))
    assert states["/GPU:0"] == (DeviceState.WITHHELD, "gpu_busy")
    assert states["/GPU:1"] == (DeviceState.FAILED, "device lost")


def test_a_device_that_measured_nothing_failed_with_the_reason_of_its_points_or_that_it_measured_nothing() -> None:
    """A device with nothing served failed: with its points' failure reason, or that nothing was measured."""
    point = point_key("/GPU:0", 16)
    states = _states(failures=(DeviceFailure(backend="fake", device="/GPU:0", reason="out of memory", point=point),))
    assert states["/GPU:0"] == (DeviceState.FAILED, "out of memory")
    assert states["/GPU:1"] == (DeviceState.FAILED, "nothing was measured")
