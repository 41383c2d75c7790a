"""The plan a sweep sends to its worker and the JSON lines the worker streams back."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monitor.config import BenchmarkSettings, GuardSettings, RefineSettings, TimingSettings
from monitor.model import (
    DeviceFailure,
    DeviceInfo,
    HardwareContext,
    Measurement,
    Mode,
    PointKey,
    StopReason,
    Timing,
    Withheld,
    WithheldReason,
)


class ProtocolError(ValueError):
    """A line from the worker is not a message this version understands."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything a worker needs to time one sweep."""

    backend: str
    devices: tuple[str, ...] | None
    sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    modes: tuple[Mode, ...]
    tf32: bool
    cpu_threads: int | None
    timing: TimingSettings
    refine: RefineSettings = dataclasses.field(default_factory=lambda: RefineSettings(enabled=False))
    skip_cpu_above_speedup: float | None = None
    expect_gpus: int = 0
    given_up: tuple[str, ...] = ()  # devices that failed fatally before: reported, not retried
    guard: GuardSettings = dataclasses.field(default_factory=lambda: GuardSettings(enabled=False))
    # A retry of busy GPUs: look at them first, and time nothing (not even the CPU) if all are still busy.
    retry: bool = False

    @classmethod
    def from_settings(cls, bench: BenchmarkSettings, guard: GuardSettings) -> Plan:
        return cls(
            guard=guard,
            backend=bench.backend,
            devices=bench.devices,
            sizes=bench.sizes,
            dtypes=bench.dtypes,
            modes=bench.modes,
            tf32=bench.tf32,
            cpu_threads=bench.cpu_threads,
            timing=bench.timing,
            refine=bench.refine,
            skip_cpu_above_speedup=bench.skip_cpu_above_speedup,
            expect_gpus=bench.expect_gpus,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        data = json.loads(text)
        devices = data.pop("devices")
        return cls(
            devices=tuple(devices) if devices is not None else None,
            sizes=tuple(data.pop("sizes")),
            dtypes=tuple(data.pop("dtypes")),
            modes=tuple(data.pop("modes")),
            timing=TimingSettings(**data.pop("timing")),
            refine=RefineSettings(**data.pop("refine")),
            given_up=tuple(data.pop("given_up")),
            guard=GuardSettings(**data.pop("guard", {"enabled": False})),
            **data,
        )


@dataclass(frozen=True)
class Environment:
    values: dict[str, str]


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Fatal:
    reason: str


Message = Environment | DeviceInfo | Measurement | DeviceFailure | Withheld | HardwareContext | Done | Fatal


def encode(message: Message) -> str:
    """One JSON line (without the newline) for a message."""
    if isinstance(message, Environment):
        body: dict[str, Any] = {"type": "environment", "values": message.values}
    elif isinstance(message, DeviceInfo):
        body = {"type": "device", **dataclasses.asdict(message)}
    elif isinstance(message, Measurement):
        timing = dataclasses.asdict(message.timing)
        timing["stop_reason"] = message.timing.stop_reason.value
        body = {"type": "measurement", "key": dataclasses.asdict(message.key), "timing": timing, "role": message.role}
    elif isinstance(message, DeviceFailure):
        body = {"type": "failure", **dataclasses.asdict(message)}
    elif isinstance(message, Withheld):
        body = {"type": "withheld", **dataclasses.asdict(message), "reason": message.reason.value}
    elif isinstance(message, HardwareContext):
        body = {"type": "hardware", **dataclasses.asdict(message)}
    elif isinstance(message, Done):
        body = {"type": "done"}
    else:
        body = {"type": "fatal", "reason": message.reason}
    return json.dumps(body, separators=(",", ":"))


def _measurement(body: dict[str, Any]) -> Measurement:
    timing = body["timing"]
    timing["stop_reason"] = StopReason(timing["stop_reason"])
    timing["samples_s"] = tuple(timing["samples_s"])
    return Measurement(key=PointKey(**body["key"]), timing=Timing(**timing), role=body.get("role", "sweep"))


def _failure(body: dict[str, Any]) -> DeviceFailure:
    point = body.pop("point")
    return DeviceFailure(point=PointKey(**point) if point else None, **body)


_DECODERS: dict[str, Callable[[dict[str, Any]], Message]] = {
    "environment": lambda body: Environment({str(k): str(v) for k, v in body["values"].items()}),
    "device": lambda body: DeviceInfo(**{**body, "details": tuple(tuple(pair) for pair in body["details"])}),
    "measurement": _measurement,
    "failure": _failure,
    "withheld": lambda body: Withheld(**{**body, "reason": WithheldReason(body["reason"])}),
    "hardware": lambda body: HardwareContext(**{**body, "clock_events": tuple(body["clock_events"])}),
    "done": lambda _: Done(),
    "fatal": lambda body: Fatal(str(body["reason"])),
}


def decode(line: str) -> Message:
    """The message in one line from the worker; raises ProtocolError for anything else."""
    try:
        body = json.loads(line)
        kind = body.pop("type")
        decoder = _DECODERS.get(kind)
        if decoder is not None:
            return decoder(body)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProtocolError(f"malformed worker message {line[:200]!r}: {exc}") from None
    raise ProtocolError(f"unknown worker message type {kind!r}")
