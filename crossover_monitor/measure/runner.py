"""Times a plan against a backend point by point and emits what it finds as messages.

Besides the configured sizes it times the n=1 point (the fixed cost), times the sizes around
each crossover again in several visits and adds sizes between them (refinement), and can stop
timing the CPU where it cannot change the answer; each of these is bounded by the plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from crossover_monitor.analysis.crossover import SpeedupPoint, crossing_span, last_crossing, speedup_point
from crossover_monitor.config.settings import GuardSettings, TimingSettings
from crossover_monitor.errors import BackendError, MeasurementFailed
from crossover_monitor.measure.contract import Backend
from crossover_monitor.measure.guard import rule
from crossover_monitor.measure.guard.guard import Guard, JudgedPoint, host_share_at
from crossover_monitor.measure.guard.hostinfo import affinity_text
from crossover_monitor.measure.guard.rule import Fate
from crossover_monitor.measure.timing import Clock, measure, with_visit
from crossover_monitor.memory import MemoryLimit, refusal
from crossover_monitor.model import (
    CPU_AFFINITY,
    DRIVER_VERSION,
    GPU_PROBLEM,
    HOST_REFERENCE,
    HOST_REFERENCE_SPREAD,
    DeviceFailure,
    DeviceInfo,
    Measurement,
    Mode,
    PointKey,
    Role,
    Timing,
    Withheld,
    WithheldReason,
    canonical_device,
    gpu_cpu_pairs,
    same_timing,
    speedup,
)
from crossover_monitor.protocol import Environment, Message, Plan, Started

Emit = Callable[[Message], None]
# Blocks of a later visit of a point: a median that one slow block cannot move. Between visits a
# point's level moves by more than its blocks within one show, so visits, not blocks, are spent.
REVISIT_BLOCKS = 3
# Rounds of refinement: each may find the crossover at a size it has not yet timed in visits.
_REFINE_ROUNDS = 4


def select_devices(
    backend: Backend,
    requested: Sequence[str] | None,
    emit: Emit,
    given_up: Sequence[str] = (),
    *,
    missing_is_fatal: bool = True,
) -> list[DeviceInfo]:
    """The discovered devices the plan asks for; each requested one that is missing is a (fatal) failure.

    Devices in ``given_up`` failed fatally in an earlier sweep: they are reported again (so their
    up gauge stays 0) but not touched.
    """
    skipped = {canonical_device(name) for name in given_up}
    for name in given_up:
        reason = "not retried after a fatal failure in an earlier sweep; restart the service once it is fixed"
        emit(DeviceFailure(backend=backend.name, device=name, reason=reason, fatal=True))
    found = [d for d in backend.discover() if canonical_device(d.device) not in skipped]
    if requested is None:
        return found
    requested = [name for name in requested if canonical_device(name) not in skipped]
    by_name = {canonical_device(d.device): d for d in found}
    chosen = []
    for name in requested:
        device = by_name.get(canonical_device(name))
        if device is None:
            available = ", ".join(d.device for d in found) or "none"
            reason = f"no such device (this machine has: {available})"
            emit(DeviceFailure(backend=backend.name, device=name, reason=reason, fatal=missing_is_fatal))
        else:
            chosen.append(device)
    return chosen


class _PointSetAside(Exception):
    """The host ran slower while a point was timed, by more than the point's host share allows: this point
    is withheld, and its device goes on (the next points are judged on their own)."""

    def __init__(self, verdict: Withheld, timing: Timing) -> None:
        super().__init__(verdict.detail)
        self.verdict = verdict
        self.timing = timing  # what the slowed host gave: never published


@dataclass
class _Session:
    """One sweep inside the worker: what was measured so far and which devices failed."""

    plan: Plan
    backend: Backend
    emit: Emit
    clock: Clock
    guard: Guard
    failed: set[str] = field(default_factory=set)
    withheld: set[str] = field(default_factory=set)  # busy or disturbed: nothing more is timed on it
    devices: list[DeviceInfo] = field(default_factory=list)
    timed: set[str] = field(default_factory=set)  # devices with a point timed in this sweep
    timings: dict[PointKey, Timing] = field(default_factory=dict)  # all visits so far
    roles: dict[PointKey, Role] = field(default_factory=dict)
    others: dict[PointKey, float] = field(default_factory=dict)  # the most others used over a point's visits
    # Points a visit of which the guard gave no others reading (timed while the host reference read the host
    # slowed): they say none, whatever a later visit read, so that their medians join no idle range.
    not_calm: set[PointKey] = field(default_factory=set)
    # Points withheld alone, with what the slowed host gave them: never timed again in this sweep (a refinement
    # that lands on one leaves it withheld), and never published; a GPU's n = 1 point's still bounds its
    # fixed cost for the host share of its other points (an overestimate: they are judged more strictly).
    set_aside: dict[PointKey, Timing] = field(default_factory=dict)
    # Their verdicts, when they were set aside and what they were timed as: each is timed again once as the sweep
    # ends (``_time_set_aside_again``), and its verdict said only if it is set aside again.
    slowed: dict[PointKey, tuple[Withheld, float, DeviceInfo, Role]] = field(default_factory=dict)
    last_tries: bool = False  # the sweep's end: a point set aside now stays withheld
    # Points whose matrices cannot fit the memory the worker may use: refused as the sweep is planned, never tried.
    refused: set[PointKey] = field(default_factory=set)
    # Points of the served curve this sweep serves as an earlier sweep timed them (``analysis.focus``), until the
    # crossovers lean on them (``_retime_carried_if_leaned_on``).
    carried: dict[PointKey, Measurement] = field(default_factory=dict)
    same_timing_as_served: bool = False  # what the served curve was timed with is what this sweep times with

    def carry(self, points: Sequence[Measurement]) -> None:
        """Serve ``points`` as they were timed: in the curves the refinement reads now, and emitted as they are once
        the sweep has timed what it will (``emit_carried``): one it times again after all is never sent stale."""
        for point in points:
            self.carried[point.key] = point
            self.timings[point.key] = point.timing
            self.roles[point.key] = point.role

    def emit_carried(self) -> None:
        """The carried points still carried, of the devices still served (a withheld device's curve is carried whole
        by the daemon)."""
        for key, point in self.carried.items():
            if key.device not in self.withheld | self.failed:
                self.emit(point)

    def served_interval(self, dtype: str, mode: Mode) -> tuple[float, float] | None:
        """The sizes the served crossovers of a dtype and mode were found between (their intervals), where the
        sweep times as they were timed; None where there are none."""
        if not self.same_timing_as_served:
            return None
        reaches = [r for c in self.plan.refine_around if (c.dtype, c.mode) == (dtype, mode) and (r := c.reach)]
        return (min(r[0] for r in reaches), max(r[1] for r in reaches)) if reaches else None

    def retime_carried(self, dtype: str, mode: Mode) -> bool:
        """Time the carried points of one dtype and mode again (``_sweep_sizes``); False if none was carried."""
        dropped = [k for k in self.carried if (k.dtype, k.mode) == (dtype, mode)]
        for key in dropped:
            del self.carried[key], self.timings[key], self.roles[key]
        return bool(dropped)

    def key(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> PointKey:
        return PointKey(backend=self.backend.name, device=device.device, dtype=dtype, mode=mode, size=size)

    def point(self, device: DeviceInfo, size: int, dtype: str, mode: Mode, role: Role) -> float | None:
        """Time one point (once per sweep) and emit it; its median, or None if it could not be timed."""
        where = self.key(device, size, dtype, mode)
        cached = self.timings.get(where)
        gone = device.device in self.failed | self.withheld or self.retry_is_over()
        if cached is not None or where in self.set_aside or where in self.refused or gone:
            return cached.median_s if cached is not None else None
        timing = self._attempt(device, size, dtype, mode, role=role, settings=self.plan.bench.timing, calls=None)
        if timing is None:
            return None
        self.timed.add(device.device)
        self.timings[where] = timing
        self.roles[where] = role
        self._emit_point(device, size, dtype, mode)
        return timing.median_s

    def visit_round(self, devices: list[DeviceInfo], size: int, dtype: str, mode: Mode, visits: int) -> bool:
        """Bring one size to ``visits`` visits on every device; False (the round taken back) if one could not be.

        The CPU's and a GPU's k-th visits are paired by their order, so a round must be whole.
        """
        wheres = [self.key(d, size, dtype, mode) for d in devices]
        before = [self.timings.get(where) for where in wheres]
        others_before = {where: self.others[where] for where in wheres if where in self.others}
        not_calm_before = self.not_calm & set(wheres)
        for device in devices:
            self.visit(device, size, dtype, mode, visits)
        if all(where in self.timings and self.timings[where].visit_count >= visits for where in wheres):
            return True
        for device, where, earlier in zip(devices, wheres, before, strict=True):
            if earlier is not None and self.timings.get(where) != earlier:
                self.timings[where] = earlier
                self.others.pop(where, None)  # and what others used over the visits it keeps
                if where in others_before:
                    self.others[where] = others_before[where]
                self.not_calm.discard(where)
                if where in not_calm_before:
                    self.not_calm.add(where)
                self._emit_point(device, size, dtype, mode)  # the point as it was before this round
        return False

    def visit(self, device: DeviceInfo, size: int, dtype: str, mode: Mode, visits: int) -> None:
        """Time a point again (short blocks of the first visit's length) up to ``visits`` visits."""
        where = self.key(device, size, dtype, mode)
        timing = self.timings.get(where)
        if timing is None:
            self.point(device, size, dtype, mode, "refine")
            return
        if timing.visit_count >= visits or where in self.carried:  # a carried point leaned on is timed anew instead
            return
        if device.device in self.failed | self.withheld or self.retry_is_over():
            return
        blocks = dataclasses.replace(self.plan.bench.timing, min_blocks=REVISIT_BLOCKS, max_blocks=REVISIT_BLOCKS)
        again = self._attempt(device, size, dtype, mode, role="refine", settings=blocks, calls=timing.calls_per_block)
        if again is not None:
            self.timings[where] = with_visit(timing, again, self.plan.bench.timing.target_spread)
            self._emit_point(device, size, dtype, mode)  # replaces the point's earlier message

    def _emit_point(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> None:
        where = self.key(device, size, dtype, mode)
        if where in self.carried:  # sent as the sweep ends
            return
        others = None if where in self.not_calm else self.others.get(where)
        self.emit(Measurement(key=where, timing=self.timings[where], role=self.roles[where], others_cores=others))

    def _attempt(
        self,
        device: DeviceInfo,
        size: int,
        dtype: str,
        mode: Mode,
        *,
        role: Role,
        settings: TimingSettings,
        calls: int | None,
    ) -> Timing | None:
        """One visit of a point under the guard; None if it failed (reported) or was withheld."""
        key = self.key(device, size, dtype, mode)
        self.emit(Started(key=key, role=role))
        try:
            return self._guarded(device, size, dtype, mode, settings=settings, calls=calls)
        except _PointSetAside as aside:
            self.timed.add(device.device)  # it was timed clean of other jobs: a job arriving later stops the sweep
            # Only a point that has no figure yet is withheld (a size refinement added too, named, so that the
            # crossover its gap withholds says why): a refinement's revisit is taken back, its earlier visits stand.
            if key not in self.timings:
                self.set_aside[key] = aside.timing
                if self.last_tries:
                    self.emit(aside.verdict)
                else:
                    self.slowed[key] = (aside.verdict, self.clock(), device, role)
            return None
        except MeasurementFailed as exc:
            self.emit(DeviceFailure(backend=self.backend.name, device=device.device, reason=str(exc), point=key))
            return None
        except BackendError as exc:
            self.failed.add(device.device)
            self.emit(DeviceFailure(backend=self.backend.name, device=device.device, reason=str(exc), fatal=exc.fatal))
            return None
        except Exception as exc:  # noqa: BLE001 - a plug-in backend's bug fails its device, not the sweep
            self.failed.add(device.device)
            reason = f"unexpected {type(exc).__name__} from the backend: {exc}"
            self.emit(DeviceFailure(backend=self.backend.name, device=device.device, reason=reason))
            return None

    def _guarded(
        self, device: DeviceInfo, size: int, dtype: str, mode: Mode, *, settings: TimingSettings, calls: int | None
    ) -> Timing | None:
        """Time one point under the interference guard and do what the rule says of its verdict: None (and the device
        withheld, or the sweep stopped) if it was disturbed; raises ``_PointSetAside`` where only this point was moved
        (the host ran slower while it was timed)."""
        timed = self._timed_gpu if device.kind == "gpu" else self._timed_cpu
        verdict, timing = timed(device, size, dtype, mode, settings=settings, calls=calls)
        # Busy after a point of it was measured clean in this sweep: a job arrived while the sweep ran. (Busy at its
        # first point is a job that was there first, or one the guard could only see once the worker's own context
        # joined it in a separate PID namespace: no reason to stop.)
        fate = rule.fate_of(verdict, job_arrived=device.device in self.timed)
        if verdict is not None and fate is Fate.SWEEP_STOPPED:
            self.yield_to(verdict)
            return None
        if verdict is not None and fate is Fate.POINT_WITHHELD and timing is not None:
            raise _PointSetAside(dataclasses.replace(verdict, point=self.key(device, size, dtype, mode)), timing)
        if verdict is not None:
            self.withhold(verdict)
            return None
        if timing is not None and not (math.isfinite(timing.median_s) and timing.median_s > 0):  # a broken clock
            raise MeasurementFailed(device.device, f"n={size}", f"impossible median {timing.median_s!r} s at n={size}")
        others = self.guard.last_point_others
        if timing is not None:
            where = self.key(device, size, dtype, mode)
            if others is None:
                self.not_calm.add(where)  # with no host meter every point says none anyway
            else:
                self.others[where] = max(others, self.others.get(where, 0.0))
        return timing

    def _timed_gpu(
        self, device: DeviceInfo, size: int, dtype: str, mode: Mode, *, settings: TimingSettings, calls: int | None
    ) -> tuple[Withheld | None, Timing | None]:
        """A GPU point under the guard: looked at before anything is allocated on it (a busy GPU gets no operands
        either), timed, looked at again; the verdict and its timing (None where it was not timed)."""
        verdict = self.guard.before_gpu_point(device)
        if verdict is not None:
            return verdict, None
        run = self.backend.prepare(device, size, dtype, mode)
        timings: list[Timing] = []
        fixed_key = self.key(device, 1, dtype, mode)
        share_at = _host_share_at(device, size, mode, self.timings.get(fixed_key) or self.set_aside.get(fixed_key))

        def host_share() -> float:
            """The reference's judgement takes all of a point whose share is not known as the host's."""
            share = share_at(timings[-1].median_s) if timings else None
            return 1.0 if share is None else share

        waited = self.guard.time_gpu_point(
            device,
            lambda: timings.append(measure(run, settings, self.clock, calls=calls)),
            host_share,
            self._judged(device, size, dtype, mode, timings, share_at=share_at, revisit=calls is not None),
        )
        # A job that arrived meanwhile outranks a host that was busy: it stops the sweep.
        return self.guard.after_gpu_point(device) or waited, timings[-1]

    def _timed_cpu(
        self, device: DeviceInfo, size: int, dtype: str, mode: Mode, *, settings: TimingSettings, calls: int | None
    ) -> tuple[Withheld | None, Timing | None]:
        """A CPU point under the guard: the verdict and its timing."""
        run = self.backend.prepare(device, size, dtype, mode)
        timings: list[Timing] = []
        threads = int(dict(device.details).get("threads", "0")) or 1
        share_at = _host_share_at(device, size, mode, None)
        verdict = self.guard.time_cpu_point(
            device,
            threads,
            lambda watch: timings.append(measure(run, settings, self.clock, calls=calls, watch=watch)),
            self._judged(device, size, dtype, mode, timings, share_at=share_at, revisit=calls is not None),
        )
        return verdict, timings[-1]

    def _judged(
        self,
        device: DeviceInfo,
        size: int,
        dtype: str,
        mode: Mode,
        timings: list[Timing],
        *,
        share_at: Callable[[float], float | None],
        revisit: bool,
    ) -> JudgedPoint | None:
        """The point for the guard to hold against its idle range, its median the latest try's; None for a
        revisit (a few short blocks, whose median is noisier than the full points the range is made of). A
        point whose host share is not known is not judged by its range. A size the configuration does not ask
        for (a refinement's) is held against the range of the next configured size up, which a curve that
        rises with n keeps above it."""
        if revisit:
            return None
        configured = self.plan.bench.sizes
        refined = size not in configured and size != 1  # n = 1 is timed for the fixed cost, configured or not
        above = min((n for n in configured if n > size), default=None) if refined else None
        return JudgedPoint(
            self.key(device, size, dtype, mode),
            lambda: timings[-1].median_s if timings else None,
            share_at,
            range_from=None if above is None else self.key(device, above, dtype, mode),
        )

    def retry_is_over(self) -> bool:
        """A retry exists for its GPUs (where it has any: a CPU-only host's retries the CPU alone): once none of them
        can be timed, the CPU is not timed either."""
        gpus = [d.device for d in self.devices if d.kind == "gpu"]
        return self.plan.retry and bool(gpus) and all(gpu in self.withheld | self.failed for gpu in gpus)

    def withhold(self, verdict: Withheld) -> None:
        self.withheld.add(verdict.device)
        self.emit(verdict)

    def yield_to(self, verdict: Withheld) -> None:
        """A job started on a GPU mid-sweep: give up the rest of the sweep, CPU points included.

        The CPU's threads would take cores the job's own host threads need (a job starting mid-sweep
        on a 16-vCPU H200 machine ran 10% slower while the sweep went on timing the CPU). Every other
        device is withheld too, since a curve is published whole or not at all; the busy GPUs' retry
        times them again, the CPU with them.
        """
        self.withhold(verdict)
        detail = f"the sweep stopped to stay out of the way of a job that started on {verdict.device} while it ran"
        for device in self.devices:
            if device.device not in self.withheld | self.failed:
                self.withhold(
                    Withheld(backend=device.backend, device=device.device, reason=WithheldReason.YIELDED, detail=detail)
                )

    def speedup(self, cpu: DeviceInfo, gpu: DeviceInfo, dtype: str, mode: Mode, size: int) -> float | None:
        cpu_time = self.timings.get(self.key(cpu, size, dtype, mode))
        gpu_time = self.timings.get(self.key(gpu, size, dtype, mode))
        return speedup(cpu_time.median_s, gpu_time.median_s) if cpu_time is not None and gpu_time is not None else None

    def curve(self, cpu: DeviceInfo, gpu: DeviceInfo, dtype: str, mode: Mode) -> list[SpeedupPoint]:
        """The pair's speed-ups so far, at every size both have (the n=1 fixed-cost point aside), visits paired."""
        return [
            speedup_point(where.size, timing, self.timings[on_gpu])
            for where, timing in self.timings.items()
            if where.device == cpu.device
            and (where.dtype, where.mode) == (dtype, mode)
            and (on_gpu := dataclasses.replace(where, device=gpu.device)) in self.timings
            and self.roles[where] != "fixed_cost"
        ]


def _host_share_at(device: DeviceInfo, size: int, mode: Mode, fixed: Timing | None) -> Callable[[float], float | None]:
    """The share of a time of the point that is the host's (``guard.host_share_at``), from its n = 1 point's timing."""
    fixed_s = None if fixed is None else fixed.median_s
    return lambda seconds: host_share_at(device.kind, mode, size, fixed_s, seconds)


def run_plan(
    plan: Plan,
    backend: Backend,
    emit: Emit,
    clock: Clock,
    guard: Guard | None = None,
    *,
    memory: MemoryLimit | None = None,
) -> None:
    """Time every (dtype, mode, size, device) of the plan; a failed or withheld device is left out from then on.

    Sizes are the outer loop over devices so that the CPU and GPU timings of one size are taken
    close together in time, and drift on the host affects both alike. A point whose matrices cannot fit
    ``memory`` (what the worker may use) fails at once with that reason: the OOM killer would end the whole sweep.
    """
    guard = guard or Guard(GuardSettings(enabled=False), gpu_sampler=None, host=None, own_pid=0, sleep=lambda _: None)
    environment = _environment(backend, guard)
    emit(Environment(environment))
    guard.use_range_tops_timed_as(plan.range_tops_timed_as, environment)
    # A retry names its devices; one that vanished for a moment (a GPU reset) is not given up for good.
    devices = select_devices(backend, plan.bench.devices, emit, plan.given_up, missing_is_fatal=not plan.retry)
    for device in devices:
        # The driver's UUID and PCI bus id win over what the framework said: they are what other exporters use.
        details = {str(k): str(v) for k, v in device.details} | guard.identity(device)
        emit(dataclasses.replace(device, details=tuple(details.items())))
    found_gpus = sum(1 for d in devices if d.kind == "gpu")
    _report_missing_gpus(plan, backend.name, found_gpus, environment.get(GPU_PROBLEM), emit)
    session = _Session(plan, backend, emit, clock, guard, devices=devices)
    session.refused = _refuse_what_cannot_fit(session, memory)
    session.same_timing_as_served = same_timing(plan.carried_timed_as, environment)
    if session.same_timing_as_served:  # else another framework, threads or driver: time them all
        names = {d.device for d in devices}
        session.carry([p for p in plan.carried if p.key.device in names and p.key not in session.refused])
    if plan.retry and not _any_gpu_free(session, devices):
        return  # still busy: the CPU's curve would be timed for nothing
    refine_left = plan.bench.refine.budget_s  # the budget is the refinement's own time, over all dtypes and modes
    for dtype in plan.bench.dtypes:
        for mode in plan.bench.modes:
            refine_left -= _time_curve(session, devices, dtype, mode, refine_left)
    _time_set_aside_again(session)
    session.emit_carried()
    for context in guard.contexts([d for d in devices if d.device not in session.withheld | session.failed]):
        emit(context)
    reference = guard.host_reference
    if reference is not None:  # the daemon's baseline for the next sweeps
        emit(
            Environment({HOST_REFERENCE: f"{reference.median_s:.6g}", HOST_REFERENCE_SPREAD: f"{reference.spread:.4g}"})
        )


def _time_curve(session: _Session, devices: list[DeviceInfo], dtype: str, mode: Mode, refine_left: float) -> float:
    """Time one dtype and mode's curve on every device and refine it within ``refine_left``; the refinement's time."""
    bench = session.plan.bench
    if 1 not in bench.sizes:
        for device in devices:
            session.point(device, 1, dtype, mode, "fixed_cost")
    _sweep_sizes(session, devices, dtype, mode)
    _retime_carried_if_leaned_on(session, devices, dtype, mode)
    if not bench.refine.enabled or refine_left <= 0:
        return 0.0
    started = session.clock()
    _refine(session, devices, dtype, mode, started + refine_left, seeded=True)
    if _retime_carried_if_leaned_on(session, devices, dtype, mode):  # the visits moved n* out to a carried size
        _refine(session, devices, dtype, mode, started + refine_left, seeded=False)
    return session.clock() - started


def _time_set_aside_again(session: _Session) -> None:
    """Time each point the slowed host set aside once more as the sweep ends, at least ``rule.SLOWED_AGAIN_AFTER_S``
    after it was (a host's slow spell outlasts the second try a second later): published if the guard finds it
    clean then, withheld (its verdict said) if not. Its size's refinement visits are not made up for."""
    session.last_tries = True
    for key, (verdict, set_aside_at, device, role) in list(session.slowed.items()):
        del session.slowed[key]
        if device.device in session.withheld | session.failed or session.retry_is_over():
            session.emit(verdict)  # said once, whole, with its device's own verdict
            continue
        wait = set_aside_at + rule.SLOWED_AGAIN_AFTER_S - session.clock()
        if wait > 0:
            session.guard.pause(wait)
        del session.set_aside[key]
        if session.point(device, key.size, key.dtype, key.mode, role) is None and key not in session.set_aside:
            session.emit(verdict)  # not timed at all this time (a failure, said): withheld as it was


def _environment(backend: Backend, guard: Guard) -> dict[str, str]:
    """What the sweep ran with. Plain strings on the wire, whatever a plug-in hands over (an int thread count,
    say); the cores the worker may run on and the GPU driver change the answer as the framework does, and a
    drift alert names their change."""
    environment = {CPU_AFFINITY: affinity_text()} | {str(k): str(v) for k, v in backend.environment().items()}
    driver = guard.driver_version()
    if driver:
        environment[DRIVER_VERSION] = driver
    return environment


def _report_missing_gpus(plan: Plan, backend: str, found_gpus: int, problem: str | None, emit: Emit) -> None:
    """One failure per expected GPU not found, saying why where the backend could tell (it found none)."""
    for index in range(found_gpus, plan.bench.expect_gpus):
        # A named series (expected-gpu-N) so that matmul_device_up says 0 and the device-down alert fires.
        reason = f"expected {plan.bench.expect_gpus} GPU(s), {backend} found {found_gpus}: " + (
            problem
            or "is the driver loaded and the device visible to this process (CUDA_VISIBLE_DEVICES, container runtime)?"
        )
        emit(DeviceFailure(backend=backend, device=f"expected-gpu-{index}", reason=reason))


def _refuse_what_cannot_fit(session: _Session, memory: MemoryLimit | None) -> set[PointKey]:
    """The configured points whose matrices alone exceed ``memory``, each failed with its reason (size and limit)."""
    refused = set()
    bench = session.plan.bench
    for dtype in bench.dtypes:
        for mode in bench.modes:
            for size in bench.sizes:
                for device in session.devices:
                    reason = refusal(size, dtype, mode, device.kind, memory)
                    if reason is not None:
                        key = session.key(device, size, dtype, mode)
                        refused.add(key)
                        session.emit(DeviceFailure(backend=key.backend, device=key.device, reason=reason, point=key))
    return refused


def _any_gpu_free(session: _Session, devices: list[DeviceInfo]) -> bool:
    """Look at every GPU before anything is timed; withhold the busy ones. False if there are GPUs and none is free."""
    gpus = [d for d in devices if d.kind == "gpu"]
    for gpu in gpus:
        verdict = session.guard.before_gpu_point(gpu)
        if verdict is not None:
            session.withhold(verdict)
    return not gpus or any(gpu.device not in session.withheld for gpu in gpus)


def _sweep_sizes(session: _Session, devices: list[DeviceInfo], dtype: str, mode: Mode) -> None:
    factor = session.plan.bench.skip_cpu_above_speedup
    pairs = gpu_cpu_pairs(devices)
    gpus = [d for d in devices if d.kind == "gpu"]
    streak = 0  # consecutive sizes at which every GPU beat every CPU by the factor
    for size in session.plan.bench.sizes:
        for device in devices:
            if device.kind == "cpu" and factor is not None and streak >= 2:  # noqa: PLR2004 - two in a row
                continue
            session.point(device, size, dtype, mode, "sweep")
        if factor is None or streak >= 2 or not gpus:  # noqa: PLR2004
            continue
        ratios = [
            session.speedup(c, g, dtype, mode, size)
            for c, paired in pairs
            for g in paired
            if g.device not in session.failed | session.withheld
        ]
        far = bool(ratios) and all(r is not None and r >= factor for r in ratios)
        streak = streak + 1 if far else 0


def _retime_carried_if_leaned_on(session: _Session, devices: list[DeviceInfo], dtype: str, mode: Mode) -> bool:
    """Time the carried points of a dtype and mode after all where a pair's change of lead (the sizes the
    refinement would visit) reaches one of them: n* has moved out of the sizes timed around it. True if it did."""
    carried = {k.size for k in session.carried if (k.dtype, k.mode) == (dtype, mode)}
    spacing = session.plan.bench.refine.spacing
    leaned_on = any(
        _sizes_to_visit(session.curve(cpu, gpu, dtype, mode), spacing) & carried
        for cpu, paired in gpu_cpu_pairs(devices)
        for gpu in paired
    )
    if not leaned_on or not session.retime_carried(dtype, mode):
        return False
    _sweep_sizes(session, devices, dtype, mode)
    return True


def _refine(
    session: _Session, devices: list[DeviceInfo], dtype: str, mode: Mode, deadline: float, *, seeded: bool = True
) -> None:
    """Time the sizes around each crossover in ``refine.visits`` visits each, until time is up.

    The measured sizes from the first to the last change of which device is faster, and sizes
    between the two around the last change, at most ``spacing`` apart; again if the visits' medians
    move those changes to sizes timed once. Visits go round-robin over the sizes, and at each size
    the CPU and every GPU in turn, so that one size's visits are spread over the sweep and the CPU's
    and a GPU's k-th visits are taken together. A size's round is kept whole: if one device's visit
    fails there, the round's other visits are taken back and the size is visited no more.
    """
    refine = session.plan.bench.refine
    cpus = [d for d in devices if d.kind == "cpu"]
    gpus = [d for d in devices if d.kind == "gpu"]
    pairs = gpu_cpu_pairs(devices)
    done: set[int] = set()
    around = session.served_interval(dtype, mode) if seeded else None  # unseeded: n* is no longer where it was
    for _ in range(_REFINE_ROUNDS):
        wanted: set[int] = set()
        for cpu, paired in pairs:
            for gpu in paired:
                wanted |= _sizes_to_visit(session.curve(cpu, gpu, dtype, mode), refine.spacing)
        if around is not None and not done:  # first where n* was: a crossing found elsewhere widens the next round
            low, high = around[0] / (1 + refine.spacing), around[1] * (1 + refine.spacing)
            wanted = {n for n in wanted if low <= n <= high} or wanted
        sizes = sorted(wanted - done)
        if not sizes:
            return
        done |= set(sizes)
        for visit in range(1, refine.visits + 1):
            for size in sizes:
                if session.clock() >= deadline:
                    return
                if not session.visit_round(cpus + gpus, size, dtype, mode, visit):
                    sizes = [n for n in sizes if n != size]


def _sizes_to_visit(curve: list[SpeedupPoint], spacing: float) -> set[int]:
    """The sizes around a pair's crossover: those where the lead changes, and sizes inside the last change's bracket."""
    if not curve:
        return set()
    span = crossing_span(curve)
    wanted = set() if span is None else {p.size for p in curve if span[0] <= p.size <= span[1]}
    _, _, lower, upper = last_crossing(sorted((p.size, p.median) for p in curve))
    if lower is not None and upper is not None:
        wanted |= {lower, upper, *between(lower, upper, spacing)}
    return wanted


# Added sizes are multiples of this where one is in reach. Odd sizes carry their own costs: on an H200
# with TensorFlow the CPU took 71-73 us at n = 99-103 against 65 at 96 (compute), and 1.4 ms at
# n = 362 against 1.1 at 431 (end_to_end), which made the GPU "win" at 362 alone and 4 of 16 idle
# sweeps `ambiguous` (benchmarks/README.md, "Fourth session"). Models use aligned shapes too.
_ALIGN = 8


def between(lower: int, upper: int, spacing: float) -> list[int]:
    """Sizes between two with no two neighbours more than ``spacing`` apart (ratio − 1), each as far
    from the one before as that allows: the largest multiple of ``_ALIGN`` in reach when it is at
    least half as far as the reach, else the largest size in reach (small sizes, where multiples of
    8 are far apart). Aligned sizes can take one more size per bracket than unaligned ones would
    (64-128: 72, 80, 96, 112)."""
    found: list[int] = []
    previous = lower
    while True:
        reach = math.floor(previous * (1 + spacing) + 1e-9)
        if reach >= upper:
            return found
        aligned = reach - reach % _ALIGN
        far_enough = aligned - previous >= (reach - previous) / 2
        following = aligned if aligned > previous and far_enough else max(reach, previous + 1)
        if following >= upper:
            return found
        found.append(following)
        previous = following
