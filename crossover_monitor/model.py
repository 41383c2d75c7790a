"""The shared vocabulary: immutable value objects passed between the layers (stdlib only)."""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from crossover_monitor.analysis import ranges

Mode = Literal["compute", "end_to_end"]
DeviceKind = Literal["cpu", "gpu"]
# sweep: a configured size; fixed_cost: the n=1 point timed for the fixed cost when 1 is not configured;
# refine: a size added between the two configured sizes around a crossover, to locate it. Only sweep
# points become duration series.
Role = Literal["sweep", "fixed_cost", "refine"]

MODES: tuple[Mode, ...] = ("compute", "end_to_end")
DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True, kw_only=True)
class BuiltinBackend:
    """What is fixed about one built-in backend, crossover_monitor/measure/backends/<name>_backend.py."""

    name: str
    gpu_prefix: str  # how the framework names its GPUs: this and the index, e.g. "/GPU:0"
    install: str  # what pip installs to bring the framework

    def gpu_device(self, index: int) -> str:
        return f"{self.gpu_prefix}{index}"


# Built-in backends by name; anything else is a plugin "package.module:attribute".
BUILTIN_BACKENDS: Mapping[str, BuiltinBackend] = {
    b.name: b
    for b in (
        BuiltinBackend(
            name="tensorflow",
            gpu_prefix="/GPU:",
            install="crossover-monitor",  # a dependency of the package itself; [cuda] adds its CUDA libraries
        ),
        BuiltinBackend(name="torch", gpu_prefix="cuda:", install="crossover-monitor[torch]"),
        # The JAX backend names a device by its platform, as JAX does: "gpu" for CUDA and ROCm GPUs alike.
        BuiltinBackend(name="jax", gpu_prefix="gpu:", install="crossover-monitor[jax]"),
    )
}
BACKENDS: tuple[str, ...] = tuple(BUILTIN_BACKENDS)
# The environment entry in which a backend that found no GPU says why, and how to fix it
# (crossover_monitor/measure/nogpu.py).
GPU_PROBLEM = "gpu_problem"
# A CPU device's detail: how its framework shares a parallel call among its threads. "fork_join": each
# call waits for its slowest thread (OpenMP: PyTorch), so a neighbour beside one thread stalls it;
# "work_stealing": idle threads take over a waiting thread's share (TensorFlow's Eigen pool), so it does not
# (a pool of one thread has none to take it).
THREAD_POOL = "thread_pool"
FORK_JOIN = "fork_join"
WORK_STEALING = "work_stealing"
# The environment keys the worker adds to its backend's: the cores it may run on, as a cpuset list
# ("0-15"), and the GPU driver's version where NVML says it.
CPU_AFFINITY = "cpu_affinity"
DRIVER_VERSION = "driver_version"
# The environment keys of the sweep's host reference: the median reading of the host-only reference workload
# over the sweep, in seconds, and the readings' relative IQR (the daemon's baseline comes from recent ones).
HOST_REFERENCE = "host_reference_s"
HOST_REFERENCE_SPREAD = "host_reference_spread"
# What the sweep cost the node, as the worker measured itself at its end: its CPU time (all threads) and
# its peak resident memory.
WORKER_CPU_SECONDS = "worker_cpu_s"
WORKER_PEAK_RSS_BYTES = "worker_peak_rss_bytes"


@dataclass(frozen=True, kw_only=True)
class HostReference:
    """What the host reference read over a sweep (or its idle figure over recent sweeps): how fast the host
    ran, and how much its readings move on their own there (a noisy VM can only be judged coarsely)."""

    median_s: float
    spread: float  # relative IQR of the readings

    @staticmethod
    def of(kept: Sequence[HostReference]) -> HostReference | None:
        """The idle figure of recent sweeps (``analysis.ranges.idle_figure``)."""
        found = ranges.idle_figure([r.median_s for r in kept], [r.spread for r in kept])
        return None if found is None else HostReference(median_s=found[0], spread=found[1])


def canonical_device(name: str) -> str:
    """A device name compared loosely: '/device:GPU:0', '/GPU:0' and 'gpu:0' are one device."""
    return name.strip().lower().removeprefix("/").removeprefix("device:")


