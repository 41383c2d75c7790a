"""The interference guard: keeps the worker off GPUs and cores that other programs are using.

A GPU is looked at (through a ``GpuSampler``, NVML in production) before and after each of its
points: another program's process on it, or utilisation while this worker is not using it,
makes it busy, and its points of this sweep are withheld. Every point is timed inside a
window over which the host meter (``HostMeter``) measures the host's load from other processes
and how long the worker's timing thread waited for a CPU: a CPU point during which others used cores
its threads needed, or a GPU point whose host side waited for a CPU, is timed again once, then withheld.
Two timings judge the point beside those counts: the host reference, read before and after it against its
idle figure, and, while other programs use the host or the reference read it slowed, the point's own median
against its idle range over recent calm sweeps (a neighbour can slow a framework's pool threads without the
reference feeling it, or by more than the reference's reading says).
Every sample also feeds the hardware context recorded for the sweep (clocks, throttling, link).
What each of those facts makes of a point is decided in ``rule.py``, not here: this module gathers them.

Pure apart from the samplers, meters, clock and sleep it is given, so that tests drive it with fakes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from crossover_monitor.analysis.ranges import relative_iqr
from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.measure.guard import rule
from crossover_monitor.measure.guard.podresources import PodResourcesUnavailable
from crossover_monitor.measure.guard.rule import DISTURBED_PAUSE_S, host_allowance
from crossover_monitor.measure.timing import MIN_BLOCKS_ON_BUDGET, BlockWatch
from crossover_monitor.model import (
    FORK_JOIN,
    THREAD_POOL,
    WORK_STEALING,
    DeviceInfo,
    DeviceKind,
    HardwareContext,
    HostReference,
    Mode,
    PointKey,
    RangeTop,
    Withheld,
    WithheldReason,
    same_timing,
)

N = TypeVar("N", int, float)


class GuardUnavailable(Exception):
    """The guard cannot look at a device (NVML missing, failing, or the device not found in it)."""


@dataclass(frozen=True, kw_only=True)
class GpuProcess:
    pid: int
    name: str = "?"  # the command name where this process's /proc can see it
    visible: bool = True  # False: the pid is not in this process's PID namespace (a container)
    used_memory_bytes: int | None = None  # None: the driver does not say
    # Its SM utilisation over the last second from NVML's per-process samples; None: not known.
    sm_utilization_pct: float | None = None


@dataclass(frozen=True, kw_only=True)
class GpuSample:
    """One look at a GPU; None where the GPU or driver does not say."""

    processes: tuple[GpuProcess, ...]
    utilization_pct: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    clock_events: tuple[str, ...] = ()
    temperature_c: float | None = None
    power_w: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_generation_max: int | None = None
    pcie_width_max: int | None = None
    # NVML's running totals of the time the GPU was held below its requested clocks by its power or its
    # thermal limit, and when they were read (monotonic seconds): their growth over a point says how
    # long that point ran held back, however briefly it happened (a look after it could miss it).
    power_limited_s: float | None = None
    thermal_limited_s: float | None = None
    read_at_s: float | None = None


class GpuSampler(Protocol):
    def sample(self, device: DeviceInfo) -> GpuSample:
        """Look at the GPU behind ``device`` now; raises GuardUnavailable if it cannot."""
        ...

    def identity(self, device: DeviceInfo) -> dict[str, str]:
        """The driver's names for the GPU behind ``device`` (``uuid``, ``pci_bus_id``); raises GuardUnavailable."""
        ...

    def driver_version(self) -> str:
        """The GPU driver's version ("580.159.04"); raises GuardUnavailable."""
        ...


@dataclass(frozen=True)
class HostLoad:
    """What other processes did on the worker's cores over a window."""

    other_cores: float  # their CPU time over the window's wall time, in cores
    throttled_s: float  # time the container's CPU quota throttled this cgroup
    wall_s: float = 1.0  # how long the window lasted
    # Time the VM's vCPUs waited for the host (steal), in cores, as /proc/stat's ticks sample it. Unlike
    # another process it lands on the worker's own vCPUs, which the guest cannot route around. The steal
    # that took a running vCPU is in other_cores; the wake-up latency of an idle one, which the steal
    # clock counts too while the guest counts the same time idle, is not.
    steal_cores: float = 0.0
    # The share of the window the thread timing the point sat runnable but waiting for a CPU (others, or the
    # worker's own threads, had them all); None where the kernel does not say.
    own_wait: float | None = None
    # How much slower than its idle reference the host ran over the window (the host reference read before
    # and after it against the fastest reading known, 1.0: as fast); None where the guard takes no readings.
    host_slowdown: float | None = None


