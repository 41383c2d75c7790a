"""Checks the service's CPU medians against an independent plain timing loop of the same TensorFlow op.

Run: .venv/bin/python benchmarks/cpu_reference.py [--rounds 3] [--out benchmarks/results/cpu_reference.md]

Each round runs the service's own sweep (worker process, TensorFlow backend, CPU) and then, in a
fresh process, a plain loop that times each `tf.matmul` call on its own with perf_counter after
a warm-up. Rounds alternate so that drift on the host hits both alike; the medians over rounds
are compared. Target (issue 2): service / reference within 5% for n >= 256.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
MODES = ("compute", "end_to_end")


def reference(sizes: tuple[int, ...], threads: int) -> dict[str, dict[int, float]]:
    """The plain method: per-call perf_counter around tf.matmul, warm-up excluded, median."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    results: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    for n in sizes:
        a_host = np.random.default_rng(1).random((n, n), dtype=np.float32)
        b_host = np.random.default_rng(2).random((n, n), dtype=np.float32)
        with tf.device("/CPU:0"):
            a, b = tf.constant(a_host), tf.constant(b_host)
        calls = max(5, min(2000, int(0.5 / max(2 * n**3 / 5e10, 2e-5))))  # about half a second per point
        for mode in MODES:
            times = []
            for i in range(calls + 3):
                start = time.perf_counter()
                if mode == "compute":
                    tf.matmul(a, b)
                else:
                    tf.matmul(tf.constant(a_host), tf.constant(b_host)).numpy()
                if i >= 3:  # warm-up calls are not counted
                    times.append(time.perf_counter() - start)
            results[mode][n] = statistics.median(times)
    return results


def service(sizes: tuple[int, ...], threads: int) -> dict[str, dict[int, float]]:
    """The service's own sweep with its default timing settings."""
    from monitor.config import BenchmarkSettings  # noqa: PLC0415
    from monitor.protocol import Plan  # noqa: PLC0415
    from monitor.sweep import run_sweep  # noqa: PLC0415

    plan = Plan.from_settings(BenchmarkSettings(sizes=sizes, cpu_threads=threads, modes=MODES))
    outcome = run_sweep(plan, timeout_s=1800, cancel=threading.Event())
    if outcome.snapshot is None:
        raise SystemExit(f"service sweep failed: {outcome.reason}")
    results: dict[str, dict[int, float]] = {mode: {} for mode in MODES}
    for m in outcome.snapshot.measurements:
        results[m.key.mode][m.key.size] = m.timing.median_s
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cpu_reference.md")
    parser.add_argument("--reference-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    if args.reference_only:
        print(json.dumps(reference(SIZES, threads)))
        return
    rounds: list[tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]] = []
    for index in range(args.rounds):
        svc = service(SIZES, threads)
        ref_run = subprocess.run(
            [sys.executable, __file__, "--reference-only"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        ref = {mode: {int(k): v for k, v in values.items()} for mode, values in json.loads(ref_run.stdout).items()}
        rounds.append((svc, ref))
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr)
    lines = [
        "# Service median vs plain timing loop, TensorFlow on the CPU",
        "",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, {threads} threads used",
        f"- CPU: {_cpu_model()}",
        f"- python {platform.python_version()}, tensorflow {_tf_version()}",
        f"- rounds: {args.rounds} (service sweep, then reference loop in a fresh process; medians over rounds)",
        "- target: ratio within 5% of 1.00 for n >= 256",
        "",
        "| mode | n | service median | reference median | service / reference | within 5% |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    misses = 0
    for mode in MODES:
        for n in SIZES:
            svc_median = statistics.median(r[0][mode][n] for r in rounds)
            ref_median = statistics.median(r[1][mode][n] for r in rounds)
            ratio = svc_median / ref_median
            ok = abs(ratio - 1) <= 0.05
            if n >= 256 and not ok:
                misses += 1
            mark = ("yes" if ok else "NO") if n >= 256 else "(not a target)"
            lines.append(
                f"| {mode} | {n} | {svc_median * 1e6:.1f} µs | {ref_median * 1e6:.1f} µs | {ratio:.3f} | {mark} |"
            )
    lines += ["", f"points at n >= 256 outside 5%: {misses}"]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _tf_version() -> str:
    from importlib.metadata import version  # noqa: PLC0415

    return version("tensorflow")


if __name__ == "__main__":
    main()
