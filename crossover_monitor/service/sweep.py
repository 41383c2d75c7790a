"""One sweep: start a worker process, feed it the plan, enforce the deadline, build the outcome.

The daemon never imports a framework: all timing happens in the worker, a fresh interpreter
in its own process group, killed with that group when it overruns or the service stops.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Protocol

from crossover_monitor.analysis.costs import cost_models
from crossover_monitor.analysis.crossover import crossovers
from crossover_monitor.memory import MemoryLimit, memory_limit, oom_kills
from crossover_monitor.model import (
    Crossover,
    CrossoverState,
    DeviceFailure,
    DeviceInfo,
    HardwareContext,
    Measurement,
    PointKey,
    Snapshot,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
    failed_devices,
    gpu_cpu_pairs,
)
from crossover_monitor.protocol import Done, Environment, Fatal, Message, Plan, ProtocolError, Started, decode
from crossover_monitor.text import printable

log = logging.getLogger(__name__)

KILL_GRACE_S = 2.0  # SIGTERM first, then SIGKILL after this long


class EndOfStream:
    """The worker closed its message stream (it exited or died)."""


END_OF_STREAM = EndOfStream()


class Worker(Protocol):
    """A running worker: a stream of messages that can be stopped."""

    def next_message(self, timeout: float) -> Message | EndOfStream | None:
        """The next message, END_OF_STREAM when the stream ended, None if nothing came in time."""
        ...

    def stop(self) -> int | None:
        """Kill the worker (its whole process group) and return its exit status."""
        ...

    def exit_status(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` for a clean exit; None if it is still running."""
        ...

    def diagnostics(self) -> str:
        """The last lines the worker wrote to stderr."""
        ...


Launcher = Callable[[Plan], Worker]


WORKER_COMMAND = (sys.executable, "-m", "crossover_monitor.measure.worker")
# The longest line read from the worker: a message is a few KiB (a point's blocks, the hardware seen); a plugin
# or library that writes garbage (a line of hundreds of MiB, JSON nested past the parser) fails the sweep at
# once instead of holding the daemon's memory or killing its reader thread.
MESSAGE_CHARS = 1 << 20
STDERR_LINE_CHARS = 4096  # of each stderr line, what is kept (the last 20 lines go into a failure's reason)


def bounded_lines(stream: IO[str], limit: int) -> Iterator[tuple[str, bool]]:
    """The stream's lines, each cut at ``limit`` characters: (line, whole); the rest of a cut line is read
    and dropped in pieces of ``limit``, so no line is ever held whole."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if line.endswith("\n") or len(line) < limit:
            yield line, True
            continue
        yield line, False
        while True:  # the rest of the long line, thrown away
            rest = stream.readline(limit)
            if not rest or rest.endswith("\n"):
                break


class SubprocessWorker:
    """``python -m crossover_monitor.measure.worker`` in a new session (process group), plan on stdin."""

    def __init__(self, plan: Plan, command: Sequence[str] = WORKER_COMMAND) -> None:
        """``command``: the worker's (a test starts a program that misbehaves in its place)."""
        worker_env = dict(os.environ)
        worker_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ chatter off unless asked
        # CUDA's ordinals in NVML's (PCI) order, so that the guard looks at the GPU being timed.
        worker_env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        self._process = subprocess.Popen(  # noqa: S603 - the worker, or a test's stand-in for it
            list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
            env=worker_env,
        )
        self._messages: queue.Queue[Message | EndOfStream] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        assert self._process.stdin is not None  # noqa: S101 - PIPE was asked for
        assert self._process.stdout is not None  # noqa: S101
        assert self._process.stderr is not None  # noqa: S101
        threading.Thread(target=self._read_stdout, args=(self._process.stdout,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self._process.stderr,), daemon=True).start()
        try:
            self._process.stdin.write(plan.to_json() + "\n")
            self._process.stdin.close()
        except BrokenPipeError:
            pass  # it died at once; its exit status tells why

    @property
    def pid(self) -> int:
        """The worker's pid, which is also its process group id."""
        return self._process.pid

    def _read_stdout(self, stream: IO[str]) -> None:
        for line, whole in bounded_lines(stream, MESSAGE_CHARS):
            if not whole:
                cut = f"{line[:80]!r}…"
                self._messages.put(Fatal(f"the worker wrote a line longer than {MESSAGE_CHARS} characters: {cut}"))
                continue
            try:
                self._messages.put(decode(line))
            except ProtocolError as exc:
                self._messages.put(Fatal(str(exc)))
        self._messages.put(END_OF_STREAM)

    def _read_stderr(self, stream: IO[str]) -> None:
        for line, whole in bounded_lines(stream, STDERR_LINE_CHARS):
            # Printable, as every string from the worker: its stderr reaches a failed run's reason and the page.
            text = printable(line.rstrip() if whole else f"{line}… (cut at {STDERR_LINE_CHARS} characters)")
            self._stderr.append(text)
            log.debug("worker: %s", text)

    def next_message(self, timeout: float) -> Message | EndOfStream | None:
        try:
            return self._messages.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def exit_status(self, timeout: float) -> int | None:
        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> int | None:
        status = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, sig)
            status = self.exit_status(KILL_GRACE_S)
            if status is not None:
                break
        # Children the worker started (e.g. a framework's helper) die with its group too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        return status

    def diagnostics(self) -> str:
        return " | ".join(self._stderr)