class HostMeter(Protocol):
    def start(self) -> object:
        """An opaque reading to pass to ``stop``."""
        ...

    def stop(self, started: object) -> HostLoad: ...

    def cores(self) -> int:
        """The cores the worker may run on."""
        ...

    def threads_mark(self) -> object:
        """A reading of the worker's threads' run-queue wait so far, to pass to ``threads_waited``."""
        ...

    def threads_waited(self, since: object) -> float | None:
        """The worker's threads' run-queue wait since ``since``, summed, per second of it (in cores); None: unknown."""
        ...


@dataclass
class _GpuRecord:
    timed: bool = False  # this worker ran a point on it in this sweep
    samples: list[GpuSample] = field(default_factory=list)
    others_max: int = 0
    opened: GpuSample | None = None  # the look before the point being timed
    # per limit ("power", "thermal"): (seconds held back, seconds of points over which it was counted)
    limited: dict[str, tuple[float, float]] = field(default_factory=dict)
    host_wait_max: float | None = None  # the most its timing thread waited for a CPU, as a share of a point
    host_slowdown_max: float | None = None
    own_memory_max: int | None = None  # the most GPU memory this worker's process held at a look after a point

    def settle(self, load: HostLoad, throttled_s: float) -> None:  # noqa: ARG002 - throttling is the CPU's
        if load.own_wait is not None:
            self.host_wait_max = max(load.own_wait, self.host_wait_max or 0.0)
        self.host_slowdown_max = _highest((self.host_slowdown_max, load.host_slowdown))

    def close_point(self, after: GpuSample) -> None:
        """Add how long the point that just ended ran held back by each limit NVML counts."""
        before, self.opened = self.opened, None
        if before is None or before.read_at_s is None or after.read_at_s is None:
            return
        window = after.read_at_s - before.read_at_s
        for limit, start, end in (
            ("power", before.power_limited_s, after.power_limited_s),
            ("thermal", before.thermal_limited_s, after.thermal_limited_s),
        ):
            if start is not None and end is not None and end >= start and window > 0:
                held, counted = self.limited.get(limit, (0.0, 0.0))
                self.limited[limit] = (held + min(end - start, window), counted + window)

    def limited_ratio(self, limit: str) -> float | None:
        held, counted = self.limited.get(limit, (0.0, 0.0))
        return held / counted if counted > 0 else None


@dataclass
class _CpuRecord:
    other_cores_max: float = 0.0
    throttled_s: float = 0.0
    steal_cores_max: float = 0.0
    host_slowdown_max: float | None = None
    blocks_kept: int = 0
    blocks_set_aside: int = 0  # timed blocks in which the worker's threads waited for a CPU (timed again)

    def add_blocks(self, watch: _BlockWatch) -> None:
        self.blocks_kept += watch.kept
        self.blocks_set_aside += watch.set_aside

    @property
    def set_aside_ratio(self) -> float | None:
        blocks = self.blocks_kept + self.blocks_set_aside
        return self.blocks_set_aside / blocks if blocks else None

    def settle(self, load: HostLoad, throttled_s: float) -> None:
        self.throttled_s += throttled_s  # every try's: a disturbed first try was throttled too
        self.other_cores_max = max(self.other_cores_max, load.other_cores)
        self.steal_cores_max = max(self.steal_cores_max, load.steal_cores)
        self.host_slowdown_max = _highest((self.host_slowdown_max, load.host_slowdown))


