"""How a point's level varies between visits: the service's own backend and timing loop, round-robin.

Each (device, mode, size) is visited ``--visits`` times in round-robin order; each visit prepares
fresh operands and runs the timing loop as a sweep does (warm-up, calibration, converged blocks).
Within-visit spread (relative IQR of blocks) is set against the spread of the visit medians: when
the second is much larger, a point's timed level is set by a state that lasts the visit (operands,
thread placement, allocator) and a converged IQR does not show it. Run it in two processes to see
the between-process part too.

    python benchmarks/point_levels.py --backend tensorflow --out levels.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from crossover_monitor.bench.contract import BackendOptions
from crossover_monitor.bench.hostinfo import default_cpu_threads
from crossover_monitor.bench.registry import load_backend
from crossover_monitor.bench.timing import measure
from crossover_monitor.model import Mode
from crossover_monitor.settings import TimingSettings

COMPUTE_SIZES = (1, 16, 32, 48, 64, 79, 80, 96, 99, 101, 103, 112, 128, 160, 192, 256, 512)
END_TO_END_SIZES = (128, 256, 512, 609, 640, 724, 768, 1024, 1448, 2048)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--visits", type=int, default=6)
    parser.add_argument("--threads", type=int, default=default_cpu_threads())
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compute-sizes", default=",".join(map(str, COMPUTE_SIZES)))
    parser.add_argument("--end-to-end-sizes", default=",".join(map(str, END_TO_END_SIZES)))
    args = parser.parse_args()
    backend = load_backend(args.backend, BackendOptions(tf32=False, cpu_threads=args.threads))
    devices = list(backend.discover())
    settings = TimingSettings()
    plan: list[tuple[Mode, int]] = [("compute", int(n)) for n in args.compute_sizes.split(",")]
    plan += [("end_to_end", int(n)) for n in args.end_to_end_sizes.split(",")]
    visits: dict[str, list[dict[str, float]]] = {}
    started = time.time()
    for visit in range(args.visits):
        for mode, size in plan:
            for device in devices:
                run = backend.prepare(device, size, "float32", mode)
                timing = measure(run, settings, time.perf_counter)
                key = f"{device.device}|{mode}|{size}"
                visits.setdefault(key, []).append(
                    {"median_s": timing.median_s, "rel_iqr": timing.relative_iqr, "blocks": float(timing.blocks)}
                )
        print(f"visit {visit + 1}/{args.visits} done after {time.time() - started:.0f}s", file=sys.stderr, flush=True)
    summary: dict[str, dict[str, float | list[float]]] = {}
    for key, rows in visits.items():
        medians = [r["median_s"] for r in rows]
        logs = [math.log(m) for m in medians]
        summary[key] = {
            "medians_us": [round(m * 1e6, 2) for m in medians],
            "within_rel_iqr_median": statistics.median(r["rel_iqr"] for r in rows),
            "between_log_sd": statistics.stdev(logs) if len(logs) > 1 else 0.0,
            "max_over_min": max(medians) / min(medians),
        }
    args.out.write_text(json.dumps({"backend": args.backend, "threads": args.threads, "points": summary}, indent=1))
    print(f"{'point':38s} {'within':>7s} {'between':>8s} {'max/min':>8s}  medians (us)")
    for key, rows in visits.items():
        medians = [r["median_s"] * 1e6 for r in rows]
        within, between = summary[key]["within_rel_iqr_median"], summary[key]["between_log_sd"]
        print(
            f"{key:38s} {within:7.3f} {between:8.3f} {max(medians) / min(medians):8.2f}  "
            + " ".join(f"{m:.1f}" for m in medians)
        )


if __name__ == "__main__":
    main()