def launch_subprocess(plan: Plan) -> Worker:
    return SubprocessWorker(plan)


@dataclass
class _Collected:
    environment: dict[str, str] = field(default_factory=dict)
    devices: list[DeviceInfo] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    failures: list[DeviceFailure] = field(default_factory=list)
    withheld: list[Withheld] = field(default_factory=list)
    hardware: list[HardwareContext] = field(default_factory=list)
    watch: Callable[[Message], None] | None = None  # sees every message as it comes (progress on a terminal)
    # The point the worker said it started and has not yet answered for, and the last it started: what a worker
    # that dies was doing.
    in_flight: PointKey | None = None
    last_started: PointKey | None = None

    def add(self, message: Message) -> None:
        if self.watch is not None:
            self.watch(message)
        if isinstance(message, Started):
            self.in_flight = self.last_started = message.key
        elif isinstance(message, Measurement | DeviceFailure | Withheld):
            self.in_flight = None
        if isinstance(message, Environment):
            self.environment.update(message.values)
        elif isinstance(message, DeviceInfo):
            self.devices.append(message)
        elif isinstance(message, Measurement):
            # A point timed again (refinement's visits) comes again with every visit so far: the latest stands.
            self.measurements = [m for m in self.measurements if m.key != message.key]
            self.measurements.append(message)
        elif isinstance(message, DeviceFailure):
            self.failures.append(message)
            log.warning(
                "device failed" if message.whole_device else "point failed",
                extra={"device": message.device, "reason": message.reason},
            )
        elif isinstance(message, Withheld):
            self.withheld.append(message)
            log.info(
                "device withheld", extra={"device": message.device, "why": message.reason.value, "seen": message.detail}
            )
        elif isinstance(message, HardwareContext):
            self.hardware.append(message)


@dataclass(frozen=True)
class MemoryWatch:
    """The memory cgroup's OOM kill count as the worker started (``read`` again once it died) and what it may use:
    an OOM kill and any other SIGKILL look the same in an exit status."""

    read: Callable[[], int | None] = oom_kills
    limit: Callable[[], MemoryLimit | None] = memory_limit

    def start(self) -> Callable[[], bool | None]:
        """Whether the OOM killer killed a process of the cgroup since now; None where the cgroup cannot say."""
        before = self.read()

        def killed() -> bool | None:
            after = self.read()
            return None if before is None or after is None else after > before

        return killed


def _exit_reason(status: int | None, collected: _Collected, oom_killed: bool | None, limit: MemoryLimit | None) -> str:
    """Why the worker's stream ended before it was done: how it died, at which point (size named), and whether that
    was the kernel's OOM killer (the memory cgroup's count went up while it ran)."""
    point = collected.in_flight
    if point is not None:
        where = f"while timing n={point.size} ({point.described} on {point.device})"
    elif collected.last_started is not None:
        last = collected.last_started
        where = f"between points (the last it timed: n={last.size}, {last.described} on {last.device})"
    else:
        where = "before its first point (while loading the framework or finding devices)"
    may_use = f"; it may use {limit}" if limit is not None else ""
    if status is None or status >= 0:
        return f"the worker exited (status {status}) {where}, before finishing"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    if status != -signal.SIGKILL:
        return f"the worker was killed by {name} (status {status}) {where}"
    if oom_killed:
        return (
            f"out of memory: the kernel's OOM killer killed the worker (SIGKILL, status {status}) {where}"
            f"{may_use}; leave that size out, or give the service more memory"
        )
    if oom_killed is None:
        return (
            f"the worker was killed by SIGKILL (status {status}) {where}, not by this service: the kernel's OOM "
            f"killer does that when memory runs out (the memory cgroup gives no OOM count to tell){may_use}"
        )
    return f"the worker was killed by SIGKILL (status {status}) {where}, not by this service nor the OOM killer"