@dataclass
class _BlockWatch:
    """The worker's threads' run-queue wait over each timed block of a CPU point.

    In a fork-join pool every parallel call waits for its slowest thread (a pool of one, for its only one), so
    threads that waited ``w`` cores' worth over a block (a neighbour's thread sharing a core with one of them)
    stalled it by up to ``w`` of its time: a block they waited more than ``allowed`` in is set aside and another
    timed. A neighbour the scheduler moves between cores leaves undisturbed blocks between those it slowed (beside
    one busy core of 16, the threads waited 0.12-0.30 cores over whole points, and some points published 1.5x
    slower: benchmarks/README.md, "the threads' wait").
    """

    host: HostMeter
    allowed: float
    kept: int = 0
    set_aside: int = 0
    most: float | None = None  # the most they waited over one block, in cores

    def mark(self) -> object:
        return self.host.threads_mark()

    def disturbed(self, since: object) -> bool:
        waited = self.host.threads_waited(since)
        self.most = _highest((self.most, waited))
        if waited is not None and waited > self.allowed:
            self.set_aside += 1
            return True
        self.kept += 1
        return False

    def problem(self) -> str | None:
        """Why too few of the point's blocks stood to time it, or None."""
        if not self.set_aside or self.kept >= MIN_BLOCKS_ON_BUDGET:
            return None
        return (
            f"its threads waited for a CPU in {self.set_aside} of its {self.kept + self.set_aside} timed blocks "
            f"(up to {self.most or 0.0:.2f} cores, allowed {self.allowed:.2f}; a call waits for its slowest "
            "thread)"
        )


class _HostRecord(Protocol):
    """What a device's record keeps of the host's load over its points."""

    def settle(self, load: HostLoad, throttled_s: float) -> None:
        """The try that counts (the last one: a disturbed first try timed again does not), and the quota's
        throttling over every try."""
        ...


