"""The settings: frozen types whose fields declare their YAML key, converter and meaning (stdlib only).

The constraints hold however a value is built (from YAML, from the worker's JSON, in a test): each type
checks its fields against their ``Key`` when it is created, with the converters of ``convert.py``. ``loader.py``
reads YAML into these types and ``schema.py`` describes them as a JSON Schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from crossover_monitor.config.convert import (
    ANY_HOST,
    DAY_S,
    MAX_COUNT,
    MAX_PORT,
    Bad,
    Converter,
    backend_name,
    boolean,
    choice,
    cron_line,
    device_name,
    directory_path,
    duration,
    fraction,
    integer,
    listed,
    listen_address,
    listen_text,
    matrix_size,
    number,
    speedup_factor,
)
from crossover_monitor.errors import Problem
from crossover_monitor.model import BACKENDS, DTYPES, MODES, Mode, canonical_device
from crossover_monitor.text import abridged

DEFAULT_PORT = 9437
# Keys of earlier releases, and the keys of one meaning each that replaced them: the reader carries an old key's value
# to each of them the file does not set (so no verdict changes) and warns; the schema lists it as deprecated.
REPLACED_KEYS: dict[str, tuple[str, ...]] = {
    "guard.host_max_slowdown": ("reference_max_slowdown", "range_max_slowdown", "cpu_max_threads_wait"),
    "guard.point_figure_other_cores": ("range_others_cores",),
}


class Conflict(NamedTuple):
    """A rule between keys of one section that the values break."""

    key: str  # the YAML key to name; "" names the section
    message: str
    fields: tuple[str, ...]  # the fields whose defaults stand in while the problem is reported


@dataclass(frozen=True)
class Key:
    """How a settings field is written in the YAML file: its key, its converter (the rule) and its meaning.

    Declared once on the field (``metadata``); the reader converts with it, the type checks values built
    in code with it, and ``schema.py`` takes the JSON Schema from it, so the three cannot drift apart.
    """

    name: str
    convert: Converter
    help: str
    auto: bool = False  # the field holds None for the YAML value "auto"
    nullable: bool = False  # None is a value the field may hold (off, or another key in use); auto implies it


def key(name: str, convert: Converter, help_text: str, *, auto: bool = False, nullable: bool = False) -> dict[str, Key]:
    return {"yaml": Key(name, convert, help_text, auto=auto, nullable=nullable)}


def yaml_key(f: dataclasses.Field[Any]) -> Key | None:
    found = f.metadata.get("yaml")
    return found if isinstance(found, Key) else None


def _check(instance: Any) -> None:
    """Every field against its Key, then the section's rules between keys; a ValueError naming the key
    for the first that does not hold (the same converters and rules as the YAML reader's, so the same words)."""
    values = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}
    for f in dataclasses.fields(instance):
        k = yaml_key(f)
        value = values[f.name]
        if k is None or (value is None and (k.nullable or k.auto)):
            continue
        if k.convert.text_form and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TypeError(f"{k.name}: must be a number (seconds for a duration), got {abridged(value)}")
        verdict = k.convert(value)
        if isinstance(verdict, Bad):
            where = f"{k.name}[{verdict.items[0][0]}]" if verdict.items else k.name
            raise ValueError(f"{where}: {verdict.message}")  # noqa: TRY004 - a broken rule: the codec names the field
        if isinstance(value, (list, tuple)) and verdict != tuple(value):  # only an ascending list changes one
            raise ValueError(f"{k.name}: must be in ascending order")
    for conflict in type(instance).conflicts(values):
        raise ValueError(f"{conflict.key or type(instance).SECTION}: {conflict.message}")


class Section:
    """What every settings section has: its place in the file and its rules between keys."""

    SECTION: ClassVar[str]  # its key path in the file: "benchmark.timing"

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:  # noqa: ARG004 - most sections have none
        """The rules between keys that ``values`` (field name to value, each valid alone) break."""
        return []

    def __post_init__(self) -> None:
        _check(self)


def sections(cls: type[Any]) -> dict[str, type[Section]]:
    """The sections ``cls`` holds, by field name (the YAML key), in the order the file lists them."""
    found: dict[str, type[Section]] = {}
    for f in dataclasses.fields(cls):
        made = f.default_factory
        if isinstance(made, type) and issubclass(made, Section):
            found[f.name] = made
    return found