class SweepResult(enum.Enum):
    """How one scheduled sweep ended; the label values of ``matmul_sweeps_total``."""

    SUCCESS = "success"  # every device found was measured
    # The worker finished, but the guard withheld some devices (PARTIAL) or every one (WITHHELD: nothing was
    # measured); the reason names each withheld device and why.
    PARTIAL = "partial"
    WITHHELD = "withheld"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"

    @property
    def completed(self) -> bool:
        """The worker timed its whole plan, whatever the guard withheld on the way."""
        return self in (SweepResult.SUCCESS, SweepResult.PARTIAL, SweepResult.WITHHELD)

    @property
    def measured(self) -> bool:
        """It measured something: the served results are (in part) this sweep's."""
        return self in (SweepResult.SUCCESS, SweepResult.PARTIAL)


class RetryResult(enum.Enum):
    """How a retry of GPUs withheld as busy ended; the label values of ``matmul_busy_retries_total``."""

    MEASURED = "measured"
    BUSY = "busy"  # still (or again) in use by other work
    FAILED = "failed"


class CrossoverState(enum.Enum):
    """Where the GPU stands against the CPU over the measured sizes."""

    FOUND = "found"
    GPU_NEVER_FASTER = "gpu_never_faster"
    GPU_ALWAYS_FASTER = "gpu_always_faster"
    AMBIGUOUS = "ambiguous"
    NO_GPU = "no_gpu"  # nothing to compare with: no GPU was found or measured
    # The GPU or the CPU was busy with other work (or disturbed) and nothing earlier can stand in.
    WITHHELD = "withheld"


# What each state without a size says, in `once`'s table and on the chart alike.
STATE_SENTENCES = {
    CrossoverState.GPU_NEVER_FASTER: "the GPU was never faster at the measured sizes",
    CrossoverState.GPU_ALWAYS_FASTER: "the GPU was faster at every measured size",
    CrossoverState.AMBIGUOUS: "ambiguous: the curves cross more than once",
    CrossoverState.NO_GPU: "no GPU was measured, so there is nothing to compare the CPU with",
    CrossoverState.WITHHELD: "withheld: the GPU or the CPU was in use by other work, or points near it were withheld",
}


class WithheldReason(enum.Enum):
    """Why a device's timings of one sweep were not published: another program was using it."""

    GPU_BUSY = "gpu_busy"  # other processes or utilisation on the GPU before or while it was timed
    # Other processes used cores the CPU timing needed; on a GPU, the thread timing it queued for a CPU.
    CPU_CONTENDED = "cpu_contended"
    UNGUARDED = "unguarded"  # the guard could not look (NVML missing or failing), so it did not time the GPU
    # A job started on a GPU while the sweep ran: the rest of the sweep was given up to stay out of its way.
    YIELDED = "yielded"
    # The host ran slower than its idle reference while the point was timed (a neighbour's BLAS job, memory
    # traffic or SMT sibling, the hypervisor taking time): the point's host side was slowed with it. Or, while
    # others used the host, a host-bound point ran past its own idle range over recent calm sweeps.
    HOST_SLOWED = "host_slowed"


class DeviceState(enum.Enum):
    """What became of a device in the served snapshot; the run history's device states."""

    MEASURED = "measured"  # timed in this sweep (or a retry laid over it)
    WITHHELD = "withheld"  # another program was using it: its last good timings are served, if any
    FAILED = "failed"  # it failed whole, or none of its points could be timed


class StopReason(enum.Enum):
    """Why the timing loop stopped repeating blocks for one point."""

    CONVERGED = "converged"  # relative IQR fell under the target
    BUDGET = "budget"  # the per-size time budget was spent
    MAX_BLOCKS = "max_blocks"  # the block cap was reached while still noisy


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """One device a backend can time, with what identifies it."""

    backend: str
    device: str  # the framework's own name, e.g. "/GPU:0"
    kind: DeviceKind
    name: str  # human model name, e.g. "NVIDIA H200"
    details: tuple[tuple[str, str], ...] = ()  # e.g. (("compute_capability", "9.0"),)


@dataclass(frozen=True, kw_only=True)
class PointKey:
    """What one measurement is of."""

    backend: str
    device: str
    dtype: str
    mode: Mode
    size: int

    @property
    def described(self) -> str:
        """The point as messages name it: '512x512 float32 compute'."""
        return describe_point(self.size, self.dtype, self.mode)


