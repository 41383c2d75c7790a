"""Checks the service's CPU medians against an independent plain timing loop of the same TensorFlow op.

Run: .venv/bin/python benchmarks/cpu_reference.py [--rounds 3] [--out benchmarks/results/cpu_reference.md]

For each size and mode the two methods run side by side, alternating (service, plain, service,
plain, ...) for --rounds rounds in one process, so that whatever the host is doing at that moment
hits both alike:
  service: the service's own code path, the TensorFlow backend's block runner timed by
           crossover_monitor.measure.timing.measure with the default timing settings (what the worker runs);
  plain:   a perf_counter around each tf.matmul call (end_to_end: tf.constant from host memory,
           matmul, .numpy()), warm-up excluded, median — written here without the service's code.
Ratios are medians over rounds. Target (issue 2): service / plain within 5% for n >= 256.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from references import median_for  # noqa: E402

from crossover_monitor.config.settings import TimingSettings  # noqa: E402
from crossover_monitor.measure.backends.tensorflow_backend import TensorFlowBackend  # noqa: E402
from crossover_monitor.measure.contract import BackendOptions  # noqa: E402
from crossover_monitor.measure.guard.hostinfo import usable_cpus  # noqa: E402
from crossover_monitor.measure.timing import measure  # noqa: E402
from crossover_monitor.model import MODES, Mode  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)


def plain(n: int, mode: str) -> float:
    """The plain method, independent of the service's code."""
    a_host = np.random.default_rng(1).random((n, n), dtype=np.float32)
    b_host = np.random.default_rng(2).random((n, n), dtype=np.float32)
    with tf.device("/CPU:0"):
        a, b = tf.constant(a_host), tf.constant(b_host)
    call: Callable[[], object] = (
        (lambda: tf.matmul(a, b))
        if mode == "compute"
        else (lambda: tf.matmul(tf.constant(a_host), tf.constant(b_host)).numpy())
    )
    return median_for(call)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cpu_reference.md")
    args = parser.parse_args()
    threads = usable_cpus()
    backend = TensorFlowBackend(BackendOptions(tf32=False, cpu_threads=threads))
    cpu = backend.discover()[0]
    settings = TimingSettings()
    ratios: dict[tuple[Mode, int], tuple[float, float, float]] = {}
    for mode in MODES:
        for n in SIZES:
            service_runs, plain_runs = [], []
            for _ in range(args.rounds):
                service_runs.append(
                    measure(backend.prepare(cpu, n, "float32", mode), settings, time.perf_counter).median_s
                )
                plain_runs.append(plain(n, mode))
            service, reference = statistics.median(service_runs), statistics.median(plain_runs)
            ratios[(mode, n)] = (service, reference, service / reference)
            print(f"{mode} {n}: {service / reference:.3f}", file=sys.stderr, flush=True)
    lines = [
        "# Service median vs plain timing loop, TensorFlow on the CPU",
        "",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads used, CPU: {cpu.name}",
        f"- python {platform.python_version()}, tensorflow {tf.__version__}",
        f"- {args.rounds} rounds per point, service and plain alternating in one process; medians over rounds",
        "- target: service / plain within 5% for n >= 256",
        "",
        "| mode | n | service median | plain median | service / plain | within 5% |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    misses = 0
    for (mode, n), (service, reference, ratio) in ratios.items():
        ok = abs(ratio - 1) <= 0.05
        misses += n >= 256 and not ok
        mark = ("yes" if ok else "NO") if n >= 256 else "(not a target)"
        lines.append(f"| {mode} | {n} | {service * 1e6:.1f} µs | {reference * 1e6:.1f} µs | {ratio:.3f} | {mark} |")
    lines += ["", f"points at n >= 256 outside 5%: {misses}"]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
