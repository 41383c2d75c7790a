"""The plan a sweep sends to its worker and the JSON lines the worker streams back."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from crossover_monitor.codec import DecodeError, from_data, parse_json, to_data
from crossover_monitor.config.settings import BenchmarkSettings, GuardSettings
from crossover_monitor.model import (
    Crossover,
    DeviceFailure,
    DeviceInfo,
    HardwareContext,
    HostReference,
    Measurement,
    PointKey,
    RangeTop,
    Role,
    Withheld,
)
from crossover_monitor.text import abridged


class ProtocolError(ValueError):
    """A line from the worker is not a message this version understands."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything a worker needs to time one sweep: the benchmark settings, and what this run adds to them."""

    bench: BenchmarkSettings
    guard: GuardSettings = dataclasses.field(default_factory=lambda: GuardSettings(enabled=False))
    given_up: tuple[str, ...] = ()  # devices that failed fatally before: reported, not retried
    # A retry of withheld devices: look at its GPUs first, and time nothing (not even the CPU) if all are still busy.
    retry: bool = False
    # The host reference's idle figure from recent sweeps; None: the worker has only this sweep's readings.
    host_baseline: HostReference | None = None
    # The top of each point's idle range over recent calm sweeps (``ServiceState.range_tops``), and what they
    # were timed with (``model.timed_with``): a worker that times otherwise leaves them unused.
    range_tops: tuple[RangeTop, ...] = ()
    range_tops_timed_as: str = ""
    # What other programs use of the host in nine recent sweeps of ten (``ServiceState.usual_others``), in cores.
    usual_others: float = 0.0
    # Points of the served curve this sweep need not time again (``analysis.focus``), each with when it was timed:
    # the worker serves them as they are unless the crossovers it finds lean on them.
    carried: tuple[Measurement, ...] = ()
    carried_timed_as: str = ""  # what they were timed with (``model.timed_with``)
    # The served crossovers found (timed as ``carried_timed_as`` says): the refinement's first visits go to the
    # sizes around their intervals, and further only where this sweep's crossing lies elsewhere.
    refine_around: tuple[Crossover, ...] = ()

    def to_json(self) -> str:
        return json.dumps(to_data(self))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan in one line; ValueError (DecodeError naming the field) for anything else."""
        return from_data(cls, parse_json(text), verbatim=True)


@dataclass(frozen=True)
class Environment:
    values: dict[str, str]


@dataclass(frozen=True)
class Started:
    """The worker begins timing a point (for progress on a terminal; nothing is recorded from it)."""

    key: PointKey
    role: Role


@dataclass(frozen=True)
class Done:
    pass


@dataclass(frozen=True)
class Fatal:
    reason: str


Message = Environment | DeviceInfo | Started | Measurement | DeviceFailure | Withheld | HardwareContext | Done | Fatal


# The wire name of each message type: one JSON object per line, its fields as to_data writes them.
_TAGS: dict[str, type[Message]] = {
    "environment": Environment,
    "device": DeviceInfo,
    "started": Started,
    "measurement": Measurement,
    "failure": DeviceFailure,
    "withheld": Withheld,
    "hardware": HardwareContext,
    "done": Done,
    "fatal": Fatal,
}
_TAG_OF = {cls: tag for tag, cls in _TAGS.items()}


def encode(message: Message) -> str:
    """One JSON line (without the newline) for a message."""
    return json.dumps({"type": _TAG_OF[type(message)], **to_data(message)}, separators=(",", ":"))


def decode(line: str) -> Message:
    """The message in one line from the worker; raises ProtocolError naming the field at fault."""
    try:
        body = parse_json(line)
    except ValueError as exc:
        raise ProtocolError(f"malformed worker message {abridged(line, 200)}: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"malformed worker message {abridged(line, 200)}: not a JSON object")
    kind = body.pop("type", None)
    cls = _TAGS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown worker message type {kind!r}")
    try:
        return from_data(cls, body)
    except DecodeError as exc:
        raise ProtocolError(f"malformed {kind} message from the worker: {exc}") from None
