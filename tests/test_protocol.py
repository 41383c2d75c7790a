"""The worker's wire format round-trips every message and rejects garbage clearly."""

from __future__ import annotations

import pytest

from crossover_monitor.config.settings import BenchmarkSettings, GuardSettings
from crossover_monitor.model import (
    DeviceFailure,
    DeviceInfo,
    HardwareContext,
    HostReference,
    Measurement,
    RangeTop,
    StopReason,
    Withheld,
    WithheldReason,
)
from crossover_monitor.protocol import Done, Environment, Fatal, Message, Plan, ProtocolError, Started, decode, encode
from tests.builders import point_key, timing

KEY = point_key("/GPU:0", 512, backend="tensorflow", mode="end_to_end")


@pytest.mark.parametrize(
    "message",
    [
        Environment({"framework_version": "2.21.0"}),
        DeviceInfo(
            backend="tensorflow", device="/GPU:0", kind="gpu", name="H200", details=(("compute_capability", "9.0"),)
        ),
        Measurement(
            key=KEY,
            timing=timing(
                1e-3,
                iqr_s=1e-5,
                blocks=7,
                calls_per_block=3,
                stop_reason=StopReason.BUDGET,
                noisy=True,
                samples_s=(1e-3, 2e-3),
            ),
            others_cores=0.98,
        ),
        DeviceFailure(backend="tensorflow", device="/GPU:0", reason="oom", point=KEY),
        DeviceFailure(backend="tensorflow", device="/GPU:1", reason="gone", fatal=True),
        Withheld(backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="1 other process"),
        Withheld(
            backend="tensorflow",
            device="/GPU:0",
            reason=WithheldReason.HOST_SLOWED,
            detail="1.4x",
            point=KEY,
        ),
        HardwareContext(
            backend="torch",
            device="cuda:0",
            sm_clock_min_hz=1.98e9,
            clock_events=("sw_power_cap",),
            pcie_generation_min=5,
            other_processes_max=0,
        ),
        HardwareContext(backend="torch", device="cpu", other_cpu_cores=0.25, cpu_throttled_s=0.0),
        Started(key=KEY, role="refine"),
        Done(),
        Fatal("boom"),
    ],
)
def test_messages_round_trip(message: Message) -> None:
    """decode(encode(m)) == m for every message type."""
    assert decode(encode(message)) == message


def test_plan_round_trips_from_settings() -> None:
    """The plan built from settings survives the trip to the worker."""
    plan = Plan(
        bench=BenchmarkSettings(devices=("/CPU:0",), cpu_threads=3),
        guard=GuardSettings(cpu_max_other_cores=0.25, range_others_cores=1.5),
        host_baseline=HostReference(median_s=4.5e-4, spread=0.04),
        range_tops=(RangeTop(key=point_key("/CPU:0", 64), upper_s=1e-3, sweeps=4),),
    )
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("line", ["not json", '{"type": "alien"}', '{"type": "measurement"}', "[]"])
def test_garbage_is_a_protocol_error(line: str) -> None:
    """Anything that is not a known message raises ProtocolError naming the problem."""
    with pytest.raises(ProtocolError):
        decode(line)
