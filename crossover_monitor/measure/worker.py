"""The worker process: reads a plan on stdin, times it, streams JSON lines on stdout.

Run as ``python -m crossover_monitor.measure.worker`` in a fresh interpreter (never forked from the
daemon) in its own process group, so that the sweep can kill it and all its threads.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from crossover_monitor.errors import MonitorError
from crossover_monitor.measure.contract import BackendOptions
from crossover_monitor.measure.guard.guard import GpuSampler, Guard, GuardUnavailable
from crossover_monitor.measure.guard.hostinfo import ProcStatMeter, default_cpu_threads
from crossover_monitor.measure.guard.hostprobe import reading
from crossover_monitor.measure.guard.podresources import PodResourcesClient, holders
from crossover_monitor.measure.registry import load_backend
from crossover_monitor.measure.runner import run_plan
from crossover_monitor.memory import memory_limit
from crossover_monitor.model import WORKER_CPU_SECONDS, WORKER_PEAK_RSS_BYTES
from crossover_monitor.protocol import Done, Environment, Fatal, Message, Plan, encode


def _claim_stdout() -> TextIO:
    """A private copy of stdout for messages; fd 1 then points at stderr, so library prints can't corrupt it."""
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return channel


def build_guard(plan: Plan) -> Guard:
    """The guard with NVML (when it can start), the host's load meter and the host reference, and what the
    service's state knows of this node (its figures and usual load) from the plan: all of it, from one place."""
    settings = plan.guard
    sampler: GpuSampler | None = None
    problem = ""
    if settings.enabled:
        from crossover_monitor.measure.guard.nvml import NvmlSampler  # noqa: PLC0415 - only a guarded worker loads NVML

        try:
            sampler = NvmlSampler()
        except GuardUnavailable as exc:
            problem = str(exc)
    pods: Callable[[str], Sequence[str]] | None = None
    if settings.enabled and PodResourcesClient.available():  # Kubernetes, with the kubelet's socket mounted
        client = PodResourcesClient()

        def pods(uuid: str) -> Sequence[str]:  # the client asks the kubelet again once its answer is 30 s old
            return holders(client.allocations(), uuid)

    return Guard(
        settings,
        gpu_sampler=sampler,
        gpu_sampler_problem=problem,
        host=ProcStatMeter(),
        own_pid=os.getpid(),
        sleep=time.sleep,
        pods=pods,
        reference=reading,
        reference_baseline=plan.host_baseline,
        range_tops=plan.range_tops,
        usual_others=plan.usual_others,
    )


def main() -> int:
    channel = _claim_stdout()

    def emit(message: Message) -> None:
        channel.write(encode(message) + "\n")

    try:
        plan = Plan.from_json(sys.stdin.readline())
    except (ValueError, TypeError, KeyError) as exc:
        emit(Fatal(f"the worker could not read its plan: {exc}"))
        return 1
    options = BackendOptions(tf32=plan.bench.tf32, cpu_threads=plan.bench.cpu_threads or default_cpu_threads())
    try:
        backend = load_backend(plan.bench.backend, options)
        guard = build_guard(plan)
        run_plan(plan, backend, emit, time.perf_counter, guard, memory=memory_limit())
    except MonitorError as exc:
        emit(Fatal(str(exc)))
        return 1
    emit(Environment(_footprint()))
    emit(Done())
    return 0


def _footprint() -> dict[str, str]:
    """What this sweep cost the node so far: this process's CPU time and peak resident memory."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # ru_maxrss is KiB on Linux (bytes on macOS, where the service does not run).
    return {
        WORKER_CPU_SECONDS: f"{usage.ru_utime + usage.ru_stime:.3f}",
        WORKER_PEAK_RSS_BYTES: str(usage.ru_maxrss * 1024),
    }


if __name__ == "__main__":
    sys.exit(main())