def describe_point(size: int, dtype: str, mode: str) -> str:
    """A point as messages name it: '512x512 float32 compute'."""
    return f"{size}x{size} {dtype} {mode}"


@dataclass(frozen=True, kw_only=True)
class Timing:
    """The statistics of one point: per-call seconds over repeated timed blocks."""

    median_s: float
    iqr_s: float
    blocks: int
    calls_per_block: int
    stop_reason: StopReason
    noisy: bool
    samples_s: tuple[float, ...] = ()  # per-call time of each block, in timing order
    # The median of each visit, in visit order, for a point timed in several visits (sizes around a
    # crossover): a point's level moves between visits far more than its blocks within one show.
    # Empty for a point timed once. The CPU's and a GPU's k-th visits of one size were taken together.
    visits_s: tuple[float, ...] = ()

    @property
    def visit_count(self) -> int:
        return len(self.visits_s) or 1

    @property
    def relative_iqr(self) -> float:
        return ranges.relative_iqr(self.median_s, self.iqr_s)


def speedup(cpu_s: float, gpu_s: float) -> float:
    """How many times faster the GPU is than the CPU, from their times (above 1: the GPU wins)."""
    return cpu_s / gpu_s


def matmul_flops(size: int) -> float:
    """The floating-point operations of one n×n product (a multiply and an add per term): 2n³."""
    return 2.0 * size**3


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One timed point: ``C = A @ B`` for n×n operands on one device."""

    key: PointKey
    timing: Timing
    role: Role = "sweep"
    # The most other programs (or the hypervisor's steal) used of the host over the point's timed tries that
    # stood, in cores; None where the guard did not meter it, or where the host reference read the host slowed
    # over one of its visits. Below guard.range_others_cores (``others_gate``: above a node's usual load where
    # it is never that quiet) the point was timed calm, and its median joins the point's idle range (``PointMedians``).
    others_cores: float | None = None
    # When an earlier sweep timed a point this one carried (``analysis.focus``), unix seconds; None: timed in the
    # sweep whose snapshot holds it.
    timed_at: float | None = None

    @property
    def carried(self) -> bool:
        return self.timed_at is not None

    @property
    def flops_per_second(self) -> float:
        return matmul_flops(self.key.size) / self.timing.median_s


# The environment entries that say what a sweep's points were timed with: where one changes, the points' ranges
# start again.
TIMED_WITH = (
    "framework",
    "framework_version",
    "cpu_threads",
    "cpu_affinity",
    "tf32",
    "cuda_version",
    "cudnn_version",
    "driver_version",
)


def timed_with(environment: Mapping[str, str], earlier: str = "") -> str:
    """What a sweep's points were timed with (its ``TIMED_WITH`` entries), in one string: an entry the sweep did not
    report (NVML that did not start leaves out the driver) keeps its value from ``earlier``."""
    values = _timed_with_values(earlier) | {k: environment[k] for k in TIMED_WITH if environment.get(k)}
    return ";".join(f"{k}={values[k]}" for k in TIMED_WITH if k in values)


def same_timing(earlier: str, environment: Mapping[str, str]) -> bool:
    """Whether a sweep reporting ``environment`` timed its points as ``earlier`` says: no entry both have differs."""
    before = _timed_with_values(earlier)
    return all(before[k] == environment[k] for k in TIMED_WITH if k in before and environment.get(k))


def _timed_with_values(text: str) -> dict[str, str]:
    pairs = (entry.partition("=") for entry in text.split(";") if entry)
    return {k: v for k, _, v in pairs if k in TIMED_WITH and v}


@dataclass(frozen=True, kw_only=True)
class PointMedians:
    """One point's median in each recent sweep that timed it with the host to itself (calm), oldest first."""

    key: PointKey
    medians_s: tuple[float, ...]

    @property
    def top(self) -> RangeTop | None:
        """The top of its idle range (``analysis.ranges.range_top``), once enough calm sweeps timed it."""
        upper = ranges.range_top(self.medians_s)
        return None if upper is None else RangeTop(key=self.key, upper_s=upper, sweeps=len(self.medians_s))


@dataclass(frozen=True, kw_only=True)
class RangeTop:
    """The top of one point's idle range over recent calm sweeps: what the point is held against while other
    programs use the host (``Guard``)."""

    key: PointKey
    upper_s: float
    sweeps: int  # how many calm sweeps it is from