def _collect(
    worker: Worker,
    collected: _Collected,
    *,
    deadline: float,
    timeout_s: float,
    cancel: threading.Event,
    monotonic: Callable[[], float],
    oom_killed: Callable[[], bool | None],
    limit: Callable[[], MemoryLimit | None],
) -> tuple[SweepResult, str] | None:
    """Read messages until the worker is done (None) or the sweep must end (its result and reason)."""
    while True:
        if cancel.is_set():
            return SweepResult.FAILED, "cancelled: the service is stopping"
        remaining = deadline - monotonic()
        if remaining <= 0:
            return SweepResult.TIMEOUT, f"the sweep passed its {timeout_s:g}s deadline and was killed"
        message = worker.next_message(min(remaining, 0.2))
        if message is None:
            continue
        if isinstance(message, EndOfStream):
            status = worker.exit_status(KILL_GRACE_S)
            return SweepResult.FAILED, _exit_reason(status, collected, oom_killed(), limit())
        if isinstance(message, Fatal):
            return SweepResult.FAILED, message.reason
        if isinstance(message, Done):
            return None
        collected.add(message)


def _withheld_crossovers(plan: Plan, collected: _Collected) -> list[Crossover]:
    """The explicit WITHHELD state for every GPU–CPU pair of which one side was withheld."""
    withheld = {w.device for w in collected.withheld if w.whole_device}
    failed = failed_devices(collected.failures)
    working = [d for d in collected.devices if d.device not in failed]
    return [
        Crossover(
            backend=gpu.backend,
            gpu=gpu.device,
            cpu=cpu.device,
            dtype=dtype,
            mode=mode,
            state=CrossoverState.WITHHELD,
        )
        for cpu, gpus in gpu_cpu_pairs(working)
        for gpu in gpus
        if gpu.device in withheld or cpu.device in withheld
        for dtype in plan.bench.dtypes
        for mode in plan.bench.modes
    ]


def run_ends(began: float, *, clock: Callable[[], float], monotonic: Callable[[], float]) -> tuple[float, float]:
    """A run's start and end in unix seconds, for a run that began at ``began`` on the ``monotonic`` clock.

    Both are on the wall clock as it reads at the end, the start being the end less what the monotonic clock says
    the run took: a step of the wall clock during the run (NTP, a host's resume) moves both and never makes a
    duration, which every reader (the metric, the log, the history, the page) takes as their difference."""
    finished = clock()
    return finished - (monotonic() - began), finished


def run_sweep(
    plan: Plan,
    *,
    timeout_s: float,
    cancel: threading.Event,
    launch: Launcher = launch_subprocess,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    on_message: Callable[[Message], None] | None = None,
    memory: MemoryWatch | None = None,
) -> SweepOutcome:
    """Run one sweep to completion, deadline, crash or cancellation; never raises for worker faults.

    ``memory``: the cgroup the worker shares with this process (the default reads it), to tell an OOM kill."""
    began = monotonic()
    collected = _Collected(watch=on_message)
    if cancel.is_set():  # the service began stopping before this sweep could start its worker
        started, finished = run_ends(began, clock=clock, monotonic=monotonic)
        return SweepOutcome(result=SweepResult.FAILED, started_at=started, finished_at=finished, reason="cancelled")
    memory = memory or MemoryWatch()
    oom_killed = memory.start()
    worker = launch(plan)
    try:
        stopped = _collect(
            worker,
            collected,
            deadline=monotonic() + timeout_s,
            timeout_s=timeout_s,
            cancel=cancel,
            monotonic=monotonic,
            oom_killed=oom_killed,
            limit=memory.limit,
        )
    except BaseException:  # e.g. Ctrl-C in `once`: the worker is in its own session and would live on
        worker.stop()
        raise
    if stopped is not None:
        result, reason = stopped
        status = worker.stop()
        detail = worker.diagnostics()
        if detail:
            reason = f"{reason} (exit status {status}; worker stderr: {detail[-500:]})"
        started, finished = run_ends(began, clock=clock, monotonic=monotonic)
        return SweepOutcome(result=result, started_at=started, finished_at=finished, reason=reason)
    if worker.exit_status(KILL_GRACE_S) is None:
        worker.stop()
    started, finished = run_ends(began, clock=clock, monotonic=monotonic)
    return _completed(plan, collected, started, finished)