@dataclass(frozen=True, kw_only=True)
class ScheduleSettings(Section):
    SECTION: ClassVar[str] = "schedule"

    interval_s: float | None = field(  # None: the cron line says when
        default=900.0,
        metadata=key(
            "interval",
            duration(positive=True, minimum=1, maximum=366 * DAY_S),
            "time between sweeps (or use cron, not both)",
            nullable=True,
        ),
    )
    cron: str | None = field(
        default=None,
        metadata=key(
            "cron",
            cron_line,
            "5-field crontab in UTC; weekday 0 and 7 are Sunday; restrict day of month or weekday, not both",
            nullable=True,
        ),
    )
    jitter_s: float = field(
        default=0.0,
        metadata=key(
            "jitter",
            duration(positive=False),
            "random delay up to this, to spread a fleet's sweeps; shorter than the interval",
        ),
    )

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:
        interval, cron, jitter = values["interval_s"], values["cron"], values["jitter_s"]
        found = []
        if interval is not None and cron is not None:
            found.append(Conflict("", "set either interval or cron, not both", ("interval_s", "cron")))
        if interval is None and cron is None:
            found.append(Conflict("", "set an interval or a cron", ("interval_s",)))
        if interval is not None and jitter >= interval:
            message = f"must be shorter than the interval ({interval:g}s), got {jitter:g}s"
            found.append(Conflict("jitter", message, ("jitter_s",)))
        return found


@dataclass(frozen=True, kw_only=True)
class TimingSettings(Section):
    """How hard the timing loop tries for each point."""

    SECTION: ClassVar[str] = "benchmark.timing"

    # At least one: it also waits out operand creation, which the GPU does asynchronously.
    warmup_calls: int = field(
        default=2, metadata=key("warmup_calls", integer(1), "untimed calls per point before calibration")
    )
    block_s: float = field(
        default=0.02, metadata=key("block_time", duration(positive=True), "a timed block lasts at least this")
    )
    min_blocks: int = field(default=5, metadata=key("min_blocks", integer(3), "timed blocks per point, at least"))
    max_blocks: int = field(default=10, metadata=key("max_blocks", integer(3), "timed blocks per point, at most"))
    target_spread: float = field(
        default=0.05,
        metadata=key("target_spread", fraction, "stop once IQR/median is at most this; above it a point is noisy"),
    )
    size_budget_s: float = field(
        default=5.0, metadata=key("size_budget", duration(positive=True), "stop repeating a point after this long")
    )

    @staticmethod
    def conflicts(values: Mapping[str, Any]) -> list[Conflict]:
        least, most = values["min_blocks"], values["max_blocks"]
        if most >= least:
            return []
        return [
            Conflict("max_blocks", f"must be at least min_blocks ({least}), got {most}", ("max_blocks", "min_blocks"))
        ]


@dataclass(frozen=True, kw_only=True)
class RefineSettings(Section):
    """Sizes added around each crossover, each timed in several visits: where n* lies, and how well it is known."""

    SECTION: ClassVar[str] = "benchmark.refine"

    enabled: bool = field(
        default=True, metadata=key("enabled", boolean, "time sizes around each crossover in several visits")
    )
    visits: int = field(
        default=7,
        metadata=key(
            "visits",
            integer(2, 50),
            "visits of each size around a crossover, round-robin; n* and its interval come from their medians",
        ),
    )
    spacing: float = field(
        default=0.2,
        metadata=key(
            "spacing", fraction, "sizes added between the configured sizes around n* are this far apart at most"
        ),
    )
    budget_s: float = field(
        default=60.0, metadata=key("budget", duration(positive=True), "at most this much extra time per sweep")
    )