@dataclass(frozen=True, kw_only=True)
class CurveKey:
    """One curve: a device's times over sizes, for one backend, dtype and mode."""

    backend: str
    device: str
    dtype: str
    mode: Mode


Curves = dict[CurveKey, dict[int, Measurement]]


def curves(
    measurements: Iterable[Measurement], *, roles: Collection[Role] = ("sweep", "fixed_cost", "refine")
) -> Curves:
    """The measurements grouped into curves, size -> measurement, in the order first seen (only the given roles)."""
    found: Curves = {}
    for m in measurements:
        if m.role in roles:
            key = CurveKey(backend=m.key.backend, device=m.key.device, dtype=m.key.dtype, mode=m.key.mode)
            found.setdefault(key, {})[m.key.size] = m
    return found


CrossoverKey = tuple[str, str, str, str, Mode]  # backend, gpu, cpu, dtype, mode


@dataclass(frozen=True, kw_only=True)
class Crossover:
    """The crossover of one GPU against one CPU, for one dtype and mode."""

    backend: str
    gpu: str
    cpu: str
    dtype: str
    mode: Mode
    state: CrossoverState
    size: float | None = None  # n* (fitted or interpolated: analysis/crossover.py), only when state is FOUND
    lower: float | None = None  # the measured sizes either side of n*
    upper: float | None = None
    # Where the next sweep's n* should land (95%) if nothing changes, from resampling the visits of the
    # sizes around it; None when no size was timed in several visits.
    ci_lower: float | None = None
    ci_upper: float | None = None
    derived_at: float | None = None  # when the sweep it comes from ended (older than the latest while carried)

    @property
    def key(self) -> CrossoverKey:
        """What the crossover is of: the same key in the next sweep is the same series."""
        return (self.backend, self.gpu, self.cpu, self.dtype, self.mode)

    @property
    def reach(self) -> tuple[float, float] | None:
        """The sizes n* may lie between: the lowest and highest of n*, its bracket and its interval; None without n*."""
        if self.size is None:
            return None
        known = [x for x in (self.size, self.lower, self.upper, self.ci_lower, self.ci_upper) if x is not None]
        return min(known), max(known)

    @property
    def pair_label(self) -> str:
        """What it compares, in words: "GPU vs CPU", or the CPU alone where no GPU was beside it."""
        return self.cpu if self.state is CrossoverState.NO_GPU else f"{self.gpu} vs {self.cpu}"


@dataclass(frozen=True, kw_only=True)
class RecentCrossovers:
    """The n* of one crossover in the latest sweeps that found it, oldest first: how far it moves between sweeps."""

    backend: str
    gpu: str
    cpu: str
    dtype: str
    mode: Mode
    sizes: tuple[float, ...]

    @property
    def key(self) -> CrossoverKey:
        return (self.backend, self.gpu, self.cpu, self.dtype, self.mode)


@dataclass(frozen=True, kw_only=True)
class CostModel:
    """Why small sizes lose: the fixed per-call cost and the rate paid per FLOP on one device."""

    backend: str
    device: str
    dtype: str
    mode: Mode
    fixed_s: float  # median time of a 1x1 multiplication: dispatch, launch, sync (and copies)
    peak_flops: float | None  # 2n³ / (t(n) - fixed) at the largest size, when t(n) exceeds the fixed cost
    largest_size: int


@dataclass(frozen=True, kw_only=True)
class DeviceFailure:
    """A device (or one point on it) that could not be measured, and why."""

    backend: str
    device: str
    reason: str
    point: PointKey | None = None  # None: the whole device failed
    fatal: bool = False  # retrying next sweep cannot help (e.g. the device does not exist)

    @property
    def whole_device(self) -> bool:
        """The device failed, not one point on it: it keeps none of its points and is reported down."""
        return self.point is None


def failed_devices(failures: Iterable[DeviceFailure]) -> frozenset[str]:
    """The devices that failed whole (not those that lost a point)."""
    return frozenset(f.device for f in failures if f.whole_device)