def _completed(plan: Plan, collected: _Collected, started: float, finished: float) -> SweepOutcome:
    """The outcome of a sweep whose worker completed: what it timed, less what may not be published.

    A device that failed part-way through keeps none of its points: a truncated curve would give a made-up
    crossover state, and its series must disappear (its up gauge says 0). A device withheld as busy or disturbed
    keeps none either: no figure is published from a disturbed point. A point withheld alone was never sent; the
    crossovers it could have moved are withheld."""
    device_failures = [f for f in collected.failures if f.whole_device]
    left_out = failed_devices(collected.failures) | {w.device for w in collected.withheld if w.whole_device}
    measurements = [m for m in collected.measurements if m.key.device not in left_out]
    # A device withheld or failed whole after some of its points were withheld alone is said once, whole.
    withheld = [w for w in collected.withheld if w.whole_device or w.device not in left_out]
    set_aside = [w.point for w in withheld if w.point is not None and w.point.size in plan.bench.sizes]
    withheld_pairs = _withheld_crossovers(plan, collected)
    # A pair with a device withheld whole is withheld once, whatever the other device's gaps say.
    covered = {c.key for c in withheld_pairs}
    derived = [
        replace(c, derived_at=finished)
        for c in crossovers(collected.devices, measurements, set_aside)
        if c.key not in covered
    ]
    snapshot = Snapshot(
        started_at=started,
        finished_at=finished,
        devices=tuple(collected.devices),
        measurements=tuple(measurements),
        crossovers=(*derived, *withheld_pairs),
        costs=cost_models(measurements),
        failures=tuple(collected.failures),
        environment=tuple(sorted(collected.environment.items())),
        withheld=tuple(withheld),
        hardware=tuple(h for h in collected.hardware if h.device not in left_out),
    )
    result, reason = _result(device_failures, measurements, withheld)
    return SweepOutcome(
        result=result, started_at=started, finished_at=snapshot.finished_at, reason=reason, snapshot=snapshot
    )


def _result(
    device_failures: list[DeviceFailure], measurements: list[Measurement], withheld: list[Withheld]
) -> tuple[SweepResult, str]:
    """How a sweep whose worker finished ended, and why: a sweep that measured nothing is never a success."""
    if device_failures:
        return SweepResult.FAILED, "; ".join(f"{f.device}: {f.reason}" for f in device_failures)
    measurements = [m for m in measurements if not m.carried]  # what the sweep itself timed
    if not measurements and not withheld:
        return SweepResult.FAILED, "no device produced a measurement"
    if not withheld:
        return SweepResult.SUCCESS, ""
    why = "; ".join(_withheld_reasons(withheld))
    if not measurements:
        return SweepResult.WITHHELD, f"nothing measured: {why}"
    measured = ", ".join(sorted({m.key.device for m in measurements}))
    return SweepResult.PARTIAL, f"measured {measured}; {why}"


def _withheld_reasons(withheld: list[Withheld]) -> list[str]:
    """One reason per withheld device; a device's withheld points in one, with the first point's detail."""
    whole = [f"{w.device} withheld ({w.reason.value}): {w.detail}" for w in withheld if w.whole_device]
    points: dict[tuple[str, WithheldReason], list[Withheld]] = {}
    for w in withheld:
        if w.point is not None:
            points.setdefault((w.device, w.reason), []).append(w)
    for (device, reason), lost in points.items():
        named = ", ".join(w.point.described for w in lost if w.point is not None)
        first = lost[0].detail
        whole.append(f"{device}: {len(lost)} point(s) withheld ({reason.value}: {named}), the first as {first}")
    return whole