@dataclass(frozen=True, kw_only=True)
class BenchmarkSettings(Section):
    SECTION: ClassVar[str] = "benchmark"

    backend: str = field(
        default="tensorflow",
        metadata=key(
            "backend",
            backend_name,
            f"{', '.join(BACKENDS)}, or a plugin 'package.module:attribute'",
        ),
    )
    devices: tuple[str, ...] | None = field(  # None: "auto", the CPU and every visible GPU
        default=None,
        metadata=key(
            "devices",
            listed(
                device_name, same=canonical_device, noun="device", instead_of_text="'auto' or a list of device names"
            ),
            "auto = the CPU and every visible GPU; or a list of framework device names",
            auto=True,
        ),
    )
    sizes: tuple[int, ...] = field(
        default=(1, 10, 100, 500, 1000, 2000, 4000),
        metadata=key("sizes", listed(matrix_size, ascending=True), "n of the n×n operands"),
    )
    dtypes: tuple[str, ...] = field(
        default=("float32",),
        metadata=key("dtypes", listed(choice(DTYPES, "dtype")), "element types"),
    )
    modes: tuple[Mode, ...] = field(
        default=("compute", "end_to_end"),
        metadata=key(
            "modes",
            listed(choice(MODES, "mode")),
            "compute: operands on the device; end_to_end: copied in and out every call",
        ),
    )
    timeout_s: float = field(
        default=600.0, metadata=key("timeout", duration(positive=True), "deadline for a whole sweep")
    )
    tf32: bool = field(default=False, metadata=key("tf32", boolean, "TensorFloat-32 for float32 matmul"))
    cpu_threads: int | None = field(  # None: "auto", from affinity and the container's CPU quota
        default=None,
        metadata=key(
            "cpu_threads",
            integer(1),
            "framework CPU threads; auto = the usable cores, less one from four cores on",
            auto=True,
        ),
    )
    timing: TimingSettings = field(default_factory=TimingSettings)
    refine: RefineSettings = field(default_factory=RefineSettings)
    # Stop timing the CPU at larger sizes once every GPU beat it by this factor at two sizes in a row.
    skip_cpu_above_speedup: float | None = field(
        default=None,
        metadata=key(
            "skip_cpu_above_speedup",
            speedup_factor,
            "stop timing the CPU once every GPU beat it by this factor at two sizes in a row",
            nullable=True,
        ),
    )
    # Between whole curves a sweep times only what can move the served crossovers and carries the rest with
    # its own time (``analysis.focus``); every point is timed at least this often. 0: every sweep times all.
    full_curve_every_s: float = field(
        default=3600.0,
        metadata=key(
            "full_curve_every",
            duration(positive=False),
            "time every point at least this often; sweeps between time the sizes around n*; 0 = every sweep",
        ),
    )
    # GPUs this machine must have: fewer found is a failure (driver gone), not a quiet CPU-only sweep.
    expect_gpus: int = field(default=0, metadata=key("expect_gpus", integer(0), "GPUs the machine must have"))


@dataclass(frozen=True, kw_only=True)
class GuardSettings(Section):
    """The interference guard: what counts as another program using a GPU or the CPU's cores."""

    SECTION: ClassVar[str] = "guard"

    enabled: bool = field(default=True, metadata=key("enabled", boolean, "the interference guard"))
    # Without NVML the guard cannot see other programs on a GPU: then the GPU is not timed.
    require_nvml: bool = field(
        default=True,
        metadata=key("require_nvml", boolean, "without NVML, withhold GPUs instead of timing them blind"),
    )
    gpu_max_utilization_pct: float = field(  # busier than this before the worker uses it: busy
        default=10.0,
        metadata=key("gpu_max_utilization", number(0, 100), "percent; busier before the worker used it is busy"),
    )
    gpu_max_other_processes: int = field(  # more processes of other programs on it than this: busy
        default=0,
        metadata=key("gpu_max_other_processes", integer(0), "more other programs' processes than this: busy"),
    )
    # A process that holds at most this much GPU memory and ran no kernel in the last second is a
    # stray context (a framework opens one on GPU 0 by default), not a job: it does not count.
    gpu_idle_process_max_mib: int = field(
        default=1024,
        metadata=key(
            "gpu_idle_process_max_mib", integer(0), "an idle process holding at most this many MiB is ignored"
        ),
    )
    # Other programs' load on the worker's cores, beyond the cores its threads leave free, in cores.
    cpu_max_other_cores: float = field(
        default=0.5,
        metadata=key(
            "cpu_max_other_cores",
            number(0, MAX_COUNT),
            "cores others may use beyond those the threads leave free",
        ),
    )
    # A GPU point whose host side waited for a CPU longer than this share of it is disturbed (its time includes it).
    gpu_max_host_wait: float = field(
        default=0.05,
        metadata=key(
            "gpu_max_host_wait",
            number(0, 1),
            "a GPU point whose timing thread waited for a CPU more than this share of it is disturbed (1: never)",
        ),
    )
    # Row 4 of the rule (measure/guard/rule.py): how far the host reference may read the host slower than its idle
    # figure, weighed by the share of the point's time that is the host's, before the point counts as slowed.
    reference_max_slowdown: float = field(
        default=0.10,
        metadata=key(
            "reference_max_slowdown",
            number(0, MAX_COUNT),
            "a share: a point the host reference says a slower host moved by more (its slowdown × the point's host "
            "share) is slowed; wider where the reference is noisy, up to 0.25",
        ),
    )
    # Rows 3 and 5: how far a point may read past the top of its own idle range (its medians in recent calm sweeps).
    range_max_slowdown: float = field(
        default=0.10,
        metadata=key(
            "range_max_slowdown",
            number(0, MAX_COUNT),
            "a share: a point within this of its idle range's top stands whatever the reference read; past it by "
            "more, beside others or a slowed host, it is slowed",
        ),
    )
    # Row 2, a CPU point's blocks: its threads' run-queue wait over one timed block, in cores, past which the block
    # is set aside (a fork-join call waits for its slowest thread).
    cpu_max_threads_wait: float = field(
        default=0.10,
        metadata=key(
            "cpu_max_threads_wait",
            number(0, MAX_COUNT),
            "cores: a CPU point's timed block in which its threads waited for a CPU more than this is set aside",
        ),
    )
    # Row 5: the load of other programs (or the hypervisor's steal) from which a host-bound point is held against its
    # idle range (on a node whose others use this many in nine recent sweeps of ten, this many more than that: the
    # gate of ranges.others_gate, which also says which sweeps are calm enough to build the ranges).
    range_others_cores: float = field(
        default=0.75,
        metadata=key(
            "range_others_cores",
            number(0, MAX_COUNT),
            "cores: while others use this many (this many more than usual on a node never that quiet), a host-bound "
            "point past its idle range is slowed",
        ),
    )
    retry_interval_s: float = field(  # retry withheld devices this often until measured or the next sweep; 0: off
        default=60.0,
        metadata=key(
            "retry_interval",
            duration(positive=False, minimum=10),
            "retry devices withheld for other work (a busy GPU, every core taken) this often; 0 waits for the next "
            "sweep",
        ),
    )