def gpu_cpu_pairs(devices: Iterable[DeviceInfo]) -> tuple[tuple[DeviceInfo, tuple[DeviceInfo, ...]], ...]:
    """Each CPU with the GPUs a crossover compares against it: those of its own backend, in order.

    The one pairing of GPUs with CPUs: the crossovers, their withheld states, the runner's CPU skip and
    refinement, the busy-GPU retry's CPU and the report's speed-ups all take it from here.
    """
    listed = tuple(devices)
    gpus = [d for d in listed if d.kind == "gpu"]
    return tuple((cpu, tuple(g for g in gpus if g.backend == cpu.backend)) for cpu in listed if cpu.kind == "cpu")


# Devices withheld whole for these reasons are tried again before the next sweep (an unguarded GPU cannot be): the
# other work may have passed. A device is no longer withheld whole as host_slowed (its points are, alone); served
# states saved before may still say so.
RETRIED_REASONS = frozenset(
    {WithheldReason.GPU_BUSY, WithheldReason.YIELDED, WithheldReason.CPU_CONTENDED, WithheldReason.HOST_SLOWED}
)


def retry_devices(devices: Iterable[DeviceInfo], retried: Iterable[str]) -> tuple[str, ...]:
    """What a retry of the ``retried`` devices times, CPUs first: a GPU with its CPU beside it, a CPU with every GPU
    compared against it (a crossover comes from a pair timed in one host state)."""
    wanted = set(retried)
    cpus: list[str] = []
    gpus: list[str] = []
    for cpu, paired in gpu_cpu_pairs(devices):
        busy = [g.device for g in paired if g.device in wanted or cpu.device in wanted]
        if busy or cpu.device in wanted:
            cpus.append(cpu.device)
        gpus += [g for g in busy if g not in gpus]
    return (*cpus, *gpus)


@dataclass(frozen=True, kw_only=True)
class Withheld:
    """A device (or one point on it) whose timings of one sweep were withheld because other work was (or may
    have been) on it.

    A point is withheld alone where only it was moved (``HOST_SLOWED``): the host ran slower while it was timed
    by more than the point's host share allows, or, while others used the host, the point ran past its own
    idle range. Its device's other points are published, and a crossover
    whose lead could have changed at the point is withheld (``crossover.crossovers``).
    """

    backend: str
    device: str
    reason: WithheldReason
    detail: str  # what was seen, e.g. "2 other processes (pid 4711 python, pid 4712 ?); 87% utilisation"
    point: PointKey | None = None  # None: the whole device

    @property
    def whole_device(self) -> bool:
        """The device is withheld, not one point on it: it publishes none of this sweep's points."""
        return self.point is None

    @property
    def subject(self) -> str:
        """What was withheld, as messages name it: 'cpu', or 'cpu 512x512 float32 compute'."""
        return self.device if self.point is None else f"{self.device} {self.point.described}"


@dataclass(frozen=True, kw_only=True)
class HardwareContext:
    """What a device looked like while it was timed in one sweep: what a drift alert can point at.

    Every field is None where it could not be read. GPU fields come from NVML samples taken after
    each of its points (the limited ratios from NVML's counters read before and after each; the host
    wait from the kernel's schedstat of the thread that timed them);
    ``other_cpu_cores`` is the CPU time other processes used on the cores the worker may run on, in
    cores, over the CPU's points (the maximum over its points).
    """

    backend: str
    device: str
    sm_clock_min_hz: float | None = None  # the lowest SM clock seen after any of its points
    sm_clock_max_hz: float | None = None  # the GPU's maximum SM clock
    clock_events: tuple[str, ...] = ()  # clock-event (throttle) reasons seen, e.g. ("sw_thermal",)
    temperature_max_c: float | None = None
    power_max_w: float | None = None
    pcie_generation_min: int | None = None  # the link as it ran under load
    pcie_width_min: int | None = None
    pcie_generation_max: int | None = None  # what the link can do
    pcie_width_max: int | None = None
    other_processes_max: int | None = None  # other programs' processes on the GPU, most seen at once
    # GPU only: the most memory the worker's own process held on the GPU (NVML, at the looks after its
    # points; the framework's allocator keeps what it grew, so the last looks see about the peak)
    worker_gpu_memory_max_bytes: int | None = None
    # Share of the time its points ran during which NVML counted the GPU held below its requested
    # clocks by its power (thermal) limit: counted over the points, not sampled after them.
    power_limited_ratio: float | None = None
    thermal_limited_ratio: float | None = None
    # GPU only: the most the thread timing its points waited for a CPU (runnable, every core taken), as a
    # share of a point; what guard.gpu_max_host_wait is held against.
    host_wait_ratio: float | None = None
    other_cpu_cores: float | None = None  # CPU only: other processes' load on our cores
    cpu_throttled_s: float | None = None  # CPU only: time the container's CPU quota throttled the worker
    # CPU only: of other_cpu_cores, the hypervisor's steal on our vCPUs (the most over its points), in cores
    cpu_steal_cores: float | None = None
    # Fields of earlier releases, read from the run history and dropped: the threads' wait over a whole point (the
    # block watch judges it per block; the whole point's was recorded and never judged or exported).
    DROPPED: ClassVar[frozenset[str]] = frozenset({"cpu_threads_wait_cores"})
    # CPU only: the share of its timed blocks set aside (and timed again) because the worker's threads
    # waited for a CPU in them more than guard.cpu_max_threads_wait cores' worth
    cpu_blocks_set_aside_ratio: float | None = None
    # The most the host reference ran slower than its idle reference over the device's points that stood
    # (1.0: as fast; what guard.reference_max_slowdown is held against, weighed by each point's host share).
    host_slowdown_max: float | None = None