class Guard:
    """Decides, from what the GPU sampler and host meter see, whether a point may be timed and whether it stands."""

    def __init__(
        self,
        settings: GuardSettings,
        *,
        gpu_sampler: GpuSampler | None,
        gpu_sampler_problem: str = "",
        host: HostMeter | None,
        own_pid: int,
        sleep: Callable[[float], None],
        pods: Callable[[str], Sequence[str]] | None = None,
        reference: Callable[[], float] | None = None,
        reference_baseline: HostReference | None = None,
        range_tops: Iterable[RangeTop] = (),
        usual_others: float = 0.0,
    ) -> None:
        """``pods``: the pods the kubelet gave a GPU (by its UUID), where the node runs Kubernetes.

        ``reference`` takes one reading of the host reference (``hostprobe``), in seconds; ``reference_baseline``
        is its idle figure from recent sweeps (None: this sweep's own readings).
        ``range_tops``: the top of each point's idle range over recent calm sweeps, which the point timed
        while others use the host (or the reference reads it slowed) is held against.
        ``usual_others``: what other programs use of the host in nine recent sweeps of ten (the node's usual load),
        which moves the load a point counts as timed beside others from on a node never quiet (``others_gate``); 0
        until ten sweeps say, which leaves the setting alone as the gate.
        """
        self._settings = settings
        self._range_tops = {figure.key: figure for figure in range_tops}
        self._usual_others = usual_others
        self._last_others: float | None = None
        self._reference = reference
        self._reference_baseline = reference_baseline
        # What a reading is held against: the baseline, or this sweep's median reading where that is faster.
        self._reference_best: float | None = None
        self._readings: list[float] = []  # this sweep's
        self._pods = pods
        self._gpu_sampler = gpu_sampler
        self._gpu_sampler_problem = gpu_sampler_problem
        self._host = host
        self._own_pid = own_pid
        self._sleep = sleep
        self._gpus: dict[str, _GpuRecord] = {}
        self._cpus: dict[str, _CpuRecord] = {}

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a host's slow spell may pass meanwhile) on the sleep the guard was given."""
        self._sleep(seconds)

    # --- GPUs -------------------------------------------------------------------------------

    def identity(self, device: DeviceInfo) -> dict[str, str]:
        """NVML's UUID and PCI bus id of a GPU, for joining with other exporters; empty where NVML is not there."""
        if self._gpu_sampler is None or device.kind != "gpu":
            return {}
        try:
            return self._gpu_sampler.identity(device)
        except GuardUnavailable:
            return {}

    def driver_version(self) -> str:
        """The GPU driver's version, for the sweep's environment; empty where NVML is not there."""
        if self._gpu_sampler is None:
            return ""
        try:
            return self._gpu_sampler.driver_version()
        except GuardUnavailable:
            return ""

    def before_gpu_point(self, device: DeviceInfo) -> Withheld | None:
        """None if the GPU may be timed now; otherwise why it may not."""
        return self._look(device, before=True)

    def after_gpu_point(self, device: DeviceInfo) -> Withheld | None:
        """None if nobody else came while the point was timed; otherwise why the point cannot stand."""
        self._gpus.setdefault(device.device, _GpuRecord()).timed = True
        return self._look(device, before=False)

    def _look(self, device: DeviceInfo, *, before: bool) -> Withheld | None:
        if not self._settings.enabled:
            return None
        record = self._gpus.setdefault(device.device, _GpuRecord())
        if before:  # a point starts: no earlier look may pair with the look after it
            record.opened = None
        if self._gpu_sampler is None:
            return self._unguarded(device, self._gpu_sampler_problem)
        try:
            sample = self._gpu_sampler.sample(device)
        except GuardUnavailable as exc:
            return self._unguarded(device, str(exc))
        if before:
            record.opened = sample
        else:
            record.samples.append(sample)
            record.close_point(sample)
            own = self._own_memory(sample)
            if own is not None:
                record.own_memory_max = max(own, record.own_memory_max or 0)
        others = self._other_processes(sample)
        record.others_max = max(record.others_max, len(others))
        # Utilisation says who only when this worker is not the one using the GPU: before its first point.
        seen = rule.busy_signs(
            [(p.pid, p.name) for p in others],
            sample.utilization_pct,
            before_use=before and not record.timed,
            settings=self._settings,
        )
        if not seen:
            return None
        when = "before its point" if before else "while it was timed"
        detail = f"{'; '.join(seen)} {when}{self._holders(device)}"
        return Withheld(backend=device.backend, device=device.device, reason=WithheldReason.GPU_BUSY, detail=detail)

    def _holders(self, device: DeviceInfo) -> str:
        """``; allocated to pod ns/name``: who holds a busy GPU, where NVML's host PIDs cannot say (no hostPID)."""
        if self._pods is None:
            return ""
        uuid = self.identity(device).get("uuid")
        if not uuid:
            return ""
        try:
            pods = self._pods(uuid)
        except PodResourcesUnavailable as exc:
            return f"; which pod holds it is unknown ({exc})"
        if not pods:
            return f"; no pod's allocation names {uuid} (a process outside the device plugin's, or MIG or index ids)"
        return f"; allocated to pod {', '.join(pods)}"

    def _own_candidates(self, sample: GpuSample) -> list[GpuProcess]:
        """The processes that may be this worker's: the one with its PID or, where NVML's host PIDs are not in
        its /proc (a container with its own PID namespace), every hidden one. Where it finds itself, every
        other process is another program's, hidden or not (systemd's ProtectProc hides other users')."""
        return [p for p in sample.processes if p.pid == self._own_pid] or [p for p in sample.processes if not p.visible]

    def _own_process(self, sample: GpuSample) -> GpuProcess | None:
        """This worker's process among the GPU's, or None where it has none there: of several hidden candidates,
        the smallest is taken to be the worker's own context."""
        return min(self._own_candidates(sample), key=lambda p: p.used_memory_bytes or 0, default=None)

    def _own_memory(self, sample: GpuSample) -> int | None:
        """The GPU memory of this worker's process where it is sure which that is: one candidate only (of
        several hidden ones, another container's leftover could be the smallest)."""
        candidates = self._own_candidates(sample)
        return candidates[0].used_memory_bytes if len(candidates) == 1 else None

    def _other_processes(self, sample: GpuSample) -> list[GpuProcess]:
        """Processes of other programs: all but this worker's (``_own_process``). A job already on the GPU
        in a container apart is noticed after the GPU's first point, when the worker's context joins it."""
        own = self._own_process(sample)
        others = [p for p in sample.processes if p is not own]
        return [p for p in others if not rule.is_stray(p.used_memory_bytes, p.sm_utilization_pct, self._settings)]

    def _unguarded(self, device: DeviceInfo, problem: str) -> Withheld | None:
        if not self._settings.require_nvml:
            return None
        detail = (
            f"the guard cannot see whether other programs use this GPU ({problem}); set guard.require_nvml: false "
            "to time GPUs unguarded"
        )
        return Withheld(backend=device.backend, device=device.device, reason=WithheldReason.UNGUARDED, detail=detail)

    # --- the host's cores ------------------------------------------------------------------

    def time_cpu_point(
        self,
        device: DeviceInfo,
        threads: int,
        measure: Callable[[BlockWatch | None], object],
        judged: JudgedPoint | None = None,
    ) -> Withheld | None:
        """Run ``measure`` (one CPU point) under the host meter; timed again once if others disturbed it.

        Others may use the cores the worker's threads leave free, plus ``cpu_max_other_cores``;
        beyond that, one of its threads shares a core with them and every parallel call waits for it.
        Where the threads leave a core to the thread timing them and each parallel call waits for its slowest
        thread (``FORK_JOIN``, or a pool of one thread of either kind), ``measure`` sets aside the blocks they
        waited for a CPU in (``_BlockWatch``): a point with too few blocks left is disturbed too.
        """
        host = self._host
        if not self._settings.enabled or host is None:
            measure(None)
            return None
        cores = host.cores()
        # Where they take every core (and the thread timing them), they wait for each other (TensorFlow's 2
        # threads on the idle 2-core VM: 0.1-0.6 cores per block): no neighbour's sign. In a work-stealing
        # pool a thread's wait costs the call nothing: the others take its share; but a pool of one thread has
        # no other to take it (TensorFlow's 1 thread on the 2-core VM beside a busy core and a BLAS job: it
        # waited 0.51-0.54 cores and its points were published 1.26-2.18x slower, benchmarks/README.md).
        stealing = dict(device.details).get(THREAD_POOL, FORK_JOIN) == WORK_STEALING
        watch_blocks = threads < cores and (threads == 1 or not stealing)
        record = self._cpus.setdefault(device.device, _CpuRecord())
        watches: list[_BlockWatch] = []

        def watched() -> None:
            watches.append(_BlockWatch(host, self._settings.cpu_max_threads_wait))
            measure(watches[-1] if watch_blocks else None)
            record.add_blocks(watches[-1])

        def problems(load: HostLoad) -> list[str]:
            found = rule.cpu_contention(
                load.other_cores, load.throttled_s, load.wall_s, cores=cores, threads=threads, settings=self._settings
            )
            stalled = watches[-1].problem()
            return found if stalled is None else [*found, stalled]

        return self._timed_in_tries(host, device, watched, problems, record, host_share=lambda: 1.0, judged=judged)

    def time_gpu_point(
        self,
        device: DeviceInfo,
        measure: Callable[[], object],
        host_share: Callable[[], float] = lambda: 1.0,
        judged: JudgedPoint | None = None,
    ) -> Withheld | None:
        """Run ``measure`` (one GPU point) under the host meter; timed again once if its host side waited for a CPU.

        A GPU point's host side (launches, copies from pageable memory, the wait at each block's end)
        runs on the thread that times it: if that thread sat runnable without a CPU for more than
        ``gpu_max_host_wait`` of the point, the GPU's time includes that wait. Others' load alone
        cannot tell, since it cannot exceed what the worker leaves them.

        ``host_share`` (read after ``measure``): the share of the point's time that is the host's (its fixed
        cost over its median, for a compute point), by which a slower host moves it.
        ``judged``: the point and its median after ``measure``, to hold against its idle range while others use
        the host or the reference reads it slowed.
        """
        host = self._host
        if not self._settings.enabled or host is None:
            measure()
            return None

        def problems(load: HostLoad) -> list[str]:
            return rule.gpu_contention(load.own_wait, load.other_cores, cores=host.cores(), settings=self._settings)

        record = self._gpus.setdefault(device.device, _GpuRecord())
        return self._timed_in_tries(host, device, measure, problems, record, host_share=host_share, judged=judged)

    def _timed_in_tries(
        self,
        host: HostMeter,
        device: DeviceInfo,
        measure: Callable[[], object],
        problems: Callable[[HostLoad], list[str]],
        record: _HostRecord,
        *,
        host_share: Callable[[], float],
        judged: JudgedPoint | None,
    ) -> Withheld | None:
        """Time a point inside a host meter window, read the host reference before and after it, and hand what
        was seen to the rule (``rule.judge_try``); time it again after a pause where that says so."""
        contended: list[str] = []
        slowed: str | None = None
        load = HostLoad(0.0, 0.0, 1.0)
        facts: rule.TryFacts | None = None
        others = 0.0  # over every try: a point that stood once others left was still timed beside them first
        throttled = 0.0
        for attempt in range(2):
            if attempt:
                self._sleep(DISTURBED_PAUSE_S)
            before = self._read_reference()
            started = host.start()
            measure()
            load = host.stop(started)
            load = dataclasses.replace(load, host_slowdown=self._slowdown(before, self._read_reference()))
            throttled += load.throttled_s
            others = max(others, _others(load))
            contended = problems(load)
            facts = self._facts(load, host.cores(), host_share(), judged)
            slowed = rule.judge_try(facts, self._settings)
            if not contended and slowed is None:
                break
        record.settle(load, throttled)
        # A point the reference read slowed, or could not judge yet, joins no idle range (``rule.calm_others``).
        self._last_others = None if facts is None else rule.calm_others(facts, others)
        return rule.point_verdict(device, contended, slowed)

    def _facts(self, load: HostLoad, cores: int, share: float, judged: JudgedPoint | None) -> rule.TryFacts:
        """What a try of the point saw, as the rule reads it."""
        own = self._range_of(judged)
        held = self._range_of(judged, stand_in=True)
        return rule.TryFacts(
            others=_others(load),
            usual_others=self._usual_others,
            cores=cores,
            host_slowdown=load.host_slowdown,
            reference_s=self._reference_best,
            allowance=self._allowed(),
            host_share=share,
            own=None if own is None else _idle_range(*own, judged),
            judged=None if held is None else _idle_range(*held, judged),
            share_at_top=None if held is None or judged is None else judged.host_share_at(held[0].upper_s),
        )

    def _read_reference(self) -> float | None:
        if self._reference is None or not self._settings.enabled:
            return None
        reading = self._reference()
        return reading if math.isfinite(reading) and reading > 0 else None

    def _slowdown(self, before: float | None, after: float | None) -> float | None:
        """The faster of two readings against the idle baseline, or this sweep's median reading where faster:
        a slowdown that lasted over the whole point. (The slower one would also count a reading that one
        preemption or the caches the point left cold happened to slow: on the idle 2-core VM 2% of pairs of
        back-to-back readings had one 10% over the median, and none had both.)

        Medians, not the fastest reading: a reading moves on its own on a VM (vCPU frequency, cache state),
        and the fastest of a sweep's hundred readings is the tail of that, not the host's figure.
        """
        readings = [r for r in (before, after) if r is not None]
        if not readings:
            return None
        self._readings += readings
        typical = statistics.median(self._readings)
        baseline = self._reference_baseline
        self._reference_best = min(typical, baseline.median_s) if baseline is not None else typical
        return min(readings) / self._reference_best

    def _allowed(self) -> float | None:
        """How far the host may be slowed before a point counts as moved: ``reference_max_slowdown``, or more
        where the reference's readings move that much on their own (``rule.SPREADS_ALLOWED`` relative IQRs of
        the idle baseline's, else of this sweep's first readings, up to ``rule.SPREAD_ALLOWANCE_AT_MOST``); None
        while too few say how much they move."""
        if self._reference_baseline is not None:
            spread = self._reference_baseline.spread
        elif len(self._readings) >= rule.READINGS_TO_JUDGE:
            # The first readings only: a slowed stretch later in the sweep must not widen its own allowance.
            spread = _relative_spread(self._readings[: rule.READINGS_TO_JUDGE])
        else:
            return None
        return host_allowance(self._settings.reference_max_slowdown, spread)

    def _range_of(self, judged: JudgedPoint | None, *, stand_in: bool = False) -> tuple[RangeTop, float] | None:
        """The top of the point's own idle range (or, with ``stand_in``, of the range standing in where it has none:
        a refinement's size) and its median, where it has both and the top is a time."""
        if judged is None:
            return None
        figure = self._range_tops.get(judged.key)
        if figure is None and stand_in and judged.range_from is not None:
            figure = self._range_tops.get(judged.range_from)
        median = judged.median()
        if figure is None or median is None or not (math.isfinite(figure.upper_s) and figure.upper_s > 0):
            return None
        return figure, median

    def use_range_tops_timed_as(self, timed_as: str, environment: Mapping[str, str]) -> None:
        """Keep the points' ranges only if this sweep times its points as they were (``model.same_timing``):
        other threads, affinity, TF32, a framework or driver version move them, and the ranges restart."""
        if not same_timing(timed_as, environment):
            self._range_tops = {}

    @property
    def last_point_others(self) -> float | None:
        """The most other programs (or steal) used of the host over the last point's tries, in cores; None before
        any point, where the guard does not meter the host, or where the host reference read the host slowed past its
        allowance over the point, or could not judge it yet (it must not count as calm)."""
        return self._last_others

    @property
    def host_reference(self) -> HostReference | None:
        """What this sweep's readings of the host reference were; None if it took none."""
        if not self._readings:
            return None
        return HostReference(median_s=statistics.median(self._readings), spread=_relative_spread(self._readings))

    # --- what the hardware looked like ------------------------------------------------------

    def contexts(self, devices: Sequence[DeviceInfo]) -> list[HardwareContext]:
        """One context per device that was timed under the guard."""
        found = []
        for device in devices:
            gpu = self._gpus.get(device.device)
            if gpu is not None and (gpu.samples or gpu.host_wait_max is not None or gpu.host_slowdown_max is not None):
                found.append(_gpu_context(device, gpu))
            cpu = self._cpus.get(device.device)
            if cpu is not None:
                found.append(
                    HardwareContext(
                        backend=device.backend,
                        device=device.device,
                        other_cpu_cores=cpu.other_cores_max,
                        cpu_throttled_s=cpu.throttled_s,
                        cpu_steal_cores=cpu.steal_cores_max,
                        cpu_blocks_set_aside_ratio=cpu.set_aside_ratio,
                        host_slowdown_max=cpu.host_slowdown_max,
                    )
                )
        return found


