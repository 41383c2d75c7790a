"""Is the service's CPU timing the same as a plain loop, with and without GPU work in between?

Run: python benchmarks/cpu_consistency.py [--backend torch] [--sizes 128,256,512,1024]

In one fresh process per variant, for each size it reports the median per-call time of
  plain:     a perf_counter loop around the framework's matmul;
  service:   the service's timing loop (crossover_monitor.bench.timing.measure) on the backend's CPU runner;
  after-gpu: the same, right after timing the same size on the GPU (as a sweep interleaves them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from references import median_for
from crossover_monitor.bench.contract import BackendOptions
from crossover_monitor.bench.hostinfo import usable_cpus
from crossover_monitor.bench.registry import load_backend
from crossover_monitor.bench.timing import measure
from crossover_monitor.settings import TimingSettings
variant, backend_name, sizes = sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split(",")]
backend = load_backend(backend_name, BackendOptions(tf32=False, cpu_threads=usable_cpus()))
devices = {d.kind: d for d in backend.discover()}
out = {}
for n in sizes:
    run = backend.prepare(devices["cpu"], n, "float32", "compute")
    if variant == "plain":
        out[n] = median_for(lambda: run(1))
        continue
    if variant == "after-gpu" and "gpu" in devices:
        measure(backend.prepare(devices["gpu"], n, "float32", "compute"), TimingSettings(), time.perf_counter)
    out[n] = measure(run, TimingSettings(), time.perf_counter).median_s
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--sizes", default="128,256,512,1024")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"plain": [], "service": [], "after-gpu": []}
    for _ in range(args.rounds):
        for variant, runs in results.items():
            run = subprocess.run(
                [sys.executable, "-c", VARIANT, str(REPO), variant, args.backend, args.sizes],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(f"| n | {' | '.join(results)} | service/plain | after-gpu/plain |")
    print("| ---: | " + " | ".join("---:" for _ in results) + " | ---: | ---: |")
    for n in args.sizes.split(","):
        medians = {v: statistics.median(r[n] for r in rs) for v, rs in results.items()}
        cells = " | ".join(f"{medians[v] * 1e6:.1f} µs" for v in results)
        print(
            f"| {n} | {cells} | {medians['service'] / medians['plain']:.3f} | {medians['after-gpu'] / medians['plain']:.3f} |"
        )
    print(f"({args.rounds} rounds, one fresh process per variant and round, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
