"""The derived facts named once in crossover_monitor.model: the built-in backends, which GPU is compared with which
CPU, and each device's state."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from crossover_monitor.measure.registry import BUILTIN
from crossover_monitor.model import (
    BACKENDS,
    BUILTIN_BACKENDS,
    Crossover,
    CrossoverState,
    DeviceFailure,
    DeviceInfo,
    DeviceState,
    Withheld,
    WithheldReason,
    gpu_cpu_pairs,
    same_timing,
    timed_with,
)
from tests.builders import measurement, point_key, snapshot

CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
GPU0 = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
GPU1 = DeviceInfo(backend="fake", device="/GPU:1", kind="gpu", name="gpu")
TORCH_CPU = DeviceInfo(backend="torch", device="cpu", kind="cpu", name="cpu")
TORCH_GPU = DeviceInfo(backend="torch", device="cuda:0", kind="gpu", name="gpu")
REPO = Path(__file__).resolve().parent.parent


def test_each_builtin_backend_has_its_module() -> None:
    """One table: each built-in backend is crossover_monitor/measure/backends/<name>_backend.py."""
    assert tuple(BUILTIN) == BACKENDS
    for name in BUILTIN_BACKENDS:
        assert (REPO / "crossover_monitor" / "measure" / "backends" / f"{name}_backend.py").is_file()
    assert BUILTIN_BACKENDS["tensorflow"].gpu_device(1) == "/GPU:1"


def test_the_example_configuration_names_every_builtin_backend() -> None:
    """The comment above benchmark.backend (copied into the Kubernetes ConfigMap) lists the table's backends."""
    lines = (REPO / "deploy" / "config.example.yaml").read_text(encoding="utf-8").splitlines()
    comment = lines[lines.index("  backend: tensorflow") - 1]
    listed = comment.removeprefix("  # ").partition(";")[0]
    assert re.findall(r"\w+", listed.replace(" (default)", "").replace(" or ", ", ")) == list(BACKENDS)


def test_each_cpu_is_paired_with_the_gpus_of_its_own_backend_in_order() -> None:
    """Each CPU is paired with its own backend's GPUs, in the order they were found."""
    pairs = gpu_cpu_pairs([GPU0, TORCH_GPU, CPU, GPU1, TORCH_CPU])
    assert pairs == ((CPU, (GPU0, GPU1)), (TORCH_CPU, (TORCH_GPU,)))


def test_a_cpu_without_a_gpu_beside_it_is_paired_with_none() -> None:
    """A CPU with no GPU of its backend is paired with none; a GPU with no CPU makes no pair."""
    assert gpu_cpu_pairs([CPU, TORCH_GPU]) == ((CPU, ()),)
    assert gpu_cpu_pairs([GPU0]) == ()


def test_a_crossover_names_its_pair_or_the_cpu_alone_where_there_was_no_gpu() -> None:
    found = Crossover(
        backend="fake", gpu="/GPU:0", cpu="/CPU:0", dtype="float32", mode="compute", state=CrossoverState.FOUND
    )
    assert found.pair_label == "/GPU:0 vs /CPU:0"
    alone = Crossover(
        backend="fake", gpu="none", cpu="/CPU:0", dtype="float32", mode="compute", state=CrossoverState.NO_GPU
    )
    assert alone.pair_label == "/CPU:0"


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


def test_what_points_were_timed_with_keeps_what_a_sweep_left_out_and_compares_what_both_said() -> None:
    """``timed_with`` keeps an earlier entry a sweep did not report; ``same_timing`` differs only on an entry both
    have, and never on entries outside TIMED_WITH."""
    earlier = timed_with({"framework": "torch", "cpu_threads": "15", "driver_version": "580", "host_reference_s": "1"})
    assert earlier == "framework=torch;cpu_threads=15;driver_version=580"
    assert timed_with({"cpu_threads": "15", "framework_version": "2.11"}, earlier) == (
        "framework=torch;framework_version=2.11;cpu_threads=15;driver_version=580"
    )
    assert same_timing(earlier, {"cpu_threads": "15", "host_reference_s": "2"})
    assert same_timing(earlier, {"driver_version": ""})  # not reported
    assert not same_timing(earlier, {"cpu_threads": "14"})
    assert same_timing("", {"cpu_threads": "14"})  # nothing to hold it against