@dataclass(frozen=True)
class JudgedPoint:
    """A point the guard may hold against its own idle range: which it is, its median once timed, and the share
    of a time of it that is the host's (None: not known, so it is not judged by its range)."""

    key: PointKey
    median: Callable[[], float | None]
    host_share_at: Callable[[float], float | None] = lambda _: 1.0
    range_from: PointKey | None = None  # the point whose range stands in where it has none (a refinement's size)


def host_share_at(kind: DeviceKind, mode: Mode, size: int, fixed_s: float | None, seconds: float) -> float | None:
    """The share of a time ``seconds`` of a point that is the host's: all of a CPU or end_to_end point's (a copy of
    host memory is host work too) and of the n = 1 point's (it is the fixed cost); a GPU compute point's host side is
    about its fixed cost (``fixed_s``, its n = 1 point's median) over that time; None without that figure."""
    if kind != "gpu" or mode != "compute" or size == 1:
        return 1.0
    return None if fixed_s is None else min(1.0, fixed_s / seconds)


def _idle_range(figure: RangeTop, median_s: float, judged: JudgedPoint | None) -> rule.IdleRange:
    stand_in = judged is not None and figure.key != judged.key
    return rule.IdleRange(
        median_s=median_s,
        top_s=figure.upper_s,
        sweeps=figure.sweeps,
        stand_in_size=figure.key.size if stand_in else None,
    )