def _finite(text: str | None) -> float | None:
    """A non-negative finite number written as text, or None."""
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What is served after a completed sweep: its timings, crossovers and costs, with the last good
    timings of devices it withheld carried over (``crossover_monitor.analysis.carry``; ``measured_at`` says from when).
    Never mutated after it is built."""

    started_at: float  # unix seconds
    finished_at: float
    devices: tuple[DeviceInfo, ...]
    measurements: tuple[Measurement, ...]
    crossovers: tuple[Crossover, ...]
    costs: tuple[CostModel, ...] = ()
    failures: tuple[DeviceFailure, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()  # framework versions, TF32, threads, …
    withheld: tuple[Withheld, ...] = ()  # devices (or points) this sweep did not publish, and why
    hardware: tuple[HardwareContext, ...] = ()
    # When each device's served timings were taken: this sweep's end, or an earlier sweep's for a
    # device whose timings were carried over while it was withheld.
    measured_at: tuple[tuple[str, float], ...] = ()

    @property
    def gpu_problem(self) -> str | None:
        """Why the backend found no GPU, where it found none (the ``no_gpu`` state's cause and fix)."""
        return dict(self.environment).get(GPU_PROBLEM)

    @property
    def host_reference(self) -> HostReference | None:
        """What the host reference read over this sweep, where the guard took readings."""
        environment = dict(self.environment)
        try:
            median, spread = float(environment[HOST_REFERENCE]), float(environment[HOST_REFERENCE_SPREAD])
        except (KeyError, ValueError):
            return None
        if not (math.isfinite(median) and median > 0 and math.isfinite(spread) and spread >= 0):
            return None
        return HostReference(median_s=median, spread=spread)

    @property
    def worker_cpu_seconds(self) -> float | None:
        """The CPU time the sweep's worker used, all its threads; None where it did not say."""
        return _finite(dict(self.environment).get(WORKER_CPU_SECONDS))

    @property
    def worker_peak_rss_bytes(self) -> float | None:
        """The peak resident memory of the sweep's worker; None where it did not say."""
        return _finite(dict(self.environment).get(WORKER_PEAK_RSS_BYTES))

    @property
    def measured_devices(self) -> frozenset[str]:
        """The devices this snapshot's sweep timed a point of (a device it only carried points of is not one)."""
        return frozenset(m.key.device for m in self.measurements if not m.carried)

    @property
    def withheld_devices(self) -> frozenset[str]:
        """The devices withheld whole (not those that lost a point)."""
        return frozenset(w.device for w in self.withheld if w.whole_device)

    @property
    def failed_devices(self) -> frozenset[str]:
        return failed_devices(self.failures)

    def device_state(self, device: str) -> tuple[DeviceState, str]:
        """The device's state in this snapshot and why (a withheld reason's value, a failure's reason).

        Up (``matmul_device_up``) is any state but FAILED: a withheld device works, its timings carried.
        """
        whole = next((f for f in self.failures if f.device == device and f.whole_device), None)
        if whole is not None:
            return DeviceState.FAILED, whole.reason
        withheld = next((w for w in self.withheld if w.device == device and w.whole_device), None)
        if withheld is not None:
            return DeviceState.WITHHELD, withheld.reason.value
        if device in self.measured_devices:
            return DeviceState.MEASURED, ""
        # Every point failed (out of memory, say), or the sweep never reached it.
        lost = next((f.reason for f in self.failures if f.device == device), "nothing was measured")
        return DeviceState.FAILED, lost

    @property
    def devices_to_retry(self) -> tuple[str, ...]:
        """The devices withheld whole for a reason that may pass (a busy GPU, a job that started, every core taken),
        to be tried again: a CPU too, since every crossover against it is withheld with it (a first sweep beside a
        busy core would otherwise serve nothing until the next scheduled one)."""
        return tuple(sorted({w.device for w in self.withheld if w.whole_device and w.reason in RETRIED_REASONS}))


@dataclass(frozen=True, kw_only=True)
class SweepOutcome:
    """What the latest sweep attempt did, successful or not."""

    result: SweepResult
    started_at: float
    finished_at: float
    reason: str = ""  # why it failed, for logs and `once`
    snapshot: Snapshot | None = None  # present when the worker completed

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at

    @property
    def worker_cpu_seconds(self) -> float | None:
        """What its worker used of the CPU, where the worker completed and said."""
        return self.snapshot.worker_cpu_seconds if self.snapshot is not None else None


@dataclass(frozen=True, kw_only=True)
class ServiceState:
    """Everything the HTTP side reads: the served snapshot and the service's counts and times, replaced
    as a whole after each sweep, retry or skip (``crossover_monitor.service.state``)."""

    latest: Snapshot | None = None  # latest sweep whose worker completed
    last_success_at: float | None = None
    last_outcome: SweepOutcome | None = None
    sweeps: tuple[tuple[SweepResult, int], ...] = field(default_factory=lambda: tuple((r, 0) for r in SweepResult))
    next_sweep_at: float | None = None
    next_retry_at: float | None = None  # when the devices withheld in the latest sweep are tried again; None: not
    retries: tuple[tuple[RetryResult, int], ...] = field(default_factory=lambda: tuple((r, 0) for r in RetryResult))
    # The workers' CPU time since the service started, sweeps' and retries' apart (what the node paid for them).
    worker_cpu_s: tuple[tuple[str, float], ...] = (("sweep", 0.0), ("retry", 0.0))
    # The configuration: whether the latest (re)load took, and when one last did (start-up counts).
    config_loaded: bool | None = None
    config_loaded_at: float | None = None
    # n* of each crossover in the latest sweeps: the moves between them widen the served interval.
    recent: tuple[RecentCrossovers, ...] = ()
    # What the host reference read in each recent sweep, oldest first: the host's idle figure.
    host_references: tuple[HostReference, ...] = ()
    # Each point's medians in recent calm sweeps (its idle range), and what they were timed with (``timed_with``).
    point_medians: tuple[PointMedians, ...] = ()
    point_medians_timed_as: str = ""
    # What other programs (or steal) typically used of the host over each recent sweep's points, in cores, oldest
    # first: the node's usual load (``usual_others``).
    others_typical: tuple[float, ...] = ()

    @property
    def host_baseline(self) -> HostReference | None:
        """The host reference's idle figure from recent sweeps' medians and spreads (``HostReference.of``). A
        neighbour, or the host itself, slowing it in fewer than nine of ten kept sweeps cannot move it past the
        fast sweeps' readings; a lasting change of the host becomes the new figure once it holds for that long."""
        return HostReference.of(self.host_references)

    @property
    def usual_others_if_known(self) -> float | None:
        """What other programs used of the host in nine of the kept sweeps in ten (``analysis.ranges.usual_others``),
        in cores; None until enough sweeps say."""
        return ranges.usual_others(self.others_typical)

    @property
    def usual_others(self) -> float:
        """The usual load the guard and the calm ranges go by (``usual_others_if_known``), 0 until it is known."""
        usual = self.usual_others_if_known
        return 0.0 if usual is None else usual

    @property
    def range_tops(self) -> tuple[RangeTop, ...]:
        """The top of the idle range of each point timed in enough recent calm sweeps (``PointMedians.top``)."""
        return tuple(top for kept in self.point_medians if (top := kept.top) is not None)

    def count(self, result: SweepResult) -> int:
        return dict(self.sweeps)[result]