@dataclass(frozen=True, kw_only=True)
class ServerSettings(Section):
    SECTION: ClassVar[str] = "server"

    address: tuple[str, int] = field(  # an exporter listens on every interface by default
        default=(ANY_HOST, DEFAULT_PORT),
        metadata=key("listen", listen_address, f"where to serve, HOST:PORT (IPv6 in brackets); port 1 to {MAX_PORT}"),
    )

    @property
    def host(self) -> str:
        return self.address[0]

    @property
    def port(self) -> int:
        return self.address[1]

    @property
    def listen(self) -> str:
        return listen_text(self.address)


# systemd's StateDirectory= sets this; where it is set and history.directory is not, the history lives there.
STATE_DIRECTORY_ENV = "STATE_DIRECTORY"


@dataclass(frozen=True, kw_only=True)
class HistorySettings(Section):
    """The run history: every sweep in SQLite, and the served results read back after a restart."""

    SECTION: ClassVar[str] = "history"

    directory: str | None = field(
        default=None,
        metadata=key(
            "directory",
            directory_path,
            f"where the history lives; null: ${STATE_DIRECTORY_ENV} (systemd's StateDirectory=), else no history",
            nullable=True,
        ),
    )
    keep_runs: int = field(
        default=10000,
        metadata=key("keep_runs", integer(1, 10_000_000), "runs kept; older ones are deleted"),
    )

    def resolved_directory(self, environ: Mapping[str, str]) -> str | None:
        """The directory in use: the configured one, else systemd's state directory, else none."""
        if self.directory is not None:
            return self.directory
        # StateDirectory= may list several, separated by colons; the first is this service's.
        return (environ.get(STATE_DIRECTORY_ENV) or "").split(":")[0] or None


@dataclass(frozen=True, kw_only=True)
class Settings:
    schedule: ScheduleSettings = field(default_factory=ScheduleSettings)
    benchmark: BenchmarkSettings = field(default_factory=BenchmarkSettings)
    guard: GuardSettings = field(default_factory=GuardSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    history: HistorySettings = field(default_factory=HistorySettings)
    source: str = "<defaults>"
    # Keys of earlier releases the file used, each carried to the keys that replaced it: said at every load.
    replaced: tuple[Problem, ...] = field(default=(), compare=False)