def _others(load: HostLoad) -> float:
    """Other programs' use of the host over a window, in cores: their processes', or the hypervisor's steal."""
    return max(load.other_cores, load.steal_cores)


def _relative_spread(readings: Sequence[float]) -> float:
    """The readings' relative IQR read from their lower half (twice median less first quartile, inclusive
    quartiles): a host slowed for a stretch of the sweep only reads slower, and its slow readings in the upper
    quartile would widen the next sweeps' allowance by the very slowdown it is to catch."""
    if len(readings) < 2:  # noqa: PLR2004 - a spread needs two
        return 0.0
    q1, median, _ = statistics.quantiles(readings, n=4, method="inclusive")
    return relative_iqr(median, 2 * (median - q1))


def _lowest(values: Iterable[N | None]) -> N | None:
    return min((v for v in values if v is not None), default=None)


def _highest(values: Iterable[N | None]) -> N | None:
    return max((v for v in values if v is not None), default=None)


def _gpu_context(device: DeviceInfo, record: _GpuRecord) -> HardwareContext:
    samples = record.samples
    return HardwareContext(
        backend=device.backend,
        device=device.device,
        sm_clock_min_hz=_lowest(s.sm_clock_hz for s in samples),
        sm_clock_max_hz=_highest(s.sm_clock_max_hz for s in samples),
        clock_events=tuple(sorted({reason for s in samples for reason in s.clock_events})),
        temperature_max_c=_highest(s.temperature_c for s in samples),
        power_max_w=_highest(s.power_w for s in samples),
        pcie_generation_min=_lowest(s.pcie_generation for s in samples),
        pcie_width_min=_lowest(s.pcie_width for s in samples),
        pcie_generation_max=_highest(s.pcie_generation_max for s in samples),
        pcie_width_max=_highest(s.pcie_width_max for s in samples),
        other_processes_max=record.others_max if samples else None,
        power_limited_ratio=record.limited_ratio("power"),
        thermal_limited_ratio=record.limited_ratio("thermal"),
        host_wait_ratio=record.host_wait_max,
        host_slowdown_max=record.host_slowdown_max,
        worker_gpu_memory_max_bytes=record.own_memory_max,
    )
